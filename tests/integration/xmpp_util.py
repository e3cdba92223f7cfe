"""Helpers for the XMPP integration tests: accounts, a raw socket client for what a library
will not send (malformed input, chosen SASL steps), and slixmpp clients (Debian's
python3-slixmpp 1.8.3) driven from synchronous pytest functions.

Every wait here ends on an event (bytes seen, a stanza queued, a socket closed) or fails at a
deadline; nothing sleeps to let rtd catch up.
"""
import asyncio
import base64
import hashlib
import hmac
import os
import re
import socket
import subprocess
import time
import xml.etree.ElementTree as ET

from conftest import RTD

NS_STREAMS = "urn:ietf:params:xml:ns:xmpp-streams"
NS_STANZAS = "urn:ietf:params:xml:ns:xmpp-stanzas"
NS_SASL = "urn:ietf:params:xml:ns:xmpp-sasl"
NS_BIND = "urn:ietf:params:xml:ns:xmpp-bind"
NS_TLS = "urn:ietf:params:xml:ns:xmpp-tls"
NS_PING = "urn:xmpp:ping"
NS_DISCO_INFO = "http://jabber.org/protocol/disco#info"
NS_ROSTER = "jabber:iq:roster"

TIMEOUT = 10.0  # seconds any one wait may take; generous for a loaded 2-core machine


def add_users(data_dir, accounts):
    """Accounts, (jid, password) pairs, made offline before rtd starts by one `rtd xmpp user
    import` (an rtd process per account made the fixtures' set-up take 20 s under ASan), with
    few PBKDF2 rounds: the tests log in often."""
    lines = "".join(f"{jid} {password}\n" for jid, password in accounts)
    subprocess.run([RTD, "xmpp", "user", "import", "-I", "4096", "-d", data_dir], input=lines,
                   text=True, check=True, capture_output=True, timeout=120)


def add_user(data_dir, jid, password):
    add_users(data_dir, [(jid, password)])


def header(to="localhost"):
    return (f"<?xml version='1.0'?><stream:stream to='{to}' version='1.0' "
            f"xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>").encode()


# ---- SCRAM, the client's side (RFC 5802), for the raw client ----

def _hmac(h, key, msg):
    return hmac.new(key, msg, h).digest()


class Scram:
    """A SCRAM client; cb = (type, data) binds the exchange to the TLS channel (-PLUS)."""

    def __init__(self, mech, user, password, cb=None):
        self.h = {"SCRAM-SHA-1": hashlib.sha1,
                  "SCRAM-SHA-256": hashlib.sha256}[mech.removesuffix("-PLUS")]
        self.name = self.h().name
        self.user, self.password = user, password
        self.cnonce = base64.b64encode(os.urandom(18)).decode()
        self.first_bare = f"n={user},r={self.cnonce}"
        self.gs2 = f"p={cb[0]},," if cb else "n,,"
        self.cb_data = cb[1] if cb else b""

    def first(self):
        return (self.gs2 + self.first_bare).encode()

    def final(self, server_first):
        sf = server_first.decode()
        parts = dict(p.split("=", 1) for p in sf.split(","))
        assert parts["r"].startswith(self.cnonce), sf
        salted = hashlib.pbkdf2_hmac(self.name, self.password.encode(),
                                     base64.b64decode(parts["s"]), int(parts["i"]))
        client_key = _hmac(self.h, salted, b"Client Key")
        stored = self.h(client_key).digest()
        no_proof = "c=" + base64.b64encode(self.gs2.encode() + self.cb_data).decode() + \
            ",r=" + parts["r"]
        self.auth_msg = f"{self.first_bare},{sf},{no_proof}".encode()
        sig = _hmac(self.h, stored, self.auth_msg)
        proof = bytes(a ^ b for a, b in zip(client_key, sig))
        self.server_key = _hmac(self.h, salted, b"Server Key")
        return (no_proof + ",p=" + base64.b64encode(proof).decode()).encode()

    def verify(self, server_final):
        want = base64.b64encode(_hmac(self.h, self.server_key, self.auth_msg)).decode()
        return server_final.decode() == "v=" + want


# ---- The raw client ----

