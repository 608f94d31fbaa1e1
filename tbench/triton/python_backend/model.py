"""Python-backend runtime model: ONNX Runtime, TorchScript, an AOTInductor package (aoti) or a TF SavedModel inside
Triton's python backend.

Copied into the model repository as `<model>/1/model.py`. Requests that the dynamic batcher hands over together
are concatenated along the batch axis (those with the same non-batch shapes), run in one runtime call, and split
back per request.
Parameters come from config.pbtxt: `runtime` (onnxruntime | torchscript | aoti | tensorflow), `model_file`,
`intra_op_threads`.
A KIND_GPU instance runs on its GPU where the runtime has CUDA, else on the CPU; each instance prints the device it
actually got (DEVICE_MARK + JSON, to the server's log), which the run checks before it labels results with a GPU.

Tensors cross between Triton and the runtime by one of two paths, chosen per model at initialize and printed
(TENSOR_MARK + JSON: the path and why) for the run's manifest and report:
- dlpack: inputs are taken as torch tensors through DLPack and outputs handed back the same way, without NumPy in
  between; a tensor on the GPU (an input the backend leaves there, an output of a model on the GPU) stays on it.
  TorchScript and AOTInductor run on torch tensors; ONNX Runtime takes them as OrtValues (OrtValue.from_dlpack) and
  binds its outputs on its own device.
- numpy: `as_numpy()` in, a NumPy array out: string tensors (DLPack has no strings), TensorFlow, ONNX Runtime on the
  CPU (it reads NumPy arrays in place; an IO binding costs more than it saves), a runtime without DLPack, or asked
  for (parameter `tensor_path` or the server's environment TBENCH_TENSOR_PATH = numpy | dlpack).
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

DEVICE_MARK = "TBENCH_DEVICE "  # tbench/serving.py reads these lines of the server log
SPINNING = "session.intra_op.allow_spinning"  # onnxruntime's session option (off: see initialize)
TENSOR_MARK = "TBENCH_TENSORS "  # tbench/stages/tensor_path.py reads these lines of the server log
TENSOR_PATH_ENV = "TBENCH_TENSOR_PATH"  # numpy | dlpack: the A/B of the two paths without a new repository
DLPACK, NUMPY = "dlpack", "numpy"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        path = os.path.join(version_dir, params["model_file"])
        threads = int(params.get("intra_op_threads", "0"))
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]
        self.output_dtypes = {o["name"]: pb_utils.triton_string_to_numpy(o["data_type"]) for o in config["output"]}
        self.runtime = params["runtime"]
        use_gpu = args.get("model_instance_kind") == "GPU"
        if self.runtime == "onnxruntime":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            # idle intra-op threads sleep instead of spinning: with spinning, a small model's runs on a small machine
            # were fast or 20% slower as a whole, by where the OS put the spinning thread (its compute 0.24 or 0.33 ms
            # per batch of 8 on 2 cores, at 166% CPU either way); without, every run is the slower one, at 103% CPU
            opts.add_session_config_entry(SPINNING, "0")
            providers = ["CPUExecutionProvider"]
            if use_gpu and "CUDAExecutionProvider" in ort.get_available_providers():
                providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(args["model_instance_device_id"])}))
            self.session = ort.InferenceSession(path, sess_options=opts, providers=providers)
            self._run = self._run_onnx
            # what the session got, not what was asked: a CUDA provider that fails to load falls back to the CPU
            on_cuda = self.session.get_providers()[0] == "CUDAExecutionProvider"
            device = f"cuda:{args['model_instance_device_id']}" if on_cuda else "cpu"
        elif self.runtime == "torchscript":
            import torch

            if threads:
                torch.set_num_threads(threads)
            self.device = torch.device(
                f"cuda:{args['model_instance_device_id']}" if use_gpu and torch.cuda.is_available() else "cpu"
            )
            self.module = torch.jit.load(path, map_location=self.device).eval()
            self._run = self._run_torch
            device = str(self.device)
        elif self.runtime == "aoti":  # an AOTInductor package: it runs on the device it was compiled for
            import torch
            import torch._inductor

            if threads:
                torch.set_num_threads(threads)
            index = int(args["model_instance_device_id"]) if use_gpu else -1  # -1: the default device
            self.module = torch._inductor.aoti_load_package(path, device_index=index)
            compiled_for = self.module.get_metadata().get("AOTI_DEVICE_KEY", "cpu")
            self.device = torch.device(f"cuda:{max(index, 0)}" if compiled_for == "cuda" else "cpu")
            self._run = self._run_torch
            device = str(self.device)
        elif self.runtime == "tensorflow":
            import tensorflow as tf

            if threads:
                tf.config.threading.set_intra_op_parallelism_threads(threads)
                tf.config.threading.set_inter_op_parallelism_threads(1)
            if not use_gpu:
                tf.config.set_visible_devices([], "GPU")
            self.saved = tf.saved_model.load(path)  # kept: its signatures lose their variables once it is collected
            self.signature = self.saved.signatures["serving_default"]
            self._run = self._run_tf
            on_gpu = use_gpu and bool(tf.config.list_logical_devices("GPU"))  # TF places ops on its GPU when it has one
            device = f"cuda:{args['model_instance_device_id']}" if on_gpu else "cpu"
        else:
            raise ValueError(f"unknown runtime {self.runtime!r}")
        print(
            DEVICE_MARK
            + json.dumps(
                {
                    "model": args["model_name"],
                    "instance": args.get("model_instance_name"),
                    "runtime": self.runtime,
                    "device": device,
                }
            ),
            flush=True,
        )
        path, why = choose_tensor_path(self.runtime, config, params, device)
        self.tensors = DlpackTensors(self.output_dtypes) if path == DLPACK else NumpyTensors(self.output_dtypes)
        print(TENSOR_MARK + json.dumps({"model": args["model_name"], "path": path, "why": why}), flush=True)

    def _run_onnx(self, feeds):
        if self.tensors.name == NUMPY:
            return self.session.run(self.outputs, feeds)
        return self._run_onnx_bound(feeds)

    def _run_onnx_bound(self, feeds):
        """torch tensors in, torch tensors out, through an IO binding: the inputs are read where they lie and the
        outputs are written on the session's own device (the GPU's memory under the CUDA provider)."""
        import onnxruntime as ort
        import torch

        binding = self.session.io_binding()
        on_cuda = self.session.get_providers()[0] == "CUDAExecutionProvider"
        # the OrtValues share the tensors' memory; `feeds` keeps the tensors alive until the run returns. An input on
        # the GPU for a session on the CPU (the backend may leave CUDA inputs there) is brought to the host first
        for name in self.inputs:
            tensor = feeds[name] if on_cuda else feeds[name].cpu()
            binding.bind_ortvalue_input(name, ort.OrtValue.from_dlpack(tensor.contiguous()))
        device_id = self.session.get_provider_options().get("CUDAExecutionProvider", {}).get("device_id", 0)
        for name in self.outputs:
            binding.bind_output(name, "cuda" if on_cuda else "cpu", int(device_id) if on_cuda else 0)
        self.session.run_with_iobinding(binding)
        return [torch.from_dlpack(value) for value in binding.get_outputs()]

    def _run_torch(self, feeds):
        import torch

        with torch.inference_mode():
            out = self.module(*(_as_torch(feeds[n]).to(self.device) for n in self.inputs))
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def _run_tf(self, feeds):
        import tensorflow as tf

        out = self.signature(**{n: tf.constant(feeds[n]) for n in self.inputs})
        return [out[n].numpy() for n in self.outputs]

    def execute(self, requests):
        """Requests whose non-batch shapes agree run as one batch; others (dynamic dims) run in their own groups."""
        load = self.tensors.load
        feeds = [{n: load(pb_utils.get_input_tensor_by_name(r, n)) for n in self.inputs} for r in requests]
        if len(feeds) == 1:  # static batching (offline) and an idle batcher: no grouping, concatenation or slicing
            return self._run_group(feeds)
        groups = {}
        for i, f in enumerate(feeds):
            groups.setdefault(tuple(f[n].shape[1:] for n in self.inputs), []).append(i)
        responses = [None] * len(requests)
        for members in groups.values():
            for i, response in zip(members, self._run_group([feeds[i] for i in members])):
                responses[i] = response
        return responses

    def _run_group(self, feeds):
        sizes = [f[self.inputs[0]].shape[0] for f in feeds]
        concat = self.tensors.concat
        batched = feeds[0] if len(feeds) == 1 else {n: concat([f[n] for f in feeds]) for n in self.inputs}
        try:
            results = self._run(batched)
        except Exception as err:  # one failed runtime call fails the requests of that batch, not the model
            message = f"{self.runtime} failed: {err}"  # one error object per response: the stub must not share them
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message)) for _ in feeds]
        to_triton = self.tensors.to_triton
        if len(feeds) == 1:
            tensors = [to_triton(name, value) for name, value in zip(self.outputs, results)]
            return [pb_utils.InferenceResponse(output_tensors=tensors)]
        responses, offset = [], 0
        for size in sizes:
            tensors = [to_triton(name, value[offset : offset + size]) for name, value in zip(self.outputs, results)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            offset += size
        return responses


def _text(array):
    """A BYTES input arrives as an object array of bytes; the runtimes take strings (ONNX Runtime reads bytes as no
    token at all), so they are decoded as UTF-8. Other inputs pass as they are."""
    if array.dtype != np.object_:
        return array
    return np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else v, otypes=[object])(array)


def choose_tensor_path(runtime, config, params, device="cpu"):
    """(path, why): DLPack wherever the runtime and the model's tensors allow it and it pays, NumPy otherwise."""
    asked = params.get("tensor_path") or os.environ.get(TENSOR_PATH_ENV, "")
    if asked == NUMPY:
        return NUMPY, "asked for"
    if runtime == "tensorflow":
        return NUMPY, "the TensorFlow runtime is fed NumPy arrays"
    if runtime == "onnxruntime" and device == "cpu" and asked != DLPACK:
        # ONNX Runtime reads a NumPy input in place on the CPU, so DLPack saves no copy there: NumPy served 1.21 and
        # 1.14 times the IO binding's throughput at batch 1 and 8 (benchmarks/tensor_paths.py), and no instance
        # imports torch for it (1.4-1.6 s of CPU each)
        return NUMPY, "ONNX Runtime on the CPU reads NumPy arrays in place"
    strings = [t["name"] for t in config["input"] + config["output"] if t["data_type"] == "TYPE_STRING"]
    if strings:
        return NUMPY, f"string tensors ({', '.join(strings)}) have no DLPack form"
    try:  # the DLPack path holds every tensor as a torch tensor (concatenated, sliced, cast), whatever the runtime
        import torch  # noqa: F401
    except ImportError:
        return NUMPY, "torch is not installed beside the runtime"
    if runtime == "onnxruntime":
        import onnxruntime as ort

        if not hasattr(ort.OrtValue, "from_dlpack"):
            return NUMPY, f"onnxruntime {ort.__version__} has no OrtValue.from_dlpack"
    return DLPACK, "asked for" if asked == DLPACK else "zero-copy: no NumPy between Triton and the runtime"


