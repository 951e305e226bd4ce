"""The marker a meta member leaves next to its Raft directory (see _member_guard)."""

from __future__ import annotations

import json
import time
from pathlib import Path

MARKER_NAME = "meta-member.json"


def marker_path(host_dir: Path) -> Path:
    """Where a Raft host on ``host_dir`` (a node's ``data/raft``) keeps the marker."""
    return host_dir.parent / MARKER_NAME


def write_marker(host_dir: Path, node_id: int) -> None:
    """Record that this node hosts the meta group on this data directory (once)."""
    path = marker_path(host_dir)
    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"node_id": node_id, "since": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
    tmp.replace(path)
