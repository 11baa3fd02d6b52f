"""The console over plain HTTP (no browser): its login, the CSRF gate of every action, escaping of what the
cluster holds, read-only mode, a cluster that does not answer, the HTTP server's limits, and
``trimq-admin serve`` refusing a port in use.

The login and CSRF case runs against a real broker with an ACL (the console signs its requests as the
operator's admin account), the console served on a port of its own and asked over TCP."""

from __future__ import annotations

import base64
import re
import socket
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h11
import trio
from click.testing import CliRunner

from tests.integration.conftest import SMALL_STORE
from trimq.client import Message, Producer
from trimq.client.admin import Admin, open_admin
from trimq.client.config import ClientConfig
from trimq.testing import open_broker
from trimq.tools.console import ConsoleAuth, ConsoleOptions, serve_console
from trimq.tools.console.app import Console
from trimq.tools.console.http import MAX_BODY_BYTES, Request, Response, serve_http
from trimq.tools.console.security import CSRF_COOKIE, CSRF_FIELD

ACL = """
[[accounts]]
access_key = "ops-admin"
secret_key = "ops-secret"
admin = true
"""
OPS = ("ops-admin", "ops-secret")
TOPIC = "Escapes"
GROUP = "console_group"


async def http(addr: tuple[str, int], method: str, path: str, headers: dict[str, str] | None = None,
               form: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """One request on a connection of its own: (status, headers with lower-case names, body text)."""
    body = urllib.parse.urlencode(form).encode() if form is not None else b""
    hdrs = [("Host", f"{addr[0]}:{addr[1]}"), ("Connection", "close"), *(headers or {}).items()]
    if form is not None:
        hdrs += [("Content-Type", "application/x-www-form-urlencoded"), ("Content-Length", str(len(body)))]
    conn = h11.Connection(h11.CLIENT)
    stream = await trio.open_tcp_stream(*addr)
    async with stream:
        await stream.send_all(conn.send(h11.Request(method=method, target=path, headers=hdrs)))
        if body:
            await stream.send_all(conn.send(h11.Data(data=body)))
        await stream.send_all(conn.send(h11.EndOfMessage()))
        status, out_headers, chunks = 0, {}, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(65536)))
            elif isinstance(event, h11.Response):
                status = event.status_code
                out_headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return status, out_headers, b"".join(chunks).decode()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@asynccontextmanager
async def console_on(admin: Admin, options: ConsoleOptions) -> AsyncIterator[tuple[str, int]]:
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(serve_console, admin, "127.0.0.1", 0, options)
        yield addr
        nursery.cancel_scope.cancel()


