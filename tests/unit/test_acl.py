"""The pure ACL core: permission bits, the file format, signature vectors, the per-code permission table."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.broker.acl import (
    ANY,
    DENY,
    PUB,
    RULES,
    SUB,
    AccessValidator,
    Account,
    AclConfig,
    AclError,
    AddressPattern,
    calc_signature,
    canonical_content,
    canonical_value,
    check_permission,
    load_acl,
    parse_acl,
    parse_perm,
    required_permissions,
    sign_command,
)
from trimq.protocol import RemotingCommand, RequestCode
from trimq.protocol.frame import FrameDecoder, encode_frame

REPO = Path(__file__).resolve().parents[2]

APP = {
    "access_key": "app-key-1", "secret_key": "app-secret-1",
    "default_topic_perm": "DENY", "default_group_perm": "SUB",
    "topic_perms": {"orders": "PUB|SUB", "audit": "PUB", "reports": "SUB"},
    "group_perms": {"blocked": "DENY", "writers": "PUB"},
}
ADMIN = {"access_key": "admin-key", "secret_key": "admin-secret", "admin": True}


def validator(*accounts: dict[str, Any], white: list[str] | None = None) -> AccessValidator:
    data: dict[str, Any] = {"accounts": list(accounts)}
    if white is not None:
        data["global_white_remote_addresses"] = white
    return AccessValidator(parse_acl(data))


def signed(code: int, ext: dict[str, Any] | None = None, body: Any = None, *, ak: str = "app-key-1",
           sk: str = "app-secret-1") -> RemotingCommand:
    return sign_command(RemotingCommand.request(code, ext, body), ak, sk)


def over_the_wire(cmd: RemotingCommand) -> RemotingCommand:
    """What the broker sees: the command encoded and decoded again."""
    (got,) = FrameDecoder().feed(encode_frame(cmd))
    return got


# -- permissions --------------------------------------------------------------------------------------------


def test_parse_perm() -> None:
    assert parse_perm("PUB") == PUB
    assert parse_perm("SUB") == SUB
    assert parse_perm("PUB|SUB") == parse_perm("SUB | PUB") == PUB | SUB
    assert parse_perm("DENY") == DENY
    for bad in ("ANY", "READ", "", "PUB|", 4, None):
        with pytest.raises(ValueError):
            parse_perm(bad)


@pytest.mark.parametrize(("needed", "owned", "ok"), [
    (PUB, PUB, True), (PUB, SUB, False), (PUB, PUB | SUB, True), (SUB, PUB | SUB, True),
    (SUB, DENY, False), (PUB, DENY | PUB, False), (ANY, PUB, True), (ANY, SUB, True), (ANY, DENY, False),
    (PUB | SUB, SUB, True),  # RocketMQ: any needed bit suffices
])
def test_check_permission_is_rocketmqs(needed: int, owned: int, ok: bool) -> None:
    assert check_permission(needed, owned) is ok


# -- signatures ---------------------------------------------------------------------------------------------


def test_canonical_content_vector() -> None:
    ext = {"topic": "T", "queueId": 1, "AccessKey": "ak", "Signature": "ignored"}
    expected = b"2:10,9:AccessKey,3:sak,7:queueId,2:i1,5:topic,2:sT," + b"\xc4\x02hi"
    assert canonical_content(10, ext, b"hi") == expected


def test_signature_vector() -> None:
    ext = {"topic": "T", "queueId": 1, "AccessKey": "ak"}
    content = b"2:10,9:AccessKey,3:sak,7:queueId,2:i1,5:topic,2:sT,\xc4\x02hi"
    by_hand = base64.b64encode(hmac.new(b"secret12", content, hashlib.sha1).digest()).decode()
    assert calc_signature(10, ext, b"hi", "secret12") == by_hand == "jsqKRx4S7bn/EcY/ygf4jv3160Y="
    # the client-side names are aliases of the same shared implementation (protocol/signature.py)
    assert calc_signature(10, ext, b"hi", "secret12") == by_hand


def test_canonical_values_are_typed() -> None:
    assert canonical_value("5") == b"s5"
    assert canonical_value(5) == b"i5"
    assert canonical_value(-12) == b"i-12"
    assert canonical_value(True) == b"btrue"
    assert canonical_value(False) == b"bfalse"
    assert canonical_value(None) == b"n"
    assert canonical_value(1.5) == b"f" + struct.pack(">d", 1.5).hex().encode() == b"f3ff8000000000000"
    assert canonical_value(b"\x00\xff") == b"x\x00\xff"
    assert canonical_value([1, "a"]) == b"m" + msgpack.packb([1, "a"])
    # distinct types never collide
    assert len({canonical_value(v) for v in ("1", 1, True, 1.0, b"1", None, "")}) == 7


def test_body_encoding_is_msgpack() -> None:
    for n in (0, 255, 256, 65535, 65536, 70000):
        body = b"x" * n
        assert canonical_content(1, {}, body).endswith(msgpack.packb(body, use_bin_type=True))
    hb = {"clientID": "c", "consumerDataSet": [{"groupName": "g"}]}
    assert canonical_content(34, {}, hb) == b"2:34," + msgpack.packb(hb, use_bin_type=True)
    assert canonical_content(28, {}, None) == b"2:28,\xc0"


def test_no_ambiguity_between_keys_and_values() -> None:
    a = canonical_content(1, {"a": "x1:b,2:sy"}, None)
    b = canonical_content(1, {"a": "x", "b": "y"}, None)
    assert a != b


def test_sign_command_copies_ext_and_replaces_old_signature() -> None:
    ext = {"topic": "orders"}
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"body")
    sign_command(cmd, "app-key-1", "app-secret-1")
    assert ext == {"topic": "orders"}
    first = cmd.ext["Signature"]
    sign_command(cmd, "app-key-1", "app-secret-1")
    assert cmd.ext["Signature"] == first
    assert cmd.ext["AccessKey"] == "app-key-1"


ext_values = st.one_of(
    st.text(max_size=20), st.integers(min_value=-(2**63), max_value=2**64 - 1), st.booleans(), st.none(),
    st.floats(allow_nan=False), st.binary(max_size=20), st.lists(st.integers(0, 9), max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(code=st.integers(0, 10_000), ext=st.dictionaries(st.text(min_size=1, max_size=10), ext_values, max_size=6),
       body=st.one_of(st.none(), st.binary(max_size=300),
                      st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**64 - 1))))
def test_client_signature_survives_the_wire(code: int, ext: dict[str, Any], body: Any) -> None:
    """The client signs, the frame crosses the wire, the broker's separate implementation agrees."""
    v = validator(APP)
    cmd = sign_command(RemotingCommand.request(code, ext, body), "app-key-1", "app-secret-1")
    assert cmd.ext["Signature"] == calc_signature(code, cmd.ext, body, "app-secret-1")
    assert v.authenticate(over_the_wire(cmd)).access_key == "app-key-1"


