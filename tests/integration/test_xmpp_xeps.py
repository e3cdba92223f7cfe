"""The XEPs the c2s sessions serve beyond RFC 6120/6121, on a real rtd with slixmpp clients
(Debian's 1.8.3, its xep_0191 plugin) and, where exact bytes matter, the raw client
(xmpp_util.py): blocking (XEP-0191), vCards (XEP-0054), the server's caps (XEP-0115).

One server serves the module (rtd, or the differential run's peer: xmpp_server.py); every
test has its own accounts.
"""
import re
import xml.etree.ElementTree as ET

import pytest

import xmpp_server as S
import xmpp_util as X

PW = "s3cret-pw"
NS_BLOCKING = "urn:xmpp:blocking"
EMPTY_LIST = re.compile(r"<blocklist xmlns=['\"]urn:xmpp:blocking['\"]\s*(/>|></blocklist>)")

USERS = """blocker blocked bystander pushed pushed2 carder reader slixcard capser blkuser
blkcontact nocard ipblock ipwatch ippal""".split()


@pytest.fixture(scope="module")
def xmpp():
    server = S.serve(USERS, PW, rtd_settings=", max_roster_items = 5, max_vcard_size = 2048",
                     rtd_options=("auth_max_delay_ms=0",))
    yield server
    S.stop(server)


def jid(user):
    return f"{user}@localhost"


def raw_login(xmpp, user, resource="r"):
    r = X.Raw(xmpp.xport)
    r.login(user, PW, resource=resource)
    return r


def stanza(text, name):
    """The last <name ...>...</name> in text, parsed (jabber:client around it)."""
    at = text.rindex("<" + name)
    return ET.fromstring(f"<w xmlns='jabber:client'>{text[at:]}</w>")[0]


def iq(r, xml, id_):
    """Sends an iq, returns its answer's text (stanzas before it are left for read_until)."""
    r.send(xml)
    return r.read_until(rb"<iq[^>]*id='" + id_.encode() + rb"'[^>]*(/>|>.*?</iq>)")


# ---- XEP-0191 blocking ----

def test_blocking_list_block_unblock(xmpp):
    async def t():
        c = await X.login(xmpp.xport, jid("blocker") + "/a", PW, plugins=["xep_0191"])
        assert NS_BLOCKING in str(await X.iq_get(c, "localhost",
                                                 "<query xmlns='http://jabber.org/protocol/disco#info'/>"))
        got = await c.plugin["xep_0191"].get_blocked()
        assert got["blocklist"]["items"] == set()
        await c.plugin["xep_0191"].block([jid("blocked"), "evil.example"])
        got = await c.plugin["xep_0191"].get_blocked()
        assert {str(j) for j in got["blocklist"]["items"]} == {jid("blocked"), "evil.example"}
        await c.plugin["xep_0191"].unblock(["evil.example"])
        got = await c.plugin["xep_0191"].get_blocked()
        assert {str(j) for j in got["blocklist"]["items"]} == {jid("blocked")}
        await X.logout(c)
    X.run(t())


