"""``trimq-admin``: administer topics, consumer groups, dead letters and the cluster (RocketMQ's mqadmin).

::

    trimq-admin --namesrv 127.0.0.1:9876 topic list
    trimq-admin --namesrv 127.0.0.1:9876 --json consumer progress -g orders

Each command runs one operation of the library class :class:`trimq.client.admin.Admin` and prints its typed
result: tables for people (the renderers of :mod:`trimq.tools.admin_format`), ``--json`` for scripts (one
JSON document on stdout, :func:`trimq.client.admin_results.to_document`). Errors go to stderr as
``trimq-admin: error: ...`` with exit status 1 (2 for a usage error). docs/ADMIN.md shows every command
with its output.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import click
import trio

from trimq.client.admin import Admin, AdminError, BrokerNotNamedError, PartialFailure, open_admin
from trimq.client.admin_results import BrokerFailure, StoredMessage, to_document
from trimq.client.config import ClientConfig, ConfigError
from trimq.client.errors import TrimqClientError
from trimq.protocol.fields import JAVA_INT_MAX, JAVA_LONG_MAX
from trimq.protocol.validation import InvalidNameError, check_group, check_topic
from trimq.runtime.client import RemotingError
from trimq.tools import admin_format as fmt
from trimq.tools.admin_allocate import allocate_command
from trimq.tools.common import CONTEXT, leaf, version_option

__all__ = ["main"]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class CliOptions:
    namesrv: str | None
    as_json: bool
    timeout_ms: int
    access_key: str | None
    secret_key: str | None
    tls: bool
    tls_ca_file: str | None


def _fail(message: str, status: int = 1) -> NoReturn:
    click.echo(f"trimq-admin: error: {message}", err=True)
    sys.exit(status)


def _check_name(kind: str, value: str, hint: str) -> str:
    try:
        return check_group(value) if kind == "group" else check_topic(value)
    except InvalidNameError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


R = Any  # an operation's typed result (trimq.client.admin_results)


def _run(op: Callable[[Admin], Awaitable[R]], render: Callable[[dict[str, Any]], str], warn: str | None = None) -> None:
    """Run ``op`` against the cluster and print its result (JSON, or ``render`` of its document); brokers
    that did not answer are warned about on stderr (``warn`` names what was asked); errors exit 1."""
    from trimq.runtime.tls import TlsConfigError

    opts: CliOptions = click.get_current_context().find_object(CliOptions)  # type: ignore[assignment]
    if not opts.namesrv:
        raise click.UsageError("no name server: pass --namesrv HOST:PORT (or set TRIMQ_CLIENT_NAMESRV_ADDR)")
    if bool(opts.access_key) != bool(opts.secret_key):
        raise click.UsageError("--access-key and --secret-key go together")
    try:
        config = ClientConfig(namesrv_addr=opts.namesrv, access_key=opts.access_key or "",
                              secret_key=opts.secret_key or "", tls_enable=bool(opts.tls or opts.tls_ca_file),
                              tls_ca_file=opts.tls_ca_file or "")
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None

    async def session() -> R:
        async with open_admin(config, timeout_ms=opts.timeout_ms) as admin:
            return await op(admin)

    def emit(result: R) -> None:
        doc = to_document(result)
        click.echo(fmt.to_json(doc) if opts.as_json else render(doc))

    try:
        result = trio.run(session)
    except BaseException as raised:
        error = leaf(raised)  # the client's nursery wraps what the command raised in an exception group
        if isinstance(error, PartialFailure):
            emit(error.result)
            _fail(str(error))
        if isinstance(error, TlsConfigError):
            raise click.BadParameter(str(error), param_hint="--tls-ca-file") from None
        if isinstance(error, BrokerNotNamedError):
            raise click.UsageError(f"{error} with --broker") from None
        if isinstance(error, TrimqClientError | RemotingError):
            _fail(str(error))
        if isinstance(error, click.ClickException):
            raise error from None
        if isinstance(error, KeyboardInterrupt):
            _fail("interrupted", 130)
        raise
    if warn is not None:
        for failure in getattr(result, "errors", None) or []:
            if isinstance(failure, BrokerFailure):
                click.echo(f"trimq-admin: warning: {warn} of broker {failure.broker_name}: {failure.error}", err=True)
    emit(result)


@click.group(context_settings=CONTEXT)
@version_option("trimq-admin")
@click.option("--namesrv", envvar=["TRIMQ_CLIENT_NAMESRV_ADDR", "NAMESRV_ADDR"], metavar="HOST:PORT",
              help="Name server address (several separated by ';'); env TRIMQ_CLIENT_NAMESRV_ADDR.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document for scripts instead of tables.")
@click.option("--timeout-ms", type=click.IntRange(min=1, max=600_000), default=5000, show_default=True,
              help="Timeout of each request.")
@click.option("--access-key", envvar="TRIMQ_CLIENT_ACCESS_KEY", help="ACL access key (brokers with --acl).")
@click.option("--secret-key", envvar="TRIMQ_CLIENT_SECRET_KEY", help="ACL secret key.")
@click.option("--tls", is_flag=True, help="Connect with TLS (system CAs unless --tls-ca-file).")
@click.option("--tls-ca-file", type=click.Path(dir_okay=False), help="CA file to verify TLS servers with.")
@click.pass_context
def main(ctx: click.Context, namesrv: str | None, as_json: bool, timeout_ms: int, access_key: str | None,
         secret_key: str | None, tls: bool, tls_ca_file: str | None) -> None:
    """Administer a trimq cluster: topics, consumer groups, dead letters, messages, brokers.

    Tables for people, --json for scripts; errors on stderr with exit status 1 (2 for usage errors).
    """
    from trimq.runtime.logs import configure_logging

    configure_logging("auto", os.environ.get("TRIMQ_ADMIN_LOG_LEVEL", "error"))
    # a client like the others: TRIMQ_CLIENT_* variables, the retired unprefixed names refused as they do
    for old in ("TRIMQ_NAMESRV_ADDR", "TRIMQ_ACCESS_KEY", "TRIMQ_SECRET_KEY"):
        if old in os.environ:
            raise click.UsageError(f"environment variable {old} is no longer read: use TRIMQ_CLIENT_{old[6:]}")
    ctx.obj = CliOptions(namesrv, as_json, timeout_ms, access_key, secret_key, tls, tls_ca_file)
    if as_json:
        ctx.default_map = {"allocate": {"as_json": True}}  # the group's --json also applies to allocate


main.add_command(allocate_command)

def _json_flag(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        opts = ctx.find_object(CliOptions)
        if opts is not None:
            opts.as_json = True


_JSON = click.option("--json", "as_json", is_flag=True, expose_value=False, callback=_json_flag,
                     help="Print one JSON document (same as trimq-admin --json).")
_GROUP = click.option("-g", "--group", "group", required=True, help="Consumer group.")
_TOPIC = click.option("-t", "--topic", "topic", required=True, help="Topic.")
_BROKER = click.option("-b", "--broker", "broker", help="Broker name (when the topic is on several brokers).")
# What a broker's fields hold (Java int / long): a larger value could not even be encoded in the request.
QUEUE_ID = click.IntRange(min=0, max=JAVA_INT_MAX)
QUEUE_OFFSET = click.IntRange(min=0, max=JAVA_LONG_MAX)


# --- topic -------------------------------------------------------------------------------------------------


@main.group(name="topic")
def topic_group() -> None:
    """Topics: list, create, status, delete."""


@topic_group.command(name="list")
@_JSON
def topic_list() -> None:
    """Every topic the name server routes, with its queues and permission on each broker."""
    _run(lambda a: a.topic_list(), fmt.render_topic_list, "topic configs")


@topic_group.command(name="create")
@_JSON
@_TOPIC
@click.option("-q", "--queues", type=click.IntRange(min=1, max=1024), default=4, show_default=True,
              help="Read and write queues on each broker.")
@click.option("--perm", default="6", show_default=True, help="Permission: 0..7 or letters (rw, r, w).")
@click.option("-b", "--broker", "brokers", multiple=True, help="Create on this broker only (repeatable).")
@click.option("-c", "--cluster", help="Create on every broker of this cluster.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait (up to 5 s) until the name server routes the topic.")
def topic_create(topic: str, queues: int, perm: str, brokers: tuple[str, ...], cluster: str | None,
                 wait: bool) -> None:
    """Create or update TOPIC (default: on every broker the name server knows)."""
    _check_name("topic", topic, "--topic")
    try:
        perm_value = fmt.parse_perm(perm)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--perm") from None
    _run(lambda a: a.topic_create(topic, queues, perm_value, brokers, cluster, wait), fmt.render_topic_create)


@topic_group.command(name="status")
@_JSON
@_TOPIC
def topic_status(topic: str) -> None:
    """Per queue: min offset, max offset, message count and the store time of the last message."""
    _check_name("topic", topic, "--topic")
    _run(lambda a: a.topic_status(topic), lambda d: fmt.render_topic_status(d), "topic stats")


@topic_group.command(name="delete")
@_JSON
@_TOPIC
@click.option("-c", "--cluster", help="Only on the brokers of this cluster (default: every broker).")
def topic_delete(topic: str, cluster: str | None) -> None:
    """Delete TOPIC on the brokers (config, consume queues, stored offsets) and the name servers (its route),
    as mqadmin deleteTopic. Its messages stay in the commit log until they expire."""
    _check_name("topic", topic, "--topic")
    _run(lambda a: a.topic_delete(topic, cluster), fmt.render_topic_delete)


# --- consumer ----------------------------------------------------------------------------------------------


@main.group(name="consumer")
def consumer_group() -> None:
    """Consumer groups: list, progress, connections, locks, status, reset-offset, skip, delete."""


@consumer_group.command(name="list")
@_JSON
def consumer_list() -> None:
    """Every consumer group the brokers know: live members, consume mode, message model, total lag."""
    _run(lambda a: a.consumer_list(), fmt.render_consumer_list, "consumer groups")


@consumer_group.command(name="delete")
@_JSON
@_GROUP
@click.option("--force", is_flag=True, help="Delete even while members are online.")
@click.option("--keep-offsets", is_flag=True, help="Keep the group's stored offsets (RocketMQ's default).")
def consumer_delete(group: str, force: bool, keep_offsets: bool) -> None:
    """Delete the group's config (and its stored offsets) on every master broker, as mqadmin deleteSubGroup.
    Refused while the group has live members, unless --force."""
    _check_name("group", group, "--group")
    _run(lambda a: a.consumer_delete(group, force=force, keep_offsets=keep_offsets), fmt.render_consumer_delete)


@consumer_group.command(name="progress")
@_JSON
@_GROUP
@click.option("-t", "--topic", "topic", help="Only this topic (default: every topic of the group, %RETRY% too).")
def consumer_progress(group: str, topic: str | None) -> None:
    """Per queue: broker offset, consumer offset, lag and owner; the group's total lag (RocketMQ's
    consumerProgress)."""
    _check_name("group", group, "--group")
    if topic is not None:
        _check_name("topic", topic, "--topic")
    _run(lambda a: a.consumer_progress(group, topic), lambda d: fmt.render_consumer_progress(d), "consume stats")


@consumer_group.command(name="connections")
@_JSON
@_GROUP
def consumer_connections(group: str) -> None:
    """The group's live members (client id, address, version, last heartbeat) and subscriptions."""
    _check_name("group", group, "--group")
    _run(lambda a: a.consumer_connections(group), lambda d: fmt.render_consumer_connections(d))


