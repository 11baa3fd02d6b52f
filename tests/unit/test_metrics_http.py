"""The /metrics endpoint: a failing collector gives a 500, the daemon keeps serving; /healthz says whether the
daemon serves requests; HEAD answers without a body."""

from __future__ import annotations

import functools

import trio
from prometheus_client import CollectorRegistry, Counter

from trimq.runtime.metrics_http import serve_metrics
from trimq.runtime.server import RemotingServer


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


async def request(addr: tuple[str, int], method: str, path: str) -> str:
    stream = await trio.open_tcp_stream(*addr)
    async with stream:
        await stream.send_all(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data.decode()


async def test_healthz_follows_the_daemon_and_head_sends_no_body() -> None:
    registry = CollectorRegistry()
    Counter("trimq_test_events", "events", registry=registry).inc()
    serving = False
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(functools.partial(serve_metrics, registry, "127.0.0.1", 0,
                                                     healthy=lambda: serving))
        assert (await request(addr, "GET", "/healthz")).startswith("HTTP/1.1 503")  # not started yet
        serving = True
        assert (await request(addr, "GET", "/healthz")).endswith("\r\n\r\nok\n")
        serving = False  # shutdown began
        assert (await request(addr, "GET", "/healthz")).startswith("HTTP/1.1 503")
        head = await request(addr, "HEAD", "/metrics")
        headers, body = head.split("\r\n\r\n", 1)
        assert headers.startswith("HTTP/1.1 200") and body == ""
        length = int(next(h.split(": ")[1] for h in headers.split("\r\n") if h.startswith("Content-Length")))
        assert length == len((await get(addr)).split("\r\n\r\n", 1)[1])  # HEAD tells the GET's length
        assert (await request(addr, "HEAD", "/healthz")).split("\r\n\r\n", 1)[1] == ""
        assert (await request(addr, "POST", "/metrics")).startswith("HTTP/1.1 405")
        nursery.cancel_scope.cancel()


async def test_a_server_serves_only_between_listening_and_shutdown() -> None:
    server = RemotingServer()
    assert not server.serving
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve, "127.0.0.1", 0)
        assert server.serving
        server.shutdown()
        assert not server.serving
    assert not server.serving
