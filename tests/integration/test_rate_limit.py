"""Per-client rate limits (a listener's rate_limit, user_rate_limits per user name) against a
real rtd: a publisher over its rate is slowed (rtd stops reading its socket until its bucket
refills), never disconnected, and loses nothing; the slowing is counted per client (`rtctl
clients show` rate_limited), in $SYS/broker/clients/rate_limited and logged.

The bounds come from the token bucket: it holds `burst` (messages or bytes) at the start and
refills at `rate` a second; a message takes one token (or its bytes), and rtd does not read
while the bucket is empty. So N messages sent at once cannot all be through before
(N - burst) / rate seconds after the first was sent. The tolerance below that is one message
(rtd may let the message that empties the bucket through, and check before the next) plus
the refill clock's millisecond resolution.

How long it takes past that depends on how busy the machine is, so the upper side is
checked on what rtd decided, not on the clock: a pause lasts until the bucket is back at 0,
and the packet that overdrew it is at most one unit (a message, or one packet's bytes), so
the first pause (logged with its wait_ms) is at most one unit's refill time plus the
millisecond rtd adds; and each pause lets at least one more packet through, so there are at
most as many pauses as packets past the burst. A limiter that waits too long, or refills too
slowly, breaks one or the other.
"""
import re
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from conftest import Rtd, free_port, password_file, subscribe, wait_for
from mqtt_raw import Raw
from sys_tree import SysTree
from transports import find_key, listeners, tls_context


def start(rate_limit, *overrides):
    """rtd with a plain listener (port: subscribers, $SYS) and one with rate_limit (rport)."""
    port, rport = free_port(), free_port()
    b = Rtd(listeners(port, {"bind": f"127.0.0.1:{rport}", "rate_limit": rate_limit}),
            "sys_interval=1", *overrides, port=port)
    b.rport = rport
    return b


def users(tmp_path, *names):
    """The password_file= override for users whose password is their name: user_rate_limits
    are for users a password file vouches for (a bare user name is anonymous)."""
    path = password_file(tmp_path / "rtd.pw", {n: n for n in names})
    return f'password_file="{path}"'


def stop_ok(b):
    code, log = b.stop()
    assert code == 0, log[-3000:]
    return log


class Counter:
    """A paho subscriber on the plain listener that records each message's arrival time."""

    def __init__(self, port, topic, client_id):
        self.c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv311)
        self.got, self.at = [], []
        self.lock = threading.Lock()

        def on_message(_c, _u, m):
            with self.lock:
                self.got.append(m.payload)
                self.at.append(time.monotonic())
        self.c.on_message = on_message
        self.c.connect("127.0.0.1", port, keepalive=60)
        self.c.loop_start()
        subscribe(self.c, topic, 0)

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def publisher(port, client_id, username=None, keepalive=60):
    c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv311)
    if username:
        c.username_pw_set(username, username)  # each user's password is its name (users())
    c.disconnects = []
    c.on_disconnect = lambda _c, _u, rc: c.disconnects.append(rc)
    connected = threading.Event()
    c.on_connect = lambda *a: connected.set()
    c.connect("127.0.0.1", port, keepalive=keepalive)
    c.loop_start()
    assert connected.wait(5)
    return c


