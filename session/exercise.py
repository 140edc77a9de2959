"""Teaching exercises with automatic checks (as Kathara's lab-checker does for its labs).

An exercise is data: a YAML file (built-ins in ``session/exercises/*.yaml``) naming a check
kind of ``session.exercise_checks``, which says what the seed hides in the lab, what the
student is shown, the answer's format and how it is checked::

    name: colocated                # [a-z0-9_]
    title: Find the VMs that share a physical host
    check: colocated               # the check kind (KINDS)
    params: {}                     # the kind's parameters
    hide: [placement, collocation] # what the TUI does not show while the exercise runs
    scenario: {...}                # a scenario (nslab schema scenario): the exercise's lab
    task: |                        # what the student is asked
      ...
    answer: |                      # the answer file's format, with an example
      groups: [[vm1, vm3]]

``start`` draws the hidden truth from a seed (the kind's ``draw``), writes the scenario, runs
it with a ``Session`` (as ``nslab run`` does) and writes into the exercise directory the
record ``NAME.record.json`` (seed, truth, scenario, the ``nslab.results/1`` document) and
the scenario ``NAME.scenario.yaml`` (both mode 0600: a student who is not root cannot read
the truth) and ``NAME.observations.json`` (what the
student is shown). ``check`` validates the answer file against the kind's ``Answer`` (every
problem with its line, as for scenarios), runs the check's own lab when the kind needs one
(``pacer``) and returns the ``Verdict``: ``check_lab``, then ``judge``, the steps the TUI
takes too (it runs the check's lab in view).
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from mininet.topo import Topo
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contracts.base import reasons
from lab.capabilities import require_root
from lab.errors import LabError, ScenarioError, ScenarioProblem
from lab.wait import wait_until
from session.exercise_checks import KINDS, Kind, Live, Verdict, settled_window
from session.scenario import Scenario, load, load_model
from session.session import Session
from session.topology import build

EXERCISE_DIR = Path(__file__).parent / "exercises"
RECORD = "nslab.exercise/1"
DEFAULT_DIR = "nslab-exercises"
SETTLE_S = 60.0
"""How long ``start`` keeps a lab with agents running past its duration, at most, until
every VM has an estimate in the agents' last settled window (s)."""
Hidden = Literal["placement", "collocation", "links", "faults"]


class Exercise(BaseModel):
    """An exercise file (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]{0,31}$", examples=["colocated"])
    title: str = Field(description="one line", examples=["Find the VMs that share a host"])
    check: Literal[tuple(KINDS)] = Field(  # type: ignore[valid-type]
        description="the check kind: " + ", ".join(KINDS))
    params: dict = Field(default_factory=dict, description="the check kind's parameters")
    hide: list[Hidden] = Field(default_factory=list, description="what the TUI does not "
                               "show: placement (physical hosts), collocation (the agents' "
                               "groups), links (utilization, drops, queues, rates), faults "
                               "(the timeline)")
    scenario: Scenario = Field(description="the exercise's lab (the kind adds its hidden "
                               "part)")
    task: str = Field(description="what the student is asked")
    answer: str = Field(description="the answer file's format, with an example")

    @model_validator(mode="after")
    def _params(self) -> Exercise:
        try:
            self.kind.Params.model_validate(self.params)
        except ValidationError as e:
            raise ValueError(f"params: {reasons(e)}") from e
        return self

    @property
    def kind(self) -> Kind:
        return KINDS[self.check]

    @property
    def parsed_params(self) -> BaseModel:
        return self.kind.Params.model_validate(self.params)


def names() -> list[str]:
    """The built-in exercises' names, sorted."""
    return sorted(p.stem for p in EXERCISE_DIR.glob("*.yaml"))


