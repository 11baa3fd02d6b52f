"""Who may use the console, and forms that only the console's own pages can submit. Pure: no I/O.

* :class:`ConsoleAuth` — HTTP basic auth. With a token (``--auth-token``), any user name with the token as
  password (or ``Authorization: Bearer TOKEN``); else, when the console signs its requests with ACL
  credentials (``--access-key``/``--secret-key``), the access key as user name and the secret key as
  password: whoever acts through the console must know what ``trimq-admin`` itself would need. With
  neither, no login (the console then listens on loopback unless told otherwise).
* CSRF: every page sets a random session cookie (``SameSite=Strict``, ``HttpOnly``); each form carries
  ``HMAC-SHA256(server secret, cookie)``; a POST is accepted only with both, matching, and when the browser
  says it comes from the console's own origin (``Origin`` / ``Sec-Fetch-Site``). The server secret is new
  for each run of the console, so a form loaded before a restart asks to be reloaded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CSRF_COOKIE", "CSRF_FIELD", "ConsoleAuth", "csrf_token", "csrf_valid", "new_session", "same_origin"]

CSRF_COOKIE = "trimq_console_session"
CSRF_FIELD = "csrf_token"


def new_session() -> str:
    """A fresh session cookie value (128 random bits)."""
    return secrets.token_hex(16)


def csrf_token(secret: bytes, session: str) -> str:
    """The form token of ``session``: only a page the console rendered for that cookie has it."""
    return hmac.new(secret, b"csrf:" + session.encode(), hashlib.sha256).hexdigest()


def csrf_valid(secret: bytes, session: str | None, token: str | None) -> bool:
    """Whether ``token`` is the form token of ``session`` (constant-time)."""
    if not session or not token:
        return False
    return hmac.compare_digest(csrf_token(secret, session), token)


def same_origin(headers: Mapping[str, str]) -> bool:
    """False when the browser says the request comes from another site: ``Sec-Fetch-Site`` other than
    ``same-origin``/``none``, or an ``Origin`` whose host is not the ``Host`` asked. Clients that send
    neither (curl, scripts) pass: the CSRF token still has to match."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin is None:
        return True
    if origin == "null":
        return False
    _scheme, _sep, rest = origin.partition("://")
    return rest.rstrip("/") == headers.get("host", "")


@dataclass(frozen=True)
class ConsoleAuth:
    """The console's login: ``token``, else the ACL pair ``access_key``/``secret_key``, else none."""

    access_key: str = ""
    secret_key: str = ""
    token: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.token or (self.access_key and self.secret_key))

    def describe(self) -> str:
        if self.token:
            return "HTTP basic auth with the console token as password"
        if self.enabled:
            return f"HTTP basic auth as the ACL account {self.access_key} (its secret key as password)"
        return "no login"

    def allows(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value logs in (always, when no login is configured)."""
        if not self.enabled:
            return True
        if not authorization:
            return False
        scheme, _sep, value = authorization.strip().partition(" ")
        value = value.strip()
        if self.token and scheme.lower() == "bearer":
            return hmac.compare_digest(value.encode(), self.token.encode())
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        if self.token:
            return hmac.compare_digest(password.encode(), self.token.encode())
        # both compared, always: the time taken does not tell which one was wrong
        user_ok = hmac.compare_digest(user.encode(), self.access_key.encode())
        password_ok = hmac.compare_digest(password.encode(), self.secret_key.encode())
        return user_ok and password_ok
