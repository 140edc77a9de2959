"""The scenario layer: a ``Session`` runs a scenario (its lab, agents, load, fault timeline
and jobs) for both ``nslab run`` and the TUI; scoring and results come after it."""
