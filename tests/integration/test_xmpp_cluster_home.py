"""XMPP across the cluster with a home node (xmpp.cluster_home = "n1", docs/CLUSTER.md "XMPP
across the nodes"): the accounts exist on n1 alone, and users log in on n2 and n3 (SASL's
stored keys come from n1's store, through the session's proxy there); a subscription made
between users on two nodes is in both rosters wherever they log in next, with the presence
broadcast and the probe across nodes; a message for a user who is offline is kept by the
home's store and given at the user's next login on another node, and the archive (XEP-0313)
answers a query on a third; one room at conference.c.test holds occupants of all three nodes,
who see each other join and hear each other's groupchat; a session resumed through another
node (XEP-0198) moves there; a session detached on one node hands the chat it held to its
client's fresh session on another; and kill -9 of a node that is
not the home leaves the others serving its users at their next login, and of the home leaves
logins refused at once (temporary-auth-failure) while the sessions on go on.

Raw clients; every wait ends on a stanza or a node's gauge, bounded by the harness's WAIT."""

import re

import pytest

import xmpp_util as X
from cluster_harness import WAIT, nats, until  # noqa: F401 (nats: a fixture)
from test_xmpp_cluster import DOMAIN, PW, known, leave, metric, three_nodes

USERS = ["ann", "bob", "cat", "dan", "eve", "fay"]
ROOM = f"hall@conference.{DOMAIN}"
NS_MUC = "http://jabber.org/protocol/muc"
NS_MAM = "urn:xmpp:mam:2"


@pytest.fixture(scope="module")
def homed(nats):  # noqa: F811
    with three_nodes(nats, USERS, home="n1",
                     xmpp=', muc_host = "conference.@HOST@", archive = true') as started:
        yield started


def login(node, user, resource="r", presence=True):
    r = X.session(node.xport, user, DOMAIN, PW, resource)
    if presence:
        r.send("<presence/>")
        r.read_until(rf"<presence[^>]*from='{user}@{DOMAIN}/{resource}'".encode())
    return r


def roster(r):
    r.send(f"<iq type='get' id='ro'><query xmlns='{X.NS_ROSTER}'/></iq>")
    return r.read_until(rb"<iq[^>]*id='ro'[^>]*>.*?</iq>")


def test_logins_on_every_node_with_the_accounts_on_the_home(homed):
    n1, n2, n3 = homed
    known(homed, [0, 0, 0])
    for node in homed:
        r = login(node, "fay", presence=False)
        leave(r)
    assert metric(n1, "rt_xmpp_logins_total") >= 1
    # A wrong password is refused on any node, by the home's stored keys.
    bad = X.Raw(n3.xport)
    bad.open(DOMAIN)
    assert bad.scram("SCRAM-SHA-256", "fay", "not it")[0] == "failure"
    bad.close()


def test_a_subscription_across_nodes_is_in_both_rosters_everywhere(homed):
    n1, n2, n3 = homed
    ann, bob = login(n2, "ann"), login(n3, "bob")
    known(homed, [2, 1, 1])
    X.subscribe_across(ann, f"ann@{DOMAIN}", bob, f"bob@{DOMAIN}")
    X.subscribe_across(bob, f"bob@{DOMAIN}", ann, f"ann@{DOMAIN}")
    leave(ann, bob)
    known(homed, [0, 0, 0])
    # Next time on other nodes: the rosters are the home's, the presence crosses both ways.
    bob = login(n2, "bob", presence=False)
    assert "subscription='both'" in roster(bob) and f"ann@{DOMAIN}" in roster(bob)
    bob.send("<presence><priority>2</priority></presence>")
    bob.read_until(rf"<presence[^>]*from='bob@{DOMAIN}/r'".encode())
    known(homed, [1, 0, 1])  # n1 knows bob available: ann's login probes him
    ann = X.session(n1.xport, "ann", DOMAIN, PW, "r")
    text = roster(ann)
    assert f"jid='bob@{DOMAIN}'" in text and "subscription='both'" in text, text
    ann.send("<presence/>")
    text = ann.read_until(rf"<presence[^>]*from='bob@{DOMAIN}/r'".encode())  # the probe's answer
    bob.read_until(rf"<presence[^>]*from='ann@{DOMAIN}/r'".encode())  # the broadcast
    leave(ann, bob)
    known(homed, [0, 0, 0])


