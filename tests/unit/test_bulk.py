"""workloads.bulk over loopback: both ends count every byte of the transfer."""
import errno
import socket
import threading

import pytest

from workloads.bulk import receive, send


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_send_ends_after_the_receiver_has_every_byte():
    port, got = free_port(), {}
    rx = threading.Thread(target=lambda: got.update(receive(port, timeout_s=10)))
    rx.start()
    out = send("127.0.0.1", port, 3_000_001, dscp=3, timeout_s=10)
    rx.join(timeout=10)
    assert got["bytes"] == out["bytes"] == 3_000_001
    # a loaded machine may retransmit even over loopback: the count is read, not assumed
    assert isinstance(out["retransmits"], int) and out["retransmits"] >= 0
    assert out["seconds"] > 0


def test_unknown_congestion_control_is_an_error_before_connecting():
    port = free_port()
    with pytest.raises(OSError) as exc:  # from TCP_CONGESTION, not a refused connection
        send("127.0.0.1", port, 10, cc="nosuch", timeout_s=1)
    assert exc.value.errno == errno.ENOENT
