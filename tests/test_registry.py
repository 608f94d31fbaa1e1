"""The one registry style: a name registered twice by different objects is refused, in each place that registers."""

import re
from types import SimpleNamespace

import pytest

from tbench.core.enums import Format
from tbench.core.errors import ConfigError
from tbench.core.registry import Registry, RegistryError, label, qualified_name


def first():
    pass


def second():
    pass


def test_register_by_call_and_by_decorator():
    reg: Registry[str, object] = Registry("widget")
    assert reg.register("a", first) is first

    @reg.register("b")
    def deco():
        pass

    assert reg.get("a") is first and reg["b"] is deco
    assert reg.names() == ["a", "b"] and list(reg) == ["a", "b"] and reg.items() == [("a", first), ("b", deco)]
    assert "a" in reg and "c" not in reg and [] not in reg and len(reg) == 2


def test_duplicate_is_refused_with_both_named():
    reg: Registry[str, object] = Registry("widget")
    reg.register("a", first)
    with pytest.raises(RegistryError) as err:
        reg.register("a", second)
    assert str(err.value) == (f"widget a is registered twice: by {__name__}:first and by {__name__}:second")
    assert isinstance(err.value, ConfigError) and reg.get("a") is first  # the first one stays


def test_same_object_twice_is_a_no_op_and_a_reloaded_definition_replaces():
    reg: Registry[str, object] = Registry("widget")
    reg.register("a", first)
    reg.register("a", first)
    reloaded = SimpleNamespace(
        __module__=first.__module__, __qualname__=first.__qualname__
    )  # same definition, new object
    reg.register("a", reloaded)
    assert reg.get("a") is reloaded and reg.names() == ["a"]


def test_unknown_name_is_one_line_listing_the_known():
    reg: Registry[str, object] = Registry("widget")
    reg.register("b", first)
    reg.register("a", second)
    with pytest.raises(ConfigError, match=r"^unknown widget 'c'; known: b, a$"):
        reg.get("c")
    with pytest.raises(ConfigError, match=r"^unknown widget 'c'; known: b, a$"):
        reg["c"]


def test_compound_names_and_labels():
    reg: Registry[tuple[str, Format], object] = Registry("converter")
    reg.register(("onnx", Format.TRT), first)
    assert ("onnx", Format.TRT) in reg and label(("onnx", Format.TRT)) == "onnx/trt"
    with pytest.raises(RegistryError, match="converter onnx/trt is registered twice"):
        reg.register(("onnx", Format.TRT), second)
    assert qualified_name(SimpleNamespace()) == "types:SimpleNamespace"  # an instance: its type


def test_model_adapter_duplicate_is_refused():
    import model_adapters
    from model_adapters.resnet50 import ResNet50

    model_adapters.names()  # the built-ins are registered
    model_adapters.register(ResNet50)  # the same class again: fine

    class Other(ResNet50):
        pass

    with pytest.raises(
        RegistryError,
        match=r"model adapter resnet50/pytorch is registered twice: by "
        r"model_adapters\.resnet50:ResNet50 and by .*Other",
    ):
        model_adapters.register(Other)
    assert type(model_adapters.get("resnet50")) is ResNet50


def test_plugin_duplicating_a_built_in_is_refused_at_load(monkeypatch):
    import model_adapters
    from model_adapters.resnet50 import ResNet50

    class Plugin(ResNet50):
        pass

    ep = SimpleNamespace(name="theirs", load=lambda: Plugin)
    monkeypatch.setattr(model_adapters, "entry_points", lambda group: [ep] if group == "tbench.model_adapters" else [])
    with pytest.raises(RegistryError) as err:
        model_adapters.names()
    line = str(err.value)
    assert line.startswith("entry point 'theirs' (tbench.model_adapters): model adapter resnet50/pytorch is registered")
    assert "model_adapters.resnet50:ResNet50" in line and "Plugin" in line and "\n" not in line


def test_converter_duplicate_is_refused():
    from tbench.stages.converters.registry import REGISTRY, converter

    before = REGISTRY[("pytorch", Format.ONNX)]
    with pytest.raises(
        RegistryError,
        match=rf"converter pytorch/onnx is registered twice: by "
        rf"{re.escape(before.run.__module__)}:pytorch_to_onnx and by .*another",
    ):

        @converter("pytorch", Format.ONNX, tools=("torch",))
        def another(module, out, spec, options, sample):
            pass

    assert REGISTRY[("pytorch", Format.ONNX)] is before


def test_server_mode_duplicate_is_refused_and_modes_are_the_registry():
    from tbench.triton.process_server import LocalServer
    from tbench.triton.server_modes import SERVER_MODES

    assert SERVER_MODES.names() == ["embedded", "local", "docker", "remote"]
    with pytest.raises(RegistryError, match="server mode docker is registered twice"):
        SERVER_MODES.register("docker", LocalServer)


def test_search_strategy_duplicate_is_refused_and_the_flow_takes_the_registry_names():
    from tbench.search.request import SearchRequest
    from tbench.search.strategies import STRATEGIES, smart_search

    assert STRATEGIES.names() == ["smart", "exhaustive"]
    STRATEGIES.register("smart", smart_search)
    with pytest.raises(RegistryError, match="search strategy smart is registered twice"):
        STRATEGIES.register("smart", first)
    assert SearchRequest(strategy="exhaustive").strategy == "exhaustive"
    with pytest.raises(ValueError, match="Input should be 'smart' or 'exhaustive'"):
        SearchRequest(strategy="random")


def test_unknown_search_strategy_fails_before_any_artifact():
    from tasks.search_eval import search_task

    with pytest.raises(ConfigError, match=r"^unknown search strategy 'random'; known: smart, exhaustive$"):
        search_task.fn("random", None, None, None, None)
