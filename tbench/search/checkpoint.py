"""A search's checkpoint: a JSON-lines file, one line per measurement (a candidate's first, and its re-measurements in
confirmation rounds, tagged with the round), appended and fsync'ed as soon as it is measured."""

from __future__ import annotations

import os
from pathlib import Path

from tbench.search.objective import Observation


class Checkpoint:
    """A JSON-lines file, one Observation per measurement (a re-measurement carries its `confirm_round`), appended and
    fsync'ed after every measurement.
    `load()` reads it back; a last line cut short (the process was killed mid-write) is dropped from the file, a
    corrupt line elsewhere is an error (that is not what a kill leaves)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> list[Observation]:
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")  # the last item is what follows the final newline (empty when the file ends with one)
        observations: list[Observation] = []
        offset = good_end = 0  # good_end: the byte just past the last line that parsed
        for i, line in enumerate(lines):
            end = offset + len(line) + (1 if i < len(lines) - 1 else 0)
            if line.strip():
                try:
                    observations.append(Observation.model_validate_json(line))
                except ValueError:
                    if any(rest.strip() for rest in lines[i + 1 :]):
                        raise ValueError(
                            f"{self.path}: line {i + 1} is not an observation and is not the last line; "
                            "the checkpoint is corrupt"
                        ) from None
                    break  # a torn last line: keep what came before it
            good_end = offset = end
        if good_end < len(raw) or (good_end and not raw[:good_end].endswith(b"\n")):
            self._repair(raw[:good_end])
        return observations

    def _repair(self, good: bytes) -> None:
        """Drop a torn tail so the next append starts on a line of its own."""
        if good and not good.endswith(b"\n"):
            good += b"\n"
        with open(self.path, "r+b") as f:
            f.seek(0)
            f.write(good)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())

    def append(self, observation: Observation) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(observation.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
