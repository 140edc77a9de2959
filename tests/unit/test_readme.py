"""README.md is a front page: under 200 lines, no section over 40, and every link to a file of
the repository (the docs' pages, the screenshot) points at one that exists. The docs' own links
are checked by `mkdocs build --strict` (`make docs`)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_a_front_page_not_a_manual():
    lines = README.splitlines()
    assert len(lines) < 200, len(lines)
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")] + [len(lines)]
    sections = {lines[a]: b - a for a, b in zip(starts, starts[1:], strict=False)}
    assert all(n <= 40 for n in sections.values()), sections


def test_its_links_to_the_repository_exist():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if "://" not in t]
    assert "docs/tui.svg" in local and "docs/getting-started.md" in local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing
