"""MQTT over WebSocket (ws://) and over WebSocket in TLS (wss://) against a real rtd: paho with
transport="websockets", MQTT.js (tests/node/ws_client.js), and a raw WebSocket client
(transports.py) for what real clients never send: several MQTT packets in one frame, one packet
over several frames (continuations, a ping between them), unmasked frames, a 100 MB length, text
frames, and bad upgrade requests. Each protocol error gets its close code and then the TCP
close, with a log line; other clients carry on.
"""
import json
import os
import shutil
import socket
import struct
import subprocess
import time

import paho.mqtt.client as mqtt
import pytest

from conftest import ROOT, Rtd, free_port, rss_kb, subscribe, wait_for
from mqtt_raw import CONNACK, PINGRESP, PUBLISH, SUBACK, Raw
from transports import (OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT, RawOn,
                        WebSocket, connect_packet, frame, listeners, publish_packet,
                        read_http_head, subscribe_packet, tls_context, upgrade_request, wait_log,
                        ws_accept)

PATH = "/mqtt"
NODE_DIR = os.path.join(ROOT, "tests", "node")
HAVE_MQTTJS = bool(shutil.which("node")) and os.path.isdir(
    os.path.join(NODE_DIR, "node_modules", "mqtt"))


@pytest.fixture
def broker(pki):
    """rtd with a plain listener (port), ws (ws_port) and wss (wss_port) on PATH."""
    port, ws_port, wss_port = free_port(), free_port(), free_port()
    cert, key = pki.server["ec"]
    b = Rtd(listeners(port, {"bind": f"127.0.0.1:{ws_port}", "websocket": PATH},
                      {"bind": f"127.0.0.1:{wss_port}", "websocket": PATH,
                       "tls": {"cert": cert, "key": key}}), port=port)
    b.ws_port, b.wss_port, b.ca = ws_port, wss_port, pki.ca.cert
    yield b
    code, log = b.stop()
    assert code == 0, log[-3000:]


def healthy(broker):
    """A plain TCP client still gets a message through (other clients unaffected)."""
    c = Raw(broker.port, "healthy", version=4)
    assert c.subscribe("health/x", 0).body[2:] == b"\x00"
    c.publish("health/x", b"ok")
    assert c.next_publish()["payload"] == b"ok"
    c.disconnect()


def raw_ws(broker, tls=False, **kw):
    if tls:
        return WebSocket.connect(broker.wss_port, tls=tls_context(broker.ca, alpn=("http/1.1",)),
                                 **kw)
    return WebSocket.connect(broker.ws_port, **kw)


def ws_closed_logged(broker, ws, code):
    lport = ws.sock.getsockname()[1]
    wait_log(broker, rf"ws\.closed peer=127\.0\.0\.1:{lport} code={code}\b")


# ---- real clients ----

@pytest.mark.parametrize("secure", [False, True], ids=["ws", "wss"])
def test_paho_over_websocket(broker, secure):
    """paho over ws:// and wss:// on PATH: a QoS 1 round trip, and a message from a plain TCP
    client reaches the WebSocket subscriber (and back)."""
    c = mqtt.Client(client_id=f"paho-{secure}", protocol=mqtt.MQTTv311, transport="websockets")
    c.ws_set_options(path=PATH)
    if secure:
        c.tls_set_context(tls_context(broker.ca, alpn=None))
    got = []
    c.on_message = lambda _c, _u, m: got.append((m.topic, m.payload))
    c.connect("127.0.0.1", broker.wss_port if secure else broker.ws_port, keepalive=30)
    c.loop_start()
    try:
        subscribe(c, "ws/#", 1)
        c.publish("ws/self", b"round trip", qos=1).wait_for_publish(10)
        tcp = Raw(broker.port, "tcp-peer", version=4)
        assert tcp.subscribe("ws/self", 0).body[2:] == b"\x00"
        tcp.publish("ws/tcp", b"from tcp")
        assert wait_for(lambda: sorted(got) == [("ws/self", b"round trip"),
                                                ("ws/tcp", b"from tcp")]), got
        c.publish("ws/self", b"to tcp", qos=1).wait_for_publish(10)
        m = tcp.next_publish()
        assert m["payload"] in (b"round trip", b"to tcp")
        tcp.disconnect()
    finally:
        c.disconnect()
        c.loop_stop()


