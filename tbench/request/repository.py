"""A request to measure a model of the user's own Triton repository (`--repository DIR --model NAME[:VERSION]`):
which of a BenchmarkRequest's fields apply. The model is served with its config.pbtxt as written, so the fields that
export a model or write its config are refused in one line; the server is tbench's own (embedded, local or docker),
so its options apply. The sweep is a served model's (request/served.py: resolve_served)."""

from __future__ import annotations

from tbench.core.errors import ConfigError
from tbench.request.benchmark import BenchmarkRequest
from tbench.request.served import NOT_FOR_SERVED, SERVER_START_FIELDS
from tbench.request.server_options import check_server_options, cli_name

# the server's own options apply: tbench starts the server that serves the copy
NOT_FOR_REPOSITORY = tuple(f for f in NOT_FOR_SERVED if f not in (*SERVER_START_FIELDS, "model"))


def check_repository(request: BenchmarkRequest) -> BenchmarkRequest:
    """The request as a repository run reads it (its `model`: the model's name), or one line naming the option that
    does not apply."""
    if not request.repository_model:
        raise ConfigError("--repository needs the model to measure: --model NAME[:VERSION]")
    if request.served_model:
        raise ConfigError("--repository serves a copy of your repository; --served-model measures a running server's")
    given = request.model_fields_set
    for field in NOT_FOR_REPOSITORY:
        if field in given and getattr(request, field) not in (None, "fp32" if field == "precision" else None):
            raise ConfigError(
                f"{cli_name(field)} does not apply to --repository: the model is served with its own config.pbtxt "
                "as written (nothing is exported or configured)"
            )
    if request.server == "remote":
        raise ConfigError(
            "--repository serves a copy on a server tbench starts: --server embedded, local or docker, not remote"
        )
    check_server_options(request)
    name = request.repository_model.partition(":")[0]
    return request.model_copy(update={"model": name})
