"""The local stack on PostgreSQL, as a team's shared Prefect server runs: `tbench stack up` with the database URL in
its environment, against a real PostgreSQL server this session starts; a run submitted, picked up by the worker,
stored in S3 and queried back, as the SQLite stack test does; Prefect's state is in PostgreSQL, and the password is
nowhere but the server's environment."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest
from test_stack_e2e import SMALL_RUN, TBENCH

from tbench.node.ports import free_port

ONE_POINT = [*SMALL_RUN, "--scenarios", "offline", "--batch-sizes", "4"]  # stored and queried back: one is enough

pytestmark = pytest.mark.e2e


def flow_runs_in(url: str) -> int:
    """Flow runs in Prefect's table, read straight from PostgreSQL."""
    import asyncpg

    async def count() -> int:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return await conn.fetchval("SELECT count(*) FROM flow_run")
        finally:
            await conn.close()

    return asyncio.run(count())


def test_a_stack_on_postgresql_runs_stores_and_queries_back(postgres_url, tmp_path):
    folder, password = tmp_path / "stack", postgres_url.split(":")[2].split("@")[0]
    base = {**os.environ, "TBENCH_STACK_DATABASE_URL": postgres_url}
    up = subprocess.run(
        [TBENCH, "stack", "up", "--folder", str(folder), "--port", str(free_port()), "--pools", "cpu"],
        env=base,
        capture_output=True,
        text=True,
        timeout=900,
    )
    try:
        assert up.returncode == 0, (up.stdout + up.stderr)[-3000:]
        state = json.loads((folder / "stack.json").read_text())
        assert state["database"].startswith("postgresql+asyncpg://tbench:***@127.0.0.1:")
        client = {k: v for k, v in os.environ.items() if k != "TBENCH_STACK_DATABASE_URL"} | state["env"]

        done = subprocess.run(
            [TBENCH, "submit", *ONE_POINT, "--pool", "cpu"], env=client, capture_output=True, text=True, timeout=900
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0 and "state: Completed" in output, output[-3000:]
        report = next(line.split("report:", 1)[1].strip() for line in output.splitlines() if "report:" in line)
        assert report.startswith("s3://tbench/runs/resnet50-")
        results = subprocess.run(
            [TBENCH, "results", "--model", "resnet50"], env=client, capture_output=True, text=True, timeout=300
        )
        run_id = report.rsplit("/", 2)[-2]
        assert results.returncode == 0 and run_id in results.stdout, results.stdout + results.stderr

        assert flow_runs_in(postgres_url) >= 1  # the server's state is in PostgreSQL ...
        assert not list((folder / "prefect").glob("*.db"))  # ... and not in a SQLite file beside it
        written = [p for p in folder.rglob("*") if p.is_file()]
        assert written and not [p for p in written if password in p.read_text(errors="replace")]
        assert password not in up.stdout + up.stderr + output
    finally:
        down = subprocess.run(
            [TBENCH, "stack", "down", "--folder", str(folder)], env=base, capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stdout + down.stderr
