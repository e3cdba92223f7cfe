"""The $SYS/broker tree end to end: a real rtd publishing every second (sys_interval=1), read
by a paho subscriber; every value is checked against what the test itself did (clients it
connected, messages it published, subscriptions and retained messages it made).

Run: RT_BUILD_DIR=$PWD/build/release /usr/bin/python3 -m pytest -q tests/integration/test_sys.py
"""
import socket
import subprocess

import paho.mqtt.client as mqtt
import pytest

from conftest import RTD, Rtd, client, subscribe, wait_for
from mqtt_raw import CONNECT, DISCONNECT, PUBLISH, mqtt_str, u16, varint
from sys_tree import PREFIX, SysTree


@pytest.fixture
def sys1():
    broker = Rtd("sys_interval=1")
    yield broker
    code, log = broker.stop()
    assert code == 0, log


def wait_tick(tree, then="uptime"):
    """Waits for a tick that begins after this call (a tick starts with uptime) to publish
    `then`: the values it brings were read after whatever the test did before."""
    mark = len(tree.messages())

    def ticked():
        names = [name for name, _ in tree.messages()[mark:]]
        return "uptime" in names and then in names[names.index("uptime"):]

    assert wait_for(ticked, timeout=10), tree.messages()[mark:]


def publish_all(c, topic, payloads, retain=False):
    for p in payloads:
        c.publish(topic, p, qos=1, retain=retain).wait_for_publish()


def test_version_and_uptime(sys1):
    tree = SysTree(sys1.port)
    out = subprocess.run([RTD, "--version"], capture_output=True, text=True).stdout.split()
    assert wait_for(lambda: tree.get("version") is not None)
    assert tree.get("version") == "rtd version " + out[1]
    assert tree.get("uptime").endswith(" seconds")
    first = tree.num("uptime")
    assert wait_for(lambda: tree.num("uptime") >= first + 2, 4), tree.get("uptime")
    # Published on change only: the version came once (the retained copy), the uptime each tick.
    assert tree.count("version") == 1
    assert tree.count("uptime") >= 3
    tree.close()


def test_clients_messages_and_subscriptions(sys1):
    tree = SysTree(sys1.port)
    hash_sub = client(sys1.port, "hash")
    subscribe(hash_sub, "#")
    n = 3
    clients = [client(sys1.port, f"c{i}") for i in range(n)]
    for i, c in enumerate(clients):
        subscribe(c, f"t/{i}/a")
        subscribe(c, "t/+/b")
    assert tree.wait("clients/connected", n + 2), tree.get("clients/connected")
    assert tree.wait("clients/total", n + 2), tree.get("clients/total")
    assert tree.wait("subscriptions/count", 2 * n + 2), tree.get("subscriptions/count")
    assert tree.num("clients/disconnected") == 0

    publish_all(clients[0], "t/x/b", [b"m%d" % i for i in range(7)])
    assert tree.wait("messages/received", 7), tree.get("messages/received")
    # Each message went to the n clients on t/+/b and to '#'. The watcher's own $SYS
    # messages count too: messages/sent of one tick includes every $SYS message sent
    # before that tick began (the tick's first message is its uptime).
    assert wait_for(lambda: len(hash_sub.got) == 7)
    assert all(len(c.got) == 7 for c in clients)
    want = 7 * (n + 1)
    # A tick that began after every copy was received counts them all: wait for its
    # messages/sent (a tick starts with uptime), however late the tick runs.
    wait_tick(tree, "messages/sent")
    msgs = tree.messages()
    last = max(i for i, (name, _) in enumerate(msgs) if name == "messages/sent")
    tick_start = max(i for i, (name, _) in enumerate(msgs[:last]) if name == "uptime")
    assert int(msgs[last][1]) == want + tick_start

    # '#' does not match topics starting with '$' (MQTT 4.7.2): it got only the t/x/b ones.
    assert {t for t, _, _ in hash_sub.got} == {"t/x/b"}

    # The rates: a burst after a quiet start shows most in the 1 minute average.
    assert wait_for(lambda: tree.get("load/messages/received/1min") is not None)
    l1, l5, l15 = (float(tree.get(f"load/messages/received/{m}")) for m in ("1min", "5min", "15min"))
    assert l1 > l5 > l15 > 0

    for c in clients:
        c.disconnect()
        c.loop_stop()
    assert tree.wait("clients/connected", 2), tree.get("clients/connected")
    assert tree.wait("subscriptions/count", 2), tree.get("subscriptions/count")
    assert tree.num("clients/maximum") == n + 2

    # A persistent session that went offline: disconnected, still counted in total.
    p = mqtt.Client(client_id="persistent", protocol=mqtt.MQTTv311, clean_session=False)
    p.connect("127.0.0.1", sys1.port)
    p.loop_start()
    subscribe(p, "p/#", 1)
    assert tree.wait("clients/connected", 3), tree.get("clients/connected")
    p.disconnect()
    p.loop_stop()
    assert tree.wait("clients/disconnected", 1), tree.get("clients/disconnected")
    assert tree.wait("clients/connected", 2), tree.get("clients/connected")
    assert tree.num("clients/total") == 3
    assert tree.num("subscriptions/count") == 3  # the offline session keeps p/#
    assert tree.num("clients/maximum") == n + 2
    hash_sub.disconnect()
    tree.close()


