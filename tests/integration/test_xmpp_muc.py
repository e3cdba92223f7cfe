"""Multi-user chat (XEP-0045) at conference.localhost, on a real rtd or, for the differential
run, ejabberd 23.01 / Prosody 0.12 (RT_XMPP_PEER, xmpp_server.py): the service's disco, a
room made by joining it (and configured, as a service that locks new rooms wants), the join
sequence (others' presence, one's own with 110, history with delay stamps and maxstanzas,
the subject last), groupchat and private messages, availability changes, leaving, a
temporary room's end, an owner's destroy, a dropped connection, kick, ban, members-only
rooms, the occupant limit, self-ping (XEP-0410), the subject, mediated invitations, nick
changes, and the errors for a nick in use, a non-occupant's message, a room that does not
exist and what a participant may not do.

Each client is a raw stream (xmpp_util.Raw's login) whose stanzas are parsed as they come,
so a test sees exactly what order the server sent them in; every wait ends on a stanza or
fails at X.TIMEOUT. Every test has its own accounts and rooms. Where the peers differ on a
detail, the test asserts what XEP-0045 says and a comment gives what each peer sends.
"""
import asyncio
import collections
import datetime
import itertools
import socket
import time
import xml.etree.ElementTree as ET

import pytest

import xmpp_server as S
import xmpp_util as X

PW = "s3cret-pw"
MUC_HOST = "conference.localhost"
MAX_OCCUPANTS = 3  # the module's room limit (muc_max_occupants): no other test needs more

C = "{jabber:client}"
NS_MUC = "http://jabber.org/protocol/muc"
NS_USER = NS_MUC + "#user"
NS_ADMIN = NS_MUC + "#admin"
NS_OWNER = NS_MUC + "#owner"
NS_DATA = "jabber:x:data"
NS_DELAY = "urn:xmpp:delay"
NS_DISCO_ITEMS = "http://jabber.org/protocol/disco#items"

USERS = """disco1 create1 join1 join2 gc1 gc2 hist1 hist2 hist3 hmax1 hmax2 hmax3 nick1 nick2
nonocc1 nonocc2 pm1 pm2 pm3 leave1 leave2 temp1 drop1 drop2 kick1 kick2 kick3 ban1 ban2 mo1
mo2 full1 full2 full3 full4 slix1 slix2 pass1 pass2 voice1 voice2 reg1 reg2 ping1 ping2 subj1 subj2 subj3 inv1 inv2 rename1 rename2 nosuch1
perm1 perm2 stat1 stat2 destroy1 destroy2 lock1 lock2""".split()


@pytest.fixture(scope="module")
def xmpp():
    server = S.serve(USERS, PW, muc=True, muc_max_occupants=MAX_OCCUPANTS,
                     rtd_options=("auth_max_delay_ms=0",))
    yield server
    S.stop(server)


def jid(user):
    return f"{user}@localhost"


def room_jid(name):
    return f"{name}@{MUC_HOST}"


def show(stanzas):
    return "\n".join(ET.tostring(s).decode() for s in stanzas)


class Client:
    """A logged-in stream (resource r) whose incoming stanzas are parsed into a queue in
    the order they came."""

    def __init__(self, port, user):
        self.user, self.bare = user, jid(user)
        self.raw = X.Raw(port)
        self.full = self.raw.login(user, PW, resource="r")
        self.parser = ET.XMLPullParser(events=("start", "end"))
        self.parser.feed(b"<stream:stream xmlns='jabber:client' "
                         b"xmlns:stream='http://etherx.jabber.org/streams'>")
        self.depth, self.root = 0, None
        self.got = collections.deque()
        self.seen = []  # for failure messages
        self.ids = itertools.count()
        self._feed(self.raw.buf)
        self.raw.buf = b""

    def _feed(self, data):
        self.parser.feed(data)
        for event, el in self.parser.read_events():
            if event == "start":
                self.depth += 1
                if self.depth == 1:
                    self.root = el
            else:
                self.depth -= 1
                if self.depth == 1:
                    self.root.remove(el)
                    self.got.append(el)
                    self.seen = self.seen[-30:] + [el]

    def _more(self, deadline, what):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{self.user}: no {what} in {X.TIMEOUT} s; the last stanzas "
                                 f"seen:\n{show(self.seen)}")
        self.raw.sock.settimeout(left)
        try:
            data = self.raw.sock.recv(65536)
        except socket.timeout:
            data = None
        except ConnectionResetError:
            data = b""
        if data == b"":
            raise AssertionError(f"{self.user}: closed before {what}:\n{show(self.seen)}")
        if data:
            self._feed(data)

    def send(self, xml):
        self.raw.send(xml)

    def until(self, pred, what, timeout=X.TIMEOUT):
        """Every stanza up to and including the first pred accepts, in order (taken)."""
        deadline = time.monotonic() + timeout
        out = []
        while True:
            while self.got:
                out.append(self.got.popleft())
                if pred(out[-1]):
                    return out
            self._more(deadline, what)

    def wait(self, pred, what, timeout=X.TIMEOUT):
        """The first stanza pred accepts (taken); those before it stay queued."""
        deadline = time.monotonic() + timeout
        while True:
            for s in self.got:
                if pred(s):
                    self.got.remove(s)
                    return s
            self._more(deadline, what)

    def iq(self, type_, to, payload, timeout=X.TIMEOUT):
        """An iq with payload; its answer (result or error)."""
        id_ = f"{self.user}-{next(self.ids)}"
        self.send(f"<iq type='{type_}' id='{id_}' to='{to}'>{payload}</iq>")
        return self.wait(lambda s: s.tag == C + "iq" and s.get("id") == id_ and
                         s.get("type") in ("result", "error"), f"answer to iq {id_}", timeout)

    def close(self):
        self.raw.close()


