"""What every command shares: the error console, exit codes, the one error handler, the option parsers and the
progress display a flow run shows."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from tbench.core import progress
from tbench.core.errors import BenchError, ConfigError, error_line, validation_line
from tbench.stages.run_status import INTERRUPTED

console = Console(stderr=True, soft_wrap=True, emoji=False)  # "start:end:step" is not an emoji

# exit codes of `run`, `search`, `capacity` and `submit` (130: interrupted, tbench.node.interrupts.EXIT_INTERRUPTED)
EXIT_FAILED, EXIT_BAD_OPTIONS, EXIT_FAILED_POINTS = 1, 2, 3
EXIT_UNDETERMINED = 2  # a verdict the measurements could not decide (as tbench compare's and the history's)


@contextmanager
def cli_errors(
    exit_code: int, prefix: str = "", options: bool = False, also: tuple[type[BaseException], ...] = (), describe=str
):
    """The CLI's one error handler: an error a user can fix is one line, `error: PREFIX...`, and `exit_code`, never
    a traceback. Every BenchError shows its message; with `options` (the block builds the request from the options),
    a ValueError is pydantic's validation: 'invalid option: FIELD: MESSAGE'; `also` adds error types that `describe`
    turns into the line. Anything else is a bug and goes through with its traceback."""
    try:
        yield
    except Exception as err:
        if isinstance(err, BenchError):
            line = str(err)
        elif options and isinstance(err, ValueError):
            line = f"invalid option: {validation_line(err)}"
        elif isinstance(err, also):
            line = describe(err)
        else:
            raise
        console.print(f"[red]error:[/] {prefix}{line}")
        raise typer.Exit(exit_code) from None


def parse_int_list(text: str | None, what: str) -> list[int] | None:
    """'1,2,4' or a perf_analyzer-style inclusive range 'start:end[:step]', or both mixed: '1,2,4:16:4'."""
    if not text:
        return None
    values: list[int] = []
    try:
        for part in text.split(","):
            if ":" in part:
                start, end, *step = (int(x) for x in part.split(":"))
                span = range(start, end + 1, step[0] if step else 1)  # a step of 0 is a ValueError
                if start > end or not span:
                    raise ValueError
                values += span
            else:
                values.append(int(part))  # an empty item ("1,,2") is a ValueError too
    except ValueError:
        raise ConfigError(f"cannot read {what} {text!r}: use '1,2,4' or 'start:end:step' (start <= end)") from None
    return values


def parse_float_list(text: str | None, what: str) -> list[float] | None:
    if not text:
        return None
    try:
        return [float(p) for p in text.split(",")]  # an empty item ("10,,20") is a ValueError
    except ValueError:
        raise ConfigError(f"cannot read {what} {text!r}: use '10,20,40'") from None


def parse_named(values: list[str] | None, what: str, convert) -> dict | None:
    """Repeated NAME:VALUE options (the name may itself hold colons, as TF tensor names can): {name: convert(value)}."""
    if not values:
        return None
    parsed = {}
    for item in values:
        name, sep, value = item.rpartition(":")
        if not sep or not name or not value:
            raise ConfigError(f"cannot read {what} {item!r}: use NAME:VALUE")
        try:
            parsed[name] = convert(value)
        except ValueError:
            raise ConfigError(f"cannot read {what} {item!r}") from None
    return parsed


def parse_job_variables(text: str | None) -> dict | None:
    """A JSON object of the pool's job variables (image, volumes, env...) for one run."""
    if not text:
        return None
    import json

    try:
        parsed = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"cannot read the job variables: {err}") from None
    if not isinstance(parsed, dict):
        raise ConfigError('the job variables must be a JSON object, e.g. \'{"image": "NAME:TAG"}\'')
    return parsed


def parse_options(values: list[str] | None) -> dict | None:
    """Repeated NAME=VALUE model options; numbers become numbers."""
    if not values:
        return None
    parsed = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ConfigError(f"cannot read option {item!r}: use NAME=VALUE")
        try:
            parsed[name.strip()] = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            parsed[name.strip()] = value.strip()
    return parsed


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",")]


