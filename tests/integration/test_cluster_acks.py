"""What an acknowledgement means in a cluster when NATS falters (docs/CLUSTER.md, "Durable
mode", "Guarantees", "Securing NATS"): in durable mode a PUBACK is sent only once JetStream's
stream (or, for a retained message, its bucket) confirmed the message; without that word an
MQTT 5 publisher gets 0x80 and an MQTT 3.1.1 one is disconnected so that it sends again.
A NATS server that stops answering is left within RT_CLUSTER_STALE_MS; a session that moves
away answers the copies it was sent; the NATS connection signs in, says what NATS refused and
keeps trying.

The publishers here are raw sockets (mqtt_raw), because paho does not show a PUBACK's reason
code: each keeps a window of unacknowledged QoS 1 PUBLISHes and records every answer. Every
test that stops or kills a nats-server starts it again before it ends; the NATS cluster is
this module's own. Processes are stopped by the PIDs started here, never by name.
"""
import datetime
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request

import pytest

from cluster_harness import (NATS_SERVER, WAIT, await_route, cluster_option,  # noqa: F401
                             durable_nodes, fence, mq, nats, nodes, payloads, pfx, until)
from conftest import Rtd, free_port
from mqtt_raw import (DISCONNECT, P_RECEIVE_MAXIMUM, P_SESSION_EXPIRY, PUBACK, PUBLISH, Raw,
                      mqtt_str, prop_u32, u16, varint)

# actors/cluster/cluster.h: a server that stops answering is noticed within
# RT_CLUSTER_STALE_MS (two unanswered PINGs, one a second) of its last answer, and a server
# that takes the TCP connection and says nothing costs RT_CLUSTER_CONNECT_WAIT_MS.
STALE_S = 3.0
CONNECT_WAIT_S = 2.0
JETSTREAM_WAIT_S = 2.0  # cluster_impl.h: a JetStream answer (a stream or bucket write) at most
# durable_option's prefix "rd": the stream of every message ("<prefix>_msgs", durable.c) and
# the retained store's bucket, the JetStream groups the durable nodes' PUBACKs wait for.
DURABLE_STREAMS = ("rd_msgs", "KV_rd_retained")


