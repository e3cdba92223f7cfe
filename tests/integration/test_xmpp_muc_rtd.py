"""Group chat (XEP-0045) as only rtd has it (docs/XMPP.md "Group chat"): persistent rooms kept in
xmpp.db across a restart, the bounds (rooms on a node, rooms a session is in, messages an
occupant may send a second), an occupant whose client stopped reading dropped from its room
(333) while the room goes on, the rooms as actors in `rtctl actors`, and the metrics. The
behaviour XEP-0045 specifies is test_xmpp_muc.py's (run against ejabberd and Prosody too); these
tests use its clients.
"""
import re
import socket
import time

import pytest

import xmpp_util as X
from conftest import Rtd, free_port
from test_xmpp_muc import (C, NS_MUC, NS_OWNER, Client, codes, configure, create, error, is_subject,
                           item, join, joined, message_with_body, presence_from, room_jid,
                           rooms_listed, show)

pytestmark = pytest.mark.rtd_only("rtd's own bounds, storage, metrics and rtctl")

PW = "s3cret-pw"
NS_REG = "jabber:iq:register"
MUC = ', muc_host = "conference.@HOST@"'


class Server:
    """An rtd with XMPP on localhost and a MUC service, its data in a folder of the test's, so
    that a second one can start on the same data."""

    def __init__(self, data_dir, users, settings=""):
        self.data_dir = data_dir
        X.add_users(str(data_dir), [(f"{u}@localhost", PW) for u in users])
        self.settings = settings
        self.start()

    def start(self):
        self.xport = free_port()
        self.rtd = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{self.xport}" }}'
                       f'{MUC}{self.settings} }}', "auth_max_delay_ms=0", data_dir=str(self.data_dir))

    def stop(self):
        code, log = self.rtd.stop()
        assert code == 0, log[-3000:]
        return log

    def metric(self, name):
        return X.metric(self.rtd, name)


@pytest.fixture
def server(tmp_path, request):
    users, settings = request.param
    s = Server(tmp_path, users, settings)
    yield s
    s.stop()


def serving(users, settings=""):
    return pytest.mark.parametrize("server", [(users, settings)], indirect=True)


@serving(["own1", "mem1", "out1"])
def test_persistent_room_survives_a_restart(server):
    """A persistent room's configuration, subject and affiliations are in xmpp.db: after a
    restart the room is there, empty, with its name listed, members-only and its password
    still, the member admitted (with the password) with its registered nick kept, the stranger
    not, and the subject its last one; the join is not a creation
    (no 201). A room made temporary again is forgotten: after the next restart a join makes it
    anew."""
    room = room_jid("kept")
    a = Client(server.xport, "own1")
    create(a, "kept", "owner", {"muc#roomconfig_persistentroom": "1",
                                "muc#roomconfig_membersonly": "1",
                                "muc#roomconfig_roomname": "Kept room",
                                "muc#roomconfig_passwordprotectedroom": "1",
                                "muc#roomconfig_roomsecret": "kept secret"})
    ans = a.iq("set", room, f"<query xmlns='{NS_MUC}#admin'><item affiliation='member' "
                            "jid='mem1@localhost'/></query>")
    assert ans.get("type") == "result", show([ans])
    a.send(f"<message type='groupchat' to='{room}'><subject>before the restart</subject></message>")
    a.wait(lambda s: is_subject(s, room), "the subject change")
    m = Client(server.xport, "mem1")  # a registered nick (7.10) is kept with its affiliation
    ans = m.iq("set", room, f"<query xmlns='{NS_REG}'><x xmlns='jabber:x:data' type='submit'>"
                            "<field var='muc#register_roomnick'><value>member</value></field>"
                            "</x></query>")
    assert ans.get("type") == "result", show([ans])
    for c in (a, m):
        c.close()
    server.stop()
    server.start()

    m = Client(server.xport, "mem1")
    assert room in rooms_listed(m)
    ans = m.iq("get", room, f"<query xmlns='{NS_REG}'/>")
    assert ans.find(f"{{{NS_REG}}}query/{{{NS_REG}}}registered") is not None, show([ans])
    refused = join(m, room, "member")[-1]  # the password was kept too
    assert error(refused) == ("auth", "not-authorized"), show([refused])
    seq, mine = joined(m, room, "member", "<password>kept secret</password>")
    assert "201" not in codes(mine), show(seq)
    assert seq[-1].findtext(C + "subject") == "before the restart", show(seq)
    stranger = Client(server.xport, "out1")
    refused = join(stranger, room, "stranger")[-1]
    assert error(refused) == ("auth", "registration-required"), show([refused])
    a = Client(server.xport, "own1")
    joined(a, room, "owner")
    owner = m.wait(presence_from(f"{room}/owner"), "the owner's presence")
    assert item(owner).get("affiliation") == "owner", show([owner])
    configure(a, room, {"muc#roomconfig_persistentroom": "0"})
    for c in (a, m):
        c.close()
    stranger.close()
    server.stop()
    server.start()

    a = Client(server.xport, "own1")
    seq, mine = joined(a, room, "owner")
    assert "201" in codes(mine), show(seq)
    a.close()


