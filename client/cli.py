"""``trimq-producer`` and ``trimq-consumer``: send and consume from the command line, with record files
that a checker (tests/e2e/checker.py) can compare.

**Body format of trimq-producer.** Every body starts with one line of JSON, ``{"key": "key-0007",
"seq": 42}``, ended by ``\\n``; the rest is padding (``.`` bytes) up to ``--body-size`` (a body is never
shorter than its header line). ``seq`` counts a key's messages from 0 in send order. :func:`encode_body`
and :func:`decode_body` are the codec; any other body decodes to None.

**Producer record** (``--record``): one JSON line per *acknowledged* message, written and flushed as its
send returns: ``topic, broker, queue_id, queue_offset, key, seq, msg_id`` (the producer's unique key),
``send_time`` and ``ack_time`` (wall-clock ms). A message whose send failed is not recorded (it may still
have been stored: a checker must tolerate extra, unrecorded messages).

**Consumer record** (``--record``): one JSON line per successfully consumed message: ``topic, broker,
queue_id, queue_offset, keys, msg_id`` (unique key), ``offset_msg_id, reconsume_times, body_sha1,
consume_time`` (wall-clock ms), ``client_id``, and ``key``/``seq`` when the body is a trimq-producer body.
Lines are written and flushed inside the listener, before it returns success, so before the offset can be
committed: once an offset is committed its line is in the kernel and survives the consumer's SIGKILL.
``--record-fsync`` also fsyncs each listener call's lines, which only matters if the machine itself may
crash (power loss); it costs one disk flush per listener call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, NoReturn

import click
import trio

from trimq.client.config import ConfigError, ProducerConfig, PushConsumerConfig, load_client_settings
from trimq.client.errors import InvalidMessageError, TrimqClientError
from trimq.protocol.logs import configure_logging, get_logger
from trimq.protocol.message import Message, MessageExt

__all__ = [
    "RecordWriter",
    "consumer_main",
    "consumer_record",
    "decode_body",
    "encode_body",
    "key_name",
    "producer_main",
]

log = get_logger("trimq.cli")

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
_LOG_FORMATS = click.Choice(["auto", "json", "console"])
_LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"])
SEND_DEADLINE_S = 30.0
"""An orderly send is retried (same key, same seq) for this long before the run gives up."""


# --- body codec and records ---------------------------------------------------------------------------


def key_name(index: int, keys: int) -> str:
    """The name of key ``index`` of ``keys``: ``key-0000`` ... (at least 4 digits)."""
    return f"key-{index:0{max(4, len(str(keys - 1)))}d}"


def encode_body(key: str, seq: int, size: int = 0) -> bytes:
    """A trimq-producer body: ``{"key":...,"seq":...}\\n`` padded with ``.`` to ``size`` bytes."""
    head = json.dumps({"key": key, "seq": seq}, separators=(",", ":")).encode() + b"\n"
    return head + b"." * max(0, size - len(head))


def decode_body(body: bytes) -> tuple[str, int] | None:
    """``(key, seq)`` of a trimq-producer body, None for any other body."""
    if not body.startswith(b'{"key":'):
        return None
    head, sep, _ = bytes(body[:4096]).partition(b"\n")
    if not sep:
        return None
    try:
        obj = json.loads(head)
        key, seq = obj["key"], obj["seq"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(key, str) or isinstance(seq, bool) or not isinstance(seq, int):
        return None
    return key, seq


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class RecordWriter:
    """Appends JSON lines to a file; every :meth:`write` is flushed (and fsynced with ``fsync=True``)
    before it returns. Thread-safe: sync listeners run in worker threads."""

    def __init__(self, path: str, *, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fh: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.lines = 0

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        if not records:
            return
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        with self._lock:
            self._fh.write(text)
            self._fh.flush()
            if self.fsync:
                os.fsync(self._fh.fileno())
            self.lines += len(records)

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()
                self._fh.close()


def consumer_record(msg: MessageExt, *, broker: str, client_id: str, now_ms: int | None = None) -> dict[str, Any]:
    """The record line of one consumed message (see the module documentation)."""
    rec: dict[str, Any] = {
        "topic": msg.topic,
        "broker": broker,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "keys": msg.keys,
        "msg_id": msg.unique_id,
        "offset_msg_id": msg.msg_id,
        "reconsume_times": msg.reconsume_times,
        "body_sha1": hashlib.sha1(msg.body).hexdigest(),
        "consume_time": wall_ms() if now_ms is None else now_ms,
        "client_id": client_id,
    }
    decoded = decode_body(msg.body)
    if decoded is not None:
        rec["key"], rec["seq"] = decoded
    return rec


# --- shared CLI plumbing -------------------------------------------------------------------------------


def _fail(tool: str, text: str, status: int = 2) -> NoReturn:
    click.echo(f"{tool}: {text}", err=True)
    sys.exit(status)


def _load(tool: str, cls: type[Any], config_file: str | None, section: str, overrides: dict[str, Any]) -> Any:
    try:
        return load_client_settings(cls, config_file=config_file, section=section, overrides=overrides)
    except (ConfigError, TypeError) as exc:
        _fail(tool, f"invalid configuration: {exc}")


def _leaf(exc: BaseException) -> BaseException:
    """The one real error inside nested exception groups (trio nurseries wrap what their tasks raise)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _exit_on_error(tool: str, exc: BaseException) -> NoReturn:
    """A clear one-line error and exit status 1 for expected failures; anything else propagates."""
    leaf = _leaf(exc)
    if isinstance(leaf, click.ClickException):
        _fail(tool, leaf.format_message(), 1)
    if isinstance(leaf, TrimqClientError | ConfigError | OSError):
        _fail(tool, f"{type(leaf).__name__}: {leaf}", 1)
    raise exc


