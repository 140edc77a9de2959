"""The lab's compiled helpers, built on first use when missing or older than their source
(``make setup`` builds them ahead): the VM clock preload (``vmclock/``) and the agents'
datagram path (``agents/native/``), which the lab installs in its VMs as a provisioning
step would on real ones."""
from __future__ import annotations

import os
import subprocess
import threading

from lab.errors import LabError

_lock = threading.Lock()


def make(source_dir: str, library: str, source: str, what: str) -> str:
    """``library``, built with ``make -C source_dir`` when missing or older than ``source``.

    Raises:
        LabError: the build failed (no gcc/make or a header: run ``make setup``).
    """
    with _lock:
        if not os.path.exists(library) or os.path.getmtime(library) < os.path.getmtime(source):
            try:
                subprocess.run(["make", "-s", "-C", source_dir], check=True,
                               capture_output=True, text=True)
            except (OSError, subprocess.CalledProcessError) as e:
                detail = getattr(e, "stderr", "") or str(e)
                raise LabError(f"building {what} failed ({detail.strip()}); run `make setup` "
                               "(it installs gcc, make and the headers)") from e
    return library
