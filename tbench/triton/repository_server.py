"""tbench's own server over the copy of a user's repository: started with no model loaded (explicit model control),
then the plan's models loaded over gRPC in order, the steps before the ensembles that call them. A model the server
refuses is one line with the server's own reason (TritonServer.load). Everything else is the server's: a run reads
and measures it as it would a served model."""

from __future__ import annotations

from tbench.triton.server import ServerEndpoints, TritonServer


class RepositoryServer:
    def __init__(self, server: TritonServer, load_order: list[str]):
        self.server = server
        self.load_order = load_order

    def start(self) -> ServerEndpoints:
        endpoints = self.server.start()
        for name in self.load_order:
            self.server.load(name)  # with the copy's config.pbtxt (TritonServer._load_args)
        return endpoints

    def __getattr__(self, name: str):  # endpoints, alive, stop, identity, processes, ...: the server's
        return getattr(self.server, name)
