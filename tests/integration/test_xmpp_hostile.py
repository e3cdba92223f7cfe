"""Hostile and greedy XMPP clients against a real rtd (issue 29 section 6), over raw sockets
(xmpp_util.Raw) with bounded counts: each case checks the stream or stanza error RFC 6120/6121
names, a counter (rtctl metrics) or a log line, that rtd still logs another client in quickly
afterwards, and, where a client could make rtd hold memory, that its RSS stays bounded.

Also the RFC 6121 corners a flood test leans on: pre-approval (3.4), directed presence to a
non-contact (4.6) and roster versioning (2.6).

One rtd serves the module with small bounds (16 resources, refuse on a resource conflict, 50
roster items, 20 offline messages, connect_timeout 3 s); the brute-force test starts its own
with the login limiter on, which would slow every other test's logins from 127.0.0.1.
"""
import re
import socket
import sqlite3
import ssl
import tempfile
import threading
import time

import pytest

import xmpp_util as X
from conftest import Rtd, free_port, rss_kb, sanitized

PW = "hostile-pw"
MAX_RESOURCES = 16
MAX_ROSTER = 50
MAX_OFFLINE = 20
CONNECT_TIMEOUT = 3
QUICK = 2.0  # seconds within which rtd must serve another client after an attack

USERS = """after laughs big deep attrs nul fffe fffelit tlsuser victim many refuse roster
spammer spamwatch sub0 sub1 sub2 sub3 sub4 flooder floodee preuser precontact dirfrom dirto
versioned""".split()


@pytest.fixture(scope="module")
def xmpp(pki):
    tmp = tempfile.TemporaryDirectory(prefix="rtd-xmpp-hostile-")
    for u in USERS:
        X.add_user(tmp.name, f"{u}@localhost", PW)
    port, tls_port = free_port(), free_port()
    cert, key = pki.server["ec"]
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{port}", '
                 f'{{ bind = "127.0.0.1:{tls_port}", starttls = true, '
                 f'tls = {{ cert = "{cert}", key = "{key}" }} }} }}, '
                 f'max_resources = {MAX_RESOURCES}, resource_conflict = "refuse", '
                 f'max_roster_items = {MAX_ROSTER}, max_offline_messages = {MAX_OFFLINE} }}',
                 "auth_max_delay_ms=0", f"connect_timeout={CONNECT_TIMEOUT}",
                 data_dir=tmp.name)
    broker.xport, broker.tls_port, broker.ca, broker.dir = port, tls_port, pki.ca.cert, tmp.name
    yield broker
    code, log = broker.stop()
    tmp.cleanup()
    assert code == 0, log[-3000:]


def jid(user):
    return f"{user}@localhost"


def metric(broker, name):
    code, out, err = broker.ctl("metrics", "prometheus")
    assert code == 0, err
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", out, re.M)
    assert m, out[-2000:]
    return float(m.group(1))


def serves_quickly(broker):
    """Another client logs in (SCRAM, bind) within QUICK seconds."""
    t0 = time.monotonic()
    X.assert_serves(broker.xport, "after", PW)
    took = time.monotonic() - t0
    assert took < QUICK, f"a login took {took:.2f} s after the attack"


def online(broker, user, resource="r"):
    """A raw client logged in and available (its own presence read back)."""
    r = X.Raw(broker.xport)
    full = r.login(user, PW, resource=resource)
    r.send("<presence/>")
    r.read_until(rb"<presence[^>]*(?:/>|>.*?</presence>)")
    return r, full


def iq_answer(r, iq_id, timeout=X.TIMEOUT):
    """The iq result or error with that id, parsed."""
    text = r.read_until(rb"<iq[^>]*?id=['\"]" + iq_id.encode() + rb"['\"][^>]*?(?:/>|>.*?</iq>)",
                        timeout)
    m = re.search(r"<iq[^>]*?id=['\"]" + re.escape(iq_id) + r"['\"][^>]*?(?:/>|>.*?</iq>)",
                  text, re.S)
    return X.ET.fromstring(f"<w xmlns='jabber:client'>{m.group(0)}</w>")[0]


