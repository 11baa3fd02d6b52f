"""``trimq-namesrv``: run a standalone name server."""

from __future__ import annotations

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Run a trimq name server (not yet: arrives with the storage issue)."""
    click.echo("trimq-namesrv: not yet implemented")