class Raw:
    """A TCP connection to rtd that sends exactly the bytes it is given; source: the local
    address to connect from (another loopback address is another client to rtd)."""

    def __init__(self, port, host="127.0.0.1", source=None):
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT,
                                             source_address=(source, 0) if source else None)
        self.buf = b""
        self.closed = False

    @classmethod
    def of(cls, sock):
        """A Raw over a socket made elsewhere (one a test's own server accepted)."""
        r = cls.__new__(cls)
        r.sock, r.buf, r.closed = sock, b"", False
        return r

    def send(self, data):
        self.sock.sendall(data if isinstance(data, bytes) else data.encode())

    def _recv(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out; got so far: {self.buf[-2000:]!r}")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            raise AssertionError(f"timed out; got so far: {self.buf[-2000:]!r}") from None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.closed = True
        self.buf += chunk
        return chunk

    def read_until(self, pattern, timeout=TIMEOUT):
        """Reads until the regex pattern (bytes) matches what came since the last call;
        returns that text and keeps what follows the match for the next call."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern, re.S)
        while True:
            m = rx.search(self.buf)
            if m:
                out, self.buf = self.buf[:m.end()], self.buf[m.end():]
                return out.decode(errors="replace")
            if self.closed:
                raise AssertionError(f"closed before {pattern!r}: {self.buf!r}")
            self._recv(deadline)

    def read_to_close(self, timeout=TIMEOUT):
        """Everything until rtd closes the connection (which must happen in time)."""
        deadline = time.monotonic() + timeout
        while not self.closed:
            self._recv(deadline)
        out, self.buf = self.buf, b""
        return out.decode(errors="replace")

    def stream_error(self, timeout=TIMEOUT):
        """The condition of the stream error rtd sends, after which it must close the stream
        and the socket: (condition, all the text read)."""
        text = self.read_to_close(timeout)
        assert text.rstrip().endswith("</stream:stream>"), text
        m = re.search(r"<stream:error[^>]*><([a-z-]+) xmlns='" + re.escape(NS_STREAMS) + "'",
                      text)
        assert m, text
        return m.group(1), text

    def open(self, to="localhost"):
        """Sends a stream header, returns the features as text."""
        self.send(header(to))
        return self.read_until(rb"</stream:features>")

    def sasl(self, mech, data):
        b64 = base64.b64encode(data).decode() if data else "="
        self.send(f"<auth xmlns='{NS_SASL}' mechanism='{mech}'>{b64}</auth>")

    def sasl_reply(self):
        """The server's next SASL element: (name, decoded data or the inner XML)."""
        text = self.read_until(rb"<(challenge|success|failure)[^>]*(/>|>.*?</\1>)")
        m = re.search(r"<(challenge|success|failure)[^>]*?(?:/>|>(.*?)</\1>)", text, re.S)
        name, inner = m.group(1), m.group(2) or ""
        if name == "failure":  # the condition; a <text/> beside it is optional (RFC 6120 6.5)
            return name, re.sub(r"<text[^>]*(?:/>|>.*?</text>)", "", inner, flags=re.S)
        return name, base64.b64decode(inner) if inner and inner != "=" else b""

    def scram(self, mech, user, password, cb=None):
        """A SCRAM exchange: ("success", None) after checking the server's signature, or
        ("failure", inner XML)."""
        s = Scram(mech, user, password, cb)
        self.sasl(mech, s.first())
        name, data = self.sasl_reply()
        if name != "challenge":
            return name, data
        self.send(f"<response xmlns='{NS_SASL}'>"
                  f"{base64.b64encode(s.final(data)).decode()}</response>")
        name, data = self.sasl_reply()
        if name == "success":
            assert s.verify(data), data
            return name, None
        return name, data

    def login(self, user, password, resource=None, mech="SCRAM-SHA-256", to="localhost"):
        """Header, SCRAM, restart, bind: the full JID bound."""
        self.open(to)
        assert self.scram(mech, user, password) == ("success", None)
        feats = self.open(to)
        assert f"<bind xmlns='{NS_BIND}'" in feats, feats
        res = f"<resource>{resource}</resource>" if resource else ""
        self.send(f"<iq type='set' id='b1'><bind xmlns='{NS_BIND}'>{res}</bind></iq>")
        text = self.read_until(rb"</iq>")
        m = re.search(r"<jid>([^<]+)</jid>", text)
        assert m, text
        return m.group(1)

    def close(self):
        self.sock.close()


def session(port, user, domain, password, resource="r"):
    """A Raw connection logged in (SCRAM-SHA-256) and bound as user@domain/resource."""
    r = Raw(port)
    assert r.login(user, password, resource=resource, to=domain) == \
        f"{user}@{domain}/{resource}"
    return r


def subscribe_across(asker, asker_jid, owner, owner_jid):
    """asker asks owner for its presence and owner approves (RFC 6121 3.1): the asker gets
    "subscribed" and then the owner's presence, sent by the owner's server (3.1.5)."""
    asker.send(f"<presence to='{owner_jid}' type='subscribe'/>")
    text = owner.read_until(rb"<presence[^>]*type=['\"]subscribe['\"][^>]*>", timeout=30)
    assert re.search(rf"from=['\"]{re.escape(asker_jid)}['\"]", text), text
    owner.send(f"<presence to='{asker_jid}' type='subscribed'/>")
    # Either first: "subscribed" goes through the asker's roster in its server's store, the
    # presence straight to its sessions.
    seen = ""
    deadline = time.monotonic() + 30
    while not (re.search(r"<presence[^>]*type=['\"]subscribed['\"]", seen) and
               re.search(rf"<presence(?![^>]*type)[^>]*from=['\"]{re.escape(owner_jid)}/", seen)):
        seen += asker.read_until(rb"<presence[^>]*>", timeout=max(0.1, deadline - time.monotonic()))


def assert_serves(port, user, password):
    """rtd still takes a new client and logs it in."""
    r = Raw(port)
    try:
        assert r.login(user, password, resource="after").endswith("/after")
    finally:
        r.close()


def metric(broker, name):
    """A value rtd's /metrics (through rtctl) gives name (the first series of it)."""
    code, out, err = broker.ctl("metrics", "prometheus")
    assert code == 0, err
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", out, re.M)
    assert m, out[-2000:]
    return float(m.group(1))


def first_el(text, name):
    """The first <name .../> or <name>...</name> element in text, parsed (the default
    namespace jabber:client declared around it)."""
    m = re.search(rf"<{name}[\s>/].*?(?:</{name}>|/>)", text, re.S)
    assert m, text
    return ET.fromstring(f"<w xmlns='jabber:client'>{m.group(0)}</w>")[0]


# ---- slixmpp clients ----

def run(coro, timeout=30):
    """Runs a test's coroutine on a fresh event loop, bounded."""
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


async def login(port, jid, password="", mech=None, tls=False, plugins=(), timeout=TIMEOUT,
                cafile=None):
    """A slixmpp client logged in (session_start) to rtd on port, with queues of what it
    gets: messages, error messages, presences, stream errors, roster pushes (iq set)."""
    import slixmpp
    from slixmpp.xmlstream.handler import Callback
    from slixmpp.xmlstream.matcher import MatchXPath

    conf = {"feature_mechanisms": {"unencrypted_scram": True}}
    if mech:
        conf["feature_mechanisms"]["use_mech"] = mech
    c = slixmpp.ClientXMPP(jid, password, plugin_config=conf)
    for p in plugins:
        c.register_plugin(p)
    # The tests say what each side answers to a subscription: nothing automatic.
    c.roster.auto_authorize = None  # False would refuse every request on its own
    c.roster.auto_subscribe = False
    if cafile:
        c.ca_certs = cafile
    c.messages = asyncio.Queue()
    c.errors = asyncio.Queue()
    c.presences = asyncio.Queue()
    c.stream_errors = asyncio.Queue()
    c.pushes = asyncio.Queue()
    # slixmpp swaps c.disconnected for a new future once it is done: an event that stays set.
    c.gone = asyncio.Event()
    c.add_event_handler("disconnected", lambda _e: c.gone.set())
    started = asyncio.get_running_loop().create_future()
    c.add_event_handler("message", lambda m: m["type"] != "error" and c.messages.put_nowait(m))
    c.add_event_handler("message_error", lambda m: c.errors.put_nowait(m))
    c.add_event_handler("presence", lambda p: c.presences.put_nowait(p))
    c.add_event_handler("stream_error", lambda e: c.stream_errors.put_nowait(e))
    c.register_handler(Callback("roster push",
                                MatchXPath(f"{{jabber:client}}iq/{{{NS_ROSTER}}}query"),
                                lambda iq: iq["type"] == "set" and c.pushes.put_nowait(iq)))

    def done(outcome):
        if not started.done():
            started.set_result(outcome)

    c.add_event_handler("session_start", lambda _e: done("ok"))
    c.add_event_handler("failed_all_auth", lambda _e: done("auth failed"))
    c.add_event_handler("disconnected", lambda _e: done("disconnected"))
    c.add_event_handler("connection_failed", lambda _e: done("connection failed"))
    c.connect(("127.0.0.1", port), force_starttls=tls, disable_starttls=not tls)
    outcome = await asyncio.wait_for(started, timeout)
    assert outcome == "ok", f"{jid}: {outcome}"
    return c


async def logout(*clients, timeout=TIMEOUT):
    for c in clients:
        if c.is_connected():
            c.disconnect()
    for c in clients:
        await asyncio.wait_for(c.gone.wait(), timeout)


async def next_of(queue, pred=lambda _s: True, timeout=TIMEOUT):
    """The next stanza in queue that pred accepts; those before it are dropped."""
    async def find():
        while True:
            s = await queue.get()
            if pred(s):
                return s
    return await asyncio.wait_for(find(), timeout)


async def until_marker(queue, marker, timeout=TIMEOUT):
    """Everything in queue up to the message whose body is marker (which is not returned):
    what arrived before a later stanza of the same sender did, so what never will."""
    got = []
    while True:
        s = await asyncio.wait_for(queue.get(), timeout)
        if s["body"] == marker:
            return got
        got.append(s)


async def iq_get(c, to, payload_xml, timeout=TIMEOUT):
    """An iq get with the payload; returns the answer (result or error) as a stanza."""
    from slixmpp.exceptions import IqError
    iq = c.make_iq_get(ito=to)
    iq.append(ET.fromstring(payload_xml))
    try:
        return await iq.send(timeout=timeout)
    except IqError as e:
        return e.iq
