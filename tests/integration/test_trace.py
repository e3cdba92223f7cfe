"""Packet tracing (issue 16): `rtctl trace client|topic` and the API's trace stream show the
exact packets a raw-socket client sent and received; a flood traced by a reader that stopped
reading is bounded (events dropped at the source and counted, never queued without end)."""
import json
import signal
import subprocess
import time
import urllib.request

import paho.mqtt.client as mqtt
import pytest

from admin_wire import Admin, quote
from conftest import RTCTL, wait_for
from mqtt_raw import (DISCONNECT, PINGREQ, PINGRESP, PUBACK, PUBLISH, SUBACK, SUBSCRIBE,
                      UNSUBACK, UNSUBSCRIBE, Raw, mqtt_str, u16, varint)
from test_http import http  # noqa: F401  (the fixture: rtd with an HTTP listener and keys)

NAMES = {1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 8: "SUBSCRIBE", 9: "SUBACK",
         10: "UNSUBSCRIBE", 11: "UNSUBACK", 12: "PINGREQ", 13: "PINGRESP", 14: "DISCONNECT"}
TRACE_QUEUED_MAX = 1 << 20  # RT_TRACE_QUEUED_MAX (trace.h)


class RecordingRaw(Raw):
    """A raw client that remembers every packet it sent and read, as (type, size)."""

    def __init__(self, *a, **kw):
        self.sent, self.got = [], []
        super().__init__(*a, **kw)

    def send(self, first_byte, body):
        self.sent.append((first_byte >> 4, 1 + len(varint(len(body))) + len(body)))
        super().send(first_byte, body)

    def read(self, timeout=5.0):
        p = super().read(timeout)
        if p is not None:
            self.got.append((p.type, 1 + len(varint(len(p.body))) + len(p.body)))
        return p


