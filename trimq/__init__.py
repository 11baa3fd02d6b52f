"""trimq: ordered messaging for Python.

One import name over the project's layers, each a top-level folder of the repository mapped into this
package at install time (see setup.py): ``trimq.protocol`` (wire formats), ``trimq.broker`` (the broker,
its store and name server), ``trimq.client`` (the SDK) and ``trimq.spark_jobs`` (the audit).
"""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    # ``__version__`` is read from the installed metadata on first use: importing importlib.metadata costs
    # ~30 ms, paid by every client process at start-up otherwise (issue 22: start-up is CPU per message).
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("trimq")
        except PackageNotFoundError:  # running from a source tree that was never installed
            found = "0.0.0+unknown"
        globals()["__version__"] = found
        return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