def test_offline_message_kept_by_the_home_and_archived(homed):
    n1, n2, n3 = homed
    dan = login(n2, "dan")
    dan.send(f"<message to='cat@{DOMAIN}' type='chat' id='o1'><body>while away</body></message>")
    until(lambda: metric(n1, "rt_xmpp_offline_stored_total") >= 1, WAIT, n1.read_log)
    leave(dan)
    cat = X.session(n3.xport, "cat", DOMAIN, PW, "r")
    cat.send("<presence/>")
    text = cat.read_until(rb"<body>while away</body>")
    assert f"from='dan@{DOMAIN}/r'" in text, text
    # The archive is the home's: cat asks on n3 and finds dan's chat, sent on n2.
    cat.send(f"<iq type='set' id='mq'><query xmlns='{NS_MAM}' queryid='q1'/></iq>")
    text = cat.read_until(rb"<iq[^>]*id='mq'[^>]*>")
    assert "<body>while away</body>" in text and "queryid='q1'" in text, text
    leave(cat)


def join(r, nick):
    r.send(f"<presence to='{ROOM}/{nick}'><x xmlns='{NS_MUC}'/></presence>")
    return r.read_until(rb"<subject")


def test_one_room_for_occupants_of_every_node(homed):
    n1, n2, n3 = homed
    eve, ann, bob = login(n1, "eve"), login(n2, "ann"), login(n3, "bob")
    text = join(eve, "e")
    if "code='201'" in text:  # a new room: accepted as an instant room (XEP-0045 10.1.2)
        eve.send(f"<iq type='set' id='cf' to='{ROOM}'><query xmlns='{NS_MUC}#owner'>"
                 "<x xmlns='jabber:x:data' type='submit'/></query></iq>")
        eve.read_until(rb"<iq[^>]*id='cf'[^>]*>")
    text = join(ann, "a")
    assert f"from='{ROOM}/e'" in text, text  # eve, on n1, is in the room ann joined from n2
    text = join(bob, "b")
    assert f"from='{ROOM}/e'" in text and f"from='{ROOM}/a'" in text, text
    eve.read_until(rf"<presence[^>]*from='{ROOM}/b'".encode())
    ann.send(f"<message to='{ROOM}' type='groupchat'><body>hello hall</body></message>")
    for r in (eve, bob, ann):
        text = r.read_until(rb"<body>hello hall</body>")
        assert f"from='{ROOM}/a'" in text, text
    assert metric(n1, "rt_xmpp_muc_rooms") == 1 and metric(n2, "rt_xmpp_muc_rooms") == 0
    leave(bob)
    text = eve.read_until(rf"<presence[^>]*from='{ROOM}/b'[^>]*type='unavailable'".encode())
    leave(eve, ann)


def test_a_session_detached_on_one_node_hands_its_messages_to_a_bind_on_another(homed):
    """Stream management's resumption stays on the node that held the session: a phone whose
    connection to n2 dropped comes back through n3, binds the same resource (its resumption id
    means nothing there), and the chat the detached session on n2 held reaches it: the bind on
    n3 replaces the session on n2, whose unacknowledged chat goes to the home's offline store,
    given at the new session's initial presence."""
    n1, n2, n3 = homed
    known(homed, [0, 0, 0])
    fay = X.session(n2.xport, "fay", DOMAIN, PW, "phone")
    fay.send("<enable xmlns='urn:xmpp:sm:3' resume='true'/>")
    fay.read_until(rb"<enabled[^>]*/>")
    known(homed, [1, 0, 1], [0, 0, 0])  # n1 knows fay/phone: dan's chat goes to it
    dan = login(n1, "dan")
    dan.send(f"<message to='fay@{DOMAIN}/phone' type='chat'><body>held</body></message>")
    fay.read_until(rb"<body>held</body>")
    fay.sock.close()  # never acknowledged
    until(lambda: f"xmpp.session_detached jid=fay@{DOMAIN}/phone" in n2.read_log(), WAIT,
          n2.read_log)
    again = X.session(n3.xport, "fay", DOMAIN, PW, "phone")
    until(lambda: f"xmpp.unacked_rerouted jid=fay@{DOMAIN}/phone messages=1" in n2.read_log(),
          WAIT, n2.read_log)
    again.send("<presence/>")
    text = again.read_until(rb"<body>held</body>")
    assert f"from='dan@{DOMAIN}/r'" in text, text
    leave(again, dan)
    known(homed, [0, 0, 0])


