"""The GPU check: tbench's GPU paths, each executed on a GPU node and judged from what its run wrote (the manifest,
results, request, server log, capacity plan), each recorded as a case with a status: passed; failed, with the line
that says why; not executable there, with the reason (no TensorRT, no native backends...); or not executed, with the
reason (no GPU here, --dry-run).

The default plan ("paths") is the list of issue 26, read from four commands (each a subprocess with its own server,
on a reduced grid; a failure is recorded and the next one runs):
  fp32      tbench run resnet50 --size small --profile gpu --server embedded --formats onnx,ts-script (both served)
  fp16      tbench run resnet50 ... --formats ts-script --precision fp16
  capacity  tbench capacity --model-file <fp32's TorchScript file> (served by the python backend on the GPU)
  doctor    tbench doctor --json
  cases: TorchScript on CUDA in the python backend (labelled with the GPU's name and UUID) | FP16 TorchScript | ONNX
  on the CPU of a GPU node (labelled CPU, the unused GPU named) | offline points through CUDA shared memory | online
  points | Triton's GPU metrics (utilisation, memory, power, energy) from the serving GPU only | the GPU profile's
  windows | a capacity plan's energy per inference | tbench doctor on the node | TensorRT | native backends (the last
  two run only where the node has TensorRT and a Triton with native backends, e.g. the worker image).
The wider sweep for an image with every backend stays: --plan formats,seeds,modes (each format at FP32/FP16, INT8
where it applies; each seed's gpu profile; each server mode), each case one `tbench run` judged by its exit code.

Cases this node cannot run are not started: preflight's own check (planning.doctor.missing_for) on the doctor's report
says why; a run that refuses (exit 2: this node cannot run it) is not executable there, with its line. Without a GPU
nothing runs: every case is "not executed: no GPU here" (--cpu-rehearsal runs the paths on a CPU all the same, to
rehearse the check itself).

Usage: scripts/gpu_check.sh [--kit gpu_kit] [--plan paths|formats,seeds,modes] [--only TEXT] [--dry-run]
       [--timeout-s 300] [--output DIR] [--record PATH]
Writes benchmarks/results/gpu_check.json, whole, with its provenance (benchmarks/provenance.py): the doctor's
report, the kit, each command (its status, seconds, folder, log) and each case; after every command an interim copy
marked "complete": false. `timing` holds the kit's set-up and the check's own seconds.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from provenance import REPO, RESULTS, recorded

PASSED, FAILED, NOT_EXECUTABLE, NOT_EXECUTED = "passed", "failed", "not executable", "not executed"
NO_GPU = "no GPU here"
GROUPS = ("paths", "formats", "seeds", "modes")
# a point or two per scenario: each path is exercised, not measured for its numbers
REDUCED = ["--batch-sizes", "1,2", "--concurrency", "1,2", "--window-s", "1", "--max-trials", "5"]
# the seeds at their smallest size (tbench models; dlrm and dcnv2 are ensembles whose dense part is trt on gpu)
SEEDS = {
    "resnet50": "small",
    "widedeep": "small",
    "fastpitch": "small",
    "dlrm": "tiny",
    "dcnv2": "tiny",
    "nnunet": "small",
}
# (framework, format, precisions) of ResNet-50, the model with every format
FORMATS = [
    ("pytorch", "onnx", ("fp32", "fp16")),
    ("pytorch", "ts-trace", ("fp32", "fp16")),
    ("pytorch", "ts-script", ("fp32", "fp16")),
    ("pytorch", "trt", ("fp32", "fp16", "int8")),
    ("tensorflow", "tf-savedmodel", ("fp32", "fp16")),
    ("tensorflow", "tf-trt", ("fp32", "fp16", "int8")),
]
MODES = ("embedded", "local", "docker")
NATIVE = ("onnxruntime", "pytorch", "tensorflow", "tensorrt")  # Triton's native backends the gpu profile serves
# the capacity case: one configuration, a few rates; a loose SLO, so that a rate is found quickly
CAPACITY = ["--slo-p99-ms", "50", "--traffic", "100", "--instances", "1", "--max-batch-sizes", "8", "--max-points", "3"]
CAPACITY += ["--window-s", "1"]
GPU_METRICS = ("gpu_util_pct", "gpu_mem_mb", "gpu_power_w", "gpu_energy_j")


@dataclass
class Run:
    """One tbench command whose output one or more cases read."""

    key: str
    argv: list[str]  # after `python -m tbench.cli`
    request: dict | None = None  # BenchmarkRequest fields, for doctor.missing_for (None: not a benchmark)
    status: str = "planned"  # passed (exit 0), failed, not executable (refused), not executed
    line: str = ""  # why it failed, was refused or did not run; a failure's last line
    folder: str | None = None  # the run folder it wrote
    exit_code: int | None = None
    seconds: float | None = None
    log: str | None = None


@dataclass
class Case:
    """One GPU path and its status: passed; failed, with `line`; not executable or not executed, with `reason`."""

    name: str
    group: str
    runs: list[str]  # the keys of the runs it reads
    status: str = "planned"
    reason: str = ""
    line: str = ""
    evidence: dict = field(default_factory=dict)  # what was read of the runs, passed or failed


# --- plans ---


def bench_run(key: str, model: str, size: str, server: str, profile: str = "gpu", *extra: str, **fields) -> Run:
    flags = [f"--{k}={v}" for k, v in fields.items() if k in ("framework", "formats", "serve", "precision")]
    request = {
        "model": model,
        "size": size,
        "server": server,
        "profile": profile,
        **{k: v for k, v in fields.items() if k in ("framework", "precision")},
        **(
            {"formats": fields["formats"].split(","), "serve_formats": fields["serve"].split(",")}
            if "formats" in fields
            else {}
        ),
    }
    argv = ["run", model, "--size", size, f"--server={server}", f"--profile={profile}", *flags, *REDUCED, *extra]
    return Run(key, argv, request)


def serving_mode(report) -> str:
    """The mode the wide sweep's formats are served in: local (the worker image's), else docker, else embedded."""
    return next((m for m in ("local", "docker") if (c := report.get(m)) and c.ok), "embedded")


def wide_plan(report, groups) -> tuple[list[Run], list[Case]]:
    """The wider sweep: one run per case, judged by its exit code."""
    mode = serving_mode(report)
    runs: list[Run] = []

    def add(group: str, name: str, run: Run) -> None:
        run.key = name
        runs.append(run)
        cases.append(Case(name, group, [name]))

    cases: list[Case] = []
    if "formats" in groups:
        for framework, fmt, precisions in FORMATS:
            for p in precisions:
                run = bench_run("", "resnet50", "small", mode, framework=framework, formats=fmt, serve=fmt, precision=p)
                add("formats", f"resnet50 {fmt} {p} ({mode})", run)
    if "seeds" in groups:
        for model, size in SEEDS.items():
            add("seeds", f"{model} {size} gpu profile ({mode})", bench_run("", model, size, mode))
    if "modes" in groups:  # the formats group's onnx fp32 case in each mode; the one it already runs, once
        planned = [r.argv for r in runs]
        for m in MODES:
            run = bench_run(
                "", "resnet50", "small", m, framework="pytorch", formats="onnx", serve="onnx", precision="fp32"
            )
            if run.argv not in planned:
                add("modes", f"resnet50 onnx fp32 ({m})", run)
    return runs, cases


PATHS = [
    # (case, the runs it reads)
    ("TorchScript on CUDA in the python backend", ["fp32"]),
    ("FP16 TorchScript", ["fp16"]),
    ("ONNX on the CPU of a GPU node", ["fp32"]),
    ("offline points through CUDA shared memory", ["fp32"]),
    ("online points", ["fp32"]),
    ("Triton's GPU metrics from the serving GPU only", ["fp32"]),
    ("the GPU profile's windows", ["fp32", "fp16"]),
    ("a capacity plan's energy per inference", ["capacity"]),
    ("tbench doctor on the node", ["doctor"]),
    ("TensorRT", ["trt"]),
    ("native backends", ["native"]),
]


def paths_plan(report, profile: str = "gpu") -> tuple[list[Run], list[Case]]:
    ts = {"framework": "pytorch", "formats": "ts-script", "serve": "ts-script"}
    both = {"framework": "pytorch", "formats": "onnx,ts-script", "serve": "onnx,ts-script"}
    runs = [
        bench_run("fp32", "resnet50", "small", "embedded", profile, precision="fp32", **both),
        bench_run("fp16", "resnet50", "small", "embedded", profile, precision="fp16", **ts),
        Run("capacity", ["capacity", "--server=embedded", *CAPACITY]),  # --model-file: the fp32 run's, when done
        Run("doctor", ["doctor", "--json"]),
    ]
    cases = [Case(name, "paths", keys) for name, keys in PATHS]
    native = report.get("local")
    backends = set(native.data.get("backends", [])) if native and native.ok else set()
    trt_export = report.get("onnx -> trt")
    why_trt = [] if trt_export and trt_export.ok else [f"no TensorRT ({trt_export.detail if trt_export else '?'})"]
    if "tensorrt" not in backends:
        why_trt.append(f"no server with Triton's tensorrt backend ({native.detail if native else '?'})")
    why_native = (
        []
        if backends & set(NATIVE)
        else [
            "no native backends: the embedded server has the python backend only, and the local server: "
            + (native.detail if native else "not checked")
        ]
    )
    for key, why, fmt, precision in (("trt", why_trt, "trt", "fp16"), ("native", why_native, "onnx", "fp32")):
        run = bench_run(
            key, "resnet50", "small", "local", profile, framework="pytorch", formats=fmt, serve=fmt, precision=precision
        )
        if why:
            run.status, run.line = NOT_EXECUTABLE, "; ".join(why)
        runs.append(run)
    onnx_cuda = report.get("CUDA in onnxruntime")
    if onnx_cuda and onnx_cuda.ok:
        case = next(c for c in cases if c.name == "ONNX on the CPU of a GPU node")
        case.status, case.reason = (
            NOT_EXECUTABLE,
            f"onnxruntime has CUDA here ({onnx_cuda.detail}): ONNX is served on the GPU",
        )
    return runs, cases


def plan(report, groups=("paths",), profile: str = "gpu") -> tuple[list[Run], list[Case]]:
    runs, cases = paths_plan(report, profile) if "paths" in groups else ([], [])
    wide = wide_plan(report, [g for g in groups if g != "paths"])
    return runs + wide[0], cases + wide[1]


def skip_reasons(runs: list[Run], report) -> None:
    """Mark the runs this node cannot run, with preflight's own reasons."""
    from tbench.planning.doctor import missing_for
    from tbench.request.benchmark import BenchmarkRequest

    for r in runs:
        if r.status == "planned" and r.request and (missing := missing_for(BenchmarkRequest(**r.request), report)):
            r.status, r.line = NOT_EXECUTABLE, " | ".join(missing)


