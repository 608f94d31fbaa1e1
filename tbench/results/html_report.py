"""The run's report.md as one self-contained HTML page: plots embedded, no external CSS, JS or fonts.

The markdown is our own report, but it carries user-provided strings (model names, error messages), so raw HTML
in it is never passed through: the `markdown` package's raw-HTML block and inline handlers are removed, which
leaves `<`, `>` and `&` in the text to be escaped by its serializer (code spans and fenced blocks are escaped as
usual). Local images are read from the run folder only; links and images with script-capable schemes are dropped.
"""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as etree
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

import jinja2
import markdown
from markdown.extensions import Extension
from markdown.extensions.toc import TocExtension
from markdown.treeprocessors import Treeprocessor
from markupsafe import Markup

IMAGE_TYPES = {
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
}
# a check that did not pass, a point that did not stabilise, fell behind its offered rate or failed
FAILED_CELLS = {"NO", "unstable", "behind", "error"}
REMOTE_SCHEMES = {"http", "https"}
SAFE_LINK_SCHEMES = {"", "http", "https", "mailto"}
_NUMBER = re.compile(r"[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?%?")
_RUN_ID = re.compile(r"^Run `([^`]+)`", re.MULTILINE)
_H1 = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.MULTILINE)

CSS = """
:root { --fg: #1f2328; --muted: #59636e; --border: #d1d9e0; --zebra: #f6f8fa; --head: #eaeef2; --accent: #76b900;
        --bad-bg: #ffebe9; --bad-fg: #a40e26; --bad-border: #cf222e; --ok-bg: #dafbe1; --ok-fg: #116329; --ok-border: #1a7f37; }
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body { margin: 0; color: var(--fg); background: #fff; line-height: 1.5; font-size: 15px;
       font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
header.page, main, footer.page { max-width: 1200px; margin: 0 auto; padding: 0 1.5rem; }
header.page { padding-top: 1.5rem; padding-bottom: .75rem; border-bottom: 3px solid var(--accent); }
header.page h1 { margin: 0; font-size: 1.6rem; }
header.page .run-id { margin: .25rem 0 0; color: var(--muted); }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; font-size: .9em;
       background: var(--zebra); padding: .1em .3em; border-radius: 4px; }
pre { background: var(--zebra); padding: .75rem 1rem; overflow-x: auto; border-radius: 6px; }
pre code { background: none; padding: 0; }
h1, h2, h3, h4 { line-height: 1.25; margin: 1.6em 0 .6em; }
h2 { border-bottom: 1px solid var(--border); padding-bottom: .25em; }
a { color: #0969da; }
a.headerlink { visibility: hidden; text-decoration: none; margin-left: .3em; color: var(--muted); }
h1:hover a.headerlink, h2:hover a.headerlink, h3:hover a.headerlink, h4:hover a.headerlink { visibility: visible; }
nav.toc { margin: 1rem 0 1.5rem; padding: .5rem 1rem; background: var(--zebra); border: 1px solid var(--border); border-radius: 6px; }
nav.toc .toc-title { font-weight: 600; margin: .25rem 0; }
nav.toc ul { margin: .2rem 0; padding-left: 1.2rem; }
img { max-width: 100%; height: auto; }
table { border-collapse: separate; border-spacing: 0; margin: 1rem 0; font-size: .88rem; font-variant-numeric: tabular-nums; }
th, td { padding: .3rem .6rem; border-bottom: 1px solid var(--border); text-align: left; vertical-align: top; }
thead th { position: sticky; top: 0; z-index: 1; background: var(--head); border-bottom: 2px solid var(--border); }
tbody tr:nth-child(even) td { background: var(--zebra); }
th.num, td.num { text-align: right; }
th.center, td.center { text-align: center; }
tr.row-failed td { background: var(--bad-bg); }
td.check-failed { color: var(--bad-fg); font-weight: 700; }
table.plots { width: 100%; table-layout: fixed; }
table.plots th { position: static; background: none; border: 0; padding: 0 .25rem; width: 50%; font-weight: normal; }
table.plots tbody { display: none; }
.missing-plot { display: inline-block; padding: 1.5rem 1rem; margin: .25rem 0; border: 2px dashed var(--bad-border);
                color: var(--bad-fg); background: var(--bad-bg); border-radius: 6px; font-weight: 600; }
p.status-banner { padding: .6rem 1rem; border-radius: 6px; border-left: 6px solid; }
p.status-failed { background: var(--bad-bg); color: var(--bad-fg); border-color: var(--bad-border); }
p.status-completed { background: var(--ok-bg); color: var(--ok-fg); border-color: var(--ok-border); }
p.status-other { background: #fff8c5; color: #7d4e00; border-color: #bf8700; }
footer.page { margin-top: 2.5rem; padding-top: .75rem; padding-bottom: 2rem; border-top: 1px solid var(--border);
              color: var(--muted); font-size: .85rem; }
@media print { thead th { position: static; } nav.toc { break-after: page; } }
"""  # noqa: E501 - CSS: a rule's declarations stay on one line

