"""Client-side transport security: the TLS context for ``RemotingClient`` and ACL request signing.

Both follow docs/SECURITY.md. The signature code is protocol/signature.py, the same one the broker uses to
verify (client/ never imports broker/, both import protocol/).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from trimq.protocol.signature import ACCESS_KEY, SIGNATURE, calc_signature, sign_command


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


# ACL request signatures: one implementation, shared with the broker (protocol/signature.py).
request_signature = calc_signature
sign_request = sign_command


__all__ = ["ACCESS_KEY", "SIGNATURE", "TlsConfigError", "client_ssl_context", "request_signature", "sign_request"]