# --- running ---


def doctor_report(seconds: list | None = None):
    from tbench.planning.doctor import NodeReport

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tbench.cli", "doctor", "--json"], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    if seconds is not None:
        seconds.append(round(time.monotonic() - started, 1))
    if done.returncode != 0:
        raise SystemExit(f"tbench doctor --json failed: {done.stderr.strip().splitlines()[-1:]}")
    return NodeReport.model_validate_json(done.stdout[done.stdout.index("{") :])


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""


def error_line(text: str) -> str:
    """The line that says why a command failed: its `error:` line, else its last."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("error:")]
    return lines[-1][:500] if lines else last_line(text)


def run_folder(root: Path) -> Path | None:
    """The run folder a command wrote under its own artifact root (beside it, the results dataset)."""
    if not root.is_dir():
        return None
    found = [p for p in root.iterdir() if (p / "manifest.json").is_file() or (p / "capacity.json").is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def run_command(r: Run, output: Path, logs: Path, timeout_s: float) -> None:
    """One tbench command in its own process group, with its own artifact root: a timeout stops it (SIGTERM: it stops
    its server) and whatever it started."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", r.key).strip("_")
    log = logs / f"{len(list(logs.iterdir())):02d}-{slug}.log"
    r.log = str(log)
    root = output / slug
    argv = [*r.argv, "-o", str(root)] if r.argv[0] in ("run", "capacity") else r.argv
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tbench.cli", *argv],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            r.exit_code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            r.exit_code = None
    r.seconds = round(time.monotonic() - started, 1)
    text = log.read_text(errors="replace")
    folder = run_folder(root)
    r.folder = str(folder) if folder else None
    keep_evidence(folder, log.with_suffix(""))
    if r.exit_code is None:
        r.status, r.line = FAILED, f"no end within {timeout_s:.0f} s"
    elif r.exit_code == 0:
        r.status, r.line = PASSED, ""
    elif r.exit_code == 2 and "cannot run" in error_line(text):  # refused: what it needs, what it cannot apply
        r.status, r.line = NOT_EXECUTABLE, error_line(text)
    else:  # 3: some points failed; 1: the run failed; 2, not refused: options this check got wrong
        r.status, r.line = FAILED, error_line(text)


