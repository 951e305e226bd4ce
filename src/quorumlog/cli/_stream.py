"""``quorumlog stream``: create, inspect, write, read and trim streams."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from quorumlog.cli._meta import DirOption, MembersOption, _members
from quorumlog.cli._output import (
    Column,
    JsonFlag,
    OutputOption,
    emit,
    emit_document,
    field,
    human_age_ms,
    human_bytes,
    human_duration_ms,
    human_rate,
    human_time_ms,
    output_format,
    position_json,
    position_text,
    progress,
)

app = typer.Typer(help="Streams made of ledgers (Pulsar-style topics).", no_args_is_help=True)
console = Console()

T = TypeVar("T")




OFFLOAD_DELETION_LAG_HELP = (
    "Keep each offloaded ledger on the bookies this long (ms) after its Parquet copy is "
    "committed; the nodes' stream trimmer deletes the bookies' copy after it (Pulsar's "
    "managedLedgerOffloadDeletionLagMs, 4 h by default).")
OFFLOAD_TO_HELP = (
    "Automatic offload: directory or URL the nodes' trimmer offloads closed ledgers to "
    "(a local path, file://, s3://, gs://, hdfs://, abfs://; \"\" with a threshold of -1).")
COMPACTION_THRESHOLD_HELP = (
    "Automatic topic compaction: the nodes' trimmer compacts a partition once its closed "
    "ledgers after the compaction horizon hold more than this many bytes (0: any; -1: off). "
    "Pulsar's compaction-threshold.")
OFFLOAD_THRESHOLD_HELP = (
    "Automatic offload: per partition, offload the oldest closed ledgers once the closed "
    "ledgers hold more than this many bytes on the bookies (0: every closed ledger; -1: "
    "off). Pulsar's managedLedgerOffloadAutoTriggerSizeThresholdBytes.")


def _run(members: str | None, directory: Path | None,
         body: Callable[[Any], Awaitable[T]]) -> T:
    from quorumlog import rpc
    from quorumlog.stream import StreamClient

    addresses = _members(members, directory)

    async def main() -> T:
        async with await StreamClient.connect(addresses) as client:
            return await body(client)

    return rpc.run(main())


@app.command()
def create(
    name: str,
    partitions: int = typer.Option(1, help="Number of partitions."),
    ensemble: int = typer.Option(2, help="Ledger ensemble size E."),
    write_quorum: int = typer.Option(2, help="Ledger write quorum Qw."),
    ack_quorum: int = typer.Option(2, help="Ledger ack quorum Qa."),
    rollover_entries: int = typer.Option(50_000, help="Roll over after this many entries."),
    rollover_bytes: int = typer.Option(2048 * 1024 * 1024, help="... or this many bytes."),
    rollover_min_ms: int = typer.Option(600_000, help="Never roll a ledger younger than this."),
    rollover_max_ms: int = typer.Option(14_400_000, help="Roll a ledger older than this."),
    retention_time_ms: int = typer.Option(7 * 86_400_000, help="Keep consumed ledgers this "
                                          "long (-1: no limit)."),
    retention_size_bytes: int = typer.Option(-1, help="Keep at most this many bytes of "
                                             "consumed ledgers (-1: no limit)."),
    ttl_ms: int = typer.Option(0, help="Acknowledge messages older than this (0: off)."),
    offload_to: str = typer.Option("", "--offload-to", help=OFFLOAD_TO_HELP),
    offload_threshold_bytes: int = typer.Option(-1, "--offload-threshold-bytes",
                                                help=OFFLOAD_THRESHOLD_HELP),
    offload_deletion_lag_ms: int = typer.Option(4 * 3600 * 1000, "--offload-deletion-lag-ms",
                                                help=OFFLOAD_DELETION_LAG_HELP),
    compaction_threshold_bytes: int = typer.Option(-1, "--compaction-threshold-bytes",
                                                   help=COMPACTION_THRESHOLD_HELP),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Create a stream."""
    from quorumlog.ledger import DigestType
    from quorumlog.stream import (
        OffloadPolicy,
        RetentionPolicy,
        RolloverPolicy,
        StreamConfig,
        normalize_target,
    )

    config = StreamConfig(
        partitions=partitions, ensemble_size=ensemble, write_quorum=write_quorum,
        ack_quorum=ack_quorum, digest=DigestType.CRC32C,
        rollover=RolloverPolicy(max_entries=rollover_entries, max_bytes=rollover_bytes,
                                min_time_ms=rollover_min_ms, max_time_ms=rollover_max_ms),
        retention=RetentionPolicy(time_ms=retention_time_ms, size_bytes=retention_size_bytes,
                                  message_ttl_ms=ttl_ms),
        offload=OffloadPolicy(target=normalize_target(offload_to) if offload_to else "",
                              threshold_bytes=offload_threshold_bytes,
                              deletion_lag_ms=offload_deletion_lag_ms),
        compaction_threshold_bytes=compaction_threshold_bytes,
    )
    config.validate()
    _run(members, directory, lambda c: c.create_stream(name, config))
    console.print(f"created stream {name!r} with {partitions} partition(s)")