class NumpyTensors:
    """Inputs as NumPy arrays (`as_numpy()`), outputs as NumPy arrays in the config's dtypes."""

    name = NUMPY

    def __init__(self, output_dtypes):
        self.output_dtypes = output_dtypes

    def load(self, tensor):
        return _text(tensor.as_numpy())

    def concat(self, values):
        return np.concatenate(values)

    def to_triton(self, name, value):
        if hasattr(value, "detach"):  # a torch runtime's output
            value = value.detach().cpu().numpy()
        return pb_utils.Tensor(name, np.ascontiguousarray(value, dtype=self.output_dtypes[name]))


class DlpackTensors:
    """Inputs as torch tensors over DLPack, on the device Triton put them on; outputs handed back over DLPack from
    where the runtime left them (a GPU's memory stays on the GPU)."""

    name = DLPACK

    def __init__(self, output_dtypes):
        import torch

        self.torch = torch
        # the config's dtype of each output as torch's (an empty NumPy array of that dtype says which)
        self.output_dtypes = {name: torch.from_numpy(np.empty(0, dtype)).dtype for name, dtype in output_dtypes.items()}

    def load(self, tensor):
        # the capsule, not the tensor's own __dlpack__: it needs no stream handshake the stub may not know
        return self.torch.utils.dlpack.from_dlpack(tensor.to_dlpack())

    def concat(self, values):
        return self.torch.cat(values)

    def to_triton(self, name, value):
        # the stub takes only C-contiguous tensors; the capsule holds a reference to `tensor`, so it lives until the
        # stub has sent it, however long after this returns
        tensor = value.detach().to(self.output_dtypes[name]).contiguous()
        if tensor.is_cuda:  # a capsule carries no stream: the stub may read the memory once this stream's work is done
            self.torch.cuda.current_stream(tensor.device).synchronize()
        return pb_utils.Tensor.from_dlpack(name, self.torch.utils.dlpack.to_dlpack(tensor))


def _as_torch(value):
    """A torch runtime's input: the DLPack path's tensor as it is, the NumPy path's array without a copy."""
    if hasattr(value, "detach"):
        return value
    import torch

    return torch.from_numpy(value)
