"""A model of the user's own Triton repository (`tbench run --repository DIR --model NAME[:VERSION]`): wiring only.
The repository is checked and the model with everything it needs copied into the run folder (the user's folder is
only read), served there by a server tbench starts, its models loaded over gRPC; from then on the run is a served
model's (flows/served.py): inputs from the model's config as served, the same sweeps and report, with what served
each model and why."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from flows.lifecycle import run_lifecycle
from flows.served import measure_served
from tbench.core.handover import local_path
from tbench.planning.plan import server_options
from tbench.request.benchmark import BenchmarkRequest
from tbench.request.repository import check_repository
from tbench.triton.config import PYTHON_BACKEND
from tbench.triton.repository_copy import copy_repository
from tbench.triton.repository_server import RepositoryServer
from tbench.triton.served import ServedModel
from tbench.triton.server_modes import make_server
from tbench.triton.serving import CPU_LABEL, served_on
from tbench.triton.user_repository import ENSEMBLE, RepositoryPlan, parse_model_ref, plan_repository

REPOSITORY_PLAN = "repository.json"  # what was copied and loaded, and what served each model, in the run folder


def repository_benchmark(request: BenchmarkRequest, hardware) -> str:
    """Measure `request.repository_model` of `request.repository`; returns the URL of the run folder."""
    req = check_repository(request)
    # a submitted repository is an upload's URL: fetched (every file checked) into this worker's cache, read there
    req = req.model_copy(update={"repository": local_path(req.repository)})
    name, version = parse_model_ref(req.repository_model)
    with run_lifecycle(req, hardware, name, req.model_dump(mode="json")) as tracker:
        return measure_served(req, hardware, name, version, tracker, RepositorySource(req, hardware, tracker.layout))


def repository_server(req: BenchmarkRequest, hardware, layout):
    """The server a repository run starts over its copy: the request's mode, no model loaded until asked."""
    return make_server(
        req.server,
        layout.repository_dir,
        layout.server_log,
        http_port=req.http_port,
        grpc_port=req.grpc_port,
        model_control="explicit",
        **server_options(req, hardware),
    )


class RepositorySource:
    """The user's repository as a served run's source (flows/served.py: AsServed's methods): its copy, served by a
    server of ours, and the results named by what served each model."""

    def __init__(self, req: BenchmarkRequest, hardware, layout):
        self.req, self.hardware, self.layout = req, hardware, layout
        self.base = repository_server(req, hardware, layout)
        self.server = RepositoryServer(self.base, [])
        self.plan: RepositoryPlan | None = None
        self.backend: str | None = None  # the results' backend column, once the model is served

    def prepare(self, tracker) -> None:
        with tracker.stage("repository"):
            self.plan = plan_repository(self.req.repository, self.req.repository_model, self.base.capabilities())
            copy_repository(self.plan, self.layout.repository_dir)
            self.server.load_order = self.plan.loaded
            tracker.save_json(self.layout.run_dir / REPOSITORY_PLAN, self.plan.manifest())

    def labels(self, served: ServedModel) -> dict:
        how = self.plan.served[served.name]
        if how.kind == ENSEMBLE:
            steps = [s.model_name for s in served.config.ensemble_scheduling.step]
            backend = "ensemble of " + ", ".join(f"{s} ({self.plan.served[s].label})" for s in steps)
        else:
            backend = how.label
        self.backend = backend
        return {
            "model_size": f"repository v{served.version}" if served.version else "repository",
            "gpu": self._device(served),
            "backend": backend,
            "backend_accelerator": "as configured",
        }

    def _device(self, served: ServedModel) -> str:
        """The results' gpu label, as planned from the config's instance kinds (KIND_GPU where this node has one)."""
        gpu = mc.ModelInstanceGroup.KIND_GPU
        if not self.hardware.has_gpu or not any(g.kind == gpu for g in served.config.instance_group):
            return CPU_LABEL
        how = self.plan.served[served.name]
        return served_on(self.req.server, self.hardware, how.runtime, [how.runtime] if how.runtime else []).label

    def served_by(self, served: ServedModel) -> dict[str, str]:
        return self.plan.served_by() if self.plan else {}

    def steps(self, served: ServedModel) -> list[str]:
        """The models a pipeline may run, read at each point: an ensemble's or a python model's, every other model
        loaded (a python model may call any; those it did not call get no row)."""
        if self.plan.served[served.name].kind not in (ENSEMBLE, PYTHON_BACKEND):  # as the user wrote it
            return []
        return [name for name in self.plan.loaded if name != served.name]

    def manifest(self) -> dict:
        return {"repository": self.plan.manifest() if self.plan else {"source": self.req.repository}}

    def report(self) -> dict:
        plan = self.plan
        title = f"{self.req.repository_model} from {self.req.repository}"
        section = []
        if plan is not None:
            section = [
                "## Repository",
                "",
                f"Copied from `{plan.source}` into the run folder's `model_repository` (your folder was only read): "
                + ", ".join(plan.copied)
                + (" (the whole repository: a python model may call any of its models)" if plan.whole else "")
                + ". Loaded in this order: "
                + ", ".join(plan.loaded)
                + ".",
                "",
                "| Model | Served by |",
                "| --- | --- |",
                *(f"| {name} | {line} |" for name, line in plan.served_by().items()),
                *(f"| {name} | not loaded: {why} |" for name, why in plan.skipped.items()),
                "",
            ]
        return {
            "title": title,
            "intro": "A model of your own repository, served with its config.pbtxt as written on a server tbench "
            "started over a copy.",
            "server": f"({self.req.server}, started by tbench)",
            "served_by": plan.served_by()[plan.model] if plan else "-",  # each model's: the section above
            "backend": self.backend,
            "section": section,
        }
