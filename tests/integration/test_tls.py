"""Transport security: TLS round trips with a throwaway CA (trustme), mutual TLS, plain clients against a TLS
port, and the loopback-only listen defaults."""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from trimq.broker.broker import Broker, open_broker
from trimq.broker.config import BrokerConfig
from trimq.protocol import RemotingCommand, RequestCode, ResponseCode
from trimq.protocol.address import parse_address
from trimq.runtime.client import RemotingClient, RemotingConnectError, RemotingError
from trimq.runtime.server import RemotingServer
from trimq.runtime.settings import ConfigError
from trimq.runtime.tls import TlsConfigError, client_ssl_context, server_ssl_context


@dataclass
class Pki:
    ca: str
    cert: str
    key: str
    client_cert: str  # certificate and key in one file
    other_ca: str  # a CA that signed nothing here


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
    server.private_key_pem.write_to_path(str(d / "server.key"))
    client = ca.issue_cert("client.trimq.test")
    client.private_key_and_cert_chain_pem.write_to_path(str(d / "client.pem"))
    trustme.CA().cert_pem.write_to_path(str(d / "other-ca.pem"))
    return Pki(ca=str(d / "ca.pem"), cert=str(d / "server.pem"), key=str(d / "server.key"),
               client_cert=str(d / "client.pem"), other_ca=str(d / "other-ca.pem"))


@asynccontextmanager
async def tls_broker(tmp_path: Path, pki: Pki, **kw: Any) -> AsyncIterator[Broker]:
    config = BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / "store"), tls_cert_file=pki.cert,
                          tls_key_file=pki.key, **kw)
    async with open_broker(config) as broker:
        yield broker


async def runtime_info(rc: RemotingClient, addr: str) -> RemotingCommand:
    return await rc.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 5)


async def test_tls_round_trip(tmp_path: Path, pki: Pki) -> None:
    async with tls_broker(tmp_path, pki) as broker, \
            RemotingClient(ssl_context=client_ssl_context(pki.ca)) as rc:
        resp = await runtime_info(rc, broker.address)
        assert resp.ok and resp.body["brokerName"] == "broker-a"
        big = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {"pad": "x" * 300_000})
        assert (await rc.invoke(broker.address, big, 5)).ok  # frames larger than one TLS record


async def test_plain_client_against_tls_port_fails_cleanly(tmp_path: Path, pki: Pki) -> None:
    async with tls_broker(tmp_path, pki) as broker:
        async with RemotingClient(connect_timeout_s=2) as plain:
            with pytest.raises(RemotingError):
                await plain.invoke(broker.address, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 3)
        # raw garbage too
        host, port = parse_address(broker.address)
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"\x00\x00\x00\x05hello" * 10)
        with trio.fail_after(5):
            while await stream.receive_some(4096):
                pass  # the broker closes the connection
        await stream.aclose()
        async with RemotingClient(ssl_context=client_ssl_context(pki.ca)) as rc:
            assert (await runtime_info(rc, broker.address)).ok


async def test_client_rejects_a_server_it_cannot_verify(tmp_path: Path, pki: Pki) -> None:
    async with tls_broker(tmp_path, pki) as broker:
        async with RemotingClient(ssl_context=client_ssl_context(pki.other_ca)) as rc:
            with pytest.raises(RemotingConnectError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
                await runtime_info(rc, broker.address)
        async with RemotingClient(ssl_context=client_ssl_context(pki.ca)) as rc:
            assert (await runtime_info(rc, broker.address)).ok


async def test_tls_client_against_plain_port_fails_cleanly(tmp_path: Path, pki: Pki) -> None:
    config = BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / "store"))
    async with open_broker(config) as broker:
        async with RemotingClient(ssl_context=client_ssl_context(pki.ca), connect_timeout_s=2) as rc:
            with pytest.raises(RemotingConnectError):
                await runtime_info(rc, broker.address)
        async with RemotingClient() as plain:
            assert (await runtime_info(plain, broker.address)).ok


async def test_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    async with tls_broker(tmp_path, pki, tls_ca_file=pki.ca, tls_require_client_cert=True) as broker:
        async with RemotingClient(ssl_context=client_ssl_context(pki.ca), connect_timeout_s=2) as no_cert:
            # TLS 1.3: the refusal may only show once the client reads, as a broken connection
            with pytest.raises(RemotingError):
                await runtime_info(no_cert, broker.address)
        with_cert = client_ssl_context(pki.ca, cert=pki.client_cert)
        async with RemotingClient(ssl_context=with_cert) as rc:
            assert (await runtime_info(rc, broker.address)).ok


