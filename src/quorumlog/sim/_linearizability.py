"""Linearizability checker for key-value histories (Wing & Gong, as in Porcupine).

A history is a list of :class:`Operation` records, each with the time its call
was issued and the time its response arrived. The checker decides whether some
total order of the operations (a *linearization*) exists that respects real
time (an operation that returned before another was called comes first) and
the sequential semantics of a register per key (put / get / compare-and-set /
delete), which is what the metadata state machine's single-key transactions
are (``quorumlog.meta.MetaStateMachine``: a put, a range read of one key, a
transaction comparing the value, or the version 0 of an absent key, then
putting; a delete).

A key can instead be a **row** of fields, for operations that touch several
fields at once and must do so atomically: a table's hash key, whose sort keys
``multi_set``/``multi_delete`` write together, ``multi_get`` and a one-page
``scan`` read together, and ``check_and_mutate`` checks one of and writes
several of (``mput``, ``mget``, ``mcas``; a one-field set or get is an
``mput`` or ``mget`` of one field). A key's operations are all register
operations or all row operations.

How it works:

- **P-compositionality.** A history of independent registers is linearizable
  iff the sub-history of every key is; each key is checked alone.
- **Search.** Call and return events are sorted by time in one doubly-linked
  list (calls before returns at equal times: touching intervals count as
  concurrent). A depth-first search walks the list: at a call it tries to
  linearize that operation now (the model must accept it); at a return of an
  operation not yet linearized it backtracks. Visited
  ``(linearized-set bitset, model state)`` pairs are memoized, so no
  configuration is explored twice.
- **Unknown outcomes.** An operation whose client never heard back (``ret`` is
  ``None`` or ``+inf``) may or may not have taken effect. It gets a return
  event at +infinity: it can be linearized anywhere after its call, and
  "never took effect" is the same as "took effect after everything else".
  A put, delete or CAS with unknown outcome is always accepted by the model (a CAS
  takes effect iff the register holds the expected value at that point); a
  get with unknown outcome observed nothing and is dropped. The search
  succeeds as soon as every operation with a known outcome is linearized.
- **Bounds.** ``step_limit`` bounds the number of search steps over the whole
  history and ``time_limit_s`` (optional, wall clock through an injectable
  ``clock``) bounds the time. When a bound is hit the verdict is
  :attr:`Verdict.UNKNOWN` - "could not decide" - never a pass.

The checker knows nothing about the simulator: it is used against simulated
and real clusters alike.
"""

from __future__ import annotations

import enum
import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from quorumlog.errors import UsageError

Value = str | bytes | int | None
"""A register value; ``None`` means "absent" (the initial state of every key)."""

STEP_LIMIT_DEFAULT = 2_000_000
"""Search steps over a whole history before giving up with UNKNOWN."""

CLOCK_CHECK_INTERVAL_STEPS = 4096
"""How often (in search steps) the optional wall-clock budget is consulted."""

EXPLANATION_CONTEXT_OPERATIONS_MAX = 4
"""How many linearized operations before the failure point an explanation shows."""


class OpKind(enum.StrEnum):
    PUT = "put"
    GET = "get"
    CAS = "cas"
    DELETE = "delete"
    MULTI_PUT = "mput"
    MULTI_GET = "mget"
    MULTI_CAS = "mcas"


ROW_KINDS = frozenset({OpKind.MULTI_PUT, OpKind.MULTI_GET, OpKind.MULTI_CAS})
"""Operations on a row of fields (the key is the row)."""