class Stream(threading.Thread):
    """A QoS 1 publisher over a raw socket: at most `window` PUBLISHes unacknowledged, one
    every `gap` seconds, each PUBACK's reason code kept (acked: payload -> code). When rtd
    closes the connection it connects again and sends the unacknowledged ones again with DUP,
    as MQTT 3.1.1 4.4 asks of a client (counted: closes, resent)."""

    def __init__(self, node, topic, version, name, count=10**7, gap=0.002, window=20,
                 size=0):
        super().__init__(daemon=True)
        self.node, self.topic, self.version, self.name = node, topic, version, name
        self.count, self.gap, self.window, self.size = count, gap, window, size
        self.unacked = 0
        self.acked, self.acked_at, self.sent = {}, {}, []
        self.closes = self.resent = 0
        self.error = None
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.conn = self.connect()

    def connect(self):
        deadline = time.monotonic() + WAIT
        while True:
            try:
                c = Raw(self.node.port, self.name, version=self.version)
                assert c.connack_code == 0, c.connack_code
                # Within the Receive Maximum rtd gives (MQTT 5 3.3.4).
                self.window = min(self.window, c.connack_props.get(P_RECEIVE_MAXIMUM, 65535))
                return c
            except (OSError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def send(self, pid, payload, dup):
        """Sends one PUBLISH whole: the socket's timeout is the short one of the last read,
        and a send cut short by it would leave half a packet on the wire."""
        body = mqtt_str(self.topic) + u16(pid) + (varint(0) if self.version == 5 else b"")
        self.conn.sock.settimeout(WAIT)
        try:
            self.conn.send((PUBLISH << 4) | (8 if dup else 0) | 2, body + payload)
        except socket.timeout:
            raise AssertionError(f"{self.name}: rtd read no PUBLISH for {WAIT} s") from None

    def run(self):
        try:
            self.loop()
        except Exception as e:  # noqa: BLE001 (the test reads it)
            self.error = repr(e)

    def loop(self):
        pending, k, next_pid, last = {}, 0, 1, 0.0
        while pending or (k < self.count and not self.stop.is_set()):
            now = time.monotonic()
            # gap 0: as fast as the window allows, a burst at a time
            while (k < self.count and not self.stop.is_set() and len(pending) < self.window and
                   now - last >= self.gap):
                payload = b"%s-%06d" % (self.name.encode(), k)
                payload += b"x" * max(0, self.size - len(payload))
                while next_pid in pending:
                    next_pid = next_pid % 65535 + 1
                pending[next_pid] = payload
                with self.lock:
                    self.sent.append(payload)
                k, last = k + 1, now
                try:
                    self.send(next_pid, payload, False)
                except OSError:
                    break  # the read below sees the close
                next_pid = next_pid % 65535 + 1
                if self.gap:
                    break
            try:
                p = self.conn.read(timeout=self.gap or 0.005)
            except (ConnectionError, OSError):
                p = Closed
            if p is Closed or (p is not None and p.type == DISCONNECT):
                self.closes += 1
                self.conn.close()
                self.conn = self.connect()
                for pid, payload in pending.items():
                    self.send(pid, payload, True)
                    self.resent += 1
                continue
            if p is not None and p.type == PUBACK:
                pid = struct.unpack("!H", p.body[:2])[0]
                code = p.body[2] if self.version == 5 and len(p.body) > 2 else 0
                payload = pending.pop(pid, None)
                if payload is not None:
                    with self.lock:
                        self.acked[payload] = code
                        self.acked_at[payload] = time.monotonic()
            self.unacked = len(pending)

    def confirmed(self):
        with self.lock:
            return {p for p, code in self.acked.items() if code == 0}

    def refused(self):
        with self.lock:
            return {p: code for p, code in self.acked.items() if code >= 0x80}

    def state(self):
        return f"{self.name}: {len(self.sent)} sent, {self.closes} closes, error {self.error}"

    def finish(self):
        self.stop.set()
        self.join(WAIT)
        assert not self.is_alive(), f"{self.name}: acknowledgements still missing after {WAIT} s"
        assert self.error is None, self.error
        self.conn.close()


class Closed:
    """What Stream.loop reads when rtd closed the connection."""


def server_of(nats, node_name, role="routes"):
    i, _ = nats.conn(f"rtd:{node_name}:{role}")
    assert i is not None, f"rtd:{node_name}:{role} is on no NATS server"
    return i


def stopped_server(nats, i):
    """SIGSTOP of NATS server i: it keeps its sockets and answers nothing, as a frozen host."""
    nats.servers[i]["proc"].send_signal(signal.SIGSTOP)


def resumed_server(nats, i):
    nats.servers[i]["proc"].send_signal(signal.SIGCONT)
    nats.wait_ready([i])


def switched_at(node, since_lines, role="routes"):
    """When (epoch seconds, from rtd's log line) the node's connection of role reconnected
    to a NATS server, after the log's first since_lines lines; None if it has not."""
    for ln in node.read_log().splitlines()[since_lines:]:
        if f"cluster.reconnected connection={role} " in ln:
            stamp = datetime.datetime.strptime(ln.split()[0].removeprefix("ts="),
                                               "%Y-%m-%dT%H:%M:%S.%fZ")
            return stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
    return None


def figures(name, streams, sub):
    """acked (success), refused (v5 0x80) or closed (v3), lost, duplicates: the closing
    note's table."""
    got = payloads(sub)
    delivered = set(got)
    acked = set().union(*(s.confirmed() for s in streams))
    lost = sorted(acked - delivered)
    dup = sum(1 for p in delivered if got.count(p) > 1)
    refused = sum(len(s.refused()) for s in streams)
    closes = sum(s.closes for s in streams)
    print(f"\nFIGURES {name}: acked={len(acked)} refused_v5={refused} closed_v3={closes} "
          f"resent_v3={sum(s.resent for s in streams)} lost={len(lost)} duplicates={dup}")
    return lost


def retain_confirmed(node, topic, payload, cid):
    """A v3.1.1 retained QoS 1 PUBLISH, sent again on a new connection each time rtd closes
    one without its PUBACK (the bucket did not confirm it: JetStream is still electing a
    leader, say), until it is acknowledged."""
    deadline = time.monotonic() + WAIT
    while True:
        c = Raw(node.port, cid, version=4)
        try:
            c.publish(topic, payload, qos=1, retain=True)
            return
        except (ConnectionError, OSError, AssertionError):
            assert time.monotonic() < deadline, f"no PUBACK for the retained {payload!r}"
        finally:
            c.close()


# ---- Durable mode: the publisher's NATS server stalls or dies mid-stream ----

def streams_under_way(pub_node, sub_node, mq, topic, pfx):
    """A persistent subscriber to topic/# on sub_node, a probe publisher on pub_node whose
    route to it is in force, and QoS 1 streams from pub_node (MQTT 5 and 3.1.1) with 200
    messages each confirmed: (subscriber, probe, streams)."""
    sub = mq(sub_node, name="sub", clean=False, expiry=300)
    # Ended by a lapsed lease, it is refused (0x88) until its node claims again: it keeps
    # asking every 2 s, not on paho's backoff of up to 2 minutes.
    sub.c.reconnect_delay_set(1, 2)
    sub.subscribe(f"{topic}/#", 1)
    # An id the broker assigns needs no claim, so no lapse of the node's lease while its
    # NATS server is down ends the probe (docs/CLUSTER.md, "One holder per client id").
    probe = mq(pub_node, cid="")
    await_route(probe, f"{topic}/probe", [sub])
    streams = [Stream(pub_node, f"{topic}/v5", 5, f"v5{pfx}"),
               Stream(pub_node, f"{topic}/v3", 4, f"v3{pfx}")]
    for s in streams:
        s.start()
    until(lambda: all(len(s.confirmed()) >= 200 for s in streams), WAIT,
          lambda: f"streams under way: {[len(s.confirmed()) for s in streams]}")
    return sub, probe, streams


# ---- A session that moves away answers the copies it was sent ----

@pytest.mark.long
def test_moved_session_answers_its_copies(nodes, mq, pfx):
    """A persistent session moves n1 -> n2 -> n1 -> n2 while a publisher on each of those
    nodes streams QoS 1 to it (persistence on: each copy the session keeps is a commit the
    PUBACK waits for). Copies that reach the old session after it handed over, or as it ends,
    are answered at its end: every PUBLISH is acknowledged, none held for a timer
    (store.ack_timeout client=pub-p3-0 before). The end itself is tested deterministically
    in test_ended_session_answers_the_copies_it_held; here the race is the move's own."""
    n1, n2, _ = nodes
    cid = f"mva-{pfx}"
    kw = dict(v5=True, cid=cid, clean=False, expiry=300)
    holder = mq(n1, **kw)
    holder.c.reconnect_delay_set(60, 60)  # taken over: it must not come back and take it back
    holder.subscribe(f"{pfx}/m/+", 1)
    streams = [Stream(n, f"{pfx}/m/{k}", 5, f"p{k}{pfx}", gap=0, window=10)
               for k, n in enumerate((n1, n2))]
    for s in streams:
        await_route(mq(s.node, name="probe"), f"{pfx}/m/x", [holder])
        s.start()
    moves = [(n1, n2), (n2, n1), (n1, n2)]
    try:
        for old, new in moves:
            holder.wait_count(len(holder.msgs) + 100)
            gone = old.read_log().count("cluster.session_moved_out client=" + cid)
            holder = mq(new, **kw)
            holder.c.reconnect_delay_set(60, 60)
            assert holder.session_present
            until(lambda: old.read_log().count("cluster.session_moved_out client=" + cid) > gone,
                  WAIT, lambda: old.read_log()[-2000:])
            n_moved = [len(s.sent) for s in streams]
            until(lambda: all(len(s.sent) >= n + 300 for s, n in zip(streams, n_moved)), WAIT,
                  lambda: f"streams after the move: {[len(s.sent) for s in streams]}")
    finally:
        for s in streams:
            s.stop.set()
    t0 = time.monotonic()
    for s in streams:
        s.finish()  # every PUBLISH answered, within WAIT: no timer does it any more
    print(f"\nFIGURES move: {sum(len(s.sent) for s in streams)} PUBLISHes over {len(moves)} "
          f"moves, last acks {time.monotonic() - t0:.2f} s after the streams stopped")
    for s in streams:
        assert not s.refused(), s.refused()


# ---- Node alone: a subscriber that ends before storing its copies answers them ----

def test_ended_session_answers_the_copies_it_held(pfx):
    """A persistent session whose client stopped reading holds its deliveries (socket
    pressure) before storing them, and its publisher's PUBACKs wait for those copies. A
    CONNECT with its id and clean start ends it: the copies it never stored are answered at
    its end (its session ended too, so none lacks them), not 5 s later by a timer that
    claimed success."""
    rtd = Rtd()
    try:
        slow = Raw(rtd.port, f"slow-{pfx}", version=5, clean=False,
                   props=prop_u32(P_SESSION_EXPIRY, 300))
        slow.subscribe(f"{pfx}/big", 1)
        pub = Stream(rtd, f"{pfx}/big", 5, f"pub{pfx}", gap=0, window=100, size=64 * 1024)
        pub.start()
        until(lambda: pub.unacked == pub.window, WAIT,
              lambda: f"the publisher never waited: {pub.unacked} of {pub.window} unacknowledged")
        pub.stop.set()  # no more: what is unacknowledged now waits for the held copies
        t_end = time.monotonic()
        Raw(rtd.port, f"slow-{pfx}", version=5).disconnect()  # clean start: the old one ends
        until(lambda: pub.unacked == 0 or pub.error, WAIT,
              lambda: f"{pub.unacked} PUBLISHes never acknowledged:\n" + rtd.read_log()[-1500:]
              + str(rtd.ctl_json("clients", "show", f"pub{pfx}")))
        answered_s = time.monotonic() - t_end
        # The end answers them in its own turn; what answered them before was a 5 s check
        # (5 to 10 s after they began to wait, all before t_end), and it claimed success.
        assert answered_s < 5, f"answered {answered_s:.2f} s after the session ended"
        pub.finish()
        print(f"\nFIGURES ended session: {len(pub.acked)} PUBLISHes answered, the held ones "
              f"{answered_s:.2f} s after the session ended")
        assert not pub.refused(), pub.refused()
        slow.close()
    finally:
        code, log = rtd.stop()
    assert code == 0, log[-3000:]


# ---- NATS credentials (docs/CLUSTER.md, "Securing NATS") ----

class AuthNats:
    """One nats-server of this test's own (no JetStream) that asks for a user and password
    when users ({user: password}) has any; set_users rewrites its config and has it reloaded
    (SIGHUP)."""

    def __init__(self, base, users):
        self.port, self.mport = free_port(), free_port()
        self.conf = os.path.join(base, "auth-nats.conf")
        self.log = os.path.join(base, "auth-nats.log")
        self.write(users)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([NATS_SERVER, "-c", self.conf], stdout=log,
                                         stderr=subprocess.STDOUT)
        until(self.up, WAIT, lambda: self.read_log()[-2000:])

    def write(self, users):
        entries = ", ".join(f'{{user: "{u}", password: "{p}"}}' for u, p in users.items())
        with open(self.conf, "w") as f:
            f.write(f"listen: 127.0.0.1:{self.port}\nhttp: 127.0.0.1:{self.mport}\n")
            if users:
                f.write(f"authorization {{ users = [ {entries} ] }}\n")

    def set_users(self, users):
        self.write(users)
        self.proc.send_signal(signal.SIGHUP)

    def up(self):
        if self.proc.poll() is not None:
            pytest.fail("nats-server exited: " + self.read_log()[-2000:])
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.mport}/healthz", timeout=2) as r:
                return b"ok" in r.read()
        except OSError:
            return False

    def read_log(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)


