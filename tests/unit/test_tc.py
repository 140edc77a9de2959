"""Link parameter parsing and the netem capability check (no root)."""
import pytest

from lab.errors import CapabilityError
from lab.tc import LinkParams, _htb_class, parse_time_us, require


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
