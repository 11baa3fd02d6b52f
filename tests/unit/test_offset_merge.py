"""Consumer offsets of a master and its slave merged by commit version (issue 15 part 2; pure).

Each broker is a ConsumerOffsetManager with its own injected wall clock; "syncs" move their tables through the
wire form (encode / GET_ALL_CONSUMER_OFFSET body) as the brokers do."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.broker.store import offsets as offsets_module
from trimq.broker.store.offset_merge import (
    CommitVersion,
    decode_table,
    encode_versions,
    merge_and_hand_back,
    merge_by_commit_version,
    merge_tables,
)
from trimq.broker.store.offsets import ConsumerOffsetManager

G, T = "g", "T"
KEY = f"{T}@{G}"


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def pair() -> tuple[ConsumerOffsetManager, ConsumerOffsetManager, Clock]:
    clock = Clock(1_000_000)
    return ConsumerOffsetManager(now_ms=clock), ConsumerOffsetManager(now_ms=clock), clock


def sync(master: ConsumerOffsetManager, slave: ConsumerOffsetManager) -> dict | None:
    """One metadata sync round: the slave merges the master's table, then hands back what is newer on it."""
    _, push = merge_and_hand_back(slave, master.encode())
    if push is not None:
        merge_by_commit_version(master, push)
    return push


def commit(om: ConsumerOffsetManager, qid: int, offset: int, **kw: object) -> None:
    assert om.commit_offset(G, T, qid, offset, "c", source="update", **kw)  # type: ignore[arg-type]


def test_offsets_committed_on_the_slave_while_the_master_was_away_survive_its_return() -> None:
    master, slave, clock = pair()
    commit(master, 0, 100)
    commit(master, 1, 50)
    assert sync(master, slave) is None  # nothing of the slave's own yet
    assert slave.query_offset(G, T, 0) == 100 and not slave.local_changes
    clock.ms += 500
    commit(master, 0, 120)  # committed after the last sync: the slave never sees it, then the master dies
    clock.ms += 2_000
    commit(slave, 0, 110)  # consumers now read from the slave and commit there
    commit(slave, 1, 80)
    # the master is back with its old table: the slave keeps its newer commits and hands them over
    push = sync(master, slave)
    assert push is not None and push["offsetTable"] == {KEY: {"0": 110, "1": 80}}
    assert (slave.query_offset(G, T, 0), slave.query_offset(G, T, 1)) == (110, 80)
    # ... even where the master's stale offset (120) is larger: newer, not larger, wins
    assert (master.query_offset(G, T, 0), master.query_offset(G, T, 1)) == (110, 80)
    # handed over: no longer the slave's to push
    assert sync(master, slave) is None and not slave.local_changes


def test_a_commit_on_the_returned_master_wins_over_the_slaves_older_one() -> None:
    master, slave, clock = pair()
    commit(slave, 0, 10)
    clock.ms += 1
    commit(master, 0, 30)
    sync(master, slave)
    assert slave.query_offset(G, T, 0) == 30 and master.query_offset(G, T, 0) == 30


def test_an_admin_reset_backwards_is_not_undone_by_a_larger_offset() -> None:
    master, slave, clock = pair()
    commit(master, 0, 500)
    sync(master, slave)
    clock.ms += 1_000
    commit(slave, 0, 600)  # while the master is away (then it returns)
    clock.ms += 1
    gen = master.bump_reset_generation(G, T)  # an operator resets the group back to 5 ...
    master.reset_offset(G, T, 0, 5)
    clock.ms -= 10_000  # ... on a master whose clock is behind the slave's: the generation still decides
    sync(master, slave)
    assert slave.query_offset(G, T, 0) == 5 and master.query_offset(G, T, 0) == 5
    assert slave.reset_generation(G, T) == gen
    # a commit made before the reset is refused on the slave too now
    assert not slave.commit_offset(G, T, 0, 601, "c", source="update", reset_generation=gen - 1)


