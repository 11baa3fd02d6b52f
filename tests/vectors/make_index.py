"""Regenerates tests/vectors/index.json: golden values of the message index, computed by Java.

``IndexVectors.java`` (beside this file) prints Java's ``String.hashCode`` of a set of keys (ASCII, CJK, a
surrogate pair, ``"polygenelubricants"`` whose hash is ``Integer.MIN_VALUE``) and the bytes of a small index
file after RocketMQ 4.9.3's ``IndexFile.putKey`` (copied verbatim, on a heap buffer) ran a sequence of puts.
tests/unit/test_index.py checks broker/store/index.py against it. Needs a JDK (11+: single-file launch).

Run: python tests/vectors/make_index.py
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    out = subprocess.run(["java", str(HERE / "IndexVectors.java")], check=True, capture_output=True,
                         text=True).stdout
    json.loads(out)  # it must be valid JSON
    (HERE / "index.json").write_text(out)
    print(f"wrote {HERE / 'index.json'}")


if __name__ == "__main__":
    main()
