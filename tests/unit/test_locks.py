"""RebalanceLockManager: RocketMQ 4.9.3 lock semantics, trimq's additions, and a model-based state machine."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trimq.broker.locks import (
    DEFAULT_LOCK_MAX_LIVE_MS,
    RESTART_GRACE_OWNER,
    LockInfo,
    LockOutcome,
    RebalanceLockManager,
    make_epoch,
    split_epoch,
    wall_clock_ms,
)
from trimq.protocol.message_queue import MessageQueue

G = "orderly_group"
MAX = 60_000
MQ0 = MessageQueue("T", "broker-a", 0)
MQ1 = MessageQueue("T", "broker-a", 1)
MQ2 = MessageQueue("T", "broker-a", 2)
MQ3 = MessageQueue("T", "broker-b", 0)


class FakeClock:
    """Injected clock: the test moves time by hand."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def mgr(clock: FakeClock) -> RebalanceLockManager:
    return RebalanceLockManager(max_live_ms=MAX, now_ms=clock)


def owner_and_ts(mgr: RebalanceLockManager, group: str, mq: MessageQueue) -> tuple[str, int] | None:
    for info in mgr.lock_table(group):
        if info.mq == mq:
            return info.client_id, info.last_update_timestamp
    return None


# ---------------------------------------------------------------------------------------------- try_lock


def test_defaults() -> None:
    m = RebalanceLockManager()
    assert m.max_live_ms == DEFAULT_LOCK_MAX_LIVE_MS == 60_000
    assert isinstance(wall_clock_ms(), int) and wall_clock_ms() > 1_600_000_000_000


