"""Two ways into an account beyond a stored password, on a real rtd: in-band registration
(XEP-0077: make, change, cancel; xmpp.register, xmpp.register_rate) through the raw client
(xmpp_util.py), and SASL EXTERNAL (XEP-0178) with client certificates whose subjectAltName
carries id-on-xmppAddr (certs.py makes them). Also: `rtd xmpp user add` run eight at once.

One rtd serves the module: localhost registers, closed.localhost does not; a plain listener
(plaintext from 127.0.0.0/28 only) and a direct TLS one asking for client certificates. Each
registration test comes from its own loopback address, so that the per-address rate (3 an
hour here) counts only its own tries.
"""
import asyncio
import re
import ssl
import subprocess
import tempfile

import pytest

import xmpp_util as X
from conftest import RTD, Rtd, free_port

PW = "s3cret-pw"
NS_REG = "jabber:iq:register"
FEATURE = "<register xmlns='http://jabber.org/features/iq-register'/>"
RATE = 3
USERS = ["taken", "ext1", "ext2"]


@pytest.fixture(scope="module")
def xmpp(pki):
    tmp = tempfile.TemporaryDirectory(prefix="rtd-register-")
    X.add_users(tmp.name, [(f"{u}@localhost", PW) for u in USERS])
    cert, key = pki.server["ec"]
    port, tport = free_port(), free_port()
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost", "closed.localhost" }}, '
                 f'register = {{ "localhost" }}, register_rate = {RATE}, '
                 f'plaintext_from = {{ "127.0.0.0/28" }}, listeners = {{ "127.0.0.1:{port}", '
                 f'{{ bind = "127.0.0.1:{tport}", tls = {{ cert = "{cert}", key = "{key}", '
                 f'ca = "{pki.ca.cert}", verify = "optional" }} }} }} }}',
                 "auth_max_delay_ms=0", data_dir=tmp.name)
    broker.xport, broker.tport = port, tport
    yield broker
    code, log = broker.stop()
    tmp.cleanup()
    assert code == 0, log[-3000:]


_next_source = [16]


def source():
    """A loopback address of its own, outside plaintext_from (127.0.0.0/28) unless low."""
    _next_source[0] += 1
    return f"127.0.0.{_next_source[0]}"


_next_low = [1]


def low_source():
    """A loopback address inside plaintext_from, one per test."""
    _next_low[0] += 1
    assert _next_low[0] < 15
    return f"127.0.0.{_next_low[0]}"


def iq(r, xml, id_):
    """Sends an iq, returns its answer's text."""
    r.send(xml)
    return r.read_until(rb"<iq[^>]*id='" + id_.encode() + rb"'[^>]*(/>|>.*?</iq>)")


def register(r, user, password, id_="reg"):
    return iq(r, f"<iq type='set' id='{id_}'><query xmlns='{NS_REG}'>"
                 f"<username>{user}</username><password>{password}</password></query></iq>", id_)


def error_of(text):
    m = re.search(r"<error type='(\w+)'><([a-z-]+) xmlns='" + re.escape(X.NS_STANZAS) + "'",
                  text)
    assert m, text
    return m.group(1), m.group(2)


def can_login(broker, user, password):
    r = X.Raw(broker.xport)
    try:
        r.open()
        return r.scram("SCRAM-SHA-256", user, password)[0] == "success"
    finally:
        r.close()


# ---- Registration (XEP-0077) ----

def test_register_then_login(xmpp):
    before = X.metric(xmpp, "rt_xmpp_registrations_total")
    r = X.Raw(xmpp.xport, source=low_source())
    feats = r.open()
    assert FEATURE in feats, feats
    got = iq(r, f"<iq type='get' id='g1'><query xmlns='{NS_REG}'/></iq>", "g1")
    assert "type='result'" in got and "<username/>" in got and "<password/>" in got, got
    assert "<instructions>" in got, got
    assert "type='result'" in register(r, "newbie", "n3w-pass"), r.buf
    # the same stream logs in with the new account, and binds
    assert r.scram("SCRAM-SHA-256", "newbie", "n3w-pass") == ("success", None)
    r.open()
    r.send(f"<iq type='set' id='b1'><bind xmlns='{X.NS_BIND}'/></iq>")
    assert "newbie@localhost/" in r.read_until(rb"</iq>")
    r.close()
    assert can_login(xmpp, "NewBie", "n3w-pass")  # the name was prepared: one account
    assert X.metric(xmpp, "rt_xmpp_registrations_total") == before + 1
    code, out, _ = xmpp.ctl("xmpp", "user", "list", "localhost")
    assert code == 0 and "newbie@localhost" in out, out


