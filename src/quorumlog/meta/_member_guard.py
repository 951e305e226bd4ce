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

A whole data directory lost (marker and all, a replaced disk) looks like a
first start on disk; the cluster remembers instead: each member writes
``/meta/members/<id>`` once it hosts the group (``publish_member_record``),
and a member with nothing on disk asks the others for it before it hosts the
group (``_ask_peers``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from quorumlog import rpc
from quorumlog.errors import ConfigError, QuorumlogError
from quorumlog.log import get_logger
from quorumlog.meta._client import MetaClient
from quorumlog.meta._commands import RangeOp
from quorumlog.meta._member_marker import marker_path
from quorumlog.meta._service import META_GROUP_ID, MetaRangeRequest, MetaStatusRequest
from quorumlog.raft import group_directory

_log = get_logger(__name__)

MEMBER_RECORD_PREFIX = "/meta/members/"
# MetaStatusResponse.role of a member running this check with nothing on disk (a
# first start of the whole cluster has every member here at once).
FRESH_ROLE = "fresh"
PEER_TIMEOUT_S = 2.0
RETRY_INTERVAL_S = 1.0
WAIT_LOG_INTERVAL_S = 10.0
VOTER_CONFIRM_S = 5.0  # followers saying "voter" this long without a leader saying so
PROCEDURE = 'docs/meta.md, "A member whose data is lost, damaged or older"'


class MetaDataLostError(ConfigError):
    """This node ran meta before, and its meta Raft data is gone."""


def member_record_key(node_id: int) -> str:
    """The persistent key a member writes once it hosts the meta group."""
    return f"{MEMBER_RECORD_PREFIX}{node_id}"


async def publish_member_record(meta_addresses: Sequence[str], node_id: int,
                                address: str) -> None:
    """Write ``/meta/members/<id>`` once (until it exists): the cluster's memory that
    this node ran meta, which outlives its disk (``check_member_data``)."""
    value = json.dumps({"node_id": node_id, "address": address, "since": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode()
    async with MetaClient(list(meta_addresses)) as meta:
        while True:
            try:
                if await meta.get(member_record_key(node_id)) is None:
                    await meta.cas(member_record_key(node_id), 0, value)
                _log.info("meta_member_recorded", node=node_id, key=member_record_key(node_id))
                return
            except QuorumlogError as exc:
                _log.info("meta_member_record_retry", node=node_id, error=exc.message)
                await asyncio.sleep(RETRY_INTERVAL_S)


async def check_member_data(host_dir: Path, node_id: int, *, bootstrap: bool,
                            members: Mapping[int, str]) -> None:
    """Raise MetaDataLostError if starting this member could lose acknowledged writes."""
    marker = marker_path(host_dir)
    group_dir = group_directory(host_dir, META_GROUP_ID)
    if group_dir.exists():
        return
    had_data = marker.exists()
    if had_data and bootstrap:
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
    # Nothing on disk and no marker: a first start, or the whole data directory
    # lost. The record a member writes once it hosts the group tells; it is on a
    # majority, so answers from this many other members include one that has it.
    needed = len(members) - (len(members) // 2 + 1) + 1
    await _ask_peers(node_id, peers, group_dir, had_data=had_data, needed=needed)


async def _ask_peers(node_id: int, peers: Mapping[int, str], group_dir: Path, *,
                     had_data: bool, needed: int) -> None:
    """Return once this member may host the group: a member answers that it is not
    a voter (it was removed), or, with no sign that it ran meta before, ``needed``
    members answered without its record. Raise once it is known to have run meta
    and the leader, or the followers for VOTER_CONFIRM_S, still count it as a voter
    (a follower may not have applied a ``member remove`` committed a moment ago:
    meta followers learn commits from the next message)."""
    pool = rpc.Pool()
    logged = 0.0
    voter_since: float | None = None
    record = MetaRangeRequest(op=RangeOp(key=member_record_key(node_id)), serializable=True)
    try:
        while True:
            statuses, records = await asyncio.gather(
                asyncio.gather(*(pool.call(a, MetaStatusRequest(), timeout_s=PEER_TIMEOUT_S)
                                 for a in peers.values()), return_exceptions=True),
                asyncio.gather(*(pool.call(a, record, timeout_s=PEER_TIMEOUT_S)
                                 for a in peers.values()), return_exceptions=True))
            not_a_voter, counting, answered, recorded = [], [], [], []
            leader_counts = False
            for peer, status, held in zip(peers, statuses, records, strict=True):
                for answer in (status, held):
                    if isinstance(answer, BaseException) and not isinstance(
                            answer, QuorumlogError):
                        raise answer
                if isinstance(status, BaseException) or status.role == "starting":
                    continue
                if status.role == FRESH_ROLE:  # as blank as this one: no record to hold
                    answered.append(peer)
                    continue
                if node_id in status.voters:
                    counting.append(peer)
                    leader_counts = leader_counts or status.role == "leader"
                else:
                    not_a_voter.append(peer)
                if not isinstance(held, BaseException):
                    answered.append(peer)
                    if held.result.kvs:
                        recorded.append(peer)
            if not_a_voter:
                _log.info("meta_member_joins_without_data", node=node_id,
                          not_a_voter_per=not_a_voter)
                return
            known = had_data or bool(recorded)
            if not known and len(answered) >= needed:
                return  # a first start: no member holds its record
            now = time.monotonic()
            if known and counting and voter_since is None:
                voter_since = now
            if known and counting and (leader_counts or (
                    voter_since is not None and now - voter_since >= VOTER_CONFIRM_S)):
                how = (f"its meta Raft data ({group_dir}) is gone" if had_data else
                       f"member {recorded[0]} holds its record "
                       f"{member_record_key(node_id)}: it ran meta before, yet its data "
                       "directory holds no meta data (a replaced or wiped disk)")
                raise MetaDataLostError(
                    f"node {node_id}: {how}, and member {counting[0]} still counts it as a "
                    "voter of the meta group: as it is, it could vote for a member that "
                    "lacks writes it had acknowledged. Remove it first (`quorumlog meta "
                    f"member remove {node_id}`), then start it with bootstrap = false in "
                    f"[meta] and add it again as a learner ({PROCEDURE}).")
            if now - logged >= WAIT_LOG_INTERVAL_S:
                logged = now
                _log.warning(
                    "meta_member_waits_for_peers", node=node_id, peers=sorted(peers),
                    answered=answered, needed=needed,
                    reason=("its data directory holds no meta data: it hosts the group once "
                            "the other members tell it ran meta before or not"))
            await asyncio.sleep(RETRY_INTERVAL_S)
    finally:
        await pool.close()
