"""trimq.testing.processes: waiting for a broker process's address file (the real broker's start is in the e2e
tests, which all start their brokers through it)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from trimq.testing.processes import (
    ADDRESS_FILE_NAME,
    DaemonNotReadyError,
    first_event,
    fresh_address_file,
    listened_address,
    logged_event,
)


def _python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_stale_address_file_is_removed_and_a_missing_store_is_no_error(tmp_path: Path) -> None:
    (tmp_path / ADDRESS_FILE_NAME).write_text("127.0.0.1:1\n")
    assert fresh_address_file(tmp_path) == tmp_path / ADDRESS_FILE_NAME
    assert not (tmp_path / ADDRESS_FILE_NAME).exists()
    assert fresh_address_file(tmp_path / "not-yet") == tmp_path / "not-yet" / ADDRESS_FILE_NAME


def test_the_address_is_read_once_the_process_writes_it(tmp_path: Path) -> None:
    path = tmp_path / ADDRESS_FILE_NAME
    proc = _python(f"import os, time; time.sleep(0.3); open({str(path)!r} + '.tmp', 'w').write('127.0.0.1:4242\\n');"
                   f" os.replace({str(path)!r} + '.tmp', {str(path)!r}); time.sleep(30)")
    try:
        assert listened_address(path, proc, 20) == "127.0.0.1:4242"
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_exits_first_is_an_error_at_once_quoting_its_log(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    log.write_text("early lines\n" + "x" * 5000 + "\nconfig error: flush must be sync or async\n")
    proc = _python("raise SystemExit(2)")
    proc.wait()
    began = time.monotonic()
    with pytest.raises(DaemonNotReadyError, match="trimq-broker exited with 2 before it could listen") as e:
        listened_address(tmp_path / ADDRESS_FILE_NAME, proc, 30, log=log)
    assert time.monotonic() - began < 10  # not after the 30 s
    assert str(e.value).endswith("flush must be sync or async\n") and "early lines" not in str(e.value)


def test_a_process_that_never_writes_is_an_error_after_the_timeout(tmp_path: Path) -> None:
    proc = _python("import time; time.sleep(30)")
    try:
        with pytest.raises(DaemonNotReadyError, match=r"broker-b did not listen within 0.2 s \(no .*broker.addr\)"
                                                          r"; the end of its log:\nstill loading"):
            listened_address(tmp_path / ADDRESS_FILE_NAME, proc, 0.2, log=lambda: "still loading", name="broker-b")
    finally:
        proc.kill()
        proc.wait()


def test_a_log_that_cannot_be_read_is_said_not_raised(tmp_path: Path) -> None:
    proc = _python("pass")
    proc.wait()
    with pytest.raises(DaemonNotReadyError, match="its log could not be read"):
        listened_address(tmp_path / ADDRESS_FILE_NAME, proc, 1, log=tmp_path / "no.log")


def test_a_logged_event_is_the_first_json_line_naming_it(tmp_path: Path) -> None:
    log = tmp_path / "namesrv.log"
    log.write_text('plain text mentioning "namesrv.started"\n'
                   '{"event": "other", "note": "namesrv.started"}\n'
                   '{"event": "namesrv.started", "address": "127.0.0.1:9876"}\n'
                   '{"event": "namesrv.started", "address": "127.0.0.1:1"}\n'
                   '{"event": "namesrv.sta')  # a line being written
    proc = _python("import time; time.sleep(30)")
    try:
        assert logged_event(log, proc, "namesrv.started", 20)["address"] == "127.0.0.1:9876"
    finally:
        proc.kill()
        proc.wait()
    assert first_event("", "namesrv.started") is None


def test_a_daemon_that_exits_before_logging_the_event_is_an_error_at_once(tmp_path: Path) -> None:
    log = tmp_path / "namesrv.log"
    proc = _python("raise SystemExit(3)")
    proc.wait()
    log.write_text('{"event": "config.error", "detail": "bad --listen"}\n')
    with pytest.raises(DaemonNotReadyError, match=r"trimq-namesrv exited with 3 before it could log namesrv\.started"):
        logged_event(log, proc, "namesrv.started", 30)