@consumer_group.command(name="locks")
@_JSON
@_GROUP
def consumer_locks(group: str) -> None:
    """The brokers' queue locks of the group (owner, age, expired) and fenced offset updates."""
    _check_name("group", group, "--group")
    _run(lambda a: a.consumer_locks(group), lambda d: fmt.render_consumer_locks(d), "lock table")


@consumer_group.command(name="status")
@_JSON
@_GROUP
@click.option("--client", "client_id", help="Only this member (client id).")
def consumer_status(group: str, client_id: str | None) -> None:
    """Each member's running info, fetched through the broker: process queues, locked and blocked queues,
    consume latency."""
    _check_name("group", group, "--group")
    _run(lambda a: a.consumer_status(group, client_id), lambda d: fmt.render_consumer_status(d, now_ms=_now_ms()))


@consumer_group.command(name="reset-offset")
@_JSON
@_GROUP
@_TOPIC
@click.option("-s", "--timestamp", "timestamp", required=True, metavar="WHEN",
              help="Epoch ms, yyyyMMddHHmmss, ISO 8601, yyyy-MM-dd#HH:mm:ss:SSS, now, or -30m style.")
@click.option("--force/--no-force", default=True, show_default=True,
              help="--no-force only moves a queue back (never skips messages).")
@click.option("--execute", is_flag=True, help="Apply the reset (without it, only the plan is printed).")
def consumer_reset_offset(group: str, topic: str, timestamp: str, force: bool, execute: bool) -> None:
    """Move the group's offsets of TOPIC to the first message stored at or after a time (RocketMQ's
    resetOffsetByTime). Prints the plan (queue, current and new offset) and changes nothing unless --execute.
    Safe with the group online: members drop the queues and restart from the new offsets, and a commit made
    before the reset cannot undo it."""
    _check_name("group", group, "--group")
    _check_name("topic", topic, "--topic")
    try:
        ts = fmt.parse_timestamp(timestamp, now_ms=_now_ms())
    except fmt.TimestampError as exc:
        raise click.BadParameter(str(exc), param_hint="--timestamp") from None
    _run(lambda a: a.reset_offset(group, topic, ts, force, dry_run=not execute), lambda d: fmt.render_reset_offset(d))


