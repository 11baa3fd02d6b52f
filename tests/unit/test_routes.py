"""RouteInfoManager: registration, route shape, expiry after 120 s, connection loss, unregistration."""

from __future__ import annotations

import pytest

from trimq.namesrv.routes import BROKER_CHANNEL_EXPIRED_MS, RouteInfoManager


def topics(*names: str, queues: int = 4, perm: int = 6) -> dict[str, dict[str, int]]:
    return {n: {"readQueueNums": queues, "writeQueueNums": queues, "perm": perm, "topicSysFlag": 0} for n in names}


def register(r: RouteInfoManager, name: str, addr: str, table: dict[str, dict[str, int]], now: int,
             channel: object = None, cluster: str = "DefaultCluster") -> bool:
    return r.register_broker(cluster=cluster, broker_addr=addr, broker_name=name, broker_id=0,
                             topic_config_table=table, now_ms=now, channel=channel)


def test_route_has_rocketmqs_shape() -> None:
    r = RouteInfoManager()
    assert register(r, "broker-b", "10.0.0.2:10911", topics("T", queues=8), 0) is True
    assert register(r, "broker-a", "10.0.0.1:10911", topics("T", "U"), 0) is True
    assert register(r, "broker-a", "10.0.0.1:10911", topics("T", "U"), 10) is False  # a refresh
    route = r.pickup_topic_route_data("T")
    assert route is not None and route.to_wire() == {
        "brokerDatas": [
            {"cluster": "DefaultCluster", "brokerName": "broker-a", "brokerAddrs": {"0": "10.0.0.1:10911"}},
            {"cluster": "DefaultCluster", "brokerName": "broker-b", "brokerAddrs": {"0": "10.0.0.2:10911"}},
        ],
        "queueDatas": [
            {"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicSysFlag": 0},
            {"brokerName": "broker-b", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6, "topicSysFlag": 0},
        ],
        "filterServerTable": {},
    }
    assert r.pickup_topic_route_data("nope") is None
    assert r.get_all_topic_list() == ["T", "U"]
    info = r.get_all_cluster_info()
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a", "broker-b"]}
    assert set(info["brokerAddrTable"]) == {"broker-a", "broker-b"}


def test_a_registration_replaces_the_brokers_topics() -> None:
    r = RouteInfoManager()
    register(r, "a", "h:1", topics("T", "Old"), 0)
    register(r, "a", "h:1", topics("T", "New", queues=2), 1)
    assert r.get_all_topic_list() == ["New", "T"]
    route = r.pickup_topic_route_data("T")
    assert route is not None and route.queue_datas[0].read_queue_nums == 2


def test_expiry_after_120_s_of_silence() -> None:
    r = RouteInfoManager()
    register(r, "a", "h:1", topics("T"), 0)
    register(r, "b", "h:2", topics("T"), 0)
    register(r, "b", "h:2", topics("T"), 60_000)
    assert r.scan_not_active_broker(BROKER_CHANNEL_EXPIRED_MS) == []  # exactly 120 s: still alive
    assert r.scan_not_active_broker(BROKER_CHANNEL_EXPIRED_MS + 1) == ["h:1"]
    route = r.pickup_topic_route_data("T")
    assert route is not None and [b.broker_name for b in route.broker_datas] == ["b"]
    assert r.scan_not_active_broker(60_000 + BROKER_CHANNEL_EXPIRED_MS + 1) == ["h:2"]
    assert r.pickup_topic_route_data("T") is None
    assert r.get_all_cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}


def test_connection_close_drops_only_the_brokers_registered_over_it() -> None:
    r = RouteInfoManager()
    register(r, "a", "h:1", topics("T"), 0, channel=7)
    register(r, "b", "h:2", topics("T", "U"), 0, channel=8)
    assert r.on_channel_destroy(8) == ["h:2"]
    assert r.get_all_topic_list() == ["T"]
    assert r.on_channel_destroy(99) == []


def test_unregister_and_bad_tables() -> None:
    r = RouteInfoManager()
    register(r, "a", "h:1", topics("T"), 0)
    assert r.unregister_broker(cluster="DefaultCluster", broker_addr="h:1", broker_name="a", broker_id=0)
    assert not r.unregister_broker(cluster="DefaultCluster", broker_addr="h:1", broker_name="a", broker_id=0)
    assert r.get_all_topic_list() == []
    with pytest.raises(ValueError, match="T"):
        r.register_broker(cluster="c", broker_addr="h:1", broker_name="a", broker_id=0,
                          topic_config_table={"T": {"readQueueNums": "many"}}, now_ms=0)
    with pytest.raises(ValueError):
        r.register_broker(cluster="c", broker_addr="h:1", broker_name="a", broker_id=0,
                          topic_config_table={"T": 5}, now_ms=0)  # type: ignore[dict-item]
    assert r.broker_live_table == {}


def test_a_slave_registration_does_not_define_queue_data() -> None:
    r = RouteInfoManager()
    register(r, "a", "h:1", topics("T"), 0)
    r.register_broker(cluster="DefaultCluster", broker_addr="h:9", broker_name="a", broker_id=1,
                      topic_config_table=topics("X"), now_ms=0)
    route = r.pickup_topic_route_data("T")
    assert route is not None and route.broker_datas[0].broker_addrs == {0: "h:1", 1: "h:9"}
    assert r.pickup_topic_route_data("X") is None


def test_a_stale_master_is_superseded_by_the_newest_master_even_while_that_one_is_down() -> None:
    """Chaos long ASYNC seed 11: the promoted master (epoch 2) was killed; the old master (epoch 1) restarted on its
    store and, with no live master to defer to, took the route and acknowledged sends that the promoted master's
    return then cut. The name server remembers the newest master after it goes."""
    r = RouteInfoManager()

    def master(addr: str, epoch: int, ha: str, now: int, channel: object = None) -> None:
        r.register_broker(cluster="c", broker_addr=addr, broker_name="broker-a", broker_id=0,
                          topic_config_table=topics("T"), now_ms=now, channel=channel, ha_server_addr=ha,
                          master_epoch=epoch)

    master("10.0.0.1:10911", 1, "10.0.0.1:10912", 0, channel="old")
    master("10.0.0.2:10911", 2, "10.0.0.2:10912", 5, channel="promoted")  # the promoted slave
    r.on_channel_destroy("old")
    assert r.on_channel_destroy("promoted") == ["10.0.0.2:10911"]  # killed: no live master now
    assert r.master_of("broker-a") == ("", None)
    newer = r.superseding_master("broker-a", "10.0.0.1:10911", 1)
    assert newer is not None and (newer.broker_addr, newer.ha_server_addr, newer.master_epoch) == (
        "10.0.0.2:10911", "10.0.0.2:10912", 2)
    assert r.superseding_master("broker-a", "10.0.0.2:10911", 2) is None  # the newest master itself comes back
    assert r.superseding_master("broker-a", "10.0.0.3:10911", 2) is None  # the same epoch: not older
    assert r.superseding_master("broker-a", "10.0.0.3:10911", 3) is None  # a later promotion
    assert r.superseding_master("broker-b", "10.0.0.1:10911", 1) is None  # another broker name
    master("10.0.0.3:10911", 3, "10.0.0.3:10912", 10)
    assert r.newest_master["broker-a"].broker_addr == "10.0.0.3:10911"
    master("10.0.0.2:10911", 2, "10.0.0.2:10912", 11)  # the registration of an older epoch never replaces it
    assert r.newest_master["broker-a"].master_epoch == 3
