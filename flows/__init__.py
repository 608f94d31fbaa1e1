"""Thin Prefect flows: wiring only."""

from tbench.settings import configure_prefect_env

configure_prefect_env()