def test_a_commit_carrying_a_reset_the_slave_has_not_synced_yet_outranks_the_old_generation() -> None:
    master, slave, clock = pair()
    commit(master, 0, 500)
    sync(master, slave)
    gen = master.bump_reset_generation(G, T)
    master.reset_offset(G, T, 0, 5)
    clock.ms += 100
    commit(slave, 0, 7, reset_generation=gen)  # the member learned the reset from the master, then it died
    assert slave.commit_version(G, T, 0)[0] == gen
    sync(master, slave)
    assert master.query_offset(G, T, 0) == 7 and slave.query_offset(G, T, 0) == 7


def test_a_queue_only_one_side_has_is_taken_and_a_new_group_on_the_slave_reaches_the_master() -> None:
    master, slave, _ = pair()
    commit(master, 3, 9)
    commit(slave, 2, 4)  # a group that first consumed while the master was away
    push = sync(master, slave)
    assert push is not None and push["offsetTable"] == {KEY: {"2": 4}}
    assert master.queue_offsets(G, T) == {2: 4, 3: 9} == slave.queue_offsets(G, T)


def test_tables_without_versions_merge_as_rocketmqs_overwrite() -> None:
    slave = ConsumerOffsetManager()
    merge_by_commit_version(slave, {"offsetTable": {KEY: {"0": 7}}})
    assert slave.query_offset(G, T, 0) == 7 and not slave.local_changes
    merge_by_commit_version(slave, {"offsetTable": {KEY: {"0": 3}}})  # same (unknown) version: the master's value
    assert slave.query_offset(G, T, 0) == 3
    assert merge_and_hand_back(slave, {"offsetTable": {KEY: {"0": 3}}}) == (0, None)


def test_the_versions_survive_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    clock = Clock(5_000)
    path = str(tmp_path / "consumerOffset.json")
    om = ConsumerOffsetManager(path, now_ms=clock)
    commit(om, 0, 1)
    om.persist()
    again = ConsumerOffsetManager(path, now_ms=clock)
    again.load()
    assert again.commit_version(G, T, 0) == om.commit_version(G, T, 0) == (0, 0, 5_000)
    commit(again, 0, 2, lock_epoch=7)  # the clock did not move: the sequence still grows
    assert again.commit_version(G, T, 0) == (0, 7, 5_001)
    again.persist()
    doc = again.encode()  # versions stay two numbers (what brokers before lock epochs read), the epoch beside them
    assert doc["commitVersionTable"] == {KEY: {"0": [0, 5_001]}} and doc["commitLockEpochTable"] == {KEY: {"0": 7}}
    third = ConsumerOffsetManager(path, now_ms=clock)
    third.load()
    assert third.commit_version(G, T, 0) == (0, 7, 5_001)  # the lock epoch too


def test_decode_skips_malformed_entries_and_merge_tables_is_pure() -> None:
    body = {"offsetTable": {KEY: {"0": 1, "x": 2, "1": -1, "2": True}, "nogroup": {"0": 1}},
            "commitVersionTable": {KEY: {"0": [1, 9], "3": "bad"}}, "resetGenerationTable": {KEY: 1, "bad": -1}}
    table = decode_table(body)
    assert table.entries == {(KEY, 0): (1, (1, 0, 9))} and table.generations == {KEY: 1}
    with_epochs = {"offsetTable": {KEY: {"0": 1, "1": 2}}, "commitVersionTable": {KEY: {"0": [1, 9], "1": [0, 3]}},
                   "commitLockEpochTable": {KEY: {"0": 4, "1": -1}}}
    assert decode_table(with_epochs).entries == {(KEY, 0): (1, (1, 4, 9)), (KEY, 1): (2, (0, 0, 3))}
    local = {(KEY, 0): (5, CommitVersion(1, 0, 10)), (KEY, 1): (6, CommitVersion(0, 0, 3))}
    result = merge_tables(local, table.entries, {(KEY, 0), (KEY, 1)})
    assert result.adopted == [] and result.newer_here == [(KEY, 0), (KEY, 1)]


def test_a_restarted_slave_still_hands_over_its_newer_commits_but_never_revives_a_deleted_group() -> None:
    master, slave, clock = pair()
    commit(master, 0, 10)
    sync(master, slave)
    clock.ms += 1_000
    commit(slave, 0, 20)  # while the master is away
    commit(slave, 5, 1)  # a queue the master does not have
    slave.local_changes.clear()  # (a restart: what was local is no longer known as such)
    push = sync(master, slave)
    assert push is not None and push["offsetTable"] == {KEY: {"0": 20}}  # newer: only a commit here makes it so
    assert master.query_offset(G, T, 0) == 20 and master.query_offset(G, T, 5) == -1



