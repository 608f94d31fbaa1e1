"""The options `tbench run`, `search` and `submit` share, declared once.

An option that sets a request field takes its help from that field's description in request/benchmark.py, so what a
field means is written in one place: the CLI, the Python API and Prefect's parameter form say the same. Where the
command line spells a value differently from the field (a list as '1,2,4'), a short note follows the description.
Defaults stay in each command's signature (a group's, ServerOptions' and WindowOptions', in its fields): `run` sends
every option, `submit` only the ones given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from tbench.request.benchmark import BenchmarkRequest
from tbench.request.measurement import MeasurementOverrides


def field_help(name: str, cli: str = "", model: type = BenchmarkRequest) -> str:
    """The description of `model`'s field `name`, then `cli`: how the command line writes it."""
    description = model.model_fields[name].description
    if not description:
        raise ValueError(f"{model.__name__}.{name} has no description to show as help")
    return f"{description} {cli}".strip()


def _measurement_help(name: str, cli: str = "") -> str:
    return field_help(name, cli, MeasurementOverrides)


_INT_LIST = "On the command line: 1,2,4,8 or an inclusive range start:end[:step], e.g. 1:8:1."
_LIST = "On the command line: comma-separated, e.g. {}."

# Positional model name of `search` and `submit` (`run`'s is optional: --model-file replaces it).
ModelName = Annotated[str, typer.Argument(help="Model adapter name (see `tbench models`).")]
# a model file (another team's export) and how to feed it: the same options on every command that measures a model
ModelOrFile = Annotated[
    str | None,
    typer.Argument(
        help="Model adapter name (see `tbench models`); not needed with --model-file; with --repository, the "
        "repository's model, NAME[:VERSION]."
    ),
]
ModelFile = Annotated[str | None, typer.Option("--model-file", help=field_help("model_file"))]
Shape = Annotated[
    list[str] | None,
    typer.Option(
        "--shape",
        help="--model-file, --served-model: an input's non-batch shape, NAME:D1,D2 (repeat per input); several "
        "shapes one after another sweep them (input_ids:64,128,256), inputs sharing the dim moving along.",
    ),
]
ValueRange = Annotated[
    list[str] | None,
    typer.Option(
        "--value-range",
        help="--model-file: an input's synthetic values in LO..HI, NAME:LO,HI (repeat per input); integers "
        "inclusive, floats uniform.",
    ),
]
InputData = Annotated[str | None, typer.Option("--input-data", help=field_help("input_data"))]
# a model of the user's own Triton repository: --repository DIR --model NAME[:VERSION]
Repository = Annotated[str | None, typer.Option("--repository", metavar="DIR", help=field_help("repository"))]
RepositoryModel = Annotated[
    str | None,
    typer.Option(
        "--model",
        metavar="NAME[:VERSION]",
        help=field_help("repository_model", "The positional MODEL names it too: `--repository DIR NAME`."),
    ),
]

# What to benchmark
Size = Annotated[str | None, typer.Option(help=field_help("size"))]
Framework = Annotated[str | None, typer.Option(help=field_help("framework"))]
Formats = Annotated[str | None, typer.Option(help=field_help("formats", _LIST.format("onnx,ts-trace")))]
PrecisionOpt = Annotated[str | None, typer.Option(help=field_help("precision"))]
BatchSizes = Annotated[str | None, typer.Option("--batch-sizes", help=field_help("batch_sizes", _INT_LIST))]
Concurrency = Annotated[str | None, typer.Option(help=field_help("concurrency", _INT_LIST))]
Scenarios = Annotated[str | None, typer.Option(help=field_help("scenarios", _LIST.format("offline,online")))]
Output = Annotated[str | None, typer.Option("--output", "-o", help=field_help("output"))]
Reuse = Annotated[bool, typer.Option("--reuse", help=field_help("reuse_measurements"))]

