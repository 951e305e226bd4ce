"""Errors of the rpc layer and the one table mapping wire codes to classes.

A handler that raises a :class:`QuorumlogError` makes the server send an
``ErrorResponse`` with the class's stable code, the message, ``retriable`` and
the class's detail fields (``leader_hint`` for :class:`NotLeaderError`); the
client raises the same class again. Packages with their own error classes
register them with :func:`register_error` (codes 100 and up; see docs/rpc.md).
An exception class without a code travels as its nearest registered ancestor.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorumlog.errors import (
    ConfigError,
    CorruptionError,
    DeadlineExceededError,
    InvariantViolation,
    LockedError,
    NotLeaderError,
    ProtocolError,
    QuorumlogError,
    StorageError,
    TransientError,
    UsageError,
    invariant,
)

from ._messages import ErrorResponse

DetailValue = str | int | bool | None
RESERVED_ERROR_CODES_MAX = 99  # codes 1..99 belong to quorumlog.errors and rpc


class ConnectionClosedError(TransientError):
    """The connection closed before the response arrived; retry on a new one."""


class ConnectFailedError(ConnectionClosedError):
    """A connection could not be opened (refused, unreachable, timed out)."""


class BackpressureError(TransientError):
    """The connection's in-flight window is full; wait or use ``call``."""


class AuthenticationError(QuorumlogError):
    """The peer refused our credentials (token or TLS certificate)."""


class RemoteInternalError(QuorumlogError):
    """The server's handler failed unexpectedly (a bug there; see its log)."""


class UnsupportedRequestError(UsageError):
    """The server has no handler for this request type."""


class ResponseTooLargeError(UsageError):
    """The answer to this request would be larger than the connection's frame
    limit (``max_frame_bytes``): ask for less at once (fewer keys, smaller pages)."""


@dataclass(frozen=True, slots=True)
class ErrorCode:
    code: int
    cls: type[QuorumlogError]
    detail_fields: tuple[str, ...]


_BY_CODE: dict[int, ErrorCode] = {}
_BY_CLASS: dict[type[QuorumlogError], ErrorCode] = {}


def register_error(
    code: int, cls: type[QuorumlogError], detail_fields: tuple[str, ...] = ()
) -> None:
    """Give ``cls`` the stable wire ``code``. ``cls(message, **details)`` must work."""
    invariant(code > 0, "error codes are positive")
    invariant(code not in _BY_CODE, f"error code {code} is taken by {_BY_CODE.get(code)}")
    invariant(cls not in _BY_CLASS, f"{cls.__name__} already has an error code")
    invariant(
        code > RESERVED_ERROR_CODES_MAX or cls.__module__.startswith("quorumlog."),
        f"error codes 1..{RESERVED_ERROR_CODES_MAX} are reserved for quorumlog itself",
    )
    try:
        cls("probe", **dict.fromkeys(detail_fields))
    except TypeError as exc:
        raise InvariantViolation(
            f"invariant violated: {cls.__name__}(message, **details) fails: {exc}"
        ) from None
    entry = ErrorCode(code, cls, detail_fields)
    _BY_CODE[code] = entry
    _BY_CLASS[cls] = entry


for _code, _cls, _details in (
    (1, QuorumlogError, ()),
    (2, UsageError, ()),
    (3, ConfigError, ()),
    (4, ProtocolError, ()),
    (5, StorageError, ()),
    (6, CorruptionError, ()),
    (7, LockedError, ()),
    (8, TransientError, ()),
    (9, NotLeaderError, ("leader_hint",)),
    (10, DeadlineExceededError, ()),
    (20, ConnectionClosedError, ()),
    (21, ConnectFailedError, ()),
    (22, BackpressureError, ()),
    (23, AuthenticationError, ()),
    (24, RemoteInternalError, ()),
    (25, UnsupportedRequestError, ()),
    (26, ResponseTooLargeError, ()),
):
    register_error(_code, _cls, _details)


def error_name(code: int) -> str:
    """The class name registered for wire ``code`` (a metrics label), or ``code-N``."""
    entry = _BY_CODE.get(code)
    return entry.cls.__name__ if entry is not None else f"code-{code}"


def code_of(exc: QuorumlogError) -> ErrorCode:
    """The table entry of ``exc``'s class or of its nearest registered ancestor."""
    for klass in type(exc).__mro__:
        entry = _BY_CLASS.get(klass)
        if entry is not None:
            return entry
    return _BY_CODE[1]


def error_to_wire(exc: QuorumlogError) -> ErrorResponse:
    entry = code_of(exc)
    details: dict[str, DetailValue] = {}
    for name in entry.detail_fields:
        value = getattr(exc, name, None)
        plain = value is None or isinstance(value, str | int | bool)
        details[name] = value if plain else str(value)
    return ErrorResponse(
        code=entry.code, message=exc.message, retriable=exc.retriable, details=details
    )


def error_from_wire(response: ErrorResponse) -> QuorumlogError:
    entry = _BY_CODE.get(response.code)
    if entry is None:
        return QuorumlogError(
            f"remote error with unknown code {response.code}: {response.message}",
            retriable=response.retriable,
        )
    details = {name: response.details.get(name) for name in entry.detail_fields}
    exc = entry.cls(response.message, **details)  # type: ignore[arg-type]
    exc.retriable = response.retriable
    return exc