def start_trace(broker, *args):
    """rtctl --json trace ARGS: the running process, once rtd said the trace is on."""
    p = subprocess.Popen([RTCTL, "-s", broker.admin_socket, "--json", "trace", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = json.loads(p.stdout.readline())
    assert first["event"] == "started", first
    return p


def finish(p, timeout=30):
    """The trace's events after `started`, once rtctl exited 0 at its end."""
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events[-1]["event"] == "ended", events[-1]
    return events


def test_trace_shows_the_exact_packets_of_a_raw_client(rtd):
    p = start_trace(rtd, "client", "tr-raw", "--duration", "3", "--payload", "4")
    c = RecordingRaw(rtd.port, "tr-raw", version=5)
    c.send(SUBSCRIBE << 4 | 2, u16(7) + varint(0) + mqtt_str("tr/a") + bytes([1]) +
           mqtt_str("tr/b/#") + bytes([0]))
    c.expect(SUBACK)
    c.send(PUBLISH << 4 | 2, mqtt_str("tr/a") + u16(9) + varint(0) + b"hello world")
    got = {pk.type: pk for pk in (c.read(), c.read())}  # our PUBACK, and the copy for us
    assert sorted(got) == [PUBLISH, PUBACK]
    copy_id = c.publish_fields(got[PUBLISH])["pid"]
    c.send(PUBACK << 4, u16(copy_id) + b"\x00")
    c.send(PINGREQ << 4, b"")
    c.expect(PINGRESP)
    c.send(UNSUBSCRIBE << 4 | 2, u16(8) + varint(0) + mqtt_str("tr/b/#"))
    c.expect(UNSUBACK)
    c.send(DISCONNECT << 4, b"\x00\x00")
    events = finish(p)
    packets = [e for e in events if e["event"] == "packet"]
    assert all(e["client"] == "tr-raw" for e in packets)
    ins = [(NAMES[t], n) for t, n in c.sent]
    outs = [(NAMES[t], n) for t, n in c.got]
    assert [(e["type"], e["size"]) for e in packets if e["dir"] == "in"] == ins
    assert [(e["type"], e["size"]) for e in packets if e["dir"] == "out"] == outs
    by_type = {}
    for e in packets:
        by_type.setdefault((e["dir"], e["type"]), []).append(e)
    sub = by_type[("in", "SUBSCRIBE")][0]
    assert sub["packet_id"] == 7
    assert sub["filters"] == [{"filter": "tr/a", "qos": 1, "options": 1},
                              {"filter": "tr/b/#", "qos": 0, "options": 0}]
    assert by_type[("out", "SUBACK")][0]["reason_codes"] == [1, 0]
    pub = by_type[("in", "PUBLISH")][0]
    assert (pub["packet_id"], pub["qos"], pub["topic"]) == (9, 1, "tr/a")
    assert (pub["payload_size"], pub["payload"], pub["payload_truncated"]) == (11, "hell", True)
    copy = by_type[("out", "PUBLISH")][0]
    assert (copy["topic"], copy["packet_id"]) == ("tr/a", copy_id)
    assert by_type[("out", "PUBACK")][0]["reason_code"] == 0
    assert by_type[("in", "UNSUBSCRIBE")][0]["filters"] == [{"filter": "tr/b/#"}]
    assert by_type[("in", "DISCONNECT")][0]["reason_code"] == 0
    assert events[-1] == {"event": "ended", "events": len(packets), "dropped": 0}


def test_trace_topic_shows_matching_publishes_both_ways(rtd):
    p = start_trace(rtd, "topic", "tt/+/x", "--duration", "2")
    sub = Raw(rtd.port, "tt-sub", version=4)
    sub.send(SUBSCRIBE << 4 | 2, u16(1) + mqtt_str("tt/#") + bytes([0]))
    sub.expect(SUBACK)
    pub = Raw(rtd.port, "tt-pub", version=4)
    pub.send(PUBLISH << 4, mqtt_str("tt/1/y") + b"no")
    pub.send(PUBLISH << 4, mqtt_str("tt/1/x") + b"yes")
    assert [m["topic"] for m in (sub.next_publish(), sub.next_publish())] == ["tt/1/y", "tt/1/x"]
    events = finish(p)
    seen = [(e["client"], e["dir"], e["type"], e["topic"]) for e in events
            if e["event"] == "packet"]
    assert seen == [("tt-pub", "in", "PUBLISH", "tt/1/x"), ("tt-sub", "out", "PUBLISH", "tt/1/x")]


def test_trace_text_lines_and_limits(rtd):
    r = subprocess.run([RTCTL, "-s", rtd.admin_socket, "trace", "topic", "a/#/b"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "not a topic filter" in r.stderr
    r = subprocess.run([RTCTL, "-s", rtd.admin_socket, "trace", "client", "x", "--payload",
                        "100000"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "--payload" in r.stderr
    # Text: a comment line, a line per packet, a comment at the end.
    p = subprocess.Popen([RTCTL, "-s", rtd.admin_socket, "trace", "client", "txt", "--duration",
                          "2", "--payload", "16"], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith('# tracing client "txt" for 2 s')
    c = Raw(rtd.port, "txt", version=4)
    c.send(PUBLISH << 4, mqtt_str("t/x") + b"a\x00b")
    c.send(DISCONNECT << 4, b"")
    out = p.communicate(timeout=30)[0]
    assert p.returncode == 0
    lines = out.splitlines()
    assert ' in  "txt" CONNECT version=4 keepalive=60 clean_start=1 size=' in lines[0]
    assert ' out "txt" CONNACK session_present=0 reason=0x00 size=4' in lines[1]
    assert ' in  "txt" PUBLISH qos=0 topic="t/x" payload_size=3 payload="a\\x00b" size=' \
        in lines[2]
    assert ' in  "txt" DISCONNECT size=2' in lines[3]
    assert lines[-1] == "# trace ended: 4 events, 0 dropped"
    # At most 8 traces at once; one more is refused, and a trace ends with its rtctl.
    procs = [start_trace(rtd, "client", f"c{i}", "--duration", "60") for i in range(8)]
    try:
        assert rtd.ctl_json("status")["traces"] == 8
        r = subprocess.run([RTCTL, "-s", rtd.admin_socket, "trace", "client", "c9"],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 1 and "8 traces are on already" in r.stderr
    finally:
        # SIGTERM, not SIGINT: a shell that starts a job in the background (make's long
        # lane, a CI runner's nohup) has it ignore SIGINT, and rtctl inherits that.
        for q in procs:
            q.send_signal(signal.SIGTERM)
            q.wait(timeout=10)
    assert wait_for(lambda: rtd.ctl_json("status")["traces"] == 0)


def test_trace_flood_with_a_stopped_reader_is_bounded(rtd):
    """10,000 messages a second for 3 s, traced with payloads by a tracer whose reader reads
    nothing: the events waiting for the tracer stay under RT_TRACE_QUEUED_MAX bytes, the rest
    are dropped and counted, and every packet is either shown or counted as dropped."""
    admin = Admin(rtd.admin_socket)
    admin.send_raw(b" ".join(quote(w) for w in ["trace", "client", "flood", "--duration", "8",
                                                "--payload", "64", "--json"]) + b"\n")
    code, body = admin.read_response()
    assert code == 206 and json.loads(body)["event"] == "started"
    c = Raw(rtd.port, "flood", version=4)
    body = mqtt_str("fl/t") + bytes(100)
    batch = (bytes([PUBLISH << 4]) + varint(len(body)) + body) * 100
    mailbox_max, sent, start = 0, 0, time.time()
    while sent < 30000:
        c.sock.sendall(batch)
        sent += 100
        if sent % 2000 == 0:
            mailbox_max = max([mailbox_max] + [a["mailbox"] for a in rtd.ctl_json(
                "actors", "list", "--limit", "1000") if a["type"] == "admin_conn"])
        time.sleep(max(0.0, start + sent / 10000 - time.time()))
    c.send(DISCONNECT << 4, b"")
    # An event carries at least its client id, topic and 64 payload bytes.
    assert mailbox_max * (len("flood") + len("fl/t") + 64) <= TRACE_QUEUED_MAX
    # Now read: the parts that were written, the drops said, and the end.
    packets, dropped_said, end = 0, 0, None
    while end is None:
        code, body = admin.read_response()
        for line in body.decode().splitlines():
            e = json.loads(line)
            if e["event"] == "packet":
                packets += 1
            elif e["event"] == "dropped":
                dropped_said += e["dropped"]
            elif e["event"] == "ended":
                end = e
        assert code in (200, 206)
    total = 2 + sent + 1  # CONNECT, CONNACK, the PUBLISHes, DISCONNECT
    print(f"flood: {sent} sent, mailbox max {mailbox_max}, {packets} shown, {end}")
    assert end["dropped"] > 0 and dropped_said == end["dropped"]
    assert end["events"] == packets and packets + end["dropped"] == total
    admin.close()


def publish_once(port, client_id, topic, payload):
    """An MQTT 5 client connects, publishes one QoS 1 message and disconnects."""
    c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", port)
    c.loop_start()
    c.publish(topic, payload, qos=1).wait_for_publish(5)
    c.disconnect()
    c.loop_stop()


def sse_events(text):
    """The JSON of each `data:` line of a Server-Sent Event stream."""
    return [json.loads(line[6:]) for line in text.decode().splitlines()
            if line.startswith("data: ")]


def test_trace_over_the_api(http):
    b = http
    url = f"http://127.0.0.1:{b.hport}/api/v1/trace/client/api-c?duration=2&payload=8"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {b.read_key}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 403 and "admin role" in json.loads(e.value.read())["error"]
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {b.admin_key}"})
    resp = urllib.request.urlopen(req, timeout=10)
    assert resp.headers["Content-Type"] == "text/event-stream"
    first = resp.readline(), resp.readline()
    assert first[0] == b"event: trace\n" and json.loads(first[1][6:])["event"] == "started"
    publish_once(b.port, "api-c", "api/t", b"payload-bytes")
    rest = resp.read()
    assert b"\0" not in rest  # the `: alive` comments are their 9 bytes, no NUL after
    events = sse_events(rest)
    kinds = [(e.get("dir"), e.get("type")) for e in events if e["event"] == "packet"]
    assert kinds[:4] == [("in", "CONNECT"), ("out", "CONNACK"), ("in", "PUBLISH"),
                         ("out", "PUBACK")]
    pub = next(e for e in events if e.get("type") == "PUBLISH")
    assert (pub["topic"], pub["payload"], pub["payload_truncated"]) == \
        ("api/t", "payload-", True)
    assert events[-1]["event"] == "ended" and events[-1]["events"] == len(kinds)
