"""Shared by the unit and integration tests. Pytest's default ``prepend`` import mode puts
this directory on ``sys.path``, so tests import the helpers beside it as top-level modules
(``from synthetic import simulate``). ``pytester`` runs the plugin's users' test files."""

pytest_plugins = ["pytester"]
