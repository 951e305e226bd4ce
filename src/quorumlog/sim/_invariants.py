"""Raft safety invariants, checked incrementally after every step of a run.

The checker sees what every node persists, sends, applies and reports, and
keeps just enough global state to check each event in time proportional to
the event (never a scan of every log after every step):

``election-safety``
    At most one leader per term (over every node, removed ones included).
``log-matching``
    Two entries with the same index and term hold the same payload and follow
    an entry of the same term. Checked whenever a node persists entries,
    against a table keyed by (index, term); by induction the whole prefixes
    then match.
``committed-entry-lost``
    No node ever replaces a committed entry it holds (one at or below its own
    commit index, or one equal to the cluster's committed entry there) by a
    different entry or a truncation. An index counts as committed for the
    cluster as soon as any node applies it. (Appending a *different* entry at
    an index committed elsewhere is legal: an old leader cut off from the
    others does so, and its entry can never commit.)
``leader-completeness``
    A node that becomes leader holds every entry committed so far (the part
    of its log not covered by its snapshot is compared entry by entry).
``state-machine-safety``
    Every node applies the same entry at the same index, and after applying
    index i its state digest equals every other node's digest at i.
``snapshot-safety``
    An installed snapshot at index i carries the digest the log produces at i.
``commit-monotonic`` / ``applied-monotonic`` / ``epoch-monotonic``
    Within one incarnation of a node (between restarts) its commit index,
    applied index and epoch never go back, and applied <= commit. Across a
    crash the commit index restarts from the durable hard state and the
    applied index from the durable snapshot; it may therefore be lower than
    before the crash (the commit index is not fsynced on its own, as in etcd),
    but never below the durable snapshot's index, and everything re-applied is
    checked against the committed entries again.
``term-durable`` / ``vote-durable`` / ``acknowledged-entries-durable``
    What a node promises in a message is fsynced before the message leaves,
    and survives its crash: its fsynced term is at least every term it sends
    (pre-vote messages excepted), its fsynced vote is the vote it grants, and
    its fsynced log holds every entry it acknowledges to a leader (APP_RESP).
    Checked when each message is sent (against what the simulated disk has
    synced), and again after a restart against what the restarted core
    believes (its term, vote and log, and every entry it knew committed).
    These catch "answered before persisting" and "forgot its vote" bugs
    directly, without waiting for a second leader or a lost entry to follow.
``leader-commits-current-term``
    A leader advances its commit index only to an entry of its own term (Raft
    paper 5.4.2: older entries are never committed by counting replicas, they
    commit with a newer one). This catches the "commit by count" bug as soon as
    it acts, not only in the rare runs where Figure 8 then loses the entry.
``epoch-agreement``
    The group epoch is a function of the applied log (docs/raft.md): every
    node reports the same epoch at the same applied index.
``term-monotonic``
    Within one incarnation a node's term never decreases (across a crash,
    ``term-durable`` is what counts: a term nobody heard of may be forgotten).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, NoReturn

from quorumlog.errors import InvariantViolation
from quorumlog.raft import Entry, EntryType, HardState, Message, MessageType, Snapshot


class SimInvariantViolation(InvariantViolation):
    """A safety or liveness property of the system under test does not hold."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.detail = detail


def fail(name: str, detail: str) -> NoReturn:
    """Report a violated invariant. Callers test the condition first, so the
    detail message is only formatted when something is actually wrong."""
    raise SimInvariantViolation(name, detail)


EntryKey = tuple[int, EntryType, bytes]
"""What makes an entry itself: (term, type, data)."""

_NOT_DURABLE_TERM_TYPES = frozenset({MessageType.PRE_VOTE, MessageType.PRE_VOTE_RESP})


def _key(entry: Entry) -> EntryKey:
    return (entry.term, entry.type, entry.data)


def _show(entry: Entry) -> str:
    return f"{entry.term}/{entry.index} {entry.type.name} {entry.data[:40]!r}"


