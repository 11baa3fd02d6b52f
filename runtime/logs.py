"""structlog set-up shared by every trimq process, and a rate limiter for repeated warnings.

Imports no trio and does no I/O beyond configuring where logs go.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import structlog

_configured = False


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """Configure structlog once per process: colourful key=value on a TTY, JSON lines otherwise or when
    ``fmt == "json"``. Logs go to stderr. Calling it again reconfigures (the CLI's flags win)."""
    global _configured
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"log format {fmt!r} must be one of auto, json, console")
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        raise ValueError(f"log level {level!r} must be one of debug, info, warning, error")
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if use_json:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _configured = True


def get_logger(name: str) -> Any:
    """A structlog logger bound with ``component=name``. It stays lazy, so a module-level logger follows a
    ``configure_logging`` made later (e.g. by the CLI's flags)."""
    return structlog.get_logger(component=name)


class RateLimiter:
    """Lets an event through at most once per ``interval_ms`` per key; counts what it suppressed.

    Pure: the caller passes the time. Used so a stuck queue or a flood of fenced updates logs a line every
    few seconds with a count, instead of one line per occurrence.
    """

    def __init__(self, interval_ms: int = 10_000, max_keys: int = 10_000) -> None:
        self.interval_ms = interval_ms
        self.max_keys = max_keys
        self._last: dict[Any, int] = {}
        self._suppressed: dict[Any, int] = {}

    def allow(self, key: Any, now_ms: int) -> int | None:
        """None if suppressed; otherwise how many were suppressed since the last one let through."""
        last = self._last.get(key)
        if last is not None and now_ms - last < self.interval_ms:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        if len(self._last) >= self.max_keys and key not in self._last:
            self._last.clear()  # bound memory; worst case an extra log line
            self._suppressed.clear()
        self._last[key] = now_ms
        return self._suppressed.pop(key, 0)


def log_rate_limited(
    limiter: RateLimiter, key: Any, now_ms: int, emit: Callable[..., Any], event: str, **fields: Any
) -> None:
    """Emit ``event`` through ``emit`` unless ``limiter`` suppresses it; adds ``suppressed=N``."""
    n = limiter.allow(key, now_ms)
    if n is not None:
        emit(event, suppressed=n, **fields)
