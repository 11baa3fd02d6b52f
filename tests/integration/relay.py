"""A loopback TCP relay on trio for tests: a link between a client and a broker (or a slave and its master's HA
port) that can stop forwarding, both ways, without closing anything."""

from __future__ import annotations

import trio


class Relay:
    """A loopback TCP relay on trio that can stop forwarding (both ways) without closing anything."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.open = trio.Event()
        self.open.set()
        self.address = ""

    def blackhole(self) -> None:
        self.open = trio.Event()

    def heal(self) -> None:
        self.open.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        host, port = self.target.rsplit(":", 1)
        async with client, await trio.open_tcp_stream(host, int(port)) as server, trio.open_nursery() as n:
            n.start_soon(self._pump, client, server)
            n.start_soon(self._pump, server, client)

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream) -> None:
        try:
            while True:
                await self.open.wait()
                data = await src.receive_some(65536)
                if not data:
                    break
                await self.open.wait()
                await dst.send_all(data)
        except trio.BrokenResourceError:
            pass
