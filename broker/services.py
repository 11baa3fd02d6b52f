"""Which services make up a broker, in start order. Each issue's services are added here."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.broker import Broker


def build_services(broker: Broker) -> None:
    """Create the broker's services (they register their handlers) and append them to ``broker.services``."""
    from broker.processors.basic import BasicService

    broker.services.append(BasicService(broker))
