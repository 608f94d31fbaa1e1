"""The server's latency histogram per point (Triton with `--metrics-config histogram_latencies=true`): two scrapes of
its real page format, the point's delta, its p50/p99 from the buckets, the columns and the report where present."""

import http.server
import math
import threading

import pandas as pd
import pytest
from conftest import GOLDEN

from tbench.core.metrics import RESULT_COLUMNS, SERVER_COLUMNS
from tbench.results.format_section import server_lines
from tbench.triton.monitor import (
    HISTOGRAM_COLUMNS,
    LATENCY_BUCKETS_MS,
    LATENCY_HISTOGRAM,
    Histogram,
    PointMonitor,
    histogram_columns,
    histogram_delta,
    histogram_quantile,
    latency_histogram,
    model_metrics_pbtxt,
)

BEFORE = (GOLDEN / "triton" / "histogram_before.txt").read_text()
AFTER = (GOLDEN / "triton" / "histogram_after.txt").read_text()
NO_HISTOGRAM = (GOLDEN / "triton" / "metrics_4gpu.txt").read_text()  # Triton 2.51's page: no histogram family


def test_a_models_histogram_is_read_from_the_page_by_its_model_label():
    h = latency_histogram(BEFORE, "tiny_onnx")
    assert h.bounds == (1.0, 1.41, 2.0, 2.83, 4.0, 5.66, 8.0, 11.3, math.inf)
    assert h.cumulative == (0, 0, 100, 450, 900, 980, 995, 1000, 1000)
    assert (h.count, h.sum) == (1000, 2500)
    other = latency_histogram(BEFORE, "tiny_ts-trace")  # the other model's series are its own
    assert other.bounds == (100.0, 500.0, 2000.0, 5000.0, math.inf) and other.count == 4000


def test_a_page_without_the_family_or_the_model_has_no_histogram():
    assert latency_histogram(NO_HISTOGRAM, "resnet50") is None  # the embedded 2.51: none
    assert latency_histogram(BEFORE, "absent") is None
    assert latency_histogram("", "tiny_onnx") is None


def test_versions_are_summed_and_docs_style_bucket_lines_are_read():
    """Triton's metrics page prints buckets as `<family>_bucket`; its docs print them without the suffix: both read."""
    page = "\n".join(
        [
            f'{LATENCY_HISTOGRAM}_count{{model="m",version="1"}} 3',
            f'{LATENCY_HISTOGRAM}_sum{{model="m",version="1"}} 9',
            f'{LATENCY_HISTOGRAM}{{model="m",version="1", le="4"}} 3',
            f'{LATENCY_HISTOGRAM}{{model="m",version="1", le="+Inf"}} 3',
            f'{LATENCY_HISTOGRAM}_count{{model="m",version="2"}} 1',
            f'{LATENCY_HISTOGRAM}_sum{{model="m",version="2"}} 5',
            f'{LATENCY_HISTOGRAM}_bucket{{model="m",version="2",le="4"}} 0',
            f'{LATENCY_HISTOGRAM}_bucket{{model="m",version="2",le="+Inf"}} 1',
        ]
    )
    assert latency_histogram(page, "m") == Histogram((4.0, math.inf), (3, 4), 4, 14)


def test_the_points_delta_and_its_percentiles_from_the_buckets():
    delta = histogram_delta(latency_histogram(BEFORE, "tiny_onnx"), latency_histogram(AFTER, "tiny_onnx"))
    assert delta.cumulative == (0, 0, 200, 900, 1800, 1960, 1990, 2000, 2000)
    assert (delta.count, delta.sum) == (2000, 6100)
    # p50: the 1000th of 2000 lies in (2.83, 4], which holds the 901st..1800th: 100 of its 900 in
    assert histogram_quantile(0.5, delta) == pytest.approx(2.83 + (4 - 2.83) * 100 / 900)
    # p99: the 1980th lies in (5.66, 8], which holds the 1961st..1990th: 20 of its 30 in
    assert histogram_quantile(0.99, delta) == pytest.approx(5.66 + (8 - 5.66) * 20 / 30)
    row = histogram_columns(latency_histogram(BEFORE, "tiny_onnx"), latency_histogram(AFTER, "tiny_onnx"))
    assert row == pytest.approx(
        {
            "triton_hist_requests": 2000,
            "triton_hist_mean_ms": 3.05,
            "triton_hist_p50_ms": 2.83 + 1.17 / 9,
            "triton_hist_p99_ms": 5.66 + 2.34 * 2 / 3,
        }
    )


