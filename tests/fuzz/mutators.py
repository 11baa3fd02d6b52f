"""Seeds and mutations for the decoder fuzzer and the broker fuzz test.

Everything is driven by a ``random.Random`` so a run is reproduced by its seed.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path
from typing import Any

from trimq.protocol.codes import RequestCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.frame import encode_frame
from trimq.protocol.message import encode_properties
from trimq.protocol.record import encode_blank, encode_record

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "frames.json"

_INTERESTING_32 = [0, 1, 2, 3, 4, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF,
                   0x80000000, 0xFFFFFFFE, 0xFFFFFFFF, 90, 91, 92]
# msgpack type markers: nil, bools, bin/ext/float/int/str/array/map of every width, fixmap/fixarray/fixstr
_MSGPACK_MARKERS = [0xC0, 0xC1, 0xC2, 0xC3, *range(0xC4, 0xE0), 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xFF, 0xE0]


def _mq(topic: str = "FuzzTopic", qid: int = 0) -> dict[str, Any]:
    return {"topic": topic, "brokerName": "broker-a", "queueId": qid}


def request_templates() -> list[tuple[int, dict[str, Any], Any]]:
    """A well-formed request of every code in docs/PROTOCOL.md §4 (plus an unknown one): (code, ext, body)."""
    send_ext = {"producerGroup": "pg", "topic": "FuzzTopic", "queueId": 0, "sysFlag": 0,
                "bornTimestamp": 1_700_000_000_000, "flag": 0, "properties": encode_properties({"KEYS": "k"}),
                "reconsumeTimes": 0, "maxReconsumeTimes": 16}
    where = {"consumerGroup": "cg", "topic": "FuzzTopic", "queueId": 0}
    hb = {"clientID": "fuzz@1", "producerDataSet": [{"groupName": "pg"}], "consumerDataSet": [{
        "groupName": "cg", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeOrderly": True,
        "subscriptionDataSet": [{"topic": "FuzzTopic", "subString": "*", "tagsSet": [], "codeSet": [],
                                 "subVersion": 1}]}]}
    lock = {"consumerGroup": "cg", "clientId": "fuzz@1", "mqSet": [_mq(), _mq(qid=1)]}
    R = RequestCode
    return [
        (R.SEND_MESSAGE, send_ext, b"fuzz-body"),
        (R.SEND_MESSAGE_V2, send_ext, b"fuzz-body-v2"),
        (R.SEND_BATCH_MESSAGE, send_ext, [{"body": b"a", "properties": "", "flag": 0},
                                          {"body": b"b", "properties": "KEYS\x01x\x02", "flag": 1}]),
        (R.PULL_MESSAGE, {**where, "queueOffset": 0, "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0,
                          "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}, None),
        (R.QUERY_CONSUMER_OFFSET, where, None),
        (R.UPDATE_CONSUMER_OFFSET, {**where, "commitOffset": 0, "clientId": "fuzz@1"}, None),
        (R.UPDATE_AND_CREATE_TOPIC, {"topic": "FuzzCreated", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6},
         None),
        (R.GET_ALL_TOPIC_CONFIG, {}, None),
        (R.GET_BROKER_RUNTIME_INFO, {}, None),
        (R.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "FuzzTopic", "queueId": 0, "timestamp": 1_700_000_000_000}, None),
        (R.GET_MAX_OFFSET, {"topic": "FuzzTopic", "queueId": 0}, None),
        (R.GET_MIN_OFFSET, {"topic": "FuzzTopic", "queueId": 0}, None),
        (R.GET_EARLIEST_MSG_STORETIME, {"topic": "FuzzTopic", "queueId": 0}, None),
        (R.VIEW_MESSAGE_BY_ID, {"offset": 0}, None),
        (R.HEART_BEAT, {}, hb),
        (R.UNREGISTER_CLIENT, {"clientID": "fuzz@1", "producerGroup": "pg", "consumerGroup": "cg"}, None),
        (R.CONSUMER_SEND_MSG_BACK, {"group": "cg", "offset": 0, "delayLevel": 1, "originMsgId": "0" * 32,
                                    "originTopic": "FuzzTopic", "maxReconsumeTimes": 3}, None),
        (R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"}, None),
        (R.LOCK_BATCH_MQ, {}, lock),
        (R.UNLOCK_BATCH_MQ, {}, lock),
        (R.REGISTER_BROKER, {"brokerAddr": "127.0.0.1:1", "brokerName": "fuzz-b", "clusterName": "c",
                             "brokerId": 0}, {"topicConfigTable": {}}),
        (R.UNREGISTER_BROKER, {"brokerAddr": "127.0.0.1:1", "brokerName": "fuzz-b", "clusterName": "c",
                               "brokerId": 0}, None),
        (R.GET_ROUTEINFO_BY_TOPIC, {"topic": "FuzzTopic"}, None),
        (R.GET_BROKER_CLUSTER_INFO, {}, None),
        (R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, {"groupName": "cg2", "consumeEnable": True,
                                                     "retryMaxTimes": 16}),
        (R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}, None),
        (R.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "cg"}, None),
        (R.GET_CONSUME_STATS, {"consumerGroup": "cg", "topic": "FuzzTopic"}, None),
        (R.RESET_CONSUMER_CLIENT_OFFSET, {"group": "cg", "topic": "FuzzTopic", "timestamp": 0}, None),
        (R.INVOKE_BROKER_TO_RESET_OFFSET, {"group": "cg", "topic": "FuzzTopic", "timestamp": 0, "isForce": True},
         None),
        (R.GET_LOCK_TABLE, {"consumerGroup": "cg"}, None),
        (R.QUERY_DLQ_MESSAGES, {"consumerGroup": "cg", "maxCount": 10}, None),
        (R.RESEND_DLQ_MESSAGES, {"consumerGroup": "cg", "msgIds": ["0" * 32]}, None),
        (R.SKIP_MESSAGE, {"consumerGroup": "cg", "msgId": "0" * 32}, None),
        (R.GET_SUBSCRIPTION_CONSISTENCY, {"consumerGroup": "cg"}, None),
        (4242, {"x": 1}, None),
    ]


def vector_frames() -> list[bytes]:
    """The golden frames of tests/vectors/frames.json."""
    return [bytes.fromhex(v["hex"]) for v in json.loads(VECTORS.read_text())]


def seed_frames() -> list[bytes]:
    """Valid frames: the golden vectors, one request of every code, a response, and a pipelined pair."""
    frames = vector_frames()
    for i, (code, ext, body) in enumerate(request_templates()):
        frames.append(encode_frame(RemotingCommand(code=int(code), opaque=i + 1, ext=dict(ext), body=body)))
    frames.append(encode_frame(RemotingCommand(code=0, opaque=9, flag=1, remark="ok", ext={"offset": 3})))
    frames.append(frames[0] + frames[-1])
    frames.append(encode_frame(RemotingCommand(code=10, opaque=1, ext={"topic": "t"}, body=b"x" * 4000)))
    return frames


def seed_records() -> list[bytes]:
    """Valid commit-log records (IPv4 and IPv6 hosts, properties, empty body), one run of several, a blank."""
    recs = [
        encode_record(topic="FuzzTopic", body=b"hello", queue_id=1, queue_offset=2, physical_offset=0,
                      properties=encode_properties({"KEYS": "k1", "TAGS": "A"}), born_timestamp=1,
                      store_timestamp=2, born_host=("10.0.0.1", 1234), store_host=("127.0.0.1", 10911)),
        encode_record(topic="t", body=b"", queue_id=0, queue_offset=0, physical_offset=99,
                      born_host=("::1", 1), store_host=("fe80::1", 2), reconsume_times=3),
        encode_record(topic="%RETRY%cg", body=bytes(range(256)) * 4, queue_id=7, queue_offset=1 << 40,
                      physical_offset=1 << 33, sys_flag=0x2, flag=-1),
    ]
    return [*recs, b"".join(recs), recs[0] + encode_blank(64)]


class Mutator:
    """Byte-level and value-level mutations."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    # -- bytes -------------------------------------------------------------------------------------------
    def random_bytes(self, max_len: int = 256) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_len))

    def mutate_bytes(self, data: bytes, corpus: list[bytes], rounds: int | None = None) -> bytes:
        """Apply 1-4 stacked mutations (bit flips, interesting integers, msgpack markers, splices...)."""
        rng = self.rng
        buf = bytearray(data)
        for _ in range(rounds or rng.randint(1, 4)):
            op = rng.randrange(11)
            n = len(buf)
            if op == 0 and n:
                buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
            elif op == 1 and n:
                buf[rng.randrange(n)] = rng.randrange(256)
            elif op == 2 and n >= 4:
                pos = rng.choice([0, rng.randrange(n - 3)])  # the length prefix is the favourite target
                value = rng.choice([*_INTERESTING_32, max(0, n - 4 + rng.randint(-3, 3))])
                struct.pack_into(">I", buf, pos, value & 0xFFFFFFFF)
            elif op == 3 and n:
                buf[rng.randrange(n)] = rng.choice(_MSGPACK_MARKERS)
            elif op == 4:
                pos = rng.randint(0, n)
                buf[pos:pos] = rng.randbytes(rng.randint(1, 16))
            elif op == 5 and n:
                a = rng.randrange(n)
                del buf[a : a + rng.randint(1, 16)]
            elif op == 6 and n:
                a = rng.randrange(n)
                chunk = buf[a : a + rng.randint(1, 32)]
                pos = rng.randint(0, len(buf))
                buf[pos:pos] = chunk
            elif op == 7 and n:
                del buf[rng.randint(0, n - 1):]
            elif op == 8:
                other = rng.choice(corpus)
                cut = rng.randint(0, len(buf))
                buf = buf[:cut] + other[rng.randint(0, len(other)) :]
            elif op == 9:
                buf += rng.choice(corpus)
            elif n >= 8:
                # swap two 4-byte big-endian ints (e.g. a record's size and a length field)
                a, b = rng.randrange(n - 3), rng.randrange(n - 3)
                va, vb = bytes(buf[a : a + 4]), bytes(buf[b : b + 4])
                buf[a : a + 4], buf[b : b + 4] = vb, va
        return bytes(buf)

    def splits(self, n: int) -> list[int]:
        """Chunk sizes to feed ``n`` bytes in: all at once, byte by byte, or random cuts."""
        rng = self.rng
        mode = rng.randrange(4)
        if mode == 0 or n == 0:
            return [n]
        if mode == 1 and n <= 512:
            return [1] * n
        out = []
        left = n
        while left:
            k = min(left, rng.randint(1, max(1, n // 3)))
            out.append(k)
            left -= k
        return out

    # -- values ------------------------------------------------------------------------------------------
    def random_value(self, depth: int = 0) -> Any:
        """Any msgpack value, biased towards the awkward ones."""
        rng = self.rng
        kinds = 12 if depth < 3 else 10
        k = rng.randrange(kinds)
        if k == 0:
            return None
        if k == 1:
            return rng.choice([True, False])
        if k == 2:
            return rng.choice([0, -1, 1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 2**64 - 1, 255, 256, 65536])
        if k == 3:
            return rng.randint(-(2**40), 2**40)
        if k == 4:
            return rng.choice([0.0, -0.0, 1.5, float("inf"), float("-inf"), float("nan"), 1e300])
        if k == 5:
            return rng.choice(["", " ", "x" * 300, "ü€😀", "%RETRY%", "a\x00b", "1", "-1", "TopicTest", "*",
                               "a||b", "\x01\x02", "127.0.0.1:1", "[::1]:0", "0" * 32])
        if k == 6:
            return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randint(0, 12)))
        if k == 7:
            return self.random_bytes(64)
        if k == 8:
            return rng.choice([b"", b"\x00" * 100, bytes(range(256))])
        if k == 9:
            return rng.choice(["FuzzTopic", "cg", "pg", 0, 1, -5, "fuzz@1"])
        if k == 10:
            return [self.random_value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {self.random_key(): self.random_value(depth + 1) for _ in range(rng.randint(0, 4))}

    def random_key(self) -> Any:
        return self.rng.choice(["topic", "queueId", "consumerGroup", "groupName", "mqSet", "body", "x", "",
                                "clientID", "subscriptionDataSet", 1, None])

    def wrong_typed(self, value: Any) -> Any:
        """A value of another type than ``value`` (or a nasty one of the same type)."""
        for _ in range(8):
            v = self.random_value()
            if type(v) is not type(value) or self.rng.random() < 0.2:
                return v
        return None

    def mutate_value(self, value: Any, depth: int = 0) -> Any:
        """Replace, drop or add entries deep inside maps and lists; replace scalars with wrong types."""
        rng = self.rng
        if isinstance(value, dict) and depth < 4 and value and rng.random() < 0.8:
            out = dict(value)
            key = rng.choice(list(out))
            r = rng.random()
            if r < 0.15:
                del out[key]
            elif r < 0.25:
                out[self.random_key()] = self.random_value()
            else:
                out[key] = self.mutate_value(out[key], depth + 1)
            return out
        if isinstance(value, list) and depth < 4 and value and rng.random() < 0.8:
            out_l = list(value)
            i = rng.randrange(len(out_l))
            r = rng.random()
            if r < 0.15:
                del out_l[i]
            elif r < 0.3:
                out_l.append(self.random_value())
            else:
                out_l[i] = self.mutate_value(out_l[i], depth + 1)
            return out_l
        return self.wrong_typed(value)

    def mutated_request(self, opaque: int) -> RemotingCommand:
        """A well-formed frame of a real request code whose ext and body values have wrong types."""
        rng = self.rng
        code, ext, body = rng.choice(request_templates())
        ext = dict(ext)
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            if r < 0.6 and ext:
                k = rng.choice(list(ext))
                ext[k] = self.mutate_value(ext[k])
            elif r < 0.75 and ext:
                del ext[rng.choice(list(ext))]
            elif r < 0.85:
                ext[rng.choice(["topic", "queueId", "consumerGroup", "offset", "zz"])] = self.random_value()
            else:
                body = self.mutate_value(body) if body is not None else self.random_value()
        flag = 0 if rng.random() < 0.9 else rng.choice([2, 4, 0xFFFF])  # a few oneway / odd flags
        return RemotingCommand(code=int(code), opaque=opaque, flag=flag, ext=ext, body=body)