def blast(broker, client_id, n, payload_size=8, username=None, timeout=180, keepalive=60):
    """Publishes n QoS 0 messages as fast as paho takes them through the rate-limited
    listener; returns (seconds from the first publish to the last arrival, the publisher
    still connected, the subscriber's payloads in arrival order, rate_limited from rtctl).
    timeout only says when to give up on a broken run: 500 messages at 50 a second took
    over 60 s with rtd at nice 10 beside two busy loops."""
    topic = f"rl/{client_id}"
    sub = Counter(broker.port, topic, f"{client_id}-sub")
    pub = publisher(broker.rport, client_id, username, keepalive)
    try:
        pad = b"." * max(0, payload_size - 6)
        t0 = time.monotonic()
        for i in range(n):
            pub.publish(topic, b"%06d" % i + pad, qos=0)
        assert wait_for(lambda: len(sub.got) >= n, timeout), \
            (f"{len(sub.got)} of {n} arrived", "publisher disconnected (paho rc)", pub.disconnects,
             [ln for ln in broker.read_log().splitlines() if f"client={client_id} " in ln][-5:])
        elapsed = sub.at[n - 1] - t0
        show = broker.ctl_json("clients", "show", client_id)
        limited = find_key(show, "rate_limited")  # None when rtctl does not show it
        # Nothing more (no duplicate) comes: it would arrive before a last message sent now.
        pub.publish(topic, b"end", qos=0)
        assert wait_for(lambda: len(sub.got) > n, timeout), len(sub.got)
        assert sub.got[n:] == [b"end"], sub.got[n:]
        return elapsed, list(pub.disconnects), sub.got[:n], limited
    finally:
        pub.disconnect()
        pub.loop_stop()
        sub.close()


def shown(limited):
    assert limited is not None, "`rtctl clients show` has no rate_limited"
    return limited


def first_wait_ms(broker, client_id):
    """wait_ms of the client's first pause, from its client.rate_limited log line."""
    for ln in broker.read_log().splitlines():
        m = re.search(rf"client\.rate_limited client={client_id} times=1 wait_ms=(\d+)", ln)
        if m:
            return int(m.group(1))
    raise AssertionError(f"no client.rate_limited line for {client_id}")


def publish_bytes(topic, payload_size):
    """Bytes of an MQTT 3.1.1 QoS 0 PUBLISH: what one message takes from a byte bucket."""
    remaining = 2 + len(topic) + payload_size
    return 1 + (1 if remaining < 128 else 2) + remaining


def check_all_delivered(got, n, payload_size=8):
    assert len(got) == n, len(got)
    pad = b"." * max(0, payload_size - 6)
    assert got == [b"%06d" % i + pad for i in range(n)]   # none lost, none reordered


def test_message_rate_slows_without_loss():
    """rate_limit = {messages = 50, burst_messages = 50}: 500 QoS 0 messages sent at once all
    arrive, in order, the publisher is never disconnected, and it takes at least
    (500 - 50) / 50 = 9 s (less one message, 20 ms, and the clock's resolution). Counted in
    rtctl, in $SYS and in the log."""
    broker = start({"messages": 50, "burst_messages": 50})
    try:
        tree = SysTree(broker.port)
        elapsed, disconnects, got, limited = blast(broker, "rl-pub", 500)
        check_all_delivered(got, 500)
        assert disconnects == []
        assert (500 - 50) / 50 - 1 / 50 - 0.01 <= elapsed, elapsed
        # Slowed at least once, and at most once for each message past the burst.
        assert 1 <= shown(limited) <= 450, limited
        assert first_wait_ms(broker, "rl-pub") <= 1000 / 50 + 1
        assert wait_for(lambda: (tree.num("clients/rate_limited") or 0) >= limited, 5), \
            tree.get("clients/rate_limited")
        assert "client.rate_limited client=rl-pub" in broker.read_log()
        tree.close()
    finally:
        stop_ok(broker)


def test_under_the_rate_is_not_slowed():
    """A client that stays within its burst is never slowed: 40 messages with a burst of 50."""
    broker = start({"messages": 50, "burst_messages": 50})
    try:
        elapsed, disconnects, got, limited = blast(broker, "calm", 40)
        check_all_delivered(got, 40)
        assert shown(limited) == 0 and disconnects == []
        assert "client.rate_limited client=calm" not in broker.read_log()
    finally:
        stop_ok(broker)


