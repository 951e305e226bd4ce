"""quorumlog: replicated durable logs and key-value tables, fed to Spark.

Public API of the top-level package: the version and the error tree.
Components live in their own packages (``quorumlog.wal``, ``quorumlog.raft``, ...).
"""

from typing import Any

from quorumlog.errors import InvariantViolation, QuorumlogError, invariant


def __getattr__(name: str) -> Any:
    """``__version__`` is read from the installed metadata on first use:
    importlib.metadata costs about 50 ms, which every CLI command paid."""
    if name != "__version__":
        raise AttributeError(f"module 'quorumlog' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("quorumlog")
    except PackageNotFoundError:  # running from a source tree without install
        found = "0.0.0+unknown"
    globals()["__version__"] = found
    return found

__all__ = ["InvariantViolation", "QuorumlogError", "__version__", "invariant"]
