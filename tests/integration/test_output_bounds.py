"""What a client that does not read can make rtd hold (issue 27, 6a), and what clients that
never authenticate can take (6d): unsent output is bounded by RT_CONN_OUTPUT_MARK (64 KiB)
and the client's memory budget, a CONNECT by max_connect_size, all unauthenticated
connections together by max_preauth_memory, and a flood of sockets leaves descriptors and
HTTP slots for rtctl and /healthz.

Each attack is scaled down to what shows the bound: the client shrinks its receive buffer
(so the kernel holds little of what rtd sends) and sends many times the bound, which the
code before these fixes turned into as much memory in rtd.

Run: /usr/bin/python3 -m pytest tests/integration/test_output_bounds.py
"""
import resource
import socket
import time
import urllib.request

import pytest

from conftest import Rtd, free_port, rss_kb, sanitized, wait_for
from mqtt_raw import SUBSCRIBE, Raw, mqtt_str, u16, varint
from transports import (OP_PING, closed_or_reset, frame, listeners, read_http_head,
                        upgrade_request, wait_log)

# RSS noise (allocator arenas, scheduler scratch) is a few MB; each attack below made the
# code before these fixes grow by several times this.
SLACK_KB = 12 * 1024


def assert_rss_grew_little(broker, before_kb, what):
    """rtd's RSS grew by less than SLACK_KB since before_kb (not checked under a sanitizer,
    whose quarantine keeps what was freed)."""
    grown = rss_kb(broker.proc.pid) - before_kb
    assert sanitized(broker.proc.pid) or grown < SLACK_KB, (grown, what)


