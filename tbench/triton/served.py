"""A model someone else already serves (`tbench run --server-url ... --served-model NAME[:VERSION]`), measured where it
is: its inputs, shapes and batching are read from the server's model config, and nothing is loaded, unloaded or
changed, so it works with a server in any model-control mode and leaves it as it found it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.enums import Format
from tbench.core.errors import ConfigError, ServerStartError
from tbench.core.iospec import _TRITON_DTYPES, IoSpec, TensorSpec
from tbench.core.onnx_graph import onnx_file_table_rows
from tbench.triton.server import ServerEndpoints, TritonServer, one_line

_NUMPY_DTYPES = {triton: numpy for numpy, triton in _TRITON_DTYPES.items()} | {"STRING": "object"}

# the format a config's platform or backend serves, in the results' vocabulary; others (python, openvino, ...) are
# named by their backend
_FORMATS = {
    "onnxruntime_onnx": Format.ONNX,
    "onnxruntime": Format.ONNX,
    "pytorch_libtorch": Format.TS_SCRIPT,
    "torch_aoti": Format.PT2,
    "pytorch": Format.TS_SCRIPT,
    "tensorflow_savedmodel": Format.TF_SAVEDMODEL,
    "tensorflow": Format.TF_SAVEDMODEL,
    "tensorrt_plan": Format.TRT,
    "tensorrt": Format.TRT,
    "ensemble": Format.ENSEMBLE,
}


def config_format(config: mc.ModelConfig) -> Format | None:
    """The format a config's platform or backend serves, where tbench knows it."""
    return _FORMATS.get(config.platform) or _FORMATS.get(config.backend)


def parse_served_model(value: str) -> tuple[str, str]:
    """NAME[:VERSION] -> (name, version); version "" is the server's choice (its newest ready version)."""
    name, _, version = value.strip().partition(":")
    if not name or (version and not version.isdigit()):
        raise ConfigError(f"--served-model {value!r} is not NAME or NAME:VERSION (a version is a number)")
    return name, version


def split_server_url(url: str) -> tuple[str, str]:
    """HOST:GRPC_PORT[,HOST:HTTP_PORT] -> (grpc_url, http_url)."""
    grpc_url, _, http_url = url.partition(",")
    return grpc_url.strip(), (http_url or grpc_url).strip()


@dataclass(frozen=True)
class ServedModel:
    """A model as its server serves it: its config and the io spec read from it."""

    name: str
    version: str  # the version measured (the newest ready one unless the user named one)
    config: mc.ModelConfig

    @property
    def batching(self) -> bool:
        return self.config.max_batch_size > 0

    @property
    def dynamic_max_batch(self) -> int:
        """The largest batch its dynamic batcher may form; 0 without one."""
        return self.config.max_batch_size if self.config.HasField("dynamic_batching") else 0

    @property
    def io_spec(self) -> IoSpec:
        """Inputs and outputs as clients send and get them (dims without the batch axis when the model batches)."""
        return IoSpec(
            inputs=[_tensor(t, "input", self.name) for t in self.config.input],
            outputs=[_tensor(t, "output", self.name) for t in self.config.output],
        )

    @property
    def kind(self) -> str:
        """What serves it: its platform or backend."""
        return self.config.platform or self.config.backend or "unknown"

    @property
    def known_format(self) -> Format | None:
        """The format its platform or backend serves, where tbench knows it."""
        return config_format(self.config)

    @property
    def format(self) -> str:
        """The results' format: the one its backend serves where tbench knows it, else the backend's name."""
        return self.known_format.value if self.known_format else self.kind

    @property
    def model_format(self) -> str:
        return self.known_format.label if self.known_format else f"{self.kind} backend"

    @property
    def queue_delay_us(self) -> int | None:
        """The dynamic batcher's max queue delay; None without a dynamic batcher."""
        if not self.config.HasField("dynamic_batching"):
            return None
        return int(self.config.dynamic_batching.max_queue_delay_microseconds)

    @property
    def instances(self) -> int:
        return sum(g.count or 1 for g in self.config.instance_group) or 1

    def config_json(self) -> dict:
        return json_format.MessageToDict(self.config, preserving_proto_field_name=True)

    def table_rows(self, repository: Path | None) -> dict[str, int]:
        """Where its repository is at hand and holds its ONNX file, the rows of the embedding tables its integer
        inputs index, so their synthetic values stay in range as a model file's do; {} otherwise (a model served
        elsewhere, another format)."""
        if repository is None:
            return {}
        folder = Path(repository) / self.name / self.version
        parameters = self.config.parameters  # read with `in`: indexing a protobuf map adds the key to the config
        runtime_file = parameters["model_file"].string_value if "model_file" in parameters else ""
        names = [runtime_file, self.config.default_model_filename, "model.onnx"]
        path = next((folder / n for n in names if n.endswith(".onnx") and (folder / n).is_file()), None)
        ints = [t.name for t in self.io_spec.inputs if t.np_dtype.kind in "iu"]
        return onnx_file_table_rows(path, ints) if path is not None and ints else {}


def _tensor(t, what: str, model: str) -> TensorSpec:
    triton = mc.DataType.Name(t.data_type).removeprefix("TYPE_")
    if triton not in _NUMPY_DTYPES:
        raise ConfigError(
            f"served model {model!r}: {what} {t.name!r} is {triton}, which tbench cannot send yet "
            f"(it sends {', '.join(sorted(_NUMPY_DTYPES))})"
        )
    return TensorSpec(name=t.name, dtype=_NUMPY_DTYPES[triton], shape=[int(d) for d in t.dims])