def keep_evidence(folder: Path | None, into: Path) -> None:
    """A run's results table and perf_analyzer logs beside its log: the logs folder is what travels back from a lent
    node (the run folders stay there), and a failed point is judged from its windows."""
    if folder is None:
        return
    perf_logs = sorted((folder / "logs" / "perf_analyzer").glob("*.log"))
    for src in [folder / "results.csv", folder / "capacity.json", *perf_logs]:
        if src.is_file():
            (into / src.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, into / src.relative_to(folder))


def capacity_argv(r: Run, fp32: Run) -> str | None:
    """The capacity command on the fp32 run's TorchScript file (served by the python backend on the GPU); why not,
    when that run left none."""
    try:
        artifacts = json.loads((Path(fp32.folder) / "artifacts.json").read_text())
        ts = next(a for a in artifacts if a["format"] == "ts-script")
    except (TypeError, OSError, ValueError, StopIteration):
        return "no TorchScript file from the fp32 run" + (f" ({fp32.status}: {fp32.line})" if fp32.line else "")
    try:  # the file's own input names (its forward's arguments), in the io spec's order
        import torch

        names = [a.name for a in torch.jit.load(ts["path"], map_location="cpu").forward.schema.arguments[1:]]
    except Exception as err:
        return f"cannot read the inputs of {ts['path']}: {type(err).__name__}: {err}"[:500]
    shapes = [f"{n}:{','.join(str(d) for d in t['shape'])}" for n, t in zip(names, ts["io_spec"]["inputs"])]
    r.argv = [r.argv[0], "--model-file", ts["path"], *(f"--shape={s}" for s in shapes), *r.argv[1:]]
    return None


