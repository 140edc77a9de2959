"""The Textual TUI (``nslab tui``)."""