def next_stanza(r, name, timeout=X.TIMEOUT):
    """The next <name> stanza, parsed."""
    text = r.read_until(rb"<" + name.encode() + rb"\b[^>]*?(?:/>|>.*?</" + name.encode()
                        + rb">)", timeout)
    m = re.search(r"<" + name + r"\b[^>]*?(?:/>|>.*?</" + name + ">)", text, re.S)
    return X.ET.fromstring(f"<w xmlns='jabber:client'>{m.group(0)}</w>")[0]


def stanza_error(el):
    """(error type, condition) of an error stanza."""
    e = el.find("{jabber:client}error")
    assert e is not None, X.ET.tostring(el)
    conds = [c.tag.split("}")[1] for c in e if c.tag.startswith("{" + X.NS_STANZAS + "}")
             and not c.tag.endswith("}text")]
    return e.get("type"), conds[0] if conds else None


def wait_log(broker, pattern, timeout=X.TIMEOUT):
    deadline = time.monotonic() + timeout
    while not re.search(pattern, broker.read_log()):
        assert time.monotonic() < deadline, broker.read_log()[-3000:]
        time.sleep(0.02)


def send_all(r, chunks):
    """Sends until rtd closes: a stream error may come before the attacker is done."""
    try:
        for c in chunks:
            r.send(c)
    except (BrokenPipeError, ConnectionResetError):
        pass


def rss_guard(broker):
    """The RSS before, or None under a sanitizer (its allocator keeps freed memory)."""
    return None if sanitized(broker.proc.pid) else rss_kb(broker.proc.pid)


def assert_rss_grew_less(broker, before, kb):
    if before is not None:
        grew = rss_kb(broker.proc.pid) - before
        assert grew < kb, f"rtd's RSS grew by {grew} KB"


# ---- the stream parser's bounds ----

LAUGHS = (b"<?xml version='1.0'?><!DOCTYPE lolz [<!ENTITY lol 'lol'>"
          + b"".join(b"<!ENTITY lol%d '%s'>" % (i, (b"&lol%d;" % (i - 1) if i > 1 else b"&lol;")
                                                   * 10) for i in range(1, 10))
          + b"]>" + X.header()[21:] + b"<message><body>&lol9;</body></message>")


def ten_mb():
    yield b"<message to='victim@localhost'><body>"
    for _ in range(10 * 16):
        yield b"x" * 65536
    yield b"</body></message>"


def deep():
    yield b"<message to='victim@localhost'>" + b"<a>" * 10000 + b"</a>" * 10000 + b"</message>"


def attrs():
    yield (b"<message to='victim@localhost' "
           + b" ".join(b"a%d='v'" % i for i in range(100000)) + b"><body>x</body></message>")


