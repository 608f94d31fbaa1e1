"""`tbench colocate`: several models on one server, each under its own load, measured alone and together."""

from __future__ import annotations

import typer

from tbench.cli.common import EXIT_BAD_OPTIONS, _given, _quiet_prefect, _run_with_progress, cli_errors
from tbench.cli.options import GrpcPort, HttpPort, Output, Server, Stability, Verbose, WindowS, measurement_overrides
from tbench.planning.preflight import preflight
from tbench.request.colocated import LOAD_SYNTAX, ColocatedRequest, parse_load
from tbench.team.prefect_api import start_early


def colocate(
    load: list[str] = typer.Option(..., "--load", help=f"A model and its load, once per model: {LOAD_SYNTAX}."),
    repository: list[str] = typer.Option(
        None,
        "--repository",
        help="A Triton model repository to serve on this machine (repeat: their models are served together), e.g. "
        "a run folder's model_repository.",
    ),
    server_url: str = typer.Option(
        None, help="Or a running server that serves the models: 'host:grpc_port,host:http_port'."
    ),
    alone: bool = typer.Option(True, help="Measure each model alone first (the interference is the difference)."),
    percentile: int = typer.Option(99, help="The latency percentile reported and held to each SLO: 50, 90, 95, 99."),
    output: Output = None,
    server: Server = "embedded",
    http_port: HttpPort = None,
    grpc_port: GrpcPort = None,
    window_s: WindowS = None,
    stability: Stability = None,
    verbose: Verbose = False,
) -> None:
    """Several models on one server, each under its own load (a Poisson rate or a concurrency): each alone, then all
    together over the same span; prints the run folder, whose colocated.md has the interference."""
    _quiet_prefect(verbose)
    with cli_errors(EXIT_BAD_OPTIONS, options=True):
        request = ColocatedRequest(
            loads=[parse_load(text) for text in load],
            server_url=server_url,
            repositories=repository or [],
            alone=alone,
            percentile=percentile,
            measurement=measurement_overrides(window_s, stability, None),
            http_port=http_port,
            grpc_port=grpc_port,
            **_given(output=output, server=None if server_url else server),
        )
        preflight(request)  # ports, the output root, this node's server: before anything starts
    start_early()
    from flows.colocated import colocated_flow

    _run_with_progress(lambda: colocated_flow(request), "colocated.md", verbose)
