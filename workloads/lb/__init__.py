"""Load balancing of collective flows, from the hosts (nothing here imports the lab).

Modules:
    paths:    path discovery by TTL-limited probes per entropy value (traceroute-style).
    ethereal: Ethereal's assignment of equal flows to paths (round-robin, equal-byte splits)
              and its failed-path table.
    reps:     REPS's per-connection buffer of recycled entropy values, with freezing.
"""
