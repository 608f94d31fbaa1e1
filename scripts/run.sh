#!/usr/bin/env bash
# The main job: set up, then benchmark ResNet-50 (PyTorch, random weights) on this machine's CPU with the
# embedded Triton server. Extra arguments go to `tbench run`, e.g. ./scripts/run.sh --output s3://bucket/runs
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/tbench run resnet50 "$@"
