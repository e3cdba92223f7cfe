"""Tenants (docs/TENANTS.md): a listener's mountpoint ("%u/", "%c/") or a login's answer (the
HTTP service's "mountpoint", a JWT's claim) puts a client's topics, filters and client id under
a prefix on the way in and takes it off on the way out, so that two tenants each subscribed to
"#" see nothing of each other (live messages, retained messages, $share groups, $exclusive
claims, wills, $delayed); a login that cannot be mounted is refused (0x87 / 5); each tenant's
quotas (connections, subscriptions, publish rate, retained bytes; live) refuse with 0x97 and
are counted in the metrics and `rtctl tenants list`; a bad mountpoint stops the start (exit 2).

Clients: paho-mqtt (3.1.1 and 5), mosquitto_pub / mosquitto_sub, and mqtt_raw where a reason
code must be read. What must not arrive is shown by a marker published after it, once the
message that must not arrive was seen routed elsewhere (an unmounted observer got it): a
subscriber's messages keep the order they were routed in, so the marker coming first means
the other never comes."""
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCodes

from conftest import (ROOT, RTD, Rtd, free_port, metric_samples, password_file, reply_json,
                      wait_for)
from mqtt_raw import (DISCONNECT, PUBACK, PUBLISH, UNSUBACK, UNSUBSCRIBE, Raw,
                      mqtt_str, prop_u32, u16, varint)
from transports import listeners, wait_log

NOT_AUTHORIZED, QUOTA_EXCEEDED, TAKEN_OVER = 0x87, 0x97, 0x8E
ACCEPTED = (0, 0x10)  # a PUBACK's success, or 0x10: no matching subscribers
V3_NOT_AUTHORIZED, V3_UNAVAILABLE, V3_SUB_FAILURE = 5, 3, 0x80
PW = "tenant-pw"
WAIT = 10  # s: what a message on loopback may take on a busy machine
KEEP_SESSION = prop_u32(0x11, 300)  # Session Expiry Interval, s


# ---- clients ----

def paho(port, client_id, user=None, v5=False, will=None):
    """A connected paho client (3.1.1, or 5) that records what it gets in .got as
    (topic, payload); will is (topic, payload, qos)."""
    if v5:
        c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv5)
    else:
        c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv311, clean_session=True)
    if user is not None:
        c.username_pw_set(user, PW)
    if will:
        c.will_set(*will)
    c.got = []
    lock = threading.Lock()
    answered, codes = threading.Event(), []

    def on_connect(_c, _u, _flags, rc, _props=None):
        codes.append(rc)
        answered.set()

    def on_message(_c, _u, msg):
        with lock:
            c.got.append((msg.topic, msg.payload))

    c.on_connect, c.on_message = on_connect, on_message
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    assert answered.wait(WAIT), f"{client_id}: no CONNACK"
    assert codes[0] == 0, (client_id, codes)
    return c


def psub(c, topic_filter, qos=1):
    done = threading.Event()
    c.on_subscribe = lambda *a: done.set()
    c.subscribe(topic_filter, qos)
    assert done.wait(WAIT), f"no SUBACK for {topic_filter}"


def send(c, topic, payload, retain=False):
    """A QoS 1 PUBLISH from a paho client, returned once PUBACKed."""
    info = c.publish(topic, payload, qos=1, retain=retain)
    info.wait_for_publish(timeout=WAIT)
    assert info.is_published(), topic


def got(c, item):
    return wait_for(lambda: item in list(c.got), timeout=WAIT)


def paho_end(*clients):
    for c in clients:
        c.disconnect()
        c.loop_stop()


def puback(c, topic, payload=b"x", pid=1, qos=1, retain=False):
    """A PUBLISH from a raw client; for QoS 1 its PUBACK's reason code (0 when a 3.1.1 PUBACK
    has none), PUBLISHes arriving before it put aside in c.early."""
    body = mqtt_str(topic) + (u16(pid) if qos else b"") + (varint(0) if c.version == 5 else b"")
    c.send((PUBLISH << 4) | (qos << 1) | (1 if retain else 0), body + payload)
    if not qos:
        return None
    while True:
        p = c.read(WAIT)
        assert p is not None, f"no PUBACK for {topic}"
        if p.type == PUBLISH:
            m = c.publish_fields(p)
            if m["qos"] == 1:
                c.ack(PUBACK, m["pid"])
            c.__dict__.setdefault("early", []).append(m)
            continue
        assert p.type == PUBACK and p.body[:2] == u16(pid), p
        if c.version == 4:
            assert len(p.body) == 2, p  # 3.1.1 has no reason code
        return p.body[2] if len(p.body) > 2 else 0


