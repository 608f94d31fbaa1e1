"""Python-backend runtime model: ONNX Runtime, TorchScript, an AOTInductor package (aoti) or a TF SavedModel inside
Triton's python backend.

Copied into the model repository as `<model>/1/model.py`. Requests that the dynamic batcher hands over together
are concatenated along the batch axis (those with the same non-batch shapes), run in one runtime call, and split
back per request.
Parameters come from config.pbtxt: `runtime` (onnxruntime | torchscript | aoti | tensorflow), `model_file`,
`intra_op_threads`.
A KIND_GPU instance runs on its GPU where the runtime has CUDA, else on the CPU; each instance prints the device it
actually got (DEVICE_MARK + JSON, to the server's log), which the run checks before it labels results with a GPU.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

DEVICE_MARK = "TBENCH_DEVICE "  # tbench/serving.py reads these lines of the server log
SPINNING = "session.intra_op.allow_spinning"  # onnxruntime's session option (off: see initialize)


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

    def _run_onnx(self, feeds):
        return self.session.run(self.outputs, feeds)

    def _run_torch(self, feeds):
        import torch

        with torch.inference_mode():
            out = self.module(*(torch.from_numpy(feeds[n]).to(self.device) for n in self.inputs))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [o.cpu().numpy() for o in outs]

    def _run_tf(self, feeds):
        import tensorflow as tf

        out = self.signature(**{n: tf.constant(feeds[n]) for n in self.inputs})
        return [out[n].numpy() for n in self.outputs]

    def execute(self, requests):
        """Requests whose non-batch shapes agree run as one batch; others (dynamic dims) run in their own groups."""
        feeds = [{n: _text(pb_utils.get_input_tensor_by_name(r, n).as_numpy()) for n in self.inputs} for r in requests]
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
        batched = feeds[0] if len(feeds) == 1 else {n: np.concatenate([f[n] for f in feeds]) for n in self.inputs}
        try:
            results = self._run(batched)
        except Exception as err:  # one failed runtime call fails the requests of that batch, not the model
            message = f"{self.runtime} failed: {err}"  # one error object per response: the stub must not share them
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message)) for _ in feeds]
        if len(feeds) == 1:
            return [
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor(name, np.ascontiguousarray(value, dtype=self.output_dtypes[name]))
                        for name, value in zip(self.outputs, results)
                    ]
                )
            ]
        responses, offset = [], 0
        for size in sizes:
            tensors = [
                pb_utils.Tensor(
                    name,
                    np.ascontiguousarray(value[offset : offset + size]).astype(self.output_dtypes[name], copy=False),
                )
                for name, value in zip(self.outputs, results)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            offset += size
        return responses


def _text(array):
    """A BYTES input arrives as an object array of bytes; the runtimes take strings (ONNX Runtime reads bytes as no
    token at all), so they are decoded as UTF-8. Other inputs pass as they are."""
    if array.dtype != np.object_:
        return array
    return np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else v, otypes=[object])(array)
