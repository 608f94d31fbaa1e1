"""Today's stack (issue 56) on this machine, in one invocation: the TensorFlow seeds served without the TensorFlow
backend beside today's plan, and `pt2` (torch.export + AOTInductor) beside ts-trace and onnx.

Every measurement is a `tbench run` in a subprocess (its own embedded server), one after the other:

1. **seeds_without_tf_backend**: W&D, DLRM, DCNv2 and ResNet-50 (`--framework tensorflow`, each at its smallest
   size), two runs each: today's plan (the embedded server's python backend runs TensorFlow: tf-savedmodel) and the
   same server without TensorFlow in its python backend, which the run re-plans (ONNX through tf2onnx; DLRM/DCNv2:
   the ensemble's sparse part). The server is made one without TensorFlow the way tests/test_capabilities.py's end-to-
   end test makes it: `EmbeddedServer.python_runtimes` without "tensorflow", here set in the `tbench run` process
   (`NO_TF_LAUNCH`). tbench has no environment variable or option for it; the stub's own environment still has
   TensorFlow, but nothing the re-planned run serves imports it. Per seed: `served_as` (the manifests' `served_by`),
   `same_answers` (the re-planned run's accuracy through Triton passed), `throughput_ratio` (without-TF / today's per
   matched point, and its median).
2. **pt2**: ResNet-50, nnUNet and FastPitch (pytorch, smallest size), one run each with `--formats pt2,ts-trace,onnx
   --serve all` from an empty conversion cache (`TBENCH_CACHE_DIR`, a folder of its own per model): a format that does
   not export (or is not correct) is recorded with its one-line reason and the run repeated without it. Per model and
   format: `exported` (True, or the reason), `correct`, `infer_per_s` (the best point), `compile_s` (the export's
   seconds in artifacts.json, cold) and `cached_s` (the same conversion again on that cache, in this process, as
   benchmarks/pt2_adapters.py does it, with the options the run converted with).
3. **cpu_image**: the TensorFlow seeds on the NGC-like server this machine can build, `--server docker` with
   infra/build_cpu_image.py's image (its python backend has ONNX Runtime and no TensorFlow; a Docker daemon as the
   tests reach one, tests/services.py), one run each: what served each model (`served_as`, from the run's manifest),
   the image's python runtimes as the run read them, whether Triton answered as TensorFlow did (`same_answers`) and
   the best point's throughput. These back the serving matrix's cells of that image (benchmarks/serving_matrix.py).

Every run uses the model's default points (offline and, where the model has it, online) with short measurement
settings (`--window-s`, `--stability`, `--max-trials`; `--scenarios` to narrow). Writes
benchmarks/results/todays_stack.json with its provenance (benchmarks/provenance.py), an interim copy after every run;
`--dry-run` prints the record and writes nothing.

Usage: .venv/bin/python benchmarks/todays_stack.py
       .venv/bin/python benchmarks/todays_stack.py --dry-run --seeds dlrm --pt2-models resnet50 --scenarios offline
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from provenance import RESULTS, recorded

TBENCH = str(Path(sys.executable).with_name("tbench"))
TPUT = "throughput_infer_per_s"
POINT = ["scenario", "batch_size", "concurrency", "request_rate"]

# each model at its smallest size (model_adapters: widedeep full/small, dlrm and dcnv2 tiny/small/4B/22B,
# resnet50, nnunet and fastpitch full/small)
SEEDS = {"widedeep": "small", "dlrm": "tiny", "dcnv2": "tiny", "resnet50": "small"}
PT2_MODELS = {"resnet50": "small", "nnunet": "small", "fastpitch": "small"}
PT2_FORMATS = ["pt2", "ts-trace", "onnx"]
CPU_IMAGE_SEEDS = ("widedeep", "dlrm")  # part 3: a single model and an ensemble whose sparse part is re-planned
# this sandbox's daemon cannot raise memlock past the host's limit; no GPUs here (benchmarks/docker_vs_embedded.py)
DOCKER = ["--server", "docker", "--gpus", "none", "--docker-ulimit", "none"]
FILE_NAMES = {"pt2": "model.pt2", "ts-trace": "model.pt", "onnx": "model.onnx"}  # tbench.stages.export.FILE_NAMES

# `tbench run` on an embedded server whose python backend has no TensorFlow: the replacement
# tests/test_capabilities.py's end-to-end test makes, in the run's own process (the flow runs in it)
NO_TF_LAUNCH = (
    "import sys\n"
    "from tbench.triton.capabilities import importable_runtimes\n"
    "from tbench.triton.process_server import EmbeddedServer\n"
    "EmbeddedServer.python_runtimes = lambda self: importable_runtimes() - {'tensorflow'}\n"
    "from tbench.cli import main\n"
    "sys.argv[0] = 'tbench'\n"
    "sys.exit(main())\n"
)
TF_HIDDEN = (
    "EmbeddedServer.python_runtimes without 'tensorflow' in the tbench run process (the mechanism of "
    "tests/test_capabilities.py's end-to-end test; tbench has no option for it): the run reads a server that cannot "
    "run TensorFlow and re-plans before export; the stub's environment still has TensorFlow, unused"
)


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tbench_run(args: list[str], out: Path, env: dict, without_tf: bool = False, timeout: float = 1800) -> dict:
    """One `tbench run` in its own process; what it printed, its folder and manifest (a failed run's too)."""
    head = [sys.executable, "-c", NO_TF_LAUNCH] if without_tf else [TBENCH]
    argv = [*head, "run", *args, "--output", str(out)]
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=timeout)
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as err:
        rc, stdout, stderr = None, err.stdout or "", f"error: timed out after {timeout:.0f} s"
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
    wall = round(time.monotonic() - start, 1)
    lines = stderr.strip().splitlines()
    error = next((ln.removeprefix("error:").strip() for ln in lines if ln.startswith("error:")), None)
    folder = None
    if rc in (0, 3) and stdout.strip():
        folder = Path(stdout.strip().splitlines()[-1])
    else:
        for ln in lines:
            m = re.search(r"results, logs and manifest: (\S+)", ln)
            if m:
                folder = Path(m.group(1))
    manifest = read_json(folder / "manifest.json") if folder else None
    manifest = manifest or {}
    run = {
        "args": args,
        "without_tf": without_tf,
        "rc": rc,
        "ok": rc in (0, 3),
        "wall_s": wall,
        "run_dir": str(folder) if folder else None,
        "status": manifest.get("status"),
        "failed_stage": manifest.get("failed_stage"),
        "error": manifest.get("error") or error or (None if rc in (0, 3) else (lines or ["?"])[-1][:400]),
        "served_by": manifest.get("served_by"),
        "serve_formats": (manifest.get("request") or {}).get("serve_formats"),
        "python_runtimes": (manifest.get("server_capabilities") or {}).get("python_runtimes"),
        "points": manifest.get("points"),
        "stages_s": {k: v.get("seconds") for k, v in (manifest.get("stages") or {}).items()},
    }
    return run