# --- judging ---


def rows(folder: Path) -> list[dict]:
    path = folder / "results.csv"
    if not path.is_file():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def number(row: dict, key: str) -> float | None:
    try:
        return float(row.get(key) or "nan") if (row.get(key) or "") != "" else None
    except ValueError:
        return None


@dataclass
class Seen:
    """What a run left: its folder's manifest, request, results and server log."""

    run: Run
    manifest: dict = field(default_factory=dict)
    request: dict = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    log: str = ""
    capacity: dict = field(default_factory=dict)

    @classmethod
    def of(cls, run: Run) -> Seen:
        seen = cls(run)
        folder = Path(run.folder) if run.folder else None
        if folder is None or not folder.is_dir():
            return seen
        for name, attr in (("manifest.json", "manifest"), ("request.json", "request"), ("capacity.json", "capacity")):
            if (folder / name).is_file():
                setattr(seen, attr, json.loads((folder / name).read_text()))
        seen.rows = rows(folder)
        if (folder / "logs" / "tritonserver.log").is_file():
            seen.log = (folder / "logs" / "tritonserver.log").read_text(errors="replace")
        return seen

    def of_format(self, fmt: str) -> list[dict]:
        return [r for r in self.rows if r.get("format") == fmt]

    def gpu(self) -> tuple[str | None, str | None]:
        hw = self.manifest.get("hardware") or {}
        return (hw.get("gpus") or [None])[0], (hw.get("gpu_uuids") or [None])[0]


class Failed(Exception):
    """A case's evidence says it failed; the message is its line."""


def need(condition: bool, line: str) -> None:
    if not condition:
        raise Failed(line)


def ok_rows(rs: list[dict]) -> list[dict]:
    return [r for r in rs if r.get("status") == "ok"]


def reports(seen: Seen, runtime: str) -> list[dict]:
    from tbench.triton.serving import device_reports

    return [r for rs in device_reports(seen.log).values() for r in rs if r.get("runtime") == runtime]


