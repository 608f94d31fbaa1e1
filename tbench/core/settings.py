"""Environment defaults that must be set before Prefect is imported (a user's own values win)."""

from __future__ import annotations

import os
from pathlib import Path

PREFECT_DEFAULTS = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # a persistent home: the ephemeral API's database is migrated once, not on every run
    "PREFECT_HOME": str(Path.home() / ".cache" / "tbench" / "prefect"),
    # the ephemeral API takes ~15 s to start on 2 busy cores and ~45 s on a fresh database; 20 s is Prefect's default
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}


def configure_prefect_env() -> None:
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)  # Prefect makes one level only