def suback(c, topic_filter, qos=1, pid=1):
    return c.subscribe(topic_filter, qos=qos, pid=pid).body[-1]


def until_markers(c, *markers):
    """(topic, payload, retain) of each PUBLISH a raw client gets (those put aside while it
    waited for a PUBACK first) until every marker payload came, markers left out; each
    acknowledged as its QoS asks."""
    pending, out = set(markers), []
    early = c.__dict__.pop("early", [])
    while pending:
        if early:
            m = early.pop(0)
        else:
            p = c.read(WAIT)
            assert p is not None, f"no marker {pending} after {out}"
            assert p.type == PUBLISH, p
            m = c.publish_fields(p)
            if m["qos"] == 1:
                c.ack(PUBACK, m["pid"])
        if m["payload"] in pending:
            pending.discard(m["payload"])
        else:
            out.append((m["topic"], m["payload"], m["retain"]))
    return out


# ---- rtd's figures ----

def tenant_metric(broker, name, tenant, **labels):
    """A sample of the HTTP listener's /metrics (rtd writes the tenant label first)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.hport}/metrics", timeout=WAIT) as r:
        samples = metric_samples(r.read().decode())
    text = ",".join(f'{k}="{v}"' for k, v in {"tenant": tenant, **labels}.items())
    return samples.get((name, "{" + text + "}"))


def tenant_row(broker, mount):
    """`rtctl tenants list`: the figures of the line starting with mount, as {key: value}
    (key=value tokens; or columns named by a header line)."""
    code, out, err = broker.ctl("tenants", "list")
    assert code == 0, (out, err)
    lines = [ln.split() for ln in out.splitlines() if ln.strip()]
    for words in lines:
        if words[0] == mount:
            kv = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            if not kv:
                header = next(h for h in lines if "connections" in h)
                kv = dict(zip(header, words))
            return kv
    return None


# ---- the broker most tests share: users alice, bob, carol, dora, emil, frank, "eve/x" ----

ACL = ("topic readwrite #\n"  # anonymous: the unmounted observers and %c clients
       + "".join(f"user {u}\ntopic readwrite #\n" for u in ("alice", "bob", "carol", "dora",
                                                              "emil"))
       + "user frank\ntopic readwrite own/#\n")


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    """rtd with a plain listener (.port, unmounted), one mounted at "%u/" (.mport) and one at
    "%c/" (.cport), a password file and an ACL."""
    d = tmp_path_factory.mktemp("tenants")
    pw = password_file(d / "pw", {u: PW for u in ("alice", "bob", "carol", "dora", "emil",
                                                  "frank", "eve/x")})
    (d / "acl").write_text(ACL)
    port, mport, cport = free_port(), free_port(), free_port()
    broker = Rtd(listeners(port, {"bind": f"127.0.0.1:{mport}", "mountpoint": "%u/"},
                           {"bind": f"127.0.0.1:{cport}", "mountpoint": "%c/"}),
                 f'password_file="{pw}"', f'acl_file="{d / "acl"}"', port=port)
    broker.mport, broker.cport = mport, cport
    yield broker
    code, log = broker.stop()
    assert code == 0, log[-3000:]


def test_two_tenants_see_nothing_of_each_other(tenants):
    b = tenants
    obs = paho(b.port, "observer")  # unmounted: sees every tenant under its prefix
    psub(obs, "alice/#")
    psub(obs, "bob/#")
    alice = paho(b.mport, "a-1", "alice", v5=True)
    bob = paho(b.mport, "b-1", "bob")
    psub(alice, "#")
    psub(bob, "#")
    try:
        send(alice, "news", b"from alice")
        send(bob, "news", b"from bob")
        send(alice, "state", b"alice-r", retain=True)
        send(bob, "state", b"bob-r", retain=True)
        send(alice, "$delayed/0/later", b"delayed")  # delayed to alice/later
        w = paho(b.mport, "a-will", "alice", v5=True, will=("status/gone", b"bye", 1))
        w.disconnect(reasoncode=ReasonCodes(PacketTypes.DISCONNECT, identifier=4))  # with will
        w.loop_stop()
        # Prefixed on the way in: the unmounted observer sees where each went.
        for item in (("alice/news", b"from alice"), ("bob/news", b"from bob"),
                     ("alice/state", b"alice-r"), ("bob/state", b"bob-r"),
                     ("alice/later", b"delayed"), ("alice/status/gone", b"bye")):
            assert got(obs, item), (item, obs.got)
        # Everything above is routed: markers behind it, into each tenant.
        send(obs, "alice/mark", b"m1")
        send(obs, "bob/mark", b"m1")
        assert got(alice, ("mark", b"m1")) and got(bob, ("mark", b"m1"))
        # Stripped on the way out, and nothing of the other tenant.
        assert sorted(alice.got) == sorted([("news", b"from alice"), ("state", b"alice-r"),
                                            ("later", b"delayed"), ("status/gone", b"bye"),
                                            ("mark", b"m1")]), alice.got
        assert sorted(bob.got) == sorted([("news", b"from bob"), ("state", b"bob-r"),
                                          ("mark", b"m1")]), bob.got

        # Retained messages: the store holds both, each tenant is given its own.
        whole = Raw(b.port, "obs-retained", version=4)
        assert suback(whole, "+/state") == 1
        held = sorted((m["topic"], m["payload"], m["retain"])
                      for m in (whole.next_publish(WAIT), whole.next_publish(WAIT)))
        assert held == [("alice/state", b"alice-r", 1), ("bob/state", b"bob-r", 1)]
        late = Raw(b.mport, "b-late", version=4, username="bob", password=PW)
        assert late.connack_code == 0
        assert suback(late, "#") == 1  # its retained messages are queued with the SUBACK
        send(obs, "bob/mark", b"m2")
        assert until_markers(late, b"m2") == [("state", b"bob-r", 1)]

        # $share groups: one per tenant, though both name group g and filter jobs/#.
        sa = Raw(b.mport, "a-sh", username="alice", password=PW)
        sb = Raw(b.mport, "b-sh", version=4, username="bob", password=PW)
        assert suback(sa, "$share/g/jobs/#") == 1 and suback(sb, "$share/g/jobs/#") == 1
        for i in range(3):
            send(alice, f"jobs/{i}", b"job %d" % i)
        jobs = [sa.next_publish(WAIT) for _ in range(3)]  # a group of one: it takes them all
        for m in jobs:
            sa.ack(PUBACK, m["pid"])
        assert sorted((m["topic"], m["payload"]) for m in jobs) == \
            [(f"jobs/{i}", b"job %d" % i) for i in range(3)]
        send(obs, "bob/jobs/mark", b"m3")  # reaches bob's group, after alice's jobs
        assert until_markers(sb, b"m3") == []

        # $exclusive claims: per tenant too.
        ea, eb = (Raw(b.mport, f"{u}-ex", username=u, password=PW) for u in ("alice", "bob"))
        assert suback(ea, "$exclusive/lock") == 1
        assert suback(eb, "$exclusive/lock") == 1  # bob/lock, not alice/lock
        ea2 = Raw(b.mport, "alice-ex2", username="alice", password=PW)
        assert suback(ea2, "$exclusive/lock") == QUOTA_EXCEEDED  # alice's own tenant: taken
        # alice's subscriptions: #, $share/g/jobs/# and lock; the refused one is not counted
        assert tenant_row(b, "alice/")["subscriptions"] == "3", tenant_row(b, "alice/")
        for c in (whole, late, sa, sb, ea, eb, ea2):
            c.disconnect()
    finally:
        paho_end(obs, alice, bob)


def test_client_ids_are_per_tenant(tenants):
    """Client id "dev" of dora and of emil are two sessions: neither takes the other over;
    within one tenant the id takes its session over as ever."""
    b = tenants
    obs = Raw(b.port, "obs-ids")
    dora = Raw(b.mport, "dev", username="dora", password=PW, clean=False, props=KEEP_SESSION)
    emil = Raw(b.mport, "dev", username="emil", password=PW, clean=False, props=KEEP_SESSION)
    assert (dora.connack_code, dora.session_present) == (0, 0)
    assert (emil.connack_code, emil.session_present) == (0, 0)
    assert suback(dora, "inbox") == 1 and suback(emil, "inbox") == 1  # both still served
    for u in ("dora", "emil"):
        assert puback(obs, f"{u}/inbox", f"for {u}".encode()) == 0
    for c, u in ((dora, "dora"), (emil, "emil")):
        m = c.next_publish(WAIT)
        assert (m["topic"], m["payload"]) == ("inbox", f"for {u}".encode())
        c.ack(PUBACK, m["pid"])  # else the session sends it again after the takeover
    rows = {r["client_id"]: r for r in b.ctl_json("clients", "list")}
    assert rows["dora/dev"]["state"] == "connected" and rows["emil/dev"]["state"] == "connected"
    assert "dev" not in rows
    assert wait_for(lambda: (tenant_row(b, "dora/") or {}).get("connections") == "1"), \
        b.ctl("tenants", "list")
    assert tenant_row(b, "emil/")["connections"] == "1"

    # dora's second "dev" takes dora's session over (its subscription with it); emil's stays.
    again = Raw(b.mport, "dev", username="dora", password=PW, clean=False, props=KEEP_SESSION)
    assert (again.connack_code, again.session_present) == (0, 1)
    p = dora.read(WAIT)
    assert p is not None and p.type == DISCONNECT and p.body[0] == TAKEN_OVER, p
    assert puback(obs, "emil/inbox", b"emil again") == 0
    assert puback(obs, "dora/inbox", b"dora again") == 0
    assert emil.next_publish(WAIT)["payload"] == b"emil again"
    assert again.next_publish(WAIT)["payload"] == b"dora again"
    for c in (obs, emil, again):
        c.disconnect()


def test_logins_that_cannot_be_mounted_are_refused_and_the_acl_sees_the_clients_view(tenants):
    b = tenants
    before = b.read_log().count("client.mount_refused")
    # Each refusal from an address of its own: a refusal slows its address's next login.
    for version, want in ((5, NOT_AUTHORIZED), (4, V3_NOT_AUTHORIZED)):
        anon = Raw(b.mport, f"anon-{version}", version=version, bind=f"127.0.0.{40 + version}")
        assert anon.connack_code == want, version  # no user name for %u
        anon.close()
    eve = Raw(b.mport, "e-1", username="eve/x", password=PW, bind="127.0.0.46")
    assert eve.connack_code == NOT_AUTHORIZED  # "eve/x/" would be inside tenant "eve/"
    eve.close()
    for i, cid in enumerate(("a/b", "a+b", "a#b")):
        r = Raw(b.cport, cid, bind=f"127.0.0.{50 + i}")
        assert r.connack_code == NOT_AUTHORIZED, cid
        r.close()
    assert wait_for(lambda: b.read_log().count("client.mount_refused") - before >= 6), \
        b.read_log()[-3000:]

    # %c: the client id as sent.
    obs = paho(b.port, "obs-c")
    psub(obs, "k1/#")
    psub(obs, "frank/#")
    k1 = paho(b.cport, "k1", v5=True)
    psub(k1, "#")
    try:
        send(k1, "t", b"from k1")
        assert got(obs, ("k1/t", b"from k1")) and got(k1, ("t", b"from k1"))
        rows = {r["client_id"] for r in b.ctl_json("clients", "list")}
        assert "k1/k1" in rows, rows

        # frank's ACL grants own/#: it judges his own view, not frank/own/...
        frank = Raw(b.mport, "f-1", username="frank", password=PW)
        assert frank.connack_code == 0
        assert puback(frank, "own/1", b"granted") == 0
        assert puback(frank, "frank/own/1", b"refused", pid=2) == NOT_AUTHORIZED
        assert got(obs, ("frank/own/1", b"granted"))
        assert suback(frank, "own/#") == 1
        assert suback(frank, "frank/own/#", pid=2) == NOT_AUTHORIZED
        assert ("frank/frank/own/1", b"refused") not in obs.got
        frank.disconnect()
    finally:
        paho_end(obs, k1)


def test_mosquitto_clients_in_one_tenant(tenants):
    b = tenants
    obs = paho(b.port, "obs-carol")
    psub(obs, "carol/#")
    base = ["-h", "127.0.0.1", "-p", str(b.mport), "-u", "carol", "-P", PW]
    sub = None
    try:
        p = subprocess.run(["mosquitto_pub", *base, "-V", "mqttv311", "-q", "1", "-r",
                            "-t", "status", "-m", "ready"], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 0, p.stderr
        assert got(obs, ("carol/status", b"ready"))
        sub = subprocess.Popen(["mosquitto_sub", *base, "-V", "mqttv5", "-q", "1", "-t", "#",
                                "-v", "-C", "2", "-W", "30"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(ln.rstrip("\n")) for ln in sub.stdout],
                         daemon=True).start()
        # The retained message, stripped: also the sign that its subscription is in place.
        assert lines.get(timeout=30) == "status ready"
        p = subprocess.run(["mosquitto_pub", *base, "-V", "mqttv5", "-q", "1",
                            "-t", "sensors/t1", "-m", "21.5"], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 0, p.stderr
        assert lines.get(timeout=30) == "sensors/t1 21.5"
        assert sub.wait(timeout=30) == 0, sub.stderr.read()
        assert got(obs, ("carol/sensors/t1", b"21.5"))
    finally:
        if sub is not None and sub.poll() is None:
            sub.kill()
            sub.wait()
        paho_end(obs)


# ---- quotas ----

def set_conf(broker, key, value):
    code, out, err = broker.ctl("config", "set", key, str(value))
    assert code == 0, (key, value, out, err)


def test_tenant_quotas(tmp_path, stopper):
    pw = password_file(tmp_path / "pw", {"t1": PW, "t2": PW})
    port, mport, hport = free_port(), free_port(), free_port()
    b = Rtd(listeners(port, {"bind": f"127.0.0.1:{mport}", "mountpoint": "%u/"}),
            f'password_file="{pw}"', f'http={{bind="127.0.0.1:{hport}", metrics_public=true}}',
            port=port)
    stopper(b)
    b.hport = hport

    def t1(cid, version=5, **kw):
        c = Raw(mport, cid, version=version, username="t1", password=PW, **kw)
        return c

    def metric(name, tenant="t1/", **labels):
        return tenant_metric(b, name, tenant, **labels)

    # Connections: two at once.
    set_conf(b, "tenant_max_connections", 2)
    c1, c2 = t1("c1"), t1("c2")
    assert c1.connack_code == 0 and c2.connack_code == 0
    assert t1("c3", bind="127.0.0.2").connack_code == QUOTA_EXCEEDED
    assert t1("c4", version=4, bind="127.0.0.3").connack_code == V3_UNAVAILABLE
    other = Raw(mport, "c1", username="t2", password=PW)  # another tenant: its own count
    assert other.connack_code == 0
    assert metric("rt_tenant_connections") == 2
    assert metric("rt_tenant_refused_total", quota="connections") == 2
    assert metric("rt_tenant_connections", "t2/") == 1
    c1.disconnect()
    assert wait_for(lambda: metric("rt_tenant_connections") == 1, timeout=WAIT)
    c5 = t1("c5", version=4)
    assert c5.connack_code == 0  # room again
    set_conf(b, "tenant_max_connections", 0)

    # Subscriptions: three held by the tenant's sessions together.
    set_conf(b, "tenant_max_subscriptions", 3)
    assert suback(c2, "a") == 1 and suback(c2, "b", pid=2) == 1
    assert suback(c5, "c") == 1
    assert suback(c2, "d", pid=3) == QUOTA_EXCEEDED
    assert suback(c5, "e", pid=2) == V3_SUB_FAILURE
    assert metric("rt_tenant_subscriptions") == 3
    # t2 has three of its own while t1 is at its limit.
    assert [suback(other, f"t2-{i}", pid=i + 1) for i in range(3)] == [1, 1, 1]
    c2.send((UNSUBSCRIBE << 4) | 2, u16(4) + varint(0) + mqtt_str("b"))
    assert c2.expect(UNSUBACK).body[-1] == 0
    assert wait_for(lambda: metric("rt_tenant_subscriptions") == 2, timeout=WAIT)
    assert suback(c2, "d", pid=5) == 1
    assert metric("rt_tenant_refused_total", quota="subscriptions") == 2
    set_conf(b, "tenant_max_subscriptions", 0)

    # Publish rate: 5 a second for the tenant, a second's worth at once.
    rs = t1("rate-sub")
    assert suback(rs, "rate/#") == 1
    p5, p3 = t1("p5"), t1("p3", version=4)
    set_conf(b, "tenant_max_publish_rate", 5)
    t0 = time.monotonic()
    codes = [puback(p5, f"rate/q1/{i}", b"v5-%d" % i, pid=i + 1) for i in range(20)]
    v3_acked = [puback(p3, f"rate/v3/{i}", b"v3-%d" % i, pid=i + 1) for i in range(20)]
    for i in range(20):
        puback(p5, f"rate/q0/{i}", b"q0-%d" % i, qos=0)
    probe = puback(p5, "rate/probe", b"probe", pid=100)  # behind the QoS 0 ones: all read
    elapsed = time.monotonic() - t0
    set_conf(b, "tenant_max_publish_rate", 0)
    assert puback(p5, "rate/end", b"end5", pid=101) == 0
    assert puback(p3, "rate/end", b"end3", pid=101) == 0
    assert set(codes + [probe]) <= {0, QUOTA_EXCEEDED}, codes
    assert v3_acked == [0] * 20  # 3.1.1: a normal PUBACK, the message dropped
    delivered = until_markers(rs, b"end5", b"end3")
    payloads = [p for _, p, _ in delivered]
    accepted_v5 = [b"v5-%d" % i for i, code in enumerate(codes) if code == 0]
    assert [p for p in payloads if p.startswith(b"v5-")] == accepted_v5  # just those
    assert QUOTA_EXCEEDED in codes, codes
    # At most a second's worth at once, then 5 a second.
    assert len(payloads) <= 5 + 5 * elapsed + 1, (len(payloads), elapsed, payloads)
    assert len([p for p in payloads if p.startswith(b"q0-")]) < 20  # QoS 0: dropped
    assert len([p for p in payloads if p.startswith(b"v3-")]) < 20
    sent = 20 + 20 + 20 + 1
    assert metric("rt_tenant_refused_total", quota="publish_rate") == sent - len(payloads)
    assert metric("rt_tenant_messages_in_total") >= len(payloads)
    assert metric("rt_tenant_messages_out_total") >= len(delivered)
    # ... and a second's worth at once: the first five pass.
    assert codes[:5] == [0] * 5 and len(payloads) >= 5, (codes, payloads)

    # Retained bytes: two of 30 bytes fit under 100, a third does not.
    set_conf(b, "tenant_max_retained_bytes", 100)
    pr = t1("pr")
    assert puback(pr, "ret/1", b"x" * 30, retain=True) in ACCEPTED
    assert puback(pr, "ret/2", b"y" * 30, pid=2, retain=True) in ACCEPTED
    assert puback(pr, "ret/3", b"z" * 30, pid=3, retain=True) == QUOTA_EXCEEDED
    assert 60 <= metric("rt_tenant_retained_bytes") <= 100
    assert puback(other, "ret/1", b"w" * 30, retain=True) in ACCEPTED  # t2's own quota
    late = t1("late")
    assert suback(late, "ret/#") == 1
    assert puback(late, "ret/mark", b"m-ret", pid=2) == 0  # behind its retained messages
    kept = sorted(until_markers(late, b"m-ret"))
    assert kept == [("ret/1", b"x" * 30, 1), ("ret/2", b"y" * 30, 1)], kept
    assert puback(pr, "ret/1", b"", pid=4, retain=True) in ACCEPTED  # a delete frees bytes
    assert wait_for(lambda: metric("rt_tenant_retained_bytes") < 60, timeout=WAIT)
    assert puback(pr, "ret/3", b"z" * 30, pid=5, retain=True) in ACCEPTED
    assert metric("rt_tenant_refused_total", quota="retained_bytes") == 1
    for quota in ("connections", "subscriptions", "publish_rate", "retained_bytes"):
        assert metric("rt_tenant_refused_total", "t2/", quota=quota) in (0, None)
        assert re.search(rf"event=client\.tenant_quota .*quota={quota}\b", b.read_log()), quota

    # rtctl tenants list: each tenant, its mountpoint first.
    row = tenant_row(b, "t1/")
    assert row is not None and row["connections"] == str(int(metric("rt_tenant_connections")))
    assert tenant_row(b, "t2/")["connections"] == "1"
    code, out, err = b.ctl("tenants", "list", json=True)
    assert code == 0, err
    t1_row = [t for t in json.loads(out) if t["tenant"] == "t1/"][0]
    # the quotas in force: the settings, each set back to 0 (none) above but this one
    assert (t1_row["max_connections"], t1_row["max_subscriptions"], t1_row["max_publish_rate"],
            t1_row["max_retained_bytes"]) == (0, 0, 0, 100), t1_row


NODE_DIR = os.path.join(ROOT, "tests", "node")


@pytest.mark.skipif(
    not shutil.which("node") or not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "mqtt")),
    reason="MQTT.js not installed (tools/install-deps.sh runs npm ci)")
def test_mqttjs_clients_of_two_tenants(tenants):
    """MQTT.js 5 as alice and bob on the %u/ listener, with the same client id: each subscribes
    to js/# (the shared broker holds the other tests' retained messages) and publishes to the
    same topic; each gets its own message only, its topic stripped, and then a marker that the
    observer published into its tenant after both messages were routed."""
    b = tenants
    obs = paho(b.port, "js-observer")
    psub(obs, "alice/#")
    psub(obs, "bob/#")
    script = r"""