def test_a_commit_under_an_older_lock_grant_loses_to_the_new_holders_though_made_later() -> None:
    """Chaos seed 87: an ex-holder woken while its master was away committed its old position to the slave under
    its old epoch, later than the new holder's commits on the master; handed over, it rewound the queue."""
    master, slave, clock = pair()
    commit(master, 0, 10, lock_epoch=1)
    sync(master, slave)
    commit(master, 0, 20, lock_epoch=2)  # the new holder, after the slave's last sync
    clock.ms += 5_000
    commit(slave, 0, 12, lock_epoch=1)  # the slave knows no grant newer than 1: taken
    assert slave.commit_version(G, T, 0) > slave.commit_version(G, T, 1)
    push = sync(master, slave)
    assert push is None  # nothing newer to hand over: the master's commit is under a newer grant
    assert master.query_offset(G, T, 0) == 20 == slave.query_offset(G, T, 0)
    # and now the slave knows epoch 2: the ex-holder is refused there as on the master
    assert not slave.commit_offset(G, T, 0, 13, "c", source="update", lock_epoch=1)
    assert slave.fenced_updates[G] == 1


def test_a_commit_without_an_epoch_keeps_the_queues_lock_epoch_and_the_current_holder_still_wins_by_time() -> None:
    master, slave, clock = pair()
    commit(master, 0, 10, lock_epoch=2)
    sync(master, slave)
    clock.ms += 1_000
    commit(slave, 0, 15, lock_epoch=2)  # the holder itself, while the master is away: newer, handed over
    commit(slave, 1, 3)  # no epoch (a concurrent group's commit): judged by the clock alone
    assert slave.commit_version(G, T, 0) == (0, 2, 1_001_000)
    assert sync(master, slave) is not None
    assert master.query_offset(G, T, 0) == 15 and master.query_offset(G, T, 1) == 3
    commit(master, 0, 16)  # a commit with no epoch (a pull's) keeps the high-water mark
    assert master.commit_version(G, T, 0).lock_epoch == 2
    assert master.max_lock_epoch() == 2


def test_the_changes_since_a_serial_hold_what_changed_after_it_and_merge_like_the_whole_table() -> None:
    master, slave, clock = pair()
    for q in range(4):
        commit(master, q, 10 + q)
    sync(master, slave)
    seen = master.change_serial
    assert master.encode_changes(seen) == {"offsetTable": {}}
    clock.ms += 5
    commit(master, 2, 20)
    master.bump_reset_generation(G, "Other")
    changes = master.encode_changes(seen)
    assert changes["offsetTable"] == {KEY: {"2": 20}}
    assert changes["commitVersionTable"] == {KEY: {"2": list(master.commit_version(G, T, 2)[::2])}}
    assert changes["resetGenerationTable"] == {f"Other@{G}": 1}
    merge_by_commit_version(slave, changes)
    assert slave.entries() == master.entries()
    assert slave.reset_generations() == master.reset_generations()
    # a merge on the master (a slave handing back) is a change too, and so is a raised generation
    seen = master.change_serial
    master.merge_entry(KEY, 3, 40, CommitVersion(0, 0, clock.ms + 10))
    assert master.merge_reset_generation(KEY, 2)
    changes = master.encode_changes(seen)
    assert changes["offsetTable"] == {KEY: {"3": 40}} and changes["resetGenerationTable"] == {KEY: 2}
    # removed offsets leave the changes, and the removal is one, stamped as the queue's next commit would be
    versions = {q: master.commit_version(G, T, q) for q in range(4)}
    seen = master.change_serial
    clock.ms += 7
    assert master.remove_offsets(G, T) == 4
    changes = master.encode_changes(seen)
    assert changes == {"offsetTable": {}, "removedOffsetTable": {
        KEY: {str(q): [v.generation, v.lock_epoch, max(v.sequence + 1, clock.ms)] for q, v in versions.items()}}}
    assert master.encode_changes(0)["offsetTable"] == {}


