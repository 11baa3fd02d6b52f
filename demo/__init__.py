"""Demonstrations of trimq that run on one machine with nothing installed but trimq itself.

* ``python -m trimq.demo`` (``make demo``): :mod:`trimq.demo.orderly_takeover`, orderly consumption with a
  graceful takeover, checked (every message once, per-key order, takeover under a second).
"""
