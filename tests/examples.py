"""The docs' runnable examples, read from the pages themselves so that what a reader copies is
what the tests run."""
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def files(page: str) -> dict[str, str]:
    """``{file name: source}`` of a docs page's code blocks that open with ``# <file name>``
    (``docs/pytest-plugin.md``: ``# echo_agent.py: ...``, ``# test_echo_agent.py``)."""
    text = (DOCS / page).read_text()
    out = {}
    for block in re.findall(r"```(?:python|yaml)\n(.*?)```", text, re.S):
        m = re.match(r"# (\S+\.(?:py|yaml))", block)
        if m:
            out[m.group(1).rstrip(":")] = block
    return out
