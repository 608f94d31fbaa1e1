"""The search's request and plan are library code: the CLI checks a search with them before a run, without Prefect
or the flows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import sys
from tbench.request.benchmark import BenchmarkRequest
from tbench.search.plan import resume_checkpoint, search_context, variant_plan
from tbench.search.report import partial_result, write_search_files
from tbench.search.request import SearchRequest
from tbench.node.hardware import Hardware

space = {"instances": [1], "max_batch_sizes": [2, 4]}
search = SearchRequest.model_validate({"space": space, "objective": {"p99_budget_ms": 50}, "strategy": "exhaustive"})
req = BenchmarkRequest(model="resnet50", size="small").resolve(False)
plan = variant_plan(search.space, req, False)
machine = Hardware(cpu_model="cpu", cpu_cores=2, memory_gib=8.0, gpus=[], os="linux")
context = search_context(req, search, plan, machine)
assert resume_checkpoint(None, context) is None and context["space"]["max_batch_sizes"] == [2, 4]
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("prefect", "flows", "tasks"))
print(loaded)
"""


def test_search_request_and_plan_import_neither_prefect_nor_the_flows():
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
