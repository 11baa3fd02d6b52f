"""``trimq-producer`` and ``trimq-consumer`` command-line tools."""

from __future__ import annotations

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def producer_main() -> None:
    """Send messages to a topic (not yet: arrives with the push-consumer issue)."""
    click.echo("trimq-producer: not yet implemented")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def consumer_main() -> None:
    """Consume a topic in a consumer group (not yet: arrives with the push-consumer issue)."""
    click.echo("trimq-consumer: not yet implemented")
