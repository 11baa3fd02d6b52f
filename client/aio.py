"""trimq on asyncio: the SDK's own classes, native in a running asyncio loop (docs/EMBEDDING.md).

::

    async def main() -> None:                                    # asyncio.run(main())
        async with Producer(ProducerConfig(namesrv_addr=addr)) as producer:
            await producer.send(Message("Orders", b"paid"))

The SDK is trio code. Inside an asyncio loop it runs in a **trio guest run** on that loop
(``trio.lowlevel.start_guest_run``): trio's tasks are steps of the asyncio loop, in the loop's thread, and only
trio's I/O poller (a thread that waits in epoll and never runs Python code of ours or yours) lives elsewhere.
One guest run per asyncio loop is shared by every client entered in it; it starts with the first ``async
with`` and ends when the last one has exited (trio allows one guest run per host loop).

How the two loops meet (the bridge):

* **asyncio -> trio.** ``async with client`` and the clients' ``async def`` methods, awaited from asyncio, start a
  task in the guest run's nursery (trio's sync functions may be called from the host thread during a guest
  run) and await an asyncio future that the trio task completes. The trio task runs in the loop's thread, so
  it completes the future directly. Cancelling the awaiting asyncio task cancels the trio task.
* **trio -> asyncio.** A trio task cannot await an asyncio future. An ``async def`` listener or callback
  written for asyncio is run by :meth:`GuestHost.run_asyncio`: the trio side creates an asyncio task for the
  coroutine on the host loop (in a copy of the context of the asyncio task that entered the client, so
  contextvars and ``sniffio`` say asyncio) and waits on a :class:`trio.Event` that the asyncio task's done
  callback sets. Setting an Event from the host thread is allowed in guest mode; trio wakes up for it.
* **Eager start.** Waking trio from asyncio costs a round trip through trio's I/O thread (tens of microseconds
  of CPU), once per batch of completions. So the task's first step runs at once, inside the trio step that
  created it (as Python 3.12's eager tasks do, with the task as ``asyncio.current_task()`` and sniffio saying
  asyncio): a listener that finishes without suspending - most of them, per message - returns to trio with no
  round trip at all; one that awaits I/O carries on as an ordinary task of the host loop.
* **A task standing by.** Creating, scheduling and finishing an asyncio task per call costs ~3 µs, so one task
  (named ``trimq.aio.listener``) stands by for the calls' first steps: those that finish there share it, the
  first that suspends keeps it as its own task (the same ``current_task()`` before and after), and a new one
  stands by. A call that cancels its task or adds a done callback to it gets it to itself too (it ends with the
  call). The guest run's end ends the task standing by.
* Plain ``def`` listeners run in worker threads, as under trio.

Leaving the ``async with`` block (normally, by an exception or because the owning asyncio task is cancelled)
runs the client's graceful shutdown on the trio side and waits for it, shielded from further cancellation:
the consumer persists its offsets, releases its queue locks and leaves its group before the block is left.

:func:`trio_context` and :func:`run_trio` reach any other trio API of the project from asyncio
(``trimq.testing.open_broker()``, :class:`~trimq.client.admin.Admin`) through the same guest run.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import outcome
import sniffio
import trio

from trimq.client.consume.common import is_async_callable
from trimq.client.errors import ClientClosedError
from trimq.runtime.logs import get_logger

__all__ = [
    "AsyncioTaskCancelledError",
    "GuestHost",
    "HostStoppedError",
    "asyncio_native",
    "current_host",
    "in_trio",
    "run_trio",
    "trio_context",
    "trio_native",
]

log = get_logger("trimq.aio")

T = TypeVar("T")
C = TypeVar("C", bound=type[Any])

#: How long a trio task that was cancelled waits for the asyncio task it started (listener, callback) to finish
#: its own cancellation before it lets go of it. Well-behaved coroutines unwind at once.
ASYNCIO_CANCEL_GRACE_S = 5.0

# asyncio's own helpers for "this task is running now" (what 3.12's eager tasks use); without them (another
# Python), asyncio listeners start as ordinary tasks.
_enter_task = getattr(asyncio.tasks, "_enter_task", None)
_leave_task = getattr(asyncio.tasks, "_leave_task", None)

_HOSTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GuestHost] = weakref.WeakKeyDictionary()
_OWNER: weakref.WeakKeyDictionary[Any, GuestHost] = weakref.WeakKeyDictionary()


class HostStoppedError(ClientClosedError):
    """The trio guest run of this asyncio loop stopped while a call was under way."""


class AsyncioTaskCancelledError(RuntimeError):
    """An asyncio listener's task was cancelled by someone other than trimq (counts as a failed call)."""


