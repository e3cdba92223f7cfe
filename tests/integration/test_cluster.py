"""The cluster over NATS (actors/cluster/), end to end: three nats-server processes joined as
one NATS cluster with JetStream on loopback, three rtd nodes (n1, n2, n3) each given all three
NATS URLs, and paho-mqtt clients (MQTT 3.1.1 and 5) on different nodes.

A subscription made on one node becomes a NATS subscription asynchronously, and NATS spreads
it to the other servers asynchronously too: before measuring anything a test waits until a
probe published on the publisher's node reaches every subscriber (await_route). Probes and
fences carry a payload starting with PROBE and are kept apart from the measured messages.
Every test uses its own topic prefix, so the tests sharing the nodes never see each other's
messages. Every wait is bounded; the nats-server processes are stopped by the PIDs started
here, never by name.
"""
import asyncio
import json
import signal
import socket
import threading
import time
from types import SimpleNamespace

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from cluster_harness import (WAIT, Mq, await_route, cluster_option, cut_off,  # noqa: F401
                             durable_nodes, fence, mq, nats, nodes, payloads, pfx,
                             started_refusals, until)
from conftest import Rtd, free_port
from transports import listeners


def test_clients_accepted_at_start(nodes):
    assert not started_refusals, started_refusals


# ---- 1. Publish on one node, subscribers on the others ----

@pytest.mark.parametrize("pub_qos", [0, 1, 2])
def test_remote_delivery_once_in_order_with_min_qos(nodes, mq, pfx, pub_qos):
    n1, n2, n3 = nodes
    topic = f"{pfx}/q"
    subs = [(mq(n2, v5=False, name="s2a"), 2), (mq(n2, v5=True, name="s2b"), 0),
            (mq(n3, v5=True, name="s3a"), 1), (mq(n3, v5=False, name="s3b"), 2)]
    for s, q in subs:
        s.subscribe(topic, q)
    pub = mq(n1, v5=pub_qos != 1, name="pub")
    await_route(pub, topic, [s for s, _ in subs])
    n = 200
    infos = [pub.publish(topic, b"m%04d" % i, qos=pub_qos, wait=False) for i in range(n)]
    for info in infos:
        info.wait_for_publish(WAIT)
        assert info.is_published()
    for s, _ in subs:
        s.wait_count(n)
    fence(pub, topic, [s for s, _ in subs], qos=pub_qos)
    want = [b"m%04d" % i for i in range(n)]
    for s, q in subs:
        got = payloads(s)
        assert got == want, (s.id, len(got), [p for p in got if got.count(p) > 1][:5],
                             sorted(set(want) - set(got))[:5])
        with s.cond:
            qoses = {m.qos for m in s.msgs}
            topics = {m.topic for m in s.msgs}
        assert qoses == {min(pub_qos, q)}, (s.id, qoses)
        assert topics == {topic.encode()}


# ---- 2. Wildcards and topics NATS gives a meaning to ----

def test_wildcards_and_escaped_levels(nodes, mq, pfx):
    n1, n2, n3 = nodes
    plus = mq(n2, v5=False, name="plus")
    plus.subscribe(f"{pfx}/+/b", 1)
    parent = mq(n3, name="parent")
    parent.subscribe(f"{pfx}/a/#", 1)
    every = mq(n2, name="every")
    every.subscribe(f"{pfx}/#", 1)
    pub = mq(n1, name="pub")
    # The probe topics reach each of the filters (a/# through its parent level).
    await_route(pub, f"{pfx}/a/b", [plus, parent, every])
    await_route(pub, f"{pfx}/a", [parent])
    weird = [
        f"{pfx}/x.y/ /*/>/%/",                     # the brief's: . space * > % and an empty level
        f"{pfx}/%41/%/%%/%2E/..//a b/>*/",           # what looks like an escape, empty middle level
        f"{pfx}/\u00e9\u00fc/\u65e5\u672c/\U0001F600",  # UTF-8 bytes, unescaped
        f"{pfx}/" + "/" * 5,                         # only empty levels
        f"{pfx}/$x/a$/x\ty",                         # $ not first; a tab (escaped: <= space)
    ]
    sent = [f"{pfx}/a", f"{pfx}/a/b", f"{pfx}/x/b", f"{pfx}//b", f"{pfx}/a/b/c",
            f"{pfx}/x/y", f"{pfx}/a/b/"] + weird
    for i, t in enumerate(sent):
        pub.publish(t, b"w%02d" % i, qos=1)
    fence(pub, f"{pfx}/a/b", [plus, parent, every])
    sent_b = [t.encode() for t in sent]

    def got(c):
        with c.cond:
            return [(m.topic, m.payload) for m in c.msgs]

    assert got(every) == [(t, b"w%02d" % i) for i, t in enumerate(sent_b)]
    assert got(plus) == [(t, b"w%02d" % i) for i, t in enumerate(sent_b)
                         if t in (f"{pfx}/a/b".encode(), f"{pfx}/x/b".encode(),
                                  f"{pfx}//b".encode())]
    assert got(parent) == [(t, b"w%02d" % i) for i, t in enumerate(sent_b)
                           if t == f"{pfx}/a".encode() or t.startswith(f"{pfx}/a/".encode())]


# ---- 3. Overlapping filters on one node ----

def test_overlapping_filters_once_per_client_with_both_ids(nodes, nats, mq, pfx):
    n1, n2, n3 = nodes
    narrow = mq(n2, v5=False, name="narrow")
    narrow.subscribe(f"{pfx}/t/+/c", 1)  # first: its NATS subscription is made first
    both = mq(n2, name="both")
    both.subscribe(f"{pfx}/t/+/c", 1, sub_id=22)
    both.subscribe(f"{pfx}/t/#", 1, sub_id=11)
    wide = mq(n2, name="wide")
    wide.subscribe(f"{pfx}/t/#", 1)
    pub = mq(n1, name="pub")
    code, out, _ = n2.ctl("cluster", "status", json=True)
    dups_before = json.loads(out).get("duplicates_dropped") if code == 0 else None
    # The topic t reaches t/# only, through its parent-level subject, the last subscription
    # made: once a probe on it arrives, NATS has the earlier ones too.
    await_route(pub, f"{pfx}/t", [both, wide])
    n = 100
    for i in range(n):
        pub.publish(f"{pfx}/t/b/c", b"c%03d" % i, qos=1, wait=False)
        pub.publish(f"{pfx}/t/b/d", b"d%03d" % i, qos=1, wait=False)
    pub.publish(f"{pfx}/t/b/c", b"last", qos=1)
    fence(pub, f"{pfx}/t/b/c", [narrow, both, wide])
    cs = [b"c%03d" % i for i in range(n)] + [b"last"]
    ds = [b"d%03d" % i for i in range(n)]
    interleaved = [p for i in range(n) for p in (cs[i], ds[i])] + [b"last"]
    assert payloads(narrow) == cs
    assert payloads(wide) == interleaved
    assert payloads(both) == interleaved
    with both.cond:
        for m in both.msgs:
            ids = sorted(m.props.SubscriptionIdentifier)
            assert ids == ([11, 22] if m.payload[:1] in (b"c", b"l") else [11]), (m, ids)
    # Both of n2's NATS subscriptions did deliver every t/b/c message: the duplicates came,
    # and were dropped.
    subj = nats.subjects("rtd:n2:routes")
    assert subj.get(f"rt.{pfx}.t.*.c", 0) >= n + 1, subj
    assert subj.get(f"rt.{pfx}.t.>", 0) >= 2 * n + 1, subj
    if isinstance(dups_before, int):  # rtctl cluster status counts them
        dups = n2.ctl_json("cluster", "status")["duplicates_dropped"]
        assert dups - dups_before >= n + 1, (dups_before, dups)


