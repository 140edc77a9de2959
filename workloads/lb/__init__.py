"""Load balancing of collective flows, from the hosts (nothing here imports the lab).

Modules:
    paths:    path discovery by TTL-limited probes per entropy value (traceroute-style).
    ethereal: Ethereal's assignment of equal flows to paths (round-robin, equal-byte splits)
              and its failed-path table.
    reps:     REPS's per-connection buffer of recycled entropy values, with freezing.
    pinning:  path choice per connection for programs nslab did not write (DDP's gloo).
    sockdiag: the namespace's TCP connections by one sock_diag dump.
    daemon:   the VM's balancer daemon (python -m workloads.lb.daemon): pinning through an
              nftables verdict map.
"""
