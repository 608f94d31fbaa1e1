"""perf_analyzer CSVs (captured from the real 2.51.0 binary) -> tidy rows in ms."""

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import GOLDEN

from tbench.core.enums import Scenario
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.core.metrics import BREAKDOWN, PUBLISHED_COLUMNS, RESULT_COLUMNS
from tbench.loadgen.perf_analyzer import Point, output_shm_bytes, parse_perf_csv, perf_argv, perf_json_value
from tbench.request.benchmark import Measurement
from tbench.stages.sweep import plan_points

PA = GOLDEN / "perf_analyzer"


def test_plain_csv_converts_us_to_ms_and_derives_avg_from_the_breakdown():
    row = parse_perf_csv(PA / "offline_b4_plain.csv")
    assert row["concurrency"] == 1
    assert row["throughput_infer_per_s"] == pytest.approx(1709.91)
    assert row["server_compute_infer_ms"] == pytest.approx(1.027)
    assert row["p99_ms"] == pytest.approx(7.016)
    # no "Avg latency" column without --verbose-csv: the guides' average is the sum of the breakdown
    assert row["avg_ms"] == pytest.approx(sum(row[m.column] for m in BREAKDOWN))
    assert row["avg_ms"] == pytest.approx(2.322)


def test_verbose_csv_takes_avg_latency_as_written():
    row = parse_perf_csv(PA / "online_c4_verbose.csv")
    assert row["concurrency"] == 4
    assert row["avg_ms"] == pytest.approx(4.280)
    assert row["network_server_send_recv_ms"] == pytest.approx(1.254)
    assert row["p50_ms"] < row["p90_ms"] < row["p95_ms"] < row["p99_ms"]


@pytest.mark.parametrize("name", ["offline_b4_plain.csv", "offline_b8_shm_plain.csv", "online_c4_verbose.csv"])
def test_every_golden_parses_into_every_metric(name):
    from tbench.core.metrics import METRICS

    row = parse_perf_csv(PA / name)
    assert set(row) == {"concurrency"} | {m.column for m in METRICS}
    assert all(v >= 0 for v in row.values())
    assert row["avg_ms"] < 100  # microseconds were converted: these tiny-model latencies are a few ms


def test_csv_without_a_row_is_an_error(tmp_path: Path):
    empty = tmp_path / "empty.csv"
    empty.write_text((PA / "offline_b4_plain.csv").read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError):
        parse_perf_csv(empty)


def test_result_columns_extend_the_published_table():
    published_header = (
        (Path(__file__).parents[1] / "tbench" / "data" / "published_results.csv").read_text().splitlines()[0]
    )
    assert published_header.split(",") == PUBLISHED_COLUMNS
    assert RESULT_COLUMNS[: len(PUBLISHED_COLUMNS)] == PUBLISHED_COLUMNS


def test_plan_points_offline_batches_at_concurrency_1_online_concurrency_at_batch_1():
    points = plan_points([Scenario.OFFLINE, Scenario.ONLINE], [1, 4], [2, 8])
    assert points == [
        Point(Scenario.OFFLINE, 1, 1),
        Point(Scenario.OFFLINE, 4, 1),
        Point(Scenario.ONLINE, 1, 2),
        Point(Scenario.ONLINE, 1, 8),
    ]


def test_plan_points_rate_sends_open_loop_requests_at_batch_1():
    points = plan_points([Scenario.RATE], [1, 4], [2], rates=[10.0, 25.5], distribution="constant")
    assert points == [Point(Scenario.RATE, 1, None, 10.0, "constant"), Point(Scenario.RATE, 1, None, 25.5, "constant")]
    assert [p.label for p in points] == ["b1_r10_constant", "b1_r25.5_constant"]


def test_request_rate_argv_and_csv(tmp_path):
    spec = IoSpec(
        inputs=[TensorSpec(name="x", dtype="float32", shape=[3])],
        outputs=[TensorSpec(name="y", dtype="float32", shape=[2])],
    )
    argv = perf_argv(
        Path("pa"),
        "m",
        "u",
        Point(Scenario.RATE, 1, None, 50.0, "poisson"),
        Measurement(),
        10,
        tmp_path / "a.csv",
        spec,
    )
    assert (
        argv[argv.index("--request-rate-range") + 1] == "50"
        and argv[argv.index("--request-distribution") + 1] == "poisson"
    )
    assert "--concurrency-range" not in argv and "--shared-memory" not in argv
    row = parse_perf_csv(PA / "rate_r50_poisson_verbose.csv")  # a real perf_analyzer 2.51 request-rate CSV
    assert row["request_rate"] == 50.0 and "concurrency" not in row
    assert row["throughput_infer_per_s"] == pytest.approx(46.2967) and row["p99_ms"] == pytest.approx(8.182)
    assert row["avg_ms"] == pytest.approx(3.298)


