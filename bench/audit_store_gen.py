"""Generate a large broker-shaped store for the audit benchmark, fast.

    python -m bench.audit_store_gen DIR [--messages 10000000] [--body 256] [--queues 8] [--keys 1000]

One topic (``BenchTopic``) of ``--queues`` queues, ``--keys`` sharding keys (a key always goes to the same
queue, born timestamps increase: a clean store), ``--body``-byte bodies, KEYS/TAGS/UNIQ_KEY/WAIT
properties, RocketMQ's layout: 1 GiB commit-log segments (the last one preallocated, sparse), the
end-of-segment filler, ``consumequeue/BenchTopic/<qid>/`` files of 300,000 20-byte units and
``config/consumerOffset.json`` (a group 1,000 messages behind on every queue).

Speed: one block of records (one per key and queue slot) is encoded once with ``protocol.record`` and
copied; per copy, the queue offsets, physical offsets, timestamps and the hex counter in UNIQ_KEY are
patched with numpy through big-endian strided views of the block (the bodies, hence the CRCs, do not
change). The consume-queue units are built as numpy structured arrays.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from trimq.protocol.message import encode_properties
from trimq.protocol.record import encode_blank, encode_record

SEGMENT_SIZE = 1 << 30
CQ_UNITS_PER_FILE = 300_000
TOPIC = "BenchTopic"
GROUP = "bench-group"
START_MS = 1_700_000_000_000
STORE_HOST = ("10.0.0.1", 10911)
BORN_HOST = ("192.168.1.20", 50000)
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_HEX_PAIRS = np.stack([_HEX[np.arange(256) >> 4], _HEX[np.arange(256) & 15]], axis=1)


def _hex16(x: np.ndarray) -> np.ndarray:
    return _HEX_PAIRS[x.astype(">u8").view(np.uint8).reshape(-1, 8)].reshape(-1, 16)


class _Block:
    """``n`` encoded records back to back, and where the fields to patch are in each."""

    def __init__(self, n: int, body: int, queues: int, keys: int) -> None:
        rng = np.random.default_rng(7)
        parts, starts, uniq_at, qids = [], [], [], []
        pos = 0
        for i in range(n):
            k = i % keys
            q = k % queues
            props = {"KEYS": f"key-{k}", "TAGS": "TagA" if i % 2 else "TagB", "UNIQ_KEY": "0A000001" + "0" * 24,
                     "WAIT": "true"}
            ptxt = encode_properties(props)
            rec = encode_record(topic=TOPIC, body=rng.bytes(body), queue_id=q, queue_offset=0, physical_offset=0,
                                properties=ptxt, born_host=BORN_HOST, store_host=STORE_HOST)
            marker = ptxt.encode().index(b"UNIQ_KEY\x01") + len("UNIQ_KEY\x01") + 16
            uniq_at.append(pos + len(rec) - len(ptxt.encode()) + marker)
            parts.append(rec)
            starts.append(pos)
            qids.append(q)
            pos += len(rec)
        self.data = np.frombuffer(bytearray(b"".join(parts)), dtype=np.uint8).copy()
        self.starts = np.array(starts, dtype=np.int64)
        self.ends = np.r_[self.starts[1:], pos]
        self.sizes = self.ends - self.starts
        self.uniq_at = np.array(uniq_at, dtype=np.int64)
        self.qids = np.array(qids, dtype=np.int64)
        self.queues = queues

    def view(self, typ: str, width: int) -> np.ndarray:
        return np.ndarray((len(self.data) - width + 1,), dtype=typ, buffer=self.data, strides=(1,))

    def patch(self, m: int, seq0: int, base_phys: int, qnext: np.ndarray) -> np.ndarray:
        """Patch the first ``m`` records for global sequence numbers seq0.. at commit-log offset
        ``base_phys``; returns their queue offsets (and advances ``qnext``)."""
        s = self.starts[:m]
        q = self.qids[:m]
        # The k-th record of queue q in this copy gets qnext[q] + k.
        order = np.argsort(q, kind="stable")
        rank = np.empty(m, dtype=np.int64)
        counts = np.bincount(q, minlength=self.queues)
        firsts = np.r_[0, np.cumsum(counts)[:-1]]
        rank[order] = np.arange(m) - np.repeat(firsts, counts)
        qoff = qnext[q] + rank
        qnext += counts
        seq = seq0 + np.arange(m, dtype=np.int64)
        i64 = self.view(">i8", 8)
        i64[s + 20] = qoff
        i64[s + 28] = base_phys + s
        i64[s + 40] = START_MS + seq
        i64[s + 56] = START_MS + seq + 5
        idx = self.uniq_at[:m, None] + np.arange(16)
        self.data[idx] = _hex16(seq.view(np.uint64))
        return qoff


def generate(root: Path, messages: int, *, body: int = 256, queues: int = 8, keys: int = 1000,
             block: int = 8000) -> dict[str, int]:
    """Write the store under ``root``; returns counts (messages, segments, commit-log bytes)."""
    cl = root / "commitlog"
    cl.mkdir(parents=True, exist_ok=True)
    blk = _Block(min(block, messages), body, queues, keys)
    qnext = np.zeros(queues, dtype=np.int64)
    units: list[list[np.ndarray]] = [[] for _ in range(queues)]
    unit_dtype = np.dtype([("o", ">i8"), ("s", ">i4"), ("t", ">i8")])
    tags_code = {0: np.int64(2598918), 1: np.int64(2598919)}  # "TagB".hashCode(), "TagA".hashCode()
    seq = 0
    base = 0
    data_bytes = 0
    segments = 0
    while seq < messages:
        segments += 1
        with open(cl / f"{base:020d}", "wb") as f:
            pos = 0
            while seq < messages:
                m = min(len(blk.starts), messages - seq)
                # Records that fit, leaving room for the 8-byte filler.
                m = int(np.searchsorted(blk.ends[:m], SEGMENT_SIZE - pos - 8, side="right"))
                if m == 0:
                    break
                qoff = blk.patch(m, seq, base + pos, qnext)
                nbytes = int(blk.ends[m - 1])
                f.write(blk.data[:nbytes].data)  # a view, no copy
                u = np.empty(m, dtype=unit_dtype)
                u["o"] = base + pos + blk.starts[:m]
                u["s"] = blk.sizes[:m]
                u["t"] = np.where((seq + np.arange(m)) % 2, tags_code[1], tags_code[0])
                q = blk.qids[:m]
                for qi in range(queues):
                    sel = q == qi
                    if sel.any():
                        units[qi].append(u[sel])
                _ = qoff
                seq += m
                pos += nbytes
                data_bytes += nbytes
            if seq < messages:
                f.write(encode_blank(SEGMENT_SIZE - pos))
            f.truncate(SEGMENT_SIZE)  # preallocated like a mapped file: sparse zeros after the data
        base += SEGMENT_SIZE
    for qi in range(queues):
        qdir = root / "consumequeue" / TOPIC / str(qi)
        qdir.mkdir(parents=True, exist_ok=True)
        # (np.concatenate turns the big-endian structured dtype into a native one: convert back.)
        allu = (np.concatenate(units[qi]) if units[qi] else np.empty(0, dtype=unit_dtype)).astype(unit_dtype)
        for f0 in range(0, max(len(allu), 1), CQ_UNITS_PER_FILE):
            chunk = allu[f0 : f0 + CQ_UNITS_PER_FILE]
            path = qdir / f"{f0 * 20:020d}"
            with open(path, "wb") as fh:
                fh.write(chunk.tobytes())
                fh.truncate(CQ_UNITS_PER_FILE * 20)
    cfg = root / "config"
    cfg.mkdir(exist_ok=True)
    offsets = {f"{TOPIC}@{GROUP}": {str(q): max(int(qnext[q]) - 1000, 0) for q in range(queues)}}
    (cfg / "consumerOffset.json").write_text(json.dumps({"offsetTable": offsets}, indent=1))
    return {"messages": messages, "segments": segments, "commitlog_bytes": data_bytes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.audit_store_gen", description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--body", type=int, default=256)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--keys", type=int, default=1000)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    info = generate(Path(args.dir), args.messages, body=args.body, queues=args.queues, keys=args.keys)
    dt = time.perf_counter() - t0
    print(f"generated {info['messages']:,} messages, {info['commitlog_bytes'] / (1 << 20):,.0f} MiB of records in "
          f"{info['segments']} segment(s) in {dt:.1f} s under {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
