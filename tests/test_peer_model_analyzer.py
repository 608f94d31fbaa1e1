"""benchmarks/peer_model_analyzer.py's pure parts: Model Analyzer's recommendation read from its inference table (an
ensemble's quoted cells too), the referee's alternating order, medians and window size, the wrapper scripts and
the profile config. No Model Analyzer install, no server."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
GOLDEN = Path(__file__).resolve().parent / "golden" / "model_analyzer"


def _load():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports `provenance` as a script does
    spec = importlib.util.spec_from_file_location("peer_model_analyzer", BENCHMARKS / "peer_model_analyzer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


peer = _load()

HEADER = (
    "Model,Batch,Concurrency,Model Config Path,Instance Group,Max Batch Size,Satisfies Constraints,"
    "Throughput (infer/sec),p99 Latency (ms)"
)
# Model Analyzer's results/metrics-model-inference.csv: configs best first, a config's passing rows first (best first)
SINGLE_TABLE = "\n".join(
    [
        HEADER,
        "resnet50,1,8,resnet50_config_3,2:CPU,4,No,2410.5,9.8",  # its best config over budget at 8 clients
        "resnet50,1,4,resnet50_config_3,2:CPU,4,No,2300.0,6.1",
        "resnet50,1,4,resnet50_config_1,2:CPU,1,Yes,1998.2,4.7",  # the first row that meets the budget
        "resnet50,1,2,resnet50_config_1,2:CPU,1,Yes,1500.0,2.2",
        "resnet50,1,8,resnet50_config_1,2:CPU,1,No,2050.0,8.3",
        "resnet50,1,1,resnet50_config_default,1:CPU,8,Yes,900.0,1.1",
    ]
)
# Model Analyzer 1.58's quick search of the ensemble repository as it ran here: its inference table, verbatim
ENSEMBLE_TABLE = (GOLDEN / "ensemble-quick-metrics-model-inference.csv").read_text()


def test_the_recommendation_is_the_first_row_that_meets_the_constraints():
    rows = peer.parse_ma_inference_table(SINGLE_TABLE + "\n\n")
    best = peer.ma_recommendation(rows)
    assert (best.config, best.concurrency, best.throughput, best.p99_ms) == ("resnet50_config_1", 4, 1998.2, 4.7)
    assert best.composing == () and best.passes
    assert peer.ma_counts(rows) == {"configs_measured": 3, "measurements": 6, "over_budget": 3}


def test_nothing_meets_the_constraints():
    rows = peer.parse_ma_inference_table("\n".join(SINGLE_TABLE.splitlines()[:3]))
    assert peer.ma_recommendation(rows) is None


def test_an_ensembles_row_names_its_steps_variants():
    rows = peer.parse_ma_inference_table(ENSEMBLE_TABLE)
    best = peer.ma_recommendation(rows)
    assert best.config == "classifier_config_5" and best.composing == ("preprocess_config_0", "resnet50_config_2")
    assert (best.concurrency, best.throughput, best.p99_ms) == (4, 1588.1, 4.4)
    default = [r for r in rows if r.config == "classifier_config_default"]
    assert {r.composing for r in default} == {("preprocess_config_default", "resnet50_config_default")}
    assert peer.model_of_variant("resnet50_config_default") == "resnet50"


def test_another_table_is_refused():
    with pytest.raises(ValueError, match="inference table"):
        peer.parse_ma_inference_table("Model,GPU UUID,Batch\nx,y,1")


def _user_ensemble(root: Path) -> Path:
    for name, text in {
        "preprocess": 'backend: "python"\nmax_batch_size: 8\n',
        "resnet50": 'backend: "python"\nmax_batch_size: 8\n',
        "classifier": 'platform: "ensemble"\nmax_batch_size: 8\nensemble_scheduling { step { model_name: "preprocess" '
        'model_version: -1 } step { model_name: "resnet50" model_version: -1 } }\n',
    }.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(text)
    return root


def test_ma_pick_reads_the_variants_configs_back_under_the_users_names(tmp_path):
    """The pick's three configs (the ensemble's too: Model Analyzer sets its max batch to its steps' smallest), named as
    the user's models again, and loadable as Triton's rules go."""
    out = tmp_path / "ma"
    (out / "export" / "results").mkdir(parents=True)
    (out / "export" / "results" / "metrics-model-inference.csv").write_text(ENSEMBLE_TABLE)
    variants = {"classifier_config_5": 1, "preprocess_config_0": 1, "resnet50_config_2": 2}
    for variant, batch in variants.items():
        folder = out / "output_model_repository" / variant
        folder.mkdir(parents=True)
        kind = 'platform: "ensemble"' if variant.startswith("classifier") else 'backend: "python"'
        (folder / "config.pbtxt").write_text(f'name: "{variant}"\n{kind}\nmax_batch_size: {batch}\n')
    repo = peer.UserRepository(
        "ensemble", _user_ensemble(tmp_path / "user"), "classifier", None, ("preprocess", "resnet50")
    )
    picked = peer.ma_pick(out, repo, 6.01)
    configs = picked["recommended"]["configs"]
    assert set(configs) == {"classifier", "preprocess", "resnet50"}
    assert 'name: "resnet50"' in configs["resnet50"] and "max_batch_size: 2" in configs["resnet50"]
    assert picked["recommended"]["throughput"] == 1588.1 and picked["recommended"]["concurrency"] == 4
    assert picked["counts"] == {"configs_measured": 7, "measurements": 20, "over_budget": 8}


def test_a_stopped_model_analyzers_pick_is_read_from_its_checkpoint(tmp_path):
    """Stopped before it writes its table (its quick search looped here), its checkpoint still holds what it measured:
    the best measurement within the budget is its pick (the golden file: three of its variants, as it saved them)."""
    out = tmp_path / "ma"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "0.ckpt").write_text((GOLDEN / "ensemble-quick-stopped.ckpt").read_text())
    for variant in ("classifier_config_5", "preprocess_config_0", "resnet50_config_2"):
        (out / "output_model_repository" / variant).mkdir(parents=True)
        (out / "output_model_repository" / variant / "config.pbtxt").write_text(
            f'name: "{variant}"\nmax_batch_size: 2\n'
        )
    repo = peer.UserRepository(
        "ensemble", _user_ensemble(tmp_path / "user"), "classifier", None, ("preprocess", "resnet50")
    )
    picked = peer.ma_pick(out, repo, 6.103)
    assert picked["table"].endswith("0.ckpt") and picked["counts"] == {
        "configs_measured": 3,
        "measurements": 3,
        "over_budget": 2,
    }
    assert picked["recommended"]["variants"] == ["classifier_config_5", "preprocess_config_0", "resnet50_config_2"]
    assert (picked["recommended"]["concurrency"], picked["recommended"]["throughput"]) == (2, 1391.19)


def test_model_analyzer_is_stopped_at_its_limit_as_a_user_would(tmp_path):
    """Past the limit it gets SIGINT (its own way to stop: a checkpoint, then exit 1), and the record says so."""
    venv_bin = tmp_path / "bin"
    peer.write_executable(
        venv_bin / "model-analyzer", "#!/bin/bash\ntrap 'exit 1' INT\nwhile true; do sleep 0.1; done\n"
    )
    ran = peer.run_model_analyzer(venv_bin, {"profile_models": "m"}, tmp_path / "out", limit_s=1.0)
    assert ran["stopped_at_limit"] and ran["exit"] == 1 and ran["wall_s"] < 30, ran


def test_a_pick_triton_would_refuse_is_named_in_one_line(tmp_path):
    """A step batching less than the ensemble around it: the referee records Triton's rule instead of a figure."""
    repo = peer.UserRepository(
        "ensemble", _user_ensemble(tmp_path / "user"), "classifier", None, ("preprocess", "resnet50")
    )
    pick = {"preprocess": 'name: "preprocess"\nbackend: "python"\nmax_batch_size: 2\n'}
    why = peer.refused_by_triton(repo, pick, tmp_path / "referee")
    assert why.startswith("preprocess/config.pbtxt: max_batch_size 2 is below the max_batch_size 8 of ensemble")
    assert peer.refused_by_triton(repo, {}, tmp_path / "referee") is None  # the user's own loads


