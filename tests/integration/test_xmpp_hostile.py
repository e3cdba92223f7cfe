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
    text = r.read_until(rb"<iq[^>]*id=['\"]" + iq_id.encode() + rb"['\"][^>]*(?:/>|>.*?</iq>)",
                        timeout)
    m = re.search(r"<iq[^>]*id=['\"]" + re.escape(iq_id) + r"['\"][^>]*(?:/>|>.*?</iq>)", text,
                  re.S)
    return X.first_el(m.group(0), "iq")


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
    r = X.Raw(xmpp.xport)
    timeouts = metric(xmpp, "rt_xmpp_connect_timeouts_total")
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
