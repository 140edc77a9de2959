"""Daemons that run inside VMs (agent) or anywhere (coordinator). They import nothing from
``lab``, ``topo`` or ``tui``: the same code runs on a real cloud VM."""
