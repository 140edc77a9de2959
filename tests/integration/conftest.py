"""Integration tests: real namespaces, real tc, real TCP. They need root; without it they are
skipped with that reason (unit tests still run). Labs come from the plugin's fixture
``nslab_lab`` (``nslab_pytest``): torn down after each test, its teardown checked."""
import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="integration tests need root (sudo make test)")
        for item in items:
            if "integration" in str(item.fspath):
                item.add_marker(skip)
