"""The python-backend runtime's two tensor paths on the CPU (tbench/triton/python_backend/model.py): NumPy (`as_numpy()`
in, a NumPy array out) against DLPack (torch tensors in and out; ONNX Runtime through OrtValue.from_dlpack and an IO
binding), for ONNX Runtime and TorchScript on ResNet-50 (--size small by default).

One embedded server serves each format twice, one copy per path (the config's `tensor_path` parameter), so both paths
share the server, the cores and the moment; perf_analyzer measures them in alternating order each round (concurrency 1,
static batching at each batch size), and the medians over rounds are compared. Also measured: the CPU time of
importing torch in the server's Python (what an ONNX Runtime instance on the DLPack path pays at load, and an instance
on the NumPy path does not).

Usage: .venv/bin/python benchmarks/tensor_paths.py [--size small|full] [--rounds 6] [--batch-sizes 1,8]
Writes benchmarks/results/tensor_paths.json, whole, with its provenance (benchmarks/provenance.py).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import RESULTS, recorded

import model_adapters
from tbench.core.enums import Format
from tbench.core.runtimes import source_digest
from tbench.node.tools import perf_analyzer_binary, perf_analyzer_env
from tbench.stages.export import export_model
from tbench.triton.process_server import EmbeddedServer
from tbench.triton.repository import ServingConfig, write_repository

PATHS = ("numpy", "dlpack")
FORMATS = {"onnx": Format.ONNX, "torchscript": Format.TS_TRACE}


def torch_import_cpu_s(repeats: int = 3) -> float:
    """Median CPU seconds (user + system) of `import torch` in a fresh interpreter of this environment."""
    code = "import resource, torch; u = resource.getrusage(resource.RUSAGE_SELF); print(u.ru_utime + u.ru_stime)"
    base = "import resource; u = resource.getrusage(resource.RUSAGE_SELF); print(u.ru_utime + u.ru_stime)"
    runs = []
    for _ in range(repeats):
        with_torch = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
        bare = float(subprocess.run([sys.executable, "-c", base], capture_output=True, text=True).stdout)
        runs.append(with_torch - bare)
    return round(statistics.median(runs), 3)


def throughput(url: str, model: str, batch: int) -> float | None:
    """perf_analyzer's throughput over 2 s windows, 3 of them within 25% (the rounds' median does the rest); None where
    no 10 windows held 3 that close (a busy moment on a shared machine: that round's pair is left out, not the run)."""
    argv = [str(perf_analyzer_binary()), "-m", model, "-u", url, "-i", "grpc", "-b", str(batch)]
    argv += ["--concurrency-range", "1", "--measurement-interval", "2000", "-s", "25"]
    done = subprocess.run(argv, capture_output=True, text=True, env=perf_analyzer_env(), timeout=300)
    found = re.search(r"Throughput: ([\d.]+) infer/sec", done.stdout)
    if found:
        return float(found.group(1))
    if "Failed to obtain stable measurement" in done.stdout + done.stderr:
        return None
    raise RuntimeError(f"perf_analyzer on {model} at batch {batch}: {(done.stdout + done.stderr)[-400:]}")


def compared(numpy: list[float | None], dlpack: list[float | None]) -> dict:
    """The two paths' samples of one point, and how they compare over the rounds that measured both."""
    pairs = [(n, d) for n, d in zip(numpy, dlpack, strict=True) if n is not None and d is not None]
    ns, ds = [n for n, _ in pairs], [d for _, d in pairs]
    measured = {
        "numpy_infer_per_s": numpy,
        "dlpack_infer_per_s": dlpack,
        "rounds_compared": len(pairs),  # the rounds where both paths' measurements were stable
    }
    if not pairs:
        return measured
    return measured | {
        "numpy_median": round(statistics.median(ns), 1),
        "dlpack_median": round(statistics.median(ds), 1),
        "numpy_over_dlpack": round(statistics.median(ns) / statistics.median(ds), 4),
        # the median of each round's own ratio: drift over the run cancels within a round's pair
        "numpy_over_dlpack_paired": round(statistics.median(n / d for n, d in pairs), 4),
        "numpy_faster_rounds": sum(n > d for n, d in pairs),
    }


def serve_both_paths(repo: Path, artifacts: dict, max_batch: int) -> None:
    for fmt, artifact in artifacts.items():
        for path in PATHS:
            name = f"{fmt}_{path}"
            write_repository(repo, ServingConfig(name, max_batch, [], 0, 1, batching="static"), artifact)
            with (repo / name / "config.pbtxt").open("a") as config:
                config.write(f'\nparameters {{ key: "tensor_path" value {{ string_value: "{path}" }} }}\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small", choices=["small", "full"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch-sizes", default="1,8")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    adapter = model_adapters.get("resnet50", args.size)
    module = adapter.build()
    with recorded(RESULTS / "tensor_paths.json", model_sizes=[f"resnet50 {args.size}"]) as record:
        record.update(rounds=args.rounds, batch_sizes=batches, concurrency=1, batching="static")
        record["torch_import_cpu_s"] = torch_import_cpu_s()
        work = Path(tempfile.mkdtemp(prefix="tbench-tensor-paths-"))
        digest = source_digest("pytorch", module)
        artifacts = {f: export_model(adapter, module, FORMATS[f], work / "models", digest) for f in FORMATS}
        serve_both_paths(work / "repo", artifacts, max(batches))
        samples = {(f, b, p): [] for f in FORMATS for b in batches for p in PATHS}
        with EmbeddedServer(work / "repo", work / "server.log") as server:
            for r in range(args.rounds):
                for f in FORMATS:
                    for b in batches:
                        for p in PATHS if r % 2 == 0 else PATHS[::-1]:  # alternating: drift hits both paths
                            samples[(f, b, p)].append(throughput(server.endpoints.grpc_url, f"{f}_{p}", b))
                print(f"round {r + 1}/{args.rounds}", flush=True)
        record["points"] = [
            {"format": f, "batch_size": b} | compared(samples[(f, b, "numpy")], samples[(f, b, "dlpack")])
            for f in FORMATS
            for b in batches
        ]


if __name__ == "__main__":
    main()
