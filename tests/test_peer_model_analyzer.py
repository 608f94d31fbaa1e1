"""benchmarks/peer_model_analyzer.py's pure parts: Model Analyzer's recommendation read from its inference table (an
ensemble's unquoted commas too), the referee's alternating order, medians and window size, the wrapper scripts and
the profile config. No Model Analyzer install, no server."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


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
ENSEMBLE_TABLE = "\n".join(
    [
        HEADER,
        "classifier,1,4,classifier_config_2: preprocess_config_1, resnet50_config_0,1:CPU, 2:CPU,4, 4,Yes,1200.0,5.0",
        "classifier,1,8,classifier_config_0: preprocess_config_0, resnet50_config_default,1:CPU, 1:CPU,8, 8,No,1100,9",
    ]
)


def test_the_recommendation_is_the_first_row_that_meets_the_constraints():
    rows = peer.parse_ma_inference_table(SINGLE_TABLE + "\n\n")
    best = peer.ma_recommendation(rows)
    assert (best.config, best.concurrency, best.throughput, best.p99_ms) == ("resnet50_config_1", 4, 1998.2, 4.7)
    assert best.composing == () and best.passes
    assert peer.ma_counts(rows) == {"configs_measured": 3, "measurements": 6, "over_budget": 3}


def test_nothing_meets_the_constraints():
    rows = peer.parse_ma_inference_table("\n".join(SINGLE_TABLE.splitlines()[:3]))
    assert peer.ma_recommendation(rows) is None


def test_an_ensembles_row_with_unquoted_commas():
    rows = peer.parse_ma_inference_table(ENSEMBLE_TABLE)
    best = peer.ma_recommendation(rows)
    assert best.config == "classifier_config_2" and best.composing == ("preprocess_config_1", "resnet50_config_0")
    assert (best.concurrency, best.throughput, best.p99_ms) == (4, 1200.0, 5.0)
    assert rows[1].composing == ("preprocess_config_0", "resnet50_config_default") and not rows[1].passes
    assert peer.model_of_variant("resnet50_config_default") == "resnet50"


def test_another_table_is_refused():
    with pytest.raises(ValueError, match="inference table"):
        peer.parse_ma_inference_table("Model,GPU UUID,Batch\nx,y,1")


def test_ma_pick_reads_the_variants_configs_back_under_the_users_names(tmp_path):
    out = tmp_path / "ma"
    (out / "export" / "results").mkdir(parents=True)
    (out / "export" / "results" / "metrics-model-inference.csv").write_text(ENSEMBLE_TABLE)
    for variant, batch in (("classifier_config_2", 4), ("preprocess_config_1", 4), ("resnet50_config_0", 4)):
        folder = out / "output_model_repository" / variant
        folder.mkdir(parents=True)
        (folder / "config.pbtxt").write_text(f'name: "{variant}"\nmax_batch_size: {batch}\n')
    repo = peer.UserRepository("ensemble", tmp_path / "user", "classifier", None, composing=("preprocess", "resnet50"))
    picked = peer.ma_pick(out, repo)
    configs = picked["recommended"]["configs"]
    assert set(configs) == {"classifier", "preprocess", "resnet50"}
    assert 'name: "resnet50"' in configs["resnet50"] and "max_batch_size: 4" in configs["resnet50"]
    assert picked["recommended"]["throughput"] == 1200.0 and picked["counts"]["over_budget"] == 1


# Model Analyzer 1.58's brute mode on an ensemble, as it ran here: each step profiled alone, the ensemble never
STEPS_TABLE = "\n".join(
    [
        HEADER,
        "preprocess,1,8,preprocess_config_4,2:CPU,2,Yes,4094.0,4.3",
        "preprocess,1,4,preprocess_config_4,2:CPU,2,Yes,3393.1,2.4",
        "resnet50,1,8,resnet50_config_6,2:CPU,4,Yes,3147.1,5.8",
        "resnet50,1,8,resnet50_config_1,1:CPU,2,Yes,2100.0,6.1",
    ]
)


def test_an_ensemble_profiled_step_by_step_is_picked_per_step_and_checked_as_triton_would(tmp_path):
    """Each step's top config under its own name; the ensemble's config stays the user's; no pipeline figure claimed.
    A step whose max batch is below the ensemble's would not load: the referee records Triton's rule in one line."""
    out = tmp_path / "ma"
    (out / "export" / "results").mkdir(parents=True)
    (out / "export" / "results" / "metrics-model-inference.csv").write_text(STEPS_TABLE)
    for variant, batch in (("preprocess_config_4", 2), ("resnet50_config_6", 4)):
        folder = out / "output_model_repository" / variant
        folder.mkdir(parents=True)
        (folder / "config.pbtxt").write_text(f'name: "{variant}"\nbackend: "python"\nmax_batch_size: {batch}\n')
    user = tmp_path / "user"
    for name, text in {
        "preprocess": 'backend: "python"\nmax_batch_size: 8\n',
        "resnet50": 'backend: "python"\nmax_batch_size: 8\n',
        "classifier": 'platform: "ensemble"\nmax_batch_size: 8\nensemble_scheduling { step { model_name: "preprocess" '
        'model_version: -1 } step { model_name: "resnet50" model_version: -1 } }\n',
    }.items():
        (user / name / "1").mkdir(parents=True)
        (user / name / "config.pbtxt").write_text(text)
    repo = peer.UserRepository("ensemble", user, "classifier", None, composing=("preprocess", "resnet50"))
    picked = peer.ma_pick(out, repo)
    recommended = picked["recommended"]
    assert picked["profiled"] == "steps alone" and set(recommended["configs"]) == {"preprocess", "resnet50"}
    assert recommended["variants"] == ["preprocess_config_4", "resnet50_config_6"]
    assert recommended["concurrency"] is None and recommended["steps_alone"]["resnet50"]["throughput"] == 3147.1
    why = peer.refused_by_triton(repo, recommended["configs"], tmp_path / "referee")
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
    assert config["ensemble_composing_models"] == {"preprocess": {"cpu_only": True}, "resnet50": {"cpu_only": True}}
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
