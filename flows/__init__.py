"""Thin Prefect flows: wiring only."""

from tbench.core.settings import configure_prefect_env

configure_prefect_env()
