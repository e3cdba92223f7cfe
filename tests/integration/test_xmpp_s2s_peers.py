"""Federation with the other servers, each as Debian ships it (issue 32 §3): Prosody 0.12 and
ejabberd 23.01 in turn serve peer.test beside rtd's rt.test, each on its own loopback address
at port 5269, in a network namespace of their own (dns_util.Netns) whose /etc/hosts names the
two domains and their MUC services and whose DNS server knows no SRV records: each server
finds the other as RFC 6120 3.2.2 says, by the domain's own address on 5269 (rtd through
xmpp.s2s_dns, ejabberd through its resolver, Prosody through libunbound, which is pointed at
the same files). Both as they federate by default: TLS on server-to-server streams,
certificates not required to verify (the test's own CA; Prosody's s2s_secure_auth = false,
ejabberd tries SASL EXTERNAL, is refused it and falls back), so both directions go over
STARTTLS and prove themselves by dialback (ejabberd's mod_s2s_dialback). Messages both ways,
a bare JID's offline store on rtd's side, the other server answering a ping to its domain
both ways, directed presence with its unavailable at the session's end, subscriptions both
ways with broadcasts and a probe, group chat both ways (rtd's user in a room of the peer's
MUC, the peer's user in a room of rtd's), and a push notification to an app server on the
peer. Raw clients on both servers, all in the namespace."""
import contextlib
import os
import re
import subprocess
import tempfile
import shutil
import time

import pytest

import xmpp_peer
import xmpp_util as X
from conftest import Rtd, free_port, wait_listening
from dns_util import DnsServer, Netns

PW = "fed pw"
RT_ADDR, PEER_ADDR = "127.0.0.5", "127.0.0.6"


def prosody_config(d, c2s_port, s2s_addr, cert, key, domain="peer.test"):
    return f'''run_as_root = true
pidfile = "{d}/prosody.pid"
data_path = "{d}/data"
log = {{ info = "{d}/prosody.log" }}
network_backend = "epoll"
c2s_ports = {{ {c2s_port} }}
c2s_interfaces = {{ "127.0.0.1" }}
s2s_ports = {{ 5269 }}
s2s_interfaces = {{ "{s2s_addr}" }}
http_ports = {{ }}
https_ports = {{ }}
c2s_direct_tls_ports = {{ }}
s2s_direct_tls_ports = {{ }}
c2s_require_encryption = false
s2s_require_encryption = true
s2s_secure_auth = false
allow_registration = true
registration_whitelist = {{ "127.0.0.1" }}
modules_enabled = {{ "roster", "saslauth", "disco", "ping", "register", "offline", "posix",
                    "dialback", "tls" }}
unbound = {{ hoststxt = "{d}/hosts", resolvconf = "{d}/resolv.conf" }}
ssl = {{ certificate = "{cert}", key = "{key}" }}
VirtualHost "{domain}"
    authentication = "internal_plain"
Component "conference.{domain}" "muc"
    muc_room_locking = false
'''


def start_prosody(ns, d, cert, key):
    """Prosody on PEER_ADDR, its users made by in-band registration; (process, c2s port)."""
    if not xmpp_peer.installed("prosody"):
        pytest.fail("prosody is missing; run tools/install-deps.sh --for test")
    with open(os.path.join(d, "hosts"), "w") as f:  # libunbound reads these, not /etc's
        f.write(f"{RT_ADDR} rt.test conference.rt.test\n")
    with open(os.path.join(d, "resolv.conf"), "w") as f:
        f.write("nameserver 127.0.0.1\n")
    os.makedirs(os.path.join(d, "data"))
    port = free_port()
    with open(os.path.join(d, "prosody.cfg.lua"), "w") as f:
        f.write(prosody_config(d, port, PEER_ADDR, cert, key))
    argv, env = xmpp_peer.command("prosody", d)
    with open(os.path.join(d, "out.log"), "w") as log:
        proc = subprocess.Popen(ns.command(argv), stdout=log, stderr=subprocess.STDOUT, cwd=d,
                                env=dict(os.environ, **env))
    wait_listening(proc, port, 30, "prosody", lambda: read(d, "prosody.log"))
    for u in ("pat", "pia"):
        xmpp_peer.register(port, f"{u}@peer.test", PW)
    return proc, port


