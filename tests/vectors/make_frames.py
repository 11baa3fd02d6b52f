"""Regenerates tests/vectors/frames.json. The hex is built by hand from the layout in docs/PROTOCOL.md
(length prefix + msgpack map with keys in the documented order), not by protocol.frame, so the test that
reads it checks our encoder against the documented bytes.

Run: python tests/vectors/make_frames.py
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import msgpack


def frame(m: dict[str, Any]) -> str:
    payload = msgpack.packb(m, use_bin_type=True)
    return (struct.pack(">I", len(payload)) + payload).hex()


VECTORS: list[tuple[str, dict[str, Any]]] = [
    ("minimal request", {"code": 34, "opaque": 1}),
    ("send message request", {
        "code": 10, "opaque": 7,
        "ext": {"producerGroup": "pg", "topic": "TopicTest", "queueId": 3, "sysFlag": 0,
                "bornTimestamp": 1700000000000, "flag": 0, "properties": "KEYS\x01order-1\x02TAGS\x01A\x02"},
        "body": b"hello",
    }),
    ("send response", {"code": 0, "opaque": 7, "flag": 1,
                       "ext": {"msgId": "7F00000100002A9F0000000000000000", "queueId": 3, "queueOffset": 0}}),
    ("error response with remark", {"code": 3, "opaque": 9, "flag": 1, "remark": "request code 777 is not supported"}),
    ("oneway notify", {"code": 40, "opaque": 2, "flag": 2, "ext": {"consumerGroup": "g1"}}),
    ("lock batch request", {"code": 41, "opaque": 12, "body": {
        "consumerGroup": "g1", "clientId": "127.0.0.1@42",
        "mqSet": [{"topic": "T", "brokerName": "broker-a", "queueId": 0}]}}),
    ("versioned request", {"code": 105, "opaque": 4294967295, "version": 1, "ext": {"topic": "T"}}),
]

if __name__ == "__main__":
    out = [{"name": name, "hex": frame(m),
            "command": {k: (v.hex() if isinstance(v, bytes) else v) for k, v in m.items()},
            "body_is_bin": isinstance(m.get("body"), bytes)}
           for name, m in VECTORS]
    with open(os.path.join(os.path.dirname(__file__), "frames.json"), "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
