"""XMPP client sessions on a real rtd (actors/c2s): SASL, binding, 1:1 routing, the server's
iq answers, stream errors on bad input, STARTTLS, rosters and presence subscriptions, driven
by Debian's slixmpp 1.8.3 and, where a library would not send the bytes, a raw socket
(xmpp_util.py).

One server serves the module (every test its own accounts): rtd, or the peer of the
differential run (xmpp_server.py); the connect timeout and STARTTLS tests start their own rtd,
since their settings would get in the others' way.
"""
import hashlib
import re
import ssl
import threading
import time

import pytest

import xmpp_server as S
import xmpp_util as X
from conftest import Rtd, free_port

PW = "s3cret-pw"

# Each test's accounts, made before rtd starts.
USERS = """sha256 sha1 wrongpw brute bindres bindempty conflict fullto fullfrom barefrom bareto
offfrom offto nouserfrom ping disco iqoff iqunknown forger victim after rosterset subuser
subcontact probeuser probecontact ownpres ownecho unsubuser unsubcontact cancuser
canccontact hibernate malformed keptto keptfrom askto askfrom resubuser resubcontact goneuser gonecontact""".split()


@pytest.fixture(scope="module")
def xmpp():
    # No delay after a failed login here (auth_max_delay_ms=0): every test logs in from
    # 127.0.0.1, and the failures of one would slow the next.
    server = S.serve(USERS, PW, anonymous=("anon.localhost",), max_stanza_size=4096,
                     rtd_options=("auth_max_delay_ms=0",))
    yield server
    S.stop(server)


def jid(user):
    return f"{user}@localhost"


# ---- SASL ----

def test_mechanisms_offered(xmpp):
    r = X.Raw(xmpp.xport)
    mechs = re.findall(r"<mechanism>([^<]+)</mechanism>", r.open())
    # No ANONYMOUS on a host that does not allow it; no PLAIN without TLS (RFC 4616 6: not
    # without confidentiality). The order is the server's preference (RFC 6120 6.4.1).
    assert {"SCRAM-SHA-256", "SCRAM-SHA-1"} <= set(mechs), mechs
    assert "ANONYMOUS" not in mechs and "PLAIN" not in mechs, mechs
    r.close()


@pytest.mark.parametrize("mech,user", [("SCRAM-SHA-256", "sha256"), ("SCRAM-SHA-1", "sha1")])
def test_scram_login(xmpp, mech, user):
    # Raw: the login checks the server's signature (v=) against the password's keys.
    r = X.Raw(xmpp.xport)
    assert r.login(user, PW, resource="raw", mech=mech) == jid(user) + "/raw"
    r.close()

    async def t():
        c = await X.login(xmpp.xport, jid(user) + "/lib", PW, mech=mech)
        assert c.plugin["feature_mechanisms"].mech.name == mech
        assert str(c.boundjid) == jid(user) + "/lib"
        await X.logout(c)
    X.run(t())


def test_wrong_password_not_authorized(xmpp):
    r = X.Raw(xmpp.xport)
    r.open()
    name, inner = r.scram("SCRAM-SHA-256", "wrongpw", "not-" + PW)
    assert name == "failure" and inner == "<not-authorized/>", (name, inner)
    # An unknown account fails the same way (the exchange runs on made-up credentials).
    name, inner = r.scram("SCRAM-SHA-1", "nosuchuser", PW)
    assert name == "failure" and inner == "<not-authorized/>", (name, inner)
    # The stream survives two failures: the right password logs in on it.
    assert r.scram("SCRAM-SHA-256", "wrongpw", PW) == ("success", None)
    r.close()
    if not S.is_rtd(xmpp):
        return
    log = xmpp.read_log()
    assert re.search(r"event=xmpp\.login_failed .*user=wrongpw@localhost "
                     r"condition=not-authorized", log), log[-2000:]
    assert re.search(r"event=xmpp\.login_failed .*condition=not-authorized", log)


@pytest.mark.rtd_only("how many tries a stream gets is the server's (RFC 6120 6.4.5: 2 to 5)")
def test_third_failure_ends_stream(xmpp):
    r = X.Raw(xmpp.xport)
    r.open()
    for _ in range(2):
        assert r.scram("SCRAM-SHA-256", "brute", "guess") == ("failure", "<not-authorized/>")
    s = X.Scram("SCRAM-SHA-256", "brute", "guess")
    r.sasl("SCRAM-SHA-256", s.first())
    name, data = r.sasl_reply()
    assert name == "challenge"
    r.send(f"<response xmlns='{X.NS_SASL}'>"
           f"{__import__('base64').b64encode(s.final(data)).decode()}</response>")
    cond, text = r.stream_error()
    assert "<not-authorized/></failure>" in text, text
    assert cond == "policy-violation", text
    r.close()
    X.assert_serves(xmpp.xport, "brute", PW)


def test_anonymous_login(xmpp):
    r = X.Raw(xmpp.xport)
    feats = r.open("anon.localhost")
    assert "<mechanism>ANONYMOUS</mechanism>" in feats, feats
    r.close()
    # Not offered, nor taken, on a host without it.
    r = X.Raw(xmpp.xport)
    r.open("localhost")
    r.sasl("ANONYMOUS", b"")
    name, inner = r.sasl_reply()
    assert (name, inner) == ("failure", "<invalid-mechanism/>")
    r.close()

    async def t():
        a = await X.login(xmpp.xport, "anon.localhost", "")
        b = await X.login(xmpp.xport, "anon.localhost", "")
        assert a.plugin["feature_mechanisms"].mech.name == "ANONYMOUS"
        for c in (a, b):
            assert c.boundjid.domain == "anon.localhost"
            assert c.boundjid.user, c.boundjid  # its form is the server's (XEP-0175)
            assert c.boundjid.resource
        assert a.boundjid.user != b.boundjid.user
        # They are real sessions: one gets what the other sends.
        a.send_message(mto=b.boundjid, mbody="anon hello", mtype="chat")
        m = await X.next_of(b.messages)
        assert m["body"] == "anon hello" and m["from"] == a.boundjid
        await X.logout(a, b)
    X.run(t())