def auth_option(node, url, user, password):
    return cluster_option(node, [url], f'user="{user}",password="{password}"')


def test_wrong_nats_credentials_said_and_retried_until_taken(tmp_path, mq, pfx):
    """A node given a password NATS does not take says what NATS answered and keeps trying;
    once the server takes it (its config reloaded), the node connects, and the subscriptions
    its clients made meanwhile are in force on NATS."""
    lone = AuthNats(str(tmp_path), {"good": "pw-good", "rt-b": "not-yet"})
    url = f"nats://127.0.0.1:{lone.port}"
    a = b = None
    try:
        a = Rtd(auth_option("a", url, "good", "pw-good"))
        b = Rtd(auth_option("b", url, "rt-b", "pw-b"))
        until(lambda: "cluster.nats_refused" in b.read_log(), WAIT, lambda: b.read_log()[-2000:])
        said = [ln for ln in b.read_log().splitlines() if "cluster.nats_refused" in ln]
        assert "authorization violation" in said[0].lower(), said
        assert b.ctl_json("cluster", "status")["nats"] == "connecting"
        sub = mq(b, name="sub")
        sub.subscribe(f"{pfx}/t", 1)
        # Still trying: the server turns it away again and again.
        tries = lone.read_log().count("authentication error")
        until(lambda: lone.read_log().count("authentication error") >= tries + 2, WAIT,
              lambda: lone.read_log()[-2000:])
        lone.set_users({"good": "pw-good", "rt-b": "pw-b"})
        until(lambda: b.ctl_json("cluster", "status")["nats"] == "connected", WAIT,
              lambda: b.read_log()[-2000:])
        # The shared groups' connection is made after the routes' one, which is what the
        # status says: its line may follow a moment later (a proof under load saw it do so).
        until(lambda: "cluster.connected connection=shared" in b.read_log(), WAIT,
              lambda: b.read_log()[-2000:])
        await_route(mq(a, name="pub"), f"{pfx}/t", [sub])
    finally:
        for n in (a, b):
            if n:
                code, log = n.stop()
                assert code == 0, log[-3000:]
        lone.stop()


