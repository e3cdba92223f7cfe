"""Federation (RFC 6120 server-to-server with XEP-0220 dialback) between two real rtds on
loopback, a.test and b.test, each finding the other through xmpp.s2s_peers: messages both
ways (to a full JID, to a bare JID, kept offline for a user who is not on), an iq between
full JIDs and one the other server answers itself (ping), directed presence and its
unavailable at the session's end, a subscription across with the broadcast, a probe and
unsubscribed, a stanza for a domain nobody serves bounced, a peer that is
down bounced with remote-server-not-found, dialback refused for a key the other server never
gave, and stanzas before dialback refused as a stream error. Both ways over STARTTLS (the s2s
listeners carry the test certificate) and, in one test, in the clear (loopback is in
xmpp.plaintext_from). Raw clients, so every element is the test's."""
import re
import shutil
import tempfile
import time

import pytest

import xmpp_util as X
from conftest import Rtd, free_port

PW = "fed secret"
NS_STREAMS = "http://etherx.jabber.org/streams"


class Server:
    def __init__(self, domain, users, tls, peers):
        self.domain, self.tmp = domain, tempfile.mkdtemp(prefix=f"s2s-{domain}-")
        X.add_users(self.tmp, [(f"{u}@{domain}", PW) for u in users])
        self.c2s, self.s2s = free_port(), free_port()
        self.tls, self.peers = tls, peers


def start(server, peers):
    tls = ""
    if server.tls:
        cert, key = server.tls
        tls = f', starttls = true, tls = {{ cert = "{cert}", key = "{key}" }}'
    peer_list = ", ".join(f'"{d}=127.0.0.1:{p}"' for d, p in peers.items())
    rtd = Rtd(f'xmpp={{ hosts = {{ "{server.domain}" }}, listeners = {{ "127.0.0.1:{server.c2s}", '
              f'{{ bind = "127.0.0.1:{server.s2s}", s2s = true{tls} }} }}, '
              f's2s_peers = {{ {peer_list} }}, s2s_dns = false }}', "auth_max_delay_ms=0", data_dir=server.tmp)
    rtd.xport = server.c2s
    return rtd


def pair(tls):
    a = Server("a.test", ["alice", "amy"], tls, None)
    b = Server("b.test", ["bob", "bea"], tls, None)
    down = free_port()  # nothing listens there: a peer that is down
    ra = start(a, {"b.test": b.s2s, "down.test": down})
    rb = start(b, {"a.test": a.s2s})
    return a, b, ra, rb


@pytest.fixture(scope="module", params=[True, False], ids=["starttls", "plaintext"])
def fed(request, pki):
    a, b, ra, rb = pair(pki.server["ec"] if request.param else None)
    yield a, b, ra, rb, request.param
    stopped = [r.stop() for r in (ra, rb)]  # both before any verdict
    for s in (a, b):
        shutil.rmtree(s.tmp, ignore_errors=True)
    for code, log in stopped:
        assert code == 0, log[-3000:]


def client(rtd, user, domain, resource="r"):
    return X.session(rtd.xport, user, domain, PW, resource)


def leave(r):
    r.send("</stream:stream>")
    r.read_to_close()


def available(r, jid):
    """Initial presence, and its copy back (RFC 6121 4.2.2): the session has taken it."""
    r.send("<presence/>")
    r.read_until(rf"<presence[^>]*from='{jid}'".encode())


def wait_log(rtd, pattern, timeout=X.TIMEOUT):
    deadline = time.monotonic() + timeout
    while not re.search(pattern, rtd.read_log()):
        assert time.monotonic() < deadline, rtd.read_log()[-3000:]
        time.sleep(0.02)


def test_messages_both_ways(fed):
    a, b, ra, rb, tls = fed
    alice, bob = client(ra, "alice", "a.test"), client(rb, "bob", "b.test")
    alice.send("<message to='bob@b.test/r' type='chat' id='m1'><body>hello bob</body></message>")
    text = bob.read_until(rb"<message.*?</message>")
    m = X.first_el(text, "message")
    assert m.get("from") == "alice@a.test/r" and m.get("to") == "bob@b.test/r", text
    assert m.find("{jabber:client}body").text == "hello bob", text
    # Back, to a bare JID: the one available resource takes it.
    available(bob, "bob@b.test/r")
    available(alice, "alice@a.test/r")
    bob.send("<message to='alice@a.test' type='chat' id='m2'><body>hi alice</body></message>")
    text = alice.read_until(rb"<message[^>]*id='m2'.*?</message>")
    assert "from='bob@b.test/r'" in text and "<body>hi alice</body>" in text, text
    # Each direction was proven by dialback, with TLS when the listeners offer it.
    wait_log(ra, r"xmpp.server_out local=a.test remote=b.test tls=" + ("yes" if tls else "no"))
    wait_log(rb, r"xmpp.server_in from=a.test to=b.test tls=" + ("yes" if tls else "no"))
    wait_log(rb, r"xmpp.server_out local=b.test remote=a.test")
    assert X.metric(ra, "rt_xmpp_s2s_stanzas_out_total") >= 1
    assert X.metric(rb, "rt_xmpp_s2s_stanzas_in_total") >= 1
    leave(alice)
    leave(bob)


