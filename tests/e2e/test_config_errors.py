"""Bad configuration stops ``trimq-broker`` / ``trimq-namesrv`` at start: exit status 2 and one line naming the
setting, the value, what is allowed and where the value came from (docs/CONFIGURATION.md, "Errors").

Every run fails (or prints the configuration) before anything is opened, so each takes a fraction of a
second. ``--print-config`` runs check the precedence: defaults < TOML file < TRIMQ_* environment < flags.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(tool: str, *args: str, env: dict[str, str] | None = None, cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
    base.update(env or {})
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, env=base, cwd=cwd, timeout=60)


def write(tmp_path: Path, text: str, name: str = "c.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@dataclass
class Result:
    cwd: Path
    returncode: int
    stderr: str


# (id, TOML text or None, environment, extra flags, substrings the error line must contain)
Case = tuple[str, str | None, dict[str, str], list[str], list[str]]


def run_cases(tool: str, cases: list[Case], root: Path, extra: list[str]) -> dict[str, Result]:
    """Run every case's daemon at once (each fails at start, so this is just process start-up, in parallel)."""
    procs = {}
    for name, toml, env, flags, _ in cases:
        cwd = root / name
        cwd.mkdir()
        args = [*extra, *flags]
        if "{cwd}" in " ".join(args):
            args = [a.replace("{cwd}", str(cwd)) for a in args]
        if toml is not None:
            args += ["--config", write(cwd, toml)]
        base = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
        base.update(env)
        procs[name] = (cwd, subprocess.Popen([str(BIN / tool), *args], stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE, text=True, env=base, cwd=cwd))
    results = {}
    for name, (cwd, p) in procs.items():
        _, err = p.communicate(timeout=120)
        results[name] = Result(cwd, p.returncode, err)
    return results


def check(tool: str, out: Result, expected: list[str]) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: invalid configuration: "), out.stderr
    for part in expected:
        assert part in lines[0], (part, lines[0])


BROKER_CASES: list[Case] = [
    ("wrong-type", '[broker]\nflush_interval_ms = "fast"\n', {}, [],
     ["flush_interval_ms = 'fast'", "must be an integer in [1, 60000]", "(from config file"]),
    ("out-of-range", "[broker]\nflush_interval_ms = 0\n", {}, [],
     ["flush_interval_ms = 0", "out of range in [1, 60000]", "(from config file"]),
    ("bad-choice", '[broker]\nflush_disk_type = "FAST_FLUSH"\n', {}, [],
     ["flush_disk_type = 'FAST_FLUSH'", "must be one of ASYNC_FLUSH, SYNC_FLUSH"]),
    ("unknown-key", "[broker]\nflush_interval = 5\n", {}, [],
     ["unknown setting 'flush_interval' in [broker]"]),
    ("unknown-section", '[brokr]\nlisten = "127.0.0.1:1"\n', {}, [],
     ["unknown section [brokr]", "sections: namesrv, broker"]),
    ("malformed-toml", "[broker]\nlisten = \n", {}, [], ["is not valid TOML"]),
    ("bad-env-value", None, {"TRIMQ_BROKER_FLUSH_INTERVAL_MS": "soon"}, [],
     ["flush_interval_ms = 'soon'", "must be an integer in [1, 60000]",
      "(from environment variable TRIMQ_BROKER_FLUSH_INTERVAL_MS)"]),
    # the unprefixed names of earlier versions meant broker and client settings alike: refused, naming the new one
    ("retired-env-name", None, {"TRIMQ_MAX_MESSAGE_SIZE": "1048576"}, [],
     ["environment variable TRIMQ_MAX_MESSAGE_SIZE is no longer read: use TRIMQ_BROKER_MAX_MESSAGE_SIZE"]),
    ("bad-address", '[broker]\nlisten = "localhost"\n', {}, [], ["listen = 'localhost'", "HOST:PORT"]),
    ("flag-out-of-range", None, {}, ["--metrics-port", "70000"],
     ["metrics_port = 70000", "out of range (-1 or [0, 65535])", "(from command line)"]),
]