def test_rounds_alternate_and_every_config_is_measured_each_round():
    order = peer.alternating_order(["ma", "tbench"], 4)
    assert [name for _, name in order] == ["ma", "tbench", "tbench", "ma", "ma", "tbench", "tbench", "ma"]
    assert [r for r, _ in order] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert peer.alternating_order(["ma"], 3) == [(0, "ma"), (1, "ma"), (2, "ma")]


def test_medians_leave_out_failed_rounds():
    rounds = [
        {"ok": True, "throughput": 100.0, "p99_ms": 5.0},
        {"ok": False, "error": "x"},
        {"ok": True, "throughput": 140.0, "p99_ms": 3.0},
        {"ok": True, "throughput": 120.0, "p99_ms": 4.0},
    ]
    m = peer.medians(rounds)
    assert (m["rounds_ok"], m["throughput"], m["p99_ms"]) == (3, 120.0, 4.0)
    assert m["throughput_range_pct"] == pytest.approx(33.3)
    assert peer.medians([{"ok": False}]) == {"rounds_ok": 0}


def test_one_window_size_for_every_config():
    assert peer.request_count([2000.0, 2400.0]) == 4800  # 2 s at the fastest reported
    assert peer.request_count([10.0]) == peer.REFEREE_MIN_REQUESTS
    assert peer.request_count([]) == peer.REFEREE_MIN_REQUESTS


