"""Message Archive Management (XEP-0313) and stanza ids (XEP-0359) on a real rtd: what is
archived as sessions route chats (both parties' copies, offline ones too), the stanza-id the
receiver gets, queries with the form's filters and RSM paging (XEP-0059) both ways, the
retention bound, anonymous sessions, malformed queries, preferences, the account's disco#info,
a query while another user floods, and archiving turned off. Raw sockets where the bytes
matter (xmpp_util.Raw), slixmpp's xep_0313 for what a client library does with it.

Every wait is on a stanza: a session archives a chat before it routes it, and a query is
answered after the store wrote every copy sent to it before, so a message received (or sent
by the querying session) is in the answer.
"""
import re
from datetime import datetime, timedelta, timezone
import xml.etree.ElementTree as ET

import pytest

import xmpp_util as X
from conftest import Rtd, free_port

PW = "s3cret-pw"
NS_MAM = "urn:xmpp:mam:2"
NS_SID = "urn:xmpp:sid:0"
NS_RSM = "http://jabber.org/protocol/rsm"
NS_FWD = "urn:xmpp:forward:0"
NS_DELAY = "urn:xmpp:delay"
BOUND = 30  # xmpp.max_archive_messages here

USERS = """alice bob carol pager1 pager2 keeper1 keeper2 anonpal malf1 flood1 flood2 reader
offsend offrecv forger forged slix1 slix2 disco""".split()


def start_rtd(tmp, extra=""):
    port = free_port()
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost", "anon.localhost" }}, '
                 f'anonymous = {{ "anon.localhost" }}, listeners = {{ "127.0.0.1:{port}" }}'
                 f'{extra} }}', "auth_max_delay_ms=0", data_dir=tmp)
    broker.xport = port
    return broker


@pytest.fixture(scope="module")
def xmpp():
    import tempfile
    tmp = tempfile.TemporaryDirectory(prefix="rtd-mam-")
    X.add_users(tmp.name, [(f"{u}@localhost", PW) for u in USERS])
    broker = start_rtd(tmp.name, f", archive = true, max_archive_messages = {BOUND}")
    yield broker
    code, log = broker.stop()
    tmp.cleanup()
    assert code == 0, log[-3000:]


def jid(user):
    return f"{user}@localhost"


def online(xmpp, user, resource="r"):
    """A raw session, bound and available (its own presence read back)."""
    r = X.Raw(xmpp.xport)
    r.login(user, PW, resource=resource)
    r.send("<presence/>")
    r.read_until(rb"<presence[^>]*/>|<presence.*?</presence>")
    return r


def parse(text):
    return list(ET.fromstring(f"<w xmlns='jabber:client'>{text}</w>"))


def chat(sender, to, body, extra=""):
    sender.send(f"<message to='{to}' type='chat' id='{body}'><body>{body}</body>{extra}"
                f"</message>")


def receive(r, body):
    """The message with this body, as the receiver got it (parsed)."""
    text = r.read_until(rb"<message[^>]*>(?:(?!</message>).)*<body>" + body.encode() +
                        rb"</body>.*?</message>")
    msgs = [m for m in parse(text[text.rindex("<message"):]) if m.tag.endswith("message")]
    return msgs[-1]


def iq_answer(r, xml, id_, timeout=X.TIMEOUT):
    """Sends an iq; returns (its answer parsed, the stanzas that came before it, parsed)."""
    r.send(xml)
    text = r.read_until(rb"<iq[^>]*id='" + id_.encode() + rb"'[^>]*(/>|>.*?</iq>)", timeout)
    els = parse(text)
    return els[-1], els[:-1]


def form(**fields):
    f = "".join(f"<field var='{k}'><value>{v}</value></field>" for k, v in fields.items())
    return (f"<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE' type='hidden'>"
            f"<value>{NS_MAM}</value></field>{f}</x>")


class Page:
    def __init__(self, fin, results):
        self.fin = fin
        self.results = results  # (archive id, stamp, forwarded message element)
        s = fin.find(f"{{{NS_MAM}}}fin/{{{NS_RSM}}}set")
        self.complete = fin.find(f"{{{NS_MAM}}}fin").get("complete") == "true"
        self.first = s.findtext(f"{{{NS_RSM}}}first")
        self.last = s.findtext(f"{{{NS_RSM}}}last")
        self.count = int(s.findtext(f"{{{NS_RSM}}}count"))

    @property
    def bodies(self):
        return [m.findtext("{jabber:client}body") for _, _, m in self.results]

    @property
    def ids(self):
        return [i for i, _, _ in self.results]


