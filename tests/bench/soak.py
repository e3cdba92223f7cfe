#!/usr/bin/python3
"""Soak of rtd (issue 14): many connections churning subscriptions, sessions and queues for a
long time, while every heap is checked against gc_factor x live and RSS is sampled.

    soak.py [--duration 600] [--connections 20000] [--workers 4] [--quick] [--out DIR]

--quick is the CI size: 2,000 connections for 75 s, churn twice as often.

It starts its own rtd (RT_BUILD_DIR or --build; data in a temporary directory, the archive
sink and its rules off: the broker, not SQLite) on a free 127.0.0.1 port, and --workers processes, each
a selectors loop over its share of the connections bound to its own source address
127.0.0.(2+i) (so ephemeral ports and TIME_WAIT are per worker). Raw MQTT 5, no client
library: paho cannot drive 20,000 connections from two cores.

Each client has one role, by index:
  sub      (70%) clean start; 1..5 filters (exact, soak/a/b/+, soak/a/b/#, soak/+/b/c) at
           QoS 0 or 1; subscribes or unsubscribes one every 5..30 s; reconnects (a new actor)
           every 60..180 s.
  slow     (10%) like sub at QoS 1 with a 4 KB receive buffer, and it stops reading for
           5..20 s, then reads for 5..20 s: its queue in rtd grows and drains.
  pub      (15%) publishes every 2..8 s (--quick: 0.5..2 s) a QoS 0 or 1 message of 16..1024 B
           to a random soak/a/b/c; one in three also publishes a numbered QoS 1 stream to
           one persist client.
  persist  (5%)  clean start false, session expiry 600 s, subscribes soak/p/W/I at QoS 1 and
           a wildcard; goes offline for 5..20 s (DISCONNECT) every 10..40 s, so its queue
           fills offline and drains on return. Every stream message rtd PUBACKed to its
           publisher must reach it: at the end every persist client comes back and drains.
rtd holds at most --max-open connections (its fd limit is 20,000): a worker reconnects a
client only while it has fewer than its share open, so some persist clients wait offline.

Every --interval s the main process records rtd's VmRSS and, from `rtctl actors list --json`,
every mqtt_conn actor's heap: the check is heap_bytes + bin_bytes <= next_gc + SLACK, where
next_gc = max(min_heap, gc_factor x (live + bin bytes)) is the trigger the actor's last
collection set (runtime/heap.c) and SLACK is what rtd may add between two checks of the
trigger (see slack()). Output: DIR/samples.tsv (one line a sample), DIR/kinds.tsv (rtd's
`rtctl vm` memory_by_kind at each sample), DIR/summary.json.
Exit 0 when the heap check, the RSS check and the stream check hold, 1 otherwise.
"""
import argparse
import errno
import heapq
import json
import os
import random
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# rtd's `vm` kinds of memory held freed for reuse: left out of the "net" RSS growth.
FREE_KINDS = ("malloc: free", "runtime: actor slab, free", "runtime: heap chunks, free",
              "runtime: socket buffers, free", "binaries, free")

# ---- MQTT 5 encoding, only what the soak sends ----


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def mstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def packet(first, body):
    return bytes([first]) + varint(len(body)) + body


def connect_pkt(client_id, clean, expiry, recv_max=64):
    props = b"\x21" + struct.pack("!H", recv_max)
    if expiry:
        props += b"\x11" + struct.pack("!I", expiry)
    var = mstr("MQTT") + bytes([5, 0x02 if clean else 0]) + struct.pack("!H", 0)
    return packet(0x10, var + varint(len(props)) + props + mstr(client_id))


def subscribe_pkt(pid, flt, qos):
    return packet(0x82, struct.pack("!H", pid) + b"\x00" + mstr(flt) + bytes([qos]))


def unsubscribe_pkt(pid, flt):
    return packet(0xA2, struct.pack("!H", pid) + b"\x00" + mstr(flt))


def publish_pkt(topic, payload, qos, pid):
    body = mstr(topic) + (struct.pack("!H", pid) if qos else b"") + b"\x00" + payload
    return packet(0x30 | (qos << 1), body)


def puback_pkt(pid):
    return packet(0x40, struct.pack("!H", pid))


DISCONNECT = packet(0xE0, b"\x00\x00")