def points(run: dict) -> pd.DataFrame:
    """The run's ok points: mean throughput per (format, scenario, batch, concurrency, rate)."""
    path = Path(run["run_dir"] or "/nonexistent") / "results.parquet"
    if not path.is_file():
        return pd.DataFrame(columns=["format", *POINT, TPUT])
    df = pd.read_parquet(path)
    df = df[df["status"] == "ok"].fillna({"concurrency": 0, "request_rate": 0})
    return df.groupby(["format", *POINT], as_index=False)[TPUT].mean()


def label(row) -> str:
    text = f"{row['scenario']} b{int(row['batch_size'])}"
    if row["concurrency"]:
        text += f" c{int(row['concurrency'])}"
    if row["request_rate"]:
        text += f" r{row['request_rate']:g}"
    return text


def accuracy(run: dict) -> list[dict]:
    """accuracy.json: per served format, whether Triton answered as the framework did (every output within
    tolerance) and the metric both ways."""
    rows = read_json(Path(run["run_dir"] or "/nonexistent") / "accuracy.json") or []
    return [
        {
            "format": r.get("format"),
            "samples": r.get("samples"),
            "passed": bool(r.get("outputs")) and all(o.get("passed") for o in r["outputs"]),
            "metric": r.get("metric"),
            "framework": r.get("framework"),
            "triton": r.get("triton"),
            "difference": r.get("difference"),
            "agreement": r.get("agreement"),
        }
        for r in rows
    ]


