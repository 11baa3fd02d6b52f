"""``trimq-admin``: administer topics, consumer groups, dead letters and the cluster."""

from __future__ import annotations

import click

from client.admin_allocate import allocate_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Administer a trimq cluster."""


main.add_command(allocate_command)
