"""What the cluster's end-to-end tests share (test_cluster.py and the fault tests beside it):
three nats-server processes joined as one NATS cluster with JetStream on loopback, rtd nodes
given their URLs, paho-mqtt clients that keep what they receive, and the waits every test
bounds itself with (until, await_route, fence). nats-server processes are stopped by the
PIDs started here, never by name.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from conftest import Rtd, free_port

NATS_SERVER = shutil.which("nats-server") or "/usr/bin/nats-server"
PROBE = b"#probe#"
WAIT = 20.0  # the bound on a wait for something that takes milliseconds when all is well


def until(cond, timeout, what):
    """Polls cond until it is true; fails with what (a string or a callable making one)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s: " + (what() if callable(what) else what))
        time.sleep(0.01)


# ---- NATS ----

class NatsCluster:
    """Three nats-server processes as one cluster (cluster name rtc) with JetStream."""

    def __init__(self, base):
        self.base = base
        ports = set()
        while len(ports) < 9:
            ports.add(free_port())
        ports = sorted(ports)
        self.servers = [dict(name=f"n{i + 1}", port=ports[3 * i], cport=ports[3 * i + 1],
                             mport=ports[3 * i + 2], dir=os.path.join(base, f"n{i + 1}"),
                             log=os.path.join(base, f"nats-n{i + 1}.log"), proc=None)
                        for i in range(3)]
        try:
            for i in range(3):
                self.start(i)
            self.wait_ready(range(3))
        except BaseException:
            self.stop()
            raise

    def urls(self):
        return [f"nats://127.0.0.1:{s['port']}" for s in self.servers]

    def start(self, i):
        s = self.servers[i]
        routes = ",".join(f"nats://127.0.0.1:{o['cport']}" for o in self.servers if o is not s)
        # rtd's packets go up to max_packet_size (1 MiB) and its headers carry MQTT 5
        # properties hex-encoded: NATS's max_payload is raised as docs/CLUSTER.md says.
        conf = os.path.join(self.base, "nats.conf")
        with open(conf, "w") as f:
            f.write("max_payload: 4194304\n")
        argv = [NATS_SERVER, "-c", conf, "-a", "127.0.0.1", "-p", str(s["port"]),
                "--cluster", f"nats://127.0.0.1:{s['cport']}", "--cluster_name", "rtc",
                "--routes", routes, "-js", "-sd", s["dir"], "--server_name", s["name"],
                "-m", str(s["mport"])]
        with open(s["log"], "ab") as log:
            s["proc"] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def logs(self):
        out = []
        for s in self.servers:
            try:
                with open(s["log"], errors="replace") as f:
                    out.append(f"--- nats {s['name']} ---\n" + f.read()[-3000:])
            except OSError:
                pass
        return "\n".join(out)

    def get(self, i, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.servers[i]['mport']}{path}",
                                    timeout=2) as r:
            return json.loads(r.read())

    def ready(self, i):
        proc = self.servers[i]["proc"]
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server {self.servers[i]['name']} exited "
                               f"({proc.returncode}):\n{self.logs()}")
        try:
            # Routed, healthy, and JetStream's meta group has a leader this server knows and
            # follows: a server resumed from SIGSTOP answers /healthz before JetStream's API
            # does again ("no responders" to a node's bucket writes for seconds after).
            meta = self.get(i, "/jsz").get("meta_cluster") or {}
            # js-server-only: the server's own JetStream (its meta group), not every stream and
            # consumer it holds: one KV watcher's consumer stayed "not current" on a resumed
            # server past the 90 s below (a CI proof), though its meta group had caught up.
            return (self.get(i, "/routez").get("num_routes") == 2 and
                    self.get(i, "/healthz?js-server-only=true").get("status") == "ok" and
                    bool(meta.get("leader")) and
                    all(r.get("current") for r in meta.get("replicas") or []))
        except (OSError, ValueError):
            return False

    # A server resumed from SIGSTOP may have been the JetStream meta leader: with the other
    # lane's load on 2 cores the servers' elections flapped for over 30 s before they settled
    # (CI proof). What is awaited is nats-server's own health; the cap only turns a hang into
    # a failure, well inside the 300 s test watchdog.
    def wait_ready(self, which, timeout=90.0):
        deadline = time.monotonic() + timeout
        for i in which:
            while not self.ready(i):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server {self.servers[i]['name']} not ready "
                                       f"(2 routes, JetStream healthy) within {timeout} s:\n"
                                       + self.logs())
                time.sleep(0.05)

    def stream_led(self, name):
        """Whether JetStream stream `name` takes writes: a live server says it leads the
        stream's group and that enough replicas are current for a quorum (what /jsz shows;
        not all: a resumed replica may catch up long after writes are confirmed again)."""
        return self.stream_leader(name) is not None

    def stream_leader(self, name):
        """The name of the server that leads stream `name` with a quorum current, or None."""
        for i, s in enumerate(self.servers):
            if not self.alive(i):
                continue
            try:
                js = self.get(i, "/jsz?streams=true")
            except (OSError, ValueError):
                continue
            for acc in js.get("account_details") or []:
                for st in acc.get("stream_detail") or []:
                    cl = st.get("cluster") or {}
                    reps = cl.get("replicas") or []
                    current = 1 + sum(1 for r in reps if r.get("current"))  # the leader's own
                    if (st.get("name") == name and cl.get("leader") == s["name"] and
                            current > (len(reps) + 1) // 2):
                        return s["name"]
        return None

    def request(self, i, subject, payload=b""):
        """One request to server i in NATS's text protocol: the answer's payload."""
        with socket.create_connection(("127.0.0.1", self.servers[i]["port"]), timeout=5) as sk:
            f = sk.makefile("rb")
            f.readline()  # INFO
            sk.sendall(b'CONNECT {"verbose":false}\r\nSUB _rq.1 1\r\nPUB %s _rq.1 %d\r\n%s\r\n'
                       % (subject.encode(), len(payload), payload))
            for ln in iter(f.readline, b""):
                if ln.startswith(b"PING"):
                    sk.sendall(b"PONG\r\n")
                elif ln.startswith(b"MSG"):
                    return f.read(int(ln.split()[-1]) + 2)[:-2]
            raise OSError(f"{self.servers[i]['name']} closed without answering {subject}")

    def lead_elsewhere(self, name, i, timeout=90.0):
        """Stream `name` led, with a quorum, by another server than i: its leader steps down
        (JetStream's API) until one is."""
        deadline = time.monotonic() + timeout
        while (leader := self.stream_leader(name)) in (None, self.servers[i]["name"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"stream {name} not led off {self.servers[i]['name']} "
                                   f"within {timeout} s:\n" + self.led_view([name]))
            if leader:
                self.request(i, f"$JS.API.STREAM.LEADER.STEPDOWN.{name}")
            time.sleep(0.05)

    def led_view(self, names):
        """Each live server's view of the streams' leaders and replicas, for a failure."""
        out = []
        for i, s in enumerate(self.servers):
            try:
                js = self.get(i, "/jsz?streams=true")
            except (OSError, ValueError) as e:
                out.append(f"{s['name']}: {e!r}")
                continue
            for acc in js.get("account_details") or []:
                for st in acc.get("stream_detail") or []:
                    if st.get("name") in names:
                        cl = st.get("cluster") or {}
                        reps = [(r.get("name"), r.get("current"))
                                for r in cl.get("replicas") or []]
                        out.append(f"{s['name']}: {st['name']} leader={cl.get('leader')} "
                                   f"replicas={reps}")
        return "\n".join(out)

    # A server resumed from SIGSTOP comes back behind: the groups it is a replica of may elect
    # their leader again (nats-server logs "new stream leader" after the resume), and on 2
    # busy cores the durable stream had none for 11 s after wait_ready returned (which awaits
    # the meta group only), so writes to it time out whatever a client of NATS does. That is
    # nats-server's time, awaited here as its own view of the group; the cap only turns a
    # hang into a failure, as wait_ready's.
    def wait_led(self, names, timeout=90.0):
        deadline = time.monotonic() + timeout
        for name in names:
            while not self.stream_led(name):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JetStream stream {name} has no leader with a "
                                       f"quorum current within {timeout} s:\n"
                                       + self.led_view(names) + "\n" + self.logs())
                time.sleep(0.05)

    def alive(self, i):
        p = self.servers[i]["proc"]
        return p is not None and p.poll() is None

    def kill9(self, i):
        p = self.servers[i]["proc"]
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)

    def stop(self):
        for s in self.servers:
            p = s["proc"]
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for s in self.servers:
            p = s["proc"]
            if p is None:
                continue
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=10)

    def connections(self):
        """Every client connection of the live servers: (server index, connz entry)."""
        out = []
        for i in range(3):
            if not self.alive(i):
                continue
            try:
                for c in self.get(i, "/connz?subs=detail&limit=1024").get("connections", []):
                    out.append((i, c))
            except (OSError, ValueError):
                pass
        return out

    def conn(self, name):
        """The server index and connz entry of the connection named name, or (None, None)."""
        for i, c in self.connections():
            if c.get("name") == name:
                return i, c
        return None, None

    def subjects(self, name):
        """{subject: msgs delivered} of the named connection's subscriptions."""
        _, c = self.conn(name)
        if c is None:
            return {}
        return {s["subject"]: s.get("msgs", 0) for s in c.get("subscriptions_list_detail") or []}


