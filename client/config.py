"""Client settings: RocketMQ's names in snake_case, its defaults, and its allowed ranges.

* :class:`ClientConfig` — what every client process shares (RocketMQ's ``ClientConfig``): name servers,
  client id parts, timer periods.
* :class:`ProducerConfig` — ``DefaultMQProducer``'s settings (plus the client ones).
* :class:`PushConsumerConfig` — ``DefaultMQPushConsumer``'s settings (plus the client ones), with
  ``DefaultMQPushConsumerImpl.checkConfig``'s ranges (ROCKETMQ_FACTS.md §5) and the pull constants
  RocketMQ hard-codes, exposed so tests can shorten them.

Every config validates itself on construction (and on :meth:`validate` after changes); a bad value raises
:class:`ConfigError` naming the field, the value and the allowed range. Times are in milliseconds unless
the name says otherwise (``consume_timeout`` is in minutes, as in RocketMQ).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import tomllib
from dataclasses import dataclass
from typing import Any, ClassVar

from trimq.protocol.address import parse_address
from trimq.protocol.validation import InvalidNameError, check_group
from trimq.runtime.settings import ConfigError, build_settings, setting, validate_dataclass

__all__ = [
    "CONSUME_FROM_WHERE_VALUES",
    "DEFAULT_CONSUMER_GROUP",
    "DEFAULT_PRODUCER_GROUP",
    "MESSAGE_MODELS",
    "ORDER_SCOPES",
    "ClientConfig",
    "ConfigError",
    "ProducerConfig",
    "PushConsumerConfig",
    "default_consume_timestamp",
    "load_client_settings",
    "parse_consume_timestamp",
]

DEFAULT_PRODUCER_GROUP = "DEFAULT_PRODUCER"
DEFAULT_CONSUMER_GROUP = "DEFAULT_CONSUMER"
MESSAGE_MODELS = ("CLUSTERING", "BROADCASTING")
ORDER_SCOPES = ("queue", "key")
CONSUME_FROM_WHERE_VALUES = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
    # Deprecated in RocketMQ; they behave as CONSUME_FROM_LAST_OFFSET.
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
)
CONSUME_TIMESTAMP_FORMAT = "%Y%m%d%H%M%S"  # RocketMQ's yyyyMMddHHmmss
_INT_MAX = 2**31 - 1
_MIB = 1024 * 1024


@dataclass
class ClientConfig:
    """Settings shared by everything in one client process (RocketMQ's ``ClientConfig``)."""

    #: Environment variables (:func:`load_client_settings`): ``TRIMQ_CLIENT_`` + the setting's name in capitals,
    #: for the producer and the consumer alike. The unprefixed ``TRIMQ_<NAME>`` of earlier versions is refused:
    #: several of those names also meant broker settings (docs/CONFIGURATION.md).
    ENV_PREFIX: ClassVar[str] = "TRIMQ_CLIENT_"
    RETIRED_ENV_PREFIX: ClassVar[str] = "TRIMQ_"

    namesrv_addr: str = setting("", "name server HOST:PORT list separated by ';'")
    instance_name: str = setting("", "appended to the client id (ip@pid@instance_name) when set")
    client_ip: str = setting("", "IP put in the client id; empty = this host's primary address")
    poll_name_server_interval: int = setting(30_000, "refresh topic routes from the name server this often",
                                             min=10, max=86_400_000)
    heartbeat_broker_interval: int = setting(30_000, "send heartbeats to every broker this often",
                                             min=10, max=86_400_000)
    persist_consumer_offset_interval: int = setting(5_000, "persist consumer offsets to the broker this often",
                                                    min=10, max=86_400_000)
    rebalance_interval: int = setting(20_000, "rebalance every consumer this often (and at once on "
                                      "NOTIFY_CONSUMER_IDS_CHANGED)", min=10, max=86_400_000)
    mq_client_api_timeout: int = setting(3_000, "timeout of ordinary broker/name-server calls",
                                         min=1, max=600_000)
    connect_timeout: int = setting(3_000, "TCP connect timeout", min=1, max=600_000)
    access_key: str = setting("", "ACL access key; with secret_key, every request is signed (docs/SECURITY.md)")
    secret_key: str = setting("", "ACL secret key of access_key")
    tls_enable: bool = setting(False, "talk TLS to brokers and name servers (all of them: a TLS broker's name "
                               "server must speak TLS too)")
    tls_ca_file: str = setting("", "PEM CA bundle verifying the servers (empty: the system CAs)")
    tls_cert_file: str = setting("", "PEM client certificate, for servers that require one")
    tls_key_file: str = setting("", "PEM key of tls_cert_file (empty: the key is in that file)")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> ClientConfig:
        """Check every value; raise :class:`ConfigError` for the first bad one. Returns ``self``."""
        validate_dataclass(self)
        for addr in self.namesrv_addrs:
            try:
                parse_address(addr)
            except ValueError as exc:
                raise ConfigError(f"namesrv_addr = {self.namesrv_addr!r}: {exc}") from None
        if self.instance_name and ("@" in self.instance_name or self.instance_name != self.instance_name.strip()):
            raise ConfigError(f"instance_name = {self.instance_name!r}: must not contain '@' or surrounding spaces")
        if "@" in self.client_ip:
            raise ConfigError(f"client_ip = {self.client_ip!r}: must not contain '@'")
        if bool(self.access_key) != bool(self.secret_key):
            raise ConfigError("access_key and secret_key: set both (ACL signing) or neither")
        if (self.tls_ca_file or self.tls_cert_file or self.tls_key_file) and not self.tls_enable:
            raise ConfigError("tls_ca_file / tls_cert_file / tls_key_file are set but tls_enable is false")
        if self.tls_key_file and not self.tls_cert_file:
            raise ConfigError(f"tls_key_file = {self.tls_key_file!r}: needs tls_cert_file too")
        return self

    @property
    def credentials(self) -> tuple[str, str] | None:
        """``(access_key, secret_key)`` when ACL signing is configured."""
        return (self.access_key, self.secret_key) if self.access_key else None

    @property
    def namesrv_addrs(self) -> list[str]:
        """The name server addresses, in the order given."""
        return [a.strip() for a in self.namesrv_addr.split(";") if a.strip()]

    def client_settings(self) -> ClientConfig:
        """Just the :class:`ClientConfig` part of this (possibly producer/consumer) config."""
        names = {f.name for f in dataclasses.fields(ClientConfig)}
        return ClientConfig(**{n: getattr(self, n) for n in names})


@dataclass
class ProducerConfig(ClientConfig):
    """``DefaultMQProducer``'s settings."""

    producer_group: str = setting(DEFAULT_PRODUCER_GROUP, "producer group name")
    send_msg_timeout: int = setting(3_000, "timeout of one send: finding the route and every retry included",
                                    min=1, max=600_000)
    retry_times_when_send_failed: int = setting(2, "extra attempts (on another queue/broker) after a failed "
                                                "non-selected send", min=0, max=100)
    retry_another_broker_when_not_store_ok: bool = setting(False, "also retry when the broker stored the "
                                                           "message but reported a flush/slave timeout")
    max_message_size: int = setting(4 * _MIB, "largest message body accepted, bytes", min=1, max=16 * _MIB)
    default_topic_queue_nums: int = setting(4, "queues per broker of a topic created on first send",
                                            min=1, max=1024)
    create_topic_key: str = setting("TBW102", "the default topic whose route is used to auto-create topics")
    send_latency_fault_enable: bool = setting(False, "avoid a broker that failed or answered slowly for a time "
                                              "that grows with its latency (RocketMQ's sendLatencyFaultEnable: "
                                              "550 ms -> 30 s ... a failure -> 10 min; until its master re-registers)")

    def validate(self) -> ProducerConfig:
        """Check every value (the client ones and the producer group); raise ConfigError. Returns ``self``."""
        super().validate()
        try:
            check_group(self.producer_group)
        except InvalidNameError as exc:
            raise ConfigError(f"producer_group = {self.producer_group!r}: {exc}") from None
        return self


def default_consume_timestamp(now: _dt.datetime | None = None) -> str:
    """Half an hour ago in local time as ``yyyyMMddHHmmss`` (RocketMQ's default consumeTimestamp)."""
    t = (now or _dt.datetime.now()) - _dt.timedelta(minutes=30)
    return t.strftime(CONSUME_TIMESTAMP_FORMAT)


def parse_consume_timestamp(text: str) -> int:
    """``yyyyMMddHHmmss`` (local time) -> epoch milliseconds; ValueError when malformed."""
    if not isinstance(text, str) or len(text) != 14 or not text.isdigit():
        raise ValueError(f"consume_timestamp {text!r} must be yyyyMMddHHmmss (14 digits)")
    t = _dt.datetime.strptime(text, CONSUME_TIMESTAMP_FORMAT)
    return int(t.timestamp() * 1000)


@dataclass
class PushConsumerConfig(ClientConfig):
    """``DefaultMQPushConsumer``'s settings, its defaults and checkConfig ranges (ROCKETMQ_FACTS.md §5)."""

    consumer_group: str = setting("", "consumer group name (required)")
    message_model: str = setting("CLUSTERING", "CLUSTERING (share the queues) or BROADCASTING (everyone gets all)",
                                 choices=MESSAGE_MODELS)
    consume_from_where: str = setting("CONSUME_FROM_LAST_OFFSET", "where a group with no stored offset starts",
                                      choices=CONSUME_FROM_WHERE_VALUES)
    consume_timestamp: str = setting("", "CONSUME_FROM_TIMESTAMP start, yyyyMMddHHmmss local time; "
                                     "empty = half an hour before the consumer was configured")
    allocate_message_queue_strategy: str = setting("AVG", "allocation strategy name (see trimq-admin allocate)")
    consume_thread_min: int = setting(20, "minimum consume concurrency", min=1, max=1000)
    consume_thread_max: int = setting(20, "maximum consume concurrency", min=1, max=1000)
    adjust_thread_pool_nums_threshold: int = setting(100_000, "kept for RocketMQ compatibility (unused)",
                                                     min=1, max=_INT_MAX)
    consume_concurrently_max_span: int = setting(2000, "concurrent mode: stop pulling a queue while the "
                                                 "offset span of its cached messages exceeds this", min=1, max=65535)
    pull_threshold_for_queue: int = setting(1000, "stop pulling a queue while it caches more messages than this",
                                            min=1, max=65535)
    pull_threshold_size_for_queue: int = setting(100, "stop pulling a queue while it caches more MiB than this",
                                                 min=1, max=1024)
    pull_threshold_for_topic: int = setting(-1, "messages cached per topic, split over its queues (-1: off)",
                                            min=1, max=6553500, also=(-1,))
    pull_threshold_size_for_topic: int = setting(-1, "MiB cached per topic, split over its queues (-1: off)",
                                                 min=1, max=102400, also=(-1,))
    pull_interval: int = setting(0, "pause between two pulls of one queue", min=0, max=65535)
    consume_message_batch_max_size: int = setting(1, "messages handed to one listener call", min=1, max=1024)
    pull_batch_size: int = setting(32, "messages asked for per pull", min=1, max=1024)
    max_reconsume_times: int = setting(-1, "deliveries before dead-lettering; -1 = 16 (concurrently, and orderly "
                                       "with order_scope 'key'), unbounded (orderly, order_scope 'queue')",
                                       min=-1, max=_INT_MAX)
    suspend_current_queue_time_millis: int = setting(1000, "orderly: pause of a queue after a failed message",
                                                     min=0, max=_INT_MAX)
    consume_timeout: int = setting(15, "minutes a message may be in consumption before it is sent back",
                                   min=1, max=_INT_MAX)
    await_termination_millis_when_shutdown: int = setting(0, "how long shutdown waits for running consumption",
                                                          min=0, max=_INT_MAX)
    max_time_consume_continuously: int = setting(60_000, "orderly: one queue's consume loop yields after this",
                                                 min=1, max=_INT_MAX)
    # Pull constants RocketMQ hard-codes (DefaultMQPushConsumerImpl), exposed for tuning and tests.
    pull_time_delay_mills_when_exception: int = setting(3000, "retry delay after a failed pull", min=0, max=600_000)
    pull_time_delay_mills_when_flow_control: int = setting(50, "retry delay while flow control holds a queue",
                                                           min=0, max=600_000)
    pull_time_delay_mills_when_suspend: int = setting(1000, "retry delay while the consumer is paused "
                                                      "(resume() ends it at once)", min=0, max=600_000)
    broker_suspend_max_time_millis: int = setting(15_000, "how long the broker may hold a pull (long polling)",
                                                  min=0, max=600_000)
    consumer_timeout_millis_when_suspend: int = setting(30_000, "client timeout of a long-polling pull",
                                                        min=1, max=600_000)
    # Lock and idle constants (ProcessQueue / RebalancePushImpl system properties).
    lock_profile: str = setting("lease", "orderly: 'lease' (queue locks are leases the broker grants, renewed by a "
                                "task of their own every third of the lease and counted from when the renewal "
                                "was sent; a queue stops when its broker connection drops) or 'rocketmq' "
                                "(RocketMQ 4.9.3's clocks: rebalance_lock_interval, rebalance_lock_max_live_time)",
                                choices=("lease", "rocketmq"))
    rebalance_lock_interval: int = setting(20_000, "orderly, rocketmq profile: renew the broker locks of all queues "
                                           "this often", min=10, max=600_000)
    rebalance_lock_max_live_time: int = setting(30_000, "orderly: a queue lock not renewed for this long "
                                                "is treated as lost (lease profile: the broker's lease, if shorter, "
                                                "counted from the renewal's send time)", min=10, max=600_000)
    pull_max_idle_time: int = setting(120_000, "a queue not pulled for this long is dropped and re-created",
                                      min=10, max=86_400_000)
    unlock_delay_time_mills: int = setting(0, "orderly: delay before unlocking a removed queue that still "
                                           "caches messages; RocketMQ's 20000 holds the queue from its next "
                                           "owner for 20 s, while trimq's rebalance already holds the consume "
                                           "lock (nothing of the queue is being consumed), so 0 unlocks at once",
                                           min=0, max=600_000)
    local_offset_store_dir: str = setting("", "BROADCASTING: directory of the local offset files; empty = "
                                          "$TRIMQ_CLIENT_LOCAL_OFFSET_STORE_DIR or ~/.trimq_offsets")
    consume_lock_wait_millis: int = setting(1000, "orderly: how long a rebalance waits for a queue's "
                                            "consume lock before giving up removing it", min=0, max=600_000)
    order_scope: str = setting("queue", "orderly: 'queue' (RocketMQ: a queue's messages one batch at a time) or "
                               "'key' (a queue's keys in parallel, each key in queue order; the key is the "
                               "__SHARDINGKEY property, else KEYS: docs/EMBEDDING.md)", choices=ORDER_SCOPES)
    max_in_flight_keys: int = setting(64, "orderly, order_scope 'key': keys of this consumer in the listener at "
                                      "once, over all its queues (a plain-def listener is also held to "
                                      "consume_thread_max threads)", min=1, max=65535)

    def __post_init__(self) -> None:
        if not self.consume_timestamp:
            self.consume_timestamp = default_consume_timestamp()
        super().__post_init__()

    def validate(self) -> PushConsumerConfig:
        """Check every value against RocketMQ's checkConfig ranges; raise ConfigError. Returns ``self``."""
        super().validate()
        try:
            check_group(self.consumer_group)
        except InvalidNameError as exc:
            raise ConfigError(f"consumer_group = {self.consumer_group!r}: {exc}") from None
        if self.consumer_group == DEFAULT_CONSUMER_GROUP:
            raise ConfigError(f"consumer_group = {DEFAULT_CONSUMER_GROUP!r}: reserved; use your own group name")
        if self.consume_thread_min > self.consume_thread_max:
            raise ConfigError(
                f"consume_thread_min = {self.consume_thread_min}: must not exceed "
                f"consume_thread_max = {self.consume_thread_max}"
            )
        try:
            parse_consume_timestamp(self.consume_timestamp)
        except ValueError as exc:
            raise ConfigError(f"consume_timestamp = {self.consume_timestamp!r}: {exc}") from None
        if self.consumer_timeout_millis_when_suspend <= self.broker_suspend_max_time_millis:
            raise ConfigError(
                f"consumer_timeout_millis_when_suspend = {self.consumer_timeout_millis_when_suspend}: must be larger "
                f"than broker_suspend_max_time_millis = {self.broker_suspend_max_time_millis}"
            )
        from trimq.client.rebalance.strategies import STRATEGY_NAMES, get_strategy

        try:
            get_strategy(self.allocate_message_queue_strategy)
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"allocate_message_queue_strategy = {self.allocate_message_queue_strategy!r}: {exc} "
                f"(strategies needing parameters are passed as objects; names: {', '.join(STRATEGY_NAMES)})"
            ) from None
        return self

    @property
    def consume_timestamp_ms(self) -> int:
        """``consume_timestamp`` as epoch milliseconds."""
        return parse_consume_timestamp(self.consume_timestamp)

    @property
    def clustering(self) -> bool:
        """True for CLUSTERING (the group shares the queues), False for BROADCASTING."""
        return self.message_model == "CLUSTERING"


def load_client_settings(
    cls: type[Any],
    *,
    config_file: str | None = None,
    env_prefix: str | None = None,
    overrides: dict[str, Any] | None = None,
    section: str | None = None,
) -> Any:
    """Build a client config from defaults < TOML file (optionally one ``[section]``) < ``TRIMQ_CLIENT_*``
    environment < ``overrides`` (command-line flags; None values are ignored), validated; the same rules as
    the daemons' (runtime.settings.build_settings)."""
    data = None
    if config_file:
        try:
            with open(config_file, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"config file {config_file}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file} is not valid TOML: {exc}") from None
    return build_settings(cls, file_data=data, file_name=config_file or "", environ=os.environ,
                          env_prefix=env_prefix, overrides=overrides, section=section)