def served_on_gpu(seen: Seen, fmt: str, runtime: str) -> dict:
    gpu, uuid = seen.gpu()
    need(gpu is not None, "the run's manifest names no GPU")
    where = (seen.manifest.get("served_on") or {}).get(fmt)
    need(where is not None, f"the {seen.run.key} run's manifest says nowhere where {fmt} was served")
    need(
        where["label"] == gpu and where["gpu_uuids"] == [uuid] and where["kind"] == "KIND_GPU",
        f"{fmt} served on {where['label']} {where['gpu_uuids']} ({where['kind']}), not on {gpu} ({uuid})"
        + (f": {where['note']}" if where.get("note") else ""),
    )
    devices = reports(seen, runtime)
    need(bool(devices), f"no {runtime} instance reported its device in the server log")
    need(
        all(str(d.get("device", "")).startswith("cuda") for d in devices),
        f"{runtime} instances report {sorted({d.get('device') for d in devices})}",
    )
    labelled = {r.get("gpu") for r in seen.of_format(fmt)}
    need(labelled == {gpu}, f"{fmt}'s results are labelled {sorted(labelled)}, not {gpu}")
    good = ok_rows(seen.of_format(fmt))
    need(bool(good), f"no {fmt} point measured ok ({len(seen.of_format(fmt))} points)")
    return {
        "gpu": gpu,
        "uuid": uuid,
        "served_on": where,
        "instances": [d.get("device") for d in devices],
        "ok_points": len(good),
        "best_infer_per_s": max(number(r, "throughput_infer_per_s") or 0 for r in good),
    }


def check_torchscript_cuda(seen: dict[str, Seen]) -> dict:
    return served_on_gpu(seen["fp32"], "ts-script", "torchscript")


def check_fp16(seen: dict[str, Seen]) -> dict:
    fp16 = seen["fp16"]
    evidence = served_on_gpu(fp16, "ts-script", "torchscript")
    precisions = {r.get("precision") for r in fp16.of_format("ts-script")}
    need(precisions == {"FP16"}, f"the points were served at {sorted(precisions)}, not FP16")
    return {**evidence, "precision": "FP16"}


def check_onnx_cpu(seen: dict[str, Seen]) -> dict:
    fp32 = seen["fp32"]
    gpu, _ = fp32.gpu()
    where = (fp32.manifest.get("served_on") or {}).get("onnx")
    need(where is not None, "the fp32 run's manifest says nowhere where onnx was served")
    need(where["label"] == "CPU" and not where["gpu_uuids"], f"onnx served on {where['label']} {where['gpu_uuids']}")
    need(bool(gpu) and gpu in where.get("note", ""), f"the label's note does not name the unused GPU: {where!r}")
    devices = reports(fp32, "onnxruntime")
    need(bool(devices) and all(d.get("device") == "cpu" for d in devices), f"onnxruntime instances report {devices}")
    labelled = {r.get("gpu") for r in fp32.of_format("onnx")}
    need(labelled == {"CPU"}, f"onnx's results are labelled {sorted(labelled)}, not CPU")
    good = ok_rows(fp32.of_format("onnx"))
    need(bool(good), f"no onnx point measured ok ({len(fp32.of_format('onnx'))} points)")
    return {"served_on": where, "instances": [d.get("device") for d in devices], "ok_points": len(good)}


def scenario_rows(seen: Seen, scenario: str) -> dict[str, list[dict]]:
    by_format: dict[str, list[dict]] = {}
    for r in seen.rows:
        if r.get("scenario") == scenario:
            by_format.setdefault(r.get("format", "?"), []).append(r)
    return by_format


def not_ok(rows: list[dict], label: str, key: str) -> str:
    """The points that did not measure ok, one 'LABEL VALUE: STATUS ERROR' each, '; '-joined ('' when none)."""
    return "; ".join(
        f"{label} {r[key]}: {r.get('status')} {r.get('error', '')}".strip() for r in rows if r.get("status") != "ok"
    )


