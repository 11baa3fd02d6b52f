"""Request latency of a RemotingServer as a Prometheus histogram, the same for every daemon (broker and name
server): ``trimq_rpc_latency_seconds{request_code, response_code}``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram

from trimq.protocol.codes import code_name

if TYPE_CHECKING:
    from trimq.runtime.server import RemotingServer

__all__ = ["RPC_BUCKETS", "RpcMetrics"]

RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0)


class RpcMetrics:
    """``trimq_rpc_latency_seconds{request_code, response_code}``, fed by ``RemotingServer.observe``.

    The label children are cached per (request, response) code pair, so a request costs a dict lookup and
    one histogram observation. Request codes nobody handles are labelled ``other``: clients choose them, and
    a label per unknown number would let one client grow the registry without bound.
    """

    def __init__(self, registry: CollectorRegistry, server: RemotingServer) -> None:
        self.server = server
        self.histogram = Histogram("trimq_rpc_latency_seconds", "Time to handle one request",
                                   ["request_code", "response_code"], registry=registry, buckets=RPC_BUCKETS)
        self._children: dict[tuple[int, int], Any] = {}
        previous = server.observe

        def observe(request_code: int, response_code: int, seconds: float) -> None:
            self.observe(request_code, response_code, seconds)
            if previous is not None:
                previous(request_code, response_code, seconds)

        server.observe = observe if previous is not None else self.observe

    def observe(self, request_code: int, response_code: int, seconds: float) -> None:
        key = (request_code, response_code)
        child = self._children.get(key)
        if child is None:
            req = code_name(request_code, response=False) if request_code in self.server.handlers else "other"
            resp = code_name(response_code, response=True)  # 0 (SUCCESS) for oneway requests too
            if len(self._children) < 10_000:
                child = self._children[key] = self.histogram.labels(req, resp)
            else:
                child = self.histogram.labels(req, resp)
        child.observe(seconds)
