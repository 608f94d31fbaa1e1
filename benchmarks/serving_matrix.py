"""The serving matrix (issue 56): per reference seed and per kind of Triton server, the format each of its models is
served in and through which backend, as tbench's plan decides it before anything is exported. The plan is the call a
run makes once its server has said what it can do (`RunPlan.on_server`), made here for each server kind's
capabilities, on a CPU node and on a GPU node.

Server kinds:
- `embedded`: the nvidia-pytriton wheel's server as this machine has it (python backend only; the stub runs this
  environment, so every runtime installed here).
- `embedded, no TensorFlow`: the same with TensorFlow out of the python backend's reach (how
  benchmarks/todays_stack.py ran its seeds "without the TensorFlow backend").
- `tbench-triton-cpu image`: infra/build_cpu_image.py's docker image (python backend, onnxruntime only; an NGC-like
  server without the TensorFlow backend that builds here; its version is unnamed by its tag).
- `NGC 26.10`, the docker default: NGC's layout from 25.03 on (no TensorFlow backend; no framework in its python
  backend's environment), Triton 2.74.
- `NGC 25.02`: the last NGC layout with the TensorFlow backend, Triton 2.55.

Beside each cell where one exists, the e2e run that shows it on this machine: benchmarks/results/todays_stack.json's
runs of the TensorFlow seeds on the embedded server with and without TensorFlow, and on the CPU image in docker mode
(its part 3; each run's `served_by`, read back and set against the plan: `agrees`). NGC's images cannot be pulled
here (no registry reachable), so their cells are the plan alone.

Usage: .venv/bin/python benchmarks/serving_matrix.py
Writes benchmarks/results/serving_matrix.json with its provenance.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from provenance import RESULTS, recorded

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # standalone: the repository's tbench

from tbench.core.enums import Format  # noqa: E402
from tbench.core.errors import ConfigError  # noqa: E402
from tbench.node.hardware import Hardware  # noqa: E402
from tbench.planning.run_plan import RunPlan  # noqa: E402
from tbench.request.adapter import adapter_for  # noqa: E402
from tbench.request.benchmark import PYTHON_BACKEND_RUNTIMES, BenchmarkRequest  # noqa: E402
from tbench.triton.capabilities import ServerCapabilities, ngc_release_version  # noqa: E402

# (model, framework): the reference seeds, each in the frameworks tbench builds it from
SEEDS = [
    ("resnet50", "tensorflow"),
    ("resnet50", "pytorch"),
    ("widedeep", "tensorflow"),
    ("dlrm", "tensorflow"),
    ("dcnv2", "tensorflow"),
    ("fastpitch", "pytorch"),
    ("nnunet", "pytorch"),
]
# NGC's backend folders (the ones a plan can use; fil, identity and the like serve no format of ours)
NGC_BACKENDS = frozenset({"onnxruntime", "openvino", "python", "pytorch", "tensorrt"})
NODES = {
    "cpu": Hardware(cpu_model="cpu", cpu_cores=16, memory_gib=64.0, gpus=[], os="Linux"),
    "gpu": Hardware(cpu_model="cpu", cpu_cores=16, memory_gib=64.0, gpus=["NVIDIA A100"], os="Linux"),
}
RECORD_RUNS = RESULTS / "todays_stack.json"
CPU_IMAGE = "tbench-triton-cpu image"


def kind_of_run(run: dict) -> str | None:
    """The server kind a todays_stack.json run served on: its part 1's by `without_tf`, its part 3's the CPU image."""
    if run.get("part") == "cpu_image":
        return CPU_IMAGE
    if run.get("part") == "seeds_without_tf_backend":
        return "embedded, no TensorFlow" if run["without_tf"] else "embedded"
    return None


def server_kinds() -> dict[str, ServerCapabilities]:
    from tbench.triton.process_server import EmbeddedServer

    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedServer(Path(tmp), Path(tmp) / "s.log").read_capabilities()
    return {
        "embedded": embedded,
        "embedded, no TensorFlow": replace(embedded, python_runtimes=embedded.python_runtimes - {"tensorflow"}),
        CPU_IMAGE: ServerCapabilities(
            None, frozenset({"python"}), frozenset({"onnxruntime"}), "image built here", mode="docker"
        ),
        "NGC 26.10": ServerCapabilities(
            ngc_release_version("26.10"), NGC_BACKENDS, frozenset(), "image tag (26.10)", mode="docker"
        ),
        "NGC 25.02": ServerCapabilities(
            ngc_release_version("25.02"), NGC_BACKENDS | {"tensorflow"}, frozenset(), "image tag (25.02)", mode="docker"
        ),
    }


def backend_label(fmt: Format, caps: ServerCapabilities) -> str:
    """What serves `fmt` on that server, as a run's manifest says it (`served_by`): the backend, or python (runtime)."""
    if fmt is Format.ENSEMBLE:
        return "ensemble"
    return caps.backend_of(fmt) if caps.native(fmt) else f"python ({PYTHON_BACKEND_RUNTIMES[fmt]})"


