"""The name server's settings (``[namesrv]`` table of a TOML file, ``TRIMQ_NAMESRV_*`` environment variables,
``trimq-namesrv`` flags; docs/CONFIGURATION.md), declared with the runtime's settings machinery."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trimq.namesrv.routes import BROKER_CHANNEL_EXPIRED_MS
from trimq.protocol.address import parse_address
from trimq.protocol.frame import DEFAULT_MAX_FRAME_BYTES
from trimq.runtime.settings import ConfigError, setting, validate_dataclass

__all__ = ["NamesrvConfig"]


@dataclass
class NamesrvConfig:
    """Settings of a standalone name server (``[namesrv]`` section of a TOML file, ``TRIMQ_NAMESRV_*`` env)."""

    #: Environment variables: ``TRIMQ_NAMESRV_`` + the setting's name in capitals (the broker's are
    #: ``TRIMQ_BROKER_*``, the clients' ``TRIMQ_CLIENT_*``).
    ENV_PREFIX: ClassVar[str] = "TRIMQ_NAMESRV_"

    listen: str = setting("127.0.0.1:9876", "HOST:PORT to listen on; port 0 picks a free port")
    broker_channel_expired_ms: int = setting(BROKER_CHANNEL_EXPIRED_MS, "drop a broker silent this long",
                                             min=1_000, max=3_600_000)
    scan_not_active_broker_interval_ms: int = setting(10_000, "how often silent brokers are looked for",
                                                      min=100, max=600_000)
    max_frame_bytes: int = setting(DEFAULT_MAX_FRAME_BYTES, "largest frame accepted, bytes", min=1024,
                                   max=2**31 - 1)
    max_connections: int = setting(10_000, "concurrent connections", min=1, max=1_000_000)
    shutdown_grace_ms: int = setting(2_000, "on SIGTERM, how long in-flight requests may finish", min=0,
                                     max=600_000)
    metrics_port: int = setting(-1, "Prometheus metrics HTTP port; 0 = any free port (logged as metrics.started), "
                                "-1 = off", min=0, max=65535, also=(-1,))
    metrics_host: str = setting("127.0.0.1", "address the metrics endpoint binds")
    tls_cert_file: str = setting("", "PEM certificate the name server presents; set = peers must use TLS")
    tls_key_file: str = setting("", "PEM private key of tls_cert_file (empty: the key is in that file)")
    tls_ca_file: str = setting("", "PEM CA bundle verifying client certificates (with tls_require_client_cert)")
    tls_require_client_cert: bool = setting(False, "mutual TLS: refuse peers without a certificate from tls_ca_file")

    def validate(self) -> NamesrvConfig:
        validate_dataclass(self)
        if self.tls_key_file and not self.tls_cert_file:
            raise ConfigError(f"tls_key_file = {self.tls_key_file!r}: needs tls_cert_file too")
        try:
            parse_address(self.listen)
        except ValueError as exc:
            raise ConfigError(f"listen = {self.listen!r}: {exc}") from None
        return self