def check_offline_cuda_shm(seen: dict[str, Seen]) -> dict:
    offline = scenario_rows(seen["fp32"], "offline")
    need(set(offline) >= {"onnx", "ts-script"}, f"offline points of {sorted(offline)} only")
    evidence = {}
    for fmt, rs in offline.items():
        memory = {r.get("shared_memory") for r in rs}
        need(memory == {"cuda"}, f"{fmt}'s offline points sent their tensors through {sorted(memory)} shared memory")
        need(not (bad := not_ok(rs, "batch", "batch_size")), f"{fmt} offline points not ok: {bad}")
        evidence[fmt] = {"points": len(rs), "batch_sizes": [r["batch_size"] for r in rs], "shared_memory": "cuda"}
    return evidence


def check_online(seen: dict[str, Seen]) -> dict:
    online = scenario_rows(seen["fp32"], "online")
    need(set(online) >= {"onnx", "ts-script"}, f"online points of {sorted(online)} only")
    evidence = {}
    for fmt, rs in online.items():
        need(not (bad := not_ok(rs, "concurrency", "concurrency")), f"{fmt} online points not ok: {bad}")
        evidence[fmt] = {
            "points": len(rs),
            "concurrency": [r["concurrency"] for r in rs],
            "p99_ms": [number(r, "p99_ms") for r in rs],
        }
    return evidence


def check_gpu_metrics(seen: dict[str, Seen]) -> dict:
    fp32 = seen["fp32"]
    on_gpu = ok_rows(fp32.of_format("ts-script"))
    need(bool(on_gpu), "no ts-script point measured ok to read the GPU's metrics over")
    empty = [r for r in on_gpu if any(number(r, m) is None for m in GPU_METRICS)]
    missing = [m for m in GPU_METRICS if any(number(r, m) is None for r in on_gpu)]
    need(not empty, f"{', '.join(missing)} missing on {len(empty)} of {len(on_gpu)} GPU-served points")
    for m in ("gpu_mem_mb", "gpu_power_w", "gpu_energy_j"):
        need(all((number(r, m) or 0) > 0 for r in on_gpu), f"{m} not above 0 on every GPU-served point")
    on_cpu = [r for r in fp32.of_format("onnx") if any(number(r, m) is not None for m in GPU_METRICS)]
    need(not on_cpu, f"{len(on_cpu)} CPU-served onnx points carry GPU metrics: they are not the serving GPU's")
    _, uuid = fp32.gpu()
    return {
        "serving_gpu": uuid,
        **{m: [min(number(r, m) for r in on_gpu), max(number(r, m) for r in on_gpu)] for m in GPU_METRICS},
        "cpu_served_points_without_gpu_metrics": len(fp32.of_format("onnx")),
    }


def check_windows(seen: dict[str, Seen]) -> dict:
    from tbench.request.benchmark import PROFILE_MEASUREMENT

    evidence = {}
    for key in ("fp32", "fp16"):
        s = seen[key]
        profile = s.request.get("profile")
        need(profile == "gpu", f"the {key} run's profile is {profile}, not gpu")
        measurement = s.request.get("measurement") or {}
        floor = PROFILE_MEASUREMENT["gpu"].min_requests
        need(
            measurement.get("min_requests") == floor,
            f"{key}: min_requests {measurement.get('min_requests')}, not {floor}",
        )
        good = ok_rows(s.rows)
        need(bool(good), f"{key}: no point measured ok")
        few = [r for r in good if (number(r, "measurement_request_count") or 0) < floor]
        need(not few, f"{key}: {len(few)} points asked fewer than {floor} requests per window")
        spans = [number(r, "window_s") for r in good]
        need(all(s is not None and s > 0 for s in spans), f"{key}: a point has no window duration")
        evidence[key] = {
            "min_requests": floor,
            "window_s_asked": measurement.get("window_s"),
            "requests_per_window": [
                min(number(r, "measurement_request_count") for r in good),
                max(number(r, "measurement_request_count") for r in good),
            ],
            "window_s": [round(min(spans), 3), round(max(spans), 3)],
        }
    return evidence


def check_capacity_energy(seen: dict[str, Seen]) -> dict:
    cap = seen["capacity"]
    need(bool(cap.capacity), "the capacity command wrote no capacity.json")
    answer = (cap.capacity.get("answers") or [{}])[0]
    costs = answer.get("plan") or {}
    joules = costs.get("joules_per_inference")
    need(joules is not None and joules > 0, f"no energy per inference in the plan ({answer.get('reason') or costs})")
    return {
        "joules_per_inference": joules,
        "sustainable_rps": costs.get("sustainable_rps"),
        "configuration": answer.get("configuration"),
    }


