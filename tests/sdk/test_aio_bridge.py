"""The trio -> asyncio bridge of client.aio (GuestHost.run_asyncio): an ``async def`` listener's first step runs as
an asyncio task standing by for such calls, so a call that finishes without suspending creates no task of its own;
a call that suspends is carried on by that very task (same ``current_task()``, its own context) and the host
stands a new task by. What asyncio code may observe of its task holds as if each call had a task of its own.

No broker: the trio side is a plain trio function run in the loop's guest run (``run_trio``), calling the bridge
as the consume services do."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from contextlib import nullcontext  # entered in the guest run, it holds the run open for a test's calls
from typing import Any, TypeVar

import pytest
import sniffio

from trimq.client import aio as client_aio

T = TypeVar("T")
CALL_ID: contextvars.ContextVar[str] = contextvars.ContextVar("CALL_ID", default="unset")


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(30):
            return await main()

    return asyncio.run(bounded())


async def bridge(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` from a trio task of the guest run, through the bridge, as a listener is called."""

    async def trio_side() -> Any:
        host = client_aio._HOSTS[asyncio.get_running_loop()]
        assert sniffio.current_async_library() == "trio"
        return await host.run_asyncio(contextvars.copy_context(), fn, *args)

    return await client_aio.run_trio(trio_side)


def listener_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "trimq.aio.listener"]


def test_calls_that_do_not_suspend_share_one_task_and_calls_that_do_keep_theirs() -> None:
    seen: list[tuple[int, asyncio.Task[Any] | None, str, str]] = []

    async def quick(i: int) -> int:
        seen.append((i, asyncio.current_task(), sniffio.current_async_library(), CALL_ID.get()))
        CALL_ID.set(f"set by call {i}")  # its own copy of the context: the next call does not see it
        return i * 10

    async def slow(i: int) -> tuple[int, bool, str]:
        task = asyncio.current_task()
        CALL_ID.set(f"slow {i}")
        await asyncio.sleep(0.001)
        async with asyncio.timeout(5):  # the task asyncio.timeout would cancel is the one running the call
            await asyncio.sleep(0)
        return i, asyncio.current_task() is task, CALL_ID.get()

    async def main() -> None:
        async with client_aio.trio_context(nullcontext()):
            assert [await bridge(quick, i) for i in range(5)] == [0, 10, 20, 30, 40]
            first = seen[0][1]
            assert first is not None and all(task is first for _, task, _, _ in seen)  # one task for all five
            assert all(lib == "asyncio" and call_id == "unset" for _, _, lib, call_id in seen)
            assert not first.done() and listener_tasks() == [first]  # standing by for the next call

            assert await bridge(slow, 1) == (1, True, "slow 1")  # the standing task carried it, then ended
            assert first.done() and first.result() == (1, True, "slow 1")
            await bridge(quick, 6)
            assert seen[-1][1] is not first  # a new task stands by
        await asyncio.sleep(0)
        assert listener_tasks() == []  # the last client out retired it

    run(main)


def test_a_call_that_cancels_its_task_or_watches_it_ends_it_with_its_outcome() -> None:
    async def watched() -> str:
        asyncio.current_task().add_done_callback(ended.append)  # type: ignore[union-attr]
        return "watched"

    async def cancels_itself_and_suspends() -> None:
        asyncio.current_task().cancel()  # type: ignore[union-attr]
        await asyncio.sleep(1)

    async def quick() -> asyncio.Task[Any] | None:
        return asyncio.current_task()

    ended: list[asyncio.Task[Any]] = []

    async def main() -> None:
        async with client_aio.trio_context(nullcontext()):
            before = await bridge(quick)
            assert await bridge(watched) == "watched"
            await asyncio.sleep(0)
            assert ended == [before] and before is not None and before.result() == "watched"
            assert await bridge(quick) is not before
            with pytest.raises(client_aio.AsyncioTaskCancelledError):
                await bridge(cancels_itself_and_suspends)
            after = await bridge(quick)
            assert after is not None and not after.cancelling()  # the cancellation stayed with its call

    run(main)