def _bounds(text: str) -> list[float]:
    low, high = text.split(",")  # anything but two numbers is a ValueError: parse_named says which option
    return [float(low), float(high)]


def _shape_range(text: str) -> list[list[int]]:
    """'16,128,512' or '80x16,80x128,80x512': an input's non-batch MIN,OPT,MAX shapes, dims joined by 'x'."""
    shapes = [[int(d) for d in part.split("x")] for part in text.split(",")]
    if len(shapes) != 3:
        raise ValueError(text)  # parse_named says which option
    return shapes


def _given(**values) -> dict:
    """Only the options the user gave, so the request's own defaults apply to the rest."""
    return {k: v for k, v in values.items() if v is not None}


def _split(text: str | None) -> list[str] | None:
    """A comma-separated list; an empty item (",", "onnx,,ts-trace") is refused, not dropped."""
    if not text:
        return None
    items = [p.strip() for p in text.split(",")]
    if not all(items):
        raise ConfigError(f"cannot read {text!r}: an item of the list is empty (use 'a,b,c')")
    return items


def interrupted_line(err: BaseException, stage: str, stored: bool) -> str:
    """What an interrupt left, after "interrupted": before the store, the points measured so far; after it (the
    history's refresh), a stored run that is whole, whose manifest says so."""
    from tbench.node.interrupts import signal_name

    if stored:  # between the store and the history's end: the stage named may be the store's, which had ended
        return (
            f"by {signal_name(err)} after the run was stored: it is complete, every point kept; the model's history "
            "was not refreshed (its next run refreshes it)"
        )
    return f"by {signal_name(err)}{stage}; the server is stopped and every point measured so far is kept"


SWEEP_BAR, SEARCH_BAR = "perf_analyzer points", "configurations"


def window_line(point: str, window: int, throughput: float, spread_pct: float | None, band_pct: float | None) -> str:
    """The sweep bar's text while a point is measured: its newest window, and how close its last 3 are to the band."""
    line = f"{point}: window {window}, {throughput:.1f} infer/s"
    if spread_pct is not None and band_pct is not None:
        line += f", last 3 within {spread_pct:.1f}% (needs {band_pct:g}%)"
    return escape(line)


