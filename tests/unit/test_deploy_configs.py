"""deploy/ and docs/CONFIGURATION.md never rot.

* every TOML file under deploy/ loads with the loader of each program it has a table for (and the ACL
  example with the ACL loader);
* docs/CONFIGURATION.md is exactly what :func:`render_configuration_md` makes from the settings classes (so
  every setting is documented with its default, range, environment variable and flag). After changing a
  setting, regenerate it: ``.venv/bin/python tests/unit/test_deploy_configs.py --write``;
* the loaders' error messages for the cases the subprocess tests (tests/e2e/test_config_errors.py) do not
  repeat;
* the systemd units have the hardening, restart and stop settings (and ``systemd-analyze verify`` accepts
  them when it is installed); prometheus.yml has the expected structure and scrapes what the example
  configs serve; the Grafana dashboard is valid JSON that only queries metrics trimq exports.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: python tests/unit/test_deploy_configs.py --write
    sys.path.insert(0, str(ROOT))

from trimq.broker.config import BrokerConfig  # noqa: E402
from trimq.client.config import ClientConfig, ProducerConfig, PushConsumerConfig, load_client_settings  # noqa: E402
from trimq.client.config import ConfigError as ClientConfigError  # noqa: E402
from trimq.namesrv.config import NamesrvConfig  # noqa: E402
from trimq.runtime.settings import (  # noqa: E402
    CONFIG_SECTIONS,
    ConfigError,
    env_prefix_of,
    load_settings,
)

DEPLOY = ROOT / "deploy"
CONFIGURATION_MD = ROOT / "docs" / "CONFIGURATION.md"
OPERATIONS_MD = ROOT / "docs" / "OPERATIONS.md"


@pytest.fixture(autouse=True)
def no_trimq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("TRIMQ_"):
            monkeypatch.delenv(k)


# ----------------------------------------------------------------------------------------------------------
# Loading every deploy/ TOML file


def load_section(path: Path, section: str) -> Any:
    if section == "broker":
        return load_settings(BrokerConfig, config_file=str(path), section="broker")
    if section == "namesrv":
        return load_settings(NamesrvConfig, config_file=str(path), section="namesrv")
    if section == "consumer":
        return load_client_settings(PushConsumerConfig, config_file=str(path), section="consumer")
    if section == "producer":
        return load_client_settings(ProducerConfig, config_file=str(path), section="producer")
    raise AssertionError(f"{path}: no loader for [{section}]")


def deploy_tomls() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*.toml") if p.name != "acl.example.toml")


@pytest.mark.parametrize("path", deploy_tomls(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_deploy_config_loads(path: Path) -> None:
    data = tomllib.loads(path.read_text())
    sections = [k for k, v in data.items() if isinstance(v, dict)]
    assert sections, f"{path}: settings must be in program tables ([broker], [namesrv], ...)"
    assert set(data) == set(sections), f"{path}: top-level settings outside a table: {set(data) - set(sections)}"
    for section in sections:
        assert section in CONFIG_SECTIONS, section
        config = load_section(path, section)
        for key, value in data[section].items():
            assert getattr(config, key) == value, (path, section, key)


def test_deploy_examples_exist() -> None:
    names = {p.name for p in deploy_tomls()}
    assert {"single.toml", "cluster-namesrv.toml", "cluster-broker-a.toml", "cluster-broker-b.toml",
            "cluster-clients.toml"} <= names
    a = load_section(DEPLOY / "config" / "cluster-broker-a.toml", "broker")
    b = load_section(DEPLOY / "config" / "cluster-broker-b.toml", "broker")
    assert a.broker_name != b.broker_name and a.cluster_name == b.cluster_name
    assert a.namesrv_addr == b.namesrv_addr
    # 2 masters, 2 slaves (issue 15): each slave has its master's name, broker id 1 and its HA address
    for master, name in ((a, "a"), (b, "b")):
        slave = load_section(DEPLOY / "config" / f"cluster-broker-{name}-s.toml", "broker")
        assert (master.broker_role, master.broker_id, slave.broker_role, slave.broker_id) == (
            "SYNC_MASTER", 0, "SLAVE", 1)
        assert slave.broker_name == master.broker_name and slave.cluster_name == master.cluster_name
        assert slave.ha_master_address == f"{master.broker_ip}:{master.ha_listen_port}"
    single = DEPLOY / "config" / "single.toml"
    ns = load_section(single, "namesrv")
    assert load_section(single, "broker").namesrv_addr == ns.listen
    assert load_section(single, "consumer").namesrv_addr == ns.listen


def test_acl_example_loads() -> None:
    from trimq.broker.acl import load_acl

    acl = load_acl(str(DEPLOY / "acl.example.toml"))
    assert acl is not None


# ----------------------------------------------------------------------------------------------------------
# Loader errors not repeated by the subprocess tests


@pytest.mark.parametrize(("text", "env", "expected"), [
    ('[broker]\nlong_polling_enable = 1\n', {}, "long_polling_enable = 1: must be true or false"),
    ('[namesrv]\nlisten = "127.0.0.1:1"\n', {}, "no [broker] table (it has [namesrv])"),
    ('flush_intervall_ms = 5\n', {}, "unknown setting 'flush_intervall_ms'"),
    ('[broker]\n[broker.tls]\ncert = "x"\n', {}, "unknown setting table [broker.tls]"),
    ('[broker]\nlisten = "127.0.0.1:1"\n[brokr]\nlisten = "x"\n', {}, "unknown section [brokr]"),
    ('broker = 5\n', {}, "'broker' must be a table"),
    ('[broker]\nlisten = "127.0.0.1:70000"\n', {}, "listen = '127.0.0.1:70000'"),
    ('[broker]\nnamesrv_addr = "10.0.0.1:9876;nowhere"\n', {}, "namesrv_addr = '10.0.0.1:9876;nowhere'"),
    ('[broker]\nmessage_delay_level = "1s 5x"\n', {}, "message_delay_level = '1s 5x'"),
    ('[broker]\nmapped_file_size_consume_queue = 1010\n', {}, "must be a multiple of 20"),
    ("[broker]\n", {"TRIMQ_BROKER_EMBEDDED_NAMESRV": "maybe"},
     "embedded_namesrv = 'maybe': must be true or false (from environment variable TRIMQ_BROKER_EMBEDDED_NAMESRV)"),
    ("[broker]\n", {"TRIMQ_BROKER_MAX_CONNECTIONS": "0"},
     "max_connections = 0: out of range in [1, 1000000] (from environment variable TRIMQ_BROKER_MAX_CONNECTIONS)"),
    ("[broker]\n", {"TRIMQ_TLS_CERT_FILE": "/c.pem"},
     "environment variable TRIMQ_TLS_CERT_FILE is no longer read: use TRIMQ_BROKER_TLS_CERT_FILE"),
])
def test_broker_loader_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, env: dict[str, str],
                              expected: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as info:
        load_settings(BrokerConfig, config_file=str(path), section="broker")
    assert expected in str(info.value)


def test_missing_config_file_is_named() -> None:
    with pytest.raises(ConfigError, match=r"config file /nonexistent/x.toml: No such file"):
        load_settings(BrokerConfig, config_file="/nonexistent/x.toml", section="broker")


def test_other_programs_tables_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[broker]\nbroker_name = "b1"\n[audit]\nwhatever = 1\n[consumer]\nconsumer_group = "g"\n')
    assert load_settings(BrokerConfig, config_file=str(path), section="broker").broker_name == "b1"


def test_client_loader_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[consumer]\nconsumer_group = "g"\npull_batch_size = 0\n')
    with pytest.raises(ClientConfigError, match=r"pull_batch_size = 0: out of range in \[1, 1024\]"):
        load_client_settings(PushConsumerConfig, config_file=str(path), section="consumer")
    monkeypatch.setenv("TRIMQ_CLIENT_SEND_MSG_TIMEOUT", "x")
    with pytest.raises(ClientConfigError, match=r"send_msg_timeout = 'x': must be an integer"):
        load_client_settings(ProducerConfig, section="producer")


# ----------------------------------------------------------------------------------------------------------
# docs/CONFIGURATION.md, generated from the settings classes


def _toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def _allowed(f: dataclasses.Field[Any]) -> str:
    meta = f.metadata
    kind = type(f.default)
    if meta.get("choices"):
        return ", ".join(f"`{c}`" for c in meta["choices"])
    if kind is bool:
        return "`true`, `false`"
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None or hi is not None:
        also = " or ".join(f"`{a}`" for a in (meta.get("also") or ()))
        text = f"{lo if lo is not None else '-inf'} .. {hi if hi is not None else 'inf'}"
        return f"{also} or {text}" if also else text
    if f.name in ("listen",):
        return "HOST:PORT"
    if f.name == "namesrv_addr":
        return "HOST:PORT;HOST:PORT..."
    return "text"


def _flags() -> dict[str, dict[str, str]]:
    """Setting name -> flag, per program, read from the click commands themselves."""
    import click

    from trimq.tools import broker, consumer, namesrv, producer

    renamed = {"flush": "flush_disk_type", "from_where": "consume_from_where"}
    commands: dict[str, Any] = {"broker": broker.main, "namesrv": namesrv.main, "consumer": consumer.main,
                                "producer": producer.main}
    out: dict[str, dict[str, str]] = {}
    for program, command in commands.items():
        table = out.setdefault(program, {})
        for param in command.params:
            if isinstance(param, click.Option) and param.name:
                long = max(param.opts, key=len)
                table[renamed.get(param.name, param.name)] = long
    return out


def _table(cls: type[Any], env_prefix: str, flags: dict[str, str], skip: set[str] | None = None) -> list[str]:
    rows = ["| setting | default | allowed | environment | flag | meaning |",
            "|---|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if skip and f.name in skip:
            continue
        doc = str(f.metadata.get("doc", "")).replace("|", "\\|")
        flag = f"`{flags[f.name]}`" if f.name in flags else ""
        rows.append(f"| `{f.name}` | `{_toml_literal(f.default)}` | {_allowed(f)} | `{env_prefix}{f.name.upper()}` "
                    f"| {flag} | {doc} |")
    return rows


def render_configuration_md() -> str:
    """The whole of docs/CONFIGURATION.md."""
    flags = _flags()
    client_fields = {f.name for f in dataclasses.fields(ClientConfig)}
    lines: list[str] = [
        "# trimq configuration",
        "",
        "<!-- Generated from the settings classes by `.venv/bin/python tests/unit/test_deploy_configs.py --write`;",
        "     tests/unit/test_deploy_configs.py fails when this file and the code disagree. Do not edit by hand. -->",
        "",
        "Every trimq program takes its settings from four places; each one overrides the ones before it:",
        "",
        "1. the defaults below;",
        "2. a TOML file given with `--config FILE`: the settings of each program in its own table (`[namesrv]`,",
        "   `[broker]`, `[consumer]`, `[producer]`), so one file can serve every program of a machine. The",
        "   daemons also accept a file with their settings at the top level, and refuse a file with a table",
        "   that is not one of " + ", ".join(f"`[{s}]`" for s in CONFIG_SECTIONS) + ",",
        "   or with no table of theirs (it is the wrong file);",
        "3. environment variables: the program's prefix and the setting's name in capitals: `TRIMQ_BROKER_` for",
        "   the broker (`TRIMQ_BROKER_FLUSH_INTERVAL_MS=200`), `TRIMQ_NAMESRV_` for the name server,",
        "   `TRIMQ_CLIENT_` for the client programs and the SDK's `load_client_settings` (\"Environment variable",
        "   names\" below). Booleans accept `true/false`, `1/0`, `yes/no`, `on/off`;",
        "4. command-line flags, for the settings that have one.",
        "",
        "`trimq-broker --print-config` and `trimq-namesrv --print-config` print the effective settings as JSON",
        "and exit, which is also the way to check a file before a restart. Examples: `deploy/config/`",
        "(`single.toml` for one machine, `cluster-*.toml` for a name server and two brokers).",
        "",
        "## Errors",
        "",
        "An invalid value stops the program before it opens anything, with exit status 2 and one line on stderr",
        "naming the setting, the value, what is allowed and where the value came from:",
        "",
        "```",
        "trimq-broker: invalid configuration: flush_interval_ms = 0: out of range in [1, 60000] "
        "(from config file /etc/trimq/single.toml)",
        "trimq-broker: invalid configuration: flush_disk_type = 'FAST': must be one of ASYNC_FLUSH, SYNC_FLUSH "
        "(from command line)",
        "trimq-broker: invalid configuration: flush_interval_ms = 'soon': must be an integer in [1, 60000] "
        "(from environment variable TRIMQ_BROKER_FLUSH_INTERVAL_MS)",
        "trimq-broker: invalid configuration: environment variable TRIMQ_FLUSH_INTERVAL_MS is no longer read: "
        "use TRIMQ_BROKER_FLUSH_INTERVAL_MS; each program reads its own prefix (TRIMQ_BROKER_, TRIMQ_NAMESRV_, "
        "TRIMQ_CLIENT_): docs/CONFIGURATION.md",
        "trimq-broker: invalid configuration: config file /etc/trimq/single.toml: unknown setting "
        "'flush_interval' in [broker]",
        "trimq-broker: invalid configuration: config file /etc/trimq/single.toml is not valid TOML: "
        "Invalid value (at line 3, column 9)",
        "trimq-namesrv: invalid configuration: listen = '9876': address '9876' must look like HOST:PORT "
        "(from command line)",
        "```",
        "",
        "The client tools (`trimq-producer`, `trimq-consumer`) report theirs the same way and also exit with 2.",
        "A broker whose `store_dir` is a file is refused the same way (`store_dir = '...': exists and is not a",
        "directory`). A daemon that cannot start for another reason (its port is taken, its store is locked by",
        "another broker) prints `cannot start: ...` with the system's error and exits with 1:",
        "",
        "```",
        "trimq-broker: cannot start: [Errno 98] cannot listen on 127.0.0.1:10911: Address already in use",
        "```",
        "",
        "The systemd units in `deploy/systemd/` do not restart a daemon that exited with 2.",
        "",
        "## trimq-namesrv",
        "",
        "`NamesrvConfig` (namesrv/config.py): the `[namesrv]` table, `TRIMQ_NAMESRV_*` variables.",
        "",
        *_table(NamesrvConfig, env_prefix_of(NamesrvConfig), flags.get("namesrv", {})),
        "",
        "## trimq-broker",
        "",
        "`BrokerConfig` (broker/config.py): the `[broker]` table, `TRIMQ_BROKER_*` variables. Times are in",
        "milliseconds, sizes in bytes. Names follow RocketMQ's BrokerConfig / MessageStoreConfig in snake_case.",
        "",
        *_table(BrokerConfig, env_prefix_of(BrokerConfig), flags.get("broker", {})),
        "",
        "## Clients",
        "",
        "`client/config.py`: the `[producer]` table for `trimq-producer` and `Producer`, the `[consumer]` table",
        "for `trimq-consumer` and `PushConsumer`, `TRIMQ_CLIENT_*` variables. Both have the shared settings of",
        "`ClientConfig` (RocketMQ's ClientConfig) plus their own. Times are in milliseconds unless the name says",
        "otherwise (`consume_timeout` is in minutes, as in RocketMQ).",
        "",
        "### Shared (ClientConfig)",
        "",
        *_table(ClientConfig, env_prefix_of(ClientConfig), {**flags.get("producer", {}), **flags.get("consumer", {})}),
        "",
        "### trimq-producer (ProducerConfig)",
        "",
        *_table(ProducerConfig, env_prefix_of(ProducerConfig), flags.get("producer", {}), skip=client_fields),
        "",
        "### trimq-consumer (PushConsumerConfig)",
        "",
        "`consume_timestamp` left empty means half an hour before the consumer was configured (RocketMQ's",
        "default).",
        "",
        *_table(PushConsumerConfig, env_prefix_of(PushConsumerConfig), flags.get("consumer", {}), skip=client_fields),
        "",
        "## Environment variable names",
        "",
        "Each program reads its own prefix, so one environment (a shell, `deploy/local-cluster.sh`, a container)",
        "can configure them all and no name means two things:",
        "",
        "| program | variables | example |",
        "|---|---|---|",
        "| `trimq-broker` | `TRIMQ_BROKER_` + setting | `TRIMQ_BROKER_MAX_MESSAGE_SIZE=8388608` |",
        "| `trimq-namesrv` | `TRIMQ_NAMESRV_` + setting | `TRIMQ_NAMESRV_MAX_CONNECTIONS=20000` |",
        "| `trimq-producer`, `trimq-consumer`, `load_client_settings` | `TRIMQ_CLIENT_` + setting | "
        "`TRIMQ_CLIENT_NAMESRV_ADDR=10.0.0.1:9876` |",
        "| `trimq-admin` | `TRIMQ_CLIENT_NAMESRV_ADDR` (or RocketMQ's `NAMESRV_ADDR`), `TRIMQ_CLIENT_ACCESS_KEY`, "
        "`TRIMQ_CLIENT_SECRET_KEY` | |",
        "",
        "**Renamed.** The broker and the clients used to read the same `TRIMQ_<NAME>` variables, and these names",
        "meant a different setting to each: "
        + ", ".join(f"`TRIMQ_{n.upper()}`" for n in sorted(
            {f.name for f in dataclasses.fields(BrokerConfig)}
            & ({f.name for f in dataclasses.fields(ProducerConfig)} | {f.name for f in dataclasses.fields(
                PushConsumerConfig)}))) + ".",
        "Those unprefixed names are no longer read: a program that finds one of its settings under its old name",
        "stops at start (exit status 2) with a message naming the new variable, instead of silently ignoring it.",
        "The systemd units read `/etc/default/trimq-broker`, `/etc/default/trimq-namesrv` and",
        "`/etc/default/trimq-consumer` (examples in `deploy/config/*.env`).",
        "",
        "## ACL file",
        "",
        "The broker's `acl_file` is a TOML file of its own (accounts and permissions): docs/SECURITY.md,",
        "example `deploy/acl.example.toml`.",
        "",
    ]
    return "\n".join(lines)


def test_configuration_md_is_generated_from_the_settings_classes() -> None:
    expected = render_configuration_md()
    actual = CONFIGURATION_MD.read_text() if CONFIGURATION_MD.exists() else ""
    assert actual == expected, (
        "docs/CONFIGURATION.md is out of date: run `.venv/bin/python tests/unit/test_deploy_configs.py --write`")


@pytest.mark.parametrize("cls", [NamesrvConfig, BrokerConfig, ClientConfig, ProducerConfig, PushConsumerConfig],
                         ids=lambda c: c.__name__)
def test_every_setting_is_documented_with_its_default(cls: type[Any]) -> None:
    doc = CONFIGURATION_MD.read_text()
    for f in dataclasses.fields(cls):
        assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no doc"
        assert re.search(rf"\| `{f.name}` \| `{re.escape(_toml_literal(f.default))}` \|", doc), (
            f"{cls.__name__}.{f.name} (default {f.default!r}) is not in docs/CONFIGURATION.md")


# ----------------------------------------------------------------------------------------------------------
# systemd units


UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
REQUIRED = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
    "KillSignal": "SIGTERM", "Restart": "on-failure", "RestartPreventExitStatus": "2",
}


def unit_settings(path: Path) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"{path.name}: {raw!r}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_units_exist() -> None:
    assert {u.name for u in UNITS} == {"trimq-namesrv@.service", "trimq-broker@.service", "trimq-consumer@.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_hardening_restart_and_graceful_stop(unit: Path) -> None:
    s = unit_settings(unit)
    assert set(s) == {"Unit", "Service", "Install"}
    service = s["Service"]
    for key, value in REQUIRED.items():
        assert service.get(key) == [value], (unit.name, key, service.get(key))
    assert int(service["TimeoutStopSec"][0]) >= 30
    tool = unit.name.split("@")[0]
    exec_start = service["ExecStart"][0]
    assert exec_start.startswith(f"/opt/trimq/.venv/bin/{tool} --config /etc/trimq/%i.toml --log-format json")
    if tool == "trimq-broker":
        assert service["ReadWritePaths"] == ["/var/lib/trimq"]
    assert s["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    names = []
    for unit in UNITS:
        text = unit.read_text().replace("/opt/trimq/.venv/bin/", f"{bin_dir}/")
        (tmp_path / unit.name).write_text(text)
        name = unit.name.replace("@.", "@example.")
        (tmp_path / name).write_text(text)
        names.append(str(tmp_path / name))
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", *names], capture_output=True, text=True,
                         timeout=60, env={"SYSTEMD_LOG_LEVEL": "warning", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr


def test_local_cluster_script_is_valid_bash() -> None:
    script = DEPLOY / "local-cluster.sh"
    assert script.stat().st_mode & 0o111, "deploy/local-cluster.sh must be executable"
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert not re.search(r"\b(pkill|killall)\b", script.read_text().split("set -euo pipefail", 1)[1])


# ----------------------------------------------------------------------------------------------------------
# prometheus.yml (no YAML library here: a parser for the small block subset the file uses)


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _scalar(text: str) -> Any:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_scalar(p) for p in inner.split(",")] if inner else []
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    assert not text.startswith(("{", "&", "*", "!", "|", ">")), f"unsupported YAML: {text!r}"
    return text


def _block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    if lines[i][1].startswith("- "):
        seq = []
        while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
            rest = lines[i][1][2:].strip()
            if re.match(r"^[A-Za-z_][\w.-]*:(\s|$)", rest):
                lines[i] = (indent + 2, rest)  # "- key: value" starts a mapping at indent + 2
                value, i = _block(lines, i, indent + 2)
            else:
                value, i = _scalar(rest), i + 1
            seq.append(value)
        return seq, i
    mapping: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("- "):
        key, sep, rest = lines[i][1].partition(":")
        assert sep and re.fullmatch(r"[A-Za-z_][\w.-]*", key), f"not 'key: value': {lines[i][1]!r}"
        assert key not in mapping, f"duplicate key {key!r}"
        i += 1
        if rest.strip():
            mapping[key] = _scalar(rest)
        elif i < len(lines) and (lines[i][0] > indent or (lines[i][0] == indent and lines[i][1].startswith("- "))):
            mapping[key], i = _block(lines, i, lines[i][0])
        else:
            mapping[key] = None
    return mapping, i


def parse_yaml(text: str) -> Any:
    assert "\t" not in text, "tabs in YAML"
    lines = []
    for raw in text.splitlines():
        line = _strip_comment(raw).rstrip()
        if line.strip():
            lines.append((len(line) - len(line.lstrip(" ")), line.strip()))
    value, i = _block(lines, 0, lines[0][0])
    assert i == len(lines), f"unparsed YAML from line {lines[i]!r} (bad indentation?)"
    return value


def test_yaml_subset_parser() -> None:
    doc = parse_yaml("a: 1\nb:\n  c: 'x # y'  # comment\n  d: [1, 'two']\nlist:\n  - k: v\n    n: 2\n  - plain\n")
    assert doc == {"a": 1, "b": {"c": "x # y", "d": [1, "two"]}, "list": [{"k": "v", "n": 2}, "plain"]}
    with pytest.raises(AssertionError):
        parse_yaml("a: 1\n   b: 2\n")


def scrape_targets() -> dict[str, list[str]]:
    doc = parse_yaml((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert re.fullmatch(r"\d+[smh]", doc["global"]["scrape_interval"])
    jobs: dict[str, list[str]] = {}
    for job in doc["scrape_configs"]:
        assert job["job_name"] not in jobs
        targets = [t for sc in job["static_configs"] for t in sc["targets"]]
        for t in targets:
            host, _, port = t.rpartition(":")
            assert host and 0 < int(port) < 65536, t
        jobs[job["job_name"]] = targets
    return jobs


def test_prometheus_scrapes_every_daemon_of_the_example_cluster() -> None:
    jobs = scrape_targets()
    assert set(jobs) == {"trimq-namesrv", "trimq-broker", "trimq-consumer"}
    brokers = [load_section(p, "broker") for p in sorted((DEPLOY / "config").glob("cluster-broker-*.toml"))]
    assert sorted(jobs["trimq-broker"]) == sorted(f"{b.broker_ip}:{b.metrics_port}" for b in brokers)
    ns = load_section(DEPLOY / "config" / "cluster-namesrv.toml", "namesrv")
    ns_hosts = {a.rpartition(":")[0] for b in brokers for a in b.namesrv_addrs}
    assert jobs["trimq-namesrv"] == [f"{h}:{ns.metrics_port}" for h in sorted(ns_hosts)]
    for b in [*brokers, ns]:
        assert b.metrics_port and b.metrics_host == "0.0.0.0"  # reachable by a Prometheus on another host


# ----------------------------------------------------------------------------------------------------------
# Grafana dashboard


def _exported_client_metrics() -> dict[str, set[str]]:
    """The push consumer's series names and their labels, read from a live registry (every metric fed once)."""
    from prometheus_client import CollectorRegistry

    from trimq.client.metrics import ConsumerMetrics, QueueState

    class Source:
        group_name = "g"

        def metrics_state(self) -> tuple[list[QueueState], dict[str, int], int]:
            return [QueueState("T", "broker-a", 0, 1, 1, True, 1.0, 1, blocked_keys=1)], {"pulls": 1}, 1

    metrics = ConsumerMetrics("g", CollectorRegistry())
    source = Source()
    metrics.attach(source)
    metrics.observe_consume("T", 0.1)
    metrics.count_consumed("T", 1, 1)
    metrics.observe_pull("T", 0.1)
    metrics.count_send_back("broker")
    metrics.observe_rebalance(0.1)
    out: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def metric_labels() -> dict[str, set[str]]:
    """Every series name trimq exports (histograms with their _bucket/_count/_sum) -> its label names.

    The broker's and name server's come from their METRICS tables (which docs/OPERATIONS.md repeats), the
    push consumer's from a live registry; Prometheus's own ``up`` is added (every scrape target has it)."""
    from trimq.broker import metrics as broker_metrics
    from trimq.namesrv import metrics as namesrv_metrics

    out: dict[str, set[str]] = {"up": set()}
    for table in (broker_metrics.METRICS, namesrv_metrics.METRICS):
        for name, (kind, labels, _meaning) in table.items():
            names = {x.strip() for x in labels.split(",") if x.strip()}
            out.setdefault(name, set()).update(names)
            if kind == "histogram":
                out.setdefault(f"{name}_bucket", set()).update(names | {"le"})
                for suffix in ("_count", "_sum"):
                    out.setdefault(name + suffix, set()).update(names)
    out.update(_exported_client_metrics())
    return out


