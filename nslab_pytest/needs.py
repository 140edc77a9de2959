"""The ``nslab`` marker's check: does this machine have what a test needs?

    @pytest.mark.nslab(needs=["netem", "tcpdump"])

Every lab needs root; ``needs`` names capabilities of ``lab.capabilities.probe`` (the rows of
``nslab doctor``: netem, nftables, nft_mark, policy_routing, cgroups, cpuset, freezer,
multipath_hash_seed, mnexec, iperf3, tcpdump).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from lab.capabilities import Capability

ROOT_REASON = "nslab: needs root (network namespaces, tc, cgroups): run pytest with sudo"


def skip_reason(needs: Iterable[str], root: bool,
                probe: Callable[[], Mapping[str, Capability]]) -> str | None:
    """Why a test marked ``nslab(needs=...)`` cannot run here (each missing capability with
    what it disables and its fix, as ``nslab doctor`` says), or None when it can.

    Args:
        needs: capability names.
        root: whether the process runs as root.
        probe: returns the capabilities by name (called only as root).

    Raises:
        ValueError: a name that is not a capability (the message lists them).
    """
    if not root:
        return ROOT_REASON
    caps = probe()
    unknown = [n for n in needs if n not in caps]
    if unknown:
        raise ValueError(f"nslab marker: unknown capabilities {unknown}; known: "
                         f"{', '.join(sorted(caps))}")
    missing = [caps[n] for n in needs if not caps[n].ok]
    if not missing:
        return None
    return "nslab: this machine lacks " + "; ".join(
        f"{c.name} ({c.detail}), needed for {c.disables}" + (f"; fix: {c.fix}" if c.fix else "")
        for c in missing)
