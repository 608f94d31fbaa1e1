"""The run's CPU sets: disjoint server and client sets by physical core, SMT siblings kept together, threads that
follow the server's set, and the client side entered and left without changing what this process had."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tbench.node import placement as pl
from tbench.node.placement import MIN_CORES, Placement, cores, on_client_cpus, parse_cpu_list, plan_placement


def smt_topology(tmp_path: Path, pairs: list[tuple[int, int]]) -> Path:
    for pair in pairs:
        for cpu in pair:
            d = tmp_path / f"cpu{cpu}" / "topology"
            d.mkdir(parents=True)
            (d / "thread_siblings_list").write_text(",".join(map(str, pair)) + "\n")
    return tmp_path


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}


def test_two_cores_stay_unpinned_unless_asked_to(tmp_path, monkeypatch):
    assert not plan_placement(cpus={0, 1}, topology=tmp_path).pinned and MIN_CORES > 2
    monkeypatch.setenv("TBENCH_PIN_MIN_CORES", "2")
    p = plan_placement(cpus={0, 1}, topology=tmp_path)  # no /sys entries: each CPU its own core
    assert p.pinned and p.server == (0,) and p.client == (1,)
    assert p.server_threads(instances=1, cpu_cores=2) == 1
    assert p.wrap(["tritonserver"])[-3:] == ["-c", "0", "tritonserver"]


def test_smt_siblings_stay_on_one_side(tmp_path):
    topo = smt_topology(tmp_path, [(0, 4), (1, 5), (2, 6), (3, 7)])
    assert cores(set(range(8)), topo) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    p = plan_placement(cpus=set(range(8)), topology=topo)
    assert set(p.server) == {0, 4, 1, 5, 2, 6} and set(p.client) == {3, 7}
    assert not set(p.server) & set(p.client)
    assert p.server_threads(instances=2, cpu_cores=8) == 3


def test_unpinned_when_asked_or_on_one_core(tmp_path):
    assert not plan_placement(pin=False).pinned
    one = plan_placement(cpus={0}, topology=tmp_path)
    assert not one.pinned and "1 usable CPU(s)" in one.reason
    assert one.wrap(["x"]) == ["x"] and one.server_threads(instances=1, cpu_cores=4) == 4


def test_manifest_names_the_sets():
    assert Placement((0, 1), (2,), "why").manifest() == {
        "pinned": True,
        "server_cpus": "0,1",
        "client_cpus": "2",
        "reason": "why",
    }


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not shutil.which("taskset"), reason="needs two CPUs")
def test_client_side_is_entered_and_left():
    before = os.sched_getaffinity(0)
    client = min(before)
    with on_client_cpus(Placement((max(before),), (client,), "test")):
        assert os.sched_getaffinity(0) == {client}
        assert all(os.sched_getaffinity(t) == {client} for t in pl._threads(os.getpid()))
    assert os.sched_getaffinity(0) == before
