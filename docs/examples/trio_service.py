"""A trio service on trimq: a worker that consumes an ordered stream with ``async for`` and stops cleanly.

The SDK's own loop is trio, so a trio service just uses it: ``async with`` the clients in its nursery,
``await producer.send(msg, sharding_key=...)``, and for the worker ``async for msg in consumer.messages()`` with
``async with msg.process():`` (acked when the block ends normally, retried when it raises, like aio-pika). The
service stops on SIGINT / SIGTERM by cancelling its nursery; leaving ``async with consumer`` is the graceful stop
(offsets persisted, queue locks released, the group left), also when it happens by cancellation.

Here the service also produces its own work (payments, several per account, ``sharding_key`` = the account) and
stops itself once everything is settled. Run it as is (it starts a broker with an embedded name server in a
temporary directory, in this trio loop, through ``trimq.testing.open_broker``) or point it at a running one::

    python docs/examples/trio_service.py
    python docs/examples/trio_service.py --namesrv 127.0.0.1:9876 --accounts 100
"""

from __future__ import annotations

import argparse
import signal
from contextlib import AsyncExitStack

import trio

from trimq.client import Message, MessageQueue, Producer, ProducerConfig, PushConsumer, PushConsumerConfig
from trimq.client.admin import open_admin
from trimq.runtime.logs import configure_logging

TOPIC = "ExamplePayments"


class Ledger:
    """What the worker writes: each account's payments, applied in the order they were made."""

    def __init__(self) -> None:
        self.balances: dict[str, list[int]] = {}
        self.failures_left = 3  # the first few writes fail once, to show the retries

    async def apply(self, account: str, seq: int) -> None:
        await trio.sleep(0)  # e.g. a write to a database
        if self.failures_left and seq == 1:
            self.failures_left -= 1
            raise OSError("ledger unavailable")
        self.balances.setdefault(account, []).append(seq)


async def worker(consumer: PushConsumer, ledger: Ledger, expected: int, done: trio.Event) -> None:
    applied = 0
    async for msg in consumer.messages():  # the stream the consumer was started with
        try:
            async with msg.process():  # ends normally: consumed; raises: delivered again, in place (orderly)
                account, seq = msg.body.decode().split(":")
                await ledger.apply(account, int(seq))
        except OSError as exc:
            print(f"  {msg.sharding_key} #{seq} failed ({exc}), will be retried")
            continue
        applied += 1
        if applied == expected:
            done.set()


async def service(namesrv: str | None, accounts: int, payments: int) -> int:
    ledger = Ledger()
    done = trio.Event()
    async with AsyncExitStack() as stack:
        if namesrv is None:
            from trimq.testing import open_broker

            namesrv = (await stack.enter_async_context(open_broker())).namesrv_addr
        admin = await stack.enter_async_context(open_admin(namesrv))
        await admin.ensure_topic(TOPIC, 4)

        consumer = PushConsumer(PushConsumerConfig(namesrv_addr=namesrv, consumer_group="ledger_worker",
                                                   consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                                   suspend_current_queue_time_millis=50))
        consumer.subscribe(TOPIC)
        consumer.messages(orderly=True)  # chosen before the start: the consumer hands its messages to the stream

        @consumer.on_revoked
        def revoked(queues: list[MessageQueue]) -> None:
            print(f"released {len(queues)} queues (offsets persisted, locks released)")

        async with trio.open_nursery() as nursery:
            async def stop_on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()  # leaving `async with consumer` by cancellation is graceful

            nursery.start_soon(stop_on_signal)
            config = ProducerConfig(namesrv_addr=namesrv, producer_group="ledger_api")
            async with Producer(config) as producer, consumer:
                nursery.start_soon(worker, consumer, ledger, accounts * payments, done)

                async def pay(account: str) -> None:  # one account's payments in turn: stored in that order
                    for seq in range(payments):
                        await producer.send(Message(TOPIC, f"{account}:{seq}".encode()), sharding_key=account)

                async with trio.open_nursery() as senders:  # the accounts concurrently
                    for a in range(accounts):
                        senders.start_soon(pay, f"acct-{a}")
                with trio.move_on_after(30):
                    await done.wait()
                nursery.cancel_scope.cancel()  # stop the service: the worker and the signal task end, clients leave
    in_order = all(seqs == list(range(payments)) for seqs in ledger.balances.values())
    total = sum(map(len, ledger.balances.values()))
    print(f"applied {total} payments of {len(ledger.balances)} accounts; each account in order: {in_order}")
    return 0 if in_order and total == accounts * payments else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--namesrv", help="name server HOST:PORT (default: start a broker in a temp dir)")
    ap.add_argument("--accounts", type=int, default=20)
    ap.add_argument("--payments", type=int, default=5, help="payments per account")
    args = ap.parse_args()
    configure_logging("console", "error")  # (the planned failures are logged as warnings)
    return trio.run(service, args.namesrv, args.accounts, args.payments)


if __name__ == "__main__":
    raise SystemExit(main())