def test_resumed_through_another_node(homed):
    """XEP-0198 resumption through another node: a phone's connection to n2 drops with a chat
    unacknowledged; it comes back through n3 and resumes with the id n2 gave it. The session
    moves to n3 (its state from n2's actor to the new connection's): <resumed/> with the count
    of what the server handled, the unacknowledged chat sent again, the next chat to the full
    JID reaching it on n3, and no unavailable presence on the way (its contacts see it stay)."""
    n1, n2, n3 = homed
    known(homed, [0, 0, 0])
    ann = login(n2, "ann", "phone")
    ann.send("<enable xmlns='urn:xmpp:sm:3' resume='true'/>")
    smid = re.search(r"id='([^']+)'", ann.read_until(rb"<enabled[^>]*/>")).group(1)
    assert smid.endswith("-n2"), smid
    known(homed, [1, 0, 1])  # n1 knows ann/phone: dan's chat goes to it
    dan = login(n1, "dan")
    dan.send(f"<presence to='ann@{DOMAIN}/phone'/>")  # directed: dan hears ann's unavailable
    dan.send(f"<message to='ann@{DOMAIN}/phone' type='chat'><body>first</body></message>")
    ann.read_until(rb"<body>first</body>")
    ann.sock.close()  # never acknowledged
    until(lambda: f"xmpp.session_detached jid=ann@{DOMAIN}/phone" in n2.read_log(), WAIT,
          n2.read_log)
    again = X.Raw(n3.xport)
    again.open(DOMAIN)
    assert again.scram("SCRAM-SHA-256", "ann", PW) == ("success", None)
    again.open(DOMAIN)
    again.send(f"<resume xmlns='urn:xmpp:sm:3' previd='{smid}' h='0'/>")
    text = again.read_until(rb"<resumed[^>]*/>.*?<body>first</body>")
    assert f"previd='{smid}'" in text, text
    until(lambda: f"xmpp.session_moving jid=ann@{DOMAIN}/phone to=n3" in n2.read_log(), WAIT,
          n2.read_log)
    known(homed, [1, 2, 1])  # ann's binding is n3's everywhere now, dan's n1's
    dan.send(f"<message to='ann@{DOMAIN}/phone' type='chat'><body>second</body></message>")
    again.read_until(rb"<body>second</body>")
    dan.send(f"<iq type='get' id='after' to='{DOMAIN}'><ping xmlns='urn:xmpp:ping'/></iq>")
    text = dan.read_until(rb"<iq[^>]*id='after'[^>]*>")
    assert "type='unavailable'" not in text, text  # ann never left
    leave(again, dan)
    known(homed, [0, 0, 0])


def test_a_killed_node_that_is_not_the_home(homed):
    n1, n2, n3 = homed
    known(homed, [0, 0, 0])
    eve = login(n3, "eve")
    known(homed, [1, 1, 0])
    n3.kill9()
    until(lambda: "xmpp.cluster_node_dropped node=n3" in n2.read_log(), WAIT, n2.read_log)
    eve.close()
    # eve's account and roster are the home's: she logs in again on n2 as before.
    again = login(n2, "eve", "back")
    leave(again)


def test_the_home_killed(homed):
    """What the docs promise when the home goes (kill -9): once a node has noticed, a login
    there is refused at once with temporary-auth-failure (the stored keys are the home's), not
    left to its connect_timeout; a session already on goes on (the server answers its ping)."""
    n1, n2, n3 = homed  # n3 is gone already (the test before)
    ann = login(n2, "ann")
    n1.kill9()
    until(lambda: "xmpp.cluster_node_dropped node=n1" in n2.read_log(), WAIT, n2.read_log)
    r = X.Raw(n2.xport)
    r.open(DOMAIN)
    name, cond = r.scram("SCRAM-SHA-256", "bob", PW)
    assert name == "failure" and "<temporary-auth-failure" in cond, (name, cond)
    r.close()
    ann.send(f"<iq type='get' id='alive' to='{DOMAIN}'><ping xmlns='urn:xmpp:ping'/></iq>")
    text = ann.read_until(rb"<iq[^>]*id='alive'[^>]*>")
    assert "type='result'" in text, text
    leave(ann)
