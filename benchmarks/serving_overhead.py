"""Serving overhead of the embedded path: Triton (python backend running ONNX Runtime, static batching as the offline
scenario serves it) against ONNX Runtime called directly in Python on the same ONNX file with the same intra-op threads.

- latency, tiny image model (benchmarks/tiny_model.py) at batch 1, concurrency 1: Triton's average latency minus the
  direct call's, and where it goes (perf_analyzer's breakdown: client and network, queue, compute input, the python
  backend's execute round trip beyond the runtime call, compute output).
- throughput, ResNet-50 (--sizes) at batch 8: direct ONNX Runtime against Triton's best over the serving configurations
  a user would try on these cores (1 instance x all cores, or one instance per core) and concurrency 1, 2, 4.
Rounds alternate direct / Triton so that drift of a shared VM hits both sides; medians are compared.

Usage: .venv/bin/python benchmarks/serving_overhead.py [--sizes small,full] [--rounds 2]
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
from provenance import RESULTS, recorded
from tiny_model import build_tiny_image_onnx

import model_adapters
from model_adapters.file_model import ModelFileAdapter
from tbench.core.enums import Format, Scenario
from tbench.core.layout import RunLayout
from tbench.core.runtimes import source_digest
from tbench.loadgen.perf_analyzer import Point
from tbench.request.benchmark import Measurement
from tbench.stages.export import export_model
from tbench.stages.sweep import run_sweep
from tbench.triton.process_server import EmbeddedServer
from tbench.triton.repository import ServingConfig, write_repository

MEASUREMENT = Measurement()  # the defaults a run uses
THROUGHPUT_BATCH = 8


def direct_ort(model_path: str, inputs: dict, threads: int, seconds: float) -> float:
    """Seconds per call of ONNX Runtime in this process, after a warm-up."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    for _ in range(20):
        sess.run(None, inputs)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sess.run(None, inputs)
        n += 1
    return (time.perf_counter() - start) / n


def served(work: Path, tag: str, artifact, batch: int, instances: int, threads: int, concurrency: list[int]):
    """A fresh embedded server with a static-batching config; one offline-style point per concurrency."""
    repo = work / f"repo_{tag}"
    write_repository(
        repo, ServingConfig("model", batch, [], 0, instances, intra_op_threads=threads, batching="static"), artifact
    )
    layout = RunLayout(work, tag).create()
    with EmbeddedServer(repo, layout.server_log) as server:  # started on entering, stopped on leaving
        return run_sweep(
            [Point(Scenario.OFFLINE, batch, c) for c in concurrency],
            model="model",
            grpc_url=server.endpoints.grpc_url,
            spec=artifact.io_spec,
            m=MEASUREMENT,
            layout=layout,
            static={},
        )


def latency_overhead(work: Path, rounds: int, seconds: float, cores: int) -> dict:
    path = build_tiny_image_onnx(work / "tiny" / "tiny.onnx")
    adapter = ModelFileAdapter(str(path))
    artifact = export_model(adapter, adapter.build(), Format.ONNX, work / "tiny_models", "tiny")
    inputs = adapter.sample_batch(1)
    direct_ms, rows = [], []
    for r in range(rounds):
        direct_ms.append(1e3 * direct_ort(str(path), inputs, cores, seconds))
        rows.append(served(work, f"tiny{r}", artifact, 1, 1, cores, [1]).iloc[0])
    ok = [row for row in rows if row["status"] == "ok"]
    med = lambda col: float(np.median([row[col] for row in ok]))  # noqa: E731
    direct = statistics.median(direct_ms)
    server_ms = sum(
        med(c)
        for c in ("server_queue_ms", "server_compute_input_ms", "server_compute_infer_ms", "server_compute_output_ms")
    )
    result = {
        "model": "tiny image onnx (3x64x64, benchmarks/tiny_model.py)",
        "batch": 1,
        "concurrency": 1,
        "intra_op_threads": cores,
        "direct_ms": [round(d, 4) for d in direct_ms],
        "triton_avg_ms": [round(float(row["avg_ms"]), 4) for row in ok],
        "direct_median_ms": round(direct, 4),
        "triton_median_avg_ms": round(med("avg_ms"), 4),
        "overhead_ms": round(med("avg_ms") - direct, 4),
        "where": {  # medians over the rounds, ms
            "client_and_network": round(med("avg_ms") - server_ms, 4),
            "server_queue": round(med("server_queue_ms"), 4),
            "server_compute_input": round(med("server_compute_input_ms"), 4),
            "python_backend_execute_beyond_runtime": round(med("server_compute_infer_ms") - direct, 4),
            "server_compute_output": round(med("server_compute_output_ms"), 4),
        },
    }
    print(
        f"tiny batch 1: direct {direct:.3f} ms, Triton {med('avg_ms'):.3f} ms, overhead {result['overhead_ms']:.3f} ms "
        f"(goal <= 0.5): {result['where']}",
        flush=True,
    )
    return result