class Clients:
    """with Clients(xmpp, "u1", "u2") as (a, b): logged-in clients, closed at the end."""

    def __init__(self, xmpp, *users):
        self.port, self.users, self.clients = xmpp.xport, users, []

    def __enter__(self):
        try:
            for u in self.users:
                self.clients.append(Client(self.port, u))
        except BaseException:
            self.__exit__()
            raise
        return self.clients

    def __exit__(self, *_exc):
        for c in self.clients:
            c.close()


# ---- What a stanza says ----

def ptype(s):
    return s.get("type", "available")


def x_user(s):
    return s.find(f"{{{NS_USER}}}x")


def codes(s):
    x = x_user(s)
    return set() if x is None else {st.get("code") for st in x.findall(f"{{{NS_USER}}}status")}


def item(s):
    x = x_user(s)
    it = None if x is None else x.find(f"{{{NS_USER}}}item")
    assert it is not None, show([s])
    return it


def error(s):
    """(type, condition) of a stanza's error."""
    assert s.get("type") == "error", show([s])
    e = s.find(C + "error")
    assert e is not None, show([s])
    conds = [c.tag.split("}")[1] for c in e if c.tag.startswith(f"{{{X.NS_STANZAS}}}") and
             not c.tag.endswith("}text")]
    assert len(conds) == 1, show([s])
    return e.get("type"), conds[0]


def presence_from(frm, type_="available"):
    return lambda s: s.tag == C + "presence" and s.get("from") == frm and ptype(s) == type_


def is_subject(s, room):
    """The subject message that ends a join (from the room, or the occupant who set it)."""
    return (s.tag == C + "message" and s.get("type") == "groupchat" and
            s.get("from", "").split("/")[0] == room and s.find(C + "subject") is not None and
            s.find(C + "body") is None)


def message_with_body(body):
    return lambda s: s.tag == C + "message" and s.findtext(C + "body") == body


# ---- Rooms ----

def join(c, room, nick, history=""):
    """Joins room as nick; the stanzas from the room up to the subject that ends the join (or
    up to the error presence that refuses it), in the order they came. What the room sends
    from its own bare JID besides the subject (ejabberd's presence with its caps) is left out."""
    full = f"{room}/{nick}"
    c.send(f"<presence to='{full}'><x xmlns='{NS_MUC}'>{history}</x></presence>")
    seq = c.until(lambda s: is_subject(s, room) or (
        s.tag == C + "presence" and s.get("from") == full and ptype(s) == "error"),
        f"end of the join of {full}")
    return [s for s in seq if s.get("from", "").startswith(room + "/") or is_subject(s, room)]


def joined(c, room, nick, history=""):
    """Joins room as nick, which must succeed: (the join's stanzas, the self-presence)."""
    seq = join(c, room, nick, history)
    mine = [s for s in seq if s.tag == C + "presence" and s.get("from") == f"{room}/{nick}"]
    assert mine and ptype(mine[-1]) == "available", show(seq)
    assert "110" in codes(mine[-1]), show(seq)
    return seq, mine[-1]


def configure(c, room, fields=None):
    """The owner's config form (XEP-0045 10.1.2 instant room when fields is None, else
    10.2's form with those fields): must be accepted."""
    body = ""
    if fields:
        body = (f"<field var='FORM_TYPE' type='hidden'><value>{NS_MUC}#roomconfig</value></field>" +
                "".join(f"<field var='{k}'><value>{v}</value></field>" for k, v in fields.items()))
    ans = c.iq("set", room, f"<query xmlns='{NS_OWNER}'><x xmlns='{NS_DATA}' type='submit'>"
                            f"{body}</x></query>")
    assert ans.get("type") == "result", show([ans])


def create(c, name, nick, fields=None):
    """A new room made by c joining it as nick (201: new), then configured; its JID."""
    room = room_jid(name)
    seq, mine = joined(c, room, nick)
    assert "201" in codes(mine), show(seq)
    configure(c, room, fields)
    return room


def rooms_listed(c):
    """The room JIDs the service's disco#items lists (XEP-0045 6.3)."""
    items = c.iq("get", MUC_HOST, f"<query xmlns='{NS_DISCO_ITEMS}'/>")
    assert items.get("type") == "result", show([items])
    return {i.get("jid") for i in items.iter(f"{{{NS_DISCO_ITEMS}}}item")}


def wait_gone(c, room):
    """Returns once the room has ended: its disco#info (XEP-0045 6.4) is <item-not-found/>
    and the service no longer lists it. ejabberd ends a room's process a moment after the
    last presences it sent and drops what reaches the room in between (a join sent at once
    is never answered, nor is this question): there, an unanswered question is asked
    again. rtd and Prosody answer the first one."""
    deadline = time.monotonic() + X.TIMEOUT
    while True:
        try:
            ans = c.iq("get", room, f"<query xmlns='{X.NS_DISCO_INFO}'/>",
                       1.0 if S.PEER == "ejabberd" else X.TIMEOUT)
        except AssertionError:
            if S.PEER != "ejabberd" or time.monotonic() > deadline:
                raise
            continue
        if ans.get("type") == "error":
            assert error(ans)[1] == "item-not-found", show([ans])
            break
        assert time.monotonic() < deadline, f"{room} still there: {show([ans])}"
    assert room not in rooms_listed(c)


def admin(c, room, item_xml):
    ans = c.iq("set", room, f"<query xmlns='{NS_ADMIN}'>{item_xml}</query>")
    assert ans.get("type") == "result", show([ans])