def test_offline_uses_system_shared_memory_sized_for_the_output(tmp_path):
    spec = IoSpec(
        inputs=[TensorSpec(name="x", dtype="float32", shape=[3, 8, 8])],
        outputs=[TensorSpec(name="y", dtype="float32", shape=[1000])],
    )
    assert output_shm_bytes(spec, 8) == 8 * 1000 * 4
    m = Measurement()
    offline = perf_argv(Path("pa"), "m", "u", Point(Scenario.OFFLINE, 8, 1), m, 10, tmp_path / "a.csv", spec)
    online = perf_argv(Path("pa"), "m", "u", Point(Scenario.ONLINE, 1, 4), m, 10, tmp_path / "a.csv", spec)
    assert offline[offline.index("--shared-memory") + 1] == "system"
    assert offline[offline.index("--output-shared-memory-size") + 1] == str(32000)
    assert offline[offline.index("-b") + 1] == "8" and offline[offline.index("--concurrency-range") + 1] == "1"
    assert "--shared-memory" not in online
    assert online[online.index("--concurrency-range") + 1] == "4"


def test_windows_are_sized_by_time_from_the_calibrated_latency_and_double_on_retry():
    m = Measurement(window_s=1.0, min_requests=4)
    assert (Measurement().window_s, Measurement().min_requests) == (2.0, 16)
    assert m.requests_per_window(0.001, 1) == 1000  # a fast model: a second's worth of requests
    assert m.requests_per_window(0.001, 1000) == 2000  # at least 2 x concurrency
    assert m.requests_per_window(0.001, 1, attempt=1) == 2000  # a retry: twice as long
    assert m.requests_per_window(0.001, 1, attempt=1, measured_rate=300.0) == 600  # sized from what the attempt saw
    assert m.requests_per_window(None, 2) == m.resolving_requests() == 20  # no calibration: what the 10% band resolves


def test_a_slow_models_windows_hold_what_the_band_resolves_up_to_max_window_s_and_say_so_where_they_cannot():
    """nnUNet's 64^3 volume at ~0.87 s on 2 cores measured with 4 requests a window read 1.0 and 1.33 infer/s by
    turns (one request at an edge is a quarter of a window) and never met the 10% band."""
    m = Measurement(min_requests=4)
    n = m.requests_per_window(0.87, 1)
    assert n == m.resolving_requests() == 20 and m.unresolved_note(n) == ""  # 17.4 s: fits in 20 s
    crawling = m.requests_per_window(4.0, 1)  # 4 s a request: 20 would last 80 s, 5 fit in max_window_s
    assert crawling == 5
    assert m.unresolved_note(crawling) == (
        "; a window of 5 requests resolves 20%, over half the 10% band: raise measurement.max_window_s (20 s) or "
        "--stability"
    )
    assert m.requests_per_window(4.0, 1, attempt=1) == 10  # a retry's windows (and cap) twice as long
    assert m.model_copy(update={"stability_percentage": 5.0}).requests_per_window(0.2, 1) == 40  # 8 s of a 5% band


def test_a_rate_points_windows_are_sized_from_its_rate_and_its_time_limit_fits_them():
    """5 req/s on a 1 ms model: a window is window_s of arrivals (10 requests, the floor 16), not window_s / latency
    (2,000: 400 s a window); capacity's 508-request windows at 5/s get a limit that holds all the windows."""
    m = Measurement()
    assert m.requests_per_window(0.001, 1, offered_rate=5.0) == 16
    assert m.requests_per_window(0.001, 1, offered_rate=500.0) == 1000
    assert m.requests_per_window(0.001, 1, attempt=1, measured_rate=4.0, offered_rate=5.0) == 20
    assert m.point_timeout_s(16, 5.0) == m.timeout_s == m.point_timeout_s(10_000, None)
    slow = m.model_copy(update={"min_requests": 508})
    n = slow.requests_per_window(0.001, 1, offered_rate=5.0)
    assert n == 508 and slow.point_timeout_s(n, 5.0) >= slow.max_trials * n / 5.0


