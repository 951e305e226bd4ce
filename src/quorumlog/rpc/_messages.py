"""Typed messages and the registry that gives each one a stable type id.

A message is a frozen msgspec Struct that names its wire id in a ``type_id``
class variable; defining the class registers it. A request names its response
type as the parameter of :class:`Request`, which also types ``Connection.call``::

    class PingResponse(rpc.Message, frozen=True):
        type_id: ClassVar[int] = 60001
        n: int

    class PingRequest(rpc.Request[PingResponse], frozen=True):
        type_id: ClassVar[int] = 60000
        n: int

Requests and responses are named in pairs (``XxxRequest`` / ``XxxResponse``).
Type ids 1-99 belong to the rpc layer itself; docs/rpc.md lists the ranges of
the other packages. Registering a taken id is a programmer error.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from quorumlog.errors import InvariantViolation, UsageError, invariant

from ._frame import HEADER_BYTES, FrameError, pack_header

R = TypeVar("R", bound="Message")

MAX_TYPE_ID = 0xFFFF
RESERVED_TYPE_IDS_MAX = 99  # ids 1..99 are the rpc layer's own messages
PROTOCOL_VERSION = 1

_ENCODER = msgspec.msgpack.Encoder()


@dataclass(slots=True)
class MessageType:
    """What the registry knows about one message class."""

    cls: type[Message]
    type_id: int
    response_cls: type[Message] | None  # set for requests
    # Built on first use: msgspec cannot build a decoder for a class that is
    # still being defined (registration runs in __init_subclass__).
    _decoder: msgspec.msgpack.Decoder[Any] | None = None

    def decode(self, body: memoryview) -> Message:
        """Decode a body; FrameError when it is not a valid ``cls``."""
        if self._decoder is None:
            self._decoder = msgspec.msgpack.Decoder(self.cls)
        try:
            message: Message = self._decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise FrameError(f"malformed {self.cls.__name__} body: {exc}") from None
        return message


class MessageRegistry:
    """Maps type ids to message classes and back; one per process."""

    def __init__(self) -> None:
        self._by_id: dict[int, MessageType] = {}
        self._by_cls: dict[type[Message], MessageType] = {}

    def register(self, cls: type[Message], response_cls: type[Message] | None) -> None:
        type_id = cls.__dict__["type_id"]
        invariant(
            isinstance(type_id, int) and 0 < type_id <= MAX_TYPE_ID,
            f"{cls.__name__}.type_id must be an int in 1..{MAX_TYPE_ID}",
        )
        invariant(
            type_id > RESERVED_TYPE_IDS_MAX or cls.__module__.startswith("quorumlog.rpc."),
            f"{cls.__name__}: type ids 1..{RESERVED_TYPE_IDS_MAX} are reserved for quorumlog.rpc",
        )
        taken = self._by_id.get(type_id)
        invariant(
            taken is None,
            f"type id {type_id} of {cls.__qualname__} is taken by "
            f"{taken.cls.__qualname__ if taken else ''}",
        )
        entry = MessageType(cls, type_id, response_cls)
        self._by_id[type_id] = entry
        self._by_cls[cls] = entry

    def by_id(self, type_id: int) -> MessageType | None:
        return self._by_id.get(type_id)

    def by_cls(self, cls: type[Message]) -> MessageType:
        entry = self._by_cls.get(cls)
        if entry is None:
            raise UsageError(
                f"{cls.__qualname__} is not a registered message: give it a type_id class variable"
            )
        return entry


registry = MessageRegistry()


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every rpc message. Subclasses set ``type_id: ClassVar[int]``."""

    type_id: ClassVar[int]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "type_id" in cls.__dict__:
            registry.register(cls, _response_cls_of(cls))


class Request(Message, Generic[R], frozen=True):
    """Base of requests; the parameter is the response type."""


def _response_cls_of(cls: type[Message]) -> type[Message] | None:
    if not issubclass(cls, Request):
        invariant(
            not cls.__name__.endswith("Request"),
            f"{cls.__name__} is named like a request: derive it from Request[XxxResponse]",
        )
        return None
    response_cls = _declared_response(cls)
    if response_cls is None:
        raise InvariantViolation(
            f"invariant violated: {cls.__name__} must name its response type: "
            f"class {cls.__name__}(Request[{cls.__name__.removesuffix('Request')}Response])"
        )
    prefix = cls.__name__.removesuffix("Request")
    invariant(
        cls.__name__.endswith("Request") and response_cls.__name__ == f"{prefix}Response",
        f"requests and responses are named in pairs: {cls.__name__} -> {response_cls.__name__}",
    )
    invariant(
        "type_id" in response_cls.__dict__ and not issubclass(response_cls, Request),
        f"{response_cls.__name__} must be a registered non-request Message",
    )
    return response_cls


def _declared_response(cls: type[Any]) -> type[Message] | None:
    for klass in cls.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            if typing.get_origin(base) is Request:
                (arg,) = typing.get_args(base)
                return arg if isinstance(arg, type) and issubclass(arg, Message) else None
    return None


# ---------------------------------------------------------------- rpc's own


class ErrorResponse(Message, frozen=True):
    """Sent instead of a response when a handler failed (see _errors.py)."""

    type_id: ClassVar[int] = 1
    code: int
    message: str
    retriable: bool
    details: dict[str, str | int | bool | None] = msgspec.field(default_factory=dict)


class HelloResponse(Message, frozen=True):
    type_id: ClassVar[int] = 3
    protocol_version: int
    max_frame_bytes: int


class HelloRequest(Request[HelloResponse], frozen=True):
    """The first frame of every connection: version and optional token."""

    type_id: ClassVar[int] = 2
    protocol_version: int
    max_frame_bytes: int
    token: str | None = None


# ---------------------------------------------------------------- encode/decode


def encode_frame(message: Message, request_id: int, payload_bytes: int) -> bytearray:
    """Header + msgpack body in one buffer; the payload goes in its own buffer."""
    return encode_known(message, registry.by_cls(type(message)).type_id, request_id, payload_bytes)


def encode_known(message: Message, type_id: int, request_id: int, payload_bytes: int) -> bytearray:
    """:func:`encode_frame` for a caller that already looked up the type id."""
    buffer = bytearray(HEADER_BYTES)
    _ENCODER.encode_into(message, buffer, HEADER_BYTES)
    pack_header(buffer, type_id, request_id, payload_bytes)
    return buffer

