"""The servers' command wrapping, the tunnels' VNIs and the servers' sync bound (no root)."""
import shlex

import pytest

from contracts.results.truth import ServerClock, ServerClockSample
from lab.server_clock import ClockProbe, ServerClocks, sync_bound_us
from lab.servers import Servers, ServerShell
from lab.tunnel import MAX_LINKS, vni
from topo.split import Server


def test_a_remote_command_goes_over_the_shared_control_connection_quoted():
    shell = ServerShell(Server("b", "192.0.2.2", "root@192.0.2.2"), "/run/nslab/x", ["-i", "k"])
    argv = shell.argv(["sh", "-c", "echo $HOME", "a b"])
    assert argv[:2] == ["ssh", "-q"] and "ControlMaster=auto" in argv
    assert "ControlPath=/run/nslab/x/ssh-b" in argv and argv[argv.index("-i") + 1] == "k"
    assert argv[-3:-1] == ["root@192.0.2.2", "--"]
    assert shlex.split(argv[-1]) == ["sh", "-c", "echo $HOME", "a b"]
    local = ServerShell(Server("a", "192.0.2.1"), "/run/nslab/x")
    assert local.local and local.argv(["ip", "link"]) == ["ip", "link"]
    assert ClockProbe(local).measure() == ServerClock(server="a", offset_us=0.0, rtt_us=0.0)


def test_vnis_differ_by_lab_and_link_and_fit_24_bits():
    assert vni("a", 0) != vni("b", 0) and vni("a", 1) == vni("a", 0) + 1
    assert all(0 < vni(lab, i) < 2**24 for lab in ("a", "zz_9") for i in (0, MAX_LINKS - 1))
    with pytest.raises(ValueError, match="at most 4095"):
        vni("a", MAX_LINKS)


def test_the_sync_bound_is_the_worst_pair():
    c = [ServerClock(server="a", offset_us=0, rtt_us=0),
         ServerClock(server="b", offset_us=30, rtt_us=100),
         ServerClock(server="c", offset_us=-20, rtt_us=40)]
    # b against c: |30 - -20| + (100 + 40) / 2
    assert sync_bound_us(c) == 120
    assert sync_bound_us(c[:1]) == 0


def test_the_run_bound_is_the_worst_moment_and_each_server_keeps_its_series():
    watch = ServerClocks(Servers("x", [Server("a", "192.0.2.1"), Server("b", "192.0.2.2", "b")]))
    a = ServerClock(server="a", offset_us=0, rtt_us=0)
    watch.bringup = [a, ServerClock(server="b", offset_us=5, rtt_us=10)]  # bound 10
    watch.rounds = [(3_000_000_000, [a, ServerClock(server="b", offset_us=-40, rtt_us=20)]),
                    (5_000_000_000, [a, ServerClock(server="b", offset_us=2, rtt_us=8)])]
    assert watch.sync_us() == 50  # the first round: |-40| + 20 / 2
    a_now, b_now = watch.truth(t0_ns=1_000_000_000)
    assert (b_now.offset_us, b_now.rtt_us) == (5, 10)  # bring-up
    assert b_now.series == [ServerClockSample(t_s=2.0, offset_us=-40, rtt_us=20),
                            ServerClockSample(t_s=4.0, offset_us=2, rtt_us=8)]
    assert [s.offset_us for s in a_now.series] == [0, 0]


def test_a_tunnel_end_gets_address_mtu_state_and_emulation_in_one_batch_per_tool():
    from lab.links import end_commands
    from lab.tc import LinkParams

    lines = end_commands("leaf1-vx0", LinkParams(bw=50, loss=1), "10.254.0.0/31", mtu=1450)
    assert lines["ip"] == ["addr add 10.254.0.0/31 dev leaf1-vx0",
                           "link set dev leaf1-vx0 mtu 1450", "link set dev leaf1-vx0 up"]
    assert lines["tc"][0] == "qdisc add dev leaf1-vx0 root handle 1: htb default 1"
    assert "htb rate 50000000bit ceil 50000000bit" in lines["tc"][1]
    assert any("numgen random" in x for x in lines["nft"])