# ---- The service ----

def test_service_disco(xmpp):
    """XEP-0045 6.1, 6.2: the service's identity (conference/text) and feature; 6.3: a public
    room is listed in its items once it exists."""
    with Clients(xmpp, "disco1") as (a,):
        info = a.iq("get", MUC_HOST, f"<query xmlns='{X.NS_DISCO_INFO}'/>")
        assert info.get("type") == "result", show([info])
        q = info.find(f"{{{X.NS_DISCO_INFO}}}query")
        idents = {(i.get("category"), i.get("type"))
                  for i in q.findall(f"{{{X.NS_DISCO_INFO}}}identity")}
        assert ("conference", "text") in idents, show([info])
        feats = {f.get("var") for f in q.findall(f"{{{X.NS_DISCO_INFO}}}feature")}
        assert NS_MUC in feats, show([info])
        # Public by its configuration (muc#roomconfig_publicroom): the default is the
        # service's own (ejabberd: public, Prosody: not).
        room = create(a, "discoroom", "owner", {"muc#roomconfig_publicroom": "1"})
        assert room in rooms_listed(a)


def test_create_room(xmpp):
    """XEP-0045 10.1.1: the first occupant makes the room: its self-presence has 110 and 201,
    affiliation owner, role moderator; 10.1.2: the instant-room form is accepted."""
    with Clients(xmpp, "create1") as (a,):
        room = room_jid("createroom")
        seq, mine = joined(a, room, "owner")
        assert {"110", "201"} <= codes(mine), show(seq)
        it = item(mine)
        assert (it.get("affiliation"), it.get("role")) == ("owner", "moderator"), show(seq)
        configure(a, room)


@pytest.mark.skipif(S.PEER == "ejabberd", reason="ejabberd 23.01 does not lock a room made "
                    "by a join: a second user gets in before the owner configured it")
def test_locked_until_configured(xmpp):
    """XEP-0045 7.2.10: until its creator has configured it, a new room refuses entry with
    <item-not-found/> (MUST; Prosody: type cancel); once configured, it lets others in."""
    with Clients(xmpp, "lock1", "lock2") as (a, b):
        room = room_jid("lockroom")
        seq, mine = joined(a, room, "owner")
        assert "201" in codes(mine), show(seq)
        seq = join(b, room, "early")
        assert error(seq[-1]) == ("cancel", "item-not-found"), show(seq)
        configure(a, room)
        joined(b, room, "early")


def test_second_occupant_join(xmpp):
    """XEP-0045 7.2.2: the newcomer gets the others' presence (role and affiliation), then
    its own with 110, then (7.2.15) the subject, last; the others get the newcomer's; 7.2.4:
    its full JID goes to a moderator only, in a semi-anonymous room."""
    with Clients(xmpp, "join1", "join2") as (a, b):
        room = create(a, "joinroom", "first")
        seq, mine = joined(b, room, "second")
        kinds = [(s.tag[len(C):], s.get("from")) for s in seq]
        assert kinds[0] == ("presence", f"{room}/first"), show(seq)
        first = item(seq[0])
        assert (first.get("role"), first.get("affiliation")) == ("moderator", "owner"), show(seq)
        assert seq.index(mine) == 1 and is_subject(seq[-1], room) and len(seq) == 3, show(seq)
        it = item(mine)
        assert (it.get("role"), it.get("affiliation")) == ("participant", "none"), show(seq)
        if "100" not in codes(mine):  # semi-anonymous (both peers' default): no JIDs to b
            assert first.get("jid") is None, show(seq)
        got = a.wait(presence_from(f"{room}/second"), "the newcomer's presence")
        it = item(got)
        assert it.get("role") == "participant", show([got])
        assert it.get("jid") == b.full, show([got])  # a is a moderator


def test_groupchat_to_all(xmpp):
    """XEP-0045 7.4: a groupchat message to the room goes to every occupant, the sender
    too, from room/nick of the sender, type groupchat (both peers keep the id, by which a
    client knows its own reflected message)."""
    with Clients(xmpp, "gc1", "gc2") as (a, b):
        room = create(a, "gcroom", "alice")
        joined(b, room, "bob")
        a.send(f"<message to='{room}' type='groupchat' id='gc-a'><body>from alice</body></message>")
        b.send(f"<message to='{room}' type='groupchat' id='gc-b'><body>from bob</body></message>")
        for c in (a, b):
            for nick, body, id_ in (("alice", "from alice", "gc-a"), ("bob", "from bob", "gc-b")):
                m = c.wait(message_with_body(body), f"{body!r}")
                assert m.get("type") == "groupchat", show([m])
                assert m.get("from") == f"{room}/{nick}", show([m])
                if c.user == {"alice": "gc1", "bob": "gc2"}[nick]:
                    assert m.get("id") == id_, show([m])


