# The GPU workers' image: NGC's Triton server 24.10 (tritonserver 2.51 with its native backends: TensorRT, ONNX Runtime,
# PyTorch, TensorFlow, python; CUDA 12.6.2, TensorRT 10.5.0.18, ONNX Runtime 1.19.2) and this project in a Python 3.11
# virtual environment holding CUDA builds of what a GPU run does in its own process and in the embedded server:
#   - tensorrt at the image's TensorRT version: the trt export builds engines that Triton's tensorrt backend must load
#     (an engine loads only in the TensorRT it was built with);
#   - onnxruntime-gpu 1.19.2 in place of onnxruntime (the ONNX Runtime of the image's onnxruntime backend; its PyPI
#     wheels are CUDA 12 / cuDNN 9 builds since 1.19): the embedded server's python backend runs ONNX on the GPU;
#   - tensorflow 2.19.1 (the project's version, a CUDA build) in place of tensorflow-cpu: dlrm and dcnv2 put their
#     embedding tables on the GPU, the python backend runs SavedModels there; it finds CUDA and cuDNN in the image;
#   - torch 2.13.0 from TORCH_INDEX: PyPI's Linux wheel is a CUDA 13.0 build (driver R580 or later); on older drivers
#     give an index with a CUDA 12 build of torch 2.13.0, or torch sees no GPU (exports still work, on the CPU).
# TF-TRT is in no image of this project: TensorFlow >= 2.18 is built without TensorRT (infra/README.md).
#
#   docker build -f infra/worker.Dockerfile -t tbench-worker:24.10 .
#
# The build ends with `tbench doctor --image`, which fails it when one of the above is missing or a CPU build. It runs
# without a GPU: what needs one (CUDA devices, GPU metrics) is checked by every run's preflight, which refuses in one
# line what the node lacks, and by `tbench doctor` in a started container.
# The docker and kubernetes pool templates (infra/pools/) default to this tag; push it where your nodes pull from.
ARG TRITON_TAG=24.10-py3
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}

ARG TENSORRT_VERSION=10.5.0
ARG ONNXRUNTIME_GPU_VERSION=1.19.2
ARG TENSORFLOW_VERSION=2.19.1
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://pypi.org/simple

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
ENV VIRTUAL_ENV=/opt/tbench/.venv
# torch first, from its own index (its CUDA packages come from there too); the project then keeps that build
RUN uv venv --python 3.11 "$VIRTUAL_ENV" \
 && uv pip install --no-cache --index-url "$TORCH_INDEX" "torch==${TORCH_VERSION}" \
 && uv pip install --no-cache -e '.[node]' \
 && uv pip uninstall onnxruntime tensorflow-cpu \
 && uv pip install --no-cache "onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION}" "tensorflow==${TENSORFLOW_VERSION}" \
      "tensorrt==${TENSORRT_VERSION}"

ENV PATH=/opt/tbench/.venv/bin:/opt/tritonserver/bin:$PATH \
    TBENCH_SERVER=local \
    TBENCH_STAGING_DIR=/tmp/tbench-staging \
    TF_CPP_MIN_LOG_LEVEL=2 \
    DO_NOT_TRACK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false
RUN tbench doctor --image

# Workers in containers are started by the pool's worker (docker/kubernetes); a standalone worker is
#   docker run --gpus all --shm-size 8g -e PREFECT_API_URL=... tbench-worker:24.10 prefect worker start --pool a100
CMD ["prefect", "worker", "start", "--pool", "cpu"]
