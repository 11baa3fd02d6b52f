"""Topic and offset admin requests: UPDATE_AND_CREATE_TOPIC, GET_ALL_TOPIC_CONFIG, GET_MAX_OFFSET,
GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME, VIEW_MESSAGE_BY_ID."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trimq.broker.deps import AdminStore, HandlerRegistry, TopicAdmin
from trimq.broker.services import HandlerService
from trimq.broker.store.topics import MAX_QUEUE_NUMS, TopicConfig
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.protocol.fields import int_field, str_field
from trimq.protocol.validation import SYSTEM_TOPICS, InvalidNameError, check_topic
from trimq.runtime.logs import get_logger

if TYPE_CHECKING:
    from trimq.runtime.server import Connection

log = get_logger("trimq.admin")

__all__ = ["AdminTopicService"]


class AdminTopicService(HandlerService):
    """Topic configs and queue offsets for admin tools; new queues get ``default_queue_nums`` by default."""

    name = "admin_topic"

    def __init__(self, *, registry: HandlerRegistry, store: AdminStore, topics: TopicAdmin,
                 default_queue_nums: int) -> None:
        self.store = store
        self.topics = topics
        self.default_queue_nums = default_queue_nums
        reg = registry.register
        reg(RequestCode.UPDATE_AND_CREATE_TOPIC, self.update_and_create_topic)
        reg(RequestCode.GET_ALL_TOPIC_CONFIG, self.get_all_topic_config)
        reg(RequestCode.GET_MAX_OFFSET, self.get_max_offset)
        reg(RequestCode.GET_MIN_OFFSET, self.get_min_offset)
        reg(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, self.search_offset_by_timestamp)
        reg(RequestCode.GET_EARLIEST_MSG_STORETIME, self.get_earliest_msg_store_time)
        reg(RequestCode.VIEW_MESSAGE_BY_ID, self.view_message_by_id)

    # ------------------------------------------------------------------------------------------------
    async def update_and_create_topic(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        ext = cmd.ext
        topic = ext.get("topic")
        try:
            check_topic(topic)
        except InvalidNameError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"the specified topic is invalid: {exc}") from None
        assert isinstance(topic, str)
        if topic in SYSTEM_TOPICS:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"the topic[{topic}] is conflict with system topic.")
        old = self.topics.get(topic)
        default = self.default_queue_nums
        read = int_field(ext, "readQueueNums", old.read_queue_nums if old else default)
        write = int_field(ext, "writeQueueNums", old.write_queue_nums if old else default)
        perm = int_field(ext, "perm", old.perm if old else 6)
        for name, v in (("readQueueNums", read), ("writeQueueNums", write)):
            if not 1 <= v <= MAX_QUEUE_NUMS:
                raise RequestError(ResponseCode.SYSTEM_ERROR, f"{name} = {v}: must be in [1, {MAX_QUEUE_NUMS}]")
        if not 0 <= perm <= 7:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"perm = {perm}: must be in [0, 7] (4 read, 2 write)")
        cfg = TopicConfig(topic, read, write, perm)
        await self.topics.acreate_or_update(cfg)
        log.info("topic.updated", topic=topic, read_queue_nums=read, write_queue_nums=write, perm=perm,
                 remote=conn.remote)
        return RemotingCommand.response_to(cmd)

    async def get_all_topic_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        body = {"topicConfigTable": self.topics.table_json(), "dataVersion": dict(self.topics.data_version)}
        return RemotingCommand.response_to(cmd, body=body)

    def _queue(self, cmd: RemotingCommand) -> tuple[str, int]:
        topic = str_field(cmd.ext, "topic")
        queue_id = int_field(cmd.ext, "queueId")
        return topic, queue_id

    async def get_max_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic, qid = self._queue(cmd)
        return RemotingCommand.response_to(cmd, ext={"offset": self.store.get_max_offset_in_queue(topic, qid)})

    async def get_min_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic, qid = self._queue(cmd)
        return RemotingCommand.response_to(cmd, ext={"offset": self.store.get_min_offset_in_queue(topic, qid)})

    async def search_offset_by_timestamp(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic, qid = self._queue(cmd)
        ts = int_field(cmd.ext, "timestamp")
        return RemotingCommand.response_to(cmd, ext={"offset": self.store.get_offset_in_queue_by_time(topic, qid, ts)})

    async def get_earliest_msg_store_time(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic, qid = self._queue(cmd)
        ts = self.store.get_earliest_msg_store_time(topic, qid)
        return RemotingCommand.response_to(cmd, ext={"timestamp": ts if ts is not None else -1})

    async def view_message_by_id(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        offset = int_field(cmd.ext, "offset")
        data = self.store.read_record(offset) if offset >= 0 else None
        if data is None:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return RemotingCommand.response_to(cmd, body=data)
