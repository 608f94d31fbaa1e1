"""A sequence-length sweep of a BERT-style export: 4 lengths x 3 batch sizes in one `tbench run`, with its wall time.

The model is a BERT built by Hugging Face transformers from its config (4 layers, hidden 256; a library the project
does not depend on: put it on PYTHONPATH from a scratch environment, e.g. `uv pip install --target DIR transformers`),
exported as exporters do, with a dynamic batch and `sequence` axis on its three inputs. One `--shape input_ids:...`
sizes all three: they share the `sequence` dim. Writes benchmarks/results/shape_sweep.json, whole, with its provenance.

Usage: PYTHONPATH=SCRATCH .venv/bin/python benchmarks/shape_sweep.py [--lengths 32,64,128,256] [--batch-sizes 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from provenance import RESULTS, recorded

TBENCH = str(Path(sys.executable).with_name("tbench"))


def export_bert(out: Path) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
    ids = torch.randint(0, config.vocab_size, (2, 16))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]}
    path = out / "bert.onnx"

    class ByName(torch.nn.Module):  # forward's positional order differs between transformers releases
        def __init__(self):
            super().__init__()
            self.bert = BertModel(config)

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    torch.onnx.export(
        ByName().eval(), (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(path), dynamo=False,
        opset_version=17, input_names=names, output_names=["last_hidden_state", "pooler_output"],
        dynamic_axes={**axes, "pooler_output": {0: "batch"}},
    )  # fmt: skip
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="32,64,128,256")
    parser.add_argument("--batch-sizes", default="1,2,4")
    parser.add_argument("--window-s", default="1")
    args = parser.parse_args()
    with recorded(RESULTS / "shape_sweep.json", model_sizes=["no model: of tbench's own; a BERT config"]) as record:
        output = Path(tempfile.mkdtemp(prefix="tbench-shape-sweep-"))
        model = export_bert(output)
        argv = [
            "--model-file", str(model), "--shape", f"input_ids:{args.lengths}", "--value-range", "attention_mask:1,1",
            "--scenarios", "offline", "--batch-sizes", args.batch_sizes, "--window-s", args.window_s,
        ]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run([TBENCH, "run", *argv, "--output", str(output)], capture_output=True, text=True)
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"tbench run failed ({done.returncode}): {done.stdout[-2000:]}")
        run_dir = Path(done.stdout.strip().splitlines()[-1])
        results = pd.read_parquet(run_dir / "results.parquet")
        columns = ["shapes", "batch_size", "status", "throughput_infer_per_s", "p99_ms"]
        points = json.loads(results[columns].round(3).to_json(orient="records"))
        manifest = json.loads((run_dir / "manifest.json").read_text())
        perf_s = sum(s["seconds"] for name, s in manifest["stages"].items() if name.startswith("perf-"))
        record.update(
            {
                "model": "BertModel(num_hidden_layers=4, hidden_size=256, num_attention_heads=4), transformers",
                "command": ["tbench", "run", *argv],
                "lengths": [int(x) for x in args.lengths.split(",")],
                "batch_sizes": [int(x) for x in args.batch_sizes.split(",")],
                "points": points,
                "points_ok": int((results["status"] == "ok").sum()),
                "points_total": len(results),
                "wall_s": round(wall, 1),
                "sweep_stages_s": round(perf_s, 1),
                "measured_shapes": manifest["measured_shapes"],
            }
        )
        print(results[columns].to_string())
        print(f"wall {wall:.1f} s, sweeps {perf_s:.1f} s")


if __name__ == "__main__":
    main()