async def test_login_csrf_and_escaping_against_an_acl_broker(tmp_path: Path) -> None:
    acl = tmp_path / "acl.toml"
    acl.write_text(ACL)
    async with open_broker(acl_file=str(acl), **SMALL_STORE) as cluster, \
            open_admin(cluster.client_config(access_key=OPS[0], secret_key=OPS[1])) as admin:
        await admin.ensure_topic(TOPIC, 1)
        async with Producer(cluster.producer_config(access_key=OPS[0], secret_key=OPS[1])) as producer:
            await producer.send(Message(TOPIC, b"<script>alert(1)</script>", keys="<b>k</b>"))
        options = ConsoleOptions(auth=ConsoleAuth(*OPS), namesrv=cluster.namesrv_addr)
        async with console_on(admin, options) as addr:
            login = basic(*OPS)
            assert (await http(addr, "GET", "/healthz"))[0] == 200  # for probes: no login
            status, headers, _ = await http(addr, "GET", "/")
            assert status == 401 and headers["www-authenticate"].startswith("Basic ")
            assert (await http(addr, "GET", "/topics", basic(OPS[0], "wrong")))[0] == 401
            assert (await http(addr, "GET", "/topics", basic("someone", OPS[1])))[0] == 401

            status, headers, page = await http(addr, "GET", "/topics", login)
            assert status == 200, page
            assert TOPIC in page and 'class="errors"' not in page  # the console's requests passed the ACL
            assert "script-src" not in headers["content-security-policy"]  # default-src 'none': no script runs
            cookie = headers["set-cookie"].split(";")[0]
            session = cookie.split("=", 1)[1]

            # what the cluster holds is shown escaped
            _s, _h, found = await http(addr, "GET", "/message?" + urllib.parse.urlencode(
                {"by": "key", "key": "<b>k</b>", "topic": TOPIC}), login)
            assert "&lt;b&gt;k&lt;/b&gt;" in found and "<b>k</b>" not in found
            msg_id = re.search(r"by=id&amp;key=([0-9A-F]+)", found)
            assert msg_id, found
            _s, _h, shown = await http(addr, "GET", f"/message?by=id&key={msg_id.group(1)}", login)
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown and "<script>" not in shown

            # the form token of this session, as the DLQ page renders it
            _s, _h, dlq = await http(addr, "GET", f"/dlq?group={GROUP}", {**login, "Cookie": cookie})
            assert 'id="no-dead-letters"' in dlq
            _s, _h, groups = await http(addr, "GET", "/group?group=" + GROUP, {**login, "Cookie": cookie})
            token = re.search(rf'name="{CSRF_FIELD}" value="([0-9a-f]+)"', groups)
            assert token, groups
            form = {CSRF_FIELD: token.group(1), "group": GROUP, "all": "1"}
            same = {"Origin": f"http://{addr[0]}:{addr[1]}"}

            async def post(headers: dict[str, str], data: dict[str, str]) -> tuple[int, dict[str, str], str]:
                return await http(addr, "POST", "/dlq/resend", headers, data)

            assert (await post({"Cookie": cookie, **same}, form))[0] == 401  # the login is needed for actions too
            assert (await post({**login, **same}, form))[0] == 403  # no session cookie
            assert (await post({**login, "Cookie": cookie, **same}, {**form, CSRF_FIELD: "0" * 64}))[0] == 403
            other = f"{CSRF_COOKIE}={'1' * 32}"  # another session's cookie with this session's token
            assert (await post({**login, "Cookie": other, **same}, form))[0] == 403
            refused = await post({**login, "Cookie": cookie, "Origin": "http://evil.example"}, form)
            assert refused[0] == 403 and "not sent from the console" in refused[2]
            assert (await post({**login, "Cookie": cookie, "Sec-Fetch-Site": "cross-site"}, form))[0] == 403

            status, headers, _ = await post({**login, "Cookie": cookie, **same, "Sec-Fetch-Site": "same-origin"}, form)
            assert status == 303, headers
            location = headers["location"]
            assert location.startswith(f"/dlq?group={GROUP}&notice=")
            _s, _h, after = await http(addr, "GET", location, {**login, "Cookie": cookie})
            assert f"resent 0 dead letters of {GROUP}" in after
            _s, _h, again = await http(addr, "GET", location, {**login, "Cookie": cookie})
            assert 'id="notice"' not in again  # shown once
            assert session in cookie


def request(method: str, path: str, **kw: Any) -> Request:
    return Request(method, path, **kw)


