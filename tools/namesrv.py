"""``trimq-namesrv``: run a standalone name server until SIGINT/SIGTERM (RocketMQ's ``mqnamesrv``)."""

from __future__ import annotations

import json
import sys

import click
import trio

from trimq.runtime.logs import configure_logging
from trimq.runtime.settings import ConfigError, describe_settings, load_settings
from trimq.tools.common import CONTEXT, LOG_FORMATS, LOG_LEVELS, run_until_signalled, start_error, version_option


@click.command(context_settings=CONTEXT)
@version_option("trimq-namesrv")
@click.option("--listen", help="HOST:PORT to listen on (default 127.0.0.1:9876; port 0 = any free port).")
@click.option("--metrics-port", type=int,
              help="Serve Prometheus metrics on this port (0 = any free port, logged; default off).")
@click.option("--tls-cert", "tls_cert_file", help="PEM certificate to serve TLS with (docs/SECURITY.md).")
@click.option("--tls-key", "tls_key_file", help="PEM private key of --tls-cert (if not in that file).")
@click.option("--tls-ca", "tls_ca_file", help="PEM CA bundle verifying client certificates.")
@click.option("--tls-require-client-cert", is_flag=True, default=None, help="Mutual TLS: require client certificates.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML file ([namesrv] section).")
@click.option("--print-config", is_flag=True, help="Print the effective configuration and exit.")
@click.option("--log-format", type=LOG_FORMATS, default="auto", show_default=True)
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True)
def main(listen: str | None, metrics_port: int | None, tls_cert_file: str | None, tls_key_file: str | None,
         tls_ca_file: str | None, tls_require_client_cert: bool | None, config_file: str | None, print_config: bool,
         log_format: str, log_level: str) -> None:
    """Run a trimq name server: brokers register here, clients ask it for topic routes.

    Settings come from defaults, then --config FILE (TOML, [namesrv] section), then TRIMQ_NAMESRV_*
    environment variables, then flags. SIGINT/SIGTERM stop it gracefully (exit status 0). It writes
    nothing to disk.
    """
    from trimq.namesrv.config import NamesrvConfig
    from trimq.namesrv.service import serve_namesrv

    configure_logging(log_format, log_level)
    try:
        config = load_settings(NamesrvConfig, config_file=config_file, env_prefix="TRIMQ_NAMESRV_",
                               overrides={"listen": listen, "metrics_port": metrics_port,
                                          "tls_cert_file": tls_cert_file, "tls_key_file": tls_key_file,
                                          "tls_ca_file": tls_ca_file,
                                          "tls_require_client_cert": tls_require_client_cert},
                               section="namesrv")
    except ConfigError as exc:
        click.echo(f"trimq-namesrv: invalid configuration: {exc}", err=True)
        sys.exit(2)
    if print_config:
        click.echo(json.dumps({s["name"]: s["value"] for s in describe_settings(config)}, indent=2))
        return
    holder: dict[str, object] = {}

    async def runner() -> None:
        async with trio.open_nursery() as nursery:
            holder["ns"] = await nursery.start(serve_namesrv, config)

    def shutdown() -> None:
        ns = holder.get("ns")
        if ns is not None:
            ns.server.shutdown()  # type: ignore[attr-defined]

    try:
        trio.run(run_until_signalled, runner, shutdown)
    except (OSError, BaseExceptionGroup) as exc:
        err = start_error(exc)
        if err is None:
            raise
        click.echo(f"trimq-namesrv: cannot start: {err}", err=True)
        sys.exit(1)
