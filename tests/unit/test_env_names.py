"""Environment variable names: one meaning each (issue 19 item 6).

The broker and the clients used to read the same ``TRIMQ_<NAME>`` variables, so ``TRIMQ_MAX_MESSAGE_SIZE``,
``TRIMQ_TLS_*``, ``TRIMQ_DEFAULT_TOPIC_QUEUE_NUMS``, ... set in one environment meant a broker setting to the
broker and a different client setting to the clients. Now each program reads its own prefix
(``TRIMQ_BROKER_``, ``TRIMQ_NAMESRV_``, ``TRIMQ_CLIENT_``) and refuses the retired unprefixed names with a
message naming the new one. The example environment files of deploy/config/ (for the systemd units) only
hold variables their program reads, with values it accepts.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from trimq.broker.config import BrokerConfig
from trimq.client.config import ClientConfig, ProducerConfig, PushConsumerConfig, load_client_settings
from trimq.namesrv.config import NamesrvConfig
from trimq.runtime.settings import ConfigError, build_settings, env_prefix_of, env_var, load_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROGRAMS: dict[str, list[type[Any]]] = {
    "broker": [BrokerConfig], "namesrv": [NamesrvConfig], "client": [ProducerConfig, PushConsumerConfig],
}


@pytest.fixture(autouse=True)
def no_trimq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("TRIMQ_", "NAMESRV_ADDR")):
            monkeypatch.delenv(k)


def names(cls: type[Any]) -> set[str]:
    return {env_var(cls, f.name) for f in dataclasses.fields(cls)}


def test_one_prefix_per_program() -> None:
    assert env_prefix_of(BrokerConfig) == "TRIMQ_BROKER_"
    assert env_prefix_of(NamesrvConfig) == "TRIMQ_NAMESRV_"
    assert env_prefix_of(ProducerConfig) == env_prefix_of(PushConsumerConfig) == "TRIMQ_CLIENT_"


def test_no_variable_is_read_by_two_programs() -> None:
    broker, namesrv = names(BrokerConfig), names(NamesrvConfig)
    client = names(ProducerConfig) | names(PushConsumerConfig)
    assert not broker & namesrv and not broker & client and not namesrv & client
    # the producer and the consumer share a name only for a ClientConfig setting (one meaning)
    shared = names(ProducerConfig) & names(PushConsumerConfig)
    assert shared == names(ClientConfig)


def test_a_retired_name_is_never_another_programs_current_name() -> None:
    """Else one environment holding both programs' variables would stop one of them."""
    current = set().union(*(names(c) for cs in PROGRAMS.values() for c in cs))
    for classes in PROGRAMS.values():
        for cls in classes:
            retired = {getattr(cls, "RETIRED_ENV_PREFIX", "") + f.name.upper() for f in dataclasses.fields(cls)}
            if getattr(cls, "RETIRED_ENV_PREFIX", None):
                assert not retired & current, (cls.__name__, sorted(retired & current))


@pytest.mark.parametrize("name", ["max_message_size", "default_topic_queue_nums", "tls_cert_file", "tls_ca_file",
                                  "tls_key_file", "namesrv_addr", "lock_profile"])
def test_the_names_that_meant_two_things_are_refused_naming_the_new_one(name: str) -> None:
    old = "TRIMQ_" + name.upper()
    readers = [(cls, new) for cls, new in ((BrokerConfig, "TRIMQ_BROKER_"), (ProducerConfig, "TRIMQ_CLIENT_"),
                                           (PushConsumerConfig, "TRIMQ_CLIENT_"))
               if name in {f.name for f in dataclasses.fields(cls)}]
    assert BrokerConfig in [c for c, _ in readers] and len(readers) >= 2  # it did mean two things
    for cls, new in readers:
        with pytest.raises(ConfigError, match=rf"environment variable {old} is no longer read: use {new}{old[6:]}"):
            build_settings(cls, environ={old: "x"})


