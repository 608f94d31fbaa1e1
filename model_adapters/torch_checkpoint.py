"""Our PyTorch checkpoint format, shared by the PyTorch adapters: a state dict saved with torch.save, or
{"state_dict": ...}; a DataParallel `module.` prefix is dropped. Anything else is one clear ConfigError."""

from __future__ import annotations

import pickle

from tbench.core.errors import ConfigError


def load_checkpoint(module, path: str) -> None:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (
        OSError,
        RuntimeError,
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        KeyError,
    ) as err:  # what garbage raises
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"cannot read checkpoint {path}: {first}") from err
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ConfigError(f"checkpoint {path} is not a state dict (our format: torch.save(model.state_dict()))")
    state = {str(k).removeprefix("module."): v for k, v in state.items()}
    try:
        module.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError) as err:
        first = str(err).strip().splitlines()[0]
        raise ConfigError(f"checkpoint {path} does not fit this model: {first}") from err
