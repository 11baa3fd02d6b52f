"""trimq-broker freezes the collector's view of its start-up objects once the broker serves (issue 22: a full
collection walking them paused the broker for 12-16 ms), and only then."""

from __future__ import annotations

import gc

import pytest
import trio

from trimq.tools import broker as broker_cli


class FakeBroker:
    def __init__(self) -> None:
        self.started = trio.Event()
        self.frozen_before_start: bool | None = None

    async def run(self) -> None:
        await trio.sleep(1)
        self.frozen_before_start = bool(calls)
        self.started.set()
        await trio.sleep(1)


calls: list[str] = []


async def test_freezes_once_started(monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.abc.Clock) -> None:
    calls.clear()
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    fake = FakeBroker()
    await broker_cli._run_frozen_after_start(fake)
    assert fake.frozen_before_start is False
    assert calls == ["freeze"]


async def test_no_freeze_when_it_never_started(monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.abc.Clock) -> None:
    calls.clear()
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))

    class NeverStarts(FakeBroker):
        async def run(self) -> None:
            await trio.sleep(1)  # start-up failed / stopped before serving

    await broker_cli._run_frozen_after_start(NeverStarts())
    assert calls == []