def test_blocking_routing(xmpp):
    """XEP-0191 3.3, both ways: to a blocked JID refused with not-acceptable and <blocked/>
    (MUST); from it, an iq get answered service-unavailable (MUST), presence and a message not
    delivered; the bystander still gets through; after unblock the blocked one does too; and
    the message had been answered service-unavailable (SHOULD: checked last)."""
    a = raw_login(xmpp, "blocker")
    b = raw_login(xmpp, "blocked")
    s = raw_login(xmpp, "bystander")
    try:
        a.send("<presence/>")
        ans = iq(a, f"<iq type='set' id='bl1'><block xmlns='{NS_BLOCKING}'>"
                    f"<item jid='{jid('blocked')}'/></block></iq>", "bl1")
        assert "type='result'" in ans, ans
        a.send(f"<message to='{jid('blocked')}/r' id='o1' type='chat'><body>x</body></message>")
        err = stanza(a.read_until(rb"<message[^>]*id='o1'.*?</message>"), "message")
        assert err.get("type") == "error"
        e = err.find("{jabber:client}error")
        # XEP-0191 3.3's example says cancel, RFC 6120 8.3.3.9 modify for not-acceptable.
        assert e.get("type") in ("cancel", "modify"), X.ET.tostring(err)
        assert e.find(f"{{{X.NS_STANZAS}}}not-acceptable") is not None
        assert e.find("{urn:xmpp:blocking:errors}blocked") is not None
        b.send(f"<presence to='{jid('blocker')}/r'/>")
        b.send(f"<message to='{jid('blocker')}/r' id='i1' type='chat'><body>hidden</body></message>")
        # The iq's answer comes after whatever answers the message (one sender, in order).
        b.send(f"<iq to='{jid('blocker')}/r' id='i2' type='get'><ping xmlns='urn:xmpp:ping'/></iq>")
        answers = b.read_until(rb"<iq[^>]*id='i2'.*?</iq>")
        assert "service-unavailable" in answers[answers.rindex("<iq"):], answers
        s.send(f"<message to='{jid('blocker')}/r' id='s1' type='chat'><body>marker</body></message>")
        got = a.read_until(rb"<body>marker</body>")
        assert "hidden" not in got and "from='blocked@localhost/r'" not in got, got
        # Unblocked: delivered again.
        ans = iq(a, f"<iq type='set' id='ub1'><unblock xmlns='{NS_BLOCKING}'>"
                    f"<item jid='{jid('blocked')}'/></unblock></iq>", "ub1")
        assert "type='result'" in ans, ans
        b.send(f"<message to='{jid('blocker')}/r' type='chat'><body>seen</body></message>")
        assert "seen" in a.read_until(rb"<body>seen</body>")
        m = re.search(r"<message[^>]*id='i1'.*?</message>", answers, re.S)
        assert m, f"no error for the message: {answers}"
        err = stanza(m.group(0), "message")
        assert err.find(f"{{jabber:client}}error/{{{X.NS_STANZAS}}}service-unavailable") is not None
    finally:
        for r in (a, b, s):
            r.close()


def test_block_sends_unavailable(xmpp):
    """XEP-0191 3.3: blocking a JID that receives the user's presence sends it the user's
    unavailable presence."""
    u = raw_login(xmpp, "blkuser")
    c = raw_login(xmpp, "blkcontact")
    try:
        # Both available; the contact subscribes to the user, who approves, and the contact
        # gets the user's presence (RFC 6121 3.1.5).
        for r, who in ((u, "blkuser"), (c, "blkcontact")):
            r.send("<presence/>")
            r.read_until(rb"<presence[^>]*from=['\"]" + who.encode() + rb"@localhost/r['\"]")
        c.send(f"<presence type='subscribe' to='{jid('blkuser')}'/>")
        u.read_until(rb"<presence[^>]*type=['\"]subscribe['\"]")
        u.send(f"<presence type='subscribed' to='{jid('blkcontact')}'/>")
        c.read_until(rb"<presence[^>]*from=['\"]blkuser@localhost/r['\"][^>]*(/>|>.*?</presence>)")
        ans = iq(u, f"<iq type='set' id='bl1'><block xmlns='{NS_BLOCKING}'>"
                    f"<item jid='{jid('blkcontact')}'/></block></iq>", "bl1")
        assert "type='result'" in ans, ans
        text = c.read_until(rb"<presence[^>]*type=['\"]unavailable['\"][^>]*>")
        assert re.search(r"<presence[^>]*from=['\"]blkuser@localhost/r['\"][^>]*"
                         r"type=['\"]unavailable|<presence[^>]*type=['\"]unavailable['\"][^>]*"
                         r"from=['\"]blkuser@localhost/r", text), text
    finally:
        u.close()
        c.close()


def unavailable_from(full_jid):
    """A pattern for the unavailable presence from full_jid, its attributes in any order."""
    return (rb"<presence(?=[^>]*from=['\"]" + re.escape(full_jid).encode() + rb"['\"])"
            rb"(?=[^>]*type=['\"]unavailable['\"])[^>]*>")


def befriend(u, c, u_user, c_user):
    """Mutual subscriptions (both) between two available raw sessions, each resource 'r'."""
    for a, b, a_user, b_user in ((c, u, c_user, u_user), (u, c, u_user, c_user)):
        a.send(f"<presence type='subscribe' to='{jid(b_user)}'/>")
        b.read_until(rb"<presence[^>]*type=['\"]subscribe['\"]")
        b.send(f"<presence type='subscribed' to='{jid(a_user)}'/>")
        a.read_until(rb"<presence[^>]*from=['\"]" + b_user.encode() + rb"@localhost/r['\"]"
                     rb"[^>]*(/>|>.*?</presence>)")