class Verdict(enum.StrEnum):
    OK = "ok"
    ILLEGAL = "illegal"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Operation:
    """One client operation on one key.

    - put: ``input`` is the value written, ``output`` is ignored (``None``).
    - delete: ``input`` and ``output`` are ignored; the key becomes absent.
    - get: ``input`` is ignored (``None``), ``output`` the value read (``None``
      when the key was absent).
    - cas: ``input`` is ``(expected, new)``, ``output`` whether it succeeded.
    - mput (row): ``input`` is ``((field, value), ...)``, written together; a
      value ``None`` deletes the field.
    - mget (row): ``input`` is ``(field, ...)`` and ``output`` their values in
      that order (``None`` for an absent field); or ``input`` is ``None`` (the
      whole row, as a scan reads it) and ``output`` is every present field as
      ``((field, value), ...)`` in field order.
    - mcas (row): ``input`` is ``(field, expected, ((field, value), ...))``:
      if ``field`` holds ``expected`` (``None``: absent), the pairs are
      written together; ``output`` is whether it did.

    ``call`` and ``ret`` are times on one clock shared by all clients
    (simulated or real). ``ret`` is ``None`` or ``math.inf`` when the outcome is
    unknown (timeout, crash); ``output`` is then ignored.

    Fields are positional, in the order ``Operation(client_id, kind, key,
    input, output, call, ret)``, because histories are usually written as
    short literal tables in tests and tools.
    """

    client_id: int
    kind: OpKind
    key: str
    input: object
    output: object
    call: float
    ret: float | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OpKind(self.kind))
        if not math.isfinite(self.call):
            raise UsageError(f"operation call time must be finite, got {self.call}")
        if self.ret is not None and self.ret < self.call:
            raise UsageError(
                f"operation returns before it is called (call={self.call}, ret={self.ret}); "
                "record both times on the same clock"
            )
        if self.kind is OpKind.CAS and not (
            isinstance(self.input, tuple) and len(self.input) == 2
        ):
            raise UsageError(f"cas input must be (expected, new), got {self.input!r}")
        if self.kind is OpKind.CAS and self.outcome_known and not isinstance(self.output, bool):
            raise UsageError(f"cas output must be a bool (succeeded), got {self.output!r}")
        if self.kind in ROW_KINDS:
            _check_row_operation(self)

    @property
    def outcome_known(self) -> bool:
        return self.ret is not None and self.ret != math.inf

    def describe(self) -> str:
        """A one-line human description: ``client 3 cas k ('a'->'b') = True [10, 14]``."""
        ret = f"{self.ret:g}" if self.outcome_known else "?"
        if self.kind is OpKind.PUT:
            body = f"put {self.key}={self.input!r}"
        elif self.kind is OpKind.DELETE:
            body = f"delete {self.key}"
        elif self.kind is OpKind.GET:
            body = f"get {self.key} -> " + (repr(self.output) if self.outcome_known else "?")
        elif self.kind is OpKind.CAS:
            expected, new = _cas_input(self)
            outcome = repr(self.output) if self.outcome_known else "?"
            body = f"cas {self.key} ({expected!r} -> {new!r}) = {outcome}"
        elif self.kind is OpKind.MULTI_PUT:
            body = f"mput {self.key} {_pairs_text(self.input)}"
        elif self.kind is OpKind.MULTI_GET:
            fields = "*" if self.input is None else ",".join(map(str, _seq(self.input)))
            outcome = repr(_deep_tuple(self.output)) if self.outcome_known else "?"
            body = f"mget {self.key} [{fields}] -> {outcome}"
        else:
            field, expected, pairs = _seq(self.input)
            outcome = repr(self.output) if self.outcome_known else "?"
            body = (f"mcas {self.key} (if {field}={expected!r} then "
                    f"{_pairs_text(pairs)}) = {outcome}")
        return f"client {self.client_id} {body} [{self.call:g}, {ret}]"


def _seq(value: object) -> tuple[object, ...]:
    if not isinstance(value, (tuple, list)):
        raise UsageError(f"expected a sequence, got {value!r}")
    return tuple(value)


def _deep_tuple(value: object) -> object:
    """Lists (as JSON gives them) to tuples, all the way down: hashable, comparable."""
    return tuple(_deep_tuple(v) for v in value) if isinstance(value, (tuple, list)) else value


def _pairs(value: object) -> tuple[tuple[object, object], ...]:
    pairs = []
    for pair in _seq(value):
        field_value = _seq(pair)
        if len(field_value) != 2:
            raise UsageError(f"expected (field, value) pairs, got {value!r}")
        pairs.append((_deep_tuple(field_value[0]), _deep_tuple(field_value[1])))
    return tuple(pairs)


def _pairs_text(value: object) -> str:
    return "{" + ", ".join(f"{f}={v!r}" for f, v in _pairs(value)) + "}"


def _check_row_operation(op: Operation) -> None:
    if op.kind is OpKind.MULTI_PUT:
        if not _pairs(op.input):
            raise UsageError("mput input must name at least one (field, value) pair")
    elif op.kind is OpKind.MULTI_GET:
        if op.input is not None:
            _seq(op.input)
        if op.outcome_known:
            _seq(op.output)
    else:
        parts = _seq(op.input)
        if len(parts) != 3:
            raise UsageError(f"mcas input must be (field, expected, pairs), got {op.input!r}")
        _pairs(parts[2])
        if op.outcome_known and not isinstance(op.output, bool):
            raise UsageError(f"mcas output must be a bool (succeeded), got {op.output!r}")