def test_history_on_join(xmpp):
    """XEP-0045 7.2.13: what was said before is sent to a newcomer after the presences and
    before the subject, oldest first, from room/nick of its sender, each with an
    urn:xmpp:delay stamp (XEP-0203: a UTC date-time)."""
    with Clients(xmpp, "hist1", "hist2", "hist3") as (a, b, c):
        room = create(a, "histroom", "alice")
        joined(b, room, "bob")
        a.send(f"<message to='{room}' type='groupchat'><body>h1</body></message>")
        a.wait(message_with_body("h1"), "h1 reflected")
        b.send(f"<message to='{room}' type='groupchat'><body>h2</body></message>")
        a.wait(message_with_body("h2"), "h2 at alice")  # in the room's history now
        seq, mine = joined(c, room, "carol")
        presences = [i for i, s in enumerate(seq) if s.tag == C + "presence"]
        history = [i for i, s in enumerate(seq) if s.tag == C + "message" and
                   s.find(C + "body") is not None]
        assert len(presences) == 3 and seq.index(mine) == presences[-1], show(seq)
        assert history and max(presences) < min(history), show(seq)
        assert max(history) < len(seq) - 1 and is_subject(seq[-1], room), show(seq)
        msgs = [seq[i] for i in history]
        assert [(m.get("from"), m.findtext(C + "body")) for m in msgs] == [
            (f"{room}/alice", "h1"), (f"{room}/bob", "h2")], show(seq)
        for m in msgs:
            assert m.get("type") == "groupchat", show([m])
            d = m.find(f"{{{NS_DELAY}}}delay")
            assert d is not None and d.get("stamp"), show([m])
            stamp = datetime.datetime.fromisoformat(d.get("stamp").replace("Z", "+00:00"))
            assert stamp.utcoffset() == datetime.timedelta(0), show([m])
            # "The 'from' attribute MUST be set to the JID of the room itself."
            assert d.get("from") == room, show([m])


def test_history_maxstanzas(xmpp):
    """XEP-0045 7.2.14: <history maxstanzas='N'/> in the join asks for the last N messages
    of the history only; 0 for none."""
    with Clients(xmpp, "hmax1", "hmax2", "hmax3") as (a, b, c):
        room = create(a, "hmaxroom", "alice")
        for body in ("m1", "m2", "m3"):
            a.send(f"<message to='{room}' type='groupchat'><body>{body}</body></message>")
        a.wait(message_with_body("m3"), "m3 reflected")
        for who, n, want in ((b, 2, ["m2", "m3"]), (c, 0, [])):
            seq, _ = joined(who, room, who.user, f"<history maxstanzas='{n}'/>")
            got = [s.findtext(C + "body") for s in seq if s.tag == C + "message" and
                   s.find(C + "body") is not None]
            assert got == want, show(seq)


def test_nick_conflict(xmpp):
    """XEP-0045 7.2.8: a nick another user holds: presence error <conflict/>, type cancel
    (both peers)."""
    with Clients(xmpp, "nick1", "nick2") as (a, b):
        room = create(a, "nickroom", "same")
        seq = join(b, room, "same")
        assert ptype(seq[-1]) == "error" and seq[-1].get("from") == f"{room}/same", show(seq)
        assert error(seq[-1]) == ("cancel", "conflict"), show(seq)


def test_non_occupant_groupchat_refused(xmpp):
    """XEP-0045 7.4: a groupchat message from one who is not an occupant is refused with
    <not-acceptable/> and not delivered. Type: modify in the XEP's example and from
    ejabberd ("Only occupants are allowed to send messages to the conference"), cancel from
    Prosody ("You are not currently connected to this chat"): either is taken."""
    with Clients(xmpp, "nonocc1", "nonocc2") as (a, d):
        room = create(a, "nonoccroom", "alice")
        d.send(f"<message to='{room}' type='groupchat' id='outsider'>"
               "<body>intruder</body></message>")
        err = d.wait(lambda s: s.tag == C + "message" and s.get("id") == "outsider", "the error")
        assert err.get("from") == room, show([err])
        assert error(err)[1] == "not-acceptable" and error(err)[0] in ("modify", "cancel"), \
            show([err])
        # The room's own traffic after it: the outsider's message did not come before.
        a.send(f"<message to='{room}' type='groupchat'><body>marker</body></message>")
        got = a.until(message_with_body("marker"), "the marker")
        assert not [s for s in got if s.findtext(C + "body") == "intruder"], show(got)


def test_private_message(xmpp):
    """XEP-0045 7.5: type chat to room/nick goes to that occupant, from room/nick of the
    sender; from one who is not an occupant, <not-acceptable/> (MUST; type: ejabberd
    modify, Prosody cancel) and not delivered."""
    with Clients(xmpp, "pm1", "pm2", "pm3") as (a, b, d):
        room = create(a, "pmroom", "alice")
        joined(b, room, "bob")
        d.send(f"<message to='{room}/bob' type='chat' id='pm-out'><body>outside</body></message>")
        err = d.wait(lambda s: s.tag == C + "message" and s.get("id") == "pm-out", "the error")
        assert error(err)[1] == "not-acceptable", show([err])
        a.send(f"<message to='{room}/bob' type='chat'><body>psst</body></message>")
        got = b.until(message_with_body("psst"), "the private message")
        m = got[-1]
        assert m.get("from") == f"{room}/alice" and m.get("type") == "chat", show([m])
        assert not [s for s in got if s.findtext(C + "body") == "outside"], show(got)


def test_leave(xmpp):
    """XEP-0045 7.14: unavailable to room/nick: the leaver gets its own unavailable with 110
    (role none), the others unavailable from room/nick."""
    with Clients(xmpp, "leave1", "leave2") as (a, b):
        room = create(a, "leaveroom", "alice")
        joined(b, room, "bob")
        a.wait(presence_from(f"{room}/bob"), "bob's presence")
        b.send(f"<presence to='{room}/bob' type='unavailable'/>")
        mine = b.wait(presence_from(f"{room}/bob", "unavailable"), "bob's own unavailable")
        assert "110" in codes(mine) and item(mine).get("role") == "none", show([mine])
        other = a.wait(presence_from(f"{room}/bob", "unavailable"), "bob's unavailable")
        assert "110" not in codes(other) and item(other).get("role") == "none", show([other])


