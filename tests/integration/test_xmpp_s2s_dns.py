"""Federation found through DNS (RFC 6120 3.2): two rtds, a.test and b.test, with no
xmpp.s2s_peers, in a network namespace of their own (`ip netns`: its own loopback, and its
own /etc/hosts and resolv.conf, which point the system's resolver at a DNS server this test
runs there). b.test has SRV records: the first target (priority 10) accepts and closes at
once, so the second (priority 20) is the one that serves, after the first was tried. a.test
has none: b.test falls back to a.test's own address on 5269 (3.2.2), for its stanzas and for
its dialback verification. A domain whose SRV target is "." (no service) and one DNS does not
know are bounced with remote-server-not-found."""
import os
import shutil
import socket
import tempfile
import threading

import pytest

import xmpp_util as X
from conftest import Rtd, free_port
from dns_util import DnsServer, Netns

PW = "dns secret"
A_ADDR, B_ADDR, DEAD_ADDR = "127.0.0.4", "127.0.0.2", "127.0.0.3"


class Closer:
    """Accepts on addr and closes each connection at once, counting them: a server that is
    there but does not serve."""

    def __init__(self, addr):
        self.sock = socket.create_server(addr)
        self.count = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            c.close()


@pytest.fixture(scope="module")
def net(pki):
    ns = Netns(f"rt-s2s-dns-{os.getpid()}", {A_ADDR: ["a.test"], B_ADDR: ["srv2.b.test"],
                                             DEAD_ADDR: ["srv1.b.test"]})
    rtds, tmps, dns, closer = [], [], None, None
    try:
        with ns.inside():
            b_port, dead_port = free_port(), free_port()
            dns = DnsServer({
                ("_xmpp-server._tcp.b.test", "SRV"): [f"20 0 {b_port} srv2.b.test.",
                                                      f"10 0 {dead_port} srv1.b.test."],
                ("_xmpp-server._tcp.none.test", "SRV"): ["0 0 0 ."],
            })
            closer = Closer((DEAD_ADDR, dead_port))
            cert, key = pki.server["ec"]
            tls = f'starttls = true, tls = {{ cert = "{cert}", key = "{key}" }}'
            for domain, users, s2s in (("a.test", ["alice"], f"{A_ADDR}:5269"),
                                       ("b.test", ["bob"], f"{B_ADDR}:{b_port}")):
                tmp = tempfile.mkdtemp(prefix=f"s2s-dns-{domain}-")
                tmps.append(tmp)
                X.add_users(tmp, [(f"{u}@{domain}", PW) for u in users])
                c2s = free_port()
                r = Rtd(f'xmpp={{ hosts = {{ "{domain}" }}, listeners = {{ "127.0.0.1:{c2s}", '
                        f'{{ bind = "{s2s}", s2s = true, {tls} }} }} }}', "auth_max_delay_ms=0",
                        "log_level=debug", data_dir=tmp, netns=ns.name)
                r.xport = c2s
                rtds.append(r)
            yield ns, rtds[0], rtds[1], dns, closer
    finally:
        stopped = [r.stop() for r in rtds]  # all before any verdict
        for c in (dns, closer and closer.sock):
            if c:
                c.close()
        for t in tmps:
            shutil.rmtree(t, ignore_errors=True)
        ns.delete()
        for code, log in stopped:
            assert code == 0, log[-3000:]


def client(rtd, user, domain):
    return X.session(rtd.xport, user, domain, PW)


def test_srv_records_and_the_domains_own_address(net):
    ns, ra, rb, dns, closer = net
    with ns.inside():
        alice, bob = client(ra, "alice", "a.test"), client(rb, "bob", "b.test")
        alice.send("<message to='bob@b.test/r' type='chat' id='d1'><body>via srv</body></message>")
        text = bob.read_until(rb"<message[^>]*id='d1'.*?</message>")
        assert "from='alice@a.test/r'" in text and "<body>via srv</body>" in text, text
        # The priority-10 target was tried first: it took the connection and closed it.
        assert closer.count >= 1
        assert ("_xmpp-server._tcp.b.test", "SRV") in dns.asked
        bob.send("<message to='alice@a.test/r' type='chat' id='d2'><body>via a</body></message>")
        text = alice.read_until(rb"<message[^>]*id='d2'.*?</message>")
        assert "from='bob@b.test/r'" in text and "<body>via a</body>" in text, text
        # a.test has no SRV records: b.test asked, then took a.test's address on 5269.
        assert ("_xmpp-server._tcp.a.test", "SRV") in dns.asked
        assert "xmpp.server_out local=a.test remote=b.test tls=yes" in ra.read_log()
        assert "xmpp.server_out local=b.test remote=a.test tls=yes" in rb.read_log()
        for c in (alice, bob):
            c.send("</stream:stream>")
            c.read_to_close()


def test_no_service_and_unknown_domains_bounce(net):
    ns, ra, rb, dns, _ = net
    with ns.inside():
        alice = client(ra, "alice", "a.test")
        for i, domain in enumerate(("none.test", "missing.test")):
            alice.send(f"<message to='x@{domain}' type='chat' id='n{i}'><body>?</body></message>")
            text = alice.read_until(rf"<message[^>]*id='n{i}'.*?</message>".encode())
            assert "type='error'" in text and "remote-server-not-found" in text, text
            assert (f"_xmpp-server._tcp.{domain}", "SRV") in dns.asked
        log = ra.read_log()
        assert 'remote=none.test reason="the domain offers no server-to-server service (DNS)"' \
            in log, log[-3000:]
        assert 'remote=missing.test reason="no address for the domain (DNS)"' in log, log[-3000:]
        alice.send("</stream:stream>")
        alice.read_to_close()
