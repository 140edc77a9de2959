"""Link parameter parsing, the netem capability check and the traffic classes' tc lines
(no root)."""
import pytest

from lab.errors import CapabilityError
from lab.tc import (
    LinkParams,
    TrafficClass,
    _htb_class,
    class_commands,
    parse_root_qdiscs,
    parse_time_us,
    queue_change,
    rate_change,
    require,
    shape_commands,
)


@pytest.mark.parametrize("text, us", [("2ms", 2000.0), ("500us", 500.0), ("1.5s", 1.5e6),
                                      (3, 3000.0)])
def test_parse_time(text, us):
    assert parse_time_us(text) == us


@pytest.mark.parametrize("bad", ["fast", "-1ms", "2 hours"])
def test_parse_time_rejects(bad):
    with pytest.raises(ValueError):
        parse_time_us(bad)


@pytest.mark.parametrize("opts, message", [({"bw": 0}, "bw"), ({"loss": 101}, "loss"),
                                           ({"max_queue_size": 0}, "max_queue_size"),
                                           ({"reorder": 5}, "reorder needs a delay")])
def test_link_params_validation(opts, message):
    with pytest.raises(ValueError, match=message):
        LinkParams.from_opts(opts)


def test_netem_fields_need_netem_but_rate_queue_loss_do_not():
    require(LinkParams(bw=100, max_queue_size=10, loss=1), netem=False, where="a-b")
    with pytest.raises(CapabilityError, match=r"delay, jitter need the kernel qdisc sch_netem"):
        require(LinkParams(delay="1ms", jitter="100us"), netem=False, where="a-b")
    require(LinkParams(delay="1ms"), netem=True, where="a-b")


def test_htb_burst_and_quantum_scale_with_rate():
    slow, fast = _htb_class(10), _htb_class(1000)
    assert slow["burst"] == 15000 and fast["burst"] == 125000  # 1 ms of 1 Gbit/s
    assert 1600 <= slow["quantum"] <= fast["quantum"] <= 200000


@pytest.mark.parametrize("p", [LinkParams(bw=100, max_queue_size=50),
                               LinkParams(max_queue_size=50)])
def test_run_time_changes_address_what_bring_up_installed(p):
    """A rate or queue change (run on any server as tc lines) changes the class and replaces
    the leaf queue that ``shape_commands`` made, in place."""
    installed = shape_commands("eth1", p)
    leaf = [ln for ln in installed if " handle 10: " in ln]
    assert queue_change("eth1", LinkParams(bw=p.bw, max_queue_size=20)) == [
        ln.replace("qdisc add", "qdisc replace").replace("limit 50", "limit 20") for ln in leaf]
    if p.bw is not None:
        (cls,) = [ln for ln in installed if ln.startswith("class add")]
        assert rate_change("eth1", 100) == [cls.replace("class add", "class change")]
        assert "rate 40000000bit ceil 40000000bit" in rate_change("eth1", 40)[0]


def test_class_commands_classify_by_dscp_under_the_link_rate():
    p = LinkParams(bw=100, max_queue_size=50)
    lines = class_commands("eth1", p, [TrafficClass(8, 0.05, 0), TrafficClass(16, 0.25, 1)])
    assert lines[:2] == ["qdisc del dev eth1 root",
                         "qdisc add dev eth1 root handle 1: htb default 10"]
    classes = [ln for ln in lines if ln.startswith("class add")]
    # the link's class, the default class with the rest (70 %), one per DSCP; all ceil 100
    assert [ln.split(" rate ")[1].split()[0] for ln in classes] == [
        "100000000bit", "70000000bit", "5000000bit", "25000000bit"]
    assert all("ceil 100000000bit" in ln for ln in classes)
    assert [ln.split(" prio ")[1] for ln in classes[1:]] == ["7", "0", "1"]
    assert "match ip dsfield 0x20 0xfc flowid 1:11" in lines[-4]  # DSCP 8 = TOS 0x20
    assert "match ip dsfield 0x40 0xfc flowid 1:12" in lines[-1]
    assert sum("pfifo limit 50" in ln for ln in lines) == 3  # a queue per class
    assert class_commands("eth1", p, []) == ["qdisc del dev eth1 root",
                                             *shape_commands("eth1", p)]


@pytest.mark.parametrize("p, classes, message", [
    (LinkParams(max_queue_size=5), [TrafficClass(8, 0.1, 0)], "need a link rate"),
    (LinkParams(bw=10), [TrafficClass(8, 0.5, 0), TrafficClass(8, 0.1, 1)], "two traffic"),
    (LinkParams(bw=10), [TrafficClass(8, 0.5, 0), TrafficClass(9, 0.5, 1)], "sum to 1"),
])
def test_class_commands_refuse(p, classes, message):
    with pytest.raises(ValueError, match=message):
        class_commands("eth1", p, classes)


@pytest.mark.parametrize("args", [(64, 0.1, 0), (8, 0, 0), (8, 1, 0), (8, 0.1, 8)])
def test_traffic_class_bounds(args):
    with pytest.raises(ValueError):
        TrafficClass(*args)


def test_root_qdisc_counters_from_ip_and_tc_json():
    # as `ip -j link show` and `tc -s -j qdisc show` print them for a namespace on a server
    links = [{"ifindex": 1, "ifname": "lo"}, {"ifindex": 7, "ifname": "leaf2-vx1"},
             {"ifindex": 9, "ifname": "leaf2-eth1"}]
    qdiscs = [{"kind": "htb", "handle": "1:", "dev": "leaf2-vx1", "root": True, "bytes": 1500,
               "packets": 1, "drops": 2, "overlimits": 3, "requeues": 0, "backlog": 0,
               "qlen": 4},
              {"kind": "pfifo", "handle": "10:", "parent": "1:1", "dev": "leaf2-vx1",
               "bytes": 9, "packets": 9, "drops": 9, "overlimits": 9, "qlen": 9},
              {"kind": "noqueue", "handle": "0:", "dev": "gone0", "root": True, "bytes": 0,
               "packets": 0, "drops": 0, "overlimits": 0, "qlen": 0}]
    assert parse_root_qdiscs(links, qdiscs) == {
        7: {"sent_bytes": 1500, "sent_packets": 1, "drops": 2, "overlimits": 3,
            "backlog_packets": 4}}
