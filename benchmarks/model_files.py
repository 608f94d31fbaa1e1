"""Model files as other teams hand them over, each run as a new user would: `tbench run --model-file FILE` with the
options a user would know to give (a TorchScript file's --shape, their own samples), nothing else.

The set is built here by real exporters: torch.onnx (a vision net with and without a batch axis, 1-D tensors, FP16,
external data, a module for one sample), TorchScript, and, where importable, scikit-learn through skl2onnx and Hugging
Face transformers models built from their configs (libraries the project does not depend on: put them on PYTHONPATH
from a scratch environment, e.g. `uv pip install --target DIR scikit-learn skl2onnx onnxconverter-common transformers`;
a case whose exporter is missing is recorded as not built, with the reason).

Each case ends as: completed (every point stable, or the points that were not named), refused (exit 2, the one line:
it must name a fix), or failed (anything else: the goal is none). Then the online curve of one model without a batch
axis beside the same model exported with one, on the same server kind and settings.

Usage: PYTHONPATH=DIR .venv/bin/python benchmarks/model_files.py [--plan TEXT] [--window-s S]
Writes benchmarks/results/model_files.json with its provenance (benchmarks/provenance.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from provenance import RESULTS, recorded

CURVE_CONCURRENCY = "1,2,4,8"


# ---------------------------------------------------------------- the files


def _vision(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 10),
    ).eval()


def vision_onnx(out: Path, batch_axis: bool) -> Path:
    import torch

    path = out / ("vision_batch.onnx" if batch_axis else "vision_fixed.onnx")
    axes = {"image": {0: "b"}, "logits": {0: "b"}} if batch_axis else None
    torch.onnx.export(
        _vision(torch), (torch.randn(1, 3, 64, 64),), str(path), dynamo=False,
        input_names=["image"], output_names=["logits"], dynamic_axes=axes,
    )  # fmt: skip
    return path


def one_d_onnx(out: Path) -> Path:
    import torch

    class Scale(torch.nn.Module):
        def forward(self, x):
            return x * 2.0 + 1.0

    path = out / "one_d.onnx"
    torch.onnx.export(
        Scale(), (torch.randn(4),), str(path), dynamo=False, input_names=["x"], output_names=["y"],
        dynamic_axes={"x": {0: "b"}, "y": {0: "b"}},
    )  # fmt: skip
    return path


def fp16_external_onnx(out: Path) -> Path:
    import onnx
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).half().eval()
    exported = out / "mlp_fp16_inline.onnx"
    torch.onnx.export(
        module, (torch.randn(2, 32).half(),), str(exported), dynamo=False, input_names=["x"], output_names=["y"],
        dynamic_axes={"x": {0: "b"}, "y": {0: "b"}},
    )  # fmt: skip
    folder = out / "mlp_fp16_external"
    folder.mkdir(exist_ok=True)
    path = folder / "mlp_fp16.onnx"
    onnx.save_model(
        onnx.load(str(exported)), str(path), save_as_external_data=True, location="mlp.data", size_threshold=0
    )
    return path


def one_sample_torchscript(out: Path) -> Path:
    import torch

    class OneSample(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(12, 3)

        def forward(self, x):
            return self.fc(x.view(1, 12))

    path = out / "one_sample.pt"
    torch.jit.script(OneSample().eval()).save(str(path))
    return path


def vision_torchscript(out: Path) -> Path:
    import torch

    path = out / "vision.pt"
    torch.jit.trace(_vision(torch), torch.randn(2, 3, 64, 64)).save(str(path))
    return path


def _sklearn_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int64)


def sklearn_forest(out: Path, zipmap: bool) -> Path:
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier

    x, y = _sklearn_data()
    forest = RandomForestClassifier(n_estimators=10, max_depth=4, random_state=0).fit(x, y)
    path = out / ("forest_zipmap.onnx" if zipmap else "forest.onnx")
    options = {} if zipmap else {"zipmap": False}
    path.write_bytes(to_onnx(forest, x[:1], options=options, target_opset=17).SerializeToString())
    return path


def sklearn_pipeline(out: Path) -> Path:
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = _sklearn_data()
    model = make_pipeline(StandardScaler(), LogisticRegression()).fit(x, y)
    path = out / "scaler_logreg.onnx"
    path.write_bytes(to_onnx(model, x[:1], options={"zipmap": False}, target_opset=17).SerializeToString())
    return path


def _bert():
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
    )
    return BertModel(config).eval()


def hf_bert(out: Path, batch_axis: bool = True, external: bool = False) -> Path:
    import onnx
    import torch

    ids = torch.randint(0, 1000, (2 if batch_axis else 1, 16))
    names = ["input_ids", "attention_mask"]
    axes = {"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}, "last_hidden_state": {0: "b", 1: "s"}}
    path = out / ("bert.onnx" if batch_axis else "bert_fixed.onnx")
    torch.onnx.export(
        _bert(), (ids, torch.ones_like(ids)), str(path), dynamo=False, opset_version=17, input_names=names,
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_axes={**axes, "pooler_output": {0: "b"}} if batch_axis else None,
    )  # fmt: skip
    if not external:
        return path
    folder = out / "bert_external"
    folder.mkdir(exist_ok=True)
    onnx.save_model(onnx.load(str(path)), str(folder / "bert.onnx"), save_as_external_data=True, location="bert.data")
    return folder / "bert.onnx"


def hf_gpt2(out: Path) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=500, n_embd=64, n_layer=2, n_head=2, n_positions=512)).eval()
    model.config.use_cache = False
    path = out / "gpt2.onnx"
    torch.onnx.export(
        model, (torch.randint(0, 500, (2, 16)),), str(path), dynamo=False, opset_version=17,
        input_names=["input_ids"], output_names=["logits"],
        dynamic_axes={"input_ids": {0: "b", 1: "s"}, "logits": {0: "b", 1: "s"}},
    )  # fmt: skip
    return path


def bert_samples(out: Path) -> Path:
    """The user's own samples of one length (a tokenizer's padding to 48), perf_analyzer's JSON input data."""
    rng = np.random.default_rng(1)
    entries = [
        {"input_ids": rng.integers(0, 1000, 48).tolist(), "attention_mask": [1] * 40 + [0] * 8} for _ in range(16)
    ]
    path = out / "bert_samples.json"
    samples = json.dumps({"data": entries})  # an input of the runs, not a result
    path.write_text(samples)
    return path