def test_free_queue_is_locked(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    assert mgr.try_lock(G, MQ0, "A") is True
    assert owner_and_ts(mgr, G, MQ0) == ("A", clock.now)
    assert mgr.stats.acquired == 1
    assert mgr.groups() == [G]


def test_same_client_renews(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(G, MQ0, "A")
    clock.advance(30_000)
    assert mgr.try_lock_detailed(G, MQ0, "A") is LockOutcome.RENEWED
    assert owner_and_ts(mgr, G, MQ0) == ("A", clock.now)
    assert (mgr.stats.acquired, mgr.stats.renewed) == (1, 1)


def test_other_live_client_is_refused(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(G, MQ0, "A")
    before = owner_and_ts(mgr, G, MQ0)
    clock.advance(1)
    assert mgr.try_lock(G, MQ0, "B") is False
    assert owner_and_ts(mgr, G, MQ0) == before  # a refused attempt touches nothing
    assert mgr.stats.refused == 1


def test_exactly_max_live_is_still_live(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(G, MQ0, "A")
    clock.advance(MAX)
    assert mgr.try_lock(G, MQ0, "B") is False  # expiry is strictly greater than max_live
    assert mgr.live_owner(G, MQ0) == "A"
    clock.advance(1)
    assert mgr.live_owner(G, MQ0) is None
    assert mgr.try_lock(G, MQ0, "B") is True


def test_expired_lock_is_stolen(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(G, MQ0, "A")
    clock.advance(MAX + 1)
    assert mgr.try_lock_detailed(G, MQ0, "B") is LockOutcome.STOLEN
    assert owner_and_ts(mgr, G, MQ0) == ("B", clock.now)
    assert mgr.stats.stolen == 1
    assert mgr.try_lock(G, MQ0, "A") is False  # the old owner is now the outsider


def test_own_expired_lock_is_reacquired_not_stolen(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(G, MQ0, "A")
    clock.advance(MAX + 1)
    assert mgr.try_lock_detailed(G, MQ0, "A") is LockOutcome.ACQUIRED
    assert (mgr.stats.acquired, mgr.stats.stolen, mgr.stats.renewed) == (2, 0, 0)
    assert owner_and_ts(mgr, G, MQ0) == ("A", clock.now)


def test_groups_are_independent(mgr: RebalanceLockManager) -> None:
    assert mgr.try_lock("g1", MQ0, "A")
    assert mgr.try_lock("g2", MQ0, "B")
    assert mgr.live_owner("g1", MQ0) == "A"
    assert mgr.live_owner("g2", MQ0) == "B"
    assert mgr.groups() == ["g1", "g2"]


def test_outcome_locked_flag() -> None:
    assert [o.locked for o in LockOutcome] == [True, True, True, False]


# ---------------------------------------------------------------------------------------------- batch


def test_batch_all_free(mgr: RebalanceLockManager) -> None:
    assert mgr.try_lock_batch(G, [MQ0, MQ1, MQ2], "A") == {MQ0, MQ1, MQ2}
    assert mgr.stats.acquired == 3


def test_batch_all_held_by_other(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock_batch(G, {MQ0, MQ1}, "A")
    clock.advance(10)
    result = mgr.try_lock_batch_detailed(G, [MQ0, MQ1], "B")
    assert result.locked == set()
    assert result.refused == {MQ0: "A", MQ1: "A"}
    assert mgr.try_lock_batch(G, [MQ0, MQ1], "B") == set()
    assert mgr.stats.refused == 4


def test_batch_mixed(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(G, MQ0, "A")  # will be stolen by B
    mgr.try_lock(G, MQ2, "B")  # B's own, renewed
    clock.advance(MAX + 1)
    mgr.try_lock(G, MQ1, "A")  # A's live lock, refused to B
    mgr.try_lock(G, MQ2, "B")
    result = mgr.try_lock_batch_detailed(G, [MQ0, MQ1, MQ2, MQ3], "B")
    assert result.locked == {MQ0, MQ2, MQ3}
    assert result.acquired == [MQ3]
    assert result.renewed == [MQ2]
    assert result.stolen == {MQ0: "A"}
    assert result.refused == {MQ1: "A"}
    assert mgr.live_owner(G, MQ1) == "A"


def test_batch_matches_single_locks(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(G, MQ1, "A")
    assert mgr.try_lock_batch(G, [MQ0, MQ1], "B") == {MQ0}


def test_batch_duplicates_and_empty(mgr: RebalanceLockManager) -> None:
    assert mgr.try_lock_batch(G, [MQ0, MQ0, MQ0], "A") == {MQ0}
    assert mgr.stats.acquired == 1 and mgr.stats.renewed == 0
    assert mgr.try_lock_batch("other", [], "A") == set()
    assert mgr.groups() == [G]  # an empty batch creates no group


def test_batch_uses_one_timestamp(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock_batch(G, [MQ0, MQ1, MQ2], "A")
    assert {info.last_update_timestamp for info in mgr.lock_table(G)} == {clock.now}


# ---------------------------------------------------------------------------------------------- unlock


def test_unlock_by_owner(mgr: RebalanceLockManager) -> None:
    mgr.try_lock_batch(G, [MQ0, MQ1], "A")
    mgr.unlock_batch(G, [MQ0], "A")
    assert mgr.live_owner(G, MQ0) is None
    assert mgr.live_owner(G, MQ1) == "A"
    assert mgr.try_lock(G, MQ0, "B") is True  # freed at once
    assert mgr.stats.unlocked == 1


def test_unlock_by_non_owner_is_ignored(mgr: RebalanceLockManager) -> None:
    mgr.try_lock(G, MQ0, "A")
    result = mgr.unlock_batch_detailed(G, [MQ0], "B")
    assert result.refused == {MQ0: "A"} and result.unlocked == []
    assert mgr.live_owner(G, MQ0) == "A"
    assert mgr.stats.unlock_refused == 1


def test_unlock_by_owner_after_expiry(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(G, MQ0, "A")
    clock.advance(10 * MAX)
    assert mgr.unlock_batch_detailed(G, [MQ0], "A").unlocked == [MQ0]  # expiry is not considered
    assert mgr.lock_table(G) == []


def test_unlock_non_owner_of_expired_lock_is_still_refused(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(G, MQ0, "A")
    clock.advance(10 * MAX)
    mgr.unlock_batch(G, [MQ0], "B")
    assert owner_and_ts(mgr, G, MQ0) is not None


def test_unlock_unknown_group_and_unlocked_queue(mgr: RebalanceLockManager) -> None:
    mgr.unlock_batch(G, [MQ0], "A")  # unknown group: ignored, no error
    assert mgr.unlock_batch_detailed(G, [MQ0, MQ1], "A").not_locked == [MQ0, MQ1]
    mgr.try_lock(G, MQ0, "A")
    assert mgr.unlock_batch_detailed(G, [MQ0, MQ1], "A").not_locked == [MQ1]
    assert mgr.stats.unlock_not_locked == 4
    assert mgr.groups() == []  # the emptied group disappears


def test_unlock_all_for_client(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock_batch(G, [MQ2, MQ0], "A")
    mgr.try_lock(G, MQ1, "B")
    mgr.try_lock("other", MQ0, "A")
    clock.advance(MAX + 5)
    mgr.try_lock(G, MQ3, "A")
    assert mgr.unlock_all_for_client(G, "A") == [MQ0, MQ2, MQ3]  # live and expired, sorted
    assert [info.mq for info in mgr.lock_table(G)] == [MQ1]
    assert mgr.lock_table("other")[0].client_id == "A"  # other groups untouched
    assert mgr.stats.unlocked == 3
    assert mgr.unlock_all_for_client(G, "A") == []
    assert mgr.unlock_all_for_client("nobody-group", "A") == []
    mgr.unlock_all_for_client(G, "B")
    assert mgr.groups() == ["other"]


# ---------------------------------------------------------------------------------------------- checks


def test_is_lock_all_expired(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    assert mgr.is_lock_all_expired("unknown") is True
    mgr.try_lock(G, MQ0, "A")
    assert mgr.is_lock_all_expired(G) is False
    clock.advance(MAX // 2)
    mgr.try_lock(G, MQ1, "B")
    clock.advance(MAX // 2 + 1)  # MQ0 expired, MQ1 live
    assert mgr.is_lock_all_expired(G) is False
    clock.advance(MAX // 2)
    assert mgr.is_lock_all_expired(G) is True


def test_is_locked_renews_for_owner(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    mgr.try_lock(G, MQ0, "A")
    clock.advance(50_000)
    assert mgr.is_locked(G, MQ0, "A") is True
    assert owner_and_ts(mgr, G, MQ0) == ("A", clock.now)
    clock.advance(50_000)  # 100 s after the lock, 50 s after the renewal
    assert mgr.try_lock(G, MQ0, "B") is False
    assert mgr.stats.renewed == 1


def test_is_locked_false_cases_do_not_renew(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    assert mgr.is_locked(G, MQ0, "A") is False
    mgr.try_lock(G, MQ0, "A")
    locked_at = clock.now
    clock.advance(10)
    assert mgr.is_locked(G, MQ0, "B") is False
    assert owner_and_ts(mgr, G, MQ0) == ("A", locked_at)
    clock.advance(MAX)
    assert mgr.is_locked(G, MQ0, "A") is False  # expired: no renewal
    assert owner_and_ts(mgr, G, MQ0) == ("A", locked_at)


def test_live_owner_does_not_renew(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    assert mgr.live_owner(G, MQ0) is None
    mgr.try_lock(G, MQ0, "A")
    locked_at = clock.now
    for _ in range(3):
        clock.advance(MAX // 3)
        assert mgr.live_owner(G, MQ0) == "A"
    assert owner_and_ts(mgr, G, MQ0) == ("A", locked_at)
    clock.advance(1)
    assert mgr.live_owner(G, MQ0) is None
    assert mgr.try_lock(G, MQ0, "B") is True


def test_is_fenced(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    assert mgr.is_fenced(G, MQ0, "B") is False  # unlocked queue: concurrent consumers never lock
    mgr.try_lock(G, MQ0, "A")
    assert mgr.is_fenced(G, MQ0, "A") is False
    assert mgr.is_fenced(G, MQ0, "B") is True
    clock.advance(MAX + 1)
    assert mgr.is_fenced(G, MQ0, "B") is False


def test_lock_table_and_counts(mgr: RebalanceLockManager, clock: FakeClock) -> None:
    t0 = clock.now
    mgr.try_lock(G, MQ1, "A")
    clock.advance(MAX)
    mgr.try_lock(G, MQ0, "B")
    clock.advance(1)
    assert mgr.lock_table(G) == [
        LockInfo(MQ0, "B", t0 + MAX, 1, False, epoch=1),
        LockInfo(MQ1, "A", t0, MAX + 1, True, epoch=1),
    ]
    assert mgr.lock_table("unknown") == []
    assert mgr.live_lock_count(G) == 1
    mgr.try_lock("g2", MQ0, "C")
    assert mgr.live_lock_count() == 2
    assert mgr.live_lock_count("unknown") == 0


def test_stats_as_dict(mgr: RebalanceLockManager) -> None:
    mgr.try_lock(G, MQ0, "A")
    assert mgr.stats.as_dict() == {
        "acquired": 1,
        "renewed": 0,
        "stolen": 0,
        "refused": 0,
        "unlocked": 0,
        "unlock_refused": 0,
        "unlock_not_locked": 0,
        "claimed": 0,
        "released_on_disconnect": 0,
    }


@pytest.mark.parametrize("bad", [-1, 1.5, "60000", True])
def test_bad_max_live(bad: object) -> None:
    with pytest.raises(ValueError, match="max_live_ms"):
        RebalanceLockManager(max_live_ms=bad)  # type: ignore[arg-type]


def test_bad_arguments(mgr: RebalanceLockManager) -> None:
    with pytest.raises(ValueError, match="group"):
        mgr.try_lock("", MQ0, "A")
    with pytest.raises(ValueError, match="client_id"):
        mgr.try_lock_batch(G, [MQ0], "")
    with pytest.raises(ValueError, match="client_id"):
        mgr.unlock_all_for_client(G, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="MessageQueue"):
        mgr.try_lock_batch(G, [MQ0, ("T", "b", 1)], "A")  # type: ignore[list-item]
    with pytest.raises(TypeError, match="MessageQueue"):
        mgr.unlock_batch(G, ["T"], "A")  # type: ignore[list-item]
    assert mgr.groups() == []  # a rejected batch changes nothing


def test_zero_max_live(clock: FakeClock) -> None:
    m = RebalanceLockManager(max_live_ms=0, now_ms=clock)
    m.try_lock(G, MQ0, "A")
    assert m.try_lock(G, MQ0, "B") is False  # same millisecond: age 0 is not > 0
    clock.advance(1)
    assert m.try_lock(G, MQ0, "B") is True


# ---------------------------------------------------------------------------------------------- model-based


SM_MAX = 10
SM_GROUPS = ["g1", "g2"]
SM_MQS = [MessageQueue("T", "b", i) for i in range(3)]
SM_CLIENTS = ["c1", "c2", "c3"]

groups_st = st.sampled_from(SM_GROUPS)
mq_st = st.sampled_from(SM_MQS)
client_st = st.sampled_from(SM_CLIENTS)


class LockMachine(RuleBasedStateMachine):
    """Random lock / batch / unlock / renew / leave / advance-time sequences against a reference model.

    Besides matching the model answer for answer, it checks the safety property from the callers' side:
    a client that was told "you hold it" at time t believes so until t + max_live; at no instant may two
    clients hold such a belief for the same queue of a group.
    """

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0)
        self.mgr = RebalanceLockManager(max_live_ms=SM_MAX, now_ms=self.clock)
        self.model: dict[tuple[str, MessageQueue], tuple[str, int]] = {}
        self.beliefs: dict[tuple[str, MessageQueue], dict[str, int]] = {}
        self.counts = dict.fromkeys(self.mgr.stats.as_dict(), 0)

    # --- reference model: the rules of ROCKETMQ_FACTS §3 written as plainly as possible

    def _model_lock(self, group: str, mq: MessageQueue, client: str) -> bool:
        now = self.clock.now
        entry = self.model.get((group, mq))
        if entry is not None and entry[0] != client and now - entry[1] <= SM_MAX:
            self.counts["refused"] += 1
            return False
        if entry is None or (entry[0] == client and now - entry[1] > SM_MAX):
            self.counts["acquired"] += 1
        elif entry[0] == client:
            self.counts["renewed"] += 1
        else:
            self.counts["stolen"] += 1
        self.model[(group, mq)] = (client, now)
        self.beliefs.setdefault((group, mq), {})[client] = now
        return True

    def _model_unlock(self, group: str, mq: MessageQueue, client: str) -> None:
        entry = self.model.get((group, mq))
        if entry is None:
            self.counts["unlock_not_locked"] += 1
        elif entry[0] == client:
            del self.model[(group, mq)]
            self.beliefs.get((group, mq), {}).pop(client, None)
            self.counts["unlocked"] += 1
        else:
            self.counts["unlock_refused"] += 1

    # --- rules

    @rule(ms=st.sampled_from([0, 1, SM_MAX - 1, SM_MAX, SM_MAX + 1, 3 * SM_MAX]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(group=groups_st, mq=mq_st, client=client_st)
    def try_lock(self, group: str, mq: MessageQueue, client: str) -> None:
        assert self.mgr.try_lock(group, mq, client) == self._model_lock(group, mq, client)

    @rule(group=groups_st, mqs=st.lists(mq_st, max_size=4), client=client_st)
    def try_lock_batch(self, group: str, mqs: list[MessageQueue], client: str) -> None:
        expected = {mq for mq in dict.fromkeys(mqs) if self._model_lock(group, mq, client)}
        assert self.mgr.try_lock_batch(group, mqs, client) == expected

    @rule(group=groups_st, mqs=st.lists(mq_st, max_size=4), client=client_st)
    def unlock_batch(self, group: str, mqs: list[MessageQueue], client: str) -> None:
        self.mgr.unlock_batch(group, mqs, client)
        for mq in dict.fromkeys(mqs):
            self._model_unlock(group, mq, client)

    @rule(group=groups_st, mq=mq_st, client=client_st)
    def is_locked(self, group: str, mq: MessageQueue, client: str) -> None:
        entry = self.model.get((group, mq))
        expected = entry is not None and entry[0] == client and self.clock.now - entry[1] <= SM_MAX
        if expected:
            self.model[(group, mq)] = (client, self.clock.now)
            self.beliefs[(group, mq)][client] = self.clock.now
            self.counts["renewed"] += 1
        assert self.mgr.is_locked(group, mq, client) == expected

    @rule(group=groups_st, client=client_st)
    def leave(self, group: str, client: str) -> None:
        expected = sorted(mq for (g, mq), (owner, _) in self.model.items() if g == group and owner == client)
        for mq in expected:
            self._model_unlock(group, mq, client)
        assert self.mgr.unlock_all_for_client(group, client) == expected

    # --- invariants

    @invariant()
    def table_matches_model(self) -> None:
        actual = {
            (group, info.mq): (info.client_id, info.last_update_timestamp)
            for group in self.mgr.groups()
            for info in self.mgr.lock_table(group)
        }
        assert actual == self.model
        assert self.mgr.stats.as_dict() == self.counts

    @invariant()
    def never_two_live_holders(self) -> None:
        now = self.clock.now
        for group in SM_GROUPS:
            for mq in SM_MQS:
                holders = [c for c, t in self.beliefs.get((group, mq), {}).items() if now - t <= SM_MAX]
                assert len(holders) <= 1, (group, mq, holders)
                assert self.mgr.live_owner(group, mq) == (holders[0] if holders else None)
                live = [c for c in SM_CLIENTS if self.mgr.is_fenced(group, mq, c) is False]
                assert len(live) == (1 if holders else len(SM_CLIENTS))

    @invariant()
    def all_expired_agrees(self) -> None:
        now = self.clock.now
        for group in SM_GROUPS:
            live = any(g == group and now - t <= SM_MAX for (g, _), (_, t) in self.model.items())
            assert self.mgr.is_lock_all_expired(group) is (not live)


LockMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestLockMachine = LockMachine.TestCase


def test_a_closed_connection_releases_the_clients_locks_after_the_grace_unless_it_renews() -> None:
    # Semantics changed with issue 14: orphan_client (32 s after the last renewal) became release_client_after
    # (a short grace from the disconnect; docs/PROTOCOL.md "Queue-lock leases").
    clock = FakeClock()
    m = RebalanceLockManager(max_live_ms=2_000, now_ms=clock, takeover_margin_ms=400)
    assert m.try_lock("g", MQ0, "c1") and m.try_lock("g2", MQ1, "c1") and m.try_lock("g", MQ1, "c2")
    assert sorted(m.release_client_after("c1", 300)) == [("g", MQ0), ("g2", MQ1)]
    clock.advance(100)
    assert m.release_client_after("c1", 5_000) == [("g", MQ0), ("g2", MQ1)]  # never later than already set
    assert [i.releasing for i in m.lock_table("g")] == [True, False]
    clock.advance(200)
    assert not m.try_lock("g", MQ0, "c3")  # exactly at the end of the grace: still c1's
    clock.advance(1)
    assert m.try_lock_detailed("g", MQ0, "c3") is LockOutcome.STOLEN  # released 0.3 s after the disconnect
    assert m.live_owner("g", MQ1) == "c2"  # other clients' locks untouched
    m.release_client_after("c2", 300)
    clock.advance(200)
    assert m.try_lock("g", MQ1, "c2")  # it reconnected and renewed in time: the lock is its own again, full lease
    clock.advance(2_400)
    assert m.live_owner("g", MQ1) == "c2"
    assert m.drop_released() == [("g2", MQ1, "c1")]  # tidied; the taken-over entry is c3's now
    assert m.stats.released_on_disconnect == 3
    with pytest.raises(ValueError):
        m.release_client_after("c2", -1)


# ---------------------------------------------------------------------------------------------- leases (issue 14)


def test_takeover_only_after_lease_plus_margin_and_the_owner_renews_meanwhile() -> None:
    clock = FakeClock(0)
    m = RebalanceLockManager(max_live_ms=2_000, now_ms=clock, takeover_margin_ms=400)
    assert m.max_live_ms == 2_000 and m.takeover_after_ms == 2_400
    assert m.try_lock(G, MQ0, "A")
    clock.advance(2_400)  # the holder's lease (2 s from its send) is over, the margin is not
    assert not m.try_lock(G, MQ0, "B")
    assert m.live_owner(G, MQ0) == "A"
    r = m.try_lock_batch_detailed(G, [MQ0], "A")  # a late renewal inside the margin: still continuous
    assert r.renewed == [MQ0] and r.kept == {MQ0}
    clock.advance(2_401)
    assert m.try_lock_detailed(G, MQ0, "B") is LockOutcome.STOLEN


def test_epochs_grow_per_queue_with_each_new_holder_and_renewals_keep_them() -> None:
    clock = FakeClock(0)
    m = RebalanceLockManager(max_live_ms=1_000, now_ms=clock, broker_epoch=7)
    r = m.try_lock_batch_detailed(G, [MQ0, MQ1], "A")
    assert r.epochs == {MQ0: make_epoch(7, 1), MQ1: make_epoch(7, 1)} and make_epoch(7, 1) == (7 << 32) | 1
    assert m.try_lock_batch_detailed(G, [MQ0], "A").epochs == {MQ0: make_epoch(7, 1)}  # renewal
    clock.advance(1_001)
    assert m.try_lock_batch_detailed(G, [MQ0], "A").epochs == {MQ0: make_epoch(7, 1)}  # own lapsed: continuous
    clock.advance(1_001)
    assert m.try_lock_batch_detailed(G, [MQ0], "B").epochs == {MQ0: make_epoch(7, 2)}  # taken over
    m.unlock_batch(G, [MQ0], "B")
    assert m.current_epoch(G, MQ0) == make_epoch(7, 2)  # kept after the unlock (fencing)
    assert m.try_lock_batch_detailed(G, [MQ0], "B").epochs == {MQ0: make_epoch(7, 3)}  # a new grant
    assert m.current_epoch(G, MQ2) is None and m.current_epoch("other", MQ0) is None
    assert split_epoch(make_epoch(7, 3)) == (7, 3)
    # A restarted broker (a higher broker epoch, counters from 1) still grants higher epochs than before.
    m2 = RebalanceLockManager(max_live_ms=1_000, now_ms=clock, broker_epoch=8)
    assert m2.try_lock_batch_detailed(G, [MQ0], "C").epochs[MQ0] > make_epoch(7, 3)
    with pytest.raises(ValueError):
        RebalanceLockManager(broker_epoch=-1)


def test_restart_grace_keeps_free_queues_for_their_claimants_until_the_longest_lease_has_passed() -> None:
    clock = FakeClock(0)
    m = RebalanceLockManager(max_live_ms=2_000, now_ms=clock, takeover_margin_ms=400, broker_epoch=2)
    m.begin_restart_grace(2_400)
    assert m.in_restart_grace()
    r = m.try_lock_batch_detailed(G, [MQ0, MQ1], "B")  # nobody claimed them: B must wait out old leases
    assert r.locked == set() and r.refused == {MQ0: RESTART_GRACE_OWNER, MQ1: RESTART_GRACE_OWNER}
    assert m.groups() == []
    old = make_epoch(1, 5)
    r = m.try_lock_batch_detailed(G, [MQ0], "A", claims={MQ0: old})  # A's lease from before the restart
    assert r.locked == {MQ0} and r.kept == {MQ0} and r.claimed == [MQ0] and r.epochs[MQ0] > old
    assert m.stats.claimed == 1
    assert not m.try_lock(G, MQ0, "B")  # held by its claimant now, as any live lock
    clock.advance(2_400)
    assert m.in_restart_grace() and not m.try_lock(G, MQ1, "B")  # the grace ends strictly after 2.4 s
    clock.advance(1)
    assert not m.in_restart_grace()
    r = m.try_lock_batch_detailed(G, [MQ1], "B", claims={MQ1: old})  # after the grace a claim changes nothing
    assert r.acquired == [MQ1] and r.kept == set() and r.claimed == []