def known_metrics() -> set[str]:
    return set(metric_labels())


#: labels Prometheus adds to every series it scrapes (prometheus.yml sets no others).
TARGET_LABELS = {"job", "instance"}


def check_promql(expr: str, where: str, known: dict[str, set[str]], legend: str = "") -> None:
    """Every metric ``expr`` reads exists, and every label it groups, matches or prints (``legend``) is one of
    those metrics' labels or a target label: a renamed label fails here instead of graphing nothing."""
    assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), (where, expr)
    names = set(re.findall(r"\b(trimq_[a-z_]+|up)\b(?=\s*[{\[)\s]|$)", expr))
    assert names, f"{where}: reads no trimq metric: {expr}"
    labels = set(TARGET_LABELS)
    for name in names:
        assert name in known, f"{where}: unknown metric {name} in {expr}"
        labels |= known[name]
    used = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        used |= {x.strip() for x in group.split(",") if x.strip()}
    for selector in re.findall(r"\{([^}]*)\}", expr):
        used |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", selector))
    used |= set(re.findall(r"\{\{\s*\.?([A-Za-z_]\w*)\s*\}\}", legend))
    assert used <= labels, f"{where}: label(s) {sorted(used - labels)} not on {sorted(names)}: {expr}"


def test_promql_check_catches_unknown_metrics_and_labels() -> None:
    known = metric_labels()
    check_promql('sum by (consumer_group) (trimq_consumer_lag_messages{topic="T"})', "ok", known)
    with pytest.raises(AssertionError, match="unknown metric"):
        check_promql("trimq_consumer_lagg_messages > 0", "typo", known)
    with pytest.raises(AssertionError, match=r"label\(s\) \['consumer'\]"):
        check_promql("sum by (consumer) (trimq_consumer_lag_messages)", "label", known)
    with pytest.raises(AssertionError, match=r"label\(s\) \['group'\]"):
        check_promql("trimq_locks_held", "legend", known, legend="{{group}}")