# ---- Resource binding ----

def test_bind_given_resource(xmpp):
    async def t():
        c = await X.login(xmpp.xport, jid("bindres") + "/Phone Ω", PW)
        assert str(c.boundjid) == jid("bindres") + "/Phone Ω"
        await X.logout(c)
    X.run(t())


def test_bind_empty_resource_assigned(xmpp):
    r = X.Raw(xmpp.xport)
    full = r.login("bindempty", PW, resource=None)
    bare, _, res = full.partition("/")
    assert bare == jid("bindempty") and res, full  # RFC 6120 7.6.2.1
    r.close()
    r = X.Raw(xmpp.xport)
    assert r.login("bindempty", PW) != full  # a new one each time
    r.close()


def test_bind_conflict_replaces_older(xmpp):
    async def t():
        old = await X.login(xmpp.xport, jid("conflict") + "/same", PW)
        new = await X.login(xmpp.xport, jid("conflict") + "/same", PW)
        err = await X.next_of(old.stream_errors)
        assert err["condition"] == "conflict", err
        await asyncio_wait(old.gone.wait())
        # The full JID is the new session's now.
        probe = await X.login(xmpp.xport, jid("fullfrom") + "/conflict-probe", PW)
        probe.send_message(mto=jid("conflict") + "/same", mbody="to the new one", mtype="chat")
        m = await X.next_of(new.messages)
        assert m["body"] == "to the new one"
        await X.logout(new, probe)
    X.run(t())


async def asyncio_wait(fut):
    import asyncio
    await asyncio.wait_for(fut, X.TIMEOUT)


# ---- 1:1 messages ----

def test_message_to_full_jid(xmpp):
    async def t():
        a = await X.login(xmpp.xport, jid("fullfrom") + "/a", PW)
        b1 = await X.login(xmpp.xport, jid("fullto") + "/one", PW)
        b2 = await X.login(xmpp.xport, jid("fullto") + "/two", PW)
        for c in (b1, b2):
            c.send_presence()
        a.send_message(mto=jid("fullto") + "/two", mbody="only two <&>", mtype="chat")
        m = await X.next_of(b2.messages)
        assert m["body"] == "only two <&>"
        assert str(m["from"]) == jid("fullfrom") + "/a"  # stamped by the server
        assert str(m["to"]) == jid("fullto") + "/two"
        a.send_message(mto=jid("fullto") + "/one", mbody="marker", mtype="chat")
        assert await X.until_marker(b1.messages, "marker") == []
        await X.logout(a, b1, b2)
    X.run(t())


def test_message_to_bare_jid_priorities(xmpp):
    async def t():
        a = await X.login(xmpp.xport, jid("barefrom") + "/a", PW)
        res = {"hi1": 5, "hi2": 5, "low": 1, "neg": -1}
        cs = {}
        for r, prio in res.items():
            cs[r] = await X.login(xmpp.xport, jid("bareto") + "/" + r, PW)
        # Each announces its priority; one's own presence reaches its other resources, so
        # wait until the last one's is seen by the first.
        # One session's stanzas are handled in order: once its ping is answered, its
        # presence (and priority) is in the registry.
        for r, prio in res.items():
            cs[r].send_presence(ppriority=prio)
            assert (await ping(cs[r]))["type"] == "result"
        a.send_message(mto=jid("bareto"), mbody="to the bare", mtype="chat")
        for r in ("hi1", "hi2"):
            m = await X.next_of(cs[r].messages)
            assert m["body"] == "to the bare" and str(m["from"]) == jid("barefrom") + "/a"
        for r in ("low", "neg"):
            a.send_message(mto=jid("bareto") + "/" + r, mbody="marker", mtype="chat")
            assert [m["body"] for m in await X.until_marker(cs[r].messages, "marker")] == [], r
        await X.logout(a, *cs.values())
    X.run(t())


def test_own_presence_to_other_resources(xmpp):
    """RFC 6121 4.2.2 / 4.5.2: a resource's available and unavailable presence reaches the
    account's other available resources."""
    async def t():
        one = await X.login(xmpp.xport, jid("ownpres") + "/one", PW)
        one.send_presence()
        assert (await ping(one))["type"] == "result"
        two = await X.login(xmpp.xport, jid("ownpres") + "/two", PW)
        two.send_presence(pstatus="two here", ppriority=3)
        p = await X.next_of(one.presences, lambda p: p["from"] == two.boundjid)
        assert p["status"] == "two here" and p["priority"] == 3 and p["type"] == "available"
        await X.logout(two)
        p = await X.next_of(one.presences, lambda p: p["from"] == two.boundjid)
        assert p["type"] == "unavailable"
        await X.logout(one)
    X.run(t())


def test_own_presence_echoed_to_sender(xmpp):
    async def t():
        c = await X.login(xmpp.xport, jid("ownecho") + "/only", PW)
        c.send_presence(pstatus="me")
        p = await X.next_of(c.presences, lambda p: p["from"] == c.boundjid, timeout=5)
        assert p["status"] == "me"
        await X.logout(c)
    X.run(t())


def test_message_to_nonexistent_account(xmpp):
    async def t():
        a = await X.login(xmpp.xport, jid("nouserfrom") + "/a", PW)
        a.send_message(mto=jid("nobody-here"), mbody="hello?", mtype="chat")
        e = await X.next_of(a.errors)
        assert e["error"]["type"] == "cancel"
        assert e["error"]["condition"] == "service-unavailable"
        assert e["from"].bare == jid("nobody-here")
        await X.logout(a)
    X.run(t())


