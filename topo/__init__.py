"""Topologies as ``mininet.topo.Topo`` subclasses, physical placement of VMs, and routes."""
from topo.leafspine import LeafSpine
from topo.placement import place

__all__ = ["LeafSpine", "place"]