def test_no_nats_credentials_off_this_host_refused_unless_intended(tmp_path):
    """No credentials and a NATS URL off this host: rtd does not start, and says which
    setting would let it. With that setting it starts (here the URL is 127.0.0.1 written as
    one number, which the check does not take for this host and the resolver does)."""
    with pytest.raises(RuntimeError) as refused:
        Rtd(cluster_option("x", ["nats://10.255.0.1:4222"]))
    assert "10.255.0.1:4222 is off this host" in str(refused.value), str(refused.value)[-2000:]
    assert "nats_without_credentials" in str(refused.value)
    lone = AuthNats(str(tmp_path), {})  # no authorization at all
    try:
        node = Rtd(cluster_option("x", [f"nats://2130706433:{lone.port}"],
                                  "nats_without_credentials=true"))
        try:
            until(lambda: node.ctl_json("cluster", "status")["nats"] == "connected", WAIT,
                  lambda: node.read_log()[-2000:])
        finally:
            code, log = node.stop()
        assert code == 0, log[-3000:]
    finally:
        lone.stop()


def docs_nats_conf(port, mport, store):
    """docs/CLUSTER.md's n1.conf as a reader copies it, for one server alone: its ports and
    store here, no cluster block, and plain passwords for its bcrypt placeholders."""
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "CLUSTER.md")).read()
    conf = doc[doc.index("# n1.conf"):]
    conf = conf[:conf.index("```")]
    conf = conf.replace("127.0.0.1:4221", f"127.0.0.1:{port}").replace("/var/lib/nats/n1", store)
    start = conf.index("cluster {")
    conf = conf[:start] + conf[conf.index("}", start) + 1:]
    for n in (1, 2, 3):
        conf = conf.replace('password: "$2a$11$..."', f'password: "pw-rt{n}"', 1)
    return conf + f"\nhttp: 127.0.0.1:{mport}\n"


