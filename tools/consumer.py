"""``trimq-consumer``: consume a topic from the command line until SIGINT/SIGTERM, printing or recording
every message consumed (see :mod:`trimq.tools.records` for the record file), with an optional handler.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

import click
import trio

from trimq.client.config import PushConsumerConfig
from trimq.client.subscription import build_subscription_data
from trimq.protocol.message import MessageExt
from trimq.runtime.logs import configure_logging, get_logger
from trimq.tools.common import CONTEXT, LOG_FORMATS, LOG_LEVELS, exit_on_error, fail, load_client_config, version_option
from trimq.tools.records import RecordWriter, consumer_record, wall_ms

__all__ = ["ConsumerApp", "ConsumerOptions", "load_handler", "main"]

log = get_logger("trimq.tools.consumer")


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
    metrics_host: str = "127.0.0.1"


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

    def _after(self, msgs: list[MessageExt], context: Any, status: Any, started: int) -> Any:
        if status not in self.success_values:
            return status
        broker = self._broker(context)
        now = wall_ms()
        recs = [consumer_record(m, broker=broker, client_id=self.client_id, now_ms=now, start_ms=started)
                for m in msgs]
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
        started = wall_ms()
        return self._after(msgs, context, self._normalise(self.opts.handler(msgs, context)), started)

    async def async_listener(self, msgs: list[MessageExt], context: Any) -> Any:
        started = wall_ms()
        status = self.ok_status
        if self.opts.handler is not None:
            status = self._normalise(await self.opts.handler(msgs, context))
        if self.record is not None and self.record.fsync:
            return await trio.to_thread.run_sync(self._after, msgs, context, status, started)
        return self._after(msgs, context, status, started)

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
    consumer = push_consumer_cls(config, metrics_port=opts.metrics_port, metrics_host=opts.metrics_host)
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


@click.command(context_settings=CONTEXT)
@version_option("trimq-consumer")
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
@click.option("--order-scope", type=click.Choice(["queue", "key"]),
              help="With --orderly: 'queue' (RocketMQ: one batch of a queue at a time) or 'key' (a queue's keys in "
                   "parallel, each key in order) [default: queue].")
@click.option("--max-in-flight-keys", type=click.IntRange(min=1),
              help="With --order-scope key: keys in the listener at once [default: 64].")
@click.option("--max-reconsume-times", type=click.IntRange(min=-1), help="Deliveries before dead-lettering.")
@click.option("--exit-after-idle", type=click.FloatRange(min=0), default=0, metavar="S",
              help="Shut down gracefully after S seconds without a message (0 = never).")
@click.option("--instance-name", help="Instance name (part of the client id).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port (0 = any free port, printed; default off).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address the metrics endpoint binds (0.0.0.0: reachable by a Prometheus on another host).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML file; settings from its [consumer] table (PushConsumerConfig names).")
@click.option("--quiet", is_flag=True, help="Without --record, do not print messages.")
@click.option("--log-format", type=LOG_FORMATS, default="auto", show_default=True)
@click.option("--log-level", type=LOG_LEVELS, default="warning", show_default=True)
def main(namesrv_addr: str | None, consumer_group: str | None, topic: str, tags: str, orderly: bool,
         handler_spec: str | None, record: str | None, record_fsync: bool, from_where: str | None,
         consume_timestamp: str | None, order_scope: str | None, max_in_flight_keys: int | None,
         max_reconsume_times: int | None, exit_after_idle: float,
         instance_name: str | None, metrics_port: int | None, metrics_host: str, config_file: str | None, quiet: bool,
         log_format: str, log_level: str) -> None:
    """Consume TOPIC in consumer group GROUP until SIGINT/SIGTERM (graceful shutdown, exit status 0).

    Without --handler every message is printed as a JSON line (or recorded with --record). Settings:
    defaults < --config [consumer] < TRIMQ_CLIENT_* environment < flags.
    """
    configure_logging(log_format, log_level)
    if consume_timestamp and from_where not in (None, "timestamp"):
        fail("trimq-consumer", f"--timestamp needs --from timestamp (not --from {from_where})")
    if order_scope and not orderly:
        fail("trimq-consumer", "--order-scope needs --orderly (it chooses what an orderly consumer keeps in order)")
    if max_in_flight_keys is not None and order_scope != "key":
        fail("trimq-consumer", "--max-in-flight-keys needs --order-scope key")
    where = {"first": "CONSUME_FROM_FIRST_OFFSET", "last": "CONSUME_FROM_LAST_OFFSET",
             "timestamp": "CONSUME_FROM_TIMESTAMP"}.get(from_where or "")
    config = load_client_config("trimq-consumer", PushConsumerConfig, config_file, "consumer", {
        "namesrv_addr": namesrv_addr, "consumer_group": consumer_group, "consume_from_where": where,
        "consume_timestamp": consume_timestamp, "max_reconsume_times": max_reconsume_times,
        "instance_name": instance_name, "order_scope": order_scope, "max_in_flight_keys": max_in_flight_keys,
    })
    if not config.namesrv_addrs:
        fail("trimq-consumer", "no name server: pass --namesrv HOST:PORT (or set TRIMQ_CLIENT_NAMESRV_ADDR)")
    try:
        from trimq.protocol.validation import InvalidNameError, check_topic

        check_topic(topic)
    except InvalidNameError as exc:
        fail("trimq-consumer", f"--topic {topic!r}: {exc}")
    try:
        build_subscription_data(topic, tags)
    except ValueError as exc:
        fail("trimq-consumer", f"--tags {tags!r}: {exc}")
    handler = load_handler(handler_spec) if handler_spec else None
    opts = ConsumerOptions(topic=topic, tags=tags, orderly=orderly, handler=handler, record=record,
                           record_fsync=record_fsync, exit_after_idle_s=exit_after_idle, quiet=quiet,
                           metrics_port=metrics_port, metrics_host=metrics_host)
    try:
        status = trio.run(_consumer_session, config, opts)
    except BaseException as exc:
        exit_on_error("trimq-consumer", exc)
    sys.exit(status)
