"""TLS contexts and token checks built from :class:`RpcSecurityConfig`."""

from __future__ import annotations

import hmac
import ssl

from quorumlog.errors import ConfigError

from ._config import RpcSecurityConfig


def server_ssl_context(security: RpcSecurityConfig) -> ssl.SSLContext | None:
    """The server's TLS context, or None when TLS is off."""
    if not security.tls_enabled:
        return None
    if security.tls_cert_path is None or security.tls_key_path is None:
        raise ConfigError("a TLS server needs tls_cert_path and tls_key_path")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, security.tls_cert_path, security.tls_key_path)
    if security.tls_require_client_cert:
        if security.tls_ca_path is None:
            raise ConfigError("tls_require_client_cert needs tls_ca_path (the clients' CA)")
        _load_ca(context, security.tls_ca_path)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(security: RpcSecurityConfig) -> ssl.SSLContext | None:
    """The client's TLS context (verifies the server), or None when TLS is off."""
    if not security.tls_enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if security.tls_ca_path is not None:
        _load_ca(context, security.tls_ca_path)
    if security.tls_cert_path is not None and security.tls_key_path is not None:
        _load(context, security.tls_cert_path, security.tls_key_path)
    return context


def token_matches(expected: str | None, presented: str | None) -> bool:
    """Constant-time token check; a server without a token accepts anyone."""
    if expected is None:
        return True
    if presented is None:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


def _load(context: ssl.SSLContext, cert_path: str, key_path: str) -> None:
    try:
        context.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load TLS certificate {cert_path} / key {key_path}: {exc}"
        ) from None


def _load_ca(context: ssl.SSLContext, ca_path: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_path)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS CA bundle {ca_path}: {exc}") from None