def test_errors_raised_in_the_first_step_reach_trio_and_the_task_stays_ready() -> None:
    async def fails(kind: str) -> None:
        if kind == "cancelled":
            raise asyncio.CancelledError
        raise ValueError("listener failed")

    async def quick() -> asyncio.Task[Any] | None:
        return asyncio.current_task()

    async def main() -> None:
        async with client_aio.trio_context(nullcontext()):
            task = await bridge(quick)
            with pytest.raises(ValueError, match="listener failed"):
                await bridge(fails, "value")
            with pytest.raises(client_aio.AsyncioTaskCancelledError, match="raised CancelledError"):
                await bridge(fails, "cancelled")
            assert await bridge(quick) is task

    run(main)


def test_a_task_cancelled_while_standing_by_is_not_used_again() -> None:
    async def quick() -> asyncio.Task[Any] | None:
        return asyncio.current_task()

    async def suspends() -> str:
        await asyncio.sleep(0)
        return "done"

    async def main() -> None:
        async with client_aio.trio_context(nullcontext()):
            task = await bridge(quick)
            assert task is not None
            task.cancel()  # e.g. a service cancelling every task it finds
            assert await bridge(suspends) == "done"  # ran on a new task: the cancellation is not its
            await asyncio.sleep(0)
            assert task.cancelled()

    run(main)


def test_the_end_of_the_guest_run_ends_the_standing_task() -> None:
    """The last use of the guest run given back: the task standing by ends (no task left pending)."""
    left: list[asyncio.Task[Any]] = []

    async def quick() -> None:
        return None

    async def main() -> None:
        host = await client_aio.current_host()
        try:
            await bridge(quick)
            left.extend(listener_tasks())
        finally:
            await host._release()
        assert left and left[0].done()

    run(main)


def test_cancelling_the_trio_side_cancels_the_call_the_task_carries_on() -> None:
    """A call that suspended is carried on by the task it first ran as; cancelling the trio side (a shutdown's drain
    bound running out) cancels that task, and the listener sees CancelledError at its await."""
    saw: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            saw.append("cancelled")
            raise

    async def main() -> None:
        async with client_aio.trio_context(nullcontext()):
            async def trio_side() -> bool:
                import trio

                host = client_aio._HOSTS[asyncio.get_running_loop()]
                with trio.move_on_after(0.05) as scope:
                    await host.run_asyncio(contextvars.copy_context(), waits)
                return scope.cancelled_caught

            assert await client_aio.run_trio(trio_side)
            assert saw == ["cancelled"]
            assert listener_tasks() == []  # the task that carried the call ended with it

    run(main)


def test_without_asyncio_task_helpers_each_call_runs_as_a_task_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a Python whose asyncio lacks ``_enter_task``/``_leave_task`` the bridge falls back to a task per call (no
    task stands by): results, errors and each call's own context still hold."""
    monkeypatch.setattr(client_aio, "_enter_task", None)
    tasks: list[asyncio.Task[Any] | None] = []

    async def quick(i: int) -> tuple[int, str]:
        tasks.append(asyncio.current_task())
        seen = CALL_ID.get()
        CALL_ID.set(f"set by call {i}")
        return i, seen

    async def slow() -> str:
        await asyncio.sleep(0.001)
        return sniffio.current_async_library()

    async def fails() -> None:
        raise ValueError("listener failed")

    async def main() -> None:
        async with client_aio.trio_context(nullcontext()):
            assert [await bridge(quick, i) for i in range(3)] == [(0, "unset"), (1, "unset"), (2, "unset")]
            assert len({id(t) for t in tasks}) == 3 and all(t is not None and t.done() for t in tasks)
            assert await bridge(slow) == "asyncio"
            with pytest.raises(ValueError, match="listener failed"):
                await bridge(fails)
            assert listener_tasks() == []  # nothing stands by on this path

    run(main)