# -- authentication -----------------------------------------------------------------------------------------


def test_authentication_failures_say_why() -> None:
    v = validator(APP)
    info = RequestCode.GET_BROKER_RUNTIME_INFO
    assert v.check(over_the_wire(signed(info))) is None
    assert "no AccessKey" in (v.check(RemotingCommand.request(info)) or "")
    assert "no account with AccessKey=nobody-x" in (v.check(signed(info, ak="nobody-x")) or "")
    assert "signature check failed" in (v.check(signed(info, sk="wrong-secret")) or "")
    unsigned = RemotingCommand.request(info, {"AccessKey": "app-key-1"})
    assert "no Signature" in (v.check(unsigned) or "")
    assert "AccessKey must be a string" in (v.check(RemotingCommand.request(info, {"AccessKey": 7})) or "")
    assert v.accepted == 1 and v.denied == 5


def test_tampering_breaks_the_signature() -> None:
    v = validator(APP)
    cmd = signed(RequestCode.SEND_MESSAGE, {"topic": "orders", "queueId": 0}, b"payload")
    assert v.check(cmd) is None
    for change in (
        lambda c: setattr(c, "body", b"payloaD"),
        lambda c: c.ext.__setitem__("queueId", 1),
        lambda c: c.ext.__setitem__("queueId", "0"),  # same text, other type
        lambda c: c.ext.__setitem__("extra", "x"),
        lambda c: setattr(c, "code", RequestCode.SEND_MESSAGE_V2),
    ):
        forged = over_the_wire(cmd)
        change(forged)
        assert "signature check failed" in (v.check(forged) or "")


# -- the permission table -----------------------------------------------------------------------------------


def test_send_needs_pub_on_topic() -> None:
    v = validator(APP)
    for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        assert v.check(signed(code, {"topic": "orders"}, b"x")) is None
        assert v.check(signed(code, {"topic": "audit"}, b"x")) is None
        remark = v.check(signed(code, {"topic": "reports"}, b"x"))
        assert remark == "AccessKey=app-key-1 has no PUB permission on topic 'reports' (it has SUB)"
        assert "no PUB permission on topic 'other' (it has DENY)" in (v.check(signed(code, {"topic": "other"})) or "")
        assert "'topic' is missing" in (v.check(signed(code, {}, b"x")) or "")
        assert "'topic' is missing" in (v.check(signed(code, {"topic": 5}, b"x")) or "")