@pytest.fixture(scope="module")
def nats(tmp_path_factory):
    if not os.access(NATS_SERVER, os.X_OK):
        pytest.fail(f"{NATS_SERVER} is missing; run tools/install-deps.sh")
    cluster = NatsCluster(str(tmp_path_factory.mktemp("nats")))
    yield cluster
    cluster.stop()


_secret = []


def secret_file():
    """The nodes' shared secret (cluster.secret_file): one file for the whole run, 0600 in a
    0700 directory of its own, as rtd requires."""
    if not _secret:
        import tempfile
        d = tempfile.mkdtemp(prefix="rt-secret-")
        path = os.path.join(d, "cluster.secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, uuid.uuid4().hex.encode() + uuid.uuid4().hex.encode() + b"\n")
        os.close(fd)
        _secret.append(path)
    return _secret[0]


def cluster_option(node, urls, extra=""):
    """The cluster table for node with NATS urls (and extra keys, "k=v,...")."""
    return 'cluster={node="%s",secret_file="%s",nats={%s}%s}' % (
        node, secret_file(), ",".join(f'"{u}"' for u in urls), "," + extra if extra else "")


started_refusals = []


def connack(node):
    """The reason code of an MQTT 5 CONNECT to node (a fresh client id)."""
    got = threading.Event()
    code = []
    c = mqtt.Client(client_id="ready-" + uuid.uuid4().hex[:8], protocol=mqtt.MQTTv5)
    c.on_connect = lambda _c, _u, _f, rc, *p: (code.append(rc.value), got.set())
    c.connect("127.0.0.1", node.port, keepalive=30)
    c.loop_start()
    try:
        assert got.wait(WAIT), "no CONNACK"
        return code[0]
    finally:
        c.disconnect()
        c.loop_stop()


@pytest.fixture(scope="module")
def nodes(nats):
    """n1, n2, n3, each with all three NATS URLs; waits until each node's two NATS
    connections (routes and shared) show on a NATS server."""
    started = []
    try:
        for i in range(3):
            started.append(Rtd(cluster_option(f"n{i + 1}", nats.urls())))
        want = {f"rtd:n{i + 1}:{role}" for i in range(3) for role in ("routes", "shared")}
        until(lambda: want <= {c.get("name") for _, c in nats.connections()}, WAIT,
              lambda: "rtd NATS connections missing: "
              f"{want - {c.get('name') for _, c in nats.connections()}}\n"
              + "\n".join(n.read_log()[-2000:] for n in started) + nats.logs())
        # The retained store and the client ids are JetStream buckets the first node makes
        # and the others bind: a node says when it has them (until then it is alone there).
        for n in started:
            until(lambda: (lambda st: st["retained"] == "replicated" and st["lease"] == "held")(
                n.ctl_json("cluster", "status")), WAIT, lambda: n.read_log()[-2000:])
        # A client on each node at once, as a client would; test_clients_accepted_at_start
        # looks at what was refused on the way.
        started_refusals.clear()
        for i, n in enumerate(started):
            deadline = time.monotonic() + 30
            while True:
                t0 = time.monotonic()
                code = connack(n)
                if code == 0:
                    break
                started_refusals.append(
                    f"n{i + 1}: CONNACK {code:#x} after {time.monotonic() - t0:.1f} s; " +
                    "; ".join(ln for ln in n.read_log().splitlines() if "claim" in ln))
                assert time.monotonic() < deadline, started_refusals
    except BaseException:
        for n in started:
            n.stop()
        raise
    yield started
    bad = []
    for n in started:
        code, log = n.stop()
        if code != 0:
            bad.append(f"exit {code}:\n{log[-3000:]}")
        # What a node says when it lost a route or a message on the way.
        for word in ("cluster.route_lost", "cluster.route_failed", "cluster.subscribe_failed",
                     "cluster.slow_consumer", "cluster.route_too_long"):
            lines = [ln for ln in log.splitlines() if word in ln]
            if lines:
                bad.append("\n".join(lines[:5]))
    assert not bad, "\n".join(bad)


@pytest.fixture
def pfx():
    """A topic prefix of this test's own (letters and digits: a NATS token as it is)."""
    return "c" + uuid.uuid4().hex[:10]


# ---- MQTT clients ----

class Msg:
    __slots__ = ("topic", "payload", "qos", "retain", "props")

    def __init__(self, m):
        self.topic = m._topic  # the exact bytes
        self.payload = m.payload
        self.qos = m.qos
        self.retain = m.retain
        self.props = getattr(m, "properties", None)

    def __repr__(self):
        return f"Msg({self.topic!r}, {self.payload[:40]!r}, qos={self.qos}, retain={self.retain})"


class Mq:
    """A paho client on one node that keeps what it receives: msgs (measured) and probes."""

    def __init__(self, node, v5=True, name="c", clean=True, inflight=None, cid=None, expiry=0,
                 will=None):
        # cid "": the broker assigns one (MQTT 5), and a cluster node claims none.
        self.id = f"{name}-{uuid.uuid4().hex[:8]}" if cid is None else cid
        self.v5 = v5
        if v5:
            self.c = mqtt.Client(client_id=self.id, protocol=mqtt.MQTTv5)
        else:
            self.c = mqtt.Client(client_id=self.id, protocol=mqtt.MQTTv311, clean_session=clean)
        if inflight:
            self.c.max_inflight_messages_set(inflight)
        self.cond = threading.Condition()
        self.msgs, self.probes, self.acks, self.disconnects = [], [], {}, []
        self.connected = self.session_present = None
        self.c.on_message = self._on_message
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.c.on_subscribe = self._on_ack
        self.c.on_unsubscribe = self._on_ack
        if will:  # (topic, payload, delay in seconds)
            wprops = Properties(PacketTypes.WILLMESSAGE)
            wprops.WillDelayInterval = will[2]
            self.c.will_set(will[0], will[1], qos=1, properties=wprops)
        if v5:
            props = None
            if expiry:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = expiry
            self.c.connect("127.0.0.1", node.port, keepalive=30, clean_start=clean,
                           properties=props)
        else:
            self.c.connect("127.0.0.1", node.port, keepalive=30)
        self.c.loop_start()
        # "Server unavailable" (0x88; MQTT 3.1.1: 3) is what a node answers a persistent
        # session while it cannot claim the id (JetStream still electing after an earlier
        # test's fault): paho connects again a second later, as a client would.
        busy = 0x88 if v5 else 3
        self.wait(lambda: self.connected not in (None, busy), WAIT, "no CONNACK but 0x88")
        assert self.connected == 0, f"CONNACK {self.connected}"

    def _on_connect(self, c, u, flags, rc, *props):
        with self.cond:
            self.connected = rc if isinstance(rc, int) else rc.value
            self.session_present = flags.get("session present")
            self.cond.notify_all()

    def _on_disconnect(self, c, u, rc, *props):
        with self.cond:
            self.disconnects.append(rc if isinstance(rc, int) else rc.value)
            self.cond.notify_all()

    def _on_ack(self, c, u, mid, *rest):
        with self.cond:
            self.acks[mid] = rest[0] if rest else None
            self.cond.notify_all()

    def _on_message(self, c, u, m):
        msg = Msg(m)
        with self.cond:
            (self.probes if m.payload.startswith(PROBE) else self.msgs).append(msg)
            self.cond.notify_all()

    def wait(self, pred, timeout, what):
        with self.cond:
            if self.cond.wait_for(pred, timeout):
                return
            got = (f" (client {self.id}: {len(self.msgs)} messages, last "
                   f"{self.msgs[-3:]}, {len(self.probes)} probes)")
        pytest.fail(f"timed out after {timeout} s: " + (what() if callable(what) else what) + got)

    def wait_count(self, n, timeout=WAIT):
        self.wait(lambda: len(self.msgs) >= n, timeout, f"{n} messages")

    def subscribe(self, filt, qos=0, no_local=False, rap=False, sub_id=None):
        if self.v5:
            props = None
            if sub_id:
                props = Properties(PacketTypes.SUBSCRIBE)
                props.SubscriptionIdentifier = sub_id
            rc, mid = self.c.subscribe(filt, options=SubscribeOptions(
                qos=qos, noLocal=no_local, retainAsPublished=rap), properties=props)
        else:
            rc, mid = self.c.subscribe(filt, qos)
        assert rc == 0
        self.wait(lambda: mid in self.acks, 10, f"SUBACK for {filt}")
        codes = self.acks[mid]
        code = codes[0] if isinstance(codes[0], int) else codes[0].value
        assert code == qos, f"SUBACK {filt}: {codes}"

    def unsubscribe(self, filt):
        rc, mid = self.c.unsubscribe(filt)
        assert rc == 0
        self.wait(lambda: mid in self.acks, 10, f"UNSUBACK for {filt}")

    def publish(self, topic, payload, qos=0, retain=False, props=None, wait=True):
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=props)
        assert info.rc == 0, info.rc
        if wait and qos:
            info.wait_for_publish(WAIT)
            assert info.is_published(), f"no acknowledgement for {topic} within {WAIT} s"
        return info

    def probe_ids(self):
        with self.cond:
            return {m.payload for m in self.probes}

    def close(self):
        try:
            self.c.disconnect()
        finally:
            self.c.loop_stop()