def test_initial_presence_passes_over_a_blocked_subscriber(xmpp):
    """XEP-0191 3.3: a blocked contact gets none of the user's presence, the initial one
    included, whether the client fetched its roster first (rtd then has all it needs at the
    presence) or sent the presence first (rtd then asks its store for the roster and the
    blocklist); a contact not blocked gets it both times."""
    u = raw_login(xmpp, "ipblock")
    w = raw_login(xmpp, "ipwatch")
    p = raw_login(xmpp, "ippal")
    try:
        for r, who in ((u, "ipblock"), (w, "ipwatch"), (p, "ippal")):
            r.send("<presence/>")
            r.read_until(rb"<presence[^>]*from=['\"]" + who.encode() + rb"@localhost/r['\"]")
        befriend(u, w, "ipblock", "ipwatch")
        befriend(u, p, "ipblock", "ippal")
        ans = iq(u, f"<iq type='set' id='bl1'><block xmlns='{NS_BLOCKING}'>"
                    f"<item jid='{jid('ipwatch')}'/></block></iq>", "bl1")
        assert "type='result'" in ans, ans
        w.read_until(unavailable_from("ipblock@localhost/r"))  # 3.3: blocking sends it
        u.close()
        for n, roster_first in enumerate((True, False)):
            u = raw_login(xmpp, "ipblock", f"again{n}")
            if roster_first:
                iq(u, f"<iq type='get' id='rg{n}'><query xmlns='jabber:iq:roster'/></iq>",
                   f"rg{n}")
            u.send("<presence/>")
            # The probe's answer from the contact not blocked: the broadcast went before it.
            u.read_until(rb"<presence[^>]*from=['\"]ippal@localhost/r['\"]")
            p.read_until(rb"<presence[^>]*from=['\"]ipblock@localhost/again" + str(n).encode())
            # What the broadcast sent the blocked contact is in its mailbox before this ping.
            got = iq(w, f"<iq type='get' id='wp{n}' to='localhost'><ping xmlns='urn:xmpp:ping'/>"
                        "</iq>", f"wp{n}")
            assert "ipblock@localhost" not in got, (roster_first, got)
            u.close()
            p.read_until(unavailable_from(f"ipblock@localhost/again{n}"))
    finally:
        for r in (u, w, p):
            r.close()


def test_blocking_pushes_and_bounds(xmpp):
    """A resource that asked for the list gets pushes; one that did not, none; a domain
    blocks its accounts; past max_roster_items, resource-constraint; a bad JID,
    jid-malformed; an empty unblock unblocks all."""
    p1 = raw_login(xmpp, "pushed", "one")
    p2 = raw_login(xmpp, "pushed", "two")
    o = raw_login(xmpp, "pushed2")
    try:
        assert EMPTY_LIST.search(iq(
            p1, f"<iq type='get' id='g1'><blocklist xmlns='{NS_BLOCKING}'/></iq>", "g1"))
        p2.send(f"<iq type='set' id='b2'><block xmlns='{NS_BLOCKING}'>"
                f"<item jid='localhost'/></block></iq>")
        # Other pushes may come before it (ejabberd's privacy list's).
        push = p1.read_until(rb"<iq[^>]*type='set'[^>]*>\s*<block\s.*?</iq>")
        items = stanza(push, "iq").findall(f"{{{NS_BLOCKING}}}block/{{{NS_BLOCKING}}}item")
        assert [i.get("jid") for i in items] == ["localhost"], push
        assert "type='result'" in p2.read_until(rb"<iq[^>]*id='b2'[^>]*/?>")
        # The domain blocks pushed2@localhost; p2 never asked for the list: no push came.
        o.send(f"<iq to='{jid('pushed')}/two' id='d1' type='get'><ping xmlns='urn:xmpp:ping'/>"
               "</iq>")
        assert "service-unavailable" in o.read_until(rb"<iq[^>]*id='d1'.*?</iq>")
        if S.is_rtd(xmpp):  # the bound is rtd's (max_roster_items)
            items = "".join(f"<item jid='u{i}@example.net'/>" for i in range(5))
            ans = iq(p2, f"<iq type='set' id='b3'><block xmlns='{NS_BLOCKING}'>{items}</block>"
                     "</iq>", "b3")
            assert "resource-constraint" in ans, ans
        ans = iq(p2, f"<iq type='set' id='b4'><block xmlns='{NS_BLOCKING}'>"
                     f"<item jid='@bad'/></block></iq>", "b4")
        assert "jid-malformed" in ans, ans
        ans = iq(p2, f"<iq type='set' id='b5'><unblock xmlns='{NS_BLOCKING}'/></iq>", "b5")
        assert "type='result'" in ans
        assert re.search(r"<unblock xmlns=['\"]urn:xmpp:blocking['\"]\s*(/>|></unblock>)",
                         p1.read_until(rb"<unblock[^>]*(/>|></unblock>)"))
        assert EMPTY_LIST.search(iq(
            p1, f"<iq type='get' id='g2'><blocklist xmlns='{NS_BLOCKING}'/></iq>", "g2"))
        o.send(f"<message to='{jid('pushed')}/two' type='chat'><body>yes</body></message>")
        assert "yes" in p2.read_until(rb"<body>yes</body>")
        assert "<unblock" not in p2.buf.decode()
    finally:
        for r in (p1, p2, o):
            r.close()


