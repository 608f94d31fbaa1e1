"""The fuzz's request forms (benchmarks/fuzz_inputs.py): the colocated and fleet forms are among them, and a refusal
is counted by the lines its message has, not assumed to be one."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fuzz_inputs  # noqa: E402


def test_every_colocated_and_fleet_form_is_refused_in_one_line(tmp_path):
    fx = fuzz_inputs.fixtures(tmp_path)
    cases = [c for c in fuzz_inputs.form_cases(random.Random(0), fx) if c[0] in ("colocated", "fleet")]
    assert {c[0] for c in cases} == {"colocated", "fleet"}
    outcomes = [fuzz_inputs.run_form(*case) for case in cases]
    assert not [o for o in outcomes if not (o.refused and o.lines == 1 and not o.traceback)]


def test_a_refusal_in_more_lines_is_counted_so(monkeypatch, tmp_path):
    from tbench.capacity import fleet_file
    from tbench.core.errors import ConfigError

    def refuse(path, prices=None):
        raise ConfigError("fleet file: two problems\n  models.0: bad\n\n  pools: none")

    monkeypatch.setattr(fleet_file, "load_fleet", refuse)
    outcome = fuzz_inputs.run_form("fleet", "two lines", {"fleet": str(tmp_path / "fleet.yaml")})
    assert outcome.refused and outcome.lines == 3 and outcome.first_line == "fleet file: two problems"