class Progress:
    """``\\r``-rewritten progress on stderr, only when stderr is a terminal (or when forced)."""

    def __init__(self, total: int, label: str, enabled: bool | None = None) -> None:
        self.total = total
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.start = time.monotonic()
        self._shown = False

    def show(self, done: int, failed: int = 0) -> None:
        if not self.enabled:
            return
        elapsed = max(time.monotonic() - self.start, 1e-6)
        rate = done / elapsed
        width = 28
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        eta = "   0s" if done >= self.total else f"{(self.total - done) / rate:5.0f}s" if rate > 0 else "    ?"
        extra = f" failed {failed}" if failed else ""
        sys.stderr.write(f"\r{self.label} [{bar}] {done}/{self.total} {frac:6.1%} {rate:8.0f} msg/s eta {eta}{extra}")
        sys.stderr.flush()
        self._shown = True

    def finish(self, done: int, failed: int = 0) -> None:
        if self.enabled:
            self.show(done, failed)
            if self._shown:
                sys.stderr.write("\n")
                sys.stderr.flush()


# --- trimq-producer -------------------------------------------------------------------------------------


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
        return key, seq, Message(o.topic, encode_body(key, seq, o.body_size), tags=o.tag, keys=key,
                                 delay_time_level=o.delay_level)

    async def run(self) -> ProducerSummary:
        from trimq.client.selectors import select_by_hash

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
                    for mq, keys in orderly_key_shares(mqs, o.keys, o.inflight, select_by_hash):
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
                if n == 1:
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
        mq = result.message_queue
        self.record.write([
            {"topic": mq.topic, "broker": mq.broker_name, "queue_id": mq.queue_id,
             "queue_offset": result.queue_offset + j, "key": key, "seq": seq,
             "msg_id": ids[j] if j < len(ids) else "", "send_time": sent_at, "ack_time": now}
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


async def ensure_topic(instance: Any, topic: str, queues: int, *, timeout_s: float = 15.0) -> int:
    """Create or update ``topic`` with ``queues`` read/write queues on every master broker the name server
    knows, then wait until the name server's route shows them. Returns the number of writable queues."""
    from trimq.client.errors import MQBrokerError, MQClientError
    from trimq.client.remoting import RemotingError

    cluster = None
    errors: list[str] = []
    for ns in instance.config.namesrv_addrs:
        try:
            cluster = await instance.api.get_broker_cluster_info(ns)
            break
        except (RemotingError, MQBrokerError, MQClientError) as exc:
            errors.append(f"{ns}: {exc}")
    if cluster is None:
        raise click.ClickException(f"cannot reach a name server ({'; '.join(errors) or 'none configured'})")
    masters = sorted(bd.master_addr for bd in cluster.broker_addr_table.values() if bd.master_addr)
    if not masters:
        raise click.ClickException("the name server knows no master broker")
    for addr in masters:
        await instance.api.create_topic(addr, topic, read_queue_nums=queues, write_queue_nums=queues)
    want = queues * len(masters)
    ns_addr = instance.config.namesrv_addrs[0]
    with trio.move_on_after(timeout_s):
        while True:
            # Ask the name server directly (quietly) until the brokers re-registered the topic.
            try:
                route = await instance.api.get_topic_route(ns_addr, topic)
                ready = len(route.publish_queues(topic)) == want
            except (RemotingError, MQBrokerError, MQClientError):
                ready = False
            if ready and await instance.update_topic_route_info_from_name_server(topic):
                info = instance.topic_publish_info_table.get(topic)
                if info is not None and len(info.message_queue_list) == want:
                    return want
            await trio.sleep(0.05)
    raise click.ClickException(f"topic {topic!r}: the name server did not show {want} queues within {timeout_s} s")


async def _producer_session(config: ProducerConfig, opts: ProducerOptions, as_json: bool) -> int:
    from trimq.client.producer import Producer

    record = RecordWriter(opts.record) if opts.record else None
    try:
        async with Producer(config) as producer:
            assert producer.instance is not None
            if opts.queues:
                await ensure_topic(producer.instance, opts.topic, opts.queues)
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


@click.command(context_settings=_CONTEXT)
@click.option("--namesrv", "namesrv_addr", help="Name server HOST:PORT (several separated by ';').")
@click.option("--topic", required=True, help="Topic to send to.")
@click.option("--count", required=True, type=click.IntRange(min=0), help="Number of messages.")
@click.option("--keys", type=click.IntRange(min=1), default=100, show_default=True,
              help="Keys cycled over: key-0000, key-0001, ... (message i has key i % K).")
@click.option("--body-size", type=click.IntRange(min=0, max=16 * 1024 * 1024), default=64, show_default=True,
              help="Body size in bytes (the JSON header line is never cut).")
@click.option("--orderly", is_flag=True,
              help="Route by key hash and send each key's messages in sequence (next after the previous ack).")
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
@click.option("--log-format", type=_LOG_FORMATS, default="auto", show_default=True)
@click.option("--log-level", type=_LOG_LEVELS, default="warning", show_default=True)
def producer_main(namesrv_addr: str | None, topic: str, count: int, keys: int, body_size: int, orderly: bool,
                  record: str | None, rate: float, batch: int, inflight: int, tag: str | None, delay_level: int,
                  queues: int, producer_group: str | None, instance_name: str | None, config_file: str | None,
                  progress: bool | None, as_json: bool, log_format: str, log_level: str) -> None:
    """Send COUNT messages to TOPIC and print a summary (exit status 0 when all were acknowledged).

    Bodies carry {"key", "seq"} as a JSON first line (see client/cli.py). Settings: defaults < --config
    [producer] < TRIMQ_* environment < flags.
    """
    configure_logging(log_format, log_level)
    config = _load("trimq-producer", ProducerConfig, config_file, "producer", {
        "namesrv_addr": namesrv_addr, "producer_group": producer_group, "instance_name": instance_name,
    })
    if not config.namesrv_addrs:
        _fail("trimq-producer", "no name server: pass --namesrv HOST:PORT (or set TRIMQ_NAMESRV_ADDR)")
    opts = ProducerOptions(topic=topic, count=count, keys=keys, body_size=body_size, orderly=orderly, record=record,
                           rate=rate, batch=batch, tag=tag, delay_level=delay_level, inflight=inflight, queues=queues,
                           progress=progress)
    try:
        from trimq.protocol.validation import InvalidNameError, check_topic

        check_topic(topic)
    except InvalidNameError as exc:
        _fail("trimq-producer", f"--topic {topic!r}: {exc}")
    try:
        status = trio.run(_producer_session, config, opts, as_json)
    except BaseException as exc:
        _exit_on_error("trimq-producer", exc)
    sys.exit(status)


# --- trimq-consumer -------------------------------------------------------------------------------------


def load_handler(spec: str) -> Callable[..., Any]:
    """``module:function`` -> the function (ClickException with the reason when it cannot be loaded)."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise click.BadParameter(f"{spec!r} must be module:function", param_hint="--handler")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # handlers next to where the tool runs, as `python -m` would
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as exc:
        raise click.BadParameter(f"cannot import {mod_name!r}: {type(exc).__name__}: {exc}",
                                 param_hint="--handler") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise click.BadParameter(f"{mod_name!r} has no attribute {attr!r}", param_hint="--handler")
        obj = getattr(obj, part)
    if not callable(obj):
        raise click.BadParameter(f"{spec} is not callable", param_hint="--handler")
    return obj  # type: ignore[no-any-return]


@dataclasses.dataclass
class ConsumerOptions:
    topic: str
    tags: str = "*"
    orderly: bool = False
    handler: Callable[..., Any] | None = None
    record: str | None = None
    record_fsync: bool = False
    exit_after_idle_s: float = 0.0
    quiet: bool = False
    metrics_port: int | None = None


class ConsumerApp:
    """The listener of ``trimq-consumer``: runs the handler, then records (or prints) what succeeded.

    Handler convention: ``handler(msgs, context)``, ``def`` or ``async def``; it returns a status of the
    consumer's kind, or True / None for success and False for failure; raising is a failure (SUSPEND in
    orderly mode, RECONSUME_LATER in concurrent mode). Only successfully consumed messages are recorded."""

    def __init__(self, opts: ConsumerOptions, statuses: tuple[Any, Any, frozenset[Any]],
                 record: RecordWriter | None, out: IO[str] | None) -> None:
        self.opts = opts
        self.ok_status, self.fail_status, self.success_values = statuses
        self.record = record
        self.out = out
        self.client_id = ""
        self.consumed = 0
        self.last_consume = time.monotonic()
        self._out_lock = threading.Lock()

    def _broker(self, context: Any) -> str:
        mq = getattr(context, "message_queue", None) or getattr(context, "mq", None)
        return str(getattr(mq, "broker_name", ""))

    def _normalise(self, result: Any) -> Any:
        if result is None or result is True:
            return self.ok_status
        if result is False:
            return self.fail_status
        return result

    def _after(self, msgs: list[MessageExt], context: Any, status: Any) -> Any:
        if status not in self.success_values:
            return status
        broker = self._broker(context)
        now = wall_ms()
        recs = [consumer_record(m, broker=broker, client_id=self.client_id, now_ms=now) for m in msgs]
        if self.record is not None:
            self.record.write(recs)  # flushed before we return success: before the offset can be committed
        if self.out is not None:
            with self._out_lock:
                for r, m in zip(recs, msgs, strict=True):
                    r["body"] = m.body[:256].decode("utf-8", "replace")
                    self.out.write(json.dumps(r) + "\n")
                self.out.flush()
        self.consumed += len(msgs)
        self.last_consume = time.monotonic()
        return status

    def sync_listener(self, msgs: list[MessageExt], context: Any) -> Any:
        assert self.opts.handler is not None
        return self._after(msgs, context, self._normalise(self.opts.handler(msgs, context)))

    async def async_listener(self, msgs: list[MessageExt], context: Any) -> Any:
        status = self.ok_status
        if self.opts.handler is not None:
            status = self._normalise(await self.opts.handler(msgs, context))
        if self.record is not None and self.record.fsync:
            return await trio.to_thread.run_sync(self._after, msgs, context, status)
        return self._after(msgs, context, status)

    def listener(self) -> Callable[..., Any]:
        h = self.opts.handler
        if h is None or inspect.iscoroutinefunction(h):
            return self.async_listener
        return self.sync_listener


def _client_id_of(consumer: Any) -> str:
    for path in ("client_id", "instance.client_id", "core.instance.client_id"):
        obj: Any = consumer
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if isinstance(obj, str) and obj:
            return obj
    return ""


async def _consumer_session(config: PushConsumerConfig, opts: ConsumerOptions) -> int:
    from trimq import client as sdk

    push_consumer_cls = sdk.PushConsumer
    statuses: tuple[Any, Any, frozenset[Any]]
    if opts.orderly:
        o = sdk.ConsumeOrderlyStatus
        statuses = (o.SUCCESS, o.SUSPEND_CURRENT_QUEUE_A_MOMENT, frozenset({o.SUCCESS, o.COMMIT}))
    else:
        c = sdk.ConsumeConcurrentlyStatus
        statuses = (c.CONSUME_SUCCESS, c.RECONSUME_LATER, frozenset({c.CONSUME_SUCCESS}))
    record = RecordWriter(opts.record, fsync=opts.record_fsync) if opts.record else None
    app = ConsumerApp(opts, statuses, record, None if (record is not None or opts.quiet) else sys.stdout)
    consumer = push_consumer_cls(config, metrics_port=opts.metrics_port)
    consumer.subscribe(opts.topic, opts.tags)
    if opts.orderly:
        consumer.register_message_listener_orderly(app.listener())
    else:
        consumer.register_message_listener_concurrently(app.listener())
    reason = "signal"
    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with consumer:
                app.client_id = _client_id_of(consumer)
                if consumer.metrics_address is not None:
                    host, port = consumer.metrics_address
                    click.echo(f"trimq-consumer: metrics on http://{host}:{port}/metrics", err=True)
                app.last_consume = time.monotonic()  # idle time counts from the start, not from the launch
                log.info("consumer.cli_started", client_id=app.client_id, group=config.consumer_group,
                         topic=opts.topic, orderly=opts.orderly)
                async with trio.open_nursery() as nursery:

                    async def idle_watch() -> None:
                        nonlocal reason
                        while time.monotonic() - app.last_consume < opts.exit_after_idle_s:
                            await trio.sleep(min(0.2, opts.exit_after_idle_s))
                        reason = "idle"
                        nursery.cancel_scope.cancel()

                    async def show_count() -> None:
                        start, shown = time.monotonic(), False
                        try:
                            while True:
                                await trio.sleep(0.5)
                                rate = app.consumed / max(time.monotonic() - start, 1e-6)
                                sys.stderr.write(f"\rconsumed {app.consumed} ({rate:.0f} msg/s)")
                                sys.stderr.flush()
                                shown = True
                        finally:
                            if shown:
                                sys.stderr.write("\n")

                    if opts.exit_after_idle_s > 0:
                        nursery.start_soon(idle_watch)
                    if app.out is None and not opts.quiet and sys.stderr.isatty():
                        nursery.start_soon(show_count)  # a live count when nothing else goes to the terminal
                    async for signum in signals:
                        log.info("signal.received", signal=signal.Signals(signum).name)
                        nursery.cancel_scope.cancel()
                        break
                # leaving `async with consumer`: the graceful shutdown (in-flight listeners finish,
                # offsets persisted, queues unlocked, unregistered)
    finally:
        if record is not None:
            record.close()
    click.echo(f"trimq-consumer: consumed {app.consumed} messages ({reason}); client {app.client_id}", err=True)
    return 0


@click.command(context_settings=_CONTEXT)
@click.option("--namesrv", "namesrv_addr", help="Name server HOST:PORT (several separated by ';').")
@click.option("--group", "consumer_group", help="Consumer group (required, here or in the config).")
@click.option("--topic", required=True, help="Topic to consume.")
@click.option("--tags", default="*", show_default=True, help='Tag expression: "*" or "TagA || TagB".')
@click.option("--orderly", is_flag=True, help="Orderly consumption (queue locks, one message queue at a time).")
@click.option("--handler", "handler_spec", metavar="MODULE:FUNCTION",
              help="handler(msgs, context) -> status | True/None (ok) | False (retry); def or async def.")
@click.option("--record", type=click.Path(dir_okay=False),
              help="Append one JSON line per consumed message, flushed before the offset can be committed.")
@click.option("--record-fsync", is_flag=True, help="Also fsync the record file on every listener call.")
@click.option("--from", "from_where", type=click.Choice(["first", "last", "timestamp"]),
              help="Where a group with no stored offset starts [default: last].")
@click.option("--timestamp", "consume_timestamp", metavar="yyyyMMddHHmmss", help="Start time for --from timestamp.")
@click.option("--max-reconsume-times", type=click.IntRange(min=-1), help="Deliveries before dead-lettering.")
@click.option("--exit-after-idle", type=click.FloatRange(min=0), default=0, metavar="S",
              help="Shut down gracefully after S seconds without a message (0 = never).")
@click.option("--instance-name", help="Instance name (part of the client id).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on 127.0.0.1:PORT (0 = any free port; default off).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML file; settings from its [consumer] table (PushConsumerConfig names).")
@click.option("--quiet", is_flag=True, help="Without --record, do not print messages.")
@click.option("--log-format", type=_LOG_FORMATS, default="auto", show_default=True)
@click.option("--log-level", type=_LOG_LEVELS, default="warning", show_default=True)
def consumer_main(namesrv_addr: str | None, consumer_group: str | None, topic: str, tags: str, orderly: bool,
                  handler_spec: str | None, record: str | None, record_fsync: bool, from_where: str | None,
                  consume_timestamp: str | None, max_reconsume_times: int | None, exit_after_idle: float,
                  instance_name: str | None, metrics_port: int | None, config_file: str | None, quiet: bool,
                  log_format: str, log_level: str) -> None:
    """Consume TOPIC in consumer group GROUP until SIGINT/SIGTERM (graceful shutdown, exit status 0).

    Without --handler every message is printed as a JSON line (or recorded with --record). Settings:
    defaults < --config [consumer] < TRIMQ_* environment < flags.
    """
    configure_logging(log_format, log_level)
    if consume_timestamp and from_where not in (None, "timestamp"):
        _fail("trimq-consumer", f"--timestamp needs --from timestamp (not --from {from_where})")
    where = {"first": "CONSUME_FROM_FIRST_OFFSET", "last": "CONSUME_FROM_LAST_OFFSET",
             "timestamp": "CONSUME_FROM_TIMESTAMP"}.get(from_where or "")
    config = _load("trimq-consumer", PushConsumerConfig, config_file, "consumer", {
        "namesrv_addr": namesrv_addr, "consumer_group": consumer_group, "consume_from_where": where,
        "consume_timestamp": consume_timestamp, "max_reconsume_times": max_reconsume_times,
        "instance_name": instance_name,
    })
    if not config.namesrv_addrs:
        _fail("trimq-consumer", "no name server: pass --namesrv HOST:PORT (or set TRIMQ_NAMESRV_ADDR)")
    try:
        from trimq.protocol.validation import InvalidNameError, check_topic

        check_topic(topic)
    except InvalidNameError as exc:
        _fail("trimq-consumer", f"--topic {topic!r}: {exc}")
    handler = load_handler(handler_spec) if handler_spec else None
    opts = ConsumerOptions(topic=topic, tags=tags, orderly=orderly, handler=handler, record=record,
                           record_fsync=record_fsync, exit_after_idle_s=exit_after_idle, quiet=quiet,
                           metrics_port=metrics_port)
    try:
        status = trio.run(_consumer_session, config, opts)
    except BaseException as exc:
        _exit_on_error("trimq-consumer", exc)
    sys.exit(status)