def test_availability_change(xmpp):
    """XEP-0045 7.7: an occupant's presence update (show, status) to room/nick goes to every
    occupant, from room/nick."""
    with Clients(xmpp, "stat1", "stat2") as (a, b):
        room = create(a, "statroom", "alice")
        joined(b, room, "bob")
        a.wait(presence_from(f"{room}/bob"), "bob's presence")
        b.send(f"<presence to='{room}/bob'><show>away</show><status>brb</status></presence>")
        for o in (a, b):
            got = o.wait(lambda s: presence_from(f"{room}/bob")(s) and
                         s.findtext(C + "show") == "away", "bob's away")
            assert got.findtext(C + "status") == "brb", show([got])
            assert item(got).get("role") == "participant", show([got])


def test_destroy_room(xmpp):
    """XEP-0045 10.9: the owner destroys the room: result; each occupant gets one
    unavailable presence, from its own room/nick, with <destroy/> (and the reason) in the
    muc#user x; the room is gone (the next join makes a new one: 201)."""
    with Clients(xmpp, "destroy1", "destroy2") as (a, b):
        room = create(a, "destroyroom", "alice")
        joined(b, room, "bob")
        ans = a.iq("set", room, f"<query xmlns='{NS_OWNER}'><destroy><reason>done</reason>"
                                "</destroy></query>")
        assert ans.get("type") == "result", show([ans])
        for o, nick in ((a, "alice"), (b, "bob")):
            got = o.wait(presence_from(f"{room}/{nick}", "unavailable"), "own unavailable")
            d = x_user(got).find(f"{{{NS_USER}}}destroy")
            assert d is not None and d.findtext(f"{{{NS_USER}}}reason") == "done", show([got])
        wait_gone(b, room)
        seq, mine = joined(b, room, "bob")
        assert "201" in codes(mine), show(seq)
        configure(b, room)


def test_temporary_room_ends_when_empty(xmpp):
    """XEP-0045 7.14 ("If the room is not persistent and this occupant is the last to
    exit, the service is responsible for destroying the room"): its disco#info says
    <item-not-found/>, the service no longer lists it (6.3), and the next join makes a new
    room (201 again)."""
    with Clients(xmpp, "temp1") as (a,):
        room = create(a, "temproom", "alice", {"muc#roomconfig_publicroom": "1"})
        assert room in rooms_listed(a), "not listed while it exists"
        a.send(f"<presence to='{room}/alice' type='unavailable'/>")
        mine = a.wait(presence_from(f"{room}/alice", "unavailable"), "own unavailable")
        assert "110" in codes(mine), show([mine])
        wait_gone(a, room)
        seq, mine = joined(a, room, "alice")
        assert "201" in codes(mine), show(seq)
        configure(a, room)


def test_dropped_connection_leaves(xmpp):
    """RFC 6121 4.6.3 with XEP-0045 7.14: an occupant whose stream ends without an
    unavailable presence leaves the room: the others get unavailable from room/nick."""
    with Clients(xmpp, "drop1", "drop2") as (a, b):
        room = create(a, "droproom", "alice")
        joined(b, room, "bob")
        a.wait(presence_from(f"{room}/bob"), "bob's presence")
        b.close()  # no unavailable, no </stream:stream>: the TCP connection just ends
        got = a.wait(presence_from(f"{room}/bob", "unavailable"), "bob's unavailable")
        assert item(got).get("role") == "none", show([got])


def test_kick(xmpp):
    """XEP-0045 8.2: a moderator sets role none: result; the kicked occupant gets
    unavailable with 307 and 110 (and the reason), the others unavailable with 307."""
    with Clients(xmpp, "kick1", "kick2", "kick3") as (a, b, c):
        room = create(a, "kickroom", "alice")
        joined(b, room, "bob")
        joined(c, room, "carol")
        admin(a, room, "<item nick='bob' role='none'><reason>x</reason></item>")
        mine = b.wait(presence_from(f"{room}/bob", "unavailable"), "bob's own unavailable")
        assert {"110", "307"} <= codes(mine), show([mine])
        assert item(mine).get("role") == "none", show([mine])
        assert item(mine).findtext(f"{{{NS_USER}}}reason") == "x", show([mine])
        for o in (a, c):
            got = o.wait(presence_from(f"{room}/bob", "unavailable"), "bob's unavailable")
            assert "307" in codes(got) and "110" not in codes(got), show([got])


def test_ban(xmpp):
    """XEP-0045 9.1: an admin or owner sets affiliation outcast on a bare JID: result; the
    occupant is removed with 301 (110 to itself); 7.2.7: its next join is refused with
    <forbidden/>, type auth."""
    with Clients(xmpp, "ban1", "ban2") as (a, b):
        room = create(a, "banroom", "alice")
        joined(b, room, "bob")
        admin(a, room, f"<item jid='{b.bare}' affiliation='outcast'><reason>out</reason></item>")
        mine = b.wait(presence_from(f"{room}/bob", "unavailable"), "bob's own unavailable")
        assert {"110", "301"} <= codes(mine), show([mine])
        assert item(mine).get("affiliation") == "outcast", show([mine])
        got = a.wait(presence_from(f"{room}/bob", "unavailable"), "bob's unavailable")
        assert "301" in codes(got), show([got])
        seq = join(b, room, "bob")
        assert error(seq[-1]) == ("auth", "forbidden"), show(seq)


def test_members_only(xmpp):
    """XEP-0045 10.2 (muc#roomconfig_membersonly) and 7.2.6: a non-member's join is refused
    with <registration-required/>, type auth; 9.3: once the owner makes its bare JID a
    member, the join succeeds, affiliation member."""
    with Clients(xmpp, "mo1", "mo2") as (a, b):
        room = create(a, "moroom", "alice", {"muc#roomconfig_membersonly": "1"})
        seq = join(b, room, "bob")
        assert error(seq[-1]) == ("auth", "registration-required"), show(seq)
        admin(a, room, f"<item jid='{b.bare}' affiliation='member'/>")
        seq, mine = joined(b, room, "bob")
        assert item(mine).get("affiliation") == "member", show(seq)


