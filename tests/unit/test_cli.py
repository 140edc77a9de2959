"""The CLI in-process, without root: help, validation, and the not-root error."""
import os

import pytest

from cli.main import main


def test_not_root_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for cmd in (["doctor"], ["run"], ["clean"], ["up"]):
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["nslab: nslab needs root (network namespaces, tc, cgroups): "
                       "run it with sudo"]


def test_check_validates_without_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["run", "quickstart", "--check"]) == 0
    assert "valid (8 VMs" in capsys.readouterr().out


def test_unknown_scenario_exit_1(capsys):
    assert main(["run", "no_such_scenario", "--check"]) == 1
    err = capsys.readouterr().err
    assert "built-ins:" in err and "quickstart" in err


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("run", "up", "exec", "doctor", "clean"):
        assert cmd in out


def test_capture_options_need_pcap(capsys):
    assert main(["run", "quickstart", "--capture", "vm1"]) == 2
    assert "--capture and --pcap-filter need --pcap DIR" in capsys.readouterr().err


def test_schema_report_covers_every_line_an_agent_or_pacer_sends(monkeypatch, capsys):
    import json

    from contracts.messages import Hello, PacerReport, Report
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["schema", "report"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["discriminator"]["mapping"]) == {"hello", "report", "pacer"}
    for model in (Hello, Report, PacerReport):
        assert doc["$defs"][model.__name__]["properties"].keys() == \
            model.model_json_schema()["properties"].keys()


def test_up_splits_the_lab_across_the_servers_given(monkeypatch, capsys):
    import cli.up

    built = {}

    def make_lab(sc, topo, name, progress, ssh_options):
        built.update(servers=[s.address for s in sc.servers], ssh=list(ssh_options))
        raise RuntimeError("not built in a unit test")

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(cli.up, "make_lab", make_lab)
    with pytest.raises(RuntimeError, match="not built"):
        main(["up", "quickstart", "--servers", "10.0.0.1,admin@10.0.0.2",
              "--ssh-option=-i", "--ssh-option=KEY"])
    assert built == {"servers": ["10.0.0.1", "10.0.0.2"], "ssh": ["-i", "KEY"]}
    with pytest.raises(SystemExit) as e:
        main(["up", "quickstart", "--servers", "10.0.0.1"])
    assert e.value.code == 2
    assert "at least one other server" in capsys.readouterr().err
