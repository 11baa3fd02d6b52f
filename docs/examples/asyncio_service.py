"""A FastAPI-style asyncio service on trimq: HTTP in, ordered events out and back in, all in one asyncio loop.

The SDK is native on asyncio (trimq.client.aio, docs/EMBEDDING.md): ``async with Producer(...)`` and
``async with consumer`` inside the running loop, ``await producer.send(...)`` in a request handler, and an
``async def`` listener that is ordinary asyncio code (it may await asyncio libraries: a database driver, an HTTP
client). No thread runs the SDK or your code.

The application is a plain ASGI app (what FastAPI, Starlette and Django build) whose **lifespan** starts and stops
the clients, exactly where a FastAPI app would::

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with Producer(producer_config) as producer, consumer:    # consumer: listener registered
            app.state.producer = producer
            yield                                                       # serving; leaving = graceful stop

    app = FastAPI(lifespan=lifespan)

    @app.post("/orders/{order_id}/{step}")
    async def add_step(order_id: str, step: int):
        result = await app.state.producer.send(Message("ExampleOrders", ...), sharding_key=order_id)
        return {"queue": result.message_queue.queue_id, "offset": result.queue_offset}

Here it is served by a small HTTP/1.1 server on asyncio streams and h11 (uvicorn's job in production), and the
example then acts as its own client: it posts the steps of some orders over HTTP, waits until the orderly
consumer has applied them (each order's steps in order, retried in place when the "database" fails once) and
reads ``GET /orders``. Run it as is (it starts a broker with an embedded name server in a temporary directory, in
a background thread, through ``trimq.testing.broker_in_thread``) or point it at a running one::

    python docs/examples/asyncio_service.py
    python docs/examples/asyncio_service.py --namesrv 127.0.0.1:9876 --orders 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import ExitStack, asynccontextmanager
from typing import Any

import h11

from trimq.client import Message, MessageExt, Producer, ProducerConfig, PushConsumer, PushConsumerConfig
from trimq.client.admin import open_admin
from trimq.client.aio import run_trio, trio_context
from trimq.runtime.logs import configure_logging

TOPIC = "ExampleOrders"
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class OrdersApp:
    """The service: ``POST /orders/<id>/<step>`` publishes a step (keyed by order id), an orderly consumer applies
    the steps to an in-memory "database", ``GET /orders`` shows it."""

    def __init__(self, namesrv: str) -> None:
        self.namesrv = namesrv
        self.orders: dict[str, list[int]] = {}  # the "database": each order's applied steps
        self.applied = 0
        self.failed_once: set[bytes] = set()
        self.producer: Producer | None = None

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        consumer = PushConsumer(PushConsumerConfig(namesrv_addr=self.namesrv, consumer_group="orders_service",
                                                   consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                                   suspend_current_queue_time_millis=100))

        @consumer.listener(TOPIC, orderly=True)
        async def apply_step(msg: MessageExt) -> None:
            """asyncio code, in this loop: returns = consumed; raises = retried in place (orderly)."""
            order_id, step = msg.body.decode().split(":")
            await asyncio.sleep(0.001)  # e.g. an asyncpg / aiohttp call
            if step == "1" and msg.body not in self.failed_once:
                self.failed_once.add(msg.body)
                raise ConnectionError("database went away")  # the consumer retries this step before step 2
            self.orders.setdefault(order_id, []).append(int(step))
            self.applied += 1

        @consumer.on_assigned
        def assigned(queues: list[Any]) -> None:
            print(f"consuming {len(queues)} queues")

        config = ProducerConfig(namesrv_addr=self.namesrv, producer_group="orders_service")
        async with Producer(config) as producer, consumer:
            self.producer = producer
            yield
        self.producer = None  # left: consumer and producer stopped gracefully (offsets persisted, locks released)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        parts = scope["path"].strip("/").split("/")
        if scope["method"] == "POST" and len(parts) == 3 and parts[0] == "orders" and parts[2].isdigit():
            assert self.producer is not None
            order_id, step = parts[1], int(parts[2])
            result = await self.producer.send(Message(TOPIC, f"{order_id}:{step}".encode()), sharding_key=order_id)
            await _respond(send, 202, {"queue": result.message_queue.queue_id, "offset": result.queue_offset})
        elif scope["method"] == "GET" and parts == ["orders"]:
            await _respond(send, 200, {"applied": self.applied, "orders": self.orders})
        else:
            await _respond(send, 404, {"error": "not found"})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """The ASGI lifespan protocol around :meth:`lifespan` (what FastAPI does with ``lifespan=``)."""
        assert (await receive())["type"] == "lifespan.startup"
        async with self.lifespan():
            await send({"type": "lifespan.startup.complete"})
            assert (await receive())["type"] == "lifespan.shutdown"
        await send({"type": "lifespan.shutdown.complete"})


async def _respond(send: Send, status: int, body: Any) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


# --- a small ASGI server (uvicorn's job in production) -----------------------------------------------------

@asynccontextmanager
async def serve(app: OrdersApp, host: str = "127.0.0.1") -> AsyncIterator[int]:
    """Run the app's lifespan and serve HTTP/1.1 on ``host`` (a free port, yielded) until the block ends."""
    to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    lifespan = asyncio.create_task(app({"type": "lifespan"}, to_app.get, from_app.put))
    await to_app.put({"type": "lifespan.startup"})
    assert (await from_app.get())["type"] == "lifespan.startup.complete"
    server = await asyncio.start_server(lambda r, w: _connection(app, r, w), host, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
        await to_app.put({"type": "lifespan.shutdown"})
        await lifespan


async def _connection(app: OrdersApp, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
                continue
            if not isinstance(event, h11.Request):
                break
            while not isinstance(body_event := conn.next_event(), h11.EndOfMessage):  # (bodies are not used here)
                if body_event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
            scope = {"type": "http", "method": event.method.decode(), "path": event.target.decode().split("?")[0]}

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    writer.write(conn.send(h11.Response(status_code=message["status"], headers=message["headers"])))
                else:
                    writer.write(conn.send(h11.Data(data=message["body"])) + conn.send(h11.EndOfMessage()))

            await app(scope, receive, send)
            await writer.drain()
            if conn.our_state is h11.MUST_CLOSE:
                break
            conn.start_next_cycle()
    except (ConnectionError, h11.RemoteProtocolError):
        pass
    finally:
        writer.close()


# --- the example run: the service, and a client posting orders over HTTP ---------------------------------------

async def http(port: int, method: str, path: str) -> Any:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
    response = await reader.read()
    writer.close()
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


async def main_async(namesrv: str, orders: int, steps: int) -> int:
    async with trio_context(open_admin(namesrv)) as admin:  # any trio API of trimq, from asyncio
        await run_trio(admin.ensure_topic, TOPIC, 4)
    app = OrdersApp(namesrv)
    async with serve(app) as port:
        async def post_order(order: int) -> None:  # one order's steps in sequence; the orders concurrently
            for step in range(steps):
                await http(port, "POST", f"/orders/order-{order}/{step}")

        await asyncio.gather(*(post_order(o) for o in range(orders)))
        async with asyncio.timeout(30):
            while (await http(port, "GET", "/orders"))["applied"] < orders * steps:
                await asyncio.sleep(0.05)
        state = await http(port, "GET", "/orders")
    in_order = all(s == list(range(steps)) for s in state["orders"].values())
    print(f"applied {state['applied']} steps of {len(state['orders'])} orders over HTTP; each order's steps in "
          f"order: {in_order}; retried after a failure: {len(app.failed_once)}")
    return 0 if in_order and len(state["orders"]) == orders else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--namesrv", help="name server HOST:PORT (default: start a broker in a temp dir)")
    ap.add_argument("--orders", type=int, default=20, help="orders to post")
    ap.add_argument("--steps", type=int, default=3, help="steps per order")
    args = ap.parse_args()
    configure_logging("console", "error")  # (the listener's planned failures are logged as warnings)
    with ExitStack() as stack:
        namesrv = args.namesrv
        if namesrv is None:
            from trimq.testing import broker_in_thread

            namesrv = stack.enter_context(broker_in_thread()).namesrv_addr
        return asyncio.run(main_async(namesrv, args.orders, args.steps))


if __name__ == "__main__":
    raise SystemExit(main())
