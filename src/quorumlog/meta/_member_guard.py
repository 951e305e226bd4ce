"""A meta member whose Raft data is gone must not come back as its old self.

Raft counts on every member keeping what it acknowledged. A member whose Raft
directory was wiped, lost with a disk or deleted by hand, restarted under its
old id, starts with an empty log (a founding member: the bootstrap snapshot),
and its vote can complete a majority for a member that lacks writes it had
acknowledged: those writes are lost. A real run lost an acknowledged put this
way (node 3 stopped, a put acknowledged by nodes 1 and 2, nodes 1 and 2
stopped, node 2's ``data/raft`` deleted, nodes 2 and 3 started: node 3 led,
and the put was gone). etcd refuses to start a member "already bootstrapped"
with a new data directory; BookKeeper's cookies refuse a wiped bookie; this is
the same guard for meta members.

A member writes a marker (``meta-member.json``) next to its Raft directory the
first time it hosts the meta group. At start, with the marker there and the
group's directory gone, the data was lost:

- as a founding member (``[meta] bootstrap = true``) it refuses to start;
- as a joining member (``bootstrap = false``, the documented way back) it
  asks the other members before it hosts the group: it refuses when the
  leader, or the other members for ``VOTER_CONFIRM_S``, still count it as a
  voter; once one answers that it is not (it was removed), it starts, to be
  added again as a learner.

A whole data directory lost (marker and all) cannot be told from a first
start; a node with a bookie then stops at the bookie's cookie check.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

from quorumlog import rpc
from quorumlog.errors import ConfigError, QuorumlogError
from quorumlog.log import get_logger
from quorumlog.meta._member_marker import marker_path
from quorumlog.meta._service import META_GROUP_ID, MetaStatusRequest
from quorumlog.raft import group_directory

_log = get_logger(__name__)

PEER_TIMEOUT_S = 2.0
RETRY_INTERVAL_S = 1.0
WAIT_LOG_INTERVAL_S = 10.0
VOTER_CONFIRM_S = 5.0  # followers saying "voter" this long without a leader saying so
PROCEDURE = 'docs/meta.md, "A member whose data is lost, damaged or older"'


class MetaDataLostError(ConfigError):
    """This node ran meta before, and its meta Raft data is gone."""


async def check_member_data(host_dir: Path, node_id: int, *, bootstrap: bool,
                            members: Mapping[int, str]) -> None:
    """Raise MetaDataLostError if starting this member could lose acknowledged writes."""
    marker = marker_path(host_dir)
    group_dir = group_directory(host_dir, META_GROUP_ID)
    if not marker.exists() or group_dir.exists():
        return
    if bootstrap:
        raise MetaDataLostError(
            f"node {node_id} ran meta on this data directory before ({marker}), but its "
            f"meta Raft data ({group_dir}) is gone: wiped, lost or moved. Started as a "
            "founding member ([meta] bootstrap = true) it could vote for a member that "
            "lacks writes it had acknowledged, and those writes would be lost. Bring it "
            f"back as {PROCEDURE} says: `quorumlog meta member remove {node_id}`, set "
            "bootstrap = false in [meta] of its config, start it, add it with `quorumlog "
            f"meta member add {node_id} <address> --learner` and promote it once it has "
            f"caught up. (To start a new meta group from nothing on purpose, delete {marker}.)")
    peers = {n: a for n, a in members.items() if n != node_id}
    if not peers:
        return
    await _wait_until_not_a_voter(node_id, peers, group_dir)


async def _wait_until_not_a_voter(node_id: int, peers: Mapping[int, str],
                                  group_dir: Path) -> None:
    """Return once a member answers that this node is not a voter; raise once the
    leader, or the followers for VOTER_CONFIRM_S, say it still is (a follower may
    not have applied a ``member remove`` committed a moment ago: meta followers
    learn commits from the next message)."""
    pool = rpc.Pool()
    logged = 0.0
    voter_since: float | None = None
    try:
        while True:
            answers = await asyncio.gather(
                *(pool.call(address, MetaStatusRequest(), timeout_s=PEER_TIMEOUT_S)
                  for address in peers.values()), return_exceptions=True)
            not_a_voter, counting = [], []
            leader_counts = False
            for peer, answer in zip(peers, answers, strict=True):
                if isinstance(answer, BaseException):
                    if not isinstance(answer, QuorumlogError):
                        raise answer
                    continue
                if answer.role == "starting":
                    continue
                if node_id in answer.voters:
                    counting.append(peer)
                    leader_counts = leader_counts or answer.role == "leader"
                else:
                    not_a_voter.append(peer)
            if not_a_voter:
                _log.info("meta_member_rejoins_after_data_loss", node=node_id,
                          not_a_voter_per=not_a_voter)
                return
            now = time.monotonic()
            if counting and voter_since is None:
                voter_since = now
            if leader_counts or (voter_since is not None
                                 and now - voter_since >= VOTER_CONFIRM_S):
                raise MetaDataLostError(
                    f"node {node_id}'s meta Raft data ({group_dir}) is gone, and member "
                    f"{counting[0]} still counts it as a voter of the meta group: as it is, "
                    "it could vote for a member that lacks writes it had acknowledged. "
                    f"Remove it first (`quorumlog meta member remove {node_id}`), then "
                    f"start it and add it again as a learner ({PROCEDURE}).")
            if now - logged >= WAIT_LOG_INTERVAL_S:
                logged = now
                _log.warning(
                    "meta_member_waits_for_peers", node=node_id, peers=sorted(peers),
                    reason=("its meta Raft data is gone: it joins only once a member "
                            "answers that it is no longer a voter"))
            await asyncio.sleep(RETRY_INTERVAL_S)
    finally:
        await pool.close()