def test_the_server_wrapper_starts_the_embedded_binary_with_its_backends(tmp_path):
    text = peer.server_wrapper_text(
        Path("/srv/bin/tritonserver"), Path("/w/backends"), Path("/srv/caches"), "/venv/bin", "/lib:/libs"
    )
    assert text.startswith("#!/bin/sh\n")
    assert "export LD_LIBRARY_PATH=/lib:/libs" in text and 'export PATH=/venv/bin:"$PATH"' in text
    assert "exec /srv/bin/tritonserver --backend-directory=/w/backends" in text and text.rstrip().endswith('"$@"')
    script = peer.write_executable(tmp_path / "bin" / "tritonserver", text)
    assert script.stat().st_mode & 0o111


def test_the_profile_config_is_cpu_only_local_and_budgeted(tmp_path):
    repo = peer.UserRepository("ensemble", tmp_path / "user", "classifier", None, composing=("preprocess", "resnet50"))
    wrappers = {"tritonserver": tmp_path / "ts", "perf_analyzer": tmp_path / "pa"}
    config = peer.ma_config(repo, peer.Space(2, 4, 8), 12.34567, wrappers, tmp_path / "out")
    profiled = config["profile_models"]["classifier"]
    assert profiled["cpu_only"] and profiled["constraints"] == {"perf_latency_p99": {"max": 12.346}}
    assert config["triton_launch_mode"] == "local" and config["triton_server_path"] == str(tmp_path / "ts")
    assert config["run_config_search_max_model_batch_size"] == 4 and config["run_config_search_max_concurrency"] == 8
    # an ensemble: Model Analyzer's ensemble search, its steps CPU only by the option that leaves profile_models alone
    assert config["run_config_search_mode"] == "quick" and config["cpu_only_composing_models"] == [
        "preprocess",
        "resnet50",
    ]
    assert "ensemble_composing_models" not in config
    single = peer.UserRepository("single", tmp_path / "user", "resnet50", None)
    assert peer.ma_config(single, peer.Space(), 5.0, wrappers, tmp_path / "out")["run_config_search_mode"] == "brute"
    assert peer.Space(2, 8, 8).describe()["max_batch_sizes"] == [1, 2, 4, 8]


def test_tbench_over_ma_ratios():
    assert peer.ratio(84.0, 224.0) == 0.375
    assert peer.ratio(None, 224.0) is None and peer.ratio(1.0, 0.0) is None


UNSTABLE_LOG = """*** Measurement Settings ***
  Pass [1] throughput: 1542.03 infer/sec. p99 latency: 71828 usec
  Pass [2] throughput: 2000 infer/sec. p99 latency: 9000 usec
  Pass [3] throughput: 2200 infer/sec. p99 latency: 11000 usec
  Pass [4] throughput: 2400 infer/sec. p99 latency: 10000 usec
Failed to obtain stable measurement within 10 measurement windows for concurrency 8. Please try to increase the
Failed to obtain stable measurement.
"""


