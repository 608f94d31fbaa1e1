"""Serving overhead of the embedded path: Triton (python backend running ONNX Runtime) vs ONNX Runtime called
directly in Python, both at batch 8 on the same ONNX model with the same intra-op threads.

Rounds alternate direct / Triton so that drift of a shared VM hits both sides; the medians are compared.
Usage: .venv/bin/python benchmarks/serving_overhead.py [--size full|small] [--rounds 2]
Writes benchmarks/results/serving_overhead.json, whole, with its provenance (benchmarks/provenance.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import model_adapters
from tasks.export import export_model
from tbench.runtimes import source_digest
from tasks.perf import Point, run_sweep
from tasks.repository import ServingConfig, write_repository
from tasks.server import EmbeddedServer
from tbench.enums import Format, Scenario
from tbench.layout import RunLayout
from tbench.request import Measurement

from provenance import RESULTS, recorded

BATCH = 8


def direct_ort(model_path: str, inputs: dict, threads: int, seconds: float) -> float:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    sess.run(None, inputs)  # warmup
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sess.run(None, inputs)
        n += 1
    return n * BATCH / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="full")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=15.0, help="direct ORT timing per round")
    args = parser.parse_args()
    with recorded(RESULTS / "serving_overhead.json", model_sizes=[f"resnet50 {args.size}"]) as record:
        record.update(measure(args.size, args.rounds, args.seconds))


def measure(size: str, rounds: int, seconds: float) -> dict:
    threads = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="tbench-overhead-"))
    adapter = model_adapters.get("resnet50", size)
    module = adapter.build()
    artifact = export_model(adapter, module, Format.ONNX, work / "models", source_digest("pytorch", module))
    inputs = adapter.sample_batch(BATCH)
    write_repository(work / "repo", ServingConfig("resnet50", BATCH, [BATCH], 0, 1, intra_op_threads=threads), artifact)
    layout = RunLayout(work, "overhead").create()
    measurement = Measurement(images_per_window=32, stability_percentage=20, max_trials=6, retries=1)
    direct, served = [], []
    for r in range(rounds):
        direct.append(direct_ort(artifact.path, inputs, threads, seconds))
        with EmbeddedServer(work / "repo", layout.logs_dir / f"server{r}.log") as server:
            table = run_sweep([Point(Scenario.OFFLINE, BATCH, 1), Point(Scenario.OFFLINE, BATCH, 2)], model="resnet50",
                              grpc_url=server.endpoints.grpc_url, spec=artifact.io_spec, m=measurement, layout=layout, static={})
        ok = table[table["status"] == "ok"]
        served.append(float(ok["throughput_infer_per_s"].max()) if not ok.empty else float("nan"))
        print(f"round {r + 1}: direct ORT {direct[-1]:.2f} infer/s, Triton best {served[-1]:.2f} infer/s "
              f"(concurrency 1/2: {table['throughput_infer_per_s'].round(2).tolist()})")
    d, s = statistics.median(direct), float(np.nanmedian(served))
    print(f"resnet50 {size}, batch {BATCH}, {threads} intra-op threads: direct ORT {d:.2f} infer/s, "
          f"Triton {s:.2f} infer/s, ratio {s / d:.3f} (goal >= 0.8)")
    return {"model": f"resnet50 {size} onnx (python backend, embedded server)", "batch": BATCH,
            "intra_op_threads": threads, "rounds": rounds, "direct_seconds_per_round": seconds,
            "measurement": measurement.model_dump(), "direct_infer_per_s": direct, "triton_best_infer_per_s": served,
            "direct_median_infer_per_s": d, "triton_median_infer_per_s": s, "ratio": s / d}


if __name__ == "__main__":
    main()