# ---- 4. MQTT 5 properties and subscription options across nodes ----

def test_v5_properties_travel(nodes, mq, pfx):
    n1, n2, n3 = nodes
    topic = f"{pfx}/p"
    s2 = mq(n2, name="props")
    s2.subscribe(topic, 2)
    s3 = mq(n3, v5=False, name="v311")
    s3.subscribe(topic, 1)
    pub = mq(n1, name="pub")
    await_route(pub, topic, [s2, s3])
    props = Properties(PacketTypes.PUBLISH)
    user = [("k", "v"), ("k", "v2"), ("\u00fc", "\u00df \r\n%00"), ("empty", "")]
    props.UserProperty = user
    props.ContentType = "application/x-rt; q=%"
    props.ResponseTopic = f"{pfx}/reply/x.y"
    props.CorrelationData = b"\x00\x01corr\xff%\n"
    props.PayloadFormatIndicator = 1
    props.MessageExpiryInterval = 60
    payload = "h\u00e9llo".encode()
    pub.publish(topic, payload, qos=2, props=props)
    s2.wait_count(1)
    s3.wait_count(1)
    m = s2.msgs[0]
    assert m.payload == payload and m.qos == 2
    p = m.props
    assert p.UserProperty == user
    assert p.ContentType == "application/x-rt; q=%"
    assert p.ResponseTopic == f"{pfx}/reply/x.y"
    assert p.CorrelationData == b"\x00\x01corr\xff%\n"
    assert p.PayloadFormatIndicator == 1
    assert 0 < p.MessageExpiryInterval <= 60
    assert not hasattr(p, "TopicAlias")
    assert s3.msgs[0].payload == payload and s3.msgs[0].qos == 1


def test_retain_as_published_and_no_local_on_receiving_node(nodes, mq, pfx):
    n1, n2, n3 = nodes
    rap = mq(n2, name="rap")
    rap.subscribe(f"{pfx}/r/#", 1, rap=True)
    norap = mq(n2, name="norap")
    norap.subscribe(f"{pfx}/r/#", 1)
    v311 = mq(n3, v5=False, name="v311")
    v311.subscribe(f"{pfx}/r/#", 1)
    nl = mq(n2, name="nolocal")
    nl.subscribe(f"{pfx}/nl/#", 1, no_local=True)
    other = mq(n3, name="other")
    other.subscribe(f"{pfx}/nl/#", 1)
    pub = mq(n1, name="pub")
    await_route(pub, f"{pfx}/r/x", [rap, norap, v311])
    await_route(pub, f"{pfx}/nl/x", [nl, other])
    try:
        pub.publish(f"{pfx}/r/x", b"kept", qos=1, retain=True)
        pub.publish(f"{pfx}/r/x", b"plain", qos=1)
        for c in (rap, norap, v311):
            c.wait_count(2)
        assert [(m.payload, m.retain) for m in rap.msgs] == [(b"kept", 1), (b"plain", 0)]
        assert [(m.payload, m.retain) for m in norap.msgs] == [(b"kept", 0), (b"plain", 0)]
        assert [(m.payload, m.retain) for m in v311.msgs] == [(b"kept", 0), (b"plain", 0)]
    finally:
        pub.publish(f"{pfx}/r/x", b"", qos=1, retain=True)
    # No-local on n2: its own message stays away from it, and goes to the others.
    nl.publish(f"{pfx}/nl/own", b"own", qos=1)
    pub.publish(f"{pfx}/nl/remote", b"remote", qos=1)
    other.wait_count(2)
    nl.wait_count(1)
    fence(pub, f"{pfx}/nl/x", [nl, other])
    assert sorted(payloads(other)) == [b"own", b"remote"]
    assert payloads(nl) == [b"remote"]


# ---- 5. Shared subscriptions across nodes ----

def test_shared_group_spread_over_nodes(nodes, mq, pfx):
    members = [mq(node, name=f"m{i + 1}") for i, node in enumerate(nodes)]
    for m in members:
        m.subscribe(f"$share/g/{pfx}/s/#", 1)
    pub = mq(nodes[0], name="pub")
    await_route(pub, f"{pfx}/s/probe", members)
    n = 300
    infos = [pub.publish(f"{pfx}/s/x", b"s%03d" % i, qos=1, wait=False) for i in range(n)]
    for info in infos:
        info.wait_for_publish(WAIT)
        assert info.is_published()

    def total():
        return sum(len(m.msgs) for m in members)
    until(lambda: total() >= n, WAIT, lambda: f"{total()} of {n} shared messages arrived")
    # Nothing to wait for when all is well: a short look for extra copies.
    time.sleep(0.3)
    got = [p for m in members for p in payloads(m)]
    counts = [len(m.msgs) for m in members]
    assert len(got) == n and sorted(got) == [b"s%03d" % i for i in range(n)], counts
    assert sum(1 for c in counts if c) > 1, f"NATS gave every message to one node: {counts}"
    for m in members:  # each member in publish order
        assert payloads(m) == sorted(payloads(m))


# ---- 6. The route goes with the last subscriber ----

def test_unsubscribe_and_disconnect_remove_the_route(nodes, nats, mq, pfx):
    n1, n2, n3 = nodes
    routes = "rtd:n3:routes"
    a = mq(n3, name="unsub")
    a.subscribe(f"{pfx}/u/#", 1)
    b = mq(n3, v5=False, name="disc")
    b.subscribe(f"{pfx}/d/+", 1)
    keep = mq(n3, name="keep")
    keep.subscribe(f"{pfx}/m", 1)
    pub = mq(n1, name="pub")
    await_route(pub, f"{pfx}/u/x", [a])
    await_route(pub, f"{pfx}/d/x", [b])
    await_route(pub, f"{pfx}/m", [keep])
    held = {f"rt.{pfx}.u.>", f"rt.{pfx}.u", f"rt.{pfx}.d.*", f"rt.{pfx}.m"}
    assert held <= set(nats.subjects(routes)), nats.subjects(routes)
    code, out, _ = n3.ctl("cluster", "status", json=True)
    status_before = json.loads(out) if code == 0 else None

    a.unsubscribe(f"{pfx}/u/#")
    b.close()
    gone = {f"rt.{pfx}.u.>", f"rt.{pfx}.u", f"rt.{pfx}.d.*"}
    until(lambda: not gone & set(nats.subjects(routes)), WAIT,
          lambda: f"n3 still holds {gone & set(nats.subjects(routes))}")
    assert f"rt.{pfx}.m" in nats.subjects(routes)

    # What n1 publishes on them no longer goes to n3: NATS sends n3's routes connection only
    # the marker (one publisher, so once the marker arrives the others would have too).
    # Counted on this test's subjects: the connection also hears the nodes' heartbeats.
    def delivered_here():
        return sum(n for subj, n in nats.subjects(routes).items() if subj.startswith(f"rt.{pfx}."))
    before = delivered_here()
    for i in range(20):
        pub.publish(f"{pfx}/u/x", b"u%d" % i, qos=1, wait=False)
        pub.publish(f"{pfx}/d/x", b"d%d" % i, qos=1, wait=False)
    pub.publish(f"{pfx}/m", b"marker", qos=1)
    keep.wait_count(1)
    after = delivered_here()
    assert after - before == 1, (before, after)
    assert payloads(a) == []

    if status_before is not None and isinstance(status_before.get("routes"), int):
        # rtctl cluster status exists: its count of filters held follows (others' tests may
        # drop theirs meanwhile, never add).
        until(lambda: n3.ctl_json("cluster", "status")["routes"] <= status_before["routes"] - 2,
              WAIT, lambda: f"{status_before} -> {n3.ctl_json('cluster', 'status')}")


