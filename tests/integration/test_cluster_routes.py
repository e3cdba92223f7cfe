"""A session that moves while one NATS route is slow (docs/CLUSTER.md, "Sessions that move").

Three nats-server processes where the route between the first and the third goes through a
proxy that holds every byte for DELAY_S (both directions, in order); the other two routes are
direct. The claiming node is on the first server, the old holder on the second, a publisher on
the third. When the old holder lets go, the third server hears that at once over its direct
route, and the claiming node's new subscription only DELAY_S later over the slow one: without a
sync through every server before the old holder is asked for the rest, what the publisher sends
in that window finds no interest and NATS drops it (about DELAY_S / 3 ms messages). The test
makes that window long on purpose, so the loss would be certain, not a matter of load (79 of
600 messages lost in a run with the sync taken out). The route is slow only while the session
moves: JetStream's groups, which elect and replicate over it too, settle at full speed first.
"""
import collections
import os
import socket
import subprocess
import threading
import time

import pytest

from cluster_harness import (NATS_SERVER, WAIT, Mq, NatsCluster, await_route, cluster_option,
                             payloads, until)
from conftest import Rtd, free_port

DELAY_S = 0.25  # the slow route's latency each way; the sync's bound is 2 s (claims.c)


class DelayProxy:
    """Forwards TCP connections from its port to target, each chunk `delay` seconds (as it is
    when the chunk is read) late, in order."""

    def __init__(self, target_port):
        self.target, self.delay = target_port, 0.0
        self.port = free_port()
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", self.port))
        self.lsock.listen(16)
        self.stopping = False
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopping:
            try:
                a, _ = self.lsock.accept()
                b = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                continue
            self.socks += [a, b]
            for src, dst in ((a, b), (b, a)):
                q = collections.deque()
                cv = threading.Condition()
                threading.Thread(target=self._read, args=(src, q, cv), daemon=True).start()
                threading.Thread(target=self._write, args=(dst, q, cv), daemon=True).start()

    def _read(self, src, q, cv):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with cv:
                q.append((time.monotonic() + self.delay, data))
                cv.notify()
            if not data:
                return

    def _write(self, dst, q, cv):
        while True:
            with cv:
                while not q:
                    cv.wait()
                due, data = q.popleft()
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return

    def stop(self):
        self.stopping = True
        for s in [self.lsock] + self.socks:
            try:
                s.close()
            except OSError:
                pass


class SlowLinkNats(NatsCluster):
    """NatsCluster whose route between servers 0 and 2 goes through DelayProxy. Servers 0 and 2
    name only server 1 as a route and advertise their proxy as their cluster address, so the
    route each learns of the other (from server 1's gossip) is made through a proxy, whichever
    of the two survives as the one route between them."""

    def __init__(self, base):
        self.proxies = {}
        super().__init__(base)

    def slow_down(self, delay):
        for p in self.proxies.values():
            p.delay = delay

    def start(self, i):
        s = self.servers[i]
        if i != 1 and i not in self.proxies:
            self.proxies[i] = DelayProxy(s["cport"])
        routes = [o for j, o in enumerate(self.servers) if j != i and (i == 1 or j == 1)]
        conf = os.path.join(self.base, "nats.conf")
        with open(conf, "w") as f:
            f.write("max_payload: 4194304\n")
        argv = [NATS_SERVER, "-c", conf, "-a", "127.0.0.1", "-p", str(s["port"]),
                "--cluster", f"nats://127.0.0.1:{s['cport']}", "--cluster_name", "rtc",
                "--routes", ",".join(f"nats://127.0.0.1:{o['cport']}" for o in routes),
                "-js", "-sd", s["dir"], "--server_name", s["name"], "-m", str(s["mport"])]
        if i in self.proxies:
            argv += ["--cluster_advertise", f"127.0.0.1:{self.proxies[i].port}"]
        with open(s["log"], "ab") as log:
            s["proc"] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def stop(self):
        super().stop()
        for p in self.proxies.values():
            p.stop()


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    if not os.access(NATS_SERVER, os.X_OK):
        pytest.fail(f"{NATS_SERVER} is missing; run tools/install-deps.sh")
    cluster = SlowLinkNats(str(tmp_path_factory.mktemp("nats-slow")))
    yield cluster
    cluster.stop()


