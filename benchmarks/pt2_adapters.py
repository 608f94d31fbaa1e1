"""torch.export + AOTInductor (`--formats pt2`) on every PyTorch adapter at one size: which models torch.export takes,
whether the compiled package answers like eager, and for those it does not take, the one-line reason a run gives.

Each model is converted as a run converts it (tbench.stages.export at the adapter's CPU max batch, FP32) from an empty
conversion cache (a temporary folder), so `compile_s` is a cold export + compile on this machine; the same conversion
again is `cached_s` (the conversion cache's copy). The package is then checked against eager as the correctness stage
checks it (batch 4, the request's FP32 tolerances). Writes benchmarks/results/pt2_adapters.json, whole, with its
provenance (benchmarks/provenance.py); `--dry-run` prints the rows and writes nothing.

Usage: .venv/bin/python benchmarks/pt2_adapters.py --size small [--models resnet50,nnunet] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from provenance import RESULTS, recorded

import model_adapters
from tbench.core.enums import Format, Precision
from tbench.core.errors import BenchError, one_line
from tbench.core.runtimes import source_digest
from tbench.request.benchmark import DEFAULT_TOLERANCES
from tbench.stages.converters.registry import ConversionOptions
from tbench.stages.correctness import check_artifacts
from tbench.stages.export import export_model


def pytorch_models() -> list[str]:
    return [name for name in model_adapters.names() if "pytorch" in model_adapters.frameworks(name)]


def try_model(name: str, size: str, work: Path) -> dict:
    """One adapter through pytorch -> pt2, then again from the cache, then against eager."""
    adapter = model_adapters.get(name, size, framework="pytorch", profile="cpu")
    module = adapter.build()
    digest = source_digest("pytorch", module)
    max_batch = adapter.defaults("cpu").max_batch_size
    options = ConversionOptions(max_batch_size=max_batch, precision=Precision.FP32)
    row: dict = {"model": name, "size": size, "max_batch_size": max_batch}
    started = time.monotonic()
    try:
        artifact = export_model(adapter, module, Format.PT2, work / name / "cold", digest, options)
    except BenchError as err:
        row.update(exported=False, reason=one_line(str(err), 400), seconds=round(time.monotonic() - started, 1))
        return row
    row.update(exported=True, compile_s=round(time.monotonic() - started, 1))
    started = time.monotonic()
    again = export_model(adapter, module, Format.PT2, work / name / "warm", digest, options)
    row.update(cached=again.cached, cached_s=round(time.monotonic() - started, 2))
    row["package_mib"] = round(Path(artifact.path).stat().st_size / 2**20, 2)
    try:
        (result,) = check_artifacts(adapter, module, [artifact], *DEFAULT_TOLERANCES[Precision.FP32])
    except BenchError as err:  # the package failed on inputs eager ran, or differed in shape
        row.update(correct=False, reason=one_line(str(err), 400))
        return row
    row["correct"] = result.passed
    row["outputs"] = [
        {"output": o.output, "max_abs_err": o.max_abs_err, "tolerance": o.tolerance, "passed": o.passed}
        for o in result.outputs
    ]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", help="the size every adapter is tried at")
    parser.add_argument("--models", default="", help="comma-separated PyTorch adapters (default: every one)")
    parser.add_argument("--dry-run", action="store_true", help="print the rows; write no record")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()] or pytorch_models()
    with tempfile.TemporaryDirectory(prefix="tbench-pt2-") as scratch:
        os.environ["TBENCH_CACHE_DIR"] = str(Path(scratch) / "cache")  # a cold compile, whatever was cached before
        if args.dry_run:
            for name in models:
                print(json.dumps(try_model(name, args.size, Path(scratch))), flush=True)
            return
        with recorded(RESULTS / "pt2_adapters.json", model_sizes=[f"{m} {args.size}" for m in models]) as record:
            rows = []
            for name in models:
                rows.append(try_model(name, args.size, Path(scratch)))
                print(json.dumps(rows[-1]), flush=True)
            record["models"] = rows
            record["taken"] = [r["model"] for r in rows if r["exported"] and r.get("correct")]
            record["refused"] = {r["model"]: r["reason"] for r in rows if "reason" in r}


if __name__ == "__main__":
    main()
