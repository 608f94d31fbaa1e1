"""The configuration search through the flow, on the real embedded tritonserver (explicit model control) and the real
perf_analyzer, with the small ResNet-50 on a 2-candidate grid."""

from __future__ import annotations

import json
import re

import pytest

from tbench.core.errors import ConfigError
from tbench.request.benchmark import BenchmarkRequest, Measurement
from tbench.search.confirm import combined_lines
from tbench.search.strategies import Objective, Observation, SearchSpace
from tbench.triton.config import parse_pbtxt

pytestmark = pytest.mark.e2e


def test_search_flow_measures_every_candidate_and_resumes(prefect_harness, tmp_path):
    from flows.search import search_flow
    from tbench.search.request import SearchRequest

    request = BenchmarkRequest(
        model="resnet50",
        size="small",
        formats=["onnx"],
        output=str(tmp_path),
        measurement=Measurement(window_s=0.5, stability_percentage=50, max_trials=6),
    )
    space = SearchSpace(instances=[1], max_batch_sizes=[2, 4], preferred=["max"], queue_delays_us=[500])
    grid = len(space.grid())  # 2: two configurations loaded in turn, enough for the paths under test
    # one confirmation round (at most 3 re-measurements): the path exercised, the suite kept short
    search = SearchRequest(
        space=space, objective=Objective(p99_budget_ms=2000), strategy="exhaustive", concurrency=2, confirm_rounds=1
    )
    run = tmp_path / search_flow(request, search).rsplit("/", 1)[-1]

    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "completed", manifest["error"]
    summary = json.loads((run / "search.json").read_text())
    again = summary["remeasurements"]  # the confirmation's (tbench.search.confirm): a line and a load each
    assert again == sum(len(r["remeasured"]) for r in summary["confirmation"])
    lines = [Observation.model_validate_json(line) for line in (run / "search.jsonl").read_text().splitlines()]
    assert len(lines) == grid + again and sum(o.confirm_round > 0 for o in lines) == again
    observations = combined_lines(lines)
    assert sorted(o.candidate.key for o in observations) == sorted(c.key for c in space.grid())
    assert all(o.ok and o.throughput > 0 for o in observations), [
        (o.candidate.key, o.status, o.error) for o in observations
    ]
    for record in summary["confirmation"]:  # each re-measurement: the same evaluator call, its own files
        for key in record["remeasured"]:
            assert list((run / "search" / f"{key}.confirm{record['round']}" / "perf").glob("*_try*.csv")), key
    best = Observation.model_validate(summary["best"])
    assert summary["measured"] == grid and summary["grid_size"] == grid
    # the best, or a cheaper configuration within the windows' noise of it (a near-tie goes to the cheaper one)
    top = max(observations, key=lambda o: o.throughput)
    assert all(o.throughput_cv is not None for o in observations)  # each candidate's noise, from its windows
    assert best.ok and best.p99_ms <= 2000
    assert best.throughput == top.throughput or (
        search.objective.within_noise(top, best) and best.candidate.cost <= top.candidate.cost
    )
    report = (run / "search.md").read_text()
    assert f"Measured **{grid} of {grid}** configurations" in report and best.candidate.describe() in report
    assert (run / "plots" / "search.png").exists()
    assert "data:image/png;base64," in (run / "search.html").read_text()  # the page carries its plot
    # one perf_analyzer point per candidate, at the search's concurrency, with its own files
    for c in space.grid():
        assert list((run / "search" / c.key / "perf").glob("resnet50_online_b1_c2_try*.csv")), c.key
    # every candidate was loaded with its own config through explicit model control, and unloaded
    log = (run / "logs" / "tritonserver.log").read_text()
    assert len(re.findall(r"successfully loaded 'resnet50'", log)) == grid + again, log[-2000:]
    assert len(re.findall(r"successfully unloaded 'resnet50'", log)) == grid + again
    last = parse_pbtxt((run / "model_repository" / "resnet50" / "config.pbtxt").read_text())
    loaded = lines[-1].candidate  # the last measured: the grid's last, or the confirmation's last re-measured
    assert (last.max_batch_size, last.dynamic_batching.max_queue_delay_microseconds) == (
        loaded.max_batch_size,
        loaded.queue_delay_us,
    )
    assert list(last.dynamic_batching.preferred_batch_size) == list(loaded.preferred_batch_sizes)
    assert last.instance_group[0].count == 1

    # resuming from the finished run's folder measures nothing again
    resumed = tmp_path / search_flow(request, search.model_copy(update={"resume_from": str(run)})).rsplit("/", 1)[-1]
    resumed_summary = json.loads((resumed / "search.json").read_text())
    assert resumed_summary["measured"] == grid and resumed_summary["new_measurements"] == 0
    assert resumed_summary["remeasurements"] == again and resumed_summary["best"] == summary["best"]
    assert all(r["from_checkpoint"] == len(r["remeasured"]) for r in resumed_summary["confirmation"])
    assert len((resumed / "search.jsonl").read_text().splitlines()) == len(lines)
    assert "successfully loaded 'resnet50'" not in (resumed / "logs" / "tritonserver.log").read_text()
    # what the checkpoint was measured for is recorded beside it (the server once it ran), and carried by the resume
    context = json.loads((run / "search_context.json").read_text())
    assert (context["model"], context["size"], context["concurrency"], context["variants"]) == (
        "resnet50",
        "small",
        2,
        {"": "onnx:fp32"},
    )
    assert (
        context["server"]["mode"] == "embedded"
        and context["server"]["version"]
        and context["server"]["binary"].endswith("tritonserver")
    )
    assert json.loads((resumed / "search_context.json").read_text()) == context
    # a resume with another setting is refused in one line before anything runs (no new run folder)
    before = set(tmp_path.iterdir())
    with pytest.raises(
        ConfigError,
        match=r"cannot resume from .*: it was measured with another concurrency, measurement\.window_s \(see",
    ) as err:
        search_flow(
            BenchmarkRequest(
                **{
                    **request.model_dump(exclude={"measurement"}),
                    "measurement": {"stability_percentage": 50, "max_trials": 6, "window_s": 3},
                }
            ),
            search.model_copy(update={"resume_from": str(run), "concurrency": 3}),
        )
    assert "\n" not in str(err.value) and set(tmp_path.iterdir()) == before
