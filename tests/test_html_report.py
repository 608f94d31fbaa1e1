"""The self-contained HTML page made from a run's report.md (tasks/html_report.py)."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tbench.results.html_report import markdown_to_html, report_title, write_html_report

# A trimmed copy of a real run's report.md (dlrm-20261122-200716-e158d2), with one failed check and flagged points
# added.
REPORT = """# Triton benchmark: dlrm (small, tensorflow)

Run `dlrm-20261122-200716-e158d2`, status **completed**.

## Configuration

| Parameter Name               | Parameter Value                                                                             |
|:-----------------------------|:--------------------------------------------------------------------------------------------|
| Model                        | dlrm (small, tensorflow)                                                                    |
| Max Batch Size               | 2048                                                                                        |
| Triton Preferred Batch Sizes | 1024 2048                                                                                   |

### Embedding tables

| table | rows | MiB | device |
|---:|---:|---:|:---|
| 0 | 199,523 | 48.71 | GPU |
| 1 | 10,000 | 2.44 | GPU |

## Summary

Measured points: 4, stable: 2, flagged: 2.

| Format   | Scenario   |   Best inferences/second | At              |   P99 latency there (ms) |   Lowest avg latency (ms) |
|:---------|:-----------|-------------------------:|:----------------|-------------------------:|--------------------------:|
| ensemble | offline    |                  63346.3 | batch size 1024 |                   30.002 |                    10.983 |

## Format `ensemble`

Served by: ensemble of dlrm_sparse (python (tensorflow)), dlrm_dense (python (onnxruntime)).

### Correctness

| Format                      | Output     |   Max abs error |   Max rel error |   Tolerance | Passed   |
|:----------------------------|:-----------|----------------:|----------------:|------------:|:---------|
| tf-savedmodel (dlrm_sparse) | embeddings |               0 |               0 |     0.00158 | yes      |
| onnx (dlrm_dense)           | output     |            0.31 |             0.2 |     0.00169 | NO       |

### Offline scenario

Static batching: one client (concurrency 1), system shared memory.

| ![](plots/ensemble_offline_throughput_vs_batch.png) | ![](plots/ensemble_offline_latency_vs_batch.png) |
|-----|-----|

| Precision   | Backend Accelerator   |   Client Batch Size |   Inferences/second |   P99 Latency |   Avg Latency |
|:------------|:----------------------|--------------------:|--------------------:|--------------:|--------------:|
| FP32        |                       |                  64 |             5807.68 |         30.93 |        10.983 |
| FP32        |                       |                1024 |            63346.3  |        30.002 |        16.091 |

### Composing models

![](plots/ensemble_composing_latency.png)

## Flagged points

Measured but not reported above: they did not stabilise or failed.

| format   | scenario   |   batch_size |   concurrency | status   | error                                         |
|:---------|:-----------|-------------:|--------------:|:---------|:----------------------------------------------|
| ensemble | offline    |         2048 |             1 | unstable | not stable within 10 windows of 2000 requests |
| ensemble | online     |            1 |            16 | error    | model <b>boom</b> & friends                   |

## Stage timings

| Stage                 |   Seconds |
|:----------------------|----------:|
| export                |      14.8 |
| perf-offline-ensemble |      36.2 |

Latencies are in milliseconds; Avg Latency is perf_analyzer's average client latency.
"""  # noqa: E501 - a copy of a real report: its table rows stay as wide as they were
PLOTS = [
    "ensemble_offline_throughput_vs_batch.png",
    "ensemble_offline_latency_vs_batch.png",
    "ensemble_composing_latency.png",
]
TITLE = "Triton benchmark: dlrm (small, tensorflow)"


class Page(HTMLParser):
    """The parts of the page the tests look at."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: dict[int, str] = {}
        self._open: list[int] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in ("img", "meta", "br", "hr"):
            self._open.append(len(self.tags) - 1)
            self.text[len(self.tags) - 1] = ""

    def handle_endtag(self, tag):
        while self._open:
            i = self._open.pop()
            if self.tags[i][0] == tag:
                break

    def handle_data(self, data):
        for i in self._open:
            self.text[i] += data

    def find(self, tag: str, cls: str | None = None) -> list[tuple[dict, str]]:
        return [
            (attrs, self.text.get(i, ""))
            for i, (t, attrs) in enumerate(self.tags)
            if t == tag and (cls is None or cls in (attrs.get("class") or "").split())
        ]


