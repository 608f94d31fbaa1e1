"""Runs an AOTInductor package on inputs in a process of its own: `python -m tbench.core.pt2_probe PACKAGE RUN.npz ...`
prints, as JSON, each run's outputs (dtype and shape).

A package's compiled kernels do not check their inputs, and a package declares no input dtypes: one fed a float where
it indexes an embedding can abort the process it runs in (a C++ `index out of bounds` in a kernel's worker thread,
past any `except`). Run here, such an abort ends this process only, and the caller (tbench.core.pt2_files) says which
input to give which dtype."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from tbench.core.pt2_files import PROBE_ERROR_MARK, load_package


def main(argv: list[str]) -> None:
    import torch

    path, *runs = argv
    model = load_package(Path(path))
    outputs = []
    for run in runs:
        with np.load(run) as data:
            arrays = [data[f"arr_{i}"] for i in range(len(data.files))]
        with torch.inference_mode():
            result = model(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        outputs.append([{"dtype": r.detach().cpu().numpy().dtype.name, "shape": list(r.shape)} for r in results])
    print(json.dumps(outputs))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception as err:  # one line for the caller: torch's errors go on with the C++ frames
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
        print(f"{PROBE_ERROR_MARK}{type(err).__name__}: {first}", file=sys.stderr)
        sys.exit(1)
