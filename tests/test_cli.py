"""Bad input: one clear line and a non-zero exit, before anything starts."""

import pytest
from typer.testing import CliRunner

from tbench.cli import app, parse_int_list
from tbench.core.errors import ConfigError

runner = CliRunner()


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "nosuch"], "error: unknown model 'nosuch'; known: dcnv2, dlrm, fastpitch, nnunet, resnet50, widedeep"),
        (["run", "resnet50", "--formats", "onnx,foo"], "error: unknown format 'foo'"),
        (["run", "resnet50", "--batch-sizes", "1,512"], "error: batch size 512 is above max_batch_size"),
        (["run", "resnet50", "--concurrency", "x"], "error: cannot read concurrency 'x'"),
        (["run"], "error: name a model (see `tbench models`), give --model-file PATH or --served-model NAME"),
        (["search", "--served-model", "bert"], "error: a served model's configuration is the server's"),
        (["run", "--model-file", "/nonexistent/m.onnx"], "error: model file /nonexistent/m.onnx does not exist"),
        (["run", "--model-file", "x.onnx", "--shape", "tokens"], "error: cannot read shape 'tokens': use NAME:VALUE"),
        (["run", "--model-file", "x.onnx", "--shape", "tokens:a,b"], "error: cannot read shape 'tokens:a,b'"),
        (["run", "resnet50", "--framework", "jax"], "error: model 'resnet50' has no jax implementation"),
        (["run", "resnet50", "--serve", "trt"], "error: format 'trt' cannot be served by the embedded server"),
        (["run", "dlrm", "--size", "22B"], "error: dlrm size 22B needs 82.0 GiB for its embedding tables"),
        (["run", "dlrm", "--option", "threshold"], "error: cannot read option 'threshold': use NAME=VALUE"),
        (
            ["run", "dlrm", "--option", "memory_threshold_gb=-1"],
            "error: option memory_threshold_gb must be a number of GB >= 0",
        ),
        (
            ["run", "widedeep", "--online-batch-size", "100000"],
            "error: online batch size 100000 is above max_batch_size",
        ),
        (["run", "resnet50", "--trt-shape", "x:1,2"], "error: cannot read --trt-shape (NAME:MIN,OPT,MAX) 'x:1,2'"),
        (
            ["run", "resnet50", "--trt-shape", "x:1xa,2,3"],
            "error: cannot read --trt-shape (NAME:MIN,OPT,MAX) 'x:1xa,2,3'",
        ),
        (
            ["run", "resnet50", "--formats", "onnx,trt", "--trt-shape", "input__0:3x8x8,3x16x16,3x32x32"],
            "error: --trt-shape input__0: the input has no dynamic dim",
        ),
        (
            ["run", "resnet50", "--trt-shape", "input__0:1,2,3"],
            "error: --trt-shape shapes TensorRT's optimisation profile",
        ),
        (
            ["run", "resnet50", "--calibration-samples", "0"],
            "error: invalid option: calibration_samples: Input should be greater than or equal to 1",
        ),
        (
            ["run", "resnet50", "--trials", "0"],
            "error: invalid option: trials: Input should be greater than or equal to 1",
        ),
        (["search", "nosuch"], "error: unknown model 'nosuch'"),
        (
            ["stack", "up", "--pools", "cpu,b200"],
            "error: unknown pool(s) b200; known: a100, v100, t4, a30, a40, h100, cpu",
        ),
        (
            ["search", "resnet50", "--p99-budget-ms", "5", "--throughput-floor", "10"],
            "error: give a p99 budget or a throughput floor, not both",
        ),
        (
            ["search", "resnet50", "--preferred", "most"],
            "error: invalid option: preferred: unknown preferred batch size rule 'most'",
        ),
        (
            ["search", "resnet50", "--strategy", "random"],
            "error: invalid option: strategy: Input should be 'smart' or 'exhaustive'",
        ),
        (
            ["search", "resnet50", "--variants", "onnx:int8"],
            "error: variant 'onnx:int8': precision int8 cannot be carried by onnx",
        ),
        (["search", "resnet50", "--variants", "ensemble"], "error: model 'resnet50' is not an ensemble"),
        (
            ["search", "dlrm", "--size", "tiny"],
            "error: the configuration search serves one model; ensembles are not searched",
        ),
        (
            ["search", "resnet50", "--resume", "/nonexistent"],
            "error: resume_from '/nonexistent': no search checkpoint there",
        ),
    ],
)
def test_bad_input_exits_non_zero_with_one_line(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(message)


def test_trials_and_cpu_pinning_reach_the_request(monkeypatch):
    """--trials and --no-pin-cpus land in the resolved request the run reads (the checks before Prefect see them)."""
    import tbench.cli.run as run_command

    seen = []

    def stop_at_preflight(resolved):
        seen.append(resolved)
        raise ConfigError("stopped before the run")

    monkeypatch.setattr(run_command, "preflight", stop_at_preflight)
    runner.invoke(app, ["run", "resnet50", "--trials", "3", "--no-pin-cpus"])
    runner.invoke(app, ["run", "resnet50"])
    assert [(r.trials, r.pin_cpus) for r in seen] == [(3, False), (1, True)]


def test_model_options_are_numbers_where_they_read_as_numbers():
    from tbench.cli import parse_options

    assert parse_options(["memory_threshold_gb=16", "ratio=0.5", "mode=fast"]) == {
        "memory_threshold_gb": 16,
        "ratio": 0.5,
        "mode": "fast",
    }
    assert parse_options(None) is None


def test_preferred_choices_are_rules_or_sizes_joined_by_plus():
    from tbench.cli.common import search_space

    space = search_space("1", "8", "none,max,4,2+8", "0")
    assert space.preferred == ["none", "max", [4], [2, 8]]
    assert {c.preferred_batch_sizes for c in space.grid()} == {(), (8,), (4,), (2, 8)}


def test_lists_and_inclusive_ranges():
    assert parse_int_list("1,2,4", "x") == [1, 2, 4]
    assert parse_int_list("16:64:16", "x") == [16, 32, 48, 64]
    assert parse_int_list("1,4:6", "x") == [1, 4, 5, 6]
    assert parse_int_list(None, "x") is None
    with pytest.raises(ConfigError):
        parse_int_list("1;2", "x")


def test_models_lists_resnet50_and_its_frameworks():
    assert "resnet50\tpytorch, tensorflow" in runner.invoke(app, ["models"]).output


def test_named_values_keep_colons_in_names():
    from tbench.cli import _dims, parse_named

    assert parse_named(["serving:0:3,224,224", "ids:128"], "shape", _dims) == {"serving:0": [3, 224, 224], "ids": [128]}


def test_trt_shapes_read_min_opt_max_with_dims_joined_by_x():
    from tbench.cli import _shape_range, parse_named

    assert parse_named(["ids:16,128,512", "mel:80x16,80x400,80x1000"], "--trt-shape", _shape_range) == {
        "ids": [[16], [128], [512]],
        "mel": [[80, 16], [80, 400], [80, 1000]],
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "resnet50", "--instances", "x"], "error: Invalid value for '--instances'"),
        (["run", "resnet50", "--no-such-option", "1"], "error: No such option: --no-such-option"),
        (["compare"], "error: Missing argument 'baseline'."),
    ],
)
def test_the_console_script_says_a_usage_error_in_one_line(args, message):
    """What the parser refuses (a wrong type, an unknown option, a missing argument) is one line naming the help to
    read, like every other refusal: not typer's panel, and never a traceback."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tbench.cli", *args], capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(message) and lines[0].endswith("--help')")
    assert done.stdout == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "resnet50", "--gpus", "0"], "error: --gpus is an option of --server docker, not of --server embedded"),
        (["run", "resnet50", "--server-url", "h:1,h:2"], "error: --server-url is an option of --server remote"),
        (["run", "resnet50", "--server", "remote"], "error: --server remote needs the server's address"),
        (["run", "resnet50", "--batch-sizes", "4:1:1"], "error: cannot read batch sizes '4:1:1'"),
        (["run", "resnet50", "--batch-sizes", "1,,2"], "error: cannot read batch sizes '1,,2'"),
        (["run", "resnet50", "--formats", ","], "error: cannot read ',': an item of the list is empty"),
        (
            ["run", "resnet50", "--request-rates", "nan"],
            "error: invalid option: request_rates.0: Input should be a finite",
        ),
        (["history", "/nonexistent-root"], "error: no artifact root at /nonexistent-root"),
        (["results", "--root", ".", "--since", "yesterday"], "error: cannot read --since (YYYY-MM-DD)"),
    ],
)
def test_what_the_fuzz_found_is_refused_in_one_line(args, message):
    """Bad input that once ran, or was silently read as something else (benchmarks/fuzz_inputs.py found them)."""
    result = runner.invoke(app, args)
    assert result.exit_code != 0
    assert result.output.strip().splitlines()[0].startswith(message), result.output


def test_an_empty_option_value_is_refused_before_anything_runs():
    from tbench.cli import empty_option

    assert empty_option(["run", "resnet50", "--profile", ""]) == "--profile"
    assert empty_option(["run", "--output="]) == "--output"
    assert empty_option(["run", "resnet50", "--profile", "cpu"]) is None


def test_an_interrupt_after_the_store_says_the_run_is_complete():
    """A Ctrl-C in the history's refresh lands after the run was stored whole (its manifest: completed): the line says
    so, not that the points measured so far are kept."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    from tbench.cli.common import RichProgress, interrupted_line
    from tbench.stages.run_status import INTERRUPTED

    listener = RichProgress(Progress(console=Console(file=io.StringIO())))
    for stage in ("perf-offline-onnx", "store"):
        listener("stage_start", stage=stage)
        listener("stage_end", stage=stage, status="completed", seconds=1.0)
        assert listener.stored is (stage == "store")
    listener("stage_start", stage="history")
    after = interrupted_line(KeyboardInterrupt(), f" during {listener.stage_name}", listener.stored)
    # an interrupt in a sweep: the finish stores the run after it, and that store does not make it whole
    swept = RichProgress(Progress(console=Console(file=io.StringIO())))
    for stage, status in (("perf-offline-onnx", "interrupted"), ("server-stop", "completed"), ("store", "completed")):
        swept("stage_start", stage=stage)
        swept("stage_end", stage=stage, status=status, seconds=1.0)
    assert not swept.stored
    # an interrupt between two stages (none of them interrupted): the run's end says so, and names no stage
    between = RichProgress(Progress(console=Console(file=io.StringIO())))
    for stage in ("accuracy-onnx", "server-stop", "store"):
        between("stage_start", stage=stage)
        between("stage_end", stage=stage, status="completed", seconds=1.0)
    between("run_end", url="/tmp/run", status=INTERRUPTED, detail="interrupted by Ctrl-C (SIGINT)", stage=None)
    assert not between.stored and between.stage_name is None
    assert after.startswith("by Ctrl-C (SIGINT) after the run was stored: it is complete")
    before = interrupted_line(KeyboardInterrupt("SIGTERM"), " during perf-offline-onnx", stored=False)
    assert before.startswith("by SIGTERM during perf-offline-onnx; the server is stopped and every point measured")


