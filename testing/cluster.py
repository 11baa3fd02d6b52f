"""The brokers of :mod:`trimq.testing`: :func:`open_broker`, :func:`open_cluster` and their handle,
:class:`Cluster`."""

from __future__ import annotations

import string
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

from trimq.broker.broker import Broker
from trimq.broker.broker import open_broker as _run_broker
from trimq.broker.config import BrokerConfig
from trimq.client.admin import Admin, AdminError, open_admin
from trimq.client.admin_results import TopicCreateResult
from trimq.client.config import ClientConfig, ProducerConfig, PushConsumerConfig
from trimq.namesrv.config import NamesrvConfig
from trimq.namesrv.service import open_namesrv

__all__ = ["Cluster", "open_broker", "open_cluster"]

LOCAL = "127.0.0.1:0"
START_TIMEOUT_S = 20.0
"""How long :func:`open_cluster` waits for every broker to register with the name server."""


@dataclass
class Cluster:
    """A running name server and its brokers, as :func:`open_broker` and :func:`open_cluster` yield them.

    ``namesrv_addr`` is what clients are configured with; ``broker_addrs`` maps each broker's name
    (``broker-a``, ``broker-b``, ...) to its address. ``brokers`` are the daemons themselves, for tests that
    need to look inside one; ``admin`` is an :class:`~trimq.client.admin.Admin` connected to the cluster.
    """

    namesrv_addr: str
    broker_addrs: dict[str, str]
    brokers: dict[str, Broker] = field(repr=False)
    admin: Admin = field(repr=False)

    async def create_topic(self, topic: str, queues: int = 4, *, perm: int = 6) -> TopicCreateResult:
        """Create (or update) ``topic`` with ``queues`` read and write queues on every broker and wait until
        the name server routes all of them, so producers and consumers can use it at once."""
        return await self.admin.ensure_topic(topic, queues, perm=perm)

    def client_config(self, **settings: Any) -> ClientConfig:
        """A :class:`~trimq.client.config.ClientConfig` pointing at this cluster's name server."""
        return ClientConfig(**{"namesrv_addr": self.namesrv_addr, **settings})

    def producer_config(self, producer_group: str = "test_producer", **settings: Any) -> ProducerConfig:
        """A :class:`~trimq.client.config.ProducerConfig` for this cluster (``settings`` override)."""
        return ProducerConfig(**{"namesrv_addr": self.namesrv_addr, "producer_group": producer_group, **settings})

    def consumer_config(self, consumer_group: str, **settings: Any) -> PushConsumerConfig:
        """A :class:`~trimq.client.config.PushConsumerConfig` for this cluster; unless ``settings`` say
        otherwise, a new group starts at the first offset (tests usually send before they consume)."""
        return PushConsumerConfig(**{"namesrv_addr": self.namesrv_addr, "consumer_group": consumer_group,
                                     "consume_from_where": "CONSUME_FROM_FIRST_OFFSET", **settings})


def broker_name(index: int) -> str:
    """``broker-a``, ``broker-b``, ... ``broker-z``, ``broker-26``, ..."""
    return f"broker-{string.ascii_lowercase[index]}" if index < 26 else f"broker-{index}"


@asynccontextmanager
async def open_broker(**overrides: Any) -> AsyncIterator[Cluster]:
    """Run one broker with its embedded name server on 127.0.0.1 port 0, with a temporary store, for the
    duration of the block; yields its :class:`Cluster` (``namesrv_addr`` is the broker's own address).

    ``overrides`` are :class:`~trimq.broker.config.BrokerConfig` settings (``flush_disk_type="SYNC_FLUSH"``,
    ``broker_name=...``); with ``store_dir`` the store is kept there (and not deleted), so a test can reopen
    it. The broker stops gracefully when the block ends.
    """
    async with AsyncExitStack() as stack:
        settings = {"listen": LOCAL, "embedded_namesrv": True, **overrides}
        if "store_dir" not in settings:
            settings["store_dir"] = stack.enter_context(tempfile.TemporaryDirectory(prefix="trimq-test-"))
        broker = await stack.enter_async_context(_run_broker(BrokerConfig(**settings)))
        admin = await stack.enter_async_context(open_admin(broker.address))
        name = broker.config.broker_name
        yield Cluster(broker.address, {name: broker.address}, {name: broker}, admin)


@asynccontextmanager
async def open_cluster(brokers: int = 2, *, namesrv: Literal["standalone", "embedded"] = "standalone",
                       **overrides: Any) -> AsyncIterator[Cluster]:
    """Run ``brokers`` brokers (``broker-a``, ``broker-b``, ...) of one cluster with a name server, on
    127.0.0.1 port 0, each with a temporary store, for the duration of the block; yields their
    :class:`Cluster` once every broker has registered with the name server.

    ``namesrv="standalone"`` runs a name server of its own (as ``trimq-namesrv`` does); ``"embedded"`` has
    the first broker serve it. ``overrides`` are :class:`~trimq.broker.config.BrokerConfig` settings given to
    every broker. Everything stops gracefully, brokers first, when the block ends.
    """
    if brokers < 1:
        raise ValueError(f"brokers = {brokers}: a cluster needs at least one broker")
    if namesrv not in ("standalone", "embedded"):
        raise ValueError(f"namesrv = {namesrv!r}: 'standalone' or 'embedded'")
    for key in ("listen", "store_dir", "broker_name", "namesrv_addr", "embedded_namesrv"):
        if key in overrides:
            raise ValueError(f"{key} is chosen per broker by open_cluster; it cannot be overridden")
    async with AsyncExitStack() as stack:
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="trimq-test-"))
        namesrv_addr = ""
        if namesrv == "standalone":
            ns = await stack.enter_async_context(open_namesrv(config=NamesrvConfig(listen=LOCAL)))
            namesrv_addr = ns.address
        running: dict[str, Broker] = {}
        for i in range(brokers):
            name = broker_name(i)
            embedded = namesrv == "embedded" and i == 0
            config = BrokerConfig(**{"listen": LOCAL, "store_dir": f"{root}/{name}", "broker_name": name,
                                     "embedded_namesrv": embedded, "namesrv_addr": "" if embedded else namesrv_addr,
                                     **overrides})
            running[name] = await stack.enter_async_context(_run_broker(config))
            if embedded:
                namesrv_addr = running[name].address
        admin = await stack.enter_async_context(open_admin(namesrv_addr))
        with trio.fail_after(START_TIMEOUT_S):
            while not set(running) <= set(await _registered(admin)):
                await trio.sleep(0.02)
        yield Cluster(namesrv_addr, {n: b.address for n, b in running.items()}, running, admin)


async def _registered(admin: Admin) -> dict[str, str]:
    """The brokers the name server knows (none yet is an answer too)."""
    try:
        return await admin.brokers()
    except AdminError:  # it knows no broker yet
        return {}
