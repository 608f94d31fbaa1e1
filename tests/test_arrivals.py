"""Arrivals other than a fixed rate: a user's trace read and checked (tbench.core.request_trace), bursty intervals, the
points' intervals files, and how closely a schedule was kept (tbench.loadgen.arrivals)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tbench.capacity.request import CapacityRequest
from tbench.core.enums import Scenario
from tbench.core.errors import ConfigError
from tbench.core.request_trace import read_trace
from tbench.loadgen.arrivals import gamma_intervals_us, replay_error_us, with_intervals
from tbench.loadgen.perf_analyzer import Point, load_args, perf_argv
from tbench.request.benchmark import BenchmarkRequest, Measurement
from tbench.request.load import arrival_load
from tbench.triton.sleeper import SPEC as SLEEPER_SPEC


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_trace_reads_from_csv_jsonl_or_text_and_starts_at_zero(tmp_path):
    csv = read_trace(write(tmp_path, "t.csv", "timestamp,user\n10.0,a\n10.5,b\n12.0,a\n"))
    jsonl = read_trace(write(tmp_path, "t.jsonl", '{"timestamp": 10.0}\n{"timestamp": 10.5}\n\n{"timestamp": 12}\n'))
    text = read_trace(write(tmp_path, "t.txt", "10\n10.5\n12\n"))
    for trace in (csv, jsonl, text):
        assert trace.times_s.tolist() == [0.0, 0.5, 2.0] and trace.span_s == 2.0
        assert trace.mean_rate == pytest.approx(1.0)  # 2 intervals over 2 s
        assert trace.intervals_us().tolist() == [500_000, 1_500_000]
        assert trace.intervals_us(speed=2.0).tolist() == [250_000, 750_000]
    assert read_trace(write(tmp_path, "b.csv", "timestamp,batch_size\n0,4\n1,4\n")).batch_size == 4


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("t.csv", "time\n1\n2\n", "has no timestamp column (columns: time)"),
        ("t.csv", "timestamp\n1\n0.5\n", "line 3: timestamp 0.5 comes before 1: sort the trace by time"),
        ("t.csv", "timestamp\n-1\n2\n", "line 2: timestamp -1 is negative"),
        ("t.txt", "0\nsoon\n", "line 2: 'soon' is not a timestamp"),
        ("t.jsonl", '{"timestamp": 0}\n{"time": 1}\n', "line 2: not a JSON object with a timestamp"),
        ("t.txt", "5\n", "needs at least 2 requests"),
        ("t.txt", "5\n5\n", "needs at least 2 requests over a span longer than 0 s"),
        ("t.csv", "timestamp,batch_size\n0,1\n1,8\n", "holds batch sizes [1, 8]: perf_analyzer sends one batch size"),
        ("t.csv", "", "cannot be read"),
        ("t.csv", "timestamp,sample\n0,1\n1,x\n", "line 3: sample 'x' is not an index"),
        ("t.csv", "timestamp,sample\n0,1\n1,-2\n", "line 3: sample -2 is not an index"),
        ("t.csv", "timestamp,sample\n0,1.5\n1,2\n", "line 2: sample 1.5 is not an index"),
        ("t.jsonl", '{"timestamp": 0, "sample": 3}\n{"timestamp": 1}\n', "line 2: no sample, where other lines"),
    ],
)
def test_a_bad_trace_is_one_line_naming_the_fix(tmp_path, name, text, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        read_trace(write(tmp_path, name, text))
    assert "\n" not in str(err.value)


def test_a_trace_may_name_each_requests_sample(tmp_path):
    csv = read_trace(write(tmp_path, "s.csv", "timestamp,sample\n0,2\n0.5,0\n2,2\n"))
    jsonl = read_trace(write(tmp_path, "s.jsonl", '{"timestamp": 0, "sample": 2}\n{"timestamp": 0.5, "sample": 0}\n'))
    assert csv.samples.tolist() == [2, 0, 2] and jsonl.samples.tolist() == [2, 0]
    assert read_trace(write(tmp_path, "plain.csv", "timestamp\n0\n1\n")).samples is None


def samples_of(tmp_path, values: list[float]):
    from tbench.core.input_data import load_input_data

    np.savez(tmp_path / "samples.npz", INPUT0=np.asarray(values, dtype=np.float32)[:, None])
    return load_input_data(tmp_path / "samples.npz", SLEEPER_SPEC)


def test_a_trace_with_samples_sends_them_in_its_order(tmp_path):
    import json

    trace = write(tmp_path, "s.csv", "timestamp,sample\n0,2\n0.5,0\n2,2\n3,1\n")
    samples = samples_of(tmp_path, [10.0, 11.0, 12.0])
    (traced,) = with_intervals([Point(Scenario.RATE, 1, None, 1.0, "trace")], str(trace), 1, 0, tmp_path, samples)
    entries = json.loads(Path(traced.data_file).read_text())["data"]
    assert [e["INPUT0"]["content"] for e in entries] == [[12.0], [10.0], [12.0], [11.0]]  # one per request, in order
    assert len(entries) == len(np.loadtxt(traced.intervals)) + 1  # both loop together: the last interval closes it
    argv = perf_argv(Path("pa"), "m", "u", traced, Measurement(), 100, tmp_path / "x.csv", SLEEPER_SPEC)
    assert argv[argv.index("--input-data") + 1] == traced.data_file
    from tbench.stages.sweep import cache_key

    other = write(tmp_path, "o.csv", "timestamp,sample\n0,0\n0.5,0\n2,2\n3,1\n")  # the same times, other samples
    (other_point,) = with_intervals([Point(Scenario.RATE, 1, None, 1.0, "trace")], str(other), 1, 0, tmp_path, samples)
    assert cache_key(traced, "m") != cache_key(other_point, "m")  # a point measured with other samples is not reused


@pytest.mark.parametrize(
    ("trace_text", "values", "batch", "message"),
    [
        ("timestamp,sample\n0,0\n1,3\n", [1.0, 2.0], 1, "request 2 names sample 3, but"),
        ("timestamp,sample\n0,0\n1,1\n", None, 1, "names a sample per request: give the samples with --input-data"),
        ("timestamp,sample\n0,0\n1,1\n", [1.0, 2.0], 4, "sent one per request: use batch size 1 (not 4)"),
    ],
)
def test_a_trace_whose_samples_cannot_be_sent_is_one_line(tmp_path, trace_text, values, batch, message):
    trace = read_trace(write(tmp_path, "s.csv", trace_text))
    samples = samples_of(tmp_path, values) if values else None
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        trace.check_samples(samples, batch)
    assert "\n" not in str(err.value)


def test_a_trace_too_big_for_perf_analyzers_input_data_is_refused(tmp_path, monkeypatch):
    from tbench.core import request_trace

    monkeypatch.setattr(request_trace, "MAX_SAMPLE_VALUES", 3)
    trace = read_trace(write(tmp_path, "s.csv", "timestamp,sample\n0,0\n1,1\n2,0\n3,1\n"))
    with pytest.raises(ConfigError, match="requests' samples hold 4 values, more than perf_analyzer's input data"):
        trace.check_samples(samples_of(tmp_path, [1.0, 2.0]), 1)


def test_a_traces_batch_size_is_its_points(tmp_path):
    trace = write(tmp_path, "b.csv", "timestamp,batch_size\n0,4\n1,4\n")
    (traced,) = with_intervals([Point(Scenario.RATE, 1, None, 1.0, "trace")], str(trace), 1, 0, tmp_path)
    assert traced.batch_size == 4 and traced.label.startswith("b4_")
    with pytest.raises(ConfigError, match="sends batch size 4, above max_batch_size 2"):
        BenchmarkRequest(model="resnet50", size="small", trace=str(trace), max_batch_size=2, batch_sizes=[1]).resolve(
            False
        )


def test_a_missing_trace_is_refused():
    with pytest.raises(ConfigError, match="trace /nonexistent.csv is not a file"):
        read_trace("/nonexistent.csv")


def test_bursty_intervals_have_the_rate_and_the_burstiness_asked():
    intervals = gamma_intervals_us(rate=50.0, burstiness=2.0, count=200_000, seed=3) / 1e6
    assert 1 / intervals.mean() == pytest.approx(50.0, rel=0.02)
    assert intervals.std() / intervals.mean() == pytest.approx(2.0, rel=0.03)
    with pytest.raises(ConfigError, match="bursty arrivals need a rate and a burstiness above 0"):
        gamma_intervals_us(rate=50.0, burstiness=0.0, count=10)


def test_points_get_their_schedules_and_perf_analyzer_sends_them(tmp_path):
    trace = write(tmp_path, "t.txt", "0\n0.5\n2\n")
    points = [
        Point(Scenario.RATE, 1, None, 2.0, "trace"),  # the trace at twice its mean rate of 1/s
        Point(Scenario.RATE, 1, None, 40.0, "gamma"),
        Point(Scenario.RATE, 1, None, 40.0, "poisson"),
    ]
    traced, bursty, poisson = with_intervals(points, str(trace), 2.0, 0, tmp_path / "arrivals")
    assert np.loadtxt(traced.intervals, dtype=int).tolist() == [250_000, 750_000] and traced.schedule_requests == 2
    assert len(np.loadtxt(bursty.intervals)) == 40 * 300  # a loop of 300 s at the rate
    assert poisson == points[2] and not poisson.intervals
    assert load_args(traced) == ["--request-intervals", traced.intervals, "--async"]
    assert load_args(poisson)[:2] == ["--request-rate-range", "40"]


def test_a_schedule_kept_is_measured_from_wherever_the_sends_start_in_it():
    rng = np.random.default_rng(0)
    schedule = rng.integers(1_000, 50_000, 500)
    start = 137  # the measured sends begin mid-loop, after perf_analyzer's warm-up
    sent_gaps = np.resize(np.roll(schedule, -start), 1200) + rng.normal(0, 20, 1200)  # 20 us of jitter
    sent_ns = np.concatenate([[0], np.cumsum(sent_gaps * 1e3)]).astype(np.int64)
    error = replay_error_us(sent_ns, schedule)
    assert error["median_abs_error_us"] < 20 and error["p99_abs_error_us"] < 70
    assert error["rate_sent_over_asked"] == pytest.approx(1.0, abs=0.01) and error["intervals"] == 1200


def test_a_trace_sets_the_rates_of_the_rate_scenario(tmp_path):
    trace = str(write(tmp_path, "t.txt", "0\n1\n2\n3\n4\n"))  # 1 request/s
    assert arrival_load([Scenario.ONLINE], None, "poisson", trace, [1.0, 2.5]) == (
        [Scenario.ONLINE, Scenario.RATE],
        [1.0, 2.5],
        "trace",
    )
    with pytest.raises(ConfigError, match="a trace sets its own rates: give --trace-speed, not --request-rates"):
        arrival_load([Scenario.RATE], [10.0], "poisson", trace, None)
    with pytest.raises(ConfigError, match="--trace-speed speeds up a trace: give --trace FILE"):
        arrival_load([Scenario.RATE], [10.0], "poisson", None, [2.0])
    with pytest.raises(ConfigError, match="trace speeds must be > 0"):
        arrival_load([Scenario.RATE], None, "poisson", trace, [0.0])
    resolved = BenchmarkRequest(model="resnet50", size="small", trace=trace, trace_speeds=[2.0]).resolve(False)
    assert resolved.request_distribution == "trace" and resolved.request_rates == [2.0]


def test_a_capacity_plan_on_a_trace_replays_it_sped_up_to_each_rate(tmp_path):
    from tbench.capacity.evaluate import plan_arrivals

    trace = str(write(tmp_path, "t.txt", "0\n0.5\n2\n"))  # 1 request/s
    at = plan_arrivals(CapacityRequest(trace=trace), tmp_path / "arrivals")
    point = at(Point(Scenario.RATE, 1, None, 4.0, "poisson"))
    assert point.distribution == "trace" and np.loadtxt(point.intervals, dtype=int).tolist() == [125_000, 375_000]
    assert plan_arrivals(CapacityRequest(), tmp_path) is None  # Poisson
    assert CapacityRequest(trace=trace).trace_rate() == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="trace /nonexistent.csv is not a file"):
        CapacityRequest(trace="/nonexistent.csv")


def test_a_capacity_plan_on_bursty_arrivals_sends_gamma_intervals_at_each_rate(tmp_path):
    from pydantic import ValidationError

    from tbench.capacity.evaluate import plan_arrivals

    at = plan_arrivals(CapacityRequest(burstiness=3.0), tmp_path / "arrivals")
    point = at(Point(Scenario.RATE, 1, None, 40.0, "poisson"))
    intervals = np.loadtxt(point.intervals) / 1e6
    assert point.distribution == "gamma" and point.rate == 40.0
    assert 1 / intervals.mean() == pytest.approx(40.0, rel=0.05)
    assert intervals.std() / intervals.mean() == pytest.approx(3.0, rel=0.1)
    with pytest.raises(ValidationError, match="give --trace or --burstiness, not both"):
        CapacityRequest(trace=str(write(tmp_path, "t.txt", "0\n1\n")), burstiness=2.0)


def test_every_scheduled_point_with_exported_requests_is_pictured_a_flagged_one_too(tmp_path):
    """A trace point perf_analyzer could not send on time (client_bound) is the one whose picture a user wants."""
    import shutil

    import pandas as pd

    from tbench.results.arrivals_report import arrivals_lines

    golden = Path(__file__).parent / "golden" / "perf_analyzer" / "rate_r25_sleeper20ms.requests.json"
    (tmp_path / "perf").mkdir()
    rows = []
    for rate, status, attempt in ((25.0, "ok", 0), (50.0, "client_bound", 1)):  # the second measured again
        shutil.copy(golden, tmp_path / "perf" / f"m_rate_b1_r{rate:g}_trace_try{attempt}.requests.json")
        source = f"perf/m_rate_b1_r{rate:g}_trace_try{attempt}.csv"
        rows.append({"request_distribution": "trace", "request_rate": rate, "status": status, "source_file": source})
    lines = arrivals_lines(pd.DataFrame(rows), tmp_path, tmp_path / "plots", "onnx_")
    assert sorted(p.name for p in (tmp_path / "plots").glob("*.png")) == [
        "onnx_m_rate_b1_r25_trace_over_time.png",
        "onnx_m_rate_b1_r50_trace_over_time.png",
    ]
    assert any("mean 50 req/s (client_bound)" in line for line in lines)


@pytest.mark.e2e
def test_a_trace_is_replayed_whole_on_the_real_server_and_pictured(tmp_path):
    import pandas as pd
    from test_faults import CliRun

    from tbench.triton.process_server import EmbeddedServer
    from tbench.triton.sleeper import sleeper_repository

    times = np.cumsum(np.random.default_rng(0).gamma(0.25, 1 / (50 * 0.25), 300))  # bursty, 50/s, 6 s
    trace = write(tmp_path, "trace.csv", "timestamp\n" + "\n".join(f"{t:.6f}" for t in times) + "\n")
    with EmbeddedServer(sleeper_repository(tmp_path / "repo", 5), tmp_path / "server.log") as server:
        url = f"{server.endpoints.grpc_url},{server.endpoints.http_url}"
        args = ["--served-model", "sleeper", "--server-url", url, "--scenarios", "rate", "--trace", str(trace)]
        run = CliRun([*args, "--trace-speed", "1,2"], tmp_path / "runs")
        assert run.finish(timeout=300) == 0, run.output
    run_dir = run.run_dir()
    rows = pd.read_csv(run_dir / "results.csv")
    mean = read_trace(trace).mean_rate
    assert rows["request_distribution"].tolist() == ["trace", "trace"]
    assert sorted(rows["request_rate"]) == pytest.approx([mean, 2 * mean], rel=1e-3)
    assert (rows["window_requests"] * 3 >= 299).all()  # the whole trace, at least once
    assert (rows["arrivals_median_error_us"] < 2_000).all(), rows.to_string()
    assert len(list((run_dir / "plots").glob("*_trace_over_time.png"))) == 2
    assert "trace arrivals, mean" in (run_dir / "report.md").read_text()


@pytest.mark.e2e
def test_each_request_of_a_trace_carries_the_sample_it_names_on_the_real_server(tmp_path):
    """perf_analyzer sends its i-th scheduled request with the i-th input data entry, whichever thread sends it: the
    server (the sleeper, recording what it serves) sees the trace's samples in the trace's order."""
    from test_faults import CliRun

    from tbench.triton.process_server import EmbeddedServer
    from tbench.triton.sleeper import sleeper_repository

    rng = np.random.default_rng(0)
    count = 40
    times = np.cumsum(rng.uniform(0.02, 0.03, count))  # apart by more than a request takes: served as sent
    order = rng.permutation(count)  # request k sends sample order[k]
    rows = "\n".join(f"{t:.6f},{k}" for t, k in zip(times, order))
    trace = write(tmp_path, "trace.csv", f"timestamp,sample\n{rows}\n")
    samples_of(tmp_path, [1000.0 + i for i in range(count)])
    record = tmp_path / "served.txt"
    with EmbeddedServer(sleeper_repository(tmp_path / "repo", 1, record_to=record), tmp_path / "server.log") as server:
        url = f"{server.endpoints.grpc_url},{server.endpoints.http_url}"
        args = ["--served-model", "sleeper", "--server-url", url, "--scenarios", "rate", "--trace", str(trace)]
        run = CliRun([*args, "--input-data", str(tmp_path / "samples.npz")], tmp_path / "runs")
        assert run.finish(timeout=300) == 0, run.output
    position = {1000.0 + sample: k for k, sample in enumerate(order)}  # a served value -> its request in the trace
    served = [position.get(v, -1) for v in map(float, record.read_text().split())]  # -1: the warm-up's zeros
    # perf_analyzer's requests are the last (the warm-up sent the samples before, in their file's order): they follow
    # the trace, request after request, looping over it. Two requests sent by different threads a few ms apart can
    # reach the server swapped on a loaded machine, so each must sit within 2 places of its turn (the trace's order is
    # a random permutation of the file's: samples sent in the file's order would land anywhere).
    last = np.array(served[-3 * count :])
    turn = np.bincount((last - np.arange(len(last))) % count).argmax()  # where the loop over the trace starts
    off_turn = (last - np.arange(len(last)) - turn) % count
    assert (np.minimum(off_turn, count - off_turn) <= 2).mean() > 0.97, served


def test_a_rate_schedule_is_a_trace_that_ramps(tmp_path):
    from tbench.core.request_trace import load_schedule

    ramp = load_schedule("ramp:10:30,40:30")
    first, second = ramp.times_s[ramp.times_s < 29.5], ramp.times_s[ramp.times_s > 30.5]
    assert len(first) / 30 == pytest.approx(10, rel=0.25) and len(second) / 30 == pytest.approx(40, rel=0.15)
    assert ramp.mean_rate == pytest.approx(25, rel=0.15)
    assert arrival_load([Scenario.RATE], None, "poisson", "ramp:10:30,40:30", None)[1:] == ([ramp.mean_rate], "trace")
    for bad, message in [("ramp:10", "cannot read the rate schedule"), ("ramp:10:-1", "must be above 0")]:
        with pytest.raises(ConfigError, match=message):
            load_schedule(bad)
    point = Point(Scenario.RATE, 1, None, ramp.mean_rate, "trace")
    [point] = with_intervals([point], "ramp:10:30,40:30", 1.0, 2, tmp_path)
    assert point.schedule_requests == len(ramp.times_s) - 1


def test_a_submitted_trace_travels_with_the_run_and_a_rate_schedule_as_it_is(tmp_path, s3_to_stop):
    """`tbench submit --trace`: the file is uploaded to the artifact store (S3 here, moto over HTTP) under its digest,
    and the worker reads it from there; a ramp is no file and is sent as it is."""
    from tbench.cli.remote import hand_over
    from tbench.core.request_trace import load_schedule
    from tbench.core.storage import url_to_fs

    url_to_fs("s3://runs")[0].mkdir("runs")
    trace = write(tmp_path, "t.csv", "timestamp\n0\n0.5\n2\n")
    sent = hand_over(BenchmarkRequest(model="resnet50", trace=str(trace)), "s3://runs/team")
    assert sent.trace.startswith("s3://runs/team/inputs/")
    assert load_schedule(sent.trace).times_s.tolist() == [0.0, 0.5, 2.0]  # fetched and checked, as a worker does
    ramp = BenchmarkRequest(model="resnet50", trace="ramp:10:5")
    assert hand_over(ramp, "s3://runs/team").trace == "ramp:10:5"
    # a capacity plan across pools (`tbench capacity --pools ... --trace`): its trace travels the same way
    plan = hand_over(CapacityRequest(slo_ms=50, traffic_rps=10, trace=str(trace)), "s3://runs/team")
    assert plan.trace == sent.trace and plan.trace_rate() == load_schedule(str(trace)).mean_rate