@app.command()
def update(
    name: str,
    retention_time_ms: int | None = typer.Option(None, help="Keep consumed ledgers this "
                                                 "long (-1: no limit)."),
    retention_size_bytes: int | None = typer.Option(None, help="Keep at most this many "
                                                    "bytes of consumed ledgers (-1: no limit)."),
    ttl_ms: int | None = typer.Option(None, help="Acknowledge messages older than this "
                                      "(0: off)."),
    offload_to: str | None = typer.Option(None, "--offload-to", help=OFFLOAD_TO_HELP),
    offload_threshold_bytes: int | None = typer.Option(None, "--offload-threshold-bytes",
                                                       help=OFFLOAD_THRESHOLD_HELP),
    offload_deletion_lag_ms: int | None = typer.Option(None, "--offload-deletion-lag-ms",
                                                       help=OFFLOAD_DELETION_LAG_HELP),
    compaction_threshold_bytes: int | None = typer.Option(
        None, "--compaction-threshold-bytes", help=COMPACTION_THRESHOLD_HELP),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Change a live stream's retention, TTL, automatic offload policy or automatic
    compaction threshold (options not given stay as they are); the nodes' trimmer
    applies them at its next round. Partitions, ledger parameters and rollover are
    fixed at creation."""
    import msgspec

    changes: dict[str, dict[str, Any]] = {
        "retention": {"time_ms": retention_time_ms, "size_bytes": retention_size_bytes,
                      "message_ttl_ms": ttl_ms},
        "offload": {"target": offload_to, "threshold_bytes": offload_threshold_bytes,
                    "deletion_lag_ms": offload_deletion_lag_ms}}
    if all(v is None for part in changes.values() for v in part.values()) \
            and compaction_threshold_bytes is None:
        raise typer.BadParameter("nothing to change: give at least one option (see --help)")

    async def body(client: Any) -> Any:
        config = (await client.get_stream(name)).config
        policies = {kind: msgspec.structs.replace(
            getattr(config, kind), **{k: v for k, v in fields.items() if v is not None})
            for kind, fields in changes.items()}
        return await client.update_stream(
            name, **policies, compaction_threshold_bytes=compaction_threshold_bytes)

    record = _run(members, directory, body)
    retention, offload_policy = record.config.retention, record.config.offload
    offload_text = (f"offload to {offload_policy.target} past "
                    f"{human_bytes(offload_policy.threshold_bytes)} per partition, bookies' copy "
                    f"kept {human_duration_ms(offload_policy.deletion_lag_ms)}"
                    if offload_policy.enabled else "no automatic offload")
    threshold = record.config.compaction_threshold_bytes
    compaction_text = (f"compaction past {human_bytes(threshold)} per partition"
                       if threshold >= 0 else "no automatic compaction")
    console.print(f"updated stream {name!r}: retention "
                  f"{human_duration_ms(retention.time_ms)} / {_size_limit(retention.size_bytes)}"
                  f", ttl {human_duration_ms(retention.message_ttl_ms)}; {offload_text}; "
                  f"{compaction_text}")


def _stream_row(record: Any) -> dict[str, Any]:
    config = record.config
    return {"name": record.name, "partitions": config.partitions,
            "ensemble_size": config.ensemble_size, "write_quorum": config.write_quorum,
            "ack_quorum": config.ack_quorum, "created_ms": record.created_ms,
            "state": str(record.state.value),
            "retention_time_ms": config.retention.time_ms,
            "retention_size_bytes": config.retention.size_bytes,
            "message_ttl_ms": config.retention.message_ttl_ms,
            "rollover_entries": config.rollover.max_entries,
            "rollover_bytes": config.rollover.max_bytes,
            "offload_target": config.offload.target,
            "offload_threshold_bytes": config.offload.threshold_bytes,
            "offload_deletion_lag_ms": config.offload.deletion_lag_ms,
            "compaction_threshold_bytes": config.compaction_threshold_bytes}


def _size_limit(value: Any) -> str:
    return "no limit" if int(value) < 0 else human_bytes(value)


LIST_COLUMNS = (
    field("name", no_wrap=True),
    field("partitions", header="parts"),
    Column("E/Qw/Qa", lambda r: f"{r['ensemble_size']}/{r['write_quorum']}/{r['ack_quorum']}"),
    field("retention_time_ms", human_duration_ms, header="retention"),
    field("created_ms", human_age_ms, header="created"),
    field("state", wide_only=True),
    field("retention_size_bytes", _size_limit, header="retention size", wide_only=True),
    field("message_ttl_ms", human_duration_ms, header="ttl", wide_only=True),
    field("rollover_entries", lambda v: f"{v:,}", header="rollover entries", wide_only=True),
    field("rollover_bytes", human_bytes, header="rollover size", wide_only=True),
    Column("offload", lambda r: f"past {human_bytes(r['offload_threshold_bytes'])}"
           if r["offload_threshold_bytes"] >= 0 and r["offload_target"] else "-",
           wide_only=True),
)


@app.command("list")
def list_(
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
    as_json: bool = typer.Option(False, "--json", help="Print the names as a JSON list "
                                 "(the shape it had before -o; -o json has every field)."),
) -> None:
    """List the streams: partitions, quorums, retention, age (-o wide|json|yaml for more)."""
    fmt = output_format(output)

    async def body(client: Any) -> list[dict[str, Any]]:
        from quorumlog.stream import StreamNotFoundError

        rows = []
        for stream in await client.list_streams():
            try:
                rows.append(_stream_row(await client.get_stream(stream)))
            except StreamNotFoundError:
                continue  # deleted between the list and the get
        return rows

    rows: list[dict[str, Any]] = _run(members, directory, body)
    if as_json:
        typer.echo(json.dumps([row["name"] for row in rows]))
        return
    emit(console, fmt, "streams", rows, LIST_COLUMNS, title=f"{len(rows)} stream(s)")


def _readable_info(data: dict[str, Any]) -> dict[str, Any]:
    """``stream info`` data with cursor positions as named fields instead of the
    arrays they are stored as (times stay in ms, sizes in bytes)."""
    subscriptions = {
        sub: {p: {**state, "mark_delete": position_json(state.get("mark_delete")),
                  "start": position_json(state.get("start")),
                  "ranges": [[position_json(a), position_json(b)]
                             for a, b in state.get("ranges", [])]}
              for p, state in per.items()}
        for sub, per in data["subscriptions"].items()}
    return {**data, "subscriptions": subscriptions}


LEDGER_COLUMNS = (
    field("partition", header="part"),
    field("ledger_id", header="ledger", no_wrap=True),
    field("status", missing="open"),
    Column("entries", lambda r: f"{r.get('entries', 0):,}" if r.get("status") else "-"),
    Column("size", lambda r: human_bytes(r.get("size_bytes", 0)) if r.get("status") else "-"),
    field("last_publish_ms", human_age_ms, header="last publish"),
    field("tier", wide_only=True),
    field("seq", wide_only=True),
    field("first_publish_ms", human_time_ms, header="first publish", wide_only=True),
    field("created_ms", human_time_ms, header="created", wide_only=True),
)


@app.command()
def info(
    name: str,
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
    as_json: bool = JsonFlag,
) -> None:
    """Show a stream's config, ledgers per partition and subscriptions.

    Tables show sizes in KiB/MiB, times as ages and positions as
    ``ledger:entry``; ``-o json``/``yaml`` keep bytes and ms.
    """
    fmt = output_format(output, as_json)
    data: dict[str, Any] = _readable_info(_run(members, directory,
                                               lambda c: c.stream_info(name)))
    if fmt in ("json", "yaml"):
        emit_document(fmt, data)
        return
    config = data["config"]
    retention, rollover = config["retention"], config["rollover"]
    console.print(
        f"[bold]{escape(name)}[/]: {config['partitions']} partition(s), created "
        f"{human_age_ms(data['created_ms'])}; ledgers E/Qw/Qa={config['ensemble_size']}/"
        f"{config['write_quorum']}/{config['ack_quorum']}; rollover at "
        f"{rollover['max_entries']:,} entries or {human_bytes(rollover['max_bytes'])} or "
        f"{human_duration_ms(rollover['max_time_ms'])}; retention "
        f"{human_duration_ms(retention['time_ms'])} / "
        f"{_size_limit(retention['size_bytes'])}, ttl "
        f"{human_duration_ms(retention['message_ttl_ms'])}")
    offload_policy = config.get("offload") or {}
    if offload_policy.get("threshold_bytes", -1) >= 0 and offload_policy.get("target"):
        console.print(f"automatic offload to {escape(offload_policy['target'])} past "
                      f"{human_bytes(offload_policy['threshold_bytes'])} per partition; the "
                      f"bookies' copy kept "
                      f"{human_duration_ms(offload_policy['deletion_lag_ms'])}")
    threshold = config.get("compaction_threshold_bytes", -1)
    if threshold >= 0:
        console.print(f"automatic compaction past {human_bytes(threshold)} per partition")
    for part in data["partitions"]:
        compaction = part.get("compaction")
        compacted = ("" if not compaction else
                     f", compacted to ledger {compaction['ledger_id']} up to "
                     f"{compaction['horizon_ledger']}:{compaction['horizon_entry']} "
                     f"({compaction['keys']:,} keys, {human_age_ms(compaction['compacted_ms'])})")
        console.print(f"partition {part['partition']}: {part['ledger_count']} ledger(s), "
                      f"{part['entries']:,} closed entries ({human_bytes(part['size_bytes'])})"
                      f", {part['trimmed_entries']:,} trimmed, {part['offloaded_ledgers']} "
                      f"offloaded ({human_bytes(part['offloaded_bytes'])}), writer "
                      f"{'connected' if part['writer'] else 'none'}{compacted}")
    rows = [{"partition": part["partition"], **ledger}
            for part in data["partitions"] for ledger in part["ledgers"]]
    emit(console, fmt, "ledgers", rows, LEDGER_COLUMNS, title="ledgers")
    for part in data["partitions"]:
        if part["ledger_count"] > len(part["ledgers"]):
            console.print(f"partition {part['partition']}: the last {len(part['ledgers'])} of "
                          f"{part['ledger_count']} ledgers shown")
    for sub, per in data["subscriptions"].items():
        console.print(f"subscription {escape(sub)!r}: " + ", ".join(
            f"p{p} mark-delete {position_text(state['mark_delete'])}, updated "
            f"{human_age_ms(state.get('updated_ms'))}" for p, state in per.items()))


@app.command()
def produce(
    name: str,
    value: list[str] = typer.Argument(None, help="Values to send (default: lines of stdin)."),
    key: str | None = typer.Option(None, help="Message key (routes to a partition)."),
    prop: list[str] = typer.Option([], "--property", help="Property NAME=VALUE (repeatable)."),
    steal: bool = typer.Option(False, help="Take the writer lease from a live writer."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Send messages (arguments, or one per line of stdin); prints their ids."""
    properties = {}
    for item in prop:
        pname, sep, pvalue = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"--property {item!r}: expected NAME=VALUE")
        properties[pname] = pvalue
    values = value or [line.rstrip("\n") for line in sys.stdin]

    async def body(client: Any) -> list[Any]:
        producer = await client.producer(name, steal=steal)
        try:
            futures = [await producer.send_async(v.encode(), key=key,
                                                 properties=properties or None) for v in values]
            import asyncio

            return list(await asyncio.gather(*futures))
        finally:
            await producer.close()

    for message_id in _run(members, directory, body):
        typer.echo(json.dumps(message_id.to_json()))


