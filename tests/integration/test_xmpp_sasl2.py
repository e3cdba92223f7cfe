"""SASL2 (XEP-0388) with Bind2 (XEP-0386) and stream management inline (XEP-0198), on a real
rtd, with the raw client: the exact elements matter here (xmpp.js, which logs in this way
whenever a server offers it, is driven in test_xmpp_node.py). rtd alone: ejabberd 23.01 and
Prosody 0.12 offer none of it.
"""
import base64
import re

import pytest

import xmpp_server as S
import xmpp_util as X

PW = "s3cret-pw"
NS_SASL2 = "urn:xmpp:sasl:2"
NS_BIND2 = "urn:xmpp:bind:0"
NS_SM = "urn:xmpp:sm:3"

USERS = "tagged plainer wrong aborter resumer sender again fresh faster outer changer".split()
NS_FAST = "urn:xmpp:fast:0"
AGENT = "<user-agent id='{}'><software>rt tests</software></user-agent>"

pytestmark = pytest.mark.rtd_only("ejabberd 23.01 and Prosody 0.12 offer no SASL2")


@pytest.fixture(scope="module")
def xmpp():
    server = S.serve(USERS, PW, rtd_settings=", resume_timeout = 60",
                     rtd_options=("auth_max_delay_ms=0",))
    yield server
    S.stop(server)


def authenticate(r, user, password, inline="", mech="SCRAM-SHA-256"):
    """A SASL2 SCRAM exchange with inline requests: ("success", its inner XML, after checking
    the server's signature in additional-data) or ("failure", its inner XML)."""
    s = X.Scram(mech, user, password)
    r.send(f"<authenticate xmlns='{NS_SASL2}' mechanism='{mech}'><initial-response>"
           f"{base64.b64encode(s.first()).decode()}</initial-response>{inline}</authenticate>")
    text = r.read_until(rb"<(challenge|failure)[^>]*(/>|>.*?</\1>)")
    if "<failure" in text:
        return "failure", text
    challenge = re.search(r"<challenge[^>]*>([^<]*)</challenge>", text).group(1)
    assert f"xmlns='{NS_SASL2}'" in text, text
    r.send(f"<response xmlns='{NS_SASL2}'>"
           f"{base64.b64encode(s.final(base64.b64decode(challenge))).decode()}</response>")
    text = r.read_until(rb"<(success|failure)[^>]*(/>|>.*?</\1>)")
    if "<failure" in text:
        return "failure", text
    data = re.search(r"<additional-data>([^<]*)</additional-data>", text)
    assert data and s.verify(base64.b64decode(data.group(1))), text
    return "success", text


def authz(success):
    return re.search(r"<authorization-identifier>([^<]+)</authorization-identifier>",
                     success).group(1)


def test_offered_beside_rfc6120s_with_what_it_can_do_inline(xmpp):
    """The <authentication/> feature lists the same mechanisms as <mechanisms/>, and what may
    be asked inline: Bind2 with carbons and stream management, resumption, and FAST's token
    mechanism."""
    r = X.Raw(xmpp.xport)
    feats = r.open()
    classic = re.search(r"<mechanisms[^>]*>(.*?)</mechanisms>", feats).group(1)
    sasl2 = re.search(rf"<authentication xmlns='{NS_SASL2}'>(.*?)</authentication>",
                      feats).group(1)
    assert re.findall(r"<mechanism>([^<]+)</mechanism>", sasl2.split("<inline>")[0]) == \
        re.findall(r"<mechanism>([^<]+)</mechanism>", classic)
    inline = re.search(r"<inline>(.*)</inline>", sasl2).group(1)
    assert f"<bind xmlns='{NS_BIND2}'>" in inline
    assert "<feature var='urn:xmpp:carbons:2'/>" in inline
    assert f"<feature var='{NS_SM}'/>" in inline
    assert f"<sm xmlns='{NS_SM}'/>" in inline
    assert f"<fast xmlns='{NS_FAST}'><mechanism>HT-SHA-256-NONE</mechanism></fast>" in inline
    r.close()


def test_bind2_binds_enables_and_needs_no_restart(xmpp):
    """One exchange, then the session: <success/> names the full JID (the tag, a slash, a
    unique part), <bound/> holds stream management's <enabled/>, the features of the bound
    stream follow, and stanzas flow on the same stream (no header, no bind iq)."""
    r = X.Raw(xmpp.xport)
    r.open()
    outcome, text = authenticate(
        r, "tagged", PW,
        f"<user-agent id='d4565fa7-4d72-4749-b3d3-740edbf87770'><software>rt tests</software>"
        f"</user-agent><bind xmlns='{NS_BIND2}'><tag>rtests</tag>"
        f"<enable xmlns='urn:xmpp:carbons:2'/><enable xmlns='{NS_SM}' resume='true'/></bind>")
    assert outcome == "success", text
    full = authz(text)
    assert re.fullmatch(r"tagged@localhost/rtests/[0-9a-f]{16}", full), full
    bound = re.search(rf"<bound xmlns='{NS_BIND2}'>(.*?)</bound>", text).group(1)
    assert re.search(rf"<enabled xmlns='{NS_SM}' id='[^']+' resume='true'", bound), bound
    feats = r.read_until(rb"</stream:features>")
    assert "<bind " not in feats and "<sm " not in feats, feats
    r.send("<iq type='get' id='p1'><ping xmlns='urn:xmpp:ping'/></iq>")
    assert "type='result'" in r.read_until(rb"<iq[^>]*id='p1'[^>]*/>")
    r.send(f"<message to='{full}' type='chat' id='m1'><body>to myself</body></message>")
    got = r.read_until(rb"</message>")
    assert "to myself" in got and f"to='{full}'" in got
    r.send(f"<r xmlns='{NS_SM}'/>")  # the ping and the message counted since <enabled/>
    assert re.search(r"h='2'", r.read_until(rb"<a [^>]*/>"))
    r.close()


