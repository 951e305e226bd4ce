"""Session leases expire by the meta service's injected clock (issue 14): a
minute-long lease runs out when a ManualClock moves, with no real waiting."""

from __future__ import annotations

from pathlib import Path

from quorumlog import rpc
from quorumlog.clock import ManualClock
from quorumlog.meta import MetaClient
from rpc.support import wait_until

from .support import one_member

SESSION_TTL_MS = 60_000
EXPIRY_DEADLINE_S = 10.0  # real seconds: far below the lease


def test_a_session_lease_runs_out_on_the_injected_clock(tmp_path: Path) -> None:
    clock = ManualClock(monotonic_s=1_000.0)

    async def main() -> None:
        async with one_member(tmp_path, session_clock=clock) as member, \
                MetaClient([member.address]) as meta:
            session = await meta.create_session(ttl_ms=SESSION_TTL_MS)
            await meta.put("/owned", b"x", session_id=session)
            clock.advance(ms=SESSION_TTL_MS // 2)
            assert await meta.keepalive(session)  # renewed at the half-way mark
            clock.advance(ms=SESSION_TTL_MS - 1)
            assert await meta.get("/owned") is not None  # not yet: 1 ms left
            clock.advance(ms=2)
            leases = member.service.leases
            await wait_until(lambda: leases.remaining_ms(session, 0) is None,
                             timeout_s=EXPIRY_DEADLINE_S, what="the session to be revoked")
            assert await meta.get("/owned") is None  # its ephemeral key went with it

    rpc.run(main())
