"""Broker configuration: every setting with its default, its allowed range and what it means.

Sources, weakest first: defaults, a TOML file (``--config``), ``TRIMQ_BROKER_*`` environment variables, flags.
An invalid value raises ConfigError naming the setting, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trimq.protocol.address import parse_address
from trimq.protocol.frame import DEFAULT_MAX_FRAME_BYTES
from trimq.runtime.settings import ConfigError, setting, validate_dataclass


@dataclass
class BrokerConfig:
    """Settings of one broker process (names follow RocketMQ's BrokerConfig/MessageStoreConfig in snake_case)."""

    #: Environment variables: ``TRIMQ_BROKER_`` + the setting's name in capitals. The unprefixed ``TRIMQ_<NAME>``
    #: of earlier versions is refused: several of those names also meant client settings (docs/CONFIGURATION.md).
    ENV_PREFIX: ClassVar[str] = "TRIMQ_BROKER_"
    RETIRED_ENV_PREFIX: ClassVar[str] = "TRIMQ_"

    listen: str = setting("127.0.0.1:10911", "HOST:PORT to listen on; port 0 picks a free port")
    store_dir: str = setting("./store", "store directory (commitlog/, consumequeue/, config/)")
    broker_name: str = setting("broker-a", "broker name; distinct per broker of a cluster")
    cluster_name: str = setting("DefaultCluster", "cluster the broker registers under")
    namesrv_addr: str = setting("", "name server HOST:PORT list separated by ';' (empty: none)")
    embedded_namesrv: bool = setting(False, "serve the name server on the broker's own port")
    flush_disk_type: str = setting("ASYNC_FLUSH", "ASYNC_FLUSH or SYNC_FLUSH", choices=("ASYNC_FLUSH", "SYNC_FLUSH"))
    flush_interval_ms: int = setting(500, "ASYNC_FLUSH: fsync at least this often", min=1, max=60_000)
    mapped_file_size_commit_log: int = setting(1024 * 1024 * 1024, "commit-log segment size in bytes",
                                               min=4096, max=2**31 - 1)
    mapped_file_size_consume_queue: int = setting(300_000 * 20, "consume-queue file size in bytes (multiple of 20)",
                                                  min=20 * 16, max=2**31 - 1)
    max_message_size: int = setting(4 * 1024 * 1024, "largest message record accepted, bytes", min=1024,
                                    max=64 * 1024 * 1024)
    max_frame_bytes: int = setting(DEFAULT_MAX_FRAME_BYTES, "largest frame accepted, bytes", min=1024, max=2**31 - 1)
    max_connections: int = setting(10_000, "concurrent client connections", min=1, max=1_000_000)
    # -- flow control (issue 10, docs/PROTOCOL.md §2 "Flow control"): what a peer that does not read costs
    max_inflight_requests: int = setting(1024, "requests of one connection handled at once (then it is not read)",
                                         min=1, max=65_536)
    max_pending_write_bytes: int = setting(32 * 1024 * 1024, "unsent response bytes per connection before "
                                           "answers wait (or become SYSTEM_BUSY)", min=64 * 1024, max=2**31 - 1)
    max_total_pending_write_bytes: int = setting(256 * 1024 * 1024, "unsent answer bytes of all connections "
                                                 "(every frame counts) before peers that are behind are paused: "
                                                 "their large answers become SYSTEM_BUSY, the others wait",
                                                 min=64 * 1024, max=2**40)
    busy_body_bytes: int = setting(16 * 1024, "a response body larger than this is answered SYSTEM_BUSY rather "
                                   "than held while its peer is behind; smaller ones wait", min=0, max=2**31 - 1)
    max_write_stall_ms: int = setting(30_000, "a connection whose answers make no write progress this long (the peer "
                                      "does not read; it is paused meanwhile) is closed; 0 = never",
                                      min=0, max=3_600_000)
    server_channel_max_idle_time_seconds: int = setting(120, "close a connection on which no frame arrived for this "
                                                        "long (RocketMQ's serverChannelMaxIdleTimeSeconds; clients "
                                                        "heartbeat every 30 s); 0 = never", min=0, max=86_400)
    auto_create_topic_enable: bool = setting(True, "create a topic on first send")
    default_topic_queue_nums: int = setting(4, "queues of an auto-created topic", min=1, max=1024)
    long_polling_enable: bool = setting(True, "hold pulls on an empty queue until a message arrives")
    suspend_timeout_ms: int = setting(15_000, "longest a pull is held when the client asks for no more",
                                      min=0, max=300_000)
    register_broker_interval_ms: int = setting(30_000, "re-register with the name server this often",
                                               min=1_000, max=600_000)
    shutdown_grace_ms: int = setting(5_000, "on SIGTERM, how long in-flight requests may finish", min=0, max=600_000)
    metrics_port: int = setting(-1, "Prometheus metrics HTTP port; 0 = any free port (logged as metrics.started), "
                                "-1 = off", min=0, max=65535, also=(-1,))
    metrics_host: str = setting("127.0.0.1", "address the metrics endpoint binds")
    # -- storage, send/pull, name server registration (issue 3)
    broker_ip: str = setting("", "address written into records (store host) and registered with name servers; "
                                 "empty: the listen host, or 127.0.0.1 when listening on all interfaces")
    sync_flush_timeout_ms: int = setting(5_000, "SYNC_FLUSH: answer FLUSH_DISK_TIMEOUT after waiting this long",
                                         min=10, max=600_000)
    max_transfer_count_on_message_in_memory: int = setting(32, "most messages one pull returns", min=1, max=1024)
    max_transfer_bytes_on_message_in_memory: int = setting(256 * 1024, "most record bytes one pull returns "
                                                           "(the first message always goes)", min=1024,
                                                           max=64 * 1024 * 1024)
    short_polling_time_ms: int = setting(1_000, "hold time of a suspended pull when long polling is off",
                                         min=0, max=60_000)
    # -- reclaim: expired files and a full disk (issue 20; RocketMQ's MessageStoreConfig, docs/STORAGE.md §9)
    file_reserved_time: int = setting(72, "hours a commit-log segment is kept after its last write (RocketMQ's "
                                          "fileReservedTime)", min=0, max=87_600)
    delete_when: str = setting("04", "hour(s) of the day (local time, ';'-separated, e.g. \"04;16\") at which "
                                     "expired segments are deleted (RocketMQ's deleteWhen)")
    disk_max_used_space_ratio: int = setting(75, "percent of the store's disk in use above which expired segments "
                                                 "are deleted at any hour (RocketMQ's diskMaxUsedSpaceRatio)",
                                             min=10, max=95)
    disk_space_clean_forcibly_ratio: int = setting(85, "percent of the disk in use above which segments are deleted "
                                                       "whatever their age, oldest first (RocketMQ's system property "
                                                       "rocketmq.broker.diskSpaceCleanForciblyRatio)", min=1, max=100)
    disk_space_warning_level_ratio: int = setting(90, "percent of the disk in use above which sends are refused with "
                                                      "SERVICE_NOT_AVAILABLE (RocketMQ's system property "
                                                      "rocketmq.broker.diskSpaceWarningLevelRatio)", min=1, max=100)
    clean_file_forcibly_enable: bool = setting(True, "above disk_space_clean_forcibly_ratio, delete segments that "
                                                     "have not expired yet (RocketMQ's cleanFileForciblyEnable)")
    clean_resource_interval_ms: int = setting(10_000, "how often expired files are looked for (first one minute "
                                                      "after start; RocketMQ's cleanResourceInterval)",
                                              min=100, max=3_600_000)
    delete_commit_log_files_interval_ms: int = setting(100, "pause between two segment deletions of one pass "
                                                            "(RocketMQ's deleteCommitLogFilesInterval)",
                                                       min=0, max=60_000)
    delete_consume_queue_files_interval_ms: int = setting(100, "pause after each queue whose files were deleted "
                                                               "(RocketMQ's deleteConsumeQueueFilesInterval)",
                                                          min=0, max=60_000)
    destroy_mapedfile_interval_forcibly_ms: int = setting(120_000, "a deleted file still in use by a flush is "
                                                                   "closed anyway after this long (RocketMQ's "
                                                                   "destroyMapedFileIntervalForcibly)",
                                                          min=0, max=3_600_000)
    # -- message index and lookups by key (issue 19; RocketMQ's MessageStoreConfig, docs/STORAGE.md §10)
    message_index_enable: bool = setting(True, "index messages by KEYS and UNIQ_KEY in STORE/index/ for QUERY_MESSAGE "
                                               "(RocketMQ's messageIndexEnable)")
    max_hash_slot_num: int = setting(5_000_000, "hash slots of an index file (RocketMQ's maxHashSlotNum); a file is "
                                                "40 + 4 x slots + 20 x entries bytes, created sparse",
                                     min=1, max=100_000_000)
    max_index_num: int = setting(20_000_000, "entries of an index file, then the next one starts (RocketMQ's "
                                             "maxIndexNum)", min=2, max=400_000_000)
    max_msgs_num_batch: int = setting(64, "most messages one QUERY_MESSAGE answers (RocketMQ's maxMsgsNumBatch)",
                                      min=1, max=10_000)
    default_query_max_num: int = setting(32, "messages a QUERY_MESSAGE by unique key looks for (RocketMQ's "
                                             "defaultQueryMaxNum)", min=1, max=10_000)
    # -- coordination: consumer groups, queue locks, consumer offsets (issue 4)
    flush_consumer_offset_interval_ms: int = setting(5_000, "persist config/consumerOffset.json this often",
                                                     min=10, max=600_000)
    channel_expired_timeout_ms: int = setting(120_000, "a client silent this long (no heartbeat) leaves its groups",
                                              min=1_000, max=3_600_000)
    client_housekeeping_interval_ms: int = setting(10_000, "how often silent clients are looked for",
                                                   min=100, max=600_000)
    # -- requests the broker forwards to a group's members for trimq-admin (broker/processors/admin_forward.py)
    admin_running_info_timeout_ms: int = setting(5_000, "GET_CONSUMER_RUNNING_INFO forwarded to a member "
                                                 "(consumer status): how long it may take to answer (RocketMQ: "
                                                 "5 s)", min=100, max=600_000)
    admin_skip_message_timeout_ms: int = setting(15_000, "SKIP_MESSAGE forwarded to a member (consumer skip): how "
                                                 "long it may take (it waits up to 5 s for the queue's batch, "
                                                 "then sends the message back)", min=100, max=600_000)
    admin_reset_offset_timeout_ms: int = setting(10_000, "an online offset reset: how long each member may take to "
                                                 "apply RESET_CONSUMER_CLIENT_OFFSET", min=100, max=600_000)
    # -- queue-lock leases (issue 14, docs/PROTOCOL.md "Queue-lock leases", docs/OPERATIONS.md "Leases")
    lock_profile: str = setting("lease", "'lease': queue locks are leases of lease_ms, taken over after lease_ms "
                                "+ lease_drift_percent + lease_margin_ms, released lock_disconnect_grace_ms after a "
                                "holder's connection closes, orderly members leave with their lease, a restart "
                                "waits out earlier leases; 'rocketmq': RocketMQ 4.9.3's clocks "
                                "(rebalance_lock_max_live_time_ms, no margin, no release on disconnect)",
                                choices=("lease", "rocketmq"))
    lease_ms: int = setting(2_000, "lease profile: a queue lock's lease, counted by its holder from when it sent "
                            "the renewal (clients renew every third of it)", min=100, max=600_000)
    lease_drift_percent: int = setting(10, "lease profile: clock-rate drift allowed between a client's clock and "
                                       "the broker's, in percent of lease_ms, added before a lock may be taken over",
                                       min=0, max=100)
    lease_margin_ms: int = setting(200, "lease profile: fixed time added before an unrenewed lock may be taken over "
                                   "(the holder's scheduling delay between its deadline check and a batch's start)",
                                   min=0, max=60_000)
    lock_disconnect_grace_ms: int = setting(300, "lease profile: once a client's connection closes, its queue locks "
                                            "and orderly memberships go this long after, unless it renews over a new "
                                            "connection first (was orphaned_lock_max_live_time_ms)",
                                            min=0, max=10_000)
    rebalance_lock_max_live_time_ms: int = setting(60_000, "rocketmq lock profile: a queue lock not renewed this "
                                                   "long may be taken over", min=1_000, max=3_600_000)
    notify_consumer_ids_changed_enable: bool = setting(True, "push NOTIFY_CONSUMER_IDS_CHANGED on group changes")
    notify_consumer_ids_changed_delay_ms: int = setting(100, "coalescing window for NOTIFY_CONSUMER_IDS_CHANGED",
                                                        min=0, max=10_000)
    # -- retries, delay levels, dead letters (issue 5)
    message_delay_level: str = setting("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
                                       "delay of each delay level, level 1 first (units ms, s, m, h, d)")
    flush_delay_offset_interval_ms: int = setting(10_000, "persist config/delayOffset.json at least this often",
                                                  min=10, max=600_000)
    auto_create_subscription_group: bool = setting(True, "create an unknown consumer group's config with defaults")
    broker_permission: int = setting(6, "RocketMQ PermName bits: 4 read, 2 write (6 = both)", min=0, max=7)
    # -- security (issue 10): TLS and ACL, docs/SECURITY.md
    tls_cert_file: str = setting("", "PEM certificate the broker presents; set = clients must use TLS")
    tls_key_file: str = setting("", "PEM private key of tls_cert_file (empty: the key is in that file)")
    tls_ca_file: str = setting("", "PEM CA bundle verifying client certificates (mutual TLS)")
    tls_require_client_cert: bool = setting(False, "mutual TLS: refuse clients without a certificate from tls_ca_file")
    namesrv_tls: bool = setting(False, "register with the name servers over TLS, verifying them with tls_ca_file "
                                       "(or the system CAs); presents tls_cert_file when set (mutual TLS)")
    acl_file: str = setting("", "ACL TOML file; requests must be signed by one of its accounts (empty: ACL off)")
    # -- high availability: master/slave replication (issue 15; docs/OPERATIONS.md "High availability")
    broker_role: str = setting("ASYNC_MASTER", "ASYNC_MASTER (sends answered once stored), SYNC_MASTER (answered "
                               "once a slave has them too) or SLAVE (follows its master, refuses sends; RocketMQ's "
                               "brokerRole); a promotion or demotion recorded in STORE/config/haState.json wins",
                               choices=("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"))
    broker_id: int = setting(0, "0 for a master, > 0 for a slave of the same broker_name (RocketMQ's brokerId)",
                             min=0, max=1024)
    ha_listen_port: int = setting(-1, "port of the replication stream (RocketMQ's haListenPort); -1: the listen "
                                  "port + 1, or any free port when that is 0", min=0, max=65535, also=(-1,))
    ha_master_address: str = setting("", "SLAVE: HOST:PORT of the master's HA port (RocketMQ's haMasterAddress); "
                                     "empty: learned from the name server")
    ha_confirm_master_at_start: bool = setting(
        True, "a master that restarts with name servers configured refuses sends until a registration round is "
        "answered with none of them naming a newer master (its slave may have been promoted while it was down; sends "
        "it took before being told would be cut when it follows that master); false: take sends at once, as RocketMQ")
    ha_send_heartbeat_interval: int = setting(5_000, "ms between a slave's offset reports when idle, and between "
                                              "the master's empty frames (RocketMQ's haSendHeartbeatInterval)",
                                              min=10, max=600_000)
    ha_housekeeping_interval: int = setting(20_000, "ms without a byte from the peer after which a replication "
                                            "connection is closed (RocketMQ's haHousekeepingInterval)",
                                            min=100, max=3_600_000)
    ha_transfer_batch_size: int = setting(32 * 1024, "most commit-log bytes in one replication frame (RocketMQ's "
                                          "haTransferBatchSize)", min=1024, max=16 * 1024 * 1024)
    ha_slave_fallbehind_max: int = setting(256 * 1024 * 1024, "SYNC_MASTER: a slave more bytes behind than this "
                                           "is not waited for: sends get SLAVE_NOT_AVAILABLE (RocketMQ's "
                                           "haSlaveFallbehindMax)", min=0, max=2**62)
    slave_timeout: int = setting(3_000, "SYNC_MASTER: ms a send waits for a slave before FLUSH_SLAVE_TIMEOUT "
                                 "(RocketMQ's slaveTimeout)", min=1, max=600_000)
    slave_synchronize_interval_ms: int = setting(10_000, "SLAVE: how often topics, subscription groups, consumer "
                                                 "offsets and delay offsets are fetched from the master (first after "
                                                 "3 s; RocketMQ: 10 s)", min=100, max=3_600_000)
    slave_offset_sync_interval_ms: int = setting(1_000, "SLAVE: how often consumer offsets alone are merged with "
                                                 "the master's (both ways) between the full syncs: a promoted slave's "
                                                 "offsets then trail the dead master's by about this much, not by up "
                                                 "to a full interval; 0: only with the full sync (RocketMQ)",
                                                 min=100, max=3_600_000, also=(0,))

    def validate(self) -> BrokerConfig:
        """Check every value against its range; raise ConfigError for the first bad one."""
        validate_dataclass(self)
        try:
            parse_address(self.listen)
        except ValueError as exc:
            raise ConfigError(f"listen = {self.listen!r}: {exc}") from None
        for addr in filter(None, self.namesrv_addr.split(";")):
            try:
                parse_address(addr)
            except ValueError as exc:
                raise ConfigError(f"namesrv_addr = {self.namesrv_addr!r}: {exc}") from None
        try:
            from trimq.broker.store.delay_levels import DelayLevelTable

            DelayLevelTable.parse(self.message_delay_level)
        except ValueError as exc:
            raise ConfigError(f"message_delay_level = {self.message_delay_level!r}: {exc}") from None
        for hour in self.delete_when.split(";"):
            if not (hour.strip().isdigit() and 0 <= int(hour) <= 23):
                raise ConfigError(f"delete_when = {self.delete_when!r}: hours 0-23 separated by ';' (e.g. \"04\")")
        if self.mapped_file_size_consume_queue % 20:
            raise ConfigError(
                f"mapped_file_size_consume_queue = {self.mapped_file_size_consume_queue}: must be a multiple of 20"
            )
        if self.tls_key_file and not self.tls_cert_file:
            raise ConfigError(f"tls_key_file = {self.tls_key_file!r}: needs tls_cert_file too")
        if self.broker_role == "SLAVE" and self.broker_id == 0:
            raise ConfigError("broker_id = 0 with broker_role = SLAVE: a slave's broker_id must be > 0 (0 is the "
                              "master's)")
        if self.broker_role != "SLAVE" and self.broker_id != 0:
            raise ConfigError(f"broker_id = {self.broker_id} with broker_role = {self.broker_role}: a master's "
                              "broker_id is 0")
        if self.ha_master_address:
            try:
                parse_address(self.ha_master_address)
            except ValueError as exc:
                raise ConfigError(f"ha_master_address = {self.ha_master_address!r}: {exc}") from None
        if self.tls_require_client_cert and not (self.tls_cert_file and self.tls_ca_file):
            raise ConfigError("tls_require_client_cert = true: needs tls_cert_file and tls_ca_file")
        return self

    @property
    def lock_lease_ms(self) -> int:
        """The lease a queue lock is granted for (the rocketmq profile: rebalance_lock_max_live_time_ms)."""
        return self.lease_ms if self.lock_profile == "lease" else self.rebalance_lock_max_live_time_ms

    @property
    def lock_takeover_margin_ms(self) -> int:
        """What is added to the lease before another client may take an unrenewed lock over (rocketmq: 0)."""
        if self.lock_profile != "lease":
            return 0
        return self.lease_ms * self.lease_drift_percent // 100 + self.lease_margin_ms

    @property
    def lock_disconnect_grace(self) -> int:
        """How long a closed connection's locks and orderly memberships outlive it; 0: the rocketmq profile
        (memberships go at once, locks stay until they expire)."""
        return self.lock_disconnect_grace_ms if self.lock_profile == "lease" else 0

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type == "SYNC_FLUSH"

    @property
    def ha_port(self) -> int:
        """The HA port to bind: ``ha_listen_port``, or the listen port + 1 (0, any free port, when that is 0)."""
        if self.ha_listen_port >= 0:
            return self.ha_listen_port
        port = parse_address(self.listen)[1]
        return port + 1 if 0 < port < 65535 else 0

    @property
    def namesrv_addrs(self) -> list[str]:
        return [a for a in self.namesrv_addr.split(";") if a]
