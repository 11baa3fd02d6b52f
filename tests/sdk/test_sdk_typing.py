"""What users' tools see (issue 18 item 2): every public name of the SDK has a docstring, and a type checker
(mypy --strict, as a user runs it on their service) sees the SDK's types: config fields, send's sharding_key,
the decorator, the message stream."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["protocol", "runtime", "namesrv", "broker", "client", "spark_jobs", "tools", "testing", "demo"]
PUBLIC_MODULES = ["trimq.client", "trimq.client.aio", "trimq.client.stream", "trimq.testing"]


def test_every_public_name_has_a_docstring() -> None:
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not inspect.getdoc(obj):
                missing.append(f"{module_name}.{name}")
            if not inspect.isclass(obj) or not obj.__module__.startswith("trimq"):
                continue
            for attr, value in vars(obj).items():
                member = value.fget if isinstance(value, property) else value
                if attr.startswith("_") or not (callable(member) or isinstance(value, property)):
                    continue
                if not getattr(member, "__doc__", None):
                    missing.append(f"{module_name}.{name}.{attr}")
    assert missing == []


USER_CODE = '''
from trimq.client import Message, MessageExt, Producer, PushConsumer, PushConsumerConfig

cfg = PushConsumerConfig(consumer_group="billing", pull_batch_size="32")
reveal_type(cfg.pull_batch_size)
consumer = PushConsumer(PushConsumerConfig(consumer_group="billing", namesrv_addr="127.0.0.1:9876"))


@consumer.listener("Orders", orderly=True)
async def on_order(msg: MessageExt) -> None:
    print(msg.body)


reveal_type(on_order)


async def send(producer: Producer) -> None:
    reveal_type(await producer.send(Message("Orders", b"x"), sharding_key="order-7"))
    await producer.send(Message("Orders", b"x"), sharding_key=7)


async def consume() -> None:
    async with consumer:
        async for msg in consumer.messages():
            async with msg.process() as m:
                reveal_type(m)
                reveal_type(m.body)
'''


def test_a_users_type_checker_sees_the_sdk_types(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    # mypy does not follow setuptools' editable-install hook: lay the layer folders out as the installed package
    # (what `make lint` does in build/typecheck); --follow-imports=silent treats them as an installed library.
    package = tmp_path / "site" / "trimq"
    package.mkdir(parents=True)
    for name in ("__init__.py", "py.typed"):
        (package / name).write_bytes((ROOT / "trimq" / name).read_bytes())
    for layer in LAYERS:
        (package / layer).symlink_to(ROOT / layer, target_is_directory=True)
    user = tmp_path / "service.py"
    user.write_text(textwrap.dedent(USER_CODE))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), str(user)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(tmp_path / "site")})
    lines = [line.split(": ", 1)[1] for line in out.stdout.splitlines() if line.startswith("service.py:")]
    assert lines == [
        'error: Argument "pull_batch_size" to "PushConsumerConfig" has incompatible type "str"; expected "int"  '
        '[arg-type]',
        'note: Revealed type is "int"',
        'note: Revealed type is "def (msg: trimq.protocol.message.MessageExt) -> typing.Coroutine[Any, Any, None]"',
        'note: Revealed type is "trimq.client.api.SendResult"',
        'error: Argument "sharding_key" to "send" of "Producer" has incompatible type "int"; expected "str | None"  '
        '[arg-type]',
        'note: Revealed type is "trimq.client.stream.ReceivedMessage"',
        'note: Revealed type is "bytes"',
    ], out.stdout + out.stderr
