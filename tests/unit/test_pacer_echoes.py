"""The pacer's compiled loop (agents/native/pacer.c through agents.pacerio.Engine) matching echoes
to its probes, against a scripted peer on loopback: the engine probes 127.0.0.2, where the test
reads the probes and sends the echoes it chooses (none, a duplicate, a previous pacer's), on a
VM clock the test can step back (the engine's ``convert``, as the lab's ``clock_step`` fault).
No lab, no privileges: a hold's switch messages are netlink no-ops (the kernel skips them).

A step of the VM clock moves the probes' stamps and nothing the engine schedules (pacer.c's
header): a probe sent at once by a hold's start or end says when that happened, its stamp less
the step the true elapsed time."""
import socket
import struct
import time

import pytest

from agents.gate import GateConfig
from agents.pacerio import Engine

US, MS, S = 1_000, 1_000_000, 1_000_000_000
PEER = "127.0.0.2"
GATE = GateConfig(max_age_ns=S)     # T 0.5 ms, a probe late 5.5 ms after; 2 unanswered: 1 s
PROBE = ">4sB3xQq"                  # "NSPC", kind 1, pad, seq, tx_ns (pacer.c's header)
NOOP = struct.pack("=IHHII", 16, 1, 0, 0, 0)   # a hold's "switch": NLMSG_NOOP, not a request


class Peer:
    """The destination's end: a UDP socket on the engine's port at ``PEER``."""

    def __init__(self, port: int):
        self.port = port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((PEER, port))

    def probe(self, timeout: float = 2.0) -> tuple[int, int]:
        """The next probe's (seq, tx_ns).

        Raises:
            TimeoutError: none within ``timeout``."""
        self.sock.settimeout(timeout)
        b = self.sock.recv(64)
        magic, kind, seq, tx = struct.unpack(PROBE, b)
        assert (magic, kind) == (b"NSPC", 1), b
        return seq, tx

    def echo(self, seq: int, tx: int, owd_ns: int = 100 * US) -> None:
        """An echo of probe ``seq`` sent at ``tx``, there ``owd_ns`` later."""
        self.sock.sendto(struct.pack(PROBE + "q", b"NSPC", 2, seq, tx, tx + owd_ns),
                         ("127.0.0.1", self.port))


@pytest.fixture
def loop():
    """``start(pace, probe_s)``: an engine probing ``PEER`` (active, synchronized at zero
    offsets) on the clock ``shift[0]`` ns off the system's; (engine, peer, shift)."""
    made = []

    def start(pace: bool, probe_s: float, gate: GateConfig = GATE):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made.append(sock)
        sock.bind(("127.0.0.1", 0))
        port, shift = sock.getsockname()[1], [0]
        peer = Peer(port)
        made.append(peer.sock)
        eng = Engine(sock, port, [PEER], pace, gate, probe_s, lambda ns: ns + shift[0])
        made.insert(0, eng)
        eng.set_switch(0, NOOP, NOOP)
        eng.set_dest(0, True, True, 0.0, 0.0, 0)
        eng.set_dest(1, False, True, 0.0, 0.0, 0)
        eng.start()
        return eng, peer, shift

    yield start
    for x in made:
        x.close()


def test_a_clock_stepped_back_leaves_probing_and_the_overdue_hold_as_they_were(loop):
    """A probe sent at once (a hold's) after the VM clock stepped back carries a smaller stamp
    than the probes still unanswered from before the step: its echo answers them all (by
    sequence number), so probing goes on at its period (not one per max_age while an old probe
    counts as unanswered) and a probe left unanswered holds its destination T + the longest
    hold after its own send (not the old probe's, 10 s later on the stepped clock)."""
    eng, peer, shift = loop(pace=True, probe_s=0.02)
    a, b = peer.probe(), peer.probe()       # both unanswered: probing waits (IN_FLIGHT)
    shift[0] = -10 * S                      # the VM clock steps back 10 s
    peer.echo(*a, owd_ns=10 * MS)           # above T: a hold, with a probe sent in it at once
    answered, end = [], time.monotonic() + 1.0
    try:
        while time.monotonic() < end:       # every probe answered below T
            answered.append(peer.probe(max(end - time.monotonic(), 1e-3)))
            peer.echo(*answered[-1])
    except TimeoutError:
        pass
    assert answered[0][1] < b[1] - 9 * S    # the hold's probe, stamped before b
    assert len(answered) >= 20, answered    # one per 20 ms: 50 in 1 s
    overdue = eng.stats(0)[0].overdue
    peer.probe()                            # unanswered: a hold 5.5 ms after it was sent
    end = time.monotonic() + 1.0
    while eng.stats(0)[0].overdue == overdue and time.monotonic() < end:
        time.sleep(0.01)
    assert eng.stats(0)[0].overdue > overdue


