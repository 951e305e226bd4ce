"""One seeded simulator run of a Raft key-value cluster, and many of them.

A run is a pure function of ``(seed, mix, config)``: every random choice comes
from ``random.Random`` streams derived from the seed in a fixed order, time is
virtual, and nothing iterates over a hash-ordered collection of strings.

Timeline of a run:

- ``[0, active_ms)``: clients issue operations; the nemesis injects the
  faults of the mix (crashes, partitions, membership changes, leader
  transfers, compactions, disk flushes); the network drops, duplicates and
  delays messages.
- ``active_ms``: everything heals - partitions, message loss, crashed nodes
  restart - and the nemesis stops.
- then the quiet period, as long as it takes, within bounds: a leader must
  appear within ``liveness_election_bound_ms``; clients keep going for
  ``liveness_client_window_ms`` after that and then stop starting operations;
  within ``liveness_commit_bound_ms`` every client must have its answer, the
  leader must have committed its whole log and every running member must have
  applied it - which ends the run. Every client must also have completed an
  operation after the heal.

Safety invariants (see ``_invariants``) are checked after every step; at the
end the clients' history must be linearizable.
"""

from __future__ import annotations

import functools
import hashlib
import random
import traceback
from dataclasses import dataclass

from quorumlog.errors import InvariantViolation
from quorumlog.raft import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
    ConfState,
    Message,
    MessageType,
    Role,
    format_message,
)
from quorumlog.raft import RaftConfig as _RaftConfig
from quorumlog.sim._client import CLIENT_ID_BASE, ClientRequest, ClientResponse, SimClient
from quorumlog.sim._clock import TimerQueue, VirtualClock
from quorumlog.sim._config import FaultMix, SimConfig
from quorumlog.sim._host import Outbox, SimRaftHost
from quorumlog.sim._invariants import RaftInvariants, SimInvariantViolation, fail
from quorumlog.sim._linearizability import Operation, Verdict, check_history
from quorumlog.sim._network import SimNetwork
from quorumlog.sim._trace import Tracer


@dataclass(frozen=True, slots=True)
class ProcessBeat:
    """A host's sign of life to a peer host (``PeerLiveness``): RaftHost sends
    an empty request to each peer process it sent nothing to in a tick."""


Payload = Message | ClientRequest | ClientResponse | ProcessBeat

SMALL_MESSAGE_BYTES = 1
"""``max_entries_per_message_bytes`` of "small messages" runs: one entry per APP."""

VIOLATION_LINEARIZABILITY = "linearizability"
VIOLATION_UNDECIDED = "linearizability-undecided"
VIOLATION_RAFT_INTERNAL = "raft-internal-invariant"
VIOLATION_SIM_INTERNAL = "sim-internal-invariant"
VIOLATION_EXCEPTION = "exception"


@dataclass(frozen=True, slots=True)
class SimResult:
    """What one seed did: passed, or which invariant failed and how."""

    seed: int
    mix: str
    nodes: int
    violation: str | None  # None: every check passed
    detail: str
    verdict: Verdict | None  # linearizability (None if the run stopped before the end)
    operations: int
    unknown_operations: int
    end_ms: int
    fingerprint: str  # hash over the run's outcome; same seed -> same fingerprint
    trace_hash: str  # hash over the transcript (only with keep_trace)
    stats: dict[str, int]
    trace: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.violation is None


@dataclass(slots=True)
class _RunState:
    healed: bool = False
    quiet_start_ms: int = -1
    leader_seen_after_heal_ms: int = -1
    clients_stopped_ms: int = -1
    done: bool = False
    partition_active: bool = False
    next_node_id: int = 0
    crashes: int = 0
    restarts: int = 0
    partitions: int = 0
    conf_changes: int = 0
    transfers: int = 0
    events: int = 0