def test_without_bind2_the_client_binds_as_before(xmpp):
    """No Bind2 asked: the bare JID is authorized, the features offer bind (still no
    restart), and RFC 6120's bind iq binds."""
    r = X.Raw(xmpp.xport)
    r.open()
    outcome, text = authenticate(r, "plainer", PW)
    assert outcome == "success" and authz(text) == "plainer@localhost", text
    feats = r.read_until(rb"</stream:features>")
    assert f"<bind xmlns='{X.NS_BIND}'/>" in feats, feats
    r.send(f"<iq type='set' id='b1'><bind xmlns='{X.NS_BIND}'><resource>desk</resource></bind>"
           f"</iq>")
    assert "<jid>plainer@localhost/desk</jid>" in r.read_until(rb"</iq>")
    r.close()


def test_wrong_password_fails_in_sasl2s_form_and_the_stream_goes_on(xmpp):
    r = X.Raw(xmpp.xport)
    r.open()
    outcome, text = authenticate(r, "wrong", "not-the-password")
    assert outcome == "failure", text
    assert re.search(rf"<failure xmlns='{NS_SASL2}'><not-authorized "
                     rf"xmlns='urn:ietf:params:xml:ns:xmpp-sasl'/></failure>", text), text
    outcome, text = authenticate(r, "wrong", PW, f"<bind xmlns='{NS_BIND2}'/>")
    assert outcome == "success" and authz(text).startswith("wrong@localhost/"), text
    r.close()


def test_abort(xmpp):
    r = X.Raw(xmpp.xport)
    r.open()
    s = X.Scram("SCRAM-SHA-256", "aborter", PW)
    r.send(f"<authenticate xmlns='{NS_SASL2}' mechanism='SCRAM-SHA-256'><initial-response>"
           f"{base64.b64encode(s.first()).decode()}</initial-response></authenticate>")
    r.read_until(rb"</challenge>")
    r.send(f"<abort xmlns='{NS_SASL2}'/>")
    assert "<aborted xmlns='urn:ietf:params:xml:ns:xmpp-sasl'/>" in \
        r.read_until(rb"</failure>")
    r.close()


def test_resumed_inline_with_what_was_not_acknowledged(xmpp):
    """XEP-0198's inline resumption: a session enabled through Bind2 loses its connection;
    a new one authenticates with <resume/> inside <authenticate/> and gets, in <success/>, the
    old session's full JID and <resumed/>, then the features, then the message sent to it
    while it was away (never acknowledged)."""
    r = X.Raw(xmpp.xport)
    r.open()
    outcome, text = authenticate(r, "resumer", PW, f"<bind xmlns='{NS_BIND2}'><tag>phone</tag>"
                                 f"<enable xmlns='{NS_SM}' resume='true'/></bind>")
    assert outcome == "success", text
    full = authz(text)
    previd = re.search(r"<enabled[^>]* id='([^']+)'", text).group(1)
    r.read_until(rb"</stream:features>")
    r.close()  # no </stream:stream>: the session detaches and waits
    sender = X.Raw(xmpp.xport)
    sender.login("sender", PW, resource="s")
    sender.send(f"<message to='{full}' type='chat' id='away'><body>while away</body></message>")
    # The detached session keeps it; a ping answered after shows the message was routed.
    sender.send("<iq type='get' id='p'><ping xmlns='urn:xmpp:ping'/></iq>")
    sender.read_until(rb"<iq[^>]*id='p'")
    back = X.Raw(xmpp.xport)
    back.open()
    outcome, text = authenticate(back, "resumer", PW,
                                 f"<resume xmlns='{NS_SM}' previd='{previd}' h='0'/>")
    assert outcome == "success", text
    assert authz(text) == full, text
    assert re.search(rf"<resumed xmlns='{NS_SM}' h='0' previd='{re.escape(previd)}'/>", text)
    feats = back.read_until(rb"</stream:features>")
    assert "<bind " not in feats, feats
    assert "while away" in back.read_until(rb"</message>")
    back.send("<iq type='get' id='p2'><ping xmlns='urn:xmpp:ping'/></iq>")
    assert "type='result'" in back.read_until(rb"<iq[^>]*id='p2'[^>]*/>")
    for c in (sender, back):
        c.close()


