"""A tiny image model as a user would bring it: an ONNX file of a small conv net (3x64x64 input, ~0.2 ms of compute
on one core) with two outputs, dynamic batch. The benchmarks and tests use it as "a fast model we did not write".

Usage: .venv/bin/python benchmarks/tiny_model.py OUT.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path


def build_tiny_image_onnx(path: Path, seed: int = 0, extra_layers: int = 0) -> Path:
    """`extra_layers`: 3x3 convolutions (16 channels at 16x16) added after the second convolution, a planted slowdown
    of the same model (benchmarks/real_aa.py measures how much slower it serves)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class TinyNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 8, 3, stride=2, padding=1),
                nn.ReLU(),
                nn.Conv2d(8, 16, 3, stride=2, padding=1),
                nn.ReLU(),
                *(m for _ in range(extra_layers) for m in (nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
            )
            self.classes = nn.Linear(16, 10)
            self.embedding = nn.Linear(16, 4)

        def forward(self, image):
            x = self.features(image)
            return self.classes(x).softmax(-1), self.embedding(x)

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        TinyNet().eval(),
        (torch.zeros(1, 3, 64, 64),),
        str(path),
        input_names=["image"],
        output_names=["probabilities", "embedding"],
        opset_version=17,
        dynamo=False,
        dynamic_axes={"image": {0: "batch"}, "probabilities": {0: "batch"}, "embedding": {0: "batch"}},
    )
    return path


if __name__ == "__main__":
    print(build_tiny_image_onnx(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny.onnx")))
