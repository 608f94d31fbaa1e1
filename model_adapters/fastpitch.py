"""FastPitch (text -> mel spectrogram) in PyTorch: our own implementation of the architecture.

Token embedding -> FFT-transformer encoder -> duration and pitch predictors -> pitch embedding added to the encoder
output -> length regulator (each token repeated by its predicted number of frames) -> FFT-transformer decoder ->
linear projection to 80 mel channels.

Inference is written for torch.jit.trace (the guide serves "ts-trace") and ONNX export: no Python control flow on
tensor values. The length regulator is tensor arithmetic (cumulative durations compared with a frame index, then a
gather), and the number of output frames is computed from the tensors, so one trace serves every batch size and input.
Durations are rounded and clamped to [1, MAX_TOKEN_FRAMES] per non-padding token, and the total per utterance is
clamped to MAX_FRAMES_PER_TOKEN * sequence length, so outputs stay bounded even for random weights.

A batch's mel spectrograms share one frame axis: each is padded with zero frames to the longest in the batch, and
`output__1` holds each one's own length. The python backend concatenates requests along the batch axis, so a request
served together with another gets as many frames as the longest of them (its length output still says its own).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from model_adapters.base import Batch, ModelAdapter, ServingDefaults
from model_adapters.torch_checkpoint import load_checkpoint
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec

N_MELS = 80
N_SYMBOLS = 148  # the published model's symbol table size (padding, punctuation, letters, ARPAbet)
MAX_TOKEN_FRAMES = 20  # predicted frames per token are clamped to [1, this]
MAX_FRAMES_PER_TOKEN = 10  # an utterance has at most this * sequence length frames
# random weights predict log-durations near 0 (about 1 frame per token); the duration head's bias starts at the log of
# LJSpeech's typical frames per token (~6) so a random-weight model does about as much decoder work as a trained one
INIT_LOG_DURATION = math.log(1.0 + 6.0)

# size -> model dimensions and the fixed input length
_SIZES = {
    "full": dict(
        d_model=384,
        n_layers=6,
        n_heads=1,
        d_head=64,
        kernel=3,
        filter=1536,
        predictor_filter=256,
        predictor_layers=2,
        seq_len=128,
    ),
    "small": dict(
        d_model=32,
        n_layers=2,
        n_heads=1,
        d_head=16,
        kernel=3,
        filter=64,
        predictor_filter=32,
        predictor_layers=2,
        seq_len=16,
    ),
}

# Our own symbol table for English text (lower-cased first); characters outside it are skipped.
PAD = "_"
SYMBOLS = [PAD, *"!'(),.:;? -", *"abcdefghijklmnopqrstuvwxyz"]
SYMBOL_IDS = {s: i for i, s in enumerate(SYMBOLS)}


def text_to_ids(text: str, seq_len: int) -> np.ndarray:
    """Lower-cased text -> symbol ids, unknown characters skipped, truncated or padded with 0 to seq_len."""
    ids = [SYMBOL_IDS[c] for c in text.lower() if c in SYMBOL_IDS and c != PAD][:seq_len]
    out = np.zeros(seq_len, dtype=np.int64)
    out[: len(ids)] = ids
    return out


def read_metadata(data_dir: str) -> list[str]:
    """Texts of an LJSpeech-style `metadata.csv` (`id|text|normalized text`; the normalized text when present)."""
    path = Path(data_dir) / "metadata.csv"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ConfigError(f"cannot read the FastPitch dataset's metadata {path}: {err}") from err
    texts = []
    for line in lines:
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) < 2:
            raise ConfigError(f"{path}: expected `id|text|normalized text` lines, got {line[:60]!r}")
        texts.append(fields[2] if len(fields) > 2 and fields[2].strip() else fields[1])
    if not texts:
        raise ConfigError(f"{path} holds no utterances")
    return texts


def _build_module(
    d_model: int,
    n_layers: int,
    n_heads: int,
    d_head: int,
    kernel: int,
    filter: int,
    predictor_filter: int,
    predictor_layers: int,
    seq_len: int,
    dropout: float = 0.1,
):
    import torch
    from torch import nn

    def sinusoid(positions, inv_freq):
        """[T] float positions -> [T, d_model] sinusoidal embedding (sin half, cos half)."""
        angles = positions[:, None] * inv_freq[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    class MultiHeadAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(d_model, 3 * n_heads * d_head)
            self.out = nn.Linear(n_heads * d_head, d_model, bias=False)
            self.drop = nn.Dropout(dropout)
            self.norm = nn.LayerNorm(d_model)
            self.scale = 1.0 / math.sqrt(d_head)

        def forward(self, x, mask):  # x [B, T, D], mask [B, T, 1] (1: valid)
            b, t = x.shape[0], x.shape[1]
            q, k, v = (
                self.qkv(x).view(b, t, 3, n_heads, d_head).permute(2, 0, 3, 1, 4).unbind(0)
            )  # each [B, H, T, d_head]
            scores = torch.matmul(q, k.transpose(2, 3)) * self.scale
            key_valid = mask.transpose(1, 2).unsqueeze(1) > 0  # [B, 1, 1, T]
            scores = scores.masked_fill(~key_valid, -1e9)  # finite: an all-padding row stays NaN-free
            attn = self.drop(torch.softmax(scores, dim=-1))
            heads = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, n_heads * d_head)
            return self.norm(x + self.drop(self.out(heads)))

    class ConvFeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv1d(d_model, filter, kernel, padding=kernel // 2)
            self.conv2 = nn.Conv1d(filter, d_model, kernel, padding=kernel // 2)
            self.drop = nn.Dropout(dropout)
            self.norm = nn.LayerNorm(d_model)

        def forward(self, x):  # [B, T, D]
            y = self.conv2(torch.relu(self.conv1(x.transpose(1, 2)))).transpose(1, 2)
            return self.norm(x + self.drop(y))

    class FFTBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = MultiHeadAttention()
            self.ff = ConvFeedForward()

        def forward(self, x, mask):
            x = self.attn(x, mask) * mask
            return self.ff(x) * mask

    class FFTransformer(nn.Module):
        """Sinusoidal positions added to the (masked) input, then FFT blocks; padded positions stay zero."""

        def __init__(self):
            super().__init__()
            self.register_buffer(
                "inv_freq", 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0) / d_model)), persistent=False
            )
            self.drop = nn.Dropout(dropout)
            self.layers = nn.ModuleList(FFTBlock() for _ in range(n_layers))

        def forward(self, x, mask):  # x [B, T, D], mask [B, T, 1] float
            positions = torch.arange(x.shape[1], device=x.device, dtype=x.dtype)
            x = self.drop(x + sinusoid(positions, self.inv_freq)[None] * mask)
            for layer in self.layers:
                x = layer(x, mask)
            return x

    class ConvReLUNorm(nn.Module):
        def __init__(self, cin: int):
            super().__init__()
            self.conv = nn.Conv1d(cin, predictor_filter, kernel, padding=kernel // 2)
            self.norm = nn.LayerNorm(predictor_filter)
            self.drop = nn.Dropout(dropout)

        def forward(self, x):  # [B, C, T] -> [B, F, T]
            y = torch.relu(self.conv(x))
            return self.drop(self.norm(y.transpose(1, 2)).transpose(1, 2))

    class TemporalPredictor(nn.Module):
        """One value per token (log-duration or pitch) from the encoder output."""

        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(
                *(ConvReLUNorm(d_model if i == 0 else predictor_filter) for i in range(predictor_layers))
            )
            self.proj = nn.Linear(predictor_filter, 1)

        def forward(self, x, mask):  # x [B, T, D] -> [B, T]
            y = self.layers((x * mask).transpose(1, 2)).transpose(1, 2)
            return (self.proj(y) * mask).squeeze(2)

    class FastPitch(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(N_SYMBOLS, d_model, padding_idx=0)
            self.encoder = FFTransformer()
            self.duration_predictor = TemporalPredictor()
            self.pitch_predictor = TemporalPredictor()
            self.pitch_embedding = nn.Conv1d(1, d_model, kernel, padding=kernel // 2)
            self.decoder = FFTransformer()
            self.proj = nn.Linear(d_model, N_MELS)
            self.max_frames = MAX_FRAMES_PER_TOKEN * seq_len
            nn.init.constant_(self.duration_predictor.proj.bias, INIT_LOG_DURATION)

        def length_regulate(self, enc, durations):
            """enc [B, L, D], durations [B, L] int64 -> frames [B, T, D], frame mask [B, T, 1], lengths [B].

            Frame t of an utterance belongs to the first token whose cumulative duration exceeds t; T is the batch's
            longest (clamped) length, computed from the tensors so a trace stays valid for other inputs."""
            ends = torch.clamp(torch.cumsum(durations, dim=1), max=self.max_frames)  # [B, L]
            lengths = ends[:, -1]
            n_frames = torch.clamp(lengths.max(), min=1)
            frames = torch.arange(n_frames, device=enc.device)  # [T]
            token = (ends.unsqueeze(1) <= frames[None, :, None]).sum(dim=2)  # [B, T]: tokens finished before t
            token = torch.clamp(token, max=enc.shape[1] - 1)
            out = torch.gather(enc, 1, token.unsqueeze(2).expand(-1, -1, enc.shape[2]))
            mask = (frames[None, :] < lengths[:, None]).unsqueeze(2).to(enc.dtype)
            return out * mask, mask, lengths

        def forward(self, ids):  # ids [B, L] int64, 0: padding
            mask = (ids != 0).unsqueeze(2).to(torch.float32)  # [B, L, 1]
            enc = self.encoder(self.embedding(ids), mask)
            log_durations = self.duration_predictor(enc, mask)
            pitch = self.pitch_predictor(enc, mask)
            enc = enc + self.pitch_embedding(pitch.unsqueeze(1)).transpose(1, 2) * mask
            durations = torch.clamp(torch.round(torch.exp(log_durations) - 1.0), 1.0, float(MAX_TOKEN_FRAMES))
            durations = (durations * mask.squeeze(2)).to(torch.int64)  # padding tokens get no frames
            frames, frame_mask, lengths = self.length_regulate(enc, durations)
            dec = self.decoder(frames, frame_mask)
            mel = (self.proj(dec) * frame_mask).transpose(1, 2)  # [B, 80, T], zero past each length
            return mel, lengths.unsqueeze(1)

    return FastPitch()


class FastPitch(ModelAdapter):
    name = "fastpitch"
    framework = "pytorch"
    metric_name = None  # no labels: accuracy compares the served mel spectrograms with the framework's

    @property
    def _dims(self) -> dict:
        return _SIZES[self.size]

    @property
    def seq_len(self) -> int:
        return self._dims["seq_len"]

    def build(self):
        import torch

        torch.manual_seed(0)
        module = _build_module(**self._dims)
        if self.checkpoint:
            load_checkpoint(module, self.checkpoint)
        return module.eval()

    def io_spec(self) -> IoSpec:
        return IoSpec(
            inputs=[TensorSpec(name="input__0", dtype="int64", shape=[self.seq_len])],
            outputs=[
                TensorSpec(name="output__0", dtype="float32", shape=[N_MELS, -1]),
                TensorSpec(name="output__1", dtype="int64", shape=[1]),
            ],
        )

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        """Utterances of `data_dir/metadata.csv` in file order (repeated when more are asked for), as fixed-length
        padded symbol ids; without a dataset, random ids in [1, N_SYMBOLS) over random lengths, padded with 0."""
        if self.data_dir is not None:
            texts = read_metadata(self.data_dir)
            ids = np.stack([text_to_ids(texts[i % len(texts)], self.seq_len) for i in range(n_samples)])
        else:
            rng = np.random.default_rng(seed)
            ids = rng.integers(1, N_SYMBOLS, size=(n_samples, self.seq_len), dtype=np.int64)
            lengths = rng.integers(self.seq_len // 2, self.seq_len + 1, size=n_samples)
            ids[np.arange(self.seq_len)[None, :] >= lengths[:, None]] = 0
        for start in range(0, n_samples, batch_size):
            yield Batch(inputs={"input__0": ids[start : start + batch_size]}, labels=None)

    def predict(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError(
            "FastPitch has no labels to score; its served outputs are compared with the framework's"
        )

    def metric(self, predictions: np.ndarray, labels: np.ndarray) -> float:
        raise NotImplementedError("FastPitch has no labels")

    def defaults(self, profile: str) -> ServingDefaults:
        if profile == "gpu":  # the reference guide's parameters (sequence length 128)
            return ServingDefaults(
                max_batch_size=8,
                model_instances=2,
                preferred_batch_sizes=[4, 8],
                max_queue_delay_us=1,
                offline_batch_sizes=[1, 2, 4, 8],
                online_concurrency=list(range(1, 17)),
                accuracy_samples=256,
                formats=["ts-trace", "onnx"],
            )
        # cpu: the full model takes ~0.55 s per batch-1 utterance on 2 cores (128 tokens, ~880 frames) and a perf point
        # needs >= 3 windows, so its grid is [1, 2] with windows of 8 inferences (a loaded machine triples the time
        # per utterance); the small size is fast enough for the bigger grid and the profile's windows
        grid = [1, 2] if self.size == "full" else [1, 2, 4, 8]
        return ServingDefaults(
            max_batch_size=grid[-1],
            model_instances=1,
            preferred_batch_sizes=grid[-2:],
            max_queue_delay_us=2000,
            offline_batch_sizes=grid,
            online_concurrency=grid,
            accuracy_samples=16 if self.size == "full" else 32,
            formats=["ts-trace", "onnx"],
        )