def test_register_refusals(xmpp):
    """conflict, a name nodeprep refuses, missing or empty fields, a second account."""
    r = X.Raw(xmpp.xport, source=low_source())
    r.open()
    assert error_of(register(r, "taken", "x", "c1")) == ("cancel", "conflict")
    assert error_of(register(r, "bad@name", "x", "c2")) == ("modify", "jid-malformed")
    assert error_of(register(r, "u" * 65, "x", "c3")) == ("modify", "not-acceptable")
    assert error_of(iq(r, f"<iq type='set' id='c4'><query xmlns='{NS_REG}'>"
                          f"<username>nopw</username></query></iq>", "c4")) == \
        ("modify", "not-acceptable")
    assert error_of(register(r, "emptypw", "", "c5")) == ("modify", "not-acceptable")
    assert error_of(register(r, "longpw", "p" * 1024, "c6")) == ("modify", "not-acceptable")
    assert error_of(iq(r, f"<iq type='set' id='c7'><query xmlns='{NS_REG}'><remove/></query>"
                          "</iq>", "c7")) == ("auth", "registration-required")
    assert "type='result'" in register(r, "firstone", PW, "c8")
    assert error_of(register(r, "secondone", PW, "c9")) == ("modify", "not-acceptable")
    # anything else before authentication still ends the stream
    r.send("<message to='taken@localhost'><body>hi</body></message>")
    assert r.stream_error()[0] == "not-authorized"
    assert can_login(xmpp, "taken", PW)  # the conflict changed nothing
    assert not can_login(xmpp, "secondone", PW)


def test_register_disabled_host(xmpp):
    r = X.Raw(xmpp.xport, source=low_source())
    feats = r.open(to="closed.localhost")
    assert FEATURE not in feats, feats
    got = iq(r, f"<iq type='get' id='d1'><query xmlns='{NS_REG}'/></iq>", "d1")
    assert error_of(got) == ("cancel", "service-unavailable")
    assert error_of(register(r, "closeduser", PW, "d2")) == ("cancel", "service-unavailable")
    r.close()


def test_register_plaintext_refused(xmpp):
    """From an address outside plaintext_from, without TLS: not offered, refused."""
    r = X.Raw(xmpp.xport, source=source())
    feats = r.open()
    assert FEATURE not in feats and "<mechanisms" not in feats, feats
    assert error_of(register(r, "cleartext", PW)) == ("modify", "not-authorized")
    r.close()
    assert not can_login(xmpp, "cleartext", PW)


def test_register_rate_limit(xmpp):
    """The RATE+1th try from one address is refused with resource-constraint (type wait);
    another address is not affected."""
    before = X.metric(xmpp, "rt_xmpp_registrations_limited_total")
    src, other = low_source(), low_source()
    for i in range(RATE):
        r = X.Raw(xmpp.xport, source=src)
        r.open()
        assert "type='result'" in register(r, f"burst{i}", PW), r.buf
        r.close()
    r = X.Raw(xmpp.xport, source=src)
    r.open()
    assert error_of(register(r, "burst-over", PW)) == ("wait", "resource-constraint")
    # the refused try did not count, and stays refused on this stream too
    assert error_of(register(r, "burst-over2", PW, "again")) == ("wait", "resource-constraint")
    r.close()
    r = X.Raw(xmpp.xport, source=other)
    r.open()
    assert "type='result'" in register(r, "elsewhere", PW)
    r.close()
    assert not can_login(xmpp, "burst-over", PW)
    assert can_login(xmpp, "elsewhere", PW)
    assert X.metric(xmpp, "rt_xmpp_registrations_limited_total") == before + 2


def registered_session(xmpp, user, resource):
    r = X.Raw(xmpp.xport, source=low_source())
    r.open()
    assert "type='result'" in register(r, user, PW)
    r.close()
    r = X.Raw(xmpp.xport)
    r.login(user, PW, resource=resource)
    return r


def test_password_change(xmpp):
    r = registered_session(xmpp, "changer", "a")
    got = iq(r, f"<iq type='get' id='p0'><query xmlns='{NS_REG}'/></iq>", "p0")
    assert "<registered/>" in got and "<username>changer</username>" in got, got
    assert error_of(register(r, "taken", "hijack", "p1")) == ("auth", "forbidden")
    assert error_of(register(r, "changer", "", "p2")) == ("modify", "not-acceptable")
    assert "type='result'" in register(r, "changer", "n3w-secret", "p3")
    r.close()
    assert can_login(xmpp, "changer", "n3w-secret")
    assert not can_login(xmpp, "changer", PW)
    assert can_login(xmpp, "taken", PW)