class RichProgress:
    """Listens to progress events: a line per stage, a bar over the perf_analyzer points."""

    def __init__(self, bar: Progress):
        self.bar = bar
        self.stage = self.sweep = None  # the running stage's bar; a search's configurations bar
        self.points = None  # a sweep's perf_analyzer points bar
        self.stage_name: str | None = None  # the stage running now: where an interrupt landed
        self.run_url: str | None = None
        self.status, self.detail = None, ""
        self.stored = False  # the run was stored before any stage failed: an interrupt after it (history) left it whole
        self.broken = False  # a stage ended failed or interrupted (the finish, store included, runs after it)

    def __call__(self, event: str, **data) -> None:
        from tbench.node.interrupts import interrupt_held

        with interrupt_held():  # a Ctrl-C as a line is printed is raised after it, or the line printed twice
            self._show(event, **data)

    def _show(self, event: str, **data) -> None:
        if event == "run_end":
            self.run_url, self.status, self.detail = data["url"], data["status"], data.get("detail", "")
            if self.status == INTERRUPTED:  # in a stage (named), or between two (none): the finish's store does not
                self.stage_name, self.stored = data.get("stage"), False  # make it whole
            else:
                self.stage_name = data.get("stage") or self.stage_name
        elif event == "lock_wait":
            self.bar.console.print(
                f"  [yellow]waiting[/] {data['waited_s']:.0f} s for the device lock: held by {data['holder']}"
            )
        elif event == "warning":
            self.bar.console.print(f"  [yellow]note[/] {escape(data['line'])}", highlight=False)
        elif event == "lock_reclaimed":
            self.bar.console.print(f"  [yellow]reclaimed[/] the device lock from {data['holder']} (its lease is stale)")
        elif event == "run_start":
            self.bar.console.print(f"run [bold]{data['run_id']}[/] in {data['run_dir']}")
        elif event == "stage_start":
            self.stage_name = data["stage"]
            self.stage = self.bar.add_task(f"{data['stage']}", total=None)
        elif event == "stage_end":
            if data["status"] != "completed":
                self.broken = True
            elif data["stage"] == "store" and not self.broken:
                self.stored = True
            self.bar.remove_task(self.stage)
            if data["status"] != "completed" and self.points is not None:  # a sweep cut short: its bar goes with it
                self.bar.remove_task(self.points)
                self.points = None
            mark = "[green]done[/]" if data["status"] == "completed" else f"[red]{data['status']}[/]"
            self.bar.console.print(f"  {data['stage']:<24} {mark} in {data['seconds']:.1f} s")
        elif event == "sweep_start":
            self.points = self.bar.add_task(SWEEP_BAR, total=data["total"])
        elif event == "point_window":  # on the bar of what measures the point: a sweep's, or a search's
            shown = self.points if self.points is not None else self.sweep
            if shown is not None:
                self.bar.update(shown, description=window_line(**data))
        elif event == "point_done":
            row = data["row"]
            self.bar.update(self.points, advance=1, description=SWEEP_BAR)
            tput = row.get("throughput_infer_per_s")
            what = (
                f"{tput:.1f} infer/s, p99 {row['p99_ms']:.2f} ms"
                if row["status"] == "ok"
                else f"[yellow]{row['status']}[/]: {row['error']}"
            )
            load = (
                f"rate {row['request_rate']:g}/s {row['request_distribution']}"
                if row.get("request_distribution")
                else f"concurrency {row['concurrency']}"
            )
            self.bar.console.print(f"    {row['scenario']} batch {row['batch_size']} {load}: {what}")
            if data["index"] == data["total"]:
                self.bar.remove_task(self.points)
                self.points = None
        elif event == "search_point":
            if self.sweep is None:
                self.sweep = self.bar.add_task(SEARCH_BAR, total=data["limit"])
            self.bar.update(self.sweep, completed=data["measured"], description=SEARCH_BAR)
            what = (
                f"{data['throughput']:.1f} infer/s, p99 {data['p99_ms']:.2f} ms"
                if data["status"] == "ok"
                else f"[yellow]{data['status']}[/]: {data['error']}"
            )
            again = f" (confirmation round {data['confirm_round']})" if data.get("confirm_round") else ""
            self.bar.console.print(f"    {data['key']}{again}: {what}")
        elif event == "rate_point":
            latency = f", latency {data['latency_ms']:.3g} ms" if data.get("latency_ms") is not None else ""
            why = f" ({data['reason']})" if data.get("reason") else ""
            self.bar.console.print(f"      rate {data['rate']:g}/s: {data['status']}{latency}{why}")


def _quiet_prefect(verbose: bool) -> None:
    """Without -v, Prefect's console logs stay off the terminal (tracebacks too: they still go to the run's
    logs/prefect.log). Set before anything imports Prefect (the preflight's node check does): its console handler
    reads this once."""
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")