@serving(["rate1"], ", muc_message_rate = 1")
def test_message_rate_bound(server):
    """muc_message_rate = 1: a bucket of one message that refills one a second. Of n messages
    sent back to back, at most 1 + the seconds they took (rounded up) go through; the rest are
    answered resource-constraint and counted."""
    a = Client(server.xport, "rate1")
    room = create(a, "ratelimited", "fast")
    n = 8
    t0 = time.monotonic()
    for i in range(n):
        a.send(f"<message type='groupchat' to='{room}' id='r{i}'><body>m{i}</body></message>")
    answers = [a.wait(lambda s, i=i: s.tag == C + "message" and s.get("id") == f"r{i}",
                      f"the echo or error of r{i}") for i in range(n)]
    took = time.monotonic() - t0
    passed = [s for s in answers if s.get("type") == "groupchat"]
    refused = [s for s in answers if s.get("type") == "error"]
    assert len(passed) + len(refused) == n
    assert 1 <= len(passed) <= 1 + int(took) + 1, (took, show(answers))
    assert all(error(s) == ("wait", "resource-constraint") for s in refused), show(refused)
    assert server.metric("rt_xmpp_muc_limited_total") == len(refused)
    assert server.metric("rt_xmpp_muc_messages_total") == len(passed)
    a.close()


@serving(["many1", "many2"], ", muc_max_rooms = 3")
def test_rooms_on_a_node_are_bounded(server):
    """muc_max_rooms = 3: the join that would make a fourth room is refused
    resource-constraint and counted; one room ending makes room for another."""
    a = Client(server.xport, "many1")
    for i in range(3):
        create(a, f"r{i}", "me")
    assert server.metric("rt_xmpp_muc_rooms") == 3
    refused = join(a, room_jid("r3"), "me")[-1]
    assert error(refused) == ("wait", "resource-constraint"), show([refused])
    assert server.metric("rt_xmpp_muc_rooms_refused_total") == 1
    a.send(f"<presence to='{room_jid('r0')}/me' type='unavailable'/>")
    a.wait(presence_from(f"{room_jid('r0')}/me", "unavailable"), "the leave")
    deadline = time.monotonic() + X.TIMEOUT  # the room's actor ends after its last presence
    while server.metric("rt_xmpp_muc_rooms") != 2:
        assert time.monotonic() < deadline, "the empty room did not end"
        time.sleep(0.02)
    create(a, "r3", "me")
    a.close()


@serving(["maker1", "maker2"], ", muc_max_rooms_per_user = 2")
def test_rooms_one_user_makes_are_bounded(server):
    """muc_max_rooms_per_user = 2: a user's join that would make a third room is refused
    not-allowed (another user's is not); once one of its rooms ends it may make one again; a
    join to a room that exists is no making and is let in."""
    a = Client(server.xport, "maker1")
    b = Client(server.xport, "maker2")
    create(a, "m0", "me")
    create(a, "m1", "me")
    refused = join(a, room_jid("m2"), "me")[-1]
    assert error(refused) == ("cancel", "not-allowed"), show([refused])
    create(b, "m2", "other")
    joined(a, room_jid("m2"), "me")  # b's room: a joins, makes nothing
    a.send(f"<presence to='{room_jid('m0')}/me' type='unavailable'/>")
    a.wait(presence_from(f"{room_jid('m0')}/me", "unavailable"), "the leave")
    deadline = time.monotonic() + X.TIMEOUT  # the room gives its count back as it ends
    while True:
        seq = join(a, room_jid("m3"), "me")
        if seq[-1].get("type") != "error":
            break
        assert error(seq[-1]) == ("cancel", "not-allowed") and time.monotonic() < deadline
    configure(a, room_jid("m3"))
    a.close()
    b.close()


