"""The A/B session flow (`tbench run --model-file NEW --against OLD --trials N`): wiring only. N rounds, each the
baseline's run and the candidate's back to back (the order alternating), then the comparison paired by round."""

from __future__ import annotations

import contextlib
import logging

from prefect import flow

from flows.benchmark import benchmark_flow
from tbench.core.errors import BenchError
from tbench.request.adapter import adapter_for
from tbench.request.benchmark import BenchmarkRequest
from tbench.stages.ab_session import new_session_id, round_order, round_request, side_requests, write_session

log = logging.getLogger("prefect.tbench.session")


@flow(name="triton-ab-session")
def ab_session_flow(request: BenchmarkRequest, against: str, min_effect: float = 0.05) -> str:
    """The request's model file against the `against` model file, `request.trials` rounds; returns the URL of the
    session's folder (session.json, comparison.md, comparison.png). A round whose run failed is left out of the
    pairing, and the other rounds still count; an interrupt stops the session (each run leaves its machine clean), its
    folder written with the rounds measured so far."""
    sides = side_requests(request, against)
    session_id = new_session_id(adapter_for(sides["candidate"]).name)
    record = {
        "id": session_id,
        "candidate": request.model_file,
        "baseline": against,
        "rounds": request.trials,
        "order": [],
        "runs": {"baseline": [], "candidate": []},
        "failed": [],
    }
    try:
        for round_ in range(1, request.trials + 1):
            for side in round_order(round_):
                record["order"].append(f"{round_}:{side}")
                try:
                    url = benchmark_flow(round_request(sides[side], session_id, side, round_))
                except BenchError as err:  # this round pairs with nothing; the others still pair
                    log.warning("round %d, %s: %s", round_, side, err)
                    record["failed"].append({"round": round_, "side": side, "error": str(err)})
                    continue
                record["runs"][side].append(str(getattr(url, "data", url)))
    except BaseException as err:  # interrupted: the rounds measured so far are compared and kept, then it stops
        record["interrupted"] = f"{type(err).__name__} in round {round_}"
        with contextlib.suppress(Exception):
            write_session(request.output, session_id, record, min_effect)
        raise
    url, record = write_session(request.output, session_id, record, min_effect)
    log.info("A/B session %s: %s", session_id, record["summary"])
    return url
