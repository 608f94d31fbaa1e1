"""scripts/gpu_check.sh's plan (benchmarks/gpu_check.py): every GPU path once, skips decided by the doctor's report
through preflight's own check, and each case's outcome from `tbench run`'s exit code."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tbench.doctor import Check, NodeReport

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def gpu_check():
    sys.path.insert(0, str(BENCHMARKS))  # the benchmarks import their provenance module as scripts do
    try:
        spec = importlib.util.spec_from_file_location("benchmarks_gpu_check", BENCHMARKS / "gpu_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclass looks its module up while it is being made
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))
        sys.modules.pop("benchmarks_gpu_check", None)


def node(*failed: Check, docker: bool = False) -> NodeReport:
    checks = [
        Check(area="measure", name="GPUs", ok=True, detail="NVIDIA H100 80GB HBM3 (GPU-1)"),
        Check(area="serve", name="embedded", ok=True),
        Check(area="serve", name="local", ok=True),
        Check(
            area="serve",
            name="docker",
            ok=docker,
            detail="" if docker else "no docker CLI on PATH",
            hint="" if docker else "install Docker Engine",
        ),
    ]
    return NodeReport(
        host="gpu-node", checks=[c for c in checks if c.name not in {f.name for f in failed}] + list(failed)
    )


def test_every_format_precision_seed_and_mode_once(gpu_check):
    cases = gpu_check.plan(node())
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    formats = [c for c in cases if c.group == "formats"]
    assert len(formats) == 14 and all("(local)" in c.name for c in formats)  # the worker image's mode
    assert {c.name for c in formats} >= {
        "resnet50 trt int8 (local)",
        "resnet50 tf-trt int8 (local)",
        "resnet50 ts-script fp16 (local)",
        "resnet50 tf-savedmodel fp16 (local)",
    }
    assert [c.request["model"] for c in cases if c.group == "seeds"] == list(gpu_check.SEEDS)
    assert [c.name for c in cases if c.group == "modes"] == [
        "resnet50 onnx fp32 (embedded)",
        "resnet50 onnx fp32 (docker)",
    ]
    trt = next(c for c in formats if c.name == "resnet50 trt int8 (local)")
    assert trt.args[:9] == [
        "resnet50",
        "--size",
        "small",
        "--server=local",
        "--profile=gpu",
        "--framework=pytorch",
        "--formats=trt",
        "--serve=trt",
        "--precision=int8",
    ]
    assert "--batch-sizes" in trt.args and "--concurrency" in trt.args


def test_skips_are_what_preflight_would_refuse(gpu_check):
    trt = Check(
        area="export",
        name="onnx -> trt",
        ok=False,
        detail="tensorrt is not importable",
        hint="run it on a GPU node with TensorRT (e.g. the NGC Triton image)",
    )
    report = node(trt)
    cases = gpu_check.plan(report)
    gpu_check.skip_reasons(cases, report)
    skipped = {c.name: c.detail for c in cases if c.status == "skipped"}
    assert set(skipped) == {
        "resnet50 trt fp32 (local)",
        "resnet50 trt fp16 (local)",
        "resnet50 trt int8 (local)",
        "resnet50 onnx fp32 (docker)",
    }
    assert skipped["resnet50 trt int8 (local)"].startswith(
        "trt: onnx -> trt cannot run here: tensorrt is not importable"
    )
    assert skipped["resnet50 onnx fp32 (docker)"] == "--server docker: no docker CLI on PATH; install Docker Engine"
    no_gpu = node(Check(area="measure", name="GPUs", ok=False, detail="none: no nvidia-smi on PATH"))
    cases = gpu_check.plan(no_gpu, ["seeds"])
    gpu_check.skip_reasons(cases, no_gpu)
    assert all(c.status == "skipped" and "the gpu profile needs a GPU" in c.detail for c in cases)


@pytest.mark.parametrize(
    "script, status, detail",
    [
        ("echo 'run 1 in /runs/x'; echo /runs/x", "passed", "/runs/x"),
        ("echo 'error: this node cannot run the request: trt: ...'; exit 2", "refused", "error: this node cannot run"),
        ("echo 'completed with failed points: 2 of 4'; exit 3", "failed", "completed with failed points"),
        ("echo Traceback; exit 1", "failed", "Traceback"),
        ("sleep 30", "timeout", "no end within 1 s"),
    ],
)
def test_each_case_ends_with_its_runs_outcome(gpu_check, tmp_path, monkeypatch, script, status, detail):
    fake = tmp_path / "python"  # stands in for `python -m tbench.cli run ...`
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(gpu_check.sys, "executable", str(fake))
    case = gpu_check.plan(node(), ["modes"])[0]
    (tmp_path / "logs").mkdir()
    gpu_check.run_case(case, tmp_path / "runs", tmp_path / "logs", timeout_s=1)
    assert case.status == status and case.detail.startswith(detail) and Path(case.log).is_file()