# ---- a worker: one selectors loop over its clients ----

A, B, C = 100, 100, 10  # topics soak/a/b/c


def random_filter(rng):
    a, b, c = rng.randrange(A), rng.randrange(B), rng.randrange(C)
    r = rng.random()
    if r < 0.4:
        return f"soak/{a}/{b}/{c}"
    if r < 0.7:
        return f"soak/{a}/{b}/+"
    if r < 0.9:
        return f"soak/{a}/{b}/#"
    return f"soak/+/{b}/{c}"


class Client:
    __slots__ = ("idx", "cid", "role", "sock", "state", "inbuf", "outbuf", "filters", "pid",
                 "reading", "gen", "acked", "got", "stream_to", "seq", "inflight", "qos",
                 "subscribed_once", "want_online")

    def __init__(self, idx, cid, role):
        self.idx, self.cid, self.role = idx, cid, role
        self.sock = None
        self.state = "off"  # off, connecting, connack, up
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.filters = {}
        self.pid = 0
        self.reading = True
        self.gen = 0  # bumped at each (re)connect: timers of an older connection are stale
        self.acked = set()  # stream: seqs rtd PUBACKed to this persist client's publisher
        self.got = set()  # persist: stream seqs received
        self.stream_to = None  # pub: the persist client it streams to
        self.seq = 0
        self.inflight = {}  # pub: packet id -> (persist client, seq) or None
        self.qos = 1
        self.subscribed_once = False
        self.want_online = True

    def next_pid(self):
        self.pid = self.pid % 65535 + 1
        return self.pid