_qn = [0]


def query(r, fields=None, rsm="", qid=None, to=None, timeout=X.TIMEOUT):
    """A MAM query: its page (results in order, the fin's RSM), or the error iq."""
    _qn[0] += 1
    id_ = f"q{_qn[0]}"
    qid = qid or f"qid{_qn[0]}"
    x = form(**fields) if fields is not None else ""
    s = f"<set xmlns='{NS_RSM}'>{rsm}</set>" if rsm else ""
    dest = f" to='{to}'" if to else ""
    ans, before = iq_answer(r, f"<iq type='set' id='{id_}'{dest}><query xmlns='{NS_MAM}' "
                               f"queryid='{qid}'>{x}{s}</query></iq>", id_, timeout)
    if ans.get("type") != "result":
        return ans
    results = []
    for m in before:
        res = m.find(f"{{{NS_MAM}}}result")
        if res is None or res.get("queryid") != qid:
            continue
        fwd = res.find(f"{{{NS_FWD}}}forwarded")
        results.append((res.get("id"), fwd.find(f"{{{NS_DELAY}}}delay").get("stamp"),
                        fwd.find("{jabber:client}message")))
    return Page(ans, results)


def error_of(ans):
    """(type, condition) of an error answer."""
    assert ans.get("type") == "error", ET.tostring(ans)
    e = ans.find("{jabber:client}error")
    conds = [c.tag.split("}")[1] for c in e if c.tag.startswith("{" + X.NS_STANZAS)]
    return e.get("type"), [c for c in conds if c != "text"][0]


# ---- Archiving ----

def test_chat_archived_for_both_with_stanza_id(xmpp):
    a, b = online(xmpp, "alice"), online(xmpp, "bob")
    try:
        ids = []
        for i in range(3):
            chat(a, jid("bob"), f"hello{i}")
            got = receive(b, f"hello{i}")
            sid = got.find(f"{{{NS_SID}}}stanza-id")
            assert sid is not None and sid.get("by") == jid("bob"), ET.tostring(got)
            ids.append(sid.get("id"))
        pa = query(a)
        assert pa.bodies == ["hello0", "hello1", "hello2"] and pa.complete and pa.count == 3
        m = pa.results[0][2]
        assert m.get("from") == jid("alice") + "/r" and m.get("to") == jid("bob")
        pb = query(b)
        assert pb.bodies == ["hello0", "hello1", "hello2"] and pb.ids == ids
        assert (pb.first, pb.last) == (ids[0], ids[2])
        # The same through the account's bare JID, as clients address it.
        assert query(b, to=jid("bob")).ids == ids
        # Not archived: headlines, chats without a body, a no-store hint (XEP-0334).
        a.send(f"<message to='{jid('bob')}' type='headline'><body>news</body></message>")
        a.send(f"<message to='{jid('bob')}' type='chat'><active "
               f"xmlns='http://jabber.org/protocol/chatstates'/></message>")
        chat(a, jid("bob"), "secret", "<no-store xmlns='urn:xmpp:hints'/>")
        got = receive(b, "secret")
        assert got.find(f"{{{NS_SID}}}stanza-id") is None
        assert query(b).bodies == ["hello0", "hello1", "hello2"]
    finally:
        a.close()
        b.close()


def test_offline_message_archived_with_id(xmpp):
    """Kept offline, it is archived for the receiver at once and delivered with its id."""
    s = online(xmpp, "offsend")
    try:
        chat(s, jid("offrecv"), "while-away")
        assert query(s).bodies == ["while-away"]
        r = online(xmpp, "offrecv")
        got = receive(r, "while-away")
        sid = got.find(f"{{{NS_SID}}}stanza-id")
        page = query(r)
        assert page.bodies == ["while-away"] and page.ids == [sid.get("id")]
        r.close()
    finally:
        s.close()


def test_forged_stanza_id_dropped(xmpp):
    """XEP-0359 3: a stanza-id a client wrote never reaches the receiver."""
    a, b = online(xmpp, "forger"), online(xmpp, "forged")
    try:
        chat(a, jid("forged"), "forge",
             f"<stanza-id xmlns='{NS_SID}' by='{jid('forged')}' id='fake'/>")
        sids = receive(b, "forge").findall(f"{{{NS_SID}}}stanza-id")
        assert len(sids) == 1 and sids[0].get("id") != "fake"
    finally:
        a.close()
        b.close()


# ---- Queries ----