def test_an_unstable_call_counts_as_its_last_three_windows_marked_unstable():
    figures = peer.unstable_figures(UNSTABLE_LOG)
    assert figures["ok"] and figures["stable"] is False
    assert figures["throughput"] == pytest.approx(2200.0) and figures["p99_ms"] == pytest.approx(10.0)
    assert peer.unstable_figures("error: model not ready\n") is None  # a failure is not a measurement
    assert peer.medians([figures, {"ok": True, "throughput": 1.0, "p99_ms": 1.0}])["rounds_unstable"] == 1


def test_a_pick_is_judged_at_its_best_load_that_holds_the_budget():
    by_load = {
        "5": {"rounds_ok": 2, "throughput": 2000.0, "p99_ms": 7.0},
        "8": {"rounds_ok": 2, "throughput": 2300.0, "p99_ms": 9.0},
    }
    assert peer.under_budget(by_load, 8.0) == {"throughput": 2000.0, "p99_ms": 7.0, "concurrency": 5}
    assert peer.under_budget(by_load, None)["concurrency"] == 8
    assert peer.under_budget(by_load, 5.0)["throughput"] is None


def test_model_analyzers_pick_takes_tbenchs_threads_where_they_differ():
    ma = {"m": 'name: "m"\nbackend: "python"\nparameters { key: "runtime" value { string_value: "onnxruntime" } }\n'
          'parameters { key: "intra_op_threads" value { string_value: "2" } }\n'}  # fmt: skip
    tb = {"m": ma["m"].replace('string_value: "2"', 'string_value: "1"')}
    same = peer.with_threads_of(ma, tb)
    assert 'key: "intra_op_threads"' in same["m"] and 'string_value: "1"' in same["m"]
    assert peer.with_threads_of(tb, tb) is None


def test_each_models_max_batch_as_written_and_in_each_pick(tmp_path):
    repo = peer.UserRepository(
        "ensemble", _user_ensemble(tmp_path / "user"), "classifier", None, ("preprocess", "resnet50")
    )
    picks = {
        "model_analyzer": {
            "classifier": 'platform: "ensemble"\nmax_batch_size: 1\n',
            "resnet50": "max_batch_size: 2\n",
        },
        "tbench": {"resnet50": "max_batch_size: 8\n"},
    }
    sizes = peer.max_batch_sizes(repo, picks)
    assert sizes["classifier"] == {"user": 8, "model_analyzer": 1, "tbench": 8}
    assert sizes["resnet50"] == {"user": 8, "model_analyzer": 2, "tbench": 8}
    assert sizes["preprocess"] == {"user": 8, "model_analyzer": 8, "tbench": 8}


def test_the_referee_goes_to_lighter_loads_until_every_pick_holds_the_budget(tmp_path, monkeypatch):
    """Neither pick holds the budget at the loads recommended (6 and 8): both are measured at 3, where one holds it,
    then at 1, where the other does; each is then judged at its own best load within the budget."""
    p99 = {("ma", 8): 6.0, ("ma", 6): 5.0, ("ma", 3): 4.5, ("ma", 1): 2.0}
    p99 |= {("tb", 8): 6.0, ("tb", 6): 4.6, ("tb", 3): 3.0, ("tb", 1): 1.5}
    measured = []

    def measure_once(repo, configs, settings, work):
        measured.append((configs["who"], settings.concurrency))
        return {"ok": True, "stable": True, "throughput": 300.0 * settings.concurrency, "p99_ms": p99[measured[-1]]}

    monkeypatch.setattr(peer, "measure_once", measure_once)
    monkeypatch.setattr(peer, "refused_by_triton", lambda repo, configs, work: None)
    picks = {"ma": {"who": "ma"}, "tb": {"who": "tb"}}
    repo = peer.UserRepository("single", tmp_path, "resnet50", None, ())
    result = peer.referee(repo, picks, peer.RefereeSettings(8, 100, 2), tmp_path, [6, 8], budget_ms=4.0)
    assert sorted({c for _, c in measured}) == [1, 3, 6, 8]
    assert measured.index(("ma", 3)) > measured.index(("tb", 8))  # the lighter load after the rounds recommended
    assert result["tb"]["concurrency"] == 3 and result["ma"]["concurrency"] == 1
    assert list(result["ma"]["loads"]) == ["1", "3", "6", "8"]