def test_docs_nats_permissions_are_enough(tmp_path, mq, pfx):
    """docs/CLUSTER.md's nats-server config, per-node users and permissions as written:
    two durable nodes bind the stream and buckets, route a message, replicate a retained
    one, move a persistent session from one to the other, share a ban and answer each
    other's admin questions, with no permissions violation on either side."""
    lone = AuthNats(str(tmp_path), {})
    lone.stop()
    with open(lone.conf, "w") as f:
        f.write(docs_nats_conf(lone.port, lone.mport, str(tmp_path / "js")))
    with open(lone.log, "ab") as log:
        lone.proc = subprocess.Popen([NATS_SERVER, "-c", lone.conf], stdout=log,
                                     stderr=subprocess.STDOUT)
    nodes_ = []
    try:
        until(lone.up, WAIT, lambda: lone.read_log()[-2000:])
        url = f"nats://127.0.0.1:{lone.port}"
        for n in (1, 2):
            nodes_.append(Rtd(cluster_option(f"rt{n}", [url],
                                             f'user="rt{n}",password="pw-rt{n}",durable=true')))
        for n in nodes_:
            until(lambda: n.ctl_json("cluster", "status")["durable"] == "on", WAIT,
                  lambda: n.read_log()[-2000:] + lone.read_log()[-2000:])
        rt1, rt2 = nodes_
        sub = mq(rt2, name="sub")
        sub.subscribe(f"{pfx}/#", 1)
        pub = mq(rt1, name="pub")
        await_route(pub, f"{pfx}/x", [sub])
        pub.publish(f"{pfx}/r", b"kept", qos=1, retain=True)
        late = Raw(rt2.port, f"late-{pfx}", version=5)
        late.subscribe(f"{pfx}/r", 1)
        assert late.next_publish(WAIT)["payload"] == b"kept"
        late.close()
        cid = f"mv-{pfx}"
        old = mq(rt1, cid=cid, clean=False, expiry=300)
        old.c.reconnect_delay_set(60, 60)
        assert mq(rt2, cid=cid, clean=False, expiry=300).session_present
        until(lambda: f"cluster.session_moved_in client={cid} " in rt2.read_log(), WAIT,
              lambda: rt2.read_log()[-2000:])
        assert rt1.ctl_json("clients", "show", cid)["node"] == "rt2"
        pub.publish(f"{pfx}/r", b"", qos=1, retain=True)
        # The banned list's bucket: a ban made on one node is applied on the other.
        assert rt1.ctl("banned", "add", "clientid", f"ban-{pfx}")[0] == 0
        until(lambda: [b["value"] for b in rt2.ctl_json("banned", "list")] == [f"ban-{pfx}"],
              WAIT, lambda: rt2.read_log()[-2000:] + lone.read_log()[-2000:])
        for log in [lone.read_log()] + [n.read_log() for n in nodes_]:
            bad = [ln for ln in log.splitlines() if "Violation" in ln or
                   "cluster.nats_error" in ln]
            assert not bad, bad[:5]
    finally:
        for n in nodes_:
            code, log = n.stop()
            assert code == 0, log[-3000:]
        lone.stop()


