"""``quorumlog console`` against a real local cluster: the JSON API and the pages
show what the CLI's JSON shows; the charts' rates and backlog come from the
console's own samples; and (when Debian's chromium and chromium-driver are
installed) a real headless browser loads every page and writes a screenshot.

One 1-node cluster for the module (E/Qw/Qa 1/1/1, a table with 1 replica):
a stream with data and a subscription, a ledger left open, a table.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from typer.testing import CliRunner

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.cli import app
from quorumlog.console import Console, ConsoleConfig, History, Point, Snapshot, line_chart
from quorumlog.ledger import BlockingLedgerClient
from quorumlog.stream import BlockingStreamClient, ConsumerConfig, StreamConfig
from quorumlog.table import BlockingTableClient

CONSOLE_START_TIMEOUT_S = 30
MESSAGES = 30
LEADERS_TIMEOUT_S = 30
BROWSER_WAIT_S = 5


@dataclass
class Cluster:
    directory: Path
    members: list[str]
    ledger_id: int


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The CLI configures logging onto CliRunner's streams; put it back afterwards."""
    saved = structlog.get_config()
    handlers = list(logging.getLogger().handlers)
    yield
    structlog.configure(**saved)
    logging.getLogger().handlers[:] = handlers


def cli_json(directory: Path, *args: str) -> Any:
    """The CLI's JSON, in process (the same commands, without 1 s of start-up each)."""
    result = CliRunner().invoke(app, [*args, "--dir", str(directory)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def produce(members: list[str], count: int) -> None:
    with BlockingStreamClient(members) as streams:
        producer = streams.producer("events")
        for i in range(count):
            producer.send(f"m{i}".encode(), key=f"k{i}")
        producer.flush()
        producer.close()


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("console-cluster")
    with cluster.running(directory, 1) as members:
        with BlockingStreamClient(members) as streams:
            streams.create_stream("events", StreamConfig(
                partitions=2, ensemble_size=1, write_quorum=1, ack_quorum=1))
            consumer = streams.subscribe("events", "audit", config=ConsumerConfig(
                initial_position="earliest"))
            consumer.close()
        produce(members, MESSAGES)
        with BlockingLedgerClient(members) as ledgers:
            handle = ledgers.create_ledger(1, 1, 1)
            for i in range(5):
                handle.append(f"entry {i}".encode())
            ledger_id = handle.id  # left open: the console asks its LAC
        with BlockingTableClient(members) as tables:
            tables.create_table("kv", partitions=2, replicas=1)
            tables.set("kv", b"h", b"s", b"v")
        # The scheduler learns each partition's leader from a heartbeat: wait for
        # it, so the console and the CLI read the same settled view.
        deadline = time.monotonic() + LEADERS_TIMEOUT_S
        while not all(g["leader"] for g in cli_json(directory, "table", "info", "kv", "-o",
                                                    "json")["partition_groups"]):
            assert time.monotonic() < deadline, "table kv has partitions without a leader"
            time.sleep(0.2)
        yield Cluster(directory, members, ledger_id)


def check_against_cli(snap: dict[str, Any], local: Cluster) -> None:
    """The console's snapshot shows what ``status``, ``stream info``, ``ledger
    info``, ``table info`` and ``recovery status`` print as JSON."""
    nodes = cli_json(local.directory, "status", "-o", "json")["nodes"]
    meta_rows = {r["address"]: r for r in nodes if "meta" in r["roles"]}
    assert {m["address"] for m in snap["members"]} == set(meta_rows)
    for member in snap["members"]:
        row = meta_rows[member["address"]]
        assert member["role"] == row["meta_role"]
        assert member["term"] == row["term"]
        assert member["leader"] == (row["leader"] == member["id"])
    bookie_rows = {r["address"]: r["bookie"] for r in nodes if "bookie" in r["roles"]}
    assert {b["address"] for b in snap["bookies"]} == set(bookie_rows)
    for bookie in snap["bookies"]:
        row = bookie_rows[bookie["address"]]
        assert bookie["state"] == row["state"]
        # The disk is shared with the rest of the machine: it moves between two reads.
        assert abs(bookie["disk_usage"] - row["disk_usage"]) < 0.01

    info = cli_json(local.directory, "stream", "info", "events", "--json")
    (stream,) = snap["streams"]
    assert stream["name"] == "events"
    assert [p["ledger_count"] for p in stream["partitions"]] == \
        [p["ledger_count"] for p in info["partitions"]]
    assert [p["ledgers"] for p in stream["partitions"]] == \
        [[lg["ledger_id"] for lg in p["ledgers"]] for p in info["partitions"]]
    assert stream["published_entries"] >= 1
    assert stream["backlog_entries"] == stream["published_entries"]  # nothing acked
    assert [s["name"] for s in stream["subscriptions"]] == ["audit"]

    ledger = cli_json(local.directory, "ledger", "info", str(local.ledger_id), "--json")
    (shown,) = [r for r in snap["ledgers"] if r["id"] == local.ledger_id]
    for key in ("state", "ensemble", "write_quorum", "ack_quorum", "fragments",
                "last_add_confirmed"):
        assert shown[key] == ledger[key], key
    assert shown["last_add_confirmed"] >= 3  # entry 4 carried LAC 3; a later LAC may say 4

    table = cli_json(local.directory, "table", "info", "kv", "-o", "json")
    (kv,) = snap["tables"]
    for key in ("table_id", "partitions", "replicas"):
        assert kv[key] == table[key]
    assert [(g["partition"], g["leader"], g["members"], g["epoch"])
            for g in kv["partition_groups"]] == \
        [(g["partition"], g["leader"], g["members"], g["epoch"])
         for g in table["partition_groups"]]

    recovery = cli_json(local.directory, "recovery", "status", "--json")
    for key in ("enabled", "auditor", "missing", "draining", "tasks"):
        assert snap["recovery"][key] == recovery[key], key


def test_api_and_pages_show_what_the_cli_shows(local: Cluster) -> None:
    """In process: the console's JSON API against the CLI's JSON, and each page's
    cells carrying the same values."""
    from aiohttp import ClientSession

    async def fetch_all() -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
        console = Console(ConsoleConfig(members=tuple(local.members), port=0, interval_s=0.5))
        await console.start()
        try:
            base = f"http://127.0.0.1:{console.port}"
            async with ClientSession() as http:
                async with http.get(f"{base}/api/snapshot") as reply:
                    assert reply.status == 200
                    snap = await reply.json()
                pages = {}
                for path in ("/", "/streams", "/ledgers", "/tables", "/recovery"):
                    async with http.get(base + path) as reply:
                        assert reply.status == 200
                        assert reply.content_type == "text/html"
                        pages[path] = await reply.text()
                async with http.get(f"{base}/api/tables") as reply:
                    assert set(await reply.json()) == {"taken_ms", "tables", "errors"}
                async with http.get(f"{base}/api/history") as reply:
                    history = await reply.json()
        finally:
            await console.stop()
        return snap, pages, history

    snap, pages, history = rpc.run(fetch_all())
    assert snap["errors"] == {}
    check_against_cli(snap, local)

    leader = next(m for m in snap["members"] if m["leader"])
    assert re.search(rf'<tr id="member-{leader["id"]}" class="leader">.*?'
                     rf'<td data-k="term" class="n">{leader["term"]}</td>', pages["/"])
    for bookie in snap["bookies"]:
        assert f'<tr id="bookie-{bookie["address"]}">' in pages["/"]
        assert f'<td data-k="state">{bookie["state"]}</td>' in pages["/"]
    stream = snap["streams"][0]
    assert (f'<td data-k="backlog_entries" class="n">{stream["backlog_entries"]}</td>'
            in pages["/streams"])
    assert "<svg" in pages["/streams"] and 'http-equiv="refresh"' in pages["/streams"]
    assert f'<tr id="ledger-{local.ledger_id}">' in pages["/ledgers"]
    assert '<tr id="group-kv-1">' in pages["/tables"]
    assert '<td data-k="members">1</td>' in pages["/tables"]
    assert '<td data-k="quorums">1/1/1</td>' in pages["/streams"]
    assert f'id="recovery-auditor">{snap["recovery"]["auditor"]}<' in pages["/recovery"]
    assert f"backlog:{stream['name']}" in history["series"]


def snapshot_with(t_ms: int, published: int, backlog: int) -> Snapshot:
    stream = {"name": "s", "published_entries": published, "backlog_entries": backlog}
    return Snapshot(taken_ms=t_ms, streams=[stream])


def test_history_rates_backlog_and_bounds() -> None:
    history = History(samples_max=3)
    history.add(snapshot_with(1_000, 100, 5))
    assert history.get("rate:s") == []  # one sample: no rate yet
    history.add(snapshot_with(3_000, 300, 7))
    assert history.get("rate:s") == [Point(3_000, 100.0)]  # 200 entries in 2 s
    history.add(snapshot_with(4_000, 50, 0))  # deleted and created again: no rate
    assert history.latest("rate:s") == 100.0
    history.add(snapshot_with(5_000, 60, 1))
    assert history.latest("rate:s") == 10.0
    assert [p.value for p in history.get("backlog:s")] == [7, 0, 1]  # bounded: oldest gone


def test_chart_draws_every_sample_and_waits_for_two() -> None:
    assert "collecting samples" in line_chart("rate", [("s", [Point(1, 1.0)])], "entries/s")
    svg = line_chart("rate", [("s", [Point(0, 0.0), Point(1000, 5.0), Point(2000, 2.5)]),
                              ("t", [])], "entries/s")
    (points,) = re.findall(r'<polyline [^>]*points="([^"]+)"', svg)
    assert len(points.split()) == 3
    assert "s: 2.5 entries/s" in svg and "t: - entries/s" in svg


def test_bad_config_is_a_clear_error() -> None:
    from quorumlog.errors import UsageError

    with pytest.raises(UsageError, match="--interval"):
        ConsoleConfig(members=("127.0.0.1:1",), interval_s=0.01).validate()
    with pytest.raises(UsageError, match="members"):
        ConsoleConfig(members=()).validate()


# ----- a real headless browser ------------------------------------------------------------


def chrome_driver(tmp_path: Path) -> Any:
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (./scripts/setup.sh installs the dev extra)")
    binary = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("no chromium/chromedriver on PATH: install Debian's chromium and "
                    "chromium-driver (scripts/setup.sh does, as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1600", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        # Pages reload themselves: a lookup during a reload waits for the new page.
        driver.implicitly_wait(BROWSER_WAIT_S)
        return driver
    except WebDriverException as exc:
        pytest.skip(f"chromium cannot start here: {exc.msg}")


@pytest.fixture
def console_url(local: Cluster, tmp_path: Path) -> Iterator[str]:
    """``quorumlog console`` as its own process, as a user runs it."""
    log = (tmp_path / "console.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "quorumlog", "console", "--dir", str(local.directory),
         "--port", "0", "--interval", "0.5"], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the first sample is in
        found = re.search(r"http://[\d.]+:\d+/", line)
        if found is None:
            log.seek(0)
            pytest.fail(f"the console did not start: {line!r} {log.read()}")
        yield found.group(0)
    finally:
        proc.terminate()
        proc.wait(timeout=CONSOLE_START_TIMEOUT_S)
        log.close()


def cell(driver: Any, row_id: str, key: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, f'[id="{row_id}"] td[data-k="{key}"]').text)


@pytest.mark.slow  # about 20 s on a loaded 2-core box: a browser start and five pages
def test_browser_pages_show_the_cluster(local: Cluster, console_url: str,
                                        tmp_path: Path) -> None:
    """Chromium loads every page; the cells match ``status --json`` and the API; the
    streams page draws the rate chart from the console's samples; screenshots
    are written for review."""
    import urllib.request

    from selenium.webdriver.common.by import By

    driver = chrome_driver(tmp_path)
    try:
        produce(local.members, MESSAGES)  # a rate to chart between two samples
        deadline = time.monotonic() + CONSOLE_START_TIMEOUT_S
        while True:
            with urllib.request.urlopen(console_url + "api/history", timeout=5) as reply:
                series = json.load(reply)["series"]
            if any(v for _, v in series.get("rate:events", [])):
                break
            assert time.monotonic() < deadline, f"no rate sampled: {series}"
            time.sleep(0.2)

        nodes = cli_json(local.directory, "status", "-o", "json")["nodes"]
        shots = []
        driver.get(console_url)
        assert driver.title == "quorumlog cluster"
        for row in nodes:
            assert cell(driver, f"member-{row['id']}", "role") == row["meta_role"]
            assert cell(driver, f"member-{row['id']}", "term") == str(row["term"])
            assert cell(driver, f"bookie-{row['address']}", "state") == row["bookie"]["state"]
        shots.append(tmp_path / "console-cluster.png")
        driver.save_screenshot(str(shots[-1]))

        with urllib.request.urlopen(console_url + "api/streams", timeout=5) as reply:
            (stream,) = json.load(reply)["streams"]
        driver.get(console_url + "streams")
        # The page may be a newer sample than the API answer: the backlog only grows.
        assert int(cell(driver, "stream-events", "backlog_entries")) >= stream["backlog_entries"]
        assert cell(driver, "stream-events", "partitions") == "2"
        chart = driver.find_element(By.CSS_SELECTOR, 'svg[aria-label="publish rate"]')
        assert chart.find_elements(By.TAG_NAME, "polyline")
        shots.append(tmp_path / "console-streams.png")
        driver.save_screenshot(str(shots[-1]))

        ledger = cli_json(local.directory, "ledger", "info", str(local.ledger_id), "--json")
        for path, row_id, key, expected in (
                ("ledgers", f"ledger-{local.ledger_id}", "last_entry",
                 str(ledger["last_add_confirmed"])),
                ("tables", "group-kv-0", "members", "1"),
                ("recovery", None, None, None)):
            driver.get(console_url + path)
            assert driver.title == f"quorumlog {path}"
            if row_id is not None:
                assert cell(driver, row_id, key) == expected
            shots.append(tmp_path / f"console-{path}.png")
            driver.save_screenshot(str(shots[-1]))
        assert driver.find_element(By.ID, "recovery-enabled").text == "enabled"
        for shot in shots:
            assert shot.stat().st_size > 0
            print(f"screenshot: {shot}")
    finally:
        driver.quit()
