"""README.md's commands work as written (issue 19 item 5).

* every ``trimq-*`` command in a README code block parses with the real click command (options, subcommands,
  choices), without running it;
* every ``--namesrv HOST:PORT`` a README command uses is the address every README way of starting the
  daemons serves a name server on: ``trimq-namesrv`` (its ``--listen`` or its ``--config`` file's
  ``[namesrv]`` table) or ``trimq-broker --embedded-namesrv`` (which serves it on the broker's own port: its
  ``--listen`` or the broker's default). The quick try once started ``trimq-broker --embedded-namesrv`` on
  10911 while every later command said 9876;
* ``make demo`` installs only what the demo needs (the package without extras, a stamp of its own).

The commands were also run by hand in a scratch directory; tests/e2e runs the same tools for real.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest

from trimq.broker.config import BrokerConfig
from trimq.namesrv.config import NamesrvConfig
from trimq.runtime.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_commands() -> list[list[str]]:
    """The ``trimq-*`` command lines of README.md's code blocks (continuations joined, comments cut)."""
    text = README.read_text()
    commands = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            if line.startswith("trimq-"):
                commands.append(shlex.split(line, comments=True))
    return commands


def _commands() -> dict[str, click.Command]:
    from trimq.tools import admin, broker, consumer, namesrv, producer

    return {"trimq-namesrv": namesrv.main, "trimq-broker": broker.main, "trimq-producer": producer.main,
            "trimq-consumer": consumer.main, "trimq-admin": admin.main}


def parse(argv: list[str]) -> dict[str, Any]:
    """Parse ``argv`` with the tool's click command (subcommands too); the merged parameters."""
    command = _commands()[argv[0]]
    params: dict[str, Any] = {}
    args = argv[1:]
    name = argv[0]
    while True:
        ctx = command.make_context(name, list(args))
        params.update({k: v for k, v in ctx.params.items() if v is not None})
        if not isinstance(command, click.Group):
            return params
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        assert rest, f"{' '.join(argv)}: no subcommand"
        sub_name, sub, args = command.resolve_command(ctx, rest)
        assert sub is not None and sub_name is not None
        command, name = sub, f"{name} {sub_name}"


def test_readme_has_the_quick_try() -> None:
    tools = {c[0] for c in readme_commands()}
    assert {"trimq-broker", "trimq-namesrv", "trimq-producer", "trimq-consumer", "trimq-admin"} <= tools


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_readme_command_parses(argv: list[str]) -> None:
    parse(argv)


def namesrv_addresses() -> set[str]:
    served = set()
    for argv in readme_commands():
        if argv[0] == "trimq-namesrv":
            p = parse(argv)
            if "listen" in p:
                served.add(p["listen"])
            else:
                cfg = load_settings(NamesrvConfig, config_file=str(ROOT / p["config_file"]), section="namesrv")
                served.add(cfg.listen)
        elif argv[0] == "trimq-broker" and parse(argv).get("embedded_namesrv"):
            p = parse(argv)
            served.add(p.get("listen") or BrokerConfig().listen)
    return served


def test_every_namesrv_address_is_served_by_a_readme_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("TRIMQ_"):
            monkeypatch.delenv(k)
    served = namesrv_addresses()
    assert served, "README starts no name server"
    used = {parse(a)["namesrv_addr" if a[0] != "trimq-admin" else "namesrv"]
            for a in readme_commands() if "--namesrv" in a}
    assert used, "README's commands name no name server"
    # both: whichever way of starting the daemons a reader picks, the later commands reach its name server
    assert used == served, f"README commands use name servers {sorted(used)}; its daemons serve {sorted(served)}"


def test_make_demo_installs_no_extras() -> None:
    make = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo:(.*)$", make, re.MULTILINE)
    assert demo and "$(STAMP)" not in demo.group(1).split(), "make demo must not need the full install"
    stamp = re.search(r"^\$\(DEMO_STAMP\):.*\n((?:\t.*\n)+)", make, re.MULTILINE)
    assert stamp and "$(DEMO_STAMP)" in demo.group(1)
    installs = re.findall(r"pip install[^;\n]*", stamp.group(1))
    assert installs and all("[" not in i and i.rstrip().endswith("-e .") for i in installs), installs
