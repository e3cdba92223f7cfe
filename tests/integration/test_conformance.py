"""Conformance corners that outside suites found, each against a real rtd: refused CONNECTs get
the CONNACK the spec names, a SUBACK has one code per filter however many, the defaults serve
every spec-valid topic and subscription count, an ACL that denies one topic still grants `#`,
the Receive Maximum is enforced, MQTT 3.1's (UN)SUBSCRIBE flags are tolerated, outbound topic
aliases are sent, and a bad packet's log line names the client.
"""
import socket
import struct
import time

import pytest

from conftest import Rtd, wait_for
from mqtt_raw import (DISCONNECT, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, SUBACK, UNSUBACK, Raw,
                      mqtt_str, prop_u16, read_varint, u16, varint)

P_TOPIC_ALIAS_MAXIMUM = 0x22
P_TOPIC_ALIAS = 0x23
P_RECEIVE_MAXIMUM = 0x21


@pytest.fixture(scope="module")
def broker():
    b = Rtd()
    yield b
    code, log = b.stop()
    assert code == 0, log


def packet(first_byte, body):
    return bytes([first_byte]) + varint(len(body)) + body


def connect_packet(name, level, client_id, clean=True):
    var = mqtt_str(name) + bytes([level, 0x02 if clean else 0]) + u16(60)
    if level == 5:
        var += varint(0)
    return packet(0x10, var + mqtt_str(client_id))


