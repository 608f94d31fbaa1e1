"""A new stack's database starts as the copy a first server set up (tbench.team.prefect_db)."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from tbench.team import prefect_db


@pytest.fixture(autouse=True)
def templates(tmp_path, monkeypatch):
    monkeypatch.setenv(prefect_db.TEMPLATE_ENV, str(tmp_path / "templates"))


def a_database(path, rows: int) -> None:
    with closing(sqlite3.connect(path)) as db:
        db.execute("create table block_type (name text)")
        db.executemany("insert into block_type values (?)", [(f"type-{i}",) for i in range(rows)])
        db.commit()


def rows(path) -> int:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("select count(*) from block_type").fetchone()[0]


def test_a_set_up_database_is_kept_once_and_seeds_new_ones_of_that_version_only(tmp_path):
    first = tmp_path / "stack-1" / "prefect.db"
    first.parent.mkdir()
    assert not prefect_db.seed(first, "3.8.8")  # nothing kept yet: the server sets it up itself
    a_database(first, rows=54)
    prefect_db.keep(first, "3.8.8")
    other = tmp_path / "other.db"
    a_database(other, rows=1)
    prefect_db.keep(other, "3.8.8")  # one is kept already: not replaced
    assert rows(prefect_db.template("3.8.8")) == 54

    second = tmp_path / "stack-2" / "prefect.db"
    assert prefect_db.seed(second, "3.8.8") and rows(second) == 54
    assert not prefect_db.seed(second, "3.8.8")  # an existing database is never replaced
    assert not prefect_db.seed(tmp_path / "stack-3" / "prefect.db", "3.9.0")  # another version migrates its own
    assert not list(tmp_path.rglob(".*.db.*"))  # no partial copy left


def test_the_copy_is_whole_while_its_server_writes(tmp_path):
    db = tmp_path / "prefect.db"
    a_database(db, rows=10)
    with closing(sqlite3.connect(db)) as writer:
        writer.execute("begin")
        writer.execute("insert into block_type values ('uncommitted')")
        prefect_db.keep(db, "3.8.8")
        writer.rollback()
    assert rows(prefect_db.template("3.8.8")) == 10


def test_a_copy_that_cannot_be_kept_or_made_is_no_error(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(prefect_db.TEMPLATE_ENV, str(blocked / "templates"))  # under a file: no folder can be made
    db = tmp_path / "prefect.db"
    a_database(db, rows=3)
    prefect_db.keep(db, "3.8.8")
    assert not prefect_db.template("3.8.8").exists() and rows(db) == 3
    assert not prefect_db.seed(tmp_path / "new" / "prefect.db", "3.8.8")