class Fed:
    """The pair under test: rtd (rtd.xport its client port), the peer's client port and log."""

    def __init__(self, name, rtd, pport, read_peer_log):
        self.name, self.rtd, self.xport, self.pport = name, rtd, rtd.xport, pport
        self.read_peer_log = read_peer_log

    def read_log(self):
        return self.rtd.read_log()

    def ctl(self, *args):
        return self.rtd.ctl(*args)


@contextlib.contextmanager
def federation(pki, name, trusted=False):
    """rtd and the peer name in a namespace of their own, this thread in it: a Fed. trusted:
    each shows a certificate the test CA issued for its domain and trusts that CA (rtd's
    listener with verify = "request"), so that SASL EXTERNAL can prove each to the other."""
    ns = Netns(f"rt-s2s-{name}{'-ca' if trusted else ''}-{os.getpid()}",
               {RT_ADDR: ["rt.test", "conference.rt.test"],
                PEER_ADDR: ["peer.test", "conference.peer.test"]})
    d = tempfile.mkdtemp(prefix=f"s2s-{name}-")
    pdir, rdir = os.path.join(d, name), os.path.join(d, "rt")
    os.makedirs(pdir)
    os.makedirs(rdir)
    cert, key = pki.ca.issue_domain(d, "rt", "rt.test") if trusted else pki.server["ec"]
    verify = f', ca = "{pki.ca.cert}", verify = "request"' if trusted else ""
    rtd = proc = peer = dns = None
    try:
        with ns.inside():
            dns = DnsServer({})
            if name == "prosody":
                proc, pport = start_prosody(ns, pdir, cert, key)
                read_peer_log = lambda: read(pdir, "prosody.log")  # noqa: E731
            else:
                if not xmpp_peer.installed("ejabberd"):
                    pytest.fail("ejabberd is missing; run tools/install-deps.sh --for test")
                pcert, pkey = pki.ca.issue_domain(d, "peer", "peer.test") if trusted else (cert, key)
                pem = os.path.join(d, "peer-with-key.pem")  # ejabberd: the key in the same file
                with open(pem, "w") as f, open(pcert) as c, open(pkey) as k:
                    f.write(c.read() + k.read())
                peer = xmpp_peer.Peer("ejabberd", pdir, free_port(), ["peer.test"], [],
                                      ["pat", "pia"], PW, netns=ns, muc=True,
                                      s2s=(PEER_ADDR, pem, pki.ca.cert if trusted else None))
                pport, read_peer_log = peer.xport, peer.read_log
            X.add_users(rdir, [(f"{u}@rt.test", PW) for u in ("rita", "rosa", "ruth")])
            cport = free_port()
            rtd = Rtd(f'xmpp={{ hosts = {{ "rt.test" }}, listeners = {{ "127.0.0.1:{cport}", '
                      f'{{ bind = "{RT_ADDR}:5269", s2s = true, starttls = true, '
                      f'tls = {{ cert = "{cert}", key = "{key}"{verify} }} }} }}, '
                      'muc_host = "conference.@HOST@", muc_room_locking = false }',
                      "auth_max_delay_ms=0", data_dir=rdir, netns=ns.name)
            rtd.xport = cport
            yield Fed(name, rtd, pport, read_peer_log)
    finally:
        code, log = rtd.stop() if rtd else (0, "")
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
        if peer:
            peer.stop()
        if dns:
            dns.close()
        shutil.rmtree(d, ignore_errors=True)
        ns.delete()
        assert code == 0, log[-3000:]


@pytest.fixture(scope="module", params=["prosody", "ejabberd"])
def fed(request, pki):
    with federation(pki, request.param) as f:  # the module's tests run in the namespace
        yield f


