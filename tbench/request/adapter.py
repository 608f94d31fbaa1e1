"""The model adapter a request names: a registered one, or one over a user's model file, fed the user's samples."""

from __future__ import annotations

from tbench.core.errors import ConfigError


def adapter_for(req):
    """The model adapter a request (a BenchmarkRequest or ResolvedRequest) names: a registered one, or one over a
    user's model file."""
    import model_adapters
    from tbench.core.handover import local_path  # a submitted file: fetched from the artifact store and checked

    if req.model_file:
        from model_adapters.file_model import ModelFileAdapter

        adapter = ModelFileAdapter(local_path(req.model_file), req.shapes, req.input_dtypes, req.value_ranges)
    else:
        if req.value_ranges:
            raise ConfigError(
                f"--value-range shapes a model file's synthetic data; model {req.model!r} makes its own "
                "(give --input-data PATH or --dataset DIR instead)"
            )
        adapter = model_adapters.get(
            req.model, req.size, req.checkpoint, req.framework, req.dataset, req.profile, req.model_options
        )
    if req.input_data:
        if req.dataset:
            raise ConfigError("give --dataset or --input-data, not both")
        adapter.use_input_data(local_path(req.input_data))
    return adapter


def adapter_notes(req) -> list[str]:
    """The model's own report lines (e.g. where an ensemble's embedding tables live); none when it cannot say."""
    try:
        return adapter_for(req).report_notes()
    except Exception as err:  # a report must not fail over a note
        return [f"(the model's notes could not be written: {err})", ""]
