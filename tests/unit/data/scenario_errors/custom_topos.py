"""A Mininet custom topology file (as for mn --custom) for the golden scenario errors."""
from mininet.topo import Topo


class Star(Topo):
    def build(self, n=3):
        s = self.addSwitch("s1")
        for i in range(1, n + 1):
            self.addLink(self.addHost(f"h{i}"), s)


topos = {"star": Star}
