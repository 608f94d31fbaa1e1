"""Every GPU path once, on a GPU node: each format at FP32 and FP16 (INT8 where it applies), each seed model's gpu
profile on a reduced grid, each server mode. Every case is a `tbench run ... --profile gpu` of its own (a subprocess
with its own server); a failure is recorded and the next case runs.

Cases this node cannot run are skipped before they start, with the reason `tbench doctor --json` gives through the
check every run's preflight makes (tbench.doctor.missing_for); a case the run itself refuses (exit 2: a precision the
server cannot apply, an ensemble part's converter) is recorded as refused, with its one line.

Usage: scripts/gpu_check.sh [--plan formats,seeds,modes] [--only TEXT] [--dry-run] [--timeout-s 1800]
Writes benchmarks/results/gpu_check.json, whole, with its provenance (benchmarks/provenance.py): what ran, passed,
failed, was refused or skipped and why; after every case an interim copy marked "complete": false.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from provenance import REPO, RESULTS, recorded

GROUPS = ("formats", "seeds", "modes")
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
EXIT_STATUS = {0: "passed", 2: "refused", 3: "failed"}  # tbench run's exit codes (3: some points failed)


@dataclass
class Case:
    name: str
    group: str
    args: list[str]  # after `tbench run`
    request: dict  # the same as BenchmarkRequest fields, for doctor.missing_for
    status: str = "planned"  # passed, failed, refused, timeout, skipped
    detail: str = ""  # why skipped or refused, the failure's last line, or the run folder
    seconds: float | None = None
    exit_code: int | None = None
    log: str | None = None


def case(group: str, name: str, model: str, size: str, server: str, **fields) -> Case:
    flags = [f"--{k}={v}" for k, v in fields.items() if k in ("framework", "formats", "serve", "precision")]
    request = {
        "model": model,
        "size": size,
        "server": server,
        "profile": "gpu",
        **{k: v for k, v in fields.items() if k in ("framework", "precision")},
        **({"formats": [fields["formats"]], "serve_formats": [fields["serve"]]} if "formats" in fields else {}),
    }
    return Case(name, group, [model, "--size", size, f"--server={server}", "--profile=gpu", *flags, *REDUCED], request)


def serving_mode(report) -> str:
    """The mode the formats are served in: local (the worker image's), else docker, else embedded."""
    return next((m for m in ("local", "docker") if (c := report.get(m)) and c.ok), "embedded")


def plan(report, groups=GROUPS) -> list[Case]:
    mode = serving_mode(report)
    cases = []
    if "formats" in groups:
        cases += [
            case(
                "formats",
                f"resnet50 {fmt} {p} ({mode})",
                "resnet50",
                "small",
                mode,
                framework=framework,
                formats=fmt,
                serve=fmt,
                precision=p,
            )
            for framework, fmt, precisions in FORMATS
            for p in precisions
        ]
    if "seeds" in groups:
        cases += [
            case("seeds", f"{model} {size} gpu profile ({mode})", model, size, mode) for model, size in SEEDS.items()
        ]
    if "modes" in groups:  # the formats group's onnx fp32 case in each mode; the one it already runs, once
        planned = [c.args for c in cases]
        cases += [
            c
            for m in MODES
            if (
                c := case(
                    "modes",
                    f"resnet50 onnx fp32 ({m})",
                    "resnet50",
                    "small",
                    m,
                    framework="pytorch",
                    formats="onnx",
                    serve="onnx",
                    precision="fp32",
                )
            ).args
            not in planned
        ]
    return cases


def skip_reasons(cases: list[Case], report) -> None:
    """Mark the cases this node cannot run, with preflight's own reasons."""
    from tbench.doctor import missing_for
    from tbench.request import BenchmarkRequest

    for c in cases:
        if missing := missing_for(BenchmarkRequest(**c.request), report):
            c.status, c.detail = "skipped", " | ".join(missing)


def doctor_report():
    from tbench.doctor import NodeReport

    done = subprocess.run(
        [sys.executable, "-m", "tbench.cli", "doctor", "--json"], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    if done.returncode != 0:
        raise SystemExit(f"tbench doctor --json failed: {done.stderr.strip().splitlines()[-1:]}")
    return NodeReport.model_validate_json(done.stdout[done.stdout.index("{") :])


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""


def run_case(c: Case, output: Path, logs: Path, timeout_s: float) -> None:
    """One `tbench run` in its own process group: a timeout stops it (SIGTERM: it stops its server) and whatever it
    started."""
    log = logs / f"{len(list(logs.iterdir())):02d}-{c.name.replace(' ', '_').replace('(', '').replace(')', '')}.log"
    c.log = str(log)
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tbench.cli", "run", *c.args, "-o", str(output)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            c.exit_code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            c.exit_code = None
    c.seconds = round(time.monotonic() - started, 1)
    c.status = "timeout" if c.exit_code is None else EXIT_STATUS.get(c.exit_code, "failed")
    c.detail = f"no end within {timeout_s:.0f} s" if c.exit_code is None else last_line(log.read_text(errors="replace"))


def summary(cases: list[Case]) -> dict:
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.status] = counts.get(c.status, 0) + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default=",".join(GROUPS), help="groups of cases: formats, seeds, modes")
    parser.add_argument("--only", help="only the cases whose name holds this text")
    parser.add_argument("--dry-run", action="store_true", help="plan and record the skips; run nothing")
    parser.add_argument("--timeout-s", type=float, default=1800, help="limit per case")
    parser.add_argument("--output", help="artifact root of the runs (a temporary folder by default)")
    args = parser.parse_args()
    groups = [g for g in args.plan.split(",") if g]
    if unknown := sorted(set(groups) - set(GROUPS)):
        raise SystemExit(f"unknown --plan group {unknown[0]!r}; known: {', '.join(GROUPS)}")
    report = doctor_report()
    cases = [c for c in plan(report, groups) if not args.only or args.only in c.name]
    if not cases:
        raise SystemExit(f"no case of {args.plan} matches --only {args.only!r}")
    skip_reasons(cases, report)
    output = Path(args.output or tempfile.mkdtemp(prefix="tbench-gpu-check-"))
    logs = output / "gpu_check_logs"
    logs.mkdir(parents=True, exist_ok=True)
    sizes = sorted({f"{c.request['model']} {c.request['size']}" for c in cases})
    with recorded(RESULTS / "gpu_check.json", model_sizes=sizes) as record:
        record.update(doctor=json.loads(report.model_dump_json()), output=str(output), cases=[])
        for c in cases:
            if c.status == "planned" and not args.dry_run:
                print(f"running {c.name}", flush=True)
                run_case(c, output, logs, args.timeout_s)
            elif c.status == "planned":
                c.status, c.detail = "skipped", "--dry-run"
            print(f"  {c.status}: {c.name}{f' ({c.detail})' if c.detail else ''}", flush=True)
            record["cases"].append(asdict(c))
            record["summary"] = summary(cases[: len(record["cases"])])
            record.save()


if __name__ == "__main__":
    main()
