"""The console's pages and actions over one :class:`~trimq.client.admin.Admin` (docs/ADMIN.md, "Web console").

Pages (GET): ``/`` cluster and brokers, ``/topics``, ``/topic?topic=T`` (queues with min/max offsets),
``/groups``, ``/group?group=G`` (members, subscriptions, per queue: offsets, lag, owner, lock, blocked),
``/blocked`` (blocked orderly queues of every online orderly group), ``/dlq?group=G`` (dead letters),
``/message`` (lookup by key, unique key, message id or queue position), ``/healthz``.

Actions (POST, each a form with the CSRF token; refused with ``read_only``): ``/dlq/resend``, ``/group/reset``
(first the plan, then the reset on confirmation), ``/group/skip``. An action answers with a redirect (303)
back to the page it came from, which shows the outcome once (a notice kept by id, never text taken from
the URL). When a login is configured (:class:`~trimq.tools.console.security.ConsoleAuth`), every page but
``/healthz`` and the stylesheet asks for it: the pages show message bodies too.

Every page asks the cluster afresh (nothing cached): what it shows is as of the time in its footer.
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import jinja2
import trio

import trimq
from trimq.client.admin import Admin, PartialFailure
from trimq.client.admin_results import body_text, perm_text
from trimq.client.errors import TrimqClientError
from trimq.protocol.fields import JAVA_INT_MAX, JAVA_LONG_MAX
from trimq.protocol.message import MessageConst
from trimq.protocol.validation import InvalidNameError, check_group, check_topic, dlq_topic
from trimq.runtime.client import RemotingError
from trimq.tools import admin_format as fmt
from trimq.tools.console import views
from trimq.tools.console.http import Request, Response
from trimq.tools.console.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    ConsoleAuth,
    csrf_token,
    csrf_valid,
    new_session,
    same_origin,
)

__all__ = ["Console", "ConsoleOptions", "Notice"]

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
NAV = [("/", "Cluster"), ("/topics", "Topics"), ("/groups", "Consumer groups"), ("/blocked", "Blocked queues"),
       ("/message", "Messages")]
SECURITY_HEADERS = [
    # Nothing but the console's own stylesheet loads: no scripts at all, no framing, forms post back here only.
    ("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
]
MAX_NOTICES = 128
DLQ_PAGE_LIMIT = 200
BODY_PREVIEW_CHARS = 120
BODY_SHOW_BYTES = 64 * 1024
SESSION_CHARS = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class ConsoleOptions:
    """How the console behaves: ``auth`` (its login), ``read_only`` (no actions: the forms are not shown and
    a POST is refused), ``namesrv`` (shown in the header)."""

    auth: ConsoleAuth = field(default_factory=ConsoleAuth)
    read_only: bool = False
    namesrv: str = ""


@dataclass(frozen=True)
class Notice:
    """The outcome of an action, shown once on the page the action returns to."""

    kind: str  # "ok" or "error"
    text: str
    details: list[str] = field(default_factory=list)


class BadInput(Exception):
    """A request parameter the console cannot use; the message says which and why (400)."""


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _when(ms: int) -> str:
    """A reset's target time (0 and earlier: the first message still stored)."""
    return fmt.format_timestamp(ms) if ms > 0 else "the beginning"


@dataclass
class _Page:
    """Per-request state the templates need: the session (CSRF) and whether a new cookie is to be set."""

    session: str
    csrf: str
    new_cookie: bool


def _group_param(value: str | None, name: str = "group") -> str:
    if not value:
        raise BadInput(f"the {name} is missing")
    try:
        return check_group(value)
    except InvalidNameError as exc:
        raise BadInput(str(exc)) from None


def _topic_param(value: str | None, name: str = "topic") -> str:
    if not value:
        raise BadInput(f"the {name} is missing")
    try:
        return check_topic(value)
    except InvalidNameError as exc:
        raise BadInput(str(exc)) from None


def _int_param(value: str | None, name: str, highest: int) -> int:
    try:
        number = int(value or "")
    except ValueError:
        raise BadInput(f"{name} must be a whole number, not {value!r}") from None
    if number < 0:
        raise BadInput(f"{name} must not be negative")
    if number > highest:  # a broker's field (Java int / long) could not hold it: the request could not be encoded
        raise BadInput(f"{name} {number} is past the largest a broker takes ({highest})")
    return number


