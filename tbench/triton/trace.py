"""Every request's timestamps from the server's side: Triton's trace (TIMESTAMPS level) of one model, taken over one
rate point, for requests too large for perf_analyzer's per-request export (loadgen.perf_analyzer.export_fits).

Triton writes traces only to the file its command line names (`--trace-config triton,file=...`; the trace API refuses
to move it), so a server we start is given a trace file with tracing off, and a point turns it on for its model
through the API (every request, `trace_rate` 1) and off again after. Turning it off flushes what was traced to the
file, appended to one JSON array that stays open until the server exits. The timestamps are the server's steady clock
(CLOCK_MONOTONIC on Linux: this host's `time.monotonic_ns`, inside a container too).

A request arrives when the server starts reading it (HTTP_RECV_START, GRPC_WAITREAD_END) and is answered when its
response is sent (HTTP_SEND_END, GRPC_SEND_END); without those, REQUEST_START and REQUEST_END. What the point's
verdict (loadgen.behind.kept_up_from_requests) reads from them is what it reads from perf_analyzer's export: when
requests came and went, whether the server kept pace. Their latency lacks the client's side, so a capacity plan's
percentile does not come from them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import numpy as np

from tbench.loadgen.perf_analyzer import RequestLog

TRACE_FILE = "trace.json"
ARRIVED = ("HTTP_RECV_START", "GRPC_WAITREAD_END", "REQUEST_START")  # by preference
ANSWERED = ("HTTP_SEND_END", "GRPC_SEND_END", "REQUEST_END")


def trace_args(path: Path) -> list[str]:
    """tritonserver's options for a trace file with tracing off until a point turns it on."""
    return [f"--trace-config=triton,file={path}", "--trace-config=level=OFF"]


def read_events(text: str) -> list[dict]:
    """A part of Triton's trace file (an open JSON array, written in pieces: `[{...},{...}` then `,{...}`) -> its
    events; a piece cut off at its end (a write under way) is left out, and so is one cut off at its start (written
    while the file was being emptied: the part may then begin inside an event, e.g. `"ns":123}]},{"id":7,...`)."""
    body = text.strip().lstrip("[,").rstrip("],")
    decoder, events, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            event, end = decoder.raw_decode(body, at)
        except ValueError:
            event, end = None, at
        if not (isinstance(event, dict) and "id" in event):  # not an event's start: resume at the next object
            at = body.find("{", max(end, at + 1))
            if at < 0:
                break
            continue
        events.append(event)
        at = end
        while at < len(body) and body[at] in ", \n\r\t]":
            at += 1
    return events


def request_log(events: list[dict], model: str, since_ns: int, until_ns: int) -> RequestLog | None:
    """The requests of `model` (its own traces, not those of an ensemble's steps) that arrived at or after `since_ns`
    and were answered by `until_ns`, as a RequestLog from the first arrival; None with fewer than two."""
    models: dict[int, str] = {}
    parents: set[int] = set()
    stamps: dict[int, dict[str, int]] = {}
    for event in events:
        trace_id = event.get("id")
        if "model_name" in event:
            models[trace_id] = event["model_name"]
        if "parent_id" in event:
            parents.add(trace_id)
        for stamp in event.get("timestamps") or []:
            stamps.setdefault(trace_id, {}).setdefault(stamp["name"], int(stamp["ns"]))
    sent, answered = [], []
    for trace_id, named in stamps.items():
        if models.get(trace_id) != model or trace_id in parents:
            continue
        start = next((named[n] for n in ARRIVED if n in named), None)
        end = next((named[n] for n in ANSWERED if n in named), None)
        if start is not None and end is not None and since_ns <= start <= end <= until_ns:
            sent.append(start)
            answered.append(end)
    if len(sent) < 2:
        return None
    order = np.argsort(sent, kind="stable")
    sent_ns, answered_ns = np.array(sent, dtype=np.int64)[order], np.array(answered, dtype=np.int64)[order]
    first = int(sent_ns[0])
    span = (until_ns - first) / 1e9
    return RequestLog(
        sent_s=(sent_ns - first) / 1e9,
        latency_s=(answered_ns - sent_ns) / 1e9,
        span_s=span,
        boundaries_s=(0.0, span),
    )


class RequestTrace:
    """Trace one model's requests while a point runs: `start()` before it, `stop()` after, which returns them.

    Triton writes at its own offset in the file, so the file is emptied after each read (a hole before that offset
    then, which takes no disk space) and the next read starts where the data does (SEEK_DATA): a long capacity search
    traces millions of requests, and the file would hold them all."""

    def __init__(self, http_url: str, model: str, path: Path):
        self.http_url, self.model, self.path = http_url, model, path
        self._since = 0

    def _update(self, settings: dict) -> None:
        import tritonclient.http as httpclient

        with contextlib.closing(httpclient.InferenceServerClient(self.http_url)) as client:
            client.update_trace_settings(model_name=self.model, settings=settings)

    def start(self) -> bool:
        """Turn the model's trace on; False where the server refuses (then the point is judged without it)."""
        self._since = time.monotonic_ns()
        try:
            self._update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "0"})
        except Exception:
            return False
        return True

    def stop(self) -> RequestLog | None:
        """Turn it off (which writes what it traced) and read the requests since start()."""
        until = time.monotonic_ns()
        try:
            self._update({"trace_level": ["OFF"]})
            text = self._take()
        except Exception:
            return None
        return request_log(read_events(text), self.model, self._since, until)

    def _take(self) -> str:
        """What the file holds, the file then emptied."""
        with open(self.path, "rb") as trace:
            try:
                trace.seek(os.lseek(trace.fileno(), 0, os.SEEK_DATA))
            except OSError:  # no data (ENXIO), or no SEEK_DATA here: read it all
                trace.seek(0)
            data = trace.read()
        os.truncate(self.path, 0)
        return data.lstrip(b"\0").decode(errors="replace")
