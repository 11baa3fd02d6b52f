"""Access to the shared peer-benchmark harness (``<repo>/../shared/bench/peers``).

The workload, payload format, consumer recorder and server process management are the harness's own
(``common.py``), imported from the shared directory so trimq and the peers run byte-identical workloads.
CI clones ``shared/`` beside the repository; without it the peer benchmark cannot run and says so.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
RESULTS = BENCH / "results"


def shared_dir() -> Path:
    """The harness directory: ``$TRIMQ_PEER_HARNESS`` or ``<repo>/../shared/bench/peers``."""
    env = os.environ.get("TRIMQ_PEER_HARNESS")
    return Path(env) if env else REPO.parent / "shared" / "bench" / "peers"


class HarnessMissingError(RuntimeError):
    pass


def load_harness() -> Any:
    """Put the harness (and bench/, for ``peer_trimq``) on ``sys.path``; return its ``common`` module."""
    d = shared_dir()
    if not (d / "common.py").is_file() or not (d / "peer_redis.py").is_file():
        raise HarnessMissingError(
            f"the shared peer harness is not at {d} (expected common.py and peer_redis.py there). "
            "Clone the shared repository beside this one (../shared) or set TRIMQ_PEER_HARNESS to its "
            "bench/peers directory."
        )
    # appended, not prepended: the harness has a bench.py that must not shadow this package
    for p in (str(d), str(BENCH)):
        if p not in sys.path:
            sys.path.append(p)
    import common

    return common
