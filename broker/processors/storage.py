"""The storage part of a broker (issue 3), in start order: the store, topic configs, send, pull, topic
admin, the embedded name server (``--embedded-namesrv``) and registration with name servers."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trimq.broker.broker import Broker


def add_storage_services(broker: Broker) -> None:
    """Create the storage services, set ``components["store"]`` and ``["topic_config_manager"]``."""
    from trimq.broker.namesrv.service import NamesrvService
    from trimq.broker.processors.admin_topic import AdminTopicService
    from trimq.broker.processors.pull import PullService
    from trimq.broker.processors.register import RegisterService, advertised_host
    from trimq.broker.processors.send import SendService
    from trimq.broker.store.message_store import MessageStore, StoreConfig
    from trimq.broker.store.topics import TopicConfigManager

    cfg = broker.config
    store = MessageStore(
        StoreConfig(
            store_dir=cfg.store_dir,
            segment_size=cfg.mapped_file_size_commit_log,
            consume_queue_file_size=cfg.mapped_file_size_consume_queue,
            flush_disk_type=cfg.flush_disk_type,
            flush_interval_ms=cfg.flush_interval_ms,
            sync_flush_timeout_ms=cfg.sync_flush_timeout_ms,
            max_message_size=cfg.max_message_size,
            max_transfer_count=cfg.max_transfer_count_on_message_in_memory,
            max_transfer_bytes=cfg.max_transfer_bytes_on_message_in_memory,
        ),
        store_host=lambda: advertised_host(broker),
    )
    broker.components["store"] = store
    topics = TopicConfigManager(cfg.store_dir, default_queue_nums=cfg.default_topic_queue_nums,
                                auto_create=cfg.auto_create_topic_enable, store=store)
    broker.components["topic_config_manager"] = topics
    broker.services.append(store)
    broker.services.append(topics)
    broker.services.append(SendService(broker))
    broker.services.append(PullService(broker))
    broker.services.append(AdminTopicService(broker))
    if cfg.embedded_namesrv:
        broker.services.append(NamesrvService(broker))
    broker.services.append(RegisterService(broker))
