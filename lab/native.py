"""Every compiled part a lab uses, compiled at first use into nslab's cache (``agents.native``
says how and why): the VM clock preload (``lab.vmclock.PRELOAD``) and the agents' parts
(``agents.native.NATIVES``), which the lab installs in its VMs as a provisioning step would on
real ones. ``python -m lab.native [NAME ...]`` builds them all (or the named ones) ahead
(``make setup`` does)."""
from __future__ import annotations

import sys

from agents.native import NATIVES, Native, NativeError, build, built
from lab.capabilities import Capability
from lab.errors import LabError
from lab.vmclock import PRELOAD

PARTS: tuple[Native, ...] = (PRELOAD, *NATIVES)


def ensure(part: Native) -> str:
    """``part``'s path, built first when missing.

    Raises:
        LabError: it cannot be built (the message names what is missing and its package).
    """
    try:
        return build(part)
    except NativeError as e:
        raise LabError(str(e)) from e


def capabilities(parts: tuple[Native, ...] = PARTS) -> dict[str, Capability]:
    """Each part as ``nslab doctor`` reports it, built when missing: its path and whether it
    was in the cache or compiled now, or why it cannot be built and what brings the missing
    piece."""
    caps = {}
    for part in parts:
        there = built(part)
        try:
            path = build(part)
        except NativeError as e:
            caps[part.name] = Capability(part.name, False, str(e), part.needed_by,
                                         e.fix or "see the compiler's message")
            continue
        how = "cached" if there else "compiled now"
        caps[part.name] = Capability(part.name, True, f"{path} ({how} from "
                                     f"{part.source_dir()})", part.needed_by)
    return caps


def main(names: list[str]) -> int:
    """Build every part (or those named); print each with its path; exit 1 when one failed
    (or a name is no part's)."""
    unknown = set(names) - {p.name for p in PARTS}
    if unknown:
        print(f"no such part: {', '.join(sorted(unknown))}; parts: "
              f"{', '.join(p.name for p in PARTS)}", file=sys.stderr)
        return 1
    caps = capabilities(tuple(p for p in PARTS if not names or p.name in names))
    for c in caps.values():
        print(f"{c.name}: {c.detail}", file=sys.stdout if c.ok else sys.stderr)
    return 0 if all(c.ok for c in caps.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
