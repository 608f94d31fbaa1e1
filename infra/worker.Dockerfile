# The GPU workers' image: NGC's Triton server (tritonserver with its native backends: TensorRT, ONNX Runtime,
# PyTorch, TensorFlow, python) with this project installed, so a flow run serves with `--server local` (TBENCH_SERVER)
# and measures with the perf_analyzer of the project's tritonclient wheel (the same 2.51 release as the server).
#
#   docker build -f infra/worker.Dockerfile -t tbench-worker:24.10 .
#
# The docker and kubernetes pool templates (infra/pools/) default to this tag; push it where your nodes pull from.
FROM nvcr.io/nvidia/tritonserver:24.10-py3

# The project's pins need Python 3.11 (the image has 3.10): uv brings a standalone 3.11 without touching the system's.
RUN pip install --no-cache-dir uv==0.9.* \
 && uv python install 3.11

WORKDIR /opt/tbench
COPY pyproject.toml README.md ./
COPY tbench tbench
COPY tasks tasks
COPY flows flows
COPY model_adapters model_adapters
COPY deployments deployments
RUN uv venv --python 3.11 /opt/tbench/.venv \
 && VIRTUAL_ENV=/opt/tbench/.venv uv pip install --no-cache -e . \
 && /opt/tbench/.venv/bin/python -c "import tbench, tritonclient, prefect"

ENV PATH=/opt/tbench/.venv/bin:/opt/tritonserver/bin:$PATH \
    TBENCH_SERVER=local \
    TBENCH_STAGING_DIR=/tmp/tbench-staging \
    DO_NOT_TRACK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false
# Workers in containers are started by the pool's worker (docker/kubernetes); a standalone worker is
#   docker run --gpus all --shm-size 8g -e PREFECT_API_URL=... tbench-worker:24.10 prefect worker start --pool a100
CMD ["prefect", "worker", "start", "--pool", "cpu"]