@dataclass(frozen=True, slots=True)
class KeyResult:
    key: str
    verdict: Verdict
    operations: int
    steps: int
    explanation: str


@dataclass(frozen=True, slots=True)
class LinearizabilityResult:
    """The verdict over a whole history, plus the first key that decided it.

    ``key`` and ``explanation`` name the offending key for ILLEGAL and the
    undecided key for UNKNOWN; both are empty for OK.
    """

    verdict: Verdict
    key: str | None
    explanation: str
    keys: tuple[KeyResult, ...]
    steps: int

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK


class _BudgetExhaustedError(Exception):
    pass


class _Budget:
    """Shared step and optional wall-clock budget for one check."""

    __slots__ = ("_clock", "_deadline", "check_every_steps", "steps_left", "used")

    def __init__(
        self, step_limit: int, time_limit_s: float | None, clock: Callable[[], float]
    ) -> None:
        self.steps_left = step_limit
        self.used = 0
        self.check_every_steps = min(CLOCK_CHECK_INTERVAL_STEPS, step_limit)
        self._clock = clock
        self._deadline = None if time_limit_s is None else clock() + time_limit_s

    def charge(self, steps: int, *, decided: bool = False) -> None:
        """Account for ``steps``; unless the search has ``decided``, stop it when over."""
        self.steps_left -= steps
        self.used += steps
        if decided:
            return
        if self.steps_left < 0:
            raise _BudgetExhaustedError("step limit")
        if self._deadline is not None and self._clock() > self._deadline:
            raise _BudgetExhaustedError("time limit")


# Model: operations are compiled to (code, a, b) triples; the register state is
# a Value. ``_step`` returns the new state or _ILLEGAL.
_CODE_PUT = 0
_CODE_GET = 1
_CODE_CAS_OK = 2
_CODE_CAS_FAIL = 3
_CODE_CAS_UNKNOWN = 4
# Rows: the state is ``((field, value), ...)`` in field order, absent fields left
# out (``None``, the initial state, is the empty row).
_CODE_MPUT = 5
_CODE_MGET = 6
_CODE_MGET_ROW = 7
_CODE_MCAS_OK = 8
_CODE_MCAS_FAIL = 9
_CODE_MCAS_UNKNOWN = 10
_ILLEGAL = object()


def _compile(op: Operation) -> tuple[int, object, object]:
    if op.kind in ROW_KINDS:
        return _compile_row(op)
    if op.kind is OpKind.PUT:
        return (_CODE_PUT, op.input, None)
    if op.kind is OpKind.DELETE:
        return (_CODE_PUT, None, None)  # a delete writes "absent"
    if op.kind is OpKind.GET:
        return (_CODE_GET, op.output, None)
    expected, new = _cas_input(op)
    if not op.outcome_known:
        return (_CODE_CAS_UNKNOWN, expected, new)
    return (_CODE_CAS_OK if op.output else _CODE_CAS_FAIL, expected, new)


def _compile_row(op: Operation) -> tuple[int, object, object]:
    if op.kind is OpKind.MULTI_PUT:
        return (_CODE_MPUT, _pairs(op.input), None)
    if op.kind is OpKind.MULTI_GET:
        if op.input is None:
            return (_CODE_MGET_ROW, _pairs(op.output), None)
        return (_CODE_MGET, _deep_tuple(op.input), _deep_tuple(op.output))
    field, expected, pairs = _seq(op.input)
    check = (_deep_tuple(field), _deep_tuple(expected))
    if not op.outcome_known:
        return (_CODE_MCAS_UNKNOWN, check, _pairs(pairs))
    return (_CODE_MCAS_OK if op.output else _CODE_MCAS_FAIL, check, _pairs(pairs))


Row = tuple[tuple[object, object], ...]
"""A row's state: its present fields as (field, value) pairs, in field order."""


def _row(state: object) -> Row:
    return cast(Row, state) if state is not None else ()


def _row_value(row: Row, field: object) -> object:
    for f, v in row:
        if f == field:
            return v
    return None


def _row_put(row: Row, pairs: Row) -> Row:
    fields = dict(row)
    for f, v in pairs:
        if v is None:
            fields.pop(f, None)
        else:
            fields[f] = v
    return tuple(sorted(fields.items(), key=lambda fv: repr(fv[0])))


