"""The transcript of a run: readable lines and a hash over all of them.

With ``keep_lines`` off (the default for bulk runs) nothing is formatted;
with it on, every event becomes a line like ``t=120 1->2 APP term=3 index=7
entries=2`` and the SHA-256 over all lines identifies the run: the same seed
must give the same hash, bit for bit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from quorumlog.errors import invariant

TRACE_LINES_MAX = 5_000_000
"""Lines one transcript keeps before the run is declared broken."""


@dataclass(slots=True)
class Tracer:
    keep_lines: bool = False
    lines: list[str] = field(default_factory=list)
    _hash: Any = field(default_factory=hashlib.sha256)

    @property
    def enabled(self) -> bool:
        return self.keep_lines

    def event(self, now_ms: int, text: str) -> None:
        if not self.keep_lines:
            return
        invariant(len(self.lines) < TRACE_LINES_MAX, f"trace exceeds {TRACE_LINES_MAX} lines")
        line = f"t={now_ms} {text}"
        self.lines.append(line)
        self._hash.update(line.encode())
        self._hash.update(b"\n")

    def digest(self) -> str:
        return str(self._hash.hexdigest())
