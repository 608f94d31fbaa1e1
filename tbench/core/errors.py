"""One exception tree: the CLI prints `str(err)` as one line and exits non-zero."""


class BenchError(Exception):
    """Base of every error a user can cause or fix; its message is one clear line."""

    stage: str | None = None


class ConfigError(BenchError):
    """The request is impossible (unknown model/format, batch above max, ...)."""


class ConversionError(BenchError):
    """Export or conversion of the model failed."""


class Unavailable(BenchError):
    """What a step needs (a tool, a GPU) is not on this machine; the message says where to run it."""


class RuntimeUnavailable(Unavailable):
    """An exported model's own runtime is not here (a TensorRT plan runs on a GPU node with TensorRT)."""


class CorrectnessError(BenchError):
    """An exported model disagrees with the framework model past the tolerance."""


class ServerStartError(BenchError):
    """The Triton server did not start, or a model did not load."""


class PerfAnalyzerError(BenchError):
    """perf_analyzer is missing or could not run at all."""


class AccuracyError(BenchError):
    """Accuracy through Triton could not be measured."""


class StorageError(BenchError):
    """The artifact store could not be written."""


def one_line(text: str | None, limit: int = 300) -> str:
    """Any text as one line (whitespace runs, newlines included, become one space), cut to `limit` with '...'."""
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def error_line(err: BaseException, limit: int = 300) -> str:
    """A framework's error as one line: its first (TorchScript's first line is a header; its cause is the last one)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    line = (
        lines[-1] if lines[0].startswith("The following operation failed in the TorchScript interpreter") else lines[0]
    )
    return line if len(line) <= limit else line[: limit - 3] + "..."


def validation_line(err: ValueError) -> str:
    """A pydantic error as one line: the field and pydantic's message (a validator's own, without pydantic's
    'Value error, ' prefix), not its 'N validation errors for X' header."""
    from pydantic import ValidationError

    if isinstance(err, ValidationError) and err.errors():
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = first["msg"].removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return str(err).splitlines()[0]