def seed_pair(name: str, size: str, common: list[str], work: Path, env: dict, runs: list, save) -> dict:
    """Today's plan and the server without TensorFlow, one run each, and what they show side by side."""
    args = [name, "--framework", "tensorflow", "--size", size, *common]
    pair = {}
    for key, without_tf in (("today", False), ("without_tf", True)):
        pair[key] = tbench_run(args, work / "seeds" / key, env, without_tf=without_tf)
        runs.append({"part": "seeds_without_tf_backend", "model": name, "plan": key, **pair[key]})
        print(f"{name} {size} {key}: {json.dumps(runs[-1])}", flush=True)
        save()
    today, without = pair["today"], pair["without_tf"]
    acc = {key: accuracy(run) for key, run in pair.items()}
    row = {
        "size": size,
        "served_as": {key: run["served_by"] for key, run in pair.items()},
        "served_formats": {key: run["serve_formats"] for key, run in pair.items()},
        "same_answers": without["ok"] and bool(acc["without_tf"]) and all(a["passed"] for a in acc["without_tf"]),
        "same_answers_today": today["ok"] and bool(acc["today"]) and all(a["passed"] for a in acc["today"]),
        "accuracy": acc,
        "python_runtimes_without_tf": without["python_runtimes"],
    }
    matched = {}
    if today["ok"] and without["ok"]:
        before = {label(r): r[TPUT] for _, r in points(today).iterrows()}
        after = {label(r): r[TPUT] for _, r in points(without).iterrows()}
        matched = {k: round(after[k] / before[k], 4) for k in before if k in after and before[k]}
        row["infer_per_s"] = {"today": before, "without_tf": after}
    row["throughput_ratio"] = {
        "points": matched,
        "median": round(statistics.median(matched.values()), 4) if matched else None,
    }
    if not (today["ok"] and without["ok"]):
        row["error"] = {k: r["error"] for k, r in pair.items() if not r["ok"]}
    return row


def best_infer_per_s(run: dict) -> float | None:
    found = points(run)
    return round(float(found[TPUT].max()), 2) if len(found) else None


