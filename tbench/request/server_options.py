"""The options of one server mode: given with another mode they would be silently ignored, so a request that does is
refused in one line naming the mode; and the remote mode needs the server's address."""

from __future__ import annotations

from tbench.core.errors import ConfigError

# request field -> the only server mode that reads it
SERVER_MODE_OPTIONS = {
    "server_url": "remote",
    "docker_image": "docker",
    "gpus": "docker",
    "docker_ulimits": "docker",
    "tritonserver": "local",
    "backend_dir": "local",
}


def cli_name(field: str) -> str:
    return "--docker-ulimit" if field == "docker_ulimits" else "--" + field.replace("_", "-")


def check_server_options(request) -> None:
    """`request`: a BenchmarkRequest; only the fields its user set count (a default is no choice)."""
    for field, mode in SERVER_MODE_OPTIONS.items():
        if field in request.model_fields_set and getattr(request, field) is not None and request.server != mode:
            raise ConfigError(f"{cli_name(field)} is an option of --server {mode}, not of --server {request.server}")
    if request.server == "remote" and not request.server_url:
        raise ConfigError("--server remote needs the server's address: --server-url HOST:GRPC_PORT,HOST:HTTP_PORT")
