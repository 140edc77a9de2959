"""Integration tests: real namespaces, real tc, real TCP. They need root; without it they are
skipped with that reason (unit tests still run). Labs come from the plugin's fixture
``nslab_lab`` (``nslab_pytest``): torn down after each test, its teardown checked."""
import fcntl
import os
import signal

import pytest

# A suite started in the background by a non-interactive shell ignores SIGINT, and an ignored
# signal stays ignored across exec: the Ctrl-C tests' children would never see theirs.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


LOCK = "/run/nslab-integration.lock"


def pytest_sessionstart(session):
    """Run one integration suite at a time on a machine: two suites start the same lab names
    (the second one finds the first one's namespaces, 'already up or crashed') and share the
    cores their timings need. The lock is released when this process exits."""
    if os.geteuid() != 0:
        return
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_line(f"nslab: another integration run (pid {holder}) holds {LOCK}; "
                          "waiting for it to end")
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    session.config._nslab_lock_fd = fd  # held open (and locked) until the process exits


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="integration tests need root (sudo make test)")
        for item in items:
            if "integration" in str(item.fspath):
                item.add_marker(skip)