def on_cpu_image(names: list[str], common: list[str], work: Path, env: dict, runs: list, save) -> dict:
    """Each seed served by infra/build_cpu_image.py's image in docker mode: what served it and whether it answered
    as TensorFlow did."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from services import cpu_image, docker_daemon  # the tests' way of reaching Docker

    found = {}
    with docker_daemon() as docker_env:
        image = cpu_image(docker_env)
        for name in names:
            args = [name, "--framework", "tensorflow", "--size", SEEDS[name], *DOCKER, "--docker-image", image, *common]
            run = tbench_run(args, work / "cpu_image", {**env, **docker_env})
            runs.append({"part": "cpu_image", "model": name, "image": image, **run})
            print(f"{name} on {image}: {json.dumps(runs[-1])}", flush=True)
            save()
            checked = accuracy(run)
            found[name] = {
                "image": image,
                "served_as": run["served_by"],
                "python_runtimes": run["python_runtimes"],
                "same_answers": run["ok"] and bool(checked) and all(a["passed"] for a in checked),
                "accuracy": checked,
                "infer_per_s": best_infer_per_s(run),
                **({} if run["ok"] else {"error": run["error"]}),
            }
    return found


def failing_formats(run: dict, formats: list[str]) -> dict[str, dict]:
    """The formats a failed run failed on: at export, the first without its file (formats export in order); at
    correctness, those whose check did not pass."""
    folder = Path(run["run_dir"] or "/nonexistent")
    reason = run["error"] or "failed"
    if run["failed_stage"] == "export":
        for fmt in formats:
            if not (folder / "models" / fmt / FILE_NAMES[fmt]).exists():
                return {fmt: {"exported": reason, "refused_after_s": run["stages_s"].get("export")}}
    if run["failed_stage"] == "correctness":
        checks = read_json(folder / "correctness.json") or []
        bad = {c["format"] for c in checks if not all(o.get("passed") for o in c.get("outputs", []))}
        return {fmt: {"exported": True, "correct": False, "reason": reason} for fmt in formats if fmt in bad}
    return {}


def export_seconds(run: dict) -> dict[str, dict]:
    """artifacts.json: per format, the export's seconds, whether it came from the conversion cache, the exporter."""
    rows = read_json(Path(run["run_dir"] or "/nonexistent") / "artifacts.json") or []
    return {
        r["format"]: {"seconds": round(r["seconds"], 2), "cached": r.get("cached"), "exporter": r.get("exporter")}
        for r in rows
    }


def correctness(run: dict) -> dict[str, bool]:
    checks = read_json(Path(run["run_dir"] or "/nonexistent") / "correctness.json") or []
    out: dict[str, bool] = {}
    for c in checks:
        passed = all(o.get("passed") for o in c.get("outputs", []))
        out[c["format"]] = out.get(c["format"], True) and passed
    return out