# (name, builder, options a user would give; "{samples}" is the samples file, what the case stands for)
CASES = [
    ("vision, batch axis (torch.onnx)", lambda o: vision_onnx(o, True), [], "the ordinary case"),
    ("vision, fixed batch 1 (torch.onnx)", lambda o: vision_onnx(o, False), [], "no batch axis"),
    ("1-D in and out (torch.onnx)", one_d_onnx, [], "tensors whose only dim is the batch"),
    ("FP16 MLP, external data (torch.onnx)", fp16_external_onnx, [], "FP16 inputs, weights in a separate file"),
    ("vision (torch.jit.trace)", vision_torchscript, ["--shape", "input:3,64,64"], "TorchScript with --shape"),
    ("module for one sample (torch.jit.script)", one_sample_torchscript, ["--shape", "x:3,4"], "TorchScript, batch 1"),
    ("random forest, zipmap=False (skl2onnx)", lambda o: sklearn_forest(o, False), [], "1-D int64 labels"),
    ("random forest, default ZipMap (skl2onnx)", lambda o: sklearn_forest(o, True), [], "a non-tensor output"),
    ("scaler + logistic regression (skl2onnx)", sklearn_pipeline, [], "a scikit-learn pipeline"),
    ("BERT from its config (transformers)", hf_bert, [], "int64 token ids, dynamic length"),
    ("BERT, fixed batch (transformers)", lambda o: hf_bert(o, batch_axis=False), [], "no batch axis, int64 ids"),
    ("BERT, external data (transformers)", lambda o: hf_bert(o, external=True), [], "external data"),
    ("BERT with the user's samples (transformers)", hf_bert, ["--input-data", "{samples}"], "own samples, length 48"),
    ("GPT-2 from its config (transformers)", hf_gpt2, [], "a causal LM's logits"),
]


