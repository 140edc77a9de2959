"""Each study's part of the results: its sections' models (``SECTIONS``, key -> model) and its
lines of the printed report (``report_lines(doc)``). The study that fills them runs in
``session.studies``; a new study adds its module here and one line to ``VIEWS``.
"""
from __future__ import annotations

from contracts.studies import cassini, lb, placement, two_step

VIEWS = (placement, cassini, two_step, lb)
"""The studies' views, in the printed report's order."""

SECTIONS = {key: model for view in VIEWS for key, model in view.SECTIONS.items()}
"""Every study's results sections: key -> model."""
