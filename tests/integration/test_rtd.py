"""rtd, the broker, driven over sockets by real clients: mosquitto_pub/sub, paho-mqtt (3.1.1
and 5) and raw sockets for malformed input. Each test starts its own rtd on a free loopback
port and stops it by the PID it started.
"""
import json
import os
import queue
import socket
import struct
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
import pytest

from conftest import BUILD, ROOT, RTD, Rtd, client, rtctl, subscribe, wait_for


@pytest.mark.parametrize("protocol", [mqtt.MQTTv311, mqtt.MQTTv5])
def test_pub_sub_wildcards_and_qos(rtd, protocol):
    sub = client(rtd.port, "sub-1", protocol)
    pub = client(rtd.port, "pub-1", protocol)
    subscribe(sub, "sensors/+/temp", 1)
    subscribe(sub, "all/#", 0)
    pub.publish("sensors/a/temp", b"21", qos=1).wait_for_publish(5)
    pub.publish("sensors/a/b/temp", b"no", qos=0)  # '+' is one level
    pub.publish("all", b"parent", qos=1)           # 'all/#' matches its parent
    pub.publish("all/x/y", b"deep", qos=2).wait_for_publish(5)
    assert wait_for(lambda: len(sub.got) >= 3)
    time.sleep(0.2)
    assert sorted(sub.got) == sorted([("sensors/a/temp", b"21", 1), ("all", b"parent", 0),
                                      ("all/x/y", b"deep", 0)])
    subscribe(sub, "q2/#", 2)
    for i in range(5):
        pub.publish(f"q2/{i}", b"exactly-once", qos=2).wait_for_publish(5)
    assert wait_for(lambda: len([g for g in sub.got if g[0].startswith("q2/")]) == 5)
    time.sleep(0.2)
    assert sorted(g for g in sub.got if g[0].startswith("q2/")) == \
        [(f"q2/{i}", b"exactly-once", 2) for i in range(5)]
    for c in (sub, pub):
        c.disconnect()
        c.loop_stop()


def test_dollar_topics_not_matched_by_root_wildcards(rtd):
    sub = client(rtd.port, "sub-d")
    subscribe(sub, "#")
    subscribe(sub, "$app/x")
    pub = client(rtd.port, "pub-d")
    pub.publish("$app/x", b"sys", qos=1).wait_for_publish(5)
    pub.publish("plain", b"p", qos=1).wait_for_publish(5)
    assert wait_for(lambda: len(sub.got) >= 2)
    time.sleep(0.2)
    assert sorted(sub.got) == [("$app/x", b"sys", 0), ("plain", b"p", 0)]  # once each


def test_mosquitto_clients_out_of_the_box(rtd):
    out = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(rtd.port), "-t", "#",
                            "-v", "-W", "30"], stdout=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in out.stdout],
                     daemon=True).start()

    def pub(topic, version="mqttv311"):
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(rtd.port), "-V", version,
                        "-t", topic, "-m", "hi", "-q", "2"], check=True, timeout=10)

    # Its subscription is in place once it prints a probe: until then they go to nobody.
    deadline = time.time() + 10
    while True:
        pub("probe/up")
        try:
            lines.get(timeout=0.2)
            break
        except queue.Empty:
            assert time.time() < deadline
    for v in ("mqttv311", "mqttv5"):
        pub(f"t/{v}", v)
    got = []
    while len(got) < 2:
        line = lines.get(timeout=10)
        if not line.startswith("probe/"):
            got.append(line)
    out.terminate()
    out.wait(timeout=10)
    assert got == ["t/mqttv311 hi", "t/mqttv5 hi"]


def v5_client_watching_disconnect(port, client_id):
    """A connected MQTT 5 client that records the reason of every disconnect it sees."""
    c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv5)
    c.reasons = []
    c.on_disconnect = lambda cl, u, rc, *rest: c.reasons.append(rc)
    c.connect("127.0.0.1", port)
    c.loop_start()
    assert wait_for(lambda: c.is_connected())
    return c