def test_the_bar_shows_the_window_a_long_point_is_on_and_goes_back_once_it_is_done():
    import io

    from rich.console import Console
    from rich.progress import Progress

    from tbench.cli.common import SEARCH_BAR, SWEEP_BAR, RichProgress

    window = {"point": "offline batch 1 concurrency 1", "throughput": 1.18, "band_pct": 10.0}
    done = {"status": "ok", "throughput_infer_per_s": 1.18, "p99_ms": 870.0, "scenario": "offline", "batch_size": 1}
    done |= {"concurrency": 1, "request_distribution": ""}
    bar = Progress(console=Console(file=io.StringIO()))
    listener = RichProgress(bar)
    listener("point_window", window=1, spread_pct=None, **window)  # no bar to show it on: nothing happens
    listener("sweep_start", total=2)
    task = bar.tasks[0]
    listener("point_window", window=2, spread_pct=None, **window)
    assert task.description == "offline batch 1 concurrency 1: window 2, 1.2 infer/s"
    listener("point_window", window=4, spread_pct=3.14, **window)
    assert task.description.endswith("window 4, 1.2 infer/s, last 3 within 3.1% (needs 10%)")
    listener("point_done", index=1, total=2, row=done)
    assert task.description == SWEEP_BAR and task.completed == 1
    # the sweep's stage interrupted in its second point: its bar goes with the stage, later windows show nowhere
    listener("stage_start", stage="perf-offline-onnx")
    listener("point_window", window=1, spread_pct=None, **window)
    listener("stage_end", stage="perf-offline-onnx", status="interrupted", seconds=3.0)
    assert bar.tasks == [] and listener.points is None
    listener("point_window", window=2, spread_pct=None, **window)
    # a search measures its configurations' points without a sweep: their windows show on its bar, until the next one
    listener("search_point", limit=4, measured=1, key="i1", status="ok", throughput=1.2, p99_ms=870.0)
    listener("point_window", window=3, spread_pct=2.0, **window)
    assert bar.tasks[0].description.startswith("offline batch 1 concurrency 1: window 3")
    listener("search_point", limit=4, measured=2, key="i2", status="ok", throughput=1.2, p99_ms=870.0)
    assert bar.tasks[0].description == SEARCH_BAR and bar.tasks[0].completed == 2
