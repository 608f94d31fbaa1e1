"""`tbench fleet`: which models share a node, and how many nodes of which pool, at the least cost."""

from __future__ import annotations

import os

import typer

from tbench.capacity.request import FleetRequest
from tbench.cli.common import EXIT_BAD_OPTIONS, _given, _quiet_prefect, _run_with_progress, cli_errors
from tbench.cli.options import GrpcPort, HttpPort, Output, Server, Verbose, WindowS, field_help
from tbench.core.errors import ConfigError
from tbench.planning.preflight import preflight
from tbench.team.prefect_api import start_early


def fleet(
    fleet_file: str = typer.Argument(..., metavar="FLEET", help="The fleet file (YAML or JSON); see the docs."),
    prices: str = typer.Option(None, help="Price table CSV for pools the fleet file does not price."),
    confirm: bool = typer.Option(True, help="Measure each shared node of this machine's pool before reporting it."),
    rounds: int = typer.Option(4, help="Plans tried at most: a packing that fails its measurement is planned around."),
    pool: str = typer.Option(None, help="This machine's pool; from the worker's pool or its GPU by default."),
    fan_out: bool = typer.Option(
        False, "--fan-out", help=field_help("fan_out", model=FleetRequest) + " Needs PREFECT_API_URL."
    ),
    output: Output = None,
    server: Server = "embedded",
    http_port: HttpPort = None,
    grpc_port: GrpcPort = None,
    window_s: WindowS = None,
    verbose: Verbose = False,
) -> None:
    """The cheapest assignment of a fleet's models to nodes (which share a node, how many nodes of which pool) under
    which every model keeps its SLO, each shared node of this machine's pool confirmed by measuring its models
    together; prints the run folder, whose fleet.md has the plan."""
    _quiet_prefect(verbose)
    from tbench.capacity.fleet_file import load_fleet

    with cli_errors(EXIT_BAD_OPTIONS, options=True):
        request = FleetRequest(
            fleet=fleet_file,
            prices=prices,
            confirm=confirm,
            rounds=rounds,
            pool=pool,
            fan_out=fan_out,
            server=server,
            window_s=window_s,
            http_port=http_port,
            grpc_port=grpc_port,
            **_given(output=output),
        )
        load_fleet(request.fleet, request.prices)  # a fleet file with a mistake fails here, in one line
        if fan_out and not os.environ.get("PREFECT_API_URL"):
            raise ConfigError(
                "--fan-out runs through the pools' deployments: set PREFECT_API_URL (e.g. `tbench stack env`)"
            )
        preflight(request)
    start_early()
    from flows.fleet import fleet_flow

    _run_with_progress(lambda: fleet_flow(request), "fleet.md", verbose)