def test_retired_names_through_the_loaders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMQ_FLUSH_DISK_TYPE", "SYNC_FLUSH")
    monkeypatch.setenv("TRIMQ_LISTEN", "127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"environment variables no longer read: TRIMQ_LISTEN \(use "
                                          r"TRIMQ_BROKER_LISTEN\), TRIMQ_FLUSH_DISK_TYPE \(use "
                                          r"TRIMQ_BROKER_FLUSH_DISK_TYPE\)"):
        load_settings(BrokerConfig, section="broker")
    assert load_settings(NamesrvConfig, section="namesrv").listen == "127.0.0.1:9876"  # never read TRIMQ_*
    monkeypatch.delenv("TRIMQ_FLUSH_DISK_TYPE")
    monkeypatch.delenv("TRIMQ_LISTEN")
    monkeypatch.setenv("TRIMQ_BROKER_FLUSH_DISK_TYPE", "SYNC_FLUSH")
    monkeypatch.setenv("TRIMQ_CLIENT_CONSUMER_GROUP", "g")
    monkeypatch.setenv("TRIMQ_CONSUME_THREAD_MAX", "8")
    assert load_settings(BrokerConfig, section="broker").flush_disk_type == "SYNC_FLUSH"
    with pytest.raises(ConfigError, match="TRIMQ_CONSUME_THREAD_MAX is no longer read: use "
                                          "TRIMQ_CLIENT_CONSUME_THREAD_MAX"):
        load_client_settings(PushConsumerConfig, section="consumer")
    monkeypatch.delenv("TRIMQ_CONSUME_THREAD_MAX")
    assert load_client_settings(PushConsumerConfig, section="consumer").consumer_group == "g"


def test_admin_reads_the_client_names_and_refuses_the_retired_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    import trimq.runtime.logs
    from trimq.tools.admin import main

    # in-process: leave the process's logging as the other tests expect it (capture_logs needs it unconfigured)
    monkeypatch.setattr(trimq.runtime.logs, "configure_logging", lambda *a, **k: None)
    runner = CliRunner()
    out = runner.invoke(main, ["allocate", "--queues", "4", "--consumers", "2"],
                        env={"TRIMQ_NAMESRV_ADDR": "127.0.0.1:9876"})
    assert out.exit_code == 2
    assert "TRIMQ_NAMESRV_ADDR is no longer read: use TRIMQ_CLIENT_NAMESRV_ADDR" in out.output
    params = {p.name: p for p in main.params}
    assert params["namesrv"].envvar == ["TRIMQ_CLIENT_NAMESRV_ADDR", "NAMESRV_ADDR"]
    assert params["access_key"].envvar == "TRIMQ_CLIENT_ACCESS_KEY"
    assert params["secret_key"].envvar == "TRIMQ_CLIENT_SECRET_KEY"


# ----------------------------------------------------------------------------------------------------------
# deploy/config/*.env: the environment files of the systemd units


ENV_FILES = {"trimq-broker.env": "broker", "trimq-namesrv.env": "namesrv", "trimq-consumer.env": "client"}


def env_file(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(variables, commented-out example variables) of a systemd EnvironmentFile."""
    active: dict[str, str] = {}
    examples: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        m = re.fullmatch(r"(#?)([A-Z][A-Z0-9_]*)=(.*)", line)
        if m:
            (examples if m.group(1) else active)[m.group(2)] = m.group(3)
        else:
            assert not line or line.startswith(("#", ";")), f"{path.name}: {raw!r}"
    return active, examples


@pytest.mark.parametrize("name", sorted(ENV_FILES))
def test_example_environment_files_hold_only_their_programs_variables(name: str) -> None:
    active, examples = env_file(DEPLOY / "config" / name)
    variables = {**active, **examples}
    assert variables, name
    program = ENV_FILES[name]
    classes = PROGRAMS[program]
    known = set().union(*(names(c) for c in classes))
    for var in variables:
        assert var in known, f"{name}: {var} is not a {program} setting"
    # the values, all examples taken together, are ones the program accepts
    for cls in classes:
        mine = {k: v for k, v in variables.items() if k in names(cls)}
        if cls is PushConsumerConfig:
            mine.setdefault("TRIMQ_CLIENT_CONSUMER_GROUP", "g")
        settings = build_settings(cls, environ=mine)
        for var, value in mine.items():
            field = var[len(env_prefix_of(cls)):].lower()
            assert str(getattr(settings, field)).lower() == value.lower(), (name, var)


def test_every_unit_reads_its_programs_environment_file() -> None:
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        text = unit.read_text()
        program = unit.name.split("@")[0]
        assert "EnvironmentFile=-/etc/default/%p" in text, unit.name
        assert (DEPLOY / "config" / f"{program}.env").exists(), f"no example /etc/default/{program}"
        prefix = {"trimq-broker": "TRIMQ_BROKER_", "trimq-namesrv": "TRIMQ_NAMESRV_",
                  "trimq-consumer": "TRIMQ_CLIENT_"}[program]
        assert prefix in text, f"{unit.name} should say which variables its program reads"


def test_the_consumer_units_instance_file_parses_with_the_consumer() -> None:
    """deploy/config/cluster-clients.env's CONSUMER_ARGS, with its TOML file, are a valid trimq-consumer call."""
    from trimq.tools.consumer import main

    active, _ = env_file(DEPLOY / "config" / "cluster-clients.env")
    args = ["--config", str(DEPLOY / "config" / "cluster-clients.toml"), *shlex.split(active["CONSUMER_ARGS"])]
    ctx = main.make_context("trimq-consumer", args)
    assert ctx.params["topic"] and ctx.params["config_file"]
    # what deploy/prometheus/prometheus.yml scrapes: the consumer's metrics, reachable from another host
    prometheus = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    consumer_job = prometheus.split("job_name: trimq-consumer", 1)[1]
    assert f":{ctx.params['metrics_port']}'" in consumer_job and ctx.params["metrics_host"] == "0.0.0.0"