@pytest.mark.skipif(S.PEER == "prosody", reason="Prosody 0.12 has no occupant limit "
                    "(mod_muc's options have none; a community module adds one)")
def test_room_full(xmpp):
    """XEP-0045 7.2.9: a join past the room's occupant limit is refused with
    <service-unavailable/> (the XEP's example: type wait). ejabberd refuses it with
    <resource-constraint/>, type wait ("Too many users in this conference"): a deviation,
    checked as its own. An owner still gets in (MUST)."""
    users = [f"full{i}" for i in range(1, MAX_OCCUPANTS + 2)]
    with Clients(xmpp, *users) as cs:
        room = create(cs[0], "fullroom", "n1")
        for i, c in enumerate(cs[1:MAX_OCCUPANTS], start=2):
            joined(c, room, f"n{i}")
        seq = join(cs[-1], room, "late")
        kind, cond = error(seq[-1])
        want = "resource-constraint" if S.PEER == "ejabberd" else "service-unavailable"
        assert cond == want and kind in ("wait", "cancel"), show(seq)
        assert not [s for s in seq if s.tag == C + "presence" and ptype(s) != "error"], show(seq)
        # "If the room has reached its maximum number of occupants and a room admin or owner
        # attempts to join, the room MUST allow the admin or owner to join": the owner
        # leaves, the late one takes the place, the owner comes back past the limit
        # (ejabberd: by its max_users_admin_threshold, 5 by default).
        owner, late = cs[0], cs[-1]
        owner.send(f"<presence to='{room}/n1' type='unavailable'/>")
        owner.wait(presence_from(f"{room}/n1", "unavailable"), "own unavailable")
        joined(late, room, "late")
        seq, mine = joined(owner, room, "n1")
        assert item(mine).get("affiliation") == "owner", show(seq)


def test_self_ping(xmpp):
    """XEP-0410: an occupant's ping to its own room/nick is answered (both peers: result);
    from one who is not an occupant, <not-acceptable/> (ejabberd: type modify, Prosody:
    cancel)."""
    with Clients(xmpp, "ping1", "ping2") as (a, d):
        room = create(a, "pingroom", "alice")
        ans = a.iq("get", f"{room}/alice", f"<ping xmlns='{X.NS_PING}'/>")
        assert ans.get("type") == "result" or error(ans)[1] != "not-acceptable", show([ans])
        ans = d.iq("get", f"{room}/alice", f"<ping xmlns='{X.NS_PING}'/>")
        assert ans.get("type") == "error" and error(ans)[1] == "not-acceptable", show([ans])


def test_subject_change(xmpp):
    """XEP-0045 7.3, 8.1: an occupant allowed to (here the owner, a moderator) sets the subject:
    every occupant gets it, from room/nick; a later joiner gets it at the end of its join."""
    with Clients(xmpp, "subj1", "subj2", "subj3") as (a, b, c):
        room = create(a, "subjroom", "alice")
        joined(b, room, "bob")
        a.send(f"<message to='{room}' type='groupchat'><subject>new</subject></message>")
        for o in (a, b):
            m = o.wait(lambda s: s.tag == C + "message" and s.findtext(C + "subject") == "new",
                       "the new subject")
            assert m.get("from") == f"{room}/alice" and m.get("type") == "groupchat", show([m])
        seq, _ = joined(c, room, "carol")
        assert seq[-1].findtext(C + "subject") == "new", show(seq)


def test_mediated_invitation(xmpp):
    """XEP-0045 7.8.2: an occupant's <invite to=.../> sent to the room reaches the invitee
    from the room's JID, with <invite from=.../> naming the inviter, "the bare JID, full
    JID, or occupant JID of the inviter" (ejabberd: the full JID; Prosody, in a room that is
    not non-anonymous: room/nick), and the reason."""
    with Clients(xmpp, "inv1", "inv2") as (a, c):
        room = create(a, "invroom", "alice")
        c.send("<presence/>")  # available, so that a message to the bare JID is delivered
        c.wait(presence_from(c.full), "own initial presence")
        a.send(f"<message to='{room}'><x xmlns='{NS_USER}'><invite to='{c.bare}'>"
               "<reason>come</reason></invite></x></message>")
        m = c.wait(lambda s: s.tag == C + "message" and x_user(s) is not None and
                   x_user(s).find(f"{{{NS_USER}}}invite") is not None, "the invitation")
        assert m.get("from") == room, show([m])
        inv = x_user(m).find(f"{{{NS_USER}}}invite")
        assert inv.get("from") in (a.bare, a.full, f"{room}/alice"), show([m])
        assert inv.findtext(f"{{{NS_USER}}}reason") == "come", show([m])


def test_nick_change(xmpp):
    """XEP-0045 7.6: presence to room/newnick: the others get unavailable from room/oldnick
    with 303 and the item's nick, then available presence from room/newnick; the occupant
    gets the same with 110."""
    with Clients(xmpp, "rename1", "rename2") as (a, b):
        room = create(a, "renameroom", "alice")
        joined(b, room, "old")
        a.wait(presence_from(f"{room}/old"), "old's presence")
        b.send(f"<presence to='{room}/new'/>")
        for o in (a, b):
            seq = o.until(presence_from(f"{room}/new"), "the presence from new")
            gone = [s for s in seq if presence_from(f"{room}/old", "unavailable")(s)]
            assert len(gone) == 1, show(seq)
            assert "303" in codes(gone[0]) and item(gone[0]).get("nick") == "new", show(seq)
            assert ("110" in codes(gone[0])) == (o is b), show(seq)
            assert ("110" in codes(seq[-1])) == (o is b), show(seq)


