"""Bad input, generated: command lines and request forms that tbench must refuse in one line, with a non-zero exit and
no traceback, writing nothing. A harness module of benchmarks/soak.py (the record is its `fuzz` part).

Each command line runs as a user runs it (`tbench ...`, its own process, in an empty working folder with its own
HOME), under a time limit: one that is still running then was not refused (it started a run) and counts as such.
The forms are what the Prefect UI sends to the benchmark, search, capacity, colocated and fleet deployments: each is
validated as a flow parameter is (pydantic) and resolved as the flow resolves it (a fleet's file read); a form that
gets through both was not refused, and a refusal counts the lines of its message.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TBENCH = REPO / ".venv" / "bin" / "tbench"
OUTSIDE = [Path("/nonexistent"), Path("/nonexistent.json")]  # paths the cases name that must stay absent
LIMIT_S = 60  # a refusal comes before anything starts: seconds, not minutes

# option -> bad values (a wrong type, an unknown name, a number out of range, a malformed list)
RUN_OPTIONS = {
    "--batch-sizes": ["abc", "-1", "0", "1,,2", "4:1:1", "1:8:0", "1.5", "", "99999999"],
    "--concurrency": ["x", "0", "-3", "1:5:0", "1;2"],
    "--scenarios": ["offlin", "online,bogus", "", "OFFLINE;ONLINE"],
    "--online-batch-size": ["0", "-1", "x", "1e9"],
    "--request-rates": ["-5", "abc", "0", "nan"],
    "--distribution": ["gaussian", ""],
    "--max-batch-size": ["-1", "x"],
    "--instances": ["0", "-2", "x", "3.5"],
    "--preferred-batch-sizes": ["a", "-4", "0"],
    "--queue-delay-us": ["-1", "x"],
    "--profile": ["quantum", ""],
    "--precision": ["fp64", "int3", ""],
    "--formats": ["xyz", "onnx,bogus", ",", ""],
    "--serve": ["bogus", "trt"],
    "--server": ["cloud", "remote", "local"],
    "--server-url": ["notaurl:::", "host:port:extra:more"],
    "--http-port": ["-1", "70000", "x"],
    "--grpc-port": ["70000", "-8"],
    "--window-s": ["-1", "0", "x", "inf"],
    "--stability": ["-5", "x", "0"],
    "--max-trials": ["0", "-1", "x"],
    "--framework": ["jax", ""],
    "--size": ["gigantic", ""],
    "--option": ["nokey", "bogus=1", "=3"],
    "--checkpoint": ["/nonexistent/weights.pt"],
    "--dataset": ["/nonexistent/dataset"],
    "--baseline": ["/nonexistent/run"],
    "--docker-ulimit": ["bad", "memlock=abc"],
    "--trt-shape": ["bad", "x:1:2"],
    "--calibration-samples": ["-1", "x"],
}
MODEL_FILE_OPTIONS = {
    "--shape": ["x:1", "input:abc", "input:-5", "nocolon"],
    "--dtype": ["input:complex512", "input"],
    "--value-range": ["input:5,1", "input:a,b", "input"],
}


@dataclass
class Outcome:
    kind: str  # cli | form
    case: str
    exit_code: int | None = None
    lines: int = 0  # non-empty lines the refusal printed (stderr; the form's message)
    traceback: bool = False
    refused: bool = False  # a non-zero exit (a form: a validation or config error) before anything started
    timed_out: bool = False
    wrote: list[str] | None = None  # files the command left in its working folder or HOME
    first_line: str = ""


def files(paths: list[Path]) -> set[str]:
    return {str(p) for root in paths if root.exists() for p in root.rglob("*") if p.is_file()}


def fixtures(root: Path) -> dict[str, Path]:
    """Model files and input data a user may get wrong."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    root.mkdir(parents=True, exist_ok=True)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["output"])],
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [None, 4])],
    )
    good = root / "good.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(good))
    made = {"good": good}
    made["garbage"] = root / "garbage.onnx"
    made["garbage"].write_bytes(os.urandom(2048))
    made["empty"] = root / "empty.onnx"
    made["empty"].write_bytes(b"")
    made["truncated"] = root / "truncated.onnx"
    made["truncated"].write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    made["folder"] = root / "folder.onnx"
    made["folder"].mkdir(exist_ok=True)
    made["unreadable"] = root / "unreadable.onnx"  # a link whose file is gone (this user may read anything)
    made["unreadable"].symlink_to(root / "moved-away.onnx")
    made["text"] = root / "model.txt"
    made["text"].write_text("not a model")
    made["pickle"] = root / "model.pkl"
    made["pickle"].write_bytes(b"\x80\x04K\x01.")
    made["bad_json"] = root / "bad.json"
    made["bad_json"].write_text("{not json")
    made["wrong_names"] = root / "wrong_names.json"
    made["wrong_names"].write_text(json.dumps({"data": [{"nosuch": [1.0, 2.0, 3.0, 4.0]}]}))
    made["wrong_shape"] = root / "wrong_shape.json"
    made["wrong_shape"].write_text(json.dumps({"data": [{"input": [1.0, 2.0, 3.0]}]}))
    made["empty_json"] = root / "empty.json"
    made["empty_json"].write_text("")
    made["npz_wrong"] = root / "wrong.npz"
    np.savez(made["npz_wrong"], nosuch=np.zeros((2, 4), np.float32))
    made["npz_garbage"] = root / "garbage.npz"
    made["npz_garbage"].write_bytes(os.urandom(512))
    made["fleet_list"] = root / "fleet_list.yaml"  # valid YAML, not a mapping
    made["fleet_list"].write_text("- a\n- b\n")
    made["fleet_bad_model"] = root / "fleet_bad_model.yaml"
    made["fleet_bad_model"].write_text(
        "models: [{name: a, traffic_rps: -1, slo_ms: 10, sustainable_rps: {cpu: 100}}]\npools: [{name: cpu}]\n"
    )
    made["fleet_no_repository"] = root / "fleet_no_repository.yaml"
    made["fleet_no_repository"].write_text(
        "models: [{name: a, traffic_rps: 1, slo_ms: 10, sustainable_rps: {cpu: 100}, repository: /nonexistent/repo}]\n"
        "pools: [{name: cpu, usd_per_hour: 1}]\n"
    )
    return made