async def test_tls_with_acl(tmp_path: Path, pki: Pki) -> None:
    acl = tmp_path / "acl.toml"
    acl.write_text('[[accounts]]\naccess_key = "tls-user"\nsecret_key = "tls-secret"\n')
    async with tls_broker(tmp_path, pki, acl_file=str(acl)) as broker:
        ctx = client_ssl_context(pki.ca)
        async with RemotingClient(ssl_context=ctx) as anon, \
                RemotingClient(ssl_context=ctx, credentials=("tls-user", "tls-secret")) as user:
            assert (await runtime_info(anon, broker.address)).code == ResponseCode.NO_PERMISSION
            assert (await runtime_info(user, broker.address)).ok


async def test_remoting_server_serve_with_ssl_context(pki: Pki) -> None:
    async def echo(cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        return RemotingCommand.response_to(cmd, body=cmd.body)

    server = RemotingServer(name="tls-echo")
    server.register(1000, echo)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: server.serve("127.0.0.1", 0, task_status=task_status,
                                                             ssl_context=server_ssl_context(pki.cert, pki.key)))
        async with RemotingClient(ssl_context=client_ssl_context(pki.ca)) as rc:
            assert (await rc.invoke(server.address, RemotingCommand.request(1000, body=b"hi"), 5)).body == b"hi"
        server.shutdown()


def test_bad_tls_settings_are_config_errors(tmp_path: Path, pki: Pki) -> None:
    base: dict[str, Any] = {"listen": "127.0.0.1:0", "store_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match="tls_key_file"):
        BrokerConfig(**base, tls_key_file=pki.key).validate()
    with pytest.raises(ConfigError, match="tls_require_client_cert"):
        BrokerConfig(**base, tls_cert_file=pki.cert, tls_key_file=pki.key, tls_require_client_cert=True).validate()
    with pytest.raises(ConfigError, match=r"TLS: certificate .*missing\.pem"):
        Broker(BrokerConfig(**base, tls_cert_file=str(tmp_path / "missing.pem")))
    with pytest.raises(ConfigError, match="TLS: certificate"):
        Broker(BrokerConfig(**base, tls_cert_file=pki.ca))  # a certificate without its key
    with pytest.raises(TlsConfigError, match=r"CA file .*nope\.pem: no such file"):
        client_ssl_context(str(tmp_path / "nope.pem"))
    with pytest.raises(TlsConfigError, match="without its certificate"):
        client_ssl_context(pki.ca, key=pki.key)
    ctx = client_ssl_context(pki.ca)
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2 and ctx.check_hostname


def test_daemons_listen_on_loopback_by_default() -> None:
    from trimq.namesrv.config import NamesrvConfig

    for listen in (BrokerConfig().listen, NamesrvConfig().listen):
        host, _ = parse_address(listen)
        assert ipaddress.ip_address(host).is_loopback, listen
    assert ipaddress.ip_address(BrokerConfig().metrics_host).is_loopback


async def test_sdk_producer_and_consumer_use_tls_and_acl_from_client_config(tmp_path: Path, pki: Pki) -> None:
    """ClientConfig alone (tls_enable, tls_ca_file, access_key, secret_key) is enough for the SDK to talk to a
    broker with TLS and ACL on, name server embedded on the same TLS port."""
    from trimq.client import Message, Producer, ProducerConfig, PushConsumer, PushConsumerConfig
    from trimq.client.consume.common import ConsumeConcurrentlyStatus

    acl = tmp_path / "acl.toml"
    acl.write_text('[[accounts]]\naccess_key = "svc-key-1"\nsecret_key = "svc-secret-1"\nadmin = true\n')
    async with tls_broker(tmp_path, pki, embedded_namesrv=True, acl_file=str(acl)) as broker:
        common: dict[str, Any] = dict(namesrv_addr=broker.address, tls_enable=True, tls_ca_file=pki.ca,
                                      access_key="svc-key-1", secret_key="svc-secret-1")
        got: list[bytes] = []
        done = trio.Event()

        async def listener(msgs: list[Any], context: Any) -> ConsumeConcurrentlyStatus:
            got.extend(m.body for m in msgs)
            if len(got) >= 3:
                done.set()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        async with Producer(ProducerConfig(producer_group="tls-p", **common)) as producer:
            for i in range(3):
                await producer.send(Message("Secure", b"m%d" % i))
            consumer = PushConsumer(PushConsumerConfig(consumer_group="tls-g",
                                                       consume_from_where="CONSUME_FROM_FIRST_OFFSET", **common))
            consumer.subscribe("Secure", "*")
            consumer.register_message_listener_concurrently(listener)
            async with consumer:
                with trio.fail_after(20):
                    await done.wait()
        assert sorted(got) == [b"m0", b"m1", b"m2"]
        assert broker.acl is not None
        assert broker.acl.denied == 0


def test_client_config_rejects_half_configured_security() -> None:
    from trimq.client.config import ClientConfig
    from trimq.client.config import ConfigError as ClientConfigError

    with pytest.raises(ClientConfigError, match="set both"):
        ClientConfig(access_key="only-the-key")
    with pytest.raises(ClientConfigError, match="tls_enable is false"):
        ClientConfig(tls_ca_file="/some/ca.pem")


async def test_broker_registers_with_a_tls_name_server_and_clients_route_over_tls(tmp_path: Path, pki: Pki) -> None:
    from trimq.client import ClientConfig, ClientInstance
    from trimq.namesrv.config import NamesrvConfig
    from trimq.namesrv.service import open_namesrv

    ns_cfg = NamesrvConfig(listen="127.0.0.1:0", tls_cert_file=pki.cert, tls_key_file=pki.key)
    async with open_namesrv(config=ns_cfg) as ns:
        client_cfg = ClientConfig(namesrv_addr=ns.server.address, tls_enable=True, tls_ca_file=pki.ca)
        async with tls_broker(tmp_path, pki, namesrv_addr=ns.server.address, namesrv_tls=True,
                              tls_ca_file=pki.ca) as broker, ClientInstance(client_cfg) as client:
            await client.api.create_topic(broker.address, "OverTls", read_queue_nums=2, write_queue_nums=2)
            with trio.fail_after(10):
                while not await client.update_topic_route_info_from_name_server("OverTls"):
                    await trio.sleep(0.05)
            assert client.find_broker_address_in_publish(broker.config.broker_name) == broker.address
        # a plain-TCP peer cannot talk to the TLS name server, and it keeps serving
        async with RemotingClient(connect_timeout_s=2) as plain:
            with pytest.raises(RemotingError):
                await plain.invoke(ns.server.address, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), 2)


