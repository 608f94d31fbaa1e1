"""The FastPitch adapter, small size (fast, CPU): shapes, the length regulator, tracing, checkpoints, data, export,
and one served inference on the embedded Triton server."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_adapters.fastpitch import MAX_FRAMES_PER_TOKEN, MAX_TOKEN_FRAMES, N_MELS, N_SYMBOLS, SYMBOL_IDS, FastPitch
from tbench.core.enums import Format
from tbench.core.errors import ConfigError
from tbench.core.runtimes import run_pytorch, source_digest
from tbench.stages.correctness import check_artifacts
from tbench.stages.export import export_model

SEQ = 16  # the small size's sequence length


@pytest.fixture(scope="module")
def adapter():
    return FastPitch("small")


@pytest.fixture(scope="module")
def module(adapter):
    return adapter.build()


@pytest.fixture(scope="module")
def artifacts(adapter, module, tmp_path_factory):
    out = tmp_path_factory.mktemp("fastpitch-models")
    digest = source_digest("pytorch", module)
    return [export_model(adapter, module, fmt, out, digest) for fmt in (Format.TS_TRACE, Format.ONNX)]


def run(module, adapter, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = run_pytorch(module, adapter.io_spec(), {"input__0": ids})
    return out["output__0"], out["output__1"]


def test_io_spec_shapes_and_dtypes(adapter, module):
    spec = adapter.io_spec()
    assert [(t.name, t.dtype, t.shape) for t in spec.inputs] == [("input__0", "int64", [SEQ])]
    assert [(t.name, t.dtype, t.shape) for t in spec.outputs] == [
        ("output__0", "float32", [N_MELS, -1]),
        ("output__1", "int64", [1]),
    ]
    assert adapter.input_shapes() == {"input__0": [SEQ]}
    ids = adapter.sample_batch(4)["input__0"]
    assert ids.shape == (4, SEQ) and ids.dtype == np.int64
    mel, lengths = run(module, adapter, ids)
    assert mel.dtype == np.float32 and lengths.dtype == np.int64
    assert mel.shape == (4, N_MELS, lengths.max()) and lengths.shape == (4, 1)
    assert np.isfinite(mel).all() and mel.std() > 0


def test_every_token_gets_frames_and_lengths_match_the_nonzero_frames(adapter, module):
    ids = adapter.sample_batch(8, seed=3)["input__0"]
    tokens = (ids != 0).sum(axis=1)
    assert len(set(tokens)) > 1  # the synthetic data varies in length
    mel, lengths = run(module, adapter, ids)
    lengths = lengths[:, 0]
    assert (lengths >= tokens).all()  # at least one frame per token
    assert (lengths <= np.minimum(MAX_TOKEN_FRAMES * tokens, MAX_FRAMES_PER_TOKEN * SEQ)).all()
    nonzero_frames = (np.abs(mel) > 0).any(axis=1)  # [B, T]
    for row, n in zip(nonzero_frames, lengths):
        assert row[:n].all() and not row[n:].any()
    assert len(set(lengths)) > 1 and mel.shape[2] == lengths.max()  # padded to the batch's longest


def test_padding_only_input_gives_no_frames_and_no_nans(adapter, module):
    ids = adapter.sample_batch(2, seed=4)["input__0"]
    ids[1] = 0
    mel, lengths = run(module, adapter, ids)
    assert lengths[1, 0] == 0 and lengths[0, 0] > 0
    assert np.isfinite(mel).all() and not mel[1].any()
    alone, length = run(module, adapter, ids[1:])
    assert length[0, 0] == 0 and alone.shape == (1, N_MELS, 1) and not alone.any()


def test_total_frames_are_clamped(adapter):
    module = adapter.build()
    with torch.no_grad():
        module.duration_predictor.proj.bias.fill_(10.0)  # every token asks for far more than MAX_TOKEN_FRAMES
    ids = np.tile(np.arange(1, SEQ + 1, dtype=np.int64), (2, 1))
    ids[1, 4:] = 0
    mel, lengths = run(module, adapter, ids)
    assert lengths[:, 0].tolist() == [MAX_FRAMES_PER_TOKEN * SEQ, 4 * MAX_TOKEN_FRAMES]
    assert mel.shape == (2, N_MELS, MAX_FRAMES_PER_TOKEN * SEQ) and np.isfinite(mel).all()


def test_same_weights_and_outputs_on_two_builds(adapter, module):
    ids = adapter.sample_batch(3, seed=5)["input__0"]
    again = adapter.build()
    assert all(torch.equal(a, b) for a, b in zip(module.state_dict().values(), again.state_dict().values()))
    first, second = run(module, adapter, ids), run(again, adapter, ids)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])


def test_trace_generalises_to_other_batch_sizes_and_inputs(adapter, module):
    example = adapter.sample_batch(2, seed=1)["input__0"]
    with torch.inference_mode():
        traced = torch.jit.trace(module, (torch.from_numpy(example),), check_trace=False)
    traced_frames = run(module, adapter, example)[0].shape[2]
    for n, seed in ((3, 9), (1, 10), (5, 11)):
        ids = adapter.sample_batch(n, seed=seed)["input__0"]
        want_mel, want_len = run(module, adapter, ids)
        got_mel, got_len = run(traced, adapter, ids)
        np.testing.assert_array_equal(got_len, want_len)
        assert got_mel.shape == want_mel.shape and got_mel.shape[0] == n
        np.testing.assert_allclose(got_mel, want_mel, atol=1e-4, rtol=0)
        if n == 3:
            assert want_mel.shape[2] != traced_frames  # a frame count other than the trace example's


def test_checkpoint_round_trip(adapter, module, tmp_path):
    trained = adapter.build()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    ids = adapter.sample_batch(2, seed=6)["input__0"]
    expected = run(trained, adapter, ids)
    plain, wrapped = tmp_path / "fastpitch.pt", tmp_path / "fastpitch_wrapped.pt"
    torch.save(trained.state_dict(), plain)
    torch.save({"state_dict": {f"module.{k}": v for k, v in trained.state_dict().items()}}, wrapped)
    for path in (plain, wrapped):
        loaded = FastPitch("small", str(path)).build()
        got = run(loaded, adapter, ids)
        np.testing.assert_array_equal(got[1], expected[1])
        np.testing.assert_allclose(got[0], expected[0], atol=1e-6, rtol=1e-6)
    assert not np.array_equal(run(module, adapter, ids)[0], expected[0])


def test_bad_checkpoint_raises_config_error(adapter, tmp_path):
    with pytest.raises(ConfigError, match="cannot read checkpoint"):
        FastPitch("small", str(tmp_path / "missing.pt")).build()
    torch.save([1, 2, 3], tmp_path / "list.pt")
    not_checkpoints = (
        ("garbage.pt", b"not a checkpoint"),
        ("empty.pt", b""),
        ("text.pt", b"hello\n" * 50),
        ("list.pt", None),
    )
    for name, content in not_checkpoints:
        if content is not None:
            (tmp_path / name).write_bytes(content)
        with pytest.raises(ConfigError, match="cannot read checkpoint|is not a state dict") as info:
            FastPitch("small", str(tmp_path / name)).build()
        assert "\n" not in str(info.value)
    state = adapter.build().state_dict()
    state.pop("proj.weight")
    partial = tmp_path / "partial.pt"
    torch.save(state, partial)
    with pytest.raises(ConfigError, match="does not fit") as info:
        FastPitch("small", str(partial)).build()
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="unknown size"):
        FastPitch("tiny")


def test_dataloader_reads_ljspeech_metadata(tmp_path):
    rows = [
        "LJ001-0001|Raw 1st text.|Hi, Bob!",  # the normalized text (third column) is used; upper case is lowered
        'LJ001-0002|Unnormalized|\u00e9a1b"c',  # characters outside the symbol table are skipped
        "",  # blank lines are ignored
        "LJ001-0003|abcdefghijklmnopqrstuvwxyz",  # two columns: the text; truncated to the sequence length
    ]
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    adapter = FastPitch("small", None, data_dir=str(tmp_path))
    batches = list(adapter.batches(5, 2))
    assert [len(b.inputs["input__0"]) for b in batches] == [2, 2, 1] and all(b.labels is None for b in batches)
    ids = np.concatenate([b.inputs["input__0"] for b in batches])
    assert ids.dtype == np.int64 and ids.shape == (5, SEQ)

    def expect(text):
        row = np.zeros(SEQ, dtype=np.int64)
        row[: len(text)] = [SYMBOL_IDS[c] for c in text]
        return row

    np.testing.assert_array_equal(ids[0], expect("hi, bob!"))
    np.testing.assert_array_equal(ids[1], expect("abc"))
    np.testing.assert_array_equal(ids[2], expect("abcdefghijklmnop"))
    np.testing.assert_array_equal(ids[3:], ids[:2])  # more samples than utterances: from the start again
    assert ids.max() < N_SYMBOLS and ids.min() >= 0
    module = adapter.build()
    mel, lengths = run(module, adapter, ids)
    assert (lengths[:, 0] >= (ids != 0).sum(axis=1)).all()


def test_dataloader_errors(tmp_path):
    with pytest.raises(ConfigError, match="metadata.csv"):
        FastPitch("small", data_dir=str(tmp_path)).sample_batch(1)
    (tmp_path / "metadata.csv").write_text("\n\n")
    with pytest.raises(ConfigError, match="no utterances"):
        FastPitch("small", data_dir=str(tmp_path)).sample_batch(1)
    (tmp_path / "metadata.csv").write_text("just text without fields\n")
    with pytest.raises(ConfigError, match="id\\|text"):
        FastPitch("small", data_dir=str(tmp_path)).sample_batch(1)


def test_synthetic_data(adapter):
    ids = np.concatenate([b.inputs["input__0"] for b in adapter.batches(64, 16, seed=1)])
    assert ids.shape == (64, SEQ) and ids.min() >= 0 and ids.max() < N_SYMBOLS
    lengths = (ids != 0).sum(axis=1)
    assert lengths.min() >= SEQ // 2 and lengths.max() == SEQ
    assert all((row[:n] != 0).all() and (row[n:] == 0).all() for row, n in zip(ids, lengths))  # padding at the end only
    np.testing.assert_array_equal(
        adapter.sample_batch(4, seed=3)["input__0"], adapter.sample_batch(4, seed=3)["input__0"]
    )
    assert not np.array_equal(adapter.sample_batch(4, seed=3)["input__0"], adapter.sample_batch(4, seed=4)["input__0"])


def test_adapter_identity_and_defaults(adapter, tmp_path):
    import model_adapters

    assert (FastPitch.name, FastPitch.framework, FastPitch.metric_name) == ("fastpitch", "pytorch", None)
    with pytest.raises(NotImplementedError):
        adapter.predict({})
    with pytest.raises(NotImplementedError):
        adapter.metric(np.zeros(1), np.zeros(1))
    gpu = FastPitch("full").defaults("gpu")
    assert (gpu.max_batch_size, gpu.model_instances, gpu.preferred_batch_sizes, gpu.max_queue_delay_us) == (
        8,
        2,
        [4, 8],
        1,
    )
    assert gpu.offline_batch_sizes == [1, 2, 4, 8] and gpu.online_concurrency == list(range(1, 17))
    for size in ("small", "full"):
        d = FastPitch(size).defaults("cpu")
        assert d.formats == ["ts-trace", "onnx"]
        assert max(d.offline_batch_sizes + d.preferred_batch_sizes) <= d.max_batch_size
    rebuilt = eval(
        FastPitch("small", None, data_dir=str(tmp_path)).reproduce_expr(), {"model_adapters": model_adapters}
    )
    assert (rebuilt.size, rebuilt.data_dir) == ("small", str(tmp_path))


def test_export_and_correctness(adapter, module, artifacts):
    assert [a.format for a in artifacts] == [Format.TS_TRACE, Format.ONNX]
    results = check_artifacts(adapter, module, artifacts, atol=1e-4, rtol=1e-4, batch_size=5)  # exported at batch 2
    for r in results:
        assert [o.output for o in r.outputs] == ["output__0", "output__1"]
        assert all(o.passed for o in r.outputs), r


@pytest.mark.e2e
def test_served_outputs_match_the_module(adapter, module, artifacts, tmp_path):
    import tritonclient.grpc as grpcclient

    from tbench.stages.accuracy import infer_triton
    from tbench.triton.process_server import EmbeddedServer
    from tbench.triton.repository import ServingConfig, write_repository

    def name(artifact):
        return "fastpitch_" + artifact.format.value.replace("-", "_")

    repo = tmp_path / "repo"
    for artifact in artifacts:  # both formats in one server: the guide's ts-trace and onnx
        write_repository(repo, ServingConfig(name(artifact), 8, [8], 1000, 1), artifact)
    ids = adapter.sample_batch(3, seed=21)["input__0"]
    want = run_pytorch(module, adapter.io_spec(), {"input__0": ids})
    with EmbeddedServer(repo, tmp_path / "tritonserver.log") as server:
        client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
        try:
            for artifact in artifacts:
                got = infer_triton(client, name(artifact), adapter.io_spec(), {"input__0": ids})
                np.testing.assert_array_equal(got["output__1"], want["output__1"])
                assert got["output__0"].shape == want["output__0"].shape
                np.testing.assert_allclose(got["output__0"], want["output__0"], atol=1e-3, rtol=0)
        finally:
            client.close()
