"""The /metrics endpoint: a failing collector gives a 500, the daemon keeps serving."""

from __future__ import annotations

import trio
from prometheus_client import CollectorRegistry, Counter

from trimq.runtime.metrics_http import serve_metrics


class Broken:
    def collect(self) -> list[object]:
        raise RuntimeError("boom")


async def get(addr: tuple[str, int], path: str = "/metrics") -> str:
    stream = await trio.open_tcp_stream(*addr)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data.decode()


async def test_serves_text_and_survives_a_broken_collector() -> None:
    registry = CollectorRegistry()
    Counter("trimq_test_events", "events", registry=registry).inc()
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(serve_metrics, registry, "127.0.0.1", 0)
        assert "trimq_test_events_total 1.0" in await get(addr)
        assert (await get(addr, "/other")).startswith("HTTP/1.1 404")
        registry.register(Broken())  # type: ignore[arg-type]
        resp = await get(addr)
        assert resp.startswith("HTTP/1.1 500") and "boom" in resp
        nursery.cancel_scope.cancel()
