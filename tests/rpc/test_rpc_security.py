"""Mutual TLS and token authentication; refused peers never disturb others."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trustme
from structlog.testing import capture_logs

from quorumlog import rpc
from quorumlog.rpc._errors import error_from_wire
from quorumlog.rpc._messages import ErrorResponse

from .support import EchoRequest, hello_frame, read_until_eof, run, started


class Pki:
    """A cluster CA, a rogue CA, and PEM files for the certificates we need."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = trustme.CA()
        self.rogue_ca = trustme.CA()
        self.ca_path = self._write("ca.pem", self.ca.cert_pem.bytes())
        self.server = self._issue(self.ca, "server", "127.0.0.1", "localhost")
        self.client = self._issue(self.ca, "client", "client.quorumlog")
        self.rogue_client = self._issue(self.rogue_ca, "rogue", "client.quorumlog")

    def _write(self, name: str, data: bytes) -> str:
        path = self.directory / name
        path.write_bytes(data)
        return str(path)

    def _issue(self, ca: trustme.CA, name: str, *identities: str) -> tuple[str, str]:
        cert = ca.issue_cert(*identities)
        chain = b"".join(blob.bytes() for blob in cert.cert_chain_pems)
        key = cert.private_key_pem.bytes()
        return self._write(f"{name}.crt", chain), self._write(f"{name}.key", key)

    def server_security(self, **extra: Any) -> rpc.RpcSecurityConfig:
        return self._security(self.server, extra)

    def client_security(
        self, identity: tuple[str, str] | None, **extra: Any
    ) -> rpc.RpcSecurityConfig:
        return self._security(identity, extra)

    def _security(
        self, identity: tuple[str, str] | None, extra: dict[str, Any]
    ) -> rpc.RpcSecurityConfig:
        cert, key = identity if identity else (None, None)
        return rpc.RpcSecurityConfig(
            tls_enabled=True,
            tls_cert_path=cert,
            tls_key_path=key,
            tls_ca_path=self.ca_path,
            **extra,
        )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


async def refused_while_other_served(
    server: rpc.Server, good: rpc.RpcSecurityConfig, bad: rpc.RpcSecurityConfig
) -> rpc.AuthenticationError:
    """Connect a good client, fail a bad one, check the good one still works."""
    conn = await rpc.connect("127.0.0.1", server.port, security=good)
    try:
        with pytest.raises(rpc.AuthenticationError) as caught:
            await rpc.connect("127.0.0.1", server.port, security=bad)
        assert (await conn.call(EchoRequest(n=3), payload=b"still here")).n == 3
        again = await rpc.connect("127.0.0.1", server.port, security=good)
        await again.close()
        return caught.value
    finally:
        await conn.close()


def test_mutual_tls_round_trip(pki: Pki) -> None:
    async def body() -> None:
        server = await started(security=pki.server_security())
        conn = await rpc.connect("127.0.0.1", server.port, security=pki.client_security(pki.client))
        try:
            response, data = await conn.call_with_payload(EchoRequest(n=1), payload=b"e" * 70_000)
            assert response.n == 1 and data == b"e" * 70_000
            assert len(await conn.call_many([EchoRequest(n=i) for i in range(200)])) == 200
        finally:
            await conn.close()
            await server.close()

    run(body())


@pytest.mark.parametrize("which", ["rogue CA", "no client certificate"])
def test_client_certificate_is_required_and_checked(pki: Pki, which: str) -> None:
    bad_identity = pki.rogue_client if which == "rogue CA" else None

    async def body() -> rpc.AuthenticationError:
        server = await started(security=pki.server_security())
        try:
            return await refused_while_other_served(
                server, pki.client_security(pki.client), pki.client_security(bad_identity)
            )
        finally:
            await server.close()

    error = run(body())
    assert "TLS" in error.message and not error.retriable


def test_client_refuses_a_server_it_does_not_trust(pki: Pki, tmp_path: Path) -> None:
    rogue_ca = tmp_path / "rogue-ca.pem"
    rogue_ca.write_bytes(pki.rogue_ca.cert_pem.bytes())
    cert, key = pki.client

    async def body() -> None:
        server = await started(security=pki.server_security())
        distrustful = rpc.RpcSecurityConfig(
            tls_enabled=True, tls_cert_path=cert, tls_key_path=key, tls_ca_path=str(rogue_ca)
        )
        try:
            with pytest.raises(rpc.AuthenticationError, match="TLS handshake"):
                await rpc.connect("127.0.0.1", server.port, security=distrustful)
        finally:
            await server.close()

    run(body())


def test_plain_tcp_client_against_a_tls_server_is_refused(pki: Pki) -> None:
    async def body() -> None:
        server = await started(security=pki.server_security())
        try:
            with pytest.raises(rpc.ConnectionClosedError):
                await rpc.connect(
                    "127.0.0.1", server.port, config=rpc.RpcConfig(connect_timeout_s=2.0)
                )
            conn = await rpc.connect(
                "127.0.0.1", server.port, security=pki.client_security(pki.client)
            )
            assert (await conn.call(EchoRequest(n=1))).n == 1
            await conn.close()
        finally:
            await server.close()

    run(body())


@pytest.mark.parametrize("presented", ["wrong-token", None])
def test_token_is_checked(presented: str | None) -> None:
    async def body() -> tuple[rpc.AuthenticationError, list[MutableMapping[str, Any]]]:
        server = await started(security=rpc.RpcSecurityConfig(token="s3cret"))
        try:
            with capture_logs() as logs:
                error = await refused_while_other_served(
                    server,
                    rpc.RpcSecurityConfig(token="s3cret"),
                    rpc.RpcSecurityConfig(token=presented),
                )
            return error, logs
        finally:
            await server.close()

    error, logs = run(body())
    assert "authentication failed: wrong or missing token" in error.message
    assert not error.retriable
    assert any(e.get("kind") == "auth" and e["log_level"] == "warning" for e in logs)


def test_token_refusal_is_a_clear_error_frame_on_the_wire() -> None:
    async def body() -> bytes:
        server = await started(security=rpc.RpcSecurityConfig(token="s3cret"))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(hello_frame(token="guess"))
            data = await read_until_eof(reader)
            writer.close()
            return data
        finally:
            await server.close()

    data = run(body())
    header_bytes = 20
    reply = msgspec.msgpack.decode(data[header_bytes:], type=ErrorResponse)
    error = error_from_wire(reply)
    assert isinstance(error, rpc.AuthenticationError) and "wrong or missing token" in error.message


def test_token_and_mutual_tls_together(pki: Pki) -> None:
    async def body() -> None:
        server = await started(security=pki.server_security(token="t0k"))
        try:
            conn = await rpc.connect(
                "127.0.0.1", server.port, security=pki.client_security(pki.client, token="t0k")
            )
            assert (await conn.call(EchoRequest(n=2))).n == 2
            await conn.close()
            with pytest.raises(rpc.AuthenticationError, match="token"):
                await rpc.connect(
                    "127.0.0.1", server.port, security=pki.client_security(pki.client)
                )
        finally:
            await server.close()

    run(body())
