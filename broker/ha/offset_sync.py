"""Consumer offsets across a master and its slave, merged by commit version (HA, issue 15 part 2).

While a master is away its consumers pull from the slave and commit their offsets there. RocketMQ 4.9.3 loses
those commits when the master returns (the slave overwrites its table with the master's). trimq keeps them:

* the slave's metadata sync merges the master's table into its own by commit version
  (broker/store/offset_merge.py ``merge_by_commit_version``: the newer version wins, never the larger offset);
* then it hands the master the offsets it changed itself that are still newer (MERGE_CONSUMER_OFFSET, 9011,
  body as GET_ALL_CONSUMER_OFFSET's), which the master merges by the same rule — so a consumer that starts or
  rebalances after the master's return reads the offset committed on the slave;
* the slave syncs the moment it (re)connects to its master, not only every ``slave_synchronize_interval_ms``, and
  merges the offsets alone every ``slave_offset_sync_interval_ms`` (1 s) in between.

:class:`OffsetMergeService` is the master's side: the MERGE_CONSUMER_OFFSET handler.
"""

from __future__ import annotations

from trimq.broker.deps import HandlerRegistry
from trimq.broker.store.offset_merge import (
    VersionedOffsets,
    decode_table,
    merge_and_hand_back,
    merge_into,
)
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.runtime.logs import get_logger
from trimq.runtime.server import Connection

log = get_logger("trimq.ha")

__all__ = ["OffsetMergeService", "merge_and_hand_back"]


class OffsetMergeService:
    """MERGE_CONSUMER_OFFSET (9011): a slave's offsets newer than this broker's are taken (the others ignored);
    answers ``merged`` (how many queues changed) in the ext fields."""

    def __init__(self, *, registry: HandlerRegistry, offsets: VersionedOffsets) -> None:
        self.offsets = offsets
        self.merged = 0  # queues taken from slaves (metrics, tests)
        registry.register(RequestCode.MERGE_CONSUMER_OFFSET, self.merge_consumer_offset)

    async def merge_consumer_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            remote = decode_table(cmd.body)
        except ValueError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        remote.removed.clear()  # a slave hands over offsets, never removals: only its master removes
        result = merge_into(self.offsets, remote)
        self.merged += len(result.adopted)
        if result.adopted or result.generations_raised:
            log.info("ha.offsets_merged_from_slave", slave=conn.remote, queues=len(result.adopted),
                     kept_newer_here=len(result.newer_here), generations_raised=len(result.generations_raised))
        return RemotingCommand.response_to(cmd, ext={"merged": len(result.adopted)})
