"""Stream management (XEP-0198, issue 29 section 4) against a real rtd, over raw sockets so each
element is the test's: acknowledgements both ways, a dropped connection's session resumed on a
new one with what the client had not acknowledged sent again, a wrong resumption id refused
(the stream then binds as usual), and a detached session whose time runs out putting the
messages it held into the offline store, delivered at the next login, and answering the iq
requests it held with an error; and a detached session whose resource a new session binds
(not resuming it: a client that lost its resumption id, or reached another cluster node) handing
the messages it held on to the new one."""
import re
import time

import pytest

import xmpp_server as S
import xmpp_util as X

PW = "sm secret"
NS_SM = "urn:xmpp:sm:3"


def start(resume_timeout, users):
    return S.serve(users, PW, resume_timeout=resume_timeout,
                   rtd_options=("auth_max_delay_ms=0",))


@pytest.fixture(scope="module")
def xmpp():
    broker = start(60, ["smuser", "smpeer", "tokuser"])
    yield broker
    S.stop(broker)


def wait_log(broker, pattern, timeout=10):
    """rtd's log line that it saw the connection drop. A peer has no such barrier: what is
    sent meanwhile to the session it has not yet seen drop waits unacknowledged, which a
    resumption sends again all the same (XEP-0198 5)."""
    if not S.is_rtd(broker):
        return
    deadline = time.monotonic() + timeout
    while not re.search(pattern, broker.read_log()):
        assert time.monotonic() < deadline, broker.read_log()[-2000:]
        time.sleep(0.02)


def enable(r):
    r.send(f"<enable xmlns='{NS_SM}' resume='true'/>")
    text = r.read_until(rb"<enabled[^>]*/>")
    m = re.search(r"\sid=['\"]([^'\"]+)['\"]", text)
    assert m and re.search(r"resume=['\"](true|1)['\"]", text), text
    return m.group(1)


def acked(r):
    r.send(f"<r xmlns='{NS_SM}'/>")
    text = r.read_until(rb"<a\s[^>]*xmlns=['\"]" + NS_SM.encode() + rb"['\"][^>]*/>")
    return int(re.search(r"<a\s[^>]*h=['\"](\d+)['\"]", text).group(1))


def chat(r, to, body):
    r.send(f"<message to='{to}' type='chat' id='{body}'><body>{body}</body></message>")


def relogin(port, user):
    """A new connection authenticated as user, stopped where it would bind or resume."""
    r = X.Raw(port)
    r.open()
    assert r.scram("SCRAM-SHA-256", user, PW) == ("success", None)
    feats = r.open()
    assert f"<sm xmlns='{NS_SM}'" in feats, feats
    return r


def test_acks_and_resumption(xmpp):
    a = X.Raw(xmpp.xport)
    assert a.login("smuser", PW, resource="phone") == "smuser@localhost/phone"
    smid = enable(a)
    assert acked(a) == 0
    a.send("<iq type='get' id='p1'><ping xmlns='urn:xmpp:ping'/></iq>")
    a.read_until(rb"<iq[^>]*id='p1'[^>]*/>")
    assert acked(a) == 1  # the ping, counted once enabled

    b = X.Raw(xmpp.xport)
    b.login("smpeer", PW, resource="desk")
    chat(b, "smuser@localhost/phone", "m1")
    a.read_until(rb"<body>m1</body>.*?</message>")
    a.sock.close()  # gone without a close and without acknowledging m1
    wait_log(xmpp, r"xmpp.session_detached jid=smuser@localhost/phone")
    chat(b, "smuser@localhost/phone", "m2")  # kept for the detached session

    a2 = relogin(xmpp.xport, "smuser")
    a2.send(f"<resume xmlns='{NS_SM}' previd='{smid}' h='0'/>")
    text = a2.read_until(rb"<body>m2</body>.*?</message>")
    resumed = re.search(r"<resumed\s[^>]*>", text).group(0)
    assert f"xmlns='{NS_SM}'" in resumed and "h='1'" in resumed, text
    assert f"previd='{smid}'" in resumed, text
    assert text.index("<body>m1</body>") < text.index("<body>m2</body>"), text
    # The session is the same one: its full JID, its counters, its routes.
    a2.send(f"<a xmlns='{NS_SM}' h='2'/>")
    assert acked(a2) == 1
    chat(a2, "smpeer@localhost/desk", "back")
    text = b.read_until(rb"<body>back</body>.*?</message>")
    assert "from='smuser@localhost/phone'" in text, text
    a2.send("</stream:stream>")
    b.send("</stream:stream>")
    a2.read_to_close()
    b.read_to_close()


def test_wrong_token_fails_and_binds(xmpp):
    a = X.Raw(xmpp.xport)
    a.login("tokuser", PW, resource="one")
    smid = enable(a)
    a.sock.close()
    wait_log(xmpp, r"xmpp.session_detached jid=tokuser@localhost/one")
    # rtd's id is the actor's pid and a token: the right pid with a wrong token.
    bad = smid.split("-")[0] + "-0123456789abcdef" if S.is_rtd(xmpp) else smid + "x"
    r = relogin(xmpp.xport, "tokuser")
    r.send(f"<resume xmlns='{NS_SM}' previd='{bad}' h='0'/>")
    text = r.read_until(rb"</failed>")
    assert "<item-not-found" in text, text
    # The stream goes on: a new session binds (and replaces the detached one).
    r.send("<iq type='set' id='b2'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'>"
           "<resource>one</resource></bind></iq>")
    assert "<jid>tokuser@localhost/one</jid>" in r.read_until(rb"</iq>")
    r.send("</stream:stream>")
    r.read_to_close()