def test_offline_message_is_kept_for_the_remote_user(fed):
    a, b, ra, rb, _ = fed
    alice = client(ra, "alice", "a.test", "off")
    alice.send("<message to='bea@b.test' type='chat' id='k1'><body>for later</body></message>")
    # bea is not on: b.test keeps it, and gives it at her next available presence.
    deadline = time.monotonic() + X.TIMEOUT
    while X.metric(rb, "rt_xmpp_offline_stored_total") < 1:
        assert time.monotonic() < deadline, rb.read_log()[-2000:]
        time.sleep(0.05)
    bea = client(rb, "bea", "b.test")
    bea.send("<presence/>")
    text = bea.read_until(rb"<body>for later</body>.*?</message>")
    assert "from='alice@a.test/off'" in text and "urn:xmpp:delay" in text, text
    leave(bea)
    leave(alice)


def test_iq_across_and_the_other_server_answers_ping(fed):
    a, b, ra, rb, _ = fed
    amy, bob = client(ra, "amy", "a.test", "q"), client(rb, "bob", "b.test", "q")
    amy.send("<iq type='get' id='v1' to='bob@b.test/q'><query xmlns='jabber:iq:version'/></iq>")
    text = bob.read_until(rb"<iq[^>]*id='v1'.*?</iq>")
    assert "from='amy@a.test/q'" in text, text
    bob.send("<iq type='result' id='v1' to='amy@a.test/q'><query xmlns='jabber:iq:version'>"
             "<name>raw</name></query></iq>")
    text = amy.read_until(rb"<iq[^>]*id='v1'.*?</iq>")
    assert "type='result'" in text and "<name>raw</name>" in text, text
    amy.send("<iq type='get' id='p1' to='b.test'><ping xmlns='urn:xmpp:ping'/></iq>")
    text = amy.read_until(rb"<iq[^>]*id='p1'[^>]*(/>|>.*?</iq>)")
    assert "type='result'" in text and "from='b.test'" in text, text
    # A full JID that is not there: service-unavailable from the other side.
    amy.send("<iq type='get' id='p2' to='bob@b.test/gone'><ping xmlns='urn:xmpp:ping'/></iq>")
    text = amy.read_until(rb"<iq[^>]*id='p2'.*?</iq>")
    assert "type='error'" in text and "service-unavailable" in text, text
    leave(amy)
    leave(bob)


def test_directed_presence_and_its_unavailable(fed):
    a, b, ra, rb, _ = fed
    alice, bob = client(ra, "alice", "a.test", "dp"), client(rb, "bob", "b.test", "dp")
    available(bob, "bob@b.test/dp")  # presence goes to an available resource (RFC 6121 8.5.3)
    alice.send("<presence to='bob@b.test/dp'><status>here</status></presence>")
    text = bob.read_until(rb"<presence[^>]*from='alice@a.test/dp'.*?(/>|</presence>)")
    assert "<status>here</status>" in text, text
    leave(alice)  # RFC 6121 4.6.3: the end of the session sends unavailable where it went
    text = bob.read_until(rb"<presence[^>]*from='alice@a.test/dp'[^>]*type='unavailable'")
    leave(bob)


def test_unreachable_domains_bounce(fed):
    a, b, ra, rb, _ = fed
    amy = client(ra, "amy", "a.test", "bn")
    amy.send("<message to='x@nowhere.test' type='chat' id='n1'><body>?</body></message>")
    text = amy.read_until(rb"<message[^>]*id='n1'.*?</message>")
    assert "type='error'" in text and "remote-server-not-found" in text, text
    amy.send("<message to='x@down.test' type='chat' id='n2'><body>?</body></message>")
    text = amy.read_until(rb"<message[^>]*id='n2'.*?</message>", timeout=30)
    assert "type='error'" in text and "remote-server-not-found" in text, text
    wait_log(ra, r"xmpp.server_out_failed local=a.test remote=down.test")
    leave(amy)


