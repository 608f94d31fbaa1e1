"""scripts/gpu_check.sh's plan and judgement (benchmarks/gpu_check.py): the GPU paths issue 26 lists, each a case read
from what its runs wrote; skips decided by the doctor's report through preflight's own check; each command's outcome
from its exit code; and, without a GPU, every case "not executed: no GPU here"."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tbench.planning.doctor import Check, NodeReport

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
GPU, UUID = "NVIDIA H100 80GB HBM3", "GPU-1"


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


def node(*failed: Check, docker: bool = False, local_backends: tuple[str, ...] = ("python",)) -> NodeReport:
    checks = [
        Check(area="measure", name="GPUs", ok=True, detail=f"{GPU} ({UUID})"),
        Check(area="serve", name="embedded", ok=True, detail="python 3.12 stub: yes"),
        Check(area="serve", name="local", ok=True, detail="tritonserver", data={"backends": list(local_backends)}),
        Check(
            area="serve",
            name="docker",
            ok=docker,
            detail="" if docker else "no docker CLI on PATH",
            hint="" if docker else "install Docker Engine",
        ),
        Check(area="export", name="onnx -> trt", ok=True, detail="tensorrt 10.5"),
        Check(area="measure", name="perf_analyzer", ok=True, detail="Perf Analyzer Version 2.51.0"),
        Check(area="measure", name="GPU metrics", ok=True, detail="embedded: links DCGM"),
        Check(area="measure", name="CUDA in torch", ok=True, detail="torch 2.11, CUDA 13.0, 1 devices"),
        Check(area="measure", name="CUDA in onnxruntime", ok=False, detail="providers: CPUExecutionProvider"),
    ]
    return NodeReport(
        host="gpu-node", checks=[c for c in checks if c.name not in {f.name for f in failed}] + list(failed)
    )


# a bare GPU node as the kit finds it: no TensorRT, no Triton of its own
BARE = (
    Check(area="export", name="onnx -> trt", ok=False, detail="tensorrt is not importable"),
    Check(area="serve", name="local", ok=False, detail="no tritonserver on PATH"),
)


def test_the_paths_plan_is_the_issues_case_list(gpu_check):
    runs, cases = gpu_check.plan(node(*BARE))
    assert [c.name for c in cases] == [name for name, _ in gpu_check.PATHS]
    assert {c.name for c in cases} >= {
        "TorchScript on CUDA in the python backend",
        "FP16 TorchScript",
        "ONNX on the CPU of a GPU node",
        "offline points through CUDA shared memory",
        "online points",
        "Triton's GPU metrics from the serving GPU only",
        "the GPU profile's windows",
        "a capacity plan's energy per inference",
        "tbench doctor on the node",
    }
    by_key = {r.key: r for r in runs}
    fp32 = by_key["fp32"].argv
    assert fp32[:5] == ["run", "resnet50", "--size", "small", "--server=embedded"]
    assert {"--profile=gpu", "--formats=onnx,ts-script", "--serve=onnx,ts-script", "--precision=fp32"} <= set(fp32)
    assert "--precision=fp16" in by_key["fp16"].argv and "--serve=ts-script" in by_key["fp16"].argv
    assert by_key["capacity"].argv[0] == "capacity" and by_key["doctor"].argv == ["doctor", "--json"]
    # what the bare node cannot run is said, not attempted
    assert by_key["trt"].status == by_key["native"].status == gpu_check.NOT_EXECUTABLE
    assert "no TensorRT (tensorrt is not importable)" in by_key["trt"].line
    assert by_key["native"].line.startswith("no native backends: the embedded server has the python backend only")
    trt, native = cases[-2:]
    for c in (trt, native):
        gpu_check.judge(c, by_key, node(*BARE))
    assert (trt.status, native.status) == (gpu_check.NOT_EXECUTABLE,) * 2 and trt.reason and native.reason


def test_trt_and_native_backends_run_where_the_node_has_them(gpu_check):
    runs, _ = gpu_check.plan(node(local_backends=("python", "onnxruntime", "tensorrt")))
    by_key = {r.key: r for r in runs}
    assert by_key["trt"].status == by_key["native"].status == "planned"
    assert "--server=local" in by_key["trt"].argv and "--serve=trt" in by_key["trt"].argv
    _, cases = gpu_check.plan(node(Check(area="measure", name="CUDA in onnxruntime", ok=True, detail="CUDA")))
    onnx = next(c for c in cases if c.name == "ONNX on the CPU of a GPU node")
    assert onnx.status == gpu_check.NOT_EXECUTABLE and "onnxruntime has CUDA here" in onnx.reason


def test_without_a_gpu_every_case_is_not_executed(gpu_check):
    runs, cases = gpu_check.plan(node(*BARE))
    gpu_check.not_executed(runs, cases, gpu_check.NO_GPU)
    assert {(c.status, c.reason) for c in cases} == {("not executed", "no GPU here")}
    assert {(r.status, r.line) for r in runs} == {("not executed", "no GPU here")}


def test_the_committed_record_says_what_ran():
    """The record in benchmarks/results/: its cases as the issue lists them; where its machine had no GPU, every case
    is not executed, for that reason."""
    path = BENCHMARKS / "results" / "gpu_check.json"
    if not path.is_file():
        pytest.skip("no record yet")
    record = json.loads(path.read_text())
    assert all({"name", "status"} <= set(c) for c in record["cases"])
    assert {c["status"] for c in record["cases"]} <= {"passed", "failed", "not executable", "not executed"}
    if not record["provenance"]["machine"]["gpus"]:
        assert {(c["status"], c["reason"]) for c in record["cases"]} == {("not executed", "no GPU here")}
    for c in record["cases"]:
        assert c["status"] != "failed" or c["line"]
        assert c["status"] not in ("not executable", "not executed") or c["reason"]


def test_the_wide_sweep_runs_every_format_precision_seed_and_mode_once(gpu_check):
    runs, cases = gpu_check.plan(node(), ["formats", "seeds", "modes"])
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) and [r.key for r in runs] == names
    formats = [c for c in cases if c.group == "formats"]
    assert len(formats) == 14 and all("(local)" in c.name for c in formats)  # the worker image's mode
    assert {c.name for c in formats} >= {
        "resnet50 trt int8 (local)",
        "resnet50 tf-trt int8 (local)",
        "resnet50 ts-script fp16 (local)",
        "resnet50 tf-savedmodel fp16 (local)",
    }
    by_key = {r.key: r for r in runs}
    assert [by_key[c.name].request["model"] for c in cases if c.group == "seeds"] == list(gpu_check.SEEDS)
    assert [c.name for c in cases if c.group == "modes"] == [
        "resnet50 onnx fp32 (embedded)",
        "resnet50 onnx fp32 (docker)",
    ]
    trt = by_key["resnet50 trt int8 (local)"].argv
    assert trt[:10] == [
        "run",
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
    assert "--batch-sizes" in trt and "--concurrency" in trt


def test_skips_are_what_preflight_would_refuse(gpu_check):
    trt = Check(
        area="export",
        name="onnx -> trt",
        ok=False,
        detail="tensorrt is not importable",
        hint="run it on a GPU node with TensorRT (e.g. the NGC Triton image)",
    )
    report = node(trt)
    runs, _ = gpu_check.plan(report, ["formats", "seeds", "modes"])
    gpu_check.skip_reasons(runs, report)
    skipped = {r.key: r.line for r in runs if r.status == gpu_check.NOT_EXECUTABLE}
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
    runs, _ = gpu_check.plan(no_gpu, ["seeds"])
    gpu_check.skip_reasons(runs, no_gpu)
    assert all(r.status == gpu_check.NOT_EXECUTABLE and "the gpu profile needs a GPU" in r.line for r in runs)


@pytest.mark.parametrize(
    "script, status, line",
    [
        ("echo 'run 1 in /runs/x'; echo /runs/x", "passed", ""),
        ("echo 'error: this node cannot run the request: trt: ...'; exit 2", "not executable", "error: this node"),
        ("echo 'error: completed with failed points: 2 of 4'; echo /runs/x; exit 3", "failed", "error: completed"),
        ("echo Traceback; exit 1", "failed", "Traceback"),
        ("sleep 30", "failed", "no end within 1 s"),
    ],
)
def test_each_command_ends_with_its_outcome(gpu_check, tmp_path, monkeypatch, script, status, line):
    fake = tmp_path / "python"  # stands in for `python -m tbench.cli run ...`
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(gpu_check.sys, "executable", str(fake))
    runs, _ = gpu_check.plan(node(), ["modes"])
    (tmp_path / "logs").mkdir()
    gpu_check.run_command(runs[0], tmp_path / "runs", tmp_path / "logs", timeout_s=1)
    assert runs[0].status == status and runs[0].line.startswith(line) and Path(runs[0].log).is_file()


def test_a_runs_table_and_perf_logs_travel_back_with_its_log(gpu_check, tmp_path, monkeypatch):
    """Only the logs folder comes back from a lent node: a point that failed there is judged from the copies."""
    fake = tmp_path / "python"  # writes a run folder into the artifact root it is given (its last argument)
    fake.write_text(
        "#!/bin/sh\nfor a; do root=$a; done\nd=$root/run-1; mkdir -p $d/logs/perf_analyzer\n"
        "echo status > $d/results.csv; echo {} > $d/manifest.json; echo windows > $d/logs/perf_analyzer/b1.log\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(gpu_check.sys, "executable", str(fake))
    runs, _ = gpu_check.plan(node(), ["modes"])
    (tmp_path / "logs").mkdir()
    gpu_check.run_command(runs[0], tmp_path / "runs", tmp_path / "logs", timeout_s=5)
    kept = Path(runs[0].log).with_suffix("")
    assert (kept / "results.csv").read_text() == "status\n"
    assert (kept / "logs" / "perf_analyzer" / "b1.log").read_text() == "windows\n"


# --- judging what the runs wrote: a GPU node's run folders, made up ---


def row(fmt: str, scenario: str, n: int, **over) -> dict:
    on_gpu = fmt == "ts-script"
    metrics = {"gpu_util_pct": 61.0, "gpu_mem_mb": 1200.0, "gpu_power_w": 180.0, "gpu_energy_j": 42.0}
    return {
        "format": fmt,
        "scenario": scenario,
        "gpu": GPU if on_gpu else "CPU",
        "precision": "FP32",
        "status": "ok",
        "error": "",
        "batch_size": str(n) if scenario == "offline" else "1",
        "concurrency": "1" if scenario == "offline" else str(n),
        "shared_memory": "cuda" if scenario == "offline" else "none",
        "throughput_infer_per_s": "900",
        "p99_ms": "1.5",
        "measurement_request_count": "120",
        "window_s": "1.02",
        **{k: str(v) if on_gpu else "" for k, v in metrics.items()},
        **over,
    }


def write_run(folder: Path, formats: dict[str, str], rows: list[dict], precision: str = "fp32") -> Path:
    """A run folder as `tbench run` leaves it on a one-GPU node: `formats` maps each served format to its runtime."""
    folder.mkdir(parents=True)
    note = f"..., on the CPU (AMD EPYC); the node's GPU {GPU} was not used"
    served = {
        fmt: {"label": GPU, "kind": "KIND_GPU", "gpu_uuids": [UUID], "note": ""}
        if runtime == "torchscript"
        else {"label": "CPU", "kind": "KIND_CPU", "gpu_uuids": [], "note": note}
        for fmt, runtime in formats.items()
    }
    hardware = {"gpus": [GPU], "gpu_uuids": [UUID], "cpu_model": "AMD EPYC"}
    (folder / "manifest.json").write_text(json.dumps({"hardware": hardware, "served_on": served, "status": "ok"}))
    measurement = {"window_s": 1.0, "min_requests": 50}
    (folder / "request.json").write_text(
        json.dumps({"profile": "gpu", "precision": precision, "measurement": measurement})
    )
    with (folder / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (folder / "logs").mkdir()
    marks = [
        "TBENCH_DEVICE "
        + json.dumps({"model": f"resnet50_{fmt}", "runtime": rt, "device": "cuda:0" if rt == "torchscript" else "cpu"})
        for fmt, rt in formats.items()
    ]
    (folder / "logs" / "tritonserver.log").write_text("I1126 server started\n" + "\n".join(marks) + "\n")
    return folder


@pytest.fixture
def gpu_runs(gpu_check, tmp_path):
    both = {"onnx": "onnxruntime", "ts-script": "torchscript"}
    fp32 = [row(f, s, n) for f in both for s in ("offline", "online") for n in (1, 2)]
    fp16 = [row("ts-script", s, n, precision="FP16") for s in ("offline", "online") for n in (1, 2)]
    runs, cases = gpu_check.plan(node(*BARE))
    by_key = {r.key: r for r in runs}
    for key, rows, formats, precision in (
        ("fp32", fp32, both, "fp32"),
        ("fp16", fp16, {"ts-script": "torchscript"}, "fp16"),
    ):
        by_key[key].status, by_key[key].exit_code = gpu_check.PASSED, 0
        by_key[key].folder = str(write_run(tmp_path / key, formats, rows, precision))
    cap = tmp_path / "capacity"
    cap.mkdir()
    plan = {"joules_per_inference": 0.21, "sustainable_rps": 800.0, "usd_per_million": None}
    (cap / "capacity.json").write_text(json.dumps({"answers": [{"plan": plan}]}))
    by_key["capacity"].status, by_key["capacity"].folder = gpu_check.PASSED, str(cap)
    by_key["doctor"].status = gpu_check.PASSED
    return by_key, cases


def judged(gpu_check, by_key, cases) -> dict:
    for c in cases:
        c.status, c.line, c.reason = "planned", "", ""
        gpu_check.judge(c, by_key, node(*BARE))
    return {c.name: c for c in cases}


def test_a_gpu_nodes_runs_pass_every_path(gpu_check, gpu_runs):
    by_key, cases = gpu_runs
    out = judged(gpu_check, by_key, cases)
    assert {n: c.status for n, c in out.items() if c.status != "passed"} == {
        "TensorRT": "not executable",
        "native backends": "not executable",
    }
    ts = out["TorchScript on CUDA in the python backend"].evidence
    assert (ts["gpu"], ts["uuid"], ts["instances"]) == (GPU, UUID, ["cuda:0"])
    energy = out["a capacity plan's energy per inference"].evidence
    assert (energy["joules_per_inference"], energy["sustainable_rps"]) == (0.21, 800.0)
    assert out["Triton's GPU metrics from the serving GPU only"].evidence["serving_gpu"] == UUID


@pytest.mark.parametrize(
    "key, fmt, change, case, line",
    [
        (
            "fp32",
            "ts-script",
            {"gpu_power_w": ""},
            "Triton's GPU metrics from the serving GPU only",
            "gpu_power_w missing on 1 of 4 GPU-served points",
        ),
        ("fp32", "onnx", {"gpu_util_pct": "55"}, "Triton's GPU metrics from the serving GPU only", "CPU-served onnx"),
        (
            "fp32",
            "onnx",
            {"shared_memory": "system"},
            "offline points through CUDA shared memory",
            "sent their tensors",
        ),
        ("fp32", "onnx", {"status": "unstable", "error": "spread 31%"}, "online points", "onnx online points not ok"),
        ("fp32", "ts-script", {"measurement_request_count": "16"}, "the GPU profile's windows", "fewer than 50"),
        ("fp16", "ts-script", {"precision": "FP32"}, "FP16 TorchScript", "not FP16"),
        ("fp32", "ts-script", {"gpu": "CPU"}, "TorchScript on CUDA in the python backend", "labelled ['CPU', "),
    ],
)
def test_each_path_fails_with_the_line_that_says_why(gpu_check, gpu_runs, key, fmt, change, case, line):
    by_key, cases = gpu_runs
    path = Path(by_key[key].folder) / "results.csv"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    scenario = "offline" if "shared_memory" in change else "online"
    target = next(r for r in rows if r["format"] == fmt and r["scenario"] == scenario)
    target.update(change)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    out = judged(gpu_check, by_key, cases)
    assert out[case].status == "failed" and line in out[case].line, out[case].line
    others = {n for n, c in out.items() if c.status == "failed"}
    assert case in others


def test_a_run_that_failed_is_named_in_its_cases_lines(gpu_check, gpu_runs):
    by_key, cases = gpu_runs
    fp16 = by_key["fp16"]
    fp16.status, fp16.line, fp16.folder = gpu_check.FAILED, "error: RuntimeError during export-ts-script: half", None
    out = judged(gpu_check, by_key, cases)
    assert out["FP16 TorchScript"].status == "failed"
    assert "(the fp16 command: error: RuntimeError during export-ts-script: half)" in out["FP16 TorchScript"].line
    assert out["TorchScript on CUDA in the python backend"].status == "passed"