def _message_json(message: Any) -> str:
    return json.dumps({
        "partition": message.partition, **message.position.to_json(),
        "publish_time_ms": message.publish_time_ms,
        "key": None if message.key is None else message.key.decode(errors="replace"),
        "properties": dict(message.properties),
        "value": message.value.decode(errors="replace"),
    })


@app.command()
def consume(
    name: str,
    subscription: str = typer.Option(..., "--subscription", "-s", help="Subscription name."),
    count: int = typer.Option(0, help="Stop after this many messages (0: until Ctrl-C)."),
    initial: str = typer.Option("latest", help="Where a new subscription starts: "
                                "earliest|latest."),
    wait_ms: int = typer.Option(0, help="Stop when nothing arrives for this long (0: wait)."),
    sub_type: str = typer.Option("exclusive", "--type", help="Subscription type: exclusive "
                                 "(one consumer reads every partition) | failover (the "
                                 "partitions are shared out among the consumers)."),
    consumer_name: str = typer.Option("", "--consumer-name", help="Failover: this consumer's "
                                      "name; partitions go to consumers sorted by name "
                                      "(default host-pid-random)."),
    read_compacted: bool = typer.Option(
        False, "--read-compacted", help="Up to each partition's compaction horizon, only the "
        "latest message of every key (the compacted view); the cursor moves over the rest. "
        "With --initial earliest a new subscription starts at the view's first message."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Receive and acknowledge messages of a subscription; prints JSON lines."""
    from quorumlog.stream import ConsumerConfig

    config = ConsumerConfig(initial_position=initial, subscription_type=sub_type,
                            consumer_name=consumer_name, read_compacted=read_compacted)

    async def body(client: Any) -> None:
        consumer = await client.subscribe(name, subscription, config=config)
        try:
            # --count 0 (until Ctrl-C) has no end to show: no bar.
            with progress(f"consuming {name}", count, streams_stdout=True) as bar:
                seen = 0
                while not count or seen < count:
                    message = await consumer.receive(wait_ms or None)
                    if message is None:
                        return
                    typer.echo(_message_json(message))
                    await consumer.ack(message)
                    seen += 1
                    bar.advance()
        finally:
            await consumer.close()

    _run(members, directory, body)


@app.command()
def tail(
    name: str,
    start: str = typer.Option("latest", "--from", help="earliest | latest | publish time in "
                              "ms | JSON positions per partition."),
    count: int = typer.Option(0, help="Stop after this many messages (0: until Ctrl-C)."),
    wait_ms: int = typer.Option(0, help="Stop when nothing arrives for this long (0: wait)."),
    read_compacted: bool = typer.Option(
        False, "--read-compacted", help="Up to each partition's compaction horizon, only the "
        "latest message of every key (`stream compact`); after it, every message."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Print messages from a position on, following new ones (no subscription)."""
    from quorumlog.stream import parse_positions

    async def body(client: Any) -> None:
        record = await client.get_stream(name)
        spec: Any = int(start) if start.isdigit() else parse_positions(
            start, record.config.partitions)
        reader = await client.reader(name, spec, read_compacted=read_compacted)
        try:
            seen = 0
            while not count or seen < count:
                message = await reader.read_next(wait_ms or 1000)
                if message is None:
                    if wait_ms:
                        return
                    continue
                typer.echo(_message_json(message))
                seen += 1
        finally:
            await reader.close()

    _run(members, directory, body)


@app.command()
def trim(
    name: str,
    retention_time_ms: int | None = typer.Option(None, help="Override the retention time."),
    retention_size_bytes: int | None = typer.Option(None, help="Override the retention size."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Apply TTL and retention now: delete ledgers every cursor has passed."""
    import msgspec

    async def body(client: Any) -> Any:
        record = await client.get_stream(name)
        policy = record.config.retention
        if retention_time_ms is not None:
            policy = msgspec.structs.replace(policy, time_ms=retention_time_ms)
        if retention_size_bytes is not None:
            policy = msgspec.structs.replace(policy, size_bytes=retention_size_bytes)
        policy.validate()
        return await client.trim(name, retention=policy)

    report = _run(members, directory, body)
    console.print(f"deleted ledgers: {report.deleted_ledgers or 'none'}; cursors expired by "
                  f"TTL: {report.expired_cursors}; orphan ledgers deleted: "
                  f"{report.orphans_deleted or 'none'}; bookie copies of offloaded ledgers "
                  f"deleted: {report.offloaded_copies_deleted or 'none'}")


OFFLOAD_SUMMARY = (
    ("candidates", "closed ledgers not offloaded yet", str),
    ("offloaded", "offloaded now", str),
    ("already", "offloaded by another run meanwhile", str),
    ("trimmed", "trimmed by retention meanwhile", str),
    ("failed", "failed (left on the bookies)", str),
    ("entries", "entries copied", lambda v: f"{v:,}"),
    ("payload_bytes", "bytes read from the bookies", human_bytes),
    ("file_bytes", "Parquet bytes written", human_bytes),
    ("orphans", "files of dead runs deleted", str),
    ("seconds", "took", lambda v: f"{v:.1f} s"),
)


@app.command()
def offload(
    name: str,
    to: str = typer.Option(..., "--to", help="Directory or URL the Parquet files go under: "
                           "a local path, file://, s3://, gs://, hdfs://, abfs:// (any fsspec "
                           "URL when fsspec is installed)."),
    keep_bytes: int = typer.Option(0, "--keep-bytes", help="Per partition, leave the newest "
                                   "closed ledgers holding up to this many bytes on the "
                                   "bookies only (Pulsar's offload size threshold)."),
    deletion_lag_ms: int = typer.Option(4 * 3600 * 1000, "--deletion-lag-ms",
                                        help=OFFLOAD_DELETION_LAG_HELP),
    partition: list[int] | None = typer.Option(None, "--partition", help="Offload only this "
                                               "partition (repeat for more)."),
    spark: bool = typer.Option(True, "--spark/--no-spark", help="Run as a Spark job "
                               "(default: one task per ledger) or in this process."),
    master: str = typer.Option("local[2]", "--master", help="Spark master of the job."),
    tasks: int | None = typer.Option(None, "--tasks", help="Spark tasks (default: one per "
                                     "ledger, at most 64)."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
) -> None:
    """Offload the stream's closed ledgers to Parquet (tiered storage): each file is
    verified, then readers read it instead of the bookies (docs/stream.md)."""
    fmt = output_format(output)
    if keep_bytes < 0 or deletion_lag_ms < 0:
        raise typer.BadParameter("--keep-bytes and --deletion-lag-ms are 0 or more")
    if spark:
        import shutil

        from quorumlog.errors import UsageError
        from quorumlog.spark import local_session
        from quorumlog.spark import offload as spark_offload

        if shutil.which("java") is None:
            raise UsageError("the offload job runs on Spark, which needs Java 17+ on PATH: "
                             "install it, or offload in this process with --no-spark")
        from quorumlog.stream import normalize_target

        normalize_target(to)  # a bad target or stream fails before Spark starts
        _run(members, directory, lambda c: c.get_stream(name))

        addresses = _members(members, directory)
        session = local_session(master, "quorumlog-offload")
        try:
            result = spark_offload(session, addresses, name, to, keep_bytes=keep_bytes,
                                   deletion_lag_ms=deletion_lag_ms, partitions=partition,
                                   tasks=tasks)
        finally:
            session.stop()
        row = {"candidates": result.candidates, "offloaded": result.offloaded,
               "already": result.already, "trimmed": result.trimmed,
               "failed": len(result.failed), "entries": result.entries,
               "payload_bytes": result.payload_bytes, "file_bytes": result.file_bytes,
               "orphans": len(result.orphans_deleted),
               "seconds": round(result.seconds, 3), "target": result.target,
               "errors": [{"ledger_id": ledger_id, "error": error}
                          for ledger_id, error in result.failed]}
    else:
        import time

        from quorumlog.stream import normalize_target

        started = time.monotonic()
        async def body(client: Any) -> tuple[list[Any], list[str]]:
            outcomes = await client.offload(name, to, keep_bytes=keep_bytes,
                                            deletion_lag_ms=deletion_lag_ms,
                                            partitions=partition)
            return outcomes, await client.sweep_offload_orphans(name, to)

        outcomes, orphans = _run(members, directory, body)
        done = [o for o in outcomes if o.status == "offloaded"]
        row = {"candidates": len(outcomes), "offloaded": len(done),
               "already": sum(o.status == "already" for o in outcomes),
               "trimmed": sum(o.status == "trimmed" for o in outcomes), "failed": 0,
               "entries": sum(o.entries for o in done),
               "payload_bytes": sum(o.payload_bytes for o in done),
               "file_bytes": sum(o.file_bytes for o in done), "orphans": len(orphans),
               "seconds": round(time.monotonic() - started, 3), "target": normalize_target(to),
               "errors": []}
    if fmt in ("json", "yaml"):
        emit_document(fmt, row)
    else:
        from rich.table import Table

        table = Table("", "", title=f"offload of {name} to {row['target']}", show_header=False)
        for key, label, show in OFFLOAD_SUMMARY:
            table.add_row(label, show(row[key]))
        console.print(table)
    for failure in row["errors"]:
        console.print(f"[red]ledger {failure['ledger_id']} not offloaded:[/red] "
                      f"{escape(failure['error'])}")
    if row["errors"]:
        raise typer.Exit(2)


def _bookie_copy(row: dict[str, Any]) -> str:
    import time

    if row["bookies_deleted_ms"]:
        return f"deleted {human_age_ms(row['bookies_deleted_ms'])}"
    left_ms = row["delete_after_ms"] - int(time.time() * 1000)
    if left_ms <= 0:
        return "kept (lag passed: the trimmer deletes it)"
    return f"kept, deleted in {human_duration_ms(left_ms)}"


OFFLOADED_COLUMNS = (
    field("ledger_id", header="ledger", no_wrap=True),
    field("partition", header="part"),
    field("entries", lambda v: f"{v:,}"),
    field("payload_bytes", human_bytes, header="size"),
    field("offloaded_ms", human_age_ms, header="offloaded"),
    Column("bookie copy", _bookie_copy),
    field("url", header="file", wide_only=True, no_wrap=True),
)


@app.command()
def offloaded(
    name: str,
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
) -> None:
    """List the stream's offloaded ledgers: size, age, whether the bookies still hold a
    copy (-o wide for the Parquet file of each)."""
    import msgspec

    fmt = output_format(output)
    records = _run(members, directory, lambda c: c.offloaded(name))
    rows = [msgspec.structs.asdict(record) for record in records]
    emit(console, fmt, "offloaded", rows, OFFLOADED_COLUMNS,
         title=f"{len(rows)} offloaded ledger(s) of {name}")


def _horizon_text(horizon: Any) -> str:
    return "-" if horizon is None else f"{horizon.ledger_id}:{horizon.entry_id}"


COMPACT_COLUMNS = (
    field("partition", header="part"),
    Column("result", lambda r: "compacted" if r["compacted"] else "nothing new"),
    field("ledger_id", header="compacted ledger"),
    Column("horizon", lambda r: _horizon_text(r["horizon"])),
    field("read", header="read"),
    field("kept"),
    field("keys"),
    field("tombstones", header="removed keys"),
    Column("size", lambda r: human_bytes(r["payload_bytes"])),
)


@app.command()
def compact(
    name: str,
    partition: list[int] = typer.Option(
        [], "--partition", "-p", help="Compact only this partition (repeatable)."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
) -> None:
    """Compact the stream: keep the latest message of every key (Pulsar's topics compact).

    Per partition, writes a compacted ledger with the latest message of each key
    up to the last readable entry (the horizon); a message with an empty value
    removes its key, messages without a key are kept. `stream tail
    --read-compacted` and readers with read_compacted=True read it, then the
    messages after the horizon; it outlives the ledgers retention trims. Run
    again to fold in what came since (only the new messages are read besides
    the previous compacted ledger).
    """
    import msgspec

    from quorumlog.cli._output import progress

    fmt = output_format(output)

    async def body(client: Any) -> Any:
        with progress(f"compacting {name}", None) as bar:
            return await client.compact(name, partitions=partition or None,
                                        progress=bar.advance)

    outcomes = _run(members, directory, body)
    rows = [msgspec.structs.asdict(outcome) for outcome in outcomes]
    if fmt in ("json", "yaml"):
        for row in rows:
            row["horizon"] = None if row["horizon"] is None else \
                row["horizon"].position.to_json()
    emit(console, fmt, "partitions", rows, COMPACT_COLUMNS, title=f"compaction of {name}")


COMPACTION_STATUS_COLUMNS = (
    field("partition", header="part"),
    field("ledger_id", header="compacted ledger"),
    Column("horizon", lambda r: f"{r['horizon_ledger']}:{r['horizon_entry']}"),
    field("messages"),
    field("keys"),
    Column("size", lambda r: human_bytes(r["payload_bytes"])),
    Column("compacted", lambda r: human_age_ms(r["compacted_ms"])),
    field("pending_ledger_id", header="pending ledger", wide_only=True),
)


@app.command("compaction-status")
def compaction_status(
    name: str,
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
) -> None:
    """Show each partition's compacted view: ledger, horizon, messages, keys, age
    (Pulsar's topics compaction-status). Exit 1 when the stream was never compacted."""
    import msgspec

    fmt = output_format(output)
    records = _run(members, directory, lambda client: client.compaction_status(name))
    rows = [{"partition": partition, **msgspec.structs.asdict(record)}
            for partition, record in sorted(records.items()) if record.ledger_id]
    emit(console, fmt, "partitions", rows, COMPACTION_STATUS_COLUMNS,
         title=f"compacted partitions of {name}")
    if not rows:
        raise typer.Exit(1)


TABLE_VIEW_COLUMNS = (
    field("key"),
    field("value"),
    Column("size", lambda r: human_bytes(r["size_bytes"])),
)


@app.command("table-view")
def table_view(
    name: str,
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
) -> None:
    """Print the stream as a table: the latest value of every key (Pulsar's TableView).

    Reads the compacted view (`stream compact`), then every message after it, up
    to what is readable now; an empty value removes its key, messages without a
    key are left out. Keys and values are shown as UTF-8 (bytes that are not are
    replaced).
    """
    fmt = output_format(output)

    async def body(client: Any) -> dict[bytes, bytes]:
        view = await client.table_view(name)
        try:
            return dict(view.snapshot())
        finally:
            await view.close()

    data = _run(members, directory, body)
    rows = [{"key": key.decode(errors="replace"), "value": value.decode(errors="replace"),
             "size_bytes": len(value)} for key, value in sorted(data.items())]
    emit(console, fmt, "keys", rows, TABLE_VIEW_COLUMNS, title=f"{len(rows)} key(s) of {name}")


@app.command()
def trimmer(
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Show which node runs the background trimmer (retention and TTL of every stream)."""
    from quorumlog.stream import trimmer_holder

    holder = _run(members, directory, lambda client: trimmer_holder(client.ledger_client))
    if holder:
        console.print(f"trimmer: {holder} (applies retention and TTL to every stream each "
                      "[trimmer] check_interval_ms)")
    else:
        console.print("trimmer: none elected (every bookie node has [trimmer] enabled = false, "
                      "or the nodes started less than one check_interval_ms ago)")


@app.command()
def delete(
    name: str,
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
    force: bool = typer.Option(False, "--force", help="Delete even while producers or "
                               "consumers are live on the stream (their next call fails)."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Delete a stream and every ledger of it (refused while it is in use, unless --force)."""
    if not yes:
        typer.confirm(f"delete stream {name!r} and all its data?", abort=True)
    with progress(f"deleting ledgers of {name}", None) as bar:
        deleted = _run(members, directory,
                       lambda c: c.delete_stream(name, force=force, progress=bar.update))
    console.print(f"deleted stream {name!r} ({len(deleted)} ledgers)")


def _position_text(position: Any) -> str:
    return position_text(None if position is None else position.position)


def _subscription_row(sub: Any) -> dict[str, Any]:
    return {"name": sub.name, "connected": sub.connected, "type": sub.type or None,
            "consumers": len(sub.consumers) if sub.type == "failover" else int(sub.connected),
            "consumer_names": sub.consumers,
            "backlog_entries": sub.backlog_entries,
            "updated_ms": max((p.updated_ms for p in sub.partitions), default=0),
            "partitions": [{"partition": p.partition, "backlog_entries": p.backlog_entries,
                            "consumer": p.consumer or None,
                            "mark_delete": None if p.mark_delete is None
                            else p.mark_delete.position.to_json(),
                            "start": None if p.start is None else p.start.position.to_json(),
                            "updated_ms": p.updated_ms} for p in sub.partitions]}


def _per_partition(show: Callable[[dict[str, Any]], str]) -> Callable[[Any], str]:
    def cell(parts: Any) -> str:
        return ", ".join(f"p{p['partition']} {show(p)}" for p in parts) or "-"

    return cell


SUBSCRIPTION_COLUMNS = (
    field("name", header="subscription", no_wrap=True),
    field("connected", lambda v: "yes" if v else "no"),
    field("type", lambda v: v or "-"),
    field("consumers"),
    field("backlog_entries", lambda v: f"{v:,}", header="backlog"),
    field("partitions", _per_partition(lambda p: position_text(p["mark_delete"])),
          header="mark-delete"),
    field("updated_ms", human_age_ms, header="acked"),
    field("partitions", _per_partition(lambda p: f"{p['backlog_entries']:,}"),
          header="backlog per partition", wide_only=True),
    field("partitions", _per_partition(lambda p: position_text(p["start"])),
          header="start", wide_only=True),
    field("partitions", _per_partition(lambda p: p["consumer"] or "-"),
          header="failover consumer per partition", wide_only=True),
)


@app.command()
def subscriptions(
    name: str,
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
    as_json: bool = typer.Option(False, "--json", help="Print the JSON list it printed "
                                 "before -o (-o json: under a \"subscriptions\" key)."),
) -> None:
    """List a stream's subscriptions: connected or not, backlog (entries), mark-delete
    position per partition (ledger:entry), last acknowledgement."""
    fmt = output_format(output)
    subs: list[Any] = _run(members, directory, lambda c: c.subscriptions(name))
    rows = [_subscription_row(s) for s in subs]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows and fmt in ("table", "wide"):
        console.print(f"stream {name!r} has no subscriptions")
        return
    emit(console, fmt, "subscriptions", rows, SUBSCRIPTION_COLUMNS,
         title=f"subscriptions of {name}")


@app.command()
def unsubscribe(
    name: str,
    subscription: str = typer.Option(..., "--subscription", "-s", help="Subscription name."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
    force: bool = typer.Option(False, "--force", help="Even while a consumer holds it (its "
                               "next acknowledgement fails)."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Delete a subscription and its cursors (retention stops waiting for it)."""
    if not yes:
        typer.confirm(f"delete subscription {subscription!r} of stream {name!r}?", abort=True)
    _run(members, directory, lambda c: c.unsubscribe(name, subscription, force=force))
    console.print(f"deleted subscription {subscription!r} of stream {name!r}")


@app.command("reset-cursor")
def reset_cursor(
    name: str,
    subscription: str = typer.Option(..., "--subscription", "-s", help="Subscription name."),
    to: str = typer.Option(..., "--to", help="earliest, latest, or a publish time in ms "
                           "since the epoch."),
    force: bool = typer.Option(False, "--force", help="Even while a consumer holds it (its "
                               "next acknowledgement fails)."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Make a subscription consume again from a point (Pulsar's reset-cursor)."""
    target: Any = to
    if to not in ("earliest", "latest"):
        try:
            target = int(to)
        except ValueError:
            raise typer.BadParameter(f"--to {to!r}: expected earliest, latest or a publish "
                                     "time in ms") from None
    starts = _run(members, directory,
                  lambda c: c.reset_cursor(name, subscription, target, force=force))
    console.print(f"subscription {subscription!r} of {name!r} now starts at " + ", ".join(
        f"p{p} {_position_text(s)}" for p, s in enumerate(starts)))


STATS_INTERVAL_S_DEFAULT = 1.0


def _at_least(exact: bool, text: str) -> str:
    return text if exact else f"≥ {text}"


STATS_PARTITION_COLUMNS = (
    field("partition", header="part"),
    Column("in msg/s", lambda r: _at_least(r["in_exact"], human_rate(r["in_msgs_per_s"], "msg"))),
    Column("in bytes/s", lambda r: _at_least(r["in_exact"],
                                             human_rate(r["in_bytes_per_s"], "B"))),
    field("entries", lambda v: f"{v:,}"),
    Column("storage", lambda r: _at_least(r["storage_exact"], human_bytes(r["storage_bytes"]))),
    field("producers", header="prod"),
    field("in_entries_per_s", lambda v: human_rate(v, "entries"), header="in entries/s",
          wide_only=True),
    field("ledgers", wide_only=True),
)

STATS_SUBSCRIPTION_COLUMNS = (
    field("subscription", no_wrap=True),
    field("partition", header="part"),
    field("backlog_entries", lambda v: f"{v:,}", header="backlog (entries)"),
    field("out_entries_per_s", lambda v: human_rate(v, "entries"), header="acked"),
    field("consumers", header="cons"),
)


def _stats_subscription_rows(data: dict[str, Any], wide: bool) -> list[dict[str, Any]]:
    rows = []
    for sub, stats in data["total"]["subscriptions"].items():
        rows.append({"subscription": sub, "partition": "all", **stats})
        if wide:
            rows += [{"subscription": sub, "partition": part["partition"],
                      **part["subscriptions"][sub]}
                     for part in data["partitions"] if sub in part["subscriptions"]]
    return rows


@app.command()
def stats(
    name: str,
    interval: float = typer.Option(STATS_INTERVAL_S_DEFAULT, "--interval", min=0.001,
                                   max=300.0, help="Seconds between the two samples the "
                                   "rates come from."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
) -> None:
    """Rates, backlog and storage per partition and in total (pulsar-admin topics stats).

    Rates compare two samples --interval seconds apart: in msg/s and bytes/s
    count the entries added meanwhile (read back, at most 5,000 per partition;
    past that they are lower bounds, shown "≥"); "acked" is entries per second
    the subscription's mark-delete moved. Storage counts closed ledgers: while
    the open ledger holds entries it is a lower bound ("≥"), as its size is not
    known without reading it. -o json|yaml: raw numbers (bytes, per second).
    """
    fmt = output_format(output)
    data: dict[str, Any] = _run(members, directory,
                                lambda c: c.stats(name, interval_s=interval))
    if fmt in ("json", "yaml"):
        emit_document(fmt, data)
        return
    total = {"partition": "total", **data["total"]}
    console.print(f"[bold]{escape(name)}[/]: rates from two samples {data['interval_s']:.2f} s "
                  f"apart (--interval {interval:g})")
    rows = [*data["partitions"], total] if len(data["partitions"]) > 1 else data["partitions"]
    emit(console, fmt, "partitions", rows, STATS_PARTITION_COLUMNS, title="partitions")
    subs = _stats_subscription_rows(data, fmt == "wide")
    if subs:
        emit(console, fmt, "subscriptions", subs, STATS_SUBSCRIPTION_COLUMNS,
             title="subscriptions (acked: entries/s)")
    else:
        console.print(f"stream {name!r} has no subscriptions")