def test_groupchat_to_nonexistent_room(xmpp):
    """XEP-0045 has no example; RFC 6120 8.3.3.7: <item-not-found/>, type cancel, from the
    room's JID (both peers: ejabberd "Conference room does not exist")."""
    with Clients(xmpp, "nosuch1") as (a,):
        room = room_jid("nosuchroom")
        a.send(f"<message to='{room}' type='groupchat' id='ns'><body>anyone?</body></message>")
        err = a.wait(lambda s: s.tag == C + "message" and s.get("id") == "ns", "the error")
        assert err.get("from") == room, show([err])
        assert error(err) == ("cancel", "item-not-found"), show([err])


def test_non_owner_and_participant_refused(xmpp):
    """What a participant may not do, in a room whose owner set
    muc#roomconfig_changesubject = 0: configure the room (XEP-0045 10.2: <forbidden/>,
    MUST), change the subject (8.1: a message error <forbidden/>, MUST), both type auth (the
    XEP's example and both peers), kick (8.2 gives no condition for a non-moderator; both peers:
    <not-allowed/>, type cancel); and none of it happened."""
    with Clients(xmpp, "perm1", "perm2") as (a, b):
        room = create(a, "permroom", "alice", {"muc#roomconfig_changesubject": "0"})
        joined(b, room, "bob")
        ans = b.iq("set", room, f"<query xmlns='{NS_OWNER}'><x xmlns='{NS_DATA}' type='submit'/>"
                                "</query>")
        assert error(ans) == ("auth", "forbidden"), show([ans])
        b.send(f"<message to='{room}' type='groupchat' id='subj'><subject>mine</subject></message>")
        err = b.wait(lambda s: s.tag == C + "message" and s.get("id") == "subj", "the error")
        assert error(err) == ("auth", "forbidden"), show([err])
        ans = b.iq("set", room,
                   f"<query xmlns='{NS_ADMIN}'><item nick='alice' role='none'/></query>")
        assert error(ans)[1] in ("not-allowed", "forbidden"), show([ans])
        # Still both in the room, the subject unchanged: a's next message reaches b after
        # nothing of the kind.
        a.send(f"<message to='{room}' type='groupchat'><body>still here</body></message>")
        got = b.until(message_with_body("still here"), "a's message")
        assert not [s for s in got if s.findtext(C + "subject") == "mine" or
                    ptype(s) == "unavailable"], show(got)


def test_slixmpp_occupants(xmpp):
    """Two slixmpp occupants (its XEP-0045 plugin, as a client application uses it): the
    owner joins and configures the room with an empty submitted form, the other joins and
    sees the owner among the occupants, a groupchat reaches it from room/nick, the owner
    makes it a member (listed by the affiliation list) and then kicks it (307)."""
    room = room_jid("slixroom")

    async def t():
        a = await X.login(xmpp.xport, jid("slix1") + "/r", PW, plugins=("xep_0045", "xep_0004"))
        b = await X.login(xmpp.xport, jid("slix2") + "/r", PW, plugins=("xep_0045", "xep_0004"))
        muc_a, muc_b = a.plugin["xep_0045"], b.plugin["xep_0045"]
        seen = asyncio.Queue()  # the room's presences to b, as the plugin hands them out
        b.add_event_handler("groupchat_presence", seen.put_nowait)
        mine, _subject, _occupants, _history = await muc_a.join_muc_wait(
            room, "ann", maxstanzas=0, timeout=X.TIMEOUT)
        assert "201" in {str(c) for c in mine["muc"]["status_codes"]}, mine
        await muc_a.set_room_config(room, a.plugin["xep_0004"].make_form(ftype="submit"))
        mine, _subject, occupants, _history = await muc_b.join_muc_wait(
            room, "bob", timeout=X.TIMEOUT)
        assert "ann" in {o["muc"]["nick"] for o in occupants}, occupants
        a.send_message(mto=room, mbody="hello room", mtype="groupchat")
        got = await X.next_of(b.messages, lambda m: m["body"] == "hello room")
        assert (str(got["from"]), got["type"]) == (f"{room}/ann", "groupchat")
        await muc_a.set_affiliation(room, "member", jid=b.boundjid.bare)
        members = await muc_a.get_affiliation_list(room, "member")
        assert b.boundjid.bare in {str(j) for j in members}, members
        await muc_a.set_role(room, "bob", "none", reason="bye")
        out = await X.next_of(seen, lambda p: str(p["from"]) == f"{room}/bob" and
                              p["type"] == "unavailable")
        assert "307" in {str(c) for c in out["muc"]["status_codes"]}, out
        await X.logout(a, b)
    X.run(t())


def test_password_protected_room(xmpp):
    """XEP-0045 7.2.6 and 10.2: the owner sets a password (muc#roomconfig_passwordprotectedroom
    and roomsecret); a join without it, or with a wrong one, is refused <not-authorized/>
    (type auth); one with it gets in; the room's disco#info says muc_passwordprotected."""
    with Clients(xmpp, "pass1", "pass2") as (a, b):
        room = create(a, "secretroom", "owner", {"muc#roomconfig_passwordprotectedroom": "1",
                                                 "muc#roomconfig_roomsecret": "opensesame"})
        for given in ("", "<password>wrong</password>"):
            refused = join(b, room, "guest", given)[-1]
            assert error(refused) == ("auth", "not-authorized"), show([refused])
        joined(b, room, "guest", "<password>opensesame</password>")
        info = b.iq("get", room, "<query xmlns='http://jabber.org/protocol/disco#info'/>")
        features = {f.get("var") for f in info.iter("{http://jabber.org/protocol/disco#info}feature")}
        assert "muc_passwordprotected" in features, show([info])