async def test_read_only_token_login_and_a_cluster_that_does_not_answer() -> None:
    # nothing listens on port 1: every page says so instead of failing
    async with open_admin(ClientConfig(namesrv_addr="127.0.0.1:1"), timeout_ms=2000) as admin:
        console = Console(admin, ConsoleOptions(auth=ConsoleAuth(token="t0ken"), read_only=True))
        assert (await console.handle(request("GET", "/"))).status == 401
        assert (await console.handle(request("GET", "/", headers=basic("anyone", "wrong")))).status == 401
        for login in (basic("anyone", "t0ken"), {"authorization": "Bearer t0ken"}):
            page = await console.handle(request("GET", "/groups", headers={k.lower(): v for k, v in login.items()}))
            assert page.status == 200
            assert b'class="errors"' in page.body and b"no name server answered" in page.body
        auth = {"authorization": "Bearer t0ken"}
        page = await console.handle(request("GET", "/dlq", query={"group": "g"}, headers=auth))
        assert b"<form" not in page.body  # read-only: no action is offered
        refused = await console.handle(request("POST", "/dlq/resend", headers=auth, form={"group": "g", "all": "1"}))
        assert refused.status == 403 and b"read-only" in refused.body
        bad = await console.handle(request("GET", "/group", query={"group": "bad group!"}, headers=auth))
        assert bad.status == 400
        # past what a broker's field holds: a clear 400, not an error inside the request's encoding (found by hand)
        for queue, offset, said in (("0", "99999999999999999999", b"offset 99999999999999999999 is past the largest"),
                                    ("2147483648", "0", b"queue 2147483648 is past the largest")):
            bad = await console.handle(request("GET", "/message", query={"topic": "T", "queue": queue,
                                                                         "offset": offset}, headers=auth))
            assert bad.status == 400 and said in bad.body, bad.body[:300]
        assert (await console.handle(request("GET", "/nowhere", headers=auth))).status == 404
        assert (await console.handle(request("DELETE", "/groups", headers=auth))).status == 405
        css = await console.handle(request("GET", "/static/console.css"))
        assert css.status == 200 and css.content_type.startswith("text/css")
        assert (await console.handle(request("GET", "/static/../app.py"))).status == 404


async def test_http_server_limits() -> None:
    async def handler(req: Request) -> Response:
        return Response(200, f"{req.method} {req.path} {sorted(req.query.items())} {sorted(req.form.items())}".encode())

    async with trio.open_nursery() as nursery:
        addr = await nursery.start(serve_http, handler, "127.0.0.1", 0)
        status, _h, body = await http(addr, "GET", "/a%20b?x=1&x=2&y=")
        assert (status, body) == (200, "GET /a b [('x', '1'), ('y', '')] []")
        status, _h, body = await http(addr, "POST", "/f", form={"k": "v" * 10})
        assert (status, body) == (200, f"POST /f [] [('k', '{'v' * 10}')]")
        status, _h, _b = await http(addr, "POST", "/f", form={"k": "v" * MAX_BODY_BYTES})
        assert status == 413
        # garbage instead of HTTP: 400, and the server goes on
        stream = await trio.open_tcp_stream(*addr)
        async with stream:
            await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
            reply = await stream.receive_some(1024)
        assert reply.startswith(b"HTTP/1.1 400")
        assert (await http(addr, "GET", "/"))[0] == 200
        # two requests on one kept-alive connection
        stream = await trio.open_tcp_stream(*addr)
        async with stream:
            host = f"Host: {addr[0]}\r\n".encode()
            await stream.send_all(b"GET /1 HTTP/1.1\r\n" + host + b"\r\nGET /2 HTTP/1.1\r\n" + host +
                                  b"Connection: close\r\n\r\n")
            data = b""
            while chunk := await stream.receive_some(4096):
                data += chunk
        assert data.count(b"HTTP/1.1 200") == 2 and b"GET /1" in data and b"GET /2" in data
        nursery.cancel_scope.cancel()


def test_serve_refuses_a_port_in_use() -> None:
    from trimq.tools.admin import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["--namesrv", "127.0.0.1:1", "serve", "--listen", f"127.0.0.1:{port}"])
    assert result.exit_code == 1, result.output
    assert f"cannot serve the console on 127.0.0.1:{port}" in result.output
    names = ("TRIMQ_NAMESRV_ADDR", "NAMESRV_ADDR", "TRIMQ_CLIENT_NAMESRV_ADDR")
    unset: dict[str, str | None] = {n: None for n in names}
    result = CliRunner().invoke(main, ["serve"], env=unset)
    assert result.exit_code == 2 and "no name server" in result.output
