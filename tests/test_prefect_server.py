"""The stack's Prefect server on SQLite: a transaction that reads, then writes after another connection committed,
fails at once as Prefect ships it ("database is locked", a 503 the UI does not retry) and waits its turn with
tbench.team.prefect_server's patch. Prefect's own database configuration on a file of this test's."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest
import sqlalchemy
from prefect.server.database.configurations import AioSqliteConfiguration

from tbench.team import prefect_server


def write_beside(path: str, errors: list) -> None:
    """Another connection (a worker's poll) inserts a row and commits, waiting up to 10 s for the write lock."""
    try:
        with sqlite3.connect(path, timeout=10) as other:
            other.execute("INSERT INTO t VALUES (2)")
    except sqlite3.Error as e:
        errors.append(e)


async def read_then_write(path: str) -> list:
    """A Prefect transaction reads (the request's snapshot), another connection writes meanwhile, then it writes."""
    config = AioSqliteConfiguration(connection_url=f"sqlite+aiosqlite:///{path}")
    engine = await config.engine()
    errors: list = []
    other = threading.Thread(target=write_beside, args=(path, errors))
    try:
        async with await config.session(engine) as session, config.begin_transaction(session):
            await session.execute(sqlalchemy.text("SELECT count(*) FROM t"))
            other.start()
            await asyncio.sleep(0.5)  # the other connection commits here unless this transaction holds the lock
            await session.execute(sqlalchemy.text("INSERT INTO t VALUES (1)"))
    finally:
        other.join()
        await engine.dispose()
    return errors


@pytest.fixture
def database(tmp_path, monkeypatch):
    monkeypatch.setattr(AioSqliteConfiguration, "begin_transaction", AioSqliteConfiguration.begin_transaction)
    path = str(tmp_path / "prefect.db")
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE t (x INTEGER)")
    return path


def rows(path: str) -> list[int]:
    with sqlite3.connect(path) as db:
        return sorted(x for (x,) in db.execute("SELECT x FROM t"))


def test_as_shipped_a_read_then_write_fails_at_once_after_another_commit(database):
    with pytest.raises(sqlalchemy.exc.OperationalError, match="database is locked"):
        asyncio.run(read_then_write(database))
    assert rows(database) == [2]  # the other connection's row only


def test_with_immediate_transactions_the_other_writer_waits_and_both_rows_land(database):
    prefect_server.immediate_sqlite_transactions()
    prefect_server.immediate_sqlite_transactions()  # a second call wraps nothing twice
    assert asyncio.run(read_then_write(database)) == []
    assert rows(database) == [1, 2]
