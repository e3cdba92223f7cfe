"""XMPP across the cluster (docs/CLUSTER.md, "XMPP"): three rtd nodes over a three-server
NATS cluster, one XMPP domain, the same accounts on each node (the account store is still each
node's: the documented limit), raw clients on different nodes. Messages and iq between full
JIDs on two nodes, a bare JID's message to the resource of the highest priority wherever it
is and a headline to all, an iq for a resource on no node answered service-unavailable, a
binding of one full JID on a second node replacing the first (conflict), directed presence
to a session on another node and its unavailable at the sender's end, bindings gone with
their sessions, and kill -9 of a node: the others drop its sessions once it is silent, and a
message for a user who was only there is kept offline rather than sent into the void.

Every wait is on what a node says (its rt_xmpp_cluster_resources gauge, a log line) or on a
stanza; the bound on each is the harness's WAIT."""
import contextlib
import os
import re
import shutil
import tempfile

import pytest

import xmpp_util as X
from cluster_harness import WAIT, cluster_option, nats, until  # noqa: F401 (nats: a fixture)
from conftest import Rtd, free_port

DOMAIN = "c.test"
PW = "cluster secret"
USERS = ["ann", "bob", "cat", "dan", "eve"]


def metric(node, name):
    code, out, err = node.ctl("metrics", "prometheus")
    assert code == 0, err
    m = re.search(rf"^{name} (\S+)$", out, re.M)
    return float(m.group(1)) if m else None


@contextlib.contextmanager
def three_nodes(nats, users, home=None, xmpp=""):  # noqa: F811
    """n1, n2, n3 serving DOMAIN over one NATS cluster, with users' accounts on each node (on
    the home alone when home names one: xmpp.cluster_home) and xmpp's extra settings; they
    have each other's bindings before they are used, and stop at the end but for one a test
    killed (kill9 checked its log already)."""
    tmp = tempfile.mkdtemp(prefix="xmpp-cluster-")
    started = []
    try:
        for i in range(3):
            name, data = f"n{i + 1}", f"{tmp}/n{i + 1}"
            os.makedirs(data)
            if home in (None, name):
                X.add_users(data, [(f"{u}@{DOMAIN}", PW) for u in users])
            port = free_port()
            homed = f', cluster_home = "{home}"' if home else ""
            n = Rtd(cluster_option(name, nats.urls()),
                    f'xmpp={{ hosts = {{ "{DOMAIN}" }}, listeners = {{ "127.0.0.1:{port}" }}'
                    f'{homed}{xmpp} }}', "auth_max_delay_ms=0", data_dir=data)
            n.xport = port
            started.append(n)
        synced(started)
        yield started
    finally:
        stopped = [n.stop() for n in started if n.proc.returncode is None]
        shutil.rmtree(tmp, ignore_errors=True)
        for code, log in stopped:
            assert code == 0, f"exit {code}\n{log[-3000:]}"


@pytest.fixture(scope="module")
def xnodes(nats):  # noqa: F811
    with three_nodes(nats, USERS) as started:
        yield started


def synced(nodes):
    """Waits until each node has the others' bindings whole (it asked each, each told)."""
    until(lambda: all(metric(n, "rt_xmpp_cluster_nodes") == len(nodes) - 1 for n in nodes), WAIT,
          lambda: f"nodes synced {[metric(n, 'rt_xmpp_cluster_nodes') for n in nodes]}\n" +
          "\n".join(n.read_log()[-1500:] for n in nodes))


def known(nodes, counts, available=None):
    """Waits until each node knows as many of the other nodes' resources as counts says, and
    as many of them available (available: the same, unless given): a binding and then its
    presence reach the other nodes a moment after they are made, and what a node routes in
    between goes as if they were not there yet."""
    available = counts if available is None else available

    def now():
        return [(metric(n, "rt_xmpp_cluster_resources"), metric(n, "rt_xmpp_cluster_available"))
                for n in nodes]

    until(lambda: now() == [(c, a) for c, a in zip(counts, available)], WAIT,
          lambda: f"remote resources (all, available) {now()}, wanted "
          f"{list(zip(counts, available))}\n" + "\n".join(n.read_log()[-1500:] for n in nodes))


def login(node, user, resource="r", priority=None):
    r = X.session(node.xport, user, DOMAIN, PW, resource)
    prio = f"<priority>{priority}</priority>" if priority is not None else ""
    r.send(f"<presence>{prio}</presence>")
    r.read_until(rf"<presence[^>]*from='{user}@{DOMAIN}/{resource}'".encode())
    return r


def leave(*clients):
    for r in clients:
        r.send("</stream:stream>")
        r.read_to_close()


def test_messages_and_iq_between_nodes(xnodes):
    n1, n2, n3 = xnodes
    known(xnodes, [0, 0, 0])
    ann = login(n1, "ann")
    bob = login(n2, "bob")
    known(xnodes, [1, 1, 2])
    ann.send(f"<message to='bob@{DOMAIN}/r' type='chat' id='m1'><body>full</body></message>")
    text = bob.read_until(rb"<body>full</body>")
    assert f"from='ann@{DOMAIN}/r'" in text, text
    ann.send(f"<message to='bob@{DOMAIN}' type='chat' id='m2'><body>bare</body></message>")
    bob.read_until(rb"<body>bare</body>")
    bob.send(f"<message to='ann@{DOMAIN}/r' type='chat'><body>back</body></message>")
    ann.read_until(rb"<body>back</body>")
    # An iq to a full JID on another node, and its answer back.
    ann.send(f"<iq to='bob@{DOMAIN}/r' type='get' id='p1'><ping xmlns='urn:xmpp:ping'/></iq>")
    text = bob.read_until(rb"<iq[^>]*id='p1'[^>]*>")
    assert f"from='ann@{DOMAIN}/r'" in text, text
    bob.send(f"<iq to='ann@{DOMAIN}/r' type='result' id='p1'/>")
    text = ann.read_until(rb"<iq[^>]*id='p1'[^>]*>")
    assert "type='result'" in text and f"from='bob@{DOMAIN}/r'" in text, text
    # A resource no node holds: service-unavailable (RFC 6121 8.5.3.2.3), from this node.
    ann.send(f"<iq to='bob@{DOMAIN}/gone' type='get' id='p2'><ping xmlns='urn:xmpp:ping'/></iq>")
    text = ann.read_until(rb"</iq>")
    assert "id='p2'" in text and "<service-unavailable" in text, text
    leave(ann, bob)
    known(xnodes, [0, 0, 0])


