"""A user's Triton model repository (`--repository DIR --model NAME[:VERSION]`), read and checked before any server
starts: every config.pbtxt the model needs parses, its version folders are there, its ensemble steps name models of
the repository, and the server that will serve it can run each of them, natively or through tbench's python-backend
runtime. What it decides (`RepositoryPlan`): which models are copied into the run folder, which are loaded and in
which order, and what serves each and why. Nothing here writes: triton/repository_copy.py makes the copy.

Bad input is one line naming the file and the field (ConfigError), as Triton would refuse it at load time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.enums import Format
from tbench.core.errors import ConfigError
from tbench.request.benchmark import PYTHON_BACKEND_RUNTIMES
from tbench.triton.capabilities import ServerCapabilities
from tbench.triton.config import BACKEND_DIRS, ENSEMBLE, PLATFORMS, PYTHON_BACKEND
from tbench.triton.served import config_format

CONFIG_FILE = "config.pbtxt"
LATEST_STEP_VERSION = -1  # an ensemble step's model_version: the newest version its policy serves

# what served a model, in the report's and the manifest's words
NATIVELY = "served natively"
BY_RUNTIME = "by the python-backend runtime"


def parse_model_ref(value: str) -> tuple[str, str]:
    """NAME[:VERSION] -> (name, version); version "" is the model's version policy's newest."""
    name, _, version = value.strip().partition(":")
    if not name or "/" in name or (version and not version.isdigit()):
        raise ConfigError(
            f"--model {value!r} is not NAME or NAME:VERSION (a model folder's name; a version is a number)"
        )
    return name, version


def read_config(path: Path) -> mc.ModelConfig:
    """A config.pbtxt through Triton's own schema; one line naming the file and protobuf's message otherwise."""
    try:
        return text_format.Parse(path.read_text(), mc.ModelConfig())
    except text_format.ParseError as err:
        raise ConfigError(f"{path}: not a Triton model config: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read: {err}") from None


@dataclass(frozen=True)
class RepositoryModel:
    """One model folder of the user's repository: its config as written and its numeric version folders."""

    name: str
    path: Path
    config: mc.ModelConfig
    versions: tuple[int, ...]

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def kind(self) -> str:
        """Its platform or backend, as its config names it."""
        return self.config.platform or self.config.backend or "unknown"

    @property
    def kind_field(self) -> str:
        """The config field that names what serves it, as written."""
        return f'platform: "{self.config.platform}"' if self.config.platform else f'backend: "{self.config.backend}"'

    @property
    def is_ensemble(self) -> bool:
        return self.config.platform == ENSEMBLE

    @property
    def is_python(self) -> bool:
        """A python-backend model with its own model.py: it may call any model of the repository (BLS)."""
        return self.config.backend == PYTHON_BACKEND and not self.config.platform

    @property
    def steps(self) -> list[str]:
        return [s.model_name for s in self.config.ensemble_scheduling.step]

    def served_versions(self) -> list[int]:
        """The versions Triton loads under its version_policy (latest 1 by default)."""
        policy = self.config.version_policy
        which = policy.WhichOneof("policy_choice")
        if which == "all":
            return list(self.versions)
        if which == "specific":
            return [v for v in self.versions if v in set(policy.specific.versions)]
        count = policy.latest.num_versions if which == "latest" else 1
        return sorted(self.versions)[-max(count, 1) :]


def read_model(root: Path, name: str) -> RepositoryModel:
    """The model folder `name` of `root`, its config parsed and its version folders listed, or one line why not."""
    path = root / name
    if not (path / CONFIG_FILE).is_file():
        known = ", ".join(sorted(p.parent.name for p in root.glob(f"*/{CONFIG_FILE}"))) or "none"
        where = "no folder" if not path.is_dir() else f"no {CONFIG_FILE} in {path}"
        raise ConfigError(f"{root}: no model {name!r} ({where}); its models: {known}")
    config = read_config(path / CONFIG_FILE)
    if config.name and config.name != name:
        raise ConfigError(f"{path / CONFIG_FILE}: name {config.name!r} is not its folder's name {name!r}")
    versions = tuple(sorted(int(p.name) for p in path.iterdir() if p.is_dir() and p.name.isdigit()))
    if not versions:
        raise ConfigError(f"{path}: no numeric version folder (Triton serves {name}/1/, {name}/2/, ...)")
    return RepositoryModel(name, path, config, versions)


