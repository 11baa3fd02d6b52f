"""Client configs: RocketMQ's defaults and checkConfig ranges, with errors naming field, value and range."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from trimq.client.config import (
    ClientConfig,
    ConfigError,
    ProducerConfig,
    PushConsumerConfig,
    default_consume_timestamp,
    load_client_settings,
    parse_consume_timestamp,
)


def consumer(**kw: object) -> PushConsumerConfig:
    return PushConsumerConfig(consumer_group="g1", **kw)  # type: ignore[arg-type]


def test_client_defaults() -> None:
    c = ClientConfig()
    assert (c.poll_name_server_interval, c.heartbeat_broker_interval) == (30_000, 30_000)
    assert (c.persist_consumer_offset_interval, c.rebalance_interval) == (5_000, 20_000)
    assert c.mq_client_api_timeout == 3000
    assert ClientConfig(namesrv_addr="127.0.0.1:9876; 10.0.0.1:9876").namesrv_addrs == [
        "127.0.0.1:9876", "10.0.0.1:9876"]


def test_producer_defaults() -> None:
    p = ProducerConfig()
    assert p.producer_group == "DEFAULT_PRODUCER"
    assert (p.send_msg_timeout, p.retry_times_when_send_failed) == (3000, 2)
    assert p.max_message_size == 4 * 1024 * 1024
    assert p.default_topic_queue_nums == 4
    assert isinstance(p.client_settings(), ClientConfig)
    assert type(p.client_settings()) is ClientConfig


def test_push_consumer_defaults_match_rocketmq() -> None:
    c = consumer()
    expected = {
        "consume_thread_min": 20, "consume_thread_max": 20, "adjust_thread_pool_nums_threshold": 100_000,
        "consume_concurrently_max_span": 2000, "pull_threshold_for_queue": 1000,
        "pull_threshold_size_for_queue": 100, "pull_threshold_for_topic": -1, "pull_threshold_size_for_topic": -1,
        "pull_interval": 0, "consume_message_batch_max_size": 1, "pull_batch_size": 32, "max_reconsume_times": -1,
        "suspend_current_queue_time_millis": 1000, "consume_timeout": 15,
        "await_termination_millis_when_shutdown": 0, "message_model": "CLUSTERING",
        "consume_from_where": "CONSUME_FROM_LAST_OFFSET", "allocate_message_queue_strategy": "AVG",
        "pull_time_delay_mills_when_exception": 3000, "pull_time_delay_mills_when_flow_control": 50,
        "pull_time_delay_mills_when_suspend": 1000, "broker_suspend_max_time_millis": 15_000,
        "consumer_timeout_millis_when_suspend": 30_000, "rebalance_lock_interval": 20_000,
        "rebalance_lock_max_live_time": 30_000, "pull_max_idle_time": 120_000, "unlock_delay_time_mills": 0,
        "consume_lock_wait_millis": 1000, "max_time_consume_continuously": 60_000,
    }
    assert {k: getattr(c, k) for k in expected} == expected


def test_default_consume_timestamp_is_half_an_hour_ago() -> None:
    now = dt.datetime(2024, 3, 1, 0, 10, 0)
    assert default_consume_timestamp(now) == "20240229234000"
    c = consumer()
    ts = parse_consume_timestamp(c.consume_timestamp)
    assert abs(ts - (dt.datetime.now() - dt.timedelta(minutes=30)).timestamp() * 1000) < 120_000
    assert c.consume_timestamp_ms == ts


# (field, bad value, text the message must contain) -- RocketMQ checkConfig's ranges (FACTS §5)
BAD = [
    ("consume_thread_min", 0, "[1, 1000]"),
    ("consume_thread_max", 1001, "[1, 1000]"),
    ("consume_concurrently_max_span", 65536, "[1, 65535]"),
    ("pull_threshold_for_queue", 65536, "[1, 65535]"),
    ("pull_threshold_for_queue", 0, "[1, 65535]"),
    ("pull_threshold_size_for_queue", 1025, "[1, 1024]"),
    ("pull_threshold_for_topic", 6553501, "-1 or [1, 6553500]"),
    ("pull_threshold_for_topic", 0, "-1 or [1, 6553500]"),
    ("pull_threshold_size_for_topic", 102401, "-1 or [1, 102400]"),
    ("pull_interval", 65536, "[0, 65535]"),
    ("pull_interval", -1, "[0, 65535]"),
    ("consume_message_batch_max_size", 1025, "[1, 1024]"),
    ("pull_batch_size", 0, "[1, 1024]"),
    ("message_model", "CLUSTER", "CLUSTERING, BROADCASTING"),
    ("consume_from_where", "FROM_START", "CONSUME_FROM_FIRST_OFFSET"),
    ("pull_batch_size", "32", "must be an integer"),
    ("pull_batch_size", True, "must be an integer"),
]


@pytest.mark.parametrize(("name", "value", "text"), BAD)
def test_out_of_range_values_name_field_value_and_range(name: str, value: object, text: str) -> None:
    with pytest.raises(ConfigError) as ei:
        consumer(**{name: value})
    msg = str(ei.value)
    assert msg.startswith(f"{name} = {value!r}")
    assert text in msg


def test_threshold_special_values_and_bounds_are_accepted() -> None:
    c = consumer(pull_threshold_for_topic=-1, pull_threshold_size_for_topic=102400, pull_threshold_for_queue=65535,
                 consume_thread_min=1, consume_thread_max=1000, pull_interval=0)
    assert c.pull_threshold_size_for_topic == 102400


def test_cross_field_and_named_checks() -> None:
    with pytest.raises(ConfigError, match=r"consume_thread_min = 30: must not exceed consume_thread_max = 20"):
        consumer(consume_thread_min=30)
    with pytest.raises(ConfigError, match="consumer_group = ''"):
        PushConsumerConfig()
    with pytest.raises(ConfigError, match="reserved"):
        PushConsumerConfig(consumer_group="DEFAULT_CONSUMER")
    with pytest.raises(ConfigError, match="illegal characters"):
        PushConsumerConfig(consumer_group="a b")
    with pytest.raises(ConfigError, match="consume_timestamp = '2024-01-01'"):
        consumer(consume_timestamp="2024-01-01")
    with pytest.raises(ConfigError, match="allocate_message_queue_strategy = 'ROUND'"):
        consumer(allocate_message_queue_strategy="ROUND")
    with pytest.raises(ConfigError, match="must be larger than broker_suspend_max_time_millis"):
        consumer(consumer_timeout_millis_when_suspend=15_000)
    with pytest.raises(ConfigError, match="namesrv_addr = 'nohost'"):
        ClientConfig(namesrv_addr="nohost")
    with pytest.raises(ConfigError, match="instance_name"):
        ClientConfig(instance_name="a@b")
    with pytest.raises(ConfigError, match="producer_group"):
        ProducerConfig(producer_group="")
    with pytest.raises(ConfigError, match=r"send_msg_timeout = 0: out of range in \[1, 600000\]"):
        ProducerConfig(send_msg_timeout=0)


def test_validate_after_mutation() -> None:
    c = consumer()
    c.pull_batch_size = 5000
    with pytest.raises(ConfigError, match="pull_batch_size = 5000"):
        c.validate()


def test_replace_keeps_values() -> None:
    c = consumer(pull_batch_size=7, consume_timestamp="20240101000000")
    d = dataclasses.replace(c)
    assert d is not c and d.pull_batch_size == 7 and d.consume_timestamp == "20240101000000"


def test_load_client_settings_precedence(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.toml"
    f.write_text('consumer_group = "g"\npull_batch_size = 8\n[consumer]\npull_interval = 5\n')
    monkeypatch.setenv("TRIMQ_CLIENT_PULL_BATCH_SIZE", "16")
    c = load_client_settings(PushConsumerConfig, config_file=str(f))
    assert (c.consumer_group, c.pull_batch_size) == ("g", 16)
    c = load_client_settings(PushConsumerConfig, config_file=str(f), overrides={"pull_batch_size": 4,
                                                                                 "pull_interval": None})
    assert c.pull_batch_size == 4
    sec = load_client_settings(PushConsumerConfig, config_file=str(f), section="consumer",
                               overrides={"consumer_group": "g2"})
    assert sec.pull_interval == 5 and sec.consumer_group == "g2"
    monkeypatch.setenv("TRIMQ_CLIENT_PULL_BATCH_SIZE", "many")
    with pytest.raises(ConfigError, match="pull_batch_size = 'many'"):
        load_client_settings(PushConsumerConfig, overrides={"consumer_group": "g"})
    f.write_text('bogus = 1\n')
    monkeypatch.delenv("TRIMQ_CLIENT_PULL_BATCH_SIZE")
    with pytest.raises(ConfigError, match="unknown setting 'bogus'"):
        load_client_settings(PushConsumerConfig, config_file=str(f))


def test_client_loader_has_the_daemons_rules(tmp_path: Any, monkeypatch: Any) -> None:
    """One settings machinery for daemons and clients (runtime/settings.py): a file with only other programs'
    tables is refused instead of silently giving defaults, and errors say where a value came from."""
    from trimq.client.config import ConfigError, PushConsumerConfig, load_client_settings

    only_broker = tmp_path / "b.toml"
    only_broker.write_text("[broker]\nlisten = '127.0.0.1:1'\n")
    with pytest.raises(ConfigError, match=r"no \[consumer\] table"):
        load_client_settings(PushConsumerConfig, config_file=str(only_broker), section="consumer")
    monkeypatch.setenv("TRIMQ_CLIENT_PULL_BATCH_SIZE", "5000")
    with pytest.raises(ConfigError, match=r"pull_batch_size = 5000: .*\(from environment variable "
                                          r"TRIMQ_CLIENT_PULL_BATCH_SIZE\)"):
        load_client_settings(PushConsumerConfig, overrides={"consumer_group": "g"})
