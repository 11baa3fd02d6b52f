"""Regenerates tests/vectors/records.json: golden RocketMQ 4.x commit-log records.

The bytes are built here field by field from the table in ROCKETMQ_FACTS.md §9 (CommitLog.java's layout)
with plain ``struct``, independently of protocol/record.py, so the test that reads the file checks our codec
against the documented layout. IPv4 and IPv6 hosts, empty and non-empty bodies/properties, a filler.

Run: python tests/vectors/make_records.py
"""

from __future__ import annotations

import json
import os
import socket
import struct
import zlib
from typing import Any


def host(ip: str, port: int) -> bytes:
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    return socket.inet_pton(fam, ip) + struct.pack(">i", port)


def record(*, topic: str, body: bytes, queue_id: int, flag: int, queue_offset: int, phys: int, sys_flag: int,
           born_ts: int, born: tuple[str, int], store_ts: int, store: tuple[str, int], reconsume: int,
           prepared: int, props: str) -> bytes:
    born_b, store_b = host(*born), host(*store)
    if len(born_b) == 20:
        sys_flag |= 0x10
    if len(store_b) == 20:
        sys_flag |= 0x20
    topic_b, props_b = topic.encode(), props.encode()
    fields = [
        struct.pack(">I", 0xDAA320A7),                      # 2 MAGICCODE
        struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF),   # 3 BODYCRC
        struct.pack(">i", queue_id),                        # 4 QUEUEID
        struct.pack(">i", flag),                            # 5 FLAG
        struct.pack(">q", queue_offset),                    # 6 QUEUEOFFSET
        struct.pack(">q", phys),                            # 7 PHYSICALOFFSET
        struct.pack(">i", sys_flag),                        # 8 SYSFLAG
        struct.pack(">q", born_ts),                         # 9 BORNTIMESTAMP
        born_b,                                             # 10 BORNHOST
        struct.pack(">q", store_ts),                        # 11 STORETIMESTAMP
        store_b,                                            # 12 STOREHOST
        struct.pack(">i", reconsume),                       # 13 RECONSUMETIMES
        struct.pack(">q", prepared),                        # 14 PreparedTransactionOffset
        struct.pack(">i", len(body)) + body,                # 15 BODY
        struct.pack(">b", len(topic_b)) + topic_b,          # 16 TOPIC
        struct.pack(">h", len(props_b)) + props_b,          # 17 PROPERTIES
    ]
    rest = b"".join(fields)
    return struct.pack(">i", 4 + len(rest)) + rest          # 1 TOTALSIZE


CASES: list[dict[str, Any]] = [
    dict(name="ipv4 with tags and keys", topic="TopicTest", body=b"Hello RocketMQ 0", queue_id=3, flag=0,
         queue_offset=0, phys=0, sys_flag=0, born_ts=1700000000000, born=("192.168.1.20", 52341),
         store_ts=1700000000123, store=("10.0.0.5", 10911), reconsume=0, prepared=0,
         props="KEYS\x01order-1\x02TAGS\x01TagA\x02UNIQ_KEY\x017F0000010001\x02WAIT\x01true\x02"),
    dict(name="ipv4 empty body and properties", topic="T", body=b"", queue_id=0, flag=7, queue_offset=41,
         phys=1073741824, sys_flag=0, born_ts=1, born=("127.0.0.1", 1), store_ts=2, store=("127.0.0.1", 10911),
         reconsume=3, prepared=0, props=""),
    dict(name="ipv6 born and store hosts", topic="%RETRY%group_1", body=bytes(range(256)), queue_id=1, flag=0,
         queue_offset=9, phys=4096, sys_flag=0, born_ts=1700000000000, born=("::1", 40000),
         store_ts=1700000000001, store=("fe80::1", 10911), reconsume=16, prepared=0,
         props="RETRY_TOPIC\x01TopicTest\x02ORIGIN_MESSAGE_ID\x01C0A8011400002A9F0000000000000000\x02"),
    dict(name="ipv6 born, ipv4 store, transaction flags", topic="TopicTest", body="ünïcödé".encode(),
         queue_id=2, flag=1, queue_offset=123456789, phys=987654321, sys_flag=0x4, born_ts=1600000000000,
         born=("2001:db8::7", 1), store=("10.1.2.3", 10911), store_ts=1600000000005, reconsume=0,
         prepared=55, props="TAGS\x01标签\x02"),
]


def main() -> None:
    out = []
    for c in CASES:
        rec = record(**{k: v for k, v in c.items() if k != "name"})
        expected = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in c.items() if k != "name"}
        out.append({"name": c["name"], "hex": rec.hex(), "fields": expected})
    filler = struct.pack(">iI", 4096 - 3000, 0xCBD43194)
    doc = {"records": out, "filler": {"remaining": 1096, "hex": filler.hex()}}
    path = os.path.join(os.path.dirname(__file__), "records.json")
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2, ensure_ascii=False)
        fh.write("\n")


if __name__ == "__main__":
    main()