def throughput_ratio(work: Path, size: str, rounds: int, seconds: float, cores: int) -> dict:
    adapter = model_adapters.get("resnet50", size)
    module = adapter.build()
    artifact = export_model(adapter, module, Format.ONNX, work / f"models_{size}", source_digest("pytorch", module))
    inputs = adapter.sample_batch(THROUGHPUT_BATCH)
    configs = (
        {"1 instance x all cores": (1, cores), "1 instance per core": (cores, 1)}
        if cores > 1
        else {"1 instance": (1, 1)}
    )
    direct, best, single, per_config = [], [], [], {name: [] for name in configs}
    for r in range(rounds):
        direct.append(THROUGHPUT_BATCH / direct_ort(artifact.path, inputs, cores, seconds))
        for name, (instances, threads) in configs.items():
            table = served(
                work, f"{size}{r}_{instances}x{threads}", artifact, THROUGHPUT_BATCH, instances, threads, [1, 2, 4]
            )
            per_config[name].append(
                {int(c): round(float(t), 1) for c, t in zip(table["concurrency"], table["throughput_infer_per_s"])}
            )
        single.append(per_config[next(iter(configs))][-1][1])
        best.append(max(t for runs in per_config.values() for t in runs[-1].values() if not np.isnan(t)))
        print(
            f"resnet50 {size} round {r + 1}: direct {direct[-1]:.0f} infer/s, Triton best {best[-1]:.0f} "
            f"({per_config})",
            flush=True,
        )
    d, b, s = statistics.median(direct), statistics.median(best), statistics.median(single)
    print(
        f"resnet50 {size} batch {THROUGHPUT_BATCH}: ratio best {b / d:.3f} (goal >= 0.6), one instance at "
        f"concurrency 1 {s / d:.3f}",
        flush=True,
    )
    return {
        "model": f"resnet50 {size} onnx",
        "batch": THROUGHPUT_BATCH,
        "intra_op_threads_direct": cores,
        "direct_infer_per_s": [round(x, 1) for x in direct],
        "triton_by_config_and_concurrency": per_config,
        "direct_median": round(d, 1),
        "triton_best_median": round(b, 1),
        "ratio_best": round(b / d, 3),
        "ratio_one_instance_concurrency_1": round(s / d, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="small,full", help="ResNet-50 sizes for the throughput ratio")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="direct ONNX Runtime timing per round")
    args = parser.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    cores = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="tbench-overhead-"))
    model_sizes = ["tiny file"] + [f"resnet50 {s}" for s in sizes]
    with recorded(RESULTS / "serving_overhead.json", model_sizes=model_sizes) as record:
        record.update(measurement=MEASUREMENT.model_dump(), cores=cores, batching="static")
        record["latency"] = latency_overhead(work, args.rounds, args.seconds, cores)
        record.save()
        record["throughput"] = [throughput_ratio(work, s, args.rounds, args.seconds, cores) for s in sizes]


if __name__ == "__main__":
    main()
