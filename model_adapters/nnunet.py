"""nnU-Net's generic 3D U-Net in PyTorch (the BraTS / Medical Segmentation Decathlon Task01 configuration):
our own implementation of the architecture the nnU-Net Triton guide deploys as TorchScript (scripted).

Each stage is two conv3d(3x3x3) -> instance norm -> LeakyReLU(0.01) layers; the first layer of every stage below
the top downsamples with stride 2; the decoder upsamples with a stride-2 transposed convolution, concatenates the
encoder's skip and runs a two-layer block; a 1x1x1 convolution gives the class logits. Deep supervision heads are a
training-time feature and are not part of the inference model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from model_adapters.base import Batch, ModelAdapter, ServingDefaults
from model_adapters.torch_checkpoint import load_checkpoint
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec

IN_CHANNELS = 4  # BraTS MRI modalities: FLAIR, T1, T1-gd, T2
NUM_CLASSES = 4  # background + edema, non-enhancing tumour, enhancing tumour

# size -> (filters per stage, top to bottleneck; volume side). nnU-Net's progression: 32 doubling per stage,
# capped at 320 for 3D; a 128^3 patch gets five stride-2 stages (down to 4^3).
_SIZES = {
    "full": ((32, 64, 128, 256, 320, 320), 128),
    "small": ((8, 16, 32), 32),
}

# what the guide's process_dataset.sh (the nnU-Net example's preprocessing) leaves per case:
# <case>_x.npy float32 [4, D, H, W] and <case>_y.npy uint8 [1, D, H, W] (other files, e.g. _meta.npy, are ignored)
X_SUFFIX, Y_SUFFIX = "_x.npy", "_y.npy"
CPU_SIDE = 64  # the full model's volume on the CPU profile: 8x less work than 128^3 (~4-8 s a forward on 2 cores)


def _build_module(filters: tuple[int, ...], in_channels: int, num_classes: int):
    import torch
    from torch import nn

    class ConvLayer(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv = nn.Conv3d(cin, cout, 3, stride=stride, padding=1, bias=False)  # the norm's shift is the bias
            self.norm = nn.InstanceNorm3d(cout, affine=True)
            self.act = nn.LeakyReLU(negative_slope=0.01, inplace=True)

        def forward(self, x):
            return self.act(self.norm(self.conv(x)))

    class ConvBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = ConvLayer(cin, cout, stride)
            self.conv2 = ConvLayer(cout, cout, 1)

        def forward(self, x):
            return self.conv2(self.conv1(x))

    class UpsampleBlock(nn.Module):
        def __init__(self, cin: int, cout: int):
            super().__init__()
            self.transp_conv = nn.ConvTranspose3d(cin, cout, 2, stride=2)
            self.conv_block = ConvBlock(2 * cout, cout, 1)

        def forward(self, x, skip):
            x = self.transp_conv(x)
            return self.conv_block(torch.cat([x, skip], dim=1))

    class UNet3D(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_block = ConvBlock(in_channels, filters[0], 1)
            self.downsamples = nn.ModuleList(
                [ConvBlock(filters[i - 1], filters[i], 2) for i in range(1, len(filters) - 1)]
            )
            self.bottleneck = ConvBlock(filters[-2], filters[-1], 2)
            # deepest first: each takes the level below and the skip of its own level
            self.upsamples = nn.ModuleList(
                [UpsampleBlock(filters[i + 1], filters[i]) for i in reversed(range(len(filters) - 1))]
            )
            self.output_block = nn.Conv3d(filters[0], num_classes, 1)
            for m in self.modules():  # nnU-Net's He initialisation for LeakyReLU(0.01)
                if isinstance(m, (nn.Conv3d, nn.ConvTranspose3d)):
                    nn.init.kaiming_normal_(m.weight, a=0.01)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)

        def forward(self, x):
            x = self.input_block(x)
            skips = [x]
            for block in self.downsamples:
                x = block(x)
                skips.append(x)
            x = self.bottleneck(x)
            level = len(skips) - 1
            for block in self.upsamples:
                x = block(x, skips[level])
                level -= 1
            return self.output_block(x)

    return UNet3D()


def center_crop_or_pad(volume: np.ndarray, side: int) -> np.ndarray:
    """The last three axes center-cropped, or zero-padded around the center, to side^3."""
    out = volume
    for axis in range(volume.ndim - 3, volume.ndim):
        size = out.shape[axis]
        if size > side:
            start = (size - side) // 2
            out = np.take(out, np.arange(start, start + side), axis=axis)
        elif size < side:
            before = (side - size) // 2
            widths = [(0, 0)] * out.ndim
            widths[axis] = (before, side - size - before)
            out = np.pad(out, widths)
    return np.ascontiguousarray(out)


def list_cases(data_dir: str | Path) -> list[tuple[Path, Path | None]]:
    """(volume, label or None) per case in sorted order: <case>_x.npy with its <case>_y.npy when present."""
    root = Path(data_dir)
    if not root.is_dir():
        raise ConfigError(f"dataset {root} is not a folder of preprocessed cases (<case>{X_SUFFIX}, <case>{Y_SUFFIX})")
    cases = []
    for x in sorted(root.glob(f"*{X_SUFFIX}")):
        y = x.with_name(x.name[: -len(X_SUFFIX)] + Y_SUFFIX)
        cases.append((x, y if y.exists() else None))
    if not cases:
        raise ConfigError(
            f"dataset {root} has no preprocessed cases (<case>{X_SUFFIX} [4,D,H,W] with <case>{Y_SUFFIX})"
        )
    labelled = sum(y is not None for _, y in cases)
    if 0 < labelled < len(cases):
        missing = next(x.name for x, y in cases if y is None)
        raise ConfigError(f"dataset {root}: {labelled} of {len(cases)} cases have labels; {missing} has no {Y_SUFFIX}")
    return cases


def load_case(x_path: Path, y_path: Path | None, side: int) -> tuple[np.ndarray, np.ndarray | None]:
    try:
        volume = np.load(x_path)
        label = np.load(y_path) if y_path is not None else None
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read case {x_path.name[: -len(X_SUFFIX)]}: {err}") from err
    if volume.ndim != 4 or volume.shape[0] != IN_CHANNELS:
        raise ConfigError(f"{x_path}: expected a [{IN_CHANNELS}, D, H, W] volume, got shape {list(volume.shape)}")
    if label is not None:
        if label.ndim == 4 and label.shape[0] == 1:
            label = label[0]
        if label.shape != volume.shape[1:]:
            raise ConfigError(
                f"{y_path}: label shape {list(label.shape)} does not match the volume's {list(volume.shape[1:])}"
            )
        label = center_crop_or_pad(label.astype(np.uint8), side)
    return center_crop_or_pad(volume.astype(np.float32), side), label


def dice_per_class(predictions: np.ndarray, labels: np.ndarray, num_classes: int = NUM_CLASSES) -> dict[int, float]:
    """Per foreground class, Dice 2|P and L|/(|P|+|L|) per case ([B, D, H, W]; a [D, H, W] array is one case)
    averaged over the cases; a class absent from both prediction and label scores 1.0."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions {predictions.shape} and labels {labels.shape} differ in shape")
    if predictions.ndim == 3:
        predictions, labels = predictions[None], labels[None]
    p = predictions.reshape(len(predictions), -1)
    lab = labels.reshape(len(labels), -1)
    scores = {}
    for c in range(1, num_classes):
        pc, lc = p == c, lab == c
        overlap = np.logical_and(pc, lc).sum(axis=1)
        total = pc.sum(axis=1) + lc.sum(axis=1)
        per_case = np.where(total > 0, 2.0 * overlap / np.maximum(total, 1), 1.0)
        scores[c] = float(per_case.mean())
    return scores