def cell(model: str, framework: str, caps: ServerCapabilities, node: Hardware) -> dict:
    """One seed on one server kind and node: each served model's format and backend, why any was re-planned, or the
    one line a run would refuse it with."""
    req = BenchmarkRequest(model=model, framework=framework).resolve(node.has_gpu)
    adapter = adapter_for(req)
    try:
        plan = RunPlan(req, node).on_server(caps, adapter.part_formats())
    except ConfigError as err:
        return {"refused": str(err)}
    served = {f.value: backend_label(f, caps) for f in plan.req.serve_formats}
    out = {"planned": [f.value for f in req.serve_formats], "served": served, "replanned": plan.replanned}
    if plan.part_formats:
        out["parts"] = {
            part: {"served_as": fmts[0].value, "by": backend_label(fmts[0], caps)}
            for part, fmts in plan.part_formats.items()
        }
        out["replanned_parts"] = plan.replanned_parts
    return out


def shown_by(model: str, framework: str, kind: str, planned: dict, runs: list[dict]) -> dict | None:
    """The e2e run of todays_stack.json on this machine that served this seed on this kind of server (CPU), and
    whether what it served is what the plan says."""
    for run in runs:
        if kind_of_run(run) != kind or run["model"] != model or framework != "tensorflow" or not run.get("ok"):
            continue
        served_by = run.get("served_by") or {}
        if "parts" in planned:  # "ensemble of dlrm_sparse (python (tensorflow)), dlrm_dense (python (onnxruntime))"
            text = served_by.get("ensemble", "")
            agrees = all(f"{model}_{part} ({p['by']})" in text for part, p in planned["parts"].items())
        else:
            agrees = all(served_by.get(fmt, "").startswith(by) for fmt, by in planned["served"].items())
        return {
            "record": str(RECORD_RUNS.relative_to(RESULTS.parent.parent)),
            "run_dir": run["run_dir"],
            "served_by": served_by,
            "agrees": agrees,
        }
    return None


def main() -> int:
    kinds = server_kinds()
    runs = json.loads(RECORD_RUNS.read_text()).get("runs", []) if RECORD_RUNS.is_file() else []
    with recorded(RESULTS / "serving_matrix.json", model_sizes=["no model: each seed's plan, none run"]) as record:
        record["server_kinds"] = {name: caps.manifest() | {"mode": caps.mode} for name, caps in kinds.items()}
        matrix = record["matrix"] = {}
        for model, framework in SEEDS:
            seed = matrix[f"{model} ({framework})"] = {}
            for kind, caps in kinds.items():
                seed[kind] = {node: cell(model, framework, caps, hw) for node, hw in NODES.items()}
                shown = shown_by(model, framework, kind, seed[kind]["cpu"], runs)
                if shown:
                    seed[kind]["cpu"]["shown_by"] = shown
        record["summary"] = {
            "cells": sum(len(n) for s in matrix.values() for n in s.values()),
            "refused": sum("refused" in c for s in matrix.values() for n in s.values() for c in n.values()),
            "shown_by_e2e": sum("shown_by" in n["cpu"] for s in matrix.values() for n in s.values()),
            "e2e_agree": all(
                n["cpu"]["shown_by"]["agrees"] for s in matrix.values() for n in s.values() if "shown_by" in n["cpu"]
            ),
        }
        print(json.dumps(record["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