@pytest.mark.parametrize("case", BROKER_CASES, ids=[c[0] for c in BROKER_CASES])
def test_broker_refuses_bad_configuration(broker_results: dict[str, Result], case: Case) -> None:
    check("trimq-broker", broker_results[case[0]], case[4])
    assert not (broker_results[case[0]].cwd / "store").exists()  # stopped before touching anything


NAMESRV_CASES: list[Case] = [
    ("wrong-type", "[namesrv]\nmax_connections = 1.5\n", {}, [],
     ["max_connections = 1.5", "must be an integer in [1, 1000000]"]),
    ("out-of-range", "[namesrv]\nbroker_channel_expired_ms = 10\n", {}, [],
     ["broker_channel_expired_ms = 10", "out of range in [1000, 3600000]"]),
    ("unknown-key", "[namesrv]\nlisten_port = 9876\n", {}, [], ["unknown setting 'listen_port' in [namesrv]"]),
    ("malformed-toml", "[namesrv\n", {}, [], ["is not valid TOML"]),
    ("bad-env-value", None, {"TRIMQ_NAMESRV_MAX_CONNECTIONS": "lots"}, [],
     ["max_connections = 'lots'", "(from environment variable TRIMQ_NAMESRV_MAX_CONNECTIONS)"]),
    ("bad-address", None, {}, ["--listen", "9876"], ["listen = '9876'", "HOST:PORT", "(from command line)"]),
]


@pytest.mark.parametrize("case", NAMESRV_CASES, ids=[c[0] for c in NAMESRV_CASES])
def test_namesrv_refuses_bad_configuration(namesrv_results: dict[str, Result], case: Case) -> None:
    check("trimq-namesrv", namesrv_results[case[0]], case[4])


@pytest.fixture(scope="module")
def broker_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    return run_cases("trimq-broker", BROKER_CASES, tmp_path_factory.mktemp("broker"), ["--store", "{cwd}/store"])


@pytest.fixture(scope="module")
def namesrv_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    return run_cases("trimq-namesrv", NAMESRV_CASES, tmp_path_factory.mktemp("namesrv"), [])


def test_a_bad_flag_value_is_a_usage_error(tmp_path: Path) -> None:
    for tool, args in (("trimq-broker", ["--metrics-port", "x"]), ("trimq-namesrv", ["--log-level", "loud"])):
        out = run(tool, *args, cwd=tmp_path)
        assert out.returncode == 2 and "Invalid value" in out.stderr, (tool, out.stderr)


