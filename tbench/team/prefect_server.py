"""`prefect server start` for the stack and the CLI's private API, with SQLite write transactions that wait their turn.

Prefect begins its write transactions DEFERRED on SQLite: a request reads first (the deployment and its parameter
schema, for "create a flow run"), then writes. When another connection commits in between (a worker's poll, the event
persister), SQLite cannot turn the reader into a writer and fails at once, without consulting the busy timeout, and the
API answers 503. Prefect's Python client retries a 503; the UI does not, so a "Submit" in the UI's run form failed with
"Oops. Something went wrong." (4 of 150 submissions with one core busy: benchmarks/ui_submissions.py). BEGIN
IMMEDIATE takes the write lock when the transaction begins, so a concurrent writer makes it wait (Prefect's busy
timeout, 60 s) instead of failing. Upstream: PrefectHQ/prefect#9594. PostgreSQL is not concerned (its configuration is
another class).

Run as `python -m tbench.team.prefect_server server start ...` (the arguments of `prefect`)."""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from pathlib import Path


def immediate_sqlite_transactions() -> None:
    """Every transaction Prefect begins on SQLite is IMMEDIATE (what it asks for only `with_for_update`)."""
    from prefect.server.database.configurations import AioSqliteConfiguration

    deferred = AioSqliteConfiguration.begin_transaction
    if getattr(deferred, "tbench_immediate", False):
        return

    @asynccontextmanager
    async def begin_transaction(self, session, with_for_update: bool = False):
        async with deferred(self, session, with_for_update=True) as transaction:
            yield transaction

    begin_transaction.tbench_immediate = True
    AioSqliteConfiguration.begin_transaction = begin_transaction


def argv(*args: str) -> list[str]:
    """The command line that runs `prefect *args` with the patch, in this environment's Python."""
    return [str(Path(sys.executable)), "-m", __name__, *args]


def main() -> int | None:
    immediate_sqlite_transactions()
    from prefect.cli import app

    return app()


if __name__ == "__main__":
    sys.exit(main())
