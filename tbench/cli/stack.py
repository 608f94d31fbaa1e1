"""`tbench stack up|env|down`: the local stack (its sub-app is added to `tbench` in tbench/cli/__init__.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tbench.cli.common import EXIT_BAD_OPTIONS, EXIT_FAILED, _split, cli_errors, console
from tbench.core.errors import BenchError, ConfigError

stack_app = typer.Typer(
    help="The local stack: Prefect server, S3 endpoint (moto), pools, deployments and a cpu worker."
)
StackFolder = Annotated[str | None, typer.Option(help="The stack's folder (~/.cache/tbench/stack by default).")]


def _stack_dir(folder: str | None) -> Path:
    from tbench.team import stack

    return Path(folder) if folder else stack.DEFAULT_DIR


@stack_app.command("up")
def stack_up(
    folder: str = typer.Option(
        None, help="Where the stack keeps its database, logs and state (~/.cache/tbench/stack)."
    ),
    database_url: str = typer.Option(
        None,
        envvar="TBENCH_STACK_DATABASE_URL",
        help="PostgreSQL instead of SQLite: "
        "postgresql+asyncpg://user:pass@host/db. Better set TBENCH_STACK_DATABASE_URL (a "
        "command line is seen by ps and kept in shell history); only the Prefect server "
        "gets the password: stack.json and what is printed show the URL with ***.",
    ),
    port: int = typer.Option(4200, help="The Prefect server's port (its UI too)."),
    alert_webhook: str | None = typer.Option(
        None,
        envvar="TBENCH_ALERT_WEBHOOK",
        help="Post to this URL when a stored run makes a series regress (a Prefect automation on the "
        "tbench.history.regressed event, with a webhook block).",
    ),
    pools: str | None = typer.Option(
        None,
        help="Only these pools and their deployments, comma-separated; the cpu pool, which the stack's worker "
        "serves, always (--pools cpu comes up in seconds less). All pools by default.",
    ),
) -> None:
    """Start the stack and deploy; prints the environment a shell needs (also: tbench stack env)."""
    from tbench.team import stack
    from tbench.team.pools import unknown_pools

    selected = tuple(dict.fromkeys(["cpu", *(_split(pools) or [])])) if pools else ()
    with cli_errors(EXIT_BAD_OPTIONS):
        if error := unknown_pools(list(selected)):
            raise ConfigError(error)
    s = stack.Stack(
        root=_stack_dir(folder), database_url=database_url, api_port=port, pools=selected, alert_webhook=alert_webhook
    )
    with cli_errors(EXIT_FAILED):
        try:
            s.up()
        except BenchError:
            s.down()  # what did start stops again before the error is shown
            raise
    console.print(
        f"Prefect UI: {s.api_url[:-4]}   S3 endpoint: {s.s3.url}   artifacts: {s.artifact_root}"
        + (f"   database: {stack.masked_url(database_url)}" if database_url else "")
    )
    for key, value in s.client_env().items():
        typer.echo(f"export {key}={value}")


@stack_app.command("env")
def stack_env(folder: StackFolder = None) -> None:
    """Shell exports for the running stack: eval "$(tbench stack env)"."""
    from tbench.team import stack

    with cli_errors(EXIT_FAILED):
        state = stack.load_state(_stack_dir(folder))
    for key, value in state["env"].items():
        if key not in stack.SECRET_ENV:  # a stack.json from before the URL was kept out of it
            typer.echo(f"export {key}={value}")


@stack_app.command("down")
def stack_down(folder: StackFolder = None) -> None:
    """Stop the worker, the Prefect server and the S3 endpoint."""
    from tbench.team import stack

    with cli_errors(EXIT_FAILED):
        stopped = stack.down_from_state(_stack_dir(folder))
    console.print("stopped: " + ", ".join(stopped))
