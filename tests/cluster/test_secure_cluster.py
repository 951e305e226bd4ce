"""A local cluster with mutual TLS and a shared token, from the node TOML's
``[security]`` table: the nodes' own clients (Raft peers, the bookie's meta
session) use it, the CLI reaches the cluster with ``--security``, and a client
with a wrong token, no certificate or no TLS is refused with a clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.meta import MetaClient

TOKEN = "cluster-secret"


def _issue(ca: trustme.CA, directory: Path, name: str, *identities: str) -> tuple[str, str]:
    cert = ca.issue_cert(*identities)
    chain, key = directory / f"{name}.crt", directory / f"{name}.key"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    key.write_bytes(cert.private_key_pem.bytes())
    return str(chain), str(key)


@pytest.fixture
def secure_cluster(tmp_path: Path) -> Iterator[tuple[Path, rpc.RpcSecurityConfig, Path]]:
    ca, rogue = trustme.CA(), trustme.CA()
    ca_path = tmp_path / "ca.pem"
    ca_path.write_bytes(ca.cert_pem.bytes())
    node_cert, node_key = _issue(ca, tmp_path, "node", "127.0.0.1", "localhost")
    rogue_cert, rogue_key = _issue(rogue, tmp_path, "rogue", "127.0.0.1")
    security = rpc.RpcSecurityConfig(tls_enabled=True, tls_cert_path=node_cert,
                                     tls_key_path=node_key, tls_ca_path=str(ca_path),
                                     token=TOKEN)
    cli_file = tmp_path / "security.toml"
    cli_file.write_text(cluster.security_toml(security))
    (tmp_path / "rogue.toml").write_text(cluster.security_toml(
        security.replace(tls_cert_path=rogue_cert, tls_key_path=rogue_key)))
    directory = tmp_path / "cluster"
    rpc.set_default_security(security)  # up() writes it into every node.toml
    try:
        cluster.up(directory, 1)  # healthy = meta leader + bookie registered over TLS
        yield directory, security, tmp_path
    finally:
        cluster.down(directory)
        rpc.set_default_security(None)


def _cli(*args: str, security_file: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUORUMLOG_SECURITY")}
    prefix = ["--security", str(security_file)] if security_file is not None else []
    return subprocess.run([sys.executable, "-m", "quorumlog", *prefix, *args],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


@pytest.mark.timeout(180)
def test_tls_and_token_from_node_config(
        secure_cluster: tuple[Path, rpc.RpcSecurityConfig, Path]) -> None:
    directory, security, files = secure_cluster
    node_toml = (directory / "node-1" / "node.toml").read_text()
    assert "[security]" in node_toml and f'token = "{TOKEN}"' in node_toml
    members = cluster.meta_addresses(directory)

    async def main() -> None:
        async with MetaClient(members, pool=rpc.Pool(security=security)) as meta:
            await meta.put("/secure/a", b"1")
            kv = await meta.get("/secure/a")
            assert kv is not None and kv.value == b"1"
            # The bookie registered through TLS + token (its own meta session).
            assert await meta.list_keys("/bookies/available/")
        for bad in (security.replace(token="not-the-token"), security.replace(token=None)):
            async with MetaClient(members, pool=rpc.Pool(security=bad), deadline_s=5) as meta:
                with pytest.raises(rpc.AuthenticationError, match="token"):
                    await meta.get("/secure/a")
        for bad in (rpc.RpcSecurityConfig(token=TOKEN),  # plaintext against TLS
                    security.replace(tls_cert_path=None, tls_key_path=None)):  # no client cert
            async with MetaClient(members, pool=rpc.Pool(security=bad), deadline_s=3) as meta:
                with pytest.raises(QuorumlogError):
                    await meta.get("/secure/a")
        # The server kept serving the good client through all of that.
        async with MetaClient(members, pool=rpc.Pool(security=security)) as meta:
            kv = await meta.get("/secure/a")
            assert kv is not None and kv.value == b"1"

    rpc.run(main())
    dir_args = ["--dir", str(directory)]
    put = _cli("meta", "put", "/secure/cli", "from-cli", *dir_args,
               security_file=files / "security.toml")
    assert put.returncode == 0, put.stderr
    got = _cli("meta", "get", "/secure/cli", *dir_args, security_file=files / "security.toml")
    assert got.returncode == 0 and "from-cli" in got.stdout, got.stderr
    rogue = _cli("meta", "get", "/secure/cli", *dir_args, security_file=files / "rogue.toml")
    assert rogue.returncode != 0
    assert "Traceback" not in rogue.stderr, rogue.stderr


@pytest.mark.timeout(180)
def test_metrics_endpoint_uses_tls_and_the_token(
        secure_cluster: tuple[Path, rpc.RpcSecurityConfig, Path]) -> None:
    """Issue 18: the Prometheus endpoint ignored TLS and the token. Now it is
    HTTPS with the node's certificate and mutual TLS like the rpc port, and
    /metrics needs ``Authorization: Bearer <token>``; probes stay open."""
    import ssl
    import urllib.error
    import urllib.request

    directory, security, _ = secure_cluster
    metrics = cluster.load(directory)[0].metrics
    context = ssl.create_default_context(cafile=security.tls_ca_path)
    assert security.tls_cert_path is not None and security.tls_key_path is not None
    context.load_cert_chain(security.tls_cert_path, security.tls_key_path)

    def get(path: str, *, token: str | None = None,
            ctx: ssl.SSLContext | None = context, scheme: str = "https") -> tuple[int, str]:
        request = urllib.request.Request(f"{scheme}://{metrics}{path}")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, context=ctx, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    status, body = get("/metrics", token=TOKEN)
    assert status == 200 and "quorumlog_" in body
    assert get("/metrics")[0] == 401
    assert get("/metrics", token="not-the-token")[0] == 401
    status, body = get("/healthz")
    assert status == 200 and '"ok"' in body
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        get("/metrics", token=TOKEN, ctx=None, scheme="http")  # plaintext is refused
    no_cert = ssl.create_default_context(cafile=security.tls_ca_path)
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError, ssl.SSLError)):
        get("/metrics", token=TOKEN, ctx=no_cert)  # mutual TLS: a client certificate
    assert get("/metrics", token=TOKEN)[0] == 200  # and it kept serving