def closed(c, timeout=3.0):
    """Whether rtd closes c's connection (after whatever it still sends) within timeout."""
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            c.read(max(0.01, deadline - time.time()))
    except ConnectionError:
        return True
    return False


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def answer_then_close(port, data):
    """Sends data on a fresh connection; returns every byte rtd sent until it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        got = b""
        while True:
            chunk = s.recv(65536)  # a timeout here means rtd did not close: the test fails
            if not chunk:
                return got
            got += chunk


# ---- a, b: refused CONNECTs get their CONNACK, then the close ----

@pytest.mark.parametrize("name,level", [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4), ("MQTT", 0)])
def test_unacceptable_protocol_version(broker, name, level):
    """[MQTT-3.1.2-2]: CONNACK return code 0x01, then the connection is closed."""
    assert answer_then_close(broker.port, connect_packet(name, level, "pv")) == b"\x20\x02\x00\x01"


def test_empty_client_id_without_clean_session(broker):
    """[MQTT-3.1.3-8]: CONNACK 0x02 (identifier rejected), then close; with clean session the
    same CONNECT is accepted (rtd assigns an id)."""
    assert answer_then_close(broker.port, connect_packet("MQTT", 4, "", clean=False)) == \
        b"\x20\x02\x00\x02"
    ok = Raw(broker.port, "", version=4, clean=True)
    assert ok.connack_code == 0
    ok.disconnect()
    # MQTT 3.1 ids are 1 to 23 characters: longer is identifier rejected too.
    assert answer_then_close(broker.port, connect_packet("MQIsdp", 3, "x" * 24)) == \
        b"\x20\x02\x00\x02"


def test_v5_refused_connect_names_its_reason(broker):
    """A v5 CONNECT that breaks a rule gets a v5 CONNACK with the reason code (3.2.2.2)."""
    body = mqtt_str("MQTT") + bytes([5, 0x02]) + u16(60) + varint(3) + prop_u16(0x21, 0) + \
        mqtt_str("rm0")  # Receive Maximum 0 is a protocol error (3.1.2.11.3)
    assert answer_then_close(broker.port, packet(0x10, body)) == b"\x20\x03\x00\x82\x00"


# ---- c: one SUBACK code per filter, in order ----

@pytest.mark.parametrize("version", [4, 5])
def test_subscribe_with_5000_filters(broker, version):
    n = 5000
    c = Raw(broker.port, f"many-{version}", version=version)
    body = u16(7) + (varint(0) if version == 5 else b"")
    for i in range(n):
        body += mqtt_str(f"many/{version}/{i}") + bytes([i % 3])
    c.send((8 << 4) | 2, body)
    ack = c.expect(SUBACK)
    pos = 2
    if version == 5:
        plen, pos = read_varint(ack.body, 2)
        pos += plen
    assert struct.unpack("!H", ack.body[:2])[0] == 7
    assert ack.body[pos:] == bytes(i % 3 for i in range(n))
    # They are real subscriptions: the last one delivers, at its granted QoS (4999 % 3 = 1).
    c.publish(f"many/{version}/{n - 1}", b"last", qos=1, pid=9)
    m = c.next_publish()
    assert (m["topic"], m["payload"], m["qos"]) == (f"many/{version}/{n - 1}", b"last", 1)
    c.ack(PUBACK, m["pid"])
    body = u16(8) + (varint(0) if version == 5 else b"")
    for i in range(n):
        body += mqtt_str(f"many/{version}/{i}")
    c.send((10 << 4) | 2, body)
    unack = c.expect(UNSUBACK)
    if version == 5:
        plen, pos = read_varint(unack.body, 2)
        assert unack.body[pos + plen:] == b"\x00" * n
    c.disconnect()


# ---- d: the defaults serve what the spec allows ----

def test_default_limits_serve_long_topics_and_many_subscriptions(broker):
    c = Raw(broker.port, "big")
    long_topic = "t" * 65535
    deep_topic = "/".join(["d"] * 32768)  # 65,535 bytes in 32,768 levels
    for i, t in enumerate((long_topic, deep_topic)):
        assert c.subscribe(t, 1, pid=1 + i).body[3:] == b"\x01"
        c.publish(t, b"long", qos=1, pid=10 + i)
        m = c.next_publish()
        assert (m["topic"], m["payload"]) == (t, b"long")
        c.ack(PUBACK, m["pid"])
    # 10,000 subscriptions from one client, in SUBSCRIBEs of 1,000.
    for batch in range(10):
        body = u16(100 + batch) + varint(0)
        for i in range(1000):
            body += mqtt_str(f"sub/{batch * 1000 + i}") + b"\x00"
        c.send((8 << 4) | 2, body)
        ack = c.expect(SUBACK)
        assert ack.body[3:] == b"\x00" * 1000, batch
    assert broker.ctl_json("clients", "show", "big")["subscriptions"] == 10002
    c.publish("sub/9999", b"x", qos=0)
    assert c.next_publish()["topic"] == "sub/9999"
    c.disconnect()


# ---- e: an ACL that denies one topic grants wildcards and withholds that topic ----

@pytest.fixture
def acl_broker(tmp_path):
    acl = tmp_path / "rtd.acl"
    acl.write_text("topic readwrite #\ntopic readwrite $SYS/#\ntopic deny test/nosubscribe\n"
                   "user writer\ntopic write #\n")
    b = Rtd(f'acl_file="{acl}"')
    yield b
    code, log = b.stop()
    assert code == 0, log


@pytest.mark.parametrize("version", [4, 5])
def test_acl_denied_topic_withheld_from_wildcards(acl_broker, version):
    writer = Raw(acl_broker.port, f"w{version}", username="writer")
    writer.publish("test/nosubscribe", b"secret-retained", qos=1, retain=True, pid=1)
    writer.publish("test/other", b"public-retained", qos=1, retain=True, pid=2)
    sub = Raw(acl_broker.port, f"s{version}", version=version)
    # One SUBSCRIBE, so the SUBACK comes before any retained message.
    body = u16(1) + (varint(0) if version == 5 else b"")
    for f in ("#", "+/+", "test/nosubscribe"):
        body += mqtt_str(f) + b"\x01"
    sub.send((8 << 4) | 2, body)
    ack = sub.expect(SUBACK)
    refused = b"\x87" if version == 5 else b"\x80"
    assert ack.body[3 if version == 5 else 2:] == b"\x01\x01" + refused
    # Retained on subscribe: test/other twice (once per subscription), the denied one never.
    retained = sub.drain()
    assert sorted((m["topic"], m["payload"]) for m in retained) == \
        [("test/other", b"public-retained")] * 2
    writer.publish("test/nosubscribe", b"secret", qos=1, pid=3)
    writer.publish("test/other", b"public", qos=1, pid=4)
    writer.publish("a/b/c", b"deep", qos=1, pid=5)
    live = sub.drain()
    assert sorted((m["topic"], m["payload"]) for m in live) == \
        [("a/b/c", b"deep"), ("test/other", b"public")]
    writer.publish("test/nosubscribe", b"", qos=1, retain=True, pid=6)  # clean up
    writer.publish("test/other", b"", qos=1, retain=True, pid=7)
    sub.disconnect()
    writer.disconnect()


# ---- f: the Receive Maximum rtd gives v5 clients ----

def test_receive_maximum_exceeded_disconnects():
    broker = Rtd("receive_maximum=8")
    try:
        c = Raw(broker.port, "rm", version=5)
        rx_max = c.connack_props[P_RECEIVE_MAXIMUM]
        assert rx_max == 8
        # QoS 2 PUBLISHes count until their PUBREL; a resend of one does not count again.
        for pid in range(1, rx_max + 1):
            c.send((3 << 4) | 4, mqtt_str("rm/t") + u16(pid) + varint(0) + b"x")
            assert c.expect(PUBREC).body[:2] == u16(pid)
        c.send((3 << 4) | 4 | 8, mqtt_str("rm/t") + u16(1) + varint(0) + b"x")
        assert c.expect(PUBREC).body[:2] == u16(1)
        # Freeing one makes room for exactly one more.
        c.ack(PUBREL, 1)
        assert c.expect(PUBCOMP).body[:2] == u16(1)
        c.send((3 << 4) | 4, mqtt_str("rm/t") + u16(100) + varint(0) + b"x")
        assert c.expect(PUBREC).body[:2] == u16(100)
        c.send((3 << 4) | 2, mqtt_str("rm/t") + u16(101) + varint(0) + b"x")
        d = c.expect(DISCONNECT)
        assert d.body[0] == 0x93
        assert closed(c)
        # A v3.1.1 client has no Receive Maximum: the same traffic is served.
        v3 = Raw(broker.port, "rm3", version=4)
        for pid in range(1, rx_max + 3):
            v3.send((3 << 4) | 4, mqtt_str("rm/t") + u16(pid) + b"x")
            assert v3.expect(PUBREC).body[:2] == u16(pid)
        v3.disconnect()
    finally:
        code, log = broker.stop()
    assert code == 0, log
    assert "client.bad_packet client=rm peer=127.0.0.1:" in log and "reason=0x93" in log


# ---- g: MQTT 3.1 (UN)SUBSCRIBE with flags 0000 ----

def v31_connect(port, client_id):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(connect_packet("MQIsdp", 3, client_id))
    assert recv_exact(s, 4) == b"\x20\x02\x00\x00"
    return s


def read_packet(s):
    """(first byte, body) of the next packet; these tests only see bodies under 128 bytes."""
    head = recv_exact(s, 2)
    assert head[1] < 128, head
    return head[0], recv_exact(s, head[1])


def tolerated(broker):
    return broker.ctl_json("broker", "metrics")["tolerated"]["v31_subscribe_flags"]


def test_v31_subscribe_flags_zero_accepted_and_counted():
    broker = Rtd()
    try:
        before = tolerated(broker)
        s = v31_connect(broker.port, "tsung-like")
        s.sendall(packet(0x80, u16(1) + mqtt_str("v31/t") + b"\x01"))  # flags 0000
        assert read_packet(s) == (0x90, u16(1) + b"\x01")
        pub = Raw(broker.port, "v31-pub", version=4)
        pub.publish("v31/t", b"hello", qos=1)
        first, body = read_packet(s)
        assert first >> 4 == PUBLISH and b"hello" in body
        s.sendall(packet(0xa0, u16(2) + mqtt_str("v31/t")))  # UNSUBSCRIBE, flags 0000
        assert read_packet(s) == (0xb0, u16(2))
        assert tolerated(broker) == before + 2
        # A 3.1.1 client sending the same is malformed, as the spec says (and not counted).
        bad = Raw(broker.port, "v311-flags", version=4)
        bad.send(0x80, u16(1) + mqtt_str("v31/t") + b"\x01")
        assert closed(bad)
        assert tolerated(broker) == before + 2
        s.close()
        pub.disconnect()
    finally:
        code, log = broker.stop()
    assert code == 0, log


# ---- h: outbound topic aliases ----

def alias_subscriber(port, client_id, alias_max, topic):
    props = prop_u16(P_TOPIC_ALIAS_MAXIMUM, alias_max) if alias_max else b""
    c = Raw(port, client_id, version=5, props=props)
    c.wire_bytes = 0
    c.subscribe(topic, 0)
    return c


def read_publishes(c, n, aliases):
    """n PUBLISHes, their topics resolved through the client's alias map; counts wire bytes."""
    got = []
    for _ in range(n):
        p = c.read()
        assert p is not None and p.type == PUBLISH, p
        c.wire_bytes += 1 + len(varint(len(p.body))) + len(p.body)
        m = c.publish_fields(p)
        m["sent_topic"] = m["topic"]
        alias = m["props"].get(P_TOPIC_ALIAS)
        if m["topic"]:
            if alias:
                aliases[alias] = m["topic"]
        else:
            assert alias in aliases, m
            m["topic"] = aliases[alias]
        got.append(m)
    return got


