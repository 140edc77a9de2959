"""Where the machine was saturated (lab.saturation): the rules on synthetic samples with known
truth. The real samplers are exercised in test_fidelity.py."""
import pytest

from lab.queues import QueueReading
from lab.saturation import Interval, LinkInterval, link_interval, summarize

COOL, HOT = (0.3, 0.2), (0.3, 0.97)


def iv(core_busy=COOL, links=None, softirq=(0.0, 0.4)):
    return Interval(core_busy=core_busy, core_softirq=softirq,
                    busy=sum(core_busy) / len(core_busy), softirq=sum(softirq) / len(softirq),
                    links=links or {})


def queued(sent_mbit, bw=100.0):
    return {"leaf1->spine1": LinkInterval(bw_mbit=bw, sent_mbit=sent_mbit, queued=True)}


def test_idle_run_is_not_saturated_and_names_no_core():
    s = summarize([iv() for _ in range(8)], 0.5, links_read=True)
    assert s["saturated"] is False and s["saturated_share"] == 0
    assert [c["saturated"] for c in s["cores"]] == [False, False]
    assert s["queues"] == [] and s["cpu_busy"] == {"p50": 0.25, "max": 0.25}


def test_all_cores_busy_in_a_quarter_of_the_run_is_saturated():
    run = [iv((0.95, 0.92))] * 2 + [iv()] * 6
    s = summarize(run, 0.5)
    assert s["saturated_share"] == 0.25 and s["saturated"] is True
    assert [c["hot_share"] for c in s["cores"]] == [0.25, 0.25]
    assert s["queues"] is None  # links not read: unknown, not "none limited"
    assert summarize(run[1:], 0.5)["saturated"] is False  # 1 of 7 < 25 %


def test_one_hot_core_is_named_without_flagging_the_run():
    s = summarize([iv(HOT)] * 4 + [iv()] * 4, 0.5, links_read=True)
    cores = s["cores"]
    assert cores[1]["saturated"] is True and cores[1]["hot_share"] == 0.5
    assert cores[0]["saturated"] is False and cores[1]["softirq"]["p50"] == 0.4
    assert s["busiest_core"]["max"] == 0.97 and s["saturated"] is False


def test_queued_link_below_its_rate_on_a_hot_core_is_cpu_limited():
    run = [iv(HOT, queued(55.0)) for _ in range(3)] + [iv(COOL, queued(99.0))] * 5
    s = summarize(run, 0.5, links_read=True)
    (q,) = s["queues"]
    assert q["link"] == "leaf1->spine1" and q["queued_samples"] == 8
    assert q["starved_samples"] == 3 and q["cpu_limited"] is True
    assert q["rate_ratio"] == {"p50": 0.99, "max": 0.99}
    assert s["saturated_share"] == 0 and s["saturated"] is True  # the link says so


@pytest.mark.parametrize("run, why", [
    ([iv(HOT, queued(99.0))] * 6, "at its rate although the core is hot"),
    ([iv(COOL, queued(40.0))] * 6, "below its rate with no hot core: its traffic"),
    ([iv(HOT, queued(40.0))] + [iv()] * 5, "starved once only"),
    ([iv(HOT, queued(40.0))] * 2 + [iv(HOT, queued(98.0))] * 3, "starved in 2 of 5 hot"),
    ([iv(HOT, {"leaf1->spine1": LinkInterval(100.0, 10.0, queued=False)})] * 6,
     "never queued: the sender sent little"),
])
def test_links_not_limited_by_the_cpu(run, why):
    s = summarize(run, 0.5, links_read=True)
    assert not any(q["cpu_limited"] for q in s["queues"]), why


def test_half_of_the_hot_queued_samples_is_enough():
    run = [iv(HOT, queued(40.0))] * 3 + [iv(HOT, queued(98.0))] * 3
    assert summarize(run, 0.5, links_read=True)["queues"][0]["cpu_limited"] is True


def test_link_interval_from_two_readings():
    a = QueueReading(t_s=10.0, bw_mbit=100.0, sent_bytes=1_000_000, backlog_packets=5, drops=0)
    b = QueueReading(t_s=10.5, bw_mbit=100.0, sent_bytes=7_250_000, backlog_packets=3, drops=2)
    li = link_interval(a, b)
    assert li.sent_mbit == pytest.approx(100.0) and li.queued is True
    drained = QueueReading(t_s=11.0, bw_mbit=100.0, sent_bytes=7_250_000, backlog_packets=0,
                           drops=2)
    assert link_interval(b, drained).queued is False and link_interval(b, drained).sent_mbit == 0
    assert link_interval(b, a) is None  # counters went back (qdisc replaced)
    assert link_interval(a, a) is None  # no time passed


def test_no_samples():
    assert summarize([], 0.5, links_error="OSError: gone") == {
        "samples": 0, "saturated": None, "queues_error": "OSError: gone"}