@consumer_group.command(name="skip")
@_JSON
@_GROUP
@_TOPIC
@click.option("-q", "--queue", "queue_id", type=QUEUE_ID, required=True, help="Queue id.")
@click.option("--offset", type=QUEUE_OFFSET, required=True, help="Queue offset of the message to skip.")
@_BROKER
@click.option("--client", "client_id", help="The member to ask (default: the queue's holder).")
def consumer_skip(group: str, topic: str, queue_id: int, offset: int, broker: str | None,
                  client_id: str | None) -> None:
    """Dead-letter one message a member holds (typically the one an orderly queue is blocked on) and move on."""
    _check_name("group", group, "--group")
    _check_name("topic", topic, "--topic")
    _run(lambda a: a.consumer_skip(group, topic, queue_id, offset, broker, client_id), fmt.render_consumer_skip)


# --- dlq ---------------------------------------------------------------------------------------------------


@main.group(name="dlq")
def dlq_group() -> None:
    """Dead letters of a consumer group (%DLQ%group): list, resend."""


@dlq_group.command(name="list")
@_JSON
@_GROUP
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True, help="At most this many.")
@click.option("--body", "include_body", is_flag=True, help="Include the bodies (text if UTF-8, else hex).")
def dlq_list(group: str, limit: int, include_body: bool) -> None:
    """The group's dead letters, oldest first, with their origin and whether they were resent."""
    _check_name("group", group, "--group")
    _run(lambda a: a.dlq_list(group, limit, include_body), lambda d: fmt.render_dlq_list(d), "dead letters")


