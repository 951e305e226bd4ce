"""Node processes and the local development cluster.

``quorumlog node --config node.toml`` runs one node (its roles come from the
config); ``quorumlog up/down/status/stop/restart`` manage a local cluster on 127.0.0.1.
"""

from quorumlog.node._cluster import (
    DEFAULT_DIR,
    LOCAL_BOOKIE_TOML,
    RESTART_TIMEOUT_S,
    NodeInfo,
    add_node,
    cluster_security,
    down,
    load,
    meta_addresses,
    restart_node,
    running,
    security_toml,
    status,
    stop_node,
    up,
    wait_serving,
)
from quorumlog.node._config import MetaSection, NodeConfig, NodeSection, load_node_config
from quorumlog.node._process import EXIT_CONFIG, META_ONLY_ENV, run_node

__all__ = [
    "DEFAULT_DIR",
    "EXIT_CONFIG",
    "LOCAL_BOOKIE_TOML",
    "META_ONLY_ENV",
    "RESTART_TIMEOUT_S",
    "MetaSection",
    "NodeConfig",
    "NodeInfo",
    "NodeSection",
    "add_node",
    "cluster_security",
    "down",
    "load",
    "load_node_config",
    "meta_addresses",
    "restart_node",
    "run_node",
    "running",
    "security_toml",
    "status",
    "stop_node",
    "up",
    "wait_serving",
]
