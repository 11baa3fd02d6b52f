"""The web console in a real headless browser (Debian's chromium driven by playwright's Python API).

A real broker (trimq.testing, in this process) with messages, an orderly group blocked on a poison message
and a concurrent group; the console is ``trimq-admin serve`` in a subprocess, as an operator runs it. The
browser reads every page, then acts through the forms as a person would: skips the blocked message (it goes
to the dead-letter queue), resends it from the DLQ page, looks a message up by key, and resets a group's
offsets (plan first, then confirmed). Screenshots of every page are kept: under the test's tmp dir, and in
``$TRIMQ_ARTIFACTS/console`` when that is set.

``make test`` installs chromium (apt) and playwright (the test extra); playwright never downloads a browser
here: it drives /usr/bin/chromium (``TRIMQ_CHROMIUM`` overrides). No skip: without a browser the test fails,
saying how to get one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.conftest import SMALL_STORE
from trimq.client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from trimq.testing import open_broker

TOPIC = "Orders"
ORDERLY = "billing"
CONCURRENT = "audit"
MESSAGES = 12
POISON_QUEUE = 1
BIN = Path(sys.executable).parent
CHROMIUM = os.environ.get("TRIMQ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def browser_or_fail() -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: `make test` installs it (apt-get install chromium, as root), or set "
                    f"TRIMQ_CHROMIUM to a chromium binary")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[test]' (make test does)")


async def wait_until(pred: Callable[[], Any], timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.02)


async def start_console(namesrv: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``trimq-admin serve`` on a free port; (process, base URL) once it prints where it listens."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN / "trimq-admin"), "--namesrv", namesrv, "serve", "--listen", "127.0.0.1:0"],
                                stdout=out, stderr=subprocess.STDOUT)
    with trio.fail_after(20):
        while True:
            found = re.search(r"console on (http://127\.0\.0\.1:\d+/)", log.read_text())
            if found:
                return proc, found.group(1)
            if proc.poll() is not None:
                raise RuntimeError(f"trimq-admin serve exited with {proc.returncode}:\n{log.read_text()}")
            await trio.sleep(0.05)


def browse(base: str, shots: Path) -> dict[str, Any]:
    """Everything the browser does (run in a worker thread: playwright's sync API has a loop of its own)."""
    from playwright.sync_api import expect, sync_playwright

    seen: dict[str, Any] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.set_default_timeout(15_000)
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("requestfailed", lambda r: errors.append(f"{r.url}: {r.failure}"))

            def shot(name: str) -> None:
                # every page fits the window's width (wide tables scroll inside their card)
                if page.evaluate("document.documentElement.scrollWidth > window.innerWidth"):
                    errors.append(f"{name}: the page is wider than the window")
                page.screenshot(path=str(shots / f"{len(list(shots.iterdir())) + 1:02d}-{name}.png"), full_page=True)

            # cluster and brokers
            page.goto(base)
            expect(page.locator("#brokers")).to_contain_text("broker-a")
            expect(page.locator("#brokers")).to_contain_text("master")
            expect(page.locator("#stat-topics")).to_have_text("1")
            expect(page.locator("#stat-groups")).not_to_have_text("-")
            seen["stylesheet"] = page.evaluate("getComputedStyle(document.querySelector('header.top')).display")
            shot("cluster")

            # topics, then one topic's queues with min/max offsets
            page.click("nav >> text=Topics")
            expect(page.locator("#topics")).to_contain_text(TOPIC)
            expect(page.locator("#topics")).not_to_contain_text("%RETRY%")
            shot("topics")
            page.click(f"#topics >> text={TOPIC}")
            expect(page.locator("#total-messages")).to_have_text(str(MESSAGES))
            rows = page.locator("#queues tbody tr")
            expect(rows).to_have_count(4)
            seen["queue_rows"] = [[c.strip() for c in r] for r in
                                  rows.evaluate_all("rs => rs.map(r => [...r.cells].map(c => c.innerText))")]
            shot("topic")

            # consumer groups, then the orderly group: members, owner, lock, lag, the blocked queue
            page.click("nav >> text=Consumer groups")
            groups = page.locator("#groups")
            expect(groups.locator("tr", has_text=ORDERLY)).to_contain_text("orderly")
            expect(groups.locator("tr", has_text=CONCURRENT)).to_contain_text("concurrently")
            shot("groups")
            page.click(f"#groups >> text={ORDERLY}")
            expect(page.locator("#group-state")).to_have_text("online")
            expect(page.locator("#members tbody tr")).to_have_count(1)
            queues = page.locator("#queues tbody tr", has_text=TOPIC)  # and the group's %RETRY% queue
            expect(queues).to_have_count(4)
            expect(page.locator("#queues tr.blocked")).to_have_count(1)
            seen["group_rows"] = [[c.strip() for c in r] for r in
                                  queues.evaluate_all("rs => rs.map(r => [...r.cells].map(c => c.innerText))")]
            seen["member"] = page.locator("#members tbody td").first.inner_text()
            shot("group-orderly")

            # the blocked queues page: skip the poison message (dead-lettered, the queue moves on)
            page.click("nav >> text=Blocked queues")
            expect(page.locator("#blocked")).to_contain_text(ORDERLY)
            shot("blocked")
            page.click("#blocked >> button:has-text('Skip')")
            expect(page.locator("#notice")).to_contain_text(f"skipped {TOPIC} queue {POISON_QUEUE}")
            expect(page.locator("#none-blocked")).to_be_visible()
            shot("blocked-after-skip")

            # the group's dead letters: resend the skipped one
            page.goto(f"{base}dlq?group={ORDERLY}")
            dlq = page.locator("#dlq tbody tr")
            expect(dlq).to_have_count(1)
            expect(dlq).to_contain_text("poison-key")
            expect(dlq).to_contain_text("poison")
            shot("dlq")
            dlq.locator("button:has-text('Resend')").click()
            expect(page.locator("#notice")).to_contain_text(f"resent 1 dead letter of {ORDERLY}")
            expect(page.locator("#dlq tbody tr")).to_contain_text("resent")
            expect(page.locator("#dlq button")).to_have_count(0)
            shot("dlq-after-resend")

            # message lookup by key, then the message itself by its id
            page.click("nav >> text=Messages")
            page.fill("#lookup input[name=key]", "order-3")
            page.click("#lookup button")
            expect(page.locator("#results tbody tr")).to_have_count(1)
            shot("message-query")
            page.click("#results tbody a.mono")
            expect(page.locator("#body")).to_have_text("order 3")
            expect(page.locator("#properties")).to_contain_text("KEYS")
            expect(page.locator("#message dd", has_text="order-3")).to_have_count(1)  # the Keys field
            shot("message")

            # reset the concurrent group's offsets to the start: the plan first, then confirmed
            page.goto(f"{base}group?group={CONCURRENT}")
            expect(page.locator("#group-state")).to_have_text("online")
            page.fill("#reset-form input[name=timestamp]", "0")
            page.click("#reset-form button")
            plan = page.locator("#plan tbody tr")
            expect(plan).to_have_count(4)
            seen["plan"] = [[c.strip() for c in r] for r in
                            plan.evaluate_all("rs => rs.map(r => [...r.cells].map(c => c.innerText))")]
            shot("reset-plan")
            page.click("#confirm-reset button")
            expect(page.locator("#notice")).to_contain_text(f"offsets of {CONCURRENT} on {TOPIC} reset")
            shot("group-after-reset")
            seen["errors"] = errors
        finally:
            browser.close()
    return seen


def cells(row: list[str], *columns: int) -> list[str]:
    return [row[c] for c in columns]


async def test_console_pages_and_actions_in_a_browser(tmp_path: Path) -> None:
    browser_or_fail()
    shots = tmp_path / "console-screenshots"
    shots.mkdir()
    try:
        async with open_broker(**SMALL_STORE) as cluster:
            await cluster.create_topic(TOPIC, 4)
            async with Producer(cluster.producer_config()) as producer:
                for i in range(MESSAGES - 1):
                    await producer.send(Message(TOPIC, f"order {i}".encode(), keys=f"order-{i}"),
                                        message_queue=MessageQueue(TOPIC, "broker-a", i % 4))
                await producer.send(Message(TOPIC, b"poison", keys="poison-key"),
                                    message_queue=MessageQueue(TOPIC, "broker-a", POISON_QUEUE))

            consumed: list[str] = []
            poisoned: list[int] = []

            async def orderly(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
                if any(m.body == b"poison" for m in msgs):
                    poisoned.append(1)
                    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                return ConsumeOrderlyStatus.SUCCESS

            async def concurrently(msgs: list[MessageExt],
                                   ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
                consumed.extend(m.body.decode() for m in msgs)
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

            billing = PushConsumer(cluster.consumer_config(ORDERLY, suspend_current_queue_time_millis=200))
            billing.subscribe(TOPIC)
            billing.register_message_listener_orderly(orderly)
            audit = PushConsumer(cluster.consumer_config(CONCURRENT))
            audit.subscribe(TOPIC)
            audit.register_message_listener_concurrently(concurrently)
            async with billing, audit:
                await wait_until(lambda: billing.blocked_queues() and len(consumed) >= MESSAGES)
                proc, base = await start_console(cluster.namesrv_addr, tmp_path / "console.log")
                try:
                    started = time.monotonic()
                    seen = await trio.to_thread.run_sync(browse, base, shots)
                    print(f"browser: {time.monotonic() - started:.1f} s")
                finally:
                    proc.terminate()
                    proc.wait(10)
                assert proc.returncode == 0, (tmp_path / "console.log").read_text()

                # what the pages showed is what the cluster holds
                per_queue = [cells(r, 1, 2, 3, 4) for r in seen["queue_rows"]]
                assert per_queue == [["0", "0", "3", "3"], ["1", "0", "4", "4"], ["2", "0", "3", "3"],
                                     ["3", "0", "2", "2"]]
                assert seen["member"] == billing.client_id
                for row in seen["group_rows"]:  # topic, broker, queue, broker offset, consumer offset, lag, owner, lock
                    assert row[6] == billing.client_id and row[7].startswith(billing.client_id), row
                [blocked_row] = [r for r in seen["group_rows"] if r[8] != "-"]
                assert blocked_row[2] == str(POISON_QUEUE) and blocked_row[8].startswith("offset 3, "), blocked_row
                assert [cells(r, 1, 3) for r in seen["plan"]] == [["0", "0"], ["1", "0"], ["2", "0"], ["3", "0"]]
                assert seen["stylesheet"] == "flex"  # the stylesheet loaded (served by the console, no CDN)
                assert seen["errors"] == [], "\n".join(seen["errors"])

                # the actions happened: the dead letter was resent to its queue, the reset made audit read it all again
                dead = await cluster.admin.dlq_list(ORDERLY)
                assert [(m.keys, m.resent) for m in dead.messages] == [("poison-key", True)]
                await wait_until(lambda: consumed.count("order 0") == 2 and consumed.count("poison") >= 2)
                await wait_until(lambda: billing.blocked_queues())  # the poison is back, and blocks again
    finally:  # the screenshots taken are kept even when the test fails: they show where
        artifacts = os.environ.get("TRIMQ_ARTIFACTS")
        if artifacts:
            shutil.copytree(shots, Path(artifacts) / "console", dirs_exist_ok=True)
    assert len(list(shots.glob("*.png"))) == 13