# ---- XEP-0054 vcard-temp ----

def test_vcard_own_and_others(xmpp):
    """Own get (empty, then what was set), a set replacing it, another account's get by its
    bare JID, a set for another refused, the size bound (rtd's), and no such account."""
    a = raw_login(xmpp, "carder")
    b = raw_login(xmpp, "reader")
    try:
        # None set: an empty vCard or an error, item-not-found (XEP-0054 3.1 allows both).
        el = stanza(iq(a, "<iq type='get' id='v1'><vCard xmlns='vcard-temp'/></iq>", "v1"), "iq")
        v = el.find("{vcard-temp}vCard")
        assert (el.get("type") == "result" and v is not None and len(v) == 0) or \
            el.find(f"{{jabber:client}}error/{{{X.NS_STANZAS}}}item-not-found") is not None, \
            X.ET.tostring(el)
        card = "<vCard xmlns='vcard-temp'><FN>Carder &amp; Co</FN><NICKNAME>c</NICKNAME></vCard>"
        assert "type='result'" in iq(a, f"<iq type='set' id='v2'>{card}</iq>", "v2")
        ans = iq(a, "<iq type='get' id='v3'><vCard xmlns='vcard-temp'/></iq>", "v3")
        v = stanza(ans, "iq").find("{vcard-temp}vCard")
        assert v.find("{vcard-temp}FN").text == "Carder & Co", ans
        ans = iq(b, f"<iq type='get' id='v4' to='{jid('carder')}'><vCard xmlns='vcard-temp'/></iq>",
                 "v4")
        el = stanza(ans, "iq")
        assert el.get("from") == jid("carder") and el.get("type") == "result", ans
        assert el.find("{vcard-temp}vCard/{vcard-temp}NICKNAME").text == "c"
        ans = iq(b, f"<iq type='set' id='v6' to='{jid('carder')}'>{card}</iq>", "v6")
        assert "forbidden" in ans, ans
        if S.is_rtd(xmpp):  # the bound is rtd's (max_vcard_size)
            big = "<vCard xmlns='vcard-temp'><DESC>" + "x" * 3000 + "</DESC></vCard>"
            assert "not-acceptable" in iq(a, f"<iq type='set' id='v7'>{big}</iq>", "v7")
        # Replaced, and still there for a new session.
        card2 = "<vCard xmlns='vcard-temp'><FN>Second</FN></vCard>"
        assert "type='result'" in iq(a, f"<iq type='set' id='v8'>{card2}</iq>", "v8")
    finally:
        a.close()
    c = raw_login(xmpp, "carder", "again")
    try:
        ans = iq(c, "<iq type='get' id='v9'><vCard xmlns='vcard-temp'/></iq>", "v9")
        assert "<FN>Second</FN>" in ans and "NICKNAME" not in ans, ans
        # An iq to an account that does not exist (RFC 6121 8.5.1).
        ans = iq(b, "<iq type='get' id='v5' to='nobody@localhost'><vCard xmlns='vcard-temp'/></iq>",
                 "v5")
        assert "service-unavailable" in ans, ans
    finally:
        c.close()
        b.close()


