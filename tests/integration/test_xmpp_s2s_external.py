"""Federation proved by certificates (RFC 6120 6.4 and 13.7, XEP-0178): three rtds, a.test,
b.test and c.test, found through xmpp.s2s_peers. a.test's and b.test's s2s listeners show
certificates the test CA issued for their domains and verify the other side's against that
CA with verify = "request" (asked for, never refused): a and b prove themselves to each other
with SASL EXTERNAL both ways, no dialback. c.test's certificate comes from a CA a.test does
not know: a.test offers it no EXTERNAL and c.test proves itself by dialback, while a.test,
whose certificate c.test's listener trusts, proves itself to c.test by EXTERNAL. A raw server
that shows a.test's certificate but says it is evil.test is offered no EXTERNAL, is refused
it, and may not send for evil.test."""
import base64
import os
import re
import shutil
import socket
import ssl
import tempfile
import threading

import pytest

import xmpp_util as X
from certs import serial_of
from conftest import Rtd, free_port

PW = "ext secret"
NS_STREAMS = "http://etherx.jabber.org/streams"
NS_SASL = "urn:ietf:params:xml:ns:xmpp-sasl"


@pytest.fixture(scope="module")
def fed(pki):
    tmp = tempfile.mkdtemp(prefix="s2s-external-")
    # As a server's usually does, each names its MUC service's domain too.
    certs = {d: pki.ca.issue_domain(tmp, d, d, f"conference.{d}") for d in ("a.test", "b.test")}
    certs["c.test"] = pki.other_ca.issue_domain(tmp, "c.test", "c.test", "conference.c.test")
    certs["d.test"] = pki.ca.issue_domain(tmp, "d.test", "d.test")  # d: xmpp.s2s_secure
    ports = {d: (free_port(), free_port()) for d in certs}
    fake, fake2 = free_port(), free_port()  # raw receiving servers' (fake_receiving_server)
    rtds = {}
    try:
        for d, (c2s, s2s) in ports.items():
            data = tempfile.mkdtemp(dir=tmp)
            X.add_users(data, [(f"{u}@{d}", PW) for u in ("u", "v", "w")])
            cert, key = certs[d]
            peers = ", ".join([f'"{m}{p}=127.0.0.1:{ports[p][1]}"' for p in ports if p != d
                               for m in ("", "conference.")] +
                              [f'"fake.test=127.0.0.1:{fake}"', f'"fake2.test=127.0.0.1:{fake2}"'])
            r = Rtd(f'xmpp={{ hosts = {{ "{d}" }}, listeners = {{ "127.0.0.1:{c2s}", '
                    f'{{ bind = "127.0.0.1:{s2s}", s2s = true, starttls = true, '
                    f'tls = {{ cert = "{cert}", key = "{key}", ca = "{pki.ca.cert}", '
                    f'verify = "request" }} }} }}, s2s_peers = {{ {peers} }}, s2s_dns = false, '
                    f's2s_secure = {str(d == "d.test").lower()}, '
                    'muc_host = "conference.@HOST@", muc_room_locking = false }',
                    "auth_max_delay_ms=0", data_dir=data)
            r.xport, r.s2s = c2s, s2s
            rtds[d] = r
        yield rtds, certs, {"fake.test": fake, "fake2.test": fake2}
    finally:
        # Every rtd stopped before any verdict: one that failed leaves none running.
        stopped = [r.stop() for r in rtds.values()]
        shutil.rmtree(tmp, ignore_errors=True)
        for code, log in stopped:
            assert code == 0, log[-3000:]


def client(rtd, user, domain):
    return X.session(rtd.xport, user, domain, PW)


def talk_both_ways(rtds, one, other, user):
    """user@one and user@other chat both ways: the streams each way are set up."""
    a, b = client(rtds[one], user, one), client(rtds[other], user, other)
    for frm, to, frm_dom, mid in ((a, b, one, f"{user}1"), (b, a, other, f"{user}2")):
        to_dom = other if frm_dom == one else one
        frm.send(f"<message to='{user}@{to_dom}/r' type='chat' id='{mid}'><body>{mid}</body>"
                 "</message>")
        text = to.read_until(rf"<message[^>]*id='{mid}'.*?</message>".encode(), timeout=30)
        assert f"from='{user}@{frm_dom}/r'" in text, text
    for c in (a, b):
        c.send("</stream:stream>")
        c.read_to_close()


