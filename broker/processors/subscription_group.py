"""Subscription-group admin requests: UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200) and
GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), over the table in broker/store/subscription_groups.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trimq.broker.deps import HandlerRegistry, SubscriptionGroups
from trimq.broker.services import HandlerService
from trimq.broker.store.subscription_groups import SubscriptionGroupConfig
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError

if TYPE_CHECKING:
    from trimq.runtime.server import Connection

__all__ = ["SubscriptionGroupService"]


class SubscriptionGroupService(HandlerService):
    """Creates, replaces and lists consumer-group configs; an update is answered once it is on disk."""

    name = "subscription_group"

    def __init__(self, *, registry: HandlerRegistry, groups: SubscriptionGroups) -> None:
        self.groups = groups
        registry.register(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, self.update_and_create)
        registry.register(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self.get_all)

    async def update_and_create(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """200: the config in the body (or, from RocketMQ-style clients, the header fields)."""
        body = cmd.body if cmd.body is not None else cmd.ext
        try:
            cfg = SubscriptionGroupConfig.from_wire(body)
        except (ValueError, TypeError) as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad subscription group config: {exc}") from None
        self.groups.update_and_create(cfg)
        await self.groups.persist()
        return RemotingCommand.response_to(cmd)

    async def get_all(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """201: the whole table, as the file holds it."""
        return RemotingCommand.response_to(cmd, body=self.groups.encode())