def cached_conversions(run: dict, formats: list[str], cache: Path, out: Path) -> dict[str, dict]:
    """The run's conversions again, as pt2_adapters.py does them: tbench.stages.export in this process with the
    options the run converted with (its manifest's request) and the run's conversion cache, so each comes from the
    cache (`cached`: whether it did; `cached_s`: the export's seconds)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # standalone: the repository's tbench
    from tbench.core.enums import Format
    from tbench.core.runtimes import source_digest
    from tbench.request.adapter import adapter_for
    from tbench.request.benchmark import ResolvedRequest
    from tbench.stages.converters.registry import ConversionOptions
    from tbench.stages.export import CACHE_ENV, export_model

    manifest = read_json(Path(run["run_dir"]) / "manifest.json") or {}
    req = ResolvedRequest.model_validate(manifest["request"])
    adapter = adapter_for(req)
    module = adapter.build()
    digest = source_digest(adapter.framework, module)
    options = ConversionOptions.for_run(req)
    before, os.environ[CACHE_ENV] = os.environ.get(CACHE_ENV), str(cache)
    rows = {}
    try:
        for fmt in formats:
            started = time.monotonic()
            artifact = export_model(adapter, module, Format.parse(fmt), out, digest, options)
            rows[fmt] = {"cached_s": round(time.monotonic() - started, 3), "cached": artifact.cached}
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before
    return rows


def pt2_model(name: str, size: str, common: list[str], work: Path, env: dict, runs: list, save) -> dict:
    """pt2, ts-trace and onnx from an empty conversion cache in one run (repeated without a format that fails), then
    the same conversions again from that cache (cached_conversions)."""
    cache = work / "cache" / f"pt2-{name}"  # empty: every export is cold
    env = {**env, "TBENCH_CACHE_DIR": str(cache)}
    rows: dict[str, dict] = {fmt: {} for fmt in PT2_FORMATS}
    remaining = list(PT2_FORMATS)
    measured = None
    while remaining:
        args = [name, "--framework", "pytorch", "--size", size, "--formats", ",".join(remaining), "--serve", "all"]
        run = tbench_run([*args, *common], work / "pt2" / name, env)
        runs.append({"part": "pt2", "model": name, "formats": list(remaining), **run})
        print(f"{name} {size} {','.join(remaining)}: {json.dumps(runs[-1])}", flush=True)
        save()
        for fmt, seconds in export_seconds(run).items():  # the first run that exported a format: its cold seconds
            if fmt in rows and "compile_s" not in rows[fmt]:
                rows[fmt].update(compile_s=seconds["seconds"], compile_cached=seconds["cached"])
                if seconds["exporter"]:
                    rows[fmt]["exporter"] = seconds["exporter"]
        if run["ok"]:
            measured = run
            break
        failed = failing_formats(run, remaining)
        if not failed:  # not a format's fault: every remaining format gets the run's error
            for fmt in remaining:
                rows[fmt].setdefault("exported", run["error"] or "the run failed")
            break
        for fmt, what in failed.items():
            rows[fmt].update(what)
        remaining = [f for f in remaining if f not in failed]
    if measured:
        table = points(measured)
        checks = correctness(measured)
        for fmt in remaining:
            mine = table[table["format"] == fmt]
            rows[fmt].update(exported=True, correct=checks.get(fmt, False))
            if len(mine):
                best = mine.loc[mine[TPUT].idxmax()]
                rows[fmt]["infer_per_s"] = round(float(best[TPUT]), 2)
                rows[fmt]["best_point"] = label(best)
                rows[fmt]["infer_per_s_by_point"] = {label(r): round(float(r[TPUT]), 2) for _, r in mine.iterrows()}
            else:
                rows[fmt]["infer_per_s"] = None
        for fmt, seconds in cached_conversions(measured, remaining, cache, work / "pt2-cached" / name).items():
            rows[fmt].update(seconds)
    for fmt in PT2_FORMATS:
        rows[fmt].setdefault("exported", "not tried")
        rows[fmt].setdefault("correct", None if rows[fmt]["exported"] is not True else False)
        rows[fmt].setdefault("infer_per_s", None)
        rows[fmt].setdefault("compile_s", None)
    return rows


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def summary(record) -> dict:
    seeds = record.get("seeds_without_tf_backend", {})
    pt2 = record.get("pt2", {})
    out: dict = {
        "seeds_same_answers": {s: r["same_answers"] for s, r in seeds.items()},
        "median_throughput_ratio_by_seed": {s: r["throughput_ratio"]["median"] for s, r in seeds.items()},
        "median_throughput_ratio": median(r["throughput_ratio"]["median"] for r in seeds.values()),
        "median_throughput_ratio_all_points": median(
            v for r in seeds.values() for v in r["throughput_ratio"]["points"].values()
        ),
    }
    if record.get("cpu_image"):
        out["cpu_image_same_answers"] = {s: r["same_answers"] for s, r in record["cpu_image"].items()}
    if pt2:
        out["pt2_exported"] = {m: r["pt2"]["exported"] for m, r in pt2.items()}
        ratio = {}
        for other in ("ts-trace", "onnx"):
            ratio[other] = {
                m: round(r["pt2"]["infer_per_s"] / r[other]["infer_per_s"], 4)
                for m, r in pt2.items()
                if r["pt2"].get("infer_per_s") and r[other].get("infer_per_s")
            }
        out["pt2_infer_per_s_ratio"] = {k: {"by_model": v, "median": median(v.values())} for k, v in ratio.items()}
        for key in ("compile_s", "cached_s", "infer_per_s"):
            out[f"median_{key}"] = {fmt: median(r[fmt].get(key) for r in pt2.values()) for fmt in PT2_FORMATS}
    return out


class DryRecord(dict):
    """What `recorded` gives, printed instead of written."""

    def __init__(self, model_sizes):
        super().__init__()
        self.model_sizes = model_sizes

    def save(self):
        pass


@contextlib.contextmanager
def dry(model_sizes):
    record = DryRecord(model_sizes)
    yield record
    print(json.dumps(record, indent=2, default=str), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split(", in one invocation")[0])
    parser.add_argument("--seeds", default=",".join(SEEDS), help="TensorFlow seeds of part 1 ('' for none)")
    parser.add_argument("--pt2-models", default=",".join(PT2_MODELS), help="PyTorch models of part 2 ('' for none)")
    parser.add_argument(
        "--cpu-image-seeds", default=",".join(CPU_IMAGE_SEEDS), help="TensorFlow seeds of part 3 ('' for none)"
    )
    parser.add_argument("--size", default=None, help="one size for every model (default: each model's smallest)")
    parser.add_argument("--window-s", type=float, default=0.5, help="each run's --window-s")
    parser.add_argument("--stability", type=float, default=30.0, help="each run's --stability")
    parser.add_argument("--max-trials", type=int, default=4, help="each run's --max-trials")
    parser.add_argument("--scenarios", default=None, help="each run's --scenarios (default: the model's)")
    parser.add_argument("--dry-run", action="store_true", help="print the record; write nothing")
    args = parser.parse_args()
    seeds = [s.strip() for s in args.seeds.split(",") if s.strip()]
    models = [m.strip() for m in args.pt2_models.split(",") if m.strip()]
    on_image = [s.strip() for s in args.cpu_image_seeds.split(",") if s.strip()]
    unknown = [s for s in seeds + on_image if s not in SEEDS] + [m for m in models if m not in PT2_MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}: seeds {list(SEEDS)}, pt2 models {list(PT2_MODELS)}")
    common = [
        "--window-s",
        str(args.window_s),
        "--stability",
        str(args.stability),
        "--max-trials",
        str(args.max_trials),
    ]
    if args.scenarios:
        common += ["--scenarios", args.scenarios]
    model_sizes = [f"{s} {args.size or SEEDS[s]} tensorflow" for s in seeds]
    model_sizes += [f"{m} {args.size or PT2_MODELS[m]} pytorch" for m in models]
    model_sizes += [f"{s} {SEEDS[s]} tensorflow (cpu image)" for s in on_image]
    work = Path(tempfile.mkdtemp(prefix="tbench-todays-stack-"))
    env = {
        "TBENCH_CACHE_DIR": str(work / "cache" / "seeds"),  # a conversion cache of this invocation's own
        "TBENCH_POINT_CACHE_DIR": str(work / "points"),  # no point is read back without --reuse; kept out of ~/.cache
    }
    writer = dry(model_sizes) if args.dry_run else recorded(RESULTS / "todays_stack.json", model_sizes=model_sizes)
    with writer as record:
        record["settings"] = {
            "run_flags": common,
            "server": "embedded",
            "tensorflow_hidden": TF_HIDDEN,
            "work_dir": str(work),
        }
        runs: list[dict] = []
        record["runs"] = runs
        record["seeds_without_tf_backend"] = {}
        for seed in seeds:
            row = seed_pair(seed, args.size or SEEDS[seed], common, work, env, runs, record.save)
            record["seeds_without_tf_backend"][seed] = row
            print(f"{seed}: {json.dumps({k: row[k] for k in ('same_answers', 'throughput_ratio')})}", flush=True)
            record.save()
        record["pt2"] = {}
        for model in models:
            record["pt2"][model] = pt2_model(
                model, args.size or PT2_MODELS[model], common, work, env, runs, record.save
            )
            print(f"{model}: {json.dumps(record['pt2'][model])}", flush=True)
            record.save()
        record["cpu_image"] = on_cpu_image(on_image, common, work, env, runs, record.save) if on_image else {}
        record["summary"] = summary(record)
        print(json.dumps(record["summary"]), flush=True)


if __name__ == "__main__":
    main()