def test_filters_with_and_time(xmpp):
    a, b, c = online(xmpp, "keeper1"), online(xmpp, "keeper2"), online(xmpp, "carol")
    try:
        for i, (r, to) in enumerate([(b, "keeper2"), (c, "carol")] * 3):
            chat(a, jid(to), f"k{i}")
            receive(r, f"k{i}")
        assert query(a, {"with": jid("carol")}).bodies == ["k1", "k3", "k5"]
        # A full JID filters by its bare JID; its own archive as seen by carol.
        assert query(c, {"with": jid("keeper1") + "/r"}).bodies == ["k1", "k3", "k5"]
        everything = query(a)
        stamps = [s for _, s, _ in everything.results]
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", s) for s in stamps)
        # start and end are inclusive; a stamp with an offset means the same instant.
        got = query(a, {"start": stamps[2], "end": stamps[4]})
        want = [b_ for (_, s, _), b_ in zip(everything.results, everything.bodies)
                if stamps[2] <= s <= stamps[4]]
        assert got.bodies == want and "k2" in want and "k4" in want and got.count == len(want)
        t = datetime.strptime(stamps[2], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
        shifted = t.astimezone(timezone(timedelta(hours=2))).isoformat(timespec="milliseconds")
        assert query(a, {"start": shifted}).bodies == query(a, {"start": stamps[2]}).bodies
        assert query(a, {"start": "2999-01-01T00:00:00Z"}).bodies == []
    finally:
        for r in (a, b, c):
            r.close()


def test_paging_forward_and_backward(xmpp):
    a, b = online(xmpp, "pager1"), online(xmpp, "pager2")
    try:
        n = 12
        for i in range(n):
            chat(a, jid("pager2"), f"p{i}")
        receive(b, f"p{n - 1}")
        want = [f"p{i}" for i in range(n)]
        # Forwards: after the last of each page, until complete.
        got, after, pages = [], "", 0
        while True:
            page = query(a, rsm=f"<max>5</max>{after}")
            got += page.bodies
            pages += 1
            assert page.count == n
            if page.complete:
                break
            assert len(page.bodies) == 5
            after = f"<after>{page.last}</after>"
        assert got == want and pages == 3
        # Backwards from the last page (<before/> empty), each page oldest first.
        got, before, pages = [], "<before/>", 0
        while True:
            page = query(a, rsm=f"<max>5</max>{before}")
            got = page.bodies + got
            pages += 1
            if page.complete:
                break
            before = f"<before>{page.first}</before>"
        assert got == want and pages == 3
        # The default page (50) holds all; max 0 is only the count; a max past the server's
        # cap is served (XEP-0059 2.1: fewer than asked).
        assert query(a).bodies == want
        only = query(a, rsm="<max>0</max>")
        assert only.bodies == [] and only.count == n and only.first is None
        assert query(a, rsm="<max>100000</max>").bodies == want
        # With and paging together: the receiver's copies.
        page = query(b, {"with": jid("pager1")}, rsm="<max>4</max><before/>")
        assert page.bodies == want[-4:] and not page.complete
    finally:
        a.close()
        b.close()


def test_retention_bound(xmpp):
    """xmpp.max_archive_messages a account: the oldest go."""
    a, b = online(xmpp, "flood1"), online(xmpp, "reader")
    try:
        n = BOUND + 10
        for i in range(n):
            chat(a, jid("reader"), f"b{i}")
        receive(b, f"b{n - 1}")
        for r in (a, b):
            page = query(r, rsm="<max>250</max>")
            assert page.count == BOUND and page.complete
            assert page.bodies == [f"b{i}" for i in range(n - BOUND, n)]
    finally:
        a.close()
        b.close()


def test_malformed_queries(xmpp):
    r = online(xmpp, "malf1")
    try:
        def q(fields=None, rsm="", raw=None):
            if raw is not None:
                ans, _ = iq_answer(r, f"<iq type='set' id='m'><query xmlns='{NS_MAM}'>{raw}"
                                      f"</query></iq>", "m")
                return error_of(ans)
            return error_of(query(r, fields, rsm))
        assert q(raw="<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE'>"
                     "<value>urn:xmpp:mam:1</value></field></x>") == ("modify", "bad-request")
        assert q({"fulltext": "x"}) == ("modify", "bad-request")
        assert q({"with": "a@b@c"}) == ("modify", "jid-malformed")
        assert q({"start": "yesterday"}) == ("modify", "bad-request")
        assert q({"end": "2020-13-01T00:00:00Z"}) == ("modify", "bad-request")
        assert q(raw="<x xmlns='jabber:x:data' type='submit'><field var='with'/></x>") == \
            ("modify", "bad-request")
        assert q(rsm="<max>-1</max>") == ("modify", "bad-request")
        assert q(rsm="<max>99999999999999999999</max>") == ("modify", "bad-request")
        assert q(rsm="<max>ten</max>") == ("modify", "bad-request")
        assert q(rsm="<after>not-an-id</after>") == ("cancel", "item-not-found")
        assert q(rsm="<index>3</index>") == ("cancel", "feature-not-implemented")
        # Still served.
        assert query(r).bodies == []
        # The form (4.1.5), and preferences: always, nothing else.
        ans, _ = iq_answer(r, f"<iq type='get' id='f'><query xmlns='{NS_MAM}'/></iq>", "f")
        vars_ = {f.get("var") for f in ans.iter("{jabber:x:data}field")}
        assert vars_ == {"FORM_TYPE", "with", "start", "end"}
        ans, _ = iq_answer(r, f"<iq type='get' id='p'><prefs xmlns='{NS_MAM}'/></iq>", "p")
        assert ans.find(f"{{{NS_MAM}}}prefs").get("default") == "always"
        ans, _ = iq_answer(r, f"<iq type='set' id='p2'><prefs xmlns='{NS_MAM}' "
                              f"default='always'><always/><never/></prefs></iq>", "p2")
        assert ans.get("type") == "result"
        ans, _ = iq_answer(r, f"<iq type='set' id='p3'><prefs xmlns='{NS_MAM}' "
                              f"default='roster'/></iq>", "p3")
        assert error_of(ans) == ("cancel", "feature-not-implemented")
        assert "default='always'" in ET.tostring(ans, encoding="unicode").replace('"', "'")
    finally:
        r.close()


def test_account_disco(xmpp):
    """XEP-0313 7: the account (its bare JID) says it archives; the server's list is as it
    was (its caps hash with it)."""
    r = online(xmpp, "disco")
    try:
        ans, _ = iq_answer(r, f"<iq type='get' id='d' to='{jid('disco')}'>"
                              f"<query xmlns='{X.NS_DISCO_INFO}'/></iq>", "d")
        q = ans.find(f"{{{X.NS_DISCO_INFO}}}query")
        assert {(i.get("category"), i.get("type"))  # and PEP's (XEP-0163 6)
                for i in q.findall(f"{{{X.NS_DISCO_INFO}}}identity")} == {("account", "registered"),
                                                                           ("pubsub", "pep")}
        feats = {f.get("var") for f in q.findall(f"{{{X.NS_DISCO_INFO}}}feature")}
        assert {NS_MAM, NS_SID} <= feats
        ans, _ = iq_answer(r, f"<iq type='get' id='s' to='localhost'>"
                              f"<query xmlns='{X.NS_DISCO_INFO}'/></iq>", "s")
        assert NS_MAM not in ET.tostring(ans, encoding="unicode")
    finally:
        r.close()


def anonymous(xmpp):
    r = X.Raw(xmpp.xport)
    r.open("anon.localhost")
    r.sasl("ANONYMOUS", b"")
    assert r.sasl_reply()[0] == "success"
    r.open("anon.localhost")
    r.send(f"<iq type='set' id='b'><bind xmlns='{X.NS_BIND}'/></iq>")
    me = re.search(r"<jid>([^<]+)</jid>", r.read_until(rb"</iq>")).group(1)
    r.send("<presence/>")
    r.read_until(rb"<presence[^>]*/>|<presence.*?</presence>")
    return r, me


def test_anonymous_keeps_none(xmpp):
    """An anonymous session has no archive (its query refused, its account says nothing of
    it); the account it talks to keeps its copies, both ways."""
    g, me = anonymous(xmpp)
    p = online(xmpp, "anonpal")
    try:
        chat(g, jid("anonpal"), "from-guest")
        assert receive(p, "from-guest").find(f"{{{NS_SID}}}stanza-id") is not None
        chat(p, me, "to-guest")
        receive(g, "to-guest")
        assert error_of(query(g)) == ("cancel", "service-unavailable")
        # A stanza-id it may get (the sender cannot tell an anonymous session) is one its
        # account does not vouch for (XEP-0359 4): no urn:xmpp:sid:0, no MAM.
        bare = me.split("/")[0]
        ans, _ = iq_answer(g, f"<iq type='get' id='d' to='{bare}'>"
                              f"<query xmlns='{X.NS_DISCO_INFO}'/></iq>", "d")
        feats = ET.tostring(ans, encoding="unicode")
        assert NS_MAM not in feats and NS_SID not in feats and "anonymous" in feats
        page = query(p)
        assert page.bodies == ["from-guest", "to-guest"]
        assert page.results[1][2].get("to") == me
    finally:
        g.close()
        p.close()


def test_query_while_another_floods(xmpp):
    """Another pair chats as fast as a socket goes: the querying session answers a ping while
    its query waits behind the flood's copies in the archive actor (it is never parked on the
    archive's account), a login goes through the store meanwhile, and the query is answered
    once the archive has written what came before it."""
    f, sink, q = online(xmpp, "carol", "flood"), online(xmpp, "alice", "sink"), \
        online(xmpp, "bob", "q")
    try:
        n = 3000
        f.send("".join(f"<message to='{jid('alice')}/sink' type='chat'><body>f{i}</body>"
                       f"</message>" for i in range(n)))
        q.send(f"<iq type='set' id='fq'><query xmlns='{NS_MAM}' queryid='fq'><set "
               f"xmlns='{NS_RSM}'><max>5</max><before/></set></query></iq>"
               f"<iq type='get' id='fp'><ping xmlns='urn:xmpp:ping'/></iq>")
        got = q.read_until(rb"<iq[^>]*id='fp'[^>]*/>")
        X.assert_serves(xmpp.xport, "disco", PW)
        # The query's answer, before or after the ping's; the archive writes the flood first.
        if "id='fq'" not in got:
            got += q.read_until(rb"<iq[^>]*id='fq'.*?</iq>", timeout=120)
        assert re.search(r"<iq[^>]*id='fq'[^>]*type='result'|<iq[^>]*type='result'[^>]*id='fq'",
                         got), got[-500:]
        receive(sink, f"f{n - 1}")
        page = query(sink, {"with": jid("carol")}, rsm="<max>3</max><before/>", timeout=120)
        assert page.bodies == [f"f{i}" for i in range(n - 3, n)]
        assert page.count == BOUND  # the bound held through it
    finally:
        for r in (f, sink, q):
            r.close()


def test_slixmpp_retrieves(xmpp):
    """A client library's MAM: slixmpp's xep_0313 retrieve, and its RSM iteration."""
    async def t():
        a = await X.login(xmpp.xport, jid("slix1") + "/a", PW, plugins=["xep_0313", "xep_0359"])
        b = await X.login(xmpp.xport, jid("slix2") + "/b", PW, plugins=["xep_0313", "xep_0359"])
        for i in range(7):
            a.send_message(mto=jid("slix2") + "/b", mbody=f"s{i}", mtype="chat")
        got = await X.next_of(b.messages, lambda m: m["body"] == "s6")
        assert got["stanza_id"]["by"] == jid("slix2")
        res = await b.plugin["xep_0313"].retrieve(with_jid=jid("slix1"))
        bodies = [m["mam_result"]["forwarded"]["stanza"]["body"] for m in res["mam"]["results"]]
        assert bodies == [f"s{i}" for i in range(7)]
        seen = []
        async for m in a.plugin["xep_0313"].iterate(with_jid=jid("slix2"), rsm={"max": 3}):
            seen.append(m["mam_result"]["forwarded"]["stanza"]["body"])
        assert seen == [f"s{i}" for i in range(7)]
        await X.logout(a, b)
    X.run(t())


def test_archive_off():
    """xmpp.archive = false: nothing archived, no stanza-id, the feature neither offered nor
    served."""
    import tempfile
    tmp = tempfile.TemporaryDirectory(prefix="rtd-mam-off-")
    X.add_users(tmp.name, [(f"{u}@localhost", PW) for u in ("off1", "off2")])
    broker = start_rtd(tmp.name, ", archive = false")
    try:
        a, b = online(broker, "off1"), online(broker, "off2")
        chat(a, jid("off2"), "unkept")
        assert receive(b, "unkept").find(f"{{{NS_SID}}}stanza-id") is None
        assert error_of(query(a)) == ("cancel", "service-unavailable")
        ans, _ = iq_answer(a, f"<iq type='get' id='d' to='{jid('off1')}'>"
                              f"<query xmlns='{X.NS_DISCO_INFO}'/></iq>", "d")
        assert NS_MAM not in ET.tostring(ans, encoding="unicode")
        a.close()
        b.close()
    finally:
        code, log = broker.stop()
        tmp.cleanup()
    assert code == 0, log[-3000:]
