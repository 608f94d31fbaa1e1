"""Reading Triton's trace file into a rate point's requests (tbench.triton.trace); the real server's trace is in
test_served_model.py."""

import os
from pathlib import Path

from tbench.triton.trace import read_events, request_log

GOLDEN = Path(__file__).parent / "golden" / "triton" / "trace_grpc_open.json"


def events():
    return read_events(GOLDEN.read_text())


def test_an_open_trace_file_and_its_appended_pieces_are_read_whole():
    text = GOLDEN.read_text()
    assert text.startswith("[") and not text.rstrip().endswith("]")  # as Triton leaves it while it runs
    first = read_events(text)
    assert len(first) == 520 and {e["id"] for e in first} == set(range(1, 41))
    again = read_events("," + text[1:] + "]")  # a later piece (after tracing was turned on again), then the close
    assert again == first
    cut = read_events(text[:-20])  # a write under way: the cut event is left out, the others kept
    assert cut == first[:-1]


def test_a_part_that_begins_inside_an_event_keeps_the_events_after_it():
    """The file is emptied while Triton writes: the next part may begin inside an event (seen in a capacity run on a
    busy machine: `"ns":...` read as the first event, and the point failed). That event is left out, the rest kept."""
    text = GOLDEN.read_text()
    first = read_events(text)
    inside = text.index('"timestamps"', len(text) // 2)  # within an event half-way through
    later = read_events(text[inside:])
    assert later and later == first[-len(later) :] and all("id" in e for e in later)
    assert len(later) < len(first) // 2 + 2
    assert read_events('"ns": 12}]},' + text[1:]) == first
    assert read_events("12}]}") == [] and read_events("") == []


def test_a_request_arrives_when_the_server_reads_it_and_leaves_when_its_answer_is_sent():
    ev = events()
    stamps = {t["name"]: t["ns"] for e in ev if e["id"] == 1 for t in e.get("timestamps", [])}
    log = request_log(ev, "resnet50", 0, 2**63 - 1)
    assert len(log) == 40 and log.sent_s[0] == 0.0 and (log.latency_s > 0).all()
    # not GRPC_WAITREAD_START: the server waits for the next request long before the client sends it
    assert log.latency_s[0] * 1e9 == stamps["GRPC_SEND_END"] - stamps["GRPC_WAITREAD_END"]
    assert (log.sent_s[1:] >= log.sent_s[:-1]).all()


def test_only_the_models_requests_arrived_and_answered_within_the_point_count():
    ev = events()
    everything = request_log(ev, "resnet50", 0, 2**63 - 1)
    first_ns = next(
        t["ns"] for e in ev if e["id"] == 1 for t in e.get("timestamps", []) if t["name"] == "GRPC_WAITREAD_END"
    )
    middle = first_ns + round(everything.sent_s[20] * 1e9)
    assert len(request_log(ev, "resnet50", middle, 2**63 - 1)) == 20  # arrived before the point: another point's
    until = first_ns + round(sorted(everything.answered_s)[9] * 1e9)
    ended = request_log(ev, "resnet50", 0, until)
    assert len(ended) == 10  # answered after it: still in flight at its end
    assert ended.span_s == (until - first_ns) / 1e9  # the point's span: from its first request to its end
    assert request_log(ev, "another", 0, 2**63 - 1) is None


def test_an_ensembles_steps_are_not_its_requests():
    ev = events()
    steps = [
        {**e, "id": e["id"] + 1000, **({"model_name": "resnet50", "parent_id": e["id"]} if "model_name" in e else {})}
        for e in ev
    ]
    assert len(request_log(ev + steps, "resnet50", 0, 2**63 - 1)) == 40


def test_the_file_is_emptied_after_each_read_and_the_next_read_skips_the_hole(tmp_path):
    from tbench.triton.trace import RequestTrace

    path = tmp_path / "trace.json"
    text = GOLDEN.read_text()
    path.write_text(text)  # Triton's first flush, from its offset 0
    trace = RequestTrace("127.0.0.1:1", "resnet50", path)
    assert read_events(trace._take()) == events() and path.stat().st_size == 0
    with open(path, "r+b") as f:  # its next flush, at its own offset: a hole before it
        os.pwrite(f.fileno(), ("," + text[1:]).encode(), 1 << 20)
    assert read_events(trace._take()) == events() and path.stat().st_size == 0
