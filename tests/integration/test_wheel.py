"""nslab as a user installs it: an sdist built from this tree, a wheel built from that sdist,
installed with its dependencies (no extras) into a fresh virtual environment outside the
checkout, then used from another directory: ``nslab --version``, ``nslab schema``,
``nslab run quickstart --check``, ``nslab doctor`` (which compiles the parts from the sources
the wheel shipped, into an empty cache) and the pytest plugin's example from the docs, two real
labs.

The venv gets only the core dependencies (``pyproject.toml``'s ``dependencies``; torch is an
extra and is not pulled), resolved by pip from its usual indexes through its cache: about 30 s
on a machine that installed them once, a download of about 70 MB on one that never did."""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import examples
import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["vmclock/vmclock.c", "agents/native/probeio.c", "agents/native/pacer.c",
           "agents/native/stamp.h", "session/scenarios/quickstart.yaml",
           "session/exercises/colocated.yaml", "tui/recordings/tui_demo.json", "tui/app.tcss"]


def run(argv, cwd, env, timeout=600):
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, argv))}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def this_tree(into: Path) -> Path:
    """The checkout's files that git would commit (tracked, and untracked but not ignored)
    copied under ``into``: the sdist is built from them, not from build outputs."""
    names = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard",
                            "-z"], capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, into / name)
    return into


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(venv bin dir, environment, work dir)`` of nslab installed from its wheel."""
    base = tmp_path_factory.mktemp("wheel")
    assert not str(base).startswith(str(REPO))
    src, dist = this_tree(base / "src"), base / "dist"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                              "print(b.build_sdist(sys.argv[1]))", str(dist)], src, env)
    sdist = next(dist.glob("nslab-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert set(SHIPPED) <= in_sdist, set(SHIPPED) - in_sdist
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(sdist), "-w", str(dist)], base, env)
    wheel = next(dist.glob("nslab-*.whl"))
    assert set(SHIPPED) <= set(zipfile.ZipFile(wheel).namelist())
    venv = base / "venv"
    run([sys.executable, "-m", "venv", str(venv)], base, env)
    # --no-compile: pip's byte-compiling of the dependencies (plotly's thousands of modules)
    # is half of the install's time and none of what this checks
    run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--no-compile", str(wheel), "pytest"], base, env)
    work = base / "work"
    work.mkdir()
    env = {**env, "PATH": f"{venv / 'bin'}:{env['PATH']}", "NSLAB_CACHE": str(base / "cache")}
    return venv / "bin", env, work


def test_the_installed_package_is_imported_from_the_venv(installed):
    bin_dir, env, work = installed
    where = run([bin_dir / "python", "-c", "import lab, agents.native as n, lab.vmclock as v; "
                 "print(lab.__file__, v.PRELOAD.source_dir(), n.PROBEIO.source_dir())"], work,
                env)
    site = str(bin_dir.parent / "lib")
    assert all(p.startswith(site) for p in where.split()), where
    run([bin_dir / "python", "-c", "import importlib.util as u, sys; "
         "sys.exit(u.find_spec('torch') is not None)"], work, env)  # the core pulls no torch


def test_version_schema_and_check(installed):
    bin_dir, env, work = installed
    from cli import version
    assert run([bin_dir / "nslab", "--version"], work, env).strip() == f"nslab {version()}"
    for contract in ("scenario", "results", "api", "report"):
        schema = json.loads(run([bin_dir / "nslab", "schema", contract], work, env))
        assert schema.get("$defs") or schema.get("properties") or schema.get("oneOf")
    out = run([bin_dir / "nslab", "run", "quickstart", "--check"], work, env)
    assert "quickstart.yaml: valid" in out and str(bin_dir.parent) in out


def test_doctor_builds_the_compiled_parts_from_the_wheel(installed):
    bin_dir, env, work = installed
    out = run([bin_dir / "nslab", "doctor"], work, env)
    rows = {line.split()[1]: line for line in out.splitlines() if line[:4] in ("ok  ", "MISS")}
    site = str(bin_dir.parent / "lib")
    for part in ("vmclock", "probeio", "pacer"):
        assert rows[part].startswith("ok") and env["NSLAB_CACHE"] in rows[part], rows[part]
        assert "compiled now from " + site in rows[part], rows[part]
    assert "from " + site in rows["nslab"]
    again = run([bin_dir / "nslab", "doctor"], work, env)
    assert "(cached from" in again and "compiled now" not in again


def test_the_docs_plugin_example_passes(installed):
    """docs/pytest-plugin.md's example, copied verbatim, run as its reader runs it: two labs."""
    bin_dir, env, work = installed
    for name, source in examples.files("pytest-plugin.md").items():
        (work / name).write_text(source)
    assert {"echo_agent.py", "test_echo_agent.py"} <= {p.name for p in work.iterdir()}
    out = run([bin_dir / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "test_echo_agent.py"], work, env, timeout=300)
    assert "2 passed" in out, out
