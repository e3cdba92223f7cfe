"""One client id, one holder (docs/CLUSTER.md, "One holder per client id"): a node serves a
client id only under a claim whose lease it keeps renewing in JetStream; a claim whose holder
does not answer waits for that lease to run out; a node resumes or reloads a session only
after claiming its id. The faults: the holder's NATS server stopped (SIGSTOP), the holder node
frozen (SIGSTOP of rtd) then resumed, and a node killed and restarted with its store.

Each test watches both sides at once: a sampler asks every node's admin socket which clients
it has connected (a frozen node's silence counts as serving nothing), and raw MQTT clients
record when their connection was answered and when it was closed. Two holders are seen when
two nodes listed the id connected at one moment, or when the new connection had its CONNACK
while the old one was open on a node that was running.
"""
import fcntl
import os
import signal
import socket
import struct
import termios
import threading
import time

import pytest

from admin_wire import Admin
from cluster_harness import WAIT, cluster_option, nats, pfx, until  # noqa: F401 (fixtures)
from conftest import Rtd
from mqtt_raw import (CONNACK, DISCONNECT, PUBACK, PUBLISH, P_SESSION_EXPIRY, Raw, mqtt_str,
                      prop_u32, u16, varint)

# The holder's lease (LEASE_MS in actors/cluster/lease.c) and the taker's margin past it: a
# takeover whose holder says nothing is answered within about this long.
LEASE_S = 5.0
TAKEOVER_BOUND_S = 2.0 + LEASE_S + 1.0 + 3.0  # request, lease, margin, a loaded machine
TCP_ESTABLISHED = 1  # tcp_info.tcpi_state (include/net/tcp_states.h)


class Holders:
    """Asks each node's admin socket, every few ms and from a thread per node, whether it has
    cid connected; keeps (time, state) per node: True, False, or None when the node did not
    answer within 1 s (frozen: it serves nothing then)."""

    def __init__(self, cid, nodes):
        self.cid, self.nodes = cid, nodes
        self.samples = {i: [] for i in range(len(nodes))}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(len(nodes))]
        for t in self.threads:
            t.start()

    def _ask(self, admin):
        code, rows = admin.ask("clients", "list", as_json=True)
        assert code == 200, rows
        return any(r["client_id"] == self.cid and r["state"] == "connected" for r in rows)

    def _run(self, i):
        admin = None
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                if admin is None:
                    admin = Admin(self.nodes[i].admin_socket, timeout=1.0)
                state = self._ask(admin)
            except (OSError, EOFError):
                state = None
                if admin is not None:
                    admin.close()
                admin = None
            self.samples[i].append((t, state))
            time.sleep(0.01)
        if admin is not None:
            admin.close()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def connected_spans(self, i):
        """[(from, to)] during which node i said connected (until its next sample)."""
        s = self.samples[i]
        return [(t, s[k + 1][0] if k + 1 < len(s) else t) for k, (t, st) in enumerate(s) if st]

    def overlaps(self):
        """The moments (seconds, monotonic) two nodes both said connected."""
        out = []
        for i in self.samples:
            for j in self.samples:
                if i < j:
                    for a0, a1 in self.connected_spans(i):
                        for b0, b1 in self.connected_spans(j):
                            if max(a0, b0) < min(a1, b1):
                                out.append((max(a0, b0), min(a1, b1) - max(a0, b0)))
        return out


