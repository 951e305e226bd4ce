"""The node's one Raft handler splits requests between its meta host and its
table host by group id: messages, coalesced heartbeat rows and their answers.
(After coalesced heartbeats landed, rows of table groups went to the meta host,
which dropped them as unknown groups; table learners caught up a minute late.)"""

from __future__ import annotations

from typing import Any

from quorumlog import rpc
from quorumlog.node._process import _raft_router
from quorumlog.raft._driver import RaftMessagesRequest, RaftMessagesResponse
from quorumlog.table import group_id_of

META_GROUP = 1
TABLE_GROUP = group_id_of(1, 0)


def _route(request: RaftMessagesRequest) -> dict[str, list[RaftMessagesRequest]]:
    seen: dict[str, list[RaftMessagesRequest]] = {"meta": [], "table": []}

    def handler(name: str) -> Any:
        async def handle(req: RaftMessagesRequest, ctx: Any) -> RaftMessagesResponse:
            seen[name].append(req)
            return RaftMessagesResponse(accepted=len(req.messages))
        return handle

    route = _raft_router(handler("meta"), handler("table"))
    rpc.run(route(request, None))
    return seen


def test_heartbeat_rows_go_to_the_host_of_their_group() -> None:
    seen = _route(RaftMessagesRequest(
        from_node=2, to_node=1, messages=[],
        heartbeats=[(TABLE_GROUP, 3, 10, 10, False), (META_GROUP, 5, 7, 7, False)],
        heartbeat_responses=[(TABLE_GROUP, 3, 10)]))
    [meta], [table] = seen["meta"], seen["table"]
    assert [r[0] for r in meta.heartbeats] == [META_GROUP] and not meta.heartbeat_responses
    assert [r[0] for r in table.heartbeats] == [TABLE_GROUP]
    assert [r[0] for r in table.heartbeat_responses] == [TABLE_GROUP]


def test_rows_of_table_groups_alone_never_reach_the_meta_host() -> None:
    seen = _route(RaftMessagesRequest(from_node=2, to_node=1, messages=[],
                                      heartbeats=[(TABLE_GROUP, 3, 10, 10, True)]))
    assert seen["meta"] == [] and len(seen["table"]) == 1


def test_a_sign_of_life_reaches_both_hosts_and_messages_split() -> None:
    beat = _route(RaftMessagesRequest(from_node=2, to_node=1, messages=[]))
    assert len(beat["meta"]) == len(beat["table"]) == 1
    mixed = _route(RaftMessagesRequest(from_node=2, messages=[(META_GROUP, b"m"),
                                                              (TABLE_GROUP, b"t")]))
    assert mixed["meta"][0].messages == [(META_GROUP, b"m")]
    assert mixed["table"][0].messages == [(TABLE_GROUP, b"t")]