@dataclass(slots=True)
class NodeTrack:
    """What the checker remembers about one node (one per node id)."""

    incarnation: int = 0
    term: int = 0
    commit: int = 0
    applied: int = 0
    epoch: int = 0
    # Promises made in messages since the last crash, checked after the next one.
    term_sent: int = 0
    vote_granted: tuple[int, int] | None = None  # (term, candidate)
    acked_index: int = 0
    leader_term: int = 0  # the term this node was leader in at its last step, else 0


class DurableView(NamedTuple):
    """What a node's disk holds when it sends a message."""

    synced_hard_state: HardState
    unsynced_from_index: int  # lowest log index written but not fsynced; 0: none
    stored_last_index: int  # last index written to storage (synced or not)


@dataclass(frozen=True, slots=True)
class DurabilityPromise:
    """Taken at a crash from the node's in-memory state: what must survive it."""

    term_sent: int
    vote_granted: tuple[int, int] | None
    entries: dict[int, int]  # index -> term, up to max(acked, commit)


@dataclass(slots=True)
class RaftInvariants:
    """Incremental checker; the simulator calls ``on_*`` as events happen."""

    leaders: dict[int, int] = field(default_factory=dict)  # term -> node
    committed: dict[int, EntryKey] = field(default_factory=dict)
    committed_max: int = 0
    entries_seen: dict[tuple[int, int], tuple[EntryType, bytes, int]] = field(
        default_factory=dict
    )  # (index, term) -> (type, data, term of index-1)
    digests: dict[int, bytes] = field(default_factory=dict)  # index -> state digest
    epochs: dict[int, int] = field(default_factory=dict)  # applied index -> group epoch
    nodes: dict[int, NodeTrack] = field(default_factory=dict)
    checks: int = 0

    def track(self, node: int) -> NodeTrack:
        found = self.nodes.get(node)
        if found is None:
            found = self.nodes[node] = NodeTrack()
        return found

    # -- persisting --------------------------------------------------------------

    def on_persist_entries(
        self, node: int, entries: list[Entry], prev_term: int, replaced: list[Entry]
    ) -> None:
        """``entries`` are about to be stored after an entry of term ``prev_term``,
        replacing the stored ``replaced`` (the old suffix from ``entries[0].index``)."""
        track = self.track(node)
        if entries and entries[0].index <= track.acked_index:
            track.acked_index = entries[0].index - 1  # legitimately replaced suffix
        if replaced:
            self._check_replaced(node, track, entries, replaced)
        for entry in entries:
            self.checks += 1
            seen = self.entries_seen.setdefault(
                (entry.index, entry.term), (entry.type, entry.data, prev_term)
            )
            if seen != (entry.type, entry.data, prev_term):
                fail(
                    "log-matching",
                    f"node {node} stores {_show(entry)} after term {prev_term}, but another "
                    f"node stored {entry.term}/{entry.index} as {seen[0].name} {seen[1][:40]!r} "
                    f"after term {seen[2]}",
                )
            prev_term = entry.term

    def _check_replaced(
        self, node: int, track: NodeTrack, entries: list[Entry], replaced: list[Entry]
    ) -> None:
        """A stored entry that is committed must never be replaced by a different one.

        (A stale node may well *append* a different entry at an index committed
        elsewhere - an old leader cut off from the others does - but it can never
        have held the committed entry there and lose it.)
        """
        incoming = {entry.index: entry for entry in entries}
        for old in replaced:
            new = incoming.get(old.index)
            if new is not None and _key(new) == _key(old):
                continue
            self.checks += 1
            committed = self.committed.get(old.index)
            if committed == _key(old) or old.index <= track.commit:
                fail(
                    "committed-entry-lost",
                    f"node {node} replaces its committed entry {_show(old)} (its commit index "
                    f"is {track.commit}) with "
                    + (_show(new) if new is not None else "nothing (log truncated)"),
                )

    # -- sending -----------------------------------------------------------------

    def on_send(self, node: int, message: Message, durable: DurableView) -> None:
        """``node`` sends ``message``; ``durable`` is what its disk holds right now.

        Whatever the message promises must already be durable (Ready contract:
        persist, fsync when ``must_sync``, then send).
        """
        track = self.track(node)
        synced = durable.synced_hard_state
        kind = message.type
        if kind not in _NOT_DURABLE_TERM_TYPES:
            track.term_sent = max(track.term_sent, message.term)
            if synced.term < message.term:
                fail(
                    "term-durable",
                    f"node {node} sends {kind.name} in term {message.term} while its fsynced "
                    f"term is {synced.term}: the term change was not synced before sending",
                )
        if kind is MessageType.VOTE_RESP and not message.reject:
            track.vote_granted = (message.term, message.to)
            if synced.term != message.term or synced.vote != message.to:
                fail(
                    "vote-durable",
                    f"node {node} grants its vote to {message.to} in term {message.term} while "
                    f"its fsynced hard state says term {synced.term} vote {synced.vote}: the "
                    "vote was not synced before answering",
                )
        elif kind is MessageType.APP_RESP and not message.reject:
            track.acked_index = max(track.acked_index, message.index)
            unsynced = durable.unsynced_from_index
            if durable.stored_last_index < message.index or (
                unsynced and unsynced <= message.index
            ):
                fail(
                    "acknowledged-entries-durable",
                    f"node {node} acknowledges index {message.index} while its stored log ends "
                    f"at {durable.stored_last_index} and entries from {unsynced or '-'} on are "
                    "not fsynced: it answered before persisting",
                )

    # -- applying ----------------------------------------------------------------

    def on_apply(self, node: int, entry: Entry, digest: bytes) -> None:
        self.checks += 1
        key = _key(entry)
        committed = self.committed.setdefault(entry.index, key)
        if committed != key:
            fail(
                "state-machine-safety",
                f"node {node} applies {_show(entry)} but index {entry.index} was committed "
                f"with term {committed[0]} {committed[2][:40]!r}",
            )
        self.committed_max = max(self.committed_max, entry.index)
        known = self.digests.setdefault(entry.index, digest)
        if known != digest:
            fail(
                "state-machine-safety",
                f"node {node} state digest after index {entry.index} differs from another node's",
            )

    def on_snapshot_installed(self, node: int, snapshot: Snapshot, digest: bytes) -> None:
        index = snapshot.meta.index
        committed = self.committed.get(index)
        if committed is not None and committed[0] != snapshot.meta.term:
            fail(
                "snapshot-safety",
                f"node {node} installs a snapshot at {snapshot.meta.term}/{index}, "
                f"but index {index} was committed in term {committed[0] if committed else '?'}",
            )
        known = self.digests.get(index)
        if known is not None and known != digest:
            fail(
                "snapshot-safety",
                f"node {node} installs a snapshot at index {index} whose state differs from "
                f"the state the committed log produces there",
            )

    # -- reported state ------------------------------------------------------------

    def on_state(
        self,
        node: int,
        *,
        is_leader: bool,
        term: int,
        commit: int,
        commit_term: int,
        applied: int,
        epoch: int,
    ) -> None:
        """After every step of ``node``: role, term, commit (and its entry's term),
        applied index and epoch."""
        track = self.track(node)
        advanced_as_leader = is_leader and track.leader_term == term and commit > track.commit
        if advanced_as_leader and commit_term != term:
            fail(
                "leader-commits-current-term",
                f"leader {node} of term {term} advanced its commit index from "
                f"{track.commit} to {commit}, an entry of term {commit_term}: a leader may "
                "only commit entries of its own term by counting replicas (Raft paper "
                "5.4.2, Figure 8); older ones commit with them",
            )
        track.leader_term = term if is_leader else 0
        if term < track.term:
            fail(
                "term-monotonic",
                f"node {node} term went from {track.term} to {term}",
            )
        if commit < track.commit:
            fail(
                "commit-monotonic",
                f"node {node} commit index went from {track.commit} to {commit} "
                f"without a restart",
            )
        if not track.applied <= applied <= commit:
            fail(
                "applied-monotonic",
                f"node {node} applied index went from {track.applied} to {applied} "
                f"(commit {commit})",
            )
        if epoch < track.epoch:
            fail(
                "epoch-monotonic",
                f"node {node} epoch went from {track.epoch} to {epoch} without a restart",
            )
        known_epoch = self.epochs.setdefault(applied, epoch)
        if known_epoch != epoch:
            fail(
                "epoch-agreement",
                f"node {node} has epoch {epoch} at applied index {applied}, another node had "
                f"{known_epoch} there (the epoch is a function of the applied log)",
            )
        track.term, track.commit, track.applied, track.epoch = term, commit, applied, epoch
        if is_leader:
            leader = self.leaders.setdefault(term, node)
            if leader != node:
                fail(
                    "election-safety",
                    f"nodes {leader} and {node} are both leaders of term {term}",
                )

    def on_became_leader(self, node: int, snapshot_index: int, log: dict[int, Entry]) -> None:
        """``log`` maps every index after ``snapshot_index`` to the leader's entry."""
        for index in range(snapshot_index + 1, self.committed_max + 1):
            self.checks += 1
            committed = self.committed.get(index)
            if committed is None:
                continue
            entry = log.get(index)
            if entry is None or _key(entry) != committed:
                fail(
                    "leader-completeness",
                    f"node {node} became leader without committed entry {committed[0]}/{index}"
                    + (f" (it holds {_show(entry)})" if entry is not None else " (its log ends"
                    f" at {max(log, default=snapshot_index)})"),
                )

    # -- crashes ---------------------------------------------------------------------

    def promise_at_crash(self, node: int, log_terms: dict[int, int]) -> DurabilityPromise:
        """What the crashing node must still have; ``log_terms`` is its in-memory log."""
        track = self.track(node)
        bound = max(track.acked_index, track.commit)
        entries = {i: t for i, t in log_terms.items() if i <= bound}
        return DurabilityPromise(track.term_sent, track.vote_granted, entries)

    def on_restart(
        self,
        node: int,
        promise: DurabilityPromise,
        *,
        term: int,
        vote: int,
        commit: int,
        snapshot_index: int,
        log_terms: dict[int, int],
    ) -> None:
        """The node restarted from its durable state (term, vote, commit, log)."""
        if term < promise.term_sent:
            fail(
                "term-durable",
                f"node {node} sent messages in term {promise.term_sent} but restarted in "
                f"term {term}: the term was not persisted before sending",
            )
        if promise.vote_granted is not None:
            voted_term, candidate = promise.vote_granted
            if term < voted_term or (term == voted_term and vote != candidate):
                fail(
                    "vote-durable",
                    f"node {node} granted its vote to {candidate} in term {voted_term} but "
                    f"restarted with term {term} vote {vote}: the vote was not persisted",
                )
        for index, expected in sorted(promise.entries.items()):
            if index <= snapshot_index:
                continue
            if log_terms.get(index) != expected:
                fail(
                    "acknowledged-entries-durable",
                    f"node {node} acknowledged or committed entry {expected}/{index} but after "
                    f"a crash its durable log has "
                    + (f"term {log_terms[index]}" if index in log_terms else "no entry")
                    + " there: it answered before persisting",
                )
        if commit < snapshot_index:
            fail(
                "commit-durable-bound",
                f"node {node} restarted with commit {commit} below its snapshot {snapshot_index}",
            )
        track = self.track(node)
        track.incarnation += 1
        track.term = term
        track.commit = commit
        track.applied = snapshot_index
        track.leader_term = 0
        track.epoch = 0
        track.term_sent = 0
        track.vote_granted = None
        track.acked_index = 0
