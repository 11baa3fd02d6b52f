"""``trimq-broker``: run a broker daemon (optionally with the name server in the same process), RocketMQ's
``mqbroker``. The broker itself is :class:`trimq.broker.broker.Broker`; this module is only its command line."""

from __future__ import annotations

import functools
import gc
import json
import sys
from typing import Any

import click
import trio

from trimq.broker.config import BrokerConfig
from trimq.runtime.logs import configure_logging
from trimq.runtime.settings import ConfigError, describe_settings, load_settings
from trimq.tools.common import CONTEXT, LOG_FORMATS, LOG_LEVELS, run_until_signalled, start_error, version_option


@click.command(context_settings=CONTEXT)
@version_option("trimq-broker")
@click.option("--listen", help="HOST:PORT to listen on (default 127.0.0.1:10911; port 0 = any free port).")
@click.option("--store", "store_dir", help="Store directory (default ./store).")
@click.option("--namesrv", "namesrv_addr", help="Name server HOST:PORT (several separated by ';').")
@click.option("--embedded-namesrv", is_flag=True, default=None, help="Serve the name server on this broker's port.")
@click.option("--broker-name", help="Broker name (default broker-a).")
@click.option("--cluster-name", help="Cluster name (default DefaultCluster).")
@click.option("--flush", type=click.Choice(["async", "sync"]), help="ASYNC_FLUSH (default) or SYNC_FLUSH.")
@click.option("--role", type=click.Choice(["async_master", "sync_master", "slave"], case_sensitive=False),
              help="broker_role: ASYNC_MASTER (default), SYNC_MASTER or SLAVE (docs/OPERATIONS.md).")
@click.option("--broker-id", type=int, help="broker_id: 0 for a master (default), > 0 for a slave.")
@click.option("--metrics-port", type=int,
              help="Serve Prometheus metrics on this port (0 = any free port, logged; default off).")
@click.option("--tls-cert", "tls_cert_file", type=click.Path(dir_okay=False),
              help="PEM certificate to serve TLS with (clients must then use TLS).")
@click.option("--tls-key", "tls_key_file", type=click.Path(dir_okay=False),
              help="PEM private key of --tls-cert (if not in the same file).")
@click.option("--tls-ca", "tls_ca_file", type=click.Path(dir_okay=False),
              help="PEM CA bundle verifying client certificates (mutual TLS).")
@click.option("--tls-require-client-cert", "tls_require_client_cert", is_flag=True, default=None,
              help="Mutual TLS: refuse clients without a certificate signed by --tls-ca.")
@click.option("--acl", "acl_file", type=click.Path(dir_okay=False),
              help="ACL TOML file: requests must be signed by its accounts (docs/SECURITY.md).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML configuration file.")
@click.option("--print-config", is_flag=True, help="Print the effective configuration and exit.")
@click.option("--log-format", type=LOG_FORMATS, default="auto", show_default=True)
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True)
def main(listen: str | None, store_dir: str | None, namesrv_addr: str | None, embedded_namesrv: bool | None,
         broker_name: str | None, cluster_name: str | None, flush: str | None, role: str | None,
         broker_id: int | None, metrics_port: int | None,
         tls_cert_file: str | None, tls_key_file: str | None, tls_ca_file: str | None,
         tls_require_client_cert: bool | None, acl_file: str | None,
         config_file: str | None, print_config: bool, log_format: str, log_level: str) -> None:
    """Run a trimq broker until SIGINT/SIGTERM (graceful stop, exit status 0).

    Settings come from defaults, then --config FILE (TOML), then TRIMQ_BROKER_* environment variables, then
    flags.
    The address actually listened on is logged and written to STORE/broker.addr.
    """
    configure_logging(log_format, log_level)
    overrides = {
        "listen": listen, "store_dir": store_dir, "namesrv_addr": namesrv_addr,
        "embedded_namesrv": embedded_namesrv, "broker_name": broker_name, "cluster_name": cluster_name,
        "flush_disk_type": {"async": "ASYNC_FLUSH", "sync": "SYNC_FLUSH"}.get(flush or ""),
        "broker_role": role.upper() if role else None, "broker_id": broker_id,
        "metrics_port": metrics_port,
        "tls_cert_file": tls_cert_file, "tls_key_file": tls_key_file, "tls_ca_file": tls_ca_file,
        "tls_require_client_cert": tls_require_client_cert, "acl_file": acl_file,
    }
    try:
        config = load_settings(BrokerConfig, config_file=config_file, overrides=overrides, section="broker")
    except ConfigError as exc:
        click.echo(f"trimq-broker: invalid configuration: {exc}", err=True)
        sys.exit(2)
    if print_config:
        click.echo(json.dumps({s["name"]: s["value"] for s in describe_settings(config)}, indent=2))
        return
    from trimq.broker.broker import Broker

    try:
        broker = Broker(config)  # reads the TLS files and the ACL file: errors name the file and the field
    except ConfigError as exc:
        click.echo(f"trimq-broker: invalid configuration: {exc}", err=True)
        sys.exit(2)
    try:
        trio.run(run_until_signalled, functools.partial(_run_frozen_after_start, broker), broker.shutdown)
    except (OSError, BaseExceptionGroup) as exc:
        err = start_error(exc)
        if err is None:
            raise
        click.echo(f"trimq-broker: cannot start: {err}", err=True)
        sys.exit(1)


async def _run_frozen_after_start(broker: Any) -> None:
    """``broker.run()``; once it serves, ``gc.freeze()``: what start-up made (modules, settings, the recovered
    tables) lives as long as the process, and a full collection that walks it pauses the whole broker (16 ms
    seen on the benchmark, a p999 stall for every message in flight, issue 22). Only the daemon does this: an
    embedded broker leaves its host process's collector alone."""

    async def freeze() -> None:
        await broker.started.wait()
        gc.freeze()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(freeze)
        await broker.run()
        nursery.cancel_scope.cancel()
