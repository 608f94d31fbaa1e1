import numpy as np
import pytest

from tbench.core.artifacts import CorrectnessResult
from tbench.core.enums import Format
from tbench.core.errors import CorrectnessError
from tbench.stages.correctness import check_artifacts, compare, require_passed


def test_compare_uses_tolerance_relative_to_the_outputs_magnitude():
    ref = {"y": np.array([[100.0, -50.0]], dtype=np.float32)}
    close = {"y": ref["y"] + 0.05}
    far = {"y": ref["y"] + 0.5}
    (ok,) = compare(ref, close, atol=1e-3, rtol=1e-3)  # tolerance 0.001 + 0.1
    (bad,) = compare(ref, far, atol=1e-3, rtol=1e-3)
    assert (
        ok.passed
        and ok.max_abs_err == pytest.approx(0.05, rel=1e-3)
        and ok.max_rel_err == pytest.approx(0.0005, rel=1e-3)
    )
    assert not bad.passed


def test_shape_mismatch_is_an_error():
    with pytest.raises(CorrectnessError, match="shape"):
        compare({"y": np.zeros((2, 3))}, {"y": np.zeros((2, 4))}, 1e-3, 1e-3)


def test_exported_small_resnet_matches_the_framework(small_adapter, small_module, small_artifacts):
    results = check_artifacts(small_adapter, small_module, small_artifacts, atol=1e-3, rtol=1e-3)
    assert [r.format for r in results] == [Format.ONNX, Format.TS_TRACE]
    assert all(r.passed for r in results)
    assert results[0].outputs[0].max_abs_err < 1e-3
    require_passed(results)


def test_a_failing_output_fails_the_stage(small_adapter, small_module, small_artifacts):
    (result,) = check_artifacts(small_adapter, small_module, small_artifacts[:1], atol=0.0, rtol=0.0)
    strict = CorrectnessResult(
        format=result.format,
        batch_size=result.batch_size,
        outputs=[o.model_copy(update={"passed": False}) for o in result.outputs],
    )
    with pytest.raises(CorrectnessError, match="onnx output output__0 differs"):
        require_passed([strict])


def test_checkpoint_loads_and_a_wrong_one_is_refused(tmp_path, small_module):
    import torch

    import model_adapters
    from tbench.core.errors import ConfigError

    path = tmp_path / "ckpt.pt"
    state = {k: torch.full_like(v, 0.5) if v.is_floating_point() else v for k, v in small_module.state_dict().items()}
    torch.save({"state_dict": {"module." + k: v for k, v in state.items()}}, path)
    loaded = model_adapters.get("resnet50", "small", checkpoint=str(path)).build()
    assert torch.equal(loaded.fc.weight, torch.full_like(loaded.fc.weight, 0.5))
    with pytest.raises(ConfigError, match="does not fit this model"):
        model_adapters.get("resnet50", "full", checkpoint=str(path)).build()
