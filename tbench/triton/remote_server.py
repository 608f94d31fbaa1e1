"""The remote server mode: a Triton someone else runs, reached by URL, to which our models are uploaded and loaded
through the client (explicit model control), so the server needs no access to our files.
"""

from __future__ import annotations

import json
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.errors import ServerStartError
from tbench.request.benchmark import run_suffix
from tbench.triton.capabilities import ServerCapabilities, every_runtime
from tbench.triton.config import parse_pbtxt
from tbench.triton.server import ServerEndpoints, TritonServer, config_json, one_line


class RemoteServer(TritonServer):
    """A server someone else runs, with --model-control-mode=explicit: each model in our repository is uploaded
    (config + files) and loaded through the client, and unloaded at stop. The server's own log is not ours to keep;
    the load errors it returns are what the error quotes.

    The server is shared: a run's models carry names of its own (BenchmarkRequest's triton_suffix), a name the
    server already has is refused rather than replaced, and only what this object loaded is reloaded or unloaded."""

    mode = "remote"
    logs_itself = False  # the server logs elsewhere: log_path holds what this run saw of it

    # Triton has no API that lists backends: each is probed by loading a tiny model that uses it. A missing backend
    # fails with this message; any other outcome (loaded, or a bad model file) means the backend is there.
    PROBED = ("python", "onnxruntime", "pytorch", "tensorflow", "tensorrt", "openvino")
    MISSING_BACKEND = "unable to find backend library"
    # each under the backend's default file name, so the repository poll gets as far as the backend
    _PROBE_FILES = {
        "python": ("model.py", b"class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"),
        "onnxruntime": ("model.onnx", b"probe"),
        "pytorch": ("model.pt", b"probe"),
        "tensorflow": ("model.savedmodel/saved_model.pb", b"probe"),
        "tensorrt": ("model.plan", b"probe"),
        "openvino": ("model.xml", b"probe"),
    }

    def __init__(
        self,
        repository: Path,
        log_path: Path,
        http_url: str,
        grpc_url: str,
        start_timeout_s: float = 180.0,
        backends: set[str] | None = None,
    ):
        super().__init__(repository, log_path, start_timeout_s)
        self._endpoints = ServerEndpoints(http_url=http_url, grpc_url=grpc_url, metrics_url="")
        self._backends = set(backends) if backends else None
        self.loaded: list[str] = []

    @property
    def endpoints(self) -> ServerEndpoints:
        return self._endpoints

    def where(self) -> dict:
        return {"url": self.endpoints.grpc_url}  # where models are loaded and measured

    def taken(self, client, name: str) -> bool:
        """Whether the server has a model of this name: loaded (by anyone), or in its own repository."""
        index = client.get_model_repository_index(as_json=True).get("models", [])
        return any(m.get("name") == name for m in index) or client.is_model_ready(name)

    def claim(self, client, name: str) -> None:
        """Make `name` ours to load (and unload at stop), refusing one the server already has."""
        if name in self.loaded:
            return
        if self.taken(client, name):
            self._refuse([name])
        self.loaded.append(name)

    def _refuse(self, names: list[str]) -> None:
        raise ServerStartError(
            f"remote Triton at {self.endpoints.grpc_url} already has a model named "
            f"{', '.join(names)}; tbench loads only names of its own and replaces nothing"
        )

    def alive(self) -> bool:
        try:
            client = self._client()
            try:
                return client.is_server_live()
            finally:
                client.close()
        except Exception:
            return False

    def backends(self) -> set[str]:
        """The backends the user named, else those the server proves it has (probed once)."""
        if self._backends is None:
            self._backends = self.probe_backends()
        return self._backends

    def read_capabilities(self) -> ServerCapabilities:
        """Its version from its metadata, its backends as named or probed. Its python backend's environment is not
        ours to see: a server of a release after the last with the TensorFlow backend (25.02) is taken for NGC's
        layout (no framework there), an older or unknown one for a server like ours (every runtime)."""
        client = self._client()
        try:
            version = client.get_server_metadata(as_json=True).get("version")
        except Exception as err:  # not live, or no gRPC there: said in one line
            raise ServerStartError(
                f"cannot ask the remote Triton at {self.endpoints.grpc_url} for its version: {one_line(str(err))}"
            ) from None
        finally:
            client.close()
        caps = ServerCapabilities(
            version=version, source="server metadata", mode=self.mode, where=self.endpoints.grpc_url
        )
        runtimes = frozenset() if caps.after_tf_backend else every_runtime()
        return replace(caps, backends=frozenset(self.backends()), python_runtimes=runtimes)

    def probe_backends(self) -> set[str]:
        from tritonclient.utils import InferenceServerException

        found = set()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        client = self._client()
        try:
            with self.log_path.open("a") as log:
                for backend in self.PROBED:
                    name = f"tbench_probe_{backend}{run_suffix()}"
                    if self.taken(client, name):
                        continue  # not ours to load or unload (a unique name: does not happen)
                    filename, content = self._PROBE_FILES[backend]
                    config = json.dumps(
                        {
                            "backend": backend,
                            "max_batch_size": 0,
                            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
                            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
                        }
                    )
                    try:
                        client.load_model(name, config=config, files={f"file:1/{filename}": content}, client_timeout=60)
                        outcome = "loaded"
                    except InferenceServerException as err:
                        outcome = one_line(err.message() or "")
                        if "not allowed" in outcome or "failed to connect" in outcome.lower():
                            raise
                    if self.MISSING_BACKEND not in outcome:
                        found.add(backend)
                    log.write(
                        f"backend probe {backend} as {name}: "
                        f"{'present' if backend in found else 'missing'} ({outcome})\n"
                    )
                    try:
                        client.unload_model(name)
                    except InferenceServerException:
                        pass
        except InferenceServerException as err:
            raise ServerStartError(
                f"cannot ask the remote Triton at {self.endpoints.grpc_url} what it can serve "
                f"(it must run with --model-control-mode=explicit): {one_line(err.message() or '')}"
            ) from None
        finally:
            client.close()
        return found

    def load(self, name: str, config: mc.ModelConfig | None = None) -> None:
        if name not in self.loaded:  # e.g. an offline reload: only a model this run loaded
            raise ServerStartError(
                f"remote Triton: {name} was not loaded by this run; tbench reloads only its own models"
            )
        super().load(name, config)

    def _load_args(self, name: str, config: mc.ModelConfig | None) -> dict:
        """A remote server has none of our files: they travel with every load, with the override or our config."""
        own, files = self.upload(self.repository / name)
        return {"config": config_json(config) if config is not None else own, "files": files}

    @staticmethod
    def upload(model_dir: Path) -> tuple[str, dict[str, bytes]]:
        """A model directory as load_model's config JSON and `file:` overrides."""
        config = config_json(parse_pbtxt((model_dir / "config.pbtxt").read_text()))
        files = {
            f"file:{p.relative_to(model_dir).as_posix()}": p.read_bytes()
            for p in sorted(model_dir.rglob("*"))
            if p.is_file() and p.name != "config.pbtxt" and "__pycache__" not in p.parts
        }
        return config, files

    def start(self) -> ServerEndpoints:
        from tritonclient.utils import InferenceServerException

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("a")
        client = self._client()
        try:
            if not self.alive():
                raise ServerStartError(f"remote Triton at {self.endpoints.grpc_url} is not live")
            log.write(f"server metadata: {json.dumps(client.get_server_metadata(as_json=True))}\n")
            names = self.load_order()
            self.overridden = {}  # each is loaded with our config below
            if taken := [n for n in names if self.taken(client, n)]:  # checked before the first load: nothing to undo
                self._refuse(taken)
            for name in names:
                self.loaded.append(name)  # ours from here: a load that times out is still unloaded at stop
                config, files = self.upload(self.repository / name)
                try:
                    client.load_model(name, config=config, files=files, client_timeout=self.start_timeout_s)
                except InferenceServerException as err:
                    log.write(f"load {name}: {err.message()}\n")
                    raise ServerStartError(
                        f"remote Triton could not load {name}: {one_line(err.message() or '')} (log: {self.log_path})"
                    ) from None
                log.write(f"loaded {name}\n")
        except BaseException:
            with suppress(ServerStartError):  # unload what this run loaded so far; the first error is the one to tell
                self.stop()
            raise
        finally:
            log.close()
            client.close()
        return self.endpoints

    def load_order(self) -> list[str]:
        """The repository's models, an ensemble after the models it composes (its steps must be there first)."""

        def is_ensemble(name: str) -> bool:
            return parse_pbtxt((self.repository / name / "config.pbtxt").read_text()).platform == "ensemble"

        return sorted(self.models(), key=is_ensemble)

    def stop(self) -> None:
        """Unload what this run loaded, ensembles first (the reverse of the load order), and nothing else."""
        from tritonclient.utils import InferenceServerException

        if not self.loaded:
            return
        failed = []
        client = self._client()
        try:
            for name in reversed(self.loaded):
                try:
                    client.unload_model(name)
                except InferenceServerException as err:  # one that fails must not keep the others loaded
                    failed.append(f"{name} ({one_line(err.message() or '')})")
        finally:
            self.loaded = []
            client.close()
        if failed:
            raise ServerStartError(f"remote Triton at {self.endpoints.grpc_url} could not unload {', '.join(failed)}")