# ---- 7. Order under load ----

def test_order_under_load(nodes, mq, pfx):
    n1, n2, n3 = nodes
    topic = f"{pfx}/load"
    s2 = mq(n2, v5=False, name="s2")
    s2.subscribe(topic, 1)
    s3 = mq(n3, name="s3")
    s3.subscribe(topic, 1)
    pub = mq(n1, v5=False, name="pub", inflight=100)
    await_route(pub, topic, [s2, s3])
    n = 5000
    t0 = time.monotonic()
    infos = [pub.publish(topic, b"%05d" % i, qos=1, wait=False) for i in range(n)]
    infos[-1].wait_for_publish(60)
    assert all(i.is_published() for i in infos)
    for s in (s2, s3):
        s.wait_count(n, 60)
    elapsed = time.monotonic() - t0
    fence(pub, topic, [s2, s3])
    want = [b"%05d" % i for i in range(n)]
    for s in (s2, s3):
        got = payloads(s)
        if got != want:
            bad = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
            pytest.fail(f"{s.id}: {len(got)} messages, first out of order at {bad}: "
                        f"{got[bad - 2:bad + 3]} (all in {elapsed:.1f} s)")


# ---- 8. Retained message, live ----

def test_retained_delivered_live_to_remote_subscriber(nodes, mq, pfx):
    n1, n2, n3 = nodes
    s = mq(n2, v5=False, name="live")
    s.subscribe(f"{pfx}/ret/+", 1)
    pub = mq(n1, name="pub")
    await_route(pub, f"{pfx}/ret/probe", [s])
    try:
        pub.publish(f"{pfx}/ret/a", b"state", qos=1, retain=True)
        s.wait_count(1)
        m = s.msgs[0]
        assert (m.topic, m.payload, m.qos) == (f"{pfx}/ret/a".encode(), b"state", 1)
    finally:
        pub.publish(f"{pfx}/ret/a", b"", qos=1, retain=True)


def banned_values(node):
    return [b["value"] for b in node.ctl_json("banned", "list")]


def connack_as(node, cid):
    from mqtt_raw import Raw
    c = Raw(node.port, cid)
    code = c.connack_code
    if code == 0:
        c.disconnect()
    return code


def test_the_banned_list_is_the_clusters(nodes, pfx):
    """docs/AUTH.md, "Banned clients": a ban added on one node refuses the client on every
    node once each has applied the bucket's change, a delete on another node lifts it
    everywhere, and a ban flapping detection makes on one node travels the same way."""
    n1, n2, n3 = nodes
    cid = "ban-" + pfx
    assert n1.ctl("banned", "add", "clientid", cid, "--reason", "cluster-wide")[0] == 0
    for n in (n1, n2, n3):
        until(lambda: cid in banned_values(n), WAIT, lambda: n.read_log()[-2000:])
        assert connack_as(n, cid) == 0x8A
    [ban] = [b for b in n2.ctl_json("banned", "list") if b["value"] == cid]
    assert ban["reason"] == "cluster-wide" and ban["by"] == "admin" and ban["until"] is None
    assert n3.ctl("banned", "del", "clientid", cid)[0] == 0
    for n in (n1, n2, n3):
        until(lambda: cid not in banned_values(n), WAIT, lambda: n.read_log()[-2000:])
    assert connack_as(n1, cid) == 0
    flapper = "flap-" + pfx
    assert n1.ctl("config", "set", "flapping_max_connects", "2")[0] == 0
    try:
        assert connack_as(n1, flapper) == 0
        assert connack_as(n1, flapper) == 0x8A
    finally:
        assert n1.ctl("config", "set", "flapping_max_connects", "0")[0] == 0
    until(lambda: flapper in banned_values(n3), WAIT, lambda: n3.read_log()[-2000:])
    assert connack_as(n3, flapper) == 0x8A
    assert n2.ctl("banned", "del", "clientid", flapper)[0] == 0
    for n in (n1, n2, n3):
        until(lambda: flapper not in banned_values(n), WAIT, lambda: n.read_log()[-2000:])


# ---- 9. NATS unreachable, or lost ----

def test_tenants_across_nodes(nats, mq, pfx):
    """Two more nodes, each with a listener per tenant (mountpoints ta/ and tb/): a tenant's
    clients on different nodes reach each other and never the other tenant's; client id "dev"
    in both tenants is two ids cluster-wide (ta/dev, tb/dev), neither taken over; an unmounted
    client sees the mounted topics. The rate and quotas are per node (docs/TENANTS.md)."""
    ports = [(free_port(), free_port(), free_port()) for _ in range(2)]
    started = []
    try:
        for i, (plain, ta, tb) in enumerate(ports):
            started.append(Rtd(cluster_option(f"t{i + 1}", nats.urls()),
                               listeners(plain, {"bind": f"127.0.0.1:{ta}", "mountpoint": "ta/"},
                                         {"bind": f"127.0.0.1:{tb}", "mountpoint": "tb/"}),
                               port=plain))
        for n in started:
            until(lambda: n.ctl_json("cluster", "status")["lease"] == "held", WAIT,
                  lambda: n.read_log()[-2000:])
        at = [[SimpleNamespace(port=p) for p in node_ports[1:]] for node_ports in ports]
        a1, b2 = mq(at[0][0], cid="dev"), mq(at[1][1], cid="dev")
        a2, b1 = mq(at[1][0], name="a2"), mq(at[0][1], name="b1")
        obs = mq(started[0], name="obs")
        for c in (a1, b2):
            c.subscribe(f"{pfx}/#", 1)
        obs.subscribe(f"ta/{pfx}/#", 1)
        await_route(a2, f"{pfx}/r", [a1, obs])  # ta/ from the second node to the first
        await_route(b1, f"{pfx}/r", [b2])       # tb/ the other way
        a2.publish(f"{pfx}/x", b"for ta", qos=1)
        b1.publish(f"{pfx}/y", b"for tb", qos=1)
        a2.publish(f"{pfx}/end", b"end ta", qos=1)  # behind ta's message, from the same client
        b1.publish(f"{pfx}/end", b"end tb", qos=1)
        a1.wait_count(2)
        b2.wait_count(2)
        obs.wait_count(2)
        assert [(m.topic, m.payload) for m in a1.msgs] == [(f"{pfx}/x".encode(), b"for ta"),
                                                           (f"{pfx}/end".encode(), b"end ta")]
        assert [(m.topic, m.payload) for m in b2.msgs] == [(f"{pfx}/y".encode(), b"for tb"),
                                                           (f"{pfx}/end".encode(), b"end tb")]
        assert [m.topic for m in obs.msgs] == [f"ta/{pfx}/x".encode(), f"ta/{pfx}/end".encode()]
        assert a1.disconnects == [] and b2.disconnects == []  # "dev" twice, no takeover
        ids = {c["client_id"] for n in started for c in n.ctl_json("clients", "list")}
        assert {"ta/dev", "tb/dev"} <= ids, ids
    finally:
        bad = []
        for n in started:
            code, log = n.stop()
            if code != 0:
                bad.append(log[-3000:])
        assert not bad, bad