def read_served_model(grpc_url: str, name: str, version: str = "") -> ServedModel:
    """The model's config as its server serves it, once the server says the model (version) is ready; one line
    naming what to fix otherwise. Asks only: nothing is loaded."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        try:
            live = client.is_server_live(client_timeout=10)
        except InferenceServerException as err:
            raise ServerStartError(f"no Triton answers at {grpc_url}: {one_line(err.message() or '')}") from None
        if not live:
            raise ServerStartError(f"the Triton at {grpc_url} is not live")
        index = client.get_model_repository_index(as_json=True).get("models", [])
        states = [m for m in index if m.get("name") == name]
        if not client.is_model_ready(name, version):
            if not states:
                known = ", ".join(sorted({m.get("name", "") for m in index})) or "none"
                raise ConfigError(f"the Triton at {grpc_url} serves no model {name!r}; it has: {known}")
            said = "; ".join(
                f"version {m.get('version', '?')} {m.get('state', '?')}"
                + (f" ({m['reason']})" if m.get("reason") else "")
                for m in states
            )
            which = f"{name!r} version {version}" if version else repr(name)
            raise ConfigError(f"served model {which} is not ready on {grpc_url} ({said}); tbench loads nothing")
        if not version:  # the newest ready version: what a request without a version reaches
            ready = [int(m["version"]) for m in states if m.get("state") == "READY" and str(m.get("version")).isdigit()]
            version = str(max(ready)) if ready else ""
        config = client.get_model_config(name, version).config
    finally:
        client.close()
    return ServedModel(name=name, version=version, config=config)


def serving_instances(grpc_url: str, name: str) -> int | None:
    """How many instances serve a model, from the config the server has for it: each group's count, on every GPU it
    lists (a KIND_GPU group that lists none runs on every GPU the server sees, which it does not say: counted once, a
    lower bound, so a load estimated from it errs high). None for a model without instances of its own (an ensemble)
    or a server that does not answer."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        with grpcclient.InferenceServerClient(grpc_url) as client:
            config = client.get_model_config(name, client_timeout=10).config
    except InferenceServerException:
        return None
    if config.platform == "ensemble" or not config.instance_group:
        return None
    return sum(max(1, g.count) * max(1, len(g.gpus)) for g in config.instance_group)


def served_infer(grpc_url: str, served: ServedModel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One batch through the served model (split into requests of at most its max_batch_size): its outputs, so the
    shared-memory regions fit them. A request the model refuses is one line naming it."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    spec = served.io_spec
    rows = len(next(iter(inputs.values()))) if served.batching else 1
    step = served.config.max_batch_size if served.batching else 1
    client = grpcclient.InferenceServerClient(grpc_url)
    parts: dict[str, list[np.ndarray]] = {t.name: [] for t in spec.outputs}
    try:
        for start in range(0, rows, step):
            chunk = {n: a[start : start + step] for n, a in inputs.items()} if served.batching else inputs
            request = []
            for n, a in chunk.items():
                tensor = grpcclient.InferInput(n, list(a.shape), np_to_triton_dtype(a.dtype))
                tensor.set_data_from_numpy(np.ascontiguousarray(a))
                request.append(tensor)
            try:
                result = client.infer(served.name, request, model_version=served.version, client_timeout=120)
            except InferenceServerException as err:
                raise ConfigError(
                    f"served model {served.name!r} refused a sample request: {one_line(err.message() or '')}; "
                    "check --shape, --value-range or give --input-data PATH"
                ) from None
            for t in spec.outputs:
                parts[t.name].append(result.as_numpy(t.name))
    finally:
        client.close()
    return {n: np.concatenate(p) if served.batching else p[0] for n, p in parts.items()}


class ServedServer(TritonServer):
    """The server of a served model, as the pipeline's server: started means "answers", stopped means "left alone".
    It refuses every load, so no stage can change what it serves."""

    mode = "served"

    def __init__(self, url: str, log_path: Path):
        super().__init__(Path("/nonexistent"), log_path)
        grpc_url, http_url = split_server_url(url)
        self._endpoints = ServerEndpoints(http_url=http_url, grpc_url=grpc_url, metrics_url="")

    @property
    def endpoints(self) -> ServerEndpoints:
        return self._endpoints

    def where(self) -> dict:
        return {"url": self.endpoints.grpc_url}

    def models(self) -> list[str]:
        return []

    def start(self) -> ServerEndpoints:
        if not self.alive():
            raise ServerStartError(f"the Triton at {self.endpoints.grpc_url} is not live")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        client = self._client()
        try:
            metadata = client.get_server_metadata(as_json=True)
        finally:
            client.close()
        self.log_path.write_text(f"server metadata: {json.dumps(metadata)}\n")
        return self.endpoints

    def stop(self) -> None:
        """Nothing to stop: the server is someone else's, and nothing of it was changed."""

    def alive(self) -> bool:
        try:
            client = self._client()
            try:
                return client.is_server_live(client_timeout=10)
            finally:
                client.close()
        except Exception:
            return False

    def backends(self) -> set[str]:
        return set()

    def load(self, name: str, config: mc.ModelConfig | None = None) -> None:
        raise ServerStartError(f"tbench changes nothing on the server of a served model (asked to load {name})")
