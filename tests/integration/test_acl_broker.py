"""ACL over the wire: a real in-process broker with ``acl_file`` set, clients with and without credentials.

A refused request gets NO_PERMISSION with a remark saying what is missing, its handler is not run (nothing
changes) and the connection stays usable.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from trimq.broker.acl import sign_command
from trimq.broker.broker import Broker, open_broker
from trimq.broker.config import BrokerConfig
from trimq.protocol import RemotingCommand, RequestCode, ResponseCode
from trimq.protocol.record import parse_message_id
from trimq.runtime.client import RemotingClient
from trimq.runtime.settings import ConfigError

ACL = """
[[accounts]]
access_key = "app-key-1"
secret_key = "app-secret-1"
default_topic_perm = "DENY"
default_group_perm = "DENY"
topic_perms = { orders = "PUB|SUB", reports = "SUB" }
group_perms = { workers = "SUB" }

[[accounts]]
access_key = "admin-key"
secret_key = "admin-secret"
admin = true
"""
APP = ("app-key-1", "app-secret-1")
ADMIN = ("admin-key", "admin-secret")


@asynccontextmanager
async def acl_broker(tmp_path: Path, text: str = ACL) -> AsyncIterator[Broker]:
    acl = tmp_path / "acl.toml"
    acl.write_text(text)
    config = BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / "store"), acl_file=str(acl))
    async with open_broker(config) as broker:
        yield broker


async def call(rc: RemotingClient, broker: Broker, code: int, ext: dict[str, Any] | None = None,
               body: Any = None) -> RemotingCommand:
    return await rc.invoke(broker.address, RemotingCommand.request(code, ext, body), 5)


def heartbeat(group: str, topic: str, client_id: str = "client-1") -> dict[str, Any]:
    return {
        "clientID": client_id,
        "producerDataSet": [],
        "consumerDataSet": [{
            "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeOrderly": True,
            "subscriptionDataSet": [{"topic": topic, "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 1}],
        }],
    }


async def test_unsigned_and_badly_signed_requests_are_refused(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as broker, RemotingClient() as anon, \
            RemotingClient(credentials=("app-key-1", "wrong-secret")) as forger, \
            RemotingClient(credentials=APP) as app:
        info = RequestCode.GET_BROKER_RUNTIME_INFO
        resp = await call(anon, broker, info)
        assert resp.code == ResponseCode.NO_PERMISSION
        assert resp.remark is not None and "no AccessKey" in resp.remark
        resp = await call(forger, broker, info)
        assert resp.code == ResponseCode.NO_PERMISSION
        assert resp.remark == "signature check failed for AccessKey=app-key-1"
        # a refusal leaves the connection open: the same connection is used again
        assert (await call(anon, broker, info)).code == ResponseCode.NO_PERMISSION
        ok = await call(app, broker, info)
        assert ok.ok and ok.body["brokerName"] == "broker-a"
        assert broker.acl is not None
        assert broker.acl.denied == 3 and broker.acl.accepted == 1


async def test_refused_offset_update_changes_nothing(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as broker, RemotingClient() as anon, RemotingClient(credentials=APP) as app:
        where = {"consumerGroup": "workers", "topic": "orders", "queueId": 0}
        assert (await call(app, broker, RequestCode.UPDATE_CONSUMER_OFFSET, {**where, "commitOffset": 5})).ok
        refused = await call(anon, broker, RequestCode.UPDATE_CONSUMER_OFFSET, {**where, "commitOffset": 99})
        assert refused.code == ResponseCode.NO_PERMISSION
        # oneway: no answer at all, and no effect either
        oneway = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {**where, "commitOffset": 77})
        await anon.invoke_oneway(broker.address, oneway)
        other = {"consumerGroup": "others", "topic": "orders", "queueId": 0, "commitOffset": 3}
        refused = await call(app, broker, RequestCode.UPDATE_CONSUMER_OFFSET, other)
        assert refused.code == ResponseCode.NO_PERMISSION
        assert refused.remark == "AccessKey=app-key-1 has no SUB permission on group 'others' (it has DENY)"
        resp = await call(app, broker, RequestCode.QUERY_CONSUMER_OFFSET, where)
        assert resp.ok and resp.ext["offset"] == 5
        assert broker.offset_manager.query_offset("others", "orders", 0) == -1


async def test_heartbeat_and_locks_need_group_and_topic_rights(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as broker, RemotingClient(credentials=APP) as app, \
            RemotingClient(credentials=ADMIN) as admin:
        refused = await call(app, broker, RequestCode.HEART_BEAT, body=heartbeat("workers", "secret-topic"))
        assert refused.code == ResponseCode.NO_PERMISSION
        assert refused.remark is not None and "topic 'secret-topic'" in refused.remark
        refused = await call(app, broker, RequestCode.HEART_BEAT, body=heartbeat("intruders", "orders"))
        assert refused.code == ResponseCode.NO_PERMISSION
        # nothing was registered: the admin (no explicit entries = every group) sees no consumer
        listed = await call(admin, broker, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "intruders"})
        assert listed.code != ResponseCode.NO_PERMISSION and not (listed.body or {}).get("consumerIdList")

        assert (await call(app, broker, RequestCode.HEART_BEAT, body=heartbeat("workers", "orders"))).ok
        mq = {"topic": "orders", "brokerName": "broker-a", "queueId": 0}
        lock_body = {"consumerGroup": "workers", "clientId": "client-1", "mqSet": [mq]}
        bad_lock = {"consumerGroup": "workers", "clientId": "client-1", "mqSet": [dict(mq, topic="payroll")]}
        refused = await call(app, broker, RequestCode.LOCK_BATCH_MQ, body=bad_lock)
        assert refused.code == ResponseCode.NO_PERMISSION
        locked = await call(app, broker, RequestCode.LOCK_BATCH_MQ, body=lock_body)
        assert locked.ok and locked.body["lockOKMQSet"] == [mq]
        listed = await call(app, broker, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "workers"})
        assert listed.ok and listed.body["consumerIdList"] == ["client-1"]


async def test_admin_codes_need_an_admin_account(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as broker, RemotingClient(credentials=APP) as app, \
            RemotingClient(credentials=ADMIN) as admin:
        refused = await call(app, broker, RequestCode.GET_LOCK_TABLE)
        assert refused.code == ResponseCode.NO_PERMISSION
        assert refused.remark == "request code 9001 (GET_LOCK_TABLE) needs an admin account; AccessKey=app-key-1 " \
                                 "is not one"
        assert (await call(admin, broker, RequestCode.GET_LOCK_TABLE)).ok
        refused = await call(app, broker, RequestCode.UPDATE_AND_CREATE_TOPIC,
                             {"topic": "orders", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6})
        assert refused.code == ResponseCode.NO_PERMISSION


async def test_send_and_pull_rights(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as broker, RemotingClient(credentials=APP) as app:
        if RequestCode.PULL_MESSAGE not in broker.server.handlers:
            pytest.skip("the storage service (SEND/PULL) is not part of the broker yet")
        store = broker.store

        def send_ext(topic: str) -> dict[str, Any]:
            return {"producerGroup": "p", "topic": topic, "queueId": 0, "sysFlag": 0,
                    "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": ""}

        sent = await call(app, broker, RequestCode.SEND_MESSAGE, send_ext("orders"), b"hello")
        assert sent.ok, sent.remark
        before = store.get_max_offset_in_queue("reports", 0)
        refused = await call(app, broker, RequestCode.SEND_MESSAGE, send_ext("reports"), b"nope")
        assert refused.code == ResponseCode.NO_PERMISSION
        assert refused.remark == "AccessKey=app-key-1 has no PUB permission on topic 'reports' (it has SUB)"
        assert store.get_max_offset_in_queue("reports", 0) == before

        def pull_ext(topic: str, group: str) -> dict[str, Any]:
            return {"consumerGroup": group, "topic": topic, "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
                    "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*",
                    "subVersion": 0}

        pulled = await call(app, broker, RequestCode.PULL_MESSAGE, pull_ext("orders", "workers"))
        assert pulled.ok and b"hello" in pulled.body
        refused = await call(app, broker, RequestCode.PULL_MESSAGE, pull_ext("orders", "others"))
        assert refused.code == ResponseCode.NO_PERMISSION and "group 'others'" in (refused.remark or "")


async def test_whitelisted_addresses_need_no_credentials(tmp_path: Path) -> None:
    text = 'global_white_remote_addresses = ["127.0.0.0/8"]\n' + ACL
    async with acl_broker(tmp_path, text) as broker, RemotingClient() as anon:
        assert (await call(anon, broker, RequestCode.GET_LOCK_TABLE)).ok


async def test_signature_made_by_hand_is_accepted(tmp_path: Path) -> None:
    """A client that signs itself (e.g. another language) with the documented function gets in."""
    async with acl_broker(tmp_path) as broker, RemotingClient() as plain:
        cmd = sign_command(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), *APP)
        assert (await plain.invoke(broker.address, cmd, 5)).ok


def test_bad_acl_file_fails_at_startup(tmp_path: Path) -> None:
    bad = tmp_path / "acl.toml"
    bad.write_text('[[accounts]]\naccess_key = "app-key-1"\nsecret_key = "app-secret-1"\ntopic_perms = {t = "ALL"}\n')
    config = BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path), acl_file=str(bad))
    with pytest.raises(ConfigError, match=r"accounts\[0\] \(access_key 'app-key-1'\): topic_perms.t: permission"):
        Broker(config)
    from trimq.tools.broker import main

    result = CliRunner().invoke(main, ["--listen", "127.0.0.1:0", "--store", str(tmp_path), "--acl", str(bad)])
    assert result.exit_code == 2
    assert "invalid configuration" in result.output and "topic_perms.t" in result.output


async def test_send_back_cannot_copy_another_topics_message_into_the_callers_retry_topic(tmp_path: Path) -> None:
    """With PUB|SUB on 'orders' and SUB on 'workers', an account must not pull a 'payroll' message into
    %RETRY%workers (which it may read) by naming that message's commit-log offset."""
    async with acl_broker(tmp_path) as broker, RemotingClient(credentials=APP) as app, \
            RemotingClient(credentials=ADMIN) as admin:
        send = {"producerGroup": "p", "topic": "payroll", "queueId": 0, "sysFlag": 0, "bornTimestamp": 1, "flag": 0,
                "properties": ""}
        secret = await call(admin, broker, RequestCode.SEND_MESSAGE, send, b"salaries")
        assert secret.ok, secret.remark
        back = {"group": "workers", "offset": parse_message_id(secret.ext["msgId"])[1], "delayLevel": 1,
                "originMsgId": secret.ext["msgId"], "originTopic": "orders"}
        refused = await call(app, broker, RequestCode.CONSUMER_SEND_MSG_BACK, back)
        assert refused.code == ResponseCode.NO_PERMISSION
        assert refused.remark is not None and "not of topic 'orders'" in refused.remark
        own = await call(app, broker, RequestCode.SEND_MESSAGE, dict(send, topic="orders"), b"order")
        assert own.ok
        # the account's own message may be sent back
        ok = await call(app, broker, RequestCode.CONSUMER_SEND_MSG_BACK,
                        dict(back, offset=parse_message_id(own.ext["msgId"])[1], originMsgId=own.ext["msgId"]))
        assert ok.ok, ok.remark
