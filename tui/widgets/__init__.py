"""The TUI's widgets, one per module."""
from tui.widgets.circles import CirclesView
from tui.widgets.collocation import CollocationView
from tui.widgets.events import EventLog
from tui.widgets.fabric import FabricView
from tui.widgets.jobs import JobsPanel
from tui.widgets.owd import OwdHeatmap
from tui.widgets.plots import SeriesPlot
from tui.widgets.status import StatusBar
from tui.widgets.vmtable import VMTable

__all__ = ["CirclesView", "CollocationView", "EventLog", "FabricView", "JobsPanel", "OwdHeatmap",
           "SeriesPlot", "StatusBar", "VMTable"]