def test_takeover_v5_reason(rtd):
    first = v5_client_watching_disconnect(rtd.port, "same")
    second = client(rtd.port, "same", mqtt.MQTTv5)
    assert wait_for(lambda: first.reasons)
    assert first.reasons[0] == 0x8E  # Session taken over
    for c in (first, second):
        c.disconnect()  # wakes the network thread: loop_stop alone waits out its 1 s select
        c.loop_stop()


def raw_connect(port, client_id=b"raw", keepalive=60, version=4, clean=True):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    name = b"MQTT"
    flags = 0x02 if clean else 0x00
    var = struct.pack("!H", len(name)) + name + bytes([version, flags]) + struct.pack("!H", keepalive)
    if version == 5:
        var += b"\x00"
    payload = struct.pack("!H", len(client_id)) + client_id
    body = var + payload
    s.sendall(bytes([0x10, len(body)]) + body)
    ack = s.recv(64)
    assert ack[0] == 0x20
    return s


def closed_by_peer(s, timeout=5.0):
    s.settimeout(timeout)
    try:
        while True:
            data = s.recv(1024)
            if not data:
                return True
    except (ConnectionResetError, socket.timeout):
        return False


def test_malformed_input_closes_only_that_client(rtd):
    watcher = client(rtd.port, "watcher")
    subscribe(watcher, "ok")
    cases = [
        bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]),  # remaining length of 5 bytes
        bytes([0x82, 0x02, 0x00, 0x01]),              # SUBSCRIBE with no topic filter
        bytes([0x32, 0x05, 0x00, 0x01, 0x61, 0x00, 0x00]),  # QoS 1 PUBLISH, packet id 0
        bytes([0x30, 0x04, 0x00, 0x02, 0xC3, 0x28]),  # topic is not UTF-8
        bytes([0x10, 0x00]),                          # a second CONNECT
    ]
    for bad in cases:
        s = raw_connect(rtd.port)
        s.sendall(bad)
        assert closed_by_peer(s), bad
        s.close()
    # Garbage before any CONNECT.
    s = socket.create_connection(("127.0.0.1", rtd.port), timeout=5)
    s.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert closed_by_peer(s)
    s.close()
    pub = client(rtd.port, "pub-ok")
    pub.publish("ok", b"still here", qos=1).wait_for_publish(5)
    assert wait_for(lambda: watcher.got == [("ok", b"still here", 0)])


def test_keepalive_enforced(rtd):
    s = raw_connect(rtd.port, b"sleepy", keepalive=1)
    t0 = time.time()
    assert closed_by_peer(s, timeout=5)
    elapsed = time.time() - t0
    assert 1.0 <= elapsed <= 3.5, elapsed  # 1.5 x keepalive, checked every keepalive/2


def pinged(s):
    """A PINGRESP back: the connection's actor has finished every packet sent before."""
    s.sendall(b"\xc0\x00")
    assert s.recv(2) == b"\xd0\x00"


def timers_pending(broker):
    code, out, err = rtctl("vm", socket_path=broker.admin_socket, json=True)
    assert code == 0, err
    return json.loads(out)["actors"]["timers_pending"]


def test_idle_connection_holds_one_timer():
    """Its connect_timeout timer makes the first keepalive check when that is soon enough
    (keepalive / 2 >= connect_timeout): an idle connection holds one timer (32 bytes in its
    scheduler's heap), not two; a short keepalive gets its own, as the check cannot wait."""
    broker = Rtd("connect_timeout=5")
    try:
        # rtd's own periodic timers may be between firing and being armed again when one is
        # read: a few either way, where one timer or two a connection differ by 20.
        flux = 3
        base = timers_pending(broker)
        long_ka = [raw_connect(broker.port, b"long%d" % i, keepalive=10) for i in range(20)]
        for s in long_ka:
            pinged(s)
        held = timers_pending(broker)
        assert abs(held - base - 20) <= flux, (base, held)
        short_ka = [raw_connect(broker.port, b"short%d" % i, keepalive=9) for i in range(20)]
        for s in short_ka:
            pinged(s)
        assert abs(timers_pending(broker) - held - 40) <= flux, (base, held)
        for s in long_ka + short_ka:
            s.close()
    finally:
        code, log = broker.stop()
        assert code == 0, log