# After login, so the parser is in a bound session's stanza; laughs comes at the stream's start.
BAD = {
    "billion laughs": ("laughs", None, "restricted-xml"),
    "10 MB stanza": ("big", ten_mb, "policy-violation"),
    "10,000-deep nesting": ("deep", deep, "policy-violation"),
    "100,000 attributes": ("attrs", attrs, "policy-violation"),
    "U+0000 as &#0;": ("nul", lambda: [b"<message to='victim@localhost'><body>a&#0;b</body>"
                                       b"</message>"], "not-well-formed"),
    "U+FFFE as &#xFFFE;": ("fffe", lambda: [b"<message to='victim@localhost'><body>&#xFFFE;"
                                            b"</body></message>"], "not-well-formed"),
    "U+FFFE literal": ("fffelit", lambda: ["<message to='victim@localhost'><body>\ufffe"
                                           "</body></message>".encode()], "not-well-formed"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_stream(xmpp, case):
    user, make, want = BAD[case]
    errors = metric(xmpp, "rt_xmpp_stream_errors_total")
    before = rss_guard(xmpp)
    r = X.Raw(xmpp.xport)
    if make is None:
        send_all(r, [LAUGHS])
    else:
        r.login(user, PW, resource="bad")
        send_all(r, make())
    cond, text = r.stream_error(timeout=X.TIMEOUT * 2)
    assert cond == want, text[-2000:]
    r.close()
    assert metric(xmpp, "rt_xmpp_stream_errors_total") >= errors + 1
    wait_log(xmpp, rf"event=xmpp\.stream_error .*condition={want}")
    # Neither 10 MB nor a tree of 10,000 levels or 100,000 attributes stays (or was held).
    assert_rss_grew_less(xmpp, before, 8 * 1024)
    serves_quickly(xmpp)


def test_header_that_never_ends(xmpp):
    """A stream header trickled one attribute every 0.2 s, never finished: the stream ends
    with connection-timeout at connect_timeout, not at the trickle's pace."""
    # Read before connecting: the timeout runs from the connect, and a scrape takes a while.
    timeouts = metric(xmpp, "rt_xmpp_connect_timeouts_total")
    r = X.Raw(xmpp.xport)
    t0 = time.monotonic()
    r.send(b"<?xml version='1.0'?><stream:stream to='localhost' xmlns='jabber:client' "
           b"xmlns:stream='http://etherx.jabber.org/streams'")
    i = 0
    try:
        while time.monotonic() - t0 < CONNECT_TIMEOUT * 3:
            r.sock.settimeout(0.2)
            try:
                r.sock.recv(65536, socket.MSG_PEEK)
                break  # rtd answered (or closed)
            except socket.timeout:
                pass
            r.send(b" a%d='x'" % i)
            i += 1
    except (BrokenPipeError, ConnectionResetError):
        pass
    r.sock.settimeout(X.TIMEOUT)
    cond, text = r.stream_error(timeout=CONNECT_TIMEOUT * 3)
    took = time.monotonic() - t0
    assert cond == "connection-timeout", text
    assert CONNECT_TIMEOUT - 0.1 <= took < CONNECT_TIMEOUT + 2, took
    r.close()
    assert metric(xmpp, "rt_xmpp_connect_timeouts_total") >= timeouts + 1
    serves_quickly(xmpp)


def test_bytes_after_starttls_request(xmpp):
    """A STARTTLS request with a stanza right behind it in the same segment (the STARTTLS
    command injection of CVE-2011-0411): the plaintext after the request must not be parsed
    as the stream, nor answered in plaintext, nor survive into the TLS layer. The stream
    fails (the handshake reads those bytes as a broken ClientHello) and rtd goes on."""
    victim, vfull = online(xmpp, "victim", "inj")
    r = X.Raw(xmpp.tls_port)
    r.open()
    r.send(f"<starttls xmlns='{X.NS_TLS}'/><iq type='get' id='inj1'><ping xmlns='{X.NS_PING}'/>"
           f"</iq><message to='{vfull}'><body>injected</body></message>")
    text = r.read_to_close()
    assert "inj1" not in text and "result" not in text, text
    r.close()
    wait_log(xmpp, r"event=tls\.starttls_refused .*reason=pipelined")
    # Nothing reached the victim: its next message is one sent after.
    other, _ = online(xmpp, "after", "marker")
    other.send(f"<message to='{vfull}' type='chat'><body>marker</body></message>")
    got = victim.read_until(rb"<message[^>]*>.*?</message>")
    assert "marker" in got and "injected" not in got, got
    other.close()
    victim.close()
    # A real STARTTLS on that listener works (so the failure above was the injection's).
    r = X.Raw(xmpp.tls_port)
    r.open()
    r.send(f"<starttls xmlns='{X.NS_TLS}'/>")
    r.read_until(rb"<proceed[^>]*/>")
    r.sock = ssl.create_default_context(cafile=xmpp.ca).wrap_socket(
        r.sock, server_hostname="localhost")
    assert "<mechanism>SCRAM-SHA-256</mechanism>" in r.open()
    r.close()
    serves_quickly(xmpp)


def test_starttls_pipelined_failure_element(xmpp):
    r = X.Raw(xmpp.tls_port)
    r.open()
    r.send(f"<starttls xmlns='{X.NS_TLS}'/><presence/>")
    text = r.read_to_close()
    r.close()
    assert f"<failure xmlns='{X.NS_TLS}'/>" in text and text.endswith("</stream:stream>"), text


# ---- resources ----

def test_max_resources(xmpp):
    """MAX_RESOURCES sessions of one account bind; every further bind (24 tried, each on a
    new stream after SASL: the bound, not the count of attempts, is what is tested) gets
    <resource-constraint/> (type wait, RFC 6120 7.6.2.1); when one session leaves, a new bind
    succeeds."""
    held = []
    try:
        for i in range(MAX_RESOURCES):
            r = X.Raw(xmpp.xport)
            assert r.login("many", PW, resource=f"r{i}") == jid("many") + f"/r{i}"
            held.append(r)
        for i in range(24):
            r = X.Raw(xmpp.xport)
            r.open()
            assert r.scram("SCRAM-SHA-256", "many", PW) == ("success", None)
            r.open()
            r.send(f"<iq type='set' id='b{i}'><bind xmlns='{X.NS_BIND}'><resource>x{i}"
                   f"</resource></bind></iq>")
            el = iq_answer(r, f"b{i}")
            assert el.get("type") == "error", X.ET.tostring(el)
            assert stanza_error(el) == ("wait", "resource-constraint"), X.ET.tostring(el)
            r.close()
        held.pop().close()
        deadline = time.monotonic() + X.TIMEOUT
        while True:  # the departed session leaves the registry when its actor ends
            r = X.Raw(xmpp.xport)
            r.open()
            assert r.scram("SCRAM-SHA-256", "many", PW) == ("success", None)
            r.open()
            r.send(f"<iq type='set' id='again'><bind xmlns='{X.NS_BIND}'><resource>again"
                   f"</resource></bind></iq>")
            el = iq_answer(r, "again")
            r.close()
            if el.get("type") == "result" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert el.get("type") == "result", X.ET.tostring(el)
    finally:
        for r in held:
            r.close()
    serves_quickly(xmpp)


def test_resource_conflict_refused(xmpp):
    """resource_conflict = "refuse": a second bind of a resource in use gets <conflict/>
    (type cancel) and the first session carries on (answers a ping, gets a message)."""
    first, full = online(xmpp, "refuse", "same")
    r = X.Raw(xmpp.xport)
    r.open()
    assert r.scram("SCRAM-SHA-256", "refuse", PW) == ("success", None)
    r.open()
    r.send(f"<iq type='set' id='dup'><bind xmlns='{X.NS_BIND}'><resource>same</resource>"
           "</bind></iq>")
    el = iq_answer(r, "dup")
    assert stanza_error(el) == ("cancel", "conflict"), X.ET.tostring(el)
    r.close()
    first.send(f"<iq type='get' id='p1' to='localhost'><ping xmlns='{X.NS_PING}'/></iq>")
    assert iq_answer(first, "p1").get("type") == "result"
    other, ofull = online(xmpp, "after", "conflict")
    other.send(f"<message to='{full}' type='chat'><body>still here</body></message>")
    got = first.read_until(rb"<message[^>]*>.*?</message>")
    assert "still here" in got and ofull in got, got
    other.close()
    first.close()


# ---- rosters and subscriptions ----

def roster_set(r, iq_id, contact, name=None):
    n = f" name='{name}'" if name else ""
    r.send(f"<iq type='set' id='{iq_id}'><query xmlns='{X.NS_ROSTER}'><item jid='{contact}'{n}/>"
           "</query></iq>")


def roster_get(r, iq_id, ver=None):
    v = "" if ver is None else f" ver='{ver}'"
    r.send(f"<iq type='get' id='{iq_id}'><query xmlns='{X.NS_ROSTER}'{v}/></iq>")
    return iq_answer(r, iq_id)


def roster_jids(el):
    q = el.find(f"{{{X.NS_ROSTER}}}query")
    return [] if q is None else [i.get("jid") for i in q]


def test_roster_bound(xmpp):
    """MAX_ROSTER items are taken (sets pipelined); the next set is an iq error (what rtd
    sends: not-allowed, type cancel), logged; replacing an item already there still works; the
    roster holds exactly MAX_ROSTER items."""
    r, _ = online(xmpp, "roster", "r")
    for i in range(MAX_ROSTER):
        roster_set(r, f"s{i}", f"c{i}@example.net")
    for i in range(MAX_ROSTER):
        assert iq_answer(r, f"s{i}").get("type") == "result"
    roster_set(r, "over", "over@example.net")
    el = iq_answer(r, "over")
    assert el.get("type") == "error", X.ET.tostring(el)
    assert stanza_error(el) == ("cancel", "not-allowed"), X.ET.tostring(el)
    wait_log(xmpp, r"event=xmpp\.roster_refused .*user=roster@localhost "
                   r"contact=over@example\.net")
    roster_set(r, "rename", "c0@example.net", name="renamed")
    assert iq_answer(r, "rename").get("type") == "result"
    jids = roster_jids(roster_get(r, "all"))
    assert len(jids) == MAX_ROSTER and "over@example.net" not in jids, len(jids)
    r.close()
    serves_quickly(xmpp)


def roster_rows(broker, user):
    db = sqlite3.connect(f"file:{broker.dir}/xmpp.db?mode=ro", uri=True, timeout=10)
    try:
        return db.execute("SELECT count(*) FROM roster WHERE username = ?", (user,)).fetchone()[0]
    finally:
        db.close()


def test_subscription_spam(xmpp):
    """2,000 subscribe presences to distinct JIDs of the host (five to existing accounts,
    among the first) from one client: the sender's roster stops at MAX_ROSTER items, no
    account that does not exist gets roster rows, the existing ones get the request
    (pending when they log in); meanwhile another client's pings are answered within a
    bound, and rtd's RSS stays bounded."""
    before = rss_guard(xmpp)
    watch, _ = online(xmpp, "spamwatch")
    spammer, _ = online(xmpp, "spammer")
    targets = [f"sub{i}@localhost" for i in range(5)] + [f"ghost{i}@localhost"
                                                         for i in range(1995)]
    worst = [0.0]
    stop = threading.Event()

    def pinger():
        n = 0
        while not stop.is_set():
            t0 = time.monotonic()
            watch.send(f"<iq type='get' id='w{n}' to='localhost'><ping xmlns='{X.NS_PING}'/>"
                       "</iq>")
            iq_answer(watch, f"w{n}")
            worst[0] = max(worst[0], time.monotonic() - t0)
            n += 1
            time.sleep(0.05)

    t = threading.Thread(target=pinger, daemon=True)
    t.start()
    try:
        for i in range(0, len(targets), 100):
            spammer.send("".join(f"<presence type='subscribe' to='{j}'/>"
                                 for j in targets[i:i + 100]))
        # All handled: a ping after them is answered after them (one session, in order).
        spammer.send(f"<iq type='get' id='done' to='localhost'><ping xmlns='{X.NS_PING}'/>"
                     "</iq>")
        iq_answer(spammer, "done", timeout=30)
        # The store works them through after the session: its roster count settles.
        deadline = time.monotonic() + 30
        while roster_rows(xmpp, "spammer") < MAX_ROSTER and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        stop.set()
        t.join(10)
    assert worst[0] < 1.0, f"a ping took {worst[0]:.2f} s during the spam"
    assert roster_rows(xmpp, "spammer") == MAX_ROSTER
    ghosts = sum(roster_rows(xmpp, f"ghost{i}") for i in range(0, 1995, 97))
    assert ghosts == 0, ghosts
    spammer.close()
    watch.close()
    sub, _ = online(xmpp, "sub3")
    # RFC 6121 3.1.3: a pending request is sent again at the contact's next login.
    got = sub.read_until(rb"<presence[^>]*type=['\"]subscribe['\"][^>]*>")
    assert jid("spammer") in got, got
    sub.close()
    assert_rss_grew_less(xmpp, before, 16 * 1024)
    serves_quickly(xmpp)


# ---- offline messages ----

def test_offline_flood(xmpp):
    """MAX_OFFLINE + 5 messages to an offline user: the first MAX_OFFLINE are kept, each after
    that gets service-unavailable (counted in rt_xmpp_offline_refused_total); at login the
    user gets exactly MAX_OFFLINE, in order, with XEP-0203 delays."""
    refused = metric(xmpp, "rt_xmpp_offline_refused_total")
    r, _ = online(xmpp, "flooder")
    for i in range(MAX_OFFLINE + 5):
        r.send(f"<message to='floodee@localhost' type='chat' id='m{i}'><body>flood {i}</body>"
               "</message>")
    r.send(f"<iq type='get' id='fdone' to='localhost'><ping xmlns='{X.NS_PING}'/></iq>")
    errors = []
    deadline = time.monotonic() + X.TIMEOUT
    while len(errors) < 5:
        el = next_stanza(r, "message", max(0.1, deadline - time.monotonic()))
        assert el.get("type") == "error", X.ET.tostring(el)
        errors.append((el.get("id"), stanza_error(el)))
    assert [e[0] for e in errors] == [f"m{i}" for i in range(MAX_OFFLINE, MAX_OFFLINE + 5)]
    assert all(e[1][1] == "service-unavailable" for e in errors), errors
    r.close()
    assert metric(xmpp, "rt_xmpp_offline_refused_total") >= refused + 5
    u = X.Raw(xmpp.xport)
    u.login("floodee", PW, resource="back")
    u.send("<presence/>")
    bodies = []
    while len(bodies) < MAX_OFFLINE:
        el = next_stanza(u, "message")
        assert el.find("{urn:xmpp:delay}delay") is not None, X.ET.tostring(el)
        bodies.append(el.findtext("{jabber:client}body"))
    assert bodies == [f"flood {i}" for i in range(MAX_OFFLINE)], bodies
    # Exactly that many: a ping after them is the next thing to come.
    u.send(f"<iq type='get' id='last' to='localhost'><ping xmlns='{X.NS_PING}'/></iq>")
    tail = u.read_until(rb"<iq[^>]*id=['\"]last['\"][^>]*(?:/>|>.*?</iq>)")
    assert "<message" not in tail, tail
    u.close()


# ---- RFC 6121 corners ----

def test_pre_approval(xmpp):
    """RFC 6121 3.4: the contact approves before any request (subscribed to a JID with no
    pending request): its roster item shows approved='true'; the user's later request is
    approved at once (subscribed back, roster subscription 'to') with no request shown to
    the contact."""
    contact, cfull = online(xmpp, "precontact")
    contact.send(f"<presence type='subscribed' to='{jid('preuser')}'/>")
    el = roster_get(contact, "pre1")
    items = el.find(f"{{{X.NS_ROSTER}}}query")
    item = [i for i in items if i.get("jid") == jid("preuser")]
    assert item and item[0].get("approved") == "true", X.ET.tostring(el)
    user, _ = online(xmpp, "preuser")
    user.send(f"<presence type='subscribe' to='{jid('precontact')}'/>")
    got = user.read_until(rb"<presence[^>]*type=['\"]subscribed['\"][^>]*>")
    assert jid("precontact") in got, got
    el = roster_get(user, "pre2")
    item = [i for i in el.find(f"{{{X.NS_ROSTER}}}query") if i.get("jid") == jid("precontact")]
    assert item and item[0].get("subscription") == "to", X.ET.tostring(el)
    contact.send(f"<iq type='get' id='cping' to='localhost'><ping xmlns='{X.NS_PING}'/></iq>")
    text = contact.read_until(rb"<iq[^>]*id=['\"]cping['\"][^>]*(?:/>|>.*?</iq>)")
    assert not re.search(r"<presence[^>]*type=['\"]subscribe['\"]", text), text
    user.close()
    contact.close()


def test_pre_approval_feature_advertised(xmpp):
    r = X.Raw(xmpp.xport)
    r.open()
    assert r.scram("SCRAM-SHA-256", "after", PW) == ("success", None)
    feats = r.open()
    r.close()
    assert "<sub xmlns='urn:xmpp:features:pre-approval'/>" in feats, feats


def test_directed_presence_to_non_contact(xmpp):
    """RFC 6121 4.6: presence sent to a JID outside the roster reaches it, with the sender's
    full JID."""
    to, tofull = online(xmpp, "dirto")
    frm, frmfull = online(xmpp, "dirfrom")
    frm.send(f"<presence to='{tofull}'><status>just to you</status></presence>")
    el = next_stanza(to, "presence")
    assert el.get("from") == frmfull, X.ET.tostring(el)
    assert el.findtext("{jabber:client}status") == "just to you", X.ET.tostring(el)
    frm.close()
    to.close()


def test_roster_versioning(xmpp):
    """RFC 6121 2.6: a get without a version gets the roster with its ver; a get with that ver
    gets an empty result; after a change, a get with the old ver gets the change (the roster
    or pushes) and a new ver."""
    r, _ = online(xmpp, "versioned")
    roster_set(r, "v1", "a@example.net")
    assert iq_answer(r, "v1").get("type") == "result"
    el = roster_get(r, "g1", ver="")
    q = el.find(f"{{{X.NS_ROSTER}}}query")
    assert q is not None and q.get("ver"), X.ET.tostring(el)
    ver = q.get("ver")
    el = roster_get(r, "g2", ver=ver)
    assert el.get("type") == "result" and len(el) == 0, X.ET.tostring(el)
    roster_set(r, "v2", "b@example.net")
    assert iq_answer(r, "v2").get("type") == "result"
    r.send(f"<iq type='get' id='g3'><query xmlns='{X.NS_ROSTER}' ver='{ver}'/></iq>")
    text = r.read_until(rb"<iq[^>]*id=['\"]g3['\"][^>]*(?:/>|>.*?</iq>)")
    assert "b@example.net" in text, text
    vers = re.findall(r"ver=['\"]([^'\"]+)['\"]", text)
    assert vers and vers[-1] != ver, text
    r.close()


# ---- SASL brute force ----

def test_sasl_brute_force_slowed(stopper):
    """With the login limiter on (auth_max_delay_ms = 2000), each failure from one address is
    answered later than the one before (from 100 ms, doubling, up to the cap), and logged with
    its delay; a login with the right password is not delayed, and it clears the address's
    record, so the next failure is quick again."""
    d = tempfile.mkdtemp(prefix="rtd-xmpp-brute-")
    X.add_user(d, "brute@localhost", PW)
    port = free_port()
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{port}" }} }}',
                 "auth_max_delay_ms=2000", data_dir=d)
    stopper(broker)

    def attempt(password):
        r = X.Raw(port)
        r.open()
        s = X.Scram("SCRAM-SHA-256", "brute", password)
        r.sasl("SCRAM-SHA-256", s.first())
        name, data = r.sasl_reply()
        assert name == "challenge"
        final = s.final(data)
        t0 = time.monotonic()
        r.send(f"<response xmlns='{X.NS_SASL}'>"
               f"{__import__('base64').b64encode(final).decode()}</response>")
        name, _ = r.sasl_reply()
        took = time.monotonic() - t0
        r.close()
        return name, took

    delays = []
    for i in range(7):
        name, took = attempt(f"guess{i}")
        assert name == "failure"
        delays.append(took)
    log = broker.read_log()
    logged = [int(x) / 1000 for x in re.findall(
        r"event=xmpp\.login_failed .*user=brute@localhost .*delay_ms=(\d+)", log)]
    assert len(logged) == 7, log[-3000:]
    # Each answer waited its logged delay; the delays (from 100 ms, doubling; the count
    # decays with time, so a step may repeat) only grow, up to the cap.
    for want, got in zip(logged, delays):
        assert want * 0.9 <= got < want + 1.0, (logged, delays)
    assert logged[0] == 0.1 and logged == sorted(logged), logged
    assert logged[-1] >= 1.6 and max(logged) <= 2.0, logged
    name, took = attempt(PW)
    assert name == "success" and took < 0.5, took
    name, took = attempt("guess-after")
    assert name == "failure" and took < 0.5, took
