"""A real fleet on this machine, as a user would plan it, and the interference of two models on one server.

1. Three models, each given a model repository the way a user gets one: the tiny image model's ONNX file and the small
   ResNet-50 (each through a short `tbench run`, whose run folder holds its model_repository), and the sleeper (10 ms
   a request, a python-backend model of known capacity, tbench.triton.sleeper).
2. Each model's sustainable rate within its SLO, as served from that repository: `tbench capacity --served-model`
   against an embedded server started here on the repository.
3. Interference: `tbench colocate` of the tiny model and the ResNet-50 at fixed rates (INTERFERENCE_SHARE of each one's
   sustainable rate: together they ask 0.6 of the machine, so neither is measured beyond what it can serve), alone and
   together: throughput and p99 each.
4. The fleet: traffic for each model at a share of its sustainable rate, a fleet file naming the repositories, and
   `tbench fleet --pool cpu`: the plan, each shared node measured with its models together.

Imported by benchmarks/fleet.py, which records it beside the simulated fleets (`real_fleet`, `interference`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

TBENCH = str(Path(sys.executable).with_name("tbench"))
SLOS_MS = {"tiny": 20.0, "resnet": 60.0, "sleeper": 60.0}  # p99 SLOs of the three models
TRAFFIC_SHARE = {"tiny": 0.3, "resnet": 0.25, "sleeper": 0.25}  # each model's traffic over its sustainable rate
# each capacity search bounded (a slowly rising percentile took 60 points, ~40 min, at the defaults)
SEARCH = ["--max-points", "20", "--tolerance", "0.1"]


def tbench(*args: str, timeout_s: float = 1800) -> Path:
    """A tbench command; its run folder (the last line it prints)."""
    done = subprocess.run([TBENCH, *args], capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"tbench {' '.join(args)} failed ({done.returncode}): {done.stdout[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def only_model(repository: Path) -> str:
    [name] = [p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file()]
    return name


def repositories(work: Path) -> dict[str, Path]:
    """Each model's repository: the tiny and ResNet-50 ones from a short `tbench run` each."""
    from tiny_model import build_tiny_image_onnx

    from tbench.triton.sleeper import sleeper_repository

    runs = work / "runs"
    quick = ["--scenarios", "online", "--concurrency", "1", "--window-s", "0.5", "--output", str(runs)]
    tiny = tbench("run", "--model-file", str(build_tiny_image_onnx(work / "tiny.onnx")), *quick)
    resnet = tbench("run", "resnet50", "--size", "small", "--formats", "onnx", *quick)
    return {
        "tiny": tiny / "model_repository",
        "resnet": resnet / "model_repository",
        "sleeper": sleeper_repository(work / "sleeper_repo", 10.0),
    }


def sustainable_rates(repos: dict[str, Path], work: Path) -> dict[str, dict]:
    """Each model's sustainable rate within its p99 SLO, served from its repository (`tbench capacity`)."""
    from tbench.triton.process_server import EmbeddedServer

    found = {}
    for key, repo in repos.items():
        name = only_model(repo)
        started = time.monotonic()
        with EmbeddedServer(repo, work / f"{key}_server.log") as server:
            url = f"{server.endpoints.grpc_url},{server.endpoints.http_url}"
            run = tbench(
                "capacity", "--served-model", name, "--server-url", url, "--slo-p99-ms", f"{SLOS_MS[key]:g}",
                "--traffic", "1", *SEARCH, "--output", str(work / "runs"),
            )  # fmt: skip
        answer = json.loads((run / "capacity.json").read_text())["answers"][0]
        found[key] = {
            "model": name,
            "search": " ".join(SEARCH),
            "slo_p99_ms": SLOS_MS[key],
            "sustainable_rps": answer["plan"]["sustainable_rps"] if answer.get("plan") else None,
            "status": answer["status"],
            "search_s": round(time.monotonic() - started, 1),
        }
    return found


INTERFERENCE_SHARE = 0.3  # at 0.5 each (the whole machine together) the ResNet-50 did not stabilise together


def interference(repos: dict[str, Path], rates: dict[str, dict], work: Path) -> dict:
    """The tiny model and the ResNet-50 at INTERFERENCE_SHARE of their sustainable rates, alone and together."""
    loads = {key: INTERFERENCE_SHARE * rates[key]["sustainable_rps"] for key in ("tiny", "resnet")}
    args = ["colocate", "--output", str(work / "runs")]
    for key, rate in loads.items():
        args += ["--repository", str(repos[key]), "--load", f"{rates[key]['model']}@rate={rate:.4g}"]
    run = tbench(*args)
    results = pd.read_csv(run / "results.csv")
    out = {}
    for key in loads:
        rows = results[results["model"] == rates[key]["model"]].set_index("colocation")
        out[key] = {
            "rate_rps": round(loads[key], 3),
            **{
                f"{c}_{what}": round(float(rows.loc[c, column]), 3)
                for c in ("alone", "together")
                for what, column in (("infer_per_s", "throughput_infer_per_s"), ("p99_ms", "p99_ms"))
            },
            "status": {c: str(rows.loc[c, "status"]) for c in ("alone", "together")},
        }
        out[key]["p99_change"] = round(out[key]["together_p99_ms"] / out[key]["alone_p99_ms"] - 1, 3)
    return out | {"run": run.name}


def real_fleet(repos: dict[str, Path], rates: dict[str, dict], work: Path) -> dict:
    """A fleet of the three at a share of their sustainable rates, planned on the cpu pool and confirmed here."""
    fleet = {
        "headroom": 0.2,
        "pools": [{"name": "cpu"}],
        "models": [
            {
                "name": rates[key]["model"],
                "traffic_rps": round(TRAFFIC_SHARE[key] * rates[key]["sustainable_rps"], 3),
                "slo_ms": SLOS_MS[key],
                "sustainable_rps": {"cpu": rates[key]["sustainable_rps"]},
                "repository": str(repos[key]),
            }
            for key in repos
        ],
    }
    path = work / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    started = time.monotonic()
    run = tbench("fleet", str(path), "--pool", "cpu", "--output", str(work / "runs"))
    record = json.loads((run / "fleet_plan.json").read_text())
    plan = record["plan"]
    return {
        "fleet": fleet | {"models": [m | {"repository": Path(m["repository"]).parent.name} for m in fleet["models"]]},
        "nodes": [{"pool": n["pool"], "rates_rps": n["rates_rps"], "load": round(n["load"], 3)} for n in plan["nodes"]],
        "usd_per_hour": plan["usd_per_hour"],
        "alone_usd_per_hour": plan["alone_usd_per_hour"],
        "confirmations": [
            {k: c[k] for k in ("models", "rates_rps", "held", "reason", "points")} for c in record["confirmations"]
        ],
        "rounds": record["rounds"],
        "seconds": round(time.monotonic() - started, 1),
        "run": run.name,
    }
