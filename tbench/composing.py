"""Per composing model latency of an ensemble, as perf_analyzer prints it after a measurement (its CSV has only the
ensemble's row): queue and compute time of each step, so a report shows which part of the ensemble costs what."""

from __future__ import annotations

import re

COMPOSING_COLUMNS = [
    "model",
    "composing_model",
    "scenario",
    "format",
    "batch_size",
    "concurrency",
    "request_rate",
    "inference_count",
    "execution_count",
    "request_latency_ms",
    "overhead_ms",
    "server_queue_ms",
    "server_compute_input_ms",
    "server_compute_infer_ms",
    "server_compute_output_ms",
]

_HEADER = re.compile(r"^\s*(\S+), version: *(\S*)\s*$")
_COUNT = re.compile(r"^\s*(Inference|Execution) count: (\d+)")
_LATENCY = re.compile(r"Avg request latency: (\d+) usec \((.*)\)")
_PART = re.compile(r"(overhead|queue|compute input|compute infer|compute output) (\d+) usec")
_PART_COLUMNS = {
    "overhead": "overhead_ms",
    "queue": "server_queue_ms",
    "compute input": "server_compute_input_ms",
    "compute infer": "server_compute_infer_ms",
    "compute output": "server_compute_output_ms",
}


def parse_composing(log: str) -> list[dict]:
    """The last "Composing models:" block of a perf_analyzer log (the reported measurement; -v prints one per
    window before it): one dict per composing model, latencies in ms. Empty when the model is not an ensemble."""
    start = log.rfind("Composing models:")
    if start < 0:
        return []
    rows: list[dict] = []
    for line in log[start:].splitlines()[1:]:
        if (header := _HEADER.match(line)) and "usec" not in line:
            rows.append({"composing_model": header.group(1)})
        elif not rows:
            continue
        elif count := _COUNT.match(line):
            rows[-1][f"{count.group(1).lower()}_count"] = int(count.group(2))
        elif latency := _LATENCY.search(line):
            rows[-1]["request_latency_ms"] = int(latency.group(1)) / 1000
            for name, value in _PART.findall(latency.group(2)):
                rows[-1][_PART_COLUMNS[name]] = int(value) / 1000  # usec -> ms
        elif line.strip() and not line.startswith(" "):
            break  # the block ends at the next unindented line ("Inferences/Second vs. ...")
    return rows
