"""The trio server and client transport against each other over real loopback sockets."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import trio

from trimq.protocol import RemotingCommand, RequestCode, ResponseCode
from trimq.protocol.errors import RequestError
from trimq.protocol.frame import FrameDecoder, encode_frame
from trimq.runtime.client import RemotingClient, RemotingConnectError, RemotingTimeoutError
from trimq.runtime.server import Connection, RemotingServer
from trimq.testing.processes import ADDRESS_FILE_NAME, listened_address

ECHO = 1000
SLOW = 1001
FAIL = 1002
REFUSE = 1003


async def echo(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    return RemotingCommand.response_to(cmd, body=cmd.body)


async def slow(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    await trio.sleep(cmd.ext.get("delay", 0.0))
    return RemotingCommand.response_to(cmd, body=cmd.body)


async def fail(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    raise KeyError("boom")


async def refuse(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    raise RequestError(ResponseCode.NO_PERMISSION, "not for you")


async def start_server(nursery: trio.Nursery, **kw: object) -> RemotingServer:
    server = RemotingServer(name="test", **kw)  # type: ignore[arg-type]
    for code, h in ((ECHO, echo), (SLOW, slow), (FAIL, fail), (REFUSE, refuse)):
        server.register(code, h)
    await nursery.start(server.serve, "127.0.0.1", 0)
    return server


async def raw_request(addr: tuple[str, int], cmd: RemotingCommand) -> RemotingCommand:
    stream = await trio.open_tcp_stream(*addr)
    async with stream:
        await stream.send_all(encode_frame(cmd))
        dec = FrameDecoder()
        while True:
            data = await stream.receive_some(65536)
            assert data, "server closed the connection"
            got = dec.feed(data)
            if got:
                return got[0]


async def test_malformed_frames_close_only_their_connection() -> None:
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        addr = server.addresses[0]
        async with RemotingClient() as rc:
            good = server.address
            assert (await rc.invoke(good, RemotingCommand.request(ECHO, body=b"a"))).body == b"a"
            bad_payloads = [
                b"\x00\x00\x00\x05garbage-not-msgpack",
                struct.pack(">I", 64 * 1024 * 1024),  # oversized length
                struct.pack(">I", 3) + msgpack.packb([1, 2]),  # not a map
                struct.pack(">I", 1) + msgpack.packb({}),  # no code
            ]
            for payload in bad_payloads:
                s = await trio.open_tcp_stream(*addr)
                await s.send_all(payload)
                with trio.fail_after(5):
                    while await s.receive_some(1024):
                        pass  # the server closes it: EOF
                await s.aclose()
                resp = await rc.invoke(good, RemotingCommand.request(ECHO, body=b"still"))
                assert resp.ok and resp.body == b"still"
            assert server.protocol_errors == len(bad_payloads)
        server.shutdown()


async def test_200_concurrent_requests_on_one_connection_get_their_own_answers() -> None:
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        results: dict[int, object] = {}
        async with RemotingClient() as rc:

            async def one(i: int) -> None:
                # Later requests finish first, so responses come back out of order.
                cmd = RemotingCommand.request(SLOW, {"delay": (200 - i) / 20000}, body=i)
                results[i] = (await rc.invoke(server.address, cmd)).body

            async with trio.open_nursery() as n:
                for i in range(200):
                    n.start_soon(one, i)
            assert len(rc.connected_addresses) == 1
        assert results == {i: i for i in range(200)}
        server.shutdown()


async def test_unknown_code_failing_handler_and_request_error_keep_the_connection() -> None:
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        async with RemotingClient() as rc:
            r = await rc.invoke(server.address, RemotingCommand.request(4242))
            assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "4242" in (r.remark or "")
            r = await rc.invoke(server.address, RemotingCommand.request(FAIL))
            assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "KeyError: 'boom'"
            r = await rc.invoke(server.address, RemotingCommand.request(REFUSE))
            assert r.code == ResponseCode.NO_PERMISSION and r.remark == "not for you"
            assert (await rc.invoke(server.address, RemotingCommand.request(ECHO, body=1))).body == 1
        server.shutdown()


async def test_oneway_requests_get_no_answer_and_timeouts_are_specific() -> None:
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        async with RemotingClient() as rc:
            await rc.invoke_oneway(server.address, RemotingCommand.request(ECHO, body=b"x"))
            with pytest.raises(RemotingTimeoutError, match="no response within"):
                await rc.invoke(server.address, RemotingCommand.request(SLOW, {"delay": 5.0}), timeout_s=0.05)
            assert (await rc.invoke(server.address, RemotingCommand.request(ECHO, body=2))).body == 2
        server.shutdown()


async def test_connection_limit_refuses_extra_connections() -> None:
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, max_connections=2)
        addr = server.addresses[0]
        streams = [await trio.open_tcp_stream(*addr) for _ in range(2)]
        await trio.sleep(0.05)
        extra = await trio.open_tcp_stream(*addr)
        with trio.fail_after(5):
            assert await extra.receive_some(10) == b""  # closed at once
        assert server.refused_connections == 1
        for s in [*streams, extra]:
            await s.aclose()
        server.shutdown()


async def test_client_reconnects_after_the_server_drops_it() -> None:
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        async with RemotingClient() as rc:
            assert (await rc.invoke(server.address, RemotingCommand.request(ECHO, body=1))).ok
            for conn in list(server.connections.values()):
                await conn.stream.aclose()
            await trio.sleep(0.05)
            assert (await rc.invoke(server.address, RemotingCommand.request(ECHO, body=2))).body == 2
        server.shutdown()


async def test_connect_error_is_specific() -> None:
    """The system's reason, not trio's "all attempts to connect to H:P failed" (which hides it in its cause)."""
    async with RemotingClient(connect_timeout_s=1) as rc:
        listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        port = listener.socket.getsockname()[1]
        await listener.aclose()
        with pytest.raises(RemotingConnectError) as raised:
            await rc.invoke(f"127.0.0.1:{port}", RemotingCommand.request(ECHO))
        assert str(raised.value) == f"cannot connect to 127.0.0.1:{port}: Connection refused"


@pytest.mark.parametrize(("answer", "reason"), [
    (b"", "the peer closed it"),
    (b"\x00\x00\x00\x08garbage!", "the peer sent what is not a trimq frame (frame payload is not one msgpack value"),
    (None, "it broke (socket connection broken: [Errno 104] Connection reset by peer)"),
])
async def test_a_connection_lost_while_waiting_says_why(answer: bytes | None, reason: str) -> None:
    """A peer that closes the connection, answers with what is not a frame or resets it was "closed while waiting"
    for all three: the waiting request now says which (found by hand, a name server address that was something
    else). ``None``: the peer resets (SO_LINGER 0)."""
    async def peer(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        if answer is None:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif answer:
            await stream.send_all(answer)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, peer, 0)
        addr = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        async with RemotingClient() as rc:
            with pytest.raises(RemotingConnectError) as raised:
                await rc.invoke(addr, RemotingCommand.request(ECHO), timeout_s=5)
            assert str(raised.value).startswith(f"connection to {addr} lost while waiting for {ECHO}: "
                                                f"{reason}"), str(raised.value)
            [error] = await rc.invoke_many(addr, [RemotingCommand.request(ECHO)], timeout_s=5)
            assert isinstance(error, RemotingConnectError) and reason in str(error), str(error)
        nursery.cancel_scope.cancel()


async def test_server_initiated_request_reaches_client_handler() -> None:
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        async with RemotingClient() as rc:

            async def running_info(cmd: RemotingCommand, addr: str) -> RemotingCommand:
                return RemotingCommand.response_to(cmd, body={"asked": cmd.ext["consumerGroup"]})

            rc.register_handler(RequestCode.GET_CONSUMER_RUNNING_INFO, running_info)
            await rc.invoke(server.address, RemotingCommand.request(ECHO))
            (conn,) = server.connections.values()
            resp = await conn.request(
                RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "g"}), 5
            )
            assert resp.body == {"asked": "g"}
        server.shutdown()


async def test_graceful_shutdown_lets_in_flight_requests_finish() -> None:
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        async with RemotingClient() as rc:
            got = []

            async def call() -> None:
                got.append(await rc.invoke(server.address, RemotingCommand.request(SLOW, {"delay": 0.2}, 7)))

            async with trio.open_nursery() as n:
                n.start_soon(call)
                await trio.sleep(0.05)
                server.shutdown()
            assert got[0].body == 7


def _venv_bin(name: str) -> str:
    return os.path.join(os.path.dirname(sys.executable), name)


def _start_cli_broker(tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    store, log = tmp_path / "store", tmp_path / "broker.log"
    # The log to a file, not a pipe nobody reads: a broker writing warnings for a burst of bad frames would block
    # on a full pipe.
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [_venv_bin("trimq-broker"), "--listen", "127.0.0.1:0", "--store", str(store), "--log-format", "json"],
            stdout=out, stderr=out,
        )
    try:
        return proc, listened_address(store / ADDRESS_FILE_NAME, proc, 30, log=log)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def test_sigterm_stops_a_cli_broker_with_status_0(tmp_path: Path) -> None:
    proc, _ = _start_cli_broker(tmp_path)
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=10)
    finally:
        proc.kill()
    assert rc == 0


def test_cli_broker_survives_a_burst_of_malformed_frames_from_many_connections(tmp_path: Path) -> None:
    proc, addr = _start_cli_broker(tmp_path)
    host, port = addr.rsplit(":", 1)
    try:
        async def burst() -> None:
            garbage = [b"\xff\xff\xff\xff", b"\x00\x00\x00\x03abc", struct.pack(">I", 1) + b"\x01",
                       os.urandom(64), struct.pack(">I", 9) + msgpack.packb({"code": "x", "opaque": 1})]

            async def hammer(i: int) -> None:
                s = await trio.open_tcp_stream(host, int(port))
                try:
                    await s.send_all(garbage[i % len(garbage)])
                    with trio.move_on_after(5):
                        while await s.receive_some(1024):
                            pass
                except trio.BrokenResourceError:
                    pass
                finally:
                    await s.aclose()

            async with trio.open_nursery() as n:
                for i in range(100):
                    n.start_soon(hammer, i)
            async with RemotingClient() as rc:
                r = await rc.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))
                assert r.ok and r.body["brokerName"] == "broker-a"

        trio.run(burst)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


# ------------------------------------------------------------------------------------------- hostile peers (issue 20)

HUGE = 1010
UNENCODABLE = 1011
ASK_BACK = 1012


async def huge_error(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    raise RuntimeError("x" * (8 * 1024 * 1024))  # an exception message echoing a multi-MB field


async def unencodable(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    if cmd.ext.get("what") == "int":
        return RemotingCommand.response_to(cmd, ext={"offset": 2**70})  # msgpack carries at most 64 bits
    return RemotingCommand.response_to(cmd, body=b"x" * (conn.server.max_frame_bytes + 1))


async def ask_back(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    resp = await conn.request(RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO), 5)
    return RemotingCommand.response_to(cmd, body=resp.body)


async def start_hostile_server(nursery: trio.Nursery, **kw: object) -> RemotingServer:
    server = await start_server(nursery, **kw)
    for code, h in ((HUGE, huge_error), (UNENCODABLE, unencodable), (ASK_BACK, ask_back)):
        server.register(code, h)
    return server


async def test_answers_are_bounded_and_an_unencodable_answer_becomes_system_error() -> None:
    """A handler failing with a multi-MB message, an answer over max_frame_bytes and one holding a 2^70 int:
    each gets a small SYSTEM_ERROR and the server keeps serving (before: FrameTooLargeError escaped the
    answer path and stopped the server)."""
    async with trio.open_nursery() as nursery:
        server = await start_hostile_server(nursery)
        async with RemotingClient() as rc:
            r = await rc.invoke(server.address, RemotingCommand.request(HUGE))
            assert r.code == ResponseCode.SYSTEM_ERROR
            assert r.remark is not None and r.remark.startswith("RuntimeError: xxx") and len(r.remark) < 600
            assert "more characters" in r.remark
            for what in ("body", "int"):
                r = await rc.invoke(server.address, RemotingCommand.request(UNENCODABLE, {"what": what}))
                assert r.code == ResponseCode.SYSTEM_ERROR, r
                assert r.remark is not None and r.remark.startswith("the answer could not be encoded: ")
                assert len(r.remark) < 600
            assert server.encode_errors == 2 and server.handler_errors == 1
            assert (await rc.invoke(server.address, RemotingCommand.request(ECHO, body=b"ok"))).body == b"ok"
        server.shutdown()


async def test_an_answer_that_cannot_be_encoded_at_all_closes_only_its_connection() -> None:
    """With a frame limit too small even for the SYSTEM_ERROR that replaces the answer, that one connection is
    closed; the server and its other connections go on."""
    async with trio.open_nursery() as nursery:
        server = await start_hostile_server(nursery, max_frame_bytes=100)
        addr = server.addresses[0]
        async with RemotingClient() as rc:
            assert (await rc.invoke(server.address, RemotingCommand.request(ECHO, body=b"a"))).body == b"a"
            s = await trio.open_tcp_stream(*addr)
            await s.send_all(encode_frame(RemotingCommand(code=HUGE, opaque=1)))
            with trio.fail_after(5):
                assert await s.receive_some(1024) == b""  # closed, nothing sent
            await s.aclose()
            assert (await rc.invoke(server.address, RemotingCommand.request(ECHO, body=b"b"))).body == b"b"
        server.shutdown()


async def test_two_answers_to_one_server_request_do_not_stop_the_server() -> None:
    """A peer answering a server-initiated request twice in one packet (the second used to raise WouldBlock
    out of the reading task, stopping the server)."""
    async with trio.open_nursery() as nursery:
        server = await start_hostile_server(nursery)
        stream = await trio.open_tcp_stream(*server.addresses[0])
        await stream.send_all(encode_frame(RemotingCommand(code=ASK_BACK, opaque=7)))
        dec = FrameDecoder()
        with trio.fail_after(5):
            got: list[RemotingCommand] = []
            while not got:
                got = dec.feed(await stream.receive_some(65536))
            asked = got[0]
            assert asked.code == RequestCode.GET_CONSUMER_RUNNING_INFO
            answer = encode_frame(RemotingCommand.response_to(asked, body="first"))
            await stream.send_all(answer + encode_frame(RemotingCommand.response_to(asked, body="second")))
            got = []
            while not got:
                got = dec.feed(await stream.receive_some(65536))
        assert got[0].opaque == 7 and got[0].body == "first"
        await stream.aclose()
        async with RemotingClient() as rc:
            assert (await rc.invoke(server.address, RemotingCommand.request(ECHO, body=1))).body == 1
        server.shutdown()


async def test_out_of_range_fields_are_refused_before_the_handler_and_oneway_ones_dropped() -> None:
    """protocol/fields.py's check runs once per request in the server: the handler never sees the request."""
    seen: list[RemotingCommand] = []

    async def record(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        seen.append(cmd)
        return RemotingCommand.response_to(cmd)

    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        server.register(RequestCode.UPDATE_CONSUMER_OFFSET, record)
        ext = {"consumerGroup": "g", "topic": "t", "queueId": 0}
        async with RemotingClient() as rc:
            for bad in (2**63, 2**64 - 1, "9223372036854775808", "-9223372036854775809"):
                r = await rc.invoke(server.address, RemotingCommand.request(
                    RequestCode.UPDATE_CONSUMER_OFFSET, {**ext, "commitOffset": bad}))
                assert r.code == ResponseCode.SYSTEM_ERROR
                assert r.remark == (f"header field 'commitOffset' = {int(bad)} is outside the range of a Java long "
                                    f"(int64): [-9223372036854775808, 9223372036854775807]")
            r = await rc.invoke(server.address, RemotingCommand.request(
                RequestCode.UPDATE_CONSUMER_OFFSET, {**ext, "queueId": 2**31, "commitOffset": 1}))
            assert r.code == ResponseCode.SYSTEM_ERROR and "'queueId' = 2147483648" in (r.remark or "")
            await rc.invoke_oneway(server.address, RemotingCommand.request(
                RequestCode.UPDATE_CONSUMER_OFFSET, {**ext, "commitOffset": 2**63}, oneway=True))
            r = await rc.invoke(server.address, RemotingCommand.request(
                RequestCode.UPDATE_CONSUMER_OFFSET, {**ext, "commitOffset": 2**63 - 1}))
            assert r.ok  # the largest long passes; the connection is still served after the dropped oneway
        assert [c.ext["commitOffset"] for c in seen] == [2**63 - 1]
        assert server.field_range_errors == {False: 5, True: 1}
        server.shutdown()


class PairListener(trio.abc.Listener[trio.abc.Stream]):
    """Connections as lockstep stream pairs: no socket buffers, so every unsent byte is the server's (exact
    flow-control accounting), and nothing real-time happens (MockClock drives everything)."""

    def __init__(self) -> None:
        self._send, self._recv = trio.open_memory_channel[trio.abc.Stream](100)

    async def accept(self) -> trio.abc.Stream:
        return await self._recv.receive()

    async def aclose(self) -> None:
        await self._send.aclose()

    async def connect(self) -> trio.abc.Stream:
        client, server = trio.testing.lockstep_stream_pair()
        await self._send.send(server)
        return client


async def test_one_budget_for_all_answers_pauses_peers_that_never_read_then_closes_them(
        autojump_clock: trio.testing.MockClock) -> None:
    """16 peers pipeline small answers (8 KiB, under busy_body_bytes) and never read. Before, small answers
    skipped the server-wide budget: each peer could hold its own 64 KiB budget (1 MiB in all here). Now every
    frame counts: the unsent bytes stay within max_total_pending_write_bytes plus about a frame and
    busy_body_bytes per connection, a peer that reads is served meanwhile, and the stalled peers are closed
    after write_stall_timeout_s."""
    n_peers, body = 16, b"b" * 8 * 1024
    total, per_conn, busy = 256 * 1024, 64 * 1024, 16 * 1024
    server = RemotingServer(name="budget", max_pending_write_bytes=per_conn, max_total_pending_write_bytes=total,
                            busy_body_bytes=busy, write_stall_timeout_s=30)
    server.register(ECHO, echo)
    listener = PairListener()
    frame = len(encode_frame(RemotingCommand(code=ECHO, opaque=1, flag=1, body=body)))
    broken = 0

    async def flood() -> None:
        nonlocal broken
        stream = await listener.connect()
        requests = b"".join(encode_frame(RemotingCommand(code=ECHO, opaque=i, body=body)) for i in range(200))
        try:
            await stream.send_all(requests)  # blocks once the server stops reading this peer
            await trio.sleep_forever()
        except trio.BrokenResourceError:
            broken += 1  # closed by the server

    async def healthy() -> int:
        stream = await listener.connect()
        dec = FrameDecoder()
        for i in range(50):
            await stream.send_all(encode_frame(RemotingCommand(code=ECHO, opaque=i, body=body)))
            got: list[RemotingCommand] = []
            while not got:
                got = dec.feed(await stream.receive_some(65536))
            assert got[0].ok and got[0].opaque == i
        await stream.aclose()
        return 50

    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve_listeners, [listener])
        async with trio.open_nursery() as peers:
            for _ in range(n_peers):
                peers.start_soon(flood)
            await trio.sleep(1)
            assert len(server._paused) == n_peers  # all paused, none closed yet
            assert await healthy() == 50  # served while they are paused
            assert server.stalled_closed == 0
            await trio.sleep(30)
            assert server.stalled_closed == n_peers and broken == n_peers
        bound = total + (n_peers + 2) * (busy + frame)
        assert 0 < server.peak_pending_write_bytes <= bound, (server.peak_pending_write_bytes, bound)
        assert server.pending_write_bytes == 0 and not server._paused
        server.shutdown()


async def test_serve_on_a_taken_port_names_the_address() -> None:
    """RemotingServer.serve opens its listener as the daemons do (runtime.daemon.listen_tcp)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"^\[Errno 98\] cannot listen on 127.0.0.1:{port}: Address already in use$"):
            await RemotingServer().serve("127.0.0.1", port)
