"""Real brokers in a background thread, for tests of code that is not trio: ``broker_in_thread()`` and
``cluster_in_thread()``, the engines of the pytest fixtures (trimq.testing.pytest_plugin).

:func:`~trimq.testing.open_broker` and :func:`~trimq.testing.open_cluster` run in the caller's trio loop. A
test of an asyncio service, a threaded worker or a Django view has no trio loop of its own (or must not share
it with the daemons: the point is to test the service's own loop), so these run the same daemons in a
:class:`~trimq.client.runner.TrioRunner` thread and hand back a :class:`ThreadedCluster` that any code can use::

    with broker_in_thread() as cluster:
        cluster.create_topic_now("Orders", queues=4)        # blocking, from any thread
        asyncio.run(my_service(cluster.namesrv_addr))       # the service under test, on its own loop
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import trio

from trimq.client.admin_results import TopicCreateResult
from trimq.client.aio import in_trio
from trimq.client.config import ClientConfig, ProducerConfig, PushConsumerConfig
from trimq.client.runner import TrioRunner
from trimq.testing.cluster import Cluster, open_broker, open_cluster

__all__ = ["ThreadedCluster", "broker_in_thread", "cluster_in_thread"]

T = TypeVar("T")


@dataclass
class ThreadedCluster:
    """A :class:`~trimq.testing.Cluster` whose daemons run in a background trio thread.

    The addresses and the config builders are :class:`~trimq.testing.Cluster`'s. Its async methods run in the
    daemons' thread: :meth:`create_topic` and :meth:`acall` are awaitable from trio and from asyncio alike;
    :meth:`create_topic_now` and :meth:`call` block (from sync code, or briefly from a test's own loop)."""

    cluster: Cluster
    runner: TrioRunner = field(repr=False)

    @property
    def namesrv_addr(self) -> str:
        """The name server's ``HOST:PORT`` (what clients are configured with)."""
        return self.cluster.namesrv_addr

    @property
    def broker_addrs(self) -> dict[str, str]:
        """Each broker's name and address."""
        return self.cluster.broker_addrs

    def client_config(self, **settings: Any) -> ClientConfig:
        """A ClientConfig pointing at this cluster's name server (``settings`` override)."""
        return self.cluster.client_config(**settings)

    def producer_config(self, producer_group: str = "test_producer", **settings: Any) -> ProducerConfig:
        """A ProducerConfig for this cluster (``settings`` override)."""
        return self.cluster.producer_config(producer_group, **settings)

    def consumer_config(self, consumer_group: str, **settings: Any) -> PushConsumerConfig:
        """A PushConsumerConfig for this cluster; a new group starts at the first offset unless ``settings`` say
        otherwise."""
        return self.cluster.consumer_config(consumer_group, **settings)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``await fn(*args, **kwargs)`` in the daemons' thread and wait for it (blocks this thread), e.g.
        ``cluster.call(cluster.cluster.admin.consumer_progress, "billing")``."""
        return self.runner.call(functools.partial(fn, *args, **kwargs))

    async def acall(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """:meth:`call`, awaited: from a trio task (through a worker thread) or from asyncio (without blocking
        its loop)."""
        job = functools.partial(fn, *args, **kwargs)
        if in_trio():
            return await trio.to_thread.run_sync(self.runner.call, job)
        return await self.runner.acall(job)

    def create_topic_now(self, topic: str, queues: int = 4, *, perm: int = 6) -> TopicCreateResult:
        """:meth:`~trimq.testing.Cluster.create_topic`, blocking until every broker has it and it is routed."""
        return self.call(self.cluster.create_topic, topic, queues, perm=perm)

    async def create_topic(self, topic: str, queues: int = 4, *, perm: int = 6) -> TopicCreateResult:
        """:meth:`~trimq.testing.Cluster.create_topic`, awaited from trio or asyncio."""
        return await self.acall(self.cluster.create_topic, topic, queues, perm=perm)


@contextmanager
def _in_thread(cm: Any, name: str) -> Iterator[ThreadedCluster]:
    with TrioRunner(name=name) as runner:
        cluster: Cluster = runner.enter(cm)
        yield ThreadedCluster(cluster, runner)
    # leaving: the runner exits the cluster (daemons stop gracefully, stores deleted), then its thread ends


@contextmanager
def broker_in_thread(**overrides: Any) -> Iterator[ThreadedCluster]:
    """:func:`~trimq.testing.open_broker` (one broker with its embedded name server, port 0, a temporary store)
    in a background thread, for the duration of the ``with`` block. ``overrides`` are BrokerConfig settings."""
    with _in_thread(open_broker(**overrides), "trimq-test-broker") as cluster:
        yield cluster


@contextmanager
def cluster_in_thread(brokers: int = 2, *, namesrv: Literal["standalone", "embedded"] = "standalone",
                      **overrides: Any) -> Iterator[ThreadedCluster]:
    """:func:`~trimq.testing.open_cluster` (a name server and ``brokers`` brokers) in a background thread."""
    with _in_thread(open_cluster(brokers, namesrv=namesrv, **overrides), "trimq-test-cluster") as cluster:
        yield cluster
