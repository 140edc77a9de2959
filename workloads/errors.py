"""Typed errors of the collective workloads.

Each carries ``kind``, the short string a worker writes in its JSON report (``error_kind``),
and ``peers``, the ranks the error is about (empty when none in particular).
"""
from __future__ import annotations

from collections.abc import Iterable


class WorkloadError(Exception):
    """Base class: a job could not run or did not complete (workloads import nothing from
    the lab, so this is not a ``LabError``)."""

    kind = "error"

    def __init__(self, message: str, peers: Iterable[int] = ()):
        super().__init__(message)
        self.peers: tuple[int, ...] = tuple(sorted(set(peers)))


class ConfigError(WorkloadError):
    """Inconsistent job parameters (or a peer that answers as another job or rank)."""

    kind = "config"


class PeerUnreachableError(WorkloadError):
    """The mesh could not be completed within the connect timeout: a peer did not answer or
    did not connect. Check that every rank was started and that its address is reachable."""

    kind = "unreachable"


class PeerLostError(WorkloadError):
    """A connection to a peer closed or reset while the job ran (the peer died or failed)."""

    kind = "peer_lost"


class JobTimeoutError(WorkloadError):
    """The job's deadline passed while waiting on peers (a stalled link or a stuck peer)."""

    kind = "timeout"
