"""`rtctl metrics prometheus` (docs/HTTP.md, "Metrics"): the scrape is valid Prometheus text
(promtool agrees), its counters move by exactly what the test did, and its cost with some
20,000 idle connections is small (the scrape measures itself: rt_scrape_cpu_seconds)."""
import os
import re
import resource
import socket
import subprocess
import sys
import time

import paho.mqtt.client as mqtt
import pytest

from conftest import Rtd, metric_samples

PROMTOOL = "/usr/bin/promtool"


def scrape(broker):
    code, out, err = broker.ctl("metrics", "prometheus")
    assert code == 0, (out, err)
    return out


def promtool_check(text):
    if not os.access(PROMTOOL, os.X_OK):
        pytest.fail(f"{PROMTOOL} is missing; run tools/install-deps.sh")
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), (p.stdout,
                                                                               p.stderr)


def histograms(samples):
    """{(name, labels without le): (buckets [(le, count)] in order, sum, count)}, each checked:
    the same bounds everywhere, cumulative, +Inf last and equal to _count."""
    out = {}
    for (name, labels), v in samples.items():
        if not name.endswith("_bucket"):
            continue
        le = re.search(r'(?:^\{|,)le="([^"]+)"\}$', labels).group(1)
        rest = re.sub(r',?le="[^"]+"', "", labels)
        rest = "" if rest == "{}" else rest
        out.setdefault((name[:-len("_bucket")], rest), []).append(
            (float("inf") if le == "+Inf" else float(le), v))
    result, bounds = {}, None
    for (name, labels), buckets in out.items():
        buckets.sort()
        les = [le for le, _ in buckets]
        assert bounds is None or les == bounds, (name, labels)
        bounds = les
        assert les[-1] == float("inf") and les[0] == 1e-6 and les[-2] == 10
        counts = [n for _, n in buckets]
        assert counts == sorted(counts), (name, labels, counts)  # cumulative
        total = samples[(name + "_count", labels)]
        assert counts[-1] == total, (name, labels)
        assert samples[(name + "_sum", labels)] >= 0
        result[(name, labels)] = (buckets, samples[(name + "_sum", labels)], total)
    return result


def connect(port, client_id):
    c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    deadline = time.time() + 10
    while not c.is_connected():
        assert time.time() < deadline, f"{client_id} did not connect"
        time.sleep(0.01)
    return c


def wait_for(pred, what, timeout=10):
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, what
        time.sleep(0.05)


