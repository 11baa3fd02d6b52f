"""The chaos scenario: a whole trimq cluster as real processes, a seeded schedule of failures, and a verdict.

Processes (every one started through its command-line tool, logs under the work directory): one
``trimq-namesrv``; two brokers ``broker-a`` and ``broker-b`` (``--flush sync``), ``broker-a`` a SYNC_MASTER with a
slave (issue 15; ``broker-b`` an ASYNC_MASTER without one); a topic with
``queues_per_broker`` queues on each; three orderly consumers ``c1``..``c3`` of one group (``--orderly
--record``), ``c3`` with ``order_scope="key"`` (issue 17: a queue's keys in parallel, through a handler that takes
0-20 ms) and the others in queue scope; one orderly producer (``--orderly --sharding-key --record --rate``).

The schedule (:func:`make_schedule`, a pure function of the seed and :class:`ChaosSettings`) is a sequence
of events, each followed by ``settle_s`` of calm:

* ``kill_consumer``: SIGKILL a consumer, start a new one in its slot (a new pid, so a new client id)
  ``duration_s`` later;
* ``pause_consumer``: SIGSTOP a consumer for ``duration_s`` — longer than its queue-lock lease (and so its orderly
  membership) and than the broker's ``channel_expired_timeout_ms``, so the group
  drops it and another member takes its queues over — then SIGCONT;
* ``kill_broker``: SIGKILL a broker, read the consumer offsets it had persisted
  (``STORE/config/consumerOffset.json``: what it will reload), restart it ``duration_s`` later on the same
  store and port; it registers with the name server again;
* ``kill_master`` (issue 15, on ``broker-a``): SIGKILL its master, and ``duration_s`` later promote its slave with
  ``trimq-admin broker promote`` (SYNC_MASTER, master epoch + 1) and restart the old master on its store, where
  it learns of the newer master and rejoins as its slave, cutting the tail the new master never had. Judged as a
  broker crash whose "persisted" offsets are those the promoted master serves right after its promotion; the
  checker's "nothing acknowledged lost" is then SYNC_MASTER's promise: every acknowledged message was on the
  slave. With ``ha_role="ASYNC_MASTER"`` (:data:`LONG_ASYNC`) the pair replicates asynchronously and the slave is
  promoted as an ASYNC_MASTER: the tail its old master stored past what the slave had (the commit-log offset the
  promotion answers) may be lost, and the checker allows exactly that (:class:`tests.e2e.checker.AsyncFailover`);
  consumers that read that tail must be moved back onto the new log and skip nothing of it.

Meanwhile a sampler thread reads every broker's committed offsets of the group (GET_CONSUME_STATS) and its
fenced-update counter (GET_LOCK_TABLE) every ``sample_interval_s``. After the producer finished and every
acknowledged message was consumed (or a timeout), the consumers stop gracefully and
tests/e2e/checker.py judges the record files with the stops, pauses, broker crashes and offset samples
(see :func:`tests.e2e.checker.check`): no acknowledged message lost, per-key order except for allowed
replays, replays never below the committed floor, late completions of a paused consumer bounded, committed
offsets never going backwards within a broker's lifetime.

Lock leases are trimq's default 2 s and other timers are shortened so a run takes seconds
(:data:`BROKER_SETTINGS`, :data:`CONSUMER_SETTINGS`); the checker also counts records a paused consumer started
after its lease ran out (``lease_ms``), which must be none.
Run by hand: ``python -m tests.chaos.scenario --seed 7 [--long] [--keep DIR]``; judge a kept directory again with
``--rejudge DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.stop_signals import raise_on_stop_signals, stop_signals_held
from tests.e2e.checker import AsyncFailover, BrokerCrash, Pause, Report, Stop, async_tail, check, read_records
from trimq.testing.processes import ADDRESS_FILE_NAME, first_event, fresh_address_file, listened_address, logged_event

__all__ = [
    "BROKER_SETTINGS",
    "CONSUMER_SETTINGS",
    "LONG",
    "SHORT",
    "ChaosResult",
    "ChaosSettings",
    "Event",
    "make_schedule",
    "run_scenario",
]

BIN = Path(os.path.dirname(sys.executable))
TOPIC = "ChaosOrders"
GROUP = "chaos_orderly"
BROKERS = ("broker-a", "broker-b")
HA_BROKER = "broker-a"
"""The broker name served by a SYNC_MASTER and its slave (the ``kill_master`` events' target)."""
BROKER_KINDS = ("kill_broker", "kill_master")
SLOTS = ("c1", "c2", "c3")
KEY_SCOPE_SLOT = "c3"
"""The slot whose consumers run with ``order_scope="key"`` (the checker judges the queues they consumed per key)."""
REPO = Path(__file__).resolve().parents[2]

#: Broker settings (``TRIMQ_BROKER_*``): queue locks are the default 2 s leases (issue 14; an orderly member leaves
#: with its lease); a silent client leaves after 2 s (it heartbeats every 0.5 s) instead of 120 s, looked for
#: every 0.2 s; offsets persisted every second.
LEASE_MS = 2000
BROKER_SETTINGS: dict[str, Any] = {
    "lease_ms": LEASE_MS,
    "channel_expired_timeout_ms": 2000,
    "client_housekeeping_interval_ms": 200,
    "flush_consumer_offset_interval_ms": 1000,
    "shutdown_grace_ms": 2000,
}
#: Consumer settings: leases renewed by default (every third of the broker's lease), heartbeat every 0.5 s,
#: poll routes every second, persist offsets every second, retry a failed pull after 0.5 s, unlock queues
#: given away at once.
CONSUMER_SETTINGS: dict[str, Any] = {
    "heartbeat_broker_interval": 500,
    "poll_name_server_interval": 1000,
    "persist_consumer_offset_interval": 1000,
    "pull_time_delay_mills_when_exception": 500,
    "rebalance_interval": 5000,
    "unlock_delay_time_mills": 0,
}
PRODUCER_SETTINGS: dict[str, Any] = {"poll_name_server_interval": 1000}
#: The key-scope slot's flags (trimq-consumer --order-scope key) on top of CONSUMER_SETTINGS.
KEY_SCOPE_FLAGS = ["--order-scope", "key", "--max-in-flight-keys", "16"]


@dataclass(frozen=True)
class ChaosSettings:
    """What one scenario run does; :data:`SHORT` fits ``make test``, :data:`LONG` is ``make chaos``."""

    consumer_kills: int = 1
    consumer_pauses: int = 1
    broker_kills: int = 1
    first_event_s: float = 3.0  # after the producer started
    jitter_s: float = 1.0  # random extra gap before each event
    settle_s: float = 2.0  # calm after each event's end
    kill_down_s: tuple[float, float] = (0.5, 2.0)  # a killed consumer's replacement starts after this
    pause_s: tuple[float, float] = (5.5, 6.5)  # SIGSTOP .. SIGCONT
    broker_down_s: tuple[float, float] = (1.0, 2.5)
    master_kills: int = 1
    master_down_s: tuple[float, float] = (0.5, 1.5)  # a killed master's slave is promoted after this
    tail_s: float = 2.0  # traffic after the last event settled
    rate: float = 300.0  # messages per second
    keys: int = 200
    queues_per_broker: int = 4
    inflight: int = 32
    drain_timeout_s: float = 20.0  # after the producer finished, for the consumers to catch up
    sample_interval_s: float = 0.15
    overlap: bool = False  # events may overlap (see make_schedule)
    ha_role: str = "SYNC_MASTER"  # broker-a's master, and what its promoted slave becomes (or ASYNC_MASTER)
    #: ASYNC_MASTER: the slave is SIGKILLed this long before its master (and restarted on its store right after),
    #: so the master acknowledges and serves a tail the slave never gets (on loopback it otherwise lags by ~ms,
    #: and a SIGSTOPped slave still finds the tail in its socket buffer when it resumes)
    async_lag_s: float = 0.5


SHORT = ChaosSettings()
LONG = ChaosSettings(consumer_kills=5, consumer_pauses=4, broker_kills=3, settle_s=2.0, jitter_s=4.0, rate=400.0,
                     keys=500, drain_timeout_s=60.0, overlap=True, master_kills=2)
LONG_ASYNC = replace(LONG, ha_role="ASYNC_MASTER")


@dataclass(frozen=True)
class Event:
    """One scheduled failure: ``at_s`` after the producer started, lasting ``duration_s``."""

    at_s: float
    kind: str  # kill_consumer | pause_consumer | kill_broker | kill_master
    target: str  # a consumer slot (c1..c3) or a broker name
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s


def make_schedule(seed: int, settings: ChaosSettings = SHORT) -> list[Event]:
    """The events of a run: the kinds in a seeded order, each at a seeded time on a seeded target.

    Without ``overlap`` the events come one after the other, each followed by ``settle_s`` of calm. With it
    an event may start while earlier ones are still under way, on a target that is not: at most one broker
    down at a time, and at least one consumer running.
    """
    rng = random.Random(seed)
    kinds = (["kill_consumer"] * settings.consumer_kills + ["pause_consumer"] * settings.consumer_pauses
             + ["kill_broker"] * settings.broker_kills + ["kill_master"] * settings.master_kills)
    rng.shuffle(kinds)
    events: list[Event] = []
    busy: dict[str, float] = {}  # target -> end of its event plus calm
    t = settings.first_event_s
    for kind in kinds:
        t += rng.uniform(0, settings.jitter_s)
        pool: tuple[str, ...]
        if kind == "kill_broker":
            pool, span = BROKERS, settings.broker_down_s
        elif kind == "kill_master":
            pool, span = (HA_BROKER,), settings.master_down_s
        else:
            pool, span = SLOTS, settings.kill_down_s if kind == "kill_consumer" else settings.pause_s
        while True:
            free = [x for x in pool if busy.get(x, 0.0) <= t]
            enough = len(free) >= (1 if kind in BROKER_KINDS else 2) if settings.overlap else len(free) == len(pool)
            if kind in BROKER_KINDS and any(busy.get(x, 0.0) > t for x in BROKERS):
                enough = False  # one broker at a time
            if kind not in BROKER_KINDS and len([x for x in SLOTS if busy.get(x, 0.0) <= t]) < 2:
                enough = False  # keep a consumer running
            if enough:
                break
            watched = BROKERS if kind in BROKER_KINDS else pool
            t = min(busy[x] for x in watched if busy.get(x, 0.0) > t)
        target, dur = rng.choice(free), rng.uniform(*span)
        events.append(Event(round(t, 2), kind, target, round(dur, 2)))
        busy[target] = t + dur + settings.settle_s
        if not settings.overlap:
            t += dur + settings.settle_s
            busy = {x: min(v, t) for x, v in busy.items()}
    return events


def traffic_seconds(events: list[Event], settings: ChaosSettings) -> float:
    """How long the producer sends: past the last event's end, its calm and a tail."""
    last = max((e.end_s for e in events), default=0.0)
    return max(last + settings.settle_s + settings.tail_s, settings.first_event_s + settings.tail_s)


@dataclass
class ChaosResult:
    """What a run did and the checker's verdict."""

    seed: int
    events: list[Event]
    report: Report
    produced: int = 0
    producer_status: int | None = None
    producer_summary: dict[str, Any] = field(default_factory=dict)
    fenced_updates: int = 0
    offset_samples: int = 0
    broker_recovery_ms: dict[str, list[int | None]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # harness-level failures (timeouts, crashes)
    wall_s: float = 0.0
    workdir: str = ""
    key_scope_clients: list[str] = field(default_factory=list)
    key_scope_records: int = 0  # records of the key-scope slot's consumers

    @property
    def ok(self) -> bool:
        return self.report.ok and not self.problems

    def text(self) -> str:
        lines = [f"chaos seed {self.seed}: {len(self.events)} events, wall {self.wall_s:.1f} s, "
                 f"work dir {self.workdir}"]
        lines += [f"  event at {e.at_s:5.2f} s: {e.kind} {e.target} for {e.duration_s:.2f} s" for e in self.events]
        s = self.producer_summary
        lines.append(f"producer: exit {self.producer_status}, sent {s.get('sent')} failed {s.get('failed')} in "
                     f"{s.get('elapsed_s')} s")
        lines.append(f"offset samples: {self.offset_samples}; fenced offset updates (brokers' counters): "
                     f"{self.fenced_updates}")
        lines.append(f"key scope ({KEY_SCOPE_SLOT}): {self.key_scope_records} records by {len(self.key_scope_clients)} "
                     f"consumer(s), their queues judged per key")
        for b, vals in self.broker_recovery_ms.items():
            lines.append(f"broker {b} SIGKILL -> first consumption on each of its queues: "
                         f"{', '.join('-' if v is None else f'{v} ms' for v in vals)}")
        lines.append(self.report.text())
        lines += [f"PROBLEM: {p}" for p in self.problems]
        if not self.ok:
            lines.append(f"FAILED with seed {self.seed} (rerun: TRIMQ_CHAOS_SEED={self.seed}); first offending key: "
                         f"{self.report.first_offending_key}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- processes


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_handed_out: set[int] = set()


def _stable_port() -> int:
    """A free port below the kernel's ephemeral range, for a listener that is restarted on the same port.

    A port from the ephemeral range (what binding port 0 gives) is free again while its broker is down, and any
    outgoing connection on the machine may take it as its source port then: the restart failed with "Address
    already in use" (long seeds 60 and 87). Ports below the range are never picked that way."""
    low, high = _ephemeral_range()
    top, bottom = (low - 1, 10_000) if low > 11_000 else (65_535, high + 1)
    rng = random.Random()
    for _ in range(1000):
        port = rng.randint(bottom, top)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {bottom}-{top}")


def consumer_end_problem(name: str, returncode: int | None) -> str | None:
    """What a consumer's exit status says is wrong, or None: 0 (SIGTERM at the end) and SIGKILL (a kill event) are
    the harness's own; anything else is a finding. SIGHUP is named because the harness never sends it. On 2026-12-07
    the shell that ran a chaos run in its background exited while a pause had a consumer stopped, and the kernel's
    SIGHUP to an orphaned process group holding a stopped process killed that consumer. Cluster processes have led
    sessions of their own since (``_Proc``), so a SIGHUP now comes from elsewhere."""
    if returncode in (0, -signal.SIGKILL):
        return None
    if returncode is None:  # SIGTERM at the end did not stop it within its wait (reported there too)
        return f"{name} had not ended when the run was judged"
    if returncode == -signal.SIGHUP:
        return (f"{name} ended with status {returncode} (SIGHUP: not sent by the harness, and {name} leads a "
                f"session of its own, so no shell's exit reaches it: look for who sent it)")
    return f"{name} ended with status {returncode}"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _env(settings: dict[str, Any], prefix: str = "TRIMQ_BROKER_") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
    for k, v in settings.items():
        env[prefix + k.upper()] = str(v).lower() if isinstance(v, bool) else str(v)
    return env


class _Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], workdir: Path) -> None:
        self.name = name
        self.log = workdir / f"{name}.log"
        with open(self.log, "ab") as out:
            # A session of its own: were it in the launcher's job, a shell exiting while a pause has it stopped
            # would orphan that job's group and the kernel would hang it up (SIGHUP, then SIGCONT: POSIX). The
            # harness ends every one of them itself (cleanup, also on ^C, SIGHUP or SIGTERM to the harness).
            self.popen = subprocess.Popen(argv, stdout=out, stderr=out, env=env, cwd=workdir,
                                          start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_event(self, event: str) -> dict[str, Any] | None:
        return first_event(self.log_text(), event)

    def wait_log_event(self, event: str, timeout: float) -> dict[str, Any]:
        return logged_event(self.log, self.popen, event, timeout, name=self.name)


class _Sampler(threading.Thread):
    """Reads committed offsets and fenced-update counters from every live broker, in a background thread."""

    def __init__(self, namesrv: str, interval_s: float) -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self.namesrv = namesrv
        self.interval_s = interval_s
        self.lock = threading.Lock()  # held around each broker call; a broker kill takes it first
        self.addrs: dict[str, str | None] = {}
        self.incarnation: dict[str, int] = defaultdict(int)
        self.samples: dict[tuple[str, str, int], list[tuple[int, int]]] = defaultdict(list)
        self.fenced: dict[tuple[str, int], int] = {}
        self.errors = 0
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(10)

    def run(self) -> None:
        from trimq.client.config import ClientConfig
        from trimq.client.instance import ClientInstance
        from trimq.client.runner import TrioRunner

        with TrioRunner(name="chaos-sampler-trio") as runner:
            instance = runner.enter(ClientInstance(ClientConfig(namesrv_addr=self.namesrv)))
            api = instance.api
            while not self._halt.is_set():
                for broker in BROKERS:
                    with self.lock:
                        addr = self.addrs.get(broker)
                        if addr is None:
                            continue
                        try:
                            stats = runner.call(lambda a=addr: api.get_consume_stats(a, GROUP, TOPIC, timeout_ms=1000))
                            t = _wall_ms()
                            locks = runner.call(lambda a=addr: api.get_lock_table(a, GROUP, timeout_ms=1000))
                        except Exception:
                            self.errors += 1
                            continue
                        for row in stats.get("offsetTable", []):
                            off = int(row.get("consumerOffset", -1))
                            if off >= 0:
                                mq = row["mq"]
                                self.samples[(mq["topic"], mq["brokerName"], int(mq["queueId"]))].append((t, off))
                        fenced = int(locks.get("fencedUpdates", {}).get(GROUP, 0))
                        key = (broker, self.incarnation[broker])
                        self.fenced[key] = max(self.fenced.get(key, 0), fenced)
                self._halt.wait(self.interval_s)
            runner.exit(instance)


# ---------------------------------------------------------------------------------------------- the run


class _Cluster:
    def __init__(self, workdir: Path, settings: ChaosSettings) -> None:
        self.workdir = workdir
        self.settings = settings
        self.procs: list[_Proc] = []
        self.namesrv = ""
        self.brokers: dict[str, _Proc] = {}  # broker name -> its master's process
        self.broker_addr: dict[str, str] = {}
        self.stores: dict[str, Path] = {}  # broker name -> its master's store (a promotion swaps it with the slave's)
        self.slaves: dict[str, _Proc] = {}  # HA: broker name -> its slave's process
        self.slave_stores: dict[str, Path] = {}
        self.consumers: dict[str, _Proc] = {}  # slot -> current incarnation
        self.consumer_files: list[Path] = []
        self.all_consumers: list[_Proc] = []
        self._incarnations: dict[str, int] = defaultdict(int)
        #: HA: each store's HA port, kept across restarts. A broker listening on port 0 binds any free HA port, and
        #: restarted on its listen address it binds that port + 1 instead; its slave, which learns the master's HA
        #: address from a name-server registration every 30 s, then followed nothing for up to 30 s, so the SYNC_MASTER
        #: answered SLAVE_NOT_AVAILABLE and the next kill_master lost all of it (long seeds 11 and 13).
        self.ha_ports: dict[Path, int] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> _Proc:
        with stop_signals_held():  # a stop raising between the fork and the append would leave the child running
            p = _Proc(name, argv, env, self.workdir)
            self.procs.append(p)
        return p

    def start_namesrv(self) -> None:
        p = self.start("namesrv", [str(BIN / "trimq-namesrv"), "--listen", "127.0.0.1:0", "--log-format", "json",
                                   "--log-level", "info"], _env({}))
        self.namesrv = str(p.wait_log_event("namesrv.started", 20)["address"])

    def store(self, broker: str) -> Path:
        return self.stores.setdefault(broker, self.workdir / f"store-{broker}")

    def _broker_argv(self, broker: str, store: Path, listen: str, *extra: str) -> list[str]:
        return [str(BIN / "trimq-broker"), "--listen", listen, "--store", str(store), "--namesrv", self.namesrv,
                "--broker-name", broker, "--flush", "sync", "--log-format", "json", "--log-level", "warning", *extra]

    def start_broker(self, broker: str, listen: str | None = None) -> _Proc:
        """Start ``broker`` on ``listen`` (a restart: its previous address) or on a port of its own."""
        listen = listen or f"127.0.0.1:{_stable_port()}"
        fresh_address_file(self.store(broker))
        n = self._incarnations[broker]
        self._incarnations[broker] += 1
        role = ("--role", self.settings.ha_role.lower()) if broker == HA_BROKER else ()
        p = self.start(f"{broker}.{n}", self._broker_argv(broker, self.store(broker), listen, *role),
                       _env(self._broker_settings(broker, self.store(broker))))
        self.brokers[broker] = p
        return p

    def start_slave(self, broker: str) -> _Proc:
        """HA: a slave of ``broker`` on its own store (a fresh one, or a demoted master's); it finds its master
        through the name server."""
        store = self.slave_stores.setdefault(broker, self.workdir / f"store-{broker}-slave")
        fresh_address_file(store)
        n = self._incarnations[broker + "-s"]
        self._incarnations[broker + "-s"] += 1
        listen = f"127.0.0.1:{_stable_port()}"  # a promotion makes it the master, which kill_broker restarts here
        argv = self._broker_argv(broker, store, listen, "--role", "slave", "--broker-id", "1")
        p = self.start(f"{broker}-s.{n}", argv, _env(self._broker_settings(broker, store)))
        self.slaves[broker] = p
        return p

    def _broker_settings(self, broker: str, store: Path) -> dict[str, Any]:
        if broker != HA_BROKER:
            return BROKER_SETTINGS
        return {**BROKER_SETTINGS, "ha_listen_port": self.ha_ports.setdefault(store, _stable_port())}

    def wait_addr(self, p: _Proc, store: Path, timeout: float = 30) -> str:
        return listened_address(store / ADDRESS_FILE_NAME, p.popen, timeout, log=p.log_text, name=p.name)

    def promote(self, broker: str) -> tuple[str, int]:
        """HA: make ``broker``'s slave its master (trimq-admin broker promote); swap the bookkeeping; its address
        and the commit-log offset it writes from."""
        done = subprocess.run([str(BIN / "trimq-admin"), "--namesrv", self.namesrv, "--json", "broker", "promote",
                               "--broker-name", broker, "--broker-id", "1", "--role", self.settings.ha_role],
                              capture_output=True, text=True, env=_env({}), cwd=self.workdir, timeout=60)
        if done.returncode != 0:
            if "promoting this broker would lose" in done.stderr + done.stdout:
                raise PromotionRefused(done.stderr.strip())
            raise RuntimeError(f"promotion of {broker} failed: {done.stderr}{done.stdout}")
        kept = int(json.loads(done.stdout)["maxOffset"])
        new_master, new_store = self.slaves.pop(broker), self.slave_stores.pop(broker)
        self.slave_stores[broker], self.stores[broker] = self.stores[broker], new_store
        self.brokers[broker] = new_master
        self.broker_addr[broker] = addr = (new_store / ADDRESS_FILE_NAME).read_text().strip()
        return addr, kept

    def wait_broker(self, broker: str, timeout: float = 30) -> str:
        addr = self.wait_addr(self.brokers[broker], self.store(broker), timeout)
        self.broker_addr[broker] = addr
        return addr

    def start_consumer(self, slot: str) -> _Proc:
        n = self._incarnations[slot]
        self._incarnations[slot] += 1
        name = f"{slot}.{n}"
        record = self.workdir / f"{name}.jsonl"
        self.consumer_files.append(record)
        argv = [
            str(BIN / "trimq-consumer"), "--namesrv", self.namesrv, "--group", GROUP, "--topic", TOPIC, "--orderly",
            "--from", "first", "--record", str(record), "--instance-name", name, "--log-format", "json",
            "--log-level", "info",
        ]
        env = _env(CONSUMER_SETTINGS, "TRIMQ_CLIENT_")
        if slot == KEY_SCOPE_SLOT:
            argv += ["--handler", "tests.chaos.handlers:jitter", *KEY_SCOPE_FLAGS]
            env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x)
        p = self.start(name, argv, env)
        self.consumers[slot] = p
        self.all_consumers.append(p)
        return p

    def client_id(self, p: _Proc, timeout: float = 20) -> str:
        return str(p.wait_log_event("consumer.cli_started", timeout)["client_id"])

    def cleanup(self) -> None:
        for p in self.procs:
            if p.alive():
                p.popen.send_signal(signal.SIGCONT)
                p.kill()


class PromotionRefused(Exception):
    """The slave refused its promotion: its log ends in an older master epoch than a master that exists."""


def _persisted_offsets(store: Path, broker: str) -> dict[tuple[str, str, int], int]:
    path = store / "config" / "consumerOffset.json"
    try:
        table = json.loads(path.read_text()).get("offsetTable", {})
    except (OSError, ValueError):
        return {}
    out = {}
    for qid, off in table.get(f"{TOPIC}@{GROUP}", {}).items():
        out[(TOPIC, broker, int(qid))] = int(off)
    return out


def _served_offsets(addr: str, broker: str) -> dict[tuple[str, str, int], int]:
    """The group's committed offsets ``addr`` serves now (GET_CONSUME_STATS)."""
    import trio

    from trimq.client.api import MQClientAPI
    from trimq.runtime.client import RemotingClient

    async def go() -> dict[str, Any]:
        async with RemotingClient() as rc:
            return await MQClientAPI(rc, timeout_ms=5000).get_consume_stats(addr, GROUP, TOPIC)

    out = {}
    for row in trio.run(go).get("offsetTable", []):
        off = int(row.get("consumerOffset", -1))
        if off >= 0 and row["mq"]["brokerName"] == broker:
            out[(TOPIC, broker, int(row["mq"]["queueId"]))] = off
    return out


class HarnessStopped(Exception):
    """The harness was hung up (its terminal closed) or told to stop: the run stops, and its cluster is ended
    (``run_scenario``)."""


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as fh:
        return sum(buf.count(b"\n") for buf in iter(lambda: fh.read(1 << 16), b""))


def run_scenario(seed: int, settings: ChaosSettings = SHORT, workdir: Path | None = None,
                 log: Any = None) -> ChaosResult:
    """Run one seeded chaos scenario (see the module documentation) and return its result. A SIGHUP or SIGTERM to
    the harness meanwhile raises :class:`HarnessStopped` once the cluster is ended: its processes lead sessions of
    their own (``_Proc``), so nothing else would end them."""
    with raise_on_stop_signals(HarnessStopped):
        return _run_scenario(seed, settings, workdir, log)


def _run_scenario(seed: int, settings: ChaosSettings, workdir: Path | None, log: Any) -> ChaosResult:
    say = log or (lambda text: None)
    t_begin = time.monotonic()
    events = make_schedule(seed, settings)
    traffic_s = traffic_seconds(events, settings)
    own_dir = workdir is None
    wd = Path(tempfile.mkdtemp(prefix=f"trimq-chaos-{seed}-")) if workdir is None else workdir
    wd.mkdir(parents=True, exist_ok=True)
    if any(wd.iterdir()):
        raise ValueError(f"work directory {wd} is not empty")
    cluster = _Cluster(wd, settings)
    sampler: _Sampler | None = None
    stops: list[Stop] = []
    pauses: list[Pause] = []
    crashes: list[BrokerCrash] = []
    async_failovers: list[AsyncFailover] = []
    problems: list[str] = []
    producer_status: int | None = None
    summary: dict[str, Any] = {}
    prod_rec = wd / "producer.jsonl"
    try:
        cluster.start_namesrv()
        for b in BROKERS:
            cluster.start_broker(b)
        for b in BROKERS:
            cluster.wait_broker(b)
        if settings.master_kills:
            cluster.wait_addr(cluster.start_slave(HA_BROKER), cluster.slave_stores[HA_BROKER])
        made = subprocess.run([str(BIN / "trimq-producer"), "--namesrv", cluster.namesrv, "--topic", TOPIC, "--count",
                               "0", "--queues", str(settings.queues_per_broker)], capture_output=True, text=True,
                              env=_env({}), cwd=wd, timeout=60)
        if made.returncode != 0:
            raise RuntimeError(f"topic creation failed: {made.stderr}")
        for slot in SLOTS:
            cluster.start_consumer(slot)
        for p in list(cluster.consumers.values()):
            cluster.client_id(p)
        sampler = _Sampler(cluster.namesrv, settings.sample_interval_s)
        sampler.addrs.update(cluster.broker_addr)
        sampler.start()
        time.sleep(1.0)  # the group settles on three members
        count = int(settings.rate * traffic_s)
        producer = cluster.start("producer", [
            str(BIN / "trimq-producer"), "--namesrv", cluster.namesrv, "--topic", TOPIC, "--count", str(count),
            "--keys", str(settings.keys), "--orderly", "--sharding-key", "--rate", str(settings.rate), "--inflight",
            str(settings.inflight), "--record", str(prod_rec), "--json", "--log-format", "json",
        ], _env(PRODUCER_SETTINGS, "TRIMQ_CLIENT_"))
        t0 = time.monotonic()
        say(f"seed {seed}: {len(events)} events over {traffic_s:.1f} s of traffic ({count} messages)")

        # The timeline: each event's start and end as actions in time order.
        actions: list[tuple[float, int, str, Event]] = []
        for i, e in enumerate(events):
            actions.append((e.at_s, i, "begin", e))
            actions.append((e.end_s, i, "end", e))
        actions.sort(key=lambda a: (a[0], a[1]))
        paused_at: dict[int, tuple[str, int]] = {}
        begun: dict[int, float] = {}
        for at_s, i, phase, e in actions:
            delay = t0 + at_s - time.monotonic()
            if phase == "end" and i in begun:
                # an event that began late (an earlier one blocked: a restart under load) still lasts its duration:
                # a pause cut to 42 ms gave no takeover to judge (long ASYNC seed 29 under load)
                delay = max(delay, begun.pop(i) + e.duration_s - time.monotonic())
            if delay > 0:
                time.sleep(delay)
            if phase == "begin":
                begun[i] = time.monotonic()
            if not producer.alive() and producer.popen.returncode != 0:
                problems.append(f"the producer exited with {producer.popen.returncode} before {e.kind} {e.target}")
                break
            if e.kind == "kill_consumer":
                if phase == "begin":
                    victim = cluster.consumers[e.target]
                    cid = cluster.client_id(victim)
                    t = _wall_ms()
                    victim.kill()
                    stops.append(Stop(cid, t, graceful=False))
                    say(f"  {at_s:6.2f} s SIGKILL {victim.name} ({cid})")
                else:
                    p = cluster.start_consumer(e.target)
                    say(f"  {at_s:6.2f} s started {p.name}")
            elif e.kind == "pause_consumer":
                victim = cluster.consumers[e.target]
                if phase == "begin":
                    cid = cluster.client_id(victim)
                    t = _wall_ms()
                    victim.signal(signal.SIGSTOP)
                    paused_at[i] = (cid, t)
                    say(f"  {at_s:6.2f} s SIGSTOP {victim.name} ({cid})")
                else:
                    # the time before the signal, as for SIGSTOP: the resumed consumer may record a late completion
                    # before this thread reads the clock again (seed 13: 2 ms earlier, so not counted as late)
                    t_cont = _wall_ms()
                    victim.signal(signal.SIGCONT)
                    cid, t_stop = paused_at.pop(i)
                    pauses.append(Pause(cid, t_stop, t_cont))
                    say(f"  {at_s:6.2f} s SIGCONT {victim.name}")
            elif e.kind == "kill_broker":
                b = e.target
                if phase == "begin":
                    with sampler.lock:
                        sampler.addrs[b] = None
                        sampler.incarnation[b] += 1
                        t = _wall_ms()
                        cluster.brokers[b].kill()
                    persisted = _persisted_offsets(cluster.store(b), b)
                    crashes.append(BrokerCrash(b, t, 0, persisted))
                    say(f"  {at_s:6.2f} s SIGKILL {b}; persisted offsets {sorted(persisted.values())}")
                else:
                    cluster.start_broker(b, cluster.broker_addr[b])
                    addr = cluster.wait_broker(b)
                    crash = crashes[-1]
                    crashes[-1] = replace(crash, restart_ms=_wall_ms())
                    with sampler.lock:
                        sampler.addrs[b] = addr
                    say(f"  {time.monotonic() - t0:6.2f} s {b} restarted on {addr}")
            elif e.kind == "kill_master":
                b = e.target
                if phase == "begin":
                    lagging = settings.ha_role == "ASYNC_MASTER" and settings.async_lag_s > 0
                    if lagging:
                        cluster.slaves[b].kill()
                        time.sleep(settings.async_lag_s)
                    with sampler.lock:
                        sampler.addrs[b] = None
                        sampler.incarnation[b] += 1
                        t = _wall_ms()
                        cluster.brokers[b].kill()
                    if lagging:
                        cluster.wait_addr(cluster.start_slave(b), cluster.slave_stores[b])
                    crashes.append(BrokerCrash(b, t, 0, {}))
                    say(f"  {at_s:6.2f} s SIGKILL {b}'s master"
                        + (f" ({settings.async_lag_s} s after its slave's, restarted since)" if lagging else ""))
                else:
                    killed_addr = cluster.broker_addr[b]
                    try:
                        addr, kept = cluster.promote(b)
                    except PromotionRefused as refused:
                        # The slave never reached its master's epoch (killed while it was starting after the previous
                        # promotion): promoting it would lose the master's writes, so the master comes back instead.
                        cluster.start_broker(b, cluster.broker_addr[b])
                        addr = cluster.wait_broker(b)
                        crashes[-1] = replace(crashes[-1], restart_ms=_wall_ms(),
                                              persisted=_persisted_offsets(cluster.store(b), b))
                        with sampler.lock:
                            sampler.addrs[b] = addr
                        say(f"  {time.monotonic() - t0:6.2f} s {b}'s promotion refused ({refused}); its master "
                            f"restarted on {addr}")
                        continue
                    if settings.ha_role == "ASYNC_MASTER":
                        async_failovers.append(AsyncFailover(b, crashes[-1].time_ms, kept, killed_addr, _wall_ms()))
                    # What the promoted master serves (synced from the old master, plus what was committed to it
                    # meanwhile): the floor of the replays that follow, as a restarted broker's persisted offsets.
                    persisted = _served_offsets(addr, b)
                    crashes[-1] = replace(crashes[-1], restart_ms=_wall_ms(), persisted=persisted)
                    with sampler.lock:
                        sampler.addrs[b] = addr
                    old = cluster.start_slave(b)  # the old master's store: it rejoins as the new master's slave
                    say(f"  {time.monotonic() - t0:6.2f} s {b}'s slave promoted ({addr}); offsets "
                        f"{sorted(persisted.values())}; old master restarting as its slave ({old.name})")
        try:
            producer_status = producer.popen.wait(max(30.0, traffic_s + 30 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            problems.append("the producer did not finish in time")
            producer.kill()
        summary = next((json.loads(line) for line in reversed(producer.log_text().splitlines())
                        if line.startswith('{"topic"')), {})
        if producer_status != 0:
            problems.append(f"producer exit status {producer_status}: {producer.log_text()[-2000:]}")
        # Only SEND_OK promises a message survives a failover (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT may be lost).
        # Nor does an ASYNC_MASTER's for what its promoted slave never had.
        acked = {r["msg_id"] for r in read_records([prod_rec])[0]
                 if r.get("status", "SEND_OK") == "SEND_OK" and not async_tail(r, async_failovers)}
        say(f"producer done ({len(acked)} acknowledged); waiting for the consumers")
        deadline = time.monotonic() + settings.drain_timeout_s
        while True:
            seen = {r["msg_id"] for recs in read_records(cluster.consumer_files) for r in recs}
            if acked <= seen:
                break
            if time.monotonic() > deadline:
                problems.append(f"{len(acked - seen)} acknowledged messages not consumed within "
                                f"{settings.drain_timeout_s} s of the producer's end")
                break
            time.sleep(0.25)
        sampler.stop()
        for p in cluster.consumers.values():
            p.signal(signal.SIGTERM)
        for p in cluster.consumers.values():
            try:
                status = p.popen.wait(20)
            except subprocess.TimeoutExpired:
                problems.append(f"{p.name} did not stop within 20 s of SIGTERM")
                continue
            if status != 0:
                problems.append(f"{p.name} exited with {status}: {p.log_text()[-1500:]}")
        for p in cluster.all_consumers:  # a consumer dying by itself is a finding
            problem = consumer_end_problem(p.name, p.popen.returncode)
            if problem is not None:
                problems.append(problem)
    finally:
        try:
            cluster.cleanup()
        finally:
            if sampler is not None:
                sampler.stop()
        _dump(wd, events, stops, pauses, crashes, sampler, async_failovers)

    key_scope = [str(ev["client_id"]) for p in cluster.all_consumers if p.name.startswith(KEY_SCOPE_SLOT + ".")
                 if (ev := p.log_event("consumer.cli_started")) is not None]
    report = check([prod_rec], cluster.consumer_files, stops=stops, pauses=pauses, broker_crashes=crashes,
                   committed_samples=sampler.samples if sampler else None, topic=TOPIC, lease_ms=LEASE_MS,
                   key_scope_clients=key_scope, async_failovers=async_failovers)
    result = ChaosResult(seed, events, report, produced=report.produced, producer_status=producer_status,
                         producer_summary=summary, problems=problems, wall_s=time.monotonic() - t_begin,
                         workdir=str(wd))
    if sampler is not None:
        result.fenced_updates = sum(sampler.fenced.values())
        result.offset_samples = sum(len(v) for v in sampler.samples.values())
    result.broker_recovery_ms = _recovery_times(cluster.consumer_files, crashes, settings)
    result.key_scope_clients = key_scope
    result.key_scope_records = sum(1 for recs in read_records(cluster.consumer_files) for r in recs
                                   if r["client_id"] in set(key_scope))
    if own_dir and result.ok and not os.environ.get("TRIMQ_CHAOS_KEEP"):
        import shutil

        shutil.rmtree(wd, ignore_errors=True)
    return result


def _dump(wd: Path, events: list[Event], stops: list[Stop], pauses: list[Pause], crashes: list[BrokerCrash],
          sampler: _Sampler | None, async_failovers: list[AsyncFailover]) -> None:
    """What the run did, for a post-mortem of a failed run (``chaos.json`` in the work directory)."""
    data = {
        "events": [e.__dict__ for e in events],
        "stops": [s.__dict__ for s in stops],
        "pauses": [p.__dict__ for p in pauses],
        "broker_crashes": [{**c.__dict__, "persisted": {"/".join(map(str, q)): o for q, o in c.persisted.items()}}
                           for c in crashes],
        "samples": {"/".join(map(str, q)): v for q, v in (sampler.samples if sampler else {}).items()},
        "fenced": {f"{b}#{n}": v for (b, n), v in (sampler.fenced if sampler else {}).items()},
        "async_failovers": [f.__dict__ for f in async_failovers],
    }
    with contextlib.suppress(OSError):
        (wd / "chaos.json").write_text(json.dumps(data))


def rejudge(wd: Path) -> Report:
    """Judge a kept work directory again (``chaos.json`` and the record files) with the checker as it is now: after
    a change to the checker, a failed run's verdict without running it again."""
    data = json.loads((wd / "chaos.json").read_text())

    def queue(name: str) -> tuple[str, str, int]:
        topic, broker, qid = name.rsplit("/", 2)
        return topic, broker, int(qid)

    crashes = [BrokerCrash(c["broker"], c["time_ms"], c["restart_ms"],
                           {queue(q): o for q, o in c["persisted"].items()}) for c in data["broker_crashes"]]
    samples = {queue(q): [(int(t), int(o)) for t, o in v] for q, v in data["samples"].items()}
    key_scope = []
    for log_file in sorted(wd.glob(f"{KEY_SCOPE_SLOT}.*.log")):
        for line in log_file.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                if isinstance(ev, dict) and ev.get("event") == "consumer.cli_started":
                    key_scope.append(str(ev["client_id"]))
    return check([wd / "producer.jsonl"], sorted(wd.glob("c*.jsonl")), stops=[Stop(**s) for s in data["stops"]],
                 pauses=[Pause(**p) for p in data["pauses"]], broker_crashes=crashes, committed_samples=samples,
                 topic=TOPIC, lease_ms=LEASE_MS, key_scope_clients=key_scope,
                 async_failovers=[AsyncFailover(**f) for f in data.get("async_failovers", [])])


def _recovery_times(files: list[Path], crashes: list[BrokerCrash], settings: ChaosSettings
                    ) -> dict[str, list[int | None]]:
    """Per broker SIGKILL: for each of its queues, ms from the kill to the first consumption after it."""
    by_queue: dict[tuple[str, int], list[int]] = defaultdict(list)
    for recs in read_records(files):
        for r in recs:
            by_queue[(str(r["broker"]), int(r["queue_id"]))].append(int(r["consume_time"]))
    for times in by_queue.values():
        times.sort()
    out: dict[str, list[int | None]] = {}
    for c in crashes:
        vals: list[int | None] = []
        for q in range(settings.queues_per_broker):
            after = [t for t in by_queue.get((c.broker, q), []) if t > c.time_ms]
            vals.append(after[0] - c.time_ms if after else None)
        out.setdefault(c.broker, []).extend(vals)
    return out


@contextlib.contextmanager
def _timer() -> Iterator[None]:
    start = time.monotonic()
    yield
    print(f"wall time {time.monotonic() - start:.1f} s", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one seeded trimq chaos scenario.")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("TRIMQ_CHAOS_SEED", "1")))
    ap.add_argument("--long", action="store_true", help="the long schedule (make chaos)")
    ap.add_argument("--async-master", action="store_true",
                    help="broker-a's pair replicates asynchronously (ASYNC_MASTER; the long schedule: LONG_ASYNC)")
    ap.add_argument("--keep", type=Path, help="work directory to keep (default: a temporary one, removed if OK)")
    ap.add_argument("--schedule", action="store_true", help="print the schedule and exit")
    ap.add_argument("--rejudge", type=Path, metavar="DIR", help="judge a kept work directory again and exit")
    args = ap.parse_args(argv)
    if args.rejudge:
        report = rejudge(args.rejudge)
        print(report.text())
        return 0 if report.ok else 1
    settings = LONG if args.long else SHORT
    if args.async_master:
        settings = replace(settings, ha_role="ASYNC_MASTER")
    if args.schedule:
        for e in make_schedule(args.seed, settings):
            print(e)
        return 0
    with _timer():
        result = run_scenario(args.seed, settings, args.keep, log=print)
    print(result.text())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