def in_trio() -> bool:
    """True in trio code: a ``trio.run`` (any thread) or a step of a guest run. False in asyncio code, including
    an asyncio listener's first step that trimq runs from inside a trio step. (trio marks its code for sniffio
    with this thread-local; trio.lowlevel.in_trio_task() would also be true inside such a first step.)"""
    return sniffio.thread_local.name == "trio"


@dataclass(eq=False)
class _Entered:
    """One object entered with :meth:`GuestHost.enter`: the trio task holding its ``async with`` open."""

    obj: Any
    entered: asyncio.Future[Any]
    exited: asyncio.Future[None]
    exit_requested: trio.Event = field(default_factory=trio.Event)


def _settle(fut: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


async def _uncancellable(fut: asyncio.Future[T]) -> T:
    """Await ``fut`` to the end even if the awaiting task is cancelled meanwhile (then CancelledError is raised
    after it completed): used where leaving early would leave trio work behind (a shutdown, the host's end)."""
    cancelled = False
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                break
            cancelled = True
    if cancelled:
        fut.exception()  # retrieved: the cancellation below is what the caller gets
        raise asyncio.CancelledError
    return fut.result()


_NOTHING: Any = object()


class _Standby(Coroutine[Any, Any, Any]):
    """The coroutine of an asyncio task kept ready for listener calls: their first steps run as this task.

    Creating, scheduling and finishing an asyncio task for every listener call costs ~3 µs; most calls finish in
    their first step, so one task serves them all, standing by on a future of its own (:attr:`wake`) between
    calls. A first step that suspends hands its coroutine to the task (:meth:`adopt`): the task's next step gives
    the task what the coroutine waits on, and the task carries the coroutine on, each step in the call's context,
    as if it had been created for it (the same task before and after the suspension, so ``asyncio.timeout`` and
    ``current_task()`` hold). The host then stands a new task by. A task ends with its call's outcome when a first
    step that returned left something on it (:meth:`finish`: done callbacks, a cancellation), and with None when
    the host retires it (:meth:`finish` too)."""

    __slots__ = ("context", "coro", "finished", "loop", "result", "task", "wake", "yielded")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.wake: asyncio.Future[None] = loop.create_future()
        self.coro: Coroutine[Any, Any, Any] | None = None
        self.context: contextvars.Context | None = None
        self.yielded: Any = _NOTHING
        self.finished = False
        self.result: Any = None
        self.task: asyncio.Task[Any] = loop.create_task(self, name="trimq.aio.listener")

    @property
    def free(self) -> bool:
        """Whether a first step may run as this task: nothing adopted, not finished (a finished task is done or
        about to be), and no cancellation pending (one would reach the next call that suspends)."""
        return self.coro is None and not self.finished and not self.wake.done() and not self.task.cancelling()

    def first_step(self, coro: Coroutine[Any, Any, Any],
                   context: contextvars.Context) -> tuple[bool, Any, BaseException | None]:
        """Run ``coro``'s first step as this task in ``context``; (suspended, value, error): the value yielded
        (suspended) or returned, or the exception raised."""
        assert _enter_task is not None and _leave_task is not None
        library, sniffio.thread_local.name = sniffio.thread_local.name, None
        _enter_task(self.loop, self.task)
        try:
            return True, context.run(coro.send, None), None
        except StopIteration as stop:
            return False, stop.value, None
        except BaseException as exc:
            return False, None, exc
        finally:
            _leave_task(self.loop, self.task)
            sniffio.thread_local.name = library

    def adopt(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context, yielded: Any) -> None:
        """The task carries ``coro`` on from its first step, which yielded ``yielded``."""
        self.coro, self.context, self.yielded = coro, context, yielded
        self._wake_up()

    def finish(self, result: Any = None) -> None:
        """The task ends (result ``result``) at its next step, unless a coroutine was adopted."""
        self.finished, self.result = True, result
        self._wake_up()

    def _wake_up(self) -> None:
        if not self.wake.done():  # (cancelled: the task is cancelled, and its next step says so)
            self.wake.set_result(None)

    def send(self, value: Any) -> Any:
        if self.coro is not None:
            yielded, self.yielded = self.yielded, _NOTHING
            if yielded is not _NOTHING:
                return yielded  # the task now waits for what the first step waited for
            assert self.context is not None
            return self.context.run(self.coro.send, value)
        if self.finished:
            raise StopIteration(self.result)
        self.wake._asyncio_future_blocking = True  # type: ignore[attr-defined]  # what ``await wake`` would set
        return self.wake

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        exc = typ if val is None else val
        if self.coro is not None:
            self.yielded = _NOTHING
            assert self.context is not None
            return self.context.run(self.coro.throw, exc)
        self.finished = True  # cancelled while standing by, or after its call returned: no more first steps
        raise exc

    def close(self) -> None:
        if self.coro is not None:
            self.coro.close()

    def __await__(self) -> Generator[Any, None, Any]:  # pragma: no cover - asyncio drives it with send/throw
        raise TypeError("not awaitable: an asyncio task drives it")


class GuestHost:
    """The trio guest run of one asyncio loop (module documentation). Get it with :func:`current_host`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.users = 0
        """Clients entered (or being entered) through this host; the run stops when it drops to 0."""
        self.closing = False
        self.ready: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._entered: list[_Entered] = []
        """Objects entered and not yet exited through :meth:`exit` (also those whose block already failed: their
        error is raised by :meth:`exit`)."""
        self._standby: _Standby | None = None
        """The asyncio task that listener calls' first steps run as (:class:`_Standby`), once one was needed."""

    # --- the guest run --------------------------------------------------------------------------------

    def _start(self) -> None:
        trio.lowlevel.start_guest_run(
            self._main,
            run_sync_soon_threadsafe=self.loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=self.loop.call_soon,
            done_callback=self._done,
            # asyncio's unix loops own signal.set_wakeup_fd (add_signal_handler): trio must not take it over
            host_uses_signal_set_wakeup_fd=True,
        )

    async def _main(self) -> None:
        self._stop = trio.Event()
        if self.closing:
            return
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            _settle(self.ready)
            await self._stop.wait()
            # every client has exited (users == 0): what remains are calls whose callers went away
            nursery.cancel_scope.cancel()
        self._nursery = None

    def _done(self, result: outcome.Outcome[None]) -> None:
        self.closing = True
        if self._standby is not None:  # no more calls: the standing task ends
            self._standby.finish()
            self._standby = None
        if _HOSTS.get(self.loop) is self:
            del _HOSTS[self.loop]
        error: BaseException = RuntimeError("the trio guest run ended before it was ready")
        if isinstance(result, outcome.Error):
            error = HostStoppedError(f"the trio guest run failed: {result.error!r}")
            error.__cause__ = result.error
            log.error("aio.guest_run_failed", error=repr(result.error))
        _settle(self.ready, error=error)
        for entry in list(self._entered):
            _settle(entry.entered, error=error)
            _settle(entry.exited, error=error)
        if isinstance(result, outcome.Error):
            _settle(self.finished, error=error)
        else:
            _settle(self.finished)

    async def _release(self) -> None:
        self.users -= 1
        if self.users > 0 or self.closing:
            return
        self.closing = True
        if self._stop is not None:
            self._stop.set()  # a sync trio call from the host thread: allowed during a guest run
        await _uncancellable(self.finished)

    def _nursery_or_raise(self) -> trio.Nursery:
        if self._nursery is None or self.closing:
            raise HostStoppedError("the trio guest run of this asyncio loop is not running")
        return self._nursery

    # --- asyncio -> trio --------------------------------------------------------------------------------

    async def enter(self, obj: AbstractAsyncContextManager[T]) -> T:
        """``async with obj`` in a trio task of the guest run, held open until :meth:`exit`; returns what its
        ``__aenter__`` returned. Cancelling the caller while it enters exits ``obj`` again before raising."""
        entry = _Entered(obj, self.loop.create_future(), self.loop.create_future())

        async def hold() -> None:
            try:
                async with obj as value:
                    _settle(entry.entered, result=value)
                    await entry.exit_requested.wait()
            except BaseException as exc:
                error: BaseException = exc
                if isinstance(exc, trio.Cancelled):
                    error = HostStoppedError("the trio guest run stopped")
                _settle(entry.exited if entry.entered.done() else entry.entered, error=error)
                _settle(entry.exited)
                if not isinstance(exc, Exception):
                    raise
            else:
                _settle(entry.exited)

        self._nursery_or_raise().start_soon(hold, name=f"trimq.aio.enter({type(obj).__name__})")
        self._entered.append(entry)
        try:
            return await asyncio.shield(entry.entered)
        except asyncio.CancelledError:
            self._entered.remove(entry)
            entry.exit_requested.set()
            try:
                await _uncancellable(entry.exited)
            except Exception:
                pass
            raise
        except BaseException:  # __aenter__ failed: nothing to exit
            self._entered.remove(entry)
            raise

    async def exit(self, obj: Any) -> None:
        """Leave the ``async with`` of ``obj`` (its graceful shutdown) and wait for it, even if cancelled; raises
        what its ``__aexit__`` raised, or what ended its block earlier (a failure of its background tasks)."""
        entry = next((e for e in self._entered if e.obj is obj), None)
        if entry is None:
            return
        self._entered.remove(entry)
        entry.exit_requested.set()
        await _uncancellable(entry.exited)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
        """Run ``await fn(*args, **kwargs)`` as a trio task of the guest run; the returned asyncio future has its
        outcome. Cancelling the future cancels the trio task."""
        fut: asyncio.Future[T] = self.loop.create_future()
        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                try:
                    result = await fn(*args, **kwargs)
                except BaseException as exc:
                    if isinstance(exc, trio.Cancelled):  # the caller went away, or the guest run is stopping
                        _settle(fut, error=HostStoppedError("the trio guest run stopped during the call"))
                    else:
                        _settle(fut, error=exc)
                    if not isinstance(exc, Exception):
                        raise
                    return
                _settle(fut, result=result)

        self._nursery_or_raise().start_soon(run, name=getattr(fn, "__qualname__", repr(fn)))

        def cancelled(f: asyncio.Future[T]) -> None:
            if f.cancelled():
                scope.cancel()

        fut.add_done_callback(cancelled)
        return fut

    # --- trio -> asyncio --------------------------------------------------------------------------------

    async def run_asyncio(self, context: contextvars.Context, fn: Callable[..., Any], *args: Any) -> Any:
        """From a trio task of the guest run: run ``fn(*args)`` (an asyncio coroutine function, or a plain
        callable) on the host loop and return its result or raise its exception. The coroutine runs as an
        asyncio task in a copy of ``context``. Cancelling the trio side cancels the asyncio task and waits for
        it (up to :data:`ASYNCIO_CANCEL_GRACE_S`)."""
        ctx = context.copy()
        library, sniffio.thread_local.name = sniffio.thread_local.name, None
        try:
            value = ctx.run(fn, *args)  # a plain function runs here, as asyncio code would call it
        finally:
            sniffio.thread_local.name = library
        if not inspect.isawaitable(value):
            return value
        coro: Coroutine[Any, Any, Any] = value if inspect.iscoroutine(value) else _await(value)
        if _enter_task is None or asyncio.current_task(self.loop) is not None:
            task = self.loop.create_task(coro, context=ctx)  # (trio steps of a guest run are callbacks, no task)
        else:
            standby = self._standby_task()
            task = standby.task
            suspended, result, error = standby.first_step(coro, ctx)
            if suspended:
                standby.adopt(coro, ctx, result)
                self._standby = None
            else:
                if task.cancelling() or task._callbacks:  # type: ignore[attr-defined]
                    # The call cancelled its task or asked to hear when it ends: it ends now, with the call.
                    standby.finish(result)
                    self._standby = None
                if error is not None:
                    if isinstance(error, asyncio.CancelledError):
                        raise AsyncioTaskCancelledError(f"{fn!r} raised CancelledError") from error
                    raise error
                return result
        done = trio.Event()
        task.add_done_callback(lambda _t: done.set())
        try:
            await done.wait()
        except trio.Cancelled:
            task.cancel()
            with trio.CancelScope(shield=True), trio.move_on_after(ASYNCIO_CANCEL_GRACE_S):
                await done.wait()
            raise
        if task.cancelled():  # by someone else: a failure of this call, not a cancellation of the trio side
            raise AsyncioTaskCancelledError(f"the asyncio task running {fn!r} was cancelled")
        return task.result()

    def _standby_task(self) -> _Standby:
        """The task standing by for listener calls' first steps; a new one when there is none or it is taken."""
        if self._standby is None or not self._standby.free:
            self._standby = _Standby(self.loop)
        return self._standby

    def to_trio(self, fn: Any, context: contextvars.Context | None = None) -> Any:
        """``fn`` as trio code can call it: an ``async def`` written for asyncio becomes an ``async def`` that
        runs it through :meth:`run_asyncio`; plain callables and functions marked :func:`trio_native` are
        returned unchanged."""
        if fn is None or getattr(fn, "__trimq_trio_native__", False) or not is_async_callable(fn):
            return fn
        ctx = contextvars.copy_context() if context is None else context

        @functools.wraps(fn)
        async def bridged(*args: Any) -> Any:
            return await self.run_asyncio(ctx, fn, *args)

        bridged.__trimq_trio_native__ = True  # type: ignore[attr-defined]
        return bridged


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


def trio_native(fn: T) -> T:
    """Mark an ``async def`` as trio code: clients entered from asyncio then call it in the guest run as is,
    instead of as an asyncio coroutine (for listeners that use trio themselves)."""
    fn.__trimq_trio_native__ = True  # type: ignore[attr-defined]
    return fn


async def current_host() -> GuestHost:
    """The trio guest run of the running asyncio loop, started if needed; the caller holds one use of it and
    must give it back with ``await host._release()`` (the clients' ``async with`` does this)."""
    loop = asyncio.get_running_loop()
    while True:
        host = _HOSTS.get(loop)
        if host is None:
            host = GuestHost(loop)
            _HOSTS[loop] = host
            host._start()
        elif host.closing:  # one guest run per host loop: wait for the previous one to end
            try:
                await _uncancellable(host.finished)
            except Exception:
                pass
            continue
        host.users += 1
        try:
            await asyncio.shield(host.ready)
        except BaseException:
            await host._release()
            raise
        return host


def _running_loop(what: str) -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(f"{what} must be awaited in a trio task or in a running asyncio loop") from None


async def _asyncio_enter(obj: Any, aenter: Callable[[Any], Awaitable[Any]]) -> Any:
    _running_loop(f"{type(obj).__name__}.__aenter__")
    if obj in _OWNER:
        raise ClientClosedError(f"this {type(obj).__name__} is already entered")
    host = await current_host()
    try:
        adapt = getattr(obj, "_adapt_callbacks", None)
        if adapt is not None:
            context = contextvars.copy_context()
            adapt(lambda fn: host.to_trio(fn, context))
        value = await host.enter(obj)
    except BaseException:
        await host._release()
        raise
    _OWNER[obj] = host
    return value


async def _asyncio_exit(obj: Any) -> bool:
    host = _OWNER.pop(obj, None)
    if host is None:
        return False
    try:
        await host.exit(obj)
    finally:
        await host._release()
    return False


async def _asyncio_call(obj: Any, fn: Callable[..., Awaitable[T]], name: str, idle_ok: bool,
                        args: tuple[Any, ...], kwargs: dict[str, Any]) -> T | None:
    loop = _running_loop(f"{type(obj).__name__}.{name}()")
    host = _OWNER.get(obj)
    if host is None or host.loop is not loop:
        if idle_ok:
            return None
        where = "in another event loop" if host is not None else "not running"
        raise ClientClosedError(f"the {type(obj).__name__} is {where} (use it inside `async with` in this loop)")
    return await host.call(fn, obj, *args, **kwargs)


def asyncio_native(*methods: str, idle_ok: tuple[str, ...] = ()) -> Callable[[C], C]:
    """Class decorator: ``async with`` and the named ``async def`` methods work in trio tasks (unchanged) and in
    a running asyncio loop (through the loop's :class:`GuestHost`). Methods in ``idle_ok`` return None when
    awaited from asyncio on an object that is not running (e.g. a second ``shutdown()``).

    The wrappers are plain functions returning the original coroutine in trio (no extra frame on hot paths
    such as ``send``). Before entering from asyncio, ``obj._adapt_callbacks(to_trio)`` (if defined) is called
    so the object can wrap the asyncio callbacks it was given (listeners, hooks)."""

    def decorate(cls: C) -> C:
        aenter, aexit = cls.__aenter__, cls.__aexit__

        @functools.wraps(aenter)
        def __aenter__(self: Any) -> Awaitable[Any]:
            if in_trio():
                return aenter(self)  # type: ignore[no-any-return]
            return _asyncio_enter(self, aenter)

        @functools.wraps(aexit)
        def __aexit__(self: Any, *exc_info: Any) -> Awaitable[Any]:
            if in_trio():
                return aexit(self, *exc_info)  # type: ignore[no-any-return]
            return _asyncio_exit(self)

        cls.__aenter__, cls.__aexit__ = __aenter__, __aexit__
        for name in methods:
            setattr(cls, name, _dual(getattr(cls, name), name, name in idle_ok))
        return cls

    return decorate


def _dual(fn: Callable[..., Awaitable[T]], name: str, idle_ok: bool) -> Callable[..., Awaitable[T | None]]:
    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Awaitable[T | None]:
        if in_trio():
            return fn(self, *args, **kwargs)
        return _asyncio_call(self, fn, name, idle_ok, args, kwargs)

    return method


# --- any trio API from asyncio ---------------------------------------------------------------------------

@asynccontextmanager
async def trio_context(cm: AbstractAsyncContextManager[T]) -> AsyncIterator[T]:
    """From asyncio: ``async with trio_context(open_broker()) as cluster:`` enters a trio async context manager
    in the loop's guest run and yields what it yields; call its trio methods with :func:`run_trio`."""
    if in_trio():
        async with cm as value:
            yield value
        return
    _running_loop("trio_context()")
    host = await current_host()
    try:
        value = await host.enter(cm)
        try:
            yield value
        finally:
            await host.exit(cm)
    finally:
        await host._release()


async def run_trio(fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """From asyncio: ``await run_trio(admin.ensure_topic, "Orders", 4)`` runs a trio coroutine function in the
    loop's guest run (started for the call if no client holds it). In a trio task it is just awaited."""
    if in_trio():
        return await fn(*args, **kwargs)
    _running_loop("run_trio()")
    host = await current_host()
    try:
        return await host.call(fn, *args, **kwargs)
    finally:
        await host._release()