@pytest.mark.skipif(S.PEER == "ejabberd", reason="ejabberd 23.01 gives newcomers to a "
                    "moderated room voice (its room option members_by_default, on by default): "
                    "there is no visitor to ask for it")
def test_voice_request_in_a_moderated_room(xmpp):
    """XEP-0045 7.13 and 8.6: in a moderated room a newcomer is a visitor, whose groupchat is
    refused <forbidden/>; its voice request reaches the moderator as the approval form (the
    requester's nick in muc#roomnick); the form submitted back with muc#request_allow makes it
    a participant (its presence says so to everyone), and its groupchat then goes through."""
    request_form = NS_MUC + "#request"
    with Clients(xmpp, "voice1", "voice2") as (a, b):
        room = create(a, "quietroom", "mod", {"muc#roomconfig_moderatedroom": "1"})
        seq, mine = joined(b, room, "visitor")
        assert item(mine).get("role") == "visitor", show(seq)
        b.send(f"<message type='groupchat' to='{room}' id='v1'><body>may I?</body></message>")
        refused = b.wait(lambda s: s.get("id") == "v1" and s.get("type") == "error", "the refusal")
        assert error(refused)[1] == "forbidden", show([refused])
        b.send(f"<message to='{room}'><x xmlns='{NS_DATA}' type='submit'>"
               f"<field var='FORM_TYPE'><value>{request_form}</value></field>"
               "<field var='muc#role' type='list-single'><value>participant</value></field>"
               "</x></message>")
        ask = a.wait(lambda s: s.tag == C + "message" and
                     s.find(f"{{{NS_DATA}}}x") is not None, "the approval form")
        fields = {f.get("var"): f.findtext(f"{{{NS_DATA}}}value")
                  for f in ask.find(f"{{{NS_DATA}}}x").findall(f"{{{NS_DATA}}}field")}
        assert fields.get("FORM_TYPE") == request_form and fields.get("muc#roomnick") == "visitor", \
            show([ask])
        a.send(f"<message to='{room}'><x xmlns='{NS_DATA}' type='submit'>"
               f"<field var='FORM_TYPE'><value>{request_form}</value></field>"
               "<field var='muc#role'><value>participant</value></field>"
               f"<field var='muc#jid'><value>{fields.get('muc#jid') or ''}</value></field>"
               "<field var='muc#roomnick'><value>visitor</value></field>"
               "<field var='muc#request_allow'><value>true</value></field></x></message>")
        for o in (a, b):
            got = o.wait(lambda s: presence_from(f"{room}/visitor")(s) and
                         item(s).get("role") == "participant", "the new role")
        b.send(f"<message type='groupchat' to='{room}'><body>thanks</body></message>")
        a.wait(message_with_body("thanks"), "the voiced message")



@pytest.mark.skipif(S.PEER != "rtd", reason="the peers differ from XEP-0045 7.10 here: "
                    "ejabberd 23.01 answers a room's registration service-unavailable as "
                    "configured for these tests, Prosody 0.12 registration-required to a "
                    "non-member of an open room")
def test_nick_registration(xmpp):
    """XEP-0045 7.10: the room's registration form asks muc#register_roomnick; once reg2 has
    registered "keeper", another's move to that nick is a conflict (7.2.9), reg2 is a member
    and its next get says <registered/>; <remove/> ends it, and the owner may then take the
    nick."""
    ns_reg = "jabber:iq:register"
    with Clients(xmpp, "reg1", "reg2") as (a, b):
        room = create(a, "regroom", "owner")
        form = b.iq("get", room, f"<query xmlns='{ns_reg}'/>")
        assert form.get("type") == "result", show([form])
        fields = {f.get("var") for f in form.iter(f"{{{NS_DATA}}}field")}
        assert "muc#register_roomnick" in fields, show([form])
        ans = b.iq("set", room, f"<query xmlns='{ns_reg}'><x xmlns='{NS_DATA}' type='submit'>"
                                f"<field var='FORM_TYPE'><value>{NS_MUC}#register</value></field>"
                                "<field var='muc#register_roomnick'><value>keeper</value></field>"
                                "</x></query>")
        assert ans.get("type") == "result", show([ans])
        again = b.iq("get", room, f"<query xmlns='{ns_reg}'/>")
        q = again.find(f"{{{ns_reg}}}query")
        assert q is not None and q.find(f"{{{ns_reg}}}registered") is not None, show([again])
        a.send(f"<presence to='{room}/keeper'/>")  # the owner, in as "owner", would change
        refused = a.wait(presence_from(f"{room}/keeper", "error"), "the refusal")
        assert error(refused) == ("cancel", "conflict"), show([refused])
        members = a.iq("get", room, f"<query xmlns='{NS_ADMIN}'><item affiliation='member'/>"
                                    "</query>")
        assert jid("reg2") in {i.get("jid") for i in members.iter(f"{{{NS_ADMIN}}}item")}, \
            show([members])
        ans = b.iq("set", room, f"<query xmlns='{ns_reg}'><remove/></query>")
        assert ans.get("type") == "result", show([ans])
        a.send(f"<presence to='{room}/keeper'/>")  # now free: the owner takes it
        a.wait(presence_from(f"{room}/keeper"), "the new nick's presence")