const mqtt = require('mqtt');
const [port, pw] = process.argv.slice(1);
const limit = setTimeout(() => { console.error('timeout'); process.exit(1); }, 60000);
const got = {alice: [], bob: []};
const clients = {};
let subscribed = 0, done = 0;
for (const u of ['alice', 'bob']) {
  const c = mqtt.connect(`mqtt://127.0.0.1:${port}`,
                         {protocolVersion: 5, clientId: 'js', username: u, password: pw});
  clients[u] = c;
  c.on('message', (t, p) => {
    got[u].push([t, p.toString()]);
    if (p.toString() == 'mark' && ++done == 2) {
      console.log(JSON.stringify(got)); clearTimeout(limit); c.end(); clients.alice.end();
      clients.bob.end();
    }
  });
  c.on('connect', () => c.subscribe('js/#', {qos: 1}, () => {
    if (++subscribed == 2)
      for (const v of ['alice', 'bob']) clients[v].publish('js/topic', 'from ' + v, {qos: 1});
  }));
}
"""
    p = subprocess.Popen(["node", "-e", script, str(b.mport), PW],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, NODE_PATH=os.path.join(NODE_DIR, "node_modules")))
    try:
        # Both messages routed (the observer saw them), then a marker into each tenant.
        for item in (("alice/js/topic", b"from alice"), ("bob/js/topic", b"from bob")):
            # node starts, connects and subscribes first: bounded by the script's own limit
            assert wait_for(lambda: item in list(obs.got), timeout=60), obs.got
        send(obs, "alice/js/mark", b"mark")
        send(obs, "bob/js/mark", b"mark")
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        assert json.loads(out) == {"alice": [["js/topic", "from alice"], ["js/mark", "mark"]],
                                   "bob": [["js/topic", "from bob"], ["js/mark", "mark"]]}
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        paho_end(obs)


# ---- the login's answer names the mountpoint ----

SECRET = b"s3cret-that-is-long-enough-for-hs256-0123456789"


class Service:
    """A login service: acme-* are allowed under mountpoint acme/, watch and plain-* with none
    (the listener's), bad-* and wild-* with a mountpoint that is none."""

    def __init__(self):
        svc = self
        self.requests = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                svc.requests.append(body)
                user = body.get("username") or ""
                answer = {"result": "allow"}
                if user.startswith("acme-"):
                    answer["mountpoint"] = "acme/"
                elif user.startswith("bad-"):
                    answer["mountpoint"] = "acme"  # no trailing /
                elif user.startswith("wild-"):
                    answer["mountpoint"] = "acme/+/"
                elif not (user == "watch" or user.startswith("plain-")):
                    answer = {"result": "deny"}
                reply_json(self, answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_logins_answer_names_the_mountpoint(tmp_path, stopper):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    svc = Service()
    try:
        port, mport = free_port(), free_port()
        b = Rtd(listeners(port, {"bind": f"127.0.0.1:{mport}", "mountpoint": "%u/"}),
                "allow_anonymous=false",
                f'auth={{ {{ kind = "jwt", secret_file = "{secret}" }}, '
                f'{{ kind = "http", url = "http://127.0.0.1:{svc.port}/auth" }} }}',
                port=port)
        stopper(b)
        watch = paho(b.port, "watch", "watch")  # no mountpoint in its answer: unmounted
        psub(watch, "#")
        acme1 = paho(mport, "acme-c1", "acme-1", v5=True)
        psub(acme1, "#")
        acme2 = paho(mport, "acme-c2", "acme-2")
        plain = paho(mport, "plain-c1", "plain-1")
        tok = jwt.encode({"exp": int(time.time()) + 3600, "mountpoint": "jwt-t/"}, SECRET,
                         algorithm="HS256")
        jw = Raw(mport, "jwt-c1", username="jwt-user", password=tok)
        try:
            assert jw.connack_code == 0
            send(acme2, "hello", b"from acme-2")  # acme/, not acme-2/: acme-1 shares it
            send(plain, "x", b"from plain-1")  # the listener's %u/
            assert puback(jw, "y", b"from the token") == 0
            for item in (("acme/hello", b"from acme-2"), ("plain-1/x", b"from plain-1"),
                         ("jwt-t/y", b"from the token")):
                assert got(watch, item), (item, watch.got)
            send(watch, "acme/mark", b"m")
            assert got(acme1, ("mark", b"m"))
            assert acme1.got == [("hello", b"from acme-2"), ("mark", b"m")], acme1.got
            ids = {r["client_id"] for r in b.ctl_json("clients", "list")}
            assert {"acme/acme-c1", "acme/acme-c2", "plain-1/plain-c1", "jwt-t/jwt-c1"} <= ids
        finally:
            paho_end(watch, acme1, acme2, plain)
            jw.close()
        # An answer whose mountpoint is none refuses the login, as the listener's would.
        for i, user in enumerate(("bad-1", "wild-1")):
            r = Raw(mport, f"r{i}", username=user, password="pw", bind=f"127.0.0.{60 + i}")
            assert r.connack_code == NOT_AUTHORIZED, user
            r.close()
        bad = jwt.encode({"exp": int(time.time()) + 3600, "mountpoint": "jwt#/"}, SECRET,
                         algorithm="HS256")
        r = Raw(mport, "r3", username="jwt-user", password=bad, bind="127.0.0.63")
        assert r.connack_code == NOT_AUTHORIZED
        r.close()
        wait_log(b, r"event=client\.mount_refused", count=3, timeout=WAIT)
    finally:
        svc.stop()


# ---- a bad mountpoint stops the start ----

@pytest.mark.parametrize("mount", ["acme", "acme/+/", "#/", "%u+/"])
def test_a_mountpoint_that_is_none_stops_the_start(tmp_path, mount):
    setting = listeners(free_port(), {"bind": f"127.0.0.1:{free_port()}", "mountpoint": mount})
    r = subprocess.run([RTD, "-c", f"{ROOT}/etc/rtd.conf", "-o", f'data_dir="{tmp_path}/data"',
                        "-o", setting], capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-2000:]
    assert "listeners[2].mountpoint" in out, out[-2000:]
    assert "listener.started" not in out


def test_a_tenants_own_quotas(tmp_path, stopper):
    """tenants = { ["t2/"] = {...} }: t2's own limits in place of tenant_max_*, which t1
    keeps; a key left out (-1) takes the setting."""
    pw = password_file(tmp_path / "pw", {"t1": PW, "t2": PW})
    port, mport = free_port(), free_port()
    b = Rtd(listeners(port, {"bind": f"127.0.0.1:{mport}", "mountpoint": "%u/"}),
            f'password_file="{pw}"', "tenant_max_connections=3", "tenant_max_subscriptions=1",
            'tenants={["t2/"]={max_connections=1}}', port=port)
    stopper(b)

    def login(user, cid, bind=None):
        return Raw(mport, cid, username=user, password=PW, bind=bind)

    t2 = login("t2", "a")
    assert t2.connack_code == 0
    assert login("t2", "b", bind="127.0.0.2").connack_code == QUOTA_EXCEEDED  # its own: 1
    t1 = [login("t1", f"c{i}", bind=f"127.0.0.{i + 1}") for i in range(3)]
    assert [c.connack_code for c in t1] == [0, 0, 0]  # tenant_max_connections: 3
    assert login("t1", "c4", bind="127.0.0.5").connack_code == QUOTA_EXCEEDED
    # Subscriptions: t2 set none of its own, so tenant_max_subscriptions holds it too.
    assert suback(t2, "x") == 1 and suback(t2, "y", pid=2) == QUOTA_EXCEEDED
    code, out, _ = b.ctl("config", "show")
    assert code == 0 and "tenants.t2/.max_connections" in out, out[-3000:]
    code, out, _ = b.ctl("tenants", "list", json=True)
    limits = {t["tenant"]: (t["max_connections"], t["max_subscriptions"]) for t in json.loads(out)}
    assert limits == {"t1/": (3, 1), "t2/": (1, 1)}, limits  # t2's own, and the settings
    for c in t1 + [t2]:
        c.disconnect()


@pytest.mark.parametrize("table", ['{["acme"]={max_connections=1}}',
                                   '{["a/+/"]={max_connections=1}}',
                                   '{["acme/"]={max_connections=-2}}',
                                   '{["acme/"]={max_sessions=1}}'])
def test_a_tenants_table_that_is_none_stops_the_start(tmp_path, table):
    r = subprocess.run([RTD, "-c", f"{ROOT}/etc/rtd.conf", "-o", f'data_dir="{tmp_path}/data"',
                        "-o", f"tenants={table}"], capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-2000:]
    assert "tenants" in out and "listener.started" not in out, out[-2000:]
