"""npm's @xmpp/client (xmpp.js 0.14, tests/node/xmpp_client.js) against a real rtd (issue 29
section 7): SCRAM-SHA-256 and SCRAM-SHA-1 logins over plain TCP, direct TLS (XEP-0368, the
server checked against the test CA) and XMPP over WebSocket (RFC 7395), through SASL2 and Bind2
(XEP-0388, XEP-0386: the library's way wherever a server offers them, as rtd does); chat both
ways with a raw client (xmpp_util.Raw); stream management (XEP-0198) as the library does it:
enabled inside Bind2, its stanzas acknowledged, and a dropped connection resumed inside SASL2
with what was sent to it meanwhile delivered; group chat (XEP-0045) with one occupant over
WebSocket and one over TCP.

Skipped where node or tests/node/node_modules/@xmpp/client is missing (tools/install-deps.sh
runs `npm ci` in tests/node), as test_websocket.py does for MQTT.js.
"""
import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

import xmpp_util as X
from conftest import ROOT, Rtd, free_port

NODE_DIR = os.path.join(ROOT, "tests", "node")
HAVE_XMPPJS = bool(shutil.which("node")) and os.path.isdir(
    os.path.join(NODE_DIR, "node_modules", "@xmpp", "client"))
pytestmark = pytest.mark.skipif(not HAVE_XMPPJS,
                                reason="node or tests/node/node_modules/@xmpp/client missing")

PW = "js-secret"
WS_PATH = "/xmpp-websocket"
USERS = """js256tcp js1tcp js256tls js1tls js256ws js1ws chattcp chattls chatws peertcp peertls
peerws smacks smpeer smresume smrpeer untrusted mucws muctcp""".split()
TRANSPORTS = ["tcp", "tls", "ws"]


@pytest.fixture(scope="module")
def xmpp(pki):
    """rtd with three XMPP listeners: plain TCP (port), direct TLS (tls_port) and WebSocket on
    WS_PATH (ws_port)."""
    tmp = tempfile.TemporaryDirectory(prefix="rtd-xmpp-js-")
    X.add_users(tmp.name, [(f"{u}@localhost", PW) for u in USERS])
    port, tls_port, ws_port = free_port(), free_port(), free_port()
    cert, key = pki.server["ec"]
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{port}", '
                 f'{{ bind = "127.0.0.1:{tls_port}", tls = {{ cert = "{cert}", key = "{key}" }} }}, '
                 f'{{ bind = "127.0.0.1:{ws_port}", websocket = "{WS_PATH}" }} }}, '
                 f'resume_timeout = 60, muc_host = "conference.@HOST@" }}', "auth_max_delay_ms=0",
                 data_dir=tmp.name)
    broker.xport, broker.ca = port, pki.ca.cert
    broker.service = {"tcp": f"xmpp://127.0.0.1:{port}", "tls": f"xmpps://127.0.0.1:{tls_port}",
                      "ws": f"ws://127.0.0.1:{ws_port}{WS_PATH}"}
    yield broker
    code, log = broker.stop()
    tmp.cleanup()
    assert code == 0, log[-3000:]