def load_exercise(name_or_path: str) -> Exercise:
    """A built-in exercise by name, or an exercise file.

    Raises:
        ScenarioError: no such exercise, or every problem of the file (with its line).
    """
    path = Path(name_or_path)
    if not path.is_file():
        path = EXERCISE_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ScenarioError(name_or_path, [ScenarioProblem(
                "", "no such file and no built-in exercise",
                f"built-ins: {', '.join(names())}", name_or_path)], "nothing was loaded")
    return load_model(Exercise, path, "`name: colocated`", "nothing was loaded")


@dataclass
class Prepared:
    """An exercise's lab, ready for a ``Session``: the scenario with its hidden part (also
    written to ``path``, as a dict in ``data``), its topology and the ``truth``."""

    scenario: Scenario
    topo: Topo
    path: Path
    data: dict
    truth: dict


def prepare(ex: Exercise, seed: int, directory: str | Path) -> Prepared:
    """Draw the hidden truth from ``seed`` into the exercise's scenario, write it to
    ``directory/NAME.scenario.yaml`` and load it (``session.scenario.load``: validated and
    cross-checked as any scenario).

    Raises:
        ScenarioError: the exercise's scenario does not hold together.
    """
    data = ex.scenario.model_dump(mode="json")
    data["seed"] = seed
    sc = Scenario.model_validate(data)
    topo, problems = build(sc.topology, sc.placement, seed, EXERCISE_DIR)
    if topo is None:
        raise ScenarioError(ex.name, [ScenarioProblem(".".join(map(str, p.path)), p.message,
                                                      p.hint) for p in problems])
    truth = ex.kind.draw(random.Random(seed), data, topo, ex.parsed_params)
    path = write_scenario(data, directory, f"{ex.name}.scenario.yaml")
    sc, topo = load(str(path))
    return Prepared(sc, topo, path, data, truth)


