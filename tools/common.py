"""What every ``trimq-*`` command shares: ``--version``, the logging flags, one-line errors with an exit
status, the progress line, and the signal handling of the two daemons.

Only the tools import click; the SDK (``trimq.client``) and the daemons' library code never do.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import click
import trio

import trimq
from trimq.broker.store.atomic import StateFileError
from trimq.client.config import ConfigError, load_client_settings
from trimq.client.errors import TrimqClientError
from trimq.runtime.logs import get_logger

__all__ = [
    "CONTEXT",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "Progress",
    "exit_on_error",
    "fail",
    "leaf",
    "load_client_config",
    "run_until_signalled",
    "start_error",
    "version_option",
]

log = get_logger("trimq.tools")

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
"""click context settings of every command: ``-h`` is ``--help``, wide help text."""
LOG_FORMATS = click.Choice(["auto", "json", "console"])
LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"])


def version_option(prog: str) -> Callable[[F], F]:
    """``--version``: print ``PROG VERSION`` (the installed trimq's version) and exit 0."""
    return click.version_option(trimq.__version__, "--version", prog_name=prog, message="%(prog)s %(version)s")


def fail(tool: str, text: str, status: int = 2) -> NoReturn:
    """``TOOL: TEXT`` on stderr, then exit with ``status``."""
    click.echo(f"{tool}: {text}", err=True)
    sys.exit(status)


def leaf(exc: BaseException) -> BaseException:
    """The one real error inside nested exception groups (trio nurseries wrap what their tasks raise)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def exit_on_error(tool: str, exc: BaseException) -> NoReturn:
    """A clear one-line error and exit status 1 for expected failures; anything else propagates."""
    error = leaf(exc)
    if isinstance(error, click.ClickException):
        fail(tool, error.format_message(), 1)
    if isinstance(error, TrimqClientError | ConfigError | OSError):
        fail(tool, f"{type(error).__name__}: {error}", 1)
    raise exc


def load_client_config(tool: str, cls: type[Any], config_file: str | None, section: str,
                       overrides: dict[str, Any]) -> Any:
    """A client config from defaults < ``--config`` [section] < TRIMQ_CLIENT_* environment < flags; a bad one
    exits 2 with the reason."""
    try:
        return load_client_settings(cls, config_file=config_file, section=section, overrides=overrides)
    except (ConfigError, TypeError) as exc:
        fail(tool, f"invalid configuration: {exc}")


class Progress:
    """``\\r``-rewritten progress on stderr, only when stderr is a terminal (or when forced)."""

    def __init__(self, total: int, label: str, enabled: bool | None = None) -> None:
        self.total = total
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.start = time.monotonic()
        self._shown = False

    def show(self, done: int, failed: int = 0) -> None:
        if not self.enabled:
            return
        elapsed = max(time.monotonic() - self.start, 1e-6)
        rate = done / elapsed
        width = 28
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        eta = "   0s" if done >= self.total else f"{(self.total - done) / rate:5.0f}s" if rate > 0 else "    ?"
        extra = f" failed {failed}" if failed else ""
        sys.stderr.write(f"\r{self.label} [{bar}] {done}/{self.total} {frac:6.1%} {rate:8.0f} msg/s eta {eta}{extra}")
        sys.stderr.flush()
        self._shown = True

    def finish(self, done: int, failed: int = 0) -> None:
        if self.enabled:
            self.show(done, failed)
            if self._shown:
                sys.stderr.write("\n")
                sys.stderr.flush()


# --- the daemons ---------------------------------------------------------------------------------------


def start_error(exc: BaseException) -> OSError | StateFileError | None:
    """What stopped the daemon, found inside the nursery exception groups, if it is a reason and not a bug: an
    OSError (a port in use, a store locked by another broker, a missing segment) or a state file the broker
    will not start without (``topics.json`` that is not JSON, ...). Reported as one line, not a traceback."""
    error = leaf(exc)
    return error if isinstance(error, OSError | StateFileError) else None


async def run_until_signalled(runner: Callable[[], Awaitable[Any]], shutdown: Callable[[], Any]) -> None:
    """Run ``runner()`` and turn SIGINT/SIGTERM into ``shutdown()`` (a graceful stop)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    log.info("signal.received", signal=signal.Signals(signum).name)
                    shutdown()
                    return

            nursery.start_soon(watch)
            await runner()
            nursery.cancel_scope.cancel()
