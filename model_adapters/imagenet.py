"""ImageNet-layout image folders (one subfolder of JPEGs per class, as the guides' preprocessing leaves the
validation set) and the standard evaluation preprocessing, shared by the ResNet-50 adapters of both frameworks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tbench.core.errors import ConfigError

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}


def list_samples(root: str | Path, num_classes: int) -> list[tuple[Path, int]]:
    """(image, label) pairs; labels are the class folders' indices in sorted order, as torchvision's ImageFolder."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"dataset {root} is not a folder of class subfolders")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    if not classes:
        raise ConfigError(f"dataset {root} has no class subfolders (expected <class>/<image>.JPEG)")
    if len(classes) > num_classes:
        raise ConfigError(f"dataset {root} has {len(classes)} classes; the model predicts {num_classes}")
    samples = [
        (p, i)
        for i, c in enumerate(classes)
        for p in sorted((root / c).iterdir())
        if p.suffix.lower() in IMAGE_SUFFIXES
    ]
    if not samples:
        raise ConfigError(f"dataset {root} has no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return samples


def preprocess(path: Path, side: int) -> np.ndarray:
    """Resize the shorter side to side x 256/224, center-crop side x side, scale to [0, 1], normalise: HWC float32."""
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        short = round(side * 256 / 224)
        w, h = img.size
        scale = short / min(w, h)
        img = img.resize((max(side, round(w * scale)), max(side, round(h * scale))), Image.BILINEAR)
        w, h = img.size
        left, top = (w - side) // 2, (h - side) // 2
        img = img.crop((left, top, left + side, top + side))
        pixels = np.asarray(img, dtype=np.float32) / 255.0
    return (pixels - MEAN) / STD


def folder_batches(
    root: str | Path, side: int, num_classes: int, n_samples: int, batch_size: int, channels_first: bool
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The first n_samples images in a fixed order (accuracy compares the same samples on every run)."""
    samples = list_samples(root, num_classes)[:n_samples]
    for start in range(0, len(samples), batch_size):
        chunk = samples[start : start + batch_size]
        images = np.stack([preprocess(p, side) for p, _ in chunk])
        if channels_first:
            images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
        yield images, np.array([label for _, label in chunk])