_OPS = st.lists(st.tuples(st.sampled_from(["commit", "merge", "bump", "raise", "remove"]),
                          st.integers(0, 5), st.sampled_from([T, "Other"])), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS)
def test_the_changes_since_any_serial_are_exactly_those_made_after_it(ops: list[tuple[str, int, str]]) -> None:
    """encode_changes reads the changes back from the end of a table kept in serial order: after any mix of
    commits, merges, reset generations and removals, every serial's answer holds exactly the queues and generations
    last changed after it (the order broken, the read stops early and drops some)."""
    clock = Clock(1_000_000)
    om = ConsumerOffsetManager(now_ms=clock)
    last_change: dict[tuple[str, int], int] = {}  # the test's own record: queue -> serial of its last change
    last_raise: dict[str, int] = {}
    last_removal: dict[tuple[str, int], int] = {}  # queue -> serial of its removal, while it stays removed
    for n, (op, qid, topic) in enumerate(ops):
        clock.ms += 1
        key = f"{topic}@{G}"
        if op == "commit":
            assert om.commit_offset(G, topic, qid, 10 + n, "c", source="update")
            last_change[(key, qid)] = om.change_serial
            last_removal.pop((key, qid), None)
        elif op == "merge":
            om.merge_entry(key, qid, 5 + n, CommitVersion(0, 0, clock.ms + 10))
            last_change[(key, qid)] = om.change_serial
            last_removal.pop((key, qid), None)
        elif op == "bump":
            om.bump_reset_generation(G, topic)
            last_raise[key] = om.change_serial
        elif op == "raise":
            if om.merge_reset_generation(key, om.reset_generations().get(key, 0) + qid):
                last_raise[key] = om.change_serial
        else:
            before = om.change_serial
            om.remove_offsets(G, topic)
            for i, q in enumerate(sorted(q for q in last_change if q[0] == key)):
                del last_change[q]
                last_removal[q] = before + 1 + i
    for since in range(om.change_serial + 1):
        changes = om.encode_changes(since)
        queues = {(k, int(q)) for k, qs in changes["offsetTable"].items() for q in qs}
        assert queues == {q for q, serial in last_change.items() if serial > since}
        assert set(changes.get("resetGenerationTable", {})) == {k for k, s in last_raise.items() if s > since}
        removed = {(k, int(q)) for k, qs in changes.get("removedOffsetTable", {}).items() for q in qs}
        assert removed == {q for q, serial in last_removal.items() if serial > since}


def test_a_removal_on_the_master_reaches_the_slave_unless_the_slave_committed_since() -> None:
    master, slave, clock = pair()
    for q in range(3):
        commit(master, q, 10 + q)
    assert master.commit_offset(G, "Other", 0, 7, "c", source="update")
    sync(master, slave)
    seen = master.change_serial
    clock.ms += 1_000
    commit(slave, 1, 20)  # the slave's own commits (its master away): one before the removal ...
    clock.ms += 1_000
    assert master.remove_offsets(G, T) == 3  # DELETE_SUBSCRIPTIONGROUP removeOffset (or the topic's deletion)
    clock.ms += 1_000
    commit(slave, 2, 30)  # ... and one after it
    changed, push = merge_and_hand_back(slave, master.encode_changes(seen))
    assert changed == 2  # queues 0 and 1: the removal is newer than either
    assert sorted(slave.topics_of_group(G)) == ["Other", T] and slave.queue_offsets(G, T) == {2: 30}
    assert slave.queue_offsets(G, "Other") == {0: 7}  # the group's other topic was not removed
    assert push is not None and push["offsetTable"] == {KEY: {"2": 30}}  # handed back as any newer commit
    # what the slave removed is a removal in its own changes too (a slave promoted later serves them)
    assert set(slave.encode_changes(0).get("removedOffsetTable", {}).get(KEY, {})) == {"0", "1"}
    # the same changes again, or the whole table (which carries the removals too), change nothing
    assert merge_and_hand_back(slave, master.encode_changes(seen))[0] == 0
    assert merge_and_hand_back(slave, master.encode())[0] == 0
    # a queue stored again leaves the removals: its change is what the slave learns
    seen = master.change_serial
    clock.ms += 1_000
    commit(master, 0, 3)
    assert master.encode_changes(seen) == {"offsetTable": {KEY: {"0": 3}},
                                           **encode_versions([((KEY, 0), master.commit_version(G, T, 0))])}
    assert set(master.encode_changes(0)["removedOffsetTable"][KEY]) == {"1", "2"}


