"""trimq-admin refuses a queue id, offset, broker id or timestamp a broker could not take, before it connects.

Found by hand (2026-12-08): a 20-digit ``--offset`` or ``--timestamp`` got as far as encoding the request and died in
msgpack's OverflowError with a traceback. The name server address below is never reached.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from trimq.tools.admin import main

HUGE = "99999999999999999999"
NS = ["--namesrv", "127.0.0.1:1"]


@pytest.mark.parametrize(("args", "said"), [
    (["message", "show", "-t", "T", "-q", "0", "--offset", HUGE],
     f"Invalid value for '--offset': {HUGE} is not in the range 0<=x<=9223372036854775807"),
    (["message", "show", "-t", "T", "-q", "2147483648", "--offset", "0"],
     "Invalid value for '-q' / '--queue': 2147483648 is not in the range 0<=x<=2147483647"),
    (["consumer", "skip", "-g", "g", "-t", "T", "-q", "0", "--offset", HUGE],
     f"Invalid value for '--offset': {HUGE} is not in the range 0<=x<=9223372036854775807"),
    (["consumer", "reset-offset", "-g", "g", "-t", "T", "-s", HUGE],
     f"'{HUGE}' is {HUGE} epoch milliseconds, outside 0 .. 9223372036854775807"),
    (["broker", "promote", "--broker-name", "broker-a", "--broker-id", "0"],
     "Invalid value for '--broker-id': 0 is not in the range 1<=x<=1024"),
])
def test_values_a_broker_cannot_take_are_usage_errors(args: list[str], said: str) -> None:
    result = CliRunner().invoke(main, [*NS, *args])
    assert result.exit_code == 2, result.output
    assert said in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
