"""pytest fixtures for services built on trimq: a real broker per test (installed as the ``trimq`` pytest plugin).

Installing trimq registers this plugin (the ``pytest11`` entry point), so any test can ask for:

* ``trimq_broker``: one broker with its embedded name server;
* ``trimq_cluster``: a name server and two brokers (``broker-a``, ``broker-b``).

Both are real daemons on 127.0.0.1 port 0 with temporary stores (nothing is mocked), running in a background
trio thread for the duration of the test, so they serve tests of any kind alike: plain functions, asyncio
(``asyncio.run`` in the test, or pytest-asyncio / anyio), and trio (pytest-trio). Each yields a
:class:`~trimq.testing.threaded.ThreadedCluster`::

    async def test_order_flow(trimq_broker):                  # pytest-trio, or any asyncio test runner
        await trimq_broker.create_topic("Orders", queues=4)
        async with Producer(trimq_broker.producer_config()) as producer:
            await producer.send(Message("Orders", b"created"), sharding_key="order-7")

    def test_sync_worker(trimq_broker):
        trimq_broker.create_topic_now("Orders")
        run_worker(namesrv=trimq_broker.namesrv_addr)

Broker settings come from a marker: ``@pytest.mark.trimq_broker(flush_disk_type="SYNC_FLUSH")``,
``@pytest.mark.trimq_cluster(brokers=3, namesrv="embedded", ...)``. A trio test that wants the daemons in its own
loop uses ``async with trimq.testing.open_broker() as cluster:`` instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from trimq.testing.threaded import ThreadedCluster

__all__ = ["trimq_broker", "trimq_cluster"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "trimq_broker(**settings): BrokerConfig settings of the trimq_broker fixture")
    config.addinivalue_line("markers", "trimq_cluster(brokers=2, namesrv='standalone', **settings): the "
                                       "trimq_cluster fixture's size, name server and BrokerConfig settings")


def _marker_kwargs(request: pytest.FixtureRequest, name: str) -> dict[str, Any]:
    marker = request.node.get_closest_marker(name)
    return dict(marker.kwargs) if marker is not None else {}


@pytest.fixture
def trimq_broker(request: pytest.FixtureRequest) -> Iterator[ThreadedCluster]:
    """A real broker with its embedded name server for this test (module documentation)."""
    from trimq.testing.threaded import broker_in_thread  # imported when used: the plugin loads in every session

    with broker_in_thread(**_marker_kwargs(request, "trimq_broker")) as cluster:
        yield cluster


@pytest.fixture
def trimq_cluster(request: pytest.FixtureRequest) -> Iterator[ThreadedCluster]:
    """A real name server and brokers for this test (module documentation)."""
    from trimq.testing.threaded import cluster_in_thread

    kwargs = _marker_kwargs(request, "trimq_cluster")
    with cluster_in_thread(**kwargs) as cluster:
        yield cluster