def test_keepalive_riding_the_connect_timer_is_enforced():
    """keepalive 2 s, connect_timeout 1 s: the first check is the connect_timeout timer's, the
    later ones the connection's own; a silent client is closed past 1.5 x its keepalive and
    not before, as with a timer of its own from the start."""
    broker = Rtd("connect_timeout=1")
    try:
        t0 = time.monotonic()  # before the CONNECT: the client's silence starts after it
        s = raw_connect(broker.port, b"sleepy-long", keepalive=2)
        assert closed_by_peer(s, timeout=10)
        assert time.monotonic() - t0 > 3.0  # 1.5 x keepalive
        s.close()
    finally:
        code, log = broker.stop()
        assert code == 0, log


def test_sigterm_sends_v5_disconnect_and_exits_cleanly():
    broker = Rtd()
    c = v5_client_watching_disconnect(broker.port, "v5")
    code, log = broker.stop()
    assert code == 0, log
    assert wait_for(lambda: c.reasons)
    assert c.reasons[0] == 0x8B  # Server shutting down
    assert "clean shutdown" in log
    c.disconnect()  # ends the reconnect wait: loop_stop alone sleeps it out (up to 1 s)
    c.loop_stop()


def test_bad_config_refused_with_file_and_line(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("listeners = { \"127.0.0.1:1\" }\nmax_connections = -1\n")
    r = subprocess.run([RTD, "-c", str(conf)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2
    assert f"{conf}:2: max_connections must be a whole number from 1 to 10000000" in r.stderr
    r = subprocess.run([RTD, "-o", "batch=lots"], capture_output=True, text=True, timeout=10,
                       cwd=ROOT)
    assert r.returncode == 2 and "batch must be a whole number" in r.stderr


def test_listener_in_use_is_reported(rtd):
    r = subprocess.run([RTD, "-o", f"listeners=127.0.0.1:{rtd.port}"], capture_output=True,
                       text=True, timeout=10, cwd=ROOT)
    assert r.returncode == 2
    assert "address already in use" in r.stderr


def client_retained(port, client_id, protocol=mqtt.MQTTv311):
    """A client that records the retain flag as well."""
    c = mqtt.Client(client_id=client_id, protocol=protocol)
    c.got = []
    c.on_message = lambda _c, _u, m: c.got.append((m.topic, m.payload, m.retain))
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def test_retained_set_replace_clear(rtd):
    pub = client(rtd.port, "pub-r")
    pub.publish("r/1", b"one", qos=1, retain=True).wait_for_publish(5)
    pub.publish("r/2", b"two", qos=1, retain=True).wait_for_publish(5)
    a = client_retained(rtd.port, "a")
    subscribe(a, "r/+", 1)
    assert wait_for(lambda: len(a.got) == 2)
    assert sorted(a.got) == [("r/1", b"one", True), ("r/2", b"two", True)]
    pub.publish("r/1", b"uno", qos=1, retain=True).wait_for_publish(5)
    pub.publish("r/2", b"", qos=1, retain=True).wait_for_publish(5)  # clears r/2
    # a is subscribed already: live messages arrive with retain cleared (3.3.1.3).
    assert wait_for(lambda: len(a.got) == 4)
    assert ("r/1", b"uno", False) in a.got
    b = client_retained(rtd.port, "b")
    subscribe(b, "r/#", 1)
    assert wait_for(lambda: len(b.got) >= 1)
    time.sleep(0.2)
    assert b.got == [("r/1", b"uno", True)]
    subscribe(b, "$share/g/r/#", 1)  # no retained messages for shared subscriptions
    time.sleep(0.2)
    assert b.got == [("r/1", b"uno", True)]


def test_retain_handling_v5(rtd):
    pub = client(rtd.port, "pub-rh")
    pub.publish("rh/x", b"kept", qos=1, retain=True).wait_for_publish(5)
    c = client_retained(rtd.port, "rh", mqtt.MQTTv5)
    from paho.mqtt.subscribeoptions import SubscribeOptions
    done = threading.Event()
    c.on_subscribe = lambda *a: done.set()
    c.subscribe("rh/#", options=SubscribeOptions(qos=1, retainHandling=2))
    assert done.wait(5)
    time.sleep(0.2)
    assert c.got == []  # 2: never send retained
    done.clear()
    c.subscribe("rh/+", options=SubscribeOptions(qos=1, retainHandling=1))
    assert done.wait(5) and wait_for(lambda: len(c.got) == 1)  # 1: new subscription
    done.clear()
    c.subscribe("rh/+", options=SubscribeOptions(qos=1, retainHandling=1))
    assert done.wait(5)
    time.sleep(0.2)
    assert len(c.got) == 1  # 1: not again for an existing subscription


def test_shared_subscriptions_round_robin_and_failover(rtd):
    m1 = client(rtd.port, "m1")
    m2 = client(rtd.port, "m2")
    plain = client(rtd.port, "plain")
    subscribe(m1, "$share/g/jobs/#", 1)
    subscribe(m2, "$share/g/jobs/#", 1)
    subscribe(plain, "jobs/#", 1)
    pub = client(rtd.port, "pub-s")
    for i in range(10):
        pub.publish(f"jobs/{i}", b"j", qos=1).wait_for_publish(5)
    assert wait_for(lambda: len(plain.got) == 10 and len(m1.got) + len(m2.got) == 10)
    assert len(m1.got) == 5 and len(m2.got) == 5  # round robin, each message once
    m2.disconnect()
    m2.loop_stop()
    time.sleep(0.3)
    for i in range(4):
        pub.publish(f"jobs/x{i}", b"j", qos=1).wait_for_publish(5)
    assert wait_for(lambda: len(m1.got) == 9)  # the member that left is skipped


def test_subscription_identifiers_v5(rtd):
    from paho.mqtt.properties import Properties
    c = mqtt.Client(client_id="sid", protocol=mqtt.MQTTv5)
    ids = []
    c.on_message = lambda _c, _u, m: ids.append(getattr(m.properties, "SubscriptionIdentifier",
                                                        None))
    c.connect("127.0.0.1", rtd.port)
    c.loop_start()
    done = threading.Event()
    c.on_subscribe = lambda *a: done.set()
    props = Properties(PacketTypes.SUBSCRIBE)
    props.SubscriptionIdentifier = 7
    c.subscribe("sid/#", qos=1, properties=props)
    assert done.wait(5)
    pub = client(rtd.port, "pub-sid")
    pub.publish("sid/a", b"x", qos=1).wait_for_publish(5)
    assert wait_for(lambda: ids)
    assert ids == [[7]]
    c.disconnect()  # wakes the network thread: loop_stop alone waits out its 1 s select
    c.loop_stop()


def raw_connect_will(port, client_id, will_topic, will_payload, version=4, will_delay=None,
                     session_expiry=None, will_qos=1):
    """CONNECT with a will, over a raw socket so the test can drop it without DISCONNECT."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    flags = 0x02 | 0x04 | (will_qos << 3)
    var = struct.pack("!H", 4) + b"MQTT" + bytes([version, flags]) + struct.pack("!H", 60)
    will_props = b""
    if version == 5:
        props = b""
        if session_expiry is not None:
            props += b"\x11" + struct.pack("!I", session_expiry)
        var += bytes([len(props)]) + props
        if will_delay is not None:
            will_props = b"\x18" + struct.pack("!I", will_delay)
        will_props = bytes([len(will_props)]) + will_props
    payload = (struct.pack("!H", len(client_id)) + client_id + will_props +
               struct.pack("!H", len(will_topic)) + will_topic +
               struct.pack("!H", len(will_payload)) + will_payload)
    body = var + payload
    s.sendall(bytes([0x10, len(body)]) + body)
    ack = s.recv(64)
    assert ack[0] == 0x20
    return s


def test_will_on_abrupt_close_not_on_disconnect(rtd):
    watcher = client(rtd.port, "will-watch")
    subscribe(watcher, "wills/#", 1)
    s = raw_connect_will(rtd.port, b"w1", b"wills/w1", b"gone")
    s.close()  # no DISCONNECT: the will goes out
    assert wait_for(lambda: watcher.got == [("wills/w1", b"gone", 1)])
    s = raw_connect_will(rtd.port, b"w2", b"wills/w2", b"never")
    s.sendall(bytes([0xE0, 0x00]))  # normal DISCONNECT discards the will
    s.close()
    time.sleep(0.3)
    assert watcher.got == [("wills/w1", b"gone", 1)]


def test_will_delay_and_reconnect_cancels_it(rtd):
    watcher = client(rtd.port, "wd-watch")
    subscribe(watcher, "wd/#", 1)
    s = raw_connect_will(rtd.port, b"wd1", b"wd/1", b"late", version=5, will_delay=1,
                         session_expiry=60)
    t0 = time.time()
    s.close()
    assert wait_for(lambda: watcher.got, timeout=5)
    assert time.time() - t0 >= 0.9  # held back for the will delay
    s = raw_connect_will(rtd.port, b"wd2", b"wd/2", b"cancelled", version=5, will_delay=1,
                         session_expiry=60)
    s.close()
    time.sleep(0.2)
    # Back within the delay, continuing the session: no will.
    again = raw_connect(rtd.port, b"wd2", version=5, clean=False)
    time.sleep(1.5)
    assert watcher.got == [("wd/1", b"late", 1)]
    again.close()
    # Back within the delay with clean start 1: the old session ends, so its will goes now.
    s = raw_connect_will(rtd.port, b"wd3", b"wd/3", b"session over", version=5, will_delay=30,
                         session_expiry=60)
    s.close()
    time.sleep(0.2)
    fresh = raw_connect(rtd.port, b"wd3", version=5)
    assert wait_for(lambda: ("wd/3", b"session over", 1) in watcher.got, timeout=3)
    fresh.close()


def test_v5_properties_pass_through(rtd):
    from paho.mqtt.properties import Properties
    got = []
    sub = mqtt.Client(client_id="props-sub", protocol=mqtt.MQTTv5)
    sub.on_message = lambda _c, _u, m: got.append(m)
    sub.connect("127.0.0.1", rtd.port)
    sub.loop_start()
    subscribe(sub, "rr/#", 1)
    v3 = client(rtd.port, "props-v3")
    subscribe(v3, "rr/#", 1)
    pub = client(rtd.port, "props-pub", mqtt.MQTTv5)
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = "rr/reply"
    props.CorrelationData = b"\x01\x02"
    props.ContentType = "text/plain"
    props.PayloadFormatIndicator = 1
    props.UserProperty = [("k", "v"), ("k", "w")]
    pub.publish("rr/req", b"ping", qos=1, properties=props).wait_for_publish(5)
    assert wait_for(lambda: got and v3.got)
    p = got[0].properties
    assert p.ResponseTopic == "rr/reply" and p.CorrelationData == b"\x01\x02"
    assert p.ContentType == "text/plain" and p.PayloadFormatIndicator == 1
    assert p.UserProperty == [("k", "v"), ("k", "w")]
    assert v3.got == [("rr/req", b"ping", 1)]  # v3 subscribers get the message without them
    sub.disconnect()  # wakes the network thread: loop_stop alone waits out its 1 s select
    sub.loop_stop()


def v5_publish_raw(topic, payload, props=b"", qos=0, packet_id=None):
    var = struct.pack("!H", len(topic)) + topic
    if qos:
        var += struct.pack("!H", packet_id)
    var += bytes([len(props)]) + props
    body = var + payload
    return bytes([0x30 | (qos << 1), len(body)]) + body


def test_v5_topic_aliases(rtd):
    watcher = client(rtd.port, "alias-watch")
    subscribe(watcher, "al/#")
    s = raw_connect(rtd.port, b"aliaser", version=5)
    s.sendall(v5_publish_raw(b"al/long/topic", b"one", b"\x23\x00\x01"))  # set alias 1
    s.sendall(v5_publish_raw(b"", b"two", b"\x23\x00\x01"))              # use alias 1
    assert wait_for(lambda: len(watcher.got) == 2)
    assert watcher.got == [("al/long/topic", b"one", 0), ("al/long/topic", b"two", 0)]
    s.sendall(v5_publish_raw(b"", b"x", b"\x23\x00\x02"))  # alias 2 was never set
    assert closed_by_peer(s)
    s = raw_connect(rtd.port, b"aliaser2", version=5)
    s.sendall(v5_publish_raw(b"al/x", b"x", b"\x23\xff\xff"))  # above topic alias maximum
    data = s.recv(64)
    assert data[:1] == b"\xe0" and data[2] == 0x94  # DISCONNECT, Topic Alias invalid
    s.close()


def test_v5_client_maximum_packet_size(rtd):
    s = socket.create_connection(("127.0.0.1", rtd.port), timeout=5)
    props = b"\x27" + struct.pack("!I", 64)  # this client takes packets of 64 bytes at most
    var = struct.pack("!H", 4) + b"MQTT" + bytes([5, 0x02]) + struct.pack("!H", 60)
    var += bytes([len(props)]) + props
    body = var + struct.pack("!H", 5) + b"small"
    s.sendall(bytes([0x10, len(body)]) + body)
    assert s.recv(64)[0] == 0x20
    sub = bytes([0x82, 0x08]) + struct.pack("!H", 1) + b"\x00" + struct.pack("!H", 2) + b"mx" + b"\x00"
    s.sendall(sub)
    assert s.recv(64)[0] == 0x90
    pub = client(rtd.port, "mx-pub")
    pub.publish("mx", b"y" * 200, qos=1).wait_for_publish(5)  # too big for it: dropped
    pub.publish("mx", b"fits", qos=1).wait_for_publish(5)
    s.settimeout(2)
    data = s.recv(256)
    assert data[0] == 0x30 and data.endswith(b"fits")
    s.close()


RTBENCH = os.path.join(BUILD, "tools", "rtbench", "rtbench")


def rtbench(*args):
    import json
    r = subprocess.run([RTBENCH, *args, "--json", "--quiet"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_five_thousand_connections(rtd):
    res = rtbench("conn", "-p", str(rtd.port), "-c", "5000", "-i", "0", "-d", "3")
    assert res["connected"] == 5000 and res["failed"] == 0 and res["lost"] == 0
    watcher = client(rtd.port, "after-5000")
    subscribe(watcher, "alive")
    client(rtd.port, "pub-5000").publish("alive", b"yes", qos=1).wait_for_publish(5)
    assert wait_for(lambda: watcher.got == [("alive", b"yes", 0)])


@pytest.mark.parametrize("qos", [1, 2])
def test_load_exact_counts(rtd, qos):
    res = rtbench("pairs", "-p", str(rtd.port), "-c", "200", "-q", str(qos), "-d", "3")
    assert res["sent"] > 0
    assert res["received"] == res["sent"] == res["expected"]
    assert res["missing"] == 0 and res["duplicates"] == 0 and res["out_of_order"] == 0
    fan = rtbench("fanout", "-p", str(rtd.port), "-c", "100", "-q", str(qos), "-d", "2")
    assert fan["missing"] == 0 and fan["duplicates"] == 0 and fan["received"] == fan["expected"]
