"""``trimq-admin allocate``: simulate an allocation strategy and count the queues a membership change moves.

Pure simulation (no broker needed), built on :func:`trimq.client.rebalance.strategies.simulate`::

    trimq-admin allocate --strategy AVG --queues 8 --consumers 3 --join 1
    trimq-admin allocate --strategy CONSISTENT_HASH_BOUNDED --queues 64 --consumers 10 --leave 2 --json
"""

from __future__ import annotations

import json
from typing import Any

import click

from trimq.client.rebalance.strategies import STRATEGY_NAMES, simulate
from trimq.protocol.message_queue import MessageQueue

__all__ = ["allocate_command"]


def _queue_label(mq: MessageQueue, multi_broker: bool) -> str:
    return f"{mq.broker_name}:{mq.queue_id}" if multi_broker else str(mq.queue_id)


def _render_table(title: str, assignment: dict[str, list[MessageQueue]], multi_broker: bool) -> list[str]:
    lines = [title]
    width = max((len(c) for c in assignment), default=8)
    for cid, queues in assignment.items():
        labels = ", ".join(_queue_label(q, multi_broker) for q in queues) or "-"
        lines.append(f"  {cid:<{width}}  {len(queues):>4}  {labels}")
    return lines


def _to_json(result: dict[str, Any]) -> dict[str, Any]:
    def side(assignment: dict[str, list[MessageQueue]]) -> dict[str, list[dict[str, Any]]]:
        return {cid: [mq.to_wire() for mq in qs] for cid, qs in assignment.items()}

    return {
        "strategy": result["strategy"],
        "queues": len(result["queues"]),
        "consumers_before": result["consumers_before"],
        "consumers_after": result["consumers_after"],
        "before": side(result["before"]),
        "after": side(result["after"]),
        "moved": result["moved"],
        "unassigned_before": result["unassigned_before"],
        "unassigned_after": result["unassigned_after"],
        "max_load_before": result["max_load_before"],
        "max_load_after": result["max_load_after"],
    }


@click.command(name="allocate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--strategy", "strategy", required=True, metavar="NAME",
              help=f"allocation strategy: {', '.join(n for n in STRATEGY_NAMES if n not in ('CONFIG', 'MACHINE_ROOM'))}"
                   " (MACHINE_ROOM_NEARBY-<inner> needs rooms and is not simulated)")
@click.option("--queues", type=click.IntRange(min=1), required=True, help="queues per broker")
@click.option("--consumers", type=click.IntRange(min=1), required=True, help="members before the change")
@click.option("--join", type=click.IntRange(min=0), default=0, show_default=True, help="members joining")
@click.option("--leave", type=click.IntRange(min=0), default=0, show_default=True,
              help="members leaving (the oldest ones)")
@click.option("--brokers", default="broker-a", show_default=True, help="comma-separated broker names")
@click.option("--topic", default="TopicTest", show_default=True)
@click.option("--epsilon", type=float, default=None, help="CONSISTENT_HASH_BOUNDED: load bound factor (default 0.25)")
@click.option("--virtual-nodes", "virtual_nodes", type=click.IntRange(min=0), default=None,
              help="CONSISTENT_HASH(_BOUNDED): virtual nodes per member")
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
def allocate_command(
    strategy: str,
    queues: int,
    consumers: int,
    join: int,
    leave: int,
    brokers: str,
    topic: str,
    epsilon: float | None,
    virtual_nodes: int | None,
    as_json: bool,
) -> None:
    """Show each consumer's queues before and after members join or leave, and how many queues moved."""
    params: dict[str, Any] = {}
    if epsilon is not None:
        params["epsilon"] = epsilon
    if virtual_nodes is not None:
        params["virtual_node_count"] = virtual_nodes
    broker_list = tuple(b.strip() for b in brokers.split(",") if b.strip())
    if not broker_list:
        raise click.BadParameter("name at least one broker", param_hint="--brokers")
    try:
        result = simulate(strategy, queues, consumers, join, leave, topic=topic, brokers=broker_list, **params)
    except (ValueError, TypeError) as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(_to_json(result), indent=2))
        return
    multi = len(broker_list) > 1
    total = len(result["queues"])
    lines = [f"strategy {result['strategy']}: {total} queues, {consumers} consumers"
             + (f", +{join} joining" if join else "") + (f", -{leave} leaving" if leave else "")]
    lines += _render_table("before:", result["before"], multi)
    if join or leave:
        lines += _render_table("after:", result["after"], multi)
    lines.append(f"moved: {result['moved']} of {total} queues")
    if result["unassigned_before"] or result["unassigned_after"]:
        lines.append(f"unassigned: {result['unassigned_before']} before, {result['unassigned_after']} after")
    lines.append(f"max load: {result['max_load_before']} before, {result['max_load_after']} after")
    click.echo("\n".join(lines))
