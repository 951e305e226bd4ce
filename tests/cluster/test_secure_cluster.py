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