# ---------------------------------------------------------------- running


def tbench(args: list[str], timeout_s: float) -> tuple[int, str, str]:
    binary = Path(sys.executable).with_name("tbench")
    try:
        done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout_s:.0f} s"
    return done.returncode, done.stdout, done.stderr


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].removeprefix("error: ") if lines else ""


def run_case(path: Path, options: list[str], out: Path, window_s: float | None, extra: list[str] | None = None) -> dict:
    started = time.monotonic()
    windows = ["--window-s", str(window_s)] if window_s else []
    code, stdout, stderr = tbench(
        ["run", "--model-file", str(path), *options, "--output", str(out), *windows, *(extra or [])],
        timeout_s=900,
    )
    entry: dict = {"exit": code, "seconds": round(time.monotonic() - started, 1)}
    run_dir = Path(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    if code == 2:
        return {**entry, "status": "refused", "line": last_line(stderr)}
    if run_dir is None or not (run_dir / "results.parquet").exists():
        return {**entry, "status": "failed", "line": last_line(stderr) or last_line(stdout)}
    results = pd.read_parquet(run_dir / "results.parquet")
    ok = results[results["status"] == "ok"]
    entry.update(
        run_dir=str(run_dir),
        points=len(results),
        points_ok=len(ok),
        best_throughput=round(float(ok["throughput_infer_per_s"].max()), 1) if len(ok) else None,
        online=ok[ok["scenario"] == "online"]
        .sort_values("concurrency")
        .set_index("concurrency")["throughput_infer_per_s"]
        .round(1)
        .to_dict(),
        not_ok=[
            f"{r.scenario} b{r.batch_size} c{r.concurrency}: {r.status}"
            for r in results.itertuples()
            if r.status != "ok"
        ],
    )
    status = "completed" if code in (0, 3) and len(ok) == len(results) else "completed, points flagged"
    return {**entry, "status": status if code in (0, 3) else "failed", "line": last_line(stderr) if code else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", default="", help="only the cases whose name holds this text (all by default)")
    parser.add_argument("--window-s", type=float, default=None, help="the profile's own windows by default")
    args = parser.parse_args()
    with recorded(RESULTS / "model_files.json", ["model files set"]) as record:
        work = Path(tempfile.mkdtemp(prefix="tbench-model-files-"))
        files, out = work / "files", work / "runs"
        files.mkdir()
        samples = bert_samples(files)
        record["window_s"] = args.window_s
        record["cases"] = []
        for name, build, options, stands_for in CASES:
            if args.plan not in name:
                continue
            case = {"name": name, "stands_for": stands_for}
            try:
                path = build(files)
            except ImportError as err:
                case.update(status="not built", line=f"exporter not importable here: {err}")
            else:
                given = [str(samples) if o == "{samples}" else o for o in options]
                case.update(file=path.name, options=" ".join(options), **run_case(path, given, out, args.window_s))
            print(f"{name}: {case['status']} {case.get('line', '')}", flush=True)
            if "file" in case:
                record.model_sizes.append(f"{case['file']} file")
            record["cases"].append(case)
            record.save()
        statuses = [c["status"] for c in record["cases"]]
        record["summary"] = {
            s: statuses.count(s) for s in ("completed", "completed, points flagged", "refused", "failed", "not built")
        }
        # the online curve of one model without a batch axis beside the same model with one, same settings
        curve = ["--concurrency", CURVE_CONCURRENCY, "--scenarios", "online"]
        record["online_curve"] = {
            label: run_case(vision_onnx(files, batch_axis), [], out, args.window_s, curve).get("online")
            for label, batch_axis in (
                ("no batch axis (max_batch_size 0)", False),
                ("batch axis (dynamic batching)", True),
            )
        }
        print(json.dumps({"summary": record["summary"], "online_curve": record["online_curve"]}, indent=1), flush=True)


if __name__ == "__main__":
    main()
