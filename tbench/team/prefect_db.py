"""A new stack's Prefect database, set up once per Prefect version: a server's first start on an empty SQLite file
runs every migration and registers the block types (8.1 s of the server's CPU instead of 3.2-3.7 s, 8.8 s instead of
3.4-4.0 s to healthy, measured on this idle machine with Prefect 3.8.8), and each `tbench stack up` in a new folder did
it again. The first server that sets up a file leaves a copy of it (SQLite's backup: consistent while the server
writes), and a later new database starts as that copy, which the server finds up to date."""

from __future__ import annotations

import os
import shutil
import sqlite3
from contextlib import closing, suppress
from pathlib import Path

TEMPLATE_ENV = "TBENCH_PREFECT_DB_TEMPLATES"  # where the copies live (~/.cache/tbench/prefect-db by default)


def template(version: str | None = None) -> Path:
    """The set-up database of this Prefect version (which decides its migrations and block types)."""
    if version is None:
        from importlib.metadata import version as installed

        version = installed("prefect")
    root = Path(os.environ.get(TEMPLATE_ENV, Path.home() / ".cache" / "tbench" / "prefect-db"))
    return root / f"prefect-{version}.db"


def seed(db: Path, version: str | None = None) -> bool:
    """Start a database that does not exist yet as the set-up copy, when there is one; whether it did."""
    source = template(version)
    if db.exists() or not source.is_file():
        return False
    db.parent.mkdir(parents=True, exist_ok=True)
    partial = db.with_name(f".{db.name}.{os.getpid()}")
    try:
        shutil.copyfile(source, partial)
        partial.replace(db)  # a server that starts meanwhile sees no file or a whole one
    except OSError:  # a full disk: the server sets the database up itself, as without a copy
        _discard(partial)
        return False
    return True


def keep(db: Path, version: str | None = None) -> None:
    """Keep a copy of a database that a healthy server has just set up, unless one is kept already."""
    target = template(version)
    if target.is_file() or not db.is_file():
        return
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(db)) as source, closing(sqlite3.connect(partial)) as copy:
            source.backup(copy)
        partial.replace(target)
    except (OSError, sqlite3.Error):  # a cache, never the stack's failure: the next new stack migrates again
        _discard(partial)


def _discard(partial: Path) -> None:
    with suppress(OSError):  # also where its folder could not be made
        partial.unlink(missing_ok=True)
