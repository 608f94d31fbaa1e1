"""This node: `tbench doctor` (what it can export, serve and measure) and `tbench models` (the model adapters)."""

from __future__ import annotations

import typer
from rich.console import Console

from tbench.cli.common import EXIT_FAILED, cli_errors, console


def doctor(
    json_output: bool = typer.Option(False, "--json", help="The report as JSON, for scripts."),
    image: bool = typer.Option(
        False,
        "--image",
        help="Also check what the GPU worker image must hold (CUDA builds, "
        "TensorRT at the image's version, the local server's backends); exit 1 if it "
        "lacks any.",
    ),
) -> None:
    """What this node can export (each converter's tools), serve (each server mode) and measure (perf_analyzer, GPUs,
    GPU metrics, CUDA in each framework); `tbench run` refuses what it lacks."""
    from rich.table import Table

    from tbench.planning.doctor import full_report, image_problems

    with cli_errors(EXIT_FAILED):
        report = full_report()
    if json_output:
        typer.echo(report.model_dump_json(indent=2))
    else:
        marks = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}
        table = Table("", "check", "ok", "detail", "where to get it", title=f"tbench doctor: {report.host}")
        for check in report.checks:
            table.add_row(check.area, check.name, marks[check.ok], check.detail, check.hint)
        Console(width=None if console.is_terminal else 200).print(table)
    if image and (problems := image_problems(report)):
        console.print(f"[red]error:[/] this image lacks what GPU runs need: {' | '.join(problems)}")
        raise typer.Exit(EXIT_FAILED)


def models() -> None:
    """List the registered model adapters and their frameworks."""
    import model_adapters

    for name in model_adapters.names():
        typer.echo(f"{name}\t{', '.join(model_adapters.frameworks(name))}")
