"""Which services make up a broker, in start order. Each issue's services are added here."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trimq.broker.broker import Broker


def build_services(broker: Broker) -> None:
    """Create the broker's services (they register their handlers) and append them to ``trimq.broker.services``."""
    from trimq.broker.processors.basic import BasicService

    broker.services.append(BasicService(broker))

    # Storage (issue 3): store, topics, send, pull, topic admin, name server, registration. Before the rest.
    from trimq.broker.processors.storage import add_storage_services

    add_storage_services(broker)

    # Coordination (issue 4): consumer groups, queue locks, consumer offsets. After the store/topic services.
    from trimq.broker.processors.consumer import CoordinationService

    broker.services.append(CoordinationService(broker))

    # Retries, delay levels, dead letters (issue 5): subscription groups, the schedule service (wires the
    # store's put hook / tags-code rule / arrivals, so it must exist before the store starts), send-back + DLQ.
    from trimq.broker.processors.retry import RetryService
    from trimq.broker.store.schedule import ScheduleMessageService
    from trimq.broker.store.subscription_groups import SubscriptionGroupManager

    broker.services.append(SubscriptionGroupManager(broker))
    broker.services.append(ScheduleMessageService(broker))
    broker.services.append(RetryService(broker))

    # Operations (issue 8): admin requests answered through the consumers (running info, skip, offset reset
    # by time) and topic stats. After coordination: it uses the consumer, lock and offset managers.
    from trimq.broker.processors.admin_forward import AdminForwardService

    broker.services.append(AdminForwardService(broker))