def test_a_removal_reaches_only_what_is_no_newer_than_the_removed_version_and_malformed_ones_are_skipped() -> None:
    om = ConsumerOffsetManager(now_ms=Clock(1_000_000))
    for q in range(3):
        om.merge_entry(KEY, q, 5, CommitVersion(0, 2, 100))  # as they came from the master
    body = {"offsetTable": {}, "removedOffsetTable": {
        KEY: {"0": [0, 2, 100], "1": [0, 1, 999], "2": [0, 2, 99], "3": [0, 0, 1], "x": [0, 0, 1]},
        f"Other@{G}": {"0": [1, 2]}, "nokey": {"0": [0, 0, 1]}, f"Bad@{G}": "not a map"}}
    assert decode_table(body).removed == {(KEY, 0): CommitVersion(0, 2, 100), (KEY, 1): CommitVersion(0, 1, 999),
                                          (KEY, 2): CommitVersion(0, 2, 99), (KEY, 3): CommitVersion(0, 0, 1)}
    # queue 0: the same version, removed; 1: a removal under an older lock epoch, 2: an older one: both kept
    assert merge_and_hand_back(om, body) == (1, None)
    assert om.queue_offsets(G, T) == {1: 5, 2: 5}
    # a queue both listed and removed (a malformed body) is taken as listed
    assert decode_table({"offsetTable": {KEY: {"1": 6}}, "removedOffsetTable": {KEY: {"1": [9, 9, 9]}}}).removed == {}


def test_removals_are_kept_in_the_file_so_a_restarted_master_still_tells_a_slave_that_was_away(tmp_path: Any) -> None:
    # RocketMQ's slave keeps a deleted group's offsets for good; before removals reached the offset file, a master
    # restarted after the deletion answered a returning slave's whole-table sync without them, with the same effect
    path = str(tmp_path / "consumerOffset.json")
    clock = Clock(1_000_000)
    master = ConsumerOffsetManager(path, now_ms=clock)
    slave = ConsumerOffsetManager(now_ms=clock)
    for q in range(2):
        commit(master, q, 10 + q)
    assert master.commit_offset("keep", T, 0, 4, "c", source="update")
    sync(master, slave)
    clock.ms += 1_000
    assert master.remove_offsets(G, T) == 2
    master.persist()
    restarted = ConsumerOffsetManager(path, now_ms=clock)
    assert restarted.load() == 1
    whole = restarted.encode()
    assert set(whole["removedOffsetTable"][KEY]) == {"0", "1"} and whole == master.encode()
    # the slave's first sync with the restarted master is a whole one: it removes the group's queues
    assert merge_and_hand_back(slave, whole) == (2, None)
    assert slave.queue_offsets(G, T) == {} and slave.queue_offsets("keep", T) == {0: 4}
    # the loaded removals are no change of this lifetime: not in the changes since its first serial
    assert "removedOffsetTable" not in restarted.encode_changes(0)
    # a queue stored again is no longer removed, in memory and in the file
    commit(restarted, 1, 2)
    restarted.persist()
    again = ConsumerOffsetManager(path, now_ms=clock)
    again.load()
    assert set(again.encode()["removedOffsetTable"][KEY]) == {"0"} and again.queue_offsets(G, T) == {1: 2}


def test_malformed_removals_in_the_offset_file_are_skipped_at_load(tmp_path: Any) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text(json.dumps({"offsetTable": {KEY: {"1": 6}}, "removedOffsetTable": {
        KEY: {"0": [0, 2, 100], "1": [9, 9, 9], "2": [0, 2], "3": [-1, 0, 5], "x": [0, 0, 1]},
        "nokey": {"0": [0, 0, 1]}, f"Bad@{G}": "not a map"}}))
    om = ConsumerOffsetManager(str(path))
    assert om.load() == 1
    # queue 1 is listed, so not removed; the others are malformed: only queue 0's removal is kept
    assert om.encode()["removedOffsetTable"] == {KEY: {"0": [0, 2, 100]}}
    assert om.queue_offsets(G, T) == {1: 6}
    path.write_text(json.dumps({"offsetTable": {}, "removedOffsetTable": ["not", "a", "map"]}))
    assert om.load() == 0 and "removedOffsetTable" not in om.encode()