def write_scenario(data: dict, directory: str | Path, filename: str) -> Path:
    """Write the scenario ``data`` as YAML into ``directory`` (created), mode 0600: it holds
    the hidden truth; its path."""
    return write_private(Path(directory) / filename, yaml.safe_dump(data, sort_keys=False))


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` (its directory created), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def record_path(directory: str | Path, name: str) -> Path:
    return Path(directory) / f"{name}.record.json"


def observations_path(directory: str | Path, name: str) -> Path:
    return Path(directory) / f"{name}.observations.json"


def check_path(directory: str | Path, name: str) -> Path:
    """Where ``check_lab`` writes the scenario of the check's own lab."""
    return Path(directory) / f"{name}.check.yaml"


def new_record(ex: Exercise, prep: Prepared, results: dict,
               observations: dict | None = None) -> dict:
    """The record of a run of ``ex``'s lab (what ``check`` reads): the seed, the drawn
    truth and the scenario of ``prep``, the run's ``nslab.results/1`` document ``results``
    (the TUI gives the sections its live lab knows: ``truth``) and what the student was
    shown."""
    return {"schema": RECORD, "exercise": ex.name, "seed": prep.data["seed"],
            "truth": prep.truth, "scenario": prep.data, "results": results,
            "observations": observations}


def start(ex: Exercise, seed: int, directory: str | Path = DEFAULT_DIR,
          lab_name: str | None = None, progress=None) -> dict:
    """Build and run the exercise's lab (a ``Session``) and write its record (truth, mode
    0600) and observations into ``directory``; the record.

    Raises:
        LabError (and subclasses): the scenario is invalid or the lab failed (torn down).
    """
    prep = prepare(ex, seed, directory)
    session = Session(prep.scenario, prep.topo, str(prep.path), lab_name, progress=progress)
    session.start()
    try:
        session.wait()
        wait_settled(session)
        live = Live(session.links(), session.vms())
    finally:
        session.stop()
    doc = session.results()
    record = new_record(ex, prep, doc, ex.kind.observe(doc, session.agents_state, live,
                                                       prep.truth))
    write_private(record_path(directory, ex.name), json.dumps(record, indent=1))
    observations_path(directory, ex.name).write_text(
        json.dumps(record["observations"], indent=1) + "\n")
    return record


def wait_settled(session: Session, timeout_s: float = SETTLE_S) -> None:
    """Keep the session's lab running until every VM has an offset and a drift in the
    agents' last settled window (``exercise_checks.settled_window``), at most ``timeout_s``
    (nothing to wait for without agents). On a loaded machine a VM's agent can start
    seconds late, and the scenario's duration counts from bring-up (seen once in the
    colocated exercise: vm5 and vm6, the VMs of one host, without an estimate)."""
    if session.mesh is None:
        return
    names = [vm.name for vm in session.lab.vms]
    def estimated() -> bool:
        window = settled_window(session.mesh.state(session.sc.agents.drift_windows))
        return window is not None and all(
            v in window.vms and window.vms[v].offset_ns is not None
            and window.vms[v].drift_ppm is not None for v in names)

    wait_until(estimated, timeout_s, 0.5)


def read_record(directory: str | Path, name: str) -> dict:
    """The record ``start`` wrote for exercise ``name``.

    Raises:
        LabError: there is none (start the exercise first), or it is not a record.
    """
    path = record_path(directory, name)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise LabError(f"no record of exercise {name} in {path.parent}/: run 'nslab exercise "
                       f"start {name}' first (with the same --dir)") from e
    except (OSError, ValueError) as e:
        raise LabError(f"cannot read {path}: {e}") from e
    if not isinstance(record, dict) or record.get("schema") != RECORD:
        raise LabError(f"{path} is not an exercise record ({RECORD})")
    return record


def read_answer(ex: Exercise, path: str | Path) -> BaseModel:
    """The answer file validated against the exercise's answer format.

    Raises:
        ScenarioError: every problem at once, with its line ("not checked").
    """
    example = next((ln.strip() for ln in ex.answer.splitlines()
                    if ln.strip() and not ln.lstrip().startswith("#")), "")
    return load_model(ex.kind.Answer, Path(path), f"`{example}`", "not checked")


def check_lab(ex: Exercise, answer: BaseModel, record: dict,
              directory: str | Path) -> dict | None:
    """The scenario (dict) of the lab the check of ``answer`` runs first, for a kind that
    measures (``pacer``), written to ``check_path(directory, ex.name)``; None: the check
    reads the record alone."""
    data = ex.kind.check_scenario(answer, record, ex.parsed_params)
    if data is not None:
        write_scenario(data, directory, check_path(directory, ex.name).name)
    return data


def judge(ex: Exercise, answer: BaseModel, record: dict,
          check_results: dict | None = None) -> Verdict:
    """The verdict on ``answer`` against ``record`` (``new_record``). ``check_results``: the
    results of the lab ``check_lab`` asked for (the ``nslab.results/1`` document, or at
    least its ``jobs``), kept in the record; the verdict carries its ``lab.fidelity`` when
    there is one."""
    if check_results is not None:
        record["check_results"] = check_results
    verdict = ex.kind.check(answer, record, ex.parsed_params)
    verdict.fidelity = (check_results or {}).get("lab", {}).get("fidelity")
    return verdict


def check(ex: Exercise, answer_path: str | Path, directory: str | Path = DEFAULT_DIR,
          lab_name: str | None = None, progress=None) -> Verdict:
    """Check the answer file against the record of ``start``; for a kind that measures
    (``pacer``) run its check's lab first (root), whose fidelity the verdict then carries.

    Raises:
        ScenarioError: the answer does not fit the format (nothing checked).
        LabError: no record, or the check's lab failed.
    """
    record = read_record(directory, ex.name)
    answer = read_answer(ex, answer_path)
    results = None
    if check_lab(ex, answer, record, directory) is not None:
        require_root()
        path = str(check_path(directory, ex.name))
        sc, topo = load(path)
        results = Session(sc, topo, path, lab_name, progress=progress).run()
    return judge(ex, answer, record, results)
