"""Connection limits at the listener, end to end against a real rtd: max_connections_per_ip
(from 127.0.0.1 and 127.0.0.2, both on lo), max_connection_rate (a burst beyond the bucket)
and max_connections. A refused connection is closed at accept, before any CONNACK; the
counts the test observes are checked against $SYS/broker/connections/refused/..., and the
broker must keep serving everyone else.

Run: RT_BUILD_DIR=$PWD/build/release /usr/bin/python3 -m pytest -q tests/integration/test_limits.py
"""
import math
import re
import socket
import time

import paho.mqtt.client as mqtt

from conftest import Rtd, subscribe, wait_for
from mqtt_raw import CONNECT, mqtt_str, u16, varint
from sys_tree import SysTree

CONNACK_OK = b"\x20\x02\x00\x00"


def attempt(port, client_id, source="127.0.0.1"):
    """An MQTT 3.1.1 connection from source: the open socket once CONNACK 0 came back, or
    None when the broker closed it first (refused at accept)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    body = mqtt_str("MQTT") + bytes([4, 0x02]) + u16(60) + mqtt_str(client_id)
    data = b""
    try:
        s.sendall(bytes([CONNECT << 4]) + varint(len(body)) + body)
        while len(data) < len(CONNACK_OK):
            chunk = s.recv(len(CONNACK_OK) - len(data))
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        data = b""
    if data == CONNACK_OK:
        return s
    s.close()
    assert data == b"", data  # refused means closed with nothing sent
    return None


def admitted(port, client_id, source="127.0.0.1", timeout=5.0):
    """attempt() until the broker accepts, for a place that a connection closed a moment ago
    may still hold (the broker sees the close when that connection's actor exits): the
    socket (None if never accepted) and how many attempts were refused on the way."""
    refusals = 0
    deadline = time.time() + timeout
    while True:
        s = attempt(port, client_id, source)
        if s or time.time() > deadline:
            return s, refusals
        refusals += 1
        time.sleep(0.05)


def logged_refusals(broker):
    """The listener.refused lines of the broker's log and the refusals they add up to."""
    lines = [line for line in broker.read_log().splitlines() if "listener.refused" in line]
    return lines, sum(int(re.search(r" refused=(\d+) ", line).group(1))
                      for line in lines)


def check_refusal_log(broker, refused, first_refusal):
    """Every refusal is in the log, in at most one line a second."""
    assert wait_for(lambda: logged_refusals(broker)[1] == refused, 3), logged_refusals(broker)
    lines, _ = logged_refusals(broker)
    assert len(lines) <= 1 + math.ceil(time.monotonic() - first_refusal), lines


def healthy(port, source):
    """A paho client from source publishes to itself and gets the message."""
    c = mqtt.Client(client_id=f"healthy-{source}", protocol=mqtt.MQTTv311)
    got = []
    c.on_message = lambda _c, _u, m: got.append(m.payload)
    c.connect("127.0.0.1", port, bind_address=source)
    c.loop_start()
    subscribe(c, "health", 1)
    c.publish("health", b"ok", qos=1).wait_for_publish()
    ok = wait_for(lambda: got == [b"ok"])
    c.disconnect()
    c.loop_stop()
    return ok


def test_per_ip_limit(stopper):
    broker = Rtd("max_connections_per_ip=3", "sys_interval=1")
    stopper(broker)
    # The watcher comes from 127.0.0.2, so 127.0.0.1 has the whole limit.
    tree = SysTree(broker.port, "watcher", source="127.0.0.2")
    first, refused = admitted(broker.port, "a0")
    held = [first, attempt(broker.port, "a1"), attempt(broker.port, "a2")]
    assert all(held)
    first_refusal = time.monotonic()
    assert attempt(broker.port, "a3") is None
    assert attempt(broker.port, "a4") is None
    refused += 2
    other = [attempt(broker.port, f"b{i}", source="127.0.0.2") for i in range(2)]
    assert all(other)  # with the watcher, 127.0.0.2 is at its limit too
    assert attempt(broker.port, "b2", source="127.0.0.2") is None
    refused += 1
    assert healthy(broker.port, "127.0.0.3")

    # A connection that ends frees its place.
    held.pop().close()
    again, n = admitted(broker.port, "a-again")
    assert again is not None
    refused += n
    held.append(again)
    assert attempt(broker.port, "a5") is None
    refused += 1

    assert tree.wait("connections/refused/per_ip", refused), tree.get("connections/refused/per_ip")
    assert tree.num("connections/refused/total") == refused
    assert tree.num("connections/refused/rate") == 0
    assert tree.num("connections/refused/max_connections") == 0
    check_refusal_log(broker, refused, first_refusal)
    assert "last_per_ip=127.0.0.1" in logged_refusals(broker)[0][0]
    for s in held + other:
        s.close()
    tree.close()


def test_per_ip_counts_sockets_not_sessions(stopper):
    """An offline persistent session holds no socket, so it takes no place of its address;
    a session resumed on a new socket takes exactly one."""
    broker = Rtd("max_connections_per_ip=2")
    stopper(broker)
    p = mqtt.Client(client_id="persist", protocol=mqtt.MQTTv311, clean_session=False)
    p.connect("127.0.0.1", broker.port)
    p.loop_start()
    subscribe(p, "p/#", 1)
    p.disconnect()
    p.loop_stop()
    # Retried: the session's old socket may still be open for a moment.
    x, _ = admitted(broker.port, "x")
    y, _ = admitted(broker.port, "y")
    assert x and y
    assert attempt(broker.port, "z") is None
    x.close()
    y.close()
    time.sleep(0.3)  # both closes seen, and past the per-address re-check interval
    connected = []
    p.on_connect = lambda _c, _u, flags, rc: connected.append((flags["session present"], rc))
    p.reconnect()
    p.loop_start()
    assert wait_for(lambda: connected == [(1, 0)]), connected
    w = attempt(broker.port, "w")
    assert w is not None
    assert attempt(broker.port, "z2") is None
    p.disconnect()
    p.loop_stop()
    w.close()


def test_connection_rate_limit(stopper):
    rate = 5
    broker = Rtd(f"max_connection_rate={rate}", "sys_interval=1")
    stopper(broker)
    tree = SysTree(broker.port, "watcher")
    time.sleep(1.2)  # the watcher took a token: let the bucket refill
    start = time.monotonic()
    burst = [attempt(broker.port, f"r{i}") for i in range(12)]
    took = time.monotonic() - start
    accepted = sum(1 for s in burst if s)
    refused = len(burst) - accepted
    # The bucket holds one second's worth; the burst itself refilled rate a second.
    assert rate <= accepted <= rate + int(took * rate) + 1, (accepted, took)
    assert refused > 0
    assert tree.wait("connections/refused/rate", refused), tree.get("connections/refused/rate")
    assert tree.num("connections/refused/total") == refused
    assert tree.num("connections/refused/per_ip") == 0
    check_refusal_log(broker, refused, start)
    time.sleep(1.0)
    later = [attempt(broker.port, f"later{i}") for i in range(3)]
    assert all(later)
    assert healthy(broker.port, "127.0.0.1")
    for s in burst + later:
        if s:
            s.close()
    tree.close()


def test_max_connections(stopper):
    broker = Rtd("max_connections=4", "sys_interval=1")
    stopper(broker)
    tree = SysTree(broker.port, "watcher")
    first, refused = admitted(broker.port, "m0")
    held = [first, attempt(broker.port, "m1"), attempt(broker.port, "m2")]
    assert all(held)  # with the watcher, 4
    first_refusal = time.monotonic()
    assert attempt(broker.port, "over") is None
    assert attempt(broker.port, "over2", source="127.0.0.2") is None
    refused += 2
    assert tree.wait("connections/refused/max_connections", refused), \
        tree.get("connections/refused/max_connections")
    assert tree.num("connections/refused/total") == refused
    assert tree.num("connections/sockets") == 4
    # The watcher, connected all along, still gets its updates.
    up = tree.num("uptime")
    assert wait_for(lambda: tree.num("uptime") > up, 3)
    held.pop().close()
    again, n = admitted(broker.port, "m-again")
    assert again is not None
    refused += n
    assert tree.wait("connections/refused/max_connections", refused)
    check_refusal_log(broker, refused, first_refusal)
    for s in held + [again]:
        s.close()
    tree.close()