def test_pull_needs_sub_on_topic_and_group() -> None:
    v = validator(APP)
    pull = RequestCode.PULL_MESSAGE
    assert v.check(signed(pull, {"topic": "orders", "consumerGroup": "g1"})) is None  # default group perm SUB
    assert "on topic 'audit'" in (v.check(signed(pull, {"topic": "audit", "consumerGroup": "g1"})) or "")
    assert "on group 'blocked'" in (v.check(signed(pull, {"topic": "orders", "consumerGroup": "blocked"})) or "")
    assert "on group 'writers' (it has PUB)" in (
        v.check(signed(pull, {"topic": "orders", "consumerGroup": "writers"})) or "")
    # the retry topic is the group's resource
    assert v.check(signed(pull, {"topic": "%RETRY%g1", "consumerGroup": "g1"})) is None
    assert "on group 'blocked'" in (v.check(signed(pull, {"topic": "%RETRY%blocked", "consumerGroup": "g1"})) or "")


def test_offsets_need_sub_on_group_and_topic() -> None:
    v = validator(APP)
    for code in (RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET):
        assert v.check(signed(code, {"topic": "orders", "consumerGroup": "g", "queueId": 0})) is None
        assert v.check(signed(code, {"topic": "orders", "consumerGroup": "blocked", "queueId": 0})) is not None
        assert v.check(signed(code, {"topic": "audit", "consumerGroup": "g", "queueId": 0})) is not None


def test_heartbeat_and_locks_need_sub_on_groups_and_topics() -> None:
    v = validator(APP)

    def hb(group: str, topic: str) -> dict[str, Any]:
        return {"clientID": "c1", "producerDataSet": [{"groupName": "any-producer"}],
                "consumerDataSet": [{"groupName": group, "subscriptionDataSet": [{"topic": topic}]}]}

    assert v.check(signed(RequestCode.HEART_BEAT, body=hb("g", "orders"))) is None
    assert v.check(signed(RequestCode.HEART_BEAT, body={"clientID": "producer-only"})) is None
    assert "group 'blocked'" in (v.check(signed(RequestCode.HEART_BEAT, body=hb("blocked", "orders"))) or "")
    assert "topic 'audit'" in (v.check(signed(RequestCode.HEART_BEAT, body=hb("g", "audit"))) or "")
    assert "must be a map" in (v.check(signed(RequestCode.HEART_BEAT, body=b"junk")) or "")
    for code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        mq = {"topic": "orders", "brokerName": "b", "queueId": 0}
        assert v.check(signed(code, body={"consumerGroup": "g", "clientId": "c", "mqSet": [mq]})) is None
        assert v.check(signed(code, body={"consumerGroup": "blocked", "clientId": "c", "mqSet": [mq]})) is not None
        bad_mq = dict(mq, topic="audit")
        assert v.check(signed(code, body={"consumerGroup": "g", "clientId": "c", "mqSet": [bad_mq]})) is not None
        assert "consumerGroup" in (v.check(signed(code, body={"mqSet": []})) or "")


def test_send_back_group_list_unregister() -> None:
    v = validator(APP)
    back = {"group": "g", "offset": 1, "delayLevel": 0, "originMsgId": "X", "originTopic": "orders"}
    assert v.check(signed(RequestCode.CONSUMER_SEND_MSG_BACK, back)) is None
    assert v.check(signed(RequestCode.CONSUMER_SEND_MSG_BACK, dict(back, originTopic="reports"))) is not None
    assert v.check(signed(RequestCode.CONSUMER_SEND_MSG_BACK, dict(back, group="blocked"))) is not None
    assert v.check(signed(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "g"})) is None
    assert v.check(signed(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "blocked"})) is not None
    assert v.check(signed(RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "producerGroup": "p"})) is None
    assert v.check(signed(RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "consumerGroup": "blocked"})) is not None


def test_offset_lookups_need_any_right_on_topic() -> None:
    v = validator(APP)
    for code in (RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                 RequestCode.GET_EARLIEST_MSG_STORETIME):
        assert v.check(signed(code, {"topic": "audit", "queueId": 0})) is None  # PUB is enough
        assert v.check(signed(code, {"topic": "reports", "queueId": 0})) is None
        assert "no ANY permission on topic 'other'" in (v.check(signed(code, {"topic": "other", "queueId": 0})) or "")