def test_offline_message_delivered_at_initial_presence(xmpp):
    async def t():
        a = await X.login(xmpp.xport, jid("offfrom") + "/a", PW)
        a.send_message(mto=jid("offto"), mbody="kept 1", mtype="chat")
        a.send_message(mto=jid("offto") + "/gone", mbody="kept 2", mtype="chat")
        # No error comes back: the account exists. A ping after them is answered only once
        # the messages are handed on (the session's stanzas are handled in order).
        pong = await X.iq_get(a, "localhost", f"<ping xmlns='{X.NS_PING}'/>")
        assert pong["type"] == "result"
        assert a.errors.empty()
        b = await X.login(xmpp.xport, jid("offto") + "/back", PW)
        b.send_presence()
        m1 = await X.next_of(b.messages)
        m2 = await X.next_of(b.messages)
        assert [m1["body"], m2["body"]] == ["kept 1", "kept 2"]  # in order
        assert m1.xml.find("{urn:xmpp:delay}delay") is not None  # XEP-0203 stamp
        await X.logout(a, b)
    X.run(t())


def _roster_get(r, id_):
    """A roster get on a raw session, waited for: what the store had by then is in its answer."""
    r.send(f"<iq type='get' id='{id_}'><query xmlns='jabber:iq:roster'/></iq>")
    return r.read_until(rb"<iq[^>]*id='" + id_.encode() + rb"'[^>]*(/>|>.*?</iq>)")


@pytest.mark.parametrize("what", ["kept", "request"])
def test_between_roster_get_and_presence(xmpp, what):
    """A message kept for the user, or a subscription request made, after its client fetched
    the roster and before its initial presence comes with that presence (RFC 6121 3.1.3,
    XEP-0160): rtd's roster get tells the session whether the presence has anything to
    fetch, and what comes in between must change its mind."""
    u = X.Raw(xmpp.xport)
    s = X.Raw(xmpp.xport)
    to, sender = {"kept": ("keptto", "keptfrom"), "request": ("askto", "askfrom")}[what]
    try:
        u.login(to, PW, resource="r")
        s.login(sender, PW, resource="r")
        _roster_get(u, "g1")
        if what == "kept":
            s.send(f"<message to='{jid(to)}' type='chat'><body>late</body></message>")
        else:
            s.send(f"<presence type='subscribe' to='{jid(to)}'/>")
        # The sender's next request to the store is answered after the first one's work.
        _roster_get(s, "g2")
        u.send("<presence/>")
        if what == "kept":
            assert "<body>late</body>" in u.read_until(rb"<body>late</body>")
        else:
            got = u.read_until(rb"<presence[^>]*type=['\"]subscribe['\"][^>]*>")
            assert f"{sender}@localhost" in got[got.rindex("<presence"):], got
    finally:
        u.close()
        s.close()


def _bodies(text, tag):
    return re.findall(rf"<body>{re.escape(tag)}(\d+)</body>", text)


def _read_while_moving(server, conn, pattern):
    """conn's next match of pattern, waited for as long as rtd keeps routing or keeping
    messages (a flood of 20,000 takes minutes under TSan): it fails only when a whole
    X.TIMEOUT went by with neither counter moving (the counters are read at a timeout only)."""
    def moved():
        return (X.metric(server, "rt_xmpp_stanzas_routed_total") +
                X.metric(server, "rt_xmpp_offline_stored_total"))
    last = None
    while True:
        try:
            return conn.read_until(pattern)
        except AssertionError:
            now = moved()
            if now == last:
                raise
            last = now


@pytest.fixture(scope="module")
def xmpp_roomy():
    """A server whose offline store takes a flood: the kick below sends most of one there."""
    server = S.serve(["orphanto", "orphanfrom"], PW, max_offline=100000,
                     rtd_settings=", max_offline_bytes = 100000000")
    yield server
    S.stop(server)


def test_messages_left_in_an_ended_sessions_mailbox_are_kept(xmpp_roomy):
    """A session kicked while a flood of chats to it is under way: what it had not taken from
    its mailbox when it ended goes on as if its resource had gone (RFC 6121 8.5.3.2.1), here
    to offline storage, so the user gets every message once across its two sessions and the
    sender no error. Whether the kick lands among the messages is up to timing (the flood
    lasts longer than rtctl takes to start): up to 10 tries until the path ran
    (rt_xmpp_orphans_rerouted_total moved), each checking that none was lost or doubled."""
    xmpp = xmpp_roomy
    if not S.is_rtd(xmpp):
        pytest.skip("rtd's own counter tells whether the case happened")
    n = 20000
    for attempt in range(10):
        before = X.metric(xmpp, "rt_xmpp_orphans_rerouted_total")
        r = X.Raw(xmpp.xport)
        r.login("orphanto", PW, resource="r")
        r.send("<presence/>")
        r.read_until(rb"<presence[^>]*/>")
        s = X.Raw(xmpp.xport)
        s.login("orphanfrom", PW, resource="s")
        tag = f"try{attempt}-"
        s.send("".join(f"<message to='{jid('orphanto')}/r' type='chat' id='m{i}'>"
                       f"<body>{tag}{i}</body></message>" for i in range(n)))
        got = _bodies(r.read_until(rf"<body>{tag}\d+</body>".encode()), tag)
        code, out, err = xmpp.ctl("xmpp", "kick", f"{jid('orphanto')}/r")
        assert code == 0, (out, err)
        got += _bodies(r.read_to_close(), tag)
        # Every message routed (the sender's stanzas are handled in order), and no error back.
        s.send("<iq type='get' id='done' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>")
        text = _read_while_moving(xmpp, s, rb"<iq[^>]*id='done'[^>]*/>")
        assert "type='error'" not in text, text
        r2 = X.Raw(xmpp.xport)
        r2.login("orphanto", PW, resource="r2")
        r2.send("<presence/>")
        while len(got) < n:  # the rest comes from offline storage at the presence
            got += _bodies(_read_while_moving(xmpp, r2, rb"</message>"), tag)
        assert sorted(map(int, got)) == list(range(n)), got
        for c in (r2, s):
            c.close()
        if X.metric(xmpp, "rt_xmpp_orphans_rerouted_total") > before:
            return
    pytest.fail("in 10 tries the kick never ended the session with messages in its mailbox")


