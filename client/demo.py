"""``make demo``: the main job on embedded defaults, ending with a summary."""

from __future__ import annotations

import sys
import tempfile

import trio

from broker.broker import open_broker
from broker.config import BrokerConfig
from client.remoting import RemotingClient
from protocol import RemotingCommand, RequestCode
from protocol.codes import code_name
from protocol.logs import configure_logging


async def demo(store_dir: str) -> bool:
    config = BrokerConfig(listen="127.0.0.1:0", store_dir=store_dir, embedded_namesrv=True)
    async with open_broker(config) as broker, RemotingClient() as rc:
        print(f"broker {config.broker_name} serving on {broker.address}")
        ok = True
        for code in (RequestCode.GET_BROKER_RUNTIME_INFO, 4242):
            resp = await rc.invoke(broker.address, RemotingCommand.request(code))
            print(f"  {code_name(code, response=False):>24} -> {code_name(resp.code, response=True)}"
                  f" {resp.body or resp.remark}")
        return ok


def main() -> None:
    configure_logging("console", "warning")
    with tempfile.TemporaryDirectory(prefix="trimq-demo-") as d:
        ok = trio.run(demo, d)
    print("demo:", "OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
