"""The converters of stage 1 (tbench.stages.export plans its chains over them): plain functions registered by
(source, target) in registry.REGISTRY, one module per family of tools: pytorch.py (torch's exporters: PyTorch -> ONNX,
PyTorch -> TorchScript traced or scripted, and TorchScript's FP16 steps), aoti.py (torch.export + AOTInductor:
PyTorch -> pt2, an AOTInductor package), onnx.py (FP32 ONNX -> FP16 ONNX with ONNX
Runtime's converter), tensorrt.py (ONNX -> TensorRT, with the TensorRT builders' optimisation profile and INT8
calibration) and tensorflow.py (Keras -> SavedModel, SavedModel -> ONNX through tf2onnx, SavedModel -> TF-TRT).

A converter registers by its decorator when its module is imported, so importing this package imports every converter
module: whoever reads REGISTRY (the export stage's plan, the doctor, a step's reproduce.py) imports it from
tbench.stages.converters.registry, which Python imports after this package, and finds it full. A new converter module
is added below; the order of the imports is the registry's (the order `tbench doctor` lists the converters in).
"""

# isort: off
from tbench.stages.converters import pytorch  # noqa: F401  (registers its converters)
from tbench.stages.converters import aoti  # noqa: F401
from tbench.stages.converters import onnx  # noqa: F401
from tbench.stages.converters import tensorrt  # noqa: F401
from tbench.stages.converters import tensorflow  # noqa: F401
# isort: on
