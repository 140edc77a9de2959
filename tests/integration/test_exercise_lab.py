"""An exercise end to end in a real lab: ``colocated`` started (the seed hides which VMs share
a host, the agents measure the clocks), answered from what the student is shown (VMs whose
drift estimates agree), and checked: that answer passes, a wrong one fails."""
import os
import stat

from agents.owd import natural_key
from cli.main import main
from session import exercise


def pairs_by_drift(clocks: dict) -> list[list[str]]:
    """What a student does with the observations, knowing two VMs share each host: VMs in
    order of their drift, paired."""
    ordered = sorted(clocks, key=lambda v: clocks[v]["drift_ppm"])
    return [sorted(ordered[i:i + 2], key=natural_key) for i in range(0, len(ordered), 2)]


def test_colocated_start_then_check(tmp_path, capsys):
    ex = exercise.load_exercise("colocated")
    record = exercise.start(ex, 5, tmp_path, lab_name="exc_coloc")
    doc = record["results"]
    assert doc["teardown"]["clean"], doc["teardown"]
    for hidden in (exercise.record_path(tmp_path, "colocated"),
                   tmp_path / "colocated.scenario.yaml"):
        assert stat.S_IMODE(os.stat(hidden).st_mode) == 0o600
    clocks = record["observations"]["clocks"]
    assert set(clocks) == {f"vm{i}" for i in range(1, 9)}
    groups = pairs_by_drift(clocks)
    answer = tmp_path / "answer.yaml"
    answer.write_text("groups:\n" + "".join(f"  - [{', '.join(g)}]\n" for g in groups))
    assert main(["exercise", "check", "colocated", str(answer), "--dir", str(tmp_path)]) == 0
    assert "PASSED: 5 of 5 right" in capsys.readouterr().out
    wrong = [[groups[0][0], groups[1][0]], [groups[0][1], groups[1][1]]]
    answer.write_text(f"groups: {wrong}\n".replace("'", ""))
    assert main(["exercise", "check", "colocated", str(answer), "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "are not the VMs of one physical host" in out and "NOT YET" in out