def test_only_an_echo_of_an_unanswered_probe_answers_it(loop):
    """A previous pacer's echoes on the port (a sequence number this one never sent, or its
    own with another stamp) and a duplicate answer nothing and feed the gate nothing: they are
    ``stale``; ``sent - echoed`` is the probes lost."""
    eng, peer, _ = loop(pace=False, probe_s=10.0)
    seq, tx = peer.probe()                  # the only probe in 10 s
    peer.echo(seq + 6, tx - 5 * S)          # a previous pacer's
    peer.echo(seq, tx - 5 * S)              # a previous pacer's, of the same seq
    peer.echo(seq, tx)
    peer.echo(seq, tx)                      # a duplicate
    end = time.monotonic() + 2.0
    while (st := eng.stats(0)[0]).echoed + st.stale < 4 and time.monotonic() < end:
        time.sleep(0.01)
    assert (st.sent, st.echoed, st.samples, st.stale) == (1, 1, 1, 3)
    assert eng.drain()["tx_ns"].tolist() == [tx]


def test_probing_keeps_its_period_after_the_clock_steps_back(loop):
    """After the VM clock steps back 10 s, a destination is still probed every 20 ms: about 50
    probes, each answered, within a second (the period is not timed on the VM clock, which
    would put the next probe 10 s off)."""
    eng, peer, shift = loop(pace=False, probe_s=0.02)
    peer.echo(*peer.probe())
    shift[0] = -10 * S
    stamps, end = [], time.monotonic() + 1.0
    try:
        while time.monotonic() < end:
            seq, tx = peer.probe(max(end - time.monotonic(), 1e-3))
            peer.echo(seq, tx)
            stamps.append(tx)
    except TimeoutError:
        pass
    assert 25 <= len(stamps) <= 51, stamps  # 50 at the period; 0-1 scheduled on the VM clock
    assert max(stamps) < min(stamps) + S    # all on the stepped clock, one second apart


@pytest.mark.parametrize("step", [-10 * S, 10 * S])
def test_a_hold_across_a_clock_step_ends_at_its_bound(loop, step):
    """A hold (an echo 10 ms above T, no fresh sample after) ends at max_continuous_ns, 200 ms,
    although the VM clock stepped 10 s back (or forward) during it: its probe at the start and
    the one that wakes the released queue are 200 ms apart, less the step, on the VM clock."""
    gate = GateConfig(max_age_ns=S, max_continuous_ns=200 * MS)
    eng, peer, shift = loop(pace=True, probe_s=5.0, gate=gate)
    peer.echo(*peer.probe(), owd_ns=10 * MS)
    _, held = peer.probe()                  # the hold's own probe, sent as it starts
    shift[0] = step
    _, released = peer.probe()              # the released queue's wake-up probe
    took = released - held - step
    assert 200 * MS - MS <= took <= 200 * MS + 250 * MS, took / MS
    assert eng.stats(0)[0].switches >= 2    # held, then opened (and maybe held again since)


def test_the_overdue_hold_comes_on_time_after_the_clock_steps_back(loop):
    """A probe sent before the VM clock steps back 10 s and never answered holds its destination
    T + the longest hold (50.5 ms) after it was sent (the hold's probe then), not 10 s later."""
    gate = GateConfig(max_hold_ns=50 * MS, max_age_ns=S)
    eng, peer, shift = loop(pace=True, probe_s=0.3, gate=gate)
    peer.echo(*peer.probe())                # answered: the destination is not silent
    _, sent = peer.probe()                  # never answered
    shift[0] = -10 * S
    _, held = peer.probe()                  # the overdue hold's probe (the period's: 300 ms)
    took = held - sent + 10 * S
    assert gate.late_ns <= took <= gate.late_ns + 200 * MS, took / MS
    assert eng.stats(0)[0].overdue == 1
