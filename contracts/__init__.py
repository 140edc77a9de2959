"""nslab's contracts: the typed models that cross a layer, each value defined once, with no
import of the emulator (no pyroute2, no Mininet), so a user's script, ``nslab schema`` and
``nslab report`` can read them anywhere.

- ``enums``: the scenario's and the results' vocabularies (pacer modes, balancers, ...).
- ``events``: the fault vocabulary and the truth timeline's events.
- ``messages``: the agents' wire messages and the coordinator's API (``agents/API.md``).
- ``tcp``: TCP state as a VM's kernel reports it.
- ``results``: the ``nslab.results/1`` document; ``studies``: each study's section of it.
"""