def test_scrape_is_valid_and_counts_what_was_done(rtd):
    N, M = 5, 40  # clients; QoS 1 messages the first publishes, the second subscribes to
    before_text = scrape(rtd)
    promtool_check(before_text)
    before = metric_samples(before_text)
    assert before[("rt_connections", "")] == 0
    listener = f'listener="127.0.0.1:{rtd.port}",kind="tcp"'

    clients = [connect(rtd.port, f"metrics-{i}") for i in range(N)]
    pub, sub = clients[0], clients[1]
    got = []
    sub.on_message = lambda c, u, msg: got.append(msg.payload)
    subscribed = []
    sub.on_subscribe = lambda *a: subscribed.append(1)
    sub.subscribe("metrics/t", qos=1)
    wait_for(lambda: subscribed, "no SUBACK")
    infos = [pub.publish("metrics/t", b"x" * 10, qos=1) for _ in range(M)]
    for info in infos:
        info.wait_for_publish(timeout=10)
    wait_for(lambda: len(got) == M, f"the subscriber got {len(got)} of {M}")

    # The archive rule (etc/rules/archive.lua, from "#") takes every message to its sink.
    def archived():
        a = metric_samples(scrape(rtd))
        return a[("rt_sink_rows_written_total", '{sink="archive",type="sqlite"}')] == M
    wait_for(archived, "the archive sink did not write every message")

    after_text = scrape(rtd)
    promtool_check(after_text)
    after = metric_samples(after_text)

    def moved(name, labels=""):
        return after[(name, labels)] - before.get((name, labels), 0)

    hist_before, hist = histograms(before), histograms(after)
    archive = '{sink="archive",type="sqlite"}'
    assert set(hist) == {("rt_delivery_latency_seconds", ""), ("rt_gc_pause_seconds", ""),
                         ("rt_sink_write_duration_seconds", archive)}

    def hist_moved(name, labels=""):
        return hist[(name, labels)][2] - hist_before.get((name, labels), (0, 0, 0))[2]

    # One record per copy written as its subscriber took it: M copies to one subscriber.
    assert hist_moved("rt_delivery_latency_seconds") == M
    # One per write call: every batch succeeded here.
    assert moved("rt_sink_write_failures_total", archive) == 0
    assert hist_moved("rt_sink_write_duration_seconds", archive) == moved("rt_sink_batches_total",
                                                                          archive) > 0
    # A collection records its pause before it is counted, and the scrape reads the count first.
    assert hist[("rt_gc_pause_seconds", "")][2] >= after[("rt_gc_collections_total", "")]

    assert after[("rt_connections", "")] == N
    assert after[("rt_sessions", "")] == N
    assert after[("rt_connections_max", "")] == N
    assert moved("rt_connects_total") == N
    assert after[("rt_listener_connections", "{" + listener + "}")] == N
    assert moved("rt_listener_accepted_total", "{" + listener + "}") == N
    assert moved("rt_packets_received_total", '{type="connect"}') == N
    assert moved("rt_packets_sent_total", '{type="connack"}') == N
    assert moved("rt_packets_received_total", '{type="subscribe"}') == 1
    assert moved("rt_packets_received_total", '{type="publish"}') == M
    assert moved("rt_packets_sent_total", '{type="puback"}') == M
    assert moved("rt_messages_received_total") == M
    assert moved("rt_messages_sent_total") == M
    assert moved("rt_packets_sent_total", '{type="publish"}') == M
    assert moved("rt_messages_dropped_total", '{reason="queue_full"}') == 0
    # Every byte read is a packet read: at least the PUBLISHes' payloads and topics.
    assert moved("rt_received_bytes_total") >= M * (10 + len("metrics/t"))
    assert moved("rt_sent_bytes_total") >= M * (10 + len("metrics/t"))
    assert moved("rt_rule_matched_total", '{rule="archive"}') == M
    assert moved("rt_rule_passed_total", '{rule="archive"}') == M
    assert moved("rt_rule_failed_total", '{rule="archive",reason="exception"}') == 0
    assert moved("rt_sink_rows_in_total", '{sink="archive",type="sqlite"}') == M
    assert after[("rt_actors", '{type="mqtt_conn"}')] == N
    assert after[("rt_resident_memory_bytes", "")] > 0
    kinds = sum(v for (n, _), v in after.items() if n == "rt_memory_bytes")
    assert kinds == after[("rt_resident_memory_bytes", "")]  # "unexplained" closes the sum

    for c in clients:
        c.disconnect()
        c.loop_stop()
    wait_for(lambda: metric_samples(scrape(rtd))[("rt_connections", "")] == 0, "clients still counted")


def test_gc_pauses_are_recorded():
    # A QoS 1 copy waiting for its PUBACK holds its 2 KiB binary on the subscriber's heap,
    # which counts toward the first collection: past a 1 KiB min_heap, the turn that took the
    # first one ends in a collection (later ones wait for the next trigger, 2 x what lived).
    broker = Rtd("min_heap=1024")
    try:
        before = metric_samples(scrape(broker))
        pub, sub = connect(broker.port, "gc-pub"), connect(broker.port, "gc-sub")
        got, subscribed = [], []
        sub.on_message = lambda c, u, msg: got.append(1)
        sub.on_subscribe = lambda *a: subscribed.append(1)
        sub.subscribe("gc/t", qos=1)
        wait_for(lambda: subscribed, "no SUBACK")
        for _ in range(10):
            pub.publish("gc/t", b"x" * 2048, qos=1).wait_for_publish(timeout=10)
        wait_for(lambda: len(got) == 10, f"the subscriber got {len(got)} of 10")
        text = scrape(broker)
        promtool_check(text)
        after = metric_samples(text)
        gcs = after[("rt_gc_collections_total", "")]
        assert gcs > before[("rt_gc_collections_total", "")]
        _, total_s, n = histograms(after)[("rt_gc_pause_seconds", "")]
        assert n >= gcs and total_s > 0
        for c in (pub, sub):
            c.disconnect()
            c.loop_stop()
    finally:
        code, log = broker.stop()
    assert code == 0, log[-2000:]


