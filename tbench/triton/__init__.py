"""Triton Inference Server: model configs, repositories, server modes, monitoring."""