def phone_with_a_chat(broker, user, peer, body):
    """user@localhost/phone with stream management on, and peer's session (desk), which sent
    it the chat body: (the phone, the peer); the phone has not acknowledged it."""
    a = X.Raw(broker.xport)
    a.login(user, PW, resource="phone")
    enable(a)
    b = X.Raw(broker.xport)
    b.login(peer, PW, resource="desk")
    chat(b, f"{user}@localhost/phone", body)
    a.read_until(rf"<body>{body}</body>.*?</message>".encode())
    return a, b


def test_expired_session_keeps_messages_offline():
    broker = start(1, ["expuser", "exppeer"])
    try:
        a, b = phone_with_a_chat(broker, "expuser", "exppeer", "kept")
        b.send("<iq to='expuser@localhost/phone' type='get' id='asked'>"
               "<ping xmlns='urn:xmpp:ping'/></iq>")
        a.read_until(rb"<iq[^>]*id='asked'")
        a.sock.close()  # neither acknowledged
        if S.is_rtd(broker):
            wait_log(broker, r"xmpp.unacked_rerouted jid=expuser@localhost/phone messages=1")
            # The request is answered as for a resource that is gone (RFC 6121 8.5.3.2.3).
            text = b.read_until(rb"<iq[^>]*id='asked'.*?</iq>")
            assert "type='error'" in text and "service-unavailable" in text, text
            a2 = X.Raw(broker.xport)
            a2.login("expuser", PW, resource="laptop")
            a2.send("<presence/>")
            text = a2.read_until(rb"<body>kept</body>.*?</message>")
            assert "urn:xmpp:delay" in text, text
        else:
            # No log to wait on: a new login each time, until the expired session's message
            # comes at its initial presence (XEP-0198 5: unacknowledged stanzas of a session
            # that timed out are handled as RFC 6121 8.5 says, here kept offline).
            deadline = time.monotonic() + 2 * X.TIMEOUT
            while (a2 := offline_delivery(broker)) is None:
                assert time.monotonic() < deadline, "the message never reached the store"
        for r in (a2, b):
            r.send("</stream:stream>")
            r.read_to_close()
    finally:
        S.stop(broker)


def test_replaced_detached_session_hands_its_messages_on():
    """A phone's connection drops with a chat unacknowledged; the phone comes back without
    resuming and binds the same resource: the detached session is replaced, and the chat it
    held reaches the new session (through the offline store, at its initial presence) rather
    than ending with the old one."""
    broker = start(60, ["repuser", "reppeer"])
    try:
        if not S.is_rtd(broker):
            pytest.skip("waits on rtd's log")
        a, b = phone_with_a_chat(broker, "repuser", "reppeer", "held")
        a.sock.close()  # never acknowledged
        wait_log(broker, r"xmpp.session_detached jid=repuser@localhost/phone queued=1")
        a2 = X.Raw(broker.xport)
        a2.login("repuser", PW, resource="phone")
        wait_log(broker, r"xmpp.unacked_rerouted jid=repuser@localhost/phone messages=1")
        a2.send("<presence/>")
        text = a2.read_until(rb"<body>held</body>.*?</message>")
        assert "from='reppeer@localhost/desk'" in text, text
        for r in (a2, b):
            r.send("</stream:stream>")
            r.read_to_close()
    finally:
        S.stop(broker)


def test_message_kept_twice_keeps_one_stamp():
    """A kept message delivered to a stream-management session that then times out without
    acknowledging it is kept again (XEP-0198 5): the next session gets it with the first
    XEP-0203 stamp alone, not a second one from the same server."""
    broker = start(1, ["twiceuser", "twicepeer"])
    try:
        if not S.is_rtd(broker):
            pytest.skip("waits on rtd's log")
        b = X.Raw(broker.xport)
        b.login("twicepeer", PW, resource="desk")
        chat(b, "twiceuser@localhost", "twice")
        # The store takes requests in order: its answer to this one comes after the message
        # was kept.
        b.send("<iq type='get' id='r1'><query xmlns='jabber:iq:roster'/></iq>")
        b.read_until(rb"<iq[^>]*id='r1'")
        a = X.Raw(broker.xport)
        a.login("twiceuser", PW, resource="phone")
        enable(a)
        a.send("<presence/>")
        first = a.read_until(rb"<body>twice</body>.*?</message>")
        assert first.count("urn:xmpp:delay") == 1, first
        a.sock.close()  # never acknowledged
        wait_log(broker, r"xmpp.unacked_rerouted jid=twiceuser@localhost/phone messages=1")
        a2 = X.Raw(broker.xport)
        a2.login("twiceuser", PW, resource="laptop")
        a2.send("<presence/>")
        again = a2.read_until(rb"<body>twice</body>.*?</message>")
        assert again.count("urn:xmpp:delay") == 1, again
        stamp = re.compile(r"stamp='([^']+)'")
        assert stamp.findall(again) == stamp.findall(first)
        for r in (a2, b):
            r.send("</stream:stream>")
            r.read_to_close()
    finally:
        S.stop(broker)


def offline_delivery(broker):
    """A new session of expuser that got the message kept for it (with its XEP-0203 delay), or
    None (and closed) if its initial presence brought nothing before a ping's answer."""
    a2 = X.Raw(broker.xport)
    a2.login("expuser", PW, resource="laptop")
    a2.send("<presence/><iq type='get' id='after' to='localhost'>"
            "<ping xmlns='urn:xmpp:ping'/></iq>")
    text = a2.read_until(rb"<body>kept</body>.*?</message>|<iq[^>]*id='after'[^>]*(/>|>.*?</iq>)")
    if "<body>kept</body>" not in text:
        a2.close()
        return None
    assert "urn:xmpp:delay" in text, text
    return a2