def test_no_json_form(rtd):
    code, out, err = rtd.ctl("metrics", "prometheus", json=True)
    assert code == 1 and "no JSON form" in out + err


# ---- Cost with many idle connections ----

HOLDERS = 4               # processes holding connections, each from its own 127.0.0.x
PER_HOLDER = 4975         # 19,900 in all: rtd's own descriptors fit under a 20,000 file limit


def mqtt_connect_packet(client_id):
    cid = client_id.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x00" + len(cid).to_bytes(2, "big") + cid
    n, rl = len(body), b""
    while True:
        byte, n = n % 128, n // 128
        rl += bytes([byte | (0x80 if n else 0)])
        if not n:
            break
    return b"\x10" + rl + body


def hold(port, source, count, tag):
    """A holder process: count MQTT connections from source, CONNACKed, kept until stdin ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks = []
    for i in range(count):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(20)
        s.connect(("127.0.0.1", port))
        s.sendall(mqtt_connect_packet(f"idle-{tag}-{i}"))
        socks.append(s)
    for s in socks:
        ack = b""
        while len(ack) < 4:
            chunk = s.recv(4 - len(ack))
            if not chunk:
                raise SystemExit("closed before CONNACK")
            ack += chunk
        if ack != b"\x20\x02\x00\x00":
            raise SystemExit(f"CONNACK {ack!r}")
    print("ready", flush=True)
    sys.stdin.read()


def start_holders(port, holders, per_holder):
    """Holder processes (hold, above) from 127.0.0.2 on, once all their clients are in."""
    procs = []
    try:
        for h in range(holders):
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "hold", str(port),
                 f"127.0.0.{h + 2}", str(per_holder), str(h)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for p in procs:
            line = p.stdout.readline()
            assert line.strip() == "ready", (line, p.poll())
    except BaseException:
        stop_holders(procs)
        raise
    return procs


def stop_holders(procs):
    for p in procs:
        p.stdin.close()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_scrape_cost_with_20000_idle_connections():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < HOLDERS * PER_HOLDER + 100:
        pytest.skip(f"the file limit ({hard}) is too low for rtd to hold the connections")
    broker = Rtd("max_connections_per_ip=0", "max_connection_rate=0", "connect_timeout=60")
    holders = []
    try:
        rtd_limit = int(open(f"/proc/{broker.proc.pid}/limits").read().split(
            "Max open files")[1].split()[0])
        if rtd_limit < HOLDERS * PER_HOLDER + 100:
            pytest.skip(f"rtd's file limit ({rtd_limit}) is too low")
        holders = start_holders(broker.port, HOLDERS, PER_HOLDER)
        total = HOLDERS * PER_HOLDER
        wait_for(lambda: metric_samples(scrape(broker))[("rt_connections", "")] == total,
                 "not every connection counted", timeout=30)
        cpu, wall = [], []
        for _ in range(5):
            text = scrape(broker)
            s = metric_samples(text)
            cpu.append(s[("rt_scrape_cpu_seconds", "")])
            wall.append(s[("rt_scrape_duration_seconds", "")])
        promtool_check(text)
        assert s[("rt_actors", '{type="mqtt_conn"}')] == total
        cpu.sort()
        wall.sort()
        print(f"\nscrape at {total} idle connections: CPU {[round(c * 1e3, 2) for c in cpu]} ms,"
              f" wall {[round(w * 1e3, 2) for w in wall]} ms, {len(text)} bytes")
        # 3-5 ms on a 2-core VM (release): about half the walk of every actor, half the kernel
        # writing /proc/self/smaps for memory by kind. The bound leaves room for slower machines.
        assert cpu[len(cpu) // 2] < 0.05
    finally:
        stop_holders(holders)
        code, log = broker.stop()
    assert code == 0, log[-2000:]


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "hold":
    hold(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5])