TEMPLATE = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="tbench tasks/html_report.py">
<title>{{ title }}{% if run_id %} ({{ run_id }}){% endif %}</title>
<style>{{ css }}</style>
</head>
<body>
<header class="page">
<h1>{{ title }}</h1>
{% if run_id %}<p class="run-id">Run <code>{{ run_id }}</code></p>{% endif %}
</header>
<main>
{% if toc %}<nav class="toc" aria-label="Contents">
<p class="toc-title">Contents</p>
{{ toc }}
</nav>{% endif %}
{{ body }}
</main>
<footer class="page">Generated {{ generated }} from the run's report.md; plots are embedded, the page needs nothing else.</footer>
</body>
</html>
""")  # noqa: E501 - HTML: the footer's text stays on one line


def _split(url: str):
    """urlsplit, or None for a URL it refuses (an unclosed IPv6 bracket, say): such an image is missing, such a
    link dropped."""
    try:
        return urlsplit(url)
    except ValueError:
        return None


def _text(el: etree.Element) -> str:
    return "".join(el.itertext()).strip()


def _image_data_uri(src: str, base_dir: Path) -> str | None:
    """The local image as a data URI, or None when it is missing, outside the run folder or not an image type we
    embed."""
    parts = _split(src)
    if parts is None or parts.scheme or parts.netloc or not parts.path:
        return None
    root = base_dir.resolve()
    path = (root / unquote(parts.path)).resolve()
    kind = IMAGE_TYPES.get(path.suffix.lower())
    if kind is None or not path.is_relative_to(root) or not path.is_file():
        return None
    try:
        return f"data:{kind};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"
    except OSError:
        return None


def _missing(el: etree.Element, src: str) -> None:
    parts = _split(src)
    name = PurePosixPath(unquote(parts.path) if parts else src).name or src or "(no source)"
    tail = el.tail
    el.clear()
    el.tag, el.text, el.tail = "span", f"missing plot: {name}", tail
    el.set("class", "missing-plot")


def _add_class(el: etree.Element, name: str) -> None:
    el.set("class", " ".join(filter(None, [el.get("class", ""), name])))


class _RunPage(Treeprocessor):
    """Embeds images, drops unsafe links, marks failed checks, numeric columns, plot grids and the status line."""

    def __init__(self, md, base_dir: Path, title: str):
        super().__init__(md)
        self.base_dir, self.title = base_dir, title

    def run(self, root: etree.Element) -> None:
        first = next(iter(root), None)
        if first is not None and first.tag == "h1" and _text(first).rstrip("¶").strip() == self.title.strip():
            root.remove(first)  # the page header shows it
        for img in list(root.iter("img")):
            self._image(img)
        for a in root.iter("a"):
            parts = _split(a.get("href", ""))
            if "href" in a.attrib and (parts is None or parts.scheme.lower() not in SAFE_LINK_SCHEMES):
                del a.attrib["href"]
        for table in root.iter("table"):
            self._table(table)
        for p in root.iter("p"):
            if self._status(p):
                break

    def _image(self, img: etree.Element) -> None:
        src = (img.get("src") or "").strip()
        parts = _split(src)
        scheme = parts.scheme.lower() if parts else ""
        if scheme in REMOTE_SCHEMES:
            return
        if scheme == "data" and src.lower().startswith("data:image/"):
            return  # already embedded (an image element never runs scripts, SVG included)
        uri = _image_data_uri(src, self.base_dir)
        if uri is None:
            _missing(img, src)
        else:
            img.set("src", uri)

    def _table(self, table: etree.Element) -> None:
        head, body = table.find("thead"), table.find("tbody")
        plots = head is not None and any(el.tag == "img" or "missing-plot" in el.get("class", "") for el in head.iter())
        if plots and (body is None or not any(_text(td) for td in body.iter("td"))):
            _add_class(table, "plots")  # the side-by-side plots row, `| ![](a) | ![](b) |` with an empty body
            return
        for cell in table.iter():
            align = re.fullmatch(r"\s*text-align:\s*(left|right|center);?\s*", cell.get("style", ""))
            if (
                cell.tag in ("th", "td") and align
            ):  # the tables extension's inline alignment, as classes the CSS can style
                del cell.attrib["style"]
                if align.group(1) != "left":
                    _add_class(cell, "num" if align.group(1) == "right" else "center")
        rows = list(body.iter("tr")) if body is not None else []
        for tr in rows:
            for td in tr.iter("td"):
                if _text(td) in FAILED_CELLS:
                    _add_class(td, "check-failed")
                    if "row-failed" not in tr.get("class", ""):
                        _add_class(tr, "row-failed")
        columns: dict[int, list[etree.Element]] = {}
        for tr in rows:
            for i, td in enumerate(tr.findall("td")):
                columns.setdefault(i, []).append(td)
        header = head.findall("tr/th") if head is not None else []
        for i, cells in columns.items():
            values = [_text(c) for c in cells]
            if any(values) and all(_NUMBER.fullmatch(v) for v in values if v):
                for cell in cells + header[i : i + 1]:
                    if "num" not in cell.get("class", "").split():
                        _add_class(cell, "num")

    def _status(self, p: etree.Element) -> bool:
        children = list(p)
        for i, strong in enumerate(children):
            before = p.text if i == 0 else children[i - 1].tail
            if strong.tag == "strong" and before and re.search(r"\bstatus\s*$", before):
                status = _text(strong).lower()
                kind = status if status in {"failed", "completed"} else "other"
                _add_class(p, "status-banner")
                _add_class(p, f"status-{kind}")
                return True
        return False


class _RunPageExtension(Extension):
    def __init__(self, base_dir: Path, title: str):
        super().__init__()
        self.base_dir, self.title = base_dir, title

    def extendMarkdown(self, md) -> None:
        md.preprocessors.deregister("html_block")  # raw HTML in the source stays text, escaped on output
        md.inlinePatterns.deregister("html")
        md.treeprocessors.register(
            _RunPage(md, self.base_dir, self.title), "run_page", 4
        )  # after inline (20) and toc (5)


def markdown_to_html(markdown_text: str, base_dir: Path, title: str, run_id: str | None = None) -> str:
    """The report as one HTML page; images relative to base_dir are embedded, raw HTML in the markdown is escaped."""
    md = markdown.Markdown(
        extensions=[
            "tables",
            "fenced_code",
            TocExtension(toc_depth="2-4", permalink="¶", permalink_title="Link to this section"),
            _RunPageExtension(Path(base_dir), title),
        ],
        output_format="html",
    )
    body = md.convert(markdown_text)
    if run_id is None:
        found = _RUN_ID.search(markdown_text)
        run_id = found.group(1) if found else None
    toc = md.toc if getattr(md, "toc_tokens", None) else ""
    return TEMPLATE.render(
        title=title,
        run_id=run_id,
        css=Markup(CSS),
        toc=Markup(toc),
        body=Markup(body),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


def report_title(markdown_text: str, fallback: str) -> str:
    """The first level-1 heading as plain text (no backticks or emphasis markers), else fallback."""
    found = _H1.search(markdown_text)
    return re.sub(r"[`*]", "", found.group(1)).strip() if found else fallback


def write_html_report(report_md: Path, out: Path | None = None) -> Path:
    """report.md rendered to a self-contained page, by default report.html next to it; returns its path."""
    report_md = Path(report_md)
    out = Path(out) if out is not None else report_md.with_name("report.html")
    text = report_md.read_text(encoding="utf-8")
    html = markdown_to_html(text, report_md.parent, report_title(text, report_md.parent.name))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out