def route_ports(cluster, i):
    """The remote ports of server i's routes (a proxied route shows the proxy's side)."""
    return sorted(r.get("port") for r in cluster.get(i, "/routez").get("routes", []))


@pytest.fixture(scope="module")
def nodes(slow):
    """n1 on server 0, n2 on server 1, n3 on server 2 (one NATS URL each)."""
    urls = slow.urls()
    started = []
    try:
        for i in range(3):
            started.append(Rtd(cluster_option(f"n{i + 1}", [urls[i]])))
        for n in started:
            until(lambda: (lambda st: st["retained"] == "replicated" and st["lease"] == "held")(
                n.ctl_json("cluster", "status")), WAIT, lambda: n.read_log()[-2000:])
        # The claiming node must know the others as up to wait for their servers.
        until(lambda: sum(r["state"] == "up" for r in started[0].ctl_json("cluster", "nodes"))
              == 3, WAIT, lambda: str(started[0].ctl_json("cluster", "nodes")))
    except BaseException:
        for n in started:
            n.stop()
        raise
    yield started
    for n in started:
        n.stop()


@pytest.mark.parametrize("v5", [True, False], ids=["v5", "v311"])
def test_session_moves_across_a_slow_route_without_loss(slow, nodes, v5):
    """The move waits until the publisher's server has the claiming node's subscription, so a
    QoS 1 stream from the third server loses nothing though that server hears of the old
    holder's end DELAY_S before it hears of the new interest."""
    n1, n2, n3 = nodes
    # The premise: server 0 reaches server 2 only through a proxy.
    proxied = {p.port for p in slow.proxies.values()}
    assert proxied & set(route_ports(slow, 0)) or proxied & set(route_ports(slow, 2)), \
        (route_ports(slow, 0), route_ports(slow, 2), proxied)
    tag = "v5" if v5 else "v3"
    topic = f"slow/{tag}/t"
    kw = dict(v5=v5, cid=f"slow-{tag}", clean=False, expiry=300 if v5 else 0)
    made = []
    try:
        old = Mq(n2, **kw)
        made.append(old)
        old.c.reconnect_delay_set(60, 60)  # taken over: it must not come back
        old.subscribe(topic, 1)
        pub = Mq(n3, name="p")
        made.append(pub)
        await_route(pub, topic, [old])
        before = n1.ctl_json("cluster", "status")
        count = 600
        stop = threading.Event()

        def stream():
            for k in range(count):
                pub.publish(topic, b"%05d" % k, qos=1, wait=False)
                time.sleep(0.003)
            stop.set()
        t = threading.Thread(target=stream)
        t.start()
        try:
            old.wait_count(60)  # under way
            slow.slow_down(DELAY_S)
            new = Mq(n1, **kw)
            made.append(new)
        finally:
            t.join()
            slow.slow_down(0.0)
        want = {b"%05d" % k for k in range(count)}
        until(lambda: want <= set(payloads(old)) | set(payloads(new)), WAIT,
              lambda: f"missing {len(want - set(payloads(old)) - set(payloads(new)))}: "
              f"{sorted(want - set(payloads(old)) - set(payloads(new)))[:10]}\n"
              + "\n".join(ln for n in nodes for ln in n.read_log().splitlines()
                          if "cluster." in ln)[-3000:])
        assert new.session_present
        got = [int(m) for m in payloads(new)]
        assert got == sorted(got), "out of order on the new connection"
        after = n1.ctl_json("cluster", "status")
        assert after["sessions_moved_in"] == before["sessions_moved_in"] + 1
        assert after["move_syncs_incomplete"] == before["move_syncs_incomplete"]
    finally:
        for c in made:
            c.close()