def cli_cases(fx: dict[str, Path], rng: random.Random) -> list[tuple[str, list[str]]]:
    cases: list[tuple[str, list[str]]] = []
    for option, values in RUN_OPTIONS.items():
        cases += [(f"run {option} {v!r}", ["run", "resnet50", "--size", "small", option, v]) for v in values]
    good = str(fx["good"])
    for option, values in MODEL_FILE_OPTIONS.items():
        cases += [(f"run --model-file {option} {v!r}", ["run", "--model-file", good, option, v]) for v in values]
    for name in ("garbage", "empty", "truncated", "folder", "unreadable", "text", "pickle"):
        cases.append((f"run --model-file {name}", ["run", "--model-file", str(fx[name])]))
    cases.append(("run --model-file missing", ["run", "--model-file", "/nonexistent/model.onnx"]))
    for name in ("bad_json", "wrong_names", "wrong_shape", "empty_json", "npz_wrong", "npz_garbage"):
        cases.append((f"run --input-data {name}", ["run", "--model-file", good, "--input-data", str(fx[name])]))
    cases.append(("run --input-data missing", ["run", "--model-file", good, "--input-data", "/nonexistent.json"]))
    for out in ("/proc/tbench-out", "/dev/null/out", "/sys/tbench-out", "s3://", "nosuch://bucket/runs"):
        cases.append((f"run --output {out}", ["run", "resnet50", "--size", "small", "--output", out]))
    cases += [
        ("run unknown model", ["run", "nosuchmodel"]),
        ("run no model", ["run"]),
        ("run unknown option", ["run", "resnet50", "--bogus", "1"]),
        ("run two models", ["run", "resnet50", "widedeep"]),
    ]
    search = {
        "--instances": ["0", "x", "-1"],
        "--max-batch-sizes": ["abc", "-1"],
        "--preferred": ["x"],
        "--queue-delays-us": ["-5", "x"],
        "--p99-budget-ms": ["-1", "x", "0"],
        "--throughput-floor": ["-3", "x"],
        "--strategy": ["genetic", ""],
        "--budget-fraction": ["2", "-0.5", "x"],
        "--confirm-rounds": ["-1", "x"],
        "--concurrency": ["0", "x"],
        "--resume": ["/nonexistent/run"],
        "--variants": ["nosuch"],
    }
    for option, values in search.items():
        cases += [(f"search {option} {v!r}", ["search", "resnet50", "--size", "small", option, v]) for v in values]
    capacity = {
        "--percentile": ["98", "x", "100"],
        "--confidence": ["1.5", "0", "x"],
        "--margin-fraction": ["0", "2", "x"],
        "--headroom": ["-1", "x"],
        "--prices": ["/nonexistent/prices.csv", str(fx["bad_json"])],
        "--tolerance": ["0", "-1", "x"],
        "--max-points": ["0", "-2", "x"],
        "--start-rps": ["-1", "x"],
        "--pools": ["nosuchpool"],
    }
    for option, values in capacity.items():
        cases += [
            (f"capacity {option} {v!r}", ["capacity", "resnet50", "100", "--slo-ms", "50", option, v]) for v in values
        ]
    cases += [
        ("capacity traffic x", ["capacity", "resnet50", "x", "--slo-ms", "50"]),
        ("capacity traffic -1", ["capacity", "resnet50", "-1", "--slo-ms", "50"]),
        ("capacity slo -5", ["capacity", "resnet50", "100", "--slo-ms", "-5"]),
        ("capacity slo x", ["capacity", "resnet50", "100", "--slo-ms", "x"]),
        ("capacity no slo", ["capacity", "resnet50", "100"]),
        ("compare missing", ["compare", "/nonexistent/a", "/nonexistent/b"]),
        ("compare one", ["compare", "/nonexistent/a"]),
        ("compare a file", ["compare", str(fx["text"]), str(fx["text"])]),
        ("compare min-effect", ["compare", "/nonexistent/a", "/nonexistent/b", "--min-effect", "x"]),
        ("history missing root", ["history", "/nonexistent/root"]),
        ("history min-effect", ["history", "/nonexistent/root", "--min-effect", "-1"]),
        ("history output unwritable", ["history", "/nonexistent/root", "--output", "/proc/site"]),
        ("results missing root", ["results", "--root", "/nonexistent/root"]),
        ("results bad since", ["results", "--root", "/nonexistent/root", "--since", "yesterdayish"]),
        ("results csv unwritable", ["results", "--root", "/nonexistent/root", "--csv", "/proc/x.csv"]),
        ("upload missing", ["upload", "/nonexistent/run"]),
        ("upload a file", ["upload", str(fx["text"])]),
        ("submit unknown pool", ["submit", "resnet50", "--pool", "nosuchpool"]),
        ("submit bad batch", ["submit", "resnet50", "--batch-sizes", "x"]),
        ("doctor bad option", ["doctor", "--bogus"]),
        ("stack unknown command", ["stack", "explode"]),
        ("stack up bad pool", ["stack", "up", "--pools", "nosuchpool"]),
        ("unknown command", ["benchmark-everything"]),
    ]
    # pairs of bad options: the first refusal is the one named
    pairs = list(itertools.combinations(sorted(RUN_OPTIONS), 2))
    for a, b in rng.sample(pairs, 40):
        argv = ["run", "resnet50", "--size", "small", a, rng.choice(RUN_OPTIONS[a]), b, rng.choice(RUN_OPTIONS[b])]
        cases.append((f"run {a} + {b}", argv))
    return cases


