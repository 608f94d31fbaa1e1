"""The warm-up before a sweep or a search's candidate: every batch the dynamic batcher can form is run once before
anything is timed (a runtime compiles per batch size on its first calls), checked on the real embedded server."""

from __future__ import annotations

import time

import pytest
import tritonclient.grpc as grpcclient

from tbench.core import progress
from tbench.stages import warm_up as warming
from tbench.stages.warm_up import formed_batch_sizes, warm_up


def test_formed_batch_sizes_are_the_multiples_of_a_request_up_to_the_batcher_and_the_clients():
    assert formed_batch_sizes(1, 8) == [1, 2, 3, 4, 5, 6, 7, 8]  # open loop: any number of waiting requests
    assert formed_batch_sizes(1, 8, concurrency=3) == [1, 2, 3]  # a closed loop: no more than its clients
    assert formed_batch_sizes(2, 8, concurrency=8) == [2, 4, 6, 8]  # requests of 2 samples
    assert formed_batch_sizes(1, 0) == []  # no batch axis (or no dynamic batcher): nothing formed


def batch_counts(server, model: str) -> dict[int, int]:
    client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    finally:
        client.close()
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}


def batches_run_since(server, model: str, before: dict[int, int], sizes: range, at_least: int) -> dict[int, int]:
    """Each batch size's executions since `before`, read until each has `at_least` or 10 s have passed: the server
    counts an execution after its response is on its way, so the last call's count can lag the client by a moment."""
    deadline = time.monotonic() + 10
    while True:
        after = batch_counts(server, model)
        ran = {b: after.get(b, 0) - before.get(b, 0) for b in sizes}
        if all(n >= at_least for n in ran.values()) or time.monotonic() > deadline:
            return ran
        time.sleep(0.1)


@pytest.mark.e2e
def test_warm_up_runs_every_batch_the_batcher_can_form_before_timing(served_small, small_artifacts):
    before = batch_counts(served_small, "resnet50")
    latency = warm_up(
        served_small.endpoints.grpc_url,
        "resnet50",
        small_artifacts[0].io_spec,
        [1],
        requests=1,
        formed=formed_batch_sizes(1, 8),
    )
    assert set(latency) == {1}  # only the request's batch is timed
    ran = batches_run_since(served_small, "resnet50", before, range(2, 9), warming.FORMED_WARMUP_CALLS)
    assert all(n >= warming.FORMED_WARMUP_CALLS for n in ran.values()), ran


@pytest.mark.e2e
def test_warming_the_formed_batches_stops_at_its_budget_and_says_what_it_left(
    served_small, small_artifacts, monkeypatch
):
    monkeypatch.setattr(warming, "FORMED_WARMUP_S", -1.0)  # spent before it starts
    events = []

    def on_event(event: str, **data) -> None:
        events.append((event, data))

    progress.subscribe(on_event)
    try:
        warm_up(served_small.endpoints.grpc_url, "resnet50", small_artifacts[0].io_spec, [1], 1, formed=[2, 4, 8])
    finally:
        progress.unsubscribe(on_event)
    assert [data for event, data in events if event == "warmup_partial"] == [
        {"model": "resnet50", "warmed": [], "left": [2, 4, 8]}
    ]