def _png(path: Path, color: str = "#76b900") -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.bar([0, 1], [1, 2], color=color)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=20)
    plt.close(fig)
    return path.read_bytes()


@pytest.fixture(scope="module")
def png_bytes(tmp_path_factory) -> bytes:
    return _png(tmp_path_factory.mktemp("png") / "p.png")


@pytest.fixture
def run_dir(tmp_path, png_bytes) -> Path:
    (tmp_path / "plots").mkdir()
    for name in PLOTS:
        (tmp_path / "plots" / name).write_bytes(png_bytes)
    (tmp_path / "report.md").write_text(REPORT)
    return tmp_path


@pytest.fixture
def html(run_dir) -> str:
    return markdown_to_html(REPORT, run_dir, TITLE)


def test_every_plot_is_embedded_as_a_png_data_uri(html, png_bytes):
    uris = re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(uris) == REPORT.count("![](plots/") == 3
    assert all(base64.b64decode(u) == png_bytes for u in uris)
    assert 'src="plots/' not in html and "missing plot" not in html.replace(".missing-plot", "")


def test_headings_have_ids_and_the_toc_links_to_them(html):
    page = Page(html)
    ids = [a["id"] for tag in ("h2", "h3") for a, _ in page.find(tag)]
    assert len(ids) == len(re.findall(r"^#{2,3} ", REPORT, re.MULTILINE)) and all(ids) and len(set(ids)) == len(ids)
    toc = html[html.index('<nav class="toc"') : html.index("</nav>")]
    assert set(re.findall(r'href="#([^"]+)"', toc)) == set(ids)
    assert html.index('<nav class="toc"') < html.index('id="configuration"')  # the contents come first
    assert html.count("<h1") == 1 and TITLE in html  # the report's own H1 is the page header, not repeated


def test_tables_become_tables_with_numeric_columns_right_aligned(html):
    page = Page(html)
    assert len(page.find("table")) == len(re.findall(r"^\|[-:|\s]+\|$", REPORT, re.MULTILINE)) == 8
    assert not re.search(r'style="text-align', html)  # the alignment became classes the CSS styles
    nums = {text.strip() for _, text in page.find("td", "num")}
    assert {"199,523", "48.71", "63346.3", "30.002", "14.8", "2048"} <= nums
    assert not {"GPU", "FP32", "yes", "NO", "1024 2048"} & nums
    assert {"Seconds", "Client Batch Size", "rows"} <= {t.strip() for _, t in page.find("th", "num")}
    assert [a for a, _ in page.find("table", "plots")]  # the side-by-side plot row is laid out, not a data table
    assert "tbody tr:nth-child(even)" in html and "position: sticky" in html and "max-width: 100%" in html


def test_failed_checks_and_flagged_points_are_highlighted(html):
    page = Page(html)
    assert sorted(t.strip() for _, t in page.find("td", "check-failed")) == ["NO", "error", "unstable"]
    failed_rows = [t for _, t in page.find("tr", "row-failed")]
    assert len(failed_rows) == 3 and any("onnx (dlrm_dense)" in t for t in failed_rows)
    assert not any("tf-savedmodel (dlrm_sparse)" in t for t in failed_rows)


def test_a_missing_plot_is_a_visible_placeholder(run_dir):
    (run_dir / "plots" / "ensemble_composing_latency.png").unlink()
    page_html = markdown_to_html(REPORT, run_dir, TITLE)
    placeholders = [t for _, t in Page(page_html).find("span", "missing-plot")]
    assert placeholders == ["missing plot: ensemble_composing_latency.png"]
    assert page_html.count('src="data:image/png;base64,') == 2 and 'src="plots/' not in page_html


