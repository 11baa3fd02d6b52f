"""One meaning of the metrics port across every trimq program (issue 19): absent = no metrics endpoint,
``0`` = any free port (logged as ``metrics.started``, and readable from the daemon), ``N`` = that port.

The broker and the name server once read ``metrics_port = 0`` as "off" while ``trimq-consumer --metrics-port 0``
picked a free port. Real in-process daemons; the command lines are parsed by the real click commands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
import pytest
import structlog.testing
import trio

from trimq.namesrv.config import NamesrvConfig
from trimq.namesrv.service import open_namesrv


async def get_metrics(address: tuple[str, int]) -> str:
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:100]
    return data.decode()


async def test_broker_metrics_port_zero_is_a_free_port_and_absent_is_off(broker_factory: Callable[..., Any]) -> None:
    with structlog.testing.capture_logs() as logs:
        async with broker_factory(metrics_port=0) as b:
            assert b.metrics is not None and b.metrics.address is not None
            host, port = b.metrics.address
            assert port > 0
            assert "trimq_broker_info" in await get_metrics((host, port))
    [started] = [e for e in logs if e["event"] == "metrics.started"]
    assert started["address"] == f"{host}:{port}"
    async with broker_factory() as b:
        assert b.metrics is None


async def test_namesrv_metrics_port_zero_is_a_free_port_and_absent_is_off() -> None:
    with structlog.testing.capture_logs() as logs:
        async with open_namesrv(config=NamesrvConfig(listen="127.0.0.1:0", metrics_port=0)) as ns:
            assert ns.metrics is not None and ns.metrics.address is not None
            host, port = ns.metrics.address
            assert port > 0
            assert "trimq_namesrv_brokers" in await get_metrics((host, port))
    [started] = [e for e in logs if e["event"] == "metrics.started"]
    assert started["address"] == f"{host}:{port}"
    async with open_namesrv(config=NamesrvConfig(listen="127.0.0.1:0")) as ns:
        assert ns.metrics is None


def _metrics_port_of(command: click.Command, *args: str) -> Any:
    """What ``--metrics-port`` becomes once the program's settings are loaded (no daemon started)."""
    ctx = command.make_context(command.name or "x", list(args))
    return ctx.params["metrics_port"]


@pytest.mark.parametrize("tool", ["broker", "namesrv", "consumer"])
def test_every_tool_reads_the_flag_the_same_way(tool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--metrics-port 0`` reaches each program as 0 (a free port) and no flag as "not given" (off)."""
    import os

    from trimq.broker.config import BrokerConfig
    from trimq.runtime.settings import build_settings
    from trimq.tools import broker, consumer, namesrv

    for k in list(os.environ):
        if k.startswith("TRIMQ_"):
            monkeypatch.delenv(k)
    command = {"broker": broker.main, "namesrv": namesrv.main, "consumer": consumer.main}[tool]
    required = ["--topic", "T"] if tool == "consumer" else []
    assert _metrics_port_of(command, *required, "--metrics-port", "0") == 0
    assert _metrics_port_of(command, *required) is None
    assert "0 = any free port" in next(p.help or "" for p in command.params if p.name == "metrics_port")
    # the daemons' settings: not given = the default, off
    for cls in (BrokerConfig, NamesrvConfig):
        assert build_settings(cls, overrides={"metrics_port": None}).metrics_port == -1
        assert build_settings(cls, overrides={"metrics_port": 0}).metrics_port == 0