def test_one_group_label_name_on_every_metric() -> None:
    """``consumer_group`` on the broker's and the push consumer's metrics alike (the client said ``group``)."""
    labels = metric_labels()
    assert not [n for n, ls in labels.items() if "group" in ls]
    assert "consumer_group" in labels["trimq_consumer_lag_messages"]
    assert "consumer_group" in labels["trimq_consumer_queue_blocked_seconds"]
    assert "consumer_group" in labels["trimq_consumer_consumed_messages_total"]


def test_client_metrics_docstring_lists_what_the_registry_exports() -> None:
    from trimq.client import metrics as client_metrics

    documented = set(re.findall(r"^(trimq_consumer_[a-z_]+)\s", client_metrics.__doc__ or "", re.MULTILINE))
    exported = {re.sub(r"_(bucket|count|sum)$", "", n) for n in _exported_client_metrics()
                if not n.endswith("_created")}
    assert documented == exported


def dashboard_exprs(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def test_grafana_dashboard() -> None:
    dash = json.loads((DEPLOY / "grafana" / "trimq.json").read_text())
    assert dash["uid"] and dash["title"] == "trimq"
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("lag", "messages in", "messages out", "lock", "fenced", "retries", "dead letters", "rebalance"):
        assert topic in titles, topic
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
    known = metric_labels()
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            check_promql(target["expr"], panel["title"], known, target.get("legendFormat", ""))


def test_dashboard_and_scrape_jobs_agree() -> None:
    jobs = set(scrape_targets())
    dash = json.loads((DEPLOY / "grafana" / "trimq.json").read_text())
    for title, expr in dashboard_exprs(dash):
        for job in re.findall(r'job="([^"]+)"', expr):
            assert job in jobs, (title, job)



# ----------------------------------------------------------------------------------------------------------
# Alert rules (deploy/prometheus/alerts.yml): structure and names here, promtool below


ALERTS = DEPLOY / "prometheus" / "alerts.yml"


def alert_rules() -> list[dict[str, Any]]:
    doc = parse_yaml(ALERTS.read_text())
    assert set(doc) == {"groups"}
    rules = []
    for group in doc["groups"]:
        assert set(group) == {"name", "rules"} and group["rules"], group.get("name")
        rules.extend(group["rules"])
    return rules


def test_alert_rules_read_metrics_and_labels_trimq_exports() -> None:
    known = metric_labels()
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        expr = str(rule["expr"])
        check_promql(expr, rule["alert"], known)
        # the annotations print only labels the alert keeps
        check_promql(expr, rule["alert"], known, " ".join(rule["annotations"].values()).replace("$labels", ""))
        for job in re.findall(r'job="([^"]+)"', expr):
            assert job in scrape_targets(), (rule["alert"], job)
    # what the issue asks for: lag growing, a blocked orderly queue, DLQ growth, a broker down
    wanted = {"TrimqConsumerLagGrowing": "trimq_consumer_lag_messages",
              "TrimqOrderlyQueueBlocked": "trimq_consumer_queue_blocked_seconds",
              "TrimqDeadLetters": "trimq_send_to_dlq_messages_total", "TrimqBrokerDown": 'up{job="trimq-broker"}'}
    by_name = {r["alert"]: str(r["expr"]) for r in rules}
    for alert, metric in wanted.items():
        assert metric in by_name.get(alert, ""), alert


def test_prometheus_config_loads_the_alert_rules() -> None:
    doc = parse_yaml((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert doc["rule_files"] == ["alerts.yml"]


def promtool() -> str:
    """promtool from PATH or where `make test` puts it; a machine that could install it must have it."""
    import os

    found = shutil.which("promtool") or (ROOT / "build" / "tools" / "usr" / "bin" / "promtool")
    if Path(found).is_file():
        return str(found)
    if os.geteuid() == 0 and shutil.which("apt-get") and shutil.which("dpkg-deb"):
        pytest.fail("promtool is missing although this machine can install it: run `make promtool` "
                    "(`make test` does) or `apt-get install prometheus`")
    pytest.skip("promtool is not installed and this is not root (Debian: apt-get install prometheus); "
                "the parser tests still check alerts.yml")


def _promtool(*args: str, cwd: Path) -> str:
    out = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}{out.stderr}"
    return out.stdout


def test_promtool_accepts_the_rules_and_the_config() -> None:
    prom = DEPLOY / "prometheus"
    assert f"SUCCESS: {len(alert_rules())} rules found" in _promtool("check", "rules", "alerts.yml", cwd=prom)
    assert "SUCCESS: 1 rule files found" in _promtool("check", "config", "prometheus.yml", cwd=prom)


def test_promtool_alert_cases() -> None:
    """deploy/prometheus/alerts_test.yml: series as trimq exports them, and the alerts that must (not) fire."""
    _promtool("test", "rules", "alerts_test.yml", cwd=DEPLOY / "prometheus")


def test_promtool_parses_the_dashboard_queries(tmp_path: Path) -> None:
    dash = json.loads((DEPLOY / "grafana" / "trimq.json").read_text())
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, (_title, expr) in enumerate(dashboard_exprs(dash)):
        lines += [f"      - record: dashboard:query_{i}", f"        expr: {json.dumps(expr.replace('$group', '.*'))}"]
    (tmp_path / "dashboard.yml").write_text("\n".join(lines) + "\n")
    _promtool("check", "rules", "dashboard.yml", cwd=tmp_path)

if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        CONFIGURATION_MD.write_text(render_configuration_md())
        print(f"wrote {CONFIGURATION_MD}")
    else:
        print(render_configuration_md())