def test_topic_aliases_sent_and_resolved(broker):
    """A raw client resolves them: the clients here do not (paho-mqtt 1.6 never asks for
    aliases; libmosquitto 2.0.11 asks when told to, then fails on the first alias-only PUBLISH
    as a protocol error)."""
    topics = [f"alias/{'x' * 90}/{i:03d}" for i in range(3)]
    c = alias_subscriber(broker.port, "al-raw", 2, "alias/#")
    pub = Raw(broker.port, "al-pub")
    order = [0, 1, 0, 2, 1, 2, 0]
    for i, t in enumerate(order):
        pub.publish(topics[t], str(i).encode(), qos=0)
    aliases = {}
    got = read_publishes(c, len(order), aliases)
    assert [m["topic"] for m in got] == [topics[t] for t in order]
    assert [m["payload"] for m in got] == [str(i).encode() for i in range(len(order))]
    # Two aliases allowed: the first two topics get them (in full once, then alias-only),
    # the third always goes in full without one.
    assert aliases == {1: topics[0], 2: topics[1]}
    sent = [(bool(m["sent_topic"]), m["props"].get(P_TOPIC_ALIAS)) for m in got]
    assert sent == [(True, 1), (True, 2), (False, 1), (True, None), (False, 2), (True, None),
                    (False, 1)]
    c.disconnect()
    pub.disconnect()


