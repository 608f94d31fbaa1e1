"""One exception tree: the CLI prints `str(err)` as one line and exits non-zero."""


class BenchError(Exception):
    """Base of every error a user can cause or fix; its message is one clear line."""

    stage: str | None = None


class ConfigError(BenchError):
    """The request is impossible (unknown model/format, batch above max, ...)."""


class ConversionError(BenchError):
    """Export or conversion of the model failed."""


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
