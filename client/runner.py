"""TrioRunner: use the trio SDK from plain threads or from asyncio.

trimq's client is trio code. A program that is not a trio program (a threaded service, an asyncio web
application) hosts the trio loop in one background thread and talks to it through a :class:`TrioRunner`::

    with TrioRunner() as runner:
        producer = runner.enter(Producer(ProducerConfig(namesrv_addr=addr)))   # runs `async with` in trio
        result = runner.call(producer.send, Message("Orders", b"x"))            # blocks this thread
        result = await runner.acall(producer.send, msg)                          # from asyncio: awaits
    # leaving: every entered object is exited in reverse order (gracefully), then the loop stops

Guarantees:

* **Structured.** Every object entered and every call runs as a task of one nursery that the runner's
  trio loop owns; nothing outlives :meth:`TrioRunner.close`. ``close`` first exits the entered objects
  in reverse order of entry (their ``__aexit__`` with no exception: a consumer's graceful shutdown),
  then cancels calls still running, then stops the loop and joins the thread.
* **Exceptions keep their type.** An exception raised by ``fn`` (or by ``__aenter__``/``__aexit__``)
  is raised again, unchanged, in the thread that called ``call``/``enter``/``exit``, or from the
  awaited ``acall``.
* **Cancellation crosses over.** Cancelling the asyncio task awaiting ``acall`` cancels the trio task
  running ``fn``.
* A runner left open is closed (gracefully) when the interpreter exits.
* ``call``/``enter``/``exit``/``close`` block the calling thread; they must not be called from the
  runner's own trio thread (that would deadlock; they raise RuntimeError instead). Inside trio code
  (a listener declared ``async def``), just ``await`` the SDK directly.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import sys
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import trio

__all__ = ["RunnerClosedError", "TrioRunner"]

T = TypeVar("T")


class RunnerClosedError(RuntimeError):
    """The runner is not running (not started yet, or closed)."""


@dataclass(eq=False)
class _Entered:
    """One object entered with :meth:`TrioRunner.enter` and the task holding its ``async with`` open."""

    obj: Any
    exit_requested: trio.Event = field(default_factory=trio.Event)
    exited: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)


class TrioRunner:
    """A trio loop in a background thread; see the module documentation.

    ``name`` names the thread. ``close_timeout_s`` bounds how long :meth:`close` waits for the entered
    objects to exit (None: as long as they take; a consumer's shutdown is itself bounded by its
    ``await_termination_millis_when_shutdown``)."""

    def __init__(self, *, name: str = "trimq-trio", close_timeout_s: float | None = None) -> None:
        self.name = name
        self.close_timeout_s = close_timeout_s
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._loop_error: BaseException | None = None
        self._entered: list[_Entered] = []
        self._state_lock = threading.Lock()
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> TrioRunner:
        """Start the loop thread and wait until it accepts work. Returns ``self``."""
        with self._state_lock:
            if self._closed:
                raise RunnerClosedError("this TrioRunner was closed; create a new one")
            if self._thread is not None:
                return self
            # A daemon thread, so a forgotten runner cannot hang the interpreter's exit; the atexit hook
            # still closes it gracefully (consumers unlock their queues and leave their groups).
            self._thread = threading.Thread(target=self._thread_main, name=self.name, daemon=True)
            self._thread.start()
            atexit.register(self._close_at_exit)
        self._ready.wait()
        if self._startup_error is not None:
            raise RunnerClosedError(f"the trio loop failed to start: {self._startup_error!r}") from self._startup_error
        return self

    def __enter__(self) -> TrioRunner:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`close`."""
        return self._token is not None and not self._closed

    def close(self) -> None:
        """Exit every entered object in reverse order of entry, then stop the loop and join its thread.

        Idempotent. If an object's ``__aexit__`` raised, the first such exception is raised here after the
        loop stopped (the others are still exited)."""
        self._not_in_loop_thread("close")
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        atexit.unregister(self._close_at_exit)
        first_error: BaseException | None = None
        for entry in reversed(list(self._entered)):
            try:
                self._request_exit(entry)
                entry.exited.result(timeout=self.close_timeout_s)
            except concurrent.futures.TimeoutError:
                if first_error is None:
                    first_error = TimeoutError(f"{entry.obj!r} did not exit within {self.close_timeout_s} s")
            except BaseException as exc:
                if first_error is None:
                    first_error = exc
        token, stop = self._token, self._stop
        if token is not None and stop is not None:
            try:
                token.run_sync_soon(stop.set)
            except trio.RunFinishedError:
                pass
        thread.join()
        self._token = None
        if first_error is not None:
            raise first_error
        if self._loop_error is not None:
            raise self._loop_error

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except BaseException as exc:  # nobody left to raise it to
            sys.stderr.write(f"trimq: closing a TrioRunner at exit failed: {exc!r}\n")

    # --- the loop thread ----------------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # the loop itself failed: report it to whoever waits
            if not self._ready.is_set():
                self._startup_error = exc
            else:
                self._loop_error = exc
        finally:
            self._ready.set()
            # Calls queued after the loop ended must not hang their callers.
            for entry in self._entered:
                _settle(entry.exited, error=RunnerClosedError("the runner's trio loop ended"))

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            # close() already exited the entered objects; what remains is calls in flight.
            nursery.cancel_scope.cancel()
        self._nursery = None

    # --- submitting work ----------------------------------------------------------------------------

    def _not_in_loop_thread(self, what: str) -> None:
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError(f"TrioRunner.{what}() blocks; inside the runner's trio thread just await the SDK")

    def _submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> tuple[concurrent.futures.Future[Any], trio.CancelScope]:
        """Run ``fn(*args)`` (awaited if it returns an awaitable) as a task of the runner's nursery.

        Returns the future of its outcome and the cancel scope around it (cancel it in the trio thread)."""
        token = self._token
        if token is None or self._closed:
            raise RunnerClosedError("the TrioRunner is not running (start() it or use `with TrioRunner()`)")
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_running_or_notify_cancel()  # nobody cancels it from outside; see acall
        scope = trio.CancelScope()

        async def task() -> None:
            with scope:
                try:
                    result = fn(*args)
                    if isinstance(result, Awaitable):
                        result = await result
                except BaseException as exc:
                    if isinstance(exc, trio.Cancelled):
                        _settle(fut, error=RunnerClosedError("the call was cancelled (the runner is closing)"))
                    else:
                        _settle(fut, error=exc)
                    if not isinstance(exc, Exception):
                        raise  # Cancelled and KeyboardInterrupt belong to trio
                    return
                _settle(fut, result=result)

        def spawn() -> None:
            nursery = self._nursery
            if nursery is None:
                _settle(fut, error=RunnerClosedError("the TrioRunner is closing"))
                return
            nursery.start_soon(task)

        try:
            token.run_sync_soon(spawn)
        except trio.RunFinishedError:
            raise RunnerClosedError("the TrioRunner's loop has finished") from None
        return fut, scope

    @overload
    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    @overload
    def call(self, fn: Callable[..., T], *args: Any) -> T: ...

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in the trio thread and wait for its result (an ``async def`` is awaited there).

        Blocks the calling thread; raises what ``fn`` raised. ``fn`` must not block the trio thread: pass
        coroutine functions (``producer.send``), or cheap synchronous ones (``consumer.subscribe``)."""
        self._not_in_loop_thread("call")
        return self._submit(fn, args)[0].result()

    @overload
    async def acall(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    @overload
    async def acall(self, fn: Callable[..., T], *args: Any) -> T: ...

    async def acall(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Like :meth:`call`, awaited from asyncio without blocking its event loop."""
        fut, scope = self._submit(fn, args)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            token = self._token
            if token is not None and not fut.done():
                try:
                    token.run_sync_soon(scope.cancel)
                except trio.RunFinishedError:
                    pass
            raise

    def enter(self, obj: AbstractAsyncContextManager[T]) -> T:
        """Run ``async with obj`` inside the trio thread and keep it open until :meth:`exit` or
        :meth:`close`. Returns what ``__aenter__`` returned (the object itself, for trimq's clients).

        The ``async with`` body runs as a task of the runner's nursery, so a failure of the object's own
        background tasks ends its block; the error is raised by the next :meth:`exit`/:meth:`close`."""
        self._not_in_loop_thread("enter")
        if not (hasattr(obj, "__aenter__") and hasattr(obj, "__aexit__")):
            raise TypeError(f"{type(obj).__name__} is not an async context manager (no __aenter__/__aexit__)")
        entry = _Entered(obj)
        entered: concurrent.futures.Future[Any] = concurrent.futures.Future()

        async def host() -> None:
            try:
                async with obj as value:
                    _settle(entered, result=value)
                    await entry.exit_requested.wait()
            except BaseException as exc:
                error = RunnerClosedError("the runner stopped") if isinstance(exc, trio.Cancelled) else exc
                # Failed on the way in: enter() raises it. Failed later: exit()/close() raise it.
                _settle(entered if not entered.done() else entry.exited, error=error)
                _settle(entry.exited)
                if not isinstance(exc, Exception):
                    raise
            else:
                _settle(entry.exited)

        async def start_host() -> None:
            assert self._nursery is not None
            self._nursery.start_soon(host)

        self._submit(start_host, ())[0].result()
        value = entered.result()
        with self._state_lock:
            self._entered.append(entry)
        return value  # type: ignore[no-any-return]

    def exit(self, obj: Any) -> None:
        """Leave the ``async with`` of an object entered earlier (its graceful shutdown) and wait for it.

        Raises what its ``__aexit__`` raised; ValueError if it was not entered here."""
        self._not_in_loop_thread("exit")
        with self._state_lock:
            entry = next((e for e in self._entered if e.obj is obj), None)
            if entry is None:
                raise ValueError(f"{obj!r} was not entered in this runner (or has already exited)")
            self._entered.remove(entry)
        self._request_exit(entry)
        entry.exited.result()

    def _request_exit(self, entry: _Entered) -> None:
        token = self._token
        if token is None or entry.exited.done():
            return
        try:
            token.run_sync_soon(entry.exit_requested.set)
        except trio.RunFinishedError:
            pass


def _settle(fut: concurrent.futures.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    """Complete ``fut`` unless it is already complete."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