@dlq_group.command(name="resend")
@_JSON
@_GROUP
@click.option("--msg-id", "msg_ids", multiple=True, help="A dead letter's id, origin id or unique key (repeatable).")
@click.option("--all", "resend_all", is_flag=True, help="Every dead letter not resent yet.")
def dlq_resend(group: str, msg_ids: tuple[str, ...], resend_all: bool) -> None:
    """Send dead letters back to their original topic (with reconsume times 0)."""
    _check_name("group", group, "--group")
    if bool(msg_ids) == resend_all:
        raise click.UsageError("name the dead letters with --msg-id ID (repeatable) or pass --all, not both")
    _run(lambda a: a.dlq_resend(group, list(msg_ids) or None), fmt.render_dlq_resend)


# --- message / cluster -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shown:
    """A message shown, and the file its body was written to (``--body-file``)."""

    stored: StoredMessage
    body_file: str | None

    def to_document(self) -> dict[str, Any]:
        doc = self.stored.to_document()
        if self.body_file:
            doc["bodyFile"] = self.body_file
        return doc


@main.group(name="message")
def message_group() -> None:
    """Stored messages: show one, query by key."""


@message_group.command(name="show")
@_JSON
@click.option("--msg-id", "msg_id", help="Offset message id (the broker's msgId).")
@click.option("-t", "--topic", "topic", help="Topic (with --queue and --offset).")
@click.option("-q", "--queue", "queue_id", type=QUEUE_ID, help="Queue id.")
@click.option("--offset", type=QUEUE_OFFSET, help="Queue offset.")
@_BROKER
@click.option("--body-file", type=click.Path(dir_okay=False, writable=True), help="Also write the raw body here.")
def message_show(msg_id: str | None, topic: str | None, queue_id: int | None, offset: int | None,
                 broker: str | None, body_file: str | None) -> None:
    """One message, decoded: properties and body (text if UTF-8, else hex)."""
    by_position = (topic, queue_id, offset)
    if msg_id is not None and any(v is not None for v in by_position):
        raise click.UsageError("use --msg-id, or --topic with --queue and --offset, not both")
    if msg_id is None and any(v is None for v in by_position):
        raise click.UsageError("name the message with --msg-id ID, or --topic T --queue Q --offset O")
    if topic is not None:
        _check_name("topic", topic, "--topic")

    async def op(a: Admin) -> _Shown:
        if msg_id is not None:
            stored = await a.message_by_id(msg_id)
        else:
            assert topic is not None and queue_id is not None and offset is not None
            stored = await a.message_at(topic, queue_id, offset, broker)
        if body_file:
            try:
                with open(body_file, "wb") as fh:
                    fh.write(stored.message.body)
            except OSError as exc:
                raise AdminError(f"cannot write the body to {body_file}: {exc.strerror or exc}") from None
        return _Shown(stored, body_file)

    _run(op, lambda d: fmt.render_message(d))