@serving(["dir1"], ", muc_max_rooms = 200, muc_max_rooms_per_user = 200")
def test_rooms_one_session_is_in_are_bounded(server):
    """A join is directed presence, which a session remembers to say unavailable at its end
    (RFC 6121 4.6): 128 rooms at most; the next join is refused resource-constraint by the
    session, and the session's end leaves all 128 (every room ends)."""
    a = Client(server.xport, "dir1")
    for i in range(128):
        joined(a, room_jid(f"d{i}"), "me")
    a.send(f"<presence to='{room_jid('d128')}/me'/>")
    refused = a.wait(presence_from(f"{room_jid('d128')}/me", "error"), "the refusal")
    assert error(refused) == ("wait", "resource-constraint"), show([refused])
    assert server.metric("rt_xmpp_muc_rooms") == 128
    a.close()
    deadline = time.monotonic() + X.TIMEOUT
    while server.metric("rt_xmpp_muc_rooms") != 0:
        assert time.monotonic() < deadline, "rooms left after their only occupant's end"
        time.sleep(0.05)


@serving(["fast1", "good1", "slow1"], ", muc_message_rate = 0")
def test_an_occupant_that_stops_reading_is_dropped_and_the_room_goes_on(server):
    """slow1 joins and stops reading (a small receive buffer, so the kernel holds little).
    fast1 sends 4 KB groupchat messages; once slow1's session has had more than its pressure
    mark unsent for C2S_SLOW_MS it sheds, and the room drops it with 333 instead of waiting on
    it: good1 gets slow1's unavailable with 333 and each message fast1 sent; slow1,
    reading again, finds its own unavailable with 333 and 110 among what it was sent."""
    room = room_jid("busy")
    fast = Client(server.xport, "fast1")
    create(fast, "busy", "fast")
    good = Client(server.xport, "good1")
    joined(good, room, "good")
    slow = Client(server.xport, "slow1")
    # A small window, so that little of what slow1 does not read waits in its kernel buffers;
    # not the smallest: read again at the end, the backlog comes a window a round trip.
    slow.raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
    joined(slow, room, "slow")
    body = "x" * 4000
    sent = 0
    dropped = presence_from(f"{room}/slow", "unavailable")
    limit = 20000  # 80 MB at most: far past any socket buffer and the 64 KiB mark
    got = None
    while got is None:
        assert sent < limit, "slow1 was never dropped"
        fast.send(f"<message type='groupchat' to='{room}'><body>{sent} {body}</body></message>")
        sent += 1
        # good1 keeps up, so the room is never held by it; its stanzas show when slow1 goes.
        seq = good.until(lambda s: dropped(s) or message_with_body(f"{sent - 1} {body}")(s),
                         f"message {sent - 1} or slow1's unavailable")
        got = next((s for s in seq if dropped(s)), None)
        if got is not None and not message_with_body(f"{sent - 1} {body}")(seq[-1]):
            good.wait(message_with_body(f"{sent - 1} {body}"), f"message {sent - 1}")
    assert "333" in codes(got), show([got])
    assert server.metric("rt_xmpp_muc_occupants_dropped_total") == 1
    fast.send(f"<message type='groupchat' to='{room}'><body>after</body></message>")
    good.wait(message_with_body("after"), "the message after the drop")
    mine = slow.wait(lambda s: dropped(s) and "110" in codes(s), "its own removal",
                     timeout=4 * X.TIMEOUT)
    assert "333" in codes(mine), show([mine])
    assert re.search(r"event=xmpp\.slow_client jid=slow1@localhost/r",
                     server.rtd.read_log()), "no slow_client line"
    for c in (fast, good, slow):
        c.close()