def form_cases(rng: random.Random, fx: dict[str, Path]) -> list[tuple[str, str, dict]]:
    """(flow, label, form): what a Prefect UI form may hold, wrong."""
    bad_values = {
        "model": ["nosuch", 3, None, ""],
        "batch_sizes": ["x", [-1], [0], [1, "a"], {}],
        "concurrency": [[0], "many", [-2]],
        "scenarios": [["offlin"], "online", [1]],
        "precision": ["fp64", 16],
        "formats": [["xyz"], "onnx"],
        "model_instances": [0, -1, "x"],
        "max_batch_size": [-1, "x"],
        "online_batch_size": [0, "x"],
        "request_rates": [[-1.0], ["x"]],
        "request_distribution": ["gaussian"],
        "server": ["cloud"],
        "http_port": [70000, -1],
        "profile": ["quantum"],
        "output": [5],
        "tolerance_atol": [-1, "x"],
        "accuracy_samples": [-3],
        "model_file": ["/nonexistent/model.onnx"],
        "nosuch_field": [1],
    }
    cases = [
        ("benchmark", f"{field}={value!r}", {"model": "resnet50", "size": "small", field: value})
        for field, values in bad_values.items()
        for value in values
    ]
    cases += [
        ("search", "search strategy", {"strategy": "genetic"}),
        ("search", "search budget", {"budget_fraction": 3}),
        ("search", "search confirm", {"confirm_rounds": -1}),
        ("capacity", "capacity slo", {"traffic_rps": 100, "slo_ms": -1}),
        ("capacity", "capacity traffic", {"traffic_rps": "x", "slo_ms": 10}),
        ("capacity", "capacity pools", {"traffic_rps": 10, "slo_ms": 10, "pools": ["nosuchpool"]}),
        ("capacity", "capacity max points", {"traffic_rps": 10, "slo_ms": 10, "max_points": 0}),
    ]
    load = {"model": "resnet50", "rate": 10}
    colocated = {
        "no loads": {"loads": []},
        "load without rate or concurrency": {"loads": [{"model": "a"}]},
        "load with rate and concurrency": {"loads": [{"model": "a", "rate": 10, "concurrency": 2}]},
        "load without a model": {"loads": [{"model": "", "rate": 1}]},
        "negative rate": {"loads": [{"model": "a", "rate": -1}]},
        "load percentile": {"loads": [{**load, "percentile": 42}]},
        "load slo": {"loads": [{**load, "slo_ms": 0}]},
        "missing repository": {"loads": [load], "repositories": ["/nonexistent/repo"]},
        "a file as repository": {"loads": [load], "repositories": [str(fx["text"])]},
        "server": {"loads": [load], "repositories": [str(fx["folder"])], "server": "cloud"},
        "port": {"loads": [load], "server_url": "localhost:8001,localhost:8000", "http_port": 70000},
        "percentile": {"loads": [load], "server_url": "localhost:8001,localhost:8000", "percentile": 42},
        "loads as text": {"loads": "resnet50:rate=10"},
        "unknown field": {"loads": [load], "server_url": "localhost:8001,localhost:8000", "nosuch_field": 1},
    }
    cases += [("colocated", label, form) for label, form in colocated.items()]
    fleet = {
        "no fleet": {},
        "missing fleet file": {"fleet": "/nonexistent/fleet.yaml"},
        "fleet file not JSON": {"fleet": str(fx["bad_json"])},
        "fleet file a folder": {"fleet": str(fx["folder"])},
        "fleet file not a mapping": {"fleet": str(fx["fleet_list"])},
        "fleet model's traffic": {"fleet": str(fx["fleet_bad_model"])},
        "fleet model's repository": {"fleet": str(fx["fleet_no_repository"])},
        "missing prices": {"fleet": str(fx["fleet_bad_model"]), "prices": "/nonexistent/prices.csv"},
        "rounds": {"fleet": str(fx["fleet_list"]), "rounds": 0},
        "child timeout": {"fleet": str(fx["fleet_list"]), "child_timeout_s": -1},
        "server": {"fleet": str(fx["fleet_list"]), "server": "remote"},
        "window": {"fleet": str(fx["fleet_list"]), "window_s": 0},
        "unknown field": {"fleet": str(fx["fleet_list"]), "nosuch_field": 1},
    }
    cases += [("fleet", label, form) for label, form in fleet.items()]
    return cases