class Node:
    """tests/node/xmpp_client.js running: its JSON event lines read by a thread."""

    def __init__(self, xmpp, transport, user, mech="SCRAM-SHA-256", steps=(), sm=False,
                 trust=True, resource="js"):
        conf = {"service": xmpp.service[transport], "domain": "localhost", "username": user,
                "password": PW, "mech": mech, "resource": resource, "sm": sm,
                "timeout_ms": int(X.TIMEOUT * 2000), "steps": list(steps)}
        env = dict(os.environ)
        env.pop("NODE_EXTRA_CA_CERTS", None)
        if trust:
            env["NODE_EXTRA_CA_CERTS"] = xmpp.ca
        # Node 20 has the WebSocket that @xmpp/websocket takes behind this flag (22: default).
        self.proc = subprocess.Popen(
            ["node", "--experimental-websocket", "--no-warnings",
             os.path.join(NODE_DIR, "xmpp_client.js"), json.dumps(conf)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=NODE_DIR, env=env)
        self.events = queue.Queue()
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            try:
                self.events.put(json.loads(line))
            except ValueError:
                pass
        self.events.put({"event": "exit"})

    def event(self, name, timeout=X.TIMEOUT * 2):
        """The next event called name (those before it are kept in self.lines); a failure or
        the end of the script before it fails the test."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                e = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {name} event: {''.join(self.lines)}") from None
            if e["event"] == name:
                return e
            if e["event"] in ("fail", "exit"):
                self.proc.wait(5)
                raise AssertionError(f"{e} before {name}: {''.join(self.lines)} "
                                     f"{self.proc.stderr.read()[-2000:]}")

    def go_on(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def stderr(self):
        self.kill()
        return self.proc.stderr.read()[-6000:]

    def finish(self):
        done = self.event("done")
        assert self.proc.wait(10) == 0, "".join(self.lines)
        return done

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def jid(user):
    return f"{user}@localhost"


def raw_peer(xmpp, user, resource="raw"):
    """A raw client logged in and available: (Raw, its full JID)."""
    r = X.Raw(xmpp.xport)
    full = r.login(user, PW, resource=resource)
    r.send("<presence/>")
    return r, full


def read_chat(r, body):
    text = r.read_until(rb"<message[^>]*>.*?</message>")
    m = X.first_el(text, "message")
    assert m.findtext("{jabber:client}body") == body, text
    return m


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_scram_login(xmpp, transport, mech):
    """The library logs in with mech over the transport, in SASL2: the server's SCRAM
    signature checks out, and Bind2 binds its tag with a part of the server's after it; direct
    TLS is secure (the test CA trusted), and PLAIN is offered inside TLS only (a loopback ws://
    counts as secure to the library, so the offered mechanisms tell it apart)."""
    user = ("js256" if mech == "SCRAM-SHA-256" else "js1") + transport
    n = Node(xmpp, transport, user, mech=mech)
    try:
        offered = n.event("mechanisms")["offered"]
        on = n.event("online")
        assert re.fullmatch(re.escape(jid(user)) + "/js/[0-9a-f]{16}", on["jid"]), on
        assert on["mech"] == mech and on["verified"] is True and on["sasl2"] is True, on
        assert on["secure"] is (transport != "tcp"), on
        if transport == "tls":
            assert "PLAIN" in offered, offered  # PLAIN only inside TLS
        else:
            assert "PLAIN" not in offered, offered
        assert {"SCRAM-SHA-256", "SCRAM-SHA-1"} <= set(offered), offered
        n.finish()
    finally:
        n.kill()


def test_direct_tls_checks_the_server(xmpp):
    """Without the test CA the library refuses rtd's certificate: the TLS in the previous
    test was verified, not merely encrypted."""
    n = Node(xmpp, "tls", "untrusted", trust=False)
    try:
        with pytest.raises(AssertionError, match=r"certificate|self.signed|issuer"):
            n.event("online")
    finally:
        n.kill()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_chat_both_ways(xmpp, transport):
    """The library sends a chat to a raw client's full JID, and gets one back from it with the
    server's from (the raw client's full JID)."""
    r, peer = raw_peer(xmpp, "peer" + transport)
    n = Node(xmpp, transport, "chat" + transport,
             steps=[{"send": {"to": peer, "body": f"hello from js {transport}"}},
                    {"expect": {"body": f"hello to js {transport}"}}])
    try:
        me = n.event("online")["jid"]
        m = read_chat(r, f"hello from js {transport}")
        assert m.get("from") == me and m.get("type") == "chat", m.attrib
        r.send(f"<message to='{me}' type='chat'><body>hello to js {transport}</body></message>")
        got = n.event("expected")
        assert got["from"] == peer, got
        n.finish()
    finally:
        n.kill()
        r.close()


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_stream_management_acks(xmpp, transport):
    """rtd offers XEP-0198; the library enables it (resumable) inside Bind2, then sends its
    initial presence and 20 chats and its <r/>: all 21 are acknowledged, nothing is left in
    its queue, and all 20 chats reach the raw peer in order."""
    r, peer = raw_peer(xmpp, "smpeer", resource=transport)
    steps = [{"send": {"to": peer, "body": f"sm {i}"}} for i in range(20)] + [{"acked": 21}]
    n = Node(xmpp, transport, "smacks", sm=True, steps=steps, resource=transport)
    try:
        on = n.event("online")
        assert on["sm_enabled"] is True and on["sm_id"], (on, n.stderr())
        a = n.event("acked")
        assert a["n"] == 21 and a["queued"] == 0, a
        for i in range(20):
            read_chat(r, f"sm {i}")
        n.finish()
    finally:
        n.kill()
        r.close()


def test_stream_management_resume(xmpp):
    """The library's TCP socket is destroyed (no stream close): its reconnect module logs in
    again, with the FAST token its first login got instead of the password, and resumes the
    session with <resume/> inside SASL2's <authenticate/>; a chat sent to its full JID while it
    was away arrives after the resumption, and the session id stays the same. rtd logs the
    detachment and the resumption."""
    r, peer = raw_peer(xmpp, "smrpeer")
    n = Node(xmpp, "tcp", "smresume", sm=True,
             steps=[{"drop": True}, {"wait": True}, {"resumed": True},
                    {"expect": {"body": "while you were away"}},
                    {"send": {"to": peer, "body": "back"}}])
    try:
        on = n.event("online")
        assert on["sm_enabled"] and on["sm_id"], on
        n.event("dropped")
        r.send(f"<message to='{on['jid']}' type='chat'><body>while you were away</body>"
               "</message>")
        n.go_on()
        res = n.event("resumed")
        assert res["sm_id"] == on["sm_id"], (on, res)
        # The first login asked for a FAST token (XEP-0484); the reconnection used it.
        assert on["fast_token"] is True and res["mech"] == "HT-SHA-256-NONE", (on, res)
        got = n.event("expected")
        assert got["from"] == peer, got
        read_chat(r, "back")
        n.finish()
    finally:
        n.kill()
        r.close()
    log = xmpp.read_log()
    assert re.search(r"xmpp\.session_detached .*jid=smresume@localhost/js", log), log[-3000:]
    assert re.search(r"xmpp\.session_resumed .*jid=smresume@localhost/js", log), log[-3000:]


def test_group_chat_occupants(xmpp):
    """Two @xmpp/client occupants of one room (XEP-0045), one over WebSocket (who makes the
    room: 110 and 201, then the instant-room form) and one over TCP: each one's groupchat
    reaches both, from room/nick."""
    room = "jsroom@conference.localhost"
    a = Node(xmpp, "ws", "mucws", steps=[
        {"join": {"room": room, "nick": "web", "configure": True}}, {"wait": True},
        {"groupchat": {"room": room, "body": "from the web"}},
        {"expect": {"body": "from the web"}}, {"expect": {"body": "from tcp"}}])
    b = None
    try:
        joined = a.event("joined")
        assert {"110", "201"} <= set(joined["codes"]), joined
        b = Node(xmpp, "tcp", "muctcp", steps=[
            {"join": {"room": room, "nick": "tcp"}},
            {"expect": {"body": "from the web"}},
            {"groupchat": {"room": room, "body": "from tcp"}}, {"expect": {"body": "from tcp"}}])
        assert "201" not in b.event("joined")["codes"]
        a.go_on()
        assert b.event("expected")["from"] == f"{room}/web"
        assert b.event("expected")["from"] == f"{room}/tcp"
        assert a.event("expected")["from"] == f"{room}/web"
        assert a.event("expected")["from"] == f"{room}/tcp"
        a.finish()
        b.finish()
    finally:
        a.kill()
        if b:
            b.kill()