def test_iqs_to_a_kicked_session_are_answered(xmpp_roomy):
    """RFC 6121 8.5.3.2.3: an iq request to a full JID is answered service-unavailable when
    that resource is gone: one routed after the session left the registry, one sent to it as it
    ended (the send fails), one left in its mailbox (the runtime's dead letter) or come after
    its stream ended. Three kicks inside a flood of requests, which flows until the kick is done
    (at most 200,000): every request is either taken by the session or answered so, once, and
    none waits for ever. Which of the paths a kick hits is up to timing; test_xmpp_sm's expired
    session answers its held requests through the same function every time."""
    xmpp = xmpp_roomy
    if not S.is_rtd(xmpp):
        pytest.skip("the kick is rtd's")
    for attempt in range(3):
        r = X.Raw(xmpp.xport)
        r.login("orphanto", PW, resource="iq")
        s = X.Raw(xmpp.xport)
        s.login("orphanfrom", PW, resource="s")
        tag = f"t{attempt}-"
        n, kicked = 0, threading.Event()

        def batch():
            nonlocal n
            s.send("".join(f"<iq to='{jid('orphanto')}/iq' type='get' id='{tag}{i}'>"
                           f"<ping xmlns='urn:xmpp:ping'/></iq>" for i in range(n, n + 500)))
            n += 500

        def flood():
            while not kicked.is_set() and n < 200000:
                batch()
        sender = threading.Thread(target=flood)
        sender.start()
        taken = re.findall(rf"id='{tag}(\d+)'", r.read_until(rf"id='{tag}\d+'".encode()))
        code, out, err = xmpp.ctl("xmpp", "kick", f"{jid('orphanto')}/iq")
        kicked.set()
        sender.join()
        assert code == 0, (out, err)
        # One batch more, sent after the kick is done: the flood alone may have ended before it
        # (a kick faster than the session took its first batch, p102), and these find the
        # resource gone, so some requests are always answered by the server.
        batch()
        taken += re.findall(rf"id='{tag}(\d+)'", r.read_to_close())
        answered = []
        while len(taken) + len(answered) < n:
            text = _read_while_moving(xmpp, s, rb"</iq>")
            for stanza in re.findall(rf"<iq[^>]*id='{tag}\d+'[^>]*>", text):
                assert "type='error'" in stanza, stanza
                answered += re.findall(rf"id='{tag}(\d+)'", stanza)
        assert 0 < len(taken) < n
        assert sorted(map(int, taken + answered)) == list(range(n))
        s.close()


# ---- iq ----

async def ping(c, to="localhost"):
    return await X.iq_get(c, to, f"<ping xmlns='{X.NS_PING}'/>")


def test_ping_server(xmpp):
    async def t():
        c = await X.login(xmpp.xport, jid("ping") + "/p", PW)
        pong = await X.iq_get(c, "localhost", f"<ping xmlns='{X.NS_PING}'/>")
        assert pong["type"] == "result" and pong["from"] == "localhost"
        assert len(pong.xml) == 0  # an empty result
        await X.logout(c)
    X.run(t())


def test_disco_info(xmpp):
    async def t():
        c = await X.login(xmpp.xport, jid("disco") + "/p", PW)
        r = await X.iq_get(c, "localhost", f"<query xmlns='{X.NS_DISCO_INFO}'/>")
        assert r["type"] == "result", r
        q = r.xml.find(f"{{{X.NS_DISCO_INFO}}}query")
        ids = [(i.get("category"), i.get("type"))
               for i in q.findall(f"{{{X.NS_DISCO_INFO}}}identity")]
        assert ("server", "im") in ids, ids
        feats = {f.get("var") for f in q.findall(f"{{{X.NS_DISCO_INFO}}}feature")}
        assert {X.NS_DISCO_INFO, X.NS_PING} <= feats, feats
        await X.logout(c)
    X.run(t())


def test_iq_to_offline_full_jid(xmpp):
    async def t():
        c = await X.login(xmpp.xport, jid("iqoff") + "/p", PW)
        r = await X.iq_get(c, jid("victim") + "/not-online", f"<ping xmlns='{X.NS_PING}'/>")
        assert r["type"] == "error" and r["error"]["type"] == "cancel"
        assert r["error"]["condition"] == "service-unavailable", r
        await X.logout(c)
    X.run(t())


def test_iq_unknown_payload_to_server(xmpp):
    async def t():
        c = await X.login(xmpp.xport, jid("iqunknown") + "/p", PW)
        r = await X.iq_get(c, "localhost", "<query xmlns='urn:example:nothing-knows-this'/>")
        assert r["type"] == "error" and r["error"]["type"] == "cancel"
        assert r["error"]["condition"] == "service-unavailable", r
        await X.logout(c)
    X.run(t())


# ---- Stream errors ----

def test_forged_from_invalid_from(xmpp):
    """RFC 6120 8.1.2.1: the server stamps the sender's full JID over a client's 'from' (rtd
    ends the stream with invalid-from, 4.9.3.9, instead); the forged 'from' never arrives."""
    import asyncio

    async def t():
        v = await X.login(xmpp.xport, jid("victim") + "/v", PW)
        c = await X.login(xmpp.xport, jid("forger") + "/f", PW)
        c.send_raw(f"<message from='{jid('victim')}/x' to='{jid('victim')}/v' type='chat'>"
                   "<body>forged</body></message>")
        err, got = (asyncio.ensure_future(X.next_of(c.stream_errors)),
                    asyncio.ensure_future(X.next_of(v.messages)))
        done, pending = await asyncio.wait({err, got}, timeout=X.TIMEOUT,
                                           return_when=asyncio.FIRST_COMPLETED)
        for f in pending:
            f.cancel()
        assert done, "neither a stream error nor the message came"
        if err in done:
            assert err.result()["condition"] == "invalid-from", err.result()
            await asyncio_wait(c.gone.wait())
        else:
            assert not S.is_rtd(xmpp), "rtd ends the stream"
            assert got.result()["from"] == c.boundjid, got.result()
        await X.logout(c, v)
    X.run(t())
    X.assert_serves(xmpp.xport, "after", PW)