class Watched(Raw):
    """A raw MQTT 5 client whose CONNACK may take a takeover's wait, and whose packets after
    it are read by a thread that notes each one and when the broker closed the connection."""

    def __init__(self, node, cid, connack_timeout=TAKEOVER_BOUND_S + 5, watch=(), **kw):
        self.connack_timeout = connack_timeout
        self.t_connack = None
        Raw.__init__(self, node.port, cid, clean=False,
                     props=prop_u32(P_SESSION_EXPIRY, 300), **kw)
        # The kernel's word on each watched connection as this CONNACK is read: its reader
        # thread may note an end that had arrived first only after this thread notes the
        # CONNACK (CI: 0.5 ms later, under load), so t_closed alone cannot order the two.
        for w in watch:
            w.ended_before_peer_connack = w.t_closed is not None or w.end_arrived()
        self.t_connack = time.monotonic()
        self.packets, self.t_closed = [], None
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read_all, daemon=True)
        self.reader.start()

    def read(self, timeout=None):
        if timeout is None:
            timeout = self.connack_timeout if self.t_connack is None else 5.0
        return Raw.read(self, timeout)

    def _read_all(self):
        """Notes each packet; t_closed: when the broker ended the connection, by its
        DISCONNECT (after which it serves nothing on it) or the close, whichever came first."""
        while self.t_closed is None:
            try:
                p = Raw.read(self, 0.2)
            except (ConnectionError, OSError):
                self.t_closed = time.monotonic()
                return
            if p is not None:
                with self.lock:
                    self.packets.append((time.monotonic(), p))
                if p.type == DISCONNECT:
                    self.t_closed = self.packets[-1][0]
                    return
                if p.type == PUBLISH and (p.flags >> 1) & 3 == 1:
                    f = self.publish_fields(p)
                    self.send(PUBACK << 4, u16(f["pid"]))

    def end_arrived(self):
        """Bytes the reader has not taken yet (after a takeover only the DISCONNECT comes) or
        the broker's FIN: the connection's end is in the kernel, whatever the reader did."""
        try:
            pending = struct.unpack("i", fcntl.ioctl(self.sock, termios.FIONREAD, b"\0" * 4))[0]
            state = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
        except OSError:
            return True  # the reader closed it: it had seen the end
        return pending > 0 or state != TCP_ESTABLISHED

    def got(self, ptype):
        with self.lock:
            return [p for _, p in self.packets if p.type == ptype]

    def payloads(self):
        return [self.publish_fields(p)["payload"] for p in self.got(PUBLISH)]

    def send_publish(self, topic, payload, pid):
        """A QoS 1 PUBLISH whose PUBACK the reader thread notes."""
        self.send((PUBLISH << 4) | 2, mqtt_str(topic) + u16(pid) + varint(0) + payload)

    def subscribe_now(self, topic_filter):
        """SUBSCRIBE at QoS 1, before the reader runs (Raw.subscribe reads the SUBACK)."""
        self.send((8 << 4) | 2, u16(1) + varint(0) + mqtt_str(topic_filter) + bytes([1]))


def connect_subscribed(node, cid, topic_filter):
    """The old holder's client: connected to node, subscribed, its reader running."""
    c = Watched.__new__(Watched)
    c.connack_timeout, c.t_connack = 10, None
    Raw.__init__(c, node.port, cid, clean=False, props=prop_u32(P_SESSION_EXPIRY, 300))
    c.t_connack = time.monotonic()
    c.subscribe(topic_filter, qos=1)
    c.packets, c.t_closed = [], None
    c.lock = threading.Lock()
    c.reader = threading.Thread(target=c._read_all, daemon=True)
    c.reader.start()
    return c


def held_on(holder, taker, cid, pfx):
    """cid connected to holder, subscribed to pfx/x, with a publisher on taker whose messages
    reach it: (the client, the publisher)."""
    old = connect_subscribed(holder, cid, f"{pfx}/x")
    pub = raw_publisher(taker, "pub")
    route_ready(pub, f"{pfx}/x", old)
    return old, pub


def raw_publisher(node, name):
    return Raw(node.port, f"{name}-{os.getpid()}-{time.monotonic_ns() % 10**9}")


def route_ready(pub, topic, sub, timeout=WAIT):
    """Publishes QoS 1 probes from pub (a Raw) until sub's reader has one."""
    deadline = time.monotonic() + timeout
    n = 0
    while True:
        pub.publish(topic, b"probe%d" % n, qos=1, pid=1 + n % 60000)
        n += 1
        stop = time.monotonic() + 0.2
        while time.monotonic() < stop:
            if any(p.startswith(b"probe") for p in sub.payloads()):
                return
            time.sleep(0.01)
        assert time.monotonic() < deadline, f"no probe reached the client on {topic}"


