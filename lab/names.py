"""Names of the kernel objects and files of a lab: all carry the prefix ``nslab-<lab>``.

Several labs with different names run side by side; ``nslab clean NAME`` finds a crashed lab's
objects by this prefix only.
"""
from __future__ import annotations

import os
import re

PREFIX = "nslab"
STATE_ROOT = os.environ.get("NSLAB_STATE_DIR", "/run/nslab")
_VALID = re.compile(r"^[a-z0-9][a-z0-9_]{0,15}$")


def check_lab_name(name: str) -> str:
    """Return ``name`` if it is a valid lab name (1-16 of a-z 0-9 _, starting alphanumeric).

    Raises:
        ValueError: otherwise.
    """
    if not _VALID.match(name):
        raise ValueError(f"lab name {name!r}: use 1-16 characters of a-z, 0-9 and _")
    return name


def lab_prefix(lab: str) -> str:
    """``nslab-<lab>``: the prefix of every kernel object of the lab."""
    return f"{PREFIX}-{lab}"


def netns_name(lab: str, node: str) -> str:
    """Name of a node's network namespace as listed by ``ip netns list``."""
    return f"{lab_prefix(lab)}-{node}"


def state_dir(lab: str) -> str:
    """Directory of the lab's published files (clock parameters, state record)."""
    return os.path.join(STATE_ROOT, lab)
