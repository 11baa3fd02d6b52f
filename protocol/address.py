"""``HOST:PORT`` address strings, as used on command lines and in route data."""

from __future__ import annotations


def parse_address(addr: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` for IPv6). Raises ValueError saying what is wrong."""
    if not isinstance(addr, str) or ":" not in addr:
        raise ValueError(f"address {addr!r} must look like HOST:PORT")
    host, _, port_s = addr.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"address {addr!r} has no host")
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"address {addr!r}: port {port_s!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"address {addr!r}: port {port} is outside 0..65535")
    return host, port


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
