"""Commit-log replication between a master and its slaves (RocketMQ 4.9.3's ``store/ha``; docs/PROTOCOL.md
"Replication stream", docs/OPERATIONS.md "High availability").

* ``codec``: the stream's byte format (sans-IO): the handshake, 8-byte offset reports, transfer frames.
* ``history``: the master epoch history and the truncation rule of a slave that comes back from an older epoch.
* ``replica``: appending received bytes to a slave's store, dispatching consume queues and the index from
  them, and cutting a store's tail (pure store operations, no network).
* ``master``: ``HAService`` (the master's HA port, one ``HAConnection`` per slave, the SYNC_MASTER wait).
* ``slave``: ``HAClient`` (the slave's connection to its master).

The store layer: nothing here imports the broker.
"""
