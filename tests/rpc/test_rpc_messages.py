"""Message registration, the error-code table and the config checks."""

from __future__ import annotations

from typing import ClassVar

import msgspec
import pytest

from quorumlog import rpc
from quorumlog.errors import (
    ConfigError,
    CorruptionError,
    InvariantViolation,
    NotLeaderError,
    QuorumlogError,
    StorageError,
    UsageError,
)
from quorumlog.rpc._errors import error_from_wire, error_to_wire
from quorumlog.rpc._messages import ErrorResponse, HelloRequest, encode_frame, registry

from .support import EchoRequest, EchoResponse


def test_messages_register_with_their_type_id_and_response() -> None:
    entry = registry.by_id(60000)
    assert entry is not None and entry.cls is EchoRequest
    assert entry.response_cls is EchoResponse
    assert registry.by_cls(EchoResponse).response_cls is None
    assert registry.by_id(1) is not None and registry.by_id(1).cls is ErrorResponse  # type: ignore[union-attr]


def test_body_round_trip_through_the_registry() -> None:
    frame = encode_frame(EchoRequest(n=3, text="héllo"), 9, 0)
    entry = registry.by_cls(EchoRequest)
    assert entry.decode(memoryview(frame)[20:]) == EchoRequest(n=3, text="héllo")


def test_a_taken_type_id_is_refused() -> None:
    with pytest.raises(InvariantViolation, match="taken"):

        class ClashResponse(rpc.Message, frozen=True):
            type_id: ClassVar[int] = 60001  # EchoResponse has it


def test_reserved_type_ids_are_refused_outside_rpc() -> None:
    with pytest.raises(InvariantViolation, match="reserved"):

        class ReservedResponse(rpc.Message, frozen=True):
            type_id: ClassVar[int] = 50


def test_requests_must_name_a_matching_response() -> None:
    class GoodResponse(rpc.Message, frozen=True):
        type_id: ClassVar[int] = 60100

    with pytest.raises(InvariantViolation, match="named in pairs"):

        class BadRequest(rpc.Request[GoodResponse], frozen=True):
            type_id: ClassVar[int] = 60101

    with pytest.raises(InvariantViolation, match="must name its response"):

        class LonelyRequest(rpc.Request, frozen=True):  # type: ignore[type-arg]
            type_id: ClassVar[int] = 60102

    with pytest.raises(InvariantViolation, match="named like a request"):

        class SneakyRequest(rpc.Message, frozen=True):
            type_id: ClassVar[int] = 60103


def test_unregistered_class_cannot_be_sent() -> None:
    class Unregistered(rpc.Message, frozen=True):
        n: int = 0

    with pytest.raises(UsageError, match="not a registered message"):
        encode_frame(Unregistered(), 1, 0)


def test_malformed_body_is_a_protocol_error() -> None:
    entry = registry.by_cls(HelloRequest)
    with pytest.raises(rpc._frame.FrameError, match="malformed HelloRequest"):
        entry.decode(memoryview(msgspec.msgpack.encode({"protocol_version": "one"})))


def test_error_codes_round_trip_with_details() -> None:
    wire = error_to_wire(NotLeaderError("not me", leader_hint="10.0.0.2:7000"))
    back = error_from_wire(msgspec.msgpack.decode(msgspec.msgpack.encode(wire), type=ErrorResponse))
    assert type(back) is NotLeaderError
    assert back.leader_hint == "10.0.0.2:7000" and back.message == "not me" and back.retriable


def test_unregistered_subclass_travels_as_its_nearest_ancestor() -> None:
    class ChecksumMismatchError(CorruptionError):
        pass

    back = error_from_wire(error_to_wire(ChecksumMismatchError("crc differs")))
    assert type(back) is CorruptionError and isinstance(back, StorageError)


def test_retriable_flag_from_the_wire_wins() -> None:
    back = error_from_wire(error_to_wire(StorageError("disk busy", retriable=True)))
    assert type(back) is StorageError and back.retriable


def test_unknown_error_code_becomes_a_plain_quorumlog_error() -> None:
    back = error_from_wire(ErrorResponse(code=9999, message="new kind", retriable=True))
    assert type(back) is QuorumlogError and "9999" in back.message and back.retriable


def test_register_error_for_another_package() -> None:
    class LedgerFencedError(QuorumlogError):
        def __init__(self, message: str, *, ledger_id: int | None = None) -> None:
            super().__init__(message)
            self.ledger_id = ledger_id

    rpc.register_error(64001, LedgerFencedError, ("ledger_id",))
    back = error_from_wire(error_to_wire(LedgerFencedError("fenced", ledger_id=12)))
    assert type(back) is LedgerFencedError and back.ledger_id == 12
    with pytest.raises(InvariantViolation, match="taken"):
        rpc.register_error(64001, StorageError)


def test_config_rejects_bad_limits() -> None:
    assert rpc.RpcConfig().max_frame_bytes == 16 * 1024 * 1024
    with pytest.raises(ConfigError, match="max_frame_bytes"):
        rpc.RpcConfig().replace(max_frame_bytes=10)
    with pytest.raises(ConfigError, match="max_in_flight_requests"):
        rpc.RpcConfig().replace(max_in_flight_requests=0)
    with pytest.raises(ConfigError, match="default_request_timeout_s"):
        rpc.RpcConfig().replace(default_request_timeout_s=0.0)
    with pytest.raises(ConfigError, match="go together"):
        rpc.RpcSecurityConfig(tls_cert_path="a.pem").validate()
    with pytest.raises(ConfigError, match="tls_key_path"):
        rpc.Server({}, security=rpc.RpcSecurityConfig(tls_enabled=True))


def test_server_refuses_bad_handler_maps() -> None:
    with pytest.raises(UsageError, match="not a Request"):
        rpc.Server({EchoResponse: lambda r, c: r})  # type: ignore[dict-item]
    with pytest.raises(UsageError, match="not callable"):
        rpc.Server({EchoRequest: 42})  # type: ignore[dict-item]
