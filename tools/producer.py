"""``trimq-producer``: send messages from the command line (RocketMQ's ``tools.sh ... Producer``), as fast as
asked, in per-key order with ``--orderly``, recording every acknowledged message (see
:mod:`trimq.tools.records` for the body format and the record file). ``--sharding-key`` gives every message its
key as RocketMQ 5's sharding key (``__SHARDINGKEY``, what ``order_scope="key"`` consumers keep in order) and routes
it as ``Producer.send(msg, sharding_key=key)`` does (SelectMessageQueueByHash); with ``--orderly`` the queue is
hashed once over the topic's queues at the start and kept, as ``--orderly`` always does, so a key does not move
while its broker is down.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
from collections.abc import Callable
from typing import Any

import click
import trio

from trimq.client.admin import Admin
from trimq.client.config import ProducerConfig
from trimq.client.errors import InvalidMessageError
from trimq.protocol.message import Message, MessageConst
from trimq.runtime.logs import configure_logging, get_logger
from trimq.tools.common import (
    CONTEXT,
    LOG_FORMATS,
    LOG_LEVELS,
    Progress,
    exit_on_error,
    fail,
    load_client_config,
    version_option,
)
from trimq.tools.records import RecordWriter, encode_body, key_name, wall_ms

__all__ = ["FatalSendError", "LoadProducer", "ProducerOptions", "ProducerSummary", "main", "orderly_key_shares"]

log = get_logger("trimq.tools.producer")

SEND_DEADLINE_S = 30.0
"""An orderly send is retried (same key, same seq) for this long before the run gives up."""


@dataclasses.dataclass
class ProducerOptions:
    """What to send (the flags of ``trimq-producer``)."""

    topic: str
    count: int
    keys: int = 100
    body_size: int = 64
    orderly: bool = False
    record: str | None = None
    rate: float = 0.0
    batch: int = 1
    tag: str | None = None
    delay_level: int = 0
    inflight: int = 64
    queues: int = 0
    progress: bool | None = None
    sharding_key: bool = False


@dataclasses.dataclass
class ProducerSummary:
    sent: int = 0
    failed: int = 0
    elapsed_s: float = 0.0
    interrupted: bool = False

    @property
    def rate(self) -> float:
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"sent": self.sent, "failed": self.failed, "elapsed_s": round(self.elapsed_s, 3),
                "msgs_per_s": round(self.rate, 1), "interrupted": self.interrupted}


class _Pacer:
    """Spreads sends evenly at ``rate`` messages per second over all workers (0 = no limit)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._next = 0.0

    async def wait(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = trio.current_time()
        at = max(self._next, now)
        self._next = at + n / self.rate
        if at > now:
            await trio.sleep_until(at)


class FatalSendError(click.ClickException):
    """The run cannot continue (an orderly send kept failing, or the messages are invalid)."""


class LoadProducer:
    """Sends ``opts.count`` messages through a started :class:`client.producer.Producer`.

    Message ``i`` belongs to key ``i % keys`` and is that key's message number ``i // keys`` (its seq).

    **Pipelining and order.** ``inflight`` worker tasks send at once. With ``orderly``, every worker serves
    keys of one queue only (the workers are shared out over the queues by their number of keys) and sends
    its keys' messages in seq order, waiting for each send's acknowledgement before the next of its sends
    (a failed send is retried, same key and seq, before moving on). So a key's next message is only sent
    once the previous one is stored: the broker's storage order, hence queue-offset order, is the send
    order, whatever the connection, request scheduling or retries do. Throughput comes from many keys in
    flight at once. (The alternative — one in-order pipelined stream per queue — keeps order only as long
    as nothing fails and the broker handles a connection's requests strictly in order; a retry would
    reorder.) Orderly messages go to ``select_by_hash(queues, key)``: CRC-32 of the key modulo the queue
    count, over the queues of every broker.

    **A broker down.** An orderly message cannot go elsewhere (its key's queue is fixed): it is retried,
    same key and seq, until its broker is back (for at most :data:`SEND_DEADLINE_S`, then the run fails).
    Since a worker serves one queue, only the keys of the down broker's queues wait; the other keys keep
    flowing (RocketMQ's advice: spread ordered keys over the queues of several brokers).
    """

    def __init__(self, producer: Any, opts: ProducerOptions, *, record: RecordWriter | None = None,
                 progress: Progress | None = None) -> None:
        self.producer = producer
        self.opts = opts
        self.record = record
        self.progress = progress
        self.summary = ProducerSummary()
        self._pacer = _Pacer(opts.rate)
        self._next_index = 0
        self._stopping = False
        self._fatal: FatalSendError | None = None

    def stop(self) -> None:
        """Send nothing new; sends in flight complete."""
        self._stopping = True

    def _message(self, i: int) -> tuple[str, int, Message]:
        o = self.opts
        key = key_name(i % o.keys, o.keys)
        seq = i // o.keys
        props = {MessageConst.SHARDING_KEY: key} if o.sharding_key else {}
        return key, seq, Message(o.topic, encode_body(key, seq, o.body_size), tags=o.tag, keys=key,
                                 delay_time_level=o.delay_level, properties=props)

    async def run(self) -> ProducerSummary:
        from trimq.client.selectors import select_by_hash, select_by_java_hash

        o = self.opts
        start = trio.current_time()
        mqs = await self.producer.message_queues(o.topic) if o.orderly else []
        if o.orderly and not mqs:
            raise click.ClickException(f"topic {o.topic!r} has no writable queue")
        async with trio.open_nursery() as nursery:
            if self.progress is not None and self.progress.enabled:
                nursery.start_soon(self._show_progress)
            async with trio.open_nursery() as workers:
                if o.orderly:
                    # --sharding-key routes as Producer.send(msg, sharding_key=key): SelectMessageQueueByHash
                    selector = select_by_java_hash if o.sharding_key else select_by_hash
                    for mq, keys in orderly_key_shares(mqs, o.keys, o.inflight, selector):
                        workers.start_soon(self._guard, self._orderly_worker, keys, mq)
                else:
                    for _ in range(o.inflight):
                        workers.start_soon(self._guard, self._free_worker)
            nursery.cancel_scope.cancel()
        if self._fatal is not None:
            if self.progress is not None:
                self.progress.finish(self.summary.sent, self.summary.failed)
            raise self._fatal
        self.summary.elapsed_s = trio.current_time() - start
        self.summary.interrupted = self._stopping and self.summary.sent + self.summary.failed < o.count
        if self.progress is not None:
            self.progress.finish(self.summary.sent, self.summary.failed)
        return self.summary

    async def _guard(self, worker: Callable[..., Any], *args: Any) -> None:
        """Run one worker; its fatal error stops the others (they finish the sends in flight)."""
        try:
            await worker(*args)
        except FatalSendError as exc:
            if self._fatal is None:
                self._fatal = exc
            self.stop()

    async def _show_progress(self) -> None:
        assert self.progress is not None
        while True:
            self.progress.show(self.summary.sent, self.summary.failed)
            await trio.sleep(0.25)

    async def _orderly_worker(self, my_keys: list[int], mq: Any) -> None:
        o = self.opts
        rounds = math.ceil(o.count / o.keys)
        for r in range(rounds):
            # One message per key of this worker (keys ascending, all of queue ``mq``): distinct keys, so
            # batching them keeps each key's order (its previous message was acknowledged last round).
            items: list[tuple[int, str, int, Message]] = []
            for k in my_keys:
                i = r * o.keys + k
                if i >= o.count:
                    break
                items.append((i, *self._message(i)))
            for c in range(0, len(items), o.batch):
                if self._stopping:
                    return
                await self._send_until_acked(items[c:c + o.batch], mq)

    async def _send_until_acked(self, items: list[tuple[int, str, int, Message]], mq: Any) -> None:
        await self._pacer.wait(len(items))
        deadline = trio.current_time() + SEND_DEADLINE_S
        delay = 0.05
        while True:
            sent_at = wall_ms()
            try:
                if len(items) == 1:
                    # ``mq`` even with --sharding-key (the message carries the key, and ``mq`` is its hash's queue):
                    # send(msg, sharding_key=) would hash over the route of the moment, which loses a down broker's
                    # queues, and so move the key to another queue while its own broker is away (found by the chaos
                    # suite)
                    result = await self.producer.send(items[0][3], message_queue=mq)
                else:
                    result = await self.producer.send_batch([it[3] for it in items], message_queue=mq)
            except Exception as exc:
                if isinstance(exc, InvalidMessageError) or trio.current_time() + delay > deadline:
                    self.summary.failed += len(items)
                    raise FatalSendError(
                        f"send of {items[0][1]} seq {items[0][2]} to {mq} failed for {SEND_DEADLINE_S:.0f} s "
                        f"(per-key order forbids skipping it): {type(exc).__name__}: {exc}"
                    ) from exc
                log.info("send.retry", key=items[0][1], seq=items[0][2], queue=str(mq), error=str(exc))
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            self._acked(items, result, sent_at)
            return

    async def _free_worker(self) -> None:
        o = self.opts
        while not self._stopping and self._next_index < o.count:
            first = self._next_index
            n = min(o.batch, o.count - first)
            self._next_index += n
            items = [(i, *self._message(i)) for i in range(first, first + n)]
            await self._pacer.wait(n)
            sent_at = wall_ms()
            try:
                if n == 1 and o.sharding_key:
                    result = await self.producer.send(items[0][3], sharding_key=items[0][1])
                elif n == 1:
                    result = await self.producer.send(items[0][3])
                else:
                    result = await self.producer.send_batch([it[3] for it in items])
            except Exception as exc:
                if isinstance(exc, InvalidMessageError):
                    raise FatalSendError(f"invalid message: {exc}") from exc
                self.summary.failed += n
                log.warning("send.failed", first=first, count=n, error=str(exc))
                continue
            self._acked(items, result, sent_at)

    def _acked(self, items: list[tuple[int, str, int, Message]], result: Any, sent_at: int) -> None:
        self.summary.sent += len(items)
        if self.record is None:
            return
        now = wall_ms()
        ids = result.msg_id.split(",") if len(items) > 1 else [result.msg_id]
        offset_ids = result.offset_msg_id.split(",") if len(items) > 1 else [result.offset_msg_id]
        mq = result.message_queue
        self.record.write([
            {"topic": mq.topic, "broker": mq.broker_name, "queue_id": mq.queue_id,
             "queue_offset": result.queue_offset + j, "key": key, "seq": seq,
             "msg_id": ids[j] if j < len(ids) else "",
             "offset_msg_id": offset_ids[j] if j < len(offset_ids) else "", "send_time": sent_at, "ack_time": now,
             # SEND_OK, or a stored-but-weaker answer (FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE, FLUSH_DISK_TIMEOUT):
             # a SYNC_MASTER's failover may lose the latter (docs/OPERATIONS.md), so the checker must tell them apart
             "status": result.status.value}
            for j, (_, key, seq, _) in enumerate(items)
        ])


def orderly_key_shares(mqs: list[Any], keys: int, workers: int, selector: Any) -> list[tuple[Any, list[int]]]:
    """Deal ``keys`` to at most ``workers`` orderly workers so that each serves keys of one queue:
    ``[(queue, [key index, ...]), ...]``. Each queue with keys gets at least one worker, the rest are
    shared out by the queues' numbers of keys; a worker's keys are ascending."""
    by_queue: dict[Any, list[int]] = {}
    for k in range(keys):
        key = key_name(k, keys)
        by_queue.setdefault(selector(mqs, None, key), []).append(k)
    queues = sorted(by_queue.items(), key=lambda kv: kv[1][0])
    budget = max(workers, len(queues))
    shares = []
    for mq, ks in queues:
        n = max(1, min(len(ks), round(budget * len(ks) / keys)))
        shares += [(mq, ks[j::n]) for j in range(n)]
    return shares


async def _producer_session(config: ProducerConfig, opts: ProducerOptions, as_json: bool) -> int:
    from trimq.client.producer import Producer

    record = RecordWriter(opts.record) if opts.record else None
    try:
        async with Producer(config) as producer:
            assert producer.instance is not None
            if opts.queues:
                # Every master broker gets the topic; the route is refreshed so the first send sees every queue.
                await Admin(producer.instance.api, config.namesrv_addrs).ensure_topic(opts.topic, opts.queues)
                await producer.instance.update_topic_route_info_from_name_server(opts.topic)
            elif opts.orderly and not await producer.instance.update_topic_route_info_from_name_server(opts.topic):
                raise click.ClickException(
                    f"topic {opts.topic!r} is unknown to the name server; orderly routing needs a fixed queue "
                    f"count: create it first (pass --queues N)"
                )
            load = LoadProducer(producer, opts, record=record, progress=Progress(opts.count, "sent", opts.progress))
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:

                    async def watch() -> None:
                        async for _ in signals:
                            load.stop()
                            return

                    nursery.start_soon(watch)
                    summary = await load.run()
                    nursery.cancel_scope.cancel()
    finally:
        if record is not None:
            record.close()
    if as_json:
        click.echo(json.dumps({"topic": opts.topic, **summary.as_dict()}))
    else:
        state = " (interrupted)" if summary.interrupted else ""
        click.echo(f"trimq-producer: sent {summary.sent} of {opts.count} messages to {opts.topic} "
                   f"({summary.failed} failed) in {summary.elapsed_s:.2f} s: {summary.rate:.0f} msg/s{state}")
    return 0 if summary.sent == opts.count else 1


@click.command(context_settings=CONTEXT)
@version_option("trimq-producer")
@click.option("--namesrv", "namesrv_addr", help="Name server HOST:PORT (several separated by ';').")
@click.option("--topic", required=True, help="Topic to send to.")
@click.option("--count", required=True, type=click.IntRange(min=0), help="Number of messages.")
@click.option("--keys", type=click.IntRange(min=1), default=100, show_default=True,
              help="Keys cycled over: key-0000, key-0001, ... (message i has key i % K).")
@click.option("--body-size", type=click.IntRange(min=0, max=16 * 1024 * 1024), default=64, show_default=True,
              help="Body size in bytes (the JSON header line is never cut).")
@click.option("--orderly", is_flag=True,
              help="Route by key hash and send each key's messages in sequence (next after the previous ack).")
@click.option("--sharding-key", is_flag=True,
              help="Give each message its key as sharding key (__SHARDINGKEY, kept in order by order_scope=key "
                   "consumers) and route it by SelectMessageQueueByHash of the key (with --orderly too).")
@click.option("--record", type=click.Path(dir_okay=False), help="Append each acknowledged message as a JSON line.")
@click.option("--rate", type=click.FloatRange(min=0), default=0, show_default=True,
              help="Messages per second (0 = as fast as possible).")
@click.option("--batch", type=click.IntRange(min=1, max=1024), default=1, show_default=True,
              help="Messages per send request (orderly: a batch holds distinct keys of one queue).")
@click.option("--inflight", type=click.IntRange(min=1, max=4096), default=64, show_default=True,
              help="Sends in flight at once (orderly: at most one per key).")
@click.option("--tag", help="Tag of every message.")
@click.option("--delay-level", type=click.IntRange(min=0), default=0, show_default=True,
              help="Delay level of every message (0 = none).")
@click.option("--queues", type=click.IntRange(min=0, max=1024), default=0,
              help="First create/update the topic with this many queues on every master broker.")
@click.option("--group", "producer_group", help="Producer group name.")
@click.option("--instance-name", help="Instance name (part of the client id).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML file; settings from its [producer] table (ProducerConfig names).")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr [default: when a terminal].")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option("--log-format", type=LOG_FORMATS, default="auto", show_default=True)
@click.option("--log-level", type=LOG_LEVELS, default="warning", show_default=True)
def main(namesrv_addr: str | None, topic: str, count: int, keys: int, body_size: int, orderly: bool,
         sharding_key: bool, record: str | None, rate: float, batch: int, inflight: int, tag: str | None,
         delay_level: int, queues: int, producer_group: str | None, instance_name: str | None, config_file: str | None,
         progress: bool | None, as_json: bool, log_format: str, log_level: str) -> None:
    """Send COUNT messages to TOPIC and print a summary (exit status 0 when all were acknowledged).

    Bodies carry {"key", "seq"} as a JSON first line (see trimq.tools.records). Settings: defaults < --config
    [producer] < TRIMQ_CLIENT_* environment < flags.
    """
    configure_logging(log_format, log_level)
    config = load_client_config("trimq-producer", ProducerConfig, config_file, "producer", {
        "namesrv_addr": namesrv_addr, "producer_group": producer_group, "instance_name": instance_name,
    })
    if not config.namesrv_addrs:
        fail("trimq-producer", "no name server: pass --namesrv HOST:PORT (or set TRIMQ_CLIENT_NAMESRV_ADDR)")
    if sharding_key and batch > 1 and not orderly:
        fail("trimq-producer", "--sharding-key with --batch needs --orderly (a batch goes to one queue; --orderly "
                               "batches keys of one queue)")
    opts = ProducerOptions(topic=topic, count=count, keys=keys, body_size=body_size, orderly=orderly, record=record,
                           rate=rate, batch=batch, tag=tag, delay_level=delay_level, inflight=inflight, queues=queues,
                           progress=progress, sharding_key=sharding_key)
    try:
        from trimq.protocol.validation import InvalidNameError, check_topic

        check_topic(topic)
    except InvalidNameError as exc:
        fail("trimq-producer", f"--topic {topic!r}: {exc}")
    try:
        status = trio.run(_producer_session, config, opts, as_json)
    except BaseException as exc:
        exit_on_error("trimq-producer", exc)
    sys.exit(status)