def test_bare_jid_goes_to_the_highest_priority_anywhere(xnodes):
    n1, n2, n3 = xnodes
    low = login(n1, "cat", "low", priority=1)
    high = login(n2, "cat", "high", priority=5)
    dan = login(n3, "dan")
    known(xnodes, [2, 2, 2])
    dan.send(f"<message to='cat@{DOMAIN}' type='chat'><body>one</body></message>")
    high.read_until(rb"<body>one</body>")
    # A headline goes to every available resource (8.5.2.1.1): low gets it, and it is the
    # first message low sees, so the chat before did not reach it.
    dan.send(f"<message to='cat@{DOMAIN}' type='headline'><body>all</body></message>")
    text = low.read_until(rb"<body>all</body>")
    assert "<body>one</body>" not in text, text
    high.read_until(rb"<body>all</body>")
    leave(low, high, dan)
    known(xnodes, [0, 0, 0])


def test_a_binding_on_another_node_replaces(xnodes):
    n1, n2, n3 = xnodes
    first = login(n1, "eve", "same")
    known(xnodes, [0, 1, 1])
    second = login(n2, "eve", "same")
    assert first.stream_error()[0] == "conflict"
    known(xnodes, [1, 0, 1])  # n1 knows eve's binding as n2's now, and dropped its own
    ann = login(n3, "ann")
    ann.send(f"<message to='eve@{DOMAIN}/same' type='chat'><body>to second</body></message>")
    second.read_until(rb"<body>to second</body>")
    leave(second, ann)
    known(xnodes, [0, 0, 0])


def test_directed_presence_between_nodes(xnodes):
    n1, n2, n3 = xnodes
    ann = login(n1, "ann")
    known(xnodes, [0, 1, 1])
    bob = login(n2, "bob")
    known(xnodes, [1, 1, 2])
    ann.send(f"<presence to='bob@{DOMAIN}/r'><status>here</status></presence>")
    text = bob.read_until(rb"<status>here</status>")
    assert f"from='ann@{DOMAIN}/r'" in text, text
    leave(ann)
    text = bob.read_until(rb"<presence[^>]*type='unavailable'[^>]*>")
    assert f"from='ann@{DOMAIN}/r'" in text, text
    known(xnodes, [1, 0, 1])
    leave(bob)
    known(xnodes, [0, 0, 0])


def test_presence_and_probe_between_nodes(xnodes):
    """The rosters are each node's (docs/CLUSTER.md): cat and dan subscribe to each other on
    n1 and again on n2, so both nodes' stores have it. Then cat on n1 and dan on n2: dan's
    available presence reaches cat across, and cat's login probes dan across (the probe
    carries cat's full JID; dan's session answers through its registry) and gets it back."""
    n1, n2, n3 = xnodes
    for node in (n1, n2):
        c, d = login(node, "cat", "setup"), login(node, "dan", "setup")
        X.subscribe_across(c, f"cat@{DOMAIN}", d, f"dan@{DOMAIN}")
        X.subscribe_across(d, f"dan@{DOMAIN}", c, f"cat@{DOMAIN}")
        leave(c, d)
    known(xnodes, [0, 0, 0])
    dan = login(n2, "dan", priority=3)
    known(xnodes, [1, 0, 1])
    cat = X.session(n1.xport, "cat", DOMAIN, PW, "r")
    cat.send(f"<iq type='get' id='ro'><query xmlns='{X.NS_ROSTER}'/></iq>")
    cat.read_until(rb"</iq>")
    cat.send("<presence/>")
    text = cat.read_until(rf"<presence[^>]*from='dan@{DOMAIN}/r'".encode())
    text += cat.read_until(rb"</presence>")
    assert "<priority>3</priority>" in text, text
    text = dan.read_until(rf"<presence[^>]*from='cat@{DOMAIN}/r'".encode())
    leave(cat, dan)
    known(xnodes, [0, 0, 0])


def test_a_killed_node_is_dropped_and_its_users_messages_kept(xnodes):
    n1, n2, n3 = xnodes
    dan = login(n3, "dan")
    ann = login(n1, "ann")
    known(xnodes, [1, 2, 1])
    n3.kill9()
    until(lambda: "xmpp.cluster_node_dropped node=n3" in n1.read_log(), WAIT, n1.read_log)
    known(xnodes[:2], [0, 1])
    stored = metric(n1, "rt_xmpp_offline_stored_total")
    ann.send(f"<message to='dan@{DOMAIN}' type='chat' id='k'><body>kept</body></message>")
    until(lambda: metric(n1, "rt_xmpp_offline_stored_total") == stored + 1, WAIT,
          n1.read_log)
    dan.close()
    # dan comes back on n1 (whose store kept it) and is given it at his available presence.
    again = X.session(n1.xport, "dan", DOMAIN, PW, "back")
    again.send("<presence/>")
    again.read_until(rb"<body>kept</body>")
    leave(ann, again)