def test_external_both_ways_between_trusted_certificates(fed):
    rtds, _, _ = fed
    talk_both_ways(rtds, "a.test", "b.test", "u")
    for local, remote in (("a.test", "b.test"), ("b.test", "a.test")):
        r = rtds[local]
        log = r.read_log()
        assert f"xmpp.server_out local={local} remote={remote} tls=yes auth=external" in log, log
        assert f"xmpp.server_in from={remote} to={local} tls=yes auth=external" in log, log
        assert f"remote={remote} tls=yes auth=dialback" not in log, log
        assert f"from={remote} to={local} tls=yes auth=dialback" not in log, log
        assert X.metric(r, "rt_xmpp_s2s_external_total") >= 2  # one stream each way
        # rtctl xmpp servers lists both streams, each proved by its certificate.
        listed = {(s["direction"], s["remote"]): s for s in r.ctl_json("xmpp", "servers")}
        out, inc = listed[("out", remote)], listed[("in", remote)]
        assert (out["local"], out["state"], out["auth"], out["tls"]) == \
            (local, "ready", "external", True), out
        assert (inc["local"], inc["state"], inc["auth"], inc["domains"]) == \
            (local, "verified", "external", 1), inc
        assert out["peer"] == f"127.0.0.1:{rtds[remote].s2s}" and out["queued"] == 0, out


def test_an_unknown_ca_means_dialback_that_way_only(fed):
    rtds, _, _ = fed
    talk_both_ways(rtds, "a.test", "c.test", "v")
    ra, rc = rtds["a.test"], rtds["c.test"]
    # c.test trusts the test CA, which issued a.test's certificate: EXTERNAL.
    assert "xmpp.server_out local=a.test remote=c.test tls=yes auth=external" in ra.read_log()
    # a.test does not know c.test's CA: no EXTERNAL offered, dialback (which asks c.test).
    assert "xmpp.server_in from=c.test to=a.test tls=yes auth=dialback" in ra.read_log()
    assert "xmpp.server_out local=c.test remote=a.test tls=yes auth=dialback" in rc.read_log()
    listed = {(s["direction"], s["remote"]): s for s in ra.ctl_json("xmpp", "servers")}
    assert listed[("in", "c.test")]["auth"] == "dialback", listed
    assert listed[("out", "c.test")]["auth"] == "external", listed


def raw_server(port, frm, to, cert):
    """A raw server-to-server stream to port as domain frm, to domain to, over STARTTLS with
    cert (cert, key) as its certificate: the socket and the features after TLS."""
    s = X.Raw(port)
    header = (f"<?xml version='1.0'?><stream:stream xmlns='jabber:server' "
              f"xmlns:stream='{NS_STREAMS}' from='{frm}' to='{to}' version='1.0'>")
    s.send(header)
    s.read_until(rb"</stream:features>")
    s.send("<starttls xmlns='urn:ietf:params:xml:ns:xmpp-tls'/>")
    s.read_until(rb"<proceed[^>]*/>")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.load_cert_chain(*cert)
    s.sock = ctx.wrap_socket(s.sock, server_hostname=to)
    s.buf = b""
    s.send(header)
    return s, s.read_until(rb"</stream:features>"), header


def test_certificates_only(fed):
    """d.test sets xmpp.s2s_secure: with a.test (certificates from the CA both trust) EXTERNAL
    both ways as before; with c.test (a CA d.test does not know) nothing either way: d.test's
    outgoing stream does not take c.test's certificate, and c.test's dialback is refused."""
    rtds, _, _ = fed
    talk_both_ways(rtds, "a.test", "d.test", "w")
    rd, rc = rtds["d.test"], rtds["c.test"]
    assert "xmpp.server_out local=d.test remote=a.test tls=yes auth=external" in rd.read_log()
    vd, vc = client(rd, "v", "d.test"), client(rc, "v", "c.test")
    for frm, to, mid in ((vd, "c.test", "s1"), (vc, "d.test", "s2")):
        frm.send(f"<message to='v@{to}/r' type='chat' id='{mid}'><body>{mid}</body></message>")
        text = frm.read_until(rf"<message[^>]*id='{mid}'.*?</message>".encode(), timeout=30)
        assert "type='error'" in text and "remote-server-" in text, text
    log = rd.read_log()
    # OpenSSL's reason: c.test's chain does not lead to a CA d.test trusts.
    assert 'xmpp.server_out_failed local=d.test remote=c.test reason="unable to get local ' \
        'issuer certificate"' in log, log
    assert "xmpp.server_dialback_failed from=c.test to=d.test" in log, log
    for c in (vd, vc):
        c.send("</stream:stream>")
        c.read_to_close()


