"""``trimq-admin serve``: run the console until SIGINT/SIGTERM (the click command is in :mod:`trimq.tools.admin`)."""

from __future__ import annotations

import ipaddress
import sys

import click
import trio

from trimq.client.admin import open_admin
from trimq.client.config import ClientConfig, ConfigError
from trimq.protocol.address import format_address, parse_address
from trimq.tools.common import leaf, run_until_signalled, start_error
from trimq.tools.console import serve_console
from trimq.tools.console.app import ConsoleOptions
from trimq.tools.console.security import ConsoleAuth

__all__ = ["serve"]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(*, namesrv: str | None, access_key: str | None, secret_key: str | None, tls: bool,
          tls_ca_file: str | None, timeout_ms: int, listen: str, auth_token: str | None, read_only: bool) -> None:
    """Serve the console on ``listen`` for the cluster of ``namesrv``; prints its URL on stdout once it
    listens, runs until SIGINT/SIGTERM. Usage errors raise click exceptions; a port that cannot be bound
    exits 1 with the reason."""
    if not namesrv:
        raise click.UsageError("no name server: pass --namesrv HOST:PORT (or set TRIMQ_CLIENT_NAMESRV_ADDR)")
    if bool(access_key) != bool(secret_key):
        raise click.UsageError("--access-key and --secret-key go together")
    try:
        host, port = parse_address(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    try:
        config = ClientConfig(namesrv_addr=namesrv, access_key=access_key or "", secret_key=secret_key or "",
                              tls_enable=bool(tls or tls_ca_file), tls_ca_file=tls_ca_file or "")
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    auth = ConsoleAuth(access_key or "", secret_key or "", auth_token or "")
    options = ConsoleOptions(auth=auth, read_only=read_only, namesrv=namesrv)
    if not auth.enabled and not read_only and not _loopback(host):
        click.echo(f"trimq-admin: warning: the console on {listen} takes actions (resend, reset, skip) from anyone "
                   f"who reaches it: set --auth-token (or ACL credentials) or --read-only", err=True)
    scope = trio.CancelScope()

    async def runner() -> None:
        with scope:
            async with open_admin(config, timeout_ms=timeout_ms) as admin, trio.open_nursery() as nursery:
                bound_host, bound_port = await nursery.start(serve_console, admin, host, port, options)
                mode = "read-only" if read_only else "actions on"
                click.echo(f"trimq-admin: console on http://{format_address(bound_host, bound_port)}/ "
                           f"(name server {namesrv}; login: {auth.describe()}; {mode})")
                sys.stdout.flush()

    try:
        trio.run(run_until_signalled, runner, scope.cancel)
    except BaseException as raised:
        error = start_error(raised)
        if error is not None:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            click.echo(f"trimq-admin: error: cannot serve the console on {listen}: {reason}", err=True)
            sys.exit(1)
        if isinstance(leaf(raised), KeyboardInterrupt):
            sys.exit(130)
        raise
