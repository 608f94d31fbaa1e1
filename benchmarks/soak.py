"""Reliability as a figure: bad input refused in one line (the fuzz), and runs under injected faults (the soak).

The fuzz (benchmarks/fuzz_inputs.py): generated bad command lines and Prefect request forms (wrong types, unknown
names, out-of-range numbers, malformed --input-data, unreadable model files, unwritable outputs), each run as a user
runs it. Each must be refused with a non-zero exit, in one line, with no traceback, writing nothing.

Writes benchmarks/results/soak.json with its provenance (benchmarks/provenance.py): `inputs_tried`, `tracebacks`,
the refusals in one line and every case that was not, with its first line. Only the parts run are in the record
(`parts`); the soak under faults is a part of its own, not yet built (issue 35).
"""

from __future__ import annotations

import argparse
import sys
import time

from fuzz_inputs import fuzz
from provenance import RESULTS, recorded
from soak_faults import soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="fuzz: command lines run at once")
    parser.add_argument("--parts", default="fuzz,soak", help="fuzz, soak or both")
    parser.add_argument("--runs", type=int, default=30, help="soak: runs submitted")
    parser.add_argument("--mean-gap-s", type=float, default=45.0, help="soak: mean seconds between faults")
    parser.add_argument("--size", default="small", help="soak: the size of the ResNet-50 each run measures")
    args = parser.parse_args()
    parts = [p for p in ("fuzz", "soak") if p in args.parts.split(",")]
    ok = True
    with recorded(RESULTS / "soak.json", model_sizes=[f"resnet50 {args.size}"]) as record:
        record.update(parts=parts)
        if "fuzz" in parts:
            started = time.monotonic()
            found = fuzz(args.seed, args.workers, progress=lambda line: print(line, flush=True))
            record.update(fuzz_seconds=round(time.monotonic() - started, 1), **found)
            print(
                f"fuzz: {found['inputs_tried']} inputs, {found['refused_in_one_line']} refused in one line, "
                f"{len(found['refused_in_more_lines'])} in more, {len(found['not_refused'])} not refused, "
                f"{found['tracebacks']} tracebacks, {len(found['wrote_files'])} wrote files"
            )
            ok &= found["tracebacks"] == 0 and not found["not_refused"]
        if "soak" in parts:
            started = time.monotonic()
            soaked = soak(
                args.runs, args.seed, args.mean_gap_s, size=args.size, progress=lambda line: print(line, flush=True)
            )
            record.update(soak_seconds=round(time.monotonic() - started, 1), **soaked)
            print(
                f"soak: {soaked['runs_submitted']} runs, {soaked['completed']} completed, {soaked['failed_cleanly']} "
                f"failed cleanly, {soaked['lost_runs']} lost, {soaked['lost_points']} points lost, "
                f"{len(soaked['leftovers'])} leftovers, {len(soaked['faults'])} faults"
            )
            ok &= soaked["lost_runs"] == 0 and soaked["lost_points"] == 0 and not soaked["leftovers"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
