# nslab: `sudo make lab` runs the default scenario, `sudo make test` the whole suite.
# `setup` is idempotent: it installs only what is missing and re-installs the venv only
# when pyproject.toml changed.

PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.nslab-installed
# command -> Debian package that provides it (tshark: the tests read captures with the
# probe format's Wireshark dissector, tools/wireshark/nslab_probe.lua; chromium: the tests
# open nslab report's HTML page in a headless browser, tests/unit/test_report_browser.py, and
# load `nslab tui --serve` in one, tests/integration/test_tui_serve.py; clang, libbpf-dev: the
# pacer's kernel datapath, agents/native/pacer.bpf.c; bpftool: to inspect its maps, pinned in
# each VM's bpffs; sshd, ssh: the multi-server test runs sshd inside a lab namespace only,
# tests/integration/servers.py, and starts no service)
DEB_CMDS := mnexec:mininet ip:iproute2 tc:iproute2 nft:nftables iperf3:iperf3 \
            tcpdump:tcpdump tshark:tshark ifconfig:net-tools ping:iputils-ping ps:procps \
            gcc:gcc make:make chromium:chromium clang:clang bpftool:bpftool \
            sshd:openssh-server ssh:openssh-client
SCENARIO ?= quickstart

.PHONY: setup system-packages native bpf chrony clockd lab test unit integration docs tui tui-recording \
        bench clean

setup: system-packages $(STAMP) native chrony clockd

# the compiled parts, compiled into nslab's cache (/var/cache/nslab as root) as a lab would at
# first use (agents/native/__init__.py): the VM clock preload (vmclock/vmclock.c), the agent's
# datagram path (agents/native/probeio.c, libcrypto for its HMAC tags), the pacer's loop and
# its kernel datapath (agents/native/pacer.bpf.c, clang -target bpf)
native: system-packages $(STAMP)
	@$(BIN)/python -m lab.native

# the pacer's kernel datapath alone (one of the parts `native` builds)
bpf: system-packages $(STAMP)
	@$(BIN)/python -m lab.native pacer_bpf

# Debian's chronyd for the `chrony` scenario, unpacked into nslab's cache (not installed: no
# service starts, nothing touches the machine's clock); skipped when chronyd is found
chrony: system-packages $(STAMP)
	@$(BIN)/python -c 'import sys; from session import chrony; sys.exit(chrony.find() is None)' \
	  || { d=$$($(BIN)/python -c 'from session import chrony; print(chrony.unpacked_dir())'); \
	  mkdir -p $$d && cd $$d && { apt-get download -qq chrony 2>/dev/null \
	    || { apt-get update -qq && apt-get download -qq chrony; }; } && \
	  dpkg-deb -x chrony_*.deb . && rm -f chrony_*.deb; }

# Debian's ntpsec (ntpd) and linuxptp (ptp4l) for the clock_daemons scenario, unpacked into
# nslab's cache as chrony is (session/clockd.py); each skipped when found
clockd: system-packages $(STAMP)
	@for pkg in $$($(BIN)/python -c 'from session import clockd; print(*clockd.missing())'); do \
	  d=$$($(BIN)/python -c "from session import clockd; print(clockd.unpacked_dir('$$pkg'))"); \
	  ( mkdir -p $$d && cd $$d && { apt-get download -qq $$pkg 2>/dev/null \
	    || { apt-get update -qq && apt-get download -qq $$pkg; }; } && \
	    dpkg-deb -x $${pkg}_*.deb . && rm -f $${pkg}_*.deb ) || exit 1; done

system-packages:
	@missing=""; for pair in $(DEB_CMDS); do \
	  cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	$(PYTHON) -c 'import ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	test -f /usr/include/stdio.h || missing="$$missing libc6-dev"; \
	test -f /usr/include/openssl/hmac.h || missing="$$missing libssl-dev"; \
	test -f /usr/include/bpf/bpf_helpers.h || missing="$$missing libbpf-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "setup: installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "setup: system packages present"; fi

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,tui,torch]'
	@touch $(STAMP)

lab: setup
	$(BIN)/nslab run $(SCENARIO)

# the docs site (mkdocs.yml, docs/), warnings and broken links failing it; then unit tests on three
# workers (pytest-xdist; the TUI's tests wait on their pilots, so a third worker beside two
# cores gains about a fifth), then the labs one at a time (with the
# wheel installed in a fresh venv outside the checkout: tests/integration/test_wheel.py)
test: setup docs
	$(BIN)/python -m pytest -q -ra -n 3 tests/unit
	$(BIN)/python -m pytest -q -ra tests/integration

docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -d build/site

unit: setup
	$(BIN)/python -m pytest -q -ra -n 3 tests/unit

integration: setup
	$(BIN)/python -m pytest -q -ra tests/integration

tui: setup
	$(BIN)/nslab tui $(SCENARIO)

# the TUI's demo recording, from a real run of its scenario (root, about a minute), and the
# README's and the docs' screenshot of its last frame (tests/unit/test_tui_recording.py checks what it holds)
tui-recording: setup
	$(BIN)/nslab tui tui/scenarios/tui_demo.yaml --record tui/recordings/tui_demo.json \
	  --headless 180
	$(BIN)/nslab tui --replay tui/recordings/tui_demo.json --frame -1 \
	  --screenshot docs/tui.svg --after 2

bench: setup
	$(BIN)/python benchmarks/bringup.py
	$(BIN)/python benchmarks/link_accuracy.py
	$(BIN)/python benchmarks/collectives.py
	$(BIN)/python benchmarks/collocation.py
	$(BIN)/python benchmarks/stories.py quickstart two_step cassini lb_compare
	$(BIN)/python benchmarks/sync.py
	$(BIN)/python benchmarks/cassini.py
	$(BIN)/python benchmarks/vmclock.py
	$(BIN)/python benchmarks/chrony.py
	$(BIN)/python benchmarks/clock_daemons.py
	$(BIN)/python benchmarks/pacer.py
	$(BIN)/python benchmarks/pacer_model.py
	$(BIN)/python benchmarks/exercise_pacer.py
	$(BIN)/python benchmarks/lb.py
	$(BIN)/python benchmarks/soak.py
	$(BIN)/python benchmarks/fuzz.py

clean:
	rm -rf $(VENV) *.egg-info build