def test_retained_count_and_heap(sys1):
    tree = SysTree(sys1.port)
    pub = client(sys1.port, "retainer")
    assert wait_for(lambda: tree.num("heap/current") is not None)
    wait_tick(tree)  # after the publisher connected (heap/current is published on change)
    heap_before = tree.num("heap/current")
    big = b"x" * 200_000
    publish_all(pub, "keep/1", [b"one"], retain=True)
    publish_all(pub, "keep/2", [big], retain=True)
    # Every $SYS topic is retained too, so the store holds them plus the test's two.
    assert wait_for(lambda: tree.num("retained messages/count") == len(tree.names()) + 2), \
        (tree.get("retained messages/count"), len(tree.names()))
    assert wait_for(lambda: tree.num("heap/current") >= heap_before + len(big)), \
        (heap_before, tree.get("heap/current"))
    assert tree.num("heap/maximum") >= tree.num("heap/current")
    publish_all(pub, "keep/1", [b""], retain=True)  # an empty retained message clears it
    assert wait_for(lambda: tree.num("retained messages/count") == len(tree.names()) + 1)
    pub.disconnect()
    tree.close()


def publish_size(name, value):
    """Bytes of a QoS 0 MQTT 3.1.1 PUBLISH of $SYS/broker/<name> carrying value."""
    remaining = 2 + len(PREFIX + name) + len(value.encode())
    return 1 + len(varint(remaining)) + remaining


def test_bytes_and_connections(sys1):
    # The watcher is the only client: every byte sent is its CONNACK, SUBACK and $SYS messages.
    tree = SysTree(sys1.port)
    # A tick after the watcher subscribed: what it counts includes the CONNACK and SUBACK
    # (the retained values given at the SUBSCRIBE may be from before them).
    wait_tick(tree, "bytes/sent")
    msgs = tree.messages()
    last = max(i for i, (name, _) in enumerate(msgs) if name == "bytes/sent")
    tick_start = max(i for i, (name, _) in enumerate(msgs[:last]) if name == "uptime")
    connack, suback = 4, 5
    assert int(msgs[last][1]) == connack + suback + sum(publish_size(n, v)
                                                        for n, v in msgs[:tick_start])

    # bytes/received grows by exactly what a raw client writes (the watcher stays quiet).
    before = tree.num("bytes/received")
    assert before > 0
    with socket.create_connection(("127.0.0.1", sys1.port), timeout=5) as s:
        connect = mqtt_str("MQTT") + bytes([4, 0x02]) + u16(60) + mqtt_str("raw-bytes")
        publish = mqtt_str("b/x") + b"0123456789"
        wire = (bytes([CONNECT << 4]) + varint(len(connect)) + connect +
                bytes([PUBLISH << 4]) + varint(len(publish)) + publish + bytes([DISCONNECT << 4, 0]))
        s.sendall(wire)
        assert s.recv(4) == b"\x20\x02\x00\x00"
        assert s.recv(16) == b""  # closed after the DISCONNECT
    assert tree.wait("bytes/received", before + len(wire)), (before, len(wire),
                                                             tree.get("bytes/received"))
    assert tree.wait("messages/received", 1)
    # Two CONNECTs (the watcher's and the raw client's) show in the connection rate.
    assert wait_for(lambda: float(tree.get("load/connections/1min") or 0) > 0, 3)
    # Accepted sockets: the watcher and the raw client (Rtd waits for READY=1, it does not
    # connect to see that rtd is up).
    assert tree.wait("connections/accepted", 2), tree.get("connections/accepted")
    tree.close()


def test_bad_packets_counted(sys1):
    tree = SysTree(sys1.port)
    assert tree.wait("bad_packets", 0)
    with socket.create_connection(("127.0.0.1", sys1.port), timeout=5) as s:
        s.sendall(b"\x00\x00")  # packet type 0 is reserved (MQTT 2.1.2)
        assert s.recv(16) == b""  # closed without a CONNACK
    assert tree.wait("bad_packets", 1), tree.get("bad_packets")
    tree.close()


def test_clients_cannot_publish_to_sys(sys1):
    tree = SysTree(sys1.port)
    assert wait_for(lambda: tree.get("version") is not None)
    real = tree.get("version")
    subscribe(tree.client, "after/fake")
    faker = client(sys1.port, "faker")
    faker.publish("$SYS/broker/version", b"fake", qos=1, retain=True).wait_for_publish()
    # A marker behind it: one publisher's messages reach a subscriber in order, so once the
    # watcher has the marker it would have had the fake too.
    faker.publish("after/fake", b"marker", qos=1).wait_for_publish()
    assert wait_for(lambda: ("after/fake", b"marker", 0) in tree.client.got)
    assert ("$SYS/broker/version", b"fake", 0) not in tree.client.got
    # A retained fake would be stored before its PUBACK (durable acks): a new subscriber
    # would be given it.
    later = SysTree(sys1.port, "late-watcher")
    assert wait_for(lambda: later.get("version") is not None)
    assert later.get("version") == real
    faker.disconnect()
    later.close()
    tree.close()


def test_sys_interval_zero_publishes_nothing():
    broker = Rtd("sys_interval=0")
    try:
        # The $SYS actor publishes its tree as it starts (sys.c), and rtd is ready once
        # every stage is up: with sys_interval=0 it is not in the supervision tree at all.
        names = set()

        def walk(n):
            names.add(n.get("name"))
            for ch in n.get("children") or []:
                walk(ch)

        tree = broker.ctl_json("tree")
        for root in tree if isinstance(tree, list) else [tree]:
            walk(root)
        assert "rtd_sup" in names and "sys_sup" not in names and "sys" not in names, names
        c = client(broker.port, "watcher")
        subscribe(c, "$SYS/#")
        subscribe(c, "after/sys")
        # The subscription's retained messages come before anything published after it.
        c.publish("after/sys", b"marker", qos=1).wait_for_publish()
        assert wait_for(lambda: c.got)
        assert [t for t, _, _ in c.got] == ["after/sys"], c.got
        c.disconnect()
    finally:
        code, log = broker.stop()
    assert code == 0, log