def test_a_rate_point_the_windows_rule_left_undetermined_is_measured_again_with_the_requests_that_decide_it():
    from tbench.stages.rate_verdict import MAX_DECIDING_WINDOW_S, requests_to_decide, retry_window_requests

    point = Point(Scenario.RATE, 1, None, 6.8, "poisson")
    # 92 requests at 6.8/s of 125 ms each on 1 instance: 85% busy, too uncertain to place below capacity
    row = {"status": "undetermined", "window_requests": 92 / 3, "server_compute_infer_ms": 125.0}
    needed = requests_to_decide(point, row, instances=1)
    assert needed > 92
    planned = 28  # a plain retry's windows at 6.8/s (4 s)
    assert retry_window_requests(planned, needed, 6.8) == min(-(-needed // 3), math.ceil(MAX_DECIDING_WINDOW_S * 6.8))
    assert retry_window_requests(planned, None, 6.8) == planned  # any other point: the plain retry
    assert requests_to_decide(point, {**row, "status": "behind"}, instances=1) is None
    assert requests_to_decide(point, row, instances=None) is None  # judged from its requests, not the windows


def test_a_batching_servers_load_is_its_instances_time_per_execution_not_per_request():
    """A GPT-2 at 1,200 req/s under dynamic batching (batches of 1-8, 2.7 requests each): perf_analyzer's compute
    times charge each request its batch's 2.2 ms, a load of 2.6; the batch statistics' 0.69 ms a request is 0.83,
    which the server kept up with. Without them the breakdown stays the estimate (an upper bound)."""
    from tbench.loadgen.behind import InstanceLoad
    from tbench.stages.rate_verdict import busy_per_request_ms

    row = {"server_compute_input_ms": 0.1, "server_compute_infer_ms": 2.0, "server_compute_output_ms": 0.1}
    assert busy_per_request_ms(row) == pytest.approx(2.2)
    assert busy_per_request_ms({**row, "triton_busy_ms": 0.69}) == 0.69
    assert busy_per_request_ms({**row, "triton_busy_ms": float("nan")}) == pytest.approx(2.2)  # an older run's row
    assert InstanceLoad.estimate(1200, busy_per_request_ms({**row, "triton_busy_ms": 0.69}), 1, 8000).share < 1
    assert InstanceLoad.estimate(1200, busy_per_request_ms(row), 1, 8000).share > 2


def test_window_duration_comes_from_the_merged_windows_in_the_log():
    from tbench.loadgen.perf_analyzer import merged_requests, pass_throughputs, window_seconds

    log = (GOLDEN / "perf_analyzer" / "resnet50_online_b1_c4.log").read_text()
    assert pass_throughputs(log) == [21.9536, 23.9791, 23.8697]
    assert merged_requests(log) == 92 and merged_requests("no summary") is None
    assert window_seconds(92, 1, 22.9395) == pytest.approx(92 / 22.9395 / 3)
    assert np.isnan(window_seconds(None, 1, 22.9))


def test_perf_input_data_holds_real_samples_and_skips_huge_float_ones(
    small_adapter, small_module, tmp_path, monkeypatch
):
    import base64
    import json

    from tbench.stages import sweep as perf
    from tbench.stages.sweep import prepare_inputs

    inputs = prepare_inputs(small_adapter, small_module, tmp_path / "data.json", samples=3)
    entries = json.loads((tmp_path / "data.json").read_text())["data"]
    first = small_adapter.sample_batch(3)["input__0"][0]
    assert len(entries) == 3 and entries[0]["input__0"]["shape"] == [3, 32, 32]
    # floats are sent unrounded: read back as float32, exactly what correctness and accuracy checked
    sent = np.asarray(entries[0]["input__0"]["content"], dtype=np.float32).reshape(3, 32, 32)
    np.testing.assert_array_equal(sent, first)
    half = perf_json_value(np.linspace(-2, 2, 6, dtype=np.float16).reshape(2, 3))  # FP16 only as bytes
    assert half["shape"] == [2, 3] and np.array_equal(
        np.frombuffer(base64.b64decode(half["b64"]), "<f2"), np.linspace(-2, 2, 6, dtype=np.float16)
    )
    assert inputs.data_file == tmp_path / "data.json" and inputs.sample_output_bytes == 10 * 4
    monkeypatch.setattr(perf, "MAX_INPUT_VALUES", 100)  # a 3x32x32 image is now "too big": random data
    assert prepare_inputs(small_adapter, small_module, tmp_path / "big.json").data_file is None
    assert not (tmp_path / "big.json").exists()
    # a model too slow to run every sample within the budget sends the samples it ran: one chunk here
    monkeypatch.setattr(perf, "MAX_INPUT_VALUES", 1_000_000)
    monkeypatch.setattr(perf, "OUTPUT_PROBE_CHUNK", 2)
    monkeypatch.setattr(perf, "OUTPUT_PROBE_BUDGET_S", 0.0)
    prepare_inputs(small_adapter, small_module, tmp_path / "slow.json", samples=6)
    assert len(json.loads((tmp_path / "slow.json").read_text())["data"]) == 2


def test_offline_shared_memory_follows_the_node(tmp_path):
    """CUDA shared memory where client and server share a GPU node, none against a remote server."""
    from types import SimpleNamespace

    from tbench.loadgen.perf_analyzer import PerfInputs
    from tbench.planning.plan import offline_shared_memory

    spec = IoSpec(
        inputs=[TensorSpec(name="x", dtype="float32", shape=[4])],
        outputs=[TensorSpec(name="y", dtype="float32", shape=[2])],
    )
    gpu, cpu = SimpleNamespace(has_gpu=True), SimpleNamespace(has_gpu=False)
    assert offline_shared_memory(SimpleNamespace(server="local"), gpu) == "cuda"
    assert offline_shared_memory(SimpleNamespace(server="embedded"), cpu) == "system"
    assert offline_shared_memory(SimpleNamespace(server="remote"), gpu) == "none"
    point = Point(Scenario.OFFLINE, 8, 1)
    cuda = perf_argv(
        Path("pa"), "m", "u", point, Measurement(), 10, tmp_path / "a.csv", spec, PerfInputs(shared_memory="cuda")
    )
    assert cuda[cuda.index("--shared-memory") + 1] == "cuda"
    remote = perf_argv(
        Path("pa"), "m", "u", point, Measurement(), 10, tmp_path / "a.csv", spec, PerfInputs(shared_memory="none")
    )
    assert "--shared-memory" not in remote and "--output-shared-memory-size" not in remote


def test_points_are_measured_in_a_seeded_shuffled_order():
    from tbench.stages.sweep import measurement_order

    points = plan_points([Scenario.OFFLINE], [1, 2, 4, 8, 16, 32], [])
    shuffled = measurement_order(points, Measurement())
    assert sorted(shuffled, key=lambda p: p.batch_size) == points and shuffled != points
    assert measurement_order(points, Measurement()) == shuffled  # the same seed, the same order
    assert measurement_order(points, Measurement(order="ascending")) == points


def test_an_online_point_expects_at_least_what_a_lower_concurrency_served():
    from tbench.stages.sweep import expected_online_rate

    served = {1: {1: 100.0, 4: 300.0}, 8: {1: 20.0}}
    assert expected_online_rate(Point(Scenario.ONLINE, 1, 8), served) == 300.0
    assert expected_online_rate(Point(Scenario.ONLINE, 1, 2), served) == 100.0
    assert expected_online_rate(Point(Scenario.ONLINE, 8, 16), served) == 20.0
    assert expected_online_rate(Point(Scenario.ONLINE, 4, 2), served) is None  # nothing at that batch size yet
    assert expected_online_rate(Point(Scenario.OFFLINE, 1, 1), served) is None
    # windows sized from it: window_s worth at 300 requests/s, not at the single-request latency's 1,000
    assert Measurement().requests_per_window(0.001, 8, measured_rate=300.0) == 600


def test_profile_export_golden_holds_every_window_and_answered_requests_only():
    from tbench.loadgen.perf_analyzer import read_profile_export

    requests = read_profile_export(GOLDEN / "perf_analyzer" / "rate_r55_sleeper20ms.requests.json")
    # the -v log merged 287 requests over its last 3 of 6 windows; the export lists all 6 windows' answered requests
    assert len(requests) == 559 and len(requests.boundaries_s) == 7
    assert np.all(np.diff(requests.sent_s) >= 0) and np.all(requests.latency_s > 0)
    assert requests.answered_s.max() <= requests.span_s  # those still in flight at the end are not listed


def test_rate_points_only_ask_for_the_export(tmp_path):
    from tbench.loadgen.perf_analyzer import export_fits, profile_export_path

    spec = IoSpec(
        inputs=[TensorSpec(name="INPUT0", dtype="float32", shape=[1])],
        outputs=[TensorSpec(name="OUTPUT0", dtype="float32", shape=[1])],
    )
    csv = tmp_path / "m_rate_b1_r50_poisson_try0.csv"
    export = profile_export_path(csv)
    assert export.parent == csv.parent and export.name == "m_rate_b1_r50_poisson_try0.requests.json"
    assert export_fits(spec, 1)
    big = IoSpec(inputs=[TensorSpec(name="x", dtype="float32", shape=[3, 224, 224])], outputs=spec.outputs)
    assert not export_fits(big, 1)
    point = Point(Scenario.RATE, 1, None, 50.0, "poisson")
    argv = perf_argv(Path("pa"), "m", "u", point, Measurement(), 100, csv, spec, profile_export=export)
    assert argv[argv.index("--profile-export-file") + 1] == str(export)
    closed = perf_argv(Path("pa"), "m", "u", Point(Scenario.ONLINE, 1, 2), Measurement(), 100, csv, spec)
    assert "--profile-export-file" not in closed