def test_a_certificate_for_another_domain_proves_nothing(fed):
    rtds, certs, _ = fed
    rb = rtds["b.test"]
    s, features, _ = raw_server(rb.s2s, "evil.test", "b.test", certs["a.test"])
    assert "EXTERNAL" not in features, features  # the CA's certificate, but for a.test
    s.send(f"<auth xmlns='{NS_SASL}' mechanism='EXTERNAL'>=</auth>")
    text = s.read_until(rb"</failure>")
    assert "<not-authorized/>" in text, text
    s.send("<message from='x@evil.test' to='u@b.test' type='chat'><body>?</body></message>")
    cond, _ = s.stream_error()
    assert cond == "invalid-from"
    assert X.metric(rb, "rt_xmpp_s2s_external_failed_total") >= 1
    assert re.search(r"xmpp.server_external_failed from=evil.test to=b.test", rb.read_log())
    # The right certificate, but an authorization identity for another domain (6.3.8).
    s, features, _ = raw_server(rb.s2s, "a.test", "b.test", certs["a.test"])
    assert "EXTERNAL" in features, features
    s.send(f"<auth xmlns='{NS_SASL}' mechanism='EXTERNAL'>{base64.b64encode(b'c.test').decode()}"
           "</auth>")
    assert "<not-authorized/>" in s.read_until(rb"</failure>")


def test_a_remote_occupant_outlives_the_stream_it_joined_on(fed):
    """Another server's user keeps its seat when the stream its join came on ends (servers
    close idle streams); when a copy to it comes back as an error that says it is not there,
    the room removes it (XEP-0045's 333). Here a raw stream proves b.test by its certificate
    and carries the join of v@b.test/r, a session on the real b.test, which gets the room's
    copies through a.test's own outgoing stream."""
    rtds, certs, _ = fed
    ra, rb = rtds["a.test"], rtds["b.test"]
    room = "lobby@conference.a.test"
    u, v = client(ra, "u", "a.test"), client(rb, "v", "b.test")
    u.send(f"<presence to='{room}/u'><x xmlns='http://jabber.org/protocol/muc'/></presence>")
    u.read_until(rf"<presence[^>]*from='{room}/u'.*?</presence>".encode())
    s, features, header = raw_server(ra.s2s, "b.test", "conference.a.test", certs["b.test"])
    assert "EXTERNAL" in features, features
    s.send(f"<auth xmlns='{NS_SASL}' mechanism='EXTERNAL'>=</auth>")
    s.read_until(rb"<success[^>]*/>")
    s.buf = b""
    s.send(header)
    s.read_until(rb"</stream:features>")
    s.send(f"<presence from='v@b.test/r' to='{room}/v'>"
           "<x xmlns='http://jabber.org/protocol/muc'/></presence>")
    text = v.read_until(rf"<presence[^>]*from='{room}/v'.*?</presence>".encode(), timeout=30)
    assert "code='110'" in text, text
    u.read_until(rf"<presence[^>]*from='{room}/v'.*?</presence>".encode())
    s.send("</stream:stream>")
    s.read_to_close()  # rtd closes it as the stream's actor ends
    u.send(f"<message to='{room}' type='groupchat' id='g1'><body>still there?</body></message>")
    text = v.read_until(rb"<message[^>]*id='g1'.*?</message>", timeout=30)
    assert f"from='{room}/u'" in text, text
    # v's session ends on b.test: the room's next copy comes back service-unavailable (RFC
    # 6121 8.5.3.2.1), and the room takes the seat away, with 333. The first unavailable u
    # sees for v is that one: a seat that hung on the raw stream would have gone without 333.
    v.send("</stream:stream>")
    v.read_to_close()
    u.send(f"<message to='{room}' type='groupchat' id='g2'><body>and now?</body></message>")
    text = u.read_until(rf"<presence[^>]*from='{room}/v'[^>]*type='unavailable'.*?"
                        r"</presence>".encode(), timeout=30)
    assert "code='333'" in text, text
    u.send("</stream:stream>")
    u.read_to_close()