def small_rcvbuf_socket(port, source="127.0.0.1"):
    """A connected socket whose receive buffer is as small as the kernel allows, so that
    output rtd sends it and it does not read stays in rtd, not in the kernel."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    return s


def send_until_refused(sock, chunk, total, stall_s=1.0, limit_s=20.0):
    """Sends chunk again and again until total bytes went, or the peer took nothing for
    stall_s (it stopped reading and the kernel's buffers are full), or it closed. Returns the
    bytes sent."""
    sock.setblocking(False)
    sent, last, start = 0, time.monotonic(), time.monotonic()
    view = memoryview(chunk)
    while sent < total and time.monotonic() - last < stall_s and time.monotonic() - start < limit_s:
        try:
            n = sock.send(view)
        except BlockingIOError:
            time.sleep(0.002)
            continue
        except (BrokenPipeError, ConnectionResetError):
            break  # rtd ended the connection
        sent += n
        view = view[n:] if n < len(view) else memoryview(chunk)
        last = time.monotonic()
    sock.settimeout(5)
    return sent


def served(broker):
    """A normal client connects, subscribes, publishes and gets its own message back."""
    c = Raw(broker.port, f"normal-{time.monotonic_ns()}", version=4)
    try:
        c.subscribe("served/t")
        c.publish("served/t", b"ok")
        return c.next_publish(timeout=5) is not None
    finally:
        c.close()


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def http_rtd(*extra, **kw):
    hport = free_port()
    b = Rtd(f'http={{bind="127.0.0.1:{hport}", metrics_public=true}}', *extra, **kw)
    b.http_port = hport
    return b


def test_websocket_pings_before_connect_never_read(stopper):
    """A WebSocket client that sends pings and never reads the pongs, before any CONNECT:
    rtd keeps one pong waiting at most and stops reading the client until it goes, so 48 MB
    of pings cost rtd next to nothing (before: a pong per ping, 54 -> 372 MB in 1.2 s, with
    neither max_client_memory nor connect_timeout applying). connect_timeout still ends it,
    and a normal client is served meanwhile."""
    port, ws_port = free_port(), free_port()
    broker = Rtd(listeners(port, {"bind": f"127.0.0.1:{ws_port}", "websocket": "/mqtt"}),
                 "connect_timeout=3", port=port)
    stopper(broker)
    before = rss_kb(broker.proc.pid)
    s = small_rcvbuf_socket(ws_port)
    t0 = time.monotonic()
    req, _ = upgrade_request("/mqtt")
    s.sendall(req)
    assert read_http_head(s, 5).status == 101
    sent = send_until_refused(s, frame(OP_PING, b"p" * 125) * 4096, 48 << 20)
    assert_rss_grew_little(broker, before, sent)
    assert sent >= 48 << 20, sent  # pings that came together got one pong: rtd kept reading
    assert served(broker)
    assert closed_or_reset(s, timeout=10), "connect_timeout did not end the muted socket"
    assert time.monotonic() - t0 >= 2.5
    wait_log(broker, r"ws\.refused .*timeout|client\.connect_timeout")


def test_pingreqs_never_read(stopper):
    """PINGREQs whose PINGRESPs are never read (before: 210 MB of them added 194 MB): the
    client's input stops at 64 KiB of unsent output, its charged memory stays within its
    budget, and its keepalive ends it since it reads nothing. Its session, kept, serves the
    client again when it comes back."""
    broker = Rtd("max_client_memory=262144")
    stopper(broker)
    before = rss_kb(broker.proc.pid)
    s = small_rcvbuf_socket(broker.port)
    c = Raw(broker.port, "pinger", version=4, keepalive=2, clean=False, sock=s)
    sent = send_until_refused(c.sock, b"\xc0\x00" * 32768, 32 << 20)
    assert_rss_grew_little(broker, before, sent)
    info = broker.ctl_json("clients", "show", "pinger")
    assert info["memory"] <= 262144 + 64 * 1024, info
    assert sent < 32 << 20, sent
    assert served(broker)
    # Keepalive 2 s: closed past 3 s of reading nothing from it (checked every second).
    wait_log(broker, r"client\.keepalive_timeout client=pinger", timeout=8)
    wait_log(broker, r"client\.disconnected client=pinger session=kept")
    s.close()
    back = Raw(broker.port, "pinger", version=4, clean=False)
    assert back.session_present
    back.send(0xC0, b"")
    assert back.expect(13).type == 13  # PINGRESP: its input is read again
    back.close()


RETAINED = 200
RETAINED_BYTES = 10 * 1024


def fill_retained(broker):
    pub = Raw(broker.port, "retainer", version=4)
    for i in range(RETAINED):
        pub.publish(f"ret/{i}", bytes([65 + i % 26]) * RETAINED_BYTES, qos=1, pid=i + 1,
                    retain=True)
    pub.close()


def test_retained_subscribe_repeated_never_read(stopper):
    """SUBSCRIBE to 200 retained messages of 10 KB, 50 times, without reading (before: each
    SUBSCRIBE wrote its 2 MB straight into the output, 50 made 100 MB, and the parsing went
    on after the client closed): the retained messages go through the session's queue,
    past the budget they are dropped, the client's memory stays within its budget, and once
    it closes nothing is left of it. A client that reads gets every retained message."""
    budget = 1 << 20
    broker = Rtd(f"max_client_memory={budget}", "max_packet_size=65536")
    stopper(broker)
    fill_retained(broker)
    before = rss_kb(broker.proc.pid)
    s = small_rcvbuf_socket(broker.port)
    c = Raw(broker.port, "hoarder", version=4, sock=s)
    sub = bytes([SUBSCRIBE << 4 | 2]) + varint(2 + 2 + 5 + 1) + u16(1) + mqtt_str("ret/#") + b"\x00"
    sent = send_until_refused(c.sock, sub * 50, len(sub) * 50)
    assert sent == len(sub) * 50
    time.sleep(0.5)  # rtd's turn on what it could read; nothing below depends on its length
    assert_rss_grew_little(broker, before, sent)
    info = broker.ctl_json("clients", "show", "hoarder")
    assert info["memory"] <= budget + 128 * 1024, info
    assert info["dropped"] > 0, info
    assert served(broker)
    s.close()
    assert wait_for(lambda: broker.ctl("clients", "show", "hoarder")[0] != 0, 5)
    after_close = rss_kb(broker.proc.pid)
    time.sleep(0.5)
    assert_rss_grew_little(broker, after_close, "after the client closed")

    # A client that reads gets all 200, QoS 0 and QoS 1, through the same queue, when its
    # budget holds them (2 MB: the default 16 MiB does).
    assert broker.ctl("config", "set", "max_client_memory", str(16 << 20))[0] == 0
    for qos in (0, 1):
        r = Raw(broker.port, f"reader{qos}", version=4)
        r.subscribe("ret/#", qos=qos, pid=1)
        got = set()
        while len(got) < RETAINED:
            p = r.read(timeout=5)
            assert p is not None, (qos, len(got))
            if p.type != 3:
                continue
            f = r.publish_fields(p)
            got.add(f["topic"])
            if f["qos"]:
                r.ack(4, f["pid"])
        r.close()


def test_half_sent_connects(stopper):
    """CONNECTs that announce 1 MB and never finish (before: 400 of them held 400 MB for the
    10 s connect_timeout): a CONNECT is bounded by max_connect_size (64 KiB), refused at its
    header, so 60 of them hold nothing; under it, all unauthenticated connections together
    are bounded by max_preauth_memory, the connection whose bytes would pass it is ended
    and logged, and a normal client still connects."""
    broker = http_rtd("max_preauth_memory=1048576")
    stopper(broker)
    before = rss_kb(broker.proc.pid)
    # Within max_packet_size (1 MiB), all but its last KB sent.
    big = bytes([0x10]) + varint((1 << 20) - 8) + b"\x00\x04MQTT\x04\x02\x00\x3c"
    big += b"x" * ((1 << 20) - 1024)
    held = []
    for _ in range(60):
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        send_until_refused(s, big, len(big), stall_s=0.2)
        held.append(s)
    assert_rss_grew_little(broker, before, "60 CONNECTs of 1 MB")
    assert all(closed_or_reset(s, timeout=5) for s in held)
    assert metric(broker.http_port, "rt_connect_too_large_total") >= 60
    for s in held:
        s.close()

    # 60 KB each, under max_connect_size: 1 MiB holds about 16 of them.
    part = bytes([0x10]) + varint(60000) + b"\x00\x04MQTT\x04\x02\x00\x3c" + b"y" * 50000
    held = []
    for _ in range(40):
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        s.sendall(part)
        held.append(s)
    wait_log(broker, r"client\.preauth_refused .*max_preauth_memory=1048576")
    assert metric(broker.http_port, "rt_preauth_refusals_total") >= 1
    assert metric(broker.http_port, "rt_preauth_bytes") <= 1048576
    assert served(broker)
    for s in held:
        s.close()
    assert wait_for(lambda: metric(broker.http_port, "rt_preauth_bytes") == 0, 5)


def test_fd_flood_leaves_rtctl_and_healthz(stopper):
    """Idle MQTT sockets up to the open-file limit (before: 20,000 took every descriptor and
    rtctl and /healthz failed): the MQTT listener leaves the last 64 to the admin socket and
    HTTP, counts what it refused and says which limit in its log."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    broker = http_rtd()
    stopper(broker)
    limit = 512
    resource.prlimit(broker.proc.pid, resource.RLIMIT_NOFILE, (limit, limit))
    socks = []
    try:
        for i in range(limit):
            try:
                socks.append(socket.create_connection(("127.0.0.1", broker.port), timeout=5))
            except OSError:
                break
        code, out, err = broker.ctl("status", timeout=10)
        assert code == 0, (out, err)
        with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/healthz",
                                    timeout=5) as r:
            assert r.status == 200
        wait_log(broker, r"listener\.refused .*fd_reserve=[1-9]")
        listeners_info = broker.ctl_json("listeners")
        text = str(listeners_info)
        assert "refused_fd_reserve" in text
    finally:
        for s in socks:
            s.close()


def test_http_idle_flood_from_one_address(stopper):
    """1,100 idle HTTP connections from one address (before: 1,024 of them made /healthz
    fail until they timed out): one address holds at most 256, the rest are closed at once,
    the idle ones within ~2 s, and /healthz answers from another address meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    broker = http_rtd()
    stopper(broker)
    socks = []
    try:
        for _ in range(1100):
            socks.append(socket.create_connection(("127.0.0.1", broker.http_port), timeout=5))
        t0 = time.monotonic()
        probe = socket.create_connection(("127.0.0.1", broker.http_port), timeout=5,
                                         source_address=("127.0.0.2", 0))
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_http_head(probe, 5).status == 200
        probe.close()
        # Every idle one ends: the refused at once, the admitted after RT_HTTP_FIRST_BYTE_MS.
        assert all(closed_or_reset(s, timeout=max(0.1, t0 + 6 - time.monotonic()))
                   for s in socks)
        assert time.monotonic() - t0 < 6
    finally:
        for s in socks:
            s.close()