def test_group_and_topic_views_need_rights_on_them() -> None:
    # Added with the admin forwarding: running info reveals a member's queues and config.
    v = validator(APP)
    for code in (RequestCode.GET_CONSUMER_RUNNING_INFO, RequestCode.GET_CONSUMER_CONNECTION_LIST,
                 RequestCode.GET_CONSUME_STATS):
        assert v.check(signed(code, {"consumerGroup": "g"})) is None
        assert "group 'blocked'" in (v.check(signed(code, {"consumerGroup": "blocked"})) or "")
    assert v.check(signed(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "reports"})) is None
    assert "topic 'other'" in (v.check(signed(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "other"})) or "")


ADMIN_CODES = [17, 200, 220, 222, 33, 9001, 9002, 9003, 9004, 9005]


@pytest.mark.parametrize("code", ADMIN_CODES)
def test_admin_codes_need_an_admin_account(code: int) -> None:
    v = validator(APP, ADMIN)
    remark = v.check(signed(code, {"topic": "orders"}))
    assert remark is not None and "needs an admin account; AccessKey=app-key-1 is not one" in remark
    assert v.check(signed(code, {"topic": "orders"}, ak="admin-key", sk="admin-secret")) is None


def test_admin_with_explicit_entries_is_checked_like_others() -> None:
    v = validator(APP, dict(ADMIN, topic_perms={"secret": "DENY"}, default_topic_perm="PUB|SUB"))
    creds = {"ak": "admin-key", "sk": "admin-secret"}
    assert v.check(signed(RequestCode.SEND_MESSAGE, {"topic": "x"}, b"", **creds)) is None
    assert v.check(signed(RequestCode.SEND_MESSAGE, {"topic": "secret"}, b"", **creds)) is not None
    bare = validator(ADMIN)
    assert bare.check(signed(RequestCode.SEND_MESSAGE, {"topic": "secret"}, b"", **creds)) is None


def test_other_codes_need_only_a_valid_signature() -> None:
    v = validator(APP)
    for code in (RequestCode.GET_BROKER_RUNTIME_INFO, RequestCode.GET_ALL_TOPIC_CONFIG, 4242):
        assert v.check(signed(code)) is None
        assert v.check(RemotingCommand.request(code)) is not None


def test_name_server_codes_are_never_checked() -> None:
    v = validator(APP)
    for code in (103, 104, 105, 106, 206):
        assert v.check(RemotingCommand.request(code, {"topic": "orders"})) is None
        assert required_permissions(code, {}, None).exempt


def test_simple_authorize_api() -> None:
    v = validator(APP, ADMIN)
    app = v.config.accounts["app-key-1"]
    admin = v.config.accounts["admin-key"]
    assert v.authorize(app, RequestCode.SEND_MESSAGE, topic="orders")
    assert not v.authorize(app, RequestCode.SEND_MESSAGE, topic="reports")
    assert v.authorize(app, RequestCode.PULL_MESSAGE, topic="orders", group="g")
    assert not v.authorize(app, RequestCode.PULL_MESSAGE, topic="orders", group="blocked")
    assert not v.authorize(app, RequestCode.UPDATE_AND_CREATE_TOPIC, topic="orders")
    assert v.authorize(admin, RequestCode.UPDATE_AND_CREATE_TOPIC, topic="orders")
    assert v.authorize(app, RequestCode.GET_ROUTEINFO_BY_TOPIC, topic="anything")


def test_whitelist_lets_addresses_through_without_credentials() -> None:
    v = validator(APP, white=["10.1.*.*", "192.168.0.{1,2}", "172.16.0.10-20", "fd00::/8"])
    cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "t"})
    for remote in ("10.1.2.3:555", "192.168.0.2:1", "172.16.0.15:9", "[fd00::1]:80", "[::ffff:10.1.0.1]:3"):
        assert v.check(cmd, remote) is None, remote
    denied: tuple[str | None, ...] = ("10.2.2.3:555", "192.168.0.3:1", "172.16.0.21:9", "[fe80::1]:80", "?", None)
    for other in denied:
        assert v.check(cmd, other) is not None, other


def test_address_patterns() -> None:
    assert AddressPattern("*").match("8.8.8.8")
    assert AddressPattern("127.0.0.1").match("127.0.0.1")
    assert not AddressPattern("127.0.0.1").match("127.0.0.2")
    assert AddressPattern("10.0.0.0/8").match("10.200.1.1")
    assert not AddressPattern("10.0.0.0/8").match("::1")
    assert not AddressPattern("10.*.*.*").match("not-an-ip")
    for bad in ("10.0.0", "10.0.0.300", "10.0.0.5-1", "10.0.0.{1,999}", "host.example.com", ""):
        with pytest.raises(ValueError):
            AddressPattern(bad)


