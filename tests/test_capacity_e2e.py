"""Capacity planning on this machine, through the CLI as a user runs it: the real embedded tritonserver and the real
perf_analyzer at Poisson rates, with the small ResNet-50 and one configuration. p90 keeps the points short (139
requests each); a loose SLO makes the rate search's answer about keeping up with the offered rate."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from tbench.capacity.rate_search import Status
from tbench.capacity.report import AnswerStatus, PoolAnswer
from tbench.capacity.statistics import PercentileRule
from tbench.loadgen.behind import behind_tolerance

pytestmark = pytest.mark.e2e

TBENCH = str(Path(sys.executable).with_name("tbench"))
SMALL = ["resnet50", "--size", "small", "--instances", "1", "--max-batch-sizes", "4", "--percentile", "90"]


def capacity(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([TBENCH, "capacity", *args], capture_output=True, text=True, timeout=timeout)


def test_capacity_finds_a_sustainable_rate_and_prices_it(tmp_path):
    done = capacity(
        *SMALL,
        *("--slo-p99-ms", "500", "--traffic", "100", "--max-points", "3", "--tolerance", "0.5"),
        *("--window-s", "0.1", "--output", str(tmp_path)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = Path(done.stdout.strip().splitlines()[-1])
    answer = PoolAnswer.model_validate(json.loads((run / "capacity.json").read_text())["answers"][0])
    assert answer.status is AnswerStatus.OK and answer.pool == "cpu", answer
    rate = answer.rate
    assert rate.rate and rate.rate > 0 and 1 <= len(rate.points) <= 3
    needed = PercentileRule(percentile=90).requests()
    for point in rate.points:  # every point judged, a passing one on enough requests within the SLO
        assert point.status in typing.get_args(Status)
        if point.passed:
            assert point.requests >= needed and point.latency_ms <= 500
            # it kept up with what was offered, by the rule a rate point is judged with
            assert point.served_rps >= point.rate * (1 - behind_tolerance(point.requests))
    assert rate.at_rate.rate == rate.rate  # the answer: the highest rate that passed, and passed again
    # every measurement keeps its own files, a rate measured again included (a repeat wrote over the first)
    assert len({p.source_file for p in rate.points}) == len(rate.points)
    candidates = [d for d in (run / "search").iterdir() if d.is_dir()]  # each candidate's measurements
    assert all(any((d / p.source_file).is_file() for d in candidates) for p in rate.points)
    plan = answer.plan
    assert plan.instances == max(1, math.ceil(100 * 1.2 / rate.rate - 1e-9))
    assert plan.usd_per_million and plan.usd_per_million > 0  # the shipped table prices the cpu pool
    report = (run / "capacity.md").read_text()
    assert "p90 ≤ 500 ms" in report and "139 requests" in report
    assert (run / "plots" / "capacity.png").stat().st_size > 0 and (run / "capacity.html").exists()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["stages"]["capacity-report"]["status"] == "completed"


def test_bad_capacity_input_is_one_line_and_exit_2(tmp_path):
    unknown_pool = capacity(*SMALL, "--slo-p99-ms", "50", "--traffic", "10", "--pools", "z80")
    assert unknown_pool.returncode == 2 and "z80" in unknown_pool.stdout + unknown_pool.stderr
    no_prices = capacity(*SMALL, "--slo-p99-ms", "50", "--traffic", "10", "--prices", str(tmp_path / "none.csv"))
    assert no_prices.returncode == 2 and "price table" in no_prices.stdout + no_prices.stderr
    bad_percentile = capacity(*SMALL, "--slo-p99-ms", "50", "--traffic", "10", "--percentile", "97")
    assert bad_percentile.returncode == 2