@serving(["top1"])
def test_rooms_are_actors_rtctl_shows(server):
    """Each room is an actor registered as muc:ROOM@SERVICE, which `rtctl actors` lists with
    its memory; the service is xmpp_muc."""
    a = Client(server.xport, "top1")
    create(a, "seen", "me")
    actors = server.rtd.ctl_json("actors", "list", "--limit", "100000")
    rows = actors if isinstance(actors, list) else actors.get("actors", [])
    names = {r.get("name") for r in rows}
    assert "muc:seen@conference.localhost" in names, sorted(n for n in names if n)
    assert "xmpp_muc" in names
    room = next(r for r in rows if r.get("name") == "muc:seen@conference.localhost")
    assert room.get("type") == "muc_room", room
    a.close()


NS_MAM = "urn:xmpp:mam:2"
NS_SID = "urn:xmpp:sid:0"
NS_FWD = "urn:xmpp:forward:0"


def mam_page(c, room, rsm=""):
    """A MAM query to the room: (the results' forwarded messages in order, the fin)."""
    qid = f"q{next(c.ids)}"
    id_ = f"{c.user}-{next(c.ids)}"
    c.send(f"<iq type='set' id='{id_}' to='{room}'><query xmlns='{NS_MAM}' queryid='{qid}'>"
           f"{rsm}</query></iq>")
    seq = c.until(lambda s: s.tag == C + "iq" and s.get("id") == id_, "the query's end")
    assert seq[-1].get("type") == "result", show(seq)
    results = [s.find(f"{{{NS_MAM}}}result") for s in seq if s.tag == C + "message"]
    results = [r for r in results if r is not None and r.get("queryid") == qid]
    return results, seq[-1].find(f"{{{NS_MAM}}}fin")


@serving(["arch1", "arch2", "arch3"], ", archive = true, muc_message_rate = 0")
def test_room_archive(server):
    """XEP-0313 for rooms: each groupchat copy carries the room's stanza-id (XEP-0359, by the
    room); the room's archive, queried at the room's JID, has them in order, from room/nick,
    with their delay, paged by XEP-0059; a non-member may not read a members-only room's."""
    a = Client(server.xport, "arch1")
    room = create(a, "archived", "alice")
    ids = []
    for i in range(3):
        a.send(f"<message type='groupchat' to='{room}'><body>kept {i}</body></message>")
        got = a.wait(message_with_body(f"kept {i}"), f"message {i}")
        sid = got.find(f"{{{NS_SID}}}stanza-id")
        assert sid is not None and sid.get("by") == room, show([got])
        ids.append(sid.get("id"))
    assert len(set(ids)) == 3
    # The archive writes in batches: it holds the three once its counter says so.
    deadline = time.monotonic() + X.TIMEOUT
    while server.metric("rt_xmpp_archived_total") < 3:
        assert time.monotonic() < deadline, "not archived"
        time.sleep(0.02)
    b = Client(server.xport, "arch2")  # not an occupant: the room is open, so it may read
    results, fin = mam_page(b, room)
    assert [r.get("id") for r in results] == ids, show(results)
    for i, r in enumerate(results):
        fwd = r.find(f"{{{NS_FWD}}}forwarded")
        msg = fwd.find(C + "message")
        assert msg.get("from") == f"{room}/alice" and msg.findtext(C + "body") == f"kept {i}"
        assert fwd.find("{urn:xmpp:delay}delay") is not None
    assert fin is not None and fin.get("complete") == "true", show([fin])
    results, fin = mam_page(b, room, "<set xmlns='http://jabber.org/protocol/rsm'><max>2</max></set>")
    assert [r.get("id") for r in results] == ids[:2] and fin.get("complete") != "true"
    last = fin.find("{http://jabber.org/protocol/rsm}set").findtext(
        "{http://jabber.org/protocol/rsm}last")
    results, fin = mam_page(b, room, "<set xmlns='http://jabber.org/protocol/rsm'>"
                                     f"<after>{last}</after></set>")
    assert [r.get("id") for r in results] == ids[2:] and fin.get("complete") == "true"
    configure(a, room, {"muc#roomconfig_membersonly": "1"})
    ans = b.iq("set", room, f"<query xmlns='{NS_MAM}'/>")
    assert error(ans) == ("auth", "forbidden"), show([ans])
    c = Client(server.xport, "arch3")  # an empty archive's answer
    empty = create(c, "quiet", "carol")
    results, fin = mam_page(c, empty)
    assert results == [] and fin.get("complete") == "true"
    for x in (a, b, c):
        x.close()


