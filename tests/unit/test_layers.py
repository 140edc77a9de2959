"""The layers' import rules (docs/architecture.md): each package imports only the packages below
it. Daemons that run in VMs (``agents``, ``workloads``) and the tenant's scheduler import nothing
of the lab, so they run unchanged on real VMs; the lab knows nothing of scenarios; nothing below
the command line imports it or the TUI. Every layer may use the contracts, which import none
of them. Read from the sources (every ``import`` and
``from ... import``, also inside functions), so a lazy import counts too."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {  # package -> the packages of nslab it may import (all may import contracts)
    "contracts": set(),
    "topo": set(),
    "agents": set(),
    "workloads": {"agents"},
    "scheduler": {"workloads"},
    "lab": {"topo", "agents"},
    "session": {"lab", "topo", "agents", "workloads", "scheduler"},
    "report": {"session", "lab", "agents"},
    "tui": {"session", "lab", "topo", "agents", "workloads", "scheduler"},
    "nslab_pytest": {"session", "lab", "topo", "agents", "report"},
    "cli": {"tui", "report", "session", "lab", "topo", "agents", "workloads", "scheduler"},
}


def imports(package: str) -> dict[str, set[str]]:
    """nslab package imported -> the files of ``package`` that import it."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and \
                node.module else []
            for name in names:
                top = name.split(".")[0]
                if top in ALLOWED and top != package and (top != "contracts"
                                                           or package == "contracts"):
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_package_imports_only_the_layers_below_it():
    wrong = {f"{pkg} -> {dep}": sorted(files)
             for pkg, allowed in ALLOWED.items()
             for dep, files in imports(pkg).items() if dep not in allowed}
    assert not wrong, wrong


def test_the_rules_cover_every_package():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages == set(ALLOWED), packages ^ set(ALLOWED)