def test_precedence_file_then_environment_then_flags(tmp_path: Path) -> None:
    """One setting from each source in one run: the file's, the environment's over the file's, the flag's
    over both; anything else keeps its default."""
    config = write(tmp_path, "[namesrv]\nmetrics_port = 1001\nmax_connections = 11\nshutdown_grace_ms = 111\n"
                             "[broker]\nmetrics_port = 2001\nmax_connections = 21\nshutdown_grace_ms = 211\n")

    def effective(tool: str, *flags: str, env: dict[str, str]) -> dict[str, object]:
        out = run(tool, "--config", config, "--print-config", *flags, env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        result: dict[str, object] = json.loads(out.stdout)
        return result

    b = effective("trimq-broker", "--metrics-port", "2003",
                  env={"TRIMQ_BROKER_METRICS_PORT": "2002", "TRIMQ_BROKER_MAX_CONNECTIONS": "22"})
    assert (b["shutdown_grace_ms"], b["max_connections"], b["metrics_port"]) == (211, 22, 2003)
    assert b["flush_interval_ms"] == 500  # default
    n = effective("trimq-namesrv", "--metrics-port", "1003",
                  env={"TRIMQ_NAMESRV_METRICS_PORT": "1002", "TRIMQ_NAMESRV_MAX_CONNECTIONS": "12"})
    assert (n["shutdown_grace_ms"], n["max_connections"], n["metrics_port"]) == (111, 12, 1003)
    assert n["scan_not_active_broker_interval_ms"] == 10_000
    t = effective("trimq-namesrv", "--tls-cert", "/c.pem", "--tls-ca", "/ca.pem", "--tls-require-client-cert",
                  env={"TRIMQ_NAMESRV_TLS_KEY_FILE": "/k.pem"})
    assert (t["tls_cert_file"], t["tls_key_file"], t["tls_ca_file"], t["tls_require_client_cert"]) == (
        "/c.pem", "/k.pem", "/ca.pem", True)


def test_consumer_refuses_bad_configuration(tmp_path: Path) -> None:
    """The client tools load the same way ([consumer] / [producer] tables, TRIMQ_* variables, flags)."""
    config = write(tmp_path, '[consumer]\nconsumer_group = "g"\nnamesrv_addr = "127.0.0.1:1"\n'
                             "pull_batch_size = 5000\n")
    out = run("trimq-consumer", "--config", config, "--topic", "T", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "pull_batch_size = 5000" in out.stderr and "[1, 1024]" in out.stderr
    out = run("trimq-producer", "--topic", "T", "--count", "1", cwd=tmp_path,
              env={"TRIMQ_CLIENT_NAMESRV_ADDR": "127.0.0.1:1", "TRIMQ_CLIENT_SEND_MSG_TIMEOUT": "never"})
    assert out.returncode == 2, out.stderr
    assert "send_msg_timeout = 'never'" in out.stderr
    # a tag expression that names no tag was a traceback (found by hand)
    out = run("trimq-consumer", "--namesrv", "127.0.0.1:1", "--group", "g", "--topic", "T", "--tags", "||",
              cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "trimq-consumer: --tags '||': subscription expression '||' names no tag; use '*' or 'TagA || TagB'"]


def test_start_errors_name_the_store_and_the_address(tmp_path: Path) -> None:
    """What stops a daemon at start says which path or address: a store path that is a file was "[Errno 17] File
    exists: 'x'", a port that cannot be bound (requests, metrics, HA replication) "[Errno 98] Address already in
    use", saying neither the address nor which of its listeners (found by hand)."""
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy = f"127.0.0.1:{port}"
        free = ["--listen", "127.0.0.1:0"]

        def store(name: str) -> list[str]:  # one each: brokers on one store refuse each other (its lock)
            return ["--store", str(tmp_path / name)]

        runs: dict[str, tuple[str, list[str], dict[str, str]]] = {
            "store-is-a-file": ("trimq-broker", ["--store", str(a_file), *free], {}),
            "broker-port-taken": ("trimq-broker", [*store("s1"), "--listen", busy], {}),
            "namesrv-port-taken": ("trimq-namesrv", ["--listen", busy], {}),
            "broker-metrics-taken": ("trimq-broker", [*store("s2"), *free, "--metrics-port", port], {}),
            "namesrv-metrics-taken": ("trimq-namesrv", [*free, "--metrics-port", port], {}),
            "broker-ha-taken": ("trimq-broker", [*store("s3"), *free], {"TRIMQ_BROKER_HA_LISTEN_PORT": port}),
        }
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
        procs = {name: subprocess.Popen([str(BIN / tool), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True, cwd=tmp_path, env={**clean, **env})
                 for name, (tool, args, env) in runs.items()}
        said = {name: (p.communicate(timeout=120)[1].strip().splitlines()[-1], p.returncode)
                for name, p in procs.items()}
    assert said.pop("store-is-a-file") == (
        f"trimq-broker: invalid configuration: store_dir = '{a_file}': exists and is not a directory", 2)
    in_use = "Address already in use"
    assert said == {
        "broker-port-taken": (f"trimq-broker: cannot start: [Errno 98] cannot listen on {busy}: {in_use}", 1),
        "namesrv-port-taken": (f"trimq-namesrv: cannot start: [Errno 98] cannot listen on {busy}: {in_use}", 1),
        "broker-metrics-taken": (f"trimq-broker: cannot start: [Errno 98] cannot listen on {busy} for metrics: "
                                 f"{in_use}", 1),
        "namesrv-metrics-taken": (f"trimq-namesrv: cannot start: [Errno 98] cannot listen on {busy} for metrics: "
                                  f"{in_use}", 1),
        "broker-ha-taken": (f"trimq-broker: cannot start: [Errno 98] cannot listen on {busy} for HA replication: "
                            f"{in_use}", 1),
    }