def test_node_starts_without_nats(mq, pfx):
    dead = free_port()  # nothing listens there
    node = Rtd(cluster_option("lone", [f"nats://127.0.0.1:{dead}"]))
    try:
        until(lambda: "cluster.not_connected" in node.read_log(), WAIT,
              lambda: node.read_log()[-2000:])
        serves_local_clients(node, mq, pfx)
    finally:
        t1 = time.monotonic()
        code, log = node.stop()
    assert code == 0, log[-3000:]
    assert time.monotonic() - t1 < 8, "stop took long with NATS down"


def serves_local_clients(node, mq, pfx):
    for v5 in (False, True):
        s = mq(node, v5=v5, name="local")
        s.subscribe(f"{pfx}/l/#", 1)
        p = mq(node, v5=v5, name="pub")
        for q in (0, 1, 2):
            p.publish(f"{pfx}/l/{q}", b"q%d" % q, qos=q)
        s.wait_count(3)
        assert [(m.payload, m.qos) for m in s.msgs] == [(b"q0", 0), (b"q1", 1), (b"q2", 1)]
        s.unsubscribe(f"{pfx}/l/#")


def test_node_cut_off_from_nats_serves_local_clients(cut_off, mq, pfx):
    serves_local_clients(cut_off, mq, pfx)
    # Its nats-server had the default max_payload (1 MiB), under max_packet_size + headers.
    assert "cluster.max_payload" in cut_off.read_log()


def test_node_cut_off_refuses_persistent_sessions(cut_off, mq, pfx):
    """No claim can be made: a session that outlives its connection is refused (it could be
    live on another node); clean ones are served (test above)."""
    import paho.mqtt.client as mqtt
    for v5 in (False, True):
        c = mqtt.Client(client_id=f"per-{pfx}-{int(v5)}",
                        protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                        **({} if v5 else {"clean_session": False}))
        got = []
        c.on_connect = lambda cl, ud, flags, rc, props=None: got.append(rc)
        kw = {}
        if v5:
            from paho.mqtt.properties import Properties
            from paho.mqtt.packettypes import PacketTypes
            p = Properties(PacketTypes.CONNECT)
            p.SessionExpiryInterval = 300
            kw = {"clean_start": False, "properties": p}
        c.connect("127.0.0.1", cut_off.port, **kw)
        c.loop_start()
        try:
            until(lambda: got, WAIT, lambda: "no CONNACK")
        finally:
            c.loop_stop()
            c.disconnect()
        rc = got[0]
        assert (rc == 0x88) if v5 else (rc == 3), rc
    assert "client.refused_unclaimed" in cut_off.read_log()


def test_shared_group_on_node_cut_off_from_nats(cut_off, mq, pfx):
    member = mq(cut_off, name="member")
    member.subscribe(f"$share/g/{pfx}/l/#", 1)
    plain = mq(cut_off, name="plain")
    plain.subscribe(f"{pfx}/l/#", 1)
    p = mq(cut_off, name="pub")
    p.publish(f"{pfx}/l/x", b"one", qos=1)
    plain.wait_count(1)
    member.wait_count(1, 3)  # when all is well it is there with the plain one
    assert payloads(member) == [b"one"]


# ---- More: what else a message carries, and where it can wait ----