class NnUNet(ModelAdapter):
    name = "nnunet"
    framework = "pytorch"
    metric_name = "dice"

    @property
    def filters(self) -> tuple[int, ...]:
        return _SIZES[self.size][0]

    @property
    def side(self) -> int:
        """The volume side: the guide's 128 except for the full model on the CPU profile, which scales the volume
        down to 64^3 (the network is fully convolutional; 64 is the smallest side its five stride-2 stages take)."""
        if self.size == "full" and self.profile == "cpu":
            return CPU_SIDE
        return _SIZES[self.size][1]

    @property
    def num_classes(self) -> int:
        return NUM_CLASSES

    def build(self):
        import torch

        torch.manual_seed(0)
        module = _build_module(self.filters, IN_CHANNELS, NUM_CLASSES)
        if self.checkpoint:
            load_checkpoint(module, self.checkpoint)
        return module.eval()

    def io_spec(self) -> IoSpec:
        s = self.side
        return IoSpec(
            inputs=[TensorSpec(name="input__0", dtype="float32", shape=[IN_CHANNELS, s, s, s])],
            outputs=[TensorSpec(name="output__0", dtype="float32", shape=[NUM_CLASSES, s, s, s])],
        )

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        """The first n_samples preprocessed cases of `data_dir` in sorted order, center-cropped or zero-padded to the
        size's volume (labels uint8 [B, D, H, W]); without a dataset, standard-normal volumes with uniform labels."""
        side = self.side
        if self.data_dir is not None:
            cases = list_cases(self.data_dir)[:n_samples]
            for start in range(0, len(cases), batch_size):
                loaded = [load_case(x, y, side) for x, y in cases[start : start + batch_size]]
                labels = None if loaded[0][1] is None else np.stack([y for _, y in loaded])
                yield Batch(inputs={"input__0": np.stack([x for x, _ in loaded])}, labels=labels)
            return
        rng = np.random.default_rng(seed)
        for start in range(0, n_samples, batch_size):
            n = min(batch_size, n_samples - start)
            volumes = rng.standard_normal((n, IN_CHANNELS, side, side, side), dtype=np.float32)
            labels = rng.integers(0, NUM_CLASSES, size=(n, side, side, side), dtype=np.uint8)
            yield Batch(inputs={"input__0": volumes}, labels=labels)

    def predict(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        """Per-voxel argmax over the class logits: uint8 labels [B, D, H, W] (a 128^3 int64 map would be 16 MiB)."""
        return outputs["output__0"].argmax(axis=1).astype(np.uint8)

    def dice_per_class(self, predictions: np.ndarray, labels: np.ndarray) -> dict[int, float]:
        return dice_per_class(predictions, labels, NUM_CLASSES)

    def metric(self, predictions: np.ndarray, labels: np.ndarray) -> float:
        """Mean Dice over the foreground classes 1..classes-1 (each averaged over the cases)."""
        return float(np.mean(list(self.dice_per_class(predictions, labels).values())))

    def defaults(self, profile: str) -> ServingDefaults:
        formats = ["ts-script", "onnx"]  # the guide deploys TorchScript (scripted); ONNX for the onnxruntime backend
        if profile == "gpu":  # the reference guide's parameters (4x128^3 volumes)
            return ServingDefaults(
                max_batch_size=4,
                model_instances=1,
                preferred_batch_sizes=[2, 4],
                max_queue_delay_us=1,
                offline_batch_sizes=[1, 2, 4],
                online_concurrency=list(range(1, 9)),
                accuracy_samples=32,
                formats=formats,
            )
        # cpu: one full-size 4x128^3 forward takes 30-60 s on 2 cores (~0.8 TFLOP), so the CPU profile runs the full
        # network on 64^3 volumes (see `side`), one point per scenario with room for a batch of 2 in the server.
        # The small size (32^3, 0.1-1 s a batch) gets the guide's batch sizes.
        if self.size == "full":
            return ServingDefaults(
                max_batch_size=2,
                model_instances=1,
                preferred_batch_sizes=[2],
                max_queue_delay_us=2000,
                offline_batch_sizes=[1],
                online_concurrency=[1],
                accuracy_samples=2,
                formats=formats,
            )
        return ServingDefaults(
            max_batch_size=4,
            model_instances=1,
            preferred_batch_sizes=[2, 4],
            max_queue_delay_us=2000,
            offline_batch_sizes=[1, 2, 4],
            online_concurrency=[1, 2, 4],
            accuracy_samples=8,
            formats=formats,
        )
