"""Inbound flow control with a standard client (MQTT 5 4.9): the Receive Maximum rtd gives
MQTT 5 clients (`receive_maximum`), who is blamed for overrunning it, and MQTT.js's burst.

MQTT.js 5 keeps no send quota: it writes a whole burst before it reads one PUBREC, so its
PUBRELs reach rtd behind its own PUBLISHes. rtd's Receive Maximum leaves room for that, and a
client is disconnected with 0x93 only for QoS 2 PUBLISHes whose PUBREC it was sent and whose
PUBREL it still owes. Acknowledgements rtd withholds itself (waiting for the store to commit
the copies a persistent session keeps) are not the client's doing: its input waits for them
instead (README "Flow control").
"""
import json
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, Rtd
from mqtt_raw import DISCONNECT, PUBACK, PUBLISH, PUBREC, PUBREL, Raw, mqtt_str, u16, varint

NODE_DIR = os.path.join(ROOT, "tests", "node")
BURST = 20000
P_RECEIVE_MAXIMUM = 0x21

needs_node = pytest.mark.skipif(
    not shutil.which("node") or not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "mqtt")),
    reason="MQTT.js not installed (tools/install-deps.sh runs npm ci)")


def burst(broker, version, *extra):
    p = subprocess.run(["node", os.path.join(NODE_DIR, "burst.js"), str(broker.port), str(BURST),
                        "--version", str(version), "--timeout", "60000", *extra],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@needs_node
@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("persistent", [False, True], ids=["clean", "persistent"])
def test_mqttjs_burst_served_whatever_the_version(stopper, version, persistent):
    """20,000 messages at QoS 0, 1 and 2 from MQTT.js to one QoS 2 subscriber, rtd's defaults
    (persistence on): all delivered once, the publisher never disconnected. With a persistent
    subscriber every QoS 1/2 acknowledgement waits for the store's commit of its copy."""
    broker = Rtd()
    stopper(broker)
    r = burst(broker, version, *(["--persistent"] if persistent else []))
    assert r["received"] == BURST and r["duplicates"] == 0, r
    assert r["by_qos"] == [6667, 6667, 6666], r
    assert r["disconnects"] == [], r
    assert "client.bad_packet" not in broker.read_log()
    print(f"v{version} {'persistent' if persistent else 'clean'}: {r['ms']} ms")


def raw_v5(port, cid):
    c = Raw(port, cid, version=5)
    assert c.connack_code == 0
    return c


def test_acks_rtd_withholds_do_not_count_against_the_client():
    """A persistent subscriber's copies are committed before the publisher's PUBACK goes, so
    rtd withholds those acks for its own reasons. A Receive Maximum of 4 and 20 QoS 1
    PUBLISHes in one write: rtd stops reading at 4 withheld and goes on as commits come; the
    client is acknowledged 20 times, in order, and never disconnected."""
    broker = Rtd("receive_maximum=4")
    try:
        props = bytes([0x11]) + (3600).to_bytes(4, "big")  # Session Expiry Interval
        sub = Raw(broker.port, "wh-sub", version=5, clean=False, props=props)
        sub.send((8 << 4) | 2, u16(1) + varint(0) + mqtt_str("wh/t") + b"\x01")
        sub.expect(9)  # SUBACK
        pub = raw_v5(broker.port, "wh-pub")
        pub.sock.sendall(b"".join(
            bytes([(3 << 4) | 2]) + varint(len(body)) + body
            for body in (mqtt_str("wh/t") + u16(pid) + varint(0) + b"m%d" % pid
                         for pid in range(1, 21))))
        for pid in range(1, 21):
            ack = pub.read(timeout=30)
            assert ack is not None and ack.type == PUBACK, (pid, ack)
            assert ack.body[:2] == u16(pid)
        got = [sub.publish_fields(sub.expect(PUBLISH))["payload"] for _ in range(20)]
        assert got == [b"m%d" % pid for pid in range(1, 21)]
    finally:
        code, log = broker.stop()
    assert code == 0, log[-3000:]
    assert "client.bad_packet" not in log


def test_client_that_never_releases_is_disconnected_at_the_default():
    """paho's interoperability test_flow_control2: Receive Maximum + 1 QoS 2 PUBLISHes sent
    without reading anything and without a PUBREL: DISCONNECT 0x93 after the last one, at
    rtd's default Receive Maximum (the PUBRECs meanwhile stay within what the kernel and the
    connection's output hold, so rtd keeps reading to the one that overruns)."""
    broker = Rtd()
    try:
        c = raw_v5(broker.port, "never-releases")
        rx_max = c.connack_props[P_RECEIVE_MAXIMUM]
        assert 1024 < rx_max <= 65000, rx_max
        packets = b"".join(
            bytes([(3 << 4) | 4]) + varint(len(body)) + body
            for body in (mqtt_str("fc/t") + u16(pid) + varint(0) + b"m%d" % pid
                         for pid in range(1, rx_max + 2)))
        c.sock.sendall(packets)
        # Then as paho's client: each PUBREC answered with its PUBREL, until the DISCONNECT.
        # rtd has ended the connection by then; its socket lingers, taking what the client
        # still sends, so these writes succeed and the DISCONNECT is read, not a reset.
        for pid in range(1, rx_max + 1):
            assert c.expect(PUBREC, timeout=30).body[:2] == u16(pid)
            c.ack(PUBREL, pid)
        d = c.expect(DISCONNECT, timeout=30)
        assert d.body[0] == 0x93
    finally:
        code, log = broker.stop()
    assert code == 0, log[-3000:]
    assert "client=never-releases" in log and "reason=0x93" in log


def test_receive_maximum_is_a_live_setting():
    broker = Rtd("receive_maximum=100")
    try:
        assert raw_v5(broker.port, "a").connack_props[P_RECEIVE_MAXIMUM] == 100
        code, out, err = broker.ctl("config", "set", "receive_maximum", "200")
        assert code == 0, (out, err)
        assert raw_v5(broker.port, "b").connack_props[P_RECEIVE_MAXIMUM] == 200
        # max_inflight is the other direction only: it does not change what clients are told.
        assert broker.ctl("config", "set", "max_inflight", "10")[0] == 0
        assert raw_v5(broker.port, "c").connack_props[P_RECEIVE_MAXIMUM] == 200
    finally:
        code, log = broker.stop()
    assert code == 0, log[-3000:]