# -- the file -----------------------------------------------------------------------------------------------


def test_the_shipped_example_loads() -> None:
    config = load_acl(str(REPO / "deploy" / "acl.example.toml"))
    assert set(config.accounts) == {"orders-app", "analytics", "ops-admin"}
    assert config.accounts["orders-app"].topic_perms["orders"] == PUB | SUB
    assert config.accounts["ops-admin"].admin


def test_defaults_deny() -> None:
    acc = parse_acl({"accounts": [{"access_key": "abcdefg", "secret_key": "1234567"}]}).accounts["abcdefg"]
    assert acc == Account("abcdefg", "1234567", False, DENY, DENY, {}, {})
    assert "secret" not in repr(acc) and "1234567" not in repr(acc)


@pytest.mark.parametrize(("data", "message"), [
    ({"accounts": [dict(APP, secret_key=None)]}, "accounts[0] (access_key 'app-key-1'): secret_key is missing"),
    ({"accounts": [dict(APP, secret_key="short")]}, "secret_key must be at least 7 characters"),
    ({"accounts": [dict(APP, access_key="abc")]}, "accounts[0] (access_key 'abc'): access_key must be at least 7"),
    ({"accounts": [{"secret_key": "1234567"}]}, "accounts[0]: access_key is missing"),
    ({"accounts": [dict(APP, admin="yes")]}, "(access_key 'app-key-1'): admin must be true or false"),
    ({"accounts": [dict(APP, default_topic_perm="READ")]}, "default_topic_perm: permission 'READ' is not one of"),
    ({"accounts": [dict(APP, topic_perms={"t": "ALL"})]}, "(access_key 'app-key-1'): topic_perms.t: permission"),
    ({"accounts": [dict(APP, group_perms=["g=SUB"])]}, "group_perms must be a table"),
    ({"accounts": [dict(APP, topic_perms={"%RETRY%g": "SUB"})]}, "set group_perms.g instead"),
    ({"accounts": [dict(APP, accessKey="x")]}, "unknown field 'accessKey'"),
    ({"accounts": [APP, APP]}, "accounts[1] (access_key 'app-key-1'): access_key is used twice"),
    ({"accounts": [APP], "global_white_remote_addresses": ["1.2.3"]}, "global_white_remote_addresses: address"),
    ({"accounts": [APP], "whitelist": []}, "unknown key 'whitelist'"),
    ({"accounts": {"a": APP}}, "accounts must be an array of tables"),
    ({}, "no accounts and no whitelisted addresses"),
])
def test_bad_files_name_the_account_and_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(AclError) as exc:
        parse_acl(data, "acl.toml")
    assert message in str(exc.value)
    assert str(exc.value).startswith("acl.toml")


def test_bad_file_contents(tmp_path: Path) -> None:
    with pytest.raises(AclError, match=r"(?i)no such file"):
        load_acl(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[[accounts]\n")
    with pytest.raises(AclError, match="is not valid TOML"):
        load_acl(str(bad))


def test_acl_config_without_whitelist() -> None:
    assert not AclConfig(accounts={}).whitelisted("127.0.0.1")
    assert validator(APP).check(RemotingCommand.request(28), "127.0.0.1:1") is not None
    assert ANY not in (PUB, SUB, DENY)


_fields = st.sampled_from(["topic", "consumerGroup", "group", "originTopic", "clientID", "x"])
_body_keys = st.sampled_from(["consumerDataSet", "mqSet", "groupName", "subscriptionDataSet", "consumerGroup", "topic"])
_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=8), st.binary(max_size=8),
              st.floats()),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.one_of(_fields, _body_keys), children, max_size=3)),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(code=st.sampled_from([*RULES, 28, 105, 4242]), ext=st.dictionaries(_fields, _values, max_size=4),
       body=_values, sign=st.booleans())
def test_check_never_raises_on_malformed_requests(code: int, ext: dict[str, Any], body: Any, sign: bool) -> None:
    v = validator(APP, ADMIN)
    cmd = RemotingCommand.request(code, ext, body)
    if sign:
        cmd = sign_command(cmd, "app-key-1", "app-secret-1")
    remark = v.check(cmd, "127.0.0.1:1")
    assert remark is None or isinstance(remark, str)
