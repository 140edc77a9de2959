"""The studies a Session runs (``session.studies.base.Study``), in their order in the jobs'
turn. A new study adds its module here, one line to ``STUDIES``, and its results view in
``contracts.studies``."""
from __future__ import annotations

from session.studies.cassini import Cassini
from session.studies.chrony import Chrony
from session.studies.clock_daemons import ClockDaemons
from session.studies.lb import Lb
from session.studies.placement import Placement
from session.studies.two_step import TwoStep

STUDIES = (Chrony, ClockDaemons, Placement, Cassini, TwoStep, Lb)
