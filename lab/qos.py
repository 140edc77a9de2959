"""Traffic classes on the fabric: per-DSCP rate shares and priorities on every router-to-router
link (the unfair-share alternative to CASSINI's time shifts: Rajasekaran et al., "Congestion
control in machine learning clusters", HotNets 2022, give one job more of a shared link so
the jobs slide into interleaving).

The classes (``lab.tc.TrafficClass``) go on both directions of each link between two routers
(leaf-spine and spine-superspine), where the lab shapes the link (``lab.tc.class_commands``);
links to VMs keep their single queue. Hosts choose their class by marking DSCP (e.g.
``JobConfig.dscp``), as a tenant's traffic does under a DiffServ policy of the fabric.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from contracts.events import Event
from lab import tc
from lab.errors import LabError
from topo.routing import ROUTER_ROLES

if TYPE_CHECKING:  # pragma: no cover
    from lab.lab import Lab


def fabric_ends(lab: Lab) -> list:
    """The link ends of every router-to-router link with a rate (``lab.links.ShapedIntf``,
    and both ends of every cut link, ``lab.tunnel.TunnelEnd``)."""
    return [intf for link in lab.net.links for intf in (link.intf1, link.intf2)
            if all(getattr(i.node, "role", None) in ROUTER_ROLES
                   for i in (link.intf1, link.intf2)) and intf.shaping.bw is not None] + \
        [end for t in lab.tunnels.values() for end in t.ends if end.shaping.bw is not None]


def reshape(ends: Sequence, classes: Sequence[tc.TrafficClass]) -> None:
    """Re-install the emulation of ``ends`` (their ``shaping`` now) with ``classes``.

    Raises:
        LabError: tc refused (its message included), or the classes do not fit a link.
    """
    by_node: dict[str, tuple[object, list[str]]] = {}
    for intf in ends:
        try:
            lines = tc.class_commands(intf.shaper_name, intf.shaping, classes)
        except ValueError as e:
            raise LabError(str(e)) from e
        by_node.setdefault(intf.shaper_node.name, (intf.shaper_node, []))[1].extend(lines)
    for node, lines in by_node.values():
        node.run_batch("tc", lines)


def set_classes(lab: Lab, classes: Sequence[tc.TrafficClass]) -> Event:
    """Put ``classes`` on every fabric link (none: back to one queue per link); stamps a
    ``classes`` event (its ``dscp``, ``share``, ``prio`` lists).

    Raises:
        LabError: the lab is not running, it has no shaped fabric link, or tc refused.
    """
    if lab.net is None:
        raise LabError(f"lab {lab.name} is not running")
    ends = fabric_ends(lab)
    if classes and not ends:
        raise LabError(f"lab {lab.name} has no router-to-router link with a rate for classes")
    reshape(ends, classes)
    lab.classes = tuple(classes)
    return lab.stamp("classes", "fabric", dscp=[c.dscp for c in classes],
                     share=[c.share for c in classes], prio=[c.prio for c in classes])