HIBERNATE_S = 5  # C2S_HIBERNATE_MS: the quiet time after which a room is compacted

CROWD = [f"crowd{i}" for i in range(30)]


def room_memory(server, name):
    rows = server.rtd.ctl_json("actors", "list", "--limit", "100000")
    rows = rows if isinstance(rows, list) else rows.get("actors", [])
    return next(r for r in rows if r.get("name") == f"muc:{name}@conference.localhost")["memory"]


@serving(CROWD, ", muc_room_locking = false")
def test_an_idle_room_hibernates(server):
    """A crowd of 30 joins (each presence with a status), then all but one leave: the room's
    arrays are still sized for the crowd and its heap holds chunks the leavers' bytes emptied.
    Quiet for C2S_HIBERNATE_MS, the room shrinks them and collects: its memory goes down."""
    clients = [Client(server.xport, u) for u in CROWD]
    room = room_jid("crowded")
    for i, c in enumerate(clients):
        c.send(f"<presence to='{room}/n{i}'><status>{'s' * 200}</status></presence>")
    for i, c in enumerate(clients):
        c.wait(presence_from(f"{room}/n{i}"), "its own presence")
    for i, c in enumerate(clients[1:], 1):
        c.send(f"<presence to='{room}/n{i}' type='unavailable'/>")
        c.wait(presence_from(f"{room}/n{i}", "unavailable"), "its leave")
    before = room_memory(server, "crowded")
    deadline = time.monotonic() + HIBERNATE_S + X.TIMEOUT
    while (after := room_memory(server, "crowded")) >= before:
        assert time.monotonic() < deadline, f"still {after} bytes, {before} after the crowd"
        time.sleep(0.2)
    for c in clients:
        c.close()


@serving(["big1", "big2"], ", muc_history_bytes = 2048, muc_message_rate = 0")
def test_what_a_room_keeps_is_bounded(server):
    """Each occupant's presence is kept while it is in (4 KiB at most: a join or an update
    past it is refused not-acceptable, the presence before stays), and the history by bytes
    as by count (muc_history_bytes = 2048): of five 900-byte messages a joiner gets only the
    newest that fit in 2048 bytes, and one message bigger than that is sent on, never kept."""
    a = Client(server.xport, "big1")
    room = create(a, "bounded", "alice")
    a.send(f"<presence to='{room}/alice'><status>{'s' * 5000}</status></presence>")
    refused = a.wait(presence_from(f"{room}/alice", "error"), "the refusal")
    assert error(refused) == ("modify", "not-acceptable"), show([refused])
    for i in range(5):
        a.send(f"<message type='groupchat' to='{room}'><body>{i} {'m' * 900}</body></message>")
        a.wait(message_with_body(f"{i} {'m' * 900}"), f"message {i}")
    b = Client(server.xport, "big2")
    seen = [s for s in join(b, room, "bob") if s.tag == C + "message" and
            s.findtext(C + "body")]
    assert [s.findtext(C + "body")[0] for s in seen] == ["3", "4"], show(seen)
    huge = "h" * 3000
    a.send(f"<message type='groupchat' to='{room}'><body>{huge}</body></message>")
    b.wait(message_with_body(huge), "the big message, sent on")
    b.send(f"<presence to='{room}/bob' type='unavailable'/>")
    b.wait(presence_from(f"{room}/bob", "unavailable"), "the leave")
    seen = [s.findtext(C + "body")[0] for s in join(b, room, "bob")
            if s.tag == C + "message" and s.findtext(C + "body")]
    assert seen == ["3", "4"], seen  # the big one was not kept; the two before it still are
    b.send(f"<presence to='{room}/bob'><status>{'s' * 5000}</status></presence>")
    refused = b.wait(presence_from(f"{room}/bob", "error"), "the update's refusal")
    assert error(refused) == ("modify", "not-acceptable"), show([refused])
    a.close()
    b.close()