def _row_step(state: object, code: int, a: object, b: object) -> object:
    row = _row(state)
    if code == _CODE_MPUT:
        return _row_put(row, cast(Row, a))
    if code == _CODE_MGET:
        read = tuple(_row_value(row, f) for f in cast(tuple[object, ...], a))
        return state if read == b else _ILLEGAL
    if code == _CODE_MGET_ROW:
        return state if row == _row_put((), cast(Row, a)) else _ILLEGAL
    field, expected = cast(tuple[object, object], a)
    holds = _row_value(row, field) == expected
    if code == _CODE_MCAS_OK:
        return _row_put(row, cast(Row, b)) if holds else _ILLEGAL
    if code == _CODE_MCAS_FAIL:
        return state if not holds else _ILLEGAL
    return _row_put(row, cast(Row, b)) if holds else state


def _cas_input(op: Operation) -> tuple[object, object]:
    pair = op.input
    if not isinstance(pair, tuple):
        raise UsageError(f"cas input must be (expected, new), got {pair!r}")
    return pair[0], pair[1]


def _step(state: object, code: int, a: object, b: object) -> object:
    if code == _CODE_PUT:
        return a
    if code == _CODE_GET:
        return state if state == a else _ILLEGAL
    if code == _CODE_CAS_OK:
        return b if state == a else _ILLEGAL
    if code == _CODE_CAS_FAIL:
        return state if state != a else _ILLEGAL
    if code == _CODE_CAS_UNKNOWN:
        return b if state == a else state
    return _row_step(state, code, a, b)


class _EventList:
    """Call/return events of one key in a doubly-linked list over arrays.

    Node 0 is the head sentinel and node ``2n + 1`` the tail sentinel; node
    ``2i + 1`` is the call of operation ``i`` and ``2i + 2`` its return.
    """

    __slots__ = ("nxt", "prv", "tail")

    def __init__(self, ops: Sequence[Operation]) -> None:
        events: list[tuple[float, int, int]] = []
        for i, op in enumerate(ops):
            events.append((op.call, 0, 2 * i + 1))
            ret = op.ret if op.outcome_known else math.inf
            events.append((ret, 1, 2 * i + 2))  # type: ignore[arg-type]
        events.sort()
        self.tail = 2 * len(ops) + 1
        order = [0, *(node for _, _, node in events), self.tail]
        self.nxt = [0] * (self.tail + 1)
        self.prv = [0] * (self.tail + 1)
        for before, after in itertools.pairwise(order):
            self.nxt[before] = after
            self.prv[after] = before

    def lift(self, call: int) -> None:
        nxt, prv = self.nxt, self.prv
        nxt[prv[call]] = nxt[call]
        prv[nxt[call]] = prv[call]
        ret = call + 1
        nxt[prv[ret]] = nxt[ret]
        prv[nxt[ret]] = prv[ret]

    def unlift(self, call: int) -> None:
        nxt, prv = self.nxt, self.prv
        ret = call + 1
        nxt[prv[ret]] = ret
        prv[nxt[ret]] = ret
        nxt[prv[call]] = call
        prv[nxt[call]] = call


@dataclass(slots=True)
class _Failure:
    """The deepest point the search reached before getting stuck."""

    depth: int = -1
    linearized: tuple[int, ...] = ()
    stuck: int = -1
    candidates: tuple[int, ...] = ()
    state: object = None


def _check_key(ops: Sequence[Operation], budget: _Budget) -> tuple[Verdict, _Failure]:
    """Search one key's history; raises _BudgetExhaustedError when out of budget."""
    compiled = [_compile(op) for op in ops]
    known = [op.outcome_known for op in ops]
    events = _EventList(ops)
    nxt = events.nxt
    known_left = sum(known)
    state: object = None
    linearized = 0
    stack: list[tuple[int, object]] = []
    cache: set[tuple[int, object]] = set()
    failure = _Failure()
    entry = nxt[0]
    steps = 0
    check_every_steps = budget.check_every_steps
    budget.charge(0)
    while known_left:
        steps += 1
        if steps >= check_every_steps:
            budget.charge(steps)
            steps = 0
        if entry & 1:  # a call
            op = entry >> 1
            code, a, b = compiled[op]
            new_state = _step(state, code, a, b)
            if new_state is not _ILLEGAL:
                new_linearized = linearized | (1 << op)
                memo = (new_linearized, new_state)
                if memo not in cache:
                    cache.add(memo)
                    stack.append((entry, state))
                    state, linearized = new_state, new_linearized
                    known_left -= known[op]
                    events.lift(entry)
                    entry = nxt[0]
                    continue
            entry = nxt[entry]
            continue
        if len(stack) > failure.depth:
            failure = _failure_at(events, stack, entry, state)
        if not stack:
            budget.charge(steps, decided=True)
            return Verdict.ILLEGAL, failure
        entry, state = stack.pop()
        op = entry >> 1
        linearized &= ~(1 << op)
        known_left += known[op]
        events.unlift(entry)
        entry = nxt[entry]
    budget.charge(steps, decided=True)
    return Verdict.OK, failure