def test_vcard_of_account_without_one(xmpp):
    """XEP-0054 3.3: another user's vCard, none set, is the error an account that does not
    exist gets (service-unavailable, RFC 6121 8.5.1), against directory harvesting."""
    r = raw_login(xmpp, "reader", "nocard")
    try:
        ans = iq(r, f"<iq type='get' id='n1' to='{jid('nocard')}'><vCard xmlns='vcard-temp'/>"
                    "</iq>", "n1")
        assert "service-unavailable" in ans, ans
    finally:
        r.close()


def test_vcard_slixmpp(xmpp):
    async def t():
        c = await X.login(xmpp.xport, jid("slixcard") + "/s", PW, plugins=["xep_0054"])
        vc = c.plugin["xep_0054"].make_vcard()
        vc["FN"] = "Slix Card"
        await c.plugin["xep_0054"].publish_vcard(vc)
        got = await c.plugin["xep_0054"].get_vcard(jid("slixcard"), local=False, cached=False)
        assert got["vcard_temp"]["FN"] == "Slix Card"
        await X.logout(c)
    X.run(t())


# ---- XEP-0115 entity capabilities ----

def caps_string(query):
    """XEP-0115 5.1's string of a disco#info answer: identities, features, then the extended
    forms (XEP-0128) by FORM_TYPE, each field's var and values sorted."""
    di, xd = X.NS_DISCO_INFO, "jabber:x:data"
    lang = "{http://www.w3.org/XML/1998/namespace}lang"
    out = sorted(f"{i.get('category')}/{i.get('type')}/{i.get(lang, '')}/{i.get('name', '')}<"
                 for i in query.findall(f"{{{di}}}identity"))
    out += sorted(f.get("var") + "<" for f in query.findall(f"{{{di}}}feature"))

    def fields(form):
        return {f.get("var"): sorted(v.text or "" for v in f.findall(f"{{{xd}}}value"))
                for f in form.findall(f"{{{xd}}}field")}
    for form in sorted(query.findall(f"{{{xd}}}x"), key=lambda f: fields(f)["FORM_TYPE"]):
        fs = fields(form)
        out.append(fs.pop("FORM_TYPE")[0] + "<")
        for var in sorted(fs):
            out += [var + "<"] + [v + "<" for v in fs[var]]
    return "".join(out)


def test_caps_in_features_match_disco(xmpp):
    """The <c/> in the stream features after SASL (rtd's before it too; XEP-0115 6.3 leaves
    both to the server) carries the SHA-1 ver of what disco#info says, computed here as
    XEP-0115 5.1 says; a query to node#ver answers the same, the node echoed."""
    import base64
    import hashlib

    def caps(feats):
        c = re.search(r"<c\s[^>]*xmlns=['\"]http://jabber.org/protocol/caps['\"][^>]*>", feats)
        return c and dict(re.findall(r"(\w+)=['\"]([^'\"]*)['\"]", c.group(0)))
    r = X.Raw(xmpp.xport)
    try:
        before = caps(r.open())
        assert before or not S.is_rtd(xmpp)
        assert r.scram("SCRAM-SHA-256", "capser", PW) == ("success", None)
        after = caps(r.open())
        assert after and after["hash"] == "sha-1" and before in (after, None), (before, after)
        node, ver = after["node"], after["ver"]
        r.send(f"<iq type='set' id='b'><bind xmlns='{X.NS_BIND}'/></iq>")
        r.read_until(rb"</iq>")
        for q, qid in ((f"<query xmlns='{X.NS_DISCO_INFO}'/>", "d1"),
                       (f"<query xmlns='{X.NS_DISCO_INFO}' node='{node}#{ver}'/>", "d2")):
            el = stanza(iq(r, f"<iq type='get' id='{qid}' to='localhost'>{q}</iq>", qid), "iq")
            query = el.find(f"{{{X.NS_DISCO_INFO}}}query")
            if qid == "d2":
                assert query.get("node") == f"{node}#{ver}"
            want = base64.b64encode(hashlib.sha1(caps_string(query).encode()).digest()).decode()
            assert want == ver, caps_string(query)
    finally:
        r.close()
