"""The marker a member leaves in its data directory once it holds a role's data
(meta: ``meta-member.json``, see _member_guard; tables: ``table-member.json``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

MARKER_NAME = "meta-member.json"


def marker_path(host_dir: Path) -> Path:
    """Where a Raft host on ``host_dir`` (a node's ``data/raft``) keeps the marker."""
    return host_dir.parent / MARKER_NAME


def write_marker(path: Path, node_id: int) -> None:
    """Write the marker ``path`` once, durably (temp file, fsync, rename, fsync the
    directory): it is what tells a lost data directory from a first start."""
    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps({"node_id": node_id, "since": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
