"""quorumlog: replicated durable logs and key-value tables, fed to Spark.

Public API of the top-level package: the version and the error tree.
Components live in their own packages (``quorumlog.wal``, ``quorumlog.raft``, ...).
"""

from importlib.metadata import PackageNotFoundError, version

from quorumlog.errors import InvariantViolation, QuorumlogError, invariant

try:
    __version__ = version("quorumlog")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["InvariantViolation", "QuorumlogError", "__version__", "invariant"]