class Console:
    """The web console: :meth:`handle` answers one request (give it to
    :func:`~trimq.tools.console.http.serve_http`). ``admin`` is used for every page and action."""

    def __init__(self, admin: Admin, options: ConsoleOptions | None = None, *,
                 clock: Callable[[], int] = _now_ms) -> None:
        self.admin = admin
        self.options = options or ConsoleOptions()
        self.clock = clock
        self._secret = secrets.token_bytes(32)
        self._notices: collections.OrderedDict[str, Notice] = collections.OrderedDict()
        self._env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                                       undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        self._env.filters.update(ts=lambda ms: fmt.format_timestamp(ms), age=fmt.format_age, perm=perm_text, when=_when,
                                 dash=lambda v: "-" if v is None or v == "" else v)
        self._routes: dict[tuple[str, str], Callable[[Request, _Page], Awaitable[Response]]] = {
            ("GET", "/"): self.page_overview,
            ("GET", "/topics"): self.page_topics,
            ("GET", "/topic"): self.page_topic,
            ("GET", "/groups"): self.page_groups,
            ("GET", "/group"): self.page_group,
            ("GET", "/blocked"): self.page_blocked,
            ("GET", "/dlq"): self.page_dlq,
            ("GET", "/message"): self.page_message,
            ("POST", "/dlq/resend"): self.action_resend,
            ("POST", "/group/reset"): self.action_reset,
            ("POST", "/group/skip"): self.action_skip,
        }

    # ------------------------------------------------------------------ dispatch

    async def handle(self, request: Request) -> Response:
        """Answer one request (never raises for a cluster that fails to answer: the page says so)."""
        method = "GET" if request.method == "HEAD" else request.method
        if request.path == "/healthz" and method == "GET":
            return Response(200, b"ok\n", "text/plain; charset=utf-8", list(SECURITY_HEADERS))
        if request.path.startswith("/static/") and method == "GET":
            return self._static(request.path[len("/static/"):])
        if not self.options.auth.allows(request.headers.get("authorization")):
            return Response(401, b"login required\n", "text/plain; charset=utf-8",
                            [("WWW-Authenticate", 'Basic realm="trimq console", charset="UTF-8"'),
                             *SECURITY_HEADERS])
        route = self._routes.get((method, request.path))
        if route is None:
            if any(path == request.path for _m, path in self._routes):
                return self._plain(405, "method not allowed")
            return self._plain(404, "no such page")
        session = request.cookie(CSRF_COOKIE) or ""
        fresh = not (len(session) == 32 and set(session) <= SESSION_CHARS)
        if fresh:
            session = new_session()
        page = _Page(session, csrf_token(self._secret, session), fresh)
        if method == "POST":
            refused = self._refuse_post(request, page)
            if refused is not None:
                return refused
        try:
            response = await route(request, page)
        except BadInput as exc:
            response = self._render("error.html", page, 400, title="Bad request", message=str(exc))
        response.headers += SECURITY_HEADERS
        if page.new_cookie:
            response.headers.append(("Set-Cookie", f"{CSRF_COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict"))
        return response

    def _refuse_post(self, request: Request, page: _Page) -> Response | None:
        if self.options.read_only:
            return self._render("error.html", page, 403, title="Read-only console",
                                message="this console is read-only (trimq-admin serve --read-only): it takes no "
                                        "actions")
        if not same_origin(request.headers):
            return self._render("error.html", page, 403, title="Refused",
                                message="this form was not sent from the console's own pages")
        if page.new_cookie or not csrf_valid(self._secret, page.session, request.form.get(CSRF_FIELD)):
            return self._render("error.html", page, 403, title="Form expired",
                                message="the form's token does not match (the console was restarted, or the page "
                                        "is old): reload the page and try again")
        return None

    def _plain(self, status: int, text: str) -> Response:
        return Response(status, text.encode() + b"\n", "text/plain; charset=utf-8", list(SECURITY_HEADERS))

    def _static(self, name: str) -> Response:
        path = HERE / "static" / name
        kind = STATIC_TYPES.get(path.suffix)
        # only plain names of the static folder: no "..", no sub-folders
        if kind is None or "/" in name or name.startswith(".") or not path.is_file():
            return self._plain(404, "no such file")
        headers = [("Cache-Control", "max-age=300"), ("X-Content-Type-Options", "nosniff")]
        return Response(200, path.read_bytes(), kind, headers)

    def _render(self, template: str, page: _Page, code: int = 200, **context: Any) -> Response:
        notice = context.pop("notice", None)
        context.setdefault("errors", [])
        html = self._env.get_template(template).render(
            nav=NAV, active=context.pop("active", ""), csrf=page.csrf, csrf_field=CSRF_FIELD,
            read_only=self.options.read_only, namesrv=self.options.namesrv, version=trimq.__version__,
            now=self.clock(), notice=notice, **context)
        return Response(code, html.encode("utf-8"))

    # ------------------------------------------------------------------ helpers

    async def _ask(self, op: Callable[[], Awaitable[T]]) -> tuple[T | None, str | None]:
        """(result, error text): a page shows what the cluster answered and says what it could not."""
        try:
            return await op(), None
        except BaseException as raised:
            error = _leaf(raised)
            if isinstance(error, PartialFailure):
                return error.result, str(error)
            if isinstance(error, TrimqClientError | RemotingError):
                return None, str(error)
            raise

    async def _ask_all(self, **ops: Callable[[], Awaitable[Any]]) -> dict[str, tuple[Any, str | None]]:
        """:meth:`_ask` of every op concurrently; name -> (result, error)."""
        out: dict[str, tuple[Any, str | None]] = {}

        async def one(name: str, op: Callable[[], Awaitable[Any]]) -> None:
            out[name] = await self._ask(op)

        async with trio.open_nursery() as nursery:
            for name, op in ops.items():
                nursery.start_soon(one, name, op)
        return out

    def _notice(self, request: Request) -> Notice | None:
        key = request.query.get("notice")
        return self._notices.pop(key, None) if key else None

    def _keep(self, notice: Notice) -> str:
        key = secrets.token_urlsafe(9)
        self._notices[key] = notice
        while len(self._notices) > MAX_NOTICES:
            self._notices.popitem(last=False)
        return key

    def _redirect(self, path: str, params: dict[str, str], notice: Notice) -> Response:
        import urllib.parse

        query = urllib.parse.urlencode({**params, "notice": self._keep(notice)})
        return Response(303, b"", "text/plain; charset=utf-8", [("Location", f"{path}?{query}")])

    # ------------------------------------------------------------------ pages

    async def page_overview(self, request: Request, page: _Page) -> Response:
        got = await self._ask_all(clusters=self.admin.cluster_list, topics=self.admin.topic_list,
                                  groups=self.admin.consumer_list)
        clusters, cluster_error = got["clusters"]
        topics, topics_error = got["topics"]
        groups, groups_error = got["groups"]
        summary = {
            "brokers": sum(len(c.brokers) for c in clusters.clusters) if clusters else None,
            "topics": len(views.visible_topics(topics.topics, show_all=False)) if topics else None,
            "groups": len(groups.groups) if groups else None,
            "online": sum(1 for g in groups.groups if g.members) if groups else None,
            "lag": sum(g.total_lag for g in groups.groups) if groups else None,
        }
        errors = [e for e in (cluster_error, topics_error, groups_error) if e]
        return self._render("overview.html", page, active="/", title="Cluster", clusters=clusters,
                            summary=summary, errors=errors, notice=self._notice(request))

    async def page_topics(self, request: Request, page: _Page) -> Response:
        show_all = request.query.get("all") == "1"
        topics, error = await self._ask(self.admin.topic_list)
        entries = views.visible_topics(topics.topics, show_all=show_all) if topics else []
        hidden = len(topics.topics) - len(entries) if topics else 0
        return self._render("topics.html", page, active="/topics", title="Topics", topics=entries,
                            show_all=show_all, hidden=hidden, kind=views.topic_kind,
                            errors=[error] if error else [], broker_errors=topics.errors if topics else [])

    async def page_topic(self, request: Request, page: _Page) -> Response:
        topic = _topic_param(request.query.get("topic"))
        status, error = await self._ask(lambda: self.admin.topic_status(topic))
        return self._render("topic.html", page, active="/topics", title=f"Topic {topic}", topic=topic,
                            status=status, kind=views.topic_kind(topic), errors=[error] if error else [])

    async def page_groups(self, request: Request, page: _Page) -> Response:
        groups, error = await self._ask(self.admin.consumer_list)
        return self._render("groups.html", page, active="/groups", title="Consumer groups",
                            groups=groups.groups if groups else [], errors=[error] if error else [],
                            notice=self._notice(request))

    async def page_group(self, request: Request, page: _Page) -> Response:
        group = _group_param(request.query.get("group"))
        got = await self._ask_all(connections=lambda: self.admin.consumer_connections(group),
                                  progress=lambda: self.admin.consumer_progress(group),
                                  locks=lambda: self.admin.consumer_locks(group),
                                  status=lambda: self.admin.consumer_status(group))
        connections, conn_error = got["connections"]
        progress, progress_error = got["progress"]
        locks, locks_error = got["locks"]
        status, status_error = got["status"]
        online = connections is not None and bool(connections.connection_set)
        topics = sorted({t for t in (connections.subscription_table if connections else {})}
                        | {q.topic for q in (progress.queues if progress else []) if q.topic})
        errors = [e for e in (progress_error, locks_error) if e]
        if status_error and online:
            errors.append(status_error)
        return self._render(
            "group.html", page, active="/groups", title=f"Group {group}", group=group, online=online,
            connections=connections, progress=progress, locks=locks,
            members=views.member_rows(connections, status), queues=views.queue_rows(progress, locks, status),
            blocked=views.blocked_rows(status), reset_topics=[t for t in topics if views.topic_kind(t) == "normal"],
            offline_reason=None if online else conn_error, errors=errors, notice=self._notice(request),
            dlq_topic=dlq_topic(group))

    async def page_blocked(self, request: Request, page: _Page) -> Response:
        groups, error = await self._ask(self.admin.consumer_list)
        orderly = [g.consumer_group for g in (groups.groups if groups else [])
                   if g.members and g.consume_mode == "orderly"]
        got = await self._ask_all(**{f"g{i}": (lambda g=g: self.admin.consumer_status(g))  # type: ignore[misc]
                                     for i, g in enumerate(orderly)})
        rows: list[views.BlockedQueueRow] = []
        errors = [error] if error else []
        for i, _group in enumerate(orderly):
            status, status_error = got[f"g{i}"]
            rows += views.blocked_rows(status)
            if status_error:
                errors.append(status_error)
        return self._render("blocked.html", page, active="/blocked", title="Blocked queues", rows=rows,
                            groups=orderly, errors=errors, notice=self._notice(request))

    async def page_dlq(self, request: Request, page: _Page) -> Response:
        group = _group_param(request.query.get("group"))
        dlq, error = await self._ask(lambda: self.admin.dlq_list(group, DLQ_PAGE_LIMIT, include_body=True))
        previews = {}
        for m in dlq.messages if dlq else []:
            if m.body is not None:
                text, encoding = body_text(m.body[:BODY_PREVIEW_CHARS * 4])
                previews[m.msg_id] = (text[:BODY_PREVIEW_CHARS] + ("…" if len(text) > BODY_PREVIEW_CHARS else ""),
                                      encoding)
        pending = sum(1 for m in dlq.messages if not m.resent) if dlq else 0
        return self._render("dlq.html", page, active="/groups", title=f"Dead letters of {group}", group=group,
                            dlq=dlq, previews=previews, pending=pending, topic=dlq_topic(group),
                            errors=[error] if error else [], notice=self._notice(request))

    async def page_message(self, request: Request, page: _Page) -> Response:
        q = request.query
        by = q.get("by", "key")
        key = q.get("key", "").strip()
        topic = q.get("topic", "").strip()
        context: dict[str, Any] = {"by": by, "key": key, "topic": topic, "found": None, "message": None,
                                   "errors": []}
        if by not in ("key", "unique", "id"):
            raise BadInput("by must be key, unique or id")
        if topic:
            topic = _topic_param(topic)
        if "queue" in q and "offset" in q and topic:
            queue_id = _int_param(q.get("queue"), "queue", JAVA_INT_MAX)
            offset = _int_param(q.get("offset"), "offset", JAVA_LONG_MAX)
            broker = q.get("broker") or None
            stored, error = await self._ask(lambda: self.admin.message_at(topic, queue_id, offset, broker))
            context.update(message=self._message_view(stored), errors=[error] if error else [])
        elif key and by == "id":
            stored, error = await self._ask(lambda: self.admin.message_by_id(key))
            context.update(message=self._message_view(stored), errors=[error] if error else [])
        elif key:
            found, error = await self._ask(lambda: self.admin.message_query(key, topic or None,
                                                                            unique_key=by == "unique"))
            context.update(found=found, errors=[error] if error else [])
            if found is not None:
                context["errors"] += [f"{e.broker_name}: {e.error}" for e in found.errors]
        return self._render("message.html", page, active="/message", title="Messages", **context)

    @staticmethod
    def _message_view(stored: Any) -> dict[str, Any] | None:
        if stored is None:
            return None
        doc = stored.to_document()
        body = bytes(stored.message.body)
        text, encoding = body_text(body[:BODY_SHOW_BYTES])
        doc.update(body=text, bodyEncoding=encoding, bodyTruncated=len(body) > BODY_SHOW_BYTES)
        doc["uniqKey"] = doc.get("uniqKey") or stored.message.properties.get(
            MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        return doc

    # ------------------------------------------------------------------ actions

    async def action_resend(self, request: Request, page: _Page) -> Response:
        form = request.form
        group = _group_param(form.get("group"))
        msg_id = form.get("msg_id") or None
        if msg_id is None and form.get("all") != "1":
            raise BadInput("name the dead letter (msg_id) or resend all (all=1)")
        result, error = await self._ask(lambda: self.admin.dlq_resend(group, [msg_id] if msg_id else None))
        if result is None:
            notice = Notice("error", f"resend failed: {error}")
        else:
            details = [f"{r.dlq_msg_id} → {r.topic} queue {r.queue_id} as {r.msg_id}" for r in result.resent]
            details += [f"failed: {f.msg_id or f.queue_offset}: {f.error}" for f in result.failed]
            where = "dead letter of {} to its topic" if result.resent_count == 1 else \
                "dead letters of {} to their topics"
            text = f"resent {result.resent_count} {where.format(group)}"
            if result.skipped:
                text += f" ({result.skipped} resent before, left alone)"
            notice = Notice("error" if error else "ok", f"{text}: {error}" if error else text, details)
        return self._redirect("/dlq", {"group": group}, notice)

    async def action_reset(self, request: Request, page: _Page) -> Response:
        form = request.form
        group = _group_param(form.get("group"))
        topic = _topic_param(form.get("topic"))
        force = form.get("force") == "1"
        try:
            timestamp = fmt.parse_timestamp(form.get("timestamp", ""), now_ms=self.clock())
        except fmt.TimestampError as exc:
            return self._redirect("/group", {"group": group}, Notice("error", f"reset offset: {exc}"))
        if form.get("execute") != "1":
            plan, error = await self._ask(lambda: self.admin.reset_offset(group, topic, timestamp, force,
                                                                          dry_run=True))
            return self._render("reset_plan.html", page, active="/groups", title=f"Reset {group} on {topic}",
                                group=group, topic=topic, timestamp=timestamp, force=force, plan=plan,
                                errors=[error] if error else [])
        result, error = await self._ask(lambda: self.admin.reset_offset(group, topic, timestamp, force))
        if result is None:
            return self._redirect("/group", {"group": group}, Notice("error", f"reset offset failed: {error}"))
        details = [f"{q.broker_name} queue {q.queue_id}: {q.previous_offset} → {q.offset}" for q in result.queues]
        details += [f"member {c.client_id}: {'applied' if c.ok else 'FAILED: ' + str(c.remark)}"
                    for c in result.clients]
        text = (f"offsets of {group} on {topic} reset to {_when(timestamp)}: "
                f"{len(result.queues)} queue(s)" + ("" if result.online else "; the group is offline"))
        notice = Notice("error", f"{text}; {error}", details) if error else Notice("ok", text, details)
        return self._redirect("/group", {"group": group}, notice)

    async def action_skip(self, request: Request, page: _Page) -> Response:
        form = request.form
        group = _group_param(form.get("group"))
        topic = _topic_param(form.get("topic"))
        queue_id = _int_param(form.get("queue"), "queue", JAVA_INT_MAX)
        offset = _int_param(form.get("offset"), "offset", JAVA_LONG_MAX)
        broker = form.get("broker") or None
        client = form.get("client") or None
        result, error = await self._ask(lambda: self.admin.consumer_skip(group, topic, queue_id, offset, broker,
                                                                         client))
        if result is None:
            notice = Notice("error", f"skip failed: {error}")
        else:
            nxt = result.next_offset
            after = f"the queue continues at offset {nxt}" if nxt is not None else "later messages were cached"
            notice = Notice("ok", f"skipped {topic} queue {queue_id} offset {offset} of {group}: dead-lettered to "
                                  f"{result.dead_letter_topic}; {after}")
        back = "/blocked" if form.get("back") == "blocked" else "/group"
        return self._redirect(back, {} if back == "/blocked" else {"group": group}, notice)