BAD_INPUT = {
    "stanza before auth": (
        X.header() + b"<message to='after@localhost'><body>hi</body></message>",
        "not-authorized"),
    "doctype": (
        b"<?xml version='1.0'?><!DOCTYPE lol [<!ENTITY lol 'lol'>]>" + X.header()[21:],
        "restricted-xml"),
    "stanza over max_stanza_size": (
        # Past rtd's 4096 here and Prosody's least (10,000 bytes before login).
        X.header() + b"<message><body>" + b"x" * 12000 + b"</body></message>",
        "policy-violation"),
    "unknown host": (X.header("elsewhere.example"), "host-unknown"),
    "invalid utf-8": (X.header() + b"<message><body>\xc3\x28\xff</body></message>",
                      "not-well-formed"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_stream_error(xmpp, case):
    data, want = BAD_INPUT[case]
    r = X.Raw(xmpp.xport)
    r.send(data)
    cond, text = r.stream_error()
    assert cond == want, text
    assert "<stream:stream" in text  # the error comes inside a stream of the server's
    r.close()
    X.assert_serves(xmpp.xport, "after", PW)


@pytest.mark.rtd_only("rtd's connect_timeout setting and its log line")
def test_connect_timeout(stopper):
    port = free_port()
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{port}" }} }}',
                 "connect_timeout=1")
    stopper(broker)
    r = X.Raw(port)
    t0 = time.monotonic()
    cond, text = r.stream_error(timeout=10)
    took = time.monotonic() - t0
    assert cond == "connection-timeout", text
    assert 0.9 <= took < 5, took
    r.close()
    assert "event=xmpp.connect_timeout" in broker.read_log()
    # A client that does speak is served.
    r = X.Raw(port)
    assert "<mechanism>SCRAM-SHA-256</mechanism>" in r.open()
    r.close()


# ---- STARTTLS ----

@pytest.mark.rtd_only("starts an rtd with TLS; the peers' runs have no TLS listener")
def test_starttls_required(pki, stopper):
    import tempfile
    cert, key = pki.server["ec"]
    d = tempfile.mkdtemp(prefix="rtd-xmpp-tls-")
    X.add_user(d, "tls@localhost", PW)
    port = free_port()
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, plaintext_from = {{}}, listeners = {{ '
                 f'{{ bind = "127.0.0.1:{port}", tls = {{ cert = "{cert}", key = "{key}" }}, '
                 f'starttls = true }} }} }}', data_dir=d)
    stopper(broker)
    # Before TLS: STARTTLS required, no mechanism offered, and SASL refused.
    r = X.Raw(port)
    feats = r.open()
    assert f"<starttls xmlns='{X.NS_TLS}'><required/></starttls>" in feats, feats
    assert "<mechanisms" not in feats, feats
    r.sasl("SCRAM-SHA-256", X.Scram("SCRAM-SHA-256", "tls", PW).first())
    name, inner = r.sasl_reply()
    assert (name, inner) == ("failure", "<encryption-required/>")
    r.close()
    # Raw STARTTLS: after it, PLAIN is offered and logs in.
    r = X.Raw(port)
    r.open()
    r.send(f"<starttls xmlns='{X.NS_TLS}'/>")
    assert "<proceed" in r.read_until(rb"<proceed[^>]*/>")
    ctx = ssl.create_default_context(cafile=pki.ca.cert)
    r.sock = ctx.wrap_socket(r.sock, server_hostname="localhost")
    feats = r.open()
    mechs = re.findall(r"<mechanism>([^<]+)</mechanism>", feats)
    assert "PLAIN" in mechs and "SCRAM-SHA-256" in mechs, feats
    assert "<starttls" not in feats, feats
    r.sasl("PLAIN", b"\0tls\0" + PW.encode())
    assert r.sasl_reply()[0] == "success"
    r.close()
    # -PLUS: bound to this TLS channel by the server certificate's hash (RFC 5929; the test
    # certificate is signed with SHA-256). Bound to another channel's data, the proof fails.
    for data, outcome in ((None, "success"), (b"\0" * 32, "failure")):
        r = X.Raw(port)
        r.open()
        r.send(f"<starttls xmlns='{X.NS_TLS}'/>")
        r.read_until(rb"<proceed[^>]*/>")
        r.sock = ctx.wrap_socket(r.sock, server_hostname="localhost")
        feats = r.open()
        assert "<mechanism>SCRAM-SHA-256-PLUS</mechanism>" in feats, feats
        assert "<channel-binding type='tls-server-end-point'/>" in feats, feats
        end_point = hashlib.sha256(r.sock.getpeercert(binary_form=True)).digest()
        name, _ = r.scram("SCRAM-SHA-256-PLUS", "tls", PW,
                          cb=("tls-server-end-point", data or end_point))
        assert name == outcome, (data, name)
        r.close()

    # slixmpp 1.8.3 binds -PLUS with tls-unique, which TLS 1.3 does not define, and then
    # says "y" (no -PLUS offered, it thinks): served by a listener that offers no -PLUS.
    port = free_port()
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, plaintext_from = {{}}, listeners = {{ '
                 f'{{ bind = "127.0.0.1:{port}", tls = {{ cert = "{cert}", key = "{key}" }}, '
                 f'starttls = true }} }}, channel_binding = false }}',
                 f'admin_socket="{d}/second.sock"', data_dir=d)
    stopper(broker)

    # slixmpp: STARTTLS, the certificate checked against the test CA, then SCRAM.
    async def t():
        c = await X.login(port, "tls@localhost/lib", PW, tls=True, cafile=pki.ca.cert)
        assert c.transport.get_extra_info("ssl_object") is not None
        assert "PLAIN" in c.plugin["feature_mechanisms"].mech_list
        assert "SCRAM-SHA-256-PLUS" not in c.plugin["feature_mechanisms"].mech_list
        pong = await X.iq_get(c, "localhost", f"<ping xmlns='{X.NS_PING}'/>")
        assert pong["type"] == "result"
        await X.logout(c)
    X.run(t())


# ---- Rosters and presence subscriptions (RFC 6121) ----

async def roster_items(c):
    r = await X.iq_get(c, None, f"<query xmlns='{X.NS_ROSTER}'/>")
    assert r["type"] == "result", r
    q = r.xml.find(f"{{{X.NS_ROSTER}}}query")
    assert q is not None, r
    return {i.get("jid"): i for i in q.findall(f"{{{X.NS_ROSTER}}}item")}


def push_item(iq):
    items = iq.xml.find(f"{{{X.NS_ROSTER}}}query").findall(f"{{{X.NS_ROSTER}}}item")
    assert len(items) == 1, iq  # RFC 6121 2.1.6: one item per push
    return items[0]


async def next_push(c, contact):
    return push_item(await X.next_of(c.pushes, lambda iq: push_item(iq).get("jid") == contact))


def sub_of(item):
    return item.get("subscription", "none"), item.get("ask")


def test_roster_get_set_remove_pushes(xmpp):
    async def t():
        a1 = await X.login(xmpp.xport, jid("rosterset") + "/one", PW)
        a2 = await X.login(xmpp.xport, jid("rosterset") + "/two", PW)
        assert await roster_items(a1) == {}
        await roster_items(a2)  # an interested resource (RFC 6121 2.1.6)
        iq = a1.make_iq_set()
        iq.append(X.ET.fromstring(
            f"<query xmlns='{X.NS_ROSTER}'><item jid='{jid('victim')}' name='Vic'>"
            "<group>Friends</group></item></query>"))
        res = await iq.send(timeout=X.TIMEOUT)
        assert res["type"] == "result"
        for c in (a1, a2):
            item = await next_push(c, jid("victim"))
            assert item.get("name") == "Vic" and sub_of(item) == ("none", None)
            assert [g.text for g in item.findall(f"{{{X.NS_ROSTER}}}group")] == ["Friends"]
        items = await roster_items(a2)
        assert list(items) == [jid("victim")] and items[jid("victim")].get("name") == "Vic"
        iq = a2.make_iq_set()
        iq.append(X.ET.fromstring(f"<query xmlns='{X.NS_ROSTER}'><item jid='{jid('victim')}' "
                                  "subscription='remove'/></query>"))
        assert (await iq.send(timeout=X.TIMEOUT))["type"] == "result"
        for c in (a1, a2):
            assert (await next_push(c, jid("victim"))).get("subscription") == "remove"
        assert await roster_items(a1) == {}
        await X.logout(a1, a2)
    X.run(t())


async def online(user, res, port):
    """A session that asked for its roster and sent initial presence."""
    c = await X.login(port, jid(user) + "/" + res, PW)
    await roster_items(c)
    c.send_presence()
    return c


async def request_and_approve(user, contact):
    """user subscribes to contact and contact approves (RFC 6121 3.1): afterwards user's
    roster has contact with subscription to, contact's has user with from (one way)."""
    user.send_presence(pto=contact.boundjid.bare, ptype="subscribe")
    p = await X.next_of(contact.presences, lambda p: p["type"] == "subscribe")
    assert p["from"] == user.boundjid.bare  # bare: RFC 6121 3.1.2
    contact.send_presence(pto=user.boundjid.bare, ptype="subscribed")


def test_subscription_request_and_approval(xmpp):
    async def t():
        u = await online("subuser", "u", xmpp.xport)
        c = await online("subcontact", "c", xmpp.xport)
        u.send_presence(pto=jid("subcontact"), ptype="subscribe")
        # 3.1.2: the user's roster shows the pending request (none + ask=subscribe).
        assert sub_of(await next_push(u, jid("subcontact"))) == ("none", "subscribe")
        p = await X.next_of(c.presences, lambda p: p["type"] == "subscribe")
        assert p["from"] == jid("subuser")
        # 3.1.5: the contact approves; its roster has the user with from, the user's to.
        c.send_presence(pto=jid("subuser"), ptype="subscribed")
        assert sub_of(await next_push(c, jid("subuser"))) == ("from", None)
        assert sub_of(await next_push(u, jid("subcontact"))) == ("to", None)
        p = await X.next_of(u.presences, lambda p: p["type"] == "subscribed")
        assert p["from"] == jid("subcontact")
        # 3.1.6 / 4.3: the contact's available resources' presence goes to the user.
        p = await X.next_of(u.presences, lambda p: p["type"] == "available")
        assert str(p["from"]) == jid("subcontact") + "/c"
        assert (await roster_items(u))[jid("subcontact")].get("subscription") == "to"
        assert (await roster_items(c))[jid("subuser")].get("subscription") == "from"
        # 4.2: the contact's later presence is broadcast to the subscriber, not the reverse.
        c.send_presence(pstatus="busy now", pshow="dnd")
        p = await X.next_of(u.presences, lambda p: p["status"] == "busy now")
        assert p["show"] == "dnd"
        u.send_presence(pstatus="user status")
        c.send_message(mto=u.boundjid, mbody="marker", mtype="chat")
        await X.next_of(u.messages, lambda m: m["body"] == "marker")
        u.send_message(mto=c.boundjid, mbody="marker", mtype="chat")
        got = [p for p in await until_marker_presence(c, "marker")
               if p["status"] == "user status"]
        assert got == [], got
        await X.logout(u, c)
    X.run(t())


def test_repeated_subscribe_is_not_delivered_again(xmpp):
    """RFC 6121 A.3.1: a subscribe while the contact has the user's request pending changes
    nothing and is not delivered again (the request waits, and comes at each login)."""
    async def t():
        u = await online("resubuser", "u", xmpp.xport)
        c = await online("resubcontact", "c", xmpp.xport)
        u.send_presence(pto=jid("resubcontact"), ptype="subscribe")
        await X.next_of(c.presences, lambda p: p["type"] == "subscribe")
        u.send_presence(pto=jid("resubcontact"), ptype="subscribe")
        # Barriers through the store, which handles subscriptions in order: the user's roster
        # answer comes after its second request was handled, the contact's after whatever
        # that request sent the contact.
        await roster_items(u)
        await roster_items(c)
        again = []
        while not c.presences.empty():
            again.append(c.presences.get_nowait())
        assert [p for p in again if p["type"] == "subscribe"] == []
        assert sub_of((await roster_items(u))[jid("resubcontact")]) == ("none", "subscribe")
        await X.logout(u, c)
    X.run(t())


def test_removed_account_is_granted_nothing_when_made_again(xmpp):
    """An account removed (`rtctl xmpp user del`) while subscribed both ways: its contact's
    item stays with no subscription, pushed to the contact's session at once, so a new
    account of the same name gets none of the contact's presence (ejabberd and Prosody keep
    the item so too)."""
    if not S.is_rtd(xmpp):
        pytest.skip("rtctl is rtd's")

    async def t():
        u = await online("goneuser", "u", xmpp.xport)
        c = await online("gonecontact", "c", xmpp.xport)
        await request_and_approve(u, c)
        await X.next_of(u.presences, lambda p: p["type"] == "subscribed")
        await request_and_approve(c, u)
        await X.next_of(c.presences, lambda p: p["type"] == "subscribed")
        assert sub_of((await roster_items(c))[jid("goneuser")]) == ("both", None)
        code, out, err = xmpp.ctl("xmpp", "user", "del", jid("goneuser"))
        assert code == 0, (out, err)
        push = await X.next_of(c.pushes, lambda iq: push_item(iq).get("jid") == jid("goneuser")
                               and push_item(iq).get("subscription", "none") == "none")
        assert push_item(push).get("ask") is None
        assert sub_of((await roster_items(c))[jid("goneuser")]) == ("none", None)
        code, out, err = xmpp.ctl("xmpp", "user", "add", jid("goneuser"), "--password", PW)
        assert code == 0, (out, err)
        again = await online("goneuser", "again", xmpp.xport)
        assert await roster_items(again) == {}
        assert await presences_before_marker(c, again, "not for you") == []
        await X.logout(again, c)
    X.run(t())


async def until_marker_presence(c, marker):
    """The presences c got before the message marker arrived."""
    await X.next_of(c.messages, lambda m: m["body"] == marker)
    out = []
    while not c.presences.empty():
        out.append(c.presences.get_nowait())
    return out


async def presences_before_marker(sender, receiver, status):
    """sender broadcasts a presence with status, then sends receiver a chat marker: one
    session's stanzas to another arrive in order, so the presence comes first if it comes at
    all. The presences with status receiver got before the marker."""
    sender.send_presence(pstatus=status)
    sender.send_message(mto=receiver.boundjid, mbody="marker", mtype="chat")
    return [p for p in await until_marker_presence(receiver, "marker") if p["status"] == status]


def test_probe_at_initial_presence(xmpp):
    """RFC 6121 4.2-4.3: the user's initial presence goes to its from-subscribers, and probes
    bring it the presence of the contacts it is subscribed to."""
    async def t():
        u = await online("probeuser", "u", xmpp.xport)
        c = await online("probecontact", "c", xmpp.xport)
        await request_and_approve(u, c)   # u: to, c: from
        await X.next_of(u.presences, lambda p: p["type"] == "subscribed")
        await request_and_approve(c, u)   # u: both, c: both
        await X.next_of(c.presences, lambda p: p["type"] == "subscribed")
        # 3.1.5: the approver's presence follows. u's session sends it on the store's word,
        # queued after the push that gives its roster copy 'from' for c: once c has it, u's
        # session knows c is a subscriber. Without this wait, a turn of u's preempted after
        # it read its 'subscribed' can read the close before the push and end as it was
        # before the approval, telling c neither presence (consistent, not what this tests).
        await X.next_of(c.presences, lambda p: p["from"].bare == jid("probeuser") and
                        p["type"] == "available")
        await X.logout(u)
        # 4.5: the user's unavailable presence reaches its contact.
        p = await X.next_of(c.presences, lambda p: p["type"] == "unavailable")
        assert str(p["from"]) == jid("probeuser") + "/u"
        u = await X.login(xmpp.xport, jid("probeuser") + "/again", PW)
        u.send_presence(pstatus="back")
        # The contact gets the initial presence; the user gets the contact's (the probe).
        p = await X.next_of(c.presences, lambda p: p["status"] == "back")
        assert str(p["from"]) == jid("probeuser") + "/again"
        p = await X.next_of(u.presences, lambda p: p["from"].bare == jid("probecontact"))
        assert str(p["from"]) == jid("probecontact") + "/c" and p["type"] == "available"
        await X.logout(u, c)
    X.run(t())


async def subscribed_pair(user, contact, port):
    """Both online and interested, user subscribed to contact (to / from), every push and
    the approval seen by then."""
    u = await online(user, "u", port)
    c = await online(contact, "c", port)
    await request_and_approve(u, c)
    assert sub_of(await next_push(u, jid(contact))) == ("none", "subscribe")
    assert sub_of(await next_push(u, jid(contact))) == ("to", None)
    assert sub_of(await next_push(c, jid(user))) == ("from", None)
    await X.next_of(u.presences, lambda p: p["type"] == "subscribed")
    return u, c


def test_unsubscribe(xmpp):
    """RFC 6121 3.3: the user cancels its subscription to the contact."""
    async def t():
        u, c = await subscribed_pair("unsubuser", "unsubcontact", xmpp.xport)
        u.send_presence(pto=jid("unsubcontact"), ptype="unsubscribe")
        assert sub_of(await next_push(u, jid("unsubcontact"))) == ("none", None)
        assert sub_of(await next_push(c, jid("unsubuser"))) == ("none", None)
        p = await X.next_of(c.presences, lambda p: p["type"] == "unsubscribe")
        assert p["from"] == jid("unsubuser")
        # 3.3.3: the contact's resources' unavailable presence goes to the user.
        p = await X.next_of(u.presences, lambda p: p["type"] == "unavailable")
        assert str(p["from"]) == jid("unsubcontact") + "/c"
        assert (await roster_items(u))[jid("unsubcontact")].get("subscription", "none") == "none"
        await X.logout(u, c)
    X.run(t())


def test_unsubscribed_cancels_subscription(xmpp):
    """RFC 6121 3.2: the contact cancels the user's subscription to it."""
    async def t():
        u, c = await subscribed_pair("cancuser", "canccontact", xmpp.xport)
        c.send_presence(pto=jid("cancuser"), ptype="unsubscribed")
        assert sub_of(await next_push(c, jid("cancuser"))) == ("none", None)
        # 3.2.2: the unsubscribed goes to the user, and the contact's unavailable presence;
        # the RFC does not order the two.
        got = {}
        while len(got) < 2:
            p = await X.next_of(u.presences, lambda p: p["type"] in ("unsubscribed",
                                                                     "unavailable"))
            got[p["type"]] = str(p["from"])
        assert got == {"unsubscribed": jid("canccontact"), "unavailable": jid("canccontact") + "/c"}
        items = await roster_items(u)
        assert items[jid("canccontact")].get("subscription", "none") == "none"
        # No presence of the contact's reaches the user any more.
        assert await presences_before_marker(c, u, "secret") == []
        await X.logout(u, c)
    X.run(t())


# ---- Hibernation ----

@pytest.mark.rtd_only("rtd's hibernation, seen through rtctl")
def test_idle_session_hibernates(xmpp):
    """A bound session quiet for C2S_HIBERNATE_MS is collected and its few objects copied into
    its heap's header block: what its login used (the SASL exchange, parse trees) is given
    back, so its heap holds no 1 KiB chunk (RT_HEAP_CHUNK_SIZE) at all."""
    r = X.Raw(xmpp.xport)
    full = r.login("hibernate", PW, resource="idle")
    r.send(f"<iq type='get' id='r1'><query xmlns='{X.NS_ROSTER}'/></iq><presence/>")
    r.read_until(rb"<presence[^>]*/>")
    info = xmpp.ctl_json("xmpp", "show", full)
    pid = info["pid"]

    # The timer fires C2S_HIBERNATE_MS after the session's first quiet moment, and again for
    # the rest of the quiet time when a message came meanwhile: compacted within twice that
    # of the last message, whatever the load (the deadline only ends a broken run).
    def hibernated():
        mine = [a for a in xmpp.ctl_json("actors") if a["pid"] == pid]
        return mine[0] if mine and mine[0]["handler"] == "hibernate" and \
            mine[0]["heap_bytes"] < 1024 else None
    deadline = time.monotonic() + 60
    while not hibernated():
        assert time.monotonic() < deadline, [a for a in xmpp.ctl_json("actors")
                                             if a["pid"] == pid]
        time.sleep(0.2)
    # And it serves on: a ping answered, its presence still known to its own resources.
    r.send(f"<iq type='get' id='p'><ping xmlns='{X.NS_PING}'/></iq>")
    r.read_until(rb"<iq[^>]*id='p'[^>]*/>")
    r.send("</stream:stream>")
    r.read_to_close()


def test_malformed_to_gets_jid_malformed(xmpp):
    """A 'to' that is no JID (an empty localpart, an empty domain) is answered jid-malformed;
    once, such a JID crashed rtd where the error's reason was written through a NULL."""
    r = X.Raw(xmpp.xport)
    r.login("malformed", PW, resource="r")
    for bad in ("@bad", "a@", "a@b/", "@"):
        r.send(f"<message to='{bad}' id='m' type='chat'><body>x</body></message>")
        text = r.read_until(rb"</message>")
        assert "type='error'" in text and "<jid-malformed" in text, (bad, text)
    r.send("</stream:stream>")
    r.read_to_close()
    X.assert_serves(xmpp.xport, "after", PW)


@pytest.mark.rtd_only("rtd's low lane for a lost connection's end, its streams gauge")
def test_client_back_on_its_resource_while_the_lost_session_ends():
    """A bound session whose connection drops ends in the low lane (rt_sock_low_at_hangup):
    a client back on the same resource meanwhile replaces it. Whichever comes first, the old
    session's end or the new one's presence, the contact ends up seeing the resource
    available (the late end sends no unavailable in the name of a resource that an available
    session holds again), and a message sent to the full JID in the gap reaches the client
    once (the old session's dead letters go on to the account's sessions or offline)."""
    server = S.serve(["lsa", "lsb"], PW)
    try:
        a = X.session(server.xport, "lsa", "localhost", PW, "r")
        b = X.session(server.xport, "lsb", "localhost", PW, "b")
        a.send("<presence/>")
        b.send("<presence/>")
        X.subscribe_across(a, jid("lsa"), b, jid("lsb"))
        X.subscribe_across(b, jid("lsb"), a, jid("lsa"))
        available = rb"<presence(?![^>]*type=)[^>]*from=['\"]lsa@localhost/r['\"]"
        for i in range(10):
            a.close()  # no stream end: the connection is lost
            b.send(f"<message to='lsa@localhost/r' type='chat' id='g{i}'>"
                   f"<body>gap {i}</body></message>")
            a = X.session(server.xport, "lsa", "localhost", PW, "r")
            a.send("<presence/>")
            a.read_until(f"gap {i}<".encode())
            b.read_until(available)
            # The old stream's actor has ended (its end ran, or found the resource taken)...
            deadline = time.monotonic() + 60
            while X.metric(server, "rt_xmpp_streams") != 2:
                assert time.monotonic() < deadline, X.metric(server, "rt_xmpp_streams")
                time.sleep(0.05)
            # ...so whatever it sent b is in b's mailbox ahead of this ping.
            b.send(f"<iq type='get' id='pb{i}'><ping xmlns='{X.NS_PING}'/></iq>")
            after = b.read_until(f"<iq[^>]*id='pb{i}'[^>]*/>".encode())
            assert not re.search(r"<presence[^>]*type=['\"]unavailable['\"][^>]*"
                                 r"from=['\"]lsa@localhost/r|<presence[^>]*from=['\"]"
                                 r"lsa@localhost/r['\"][^>]*type=['\"]unavailable", after), after
            a.send(f"<iq type='get' id='pa{i}'><ping xmlns='{X.NS_PING}'/></iq>")
            assert f"gap {i}<" not in a.read_until(f"<iq[^>]*id='pa{i}'[^>]*/>".encode())
        a.close()
        b.close()
    finally:
        S.stop(server)
