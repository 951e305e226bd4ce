"""Settings of the network layer: limits (:class:`RpcConfig`) and security
(:class:`RpcSecurityConfig`). Every bound carries its unit in its name."""

from __future__ import annotations

from quorumlog.config import Config, require

from ._frame import MAX_FRAME_BYTES_WIRE, MIN_FRAME_LIMIT_BYTES

KIB = 1024
MIB = 1024 * KIB


class RpcConfig(Config, frozen=True):
    """Limits of one endpoint (client or server) of the RPC layer."""

    # Largest frame (header + body + payload) sent or accepted. Bounds the memory
    # one peer can make us allocate; a bookie entry (<= a few MiB) must fit.
    max_frame_bytes: int = 16 * MIB
    # Requests a client keeps in flight on one connection; callers beyond it
    # wait for capacity (backpressure) until their deadline.
    max_in_flight_requests: int = 1024
    # Handlers a server runs at once for one connection; beyond it the server
    # stops reading from that connection until handlers finish.
    server_max_in_flight_requests: int = 1024
    # Connections one server accepts at once; more are closed on accept.
    server_max_connections: int = 4096
    # Deadline of a call when the caller gives none.
    default_request_timeout_s: float = 30.0
    # TCP connect + TLS handshake + hello round trip.
    connect_timeout_s: float = 10.0
    # A server closes a connection whose hello (and TLS handshake) does not
    # arrive in time. Short: a client sends its hello right after connecting,
    # and a half-sent hello must not hold a connection and its buffer for long.
    handshake_timeout_s: float = 5.0
    # Frames produced in one loop iteration are written with one writelines;
    # once this many bytes are waiting they are written at once.
    write_coalesce_max_bytes: int = 1 * MIB
    # The transport pauses the protocol above this many unsent bytes.
    write_buffer_high_water_bytes: int = 4 * MIB
    # Size of a receive chunk; a frame larger than this gets a chunk of its own.
    read_chunk_bytes: int = 256 * KIB
    # Receive buffers all connections of one server may hold together (frames
    # being received). A connection whose buffer growth passes it is closed, so
    # hostile or stalled senders cannot push a node out of memory.
    server_max_buffered_bytes: int = 256 * MIB
    # Connections one Pool keeps open (one per address).
    pool_max_connections: int = 1024
    # How long Server.close() waits for cancelled handlers to finish.
    close_timeout_s: float = 5.0

    def validate(self) -> None:
        require(
            MIN_FRAME_LIMIT_BYTES <= self.max_frame_bytes <= MAX_FRAME_BYTES_WIRE,
            f"max_frame_bytes must be in [{MIN_FRAME_LIMIT_BYTES}, {MAX_FRAME_BYTES_WIRE}]",
        )
        for name in (
            "max_in_flight_requests",
            "server_max_in_flight_requests",
            "server_max_connections",
            "write_coalesce_max_bytes",
            "write_buffer_high_water_bytes",
            "pool_max_connections",
            "server_max_buffered_bytes",
        ):
            require(getattr(self, name) > 0, f"{name} must be positive")
        for name in (
            "default_request_timeout_s",
            "connect_timeout_s",
            "handshake_timeout_s",
            "close_timeout_s",
        ):
            require(getattr(self, name) > 0, f"{name} must be positive")
        require(
            self.server_max_buffered_bytes >= self.max_frame_bytes,
            "server_max_buffered_bytes must be at least max_frame_bytes "
            "(one whole frame must fit)",
        )
        require(
            self.read_chunk_bytes >= 4 * KIB,
            "read_chunk_bytes must be at least 4096",
        )


class RpcSecurityConfig(Config, frozen=True):
    """TLS (optionally mutual) and shared-token authentication.

    The same class configures both ends. A server with ``tls_enabled`` needs its
    certificate and key; with ``tls_require_client_cert`` it also needs
    ``tls_ca_path`` and refuses clients without a certificate signed by that CA.
    A client with ``tls_enabled`` verifies the server against ``tls_ca_path``
    (the system CAs when unset) and the server's name (``tls_server_hostname``,
    default the host it connects to), and presents its own certificate when
    one is configured. ``token``, when set on
    the server, must be presented by every client in its hello frame.
    """

    tls_enabled: bool = False
    tls_cert_path: str | None = None  # PEM certificate chain of this endpoint
    tls_key_path: str | None = None  # PEM private key of this endpoint
    tls_ca_path: str | None = None  # PEM CA bundle that signs the peers
    tls_require_client_cert: bool = True  # server side: mutual TLS
    tls_server_hostname: str | None = None  # client side: name to verify (default: host)
    token: str | None = None  # shared secret; compared in constant time

    def validate(self) -> None:
        require(
            (self.tls_cert_path is None) == (self.tls_key_path is None),
            "tls_cert_path and tls_key_path go together",
        )
        require(self.token is None or len(self.token) > 0, "token must not be empty")


_DEFAULT_SECURITY: dict[str, RpcSecurityConfig] = {}  # "current" -> the process default


def set_default_security(security: RpcSecurityConfig | None) -> None:
    """Set the security of every :class:`Pool` built without one in this process
    (a node sets its ``[security]`` section; ``None`` goes back to the environment)."""
    if security is None:
        _DEFAULT_SECURITY.clear()
        return
    security.validate()
    _DEFAULT_SECURITY["current"] = security


def default_security() -> RpcSecurityConfig:
    """The process-wide client security: set by :func:`set_default_security`, else
    read once from ``QUORUMLOG_SECURITY__<FIELD>`` environment variables (as
    etcdctl reads ``ETCDCTL_*``), so CLI calls, scripts and Spark workers reach a
    cluster with TLS or a token without code changes."""
    current = _DEFAULT_SECURITY.get("current")
    if current is None:
        from quorumlog import config

        current = _DEFAULT_SECURITY["current"] = config.load(RpcSecurityConfig,
                                                             section="security")
    return current