@dataclass(frozen=True)
class HowServed:
    """What serves one model of the copy: its own backend (`runtime` None) or tbench's python-backend runtime."""

    kind: str  # its platform or backend as written
    runtime: str | None  # the python-backend runtime that serves it in the copy
    why: str

    @property
    def native(self) -> bool:
        return self.runtime is None

    @property
    def label(self) -> str:
        """The results' `backend` column."""
        return self.kind if self.native else f"python ({self.runtime})"

    def line(self) -> str:
        return f"{self.kind}, {NATIVELY if self.native else BY_RUNTIME}: {self.why}"


def how_served(model: RepositoryModel, caps: ServerCapabilities) -> HowServed:
    """What serves `model` on a server that can do `caps`, or one line naming its config's field and why not."""
    if model.is_ensemble:
        return HowServed(ENSEMBLE, None, "Triton's ensemble scheduler")
    if model.is_python:
        if PYTHON_BACKEND not in caps.backends:
            raise ConfigError(f"{model.config_path}: {model.kind_field}: the server has no python backend")
        return HowServed(PYTHON_BACKEND, None, "the python backend, with the model's own model.py")
    fmt = config_format(model.config)
    if fmt is None:  # a backend tbench has no runtime for (openvino, fil, ...): the server's own or nothing
        if model.kind in caps.backends:
            return HowServed(model.kind, None, f"the server has the {model.kind} backend")
        raise ConfigError(
            f"{model.config_path}: {model.kind_field}: the server has no {model.kind} backend and tbench's "
            f"python-backend runtime serves only {', '.join(sorted({f.value for f in PYTHON_BACKEND_RUNTIMES}))}"
        )
    backend = BACKEND_DIRS.get(PLATFORMS.get(fmt, ""), model.kind)
    if caps.native(fmt):
        return HowServed(model.kind, None, f"the server has the {backend} backend")
    if fmt is Format.TRT:
        raise ConfigError(
            f"{model.config_path}: {model.kind_field}: a TensorRT plan needs TensorRT, which this server lacks"
        )
    if not caps.python_runs(fmt):
        raise ConfigError(f"{model.config_path}: {model.kind_field}: the server can serve it {caps.why_not(fmt)}")
    if not model.config.input or not model.config.output:
        raise ConfigError(
            f"{model.config_path}: no input or output: tbench's python-backend runtime serves {model.name} from its "
            "config, which must list them (Triton's auto-complete is the native backend's)"
        )
    runtime = PYTHON_BACKEND_RUNTIMES[fmt]
    return HowServed(model.kind, runtime, f"the server has no {backend} backend; its python backend runs {runtime}")


def _step_batch(model: RepositoryModel, index: int, by: RepositoryModel) -> None:
    """Triton refuses an ensemble whose batch is larger than a step's: the step could not take its requests whole."""
    if by.config.max_batch_size > 0 and model.config.max_batch_size < by.config.max_batch_size:
        raise ConfigError(
            f"{model.config_path}: max_batch_size {model.config.max_batch_size} is below the max_batch_size "
            f"{by.config.max_batch_size} of ensemble {by.name} (its ensemble_scheduling.step[{index}]): Triton refuses "
            "it; raise it or lower the ensemble's"
        )


def _step_version(model: RepositoryModel, step: mc.ModelEnsembling.Step, index: int, by: RepositoryModel) -> None:
    if step.model_version != LATEST_STEP_VERSION and step.model_version not in model.served_versions():
        raise ConfigError(
            f"{by.config_path}: ensemble_scheduling.step[{index}].model_version {step.model_version}: {model.name} "
            f"serves {', '.join(map(str, model.served_versions()))}"
        )