def test_resumption_refused_inline_then_bind2_binds(xmpp):
    """A previd no session holds: <success/> carries <failed/>, and the Bind2 request asked
    beside the resumption binds a new session."""
    r = X.Raw(xmpp.xport)
    r.open()
    outcome, text = authenticate(
        r, "again", PW, f"<resume xmlns='{NS_SM}' previd='1234-00112233445566778899aabbccddeeff'"
        f" h='3'/><bind xmlns='{NS_BIND2}'><tag>t</tag></bind>")
    assert outcome == "success", text
    assert re.search(rf"<failed xmlns='{NS_SM}'><item-not-found ", text), text
    assert authz(text).startswith("again@localhost/t/"), text
    assert f"<bound xmlns='{NS_BIND2}'>" in text
    r.close()


def test_off_by_setting():
    """xmpp.sasl2 = false: not offered, and <authenticate/> is no way in."""
    server = S.serve(["fresh"], PW, rtd_settings=", sasl2 = false",
                     rtd_options=("auth_max_delay_ms=0",))
    try:
        r = X.Raw(server.xport)
        feats = r.open()
        assert "urn:xmpp:sasl:2" not in feats, feats
        s = X.Scram("SCRAM-SHA-256", "fresh", PW)
        r.send(f"<authenticate xmlns='{NS_SASL2}' mechanism='SCRAM-SHA-256'><initial-response>"
               f"{base64.b64encode(s.first()).decode()}</initial-response></authenticate>")
        assert r.stream_error()[0] == "not-authorized"
    finally:
        S.stop(server)


# ---- FAST (XEP-0484) ----

def token_login(xmpp, user, password, agent):
    """A password login that asks for a token: the token (its expiry checked to be later)."""
    r = X.Raw(xmpp.xport)
    r.open()
    outcome, text = authenticate(r, user, password, AGENT.format(agent) +
                                 f"<request-token xmlns='{NS_FAST}' mechanism='HT-SHA-256-NONE'/>")
    assert outcome == "success", text
    m = re.search(rf"<token xmlns='{NS_FAST}' expiry='([^']+)' token='([^']+)'/>", text)
    assert m, text
    r.close()
    return m.group(2)


def fast_login(xmpp, user, token, agent, inline="", fast_attrs=""):
    """HT-SHA-256-NONE with the token: ("success", text) after checking the server's HMAC, or
    ("failure", text)."""
    import hashlib
    import hmac
    proof = hmac.new(token.encode(), b"Initiator", hashlib.sha256).digest()
    response = base64.b64encode(user.encode() + b"\0" + proof).decode()
    r = X.Raw(xmpp.xport)
    r.open()
    r.send(f"<authenticate xmlns='{NS_SASL2}' mechanism='HT-SHA-256-NONE'><initial-response>"
           f"{response}</initial-response>"
           f"{AGENT.format(agent)}<fast xmlns='{NS_FAST}'{fast_attrs}/>{inline}</authenticate>")
    text = r.read_until(rb"<(success|failure)[^>]*(/>|>.*?</\1>)")
    r.close()
    if "<failure" in text:
        return "failure", text
    data = re.search(r"<additional-data>([^<]*)</additional-data>", text).group(1)
    assert base64.b64decode(data) == hmac.new(token.encode(), b"Responder",
                                              hashlib.sha256).digest(), text
    return "success", text


def test_fast_token_issued_then_logs_in_without_the_password(xmpp):
    """A client that names itself asks for a token with its password login; later it logs in
    with HT-SHA-256-NONE (no SCRAM), the server proving it has the token too, and Bind2 binds
    as after any other exchange."""
    token = token_login(xmpp, "faster", PW, "agent-1")
    outcome, text = fast_login(xmpp, "faster", token, "agent-1",
                               f"<bind xmlns='{NS_BIND2}'><tag>fast</tag></bind>")
    assert outcome == "success", text
    assert authz(text).startswith("faster@localhost/fast/"), text
    # Bound to the client that got it, and to itself.
    assert fast_login(xmpp, "faster", token, "agent-2")[0] == "failure"
    outcome, text = fast_login(xmpp, "faster", token[:-2] + "AA", "agent-1")
    assert outcome == "failure" and "<not-authorized " in text, text
    assert fast_login(xmpp, "wrong", token, "agent-1")[0] == "failure"


def test_fast_invalidate_is_a_log_out(xmpp):
    """<fast invalidate='true'/>: the login succeeds and the token is forgotten."""
    token = token_login(xmpp, "outer", PW, "agent-o")
    assert fast_login(xmpp, "outer", token, "agent-o", fast_attrs=" invalidate='true'")[0] == \
        "success"
    assert fast_login(xmpp, "outer", token, "agent-o")[0] == "failure"


def test_fast_tokens_end_with_a_password_change(xmpp):
    token = token_login(xmpp, "changer", PW, "agent-c")
    assert fast_login(xmpp, "changer", token, "agent-c")[0] == "success"
    code, out, err = xmpp.ctl("xmpp", "user", "passwd", "changer@localhost", "--password",
                              "new-" + PW)
    assert code == 0, (out, err)
    assert fast_login(xmpp, "changer", token, "agent-c")[0] == "failure"