def test_the_oldest_removals_are_forgotten_past_the_limit(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(offsets_module, "REMOVED_OFFSETS_KEPT", 3)
    path = str(tmp_path / "consumerOffset.json")
    clock = Clock(1_000_000)
    om = ConsumerOffsetManager(path, now_ms=clock)
    for q in range(5):
        commit(om, q, 1)
    for q in range(5):  # one removal per millisecond, queue 0 first
        clock.ms += 1
        assert om.drop_entry((KEY, q))
    assert set(om.encode()["removedOffsetTable"][KEY]) == {"2", "3", "4"}
    assert set(om.encode_changes(0)["removedOffsetTable"][KEY]) == {"2", "3", "4"}
    om.persist()
    monkeypatch.setattr(offsets_module, "REMOVED_OFFSETS_KEPT", 2)  # a file from a broker that kept more
    loaded = ConsumerOffsetManager(path, now_ms=clock)
    loaded.load()
    assert set(loaded.encode()["removedOffsetTable"][KEY]) == {"3", "4"}  # the newest removals


def test_a_reloaded_table_has_a_new_id(tmp_path: Any) -> None:
    om = ConsumerOffsetManager(str(tmp_path / "consumerOffset.json"))
    commit(om, 0, 5)
    om.persist()
    before, serial = om.table_id, om.change_serial
    om.load()
    # a slave's serial of the old table says nothing of this one: its next ask gets the whole table
    assert om.table_id != before and om.encode_changes(serial)["offsetTable"] == {}
    assert ConsumerOffsetManager().table_id != ConsumerOffsetManager().table_id


def newer_here_after_merge(offsets: ConsumerOffsetManager, body: dict[str, Any]) -> dict[str, Any] | None:
    """The two-step reference for merge_and_hand_back's body: after a merge with ``body``, compare the whole local
    table with it again and hand back what is newer here (what the slave did before the one pass)."""
    local = offsets.entries()
    newer = merge_tables(local, decode_table(body).entries, offsets.local_changes).newer_here
    if not newer:
        return None
    table: dict[str, dict[str, int]] = {}
    for key, qid in newer:
        table.setdefault(key, {})[str(qid)] = local[(key, qid)][0]
    gens = offsets.reset_generations()
    return {"offsetTable": table, **encode_versions((q, local[q][1]) for q in newer),
            "resetGenerationTable": {k: gens[k] for k in table if gens.get(k, 0) > 0}}


def test_the_one_pass_merge_and_hand_back_equals_the_merge_then_the_comparison() -> None:
    master, slave, clock = pair()
    for q in range(4):
        commit(master, q, 10 * q)
    sync(master, slave)
    clock.ms += 100
    commit(master, 1, 15)  # newer on the master
    clock.ms += 100
    commit(slave, 0, 7)  # newer on the slave
    commit(slave, 5, 3)  # a queue the master lacks
    clock.ms += 100
    gen = master.bump_reset_generation(G, T)
    master.reset_offset(G, T, 3, 1)  # a reset on the master
    body = master.encode()
    two_steps = copy.deepcopy(slave)
    changed = merge_by_commit_version(two_steps, body)
    assert merge_and_hand_back(slave, body) == (changed, newer_here_after_merge(two_steps, body))
    assert changed == 2 and slave.entries() == two_steps.entries() and slave.reset_generation(G, T) == gen
    assert slave.local_changes == two_steps.local_changes
    # and with only the changes since a serial: the same, and nothing is handed back twice once the master has it
    _, push = merge_and_hand_back(slave, master.encode_changes(0))
    assert push is not None and merge_by_commit_version(master, push) == 2
    assert merge_and_hand_back(slave, master.encode_changes(master.change_serial - 2)) == (0, None)
