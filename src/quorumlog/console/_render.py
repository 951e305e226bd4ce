"""HTML pages of the console, charts as inline SVG made here: no script, no CDN,
nothing fetched by the browser but the page itself (it refreshes itself with a
``<meta http-equiv="refresh">``).

Every value cell carries ``data-k`` (the JSON field it shows) inside a row
with an ``id`` (``member-2``, ``bookie-127.0.0.1:4000``, ``stream-events``,
...), so a test or a scraper finds the same value the API returns.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape
from typing import Any

from quorumlog.console._collect import Snapshot
from quorumlog.console._history import History, Point

PAGES = (("/", "cluster"), ("/streams", "streams"), ("/ledgers", "ledgers"),
         ("/tables", "tables"), ("/recovery", "recovery"))
CHART_WIDTH_PX = 520
CHART_HEIGHT_PX = 140
CHART_MARGIN_PX = 40
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")

STYLE = """
body{font-family:sans-serif;margin:1em 2em;color:#222}
nav a{margin-right:1em} nav a.on{font-weight:bold}
table{border-collapse:collapse;margin:.5em 0 1.5em} td,th{border:1px solid #ccc;padding:2px 8px}
th{background:#eee;text-align:left} td.n{text-align:right} .err{color:#b00}
.leader{font-weight:bold} svg{border:1px solid #ddd;background:#fcfcfc;margin:0 1em 1em 0}
"""


def _cell(key: str, value: Any, *, text: str | None = None, numeric: bool = False) -> str:
    shown = (text or "-") if text is not None else ("-" if value is None else str(value))
    cls = ' class="n"' if numeric else ""
    return f'<td data-k="{escape(key)}"{cls}>{escape(shown)}</td>'


def _table(headers: Sequence[str], rows: Sequence[str]) -> str:
    if not rows:
        return "<p><i>none</i></p>"
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _row(row_id: str, cells: Sequence[str], css: str = "") -> str:
    cls = f' class="{css}"' if css else ""
    return f'<tr id="{escape(row_id)}"{cls}>{"".join(cells)}</tr>'


def human_bytes(value: float) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def line_chart(title: str, series: Sequence[tuple[str, Sequence[Point]]], unit: str) -> str:
    """An SVG line chart of ``series`` over time (x: sample time, y: from 0 to the
    largest value), with the title, the y range and a legend."""
    w, h, m = CHART_WIDTH_PX, CHART_HEIGHT_PX, CHART_MARGIN_PX
    points = [p for _, pts in series for p in pts]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 20 * len(series)}"'
             f' role="img" aria-label="{escape(title)}">',
             f'<text x="{m}" y="14" font-size="12" font-weight="bold">{escape(title)}</text>']
    if len(points) < 2:
        parts.append(f'<text x="{m}" y="{h // 2}" font-size="12" fill="#888">'
                     "collecting samples...</text></svg>")
        return "".join(parts)
    t0, t1 = min(p.t_ms for p in points), max(p.t_ms for p in points)
    top = max((p.value for p in points), default=0.0) or 1.0  # an all-zero chart
    span_ms = max(t1 - t0, 1)

    def xy(p: Point) -> str:
        x = m + (p.t_ms - t0) * (w - 2 * m) / span_ms
        y = h - m / 2 - p.value * (h - 1.5 * m) / top
        return f"{x:.1f},{y:.1f}"

    parts.append(f'<line x1="{m}" y1="{h - m / 2}" x2="{w - m}" y2="{h - m / 2}" stroke="#999"/>')
    parts.append(f'<text x="2" y="{m}" font-size="10">{top:,.1f}</text>'
                 f'<text x="2" y="{h - m / 2}" font-size="10">0</text>'
                 f'<text x="{w - m}" y="{h - 4}" font-size="10" text-anchor="end">'
                 f'last {span_ms / 1000:.0f} s ({escape(unit)})</text>')
    for i, (label, pts) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        if pts:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                         f'points="{" ".join(xy(p) for p in pts)}"/>')
        last = f"{pts[-1].value:,.1f}" if pts else "-"
        parts.append(f'<text x="{m}" y="{h + 14 + 20 * i}" font-size="11" fill="{color}">'
                     f"{escape(label)}: {last} {escape(unit)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def page(path: str, title: str, body: str, snap: Snapshot | None, refresh_s: float) -> str:
    nav = "".join(f'<a href="{href}"{" class=on" if href == path else ""}>{name}</a>'
                  for href, name in PAGES)
    if snap is None:
        taken = "no sample yet"
    else:
        taken = time.strftime("%H:%M:%S", time.localtime(snap.taken_ms / 1000))
    api = "/api/snapshot" if path == "/" else f"/api{path}"
    return (f'<!doctype html><html><head><meta charset="utf-8">'
            f'<meta http-equiv="refresh" content="{refresh_s:g}">'
            f"<title>quorumlog {escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<nav>{nav}</nav><h1>{escape(title)}</h1>"
            f'<p>sampled at <span id="taken">{taken}</span>; refreshes every {refresh_s:g} s; '
            f'as JSON: <a href="{api}">{api}</a></p>{body}</body></html>')


def _errors(snap: Snapshot, *sections: str) -> str:
    return "".join(f'<p class="err" id="error-{s}">{escape(s)}: {escape(snap.errors[s])}</p>'
                   for s in sections if s in snap.errors)


def cluster_body(snap: Snapshot) -> str:
    members = [_row(f"member-{r['id']}", [
        _cell("id", r["id"]), _cell("address", r["address"]), _cell("kind", r["kind"]),
        _cell("role", r["role"]), _cell("term", r.get("term"), numeric=True),
        _cell("leader", r.get("leader"), text="yes" if r.get("leader") else ""),
        _cell("applied_index", r.get("applied_index"), numeric=True),
        _cell("revision", r.get("revision"), numeric=True)],
        "leader" if r.get("leader") else "") for r in snap.members]
    bookies = [_row(f"bookie-{r['address']}", [
        _cell("address", r["address"]), _cell("state", r["state"]),
        _cell("disk_usage", r.get("disk_usage"), numeric=True,
              text=None if r.get("disk_usage") is None else f"{r['disk_usage'] * 100:.1f}%"),
        _cell("ledgers", r.get("ledgers"), numeric=True),
        _cell("labels", r["labels"], text=", ".join(f"{k}={v}" for k, v in
                                                      sorted(r["labels"].items())))])
        for r in snap.bookies]
    leader = next((r for r in snap.members if r.get("leader")), None)
    summary = ("no meta leader" if leader is None else
               f'meta leader <b id="meta-leader">{leader["id"]}</b> at {escape(leader["address"])}'
               f', term <b id="meta-term">{leader["term"]}</b>')
    return (f"<p>{summary}</p>" + _errors(snap, "members", "bookies")
            + "<h2>meta members</h2>"
            + _table(("id", "address", "kind", "role", "term", "leader", "applied", "revision"),
                     members)
            + "<h2>bookies</h2>" + _table(("address", "state", "disk", "ledgers", "labels"),
                                          bookies))


def streams_body(snap: Snapshot, history: History) -> str:
    rows = []
    for s in snap.streams:
        c = s["config"]
        rate = history.latest(f"rate:{s['name']}")
        rows.append(_row(f"stream-{s['name']}", [
            _cell("name", s["name"]), _cell("partitions", len(s["partitions"]), numeric=True),
            _cell("quorums", None, text=f"{c['ensemble_size']}/{c['write_quorum']}/"
                  f"{c['ack_quorum']}"),
            _cell("ledgers", sum(p["ledger_count"] for p in s["partitions"]), numeric=True),
            _cell("published_entries", s["published_entries"], numeric=True),
            _cell("backlog_entries", s["backlog_entries"], numeric=True),
            _cell("rate", rate, text=f"{rate:,.1f}" if rate is not None else "-",
                  numeric=True),
            _cell("subscriptions", None, text=", ".join(
                f"{x['name']} ({x['backlog_entries']}"
                + (f", {x['consumers']} failover consumers" if x.get("type") == "failover"
                   else "") + ")" for x in s["subscriptions"]))]))
    parts = []
    for s in snap.streams:
        parts.append(f"<h3>{escape(s['name'])}: partitions</h3>" + _table(
            ("partition", "ledgers", "entries", "closed bytes", "writer"),
            [_row(f"partition-{s['name']}-{p['partition']}", [
                _cell("partition", p["partition"]),
                _cell("ledgers", None, text=", ".join(map(str, p["ledgers"]))),
                _cell("entries", p["entries"], numeric=True),
                _cell("size_bytes", p["size_bytes"], text=human_bytes(p["size_bytes"]),
                      numeric=True),
                _cell("writer", p["writer"], text="yes" if p["writer"] else "no")])
             for p in s["partitions"]]))
    names = [s["name"] for s in snap.streams]
    charts = (line_chart("publish rate", [(n, history.get(f"rate:{n}")) for n in names],
                         "entries/s")
              + line_chart("backlog", [(n, history.get(f"backlog:{n}")) for n in names],
                           "entries")) if names else ""
    return (_errors(snap, "streams") + f'<div id="charts">{charts}</div>'
            + _table(("stream", "partitions", "E/Qw/Qa", "ledgers", "published", "backlog",
                      "entries/s", "subscriptions (backlog)"), rows) + "".join(parts))


def ledgers_body(snap: Snapshot) -> str:
    rows = []
    for r in snap.ledgers:
        last = r.get("last_add_confirmed", r["last_entry_id"])
        rows.append(_row(f"ledger-{r['id']}", [
            _cell("id", r["id"]), _cell("state", r["state"]),
            _cell("quorums", None, text=f"{r['ensemble']}/{r['write_quorum']}/{r['ack_quorum']}"),
            _cell("last_entry", last, numeric=True),
            _cell("length_bytes", r["length_bytes"], numeric=True),
            _cell("fragments", None, text="; ".join(
                f"from {f['first_entry_id']}: {', '.join(f['bookies'])}"
                for f in r["fragments"]))]))
    return (_errors(snap, "ledgers")
            + _table(("ledger", "state", "E/Qw/Qa", "last entry", "bytes", "ensembles"), rows))


def tables_body(snap: Snapshot, history: History) -> str:
    parts = [_errors(snap, "tables")]
    summary = [_row(f"table-{t['name']}", [
        _cell("name", t["name"]), _cell("table_id", t["table_id"], numeric=True),
        _cell("partitions", t["partitions"], numeric=True),
        _cell("replicas", t["replicas"], numeric=True),
        _cell("duplications", len(t["duplications"]), numeric=True)]) for t in snap.tables]
    parts.append(_table(("table", "id", "partitions", "replicas", "duplications"), summary))
    lag_series = []
    for t in snap.tables:
        parts.append(f"<h3>{escape(t['name'])}: partitions</h3>" + _table(
            ("partition", "leader", "members", "learners", "epoch", "applied", "bytes"),
            [_row(f"group-{t['name']}-{g['partition']}", [
                _cell("partition", g["partition"]), _cell("leader", g["leader"] or None),
                _cell("members", None, text=", ".join(map(str, g["members"]))),
                _cell("learners", None, text=", ".join(map(str, g["learners"]))),
                _cell("epoch", g["epoch"], numeric=True),
                _cell("applied_index", g["applied_index"], numeric=True),
                _cell("size_bytes", g["size_bytes"], numeric=True)])
             for g in t["partition_groups"]]))
        if t["duplications"]:
            parts.append(f"<h3>{escape(t['name'])}: duplications</h3>" + _table(
                ("id", "remote", "state", "fail mode", "lag (ms, max)", "pending decrees"),
                [_row(f"dup-{t['name']}-{d['dup_id']}", [
                    _cell("dup_id", d["dup_id"]), _cell("remote", d["remote"]),
                    _cell("state", d["state"]), _cell("fail_mode", d["fail_mode"]),
                    _cell("lag_ms_max", d["lag_ms_max"], numeric=True),
                    _cell("pending_decrees", d["pending_decrees"], numeric=True)])
                 for d in t["duplications"]]))
            lag_series += [(f"{t['name']}/{d['dup_id']}",
                            history.get(f"dup_lag:{t['name']}/{d['dup_id']}"))
                           for d in t["duplications"]]
    if lag_series:
        parts.insert(1, line_chart("duplication lag", lag_series, "ms"))
    return "".join(parts)


def recovery_body(snap: Snapshot) -> str:
    r = snap.recovery
    if not r:
        return _errors(snap, "recovery")
    missing = [_row(f"missing-{b}", [_cell("bookie", b), _cell("since_ms", since)])
               for b, since in sorted(r["missing"].items())]
    tasks = [_row(f"task-{t['ledger']}", [
        _cell("ledger", t["ledger"]), _cell("bookies", None, text=", ".join(t["bookies"])),
        _cell("state", t["state"]), _cell("attempts", t["attempts"], numeric=True),
        _cell("error", t["error"])]) for t in r["underreplicated"]]
    counts = ", ".join(f"{k} {v}" for k, v in sorted(r["tasks"].items())) or "none"
    return (_errors(snap, "recovery")
            + f'<p>recovery <b id="recovery-enabled">{"enabled" if r["enabled"] else "DISABLED"}'
            f'</b>; auditor <b id="recovery-auditor">{escape(r["auditor"] or "(none)")}</b>; '
            f'draining: <span id="recovery-draining">{escape(", ".join(r["draining"]) or "none")}'
            f'</span>; tasks: <span id="recovery-tasks">{escape(counts)}</span></p>'
            + "<h2>missing bookies</h2>" + _table(("bookie", "since (wall ms)"), missing)
            + "<h2>under-replicated ledgers</h2>"
            + _table(("ledger", "bookies to replace", "state", "attempts", "error"), tasks))
