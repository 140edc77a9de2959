"""The ``nslab`` command line: one module per subcommand."""
