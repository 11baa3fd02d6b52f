"""The web console (``trimq-admin serve``): a read-mostly view of a trimq cluster in the browser, in the manner
of apache/rocketmq-dashboard — cluster and brokers, topics with their queues and offsets, consumer groups with
members, per-queue owner, lock and lag, blocked orderly queues, dead letters with resend, message lookup by
key or id — and the operator's actions (resend, offset reset with a plan first, skip) as forms.

Server-rendered HTML (Jinja2 templates, autoescaped) over a small trio HTTP server (h11): no script, no
CDN, nothing loaded from elsewhere, so it works offline. Every page asks the cluster through one
:class:`~trimq.client.admin.Admin`, as ``trimq-admin`` does. docs/ADMIN.md ("Web console") describes the
pages, the login and the CSRF protection.

::

    async with open_admin("127.0.0.1:9876") as admin:
        await serve_console(admin, "127.0.0.1", 8080)
"""

from __future__ import annotations

import trio

from trimq.client.admin import Admin
from trimq.tools.console.app import Console, ConsoleOptions, Notice
from trimq.tools.console.http import serve_http
from trimq.tools.console.security import ConsoleAuth

__all__ = ["Console", "ConsoleAuth", "ConsoleOptions", "Notice", "serve_console"]


async def serve_console(admin: Admin, host: str, port: int, options: ConsoleOptions | None = None, *,
                        task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the console of ``admin``'s cluster on ``host:port`` (0: any free port) until cancelled;
    ``task_status.started((host, port))`` once it listens."""
    console = Console(admin, options)
    await serve_http(console.handle, host, port, task_status=task_status)