def raw_server(port, to, frm="a.test"):
    """A raw connection to an s2s listener, as another server: the header sent, the answer's
    stream id returned."""
    s = X.Raw(port)
    s.send(f"<?xml version='1.0'?><stream:stream xmlns='jabber:server' "
           f"xmlns:stream='{NS_STREAMS}' xmlns:db='jabber:server:dialback' from='{frm}' "
           f"to='{to}' version='1.0'>")
    text = s.read_until(rb"</stream:features>")
    return s, re.search(r"\sid='([^']+)'", text).group(1), text


def test_a_broken_tls_handshake_is_a_log_line(fed):
    """Bytes that are no TLS after <proceed/> end that connection, logged with the reason; the
    server goes on (an incoming stream's transport once called a callback it did not have)."""
    a, b, ra, rb, tls = fed
    if not tls:
        pytest.skip("the plaintext pair's listeners have no TLS")
    s, _, _ = raw_server(b.s2s, "b.test")
    s.send("<starttls xmlns='urn:ietf:params:xml:ns:xmpp-tls'/>")
    s.read_until(rb"<proceed[^>]*/>")
    s.send(b"\x16\x03\x01\x00\x05hello, no TLS here" * 4)
    s.read_to_close()
    wait_log(rb, r"tls.handshake_failed peer=127.0.0.1:\d+ reason=")
    leave(client(rb, "bob", "b.test", "after"))


def test_forged_key_and_early_stanzas_are_refused(fed):
    a, b, ra, rb, _ = fed
    # In the clear, which loopback (xmpp.plaintext_from) may. A stanza before dialback: the
    # pair is not verified.
    s, sid, _ = raw_server(b.s2s, "b.test")
    s.send("<message from='mallory@a.test' to='bob@b.test' type='chat'><body>x</body></message>")
    cond, _ = s.stream_error()
    assert cond == "invalid-from"
    # A key a.test never gave: b.test asks a.test, which says invalid.
    s, sid, _ = raw_server(b.s2s, "b.test")
    s.send("<db:result from='a.test' to='b.test'>" + "0" * 64 + "</db:result>")
    text = s.read_until(rb"<db:result[^>]*/>")
    assert "type='invalid'" in text, text
    assert X.metric(rb, "rt_xmpp_s2s_dialback_failed_total") >= 1


def test_subscription_probe_and_broadcast_across(fed):
    a, b, ra, rb, _ = fed
    amy, bea = client(ra, "amy", "a.test", "sub"), client(rb, "bea", "b.test", "sub")
    available(bea, "bea@b.test/sub")
    available(amy, "amy@a.test/sub")
    X.subscribe_across(amy, "amy@a.test", bea, "bea@b.test")
    # amy's roster has bea with subscription "to"; bea's has amy "from".
    amy.send("<iq type='get' id='r1'><query xmlns='jabber:iq:roster'/></iq>")
    text = amy.read_until(rb"<iq[^>]*id='r1'.*?</iq>")
    assert re.search(r"<item[^>]*jid='bea@b.test'[^>]*subscription='to'", text), text
    # bea's broadcast reaches her subscriber on the other server: unavailable, then available.
    leave(bea)
    amy.read_until(rb"<presence[^>]*from='bea@b.test/sub'[^>]*type='unavailable'", timeout=30)
    bea = client(rb, "bea", "b.test", "back")
    available(bea, "bea@b.test/back")
    amy.read_until(rb"<presence[^>]*from='bea@b.test/back'", timeout=30)
    # amy's next session probes bea (4.3): bea's server answers with her presence.
    leave(amy)
    amy = client(ra, "amy", "a.test", "again")
    amy.send("<presence/>")
    amy.read_until(rb"<presence[^>]*from='bea@b.test/back'", timeout=30)
    # And unsubscribed ends it: amy's roster drops to none.
    bea.send("<presence to='amy@a.test' type='unsubscribed'/>")
    amy.read_until(rb"<presence[^>]*from='bea@b.test'[^>]*type='unsubscribed'", timeout=30)
    amy.send("<iq type='get' id='r2'><query xmlns='jabber:iq:roster'/></iq>")
    text = amy.read_until(rb"<iq[^>]*id='r2'.*?</iq>")
    assert not re.search(r"jid='bea@b.test'[^>]*subscription='(to|both)'", text), text
    leave(amy)
    leave(bea)
