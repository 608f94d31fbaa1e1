"""`tbench`: start the benchmark flow from a terminal, with rich progress and one-line errors.

One module per group of commands: run.py (run), search.py (search, capacity), results.py (compare, results),
remote.py (submit, upload), stack.py (stack up|env|down), node.py (doctor, models); what they share is in common.py
and the options they share in options.py. This module makes the `tbench` app (`tbench.cli:app`, the console script)
and adds the commands to it in the order `tbench --help` lists them.
"""

from __future__ import annotations

import os

from tbench.core.settings import configure_prefect_env

# first, before typer, Prefect or any command module is imported: Prefect reads these settings when it is imported
configure_prefect_env()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up banner stays out of the CLI's output

import typer  # noqa: E402

from tbench.cli import colocate, fleet, node, remote, results, run, search, stack  # noqa: E402
from tbench.cli.common import (  # noqa: E402
    _dims,
    _shape_range,
    parse_int_list,
    parse_job_variables,
    parse_named,
    parse_options,
)

__all__ = [
    "app",
    # helpers the tests import from tbench.cli
    "_dims",
    "_shape_range",
    "parse_int_list",
    "parse_job_variables",
    "parse_named",
    "parse_options",
]

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Benchmark models on NVIDIA Triton Inference Server."
)
# in the order `tbench --help` lists them
app.command()(run.run)
app.command()(search.search)
app.command()(search.capacity)
app.command()(colocate.colocate)
app.command()(fleet.fleet)
app.command()(results.compare)
app.command()(remote.submit)
app.command()(remote.upload)
app.command()(results.results)
app.command()(results.history)
app.add_typer(stack.stack_app, name="stack")
app.command()(node.doctor)
app.command()(node.models)


def empty_option(argv: list[str]) -> str | None:
    """The first option given an empty value (`--profile ""` or `--profile=`): a typo or an unset shell variable,
    which the options would otherwise take as "not given"."""
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg.partition("=")
        if (sep and not value) or (not sep and i + 1 < len(argv) and argv[i + 1] == ""):
            return name
    return None


def main() -> None:
    """The `tbench` console script: the app, with its usage errors (a wrong type, an unknown option, a missing
    argument) in one line naming the fix, as every other refusal is; typer draws them as a multi-line panel. In a
    client install (no `node` extra), a command that reaches for the node's stack says so in one line too."""
    import sys

    from typer import rich_utils
    from typer._click import exceptions as usage  # typer's own click, whose exceptions its commands raise

    from tbench.cli.extras import missing_node_module, node_stack_line

    if option := empty_option(sys.argv[1:]):
        print(f"error: {option} is given an empty value: leave it out for its default", file=sys.stderr)
        sys.exit(2)
    try:
        code = app(standalone_mode=False)
    except usage.NoArgsIsHelpError as err:  # a bare `tbench` or `tbench stack`: the help, as typer shows it
        rich_utils.rich_format_error(err)
        sys.exit(err.exit_code)
    except usage.UsageError as err:
        command = err.ctx.command_path if err.ctx is not None else "tbench"
        print(f"error: {err.format_message()} (see '{command} --help')", file=sys.stderr)
        sys.exit(err.exit_code)
    except usage.ClickException as err:
        print(f"error: {err.format_message()}", file=sys.stderr)
        sys.exit(err.exit_code)
    except typer.Abort:  # typer's own (its click has none): Ctrl-C or end of input at a prompt
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    except (ModuleNotFoundError, FileNotFoundError) as err:  # run, search, capacity, doctor, stack up on a client
        if (missing := missing_node_module(err)) is None:
            raise
        print(node_stack_line(missing), file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
