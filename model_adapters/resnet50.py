"""ResNet-50 v1.5 in PyTorch: our own implementation of the architecture (stride on the 3x3 conv)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from model_adapters import register
from model_adapters.base import Batch, ModelAdapter, ServingDefaults
from model_adapters.imagenet import folder_batches
from model_adapters.torch_checkpoint import load_checkpoint
from tbench.core.iospec import IoSpec, TensorSpec

# size -> (blocks per stage, stem width, image side, classes)
_SIZES = {
    "full": ((3, 4, 6, 3), 64, 224, 1000),
    "small": ((1, 1, 1, 1), 8, 32, 10),
}


def _build_module(blocks: tuple[int, ...], width: int, num_classes: int):
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, planes: int, stride: int):
            super().__init__()
            cout = planes * self.expansion
            self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            # v1.5: the stride sits on the 3x3 convolution, not on the first 1x1
            self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            stages, cin = [], width
            for i, n in enumerate(blocks):
                planes = width * 2**i
                layers = []
                for j in range(n):
                    layers.append(Bottleneck(cin, planes, stride=2 if (i > 0 and j == 0) else 1))
                    cin = planes * Bottleneck.expansion
                stages.append(nn.Sequential(*layers))
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            # zero-init the last BN of each block so a random-weight network keeps sane activations
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet()


@register
class ResNet50(ModelAdapter):
    name = "resnet50"
    framework = "pytorch"
    metric_name = "top1"

    @property
    def _dims(self):
        return _SIZES[self.size]

    def build(self):
        import torch

        blocks, width, _, classes = self._dims
        torch.manual_seed(0)
        module = _build_module(blocks, width, classes)
        if self.checkpoint:
            load_checkpoint(module, self.checkpoint)
        return module.eval()

    def io_spec(self) -> IoSpec:
        _, _, side, classes = self._dims
        return IoSpec(
            inputs=[TensorSpec(name="input__0", dtype="float32", shape=[3, side, side])],
            outputs=[TensorSpec(name="output__0", dtype="float32", shape=[classes])],
        )

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        """An ImageNet-layout folder with the standard preprocessing (NCHW); synthetic images and labels without one."""
        _, _, side, classes = self._dims
        if self.data_dir:
            for images, labels in folder_batches(
                self.data_dir, side, classes, n_samples, batch_size, channels_first=True
            ):
                yield Batch(inputs={"input__0": images}, labels=labels)
            return
        rng = np.random.default_rng(seed)
        for start in range(0, n_samples, batch_size):
            n = min(batch_size, n_samples - start)
            images = rng.standard_normal((n, 3, side, side), dtype=np.float32)
            yield Batch(inputs={"input__0": images}, labels=rng.integers(0, classes, size=n))

    def predict(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        return outputs["output__0"].argmax(axis=1)

    def metric(self, predictions: np.ndarray, labels: np.ndarray) -> float:
        return float(np.mean(predictions == labels))

    def defaults(self, profile: str) -> ServingDefaults:
        if profile == "gpu":  # the reference guide's parameters
            return ServingDefaults(
                max_batch_size=128,
                model_instances=2,
                preferred_batch_sizes=[64, 128],
                max_queue_delay_us=1000,
                offline_batch_sizes=[1, 2, 4, 8, 16, 32, 64, 128],
                online_concurrency=list(range(16, 257, 16)),
                accuracy_samples=1024,
            )
        # cpu: the guide's shape scaled down so the full model finishes in ~2.5 minutes on 2 cores (~100 ms/image);
        # the small size is fast enough for the bigger grid
        grid = [1, 2, 4] if self.size == "full" else [1, 2, 4, 8]
        return ServingDefaults(
            max_batch_size=grid[-1],
            model_instances=1,
            preferred_batch_sizes=grid[-2:],
            max_queue_delay_us=2000,
            offline_batch_sizes=grid,
            online_concurrency=grid,
            accuracy_samples=16 if self.size == "full" else 64,
        )