class Worker:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed * 1000 + args.worker)
        self.sel = selectors.DefaultSelector()
        self.timers = []
        self.tseq = 0
        self.open = 0
        self.pending_connects = 0
        self.bind = f"127.0.0.{2 + args.worker}"
        self.stats = {k: 0 for k in (
            "connects", "reconnects", "connack_fail", "session_lost", "closed_by_broker",
            "subscribes", "unsubscribes", "publishes_q0", "publishes_q1", "pubacks",
            "received", "received_bytes", "offline_cycles", "slow_pauses", "stream_acked",
            "stream_received", "stream_dups", "stream_lost", "errors", "waits_for_fd")}
        self.clients = []
        n, w, W = args.connections, args.worker, args.workers
        mine = range(w, n, W)
        for i in mine:
            r = (i * 7919) % 100
            role = "sub" if r < 70 else "slow" if r < 80 else "pub" if r < 95 else "persist"
            self.clients.append(Client(len(self.clients), f"soak-{i}", role))
        self.cap = args.max_open // W
        persist = [c for c in self.clients if c.role == "persist"]
        pubs = [c for c in self.clients if c.role == "pub"]
        for k, p in enumerate(persist):  # each persist client gets one stream publisher
            if pubs:
                pubs[k % len(pubs)].stream_to = pubs[k % len(pubs)].stream_to or p
        self.persist = persist
        self.stopping = False
        self.final = False

    # timers
    def at(self, delay, c, what):
        self.tseq += 1
        heapq.heappush(self.timers, (time.monotonic() + delay, self.tseq, c.idx, c.gen, what))

    def span(self, lo, hi):
        return self.rng.uniform(lo, hi) * (self.a.time_scale)

    # connections
    def start_connect(self, c):
        if self.open >= self.cap or self.pending_connects >= 256:
            self.stats["waits_for_fd"] += self.open >= self.cap
            self.at(0.2 + self.rng.random(), c, "connect")
            return
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if c.role == "slow":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            s.bind((self.bind, 0))
            err = s.connect_ex(("127.0.0.1", self.a.port))
        except OSError:
            s.close()
            self.stats["errors"] += 1
            self.at(1.0, c, "connect")
            return
        if err not in (0, errno.EINPROGRESS):
            s.close()
            self.stats["errors"] += 1
            self.at(1.0, c, "connect")
            return
        c.gen += 1
        c.sock, c.state, c.reading = s, "connecting", True
        c.inbuf.clear()
        c.outbuf.clear()
        self.open += 1
        self.pending_connects += 1
        self.sel.register(s, selectors.EVENT_WRITE, c)
        self.stats["connects"] += 1

    def close(self, c, graceful):
        if not c.sock:
            return
        if graceful and c.state == "up":
            try:
                c.sock.send(bytes(c.outbuf) + DISCONNECT)
            except OSError:
                pass
        if c.state == "connecting":
            self.pending_connects -= 1
        try:
            self.sel.unregister(c.sock)
        except KeyError:
            pass
        c.sock.close()
        c.sock, c.state = None, "off"
        c.outbuf.clear()
        c.gen += 1
        self.open -= 1
        if c.role == "pub":
            c.inflight.clear()  # QoS 1 not PUBACKed: not counted as acknowledged

    def send(self, c, data):
        if not c.sock or c.state != "up" and not data.startswith(b"\x10"):
            return False
        if not c.outbuf:
            try:
                n = c.sock.send(data)
            except BlockingIOError:
                n = 0
            except OSError:
                self.lost(c)
                return False
            if n == len(data):
                return True
            data = data[n:]
        c.outbuf += data
        self.update(c)
        return True

    def update(self, c):
        """Registers what c waits for: reading unless paused, writing while output waits."""
        ev = (selectors.EVENT_READ if c.reading else 0) | (
            selectors.EVENT_WRITE if c.outbuf or c.state == "connecting" else 0)
        try:
            cur = self.sel.get_key(c.sock).events
        except KeyError:
            cur = 0
        if ev == cur:
            return
        if not cur:
            self.sel.register(c.sock, ev, c)
        elif not ev:
            self.sel.unregister(c.sock)
        else:
            self.sel.modify(c.sock, ev, c)

    def lost(self, c):
        if c.sock:
            self.stats["closed_by_broker"] += c.state == "up"
            self.close(c, False)
        if not self.final or c.role == "persist":
            self.at(1.0, c, "connect")

    def on_connected(self, c):
        self.pending_connects -= 1
        c.state = "connack"
        clean = c.role != "persist"
        c.sock.send(connect_pkt(c.cid, clean, 600 if not clean else 0))

    def on_connack(self, c, body):
        if len(body) < 2 or body[1] != 0:
            self.stats["connack_fail"] += 1
            self.lost(c)
            return
        c.state = "up"
        present = body[0] & 1
        if c.role == "persist" and c.subscribed_once and not present:
            self.stats["session_lost"] += 1
        if c.role != "persist" or not c.subscribed_once:
            c.filters.clear()
            if c.role == "persist":
                self.subscribe(c, f"soak/p/{self.a.worker}/{c.idx}", 1)
                self.subscribe(c, random_filter(self.rng), 1)
            else:
                for _ in range(self.rng.randint(1, 5)):
                    self.subscribe(c, random_filter(self.rng),
                                   1 if c.role == "slow" else self.rng.randint(0, 1))
        if self.stopping:
            return
        if c.role in ("sub", "slow"):
            self.at(self.span(5, 30), c, "churn")
            if c.role == "sub":
                self.at(self.span(60, 180), c, "reconnect")
            else:
                self.at(self.span(5, 20), c, "pause")
        elif c.role == "pub":
            self.at(self.rng.uniform(*self.a.pub_every), c, "publish")
        elif c.role == "persist":
            self.at(self.span(10, 40), c, "offline")

    def subscribe(self, c, flt, qos):
        if self.send(c, subscribe_pkt(c.next_pid(), flt, qos)):
            c.filters[flt] = qos
            self.stats["subscribes"] += 1

    # timer actions
    def fire(self, c, what):
        if what == "connect":
            if self.final and c.role != "persist":
                return
            if c.state == "off" and (c.want_online or self.final):
                self.start_connect(c)
            return
        if c.state != "up" or self.stopping:
            return
        rng = self.rng
        if what == "churn":
            if c.filters and (len(c.filters) >= 5 or rng.random() < 0.5):
                flt = rng.choice(list(c.filters))
                if self.send(c, unsubscribe_pkt(c.next_pid(), flt)):
                    del c.filters[flt]
                    self.stats["unsubscribes"] += 1
            else:
                self.subscribe(c, random_filter(rng), 1 if c.role == "slow" else rng.randint(0, 1))
            self.at(self.span(5, 30), c, "churn")
        elif what == "reconnect":
            self.close(c, True)
            self.stats["reconnects"] += 1
            self.at(0.5, c, "connect")
        elif what == "pause":
            c.reading = not c.reading
            self.stats["slow_pauses"] += not c.reading
            self.update(c)
            self.at(self.span(5, 20), c, "pause")
        elif what == "offline":
            self.close(c, True)
            self.stats["offline_cycles"] += 1
            c.want_online = False
            self.at(self.span(5, 20), c, "online")
        elif what == "publish":
            self.publish(c)
            self.at(rng.uniform(*self.a.pub_every), c, "publish")

    def publish(self, c):
        rng = self.rng
        if len(c.inflight) < 32:
            qos = rng.randint(0, 1)
            payload = os.urandom(rng.randint(16, 1024))
            topic = f"soak/{rng.randrange(A)}/{rng.randrange(B)}/{rng.randrange(C)}"
            pid = c.next_pid() if qos else 0
            if self.send(c, publish_pkt(topic, payload, qos, pid)):
                self.stats["publishes_q1" if qos else "publishes_q0"] += 1
                if qos:
                    c.inflight[pid] = None
        p = c.stream_to
        if p and p.subscribed_once and len(c.inflight) < 64:
            c.seq += 1
            pid = c.next_pid()
            payload = struct.pack("!Q", c.seq) + bytes(rng.randint(8, 1016))
            if self.send(c, publish_pkt(f"soak/p/{self.a.worker}/{p.idx}", payload, 1, pid)):
                c.inflight[pid] = (p, c.seq)

    # input
    def on_readable(self, c):
        try:
            data = c.sock.recv(262144)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.lost(c)
            return
        c.inbuf += data
        buf = c.inbuf
        pos = 0
        while len(buf) - pos >= 2:
            n, mult, i = 0, 1, pos + 1
            while i < len(buf):
                b = buf[i]
                n += (b & 0x7F) * mult
                mult <<= 7
                i += 1
                if not b & 0x80:
                    break
            else:
                break
            if len(buf) - i < n:
                break
            self.on_packet(c, buf[pos], bytes(buf[i:i + n]))
            pos = i + n
            if not c.sock:
                return
        del buf[:pos]

    def on_packet(self, c, first, body):
        t = first >> 4
        if t == 2:
            self.on_connack(c, body)
        elif t == 3:
            qos = (first >> 1) & 3
            tl = struct.unpack_from("!H", body)[0]
            topic = body[2:2 + tl]
            pos = 2 + tl
            pid = None
            if qos:
                pid = struct.unpack_from("!H", body, pos)[0]
                pos += 2
            plen, mult = 0, 1
            while True:
                b = body[pos]
                pos += 1
                plen += (b & 0x7F) * mult
                mult <<= 7
                if not b & 0x80:
                    break
            pos += plen
            self.stats["received"] += 1
            self.stats["received_bytes"] += len(body) - pos
            if c.role == "persist" and topic.startswith(b"soak/p/"):
                seq = struct.unpack_from("!Q", body, pos)[0]
                if seq in c.got:
                    self.stats["stream_dups"] += 1
                c.got.add(seq)
            if qos == 1:
                self.send(c, puback_pkt(pid))
        elif t == 4:
            pid = struct.unpack_from("!H", body)[0]
            if pid in c.inflight:
                ent = c.inflight.pop(pid)
                self.stats["pubacks"] += 1
                if ent:
                    ent[0].acked.add(ent[1])
                    self.stats["stream_acked"] += 1
        elif t == 9:
            if c.role == "persist":
                c.subscribed_once = True
        elif t == 14:
            self.lost(c)

    def on_writable(self, c):
        if c.state == "connecting":
            err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self.stats["errors"] += 1
                self.lost(c)
                return
            self.on_connected(c)
        if c.outbuf:
            try:
                n = c.sock.send(c.outbuf)
                del c.outbuf[:n]
            except BlockingIOError:
                pass
            except OSError:
                self.lost(c)
                return
        self.update(c)

    # the run
    def report(self, kind):
        s = dict(self.stats)
        s["open"] = self.open
        s["kind"] = kind
        s["worker"] = self.a.worker
        print(json.dumps(s), flush=True)

    def run(self):
        t0 = time.monotonic()
        end = t0 + self.a.duration
        for c in self.clients:
            self.at(self.rng.uniform(0, self.a.ramp), c, "connect")
        next_report = t0 + 5
        drain_end = None
        while True:
            now = time.monotonic()
            if not self.stopping and now >= end:
                self.begin_final()
                drain_end = now + self.a.drain
            if self.final and (now >= drain_end or self.drained()):
                break
            while self.timers and self.timers[0][0] <= now:
                _, _, idx, gen, what = heapq.heappop(self.timers)
                c = self.clients[idx]
                if what == "online":
                    c.want_online = True
                    if c.state == "off":
                        self.start_connect(c)
                elif gen == c.gen or what == "connect":
                    self.fire(c, what)
            timeout = min(1.0, max(0.0, self.timers[0][0] - now)) if self.timers else 1.0
            for key, ev in self.sel.select(timeout):
                c = key.data
                if ev & selectors.EVENT_WRITE and c.sock:
                    self.on_writable(c)
                if ev & selectors.EVENT_READ and c.sock:
                    self.on_readable(c)
            if now >= next_report:
                self.report("progress")
                next_report = now + 5
        for c in self.persist:
            missing = c.acked - c.got
            self.stats["stream_lost"] += len(missing)
        self.stats["stream_received"] = sum(len(c.got & c.acked) for c in self.persist)
        self.report("final")
        for c in self.clients:
            self.close(c, True)

    def begin_final(self):
        """Stops churn and publishing; closes the non-persist clients (freeing their fds) and
        brings every persist client back to drain what its session holds."""
        self.stopping = True
        time.sleep(1.0)  # PUBACKs in flight come in below, before the drain is judged
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(p.inflight for p in self.clients
                                                  if p.role == "pub" and p.sock):
            for key, ev in self.sel.select(0.1):
                c = key.data
                if ev & selectors.EVENT_WRITE and c.sock:
                    self.on_writable(c)
                if ev & selectors.EVENT_READ and c.sock:
                    self.on_readable(c)
        self.final = True
        for c in self.clients:
            if c.role != "persist":
                self.close(c, True)
        for c in self.persist:
            c.want_online = True
            c.reading = True
            if c.state == "off":
                self.start_connect(c)
            elif c.sock:
                self.update(c)

    def drained(self):
        return all(c.state == "up" and c.acked <= c.got for c in self.persist)