def test_buckets_too_wide_place_no_percentile_but_the_mean_is_exact():
    """Triton's default buckets (100, 500, 2000, 5000 ms): a 2 ms model's p50 would read 1 ms or 50 ms by
    interpolation, so none is given; the mean (sum over count) needs no buckets."""
    before = Histogram((100.0, 500.0, 2000.0, 5000.0, math.inf), (0, 0, 0, 0, 0), 0, 0)
    after = Histogram((100.0, 500.0, 2000.0, 5000.0, math.inf), (400, 400, 400, 400, 400), 400, 800)
    assert histogram_quantile(0.5, histogram_delta(before, after)) is None
    assert histogram_columns(before, after) == {"triton_hist_requests": 400, "triton_hist_mean_ms": 2.0}
    # past the last finite bound: no figure either
    tail = Histogram((1.0, 1.41, math.inf), (0, 10, 100), 100, 500)
    assert histogram_quantile(0.5, tail) is None and histogram_quantile(0.05, tail) == pytest.approx(1.205)


def test_no_columns_without_both_scrapes_a_request_or_steady_counters():
    h = latency_histogram(BEFORE, "tiny_onnx")
    assert histogram_columns(None, h) == {} and histogram_columns(h, None) == {}
    assert histogram_columns(h, h) == {}  # nothing served over the point
    reloaded = Histogram(h.bounds, tuple(c // 10 for c in h.cumulative), h.count // 10, h.sum / 10)
    assert histogram_delta(h, reloaded) is None  # counters went back: the model was reloaded during the point
    other_buckets = Histogram((1.0, math.inf), (0, 5), 5, 5)
    assert histogram_delta(h, other_buckets) is None


def test_the_results_have_the_columns():
    assert set(HISTOGRAM_COLUMNS.values()) <= set(SERVER_COLUMNS) <= set(RESULT_COLUMNS)


class _Pages(http.server.BaseHTTPRequestHandler):
    pages: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = (self.pages.pop(0) if self.pages else "").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_page():
    """A local metrics endpoint serving the given pages in turn (empty ones after)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def serve(*pages: str) -> str:
        _Pages.pages = list(pages)
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    yield serve
    server.shutdown()
    server.server_close()


def _monitor(url: str, model: str) -> PointMonitor:
    # no gRPC server there: the statistics columns stay empty, the histogram is read from the metrics page alone
    return PointMonitor("127.0.0.1:1", model, metrics_url=url, interval_s=0.05)


def test_the_monitor_reads_the_histogram_at_a_points_start_and_end(metrics_page):
    monitor = _monitor(metrics_page(BEFORE, AFTER), "tiny_onnx")
    monitor.start()
    row = monitor.stop()
    assert row["triton_hist_requests"] == 2000 and row["triton_hist_mean_ms"] == pytest.approx(3.05)
    assert row["triton_hist_p99_ms"] == pytest.approx(7.22)
    assert monitor.metrics_url is None  # no GPU: the GPU metrics are not read, the histogram is


def test_a_server_without_the_histogram_is_scraped_once(metrics_page):
    url = metrics_page(NO_HISTOGRAM, NO_HISTOGRAM, NO_HISTOGRAM)
    monitor = _monitor(url, "resnet50")
    for _ in range(2):
        monitor.start()
        row = monitor.stop()
        assert not set(row) & set(HISTOGRAM_COLUMNS.values())
    assert _Pages.pages == [NO_HISTOGRAM, NO_HISTOGRAM]  # one page read; after it, none


def test_the_report_shows_the_columns_only_where_present():
    base = {"status": "ok", "scenario": "online", "batch_size": 1, "concurrency": 1, "request_rate": float("nan")}
    plain = pd.DataFrame([{**base, "triton_requests": 100, "triton_queue_ms": 0.1}])
    assert not any("Histogram" in line for line in server_lines(plain))
    with_hist = plain.assign(triton_hist_mean_ms=2.5, triton_hist_p50_ms=2.4, triton_hist_p99_ms=4.1)
    text = "\n".join(server_lines(with_hist))
    assert "Histogram p50 (ms)" in text and "Histogram p99 (ms)" in text and "interpolated" in text
    coarse = "\n".join(server_lines(plain.assign(triton_hist_mean_ms=2.5)))
    assert "Histogram mean (ms)" in coarse and "too wide" in coarse and "Histogram p99" not in coarse


def test_the_model_config_block_gives_fine_buckets():
    block = model_metrics_pbtxt()
    assert f'family: "{LATENCY_HISTOGRAM}"' in block and "buckets: [ 0.05, 0.0707, 0.1, 0.141," in block
    assert len(LATENCY_BUCKETS_MS) == 39 and LATENCY_BUCKETS_MS[-1] > 20_000
    assert all(b / a < 1.43 for a, b in zip(LATENCY_BUCKETS_MS, LATENCY_BUCKETS_MS[1:]))  # sqrt(2), 3 digits