def needed_models(root: Path, name: str) -> list[RepositoryModel]:
    """`name` and every model its ensembles name, each once, steps before the ensembles that call them (the order
    they load in); one line naming the ensemble's file and step where a step names a model that is not there."""
    order: list[RepositoryModel] = []
    seen: set[str] = set()

    def visit(model: RepositoryModel, path: tuple[str, ...]) -> None:
        if model.name in path:
            raise ConfigError(
                f"{model.config_path}: ensemble_scheduling: {' -> '.join([*path, model.name])} is a cycle"
            )
        if model.name in seen:
            return
        for i, step in enumerate(model.config.ensemble_scheduling.step):
            if not (root / step.model_name / CONFIG_FILE).is_file():
                raise ConfigError(
                    f"{model.config_path}: ensemble_scheduling.step[{i}].model_name {step.model_name!r}: no such "
                    f"model in {root}"
                )
            composing = read_model(root, step.model_name)
            _step_version(composing, step, i, model)
            _step_batch(composing, i, model)
            visit(composing, (*path, model.name))
        seen.add(model.name)
        order.append(model)

    visit(read_model(root, name), ())
    return order


@dataclass(frozen=True)
class RepositoryPlan:
    """What a run does with the user's repository: copies `copied` into the run folder, loads `loaded` in order
    (every ensemble after its steps), each served as `served` says; `skipped`: copied models it does not load, and
    why."""

    source: Path
    model: str
    version: str  # the version measured ("" when none was asked: the newest its policy serves)
    copied: list[str]
    loaded: list[str]
    served: dict[str, HowServed]
    whole: bool = False  # every model copied: a python model may call any of them (BLS), which no config says
    skipped: dict[str, str] = field(default_factory=dict)

    def served_by(self) -> dict[str, str]:
        """Per loaded model: what served it and why, in words (the report's and the manifest's)."""
        return {name: how.line() for name, how in self.served.items()}

    def manifest(self) -> dict:
        return {
            "source": str(self.source),
            "model": self.model,
            "version": self.version or None,
            "copied": self.copied,
            "whole_repository": self.whole,
            "loaded": self.loaded,
            "served_by": {
                n: {"kind": h.kind, "natively": h.native, "runtime": h.runtime, "why": h.why}
                for n, h in self.served.items()
            },
            "skipped": self.skipped,
        }


def plan_repository(source: str | Path, model: str, caps: ServerCapabilities) -> RepositoryPlan:
    """The plan for measuring `model` (NAME[:VERSION]) of the repository at `source` on a server that can do `caps`;
    one line naming the file and field of the first thing Triton or that server would refuse."""
    root = Path(source).expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(f"--repository {source}: no such folder")
    name, version = parse_model_ref(model)
    needed = needed_models(root, name)
    target = needed[-1]
    if version and int(version) not in target.versions:
        raise ConfigError(f"{target.path}: no version folder {version} (it has {', '.join(map(str, target.versions))})")
    if version and int(version) not in target.served_versions():
        raise ConfigError(
            f"{target.config_path}: version_policy serves {', '.join(map(str, target.served_versions()))}, "
            f"not version {version}"
        )
    served = {m.name: how_served(m, caps) for m in needed}
    copied, extra, skipped = [m.name for m in needed], [], {}
    whole = any(m.is_python for m in needed)
    if whole:  # BLS: a python model may call any model, so every model is copied and, where it can be, loaded first
        copied = sorted(p.parent.name for p in root.glob(f"*/{CONFIG_FILE}"))
        for other in copied:
            if other in served:
                continue
            try:
                chain = needed_models(root, other)
                hows = {m.name: how_served(m, caps) for m in chain}
            except ConfigError as err:
                skipped[other] = str(err)
                continue
            for m in chain:
                if m.name not in served:
                    served[m.name] = hows[m.name]
                    extra.append(m.name)
    loaded = [m.name for m in needed] + extra  # each chain's steps first: the order holds across chains
    return RepositoryPlan(root, name, version, copied, loaded, served, whole, skipped)