def _failure_at(
    events: _EventList, stack: list[tuple[int, object]], ret_entry: int, state: object
) -> _Failure:
    candidates = []
    entry = events.nxt[0]
    while entry != ret_entry:
        candidates.append(entry >> 1)
        entry = events.nxt[entry]
    return _Failure(
        depth=len(stack),
        linearized=tuple(e >> 1 for e, _ in stack),
        stuck=(ret_entry - 1) >> 1,
        candidates=tuple(candidates),
        state=state,
    )


def _explain(key: str, ops: Sequence[Operation], failure: _Failure) -> str:
    stuck = ops[failure.stuck]
    lines = [
        f"key {key!r}: no linearization of its {len(ops)} operations. "
        f"The longest linearizable prefix has {failure.depth}; after it the register "
        f"holds {failure.state!r}, and this operation, which returned before any other "
        f"remaining operation could take effect, cannot take effect either:",
        f"  stuck: {stuck.describe()}",
    ]
    others = [i for i in failure.candidates if i != failure.stuck]
    lines.extend(f"  also pending, also impossible: {ops[i].describe()}" for i in others)
    tail = failure.linearized[-EXPLANATION_CONTEXT_OPERATIONS_MAX:]
    if tail:
        lines.append("  last linearized before it:")
        lines.extend(f"    {ops[i].describe()}" for i in tail)
    return "\n".join(lines)


def partition_by_key(history: Iterable[Operation]) -> dict[str, list[Operation]]:
    """Split a history per key, dropping reads with unknown outcome (no effect).
    A key with both register and row operations is a usage error."""
    parts: dict[str, list[Operation]] = {}
    rows: dict[str, bool] = {}
    for op in history:
        row = op.kind in ROW_KINDS
        if rows.setdefault(op.key, row) is not row:
            raise UsageError(f"key {op.key!r} has both register and row operations "
                             f"(e.g. {op.describe()})")
        if op.kind in (OpKind.GET, OpKind.MULTI_GET) and not op.outcome_known:
            continue
        parts.setdefault(op.key, []).append(op)
    return parts


def check_history(
    history: Iterable[Operation],
    *,
    step_limit: int = STEP_LIMIT_DEFAULT,
    time_limit_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> LinearizabilityResult:
    """Decide whether a key-value history is linearizable.

    Returns OK, ILLEGAL (the first offending key, with an explanation) or
    UNKNOWN (a bound was hit before a decision). Keys are checked in sorted
    order, so the result does not depend on the order of ``history``.
    """
    if step_limit <= 0:
        raise UsageError(f"step_limit must be positive, got {step_limit}")
    budget = _Budget(step_limit, time_limit_s, clock)
    parts = partition_by_key(history)
    results: list[KeyResult] = []
    undecided: KeyResult | None = None
    for key in sorted(parts):
        ops = parts[key]
        used_before = budget.used
        try:
            verdict, failure = _check_key(ops, budget)
        except _BudgetExhaustedError as exc:
            result = KeyResult(
                key, Verdict.UNKNOWN, len(ops), budget.used - used_before,
                f"key {key!r}: could not decide within the {exc} "
                f"({len(ops)} operations, {budget.used} steps used)",
            )
            results.append(result)
            undecided = undecided or result
            continue
        explanation = _explain(key, ops, failure) if verdict is Verdict.ILLEGAL else ""
        result = KeyResult(key, verdict, len(ops), budget.used - used_before, explanation)
        results.append(result)
        if verdict is Verdict.ILLEGAL:
            return LinearizabilityResult(
                Verdict.ILLEGAL, key, explanation, tuple(results), budget.used
            )
    if undecided is not None:
        return LinearizabilityResult(
            Verdict.UNKNOWN, undecided.key, undecided.explanation, tuple(results), budget.used
        )
    return LinearizabilityResult(Verdict.OK, None, "", tuple(results), budget.used)
