"""The ready pass: what every driver of :class:`RaftNode` does with its Readies.

One implementation, used by the production driver (``RaftHost``: WAL storage,
rpc transport, many groups), by the simulator (``quorumlog.sim``: simulated
disk and network, one group per simulated process) and by the in-test network
of ``tests/raft``. A pass over a set of groups:

1. takes the Ready of every group that has one (batching across groups: one
   persist step for all of them, so their fsyncs share one hop to the I/O
   thread, and the transport may coalesce their messages per peer);
2. sends the messages of the groups whose node *leads*: a leader's messages
   may leave before its own log write (Raft dissertation §10.2.1, as etcd
   does): an entry is only committed, applied and acknowledged after a later
   pass, once this pass's write is durable on the leader too;
3. persists every Ready (snapshot, entries, hard state; fsync when
   ``must_sync``) - :meth:`PendingPass.persist`, which the caller may run on an
   I/O thread - and then installs it in the storage the core reads;
4. sends everyone else's messages: votes and acknowledgements promise state,
   so they leave only once it is durable;
5. per group: applies (installs the snapshot in the state machine, applies
   committed entries, serves reads - the driver's ``apply``), ``advance()``
   (the core applies configuration changes there), then runs what ``apply``
   asked to do after the advance (resolve configuration change proposals).

The pass reads no clock: time enters a core only through ``tick()``, which
each driver calls on its own clock (the event loop's timer, the simulator's
virtual clock). The storage and the transport are narrow interfaces;
:class:`MemoryReadyStorage` is the in-memory reference storage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from quorumlog.raft._node import RaftNode
from quorumlog.raft._storage import MemoryStorage
from quorumlog.raft._types import Entry, HardState, Message, Ready, Role, Snapshot


class ReadyStorage(Protocol):
    """Where a group's Readies are written."""

    def persist(
        self,
        hard_state: HardState | None,
        entries: list[Entry],
        snapshot: Snapshot | None,
        *,
        must_sync: bool,
    ) -> None:
        """Make the Ready's state durable (snapshot first, then entries, then the
        hard state; fsync when ``must_sync``). May run on an I/O thread."""

    def install(
        self, hard_state: HardState | None, entries: list[Entry], snapshot: Snapshot | None
    ) -> None:
        """Apply the persisted Ready to the storage the core reads (driver thread)."""


class ReadyTransport(Protocol):
    """Where a pass's messages go: ``(group id, message)`` pairs, in order."""

    def send(self, messages: Sequence[tuple[int, Message]]) -> None: ...


class ReadyGroup(Protocol):
    """A Raft group as the pass sees it."""

    @property
    def group_id(self) -> int: ...

    @property
    def node(self) -> RaftNode: ...

    @property
    def storage(self) -> ReadyStorage: ...


G = TypeVar("G", bound=ReadyGroup)

AfterAdvance = Callable[[], None]
"""What ``apply`` asks to run once the core has advanced past the Ready."""


@dataclass(slots=True)
class PendingPass(Generic[G]):
    """A pass whose leaders' messages left and whose Readies await persisting."""

    batch: list[tuple[G, Ready]]
    followers: list[tuple[G, Ready]]  # everyone not leading: sends after persisting

    @property
    def needs_sync(self) -> bool:
        """Whether persisting fsyncs (worth a hop to an I/O thread)."""
        return any(r.must_sync or r.snapshot is not None for _, r in self.batch)

    def persist(self) -> None:
        """Step 3's writes, for every group of the pass (may run on an I/O thread)."""
        for group, ready in self.batch:
            group.storage.persist(
                ready.hard_state, ready.entries, ready.snapshot, must_sync=ready.must_sync
            )


class ReadyPass(Generic[G]):
    """Runs passes over groups of type ``G``; see the module docstring.

    ``apply(group, ready)`` is the driver's application step (step 5); it
    returns what to run after ``advance()``, or None.
    """

    __slots__ = ("_apply", "_transport")

    def __init__(
        self,
        transport: ReadyTransport,
        apply: Callable[[G, Ready], AfterAdvance | None],
    ) -> None:
        self._transport = transport
        self._apply = apply

    def begin(self, groups: Iterable[G]) -> PendingPass[G] | None:
        """Steps 1 and 2: take the Readies, send the leaders' messages.

        None when no group has a Ready.
        """
        # One loop, no intermediate lists: the simulator runs a pass per input.
        batch: list[tuple[G, Ready]] = []
        followers: list[tuple[G, Ready]] = []
        leader_messages: list[tuple[int, Message]] = []
        for group in groups:
            node = group.node
            if not node.has_ready():
                continue
            ready = node.ready()
            batch.append((group, ready))
            if node.role is not Role.LEADER:
                followers.append((group, ready))
            elif ready.messages:
                group_id = group.group_id
                leader_messages.extend([(group_id, m) for m in ready.messages])
        if not batch:
            return None
        if leader_messages:
            self._transport.send(leader_messages)
        return PendingPass(batch, followers)

    def finish(self, pending: PendingPass[G]) -> None:
        """Steps 3 (install) to 5, once :meth:`PendingPass.persist` has run."""
        batch = pending.batch
        for group, ready in batch:
            group.storage.install(ready.hard_state, ready.entries, ready.snapshot)
        follower_messages = [
            (g.group_id, m) for g, r in pending.followers for m in r.messages]
        if follower_messages:
            self._transport.send(follower_messages)
        apply = self._apply
        for group, ready in batch:
            after = apply(group, ready)
            group.node.advance(ready)
            if after is not None:
                after()

    def run(self, groups: Iterable[G]) -> PendingPass[G] | None:
        """One whole pass on the calling thread; the pass that ran, or None."""
        pending = self.begin(groups)
        if pending is not None:
            pending.persist()
            self.finish(pending)
        return pending


class MemoryReadyStorage:
    """The reference :class:`ReadyStorage`: a :class:`MemoryStorage` and no disk.

    ``persist`` has nothing to make durable; ``install`` writes the memory.
    """

    __slots__ = ("memory",)

    def __init__(self, memory: MemoryStorage) -> None:
        self.memory = memory

    def persist(
        self,
        hard_state: HardState | None,
        entries: list[Entry],
        snapshot: Snapshot | None,
        *,
        must_sync: bool,
    ) -> None:
        return

    def install(
        self, hard_state: HardState | None, entries: list[Entry], snapshot: Snapshot | None
    ) -> None:
        self.memory.install(hard_state, entries, snapshot)
