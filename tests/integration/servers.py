"""Two servers emulated as network namespaces for the multi-server tests: ``nslab-<dc>-s1`` and
``-s2`` joined by one veth pair (the "data-centre network", 198.18.32.0/24, RFC 2544's
benchmarking range: never routed out), the second running Debian's sshd on its own lab
address, with a host key and a client key made for the test under the lab's state directory.
The first server is the local one: the test runs nslab's code with its thread inside that
namespace."""
import contextlib
import os
import shutil
import subprocess

from lab.names import netns_name, state_dir
from lab.netlink import entered
from lab.wait import wait_until
from topo.split import Server

SUBNET = "198.18.32"
SSHD_CONFIG = """ListenAddress {address}
HostKey {dir}/host_key
AuthorizedKeysFile {dir}/id.pub
PidFile {dir}/sshd-{name}.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
"""


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def emulated_servers(dc: str, nic_mbit=None):
    """``(servers, ssh_options)`` for two servers emulated in lab ``dc``'s namespaces, the
    calling thread inside the first; everything removed after (sshd by its PID)."""
    d = state_dir(dc)
    os.makedirs(d, exist_ok=True)
    names = [netns_name(dc, "s1"), netns_name(dc, "s2")]
    sshd = []
    try:
        for ns in names:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", names[0], "link", "add", "dc0", "type", "veth", "peer", "name", "dc0",
            "netns", names[1])
        servers = []
        for i, ns in enumerate(names):
            address = f"{SUBNET}.{i + 1}"
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "dc0")
            _ip("-n", ns, "link", "set", "dc0", "up")
            servers.append(Server(f"s{i + 1}", address, "" if i == 0 else f"root@{address}",
                                  nic_mbit))
        for key in ("host_key", "id"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            os.path.join(d, key)], check=True)
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        for s, ns in zip(servers[1:], names[1:], strict=True):
            conf = os.path.join(d, f"sshd-{s.name}.conf")
            with open(conf, "w") as f:
                f.write(SSHD_CONFIG.format(address=s.address, dir=d, name=s.name))
            # nsenter, not ip netns exec: the server keeps the machine's /sys (its cgroups)
            sshd.append(subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", "/usr/sbin/sshd",
                                          "-D", "-e", "-f", conf], stderr=subprocess.DEVNULL))
        options = ["-F", "/dev/null", "-i", os.path.join(d, "id"), "-o", "IdentitiesOnly=yes",
                   "-o", f"UserKnownHostsFile={d}/known_hosts",
                   "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=5"]
        with entered(names[0]):
            for s in servers[1:]:
                probe = ["ssh", *options, s.ssh, "true"]
                assert wait_until(lambda p=probe: subprocess.run(p, capture_output=True)
                                  .returncode == 0, 10, 0.1), f"sshd on {s.name} never answered"
            yield servers, options
    finally:
        for p in sshd:
            p.terminate()
            p.wait(timeout=10)
        for ns in names:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", ns)
        shutil.rmtree(d, ignore_errors=True)