DOCTOR_NEEDS = ("embedded", "perf_analyzer", "GPUs", "GPU metrics", "CUDA in torch")


def check_doctor(seen: dict[str, Seen], report) -> dict:
    checks = {c: report.get(c) for c in DOCTOR_NEEDS}
    bad = [f"{n}: {c.detail if c else 'not checked'}" for n, c in checks.items() if not c or not c.ok]
    need(not bad, " | ".join(bad))
    return {n: c.detail for n, c in checks.items()}


def check_by_exit(seen: dict[str, Seen]) -> dict:
    (s,) = seen.values()
    return {"folder": s.run.folder, "points": s.manifest.get("points"), "served_on": s.manifest.get("served_on")}


CHECKS: dict[str, Callable] = {
    "TorchScript on CUDA in the python backend": check_torchscript_cuda,
    "FP16 TorchScript": check_fp16,
    "ONNX on the CPU of a GPU node": check_onnx_cpu,
    "offline points through CUDA shared memory": check_offline_cuda_shm,
    "online points": check_online,
    "Triton's GPU metrics from the serving GPU only": check_gpu_metrics,
    "the GPU profile's windows": check_windows,
    "a capacity plan's energy per inference": check_capacity_energy,
}


def judge(case: Case, runs: dict[str, Run], report) -> None:
    """A case's status from its runs: not executable or not executed as they were, else its check of what they
    wrote; a wide-sweep case (no check of its own) by its run's exit."""
    if case.status != "planned":
        return
    mine = [runs[k] for k in case.runs]
    for r in mine:
        if r.status in (NOT_EXECUTABLE, NOT_EXECUTED):
            case.status, case.reason = r.status, r.line
            return
    seen = {r.key: Seen.of(r) for r in mine}
    try:
        if case.name == "tbench doctor on the node":
            case.evidence = check_doctor(seen, report)
        elif case.name in CHECKS:
            case.evidence = CHECKS[case.name](seen)
        else:
            need(mine[0].status == PASSED, mine[0].line or f"exit {mine[0].exit_code}")
            case.evidence = check_by_exit(seen)
        case.status = PASSED
    except Failed as failure:
        case.status, case.line = FAILED, str(failure)
        failed = [r for r in mine if r.status == FAILED and r.line and r.line not in case.line]
        if failed:
            case.line += f" (the {failed[0].key} command: {failed[0].line})"
    except Exception as err:  # the evidence was not what the check expects: the case failed, saying so
        case.status, case.line = FAILED, f"{type(err).__name__} reading the evidence: {err}"[:500]


def not_executed(runs: list[Run], cases: list[Case], reason: str) -> None:
    """Every run and case not executed, for `reason` (no GPU here): what the node could not have run says so too."""
    for r in runs:
        r.status, r.line = NOT_EXECUTED, reason
    for c in cases:
        c.status, c.reason = NOT_EXECUTED, reason


def summary(cases: list[Case]) -> dict:
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.status] = counts.get(c.status, 0) + 1
    return counts


def kit_info() -> dict | None:
    """The offline kit this check runs from (scripts/gpu_check.sh --kit), if any: its parts and set-up time."""
    home = os.environ.get("TBENCH_GPU_KIT_HOME")
    if not home or not (Path(home) / "manifest.json").is_file():
        return None
    manifest = json.loads((Path(home) / "manifest.json").read_text())
    setup = Path(home) / "setup.json"
    return {
        "fingerprint": manifest.get("fingerprint"),
        "built": manifest.get("built"),
        "parts": [{k: p[k] for k in ("name", "size", "sha256", "transfer")} for p in manifest.get("parts", [])],
        **(json.loads(setup.read_text()) if setup.is_file() else {}),
    }