@pytest.fixture
def mq():
    """mq(node, ...) makes an Mq that is disconnected when the test ends."""
    made = []

    def make(node, **kw):
        c = Mq(node, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def await_route(pub, topic, subs, timeout=WAIT, qos=0):
    """Publishes probes on topic from pub until every client in subs has received one (each
    probe once: a shared group's member too, as NATS picks). Returns the probes' count."""
    before = {s: len(s.probes) for s in subs}
    deadline = time.monotonic() + timeout
    n = 0
    while True:
        pub.publish(topic, PROBE + b"r%d" % n, qos=qos)
        n += 1
        step = time.monotonic() + 0.1
        while time.monotonic() < step:
            if all(len(s.probes) > before[s] for s in subs):
                return n
            time.sleep(0.005)
        if time.monotonic() > deadline:
            missing = [s.id for s in subs if len(s.probes) <= before[s]]
            pytest.fail(f"no probe on {topic} reached {missing} after {n} probes in {timeout} s")


def fence(pub, topic, subs, timeout=WAIT, qos=1):
    """One more message after the measured ones: once every sub has it, whatever came before
    (a duplicate included) has arrived too (one publisher, one path: NATS keeps order). At the
    measured messages' QoS: paho hands a QoS 2 message over at PUBREL, a QoS 1 one at once."""
    mark = PROBE + b"fence-" + uuid.uuid4().hex.encode()
    pub.publish(topic, mark, qos=qos)
    for s in subs:
        s.wait(lambda: mark in {m.payload for m in s.probes}, timeout, f"fence on {topic}")


def payloads(c):
    with c.cond:
        return [m.payload for m in c.msgs]



class LoneNats:
    """One nats-server of its own (no cluster, no JetStream), to take away from a node."""

    def __init__(self, base):
        self.port, self.mport = free_port(), free_port()
        self.log = os.path.join(base, "nats-lone.log")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.mport)],
                stdout=log, stderr=subprocess.STDOUT)

        def up():
            if self.proc.poll() is not None:
                pytest.fail("nats-server exited: " + open(self.log).read()[-2000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.mport}/healthz",
                                            timeout=2) as r:
                    return json.loads(r.read()).get("status") == "ok"
            except (OSError, ValueError):
                return False
        until(up, WAIT, lambda: open(self.log).read()[-2000:])

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def cut_off(tmp_path):
    """A node whose only NATS server was killed after it connected (cluster.disconnected)."""
    lone = LoneNats(str(tmp_path))
    try:
        node = Rtd(cluster_option("cut", [f"nats://127.0.0.1:{lone.port}"]))
    except BaseException:
        lone.stop()
        raise
    try:
        lone.stop(signal.SIGKILL)
        until(lambda: "cluster.disconnected" in node.read_log(), WAIT,
              lambda: node.read_log()[-2000:])
        yield node
    finally:
        t1 = time.monotonic()
        code, log = node.stop()
        lone.stop()
        assert code == 0, log[-3000:]
        assert time.monotonic() - t1 < 8, "stop took long with NATS down"





def durable_option(node, urls):
    return cluster_option(node, urls, 'prefix="rd",durable=true,replay_margin=2')


@pytest.fixture
def durable_nodes(nats):
    started = []
    try:
        for i in range(3):
            started.append(Rtd(durable_option(f"d{i + 1}", nats.urls())))
        # Durable, and holding its lease: a claim on a node whose lease lapsed (JetStream
        # still settling after an earlier test's fault) fails at once, 0x88.
        for n in started:
            until(lambda: (lambda st: st["durable"] == "on" and st["lease"] == "held")(
                n.ctl_json("cluster", "status")), WAIT, lambda: n.read_log()[-2000:])
        yield started
    finally:
        for n in started:
            if n.proc.poll() is None:
                n.stop()