def test_topic_alias_bytes_saved(broker):
    """1,000 messages on a 100-byte topic: the bytes on the wire with aliases and without.
    The saving is what the mechanism gives: every PUBLISH after the first carries a zero-length
    topic and a 3-byte Topic Alias property instead of the topic, and the first carries the
    property on top of it."""
    topic = "b/" + "z" * 98
    assert len(topic) == 100
    n, payload = 1000, b"p" * 16
    plain = alias_subscriber(broker.port, "al-plain", 0, topic)
    aliased = alias_subscriber(broker.port, "al-aliased", 10, topic)
    pub = Raw(broker.port, "al-bytes-pub")
    for _ in range(n):
        pub.publish(topic, payload, qos=0)
    for c in (plain, aliased):
        got = read_publishes(c, n, {})
        assert all(m["topic"] == topic and m["payload"] == payload for m in got)

    def size(topic_len, props_len):
        rl = 2 + topic_len + len(varint(props_len)) + props_len + len(payload)
        return 1 + len(varint(rl)) + rl

    expect = n * size(len(topic), 0) - (size(len(topic), 3) + (n - 1) * size(0, 3))
    saved = plain.wire_bytes - aliased.wire_bytes
    print(f"topic aliases: {plain.wire_bytes} bytes without, {aliased.wire_bytes} with, "
          f"{saved} saved ({100 * saved / plain.wire_bytes:.1f}%) for {n} messages on a "
          f"{len(topic)}-byte topic")
    assert saved == expect
    for c in (plain, aliased, pub):
        c.disconnect()


# ---- h2: frames written straight into the socket (issue 30, part 4) ----

P_MESSAGE_EXPIRY = 0x02
P_SUBSCRIPTION_ID = 0x0B


