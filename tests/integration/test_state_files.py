"""A broker refuses to start on a state file that does not hold its state: it names the file, leaves it as it was
and says so in one line from ``trimq-broker`` (``cannot start: ...``, exit status 1).

Found by hand (2026-12-08): every one of these files, holding garbage, stopped ``trimq-broker`` with a
forty-line traceback; one holding JSON ``null`` was read as no file, so the broker started without the state
(consumer offsets, delay progress, topics) and wrote it anew. Atomic writes never leave either (docs/STORAGE.md):
they come from a disk or a hand that damaged the file, and starting from nothing would lose that state unnoticed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import SMALL_STORE
from trimq.broker.broker import open_broker
from trimq.broker.config import BrokerConfig
from trimq.broker.store.atomic import StateFileError
from trimq.tools.common import leaf

STATE_FILES = ["topics.json", "store.json", "brokerEpoch.json", "haState.json", "consumerOffset.json",
               "subscriptionGroup.json", "delayOffset.json", "dlqResend.json"]


@pytest.mark.parametrize("content", [b"garbage{", b"null\n", b"", b"\xff\xfe"], ids=["garbage", "null", "empty",
                                                                                     "not-utf8"])
async def test_a_broker_refuses_a_state_file_it_cannot_read_and_leaves_it_alone(tmp_path: Path, content: bytes
                                                                               ) -> None:
    for name in STATE_FILES:
        store = tmp_path / name
        (store / "config").mkdir(parents=True)
        path = store / "config" / name
        path.write_bytes(content)
        with pytest.raises(BaseException) as raised:  # (inside the nursery's exception groups)
            async with open_broker(BrokerConfig(listen="127.0.0.1:0", store_dir=str(store), **SMALL_STORE)):
                pass
        error = leaf(raised.value)
        assert isinstance(error, StateFileError), (name, repr(error))
        assert str(error).startswith(f"{path}: "), (name, str(error))
        assert path.read_bytes() == content, name  # not overwritten by the services that stopped


def test_trimq_broker_says_it_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "store" / "config").mkdir(parents=True)
    offsets = tmp_path / "store" / "config" / "consumerOffset.json"
    offsets.write_text("garbage{")
    out = subprocess.run([str(Path(sys.executable).parent / "trimq-broker"), "--store", str(tmp_path / "store"),
                          "--listen", "127.0.0.1:0", "--log-level", "warning"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"trimq-broker: cannot start: {offsets}: not valid JSON (Expecting value: line 1 column 1 (char 0))"]


@pytest.mark.parametrize("content", [b"[]\n", b"7\n"], ids=["a-list", "a-number"])
async def test_a_state_file_of_the_wrong_kind_is_a_start_error_naming_it(tmp_path: Path, content: bytes) -> None:
    """Valid JSON that is not a map (each loader's own check): what trimq-broker reports in one line
    (``start_error``, the CLI's own test), naming the file, and the file is left as it was."""
    from trimq.tools.common import start_error

    for name in STATE_FILES:
        store = tmp_path / name
        (store / "config").mkdir(parents=True)
        path = store / "config" / name
        path.write_bytes(content)
        with pytest.raises(BaseException) as raised:
            async with open_broker(BrokerConfig(listen="127.0.0.1:0", store_dir=str(store), **SMALL_STORE)):
                pass
        error = start_error(raised.value)
        assert error is not None, (name, repr(leaf(raised.value)))
        assert str(error).startswith(f"{path}: "), (name, str(error))
        assert path.read_bytes() == content, name