def worker_main(args):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Worker(args).run()


# ---- the main process: rtd, the workers, the samples ----


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def slack(msg_max):
    """What a conn actor's footprint may exceed its trigger by when sampled (heap.c): the
    trigger is checked only between messages, and one message's allocations come first (the
    largest packet it reads or writes, from its own large-object allocation or fresh 1 KiB
    chunks, and that message's binary); the footprint rule fires from 1/16 below the trigger
    only once half the allocation budget is spent, so up to one partly used chunk per size
    class (10 x 1 KiB) can stand above it; and the heap's own header (heap.h: 176 B of
    counters and class lists, and the 256-byte first block every class starts in)."""
    chunk = 1024
    return 2 * (msg_max + 256) + 10 * chunk + 176 + 256


def start_rtd(args, data_dir):
    build = args.build
    rules = os.path.join(data_dir, "rules")  # none: the stock rules feed the archive sink
    os.makedirs(rules, exist_ok=True)
    argv = [os.path.join(build, "rtd"), "-c", os.path.join(ROOT, "etc", "rtd.conf"),
            "-o", f"listeners=127.0.0.1:{args.port}", "-o", f'data_dir="{data_dir}"',
            "-o", "sinks={}", "-o", f'rules_dir="{rules}"',
            "-o", "log_level=\"warning\""] + sum(
                (["-o", o] for o in args.rtd_opt), [])

    def nofile():
        import resource
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    log = open(os.path.join(args.out, "rtd.log"), "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=nofile)
    sock = os.path.join(data_dir, "rtd.sock")
    deadline = time.time() + 15
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit("rtd exited: " + open(os.path.join(args.out, "rtd.log")).read())
        if os.path.exists(sock):
            r = subprocess.run([os.path.join(build, "rtctl"), "-s", sock, "status"],
                               capture_output=True, timeout=10)
            if r.returncode == 0:
                return proc, sock
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("rtd did not start")


def ctl_json(args, sock, *cmd, timeout=60):
    r = subprocess.run([os.path.join(args.build, "rtctl"), "-s", sock, "--timeout", str(timeout)]
                       + list(cmd) + ["--json"], capture_output=True, text=True,
                       timeout=timeout + 10)
    if r.returncode != 0:
        raise RuntimeError(f"rtctl {cmd}: {r.stderr}")
    return json.loads(r.stdout)


def heap_sample(args, sock, gc_factor, min_heap, slk):
    """One look at every mqtt_conn actor's heap. Checked: heap_bytes + bin_bytes <= next_gc +
    slack, next_gc being max(min_heap, gc_factor x (live + bin bytes)) as the actor's last
    collection set it. Reported, not checked: heap_bytes against max(min_heap, gc_factor x
    live_bytes) alone, which binaries held at that collection (queued messages since sent)
    may lift for as long as the next collection is not due."""
    rows = ctl_json(args, sock, "actors", "list", "--limit", "1000000", "--sort", "memory")
    conns = [r for r in rows if r["type"] == "mqtt_conn"]
    over, worst, sized, live_ratio, live_over, top = [], 0.0, 0, 0.0, 0, None
    for r in conns:
        foot = r["heap_bytes"] + r["bin_bytes"]
        trig = r["next_gc"] or min_heap
        if foot > trig + slk:
            over.append(r)
        worst = max(worst, foot / trig)
        if r["gcs"] and trig > min_heap:
            sized += 1  # its trigger comes from gc_factor x live, not the min_heap floor
        if r["gcs"]:
            bound = max(min_heap, gc_factor * r["live_bytes"])
            q = r["heap_bytes"] / bound
            live_over += r["heap_bytes"] > bound + slk
            if q > live_ratio:
                live_ratio, top = q, r
    return {"actors": len(rows), "conns": len(conns),
            "conn_heap_sum": sum(r["heap_bytes"] for r in conns),
            "conn_bin_sum": sum(r["bin_bytes"] for r in conns),
            "conn_foot_max": max((r["heap_bytes"] + r["bin_bytes"] for r in conns), default=0),
            "collected": sum(1 for r in conns if r["gcs"]), "gc_sized": sized,
            "foot_over_trigger_max": round(worst, 3), "over": len(over),
            "over_examples": over[:3], "heap_over_factor_live_max": round(live_ratio, 3),
            "heap_over_factor_live_count": live_over, "live_example": top}


def linear_slope(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def main_run(args):
    os.makedirs(args.out, exist_ok=True)
    if not args.port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    data_dir = tempfile.mkdtemp(prefix="rtd-soak-")
    rtd, sock = start_rtd(args, data_dir)
    conf = {r["setting"]: r["value"] for r in ctl_json(args, sock, "config", "show")}
    gc_factor, min_heap = float(conf["gc_factor"]), int(conf["min_heap"])
    slk = slack(1024 + 64)
    workers = []
    me = os.path.abspath(__file__)
    for w in range(args.workers):
        argv = [sys.executable, me, "--worker", str(w), "--workers", str(args.workers),
                "--connections", str(args.connections), "--port", str(args.port),
                "--duration", str(args.duration), "--seed", str(args.seed),
                "--max-open", str(args.max_open), "--ramp", str(args.ramp),
                "--time-scale", str(args.time_scale), "--drain", str(args.drain),
                "--pub-every", str(args.pub_every[0]), str(args.pub_every[1])]
        workers.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                                        preexec_fn=start_nofile))
    for w in workers:
        os.set_blocking(w.stdout.fileno(), False)
    latest = [{} for _ in workers]
    bufs = ["" for _ in workers]

    def poll_workers():
        for i, w in enumerate(workers):
            try:
                chunk = w.stdout.read()
            except (BlockingIOError, TypeError):
                chunk = None
            if chunk:
                bufs[i] += chunk
                *lines, bufs[i] = bufs[i].split("\n")
                for line in lines:
                    if line.strip():
                        latest[i] = json.loads(line)

    def totals():
        keys = set().union(*[set(d) for d in latest]) - {"kind", "worker"}
        return {k: sum(d.get(k, 0) for d in latest) for k in sorted(keys)}

    tsv = open(os.path.join(args.out, "samples.tsv"), "w")
    cols = ["t_s", "rss_kb", "held_free_kb", "open", "conns", "conn_heap_sum", "conn_bin_sum", "conn_foot_max",
            "collected", "gc_sized", "foot_over_trigger_max", "over", "heap_over_factor_live_max",
            "heap_over_factor_live_count", "connects",
            "reconnects", "subscribes", "unsubscribes", "publishes", "received",
            "offline_cycles", "slow_pauses", "stream_acked"]
    tsv.write("\t".join(cols) + "\n")
    kinds = open(os.path.join(args.out, "kinds.tsv"), "w")
    kinds.write("t_s\tkind\tbytes\n")
    samples = []
    t0 = time.monotonic()
    hard_end = t0 + args.duration + args.drain + 60
    next_sample = t0
    over_total, ratio_max, trig_max, crash, live_ex = 0, 0.0, 0.0, None, None
    examples = []
    while any(w.poll() is None for w in workers) and time.monotonic() < hard_end:
        poll_workers()
        now = time.monotonic()
        if rtd.poll() is not None:
            crash = f"rtd exited {rtd.returncode}"
            break
        if now >= next_sample and now - t0 <= args.duration + 1:
            next_sample += args.interval
            try:
                h = heap_sample(args, sock, gc_factor, min_heap, slk)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"sample failed: {e}", file=sys.stderr)
                continue
            tot = totals()
            row = {"t_s": round(now - t0, 1), "rss_kb": rss_kb(rtd.pid), **h, **tot}
            try:  # rtd's own account of its RSS, by kind: what a step in RSS was
                for k in ctl_json(args, sock, "vm")["memory_by_kind"]["kinds"]:
                    kinds.write(f"{row['t_s']}\t{k['kind']}\t{k['bytes']}\n")
                    if k["kind"] in FREE_KINDS:
                        row["held_free_kb"] = row.get("held_free_kb", 0) + k["bytes"] // 1024
                kinds.flush()
            except (RuntimeError, subprocess.TimeoutExpired, KeyError) as e:
                print(f"vm sample failed: {e}", file=sys.stderr)
            row["publishes"] = tot.get("publishes_q0", 0) + tot.get("publishes_q1", 0)
            samples.append(row)
            over_total += h["over"]
            examples += h["over_examples"]
            if h["heap_over_factor_live_max"] > ratio_max:
                ratio_max, live_ex = h["heap_over_factor_live_max"], h["live_example"]
            trig_max = max(trig_max, h["foot_over_trigger_max"])
            tsv.write("\t".join(str(row.get(k, "")) for k in cols) + "\n")
            tsv.flush()
            if not args.quiet:
                print("\t".join(f"{k}={row.get(k, '')}" for k in cols[:13]), file=sys.stderr)
        time.sleep(0.2)
    for w in workers:
        try:
            w.wait(timeout=max(1, hard_end - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
    poll_workers()
    for i, w in enumerate(workers):
        rest = w.stdout.read() or ""
        for line in (bufs[i] + rest).split("\n"):
            if line.strip():
                latest[i] = json.loads(line)
    final = totals()
    if rtd.poll() is not None and not crash:
        crash = f"rtd exited {rtd.returncode}"
    end_rss = rss_kb(rtd.pid) if rtd.poll() is None else 0
    # RSS: the warm-up is the first args.warmup seconds; after it, the linear trend over the
    # rest and the last window's mean against the first window's.
    # "Net" leaves out what rtd holds freed for reuse (rtd's `vm` account, FREE_KINDS): the
    # replies to this monitor's own `actors list` over every actor (about 350 B an actor) are
    # the largest blocks rtd mallocs, and glibc keeps them in whichever thread's arena built
    # them; and a burst of connections past the peak takes a new 2 MiB page of actor slab,
    # free again once they go (CI: +2 MiB, 10% of RSS, in the last window), until a trim.
    later = [s for s in samples if s["t_s"] >= args.warmup]
    slope_kb_min, growth, net_growth = 0.0, 0.0, 0.0
    if len(later) >= 4:
        xs = [s["t_s"] for s in later]
        ys = [s["rss_kb"] for s in later]
        slope_kb_min = linear_slope(xs, ys) * 60
        k = max(1, len(later) // 4)
        first, last = sum(ys[:k]) / k, sum(ys[-k:]) / k
        growth = (last - first) / first
        net = [s["rss_kb"] - s.get("held_free_kb", 0) for s in later]
        first, last = sum(net[:k]) / k, sum(net[-k:]) / k
        net_growth = (last - first) / first
    summary = {
        "connections": args.connections, "workers": args.workers, "duration_s": args.duration,
        "max_open": args.max_open, "gc_factor": gc_factor, "min_heap": min_heap,
        "slack_bytes": slk, "samples": len(samples),
        "rss_kb_start": samples[0]["rss_kb"] if samples else 0,
        "rss_kb_after_warmup": later[0]["rss_kb"] if later else 0,
        "rss_kb_end_of_load": samples[-1]["rss_kb"] if samples else 0,
        "rss_kb_after_drain": end_rss,
        "rss_kb_max": max((s["rss_kb"] for s in samples), default=0),
        "rss_slope_kb_per_min_after_warmup": round(slope_kb_min, 1),
        "rss_growth_last_vs_first_window": round(growth, 4),
        "rss_net_growth_last_vs_first_window": round(net_growth, 4),
        "held_free_kb_end": samples[-1].get("held_free_kb", 0) if samples else 0,
        "open_max": max((s.get("open", 0) for s in samples), default=0),
        "conn_actors_max": max((s["conns"] for s in samples), default=0),
        "heap_over_trigger_plus_slack": over_total,
        "foot_over_trigger_max": trig_max, "heap_over_factor_live_max": ratio_max,
        "heap_over_factor_live_example": live_ex,
        "collected_max": max((s["collected"] for s in samples), default=0),
        "gc_sized_max": max((s["gc_sized"] for s in samples), default=0),
        "over_examples": examples[:5], "crash": crash, "totals": final,
    }
    rtd_code = None
    if rtd.poll() is None:
        rtd.send_signal(signal.SIGTERM)
        try:
            rtd_code = rtd.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rtd.kill()
            rtd_code = rtd.wait()
    else:
        rtd_code = rtd.returncode
    summary["rtd_exit"] = rtd_code
    shutil.rmtree(data_dir, ignore_errors=True)
    ok_heap = over_total == 0
    ok_rss = net_growth <= args.rss_growth
    ok_stream = final.get("stream_lost", 1) == 0 and final.get("stream_acked", 0) > 0
    ok = ok_heap and ok_rss and ok_stream and not crash and rtd_code == 0 and \
        final.get("session_lost", 0) == 0
    summary.update(ok=ok, ok_heap=ok_heap, ok_rss=ok_rss, ok_stream=ok_stream)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    return 0 if ok else 1


def start_nofile():
    import resource
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=600, help="seconds of load (600)")
    p.add_argument("--connections", type=int, default=20000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--quick", action="store_true",
                   help="CI size: 75 s, 2,000 connections, 2 workers, 40 s warm-up")
    p.add_argument("--out", default=None, help="directory for samples.tsv and summary.json")
    p.add_argument("--build", default=os.environ.get("RT_BUILD_DIR",
                                                     os.path.join(ROOT, "build", "release")))
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--interval", type=float, default=10, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=120, help="seconds before RSS is judged")
    p.add_argument("--rss-growth", type=float, default=0.05,
                   help="allowed growth of the last quarter's mean RSS (less malloc's free "
                   "memory) over the first quarter's, after the warm-up")
    p.add_argument("--max-open", type=int, default=19600,
                   help="connections open at once (rtd's fd limit is 20,000)")
    p.add_argument("--ramp", type=float, default=30, help="seconds over which clients connect")
    p.add_argument("--drain", type=float, default=30, help="seconds for persist clients to drain")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies churn intervals")
    p.add_argument("--pub-every", type=float, nargs=2, default=[2, 8])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rtd-opt", action="append", default=[], help="extra rtd -o setting")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick and a.worker is None:
        a.duration, a.connections, a.workers, a.warmup = 75, 2000, 2, 40
        a.ramp, a.pub_every, a.time_scale, a.drain = 5, [0.5, 2], 0.5, 20
    if a.out is None:
        a.out = tempfile.mkdtemp(prefix="soak-")
    return a


if __name__ == "__main__":
    args = parse(sys.argv[1:])
    if args.worker is not None:
        worker_main(args)
    else:
        sys.exit(main_run(args))
