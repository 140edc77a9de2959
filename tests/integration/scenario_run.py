"""Run a scenario given as YAML text in a real lab, for the integration tests."""
from contracts.results import Results, validate
from session.scenario import load
from session.session import Session


def run_text(directory, text: str, name: str = "s.yaml") -> Results:
    """Write ``text`` to ``directory/name``, run it through a ``Session``; the validated
    results document."""
    path = directory / name
    path.write_text(text)
    sc, topo = load(str(path))
    return validate(Session(sc, topo, str(path)).run())
