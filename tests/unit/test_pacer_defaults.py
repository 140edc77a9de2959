"""The pacer's defaults are one set: its command line, its config and the scenario's
``pacer:`` section agree, and the scenario's switches reach the command line both ways."""
from agents.__main__ import build_parser
from agents.gate import GateConfig
from agents.pacer import PacerConfig
from session.daemons import PacerSpec

REQUIRED = ["pacer", "--name", "vm1", "--bind", "10.0.0.1", "--ifname", "vm1-eth0",
            "--peers", "vm2=10.0.0.2", "--coordinator", "10.0.0.1:7700",
            "--api", "10.0.0.1:7780"]


def test_command_line_config_and_scenario_share_their_defaults():
    args = build_parser().parse_args(REQUIRED)
    spec, gate = PacerSpec(), GateConfig()
    cfg = PacerConfig(name="vm1", bind="10.0.0.1", ifname="vm1-eth0", peers={},
                      coordinator=("10.0.0.1", 7700), api=("10.0.0.1", 7780))
    shared = ("threshold_us", "max_hold_us", "probe_us", "quantum_us", "predict", "fresh",
              "spread", "datapath", "hold", "threshold_from", "window_queue", "ack_pace")
    assert {k: getattr(args, k) for k in shared} == {k: getattr(spec, k) for k in shared}
    assert args.window_clamp == spec.window_clamp == cfg.window
    assert (gate.threshold_ns, gate.max_hold_ns) == (spec.threshold_us * 1e3,
                                                     spec.max_hold_us * 1e3)
    assert (gate.predict, gate.fresh, gate.spread) == (spec.predict, spec.fresh, spec.spread)
    assert (cfg.probe_s, cfg.quantum_ns) == (spec.probe_us / 1e6, spec.quantum_us * 1e3)
    assert (cfg.datapath, cfg.hold, cfg.window_queue, cfg.ack_pace) == (
        spec.datapath, spec.hold, spec.window_queue, spec.ack_pace)
    assert cfg.from_base == (spec.threshold_from == "base")
    assert (cfg.mode, cfg.port, cfg.line_mbit, cfg.active_s, cfg.pin_dir) == (
        args.mode, args.port, args.line_mbit, args.active_s, args.pin_dir)


def test_on_off_switches_parse_both_ways():
    p = build_parser()
    off = p.parse_args(REQUIRED + ["--no-predict", "--no-fresh", "--spread"])
    assert (off.predict, off.fresh, off.spread) == (False, False, True)
    on = p.parse_args(REQUIRED + ["--predict", "--fresh", "--no-spread"])
    assert (on.predict, on.fresh, on.spread) == (True, True, False)


def test_each_datapaths_own_settings_given_are_named_for_the_other():
    from agents.__main__ import _not_used
    p = build_parser()
    assert _not_used(p.parse_args(REQUIRED), "bpf") == []
    given = p.parse_args(REQUIRED + ["--window-clamp", "--ack-pace", "0.9", "--threshold-from",
                                     "base", "--no-predict", "--probe-us", "2000"])
    assert _not_used(given, "probe") == ["--threshold-from base", "--window-clamp True",
                                         "--ack-pace 0.9"]
    assert _not_used(given, "bpf") == ["--probe-us 2000.0", "--predict False"]