def read(d, name):
    try:
        with open(os.path.join(d, name), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def on_rt(rtd, user, resource="r"):
    return X.session(rtd.xport, user, "rt.test", PW, resource)


def on_peer(fed, user, resource="p"):
    return X.session(fed.pport, user, "peer.test", PW, resource)


def available(r, jid):
    r.send("<presence/>")
    r.read_until(rf"<presence[^>]*from=['\"]{jid}['\"]".encode())


def leave(r):
    r.send("</stream:stream>")
    r.read_to_close()


def logs(fed):
    return fed.read_log()[-3000:] + f"\n--- {fed.name} ---\n" + fed.read_peer_log()[-3000:]


def test_messages_both_ways_over_tls_and_dialback(fed):
    rita, pat = on_rt(fed, "rita"), on_peer(fed, "pat")
    available(pat, "pat@peer.test/p")
    available(rita, "rita@rt.test/r")
    rita.send("<message to='pat@peer.test/p' type='chat' id='x1'><body>hi pat</body></message>")
    text = pat.read_until(rb"<message.*?</message>", timeout=30)
    m = X.first_el(text, "message")
    assert m.get("from") == "rita@rt.test/r" and "<body>hi pat</body>" in text, logs(fed)
    pat.send("<message to='rita@rt.test' type='chat' id='x2'><body>hi rita</body></message>")
    text = rita.read_until(rb"<message[^>]*id=['\"]x2['\"].*?</message>", timeout=30)
    assert "from='pat@peer.test/p'" in text and "<body>hi rita</body>" in text, text
    log = fed.read_log()
    assert re.search(r"xmpp.server_out local=rt.test remote=peer.test tls=yes", log), logs(fed)
    assert re.search(r"xmpp.server_in from=peer.test to=rt.test tls=yes", log), logs(fed)
    leave(rita)
    leave(pat)


def test_offline_on_rt_and_pings_both_ways(fed):
    pia = on_peer(fed, "pia")
    pia.send("<message to='ruth@rt.test' type='chat' id='o1'><body>while you were out</body>"
             "</message>")
    deadline = time.monotonic() + 30
    while X.metric(fed, "rt_xmpp_offline_stored_total") < 1:
        assert time.monotonic() < deadline, logs(fed)
        time.sleep(0.05)
    ruth = on_rt(fed, "ruth")
    ruth.send("<presence/>")
    text = ruth.read_until(rb"<body>while you were out</body>.*?</message>", timeout=30)
    assert "from='pia@peer.test/p'" in text, text
    ruth.send("<iq type='get' id='pg1' to='peer.test'><ping xmlns='urn:xmpp:ping'/></iq>")
    text = ruth.read_until(rb"<iq[^>]*id='pg1'[^>]*(/>|>.*?</iq>)", timeout=30)
    assert "type='result'" in text, text
    pia.send("<iq type='get' id='pg2' to='rt.test'><ping xmlns='urn:xmpp:ping'/></iq>")
    text = pia.read_until(rb"<iq[^>]*id=['\"]pg2['\"][^>]*(/>|>.*?</iq>)", timeout=30)
    assert re.search(r"type=['\"]result['\"]", text), text
    leave(ruth)
    leave(pia)


def test_directed_presence_and_its_unavailable(fed):
    rosa, pat = on_rt(fed, "rosa", "dp"), on_peer(fed, "pat", "dp")
    available(pat, "pat@peer.test/dp")
    rosa.send("<presence to='pat@peer.test/dp'><status>hello</status></presence>")
    text = pat.read_until(rb"<presence[^>]*from=['\"]rosa@rt.test/dp['\"].*?(/>|</presence>)",
                          timeout=30)
    assert "<status>hello</status>" in text, text
    leave(rosa)
    text = pat.read_until(rb"<presence[^>]*type=['\"]unavailable['\"][^>]*>", timeout=30)
    assert re.search(r"from=['\"]rosa@rt.test/dp['\"]", text), text
    leave(pat)


def roster_state(r, jid, rid):
    r.send(f"<iq type='get' id='{rid}'><query xmlns='jabber:iq:roster'/></iq>")
    text = r.read_until(rf"<iq[^>]*id=['\"]{rid}['\"].*?</iq>".encode(), timeout=30)
    m = re.search(rf"<item[^>]*jid=['\"]{re.escape(jid)}['\"][^>]*>", text)
    s = re.search(r"subscription=['\"](\w+)['\"]", m.group(0)) if m else None
    return s.group(1) if s else None


def test_subscriptions_both_ways_broadcast_and_probe(fed):
    """Each asks the other (RFC 6121 3): both rosters end at "both"; then the peer's user's
    broadcast reaches rtd's user and rtd's user's broadcast reaches the peer's, and a new
    session on rtd's side probes the peer's user (4.3) and gets her presence."""
    rita, pia = on_rt(fed, "rita", "sub"), on_peer(fed, "pia", "sub")
    # Interested resources (RFC 6121 2.1.6): Prosody gives subscription stanzas only to those.
    roster_state(pia, "rita@rt.test", "r0")
    roster_state(rita, "pia@peer.test", "r0")
    available(pia, "pia@peer.test/sub")
    available(rita, "rita@rt.test/sub")
    X.subscribe_across(rita, "rita@rt.test", pia, "pia@peer.test")
    X.subscribe_across(pia, "pia@peer.test", rita, "rita@rt.test")
    assert roster_state(rita, "pia@peer.test", "r1") == "both"
    assert roster_state(pia, "rita@rt.test", "r2") == "both"
    # Broadcasts both ways: a status change of each reaches the other.
    pia.send("<presence><status>away on the peer</status></presence>")
    rita.read_until(rb"<status>away on the peer</status>", timeout=30)
    rita.send("<presence><status>busy on rt</status></presence>")
    pia.read_until(rb"<status>busy on rt</status>", timeout=30)
    # A second session on rtd's side probes: the peer answers with pia's presence.
    rita2 = on_rt(fed, "rita", "two")
    rita2.send("<presence/>")
    rita2.read_until(rb"<presence[^>]*from=['\"]pia@peer.test/sub['\"]", timeout=30)
    for r in (rita2, rita, pia):
        leave(r)


def test_a_room_on_the_peer_with_an_occupant_from_rt(fed):
    """XEP-0045 across servers: rtd's user joins a room of the peer's MUC service, sees the
    occupants' presence, and the groupchat messages go both ways through the room."""
    room = "lobby@conference.peer.test"
    pia, rosa = on_peer(fed, "pia", "muc"), on_rt(fed, "rosa", "muc")
    muc = "<x xmlns='http://jabber.org/protocol/muc'/>"
    pia.send(f"<presence to='{room}/pia'>{muc}</presence>")
    pia.read_until(rb"<presence[^>]*from=['\"]lobby@conference.peer.test/pia['\"].*?</presence>",
                   timeout=30)
    rosa.send(f"<presence to='{room}/rosa'>{muc}</presence>")
    text = rosa.read_until(rb"<presence[^>]*from=['\"]lobby@conference.peer.test/rosa['\"]"
                           rb".*?</presence>", timeout=30)
    assert "status code='110'" in text or 'status code="110"' in text, text  # self-presence
    pia.read_until(rb"<presence[^>]*from=['\"]lobby@conference.peer.test/rosa['\"]", timeout=30)
    rosa.send(f"<message to='{room}' type='groupchat'><body>hello from rt</body></message>")
    text = pia.read_until(rb"<body>hello from rt</body>", timeout=30)
    assert re.search(r"from=['\"]lobby@conference.peer.test/rosa['\"]", text), text
    pia.send(f"<message to='{room}' type='groupchat'><body>hello from the peer</body></message>")
    text = rosa.read_until(rb"<body>hello from the peer</body>", timeout=30)
    assert re.search(r"from=['\"]lobby@conference.peer.test/pia['\"]", text), text
    leave(rosa)  # its unavailable leaves the room: pia sees rosa go
    text = pia.read_until(rb"<presence[^>]*type=['\"]unavailable['\"][^>]*>", timeout=30)
    assert re.search(r"from=['\"]lobby@conference.peer.test/rosa['\"]", text), text
    leave(pia)


def test_a_room_on_rt_with_an_occupant_from_the_peer(fed):
    """The other way: the peer's user joins a room of rtd's MUC service (made by rtd's user:
    another server's users join rooms, they do not make them), and the groupchat goes both
    ways; a join to a room that is not there is refused (not-allowed)."""
    room = "hall@conference.rt.test"
    ruth, pat = on_rt(fed, "ruth", "muc"), on_peer(fed, "pat", "muc")
    muc = "<x xmlns='http://jabber.org/protocol/muc'/>"
    ruth.send(f"<presence to='{room}/ruth'>{muc}</presence>")
    ruth.read_until(rb"<presence[^>]*from='hall@conference.rt.test/ruth'.*?</presence>")
    pat.send(f"<presence to='{room}/pat'>{muc}</presence>")
    text = pat.read_until(rb"<presence[^>]*from=['\"]hall@conference.rt.test/pat['\"].*?</presence>",
                          timeout=30)
    assert "110" in text, text
    ruth.read_until(rb"<presence[^>]*from='hall@conference.rt.test/pat'", timeout=30)
    pat.send(f"<message to='{room}' type='groupchat'><body>from the peer to rt</body></message>")
    text = ruth.read_until(rb"<body>from the peer to rt</body>", timeout=30)
    assert "from='hall@conference.rt.test/pat'" in text, text
    ruth.send(f"<message to='{room}' type='groupchat'><body>from rt to the peer</body></message>")
    text = pat.read_until(rb"<body>from rt to the peer</body>", timeout=30)
    assert re.search(r"from=['\"]hall@conference.rt.test/ruth['\"]", text), text
    pat.send(f"<presence to='nowhere@conference.rt.test/pat'>{muc}</presence>")
    text = pat.read_until(rb"<presence[^>]*type=['\"]error['\"].*?</presence>", timeout=30)
    assert "not-allowed" in text, text
    leave(pat)  # the peer sends its unavailable to the room: ruth sees pat go
    text = ruth.read_until(rb"<presence[^>]*type='unavailable'[^>]*>", timeout=30)
    assert "from='hall@conference.rt.test/pat'" in text, text
    leave(ruth)


def test_push_to_an_app_server_on_the_peer(fed):
    """XEP-0357 across servers: rtd's user enables an app server that is a session on the peer;
    a message kept offline for that user makes rtd publish the summary there, through
    federation."""
    pat = on_peer(fed, "pat", "push")
    rita = on_rt(fed, "rita", "phone")
    rita.send("<iq type='set' id='e1'><enable xmlns='urn:xmpp:push:0' "
              "jid='pat@peer.test/push' node='rita-phone'/></iq>")
    assert "type='result'" in rita.read_until(rb"<iq[^>]*id='e1'[^>]*(/>|>.*?</iq>)")
    leave(rita)
    ruth = on_rt(fed, "ruth", "pusher")
    ruth.send("<message to='rita@rt.test' type='chat'><body>wake up</body></message>")
    text = pat.read_until(rb"<iq[^>]*>.*?</iq>", timeout=30)
    assert re.search(r"from=['\"]rita@rt.test['\"]", text), text
    assert "rita-phone" in text and "urn:xmpp:push:summary" in text, text
    assert "wake up" not in text, text
    leave(ruth)
    leave(pat)


def test_certificates_instead_of_dialback_with_ejabberd(pki):
    """SASL EXTERNAL both ways with ejabberd (XEP-0178 between servers): each shows a
    certificate for its domain from a CA the other trusts; no dialback either way."""
    with federation(pki, "ejabberd", trusted=True) as f:
        rita, pat = on_rt(f, "rita"), on_peer(f, "pat")
        rita.send("<message to='pat@peer.test/p' type='chat' id='t1'><body>t1</body></message>")
        text = pat.read_until(rb"<body>t1</body>|<message[^>]*type=.error.*?</message>", timeout=30)
        assert "t1" in text, logs(f) + text
        pat.send("<message to='rita@rt.test/r' type='chat' id='t2'><body>t2</body></message>")
        text = rita.read_until(rb"<body>t2</body>|<message[^>]*type=.error.*?</message>", timeout=30)
        assert "t2" in text, logs(f) + text
        log = f.read_log()
        assert "xmpp.server_out local=rt.test remote=peer.test tls=yes auth=external" in log, \
            logs(f)
        assert "xmpp.server_in from=peer.test to=rt.test tls=yes auth=external" in log, logs(f)
        assert "auth=dialback" not in log, logs(f)
        leave(rita)
        leave(pat)