async def test_the_ha_port_speaks_tls_too_and_keeps_strangers_out(tmp_path: Path, pki: Pki) -> None:
    """The HA port streams every stored message to whoever completes its handshake: with TLS on, it speaks TLS with
    the broker's certificate (mutual TLS when required), and a slave configured like its master replicates over it.
    A plain-TCP peer and a TLS peer without a client certificate get nothing of the log; a slave whose TLS handshake
    hangs (a link that stops forwarding) gives up after ``ha_housekeeping_interval`` and tries again, instead of
    its broker failing; and the master goes on serving its slave throughout."""
    from tests.integration.relay import Relay
    from trimq.broker.store.ha.codec import Hello, StreamBuffer, encode_hello

    tls = {"tls_cert_file": pki.cert, "tls_key_file": pki.key, "tls_ca_file": pki.ca, "tls_require_client_cert": True,
           "ha_send_heartbeat_interval": 100, "ha_housekeeping_interval": 1000}
    client_ctx = client_ssl_context(pki.ca, cert=pki.client_cert)

    async def no_log_from_ha_port(stream: trio.abc.Stream) -> None:
        received = bytearray()
        with trio.fail_after(5):
            try:
                await stream.send_all(encode_hello(Hello(0, 1)))
                while data := await stream.receive_some(4096):
                    received += data
            except trio.BrokenResourceError:
                pass  # refused in the TLS handshake
        buf = StreamBuffer()
        buf.feed(bytes(received))
        assert buf.next_hello_ack() is None, "the HA port answered a peer that is not a slave of this cluster"

    def store_config(name: str, **kw: Any) -> BrokerConfig:
        return BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / name), **tls, **kw)  # type: ignore[arg-type]

    async def send(rc: RemotingClient, addr: str, body: bytes) -> None:
        ext = {"producerGroup": "pg", "topic": "T", "queueId": 0, "sysFlag": 0, "bornTimestamp": 1, "flag": 0,
               "properties": ""}
        assert (await rc.invoke(addr, RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, body), 5)).ok

    async with open_broker(store_config("master")) as master, RemotingClient(ssl_context=client_ctx) as rc, \
            trio.open_nursery() as nursery:
        link = Relay(master.ha_controller.ha_server_addr)
        await nursery.start(link.serve)
        link.blackhole()  # the slave's first TLS handshake hangs
        await send(rc, master.address, b"m0")
        async with open_broker(store_config("slave", broker_role="SLAVE", broker_id=1,
                                            ha_master_address=link.address)) as slave:
            await trio.sleep(1.5)  # past the handshake's time limit: the slave gave up and tries again
            link.heal()
            with trio.fail_after(10):
                while slave.store.commitlog.max_offset != master.store.commitlog.max_offset:
                    await trio.sleep(0.02)
            host, port = parse_address(master.ha_controller.ha_server_addr)
            await no_log_from_ha_port(await trio.open_tcp_stream(host, port))
            no_cert = trio.SSLStream(await trio.open_tcp_stream(host, port), client_ssl_context(pki.ca),
                                     server_hostname=host)
            await no_log_from_ha_port(no_cert)
            await send(rc, master.address, b"m1")
            with trio.fail_after(10):
                while slave.store.commitlog.max_offset != master.store.commitlog.max_offset:
                    await trio.sleep(0.02)
            assert slave.ha_controller.client.connected
        nursery.cancel_scope.cancel()