# ---- Last: a NATS server stalled, then one killed (JetStream elects for a while after) ----

def retained_on(node, topic, cid):
    """What a fresh subscriber on node gets as topic's retained message (None: nothing)."""
    c = Raw(node.port, cid, version=5)
    try:
        c.subscribe(topic, 0)
        p = c.next_publish(2.0)
        return p["payload"] if p else None
    finally:
        c.close()


@pytest.mark.long
def test_stalled_nats_server_acks_only_what_jetstream_confirmed(nats, durable_nodes, mq, pfx):
    """The NATS server of the publishers' node is SIGSTOPped for 8 s in the middle of QoS 1
    streams (MQTT 5 and 3.1.1) and a retained PUBLISH. Every success PUBACK is a message the
    subscriber on another node gets; what JetStream never confirmed is 0x80 (v5) or a closed
    connection and a resend (v3), never a PUBACK on a timer; the node moves to another NATS
    server within the stated bound and cross-node messages flow again before the stall ends."""
    d1, d2, _ = durable_nodes
    topic = f"{pfx}/s"
    retain_confirmed(d1, f"{topic}/ret", b"old", f"ret-{pfx}")
    sub, probe, streams = streams_under_way(d1, d2, mq, topic, pfx)
    i = server_of(nats, "d1")
    try:
        # Connected before the stall: its CONNECT's claim is not what is measured.
        ret = Raw(d1.port, f"ret2-{pfx}", version=4)
        lines = len(d1.read_log().splitlines())
        t_stop, t_stop_wall = time.monotonic(), time.time()
        stopped_server(nats, i)
        # A retained PUBLISH right away: its bucket write goes to the stopped server.
        ret.send((PUBLISH << 4) | 2 | 1, mqtt_str(f"{topic}/ret") + u16(7) + b"new")
        try:
            first = ret.read(timeout=JETSTREAM_WAIT_S + STALE_S + CONNECT_WAIT_S)
        except (ConnectionError, OSError):
            first = Closed
        switch_s = until(lambda: switched_at(d1, lines), WAIT,
                         lambda: "no reconnection:\n" + d1.read_log()[-2500:]) - t_stop_wall
        # Core NATS carries the other nodes' messages again while the server is still stopped.
        await_route(probe, f"{topic}/probe", [sub], timeout=8.0 - (time.monotonic() - t_stop))
        assert time.monotonic() - t_stop < 8.0, "the stall ended before messages crossed again"
        time.sleep(max(0.0, 8.0 - (time.monotonic() - t_stop)))
    finally:
        resumed_server(nats, i)
    # What the node writes from here on goes to JetStream: its groups have a leader again
    # (they may elect one for many seconds after the resume: NatsCluster.wait_led). The waits
    # below are rtd's own: a pending write times out within JETSTREAM_WAIT_S, the v3
    # publisher sends it again, and the next is confirmed.
    nats.wait_led(DURABLE_STREAMS)
    assert first is not None, "the retained PUBLISH was neither acknowledged nor closed"
    if first is not Closed:
        # Acknowledged after all: only once the bucket confirmed it (the node reached another
        # server first, under a loaded machine), so another node serves it, not the old one.
        assert first.type == PUBACK, first
        until(lambda: retained_on(d2, f"{topic}/ret", f"chk-{pfx}") == b"new", WAIT,
              "a v3 PUBACK for a retained message another node does not serve")
    retain_confirmed(d1, f"{topic}/ret", b"new", f"ret2-{pfx}")  # MQTT 4.4: sent again
    n_after = [len(s.sent) for s in streams]
    until(lambda: all(len(s.sent) >= n + 200 for s, n in zip(streams, n_after)), WAIT,
          lambda: f"streams after the stall: {[s.state() for s in streams]}\n" +
          nats.led_view(DURABLE_STREAMS) + "\n" + d1.read_log()[-3000:])
    for s in streams:
        s.finish()
    fence(probe, f"{topic}/probe", [sub])
    lost = figures("stall (SIGSTOP 8 s)", streams, sub)
    print(f"FIGURES stall: switched to another NATS server after {switch_s:.2f} s")
    assert not lost, f"acknowledged, never delivered: {lost[:10]}"
    assert switch_s <= STALE_S + CONNECT_WAIT_S, switch_s
    v5, v3 = streams
    assert set(v5.refused().values()) == {0x80}, v5.refused()
    assert v3.closes >= 1 and v3.resent >= 1, "the v3 publisher was never closed and resent"
    assert "client.ack_unconfirmed" in d1.read_log()
    # The retained PUBLISH sent into the stall: closed without its v3 PUBACK, or acknowledged
    # once confirmed (checked above); before, the PUBACK went on a timer and d2 kept "old".
    late = Raw(d2.port, f"late-{pfx}", version=5)
    late.subscribe(f"{topic}/ret", 1)
    assert late.next_publish(WAIT)["payload"] == b"new"
    for c in (ret, late):
        c.close()