def test_images_outside_the_run_folder_are_not_embedded_and_remote_ones_are_kept(run_dir, png_bytes):
    (run_dir.parent / "secret.png").write_bytes(png_bytes)
    (run_dir / "plots" / "a.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>')
    (run_dir / "plots" / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0jpeg")
    text = (
        "![](../secret.png) ![](/etc/passwd) ![](plots/a.svg) ![](plots/b.jpg) ![](plots/c.txt) "
        "![](https://example.com/remote.png) ![](http://[::1/broken.png) [x](http://[::1/broken)"
    )
    page_html = markdown_to_html(text, run_dir, "t")
    assert sorted(t for _, t in Page(page_html).find("span", "missing-plot")) == [
        "missing plot: broken.png",
        "missing plot: c.txt",
        "missing plot: passwd",
        "missing plot: secret.png",
    ]
    assert 'src="data:image/svg+xml;base64,' in page_html and 'src="data:image/jpeg;base64,' in page_html
    assert 'src="https://example.com/remote.png"' in page_html and "[::1/broken" not in page_html


def test_raw_html_from_user_strings_is_escaped(run_dir):
    text = REPORT.replace(
        "status **completed**.", "status **failed**: perf_analyzer said <script>alert(1)</script> & quit."
    ) + (
        '\n<div onclick="alert(2)">block</div>\n\n<img src=x onerror=alert(3)>\n\n'
        "Code stays code: `a<b> && c`\n\n```\n<script>in a fence</script>\n```\n\n"
        "[click](javascript:alert(4)) [ok](https://example.com/docs)\n"
    )
    page_html = markdown_to_html(text, run_dir, "model <script>alert(5)</script>")
    assert "<script" not in page_html.lower() and "<div onclick" not in page_html and "<img src=x" not in page_html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; quit" in page_html
    assert "model &lt;script&gt;alert(5)&lt;/script&gt;" in page_html
    assert "model &lt;b&gt;boom&lt;/b&gt; &amp; friends" in page_html  # the flagged point's error cell
    assert "<code>a&lt;b&gt; &amp;&amp; c</code>" in page_html  # escaped once, not twice
    assert "&lt;script&gt;in a fence&lt;/script&gt;" in page_html
    assert "javascript:" not in page_html and 'href="https://example.com/docs"' in page_html


def test_the_status_line_is_a_red_or_green_banner(run_dir):
    ok = Page(markdown_to_html(REPORT, run_dir, TITLE))
    assert [t for _, t in ok.find("p", "status-completed")] == ["Run dlrm-20261122-200716-e158d2, status completed."]
    assert not ok.find("p", "status-failed")
    failed = Page(markdown_to_html(REPORT.replace("**completed**.", "**failed**: out of memory."), run_dir, TITLE))
    ((attrs, text),) = failed.find("p", "status-failed")
    assert "status-banner" in attrs["class"] and "out of memory" in text and not failed.find("p", "status-completed")
    assert len(failed.find("p", "status-banner")) == 1
    assert ".status-failed" in markdown_to_html(REPORT, run_dir, TITLE)


def test_the_page_needs_nothing_external(html):
    assert not re.search(r"<(link|script)\b", html, re.IGNORECASE)
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "@import" not in html and "url(" not in html and "@font-face" not in html
    assert '<header class="page">' in html and "dlrm-20261122-200716-e158d2" in html
    assert re.search(r'<footer class="page">Generated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC', html)


def test_write_html_report_writes_next_to_the_markdown_or_where_asked(run_dir):
    out = write_html_report(run_dir / "report.md")
    assert out == run_dir / "report.html" and out.read_text().startswith("<!DOCTYPE html>")
    assert f"<title>{TITLE} (dlrm-20261122-200716-e158d2)</title>" in out.read_text()
    other = write_html_report(run_dir / "report.md", run_dir / "site" / "index.html")
    assert other.read_text().count('src="data:image/png;base64,') == 3  # images still resolve from report.md's folder
    assert not list(run_dir.rglob(".*.tmp"))
    assert (
        report_title("no heading", "fallback") == "fallback"
        and report_title("# Run of `m.onnx`\n", "x") == "Run of m.onnx"
    )