@message_group.command(name="query")
@_JSON
@click.option("-k", "--key", "key", help="A key of the messages (one of their KEYS).")
@click.option("--unique-key", "unique_key", help="A producer's unique key (UNIQ_KEY, the client's message id).")
@click.option("-t", "--topic", "topic", help="Only this topic, on the brokers of its route (default: every topic "
                                             "of every broker).")
@click.option("--max", "max_num", type=click.IntRange(min=1, max=10_000), default=64, show_default=True,
              help="At most this many per broker (a broker caps it at its max_msgs_num_batch, 64).")
@click.option("--begin", "begin", metavar="WHEN", help="Stored at or after (same forms as reset-offset --timestamp).")
@click.option("--end", "end", metavar="WHEN", help="Stored at or before.")
def message_query(key: str | None, unique_key: str | None, topic: str | None, max_num: int, begin: str | None,
                  end: str | None) -> None:
    """Messages by key, from the brokers' message index (RocketMQ's queryMsgByKey / queryMsgByUniqueKey)."""
    if bool(key) == bool(unique_key):
        raise click.UsageError("name the messages with --key KEY or --unique-key UNIQ_KEY (one of them)")
    if topic is not None:
        _check_name("topic", topic, "--topic")
    now = _now_ms()
    try:
        begin_ms = fmt.parse_timestamp(begin, now_ms=now) if begin else 0
        end_ms = fmt.parse_timestamp(end, now_ms=now) if end else 2**63 - 1
    except fmt.TimestampError as exc:
        raise click.BadParameter(str(exc), param_hint="--begin/--end") from None
    wanted = key or unique_key
    assert wanted is not None
    _run(lambda a: a.message_query(wanted, topic, unique_key=bool(unique_key), max_num=max_num, begin_ms=begin_ms,
                                   end_ms=end_ms), lambda d: fmt.render_message_query(d), "message query")


@main.group(name="broker")
def broker_group() -> None:
    """Broker roles (high availability)."""


@broker_group.command(name="promote")
@click.option("--broker-name", required=True, help="Broker name whose slave becomes its master.")
@click.option("--broker-id", type=click.IntRange(min=1, max=1024), default=1, show_default=True,
              help="brokerId of the slave to promote.")
@click.option("--role", type=click.Choice(["ASYNC_MASTER", "SYNC_MASTER"]), default="ASYNC_MASTER",
              show_default=True, help="Role of the new master.")
@click.option("--force", is_flag=True,
              help="Promote even though a master of a newer epoch than this slave's log exists (what that master "
                   "stored is lost).")
@_JSON
def broker_promote(broker_name: str, broker_id: int, role: str, force: bool) -> None:
    """Make a slave the master of its broker name, with a newer master epoch (docs/OPERATIONS.md)."""
    _run(lambda a: a.broker_promote(broker_name, broker_id, role, force),
         lambda d: (f"{d['brokerName']} brokerId {broker_id} at {d['brokerAddr']} is now {d['brokerRole']}: "
                    f"master epoch {d['masterEpoch']}, broker epoch {d['brokerEpoch']}, "
                    f"writes from offset {d['maxOffset']}"))


@main.group(name="cluster")
def cluster_group() -> None:
    """Brokers known to the name server."""


@cluster_group.command(name="list")
@_JSON
def cluster_list() -> None:
    """Brokers by cluster: address, topics, when each last registered with the name server."""
    _run(lambda a: a.cluster_list(), lambda d: fmt.render_cluster_list(d, now_ms=_now_ms()))


# --- web console -------------------------------------------------------------------------------------------


@main.command(name="serve")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT",
              help="Address of the web console (port 0: any free port; the URL is printed).")
@click.option("--auth-token", envvar="TRIMQ_CONSOLE_TOKEN",
              help="Ask for HTTP basic auth with this password (any user name); env TRIMQ_CONSOLE_TOKEN. Without "
                   "it, --access-key/--secret-key are the login when set.")
@click.option("--read-only", is_flag=True, help="No actions (resend, reset, skip): pages only.")
def serve(listen: str, auth_token: str | None, read_only: bool) -> None:
    """Serve the web console: cluster, topics, groups, queues, locks, blocked queues, dead letters, messages
    (docs/ADMIN.md, "Web console"). Runs until SIGINT/SIGTERM."""
    from trimq.tools.console.cli import serve as serve_console

    opts: CliOptions = click.get_current_context().find_object(CliOptions)  # type: ignore[assignment]
    serve_console(namesrv=opts.namesrv, access_key=opts.access_key, secret_key=opts.secret_key, tls=opts.tls,
                  tls_ca_file=opts.tls_ca_file, timeout_ms=opts.timeout_ms, listen=listen, auth_token=auth_token,
                  read_only=read_only)
