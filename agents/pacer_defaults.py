"""The pacer's defaults, in its command line's units (``python -m agents pacer --help``): one
definition for the command line, ``agents.pacer.PacerConfig``, ``agents.gate.GateConfig`` and
the scenario's ``pacer:`` section (``session.daemons.PacerSpec``). What each means: the
command line's help and ``docs/how-it-works/pacer-datapath.md``."""

MODE = "pace"
PORT = 7703
LINE_MBIT = 10_000.0
DATAPATH = "bpf"
PIN_DIR = "/sys/fs/bpf/nslab-pacer"
HOLD = "auto"
THRESHOLD_FROM = "zero"
THRESHOLD_US = 500.0
MAX_HOLD_US = 5000.0
PROBE_US = 500.0
ACTIVE_S = 1.0
QUANTUM_US = 0.0
PREDICT = True
FRESH = True
SPREAD = False
WINDOW_CLAMP = False
WINDOW_QUEUE = 2
ACK_PACE = 0.0
