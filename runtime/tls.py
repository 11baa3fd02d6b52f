"""Transport security for both ends of the one transport (docs/SECURITY.md): the TLS context a RemotingClient
dials with, the context and listeners a RemotingServer serves with. ACL request signing is wire format:
protocol/signature.py (the client signs, the broker verifies, with the same code).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["TlsConfigError", "client_ssl_context", "server_ssl_context", "tls_listeners"]


class TlsConfigError(ValueError):
    """A certificate, key or CA file cannot be used; the message names the file and the problem."""


def _load(what: str, path: str, action: Callable[[], object]) -> None:
    try:
        action()
    except FileNotFoundError:
        raise TlsConfigError(f"{what} {path}: no such file") from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise TlsConfigError(f"{what} {path}: {exc}") from None


def client_ssl_context(
    ca_file: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    *,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A TLS 1.2+ client context verifying servers against ``ca_file`` (the system CAs when None).

    ``cert``/``key`` (PEM) are the client certificate for servers that require one (``key`` may be None
    when ``cert`` holds both). The server's certificate must name the host part of the address dialled
    (an IP address must be in its subjectAltName) unless ``check_hostname`` is false.
    Raises TlsConfigError naming the file that cannot be used.
    """
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file:
        _load("CA file", ca_file, lambda: ctx.load_verify_locations(cafile=ca_file))
    if key and not cert:
        raise TlsConfigError("a client key was given without its certificate")
    if cert:
        _load("client certificate", cert, lambda: ctx.load_cert_chain(cert, key))
    if not check_hostname:
        ctx.check_hostname = False
    return ctx


def server_ssl_context(cert_file: str, key_file: str | None = None, ca_file: str | None = None, *,
                       require_client_cert: bool = False) -> ssl.SSLContext:
    """A TLS 1.2+ server context presenting ``cert_file``/``key_file`` (PEM); with ``require_client_cert``,
    peers must show a certificate signed by ``ca_file`` (mutual TLS). ValueError naming an unusable file."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"certificate {cert_file} / key {key_file or cert_file}: {exc}") from None
    ctx.verify_mode = ssl.CERT_NONE
    if require_client_cert:
        if not ca_file:
            raise ValueError("requiring client certificates needs a CA file to verify them with")
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"CA file {ca_file}: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def tls_listeners(listeners: list[Any], ssl_context: ssl.SSLContext) -> list[Any]:
    """Wrap TCP listeners so every accepted connection speaks TLS (the handshake runs on first read/write;
    a peer that fails it is just a broken connection)."""
    return [trio.SSLListener(lst, ssl_context, https_compatible=False) for lst in listeners]