def test_cancel_ends_sessions(xmpp):
    """<remove/>: the result, then a not-authorized stream error on every session of the
    account; the account is gone (a login fails, the list has no such user)."""
    a = registered_session(xmpp, "leaver", "a")
    b = X.Raw(xmpp.xport)
    b.login("leaver", PW, resource="b")
    got = iq(a, f"<iq type='set' id='rm'><query xmlns='{NS_REG}'><remove/></query></iq>", "rm")
    assert "type='result'" in got, got
    cond, text = a.stream_error()
    assert cond == "not-authorized", text
    cond, text = b.stream_error()
    assert cond == "not-authorized", text
    assert not can_login(xmpp, "leaver", PW)
    code, out, _ = xmpp.ctl("xmpp", "user", "list", "localhost")
    assert code == 0 and "leaver@" not in out, out
    # the name is free again
    r = X.Raw(xmpp.xport, source=low_source())
    r.open()
    assert "type='result'" in register(r, "leaver", "again-pw")
    r.close()


def test_cancel_needs_remove_alone(xmpp):
    r = registered_session(xmpp, "stayer", "a")
    got = iq(r, f"<iq type='set' id='rm2'><query xmlns='{NS_REG}'><remove/>"
                f"<username>stayer</username></query></iq>", "rm2")
    assert error_of(got) == ("modify", "bad-request")
    r.close()
    assert can_login(xmpp, "stayer", PW)


def test_slixmpp_changes_and_cancels(xmpp):
    """A library's XEP-0077 once logged in (slixmpp's xep_0077: its registration before
    authentication is queued until a session starts, in 1.8.3, so the raw client makes the
    account): a password change, then the cancel, which ends its stream."""
    registered_session(xmpp, "slixreg", "raw").close()

    async def t():
        c = await X.login(xmpp.xport, "slixreg@localhost/lib", PW,
                          plugins=["xep_0004", "xep_0066", "xep_0077"])
        await c.plugin["xep_0077"].change_password("lib-new-pw", timeout=X.TIMEOUT)
        assert can_login(xmpp, "slixreg", "lib-new-pw")
        await c.plugin["xep_0077"].cancel_registration(timeout=X.TIMEOUT)
        await X.next_of(c.stream_errors)
        await asyncio.wait_for(c.gone.wait(), X.TIMEOUT)
    X.run(t())
    assert not can_login(xmpp, "slixreg", "lib-new-pw")


# ---- SASL EXTERNAL (XEP-0178) ----

class TlsRaw(X.Raw):
    """The raw client over direct TLS, presenting a client certificate when given one."""

    def __init__(self, port, ca, client=None):
        super().__init__(port)
        ctx = ssl.create_default_context(cafile=ca)
        ctx.check_hostname = False
        if client:
            ctx.load_cert_chain(*client)
        self.sock = ctx.wrap_socket(self.sock, server_hostname="localhost")


@pytest.fixture(scope="module")
def certs(pki, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("xmpp-certs"))
    return {
        "ext1": pki.ca.issue_xmpp(d, "ext1", "ext1@localhost"),
        "both": pki.ca.issue_xmpp(d, "both", "ext1@localhost", "ext2@localhost"),
        "ghost": pki.ca.issue_xmpp(d, "ghost", "ghost@localhost"),
        "elsewhere": pki.ca.issue_xmpp(d, "elsewhere", "ext1@example.org"),
        "unknown_ca": pki.unknown,
    }


def external(r, authzid=b""):
    r.sasl("EXTERNAL", authzid)
    return r.sasl_reply()


def test_external_login(xmpp, pki, certs):
    r = TlsRaw(xmpp.tport, pki.ca.cert, certs["ext1"])
    feats = r.open()
    assert "<mechanism>EXTERNAL</mechanism>" in feats, feats
    assert external(r) == ("success", b"")
    feats = r.open()
    r.send(f"<iq type='set' id='b1'><bind xmlns='{X.NS_BIND}'><resource>cert</resource>"
           f"</bind></iq>")
    assert "<jid>ext1@localhost/cert</jid>" in r.read_until(rb"</iq>")
    r.close()
    # the authzid, when given, is the certificate's address
    r = TlsRaw(xmpp.tport, pki.ca.cert, certs["ext1"])
    r.open()
    assert external(r, b"ext1@localhost") == ("success", b"")
    r.close()


