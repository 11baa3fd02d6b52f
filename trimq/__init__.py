"""trimq: ordered messaging for Python.

One import name over the project's layers, each a top-level folder of the repository mapped into this
package at install time (see setup.py): ``trimq.protocol`` (wire formats), ``trimq.broker`` (the broker,
its store and name server), ``trimq.client`` (the SDK) and ``trimq.spark_jobs`` (the audit).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trimq")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