@pytest.mark.skipif(not HAVE_MQTTJS, reason="node or tests/node/node_modules/mqtt missing")
@pytest.mark.parametrize("secure", [False, True], ids=["ws", "wss"])
def test_mqttjs_over_websocket(broker, secure):
    """MQTT.js over ws:// and wss:// (the server checked against the test CA): 200 QoS 1
    messages to itself, all back in order, on subprotocol "mqtt" (and ALPN http/1.1 on wss)."""
    url = (f"wss://127.0.0.1:{broker.wss_port}{PATH}" if secure
           else f"ws://127.0.0.1:{broker.ws_port}{PATH}")
    args = ["node", os.path.join(NODE_DIR, "ws_client.js"), url, f"js-{secure}", "js/t", "200",
            broker.ca if secure else "", "20000"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (p.stdout, p.stderr)
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["received"] == 200 and r["in_order"], r
    assert r["subprotocol"] == "mqtt", r
    if secure and r["alpn"]:
        assert r["alpn"] == "http/1.1", r
    if secure:  # without the CA the server is not trusted: the TLS check is real
        bad = subprocess.run(args[:6] + ["", "10000"], capture_output=True, text=True,
                             timeout=60)
        assert bad.returncode == 2, (bad.stdout, bad.stderr)


def test_wss_alpn_is_http11(broker):
    """On WSS the ALPN answer is "http/1.1" (the WebSocket's HTTP), not "mqtt"."""
    ws = raw_ws(broker, tls=True)
    assert ws.sock.selected_alpn_protocol() == "http/1.1"
    assert RawOn(ws, "alpn-wss", version=4).connack_code == 0
    ws.close()


# ---- framing ----

@pytest.mark.parametrize("secure", [False, True], ids=["ws", "wss"])
def test_several_packets_in_one_frame(broker, secure):
    """CONNECT, SUBSCRIBE and a PUBLISH to the subscribed topic in one binary frame: CONNACK,
    SUBACK and the PUBLISH come back, in that order."""
    ws = raw_ws(broker, tls=secure)
    ws.send_frame(OP_BINARY, connect_packet("one-frame") + subscribe_packet("f/1") +
                  publish_packet("f/1", b"together"))
    c = RawOn.__new__(RawOn)
    c.sock, c.buf, c.version = ws, b"", 4
    assert c.expect(CONNACK).body == b"\x00\x00"
    assert c.expect(SUBACK).body == b"\x00\x01\x00"
    p = c.expect(PUBLISH)
    assert c.publish_fields(p)["payload"] == b"together"
    ws.close()


@pytest.mark.parametrize("secure", [False, True], ids=["ws", "wss"])
def test_one_packet_over_several_frames(broker, secure):
    """A CONNECT fragmented into a binary frame and two continuations; then a PUBLISH whose
    fragments have a ping between them (control frames may come inside a fragmented message):
    the pong comes with the ping's payload and the PUBLISH is delivered whole. Last, one
    PUBLISH cut across two separate binary messages (MQTT is a byte stream over WebSocket)."""
    ws = raw_ws(broker, tls=secure)
    conn = connect_packet("fragments")
    ws.send_frame(OP_BINARY, conn[:3], fin=False)
    ws.send_frame(OP_CONT, conn[3:10], fin=False)
    ws.send_frame(OP_CONT, conn[10:], fin=True)
    c = RawOn.__new__(RawOn)
    c.sock, c.buf, c.version = ws, b"", 4
    assert c.expect(CONNACK).body == b"\x00\x00"
    assert c.subscribe("frag/#", 0).body[2:] == b"\x00"
    pub = publish_packet("frag/a", b"x" * 300)
    ws.send_frame(OP_BINARY, pub[:100], fin=False)
    ws.send_frame(OP_PING, b"in between")
    ws.send_frame(OP_CONT, pub[100:200], fin=False)
    ws.send_frame(OP_CONT, pub[200:], fin=True)
    m = c.next_publish()
    assert (m["topic"], m["payload"]) == ("frag/a", b"x" * 300)
    deadline = time.time() + 2  # the pong may come after the message
    while (OP_PONG, b"in between") not in ws.control and time.time() < deadline:
        f = ws.read_frame(0.2)
        if f is not None:
            ws.control.append((f[1], f[2]))
    assert (OP_PONG, b"in between") in ws.control, ws.frames
    pub = publish_packet("frag/b", b"y" * 50)
    ws.send_frame(OP_BINARY, pub[:7])
    ws.send_frame(OP_BINARY, pub[7:])
    m = c.next_publish()
    assert (m["topic"], m["payload"]) == ("frag/b", b"y" * 50)
    ws.close()


def test_ping_gets_pong(broker):
    """A ping (empty, then with 125 bytes, the most a control frame holds) is answered by a pong
    with the same payload; the MQTT session is untouched (its own PINGREQ still works)."""
    ws = raw_ws(broker)
    c = RawOn(ws, "pinger", version=4)
    for payload in (b"", bytes(range(125))):
        ws.send_frame(OP_PING, payload)
        deadline = time.time() + 5
        while (OP_PONG, payload) not in ws.control and time.time() < deadline:
            f = ws.read_frame(1)
            if f is not None:
                ws.control.append((f[1], f[2]))
        assert (OP_PONG, payload) in ws.control, ws.frames
    c.send(0xC0, b"")
    assert c.expect(PINGRESP)
    ws.close()


def close_case(broker, send, code, secure=False):
    """Sends send(ws) after a connected MQTT session: a close frame with code comes back, then
    the TCP connection closes, and ws.closed is logged with the code."""
    ws = raw_ws(broker, tls=secure)
    c = RawOn(ws, f"bad-{code}-{secure}", version=4)
    assert c.connack_code == 0
    send(ws)
    assert ws.expect_close() == code, ws.frames
    assert ws.tcp_closed(5), "TCP connection still open after the close frame"
    ws_closed_logged(broker, ws, code)
    ws.close()
    healthy(broker)


@pytest.mark.parametrize("secure", [False, True], ids=["ws", "wss"])
def test_unmasked_client_frame_is_1002(broker, secure):
    close_case(broker, lambda ws: ws.sock.sendall(frame(OP_BINARY, b"\xc0\x00", mask=False)),
               1002, secure)


def test_reserved_bits_and_unknown_opcode_are_1002(broker):
    close_case(broker, lambda ws: ws.send_frame(OP_BINARY, b"\xc0\x00", rsv=4), 1002)
    close_case(broker, lambda ws: ws.send_frame(0x3, b"\xc0\x00"), 1002)


@pytest.mark.parametrize("case", ["ping of 126 bytes", "fragmented ping",
                                  "continuation without a message",
                                  "new message inside a fragmented one",
                                  "64-bit length with its top bit set"])
def test_other_protocol_errors_are_1002(broker, case):
    """RFC 6455 5.2 and 5.5: each closed with 1002 (then TCP), logged; others unaffected."""
    def send(ws):
        if case == "ping of 126 bytes":
            ws.send_frame(OP_PING, b"p" * 126)
        elif case == "fragmented ping":
            ws.send_frame(OP_PING, b"p", fin=False)
        elif case == "continuation without a message":
            ws.send_frame(OP_CONT, b"\xc0\x00")
        elif case == "new message inside a fragmented one":
            ws.send_frame(OP_BINARY, b"\xc0", fin=False)
            ws.send_frame(OP_BINARY, b"\x00")
        else:
            head = bytearray(frame(OP_BINARY, b"", length=1 << 16))
            head[2] = 0x80   # the 64-bit length's most significant bit (must be 0)
            ws.sock.sendall(bytes(head) + b"\x00" * 16)
    close_case(broker, send, 1002)


def test_text_frame_is_1003(broker):
    close_case(broker, lambda ws: ws.send_frame(OP_TEXT, b"hello"), 1003)


def test_100mb_frame_is_1009_without_allocating_it(broker):
    """A frame header announcing 100 MB (more than max_packet_size) followed by a few bytes:
    closed with 1009 at once, without waiting for (or allocating) the rest. The broker's
    resident memory grows by far less than the announced size."""
    before = rss_kb(broker.proc.pid)
    t0 = time.monotonic()

    def send(ws):
        head = frame(OP_BINARY, b"", length=100 * 1024 * 1024)
        # frame() appended the mask key to the header; the payload starts after it.
        ws.sock.sendall(head + b"\x30" + b"\x00" * 1023)
    close_case(broker, send, 1009)
    # Nothing more was sent: the verdict came from the header (bounded well under the read
    # timeout, which a broker waiting for the payload would have hit).
    assert time.monotonic() - t0 < 5
    assert rss_kb(broker.proc.pid) - before < 50 * 1024


@pytest.mark.parametrize("secure", [False, True], ids=["ws", "wss"])
def test_close_frame_is_answered(broker, secure):
    """The client closes (1000): the broker answers with a close frame and ends the TCP
    connection; the MQTT session ends as a network close (no DISCONNECT came)."""
    ws = raw_ws(broker, tls=secure)
    assert RawOn(ws, f"closer-{secure}", version=4).connack_code == 0
    ws.send_frame(OP_CLOSE, struct.pack("!H", 1000) + b"bye")
    assert ws.expect_close() in (1000, None), ws.frames
    assert ws.tcp_closed(5)
    wait_log(broker, rf"client\.disconnected client=closer-{secure}\b")


# ---- the upgrade ----

def upgrade(broker, secure=False, **kw):
    """Sends an upgrade request; returns (HttpAnswer, socket, local port)."""
    s = socket.create_connection(("127.0.0.1", broker.wss_port if secure else broker.ws_port),
                                 timeout=5)
    if secure:
        s = tls_context(broker.ca, alpn=("http/1.1",)).wrap_socket(s, server_hostname="localhost")
    req, key = upgrade_request(**kw)
    s.sendall(req)
    ans = read_http_head(s)
    ans.key = key
    return ans, s, s.getsockname()[1]


@pytest.mark.parametrize("case,kw,status", [
    ("wrong key", {"key": "not-a-16-byte-key"}, 400),
    ("no key", {"key": ""}, 400),
    ("version 8", {"version": "8"}, 426),
    ("unknown subprotocol", {"protocol": "chat, superchat"}, 400),
    ("other path", {"path": "/other"}, 404),
])
def test_bad_upgrade_gets_http_error(broker, case, kw, status):
    """A bad upgrade gets its HTTP status (426 names version 13), then the connection closes,
    and ws.refused is logged with the status."""
    ans, s, lport = upgrade(broker, **kw)
    assert ans.status == status, (case, ans.status, ans.headers)
    if status == 426:
        assert ans.headers.get("sec-websocket-version") == "13", ans.headers
    s.settimeout(5)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    s.close()
    wait_log(broker, rf"ws\.refused peer=127\.0\.0\.1:{lport} status={status}\b")
    healthy(broker)


def test_upgrade_answers(broker):
    """A good upgrade: 101 with the right Sec-WebSocket-Accept; subprotocol "mqtt" or
    "mqttv3.1" echoed (the first the client lists that rtd speaks); none asked, none given; a
    query string is ignored; the same over wss."""
    for protocol, chosen in (("mqtt", "mqtt"), ("mqttv3.1", "mqttv3.1"),
                             ("chat, mqtt", "mqtt"), (None, None)):
        ans, s, _ = upgrade(broker, protocol=protocol)
        assert ans.status == 101, (protocol, ans.headers)
        assert ans.headers["sec-websocket-accept"] == ws_accept(ans.key)
        assert ans.headers.get("upgrade", "").lower() == "websocket"
        assert ans.headers.get("sec-websocket-protocol") == chosen, (protocol, ans.headers)
        s.close()
    ans, s, _ = upgrade(broker, path=PATH + "?client=1")
    assert ans.status == 101
    s.close()
    ans, s, _ = upgrade(broker, secure=True)
    assert ans.status == 101 and ans.headers["sec-websocket-accept"] == ws_accept(ans.key)
    s.close()


def test_plain_mqtt_to_the_websocket_port(broker):
    """A plain MQTT CONNECT on the WebSocket port is not an HTTP request: 400 (or a close),
    never a CONNACK, and a log line."""
    s = socket.create_connection(("127.0.0.1", broker.ws_port), timeout=5)
    lport = s.getsockname()[1]
    s.sendall(connect_packet("not-ws"))
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    s.close()
    assert not got.startswith(b"\x20"), got
    assert got == b"" or got.startswith(b"HTTP/1.1 400"), got
    wait_log(broker, rf"ws\.refused peer=127\.0\.0\.1:{lport} status=400\b")
    healthy(broker)


def test_stalled_upgrade_is_closed_after_connect_timeout(pki):
    """connect_timeout covers the upgrade: half an upgrade request, and an upgraded WebSocket
    that never sends CONNECT, are each closed after connect_timeout (2 s) with a log line
    naming the peer; not before it, and within it plus a second (a timer sweep) plus a
    second of slack for a loaded machine."""
    port, ws_port = free_port(), free_port()
    b = Rtd(listeners(port, {"bind": f"127.0.0.1:{ws_port}", "websocket": PATH}),
            "connect_timeout=2", port=port)
    try:
        half = socket.create_connection(("127.0.0.1", ws_port), timeout=10)
        half.sendall(b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
        t_half = time.monotonic()
        ws = WebSocket.connect(ws_port, timeout=10)
        t_ws = time.monotonic()
        half_port, ws_lport = half.getsockname()[1], ws.sock.getsockname()[1]
        try:
            while half.recv(4096):  # an HTTP error answer may come first
                pass
        except ConnectionResetError:
            pass
        waited_half = time.monotonic() - t_half
        assert ws.tcp_closed(10), ws.frames
        waited_ws = time.monotonic() - t_ws
        for waited in (waited_half, waited_ws):
            assert 2 - 0.1 <= waited <= 2 + 2.0, (waited_half, waited_ws)
        for lport in (half_port, ws_lport):
            wait_log(b, rf"peer=127\.0\.0\.1:{lport}\b.*timeout|timeout.*peer=127\.0\.0\.1:"
                        rf"{lport}\b")
        half.close()
        ws.close()
        healthy(b)
    finally:
        code, log = b.stop()
        assert code == 0, log[-3000:]
