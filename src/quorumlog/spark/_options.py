"""Options of the ``quorumlog`` Spark data source, parsed and checked up front.

Every problem is reported with the option's name, so Spark's error says what
to fix (Spark wraps the exception in an AnalysisException / a task failure).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from quorumlog.errors import UsageError
from quorumlog.stream import EARLIEST, LATEST, BadPositionError, check_name

# Entries a Spark task reads at most (across ledger boundaries: group_tasks).
# A task costs Spark about 0.1 s of CPU before its first row (JVM and Python
# worker, Spark 4.3 local mode), what ~100,000 one-message entries cost to
# read: 1M entries keeps that under a tenth, about the rows of one of Spark's
# own 128 MiB file splits at 100 B messages (docs/spark.md, "Tasks").
MAX_ROWS_PER_PARTITION_DEFAULT = 1_000_000
# Rows per Arrow batch handed to Spark: the JVM pays per batch, and 32,768 rows
# cost it 0.69-0.87 us a row against 1.04-1.15 with 8,192 (issue 17, batched
# entries, same session and data, load 7.8); ~5 MB a batch of 100 B messages.
ARROW_BATCH_ROWS_DEFAULT = 32768


@dataclass(frozen=True, slots=True)
class SourceOptions:
    meta: tuple[str, ...]
    stream: str
    starting_positions: str | None
    ending_positions: str | None
    starting_time_ms: int | None
    ending_time_ms: int | None
    max_rows_per_partition: int
    max_entries_per_trigger: int | None
    fail_on_data_loss: bool
    arrow_batch_rows: int
    writer_id: str | None
    read_compacted: bool = False  # batch reads: the compacted view up to each horizon


def _int(options: Mapping[str, str], name: str, default: int | None, minimum: int
         ) -> int | None:
    raw = options.get(name.lower(), options.get(name))
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"option {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise UsageError(f"option {name}={value} must be >= {minimum}")
    return value


def _bool(options: Mapping[str, str], name: str, default: str) -> bool:
    raw = (_get(options, name) or default).strip().lower()
    if raw not in ("true", "false"):
        raise UsageError(f"option {name}={raw!r} must be true or false")
    return raw == "true"


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower(), options.get(name))
    return None if value is None else str(value)


def parse_time_ms(name: str, raw: str) -> int:
    """Milliseconds since the epoch, or an ISO-8601 time (UTC unless it says)."""
    raw = raw.strip()
    if raw.lstrip("-").isdigit():
        return int(raw)
    try:
        moment = datetime.datetime.fromisoformat(raw)
    except ValueError:
        raise UsageError(f"option {name}={raw!r} is neither milliseconds since the epoch nor "
                         "an ISO-8601 time like 2026-01-31T12:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def _check_positions(name: str, raw: str | None) -> str | None:
    if raw is None:
        return None
    text = raw.strip()
    if text in (EARLIEST, LATEST):
        return text
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadPositionError(
            f"option {name} must be 'earliest', 'latest' or JSON like "
            f"{{\"0\": {{\"ledger\": 5, \"entry\": 0}}}}: {exc.msg} at character {exc.pos}"
        ) from None
    if not isinstance(data, dict):
        raise BadPositionError(f"option {name} must be a JSON object keyed by partition")
    return text


def meta_addresses(options: Mapping[str, str]) -> tuple[str, ...]:
    raw = _get(options, "meta")
    if raw:
        addresses = tuple(a.strip() for a in raw.split(",") if a.strip())
        if addresses:
            return addresses
    directory = _get(options, "clusterDir")
    from quorumlog.node import DEFAULT_DIR
    from quorumlog.node import meta_addresses as cluster_meta

    path = Path(directory) if directory else DEFAULT_DIR
    try:
        return tuple(cluster_meta(path))
    except UsageError:
        raise UsageError(
            "option meta (comma-separated meta addresses) is required, or clusterDir naming "
            f"a running local cluster; there is no cluster in {path}") from None


def parse(options: Mapping[str, str], *, need_stream: bool = True) -> SourceOptions:
    stream = _get(options, "stream")
    if need_stream and not stream:
        raise UsageError("option stream is required: .option('stream', 'events')")
    starting_time = _get(options, "startingTime")
    ending_time = _get(options, "endingTime")
    starting = _check_positions("startingPositions", _get(options, "startingPositions"))
    if starting is not None and starting_time is not None:
        raise UsageError("give startingPositions or startingTime, not both")
    fail = _bool(options, "failOnDataLoss", "true")
    compacted = _bool(options, "readCompacted", "false")
    return SourceOptions(
        meta=meta_addresses(options),
        stream=check_name("stream", stream) if stream else "",
        starting_positions=starting,
        ending_positions=_check_positions("endingPositions", _get(options, "endingPositions")),
        starting_time_ms=None if starting_time is None else parse_time_ms("startingTime",
                                                                          starting_time),
        ending_time_ms=None if ending_time is None else parse_time_ms("endingTime",
                                                                      ending_time),
        max_rows_per_partition=_int(options, "maxRowsPerPartition",
                                    MAX_ROWS_PER_PARTITION_DEFAULT, 1) or 1,
        max_entries_per_trigger=_int(options, "maxEntriesPerTrigger", None, 1),
        fail_on_data_loss=fail,
        read_compacted=compacted,
        arrow_batch_rows=_int(options, "arrowBatchRows", ARROW_BATCH_ROWS_DEFAULT, 1) or 1,
        writer_id=_writer_id(options),
    )


def _writer_id(options: Mapping[str, str]) -> str | None:
    """Who commits micro-batches of a streaming write: the writerId option, or a
    name derived from the query's checkpoint location (stable across restarts)."""
    explicit = _get(options, "writerId")
    if explicit:
        return check_name("writerId", explicit)
    checkpoint = _get(options, "checkpointLocation")
    if checkpoint:
        return "ckpt-" + hashlib.sha256(checkpoint.encode()).hexdigest()[:24]
    return None