def pattern(n, seed):
    """n bytes that differ from any other seed's and from a shifted copy of themselves."""
    base = bytes(range(251))
    return (base * (n // 251 + 2))[seed % 251:seed % 251 + n]


def read_in_order(c, n, aliases):
    """n PUBLISHes, acknowledged as their QoS asks, topics resolved through aliases."""
    c.wire_bytes, got = 0, []
    for _ in range(n):
        got += read_publishes(c, 1, aliases)
        if got[-1]["qos"] == 1:
            c.ack(PUBACK, got[-1]["pid"])
    return got


def test_frames_on_both_sides_of_in_place_arrive_whole(broker):
    """Frames of 512 bytes and more (RT_CONN_IN_PLACE_MIN) are encoded into the socket's
    output, smaller ones into a stack buffer and copied, those past 4 KB into a malloc'ed one
    before: payloads across each of those edges and the 64 KB mid-turn flush, each with its
    subscription identifier, topic alias and remaining expiry, reach an MQTT 5 subscriber byte
    for byte and in order."""
    topic = "inplace/" + "t" * 20
    sub = Raw(broker.port, "ip-sub", version=5, props=prop_u16(P_TOPIC_ALIAS_MAXIMUM, 4))
    sub.subscribe("inplace/#", 1, props=bytes([P_SUBSCRIPTION_ID]) + varint(9))
    pub = Raw(broker.port, "ip-pub", version=5)
    sizes = list(range(470, 540)) + list(range(4060, 4110, 7)) + [65000, 65536, 70000, 200000]
    for i, n in enumerate(sizes):
        pub.publish(topic, pattern(n, i), qos=1, pid=i + 1,
                    props=bytes([P_MESSAGE_EXPIRY]) + struct.pack("!I", 3600))
    got = read_in_order(sub, len(sizes), {})
    assert [len(m["payload"]) for m in got] == sizes
    for i, m in enumerate(got):
        assert m["topic"] == topic and m["qos"] == 1, (i, m["topic"], m["qos"])
        assert m["payload"] == pattern(sizes[i], i), f"payload {i} ({sizes[i]} bytes) differs"
        assert m["props"][P_SUBSCRIPTION_ID] == [9]
        assert 3500 <= m["props"][P_MESSAGE_EXPIRY] <= 3600
    # The alias was made once, in full, and then sent alone.
    assert got[0]["sent_topic"] == topic and not any(m["sent_topic"] for m in got[1:])
    sub.disconnect()
    pub.disconnect()


def test_burst_of_mixed_frames_arrives_whole(broker):
    """600 QoS 0 messages of 100 B to 5 KB written to the broker in one go: many frames, both
    kinds, go out to the subscriber in one turn of its actor; it reads each whole, in order."""
    sub = Raw(broker.port, "ip-burst-sub", version=5)
    sub.subscribe("burst/#", 0)
    pub = Raw(broker.port, "ip-burst-pub", version=4)
    sizes = [(100, 600, 2000, 5000)[i % 4] + i for i in range(600)]
    frames = b"".join(bytes([PUBLISH << 4]) + varint(len(body)) + body for body in
                      (mqtt_str(f"burst/{i % 7}") + pattern(n, i) for i, n in enumerate(sizes)))
    pub.sock.sendall(frames)
    got = read_in_order(sub, len(sizes), {})
    for i, m in enumerate(got):
        assert (m["topic"], m["payload"]) == (f"burst/{i % 7}", pattern(sizes[i], i)), i
    sub.disconnect()
    pub.disconnect()


# ---- i: a bad packet's log line names the client ----

@pytest.mark.parametrize("version", [3, 4, 5])
def test_bad_packet_log_names_the_client(broker, version):
    cid = f"named-bad-{version}"
    if version == 3:
        s = v31_connect(broker.port, cid)
        s.sendall(b"\x62\x02\x00\x01")  # PUBREL with flags 0010 is fine; flags 0 below are not
        assert read_packet(s)[0] >> 4 == 7
        s.sendall(b"\x60\x02\x00\x01")
        assert s.recv(1) == b""
        s.close()
    else:
        c = Raw(broker.port, cid, version=version)
        c.send(0x60, u16(1))  # PUBREL with flags 0000: malformed
        assert closed(c)
    assert wait_for(lambda: f"client.bad_packet client={cid} peer=127.0.0.1:" in
                    broker.read_log())


def test_refused_connect_log_names_what_it_can(broker):
    """A CONNECT refused for its client id names that id; one refused earlier names the peer."""
    answer_then_close(broker.port, connect_packet("MQIsdp", 3, "y" * 30))
    answer_then_close(broker.port, connect_packet("MQTT", 7, "never-read"))
    assert wait_for(lambda: f"client.bad_packet client={'y' * 30} peer=127.0.0.1:" in
                    broker.read_log())
    assert wait_for(lambda: "client.bad_packet client=- peer=127.0.0.1:" in broker.read_log())
    assert "never-read" not in broker.read_log()