def test_user_rate_limits_override_the_listener(tmp_path):
    """user_rate_limits: alice gets 10 messages a second (bucket 1 s worth: 10) on a listener
    that allows 1,000; carol gets 100,000 on the same listener, and bob, with no entry, the
    listener's. 60 messages from alice take at least (60 - 10) / 10 = 5 s; 500 from bob and
    from carol are never slowed (rate_limited stays 0)."""
    broker = start({"messages": 1000, "burst_messages": 1000},
                   "user_rate_limits={alice={messages=10}, carol={messages=100000}}",
                   users(tmp_path, "alice", "bob", "carol"))
    try:
        elapsed, disconnects, got, limited = blast(broker, "alice-pub", 60, username="alice")
        check_all_delivered(got, 60)
        assert disconnects == []
        assert (60 - 10) / 10 - 1 / 10 - 0.01 <= elapsed, elapsed
        assert 1 <= shown(limited) <= 50, limited
        assert first_wait_ms(broker, "alice-pub") <= 1000 / 10 + 1
        for user in ("bob", "carol"):
            elapsed, disconnects, got, limited = blast(broker, f"{user}-pub", 500, username=user)
            check_all_delivered(got, 500)
            assert shown(limited) == 0 and disconnects == [], (user, limited, disconnects)
    finally:
        stop_ok(broker)


def test_user_rate_limit_raises_a_low_listener_limit(tmp_path):
    """The override works both ways: carol may send 100,000 a second on a listener that
    allows 10: 300 messages, never slowed; dave, without an entry, is slowed."""
    broker = start({"messages": 10, "burst_messages": 10},
                   "user_rate_limits={carol={messages=100000, burst_messages=100000}}",
                   users(tmp_path, "carol", "dave"))
    try:
        _, disconnects, got, limited = blast(broker, "carol-pub", 300, username="carol")
        check_all_delivered(got, 300)
        assert shown(limited) == 0 and disconnects == []
        elapsed, disconnects, got, limited = blast(broker, "dave-pub", 30, username="dave")
        check_all_delivered(got, 30)
        assert elapsed >= (30 - 10) / 10 - 1 / 10 - 0.01, elapsed
        assert shown(limited) >= 1
    finally:
        stop_ok(broker)


def test_byte_rate_slows_without_loss():
    """rate_limit = {bytes = 10000, burst_bytes = 10000}: 40 messages of 1,000 payload bytes
    (about 1,014 on the wire each) sent at once all arrive in order; counting payload bytes
    only (a lower bound on whatever rtd counts), they take at least
    (40 * 1000 - 10000) / 10000 = 3 s less one message (0.1 s)."""
    broker = start({"bytes": 10000, "burst_bytes": 10000})
    try:
        elapsed, disconnects, got, limited = blast(broker, "bytes-pub", 40, payload_size=1000)
        check_all_delivered(got, 40, payload_size=1000)
        assert disconnects == []
        assert (40 * 1000 - 10000) / 10000 - 0.1 - 0.01 <= elapsed, elapsed
        unit = publish_bytes("rl/bytes-pub", 1000)
        assert 1 <= shown(limited) <= 40 - 10000 // unit, limited
        assert first_wait_ms(broker, "bytes-pub") <= 1000 * unit / 10000 + 1
    finally:
        stop_ok(broker)


def test_user_byte_limit(tmp_path):
    """user_rate_limits with bytes: erin gets 5,000 bytes a second (bucket 5,000) on a listener
    without a limit: 20 messages of 1,000 bytes take at least (20,000 - 5,000) / 5,000 = 3 s
    less one message; frank, on the same listener, is not slowed."""
    broker = start({"messages": 100000}, "user_rate_limits={erin={bytes=5000}}",
                   users(tmp_path, "erin", "frank"))
    try:
        elapsed, disconnects, got, limited = blast(broker, "erin-pub", 20, payload_size=1000,
                                                   username="erin")
        check_all_delivered(got, 20, payload_size=1000)
        assert disconnects == []
        assert (20 * 1000 - 5000) / 5000 - 0.2 - 0.01 <= elapsed, elapsed
        assert shown(limited) >= 1
        _, disconnects, got, limited = blast(broker, "frank-pub", 20, payload_size=1000,
                                             username="frank")
        check_all_delivered(got, 20, payload_size=1000)
        assert shown(limited) == 0 and disconnects == []
    finally:
        stop_ok(broker)


