#!/usr/bin/python3
"""What a Prometheus scrape (GET /metrics) costs rtd with ~20,000 idle MQTT connections
(docs/BENCHMARKS.md, "Scrape cost"):

  1. rtd's CPU per scrape: the CPU time of all its threads (/proc/PID/task/*/schedstat, ns)
     over back-to-back scrapes, less what it spends idle over as long, divided by the
     scrapes; and the scrape's own figure (rt_scrape_cpu_seconds, its blocking-pool thread).
  2. How long a scheduler is held meanwhile: the scrape runs on the blocking pool, so the
     schedulers only pass the request and the answer on. One MQTT client sends PINGREQs one
     after another and times each PINGRESP, with no scrape running and then during
     back-to-back scrapes: a scheduler held for X ms shows as round trips X ms longer.

    RT_BUILD_DIR=$PWD/build/release /usr/bin/python3 tests/bench/scrape_cost.py \\
        [--conns 19900] [--scrapes 100] [--ping-seconds 10]

One process may hold at most 20,000 descriptors here, rtd included: 19,900 connections
leave rtd room for its own files. The holders are test_metrics.py's, four processes, each
from its own 127.0.0.x address.
"""
import argparse
import glob
import http.client
import os
import socket
import statistics
import sys
import multiprocessing
import time

HERE = os.path.dirname(os.path.abspath(__file__))
INTEGRATION = os.path.join(HERE, "..", "integration")
sys.path.insert(0, INTEGRATION)
from conftest import Rtd, free_port  # noqa: E402
from test_metrics import mqtt_connect_packet, parse, start_holders, stop_holders  # noqa: E402

HOLDERS = 4


def rtd_cpu_ns(pid):
    """CPU time of every thread of pid so far, in ns."""
    total = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(open(f).read().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # a thread that ended between the listing and the read
    return total


class Scraper:
    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def scrape(self):
        self.conn.request("GET", "/metrics")
        r = self.conn.getresponse()
        body = r.read().decode()
        assert r.status == 200, (r.status, body[:200])
        return body


def pinger(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(mqtt_connect_packet("scrape-cost-pinger"))
    assert s.recv(4) == b"\x20\x02\x00\x00"
    return s


def ping_rtts(s, seconds, stop=None):
    """Round trips of PINGREQs sent one after another for seconds, in ms."""
    rtts = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end and not (stop and stop.is_set()):
        t0 = time.perf_counter()
        s.sendall(b"\xc0\x00")
        got = b""
        while len(got) < 2:
            got += s.recv(2 - len(got))
        assert got == b"\xd0\x00", got
        rtts.append((time.perf_counter() - t0) * 1e3)
    return rtts


def scrape_loop(port, stop, count):
    sc = Scraper(port)
    while not stop.is_set():
        sc.scrape()
        with count.get_lock():
            count.value += 1


def summary(rtts):
    q = statistics.quantiles(rtts, n=1000)
    return (f"n={len(rtts)} p50={statistics.median(rtts):.3f} p99={q[989]:.3f} "
            f"p99.9={q[998]:.3f} max={max(rtts):.3f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=19900)
    ap.add_argument("--scrapes", type=int, default=100)
    ap.add_argument("--ping-seconds", type=float, default=10)
    a = ap.parse_args()
    hport = free_port()
    broker = Rtd(f'http={{bind="127.0.0.1:{hport}", metrics_public=true}}',
                 "max_connections_per_ip=0", "max_connection_rate=0", "connect_timeout=60")
    holders = []
    try:
        per = a.conns // HOLDERS
        holders = start_holders(broker.port, HOLDERS, per)
        total = per * HOLDERS
        sc = Scraper(hport)
        deadline = time.time() + 30
        while parse(sc.scrape())[("rt_connections", "")] < total:
            assert time.time() < deadline, "not every connection counted"
            time.sleep(0.1)
        pid = broker.proc.pid
        time.sleep(1)

        # 1. CPU per scrape.
        c0, t0 = rtd_cpu_ns(pid), time.perf_counter()
        time.sleep(3)
        idle_ns_per_s = (rtd_cpu_ns(pid) - c0) / (time.perf_counter() - t0)
        own = []
        c0, t0 = rtd_cpu_ns(pid), time.perf_counter()
        for _ in range(a.scrapes):
            own.append(parse(sc.scrape())[("rt_scrape_cpu_seconds", "")] * 1e3)
        wall = time.perf_counter() - t0
        spent = rtd_cpu_ns(pid) - c0
        per_scrape = (spent - idle_ns_per_s * wall) / a.scrapes / 1e6
        print(f"connections: {total} idle")
        print(f"rtd idle CPU: {idle_ns_per_s / 1e6:.3f} ms/s")
        print(f"rtd CPU per scrape: {per_scrape:.3f} ms (all threads, idle CPU taken off; "
              f"{a.scrapes} scrapes back to back in {wall:.2f} s, {wall / a.scrapes * 1e3:.2f} ms "
              f"each)")
        print(f"rt_scrape_cpu_seconds: median {statistics.median(own):.3f} ms, max "
              f"{max(own):.3f} ms")

        # 2. Scheduler hold: PINGREQ round trips without and during scrapes.
        s = pinger(broker.port)
        quiet = ping_rtts(s, a.ping_seconds)
        # The scrapes come from another process: in this one they would take the GIL from
        # the pings and show as round trips the broker never made longer.
        stop, scrapes = multiprocessing.Event(), multiprocessing.Value("i", 0)
        t = multiprocessing.Process(target=scrape_loop, args=(hport, stop, scrapes))
        t.start()
        try:
            busy = ping_rtts(s, a.ping_seconds)
        finally:
            stop.set()
            t.join()
        s.close()
        print(f"PINGREQ round trip, no scrape:       {summary(quiet)}")
        print(f"PINGREQ round trip, during {scrapes.value} scrapes: {summary(busy)}")
    finally:
        stop_holders(holders)
        code, log = broker.stop()
        if code != 0:
            print(log[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
