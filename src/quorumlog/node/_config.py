"""Configuration of one node process (``quorumlog node --config node.toml``).

Example::

    [node]
    id = 1
    data_dir = "/var/lib/quorumlog/node-1"
    listen = "0.0.0.0:7101"              # the address the rpc server binds
    advertise = "10.0.0.1:7101"          # what others dial (default: listen); never 0.0.0.0
    metrics_listen = "127.0.0.1:9101"    # "" disables the Prometheus endpoint
    metrics_advertise = ""               # what status shows (default: metrics_listen)
    roles = ["meta", "bookie", "table"]  # any of: meta, bookie, table

    [meta]
    members = ["1=127.0.0.1:7101", "2=127.0.0.1:7102", "3=127.0.0.1:7103"]
    bootstrap = true                     # a new group with these voters
    tick_interval_ms = 100
    snapshot_entries = 10000
    read_mode = "read_index"             # or "lease": see docs/meta.md for when it is safe
    lease_clock_drift_percent = 10       # lease mode: the lease is cut by this clock bound

    [bookie]                             # see quorumlog.bookie.BookieConfig
    journal_dir = "/disk1/quorumlog/journal"   # default <data_dir>/journal
    ledger_dir = "/disk2/quorumlog/ledgers"    # default <data_dir>/ledgers
    labels = { rack = "r1", zone = "z1" }
    journal_max_wait_us = 500
    journal_max_batch_bytes = 4194304
    flush_interval_ms = 100
    gc_interval_ms = 600000
    gc_live_ratio_threshold = 0.5

    [bookie.storage]                     # see quorumlog.bookie.LedgerStorageConfig
    write_cache_max_bytes = 67108864
    disk_usage_threshold_fraction = 0.95

    [table]                              # optional; see quorumlog.table.TableConfig
    zone = "z1"

    [security]                           # optional; see quorumlog.rpc.RpcSecurityConfig
    tls_enabled = true
    tls_cert_path = "/etc/quorumlog/node-1.pem"   # server cert, also the client cert
    tls_key_path = "/etc/quorumlog/node-1.key"
    tls_ca_path = "/etc/quorumlog/ca.pem"         # signs every node and client
    token = "shared-secret"

Clients (the CLI, scripts, Spark workers) take the same fields from
``QUORUMLOG_SECURITY__<FIELD>`` environment variables or ``quorumlog
--security FILE`` (a TOML file with a ``[security]`` table).

``listen`` is bound; ``advertise`` is the address other nodes and clients
use: the bookie registers in meta under it (it is the bookie's id), and a meta
member's entry in ``[meta] members`` must be it. A wildcard address
(``0.0.0.0``, ``::``) can be listened on but never advertised, so a node
listening on one must set ``advertise`` (docs/deploy.md).

A node without the meta role still needs ``[meta] members``: it is the list
of meta addresses its bookie registers with.

Every field can be overridden from the environment, for example
``QUORUMLOG_NODE__LISTEN=127.0.0.1:7200``.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from quorumlog import config
from quorumlog.bookie import BookieConfig
from quorumlog.config import Config, require
from quorumlog.meta import LEASE_CLOCK_DRIFT_PERCENT, READ_MODES, ReadMode
from quorumlog.recovery import RecoveryConfig
from quorumlog.rpc import RpcSecurityConfig
from quorumlog.stream import TrimmerConfig
from quorumlog.table import TableConfig

KNOWN_ROLES = frozenset({"meta", "bookie", "table"})
# Hosts that mean "every local address" when bound and no address when dialed.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", "*", ""})


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    require(bool(host) and port.isdigit(), f"address {text!r} must look like host:port")
    require(0 < int(port) < 65536, f"port of {text!r} out of range")
    return host, int(port)


def require_advertisable(address: str, field: str, advertise_field: str) -> None:
    """A ConfigError naming ``field`` when ``address`` (its value, or the default of
    ``advertise_field``) is a wildcard address, which nobody can dial."""
    host, _ = parse_address(address)
    require(host not in WILDCARD_HOSTS,
            f"node.{field} = \"{address}\" would be advertised, but it is a wildcard "
            "address that other hosts cannot dial: set node."
            f"{advertise_field} to this host's reachable host:port (an IP or DNS name)")


class NodeSection(Config, frozen=True):
    id: int
    data_dir: str
    listen: str
    # What other nodes and clients dial; "" = listen. The bookie's id.
    advertise: str = ""
    metrics_listen: str = ""
    # What `quorumlog status` shows for the Prometheus endpoint; "" = metrics_listen.
    metrics_advertise: str = ""
    roles: tuple[str, ...] = ("meta",)
    log_level: str = "INFO"

    @property
    def advertise_address(self) -> str:
        """The rpc address others use: ``advertise``, else ``listen``."""
        return self.advertise or self.listen

    @property
    def metrics_advertise_address(self) -> str:
        """The Prometheus address others use ("" when the endpoint is off)."""
        if not self.metrics_listen:
            return ""
        return self.metrics_advertise or self.metrics_listen

    def validate(self) -> None:
        require(self.id >= 1, f"node id must be >= 1, got {self.id}")
        parse_address(self.listen)
        require_advertisable(self.advertise_address, "advertise" if self.advertise else "listen",
                             "advertise")
        if self.metrics_listen:
            parse_address(self.metrics_listen)
            require_advertisable(
                self.metrics_advertise_address,
                "metrics_advertise" if self.metrics_advertise else "metrics_listen",
                "metrics_advertise")
        else:
            require(not self.metrics_advertise,
                    "node.metrics_advertise needs node.metrics_listen (the endpoint is off)")
        unknown = set(self.roles) - KNOWN_ROLES
        require(not unknown, f"unknown roles {sorted(unknown)}; known: {sorted(KNOWN_ROLES)}")


class MetaSection(Config, frozen=True):
    members: tuple[str, ...] = ()
    bootstrap: bool = True
    tick_interval_ms: int = 100
    election_timeout_ticks: int = 10
    snapshot_entries: int = 10_000
    # How the leader confirms it still leads before a linearizable read:
    # read_index (a heartbeat round per read batch) or lease (no round trip
    # while its lease holds; needs clocks whose rates differ by at most
    # lease_clock_drift_percent). Serializable reads never ask the leader.
    read_mode: ReadMode = "read_index"
    lease_clock_drift_percent: int = LEASE_CLOCK_DRIFT_PERCENT
    # The meta group's WAL segments (etcd's 64 MiB); each is preallocated.
    wal_segment_size_bytes: int = 64 * 1024 * 1024

    def member_map(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for item in self.members:
            node_id, sep, address = item.partition("=")
            require(
                sep == "=" and node_id.isdigit(), f"member {item!r} must look like 'id=host:port'"
            )
            parse_address(address)
            out[int(node_id)] = address
        return out

    def validate(self) -> None:
        require(bool(self.members), "[meta] members must list the meta group (id=host:port)")
        self.member_map()
        require(self.tick_interval_ms >= 1, "tick_interval_ms must be >= 1")
        require(self.election_timeout_ticks >= 2, "election_timeout_ticks must be >= 2")
        require(self.snapshot_entries >= 1, "snapshot_entries must be >= 1")
        require(self.wal_segment_size_bytes >= 64 * 1024,
                "[meta] wal_segment_size_bytes must be >= 65536")
        require(self.read_mode in READ_MODES,
                f"read_mode must be one of {list(READ_MODES)}, got {self.read_mode!r}")
        require(0 <= self.lease_clock_drift_percent < 100,
                "lease_clock_drift_percent must be in [0, 100)")


class NodeConfig(Config, frozen=True):
    node: NodeSection
    meta: MetaSection | None = None
    bookie: BookieConfig | None = None
    table: TableConfig | None = None  # [table]: zone, cluster id, Raft timing
    # [recovery]: the auditor and replication worker of a bookie node
    # (quorumlog.recovery.RecoveryConfig; defaults when absent).
    recovery: RecoveryConfig | None = None
    # [trimmer]: the background trimmer candidate of a bookie node, which
    # applies every stream's retention and TTL (quorumlog.stream.TrimmerConfig;
    # defaults when absent).
    trimmer: TrimmerConfig | None = None
    # TLS and token for the node's rpc server and for its own clients (Raft
    # peers, the bookie's meta client): see quorumlog.rpc.RpcSecurityConfig.
    security: RpcSecurityConfig | None = None
    # [clusters]: other clusters by name -> their meta addresses; a table
    # duplicated to a name ships there (docs/duplication.md).
    clusters: dict[str, list[str]] = msgspec.field(default_factory=dict)

    def validate(self) -> None:
        self.node.validate()
        for name, addresses in self.clusters.items():
            require(bool(name) and "/" not in name,
                    f"[clusters] name {name!r} must be non-empty, without '/'")
            require(bool(addresses), f"[clusters] {name} needs its meta addresses")
        if self.security is not None:
            self.security.validate()
            require(not self.security.tls_enabled or self.security.tls_cert_path is not None,
                    "[security] tls_enabled needs tls_cert_path and tls_key_path "
                    "(the node's certificate, for its server and as its client certificate)")
        if "bookie" in self.node.roles:
            require(self.meta is not None and bool(self.meta.members),
                    "role bookie needs [meta] members (the meta addresses it registers with)")
            assert self.meta is not None
            self.meta.validate()
            self.bookie_config.validate()
            if self.recovery is not None:
                self.recovery.validate()
            if self.trimmer is not None:
                self.trimmer.validate()
        if "table" in self.node.roles:
            require(self.meta is not None and bool(self.meta.members),
                    "role table needs [meta] members (the meta addresses it registers with)")
            if self.table is not None:
                self.table.validate()
        if "meta" in self.node.roles:
            require(self.meta is not None, "role meta needs a [meta] section")
            assert self.meta is not None
            self.meta.validate()
            members = self.meta.member_map()
            require(
                self.node.id in members,
                f"node {self.node.id} has role meta but is not in [meta] members",
            )
            advertised = self.node.advertise_address
            require(
                members[self.node.id] == advertised,
                f"[meta] members lists node {self.node.id} at {members[self.node.id]} but the "
                f"node advertises {advertised} (node.advertise, default node.listen): peers dial "
                "the members list, so make the two equal",
            )

    @property
    def data_path(self) -> Path:
        return Path(self.node.data_dir)

    @property
    def bookie_config(self) -> BookieConfig:
        """The [bookie] section (defaults when absent), directories filled in."""
        section = self.bookie if self.bookie is not None else BookieConfig()
        return section.with_directories(self.node.data_dir)

    @property
    def meta_addresses(self) -> list[str]:
        """The meta members' addresses (for clients such as the bookie)."""
        if self.meta is None:
            return []
        return [address for _, address in sorted(self.meta.member_map().items())]


def load_node_config(path: str | os.PathLike[str]) -> NodeConfig:
    return config.load(NodeConfig, path)