def soon(cond, timeout):
    """Whether cond becomes true within timeout (the tests report before they assert)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def node_option(name, urls):
    # replicas = 3 whatever the node was given: the buckets this module's nodes may be first
    # to make must outlive one NATS server stopped.
    return cluster_option(name, urls, "replicas=3")


def ready(n):
    until(lambda: n.ctl_json("cluster", "status")["retained"] == "replicated", WAIT,
          lambda: n.read_log()[-2000:])
    until(lambda: "cluster.lease_held" in n.read_log(), WAIT, lambda: n.read_log()[-2000:])


def stream_leader(nats, stream):
    """The name of the NATS server leading stream (JetStream's view)."""
    for i in range(3):
        if not nats.alive(i):
            continue
        for acc in nats.get(i, "/jsz?accounts=true&streams=true").get("account_details", []):
            for st in acc.get("stream_detail") or []:
                if st.get("name") == stream and st.get("cluster", {}).get("leader"):
                    return st["cluster"]["leader"]
    return None


def pair(nats, tag, holder_data=None, holder_alone=False):
    """Two nodes (holder, taker). holder_alone: the holder is given only a NATS server that
    neither leads the client ids' bucket nor has the taker's connection (stopping it leaves
    the taker and JetStream able to answer)."""
    urls = nats.urls()
    made = []
    try:
        made.append(Rtd(node_option(f"t{tag}", urls)))
        ready(made[0])
        hurls = urls
        if holder_alone:
            leader = until(lambda: stream_leader(nats, "KV_rt_clients"), WAIT,
                           "the client ids' bucket has no leader")
            taker_on, _ = nats.conn(f"rtd:t{tag}:routes")
            hurls = [u for i, (s, u) in enumerate(zip(nats.servers, urls))
                     if s["name"] != leader and i != taker_on][:1]
        made.insert(0, Rtd(node_option(f"h{tag}", hurls), data_dir=holder_data))
        ready(made[0])
    except BaseException:
        for n in made:
            n.stop()
        raise
    return made


def stop_nodes(*nodes):
    for n in nodes:
        if n.proc.poll() is None:
            try:
                n.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            n.stop()


def report(name, holders, old, new, extra=""):
    closed = "open" if old.t_closed is None else f"{old.t_closed - new.t_start:+.2f} s"
    overlap = holders.overlaps()
    print(f"\n[{name}] old connection closed {closed}, new CONNACK "
          f"{new.t_connack - new.t_start:+.2f} s (session present {new.session_present}), "
          f"sampled two holders for {sum(d for _, d in overlap):.2f} s {extra}")


def open_new(node, cid, watch=()):
    """A Watched client on node. 0x88 (Server unavailable) is a node's answer while its lease
    does not hold (docs/CLUSTER.md: a holder resumed from a freeze, until its renewal is
    confirmed): the client connects again, as paho does, within WAIT."""
    t = time.monotonic()
    while True:
        c = Watched(node, cid, watch=watch)
        if c.connack_code != 0x88 or time.monotonic() > t + WAIT:
            break
        c.close()
        time.sleep(0.1)
    c.t_start = t
    assert c.connack_code == 0, f"CONNACK {c.connack_code:#x}\n" + node.read_log()[-3000:]
    return c


def frozen_takeover(nats, pfx, tag):
    """The holder node frozen (SIGSTOP of rtd) and its client's id claimed on the taker: the
    taker answers once the holder's lease ran out. While frozen the old client sends a QoS 1
    PUBLISH (it waits in the holder's socket) and a message for the id's subscription is
    published. Returns (holder, taker, cid, old, new, holders sampler, watcher), holder
    resumed."""
    h, t = pair(nats, tag)
    cid = f"hf{tag}-" + pfx
    old, pub = held_on(h, t, cid, pfx)
    watcher = connect_subscribed(t, "w-" + cid, f"{pfx}/from-old")
    probe = raw_publisher(h, "probe")
    route_ready(probe, f"{pfx}/from-old", watcher)
    holders = Holders(cid, [h, t])
    h.proc.send_signal(signal.SIGSTOP)
    try:
        new = open_new(t, cid)
        old.send_publish(f"{pfx}/from-old", b"sent-while-frozen", 7)
        if not new.session_present:  # the holder never answered: no session came with it
            new.subscribe_now(f"{pfx}/x")
            route_ready(pub, f"{pfx}/x", new)
        pub.publish(f"{pfx}/x", b"after-takeover", qos=1, pid=61000)
    finally:
        h.proc.send_signal(signal.SIGCONT)
    return h, t, cid, old, new, holders, watcher, pub


@pytest.mark.long
def test_frozen_holder_resumes_without_serving_its_old_connection(nats, pfx):
    """The holder frozen (SIGSTOP of rtd) while its client's id is claimed on another node:
    the taker answers once the holder's lease ran out; the holder, resumed, closes the old
    connection before serving anything on it: the PUBLISH its client sent meanwhile is not
    acknowledged or routed, and the message for the id goes to the new connection only."""
    h = t = None
    try:
        h, t, cid, old, new, holders, watcher, pub = frozen_takeover(nats, pfx, "a")
        soon(lambda: old.t_closed, WAIT)
        soon(lambda: b"after-takeover" in new.payloads() + old.payloads(), WAIT)
        time.sleep(0.3)  # a look for what the old holder might still route
        holders.finish()
        report("rtd freeze", holders, old, new,
               f"old PUBACKs {len(old.got(PUBACK))}, routed {watcher.payloads()}")
        assert old.t_closed, "the old connection was not closed after SIGCONT"
        assert b"after-takeover" in new.payloads()
        assert not old.got(PUBACK), "the resumed holder acknowledged its old client's PUBLISH"
        assert b"sent-while-frozen" not in watcher.payloads(), "and routed it"
        assert b"after-takeover" not in old.payloads()
        assert not holders.overlaps(), holders.overlaps()[:5]
        assert new.session_present == 0 or new.session_present == 1
        assert new.t_closed is None
    finally:
        stop_nodes(*[n for n in (h, t) if n])


@pytest.mark.long
def test_resumed_holder_claims_before_resuming_a_session(nats, pfx):
    """After the frozen holder resumes, its client connects to it again: the holder resumes
    nothing locally (its session went to the other node) before claiming the id, which ends
    the connection on the other node first (DISCONNECT 0x8E); one holder at every moment."""
    h = t = None
    try:
        h, t, cid, old, new, holders, watcher, pub = frozen_takeover(nats, pfx, "b")
        soon(lambda: old.t_closed, WAIT)
        again = open_new(h, cid)
        soon(lambda: new.t_closed, WAIT)
        holders.finish()
        report("back to the frozen holder", holders, new, again)
        assert new.t_closed, "the client on the taker was not ended"
        assert new.t_closed < again.t_connack, "both connections served at once"
        disc = new.got(DISCONNECT)
        assert disc and disc[0].body[0] == 0x8E, disc
        assert not holders.overlaps(), holders.overlaps()[:5]
        # The resume came after the claim that took the id (and session) back from the taker.
        log = h.read_log()
        resumed = log.rfind(f"client.connected client={cid} ")
        taken = log.rfind(f"cluster.client_taken_over client={cid} from=tb")
        assert 0 <= taken < resumed, "resumed locally without a claim"
    finally:
        stop_nodes(*[n for n in (h, t) if n])


@pytest.mark.long
def test_restarted_node_does_not_serve_sessions_claimed_elsewhere(nats, pfx, tmp_path):
    """kill -9 of the holder; its client resumes on another node; the holder restarts with its
    store (persistence on) and reloads the session: it checks the id's claim first, finds it
    another node's and ends the stale copy (it collects nothing more); the client connecting to
    it again takes the id over properly, the other node's connection ended first."""
    data = str(tmp_path / "h-data")
    os.makedirs(data, mode=0o700)
    h, t = pair(nats, "c", holder_data=data)
    h2 = None
    try:
        cid = "hc-" + pfx
        old, pub = held_on(h, t, cid, pfx)
        h.kill9()
        new = open_new(t, cid)
        new.subscribe_now(f"{pfx}/x")
        route_ready(pub, f"{pfx}/x", new)
        h2 = Rtd(node_option("hc", nats.urls()), data_dir=data, port=h.port)
        holders = Holders(cid, [h2, t])
        stale_ended = soon(lambda: f"cluster.session_stale client={cid}" in h2.read_log(), WAIT)
        rows = h2.ctl_json("clients", "list")
        again = open_new(h2, cid)
        soon(lambda: new.t_closed, WAIT)
        holders.finish()
        report("restart with the store", holders, new, again,
               f"stale ended {stale_ended}, again session present {again.session_present}")
        assert stale_ended, "the stale session was not ended\n" + h2.read_log()[-3000:]
        assert cid not in {r["client_id"] for r in rows}, rows
        assert new.t_closed, "the client on the taker was not ended"
        assert new.t_closed < again.t_connack, "both connections served at once"
        assert not holders.overlaps(), holders.overlaps()[:5]
        assert h2.ctl_json("cluster", "status")["client_ids_claimed"] >= 1
    finally:
        stop_nodes(*[n for n in (h, h2, t) if n])


# Last: the NATS server it stops leaves JetStream electing for a while after it resumes.
@pytest.mark.long
def test_takeover_while_the_holders_nats_server_is_stopped(nats, pfx):
    """The holder's NATS server is stopped (SIGSTOP): the holder cannot renew its lease and
    ends its client within the lease (MQTT 5: DISCONNECT 0x9C, use another server), unless it
    reaches another NATS server first and answers the takeover; the new node, whose request
    got no answer, waits for one or the other before its CONNACK. At no moment are both
    connections served."""
    h, t = pair(nats, "s", holder_alone=True)
    stopped = None
    try:
        cid = "hs-" + pfx
        old, pub = held_on(h, t, cid, pfx)
        server, _ = nats.conn("rtd:hs:routes")
        assert server is not None, "the holder's NATS connection is not on a server"
        holders = Holders(cid, [h, t])
        nats.servers[server]["proc"].send_signal(signal.SIGSTOP)
        stopped = server
        new = open_new(t, cid, watch=[old])
        if not new.session_present:  # the holder never answered: no session came with it
            new.subscribe_now(f"{pfx}/x")
        soon(lambda: old.t_closed, TAKEOVER_BOUND_S)
        holders.finish()
        report("nats stall", holders, old, new)
        assert old.t_closed, "the old connection stayed open"
        assert old.ended_before_peer_connack or old.t_closed < new.t_connack, (
            f"CONNACK on the new node {old.t_closed - new.t_connack:.4f} s before the old "
            "connection closed")
        assert not holders.overlaps(), holders.overlaps()[:5]
        # Either the lease ran out first (0x9C, use another server), or the holder noticed
        # the stall (two unanswered PINGs, 3 s), went to a server it learned from the NATS
        # cluster and answered the takeover (0x8E): one holder at a time either way.
        disc = old.got(DISCONNECT)
        assert disc and disc[0].body[0] in (0x9C, 0x8E), disc
        if disc[0].body[0] == 0x9C:
            assert "cluster.lease_lost" in h.read_log()
        nats.servers[server]["proc"].send_signal(signal.SIGCONT)
        stopped = None
        nats.wait_ready([server])
        # The stale takeover that reaches the holder now ends nothing on the new node.
        route_ready(pub, f"{pfx}/x", new)
        assert new.t_closed is None
    finally:
        for n in (h, t):
            print("\n".join(ln for ln in n.read_log().splitlines() if "lease" in ln))
        if stopped is not None:
            nats.servers[stopped]["proc"].send_signal(signal.SIGCONT)
            nats.wait_ready([stopped])
        stop_nodes(h, t)


# After the one above, as last: every NATS server restarts, and JetStream elects anew.
@pytest.mark.long
def test_every_nats_server_restarted_the_forgotten_claims_end(nats, pfx):
    """The clients bucket lives in the NATS servers' memory: a restart of every NATS server
    forgets it, and the claims with it. The holder's next renewal finds its lease key gone
    (`cluster.lease_key_lost`) and its lease ends, so its client is ended rather than served
    beside a claim another node could now make without asking; then the holder takes its
    lease anew (a compare-and-swap on a forgotten revision would never succeed again), and
    the id is claimed anew on the other node: one holder at a time throughout."""
    h, t = pair(nats, "w")
    try:
        cid = "hw-" + pfx
        old, pub = held_on(h, t, cid, pfx)
        for i in range(3):
            nats.kill9(i)
        for i in range(3):
            nats.start(i)
        nats.wait_ready(range(3))
        lost = soon(lambda: "cluster.lease_key_lost" in h.read_log(), WAIT)
        assert lost, "no renewal found the lease key gone\n" + h.read_log()[-3000:]
        assert soon(lambda: old.t_closed, WAIT), "the holder kept serving a forgotten claim"
        for n in (h, t):
            until(lambda: n.ctl_json("cluster", "status")["lease"] == "held", WAIT,
                  lambda: n.read_log()[-3000:])
        holders = Holders(cid, [h, t])
        new = open_new(t, cid)
        rows = {n: {r["client_id"]: r["state"] for r in n.ctl_json("clients", "list")}
                for n in (h, t)}
        holders.finish()
        assert new.t_closed is None, "the new holder's client was ended"
        assert rows[t].get(cid) == "connected" and rows[h].get(cid) != "connected", rows
        assert not holders.overlaps(), holders.overlaps()[:5]
        assert t.ctl_json("cluster", "status")["client_ids_claimed"] >= 1
    finally:
        for n in (h, t):
            print("\n".join(ln for ln in n.read_log().splitlines() if "lease" in ln))
        for i in range(3):
            if not nats.alive(i):
                nats.start(i)
        nats.wait_ready(range(3))
        stop_nodes(h, t)
