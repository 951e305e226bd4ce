"""Read modes of the meta service: the lease (pure), the config, and one member.

The lease arithmetic and its rules are checked without I/O. The service is
then run for real in this process (a one-member Raft group on its WAL, rpc on
127.0.0.1) with an injected lease clock, so the moments a lease is granted,
used, renewed and expired are exact.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumlog import rpc
from quorumlog.config import from_mapping
from quorumlog.errors import ConfigError, TransientError, UsageError
from quorumlog.meta import MetaClient
from quorumlog.meta._read_lease import ReadLease, lease_duration_s
from quorumlog.meta._service import META_GROUP_ID, MetaStatusRequest, MetaWriteRequest
from quorumlog.node import NodeConfig
from rpc.support import wait_until

from .support import ELECTION_TICKS, TICK_MS, one_member


def test_lease_duration_is_the_follower_guard_cut_by_the_drift_bound() -> None:
    # Followers refuse votes for 10 ticks, the first of which may come at once.
    assert lease_duration_s(election_timeout_ticks=10, tick_interval_ms=100,
                            clock_drift_percent=0) == pytest.approx(0.9)
    assert lease_duration_s(election_timeout_ticks=10, tick_interval_ms=100,
                            clock_drift_percent=10) == pytest.approx(0.9 / 1.1)


def test_a_lease_runs_from_the_confirmed_start_and_only_for_its_leadership() -> None:
    lease = ReadLease(duration_s=1.0)
    first = (3, 7)  # (term, epoch)
    assert not lease.valid(now_s=0.0, leadership=first)
    lease.extend(start_s=10.0, leadership=first)
    assert lease.valid(now_s=10.5, leadership=first)
    assert not lease.valid(now_s=11.0, leadership=first)  # expired
    assert not lease.valid(now_s=10.5, leadership=(4, 8))  # a new leader
    assert not lease.valid(now_s=10.5, leadership=(3, 8))  # a configuration change
    lease.extend(start_s=9.0, leadership=first)  # an older round never shortens it
    assert lease.remaining_s(now_s=10.5, leadership=first) == pytest.approx(0.5)
    lease.extend(start_s=20.0, leadership=(4, 8))  # a new leadership starts from scratch
    assert lease.valid(now_s=20.5, leadership=(4, 8))
    assert not lease.valid(now_s=20.5, leadership=first)
    lease.drop()  # leadership lost
    assert not lease.valid(now_s=20.5, leadership=(4, 8))


def _node_config(meta: dict[str, object]) -> NodeConfig:
    return from_mapping(NodeConfig, {
        "node": {"id": 1, "data_dir": "/tmp/x", "listen": "127.0.0.1:7101"},
        "meta": {"members": ["1=127.0.0.1:7101"], **meta},
    })


def test_read_mode_comes_from_the_node_toml_and_bad_values_are_clear_errors() -> None:
    assert _node_config({}).meta.read_mode == "read_index"  # type: ignore[union-attr]
    cfg = _node_config({"read_mode": "lease", "lease_clock_drift_percent": 20})
    assert cfg.meta is not None and cfg.meta.read_mode == "lease"
    assert cfg.meta.lease_clock_drift_percent == 20
    with pytest.raises(ConfigError, match="read_mode"):
        _node_config({"read_mode": "stale"})
    with pytest.raises(ConfigError, match="lease_clock_drift_percent"):
        _node_config({"lease_clock_drift_percent": 100})


def test_an_unknown_read_mode_is_a_usage_error(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(UsageError, match="read_mode must be one of"):
            async with one_member(tmp_path, "sometimes"):
                pass

    rpc.run(main())


def test_lease_reads_skip_the_round_trip_until_the_lease_runs_out(tmp_path: Path) -> None:
    async def main() -> None:
        async with one_member(tmp_path, "lease") as member, \
                MetaClient([member.address]) as meta:
            service, clock = member.service, member.clock
            await meta.put("/k", b"1")
            lease_s = service.read_lease.duration_s
            # The first read confirms leadership with a ReadIndex round: a lease.
            kv = await meta.get("/k")
            assert kv is not None and kv.value == b"1"
            assert (service.read_index_reads, service.lease_reads) == (1, 0)
            # Within the lease: served at once, and it sees the latest write.
            await meta.put("/k", b"2")
            clock.now_s += lease_s * 0.4
            kv = await meta.get("/k")
            assert kv is not None and kv.value == b"2"
            assert (service.read_index_reads, service.lease_reads) == (1, 1)
            # Past half the lease a read still uses it and renews it meanwhile.
            clock.now_s += lease_s * 0.2
            await meta.get("/k")
            assert service.lease_reads == 2
            node = service.host.group(META_GROUP_ID).node
            renewed_from, leadership = clock.now_s, (node.term, node.epoch)
            await wait_until(lambda: service.read_lease.remaining_s(
                now_s=renewed_from, leadership=leadership) > lease_s * 0.9,
                what="the lease renewal")
            # Expired (as after a pause of the whole process): a ReadIndex round again.
            clock.now_s += lease_s * 2
            await meta.get("/k")
            assert (service.read_index_reads, service.lease_reads) == (2, 2)
            status = await meta.status(member.address)
            assert status.read_mode == "lease" and status.lease_reads == 2

    rpc.run(main())


def test_read_index_mode_confirms_every_read(tmp_path: Path) -> None:
    async def main() -> None:
        async with one_member(tmp_path, "read_index") as member, \
                MetaClient([member.address]) as meta:
            await meta.put("/k", b"1")
            for _ in range(3):
                await meta.get("/k")
            assert (member.service.read_index_reads, member.service.lease_reads) == (3, 0)
            # A serializable read asks nobody: neither counter moves.
            kv = await meta.get("/k", serializable=True)
            assert kv is not None and kv.value == b"1"
            assert (member.service.read_index_reads, member.service.lease_reads) == (3, 0)

    rpc.run(main())


def test_a_member_in_lease_mode_holds_off_one_election_timeout_after_start(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with one_member(tmp_path, "lease") as member:
            pool = rpc.Pool()
            try:
                # At once: not in the group yet, and it says so (retriable).
                status = await pool.call(member.address, MetaStatusRequest())
                assert status.role == "starting"
                with pytest.raises(TransientError, match="is starting") as error:
                    await pool.call(member.address, MetaWriteRequest(request=b""))
                assert error.value.retriable
                async with MetaClient([member.address]) as meta:
                    await meta.put("/k", b"1")  # retried until the member joined
                held_s = loop.time() - started
                assert held_s >= ELECTION_TICKS * TICK_MS / 1000
            finally:
                await pool.close()

    rpc.run(main())
