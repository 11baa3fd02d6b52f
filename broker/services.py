"""Which services make up a broker, in start order. Each issue's services are added here."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.broker import Broker


def build_services(broker: Broker) -> None:
    """Create the broker's services (they register their handlers) and append them to ``broker.services``."""
    from broker.processors.basic import BasicService

    broker.services.append(BasicService(broker))

    # Coordination (issue 4): consumer groups, queue locks, consumer offsets. After the store/topic services.
    from broker.processors.consumer import CoordinationService

    broker.services.append(CoordinationService(broker))
