"""benchmarks/provenance.py: every results file is written whole by one invocation and says which command, commit,
machine, times and model sizes produced it; and the files under benchmarks/results/ have that record (no server)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# the scripts import it as `provenance` (run as scripts, benchmarks/ is their sys.path[0])
provenance = sys.modules.get("provenance") or _load("provenance", BENCHMARKS / "provenance.py")
# tiny_model: a model, no figure
# calibration_*.py, fuzz_inputs.py, soak_faults.py and fleet_real.py are harnesses benchmarks/calibration.py,
# soak.py and fleet.py run and record: modules that write nothing themselves
SCRIPTS = sorted(
    p
    for p in BENCHMARKS.glob("*.py")
    if p.name not in ("provenance.py", "tiny_model.py", "fuzz_inputs.py", "soak_faults.py", "fleet_real.py")
    and not p.name.startswith("calibration_")
)
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00$")


def _run(path: Path, sizes=("resnet50 small",), argv=("benchmarks/fake.py", "--size", "small"), body=None) -> dict:
    with provenance.recorded(path, model_sizes=list(sizes), argv=list(argv)) as record:
        record["results"] = [1, 2, 3]
        if body:
            body(record)
    return json.loads(path.read_text())


def _temp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_every_field_is_recorded(tmp_path):
    data = _run(tmp_path / "out.json")
    assert list(data) == ["provenance", "results"] and data["results"] == [1, 2, 3]
    p = data["provenance"]
    assert set(provenance.FIELDS) <= set(p)
    python = provenance._shown(sys.executable, Path.cwd(), provenance.REPO)
    assert p["command"] == f"{python} benchmarks/fake.py --size small"
    if provenance.git_state()[0] is None:  # a copy of the tree without git: nothing to record, and it says so
        assert p["commit"] is None and p["dirty"] is None
    else:
        assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) and isinstance(p["dirty"], bool)
    m = p["machine"]
    assert m["cpu_model"] and m["cpu_cores"] >= 1 and m["memory_gib"] > 0 and isinstance(m["gpus"], list)
    assert m["python"].count(".") == 2
    assert p["model_sizes"] == ["resnet50 small"] and p["complete"] is True


def test_times_are_utc_and_ordered(tmp_path):
    before = dt.datetime.now(dt.UTC)
    p = _run(tmp_path / "out.json", body=lambda record: time.sleep(0.2))["provenance"]
    after = dt.datetime.now(dt.UTC)
    assert ISO_UTC.match(p["started"]) and ISO_UTC.match(p["ended"])
    started, ended = dt.datetime.fromisoformat(p["started"]), dt.datetime.fromisoformat(p["ended"])
    assert before - dt.timedelta(milliseconds=1) <= started < ended <= after + dt.timedelta(milliseconds=1)
    assert 0.2 <= p["wall_s"] <= (ended - started).total_seconds() + 0.05


def test_the_file_is_replaced_by_a_rename_in_its_folder(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text('{"old": true}')
    renames = []
    real_replace = os.replace

    def replace(src, dst):
        assert json.loads(Path(dst).read_text()) == {"old": True}  # the old file is whole until the rename
        assert Path(src).parent == path.parent and json.loads(Path(src).read_text())["results"] == [1, 2, 3]
        renames.append((src, dst))
        real_replace(src, dst)

    monkeypatch.setattr(provenance.os, "replace", replace)
    _run(path)
    assert len(renames) == 1 and Path(renames[0][1]) == path.resolve()
    assert _temp_files(tmp_path) == []


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text('{"old": true}')

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(provenance.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        _run(path)
    assert path.read_text() == '{"old": true}' and _temp_files(tmp_path) == []
    monkeypatch.undo()
    loop: dict = {}
    loop["self"] = loop  # cannot be serialised: nothing on disk changes
    with pytest.raises(ValueError):
        provenance.write_atomic(path, loop)
    assert path.read_text() == '{"old": true}' and _temp_files(tmp_path) == []


def test_a_rerun_replaces_the_file_whole(tmp_path):
    path = tmp_path / "out.json"
    path.write_text(json.dumps({"provenance": {"command": "earlier"}, "old": 1, "results": [9]}))
    data = _run(path)
    assert "old" not in data and data["results"] == [1, 2, 3]
    assert data["provenance"]["command"] != "earlier"
    with provenance.recorded(path, model_sizes=["resnet50 full"], argv=["benchmarks/fake.py"]) as record:
        assert dict(record) == {}  # a record starts empty: nothing is read back from the file
        record["other"] = True
    assert set(json.loads(path.read_text())) == {"provenance", "other"}


def test_a_failing_run_leaves_the_earlier_file_and_a_saved_one_says_incomplete(tmp_path):
    path = tmp_path / "out.json"
    path.write_text('{"old": true}')

    def crash(record):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(path, body=crash)
    assert path.read_text() == '{"old": true}'  # nothing of this invocation was kept: the earlier file stays whole

    def save_then_crash(record):
        record["partial"] = 1
        record.save()
        assert json.loads(path.read_text())["provenance"]["complete"] is False
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        _run(path, body=save_then_crash)
    data = json.loads(path.read_text())
    assert "old" not in data and data["partial"] == 1
    assert data["provenance"]["complete"] is False and data["provenance"]["error"] == "RuntimeError: killed"


def test_refusals(tmp_path):
    path = tmp_path / "out.json"
    with pytest.raises(ValueError, match="model size"):
        _run(path, sizes=())
    assert not path.exists()
    with pytest.raises(ValueError, match="provenance"):
        _run(path, body=lambda record: record.update(provenance={"command": "made up"}))
    assert not path.exists()
    with pytest.raises(RuntimeError, match="never merged"):
        _run(path, body=lambda record: _run(path))  # a second result set for the same file in one invocation
    # sizes may be known only inside the block (default_runs.py reads them from the run's manifest)
    data = _run(path, sizes=(), body=lambda record: record.model_sizes.append("resnet50 full"))
    assert data["provenance"]["model_sizes"] == ["resnet50 full"]


def test_command_line_as_typed_from_the_repository_root(tmp_path):
    root = tmp_path / "repo"
    python = str(root / ".venv/bin/python")
    cmd = provenance.command_line
    assert (
        cmd(["benchmarks/repeatability.py", "--size", "full"], executable=python, cwd=root, root=root)
        == ".venv/bin/python benchmarks/repeatability.py --size full"
    )
    # from another folder, and an absolute script path: still from the root; arguments shell-quoted
    assert (
        cmd(["repeatability.py", "--note", "a b"], executable=python, cwd=root / "benchmarks", root=root)
        == ".venv/bin/python benchmarks/repeatability.py --note 'a b'"
    )
    assert (
        cmd(
            [str(root / "benchmarks/search.py"), "--part", "real"],
            orig_argv=["python", "-u", "benchmarks/search.py", "--part", "real"],
            executable=python,
            cwd=root,
            root=root,
        )
        == ".venv/bin/python -u benchmarks/search.py --part real"
    )
    assert (
        cmd(
            [str(root / "benchmarks/search.py"), "--part", "real"],
            orig_argv=["python", "-m", "benchmarks.search", "--part", "real"],
            executable=python,
            cwd=root,
            root=root,
        )
        == ".venv/bin/python -m benchmarks.search --part real"
    )
    assert (
        cmd(["benchmarks/search.py"], executable="/usr/bin/python3", cwd=root, root=root)
        == "/usr/bin/python3 benchmarks/search.py"
    )


def test_git_state_leaves_the_results_folder_out(tmp_path):
    def git(*args):
        subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True,
            capture_output=True,
        )

    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / "benchmarks/x.py").write_text("x = 1\n")
    (tmp_path / "benchmarks/results/x.json").write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    commit, dirty, changed = provenance.git_state(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and dirty is False and changed == []
    (tmp_path / "benchmarks/results/x.json").write_text('{"new": 1}\n')  # a benchmark's output: not code
    (tmp_path / "benchmarks/results/y.json").write_text("{}\n")
    assert provenance.git_state(tmp_path)[1] is False
    (tmp_path / "benchmarks/x.py").write_text("x = 2\n")
    (tmp_path / "new.py").write_text("")
    commit2, dirty, changed = provenance.git_state(tmp_path)
    assert commit2 == commit and dirty is True and sorted(changed) == ["benchmarks/x.py", "new.py"]
    assert provenance.git_state(tmp_path / "nowhere") == (None, None, [])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_writes_through_provenance(script):
    """Each script records its results with `recorded`, takes or records a model size, writes no results file any
    other way, and has its command in provenance.COMMANDS (the docs' page on our own figures lists the same)."""
    source = script.read_text()
    assert "from provenance import" in source and "recorded(RESULTS / " in source
    # the sleeper's size is its service time (benchmarks/capacity_truth.py), a simulation's the truth it simulates; a
    # script that measures no model (the fuzz, the kit's build) says so; the tiny model has one size
    sized = any(f'"--{o}' in source for o in ("size", "plan", "service-ms")) or any(
        f'model_sizes=["{kind}' in source for kind in ("simulated", "no model: ", "tiny onnx")
    )
    assert "model_sizes" in source and sized
    assert "write_text(json.dumps" not in source and "json.dump(" not in source
    outputs = [name for name, command in provenance.COMMANDS.items() if f" benchmarks/{script.name} " in command + " "]
    assert outputs, f"{script.name} has no command in provenance.COMMANDS"
    for name in outputs:
        assert f'RESULTS / "{name}"' in source
    page = (BENCHMARKS.parent / "docs" / "concepts" / "benchmarks.md").read_text()
    for name in outputs:
        assert provenance.COMMANDS[name] in page and f"benchmarks/results/{name}" in page


def test_search_measures_what_it_reports_within_the_invocation(tmp_path, capsys):
    """search_real.json once reported searches an earlier invocation measured: `--work` was reused and the searches
    resumed from its checkpoints (empty `loads`, a wall time shorter than the exhaustive search). Now a used --work is
    refused, and a search result that holds anything read back from a checkpoint is an error."""
    search = _load("benchmarks_search", BENCHMARKS / "search.py")
    from tbench.search.strategies import Candidate, Checkpoint, Objective, Observation, SearchSpace, exhaustive_search

    class Evaluator:
        def evaluate(self, c: Candidate) -> Observation:
            return Observation(
                candidate=c, throughput=100.0 * c.max_batch_size, p99_ms=1.0 + c.max_batch_size, seconds=0.01
            )

    space = SearchSpace(instances=[1], max_batch_sizes=[1, 2], preferred=["none"], queue_delays_us=[0])
    first = search.LoadRecorder(Evaluator())
    result = exhaustive_search(space, Objective(), first, Checkpoint(tmp_path / "work/exhaustive.jsonl"))
    search.measured_here("exhaustive", result, first.loads)  # all measured here: fine
    again = search.LoadRecorder(Evaluator())
    resumed = exhaustive_search(space, Objective(), again, Checkpoint(tmp_path / "work/exhaustive.jsonl"))
    assert again.loads == [] and resumed.measured == 2  # what made search_real.json stale
    with pytest.raises(RuntimeError, match="earlier invocation"):
        search.measured_here("exhaustive", resumed, again.loads)
    with pytest.raises(SystemExit, match="not empty"):
        search.fresh_work_dir(str(tmp_path / "work"))
    assert search.fresh_work_dir(str(tmp_path / "new")).is_dir()
    assert search.fresh_work_dir(None).is_dir()


RESULT_FILES = sorted(provenance.RESULTS.glob("*.json"))


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_results_file_has_a_complete_provenance_block(path):
    data = json.loads(path.read_text())
    command = provenance.COMMANDS.get(path.name, "the benchmarks/ script that writes it")
    if "provenance" not in data:
        pytest.skip(f"stale: produced before provenance records; re-run: {command}")
    p = data["provenance"]
    missing = [f for f in provenance.FIELDS if p.get(f) in (None, "", [], {}) and f != "dirty"]
    assert not missing, f"{path.name}: provenance lacks {missing}"
    assert isinstance(p["dirty"], bool)
    # every results file has its command, and the record names that command's script as a word of its own
    assert path.name in provenance.COMMANDS, f"{path.name}: no command in provenance.COMMANDS writes it"
    script = f"benchmarks/{command.split('benchmarks/')[1].split()[0]}"
    words = shlex.split(p["command"])
    assert script in words and words[0].split("/")[-1].startswith("python"), p["command"]
    assert re.fullmatch(r"[0-9a-f]{40}", p["commit"])
    assert all(p["machine"].get(k) not in (None, "") for k in ("cpu_model", "cpu_cores", "memory_gib", "gpus"))
    assert ISO_UTC.match(p["started"]) and ISO_UTC.match(p["ended"])
    assert dt.datetime.fromisoformat(p["started"]) <= dt.datetime.fromisoformat(p["ended"])
    span = dt.datetime.fromisoformat(p["ended"]) - dt.datetime.fromisoformat(p["started"])
    assert 0 <= p["wall_s"] <= span.total_seconds() + 1
    assert all(isinstance(s, str) and s.strip() for s in p["model_sizes"])
    assert p["complete"] is True, f"{path.name}: an interrupted run ({p.get('error')}); re-run: {command}"


def test_a_number_that_is_not_finite_is_written_as_null(tmp_path):
    import numpy as np

    path = provenance.write_atomic(
        tmp_path / "out.json", {"p99": float("nan"), "rows": [np.float64("inf"), 1.5], "n": np.int64(3)}
    )
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()
    assert json.loads(path.read_text()) == {"p99": None, "rows": [None, 1.5], "n": 3}