def _run_with_progress(start_flow, done: str, verbose: bool = False, points_exit: bool = True) -> str:
    """Run a flow with a rich progress bar in the CLI's own Prefect API; print `done` (a file of the run folder) and the
    run folder. Every way a run can end is one line and an exit code: completed 0, completed with failed points 3,
    failed 1 (a BenchError's message, or the type and first line of anything else; the traceback is in the run's
    logs, and on the terminal with -v), interrupted 130 (Ctrl-C or SIGTERM)."""
    from tbench.node.interrupts import EXIT_INTERRUPTED, cli_signal_handlers, is_interrupt
    from tbench.team.prefect_api import prefect_api

    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    listener = None
    logging.raiseExceptions = False  # a log file on a full disk: the run's own error says so, not a logging traceback
    try:
        with cli_signal_handlers(), Progress(*columns, console=console, transient=True) as bar:
            listener = RichProgress(bar)
            progress.subscribe(listener)
            with prefect_api():
                url = start_flow()
    except BaseException as err:
        where = listener.run_url if listener else None
        stage = f" during {listener.stage_name}" if listener and listener.stage_name else ""
        stored = listener is not None and listener.stored
        if is_interrupt(err):
            console.print(f"[red]interrupted[/] {interrupted_line(err, stage, stored)}")
            code = EXIT_INTERRUPTED
        elif isinstance(err, BenchError):
            console.print(f"[red]error:[/] {err}")
            code = EXIT_FAILED
        else:  # a bug or an environment problem: one line here, the traceback in the run's logs (and here with -v)
            if verbose:
                console.print_exception()
            console.print(
                f"[red]error:[/] {type(err).__name__}{stage}: {error_line(err)}"
                + (f" (traceback: {where}/logs/prefect.log)" if where else "")
            )
            code = EXIT_FAILED
        if where:
            console.print(f"{'' if stored else 'partial '}results, logs and manifest: {where}")
        raise typer.Exit(code) from None
    finally:
        if listener:
            progress.unsubscribe(listener)
    console.print(f"[green]{done}:[/] {url}/{done}")
    if points_exit and listener.status == "completed_with_failures":
        console.print(f"[yellow]completed with failed points:[/] {listener.detail}")
        typer.echo(url)
        raise typer.Exit(EXIT_FAILED_POINTS)
    typer.echo(url)
    return url


def search_space(
    instances: str, max_batch_sizes: str, preferred: str, queue_delays_us: str, variants: str | None = None
):
    """The configuration grid from the command line's lists, as `search` and `capacity` both take them."""
    from tbench.search.strategies import SearchSpace

    return SearchSpace(
        instances=parse_int_list(instances, "instances"),
        max_batch_sizes=parse_int_list(max_batch_sizes, "max batch sizes"),
        preferred=[_preferred_choice(item) for item in _split(preferred) or []],
        queue_delays_us=parse_int_list(queue_delays_us, "queue delays"),
        formats=_split(variants) or [""],
    )


def _preferred_choice(item: str) -> str | list[int]:
    """One choice of --preferred: a rule by name (none, max, half, quarter), or sizes joined by '+' (4, 4+8)."""
    sizes = item.split("+")
    return [int(s) for s in sizes] if all(s.isdigit() for s in sizes) else item


def model_fields(model, model_file, served_model, repository=None, repository_model=None) -> dict:
    """The request fields naming what to measure: an adapter (`model`, resnet50 by default), a model file, a served
    model, or a model of the user's repository (`--repository DIR --model NAME`, or the positional MODEL with
    --repository); one line where none is named or the names disagree. The model file's own fields come from
    `model_file_fields`."""
    if repository_model and not repository:
        raise ConfigError("--model NAME[:VERSION] names a model of --repository DIR; give --repository too")
    if repository:
        if model and repository_model and model != repository_model:
            raise ConfigError(f"--repository: the model is {model!r} or {repository_model!r}? Name it once")
        return {"repository": repository, "repository_model": repository_model or model}
    if not model and not model_file and not served_model:
        raise ConfigError(
            "name a model (see `tbench models`), give --model-file PATH or --served-model NAME with --server-url, "
            "or --repository DIR --model NAME"
        )
    if served_model:
        return {"served_model": served_model, **_given(model=model)}
    return {"model": model or "resnet50"}


def model_file_fields(model_file, shape, value_range, input_data) -> dict:
    """The request fields of a model file and its input options: the same on every command that measures a model."""
    return dict(
        model_file=model_file,
        shapes=parse_named(shape, "shape", _dims),
        input_data=input_data,
        value_ranges=parse_named(value_range, "--value-range (NAME:LO,HI)", _bounds),
    )
