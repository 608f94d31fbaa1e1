"""The stack's database password reaches the Prefect server's environment and nothing else: not stack.json, not the
printed environment, not the clients' environments, not an error message that quotes the server's log."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tbench.cli import app
from tbench.team import stack

URL = "postgresql+asyncpg://tbench:S3cr3t%40pw@db.example:5432/prefect"
PASSWORD = "S3cr3t"  # the decoded password is S3cr3t@pw: neither form may show


def a_stack(tmp_path, monkeypatch) -> stack.Stack:
    monkeypatch.setenv(stack.DATABASE_URL_ENV, URL)  # as a user would pass it
    return stack.Stack(root=tmp_path, database_url=URL, api_port=4999)


def test_stack_json_and_the_client_environments_hold_no_password(tmp_path, monkeypatch):
    s = a_stack(tmp_path, monkeypatch)
    s.save()
    text = (tmp_path / "stack.json").read_text()
    assert PASSWORD not in text
    assert json.loads(text)["database"] == "postgresql+asyncpg://tbench:***@db.example:5432/prefect"
    for env in (s.client_env(), s._env(), s._env(PREFECT_WORKER_QUERY_SECONDS="1")):
        assert not [k for k, v in env.items() if PASSWORD in v], "a client or worker environment carries the password"
    # only the server gets the real URL, and not through the variable it was read from
    server = s.server_env()
    assert server[stack.DATABASE_ENV] == URL and stack.DATABASE_URL_ENV not in server


def test_stack_env_prints_no_password_even_from_an_old_stack_json(tmp_path, monkeypatch):
    s = a_stack(tmp_path, monkeypatch)
    s.save()
    state = json.loads((tmp_path / "stack.json").read_text())
    state["env"][stack.DATABASE_ENV] = URL  # what the previous version saved
    (tmp_path / "stack.json").write_text(json.dumps(state))
    result = CliRunner().invoke(app, ["stack", "env", "--folder", str(tmp_path)])
    assert result.exit_code == 0 and f"export PREFECT_API_URL={s.api_url}" in result.output
    assert PASSWORD not in result.output


def test_masked_urls_and_redacted_messages():
    assert stack.masked_url(URL) == "postgresql+asyncpg://tbench:***@db.example:5432/prefect"
    assert stack.masked_url("sqlite+aiosqlite:////tmp/prefect.db") == "sqlite+aiosqlite:////tmp/prefect.db"
    assert stack.masked_url(None) is None
    # SQLAlchemy cannot parse it (a bad port): its own error would echo the string, so only the scheme shows
    assert stack.masked_url("postgresql://u:pw@host:port/db") == "postgresql://***"
    line = f"the Prefect server exited with 3: could not connect to {URL} (password S3cr3t@pw rejected)"
    redacted = stack.redact(line, URL)
    assert PASSWORD not in redacted and "tbench:***@db.example" in redacted
