"""Client side of admin requests a broker sends to its consumers: RESET_CONSUMER_CLIENT_OFFSET (220).

``trimq-admin consumer reset-offset`` sends INVOKE_BROKER_TO_RESET_OFFSET (222) to each broker of the topic;
the broker writes the new offsets into its table and forwards RESET_CONSUMER_CLIENT_OFFSET to every live
member of the group (broker/processors/admin_forward.py). Here a member applies it, as RocketMQ's
MQClientInstance.resetOffset does, for the queues of the table it holds:

1. drop the process queue (pulling stops, cached messages are discarded, a result of a batch still being
   consumed is not committed — the consume services skip commits of dropped queues) and forget it;
2. set the queue's offset in the offset store (memory) and persist it (to the broker, or the local file of a
   BROADCASTING consumer);
3. rebalance at once: the queue comes back as new, its pull starting at the stored (reset) offset. An orderly
   consumer keeps its broker lock meanwhile, so nobody else can take the queue; its old consume loop ends on
   the dropped flag before the new one starts (one consume task per queue).

Unlike RocketMQ, queues of the topic that are *not* in the table (another broker's) are left alone, and no
10 s sleep is needed since commits of dropped queues are never applied.

The request carries the broker's new reset generation (``resetGeneration``, issue 19): the reset queues'
offsets are persisted under it, and the broker refuses any commit made under an older one. A member that was
not told (its answer timed out, it missed the request) finds out when a commit of the queue is refused:
:func:`watch_stale_resets` then drops that queue and reads its offset again, as a reset would have.

Wire fields (docs/PROTOCOL.md §4): ext ``topic``, ``group``, ``timestamp``, ``isForce``; body
``{"offsetTable": [{"mq": mq, "offset": int}]}``; response body ``{"consumerGroup", "clientId", "topic",
"queues": [{"mq", "offset", "previousOffset", "held"}]}``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from trimq.client.offset_store import LocalFileOffsetStore, RemoteBrokerOffsetStore
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.logs import get_logger

if TYPE_CHECKING:
    from trimq.client.consumer_core import ConsumerCore
    from trimq.client.instance import ClientInstance

log = get_logger("trimq.admin_handlers")


class PushConsumer(Protocol):
    """What these handlers use of a push consumer (client.push_consumer.PushConsumer is one; a Protocol, so
    that this module, which push_consumer registers, does not import it back)."""

    core: ConsumerCore | None
    instance: ClientInstance | None

    @property
    def running(self) -> bool: ...

    @property
    def group_name(self) -> str: ...

__all__ = ["apply_reset_offset", "parse_reset_body", "register_admin_handlers", "resync_queue", "watch_stale_resets"]

ConsumerLookup = Callable[[str], "PushConsumer | None"]


def register_admin_handlers(instance: ClientInstance, lookup: ConsumerLookup) -> None:
    """Answer the broker's admin requests on ``instance``'s connections. ``lookup(group)`` returns the push
    consumer of that group started on this instance (or None). Idempotent: registering again replaces."""
    instance.remoting.register_handler(RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                                       functools.partial(_on_reset_consumer_client_offset, instance, lookup))


def parse_reset_body(ext: dict[str, Any], body: Any) -> tuple[str, str, dict[MessageQueue, int]]:
    """(group, topic, offsets) of a RESET_CONSUMER_CLIENT_OFFSET request; ValueError naming a bad field."""
    group, topic = ext.get("group"), ext.get("topic")
    for name, value in (("group", group), ("topic", topic)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"header field '{name}' is required (a non-empty string), got {value!r}")
    assert isinstance(group, str) and isinstance(topic, str)
    table = body.get("offsetTable") if isinstance(body, dict) else None
    if not isinstance(table, list):
        raise ValueError("body must be a map with 'offsetTable': [{'mq': mq, 'offset': int}]")
    offsets: dict[MessageQueue, int] = {}
    for i, entry in enumerate(table):
        if not isinstance(entry, dict):
            raise ValueError(f"offsetTable[{i}] must be a map with 'mq' and 'offset'")
        try:
            mq = MessageQueue.from_wire(entry.get("mq"))
        except ValueError as exc:
            raise ValueError(f"offsetTable[{i}].mq: {exc}") from None
        offset = entry.get("offset")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offsetTable[{i}].offset must be a non-negative integer, got {offset!r}")
        if mq.topic != topic:
            raise ValueError(f"offsetTable[{i}].mq is of topic {mq.topic!r}, not {topic!r}")
        offsets[mq] = offset
    return group, topic, offsets


async def apply_reset_offset(consumer: PushConsumer, topic: str, offsets: dict[MessageQueue, int],
                             reset_generation: int | None = None) -> list[dict[str, Any]]:
    """Apply a reset to a running push consumer (see the module documentation); one row per queue of
    ``offsets``: ``mq``, ``offset``, ``previousOffset`` (this client's offset in memory, -1 none) and
    ``held`` (whether this client consumed the queue, so the reset touched it here). ``reset_generation``:
    the broker's generation of this reset, which the persisted offsets carry."""
    core = consumer.core
    if core is None or not consumer.running:
        raise LookupError(f"the consumer group {consumer.group_name} is not running")
    rebalance, store = core.rebalance, core.offset_store
    memory = store.clone_offset_table(topic)
    rows: list[dict[str, Any]] = []
    held: list[MessageQueue] = []
    # Synchronous up to the first persist: drop, forget and set memory in one go (no checkpoint between).
    for mq, offset in sorted(offsets.items()):
        pq = rebalance.process_queue_table.get(mq)
        rows.append({"mq": mq.to_wire(), "offset": offset, "previousOffset": memory.get(mq, -1),
                     "held": pq is not None})
        if pq is None:
            continue
        if (reset_generation is not None and isinstance(store, RemoteBrokerOffsetStore)
                and (store.reset_generation(mq) or 0) >= reset_generation):
            continue  # already read again under this reset (a refused commit made it resync): once is enough
        rebalance.remove_process_queue(mq, pq)
        # Emptying it also stops a batch still in the listener from committing: the orderly service commits
        # a dropped queue's batch (it relies on the rebalance's consume lock), but commit() of an emptied
        # process queue is -1; the concurrent service never commits for a dropped queue.
        pq.clear()
        if reset_generation is not None and isinstance(store, RemoteBrokerOffsetStore):
            store.set_reset_generation(mq, reset_generation)
        store.update_offset(mq, offset, False)
        held.append(mq)
    if held:
        if isinstance(store, LocalFileOffsetStore):
            # the file holds every queue's offset: write all of them, not only the reset ones
            await store.persist_all(set(rebalance.process_queue_table) | set(held))
        else:
            for mq in held:
                await store.persist(mq)
                store.remove_offset(mq)  # the re-added queue reads the reset offset back from the broker
        assert consumer.instance is not None
        consumer.instance.rebalance_immediately()
    log.warning("consumer.offset_reset", group=consumer.group_name, topic=topic,
                queues={str(MessageQueue.from_wire(r["mq"])): [r["previousOffset"], r["offset"]]
                        for r in rows if r["held"]})
    return rows


async def _on_reset_consumer_client_offset(instance: ClientInstance, lookup: ConsumerLookup, cmd: RemotingCommand,
                                           addr: str) -> RemotingCommand:
    try:
        group, topic, offsets = parse_reset_body(cmd.ext or {}, cmd.body)
    except ValueError as exc:
        return RemotingCommand.response_to(cmd, ResponseCode.SYSTEM_ERROR, f"RESET_CONSUMER_CLIENT_OFFSET: {exc}")
    consumer = lookup(group)
    if consumer is None or not consumer.running:
        return RemotingCommand.response_to(
            cmd, ResponseCode.SYSTEM_ERROR, f"the consumer group {group} does not run on client {instance.client_id}")
    generation = (cmd.ext or {}).get("resetGeneration")
    generation = generation if isinstance(generation, int) and not isinstance(generation, bool) else None
    try:
        rows = await apply_reset_offset(consumer, topic, offsets, generation)
    except LookupError as exc:
        return RemotingCommand.response_to(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
    body = {"consumerGroup": group, "clientId": instance.client_id, "topic": topic, "queues": rows}
    return RemotingCommand.response_to(cmd, body=body)


def resync_queue(consumer: PushConsumer, mq: MessageQueue) -> None:
    """Drop ``mq``'s process queue and cached offset and rebalance at once: the queue comes back with its
    offset (and reset generation) read from the broker — what a reset notification would have done."""
    core = consumer.core
    if core is None or not consumer.running:
        return
    pq = core.rebalance.process_queue_table.get(mq)
    if pq is not None:
        core.rebalance.remove_process_queue(mq, pq)
        pq.clear()
    core.offset_store.remove_offset(mq)
    if consumer.instance is not None:
        consumer.instance.rebalance_immediately()
    log.warning("consumer.resync_after_reset", group=consumer.group_name, mq=str(mq), held=pq is not None)


def watch_stale_resets(consumer: PushConsumer) -> None:
    """Resync a queue (:func:`resync_queue`) whose commit the broker refused as made before a reset."""
    store = consumer.core.offset_store if consumer.core is not None else None
    if isinstance(store, RemoteBrokerOffsetStore):
        store.on_stale_reset = functools.partial(resync_queue, consumer)