@pytest.mark.long
def kill9_midstream(nats, i, d1, streams, sub, probe, topic, what, caught_up=lambda: True):
    """NATS server i killed with -9 under the streams: they go on 500 messages more each (and
    caught_up holds), then it is started again; every success PUBACK must be delivered."""
    try:
        n_before = [len(s.sent) for s in streams]
        nats.kill9(i)
        until(lambda: all(len(s.sent) >= n + 500 for s, n in zip(streams, n_before)), WAIT,
              lambda: f"streams after the kill: {[s.state() for s in streams]}\n" +
              d1.read_log()[-3000:])
        until(caught_up, WAIT, lambda: "the node did not read the stream again")
    finally:
        if not nats.alive(i):
            nats.start(i)
        nats.wait_ready([i])
    for s in streams:
        s.finish()
    fence(probe, f"{topic}/probe", [sub])
    lost = figures(what, streams, sub)
    assert not lost, f"acknowledged, never delivered: {lost[:10]}"


def test_killed_nats_server_acks_only_what_jetstream_confirmed(nats, durable_nodes, mq, pfx):
    """kill -9 of the publishers' node's NATS server mid-stream: what it had taken and not
    answered is 0x80 (v5) or a resend (v3); every success PUBACK is delivered."""
    d1, d2, _ = durable_nodes
    topic = f"{pfx}/k"
    sub, probe, streams = streams_under_way(d1, d2, mq, topic, pfx)
    kill9_midstream(nats, server_of(nats, "d1"), d1, streams, sub, probe, topic,
                    "kill -9 of the NATS server")


@pytest.mark.long
def test_killed_subscribers_nats_server_loses_nothing_acknowledged(nats, durable_nodes, mq, pfx):
    """kill -9 of the subscriber's node's NATS server mid-stream, the stream led by another
    server (it goes on confirming): what the stream kept until the node's subscriptions were
    on another server, NATS never brings the node; it reads that from the stream once its
    connection is back (docs/CLUSTER.md, Durable mode). Every success PUBACK is delivered."""
    d1, d2, _ = durable_nodes
    topic = f"{pfx}/ks"
    sub, probe, streams = streams_under_way(d1, d2, mq, topic, pfx)
    i = server_of(nats, "d2")
    nats.lead_elsewhere("rd_msgs", i)
    lines = len(d2.read_log().splitlines())
    # The read of the stream is done: what it routes is ahead of the fence's probe.
    kill9_midstream(nats, i, d1, streams, sub, probe, topic,
                    "kill -9 of the subscriber's NATS server",
                    lambda: "cluster.caught_up " in "".join(d2.read_log().splitlines()[lines:]))