# Where it is served
Server = Annotated[str, typer.Option(help=field_help("server"))]
ServerUrl = Annotated[str | None, typer.Option(help=field_help("server_url"))]
ServedModel = Annotated[str | None, typer.Option("--served-model", help=field_help("served_model"))]
DockerImage = Annotated[str | None, typer.Option(help=field_help("docker_image"))]
Gpus = Annotated[str | None, typer.Option(help=field_help("gpus"))]
DockerNetwork = Annotated[str, typer.Option(help=field_help("docker_network"))]
DockerUlimit = Annotated[
    list[str] | None, typer.Option(help=field_help("docker_ulimits", "Repeat the option per ulimit; 'none' for none."))
]
HttpPort = Annotated[int | None, typer.Option(help=field_help("http_port"))]
GrpcPort = Annotated[int | None, typer.Option(help=field_help("grpc_port"))]

# How perf_analyzer measures (MeasurementOverrides: the profile's and the model's settings hold where not given)
WindowS = Annotated[
    float | None, typer.Option("--window-s", help=_measurement_help("window_s", "The profile's by default."))
]
Stability = Annotated[float | None, typer.Option(help=_measurement_help("stability_percentage"))]
MaxTrials = Annotated[int | None, typer.Option("--max-trials", help=_measurement_help("max_trials"))]


# The configuration grid of `search` and `capacity` (each command sets its own defaults)
def _space_help(name: str, cli: str = "") -> str:
    from tbench.search.strategies import SearchSpace

    return field_help(name, cli, SearchSpace)


Instances = Annotated[str, typer.Option(help=_space_help("instances", _INT_LIST))]
MaxBatchSizes = Annotated[str, typer.Option("--max-batch-sizes", help=_space_help("max_batch_sizes", _INT_LIST))]
Preferred = Annotated[
    str, typer.Option(help=_space_help("preferred", _LIST.format("none,max,4+8") + " Sizes of one choice: '+'."))
]
QueueDelaysUs = Annotated[str, typer.Option("--queue-delays-us", help=_space_help("queue_delays_us", _INT_LIST))]

# The terminal
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Also show Prefect's logs in the terminal.")]


def measurement_overrides(window_s: float | None = None, stability: float | None = None, max_trials: int | None = None):
    """The one way the CLI builds the request's measurement: only the fields the user set (a MeasurementOverrides),
    so the profile's and the model's settings hold for the others; None when none was set."""
    given = {
        k: v
        for k, v in {"window_s": window_s, "stability_percentage": stability, "max_trials": max_trials}.items()
        if v is not None
    }
    return MeasurementOverrides(**given) if given else None


@dataclass(frozen=True)
class ServerOptions:
    """Where a run's server is, as `run`, `search` and `capacity` all take it: --server, --server-url, the docker
    options and the ports (a group: tbench.cli.option_groups)."""

    server: Server = "embedded"
    server_url: ServerUrl = None
    docker_image: DockerImage = None
    gpus: Gpus = None
    docker_network: DockerNetwork = "host"
    docker_ulimit: DockerUlimit = None
    http_port: HttpPort = None
    grpc_port: GrpcPort = None

    def fields(self) -> dict:
        """The request's server fields."""
        return dict(
            server=self.server,
            server_url=self.server_url,
            docker_image=self.docker_image,
            gpus=self.gpus,
            docker_network=self.docker_network,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            # --docker-ulimit none: the empty list, which sets no ulimit at all
            docker_ulimits=None if not self.docker_ulimit else [u for u in self.docker_ulimit if u != "none"],
        )


@dataclass(frozen=True)
class WindowOptions:
    """How perf_analyzer's windows are sized and judged, as `run`, `search` and `submit` take it (a group:
    tbench.cli.option_groups)."""

    window_s: WindowS = None
    stability: Stability = None
    max_trials: MaxTrials = None

    def overrides(self):
        """The request's measurement: only the fields given (measurement_overrides)."""
        return measurement_overrides(self.window_s, self.stability, self.max_trials)