def test_slowed_client_is_not_cut_by_its_keepalive():
    """A client held back longer than its keepalive allows (1.5 x 2 s) is never disconnected
    by rtd: 8 messages at 1 a second (bucket 1) take at least 7 s less one message, and the
    pause is rtd's doing, not the client's silence. A raw client, because a client's own
    keepalive is its business: one that waits for a PINGRESP queued behind its own slowed
    PUBLISHes (paho gives up after its keepalive) may leave, and rtd cannot answer a
    PINGREQ it has not read."""
    broker = start({"messages": 1, "burst_messages": 1})
    try:
        sub = Counter(broker.port, "rl/slow-ka", "slow-ka-sub")
        pub = Raw(broker.rport, "slow-ka", version=4, keepalive=2)
        t0 = time.monotonic()
        for i in range(8):
            pub.publish("rl/slow-ka", b"%06d.." % i)
        assert wait_for(lambda: len(sub.got) >= 8, 21), (len(sub.got), broker.read_log()[-2000:])
        elapsed = sub.at[7] - t0
        check_all_delivered(sub.got, 8)
        assert elapsed >= (8 - 1) / 1 - 1 - 0.01, elapsed
        assert "client.keepalive_timeout client=slow-ka" not in broker.read_log()
        assert shown(find_key(broker.ctl_json("clients", "show", "slow-ka"), "rate_limited")) >= 1
        pub.close()
        sub.close()
    finally:
        stop_ok(broker)


@pytest.mark.parametrize("kind", ["tls", "ws", "wss"])
def test_rate_limit_on_tls_and_websocket(pki, kind):
    """The same bucket on a TLS, WebSocket and WSS listener, where records or frames may
    hold many packets already decrypted or unmasked: 200 messages at 50 a second (bucket 50)
    all arrive, in order, no disconnect, after at least (200 - 50) / 50 = 3 s less one
    message."""
    port, rport = free_port(), free_port()
    listener = {"bind": f"127.0.0.1:{rport}", "rate_limit": {"messages": 50,
                                                             "burst_messages": 50}}
    if kind in ("tls", "wss"):
        listener["tls"] = {"cert": pki.server["ec"][0], "key": pki.server["ec"][1]}
    if kind in ("ws", "wss"):
        listener["websocket"] = "/mqtt"
    broker = Rtd(listeners(port, listener), port=port)
    broker.rport = rport
    topic = f"rl/{kind}"
    sub = Counter(port, topic, f"{kind}-sub")
    pub = mqtt.Client(client_id=f"{kind}-pub", protocol=mqtt.MQTTv311,
                      transport="websockets" if kind in ("ws", "wss") else "tcp")
    if kind in ("ws", "wss"):
        pub.ws_set_options(path="/mqtt")
    if kind in ("tls", "wss"):
        pub.tls_set_context(tls_context(pki.ca.cert, alpn=None))
    disconnects = []
    pub.on_disconnect = lambda _c, _u, rc: disconnects.append(rc)
    connected = threading.Event()
    pub.on_connect = lambda *a: connected.set()
    try:
        pub.connect("127.0.0.1", rport, keepalive=60)
        pub.loop_start()
        assert connected.wait(5)
        t0 = time.monotonic()
        for i in range(200):
            pub.publish(topic, b"%06d.." % i, qos=0)
        assert wait_for(lambda: len(sub.got) >= 200, 30), (len(sub.got), disconnects)
        elapsed = sub.at[199] - t0
        check_all_delivered(list(sub.got), 200)
        assert disconnects == []
        assert (200 - 50) / 50 - 1 / 50 - 0.01 <= elapsed, elapsed
        limited = find_key(broker.ctl_json("clients", "show", f"{kind}-pub"), "rate_limited")
        assert 1 <= shown(limited) <= 200 - 50, limited
        assert first_wait_ms(broker, f"{kind}-pub") <= 1000 / 50 + 1
    finally:
        pub.disconnect()
        pub.loop_stop()
        sub.close()
        stop_ok(broker)