def run_cli(label: str, argv: list[str], work: Path) -> Outcome:
    home, cwd = work / "home", work / "cwd"
    home.mkdir(parents=True)
    cwd.mkdir()
    env = {**os.environ, "HOME": str(home), "TBENCH_ARTIFACT_ROOT": str(cwd / "runs"), "NO_COLOR": "1"}
    env.pop("PREFECT_API_URL", None)
    before = files([home, cwd])
    outcome = Outcome("cli", label)
    process = subprocess.Popen(
        [str(TBENCH), *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:  # it started something: stop it and everything it started
        os.killpg(process.pid, signal.SIGINT)
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
        outcome.timed_out = True
    lines = [line for line in err.splitlines() if line.strip()]
    outcome.exit_code = process.returncode
    outcome.lines = len(lines)
    outcome.first_line = lines[0][:200] if lines else ""
    outcome.traceback = "Traceback" in out + err
    outcome.refused = process.returncode not in (0, None) and not outcome.timed_out
    wrote = sorted(files([home, cwd]) - before)
    outcome.wrote = [str(Path(w).relative_to(work)) for w in wrote if "/.cache/matplotlib/" not in w]  # its font list
    for made in (p for p in OUTSIDE if p.exists()):  # the cases' absolute paths: nothing may make them
        outcome.wrote.append(str(made))
        shutil.rmtree(made, ignore_errors=True)
    return outcome


def run_form(flow: str, label: str, form: dict) -> Outcome:
    from pydantic import ValidationError

    from tbench.capacity.fleet_file import load_fleet
    from tbench.capacity.request import CapacityRequest, FleetRequest
    from tbench.cli.common import validation_line
    from tbench.core.errors import BenchError
    from tbench.request.benchmark import BenchmarkRequest
    from tbench.request.colocated import ColocatedRequest
    from tbench.search.request import SearchRequest

    outcome = Outcome("form", f"{flow}: {label}")
    message = ""
    try:
        if flow == "benchmark":
            BenchmarkRequest.model_validate(form).resolve(has_gpu=False)
        elif flow == "search":
            SearchRequest.model_validate(form)
        elif flow == "colocated":
            ColocatedRequest.model_validate(form)
        elif flow == "fleet":  # the flow reads the fleet file first
            request = FleetRequest.model_validate(form)
            load_fleet(request.fleet, request.prices)
        else:
            CapacityRequest.model_validate(form)
    except ValidationError as err:
        outcome.refused, message = True, validation_line(err)
    except BenchError as err:  # the flow run fails with this message
        outcome.refused, message = True, str(err)
    except Exception as err:  # anything else reaches the user as a traceback in the flow run's log
        outcome.traceback, message = True, f"{type(err).__name__}: {err}"
    # the message's own lines, as the form's user reads them in the flow run's state
    lines = [line for line in message.splitlines() if line.strip()]
    outcome.lines = len(lines)
    outcome.first_line = lines[0][:200] if lines else ""
    return outcome


def fuzz(seed: int = 0, workers: int = 2, progress=print) -> dict:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="tbench-fuzz-") as tmp:
        root = Path(tmp)
        fx = fixtures(root / "fixtures")
        cases = cli_cases(fx, rng)
        done = 0

        def one(item):
            nonlocal done
            i, (label, argv) = item
            result = run_cli(label, argv, root / f"case{i:04d}")
            done += 1
            if done % 20 == 0:
                progress(f"fuzz: {done}/{len(cases)} command lines")
            return result

        with ThreadPoolExecutor(workers) as pool:
            outcomes = list(pool.map(one, enumerate(cases)))
        outcomes += [run_form(*case) for case in form_cases(rng, fx)]
    cli = [o for o in outcomes if o.kind == "cli"]
    return {
        "inputs_tried": len(outcomes),
        "command_lines": len(cli),
        "forms": len(outcomes) - len(cli),
        "refused_in_one_line": sum(o.refused and o.lines == 1 and not o.traceback for o in outcomes),
        "refused_in_more_lines": [asdict(o) for o in outcomes if o.refused and o.lines > 1 and not o.traceback],
        "not_refused": [asdict(o) for o in outcomes if not o.refused and not o.traceback],
        "tracebacks": sum(o.traceback for o in outcomes),
        "traceback_cases": [asdict(o) for o in outcomes if o.traceback],
        "wrote_files": [asdict(o) for o in cli if o.wrote],
        "limit_s": LIMIT_S,
        "examples": [asdict(o) for o in outcomes[:: max(1, len(outcomes) // 12)]],
    }


if __name__ == "__main__":
    print(json.dumps({k: v for k, v in fuzz().items() if k != "examples"}, indent=2, default=str), file=sys.stdout)
