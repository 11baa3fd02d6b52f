"""Real brokers for tests, demos and examples: ``trimq.testing.open_broker()`` and ``open_cluster()``.

Like :mod:`trio.testing`'s helpers these are async context managers: the daemons run in the background of
the block (in this process, on 127.0.0.1 port 0, each with a temporary store that is deleted afterwards)
and stop gracefully when it ends. Nothing is mocked: clients talk to them over TCP as to any deployment.

::

    from trimq.client import Message, Producer
    from trimq.testing import open_broker

    async def test_send() -> None:
        async with open_broker() as cluster:
            await cluster.create_topic("Orders", queues=4)
            async with Producer(cluster.producer_config()) as producer:
                await producer.send(Message("Orders", b"hello"))

Code that is not trio (asyncio services, threads) runs the same daemons in a background thread with
:func:`broker_in_thread` / :func:`cluster_in_thread`; the pytest plugin (trimq.testing.pytest_plugin) makes them
the ``trimq_broker`` / ``trimq_cluster`` fixtures.
"""

from trimq.testing.cluster import Cluster, open_broker, open_cluster
from trimq.testing.threaded import ThreadedCluster, broker_in_thread, cluster_in_thread

__all__ = ["Cluster", "ThreadedCluster", "broker_in_thread", "cluster_in_thread", "open_broker", "open_cluster"]