def fake_receiving_server(port, pki, domain):
    """A raw receiving server for domain on port, in a thread: it offers EXTERNAL and refuses
    it, takes dialback as valid, and keeps what it saw (the auth, the certificate shown, the
    db:result, one message) in the dict returned with the thread."""
    listener = socket.create_server(("127.0.0.1", port))
    got = {}

    def serve():
        conn, _ = listener.accept()
        listener.close()
        r = X.Raw.of(conn)
        head = ("<?xml version='1.0'?><stream:stream xmlns='jabber:server' "
                f"xmlns:stream='{NS_STREAMS}' xmlns:db='jabber:server:dialback' id='fake1' "
                f"from='{domain}' version='1.0'>")
        r.read_until(rb"<stream:stream[^>]*>")
        r.send(head + "<stream:features><starttls xmlns='urn:ietf:params:xml:ns:xmpp-tls'/>"
               "</stream:features>")
        r.read_until(rb"<starttls[^>]*/>")
        r.send("<proceed xmlns='urn:ietf:params:xml:ns:xmpp-tls'/>")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*pki.server["ec"])
        ctx.verify_mode = ssl.CERT_OPTIONAL
        ctx.load_verify_locations(pki.ca.cert)
        r.sock, r.buf = ctx.wrap_socket(conn, server_side=True), b""
        r.read_until(rb"<stream:stream[^>]*>")
        r.send(head + f"<stream:features><mechanisms xmlns='{NS_SASL}'>"
               "<mechanism>EXTERNAL</mechanism></mechanisms>"
               "<dialback xmlns='urn:xmpp:features:dialback'/></stream:features>")
        got["auth"] = r.read_until(rb"</auth>")
        got["cert"] = r.sock.getpeercert()
        r.send(f"<failure xmlns='{NS_SASL}'><not-authorized/></failure>")
        got["result"] = r.read_until(rb"</db:result>")
        r.send(f"<db:result from='{domain}' to='a.test' type='valid'/>")
        got["message"] = r.read_until(rb"</message>")
        r.send("</stream:stream>")
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return got, t


def test_a_refused_certificate_falls_back_to_dialback(fed, pki):
    """The outgoing side: a receiving server (raw, here) that offers EXTERNAL and refuses it;
    a.test goes on with dialback on the same stream, and its message goes through."""
    rtds, _, fakes = fed
    ra = rtds["a.test"]
    got, t = fake_receiving_server(fakes["fake.test"], pki, "fake.test")
    u = client(ra, "u", "a.test")
    u.send("<message to='x@fake.test' type='chat' id='f1'><body>fallback</body></message>")
    t.join(X.TIMEOUT * 3)
    assert "mechanism='EXTERNAL'" in got["auth"] and "YS50ZXN0" in got["auth"]
    assert ("DNS", "a.test") in got["cert"]["subjectAltName"], got  # a.test's own certificate
    assert "from='a.test'" in got["result"], got
    assert "<body>fallback</body>" in got["message"], got
    log = ra.read_log()
    assert "xmpp.server_external_failed from=a.test to=fake.test" in log, log
    assert "xmpp.server_out local=a.test remote=fake.test tls=yes auth=dialback" in log, log
    u.send("</stream:stream>")
    u.read_to_close()


def test_outgoing_streams_show_the_reloaded_certificate(fed, pki):
    """A renewed certificate (the same files, new contents) and `rtctl tls reload`: outgoing
    streams set up after it show the new one, as the listener does."""
    rtds, certs, fakes = fed
    ra = rtds["a.test"]
    tmp = os.path.dirname(certs["a.test"][0])
    new_cert, new_key = pki.ca.issue_domain(tmp, "a.test-renewed", "a.test", "conference.a.test")
    for src, dst in ((new_cert, certs["a.test"][0]), (new_key, certs["a.test"][1])):
        shutil.copyfile(src, dst)
    code, out, err = ra.ctl("tls", "reload")
    assert code == 0, (out, err)
    assert "tls.reloaded listener=s2s-out" in ra.read_log()
    got, t = fake_receiving_server(fakes["fake2.test"], pki, "fake2.test")
    u = client(ra, "u", "a.test")
    u.send("<message to='x@fake2.test' type='chat' id='f2'><body>renewed</body></message>")
    t.join(X.TIMEOUT * 3)
    assert got["cert"]["serialNumber"] == serial_of(new_cert), (got, serial_of(new_cert))
    u.send("</stream:stream>")
    u.read_to_close()