def big_message(nodes, mq, pfx, payload_len, prop_len):
    """A v5 message near the size limits, published on n1: (local copy, remote copies)."""
    n1, n2, _ = nodes
    topic = f"{pfx}/big"
    local = mq(n1, name="local")
    local.subscribe(topic, 1)
    remote = mq(n2, name="remote")
    remote.subscribe(topic, 1)
    pub = mq(n1, name="pub")
    await_route(pub, topic, [remote])
    props = None
    if prop_len:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("big%d" % i, "x" * 60000) for i in range(prop_len // 60000)]
    pub.publish(topic, b"b" * payload_len, qos=1, props=props)
    local.wait_count(1)
    fence(pub, topic, [remote])  # the connection to NATS still works
    return local.msgs, remote.msgs


def test_big_message_crosses(nodes, mq, pfx):
    local, remote = big_message(nodes, mq, pfx, 1_048_000, 0)
    assert len(remote) == 1 and remote[0].payload == local[0].payload


@pytest.mark.parametrize("payload_len,prop_len", [(1_048_500, 0), (400_000, 360_000)],
                         ids=["payload-near-1MiB", "700KB-with-properties"])
def test_big_message_with_nats_max_payload_raised(nodes, mq, pfx, payload_len, prop_len):
    local, remote = big_message(nodes, mq, pfx, payload_len, prop_len)
    assert len(remote) == 1 and remote[0].payload == local[0].payload


def test_topic_alias_resolved_before_forwarding(nodes, mq, pfx):
    from mqtt_raw import Raw, prop_u16
    n1, n2, _ = nodes
    s = mq(n2, name="alias")
    s.subscribe(f"{pfx}/al/#", 1)
    probe = mq(n1, name="probe")
    await_route(probe, f"{pfx}/al/p", [s])
    raw = Raw(n1.port, "raw-" + pfx, version=5)
    try:
        assert raw.connack_props.get(0x22, 0) >= 1, raw.connack_props  # topic alias maximum
        raw.publish(f"{pfx}/al/x", b"first", qos=1, pid=1, props=prop_u16(0x23, 1))
        raw.publish("", b"second", qos=1, pid=2, props=prop_u16(0x23, 1))
    finally:
        raw.disconnect()
    s.wait_count(2)
    assert [(m.topic, m.payload) for m in s.msgs] == [(f"{pfx}/al/x".encode(), b"first"),
                                                       (f"{pfx}/al/x".encode(), b"second")]
    assert not any(hasattr(m.props, "TopicAlias") for m in s.msgs)


def test_remote_messages_wait_in_a_kept_session(nodes, mq, pfx):
    n1, n2, _ = nodes
    cid = "kept-" + pfx
    holder = Mq(n2, v5=False, cid=cid, clean=False)  # a v3.1.1 session kept on n2
    holder.subscribe(f"{pfx}/kept", 1)
    watcher = mq(n2, name="watcher")
    watcher.subscribe(f"{pfx}/kept", 1)
    pub = mq(n1, name="pub")
    await_route(pub, f"{pfx}/kept", [holder, watcher])
    holder.close()
    n2.wait_offline(cid)
    for i in range(5):
        pub.publish(f"{pfx}/kept", b"k%d" % i, qos=1)
    watcher.wait_count(5)  # on n2, so routed to the kept session too
    back = mq(n2, v5=False, cid=cid, clean=False)
    back.wait_count(5)
    assert payloads(back) == [b"k%d" % i for i in range(5)]
    back.unsubscribe(f"{pfx}/kept")


def test_will_message_crosses(nodes, mq, pfx):
    n1, n2, n3 = nodes
    s = mq(n3, name="will")
    s.subscribe(f"{pfx}/will", 1)
    probe = mq(n1, name="probe")
    await_route(probe, f"{pfx}/will", [s])
    dying = mqtt.Client(client_id="dying-" + pfx, protocol=mqtt.MQTTv311)
    dying.will_set(f"{pfx}/will", b"gone", qos=1)
    connected = threading.Event()
    dying.on_connect = lambda *a: connected.set()
    dying.connect("127.0.0.1", n1.port, keepalive=30)
    dying.loop_start()
    assert connected.wait(10)
    dying.loop_stop()
    dying.socket().close()  # no DISCONNECT: the will goes out
    s.wait_count(1)
    assert (s.msgs[0].payload, s.msgs[0].qos) == (b"gone", 1)


def test_many_filters_routes_table_grows_and_shrinks(nodes, nats, mq, pfx):
    n1, n2, _ = nodes
    s = mq(n2, name="many")
    n = 300
    for i in range(n):
        s.subscribe(f"{pfx}/f{i}/+", 1)
    pub = mq(n1, name="pub")
    await_route(pub, f"{pfx}/f{n - 1}/p", [s])
    for i in range(n):
        pub.publish(f"{pfx}/f{i}/x", b"%d" % i, qos=1, wait=False)
    fence(pub, f"{pfx}/f{n - 1}/p", [s])
    assert sorted(payloads(s), key=int) == [b"%d" % i for i in range(n)]
    for i in range(0, n, 2):
        s.unsubscribe(f"{pfx}/f{i}/+")
    for i in range(n, n + 100):  # new ones into a table full of tombstones
        s.subscribe(f"{pfx}/f{i}/+", 1)
    mine = {f"rt.{pfx}.f{i}.*" for i in list(range(1, n, 2)) + list(range(n, n + 100))}
    until(lambda: set(k for k in nats.subjects("rtd:n2:routes") if k.startswith(f"rt.{pfx}."))
          == mine, WAIT, lambda: f"n2's subjects: {len(nats.subjects('rtd:n2:routes'))}")
    await_route(pub, f"{pfx}/f{n + 99}/p", [s])
    with s.cond:
        s.msgs.clear()
    for i in range(n + 100):
        pub.publish(f"{pfx}/f{i}/x", b"%d" % i, qos=1, wait=False)
    fence(pub, f"{pfx}/f{n + 99}/p", [s])
    assert sorted(payloads(s), key=int) == [b"%d" % i for i in sorted(
        set(range(1, n, 2)) | set(range(n, n + 100)))]


def test_two_groups_and_a_plain_subscriber_on_one_filter(nodes, mq, pfx):
    n1, n2, n3 = nodes
    g = [mq(n2, name="g2"), mq(n3, name="g3")]
    h = [mq(n1, name="h1"), mq(n3, name="h3")]
    for m in g:
        m.subscribe(f"$share/g/{pfx}/two/#", 1)
    for m in h:
        m.subscribe(f"$share/h/{pfx}/two/#", 1)
    plain = mq(n3, name="plain")
    plain.subscribe(f"{pfx}/two/#", 1)
    pub = mq(n2, name="pub")
    await_route(pub, f"{pfx}/two/p", g + h + [plain])
    n = 100
    for i in range(n):
        pub.publish(f"{pfx}/two/x", b"%03d" % i, qos=1, wait=False)
    want = [b"%03d" % i for i in range(n)]
    for group in (g, h):
        until(lambda: sum(len(m.msgs) for m in group) >= n, WAIT,
              lambda: f"{[len(m.msgs) for m in group]} of {n}")
    plain.wait_count(n)
    time.sleep(0.3)  # a look for extra copies
    for group in (g, h):
        assert sorted(p for m in group for p in payloads(m)) == want
    assert payloads(plain) == want


def test_node_restart_is_a_new_incarnation(nats, nodes, mq, pfx):
    n1, n2, _ = nodes
    s = mq(n2, name="inc")
    s.subscribe(f"{pfx}/inc", 1)
    for run in range(2):
        n4 = Rtd(cluster_option("n4", nats.urls()))
        try:
            pub = mq(n4, name="pub")
            await_route(pub, f"{pfx}/inc", [s])
            for i in range(10):  # the same sequence numbers as the run before
                pub.publish(f"{pfx}/inc", b"%d-%d" % (run, i), qos=1)
            s.wait_count(10 * (run + 1))
            pub.close()
        finally:
            code, log = n4.stop()
        assert code == 0, log[-3000:]
    assert payloads(s) == [b"%d-%d" % (r, i) for r in range(2) for i in range(10)]


# ---- Retained messages cluster-wide, client ids, nodes and rules ----

def test_retained_for_a_later_subscriber_on_any_node(nodes, mq, pfx):
    """A subscriber that subscribes on another node right after the PUBACK of a retained
    PUBLISH gets it (the store is replicated in JetStream and a subscription waits for its
    node's copy to catch up): no lost-update race, each time."""
    n1, n2, n3 = nodes
    pub = mq(n1, name="pub")
    for i in range(20):
        topic = f"{pfx}/late/{i}"
        pub.publish(topic, b"v%d" % i, qos=1, retain=True)  # returns at the PUBACK
        s = mq(n2 if i % 2 else n3, name="late")
        s.subscribe(topic, 1)
        s.wait_count(1)
        assert [(m.payload, m.retain) for m in s.msgs] == [(b"v%d" % i, 1)]
        s.close()
    # A newer value replaces it everywhere, and an empty one clears it everywhere.
    pub.publish(f"{pfx}/late/0", b"newer", qos=1, retain=True)
    s = mq(n3, name="newer")
    s.subscribe(f"{pfx}/late/0", 1)
    s.wait_count(1)
    assert payloads(s) == [b"newer"]
    pub.publish(f"{pfx}/late/0", b"", qos=1, retain=True)
    gone = mq(n2, name="gone")
    gone.subscribe(f"{pfx}/late/#", 1)
    gone.wait_count(19)
    time.sleep(0.3)  # a look for the cleared one
    assert sorted(payloads(gone)) == sorted(b"v%d" % i for i in range(1, 20))
    for i in range(1, 20):
        pub.publish(f"{pfx}/late/{i}", b"", qos=1, retain=True)
    status = n2.ctl_json("cluster", "status")
    assert status["retained"] == "replicated" and status["retained_put_failed"] == 0, status


def mqtt311_connect(cid, clean=True):
    """A CONNECT, MQTT 3.1.1, keep alive 60 s."""
    flags = b"\x02" if clean else b"\x00"
    body = b"\x00\x04MQTT\x04" + flags + b"\x00\x3c" + len(cid).to_bytes(2, "big") + cid.encode()
    assert len(body) < 128
    return bytes([0x10, len(body)]) + body


class RawClient:
    """One MQTT connection read to its end in the background: what came, and whether the
    server closed it."""

    def __init__(self, port):
        self.port, self.got, self.closed = port, b"", asyncio.Event()

    async def open(self):
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)
        self.task = asyncio.create_task(self.read())

    async def read(self):
        try:
            while chunk := await self.r.read(256):
                self.got += chunk
        except ConnectionError:
            pass
        self.closed.set()

    async def answers(self, expected):
        """Waits (bounded) until what came ends with expected, the connection still open."""
        async def seen():
            while not self.got.endswith(expected) and not self.closed.is_set():
                await asyncio.sleep(0.005)
        await asyncio.wait_for(seen(), WAIT)
        return self.got.endswith(expected) and not self.closed.is_set()