def main() -> None:
    started = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default="paths", help="groups of cases: paths (the default), formats, seeds, modes")
    parser.add_argument("--only", help="only the cases whose name holds this text")
    parser.add_argument("--dry-run", action="store_true", help="plan and record what is not executable; run nothing")
    parser.add_argument("--timeout-s", type=float, default=300, help="limit per command")
    parser.add_argument("--output", help="artifact root of the runs (a temporary folder by default)")
    parser.add_argument("--record", help="where the record goes (benchmarks/results/gpu_check.json by default)")
    parser.add_argument(
        "--cpu-rehearsal",
        action="store_true",
        help="without a GPU: run the paths anyway, on the CPU profile (the GPU checks then fail, saying why)",
    )
    args = parser.parse_args()
    groups = [g for g in args.plan.split(",") if g]
    if unknown := sorted(set(groups) - set(GROUPS)):
        raise SystemExit(f"unknown --plan group {unknown[0]!r}; known: {', '.join(GROUPS)}")
    from tbench.node.hardware import detect

    has_gpu = detect().has_gpu
    doctor_s: list[float] = []
    report = doctor_report(doctor_s)
    runs, cases = plan(report, groups, "gpu" if has_gpu or not args.cpu_rehearsal else "cpu")
    cases = [c for c in cases if not args.only or args.only in c.name]
    if not cases:
        raise SystemExit(f"no case of {args.plan} matches --only {args.only!r}")
    wanted = {k for c in cases for k in c.runs}
    wanted |= {"fp32"} if "capacity" in wanted else set()  # capacity plans on the fp32 run's TorchScript file
    runs = [r for r in runs if r.key in wanted]
    by_key = {r.key: r for r in runs}
    if not has_gpu and not args.cpu_rehearsal:
        not_executed(runs, cases, NO_GPU)
    skip_reasons(runs, report)
    if "doctor" in by_key and by_key["doctor"].status == "planned":
        by_key["doctor"].status, by_key["doctor"].seconds = PASSED, doctor_s[0]  # the report the plan was made from
    output = Path(args.output or os.path.join(tempfile.gettempdir(), f"tbench-gpu-check-{os.getpid()}"))
    logs = output / "gpu_check_logs"
    sizes = sorted({f"{r.request['model']} {r.request['size']}" for r in runs if r.request})
    sizes = sizes or ["resnet50 small"]
    with recorded(RESULTS / "gpu_check.json" if not args.record else Path(args.record), model_sizes=sizes) as record:
        # a copied tree: the device machine's copy may have no .git, or an older one than its files (seen on a lent
        # GPU machine: a .git two commits behind), so the commit the caller names wins over what git says there
        if os.environ.get("TBENCH_GIT_COMMIT"):
            record.commit = os.environ["TBENCH_GIT_COMMIT"]
            record.dirty = os.environ.get("TBENCH_GIT_DIRTY", "1") != "0"
            record.changed = [] if not record.dirty else record.changed  # what the stale .git says differs
        record.update(
            doctor=json.loads(report.model_dump_json()),
            kit=kit_info(),
            output=str(output),
            runs=[],
            cases=[],
        )
        for r in runs:
            if r.status == "planned" and args.dry_run:
                r.status, r.line = NOT_EXECUTED, "--dry-run"
            if r.status == "planned" and r.key == "capacity":
                if why := capacity_argv(r, by_key["fp32"]):
                    r.status, r.line = FAILED, why
            if r.status == "planned":
                print(f"running {r.key}: tbench {' '.join(r.argv)}", flush=True)
                logs.mkdir(parents=True, exist_ok=True)
                run_command(r, output, logs, args.timeout_s)
            print(f"  {r.status}: {r.key}{f' ({r.line})' if r.line else ''}", flush=True)
            record["runs"].append(asdict(r))
            record.save()
        for c in cases:
            judge(c, by_key, report)
            print(f"  {c.status}: {c.name}{f' ({c.reason or c.line})' if c.reason or c.line else ''}", flush=True)
        record["cases"] = [asdict(c) for c in cases]
        record["summary"] = summary(cases)
        record["timing"] = {
            "kit_install_s": (record["kit"] or {}).get("install_s"),  # each part's, in the call that brought it
            "kit_setup_s": (record["kit"] or {}).get("setup_s"),  # the check's own call, before the check
            "check_s": round(time.monotonic() - started, 1),
        }


if __name__ == "__main__":
    main()