def test_external_identities(xmpp, pki, certs):
    """Another account as authzid, several addresses and none named, an address with no
    account, one of another domain."""
    for cert, authzid, cond in (("ext1", b"taken@localhost", "invalid-authzid"),
                                ("both", b"", "invalid-authzid"),
                                ("ghost", b"", "not-authorized"),
                                ("elsewhere", b"", "not-authorized")):
        r = TlsRaw(xmpp.tport, pki.ca.cert, certs[cert])
        r.open()
        name, inner = external(r, authzid)
        assert name == "failure" and f"<{cond}/>" in inner, (cert, inner)
        if cert == "both":  # named, one of several is taken
            assert external(r, b"ext2@localhost") == ("success", b"")
        r.close()


def test_external_not_offered_without_cert(xmpp, pki):
    r = TlsRaw(xmpp.tport, pki.ca.cert)
    feats = r.open()
    assert "<mechanism>PLAIN</mechanism>" in feats and "EXTERNAL" not in feats, feats
    name, inner = external(r)
    assert name == "failure" and "<invalid-mechanism/>" in inner, inner
    # PLAIN, answered after the store's check as EXTERNAL is: the restart is a new stream
    r.sasl("PLAIN", b"\0taken\0" + PW.encode())
    assert r.sasl_reply()[0] == "success"
    assert f"<bind xmlns='{X.NS_BIND}'/>" in r.open()
    r.close()
    r = X.Raw(xmpp.xport)
    feats = r.open()
    assert "EXTERNAL" not in feats, feats
    r.close()


def test_external_unknown_ca_refused(xmpp, pki, certs):
    """A certificate from a CA rtd does not know ends the handshake: no stream at all."""
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError, OSError)):
        r = TlsRaw(xmpp.tport, pki.ca.cert, certs["unknown_ca"])
        r.open()


# ---- `rtd xmpp user add` in parallel ----

def test_parallel_user_add():
    """Eight at once on a new file (the schema and WAL made once, the others waiting for
    it), then eight more on the existing file: every one succeeds."""
    for round_ in range(3):
        d = tempfile.mkdtemp(prefix="rtd-par-")
        for batch in ("a", "b"):
            procs = [subprocess.Popen([RTD, "xmpp", "user", "add", "-b", "-I", "4096", "-d", d,
                                       f"{batch}{i}@localhost", PW],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for i in range(8)]
            for p in procs:
                out, err = p.communicate(timeout=60)
                assert p.returncode == 0, (round_, batch, err)
        out = subprocess.run([RTD, "xmpp", "user", "list", "-d", d], check=True,
                             capture_output=True, text=True, timeout=30).stdout
        assert len(out.splitlines()) == 16, out


# ---- `rtd xmpp user import` ----

def test_user_import_adds_each_line_and_names_the_refused():
    """One account a line, the password the rest of it (spaces kept); blank lines and #
    comments skipped; a bad address, a line without a password and an existing account are
    each named by line number (never with the password) while the other lines go in."""
    d = tempfile.mkdtemp(prefix="rtd-import-")
    lines = ["# accounts from the old server", "", "imp1@localhost secret one",
             "bad@@x pw-of-bad", "nopw@localhost", "Imp2@LocalHost\tp2", "imp1@localhost again"]
    p = subprocess.run([RTD, "xmpp", "user", "import", "-I", "4096", "-d", d],
                       input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p
    assert "stdin:4: bad@@x:" in p.stderr and "pw-of-bad" not in p.stderr, p.stderr
    assert "stdin:5: nopw@localhost: no password" in p.stderr, p.stderr
    assert "stdin:7: imp1@localhost: imp1@localhost exists" in p.stderr, p.stderr
    assert "imported 2 accounts, 3 lines refused" in p.stderr, p.stderr
    out = subprocess.run([RTD, "xmpp", "user", "list", "-d", d], check=True,
                         capture_output=True, text=True, timeout=30).stdout
    assert sorted(l.split("\t")[0] for l in out.splitlines()) == ["imp1@localhost",
                                                                   "imp2@localhost"], out
    # The passwords are what the lines said: a login with each, on an rtd serving the file.
    port = free_port()
    server = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{port}" }} }}',
                 data_dir=d)
    try:
        for user, pw in (("imp1", "secret one"), ("imp2", "p2")):
            r = X.Raw(port)
            assert r.login(user, pw, resource="imp") == f"{user}@localhost/imp"
            r.close()
    finally:
        code, log = server.stop()
    assert code == 0, log[-2000:]