class RaftSimulation:
    """One run. ``run()`` returns a :class:`SimResult`; it never raises for a bug found."""

    def __init__(
        self, seed: int, mix: FaultMix, config: SimConfig, *, keep_trace: bool = False
    ) -> None:
        mix.validate()
        config.validate()
        self.seed = seed
        self.mix = mix
        self.config = config
        root = random.Random(seed)
        self._nemesis_rng = random.Random(root.getrandbits(64))
        self._disk_rng = random.Random(root.getrandbits(64))
        network_rng = random.Random(root.getrandbits(64))
        self._raft_seed = root.getrandbits(64)
        client_seed = root.getrandbits(64)
        self._small_messages = root.random() < mix.small_messages_probability
        self._pre_vote = root.random() < config.pre_vote_probability
        self._check_quorum = root.random() < config.check_quorum_probability
        # Its own generator: runs without quiescence stay the runs of before.
        self._quiesce = random.Random(f"quiesce/{seed}").random() < config.quiesce_probability
        self.clock = VirtualClock()
        self.timers = TimerQueue()
        self.network: SimNetwork[Payload] = SimNetwork(network_rng, mix)
        self.tracer = Tracer(keep_lines=keep_trace)
        self.invariants = RaftInvariants()
        self.state = _RunState(next_node_id=config.nodes + 1)
        self.hosts: dict[int, SimRaftHost] = {}
        founding = ConfState(voters=frozenset(range(1, config.nodes + 1)))
        for node_id in range(1, config.nodes + 1):
            self._add_host(node_id, founding)
        self.clients = [
            SimClient(
                CLIENT_ID_BASE + i,
                random.Random(client_seed + i),
                config.replace(client_think_ms_max=mix.client_think_ms_max)
                if mix.client_think_ms_max else config,
                self.clock.stamp,
                self._trace if keep_trace else None,
            )
            for i in range(config.clients)
        ]

    # == setup =====================================================================

    def _raft_config(self, node_id: int) -> _RaftConfig:
        config = self.config
        raft_config = _RaftConfig(
            node_id=node_id,
            election_timeout_ticks=config.election_timeout_ticks,
            heartbeat_interval_ticks=config.heartbeat_interval_ticks,
            pre_vote=self._pre_vote,
            check_quorum=self._check_quorum,
            quiesce_idle=self._quiesce,
        )
        if self._small_messages:
            raft_config = raft_config.replace(max_entries_per_message_bytes=SMALL_MESSAGE_BYTES)
        return raft_config

    def _add_host(self, node_id: int, bootstrap: ConfState | None) -> SimRaftHost:
        outbox = Outbox(
            send_raft=self._send_raft,
            send_client=functools.partial(self._send, node_id),
            send_beat=functools.partial(self._send_beat, node_id),
            on_sent=self._on_sent,
            dies_before_send=self._dies_before_send,
            trace=self._trace if self.tracer.enabled else None,
        )
        host = SimRaftHost(
            node_id=node_id,
            raft_config=self._raft_config(node_id),
            bootstrap=bootstrap,
            invariants=self.invariants,
            outbox=outbox,
            rng=random.Random(self._raft_seed + node_id),
        )
        self.hosts[node_id] = host
        host.start()
        phase_ms = self._nemesis_rng.randrange(self.config.tick_interval_ms)
        self.timers.schedule(self.clock.now_ms + phase_ms, lambda: self._tick_host(host))
        return host

    # == the loop ======================================================================

    def run(self) -> SimResult:
        try:
            self._schedule_run()
            self._loop()
        except SimInvariantViolation as exc:
            return self._result(exc.name, exc.detail, verdict=None)
        except InvariantViolation as exc:
            where = _where(exc)
            name = VIOLATION_RAFT_INTERNAL if "/raft/" in where else VIOLATION_SIM_INTERNAL
            return self._result(name, f"{exc.message} (at {where})", verdict=None)
        except Exception as exc:  # the system under test crashed: a failing seed, not a crash
            detail = f"{type(exc).__name__}: {exc} (at {_where(exc)})"
            return self._result(VIOLATION_EXCEPTION, detail, verdict=None)
        return self._check_history()

    def _schedule_run(self) -> None:
        config = self.config
        for index, client in enumerate(self.clients):
            self.timers.schedule(client.wake_ms, functools.partial(self._wake_client, index))
        self.timers.schedule(config.tick_interval_ms, self._nemesis_tick)
        self.timers.schedule(config.active_ms, self._heal)

    def _loop(self) -> None:
        config = self.config
        end_ms = (
            config.active_ms + config.liveness_election_bound_ms
            + config.liveness_client_window_ms + config.liveness_commit_bound_ms
        )
        clock, timers, network, state = self.clock, self.timers, self.network, self.state
        events_max = self.config.run_events_max
        while True:
            due_timer = timers.next_due_ms()
            due_message = network.next_delivery_ms()
            if due_timer is None:
                next_ms = due_message
            elif due_message is None:
                next_ms = due_timer
            else:
                next_ms = min(due_timer, due_message)
            if state.done or next_ms is None or next_ms >= end_ms:
                break
            clock.advance_to(next_ms)
            while (callback := timers.pop_due(next_ms)) is not None:
                state.events += 1
                callback()
            for envelope in network.pop_due(next_ms):
                state.events += 1
                self._deliver(envelope.source, envelope.target, envelope.payload)
            if state.events >= events_max:
                fail(
                    "run-bounded",
                    f"more than {events_max} events; the run does not settle",
                )
        if not state.done:
            fail("liveness-commit", f"the run did not settle by t={end_ms} ({self._terms()})")

    # == nodes =========================================================================

    def _tick_host(self, host: SimRaftHost) -> None:
        if host.decommissioned:
            return
        self.timers.schedule(
            self.clock.now_ms + self.config.tick_interval_ms, lambda: self._tick_host(host)
        )
        if host.up:
            host.tick()
            self._after_host_event(host)

    def _deliver(self, source: int, target: int, payload: Payload) -> None:
        if target >= CLIENT_ID_BASE:
            if isinstance(payload, ClientResponse):
                client = self.clients[target - CLIENT_ID_BASE]
                client.on_response(self.clock.now_ms, payload)
                self._schedule_client(target - CLIENT_ID_BASE)
            return
        host = self.hosts.get(target)
        if host is None or not host.up:
            return
        if source < CLIENT_ID_BASE:
            host.heard(source)
        if isinstance(payload, Message):
            host.deliver(payload)
        elif isinstance(payload, ClientRequest):
            host.on_client_request(payload)
        self._after_host_event(host)

    def _after_host_event(self, host: SimRaftHost) -> None:
        if host.crash_requested and host.up:
            self._crash(host, "targeted")

    def _send_raft(self, message: Message) -> None:
        self._send(message.from_, message.to, message)

    def _send_beat(self, source: int, target: int) -> None:
        self.network.send(self.clock.now_ms, source, target, ProcessBeat())

    def _send(self, source: int, target: int, payload: Payload) -> None:
        if self.tracer.enabled and isinstance(payload, Message):
            self._trace(format_message(payload))
        self.network.send(self.clock.now_ms, source, target, payload)

    def _on_sent(self, node_id: int, message: Message) -> None:
        """Targeted crashes right after the riskiest promises leave: a vote, an ack."""
        mix = self.mix
        if self.state.healed or message.reject:
            return
        if message.type is MessageType.VOTE_RESP:
            probability = mix.crash_after_vote_probability
        elif message.type is MessageType.APP_RESP:
            probability = mix.crash_after_append_ack_probability
        else:
            return
        if probability and self._nemesis_rng.random() < probability and self._may_crash():
            self.hosts[node_id].crash_requested = True

    def _dies_before_send(self, node_id: int, message: Message) -> bool:
        """A leader dies while sending new entries: this message and the rest of
        its Ready never leave (the Raft paper's Figure 8 needs exactly this)."""
        probability = self.mix.crash_leader_after_append_probability
        return (
            bool(probability)
            and not self.state.healed
            and message.type is MessageType.APP
            and _is_new_proposal(message)
            and self._nemesis_rng.random() < probability
            and self._may_crash()
        )

    def _may_crash(self) -> bool:
        down = sum(1 for h in self.hosts.values() if not h.up and not h.decommissioned)
        return down < self.mix.crashed_nodes_max

    def _crash(self, host: SimRaftHost, reason: str) -> None:
        outcome = host.crash(self._disk_rng, self.mix)
        self.network.set_down(host.node_id, True)
        self.state.crashes += 1
        self._trace(
            f"CRASH node {host.node_id} ({reason}): unsynced records lost="
            f"{outcome.lost_records} kept={outcome.kept_unsynced_records}"
            + (" torn" if outcome.torn else "")
        )
        downtime = self._nemesis_rng.randint(self.mix.downtime_ms_min, self.mix.downtime_ms_max)
        self.timers.schedule(self.clock.now_ms + downtime, lambda: self._restart(host))

    def _restart(self, host: SimRaftHost) -> None:
        if host.up or host.decommissioned:
            return
        host.start()
        self.network.set_down(host.node_id, False)
        self.state.restarts += 1
        raft = host.raft
        self._trace(
            f"RESTART node {host.node_id} term={raft.term} commit={raft.commit_index} "
            f"applied={raft.applied_index} last={raft.last_index}"
        )

    # == clients =========================================================================

    def _members(self) -> list[int]:
        return [n for n, h in sorted(self.hosts.items()) if not h.decommissioned]

    def _wake_client(self, index: int) -> None:
        client = self.clients[index]
        if self.clock.now_ms < client.wake_ms:
            return
        for node_id, request in client.wake(self.clock.now_ms, self._members()):
            self._send(client.client_id, node_id, request)
        self._schedule_client(index)

    def _schedule_client(self, index: int) -> None:
        wake_ms = self.clients[index].wake_ms
        self.timers.schedule(
            max(wake_ms, self.clock.now_ms), functools.partial(self._wake_client, index)
        )

    def _stop_clients(self) -> None:
        for client in self.clients:
            client.stop()

    # == the nemesis =======================================================================

    def _nemesis_tick(self) -> None:
        self.timers.schedule(self.clock.now_ms + self.config.tick_interval_ms, self._nemesis_tick)
        self._decommission_removed()
        if self.state.healed:
            return
        mix, rng = self.mix, self._nemesis_rng
        for host in self._running():
            if rng.random() < mix.background_flush_probability_per_tick:
                host.sync()
        if rng.random() < mix.crash_probability_per_tick and self._may_crash():
            self._random_crash()
        if rng.random() < mix.partition_probability_per_tick and not self.state.partition_active:
            self._start_partition()
        if rng.random() < mix.membership_change_probability_per_tick:
            self._change_membership()
        if rng.random() < mix.leader_transfer_probability_per_tick:
            self._transfer_leader()
        if rng.random() < mix.compaction_probability_per_tick:
            self._compact()

    def _running(self) -> list[SimRaftHost]:
        return [h for _, h in sorted(self.hosts.items()) if h.up]

    def _leader(self) -> SimRaftHost | None:
        leaders = [h for h in self._running() if h.raft.role is Role.LEADER]
        return max(leaders, key=lambda h: h.raft.term) if leaders else None

    def _random_crash(self) -> None:
        running = self._running()
        if not running:
            return
        leader = self._leader()
        if leader is not None and self._nemesis_rng.random() < self.mix.crash_leader_probability:
            victim = leader
        else:
            victim = running[self._nemesis_rng.randrange(len(running))]
        self._crash(victim, "random")

    def _start_partition(self) -> None:
        rng, mix = self._nemesis_rng, self.mix
        nodes = [n for n, h in sorted(self.hosts.items()) if not h.decommissioned]
        if len(nodes) < 2:
            return
        leader = self._leader()
        if leader is not None and rng.random() < mix.partition_isolate_leader_probability:
            side = [leader.node_id]
        else:
            shuffled = nodes[:]
            rng.shuffle(shuffled)
            side = sorted(shuffled[: rng.randint(1, len(nodes) - 1)])
        rest = [n for n in nodes if n not in side]
        one_way = rng.random() < mix.partition_one_way_probability
        if one_way:
            for a in side:
                for b in rest:
                    self.network.block(a, b)
        else:
            self.network.partition([side, rest])
        self.state.partition_active = True
        self.state.partitions += 1
        arrow = "->|" if one_way else "|"
        self._trace(f"PARTITION {side} {arrow} {rest}")
        duration = rng.randint(mix.partition_duration_ms_min, mix.partition_duration_ms_max)
        self.timers.schedule(self.clock.now_ms + duration, self._heal_partition)

    def _heal_partition(self) -> None:
        if self.state.partition_active:
            self.network.heal()
            self.state.partition_active = False
            self._trace("PARTITION healed")

    def _change_membership(self) -> None:
        leader = self._leader()
        if leader is None:
            return
        conf = leader.raft.conf_state
        if conf.is_joint:
            return
        rng, config = self._nemesis_rng, self.config
        live = [n for n, h in self.hosts.items() if not h.decommissioned]
        voters = sorted(conf.voters)
        learners = sorted(conf.learners)
        choices: list[str] = []
        if len(live) < config.nodes + config.nodes_extra_max:
            choices += ["add_learner", "add_voter", "replace"]
        if learners:
            choices.append("promote")
        if len(voters) > config.voters_min:
            choices.append("remove")
        if not choices:
            return
        kind = choices[rng.randrange(len(choices))]
        changes = self._conf_changes(kind, voters, learners)
        self._propose_conf_change(leader, kind, changes)

    def _conf_changes(
        self, kind: str, voters: list[int], learners: list[int]
    ) -> tuple[ConfChangeSingle, ...]:
        rng = self._nemesis_rng
        if kind == "promote":
            return (ConfChangeSingle(ConfChangeType.ADD_NODE, learners[0]),)
        if kind == "remove":
            victim = voters[rng.randrange(len(voters))]
            return (ConfChangeSingle(ConfChangeType.REMOVE_NODE, victim),)
        new_id = self.state.next_node_id
        if kind == "add_learner":
            return (ConfChangeSingle(ConfChangeType.ADD_LEARNER, new_id),)
        if kind == "add_voter":
            return (ConfChangeSingle(ConfChangeType.ADD_NODE, new_id),)
        victim = voters[rng.randrange(len(voters))]
        return (
            ConfChangeSingle(ConfChangeType.ADD_NODE, new_id),
            ConfChangeSingle(ConfChangeType.REMOVE_NODE, victim),
        )

    def _propose_conf_change(
        self, leader: SimRaftHost, kind: str, changes: tuple[ConfChangeSingle, ...]
    ) -> None:
        new_id = self.state.next_node_id
        adds_node = any(c.node_id == new_id for c in changes)
        if adds_node:
            self.state.next_node_id += 1
            self._add_host(new_id, None)
        change = ConfChange(changes=changes)
        accepted = leader.propose_conf_change(change)
        self._after_host_event(leader)
        described = ", ".join(f"{c.type.name.lower()} {c.node_id}" for c in changes)
        self._trace(f"CONF CHANGE via {leader.node_id}: {kind} ({described})"
                    + ("" if accepted else " refused"))
        if accepted:
            self.state.conf_changes += 1
        elif adds_node:
            self._decommission(self.hosts[new_id])

    def _decommission_removed(self) -> None:
        """Stop nodes the leader's applied configuration no longer has."""
        leader = self._leader()
        if leader is None:
            return
        members = leader.raft.conf_state.members()
        for node_id, host in sorted(self.hosts.items()):
            if host.decommissioned or node_id in members:
                host.removed_since_ms = -1
                continue
            if not host.joined:
                continue
            if host.removed_since_ms < 0:
                host.removed_since_ms = self.clock.now_ms
            elif self.clock.now_ms - host.removed_since_ms >= self.config.node_removal_grace_ms:
                self._decommission(host)

    def _decommission(self, host: SimRaftHost) -> None:
        if host.up:
            host.crash(self._disk_rng, self.mix)
        host.decommissioned = True
        self.network.set_down(host.node_id, True)
        self._trace(f"DECOMMISSION node {host.node_id}")

    def _transfer_leader(self) -> None:
        leader = self._leader()
        if leader is None:
            return
        voters = sorted(leader.raft.conf_state.voters - {leader.node_id})
        if not voters:
            return
        target = voters[self._nemesis_rng.randrange(len(voters))]
        self._trace(f"TRANSFER leadership {leader.node_id} -> {target}")
        self.state.transfers += 1
        leader.raft.transfer_leader(target)
        leader.flush()
        self._after_host_event(leader)

    def _compact(self) -> None:
        running = self._running()
        if not running:
            return
        host = running[self._nemesis_rng.randrange(len(running))]
        keep = self._nemesis_rng.randint(0, self.config.compaction_keep_entries_max)
        host.compact(min_entries=self.config.snapshot_min_entries, keep_entries=keep)

    # == healing and liveness ==================================================================

    def _heal(self) -> None:
        state = self.state
        state.healed = True
        state.quiet_start_ms = self.clock.now_ms
        self.network.heal()
        self.network.heal_faults()
        state.partition_active = False
        self._trace("HEAL: partitions and message loss end, crashed nodes restart")
        for host in sorted(self.hosts.values(), key=lambda h: h.node_id):
            if not host.up and not host.decommissioned:
                self._restart(host)
        self._liveness_tick()

    def _liveness_tick(self) -> None:
        """The quiet period, checked every tick: a leader within the election
        bound; then clients run for a window and stop; then the cluster must
        converge within the commit bound, which ends the run."""
        state, config, now = self.state, self.config, self.clock.now_ms
        self.timers.schedule(now + config.tick_interval_ms, self._liveness_tick)
        if state.clients_stopped_ms < 0:
            if self._stable_leader() is None:
                state.leader_seen_after_heal_ms = -1  # lost it: the client window restarts
                if now - state.quiet_start_ms >= config.liveness_election_bound_ms:
                    fail(
                        "liveness-election",
                        f"no stable leader within {config.liveness_election_bound_ms} ms after "
                        f"the faults healed ({self._terms()})",
                    )
            elif state.leader_seen_after_heal_ms < 0:
                state.leader_seen_after_heal_ms = now
            elif now - state.leader_seen_after_heal_ms >= config.liveness_client_window_ms:
                self._stop_clients()
                state.clients_stopped_ms = now
            return
        lagging = self._lagging()
        if not lagging:
            self._finish()
            state.done = True
        elif now - state.clients_stopped_ms >= config.liveness_commit_bound_ms:
            fail(
                "liveness-commit",
                f"{config.liveness_commit_bound_ms} ms after clients stopped: {lagging}",
            )

    def _stable_leader(self) -> SimRaftHost | None:
        """The leader, if no running node has moved on to a later term."""
        leader = self._leader()
        running = self._running()
        if leader is None or any(h.raft.term > leader.raft.term for h in running):
            return None
        return leader

    def _lagging(self) -> str:
        """What still keeps the cluster from having settled ('' once it has)."""
        busy = [c.client_id for c in self.clients if c.busy]
        if busy:
            return f"clients {busy} still wait for an answer"
        leader = self._leader()
        if leader is None:
            return f"no leader ({self._terms()})"
        raft = leader.raft
        if raft.commit_index != raft.last_index:
            return (f"leader {leader.node_id} committed {raft.commit_index} of "
                    f"{raft.last_index} entries")
        members = raft.conf_state.members()
        behind = [
            f"{h.node_id}:{h.raft.applied_index}" for h in self._running()
            if h.node_id in members and h.raft.applied_index != raft.commit_index
        ]
        if behind:
            return f"members applied {', '.join(behind)} of {raft.commit_index}"
        return ""

    def _terms(self) -> str:
        return "terms: " + ", ".join(
            f"{h.node_id}:{h.raft.term}/{h.raft.role.name}" for h in self._running()
        )

    def _finish(self) -> None:
        for client in self.clients:
            client.finish_run()
        quiet_start = self.state.quiet_start_ms
        for client in self.clients:
            if client.last_completed_ms < quiet_start:
                fail(
                    "liveness-clients",
                    f"client {client.client_id} completed no operation after the faults "
                    f"healed at t={quiet_start}",
                )

    # == results ==================================================================================

    def _history(self) -> list[Operation]:
        return [op for client in self.clients for op in client.history]

    def _check_history(self) -> SimResult:
        result = check_history(
            self._history(), step_limit=self.config.linearizability_step_limit
        )
        if result.verdict is Verdict.ILLEGAL:
            return self._result(VIOLATION_LINEARIZABILITY, result.explanation, result.verdict)
        if result.verdict is Verdict.UNKNOWN:
            return self._result(VIOLATION_UNDECIDED, result.explanation, result.verdict)
        return self._result(None, "", result.verdict)

    def _result(self, violation: str | None, detail: str, verdict: Verdict | None) -> SimResult:
        history = self._history()
        state = self.state
        stats = {
            "events": state.events,
            "crashes": state.crashes,
            "restarts": state.restarts,
            "partitions": state.partitions,
            "conf_changes": state.conf_changes,
            "transfers": state.transfers,
            "leaders": len(self.invariants.leaders),
            "committed": self.invariants.committed_max,
            "messages_sent": self.network.stats.sent,
            "messages_delivered": self.network.stats.delivered,
            "snapshots_installed": sum(h.stats.snapshots_installed for h in self.hosts.values()),
            "compactions": sum(h.stats.compactions for h in self.hosts.values()),
            "protocol_errors": sum(h.stats.protocol_errors for h in self.hosts.values()),
            "checks": self.invariants.checks,
        }
        fingerprint = hashlib.sha256(
            repr((violation, detail, self.clock.now_ms, sorted(stats.items()),
                  [(o.client_id, o.kind, o.key, o.input, o.output, o.call, o.ret)
                   for o in history])).encode()
        ).hexdigest()
        if violation is not None:
            self._trace(f"VIOLATION {violation}: {detail}")
        return SimResult(
            seed=self.seed,
            mix=self.mix.name,
            nodes=self.config.nodes,
            violation=violation,
            detail=detail,
            verdict=verdict,
            operations=len(history),
            unknown_operations=sum(1 for o in history if not o.outcome_known),
            end_ms=self.clock.now_ms,
            fingerprint=fingerprint,
            trace_hash=self.tracer.digest(),
            stats=stats,
            trace=tuple(self.tracer.lines),
        )

    def _trace(self, text: str) -> None:
        self.tracer.event(self.clock.now_ms, text)


def _is_new_proposal(message: Message) -> bool:
    """An APP whose last entry is newer than the follower's known position: fresh data."""
    return bool(message.entries) and message.entries[-1].term == message.term


def _where(exc: BaseException) -> str:
    """``quorumlog/raft/_node.py:363 in propose``: where it was raised (the
    caller of ``invariant()``, not the helper itself)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.endswith("quorumlog/errors.py")]
    if not frames:
        return "?"
    frame = frames[-1]
    path = frame.filename
    short = path[path.rfind("quorumlog/"):] if "quorumlog/" in path else path
    return f"{short}:{frame.lineno} in {frame.name}"


def run_seed(
    seed: int, mix: FaultMix, config: SimConfig | None = None, *, keep_trace: bool = False
) -> SimResult:
    """Run one seed and return its result (never raises for a bug it finds)."""
    return RaftSimulation(seed, mix, config or SimConfig(), keep_trace=keep_trace).run()
