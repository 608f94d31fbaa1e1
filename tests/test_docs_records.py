"""The pages' figures come from clean records: a page that cites a record (`benchmarks/results/NAME.json`, or a bare
`NAME.json` on a page that cites its full path too) cites one that exists and whose provenance says a clean tree, and
every figure in the paragraph, list item or table row that cites it is in it.

The convention for figures: a paragraph (list item, table row) that cites a record quotes that record's figures and no
other. A figure matches a number in the record (or in one of its strings) at the precision it is written to, a
percentage also matching a fraction; a version (1.2.3) matches the record's text. Figures in code spans and link
targets are not read. Figures from an earlier record or from a sum over records go in a paragraph of their own, naming
the commit."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# Pages others are correcting; each fails this test for a reason named here. Empty this list as they are fixed.
KNOWN_EXCEPTIONS: dict[str, str] = {}

# The page listing every record as the output of its command: what a record measures, not its figures, so a dirty
# record may be listed there (it says what re-measures it).
OUTPUT_INDEX = "docs/concepts/benchmarks.md"

FULL = re.compile(r"benchmarks/results/([\w.-]+\.json)")
NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.,])\d+(?:\.\d+)*(?![\w])")


def leaves(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from leaves(v)
    else:
        yield value


@cache
def record(name: str) -> tuple[dict, tuple[float, ...], str]:
    """The record, its numbers (those inside its strings too) and its strings."""
    data = json.loads((RESULTS / name).read_text())
    numbers, texts = [], []
    for v in leaves(data):
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int | float):
            numbers.append(float(v))
        else:
            texts.append(str(v))
            numbers += [float(t.replace(",", "")) for t in NUMBER.findall(str(v)) if t.count(".") <= 1]
    return data, tuple(numbers), "\n".join(texts)


def in_record(figure: str, name: str) -> bool:
    _, numbers, text = record(name)
    if figure.count(".") > 1:  # a version
        return re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", text) is not None
    written = float(figure.replace(",", ""))
    places = len(figure.split(".")[1]) if "." in figure else 0
    return any(round(v, places) == written or round(100 * v, places) == written for v in numbers)


def units(text: str) -> list[str]:
    """Paragraphs, list items and table rows, fenced code left out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [u for block in re.split(r"\n\s*\n", text) for u in re.split(r"\n(?=\s*(?:[-*|]|\d+\.) )", block)]


def citations(unit: str, cited_in_full: set[str]) -> set[str]:
    """Records the unit cites: a full path in prose or as a code span of its own (not inside a command), or a bare
    name the page also cites in full."""
    prose = re.sub(r"`(?!benchmarks/results/[\w.-]+\.json`)[^`]*`", " ", unit)
    bare = {m for m in re.findall(r"(?<![\w/.])([\w-]+\.json)\b", prose) if m in cited_in_full}
    return set(FULL.findall(prose)) | bare


def figures(unit: str) -> list[str]:
    prose = re.sub(r"`[^`]*`", " ", unit)
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # link targets
    return NUMBER.findall(prose)


def page_problems(text: str, name: str) -> list[str]:
    full = set(FULL.findall(text))
    existing = {r for r in full if (RESULTS / r).is_file()}
    problems = [f"cites {r}, which does not exist" for r in sorted(full - existing)]
    if name != OUTPUT_INDEX:
        dirty = [r for r in sorted(existing) if record(r)[0]["provenance"]["dirty"]]
        problems += [f"cites {r}, measured on a dirty tree" for r in dirty]
    for unit in units(text):
        cited = citations(unit, existing)
        if not cited:
            continue
        wrong = [f for f in figures(unit) if not any(in_record(f, r) for r in cited)]
        if wrong:
            problems.append(f"{wrong} not in {sorted(cited)}: {' '.join(unit.split())[:160]}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_page_quotes_only_what_its_clean_records_hold(page):
    name = page.relative_to(ROOT).as_posix()
    problems = page_problems(page.read_text(), name)
    if name in KNOWN_EXCEPTIONS:
        assert problems, f"{name} passes now: take it off KNOWN_EXCEPTIONS"
        pytest.xfail(KNOWN_EXCEPTIONS[name])
    assert not problems, "\n".join(problems)


def test_the_index_lists_every_record():
    listed = set(FULL.findall((ROOT / OUTPUT_INDEX).read_text()))
    assert listed == {p.name for p in RESULTS.glob("*.json")}


def test_the_check_catches_a_typed_in_figure_a_dirty_record_and_a_missing_one():
    by_dirty = {json.loads(p.read_text())["provenance"]["dirty"]: p.name for p in sorted(RESULTS.glob("*.json"))}
    clean, dirty = by_dirty[False], by_dirty[True]
    wall = record(clean)[0]["provenance"]["wall_s"]
    text = (
        f"It took {wall:.1f} s (`benchmarks/results/{clean}`).\n\n"
        f"It took {wall + 1000:.1f} s (`benchmarks/results/{clean}`).\n\n"
        f"See benchmarks/results/{dirty} and benchmarks/results/no_such.json.\n"
    )
    problems = page_problems(text, "page.md")
    assert len(problems) == 3, problems
    assert "no_such.json, which does not exist" in problems[0] and "dirty" in problems[1]
    assert f"{wall + 1000:.1f}" in problems[2]
