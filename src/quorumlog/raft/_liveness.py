"""Process liveness for quiesced groups: which peer processes answer, in ticks.

A quiesced group sends nothing and its followers' election timers stand
still, so nothing inside a core notices that its leader's process died. A
driver (``RaftHost``, the simulator's host) keeps one :class:`PeerLiveness`
per process: every message from a peer process counts as a sign of life
(the hosts send at least one request to each peer every tick, empty when
there is nothing else), and a peer silent for ``dead_after_ticks`` ticks is
dead. Each change (dead, or alive again) is handed to every group's
``RaftNode.peer_liveness_changed``, which wakes the quiesced ones it
concerns. Sans-IO, like the core: time is the driver's ticks.
"""

from __future__ import annotations

from collections.abc import Iterable

from quorumlog.errors import UsageError


class PeerLiveness:
    """Ticks since each known peer process was last heard from."""

    __slots__ = ("_dead", "_dead_after_ticks", "_pending", "_sent", "_silent_ticks")

    def __init__(self, dead_after_ticks: int) -> None:
        if dead_after_ticks < 1:
            raise UsageError(f"dead_after_ticks must be >= 1, got {dead_after_ticks}")
        self._dead_after_ticks = dead_after_ticks
        self._silent_ticks: dict[int, int] = {}  # bounded by the peers ever heard
        self._dead: set[int] = set()
        self._pending: set[int] = set()  # changes not yet returned by tick()
        self._sent: set[int] = set()  # peers sent something since beat_targets()

    def heard(self, peer: int) -> None:
        """A message from ``peer``'s process arrived."""
        self._silent_ticks[peer] = 0
        if peer in self._dead:
            self._dead.discard(peer)
            self._pending.add(peer)

    def sent(self, peer: int) -> None:
        """Something left for ``peer``'s process: it needs no beat this tick."""
        self._sent.add(peer)

    def beat_targets(self, peers: Iterable[int]) -> list[int]:
        """Of ``peers``, those sent nothing since the last call: send each an
        empty message, so that a peer hears from this process every tick."""
        quiet = sorted(set(peers) - self._sent)
        self._sent.clear()
        return quiet

    def is_alive(self, peer: int) -> bool:
        """Heard from, and not silent for ``dead_after_ticks`` since."""
        return peer in self._silent_ticks and peer not in self._dead

    def tick(self) -> set[int]:
        """Count one tick; return the peers that died or came back since the last call."""
        limit = self._dead_after_ticks
        silent = self._silent_ticks
        for peer, ticks in silent.items():
            silent[peer] = ticks + 1
            if ticks + 1 >= limit and peer not in self._dead:
                self._dead.add(peer)
                self._pending.add(peer)
        changed, self._pending = self._pending, set()
        return changed
