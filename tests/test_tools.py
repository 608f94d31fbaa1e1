"""Missing binaries are named with what to install."""

import importlib.util
import shutil
import sys

import pytest

from tbench.core.errors import PerfAnalyzerError, ServerStartError
from tbench.node import tools


def test_missing_embedded_server_says_which_wheel(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ServerStartError, match="install the nvidia-pytriton==0.7.0 wheel"):
        tools.pytriton_server_dir()


def test_missing_perf_analyzer_says_which_wheel(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(PerfAnalyzerError, match=r"tritonclient\[all\]==2.51.0"):
        tools.perf_analyzer_binary()


def test_perf_analyzer_env_links_the_libraries_it_needs():
    env = tools.perf_analyzer_env()
    link_dir = env["LD_LIBRARY_PATH"].split(":")[0]
    for soname in ("libb64.so.0d", "libcudart.so.12"):
        assert (tools.Path(link_dir) / soname).resolve().exists()