async def race_pairs(ports, ids):
    """For each id a CONNECT to each of two nodes, written together; returns per id the
    client that survived, once the other's connection has closed (bounded), and the ids
    where both or neither did."""
    pairs = [(RawClient(ports[0]), RawClient(ports[1])) for _ in ids]
    await asyncio.gather(*(c.open() for pair in pairs for c in pair))
    for cid, pair in zip(ids, pairs):
        for c in pair:
            c.w.write(mqtt311_connect(cid))
    await asyncio.gather(*(c.w.drain() for pair in pairs for c in pair))

    async def first_closed(pair):
        done, _ = await asyncio.wait([asyncio.create_task(c.closed.wait()) for c in pair],
                                     timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
        return bool(done)
    settled = await asyncio.gather(*(first_closed(p) for p in pairs))
    survivors, wrong = [], []
    for cid, pair, one_closed in zip(ids, pairs, settled):
        alive = [c for c in pair if not c.closed.is_set()]
        if not one_closed or len(alive) != 1:
            wrong.append((cid, len(alive)))
        else:
            survivors.append(alive[0])
    # A survivor answers: its CONNACK (accepted), then a PINGRESP to a PINGREQ.
    for c in survivors:
        c.w.write(b"\xc0\x00")
    alive = await asyncio.gather(*(c.answers(b"\x20\x02\x00\x00\xd0\x00") for c in survivors))
    for pair in pairs:  # the losers' sockets, closed here rather than by the collector later
        for c in pair:
            if c.closed.is_set():
                c.w.close()
    return survivors, wrong, alive


def test_same_id_on_two_nodes_at_once_exactly_one_survives(nodes, pfx):
    """Issue 30 (8): one client id CONNECTs to n1 and n2 at the same moment, 1,000 times (in
    rounds of 100 ids): each time exactly one connection survives, it is accepted and
    answers, and the other is closed. Most claims are settled by one create in JetStream
    (the pipelined path); the loser's node asks the winner's, which ends its client even
    when the client has not finished its CONNECT (its claim had just been made)."""
    n1, n2, _ = nodes

    def at_once(node):
        return node.ctl_json("cluster", "status")["client_ids_claimed_at_once"]
    # Until its first lease a node claims the sequential way (which waits for the lease).
    for node in (n1, n2):
        until(lambda: node.ctl_json("cluster", "status")["lease"] == "held", WAIT,
              lambda: node.ctl_json("cluster", "status"))
    before = at_once(n1) + at_once(n2)

    async def run():
        everyone, wrong_all = [], []
        for r in range(10):
            ids = [f"{pfx}-race-{r}-{i}" for i in range(100)]
            survivors, wrong, alive = await race_pairs((n1.port, n2.port), ids)
            wrong_all += wrong
            assert all(alive), f"round {r}: {alive.count(False)} survivors did not answer"
            everyone += survivors
        assert not wrong_all, (f"ids with other than one survivor (id, alive): {wrong_all[:10]}\n"
                               + "\n".join(line for n in (n1, n2)
                                           for line in n.read_log().splitlines()
                                           if any(cid in line for cid, _ in wrong_all[:10])))
        # All still there at the end: none ended by a claim that came late.
        for c in everyone:
            c.w.write(b"\xc0\x00")
        alive = await asyncio.gather(*(c.answers(b"\xd0\x00\xd0\x00") for c in everyone))
        assert all(alive), f"{alive.count(False)} survivors gone by the end"
        for c in everyone:
            c.w.write(b"\xe0\x00")
        await asyncio.gather(*(c.closed.wait() for c in everyone))
        for c in everyone:
            c.w.close()
        return len(everyone)
    assert asyncio.run(run()) == 1000
    assert at_once(n1) + at_once(n2) - before >= 1000


def test_client_id_taken_over_across_nodes(nodes, mq, pfx):
    """One client id, one node: a CONNECT on n2 for a client connected to n1 ends it there
    (MQTT 5: DISCONNECT 0x8E), then n2 holds the id."""
    n1, n2, _ = nodes
    cid = "tk-" + pfx
    reasons = []
    first = mqtt.Client(client_id=cid, protocol=mqtt.MQTTv5)
    first.on_disconnect = lambda c, u, rc, *p: reasons.append(rc if isinstance(rc, int)
                                                               else rc.value)
    first.connect("127.0.0.1", n1.port, keepalive=30)
    first.loop_start()
    try:
        until(lambda: first.is_connected(), WAIT, "first client connected")
        second = mq(n2, cid=cid)
        until(lambda: reasons, WAIT, lambda: "no DISCONNECT on n1\n" + n1.read_log()[-2000:])
        assert reasons[0] == 0x8E, reasons
        assert f"cluster.client_given_up client={cid}" in n1.read_log()
        assert f"cluster.client_taken_over client={cid} from=n1" in n2.read_log()
        assert second.c.is_connected()
    finally:
        first.loop_stop()
    # 3.1.1 too: the old connection is closed (3.1.1 has no DISCONNECT from the server).
    old = Mq(n2, v5=False, cid=cid + "-v3")
    gone = threading.Event()
    old.c.on_disconnect = lambda *a: gone.set()
    try:
        mq(n1, v5=False, cid=cid + "-v3")
        assert gone.wait(WAIT), "the 3.1.1 client on n2 was not ended"
    finally:
        old.close()


def test_topics_cannot_reach_the_nodes_control_subjects(nodes, mq, pfx):
    """Topics map to subjects under the prefix; the nodes' own requests and heartbeats live
    under <prefix>_ctl, out of any topic's reach: a client publishing on what looks like a
    node's takeover subject, or its heartbeats, ends no one and adds no node."""
    n1, n2, _ = nodes
    victim = mq(n1, name="victim")
    attacker = mq(n2, name="attacker")
    for topic in ("node/n1/takeover", "node/n1/handover", "rt_ctl/node/n1/takeover"):
        attacker.publish(topic, victim.id.encode(), qos=1)
    attacker.publish("status/n9", b"uptime_s 1\n", qos=1)
    probe = mq(n1, name="probe")
    probe.subscribe(f"{pfx}/p", 1)
    await_route(attacker, f"{pfx}/p", [probe])  # what went before has been routed by now
    assert victim.c.is_connected() and not victim.disconnects
    assert "n9" not in {n["node"] for n in n1.ctl_json("cluster", "nodes")}


def test_clients_show_finds_a_client_on_another_node(nodes, mq, pfx):
    """`rtctl clients show ID` (and `subscriptions show ID`) on any node: the node holding the
    id (the clients bucket) is asked over NATS and its answer comes back with its name; the
    text form too; an id no node holds is 404."""
    n1, n2, _ = nodes
    far = mq(n2, name="far")
    far.subscribe(f"{pfx}/far/#", 1)
    got = n1.ctl_json("clients", "show", far.id)
    assert got["node"] == "n2" and got["client_id"] == far.id, got
    assert got["subscriptions"] == 1, got
    code, out, _ = n1.ctl("clients", "show", far.id)
    assert code == 0 and "n2" in out and far.id in out, out
    code, out, err = n1.ctl("clients", "show", "nobody-" + pfx)
    assert code != 0 and "no client" in (out + err), (out, err)
    # Every command about one client that says so in the command table asks the same way:
    # the rows as that node gives them, each with its name.
    subs = n1.ctl_json("subscriptions", "show", far.id)
    assert [(r["node"], r["client_id"], r["topic"]) for r in subs] == [
        ("n2", far.id, f"{pfx}/far/#")], subs
    code, out, _ = n1.ctl("subscriptions", "show", far.id)
    assert code == 0 and "n2" in out and f"{pfx}/far/#" in out, out


def moved_logs(old_node, new_node, cid):
    assert f"cluster.session_moved_out client={cid} " in old_node.read_log()
    assert f"cluster.session_moved_in client={cid} " in new_node.read_log()


@pytest.mark.parametrize("v5", [True, False], ids=["v5", "v311"])
def test_persistent_session_moves_under_a_qos1_stream(nodes, mq, pfx, v5):
    """A persistent session taken over on another node moves there (docs/CLUSTER.md, "Sessions
    that move"): QoS 1 streams from a publisher on each node, running across the move, reach
    the client: every message on the old connection or the new one, each publisher's in order
    on the new one and none twice there."""
    n1, n2, _ = nodes
    cid = f"mv-{pfx}-{'v5' if v5 else 'v3'}"
    kw = dict(v5=v5, cid=cid, clean=False, expiry=300 if v5 else 0)
    old = mq(n1, **kw)
    old.c.reconnect_delay_set(60, 60)  # taken over: it must not come back and take it back
    old.subscribe(f"{pfx}/mv/+", 1)
    pubs = [mq(n, name=f"p{i}") for i, n in enumerate(nodes)]
    for i, p in enumerate(pubs):
        await_route(p, f"{pfx}/mv/{i}", [old])
    per_pub = 400

    def stream(i, p):
        for k in range(per_pub):
            p.publish(f"{pfx}/mv/{i}", b"%d-%05d" % (i, k), qos=1, wait=False)
            time.sleep(0.003)
    threads = [threading.Thread(target=stream, args=(i, p)) for i, p in enumerate(pubs)]
    for t in threads:
        t.start()
    try:
        old.wait_count(60)  # the streams are under way
        new = mq(n2, **kw)
    finally:
        for t in threads:
            t.join()
    want = {b"%d-%05d" % (i, k) for i in range(len(pubs)) for k in range(per_pub)}
    until(lambda: want <= set(payloads(old)) | set(payloads(new)), WAIT,
          lambda: f"missing {sorted(want - set(payloads(old)) - set(payloads(new)))[:10]}\n"
          + n1.read_log()[-1500:] + n2.read_log()[-1500:])
    assert new.session_present
    # Ended (MQTT 5: DISCONNECT 0x8E first, but a client still sending PUBACKs may see the
    # reset that a close with its unread bytes makes, not the DISCONNECT before it).
    assert old.disconnects, "the old connection was not ended"
    got = payloads(new)
    twice = sorted({m for m in got if got.count(m) > 1})
    assert not twice, (f"twice on the new connection: {twice[:5]} (first of {len(got)}: "
                       f"{got[:3]}); " + " | ".join(
                           ln for ln in (n1.read_log() + n2.read_log()).splitlines()
                           if cid in ln and "cluster." in ln))
    for i in range(len(pubs)):
        seq = [int(m.split(b"-")[1]) for m in got if m.startswith(b"%d-" % i)]
        assert seq == sorted(seq), f"publisher {i} out of order on the new connection"
    moved_logs(n1, n2, cid)
    assert n2.ctl_json("cluster", "status")["sessions_moved_in"] >= 1
    assert n1.ctl_json("cluster", "status")["sessions_moved_out"] >= 1


def test_offline_session_moves_with_its_queue_and_pending_will(nodes, mq, pfx):
    """An offline session's queue moves in order; its delayed will moves with it and, as the
    client came back within the delay (MQTT 5 3.1.3.2.2), goes nowhere."""
    n1, n2, n3 = nodes
    cid = "mvq-" + pfx
    watcher = mq(n3, name="w")
    watcher.subscribe(f"{pfx}/will", 1)
    delay = 6  # the will's: long enough for the move to come first even on a loaded machine
    old = Mq(n1, cid=cid, clean=False, expiry=300, will=(f"{pfx}/will", b"gone", delay))
    old.subscribe(f"{pfx}/q", 1)
    keeper = mq(n1, name="keeper")  # sees what reaches n1, in the order the session does
    keeper.subscribe(f"{pfx}/q", 1)
    pub = mq(n3, name="pub")
    await_route(pub, f"{pfx}/q", [old, keeper])
    await_route(old, f"{pfx}/will", [watcher])
    old.c.loop_stop()
    old.c.socket().close()  # no DISCONNECT: the will waits for its delay
    closed = time.monotonic()
    n1.wait_offline(cid)
    for i in range(20):
        pub.publish(f"{pfx}/q", b"q%02d" % i, qos=1)
    keeper.wait_count(20)
    new = mq(n2, cid=cid, clean=False, expiry=300)
    assert time.monotonic() - closed < delay, "the test's premise: back before the will's delay"
    assert new.session_present
    new.wait_count(20)
    assert payloads(new) == [b"q%02d" % i for i in range(20)]
    moved_logs(n1, n2, cid)
    time.sleep(max(0.0, delay + 0.5 - (time.monotonic() - closed)))
    assert not watcher.msgs, "the will went out though its client came back in time"


def test_connect_answered_when_the_session_moving_in_ends_before_its_merge(nodes, mq, pfx):
    """Issue 30 (8): a CONNECT that takes a session from another node is answered once the
    session merged the rest (docs/CLUSTER.md, "Sessions that move"). If the session that moved
    in ends first, the CONNECT is answered all the same: it goes on with a new session
    (cluster.session_move_ended). The window: before asking the old holder for the rest, the
    new node waits up to 2 s for every node heard from in its heartbeats' last three periods
    to confirm the session's subscriptions; n3, stopped (SIGSTOP) just before, is such a node
    and stays silent, so the session that moved in to n2 can be killed meanwhile. A kill that
    came too late (the merge done: the session present, no such line) is tried again."""
    n1, n2, n3 = nodes
    for attempt in range(3):
        cid = f"mve-{pfx}-{attempt}"
        old = mq(n1, cid=cid, clean=False, v5=False)
        old.c.reconnect_delay_set(60, 60)  # taken over: it must not come back and take it back
        old.subscribe(f"{pfx}/e/{attempt}", 1)
        n3.proc.send_signal(signal.SIGSTOP)
        try:
            s = socket.create_connection(("127.0.0.1", n2.port), timeout=WAIT)
            s.sendall(mqtt311_connect(cid, clean=False))

            def moved_in():
                code, out, _ = n2.ctl("clients", "show", cid, json=True)
                got = json.loads(out) if code == 0 else {}
                return got.get("pid") if got.get("node", "n2") == "n2" else None
            pid = until(moved_in, WAIT, lambda: n2.read_log()[-2000:])
            code, out, err = n2.ctl("actors", "kill", str(pid))
        finally:
            n3.proc.send_signal(signal.SIGCONT)
        connack = b""
        while len(connack) < 4:
            chunk = s.recv(4 - len(connack))
            assert chunk, f"closed after {connack!r}: " + n2.read_log()[-2000:]
            connack += chunk
        s.close()
        ended = f"cluster.session_move_ended client={cid} " in n2.read_log()
        if code == 0 and ended:
            assert connack == b"\x20\x02\x00\x00", connack  # accepted, a new session
            return
        assert connack == b"\x20\x02\x01\x00", (connack, out, err)  # merged before the kill
    pytest.fail("three kills in a row came after the merge")


# ---- Durable mode (docs/CLUSTER.md "Durable mode"): nodes of their own, prefix "rd" ----


def test_kill9_of_a_node_sessions_resume_elsewhere_nothing_acknowledged_lost(durable_nodes, mq,
                                                                             pfx):
    """Durable mode: a QoS 1 PUBLISH is acknowledged once JetStream's stream has it, and a
    persistent session keeps a record in JetStream KV. kill -9 of the subscriber's node in the
    middle of a stream: the client fails over to another node, its session resumes there from
    the record, and the stream's replay brings every acknowledged message (at least once)."""
    d1, d2, d3 = durable_nodes
    cid = "k9-" + pfx
    old = mq(d1, cid=cid, clean=False, expiry=300)
    old.c.reconnect_delay_set(60, 60)  # its node is dead; the test fails it over itself
    old.subscribe(f"{pfx}/k", 1)
    pub = mq(d3, name="pub")
    await_route(pub, f"{pfx}/k", [old])
    infos, stop = [], threading.Event()

    def stream():
        for k in range(100000):
            if stop.is_set():
                return
            infos.append((b"%05d" % k, pub.publish(f"{pfx}/k", b"%05d" % k, qos=1, wait=False)))
            time.sleep(0.004)
    t = threading.Thread(target=stream)
    t.start()
    try:
        old.wait_count(100)
        d1.kill9()
        t_killed = time.monotonic()
        deadline = t_killed + WAIT
        while True:  # client-side failover: the next node, until it takes the session
            try:
                new = mq(d2, cid=cid, clean=False, expiry=300)
                break
            except BaseException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        new.wait_count(50)  # the stream goes on reaching the session on d2
    finally:
        stop.set()
        t.join()
    for _, info in infos:
        info.wait_for_publish(WAIT)
    acked = {p for p, info in infos if info.is_published()}
    assert len(acked) == len(infos)
    until(lambda: acked <= set(payloads(old)) | set(payloads(new)), WAIT,
          lambda: f"acknowledged, never delivered: "
          f"{sorted(acked - set(payloads(old)) - set(payloads(new)))[:10]}\n"
          + d2.read_log()[-2500:])
    assert new.session_present
    got = [int(p) for p in payloads(new)]
    assert got == sorted(got), "out of order on the new connection"
    assert f"cluster.session_replayed client={cid} from=d1" in d2.read_log()
    st = d2.ctl_json("cluster", "status")
    assert st["sessions_replayed"] >= 1 and st["stream_failed"] == 0
    assert d3.ctl_json("cluster", "status")["stream_acked"] >= len(acked)


def test_kill9_of_the_publishers_node_loses_nothing_acknowledged(durable_nodes, mq, pfx):
    """Durable mode, a crash between the hops: the publisher's node dies in the middle of a
    QoS 1 stream. What it acknowledged was in the stream, and so published on NATS: every
    acknowledged message reaches the subscriber on another node."""
    d1, d2, _ = durable_nodes
    sub = mq(d2, name="sub", clean=False, expiry=300)
    sub.subscribe(f"{pfx}/p", 1)
    pub = mq(d1, name="pub")
    pub.c.reconnect_delay_set(60, 60)
    await_route(pub, f"{pfx}/p", [sub])
    infos, stop = [], threading.Event()

    def stream():
        for k in range(100000):
            if stop.is_set() or not pub.c.is_connected():
                return  # its node is gone: paho refuses to queue more
            try:
                infos.append((b"%05d" % k, pub.publish(f"{pfx}/p", b"%05d" % k, qos=1,
                                                       wait=False)))
            except AssertionError:
                return
            time.sleep(0.002)
    t = threading.Thread(target=stream)
    t.start()
    try:
        sub.wait_count(200)
        d1.kill9()
    finally:
        stop.set()
        t.join()
    acked = {p for p, info in infos if info.is_published()}
    assert len(acked) >= 100
    until(lambda: acked <= set(payloads(sub)), WAIT,
          lambda: f"acknowledged, never delivered: {sorted(acked - set(payloads(sub)))[:10]}")
    got = [int(p) for p in payloads(sub)]
    assert got == sorted(got)


def test_nodes_and_rules_counted_cluster_wide(nodes, mq, pfx):
    """Each node hears the others' heartbeats: `cluster nodes` lists all three; a rule runs
    once per message, on the publisher's node, and `rules metrics` adds the cluster's sums."""
    n1, n2, n3 = nodes

    def archive(node):
        return next(r for r in node.ctl_json("rules", "metrics") if r["name"] == "archive")

    # A node another test stopped is "up" until 3 s pass without its heartbeat, then
    # "silent" for a minute.
    def up():
        return [n for n in n2.ctl_json("cluster", "nodes") if n["state"] == "up"]
    until(lambda: [n["node"] for n in up()] == ["n1", "n2", "n3"], WAIT, lambda: up())
    listed = up()
    assert [n["self"] for n in listed] == [False, True, False]
    assert all(n["heard_ms_ago"] < 5000 for n in listed), listed
    sub = mq(n2, name="sub")
    sub.subscribe(f"{pfx}/r/#", 1)
    pub = mq(n1, name="pub")
    await_route(pub, f"{pfx}/r/x", [sub])
    before = {n: archive(node)["matched"] for n, node in zip("123", nodes)}
    k = 25
    for i in range(k):
        pub.publish(f"{pfx}/r/{i}", b"r", qos=1)
    sub.wait_count(k)
    until(lambda: archive(n1)["matched"] - before["1"] >= k, WAIT, "n1's rule ran")
    assert archive(n1)["matched"] - before["1"] == k
    assert archive(n2)["matched"] == before["2"], "a rule ran again on the receiving node"

    def summed():
        local = sum(archive(node)["matched"] for node in nodes)
        return archive(n2)["cluster_matched"] == local and archive(n3)["cluster_matched"] == local
    until(summed, WAIT, lambda: f"{archive(n2)} {[archive(x)['matched'] for x in nodes]}")
    per_node = {(r["node"], r["rule"]): r for r in n3.ctl_json("cluster", "rules")}
    assert per_node[("n1", "archive")]["matched"] == archive(n1)["matched"]


def test_sys_names_the_node(nodes, mq):
    for i, node in enumerate(nodes):
        s = mq(node, name="sys")
        s.subscribe("$SYS/broker/node", 0)
        s.wait_count(1)
        assert s.msgs[0].payload == f"n{i + 1}".encode()


# ---- 10. A NATS server dies (last: it takes one away, and brings it back) ----

def test_nats_server_killed_and_nodes_reconnect(nats, nodes, mq, pfx):
    n1, n2, n3 = nodes
    subs = {name: mq(node, name=f"k{name}") for name, node in zip(("n1", "n2", "n3"), nodes)}
    for s in subs.values():
        s.subscribe(f"{pfx}/k/#", 1)
    pub1 = mq(n1, name="pub1")
    pub2 = mq(n2, name="pub2")
    await_route(pub1, f"{pfx}/k/a", [subs["n2"], subs["n3"]])
    await_route(pub2, f"{pfx}/k/b", [subs["n1"], subs["n3"]])

    victim, _ = nats.conn("rtd:n2:routes")
    assert victim is not None
    on_victim = {}  # node index: how many of its connections were on the victim
    for i in range(3):
        on_victim[i] = sum(1 for role in ("routes", "shared")
                           if nats.conn(f"rtd:n{i + 1}:{role}")[0] == victim)
    marks = [n.read_log().count("cluster.reconnected") for n in nodes]
    nats.kill9(victim)
    try:
        for i, node in enumerate(nodes):
            if on_victim[i]:
                until(lambda: node.read_log().count("cluster.reconnected") >=
                      marks[i] + on_victim[i], WAIT,
                      lambda: f"n{i + 1} did not log cluster.reconnected:\n"
                      + node.read_log()[-2000:])
        # Subscriptions made before the loss were made again on the new server.
        await_route(pub1, f"{pfx}/k/a", [subs["n2"], subs["n3"]])
        await_route(pub2, f"{pfx}/k/b", [subs["n1"], subs["n3"]])
        # And what is made now works too.
        fresh = mq(n2, name="fresh")
        fresh.subscribe(f"{pfx}/f", 1)
        await_route(mq(n3, name="pub3"), f"{pfx}/f", [fresh])
        # The buckets keep two of their three copies: retained messages still replicate.
        pub1.publish(f"{pfx}/k/ret", b"kept", qos=1, retain=True)
        late = mq(n3, name="late")
        late.subscribe(f"{pfx}/k/ret", 1)
        late.wait_count(1)
        assert payloads(late) == [b"kept"]
        pub1.publish(f"{pfx}/k/ret", b"", qos=1, retain=True)
        for i, node in enumerate(nodes):
            log = node.read_log()
            if on_victim[i]:
                assert "cluster.disconnected" in log, log[-2000:]
    finally:
        nats.start(victim)
        nats.wait_ready(range(3))

