"""Sessions, the inflight window and message expiry, end to end against a real rtd: paho-mqtt
for the ordinary client's view, a raw socket client (mqtt_raw) where a test has to hold back
acknowledgements or drop a connection in the middle of an exchange.
"""
import struct
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from conftest import Rtd, client, subscribe, wait_for
from mqtt_raw import (P_MESSAGE_EXPIRY, P_RECEIVE_MAXIMUM, P_SESSION_EXPIRY, PUBCOMP, PUBLISH,
                      PUBREC, PUBREL, PUBACK, DISCONNECT, Raw, mqtt_str, prop_u16, prop_u32,
                      varint)


@pytest.fixture
def small_queue():
    broker = Rtd("max_queued_messages=3")
    yield broker
    code, log = broker.stop()
    assert code == 0, log


def publish_all(port, topic, payloads, qos=1, props=None):
    pub = Raw(port, "pub-" + topic.replace("/", "-"), version=5)
    for i, p in enumerate(payloads):
        pub.publish(topic, p, qos=qos, pid=i + 1, props=props or b"")
    pub.disconnect()


def test_persistent_session_v311_keeps_subscription_and_queue(rtd):
    connected = []
    sub = mqtt.Client(client_id="ps1", protocol=mqtt.MQTTv311, clean_session=False)
    sub.on_connect = lambda c, u, flags, rc: connected.append(flags["session present"])
    got = []
    sub.on_message = lambda c, u, m: got.append((m.payload, m.qos))
    sub.connect("127.0.0.1", rtd.port)
    sub.loop_start()
    subscribe(sub, "ps/#", 1)
    sub.disconnect()
    sub.loop_stop()
    # Until rtd has handled the DISCONNECT the session is still online, and the QoS 0
    # message below would go out on the closing socket instead of being left out.
    rtd.wait_offline("ps1")
    publish_all(rtd.port, "ps/x", [b"%d" % i for i in range(20)], qos=1)
    pub = Raw(rtd.port, "pub-qos0", version=5)
    pub.publish("ps/x", b"qos0", qos=0)  # not queued: queue_qos0 is off
    # A QoS 0 PUBLISH has no ack: without this the broker could route it after the
    # reconnect below. The PUBACK of a later PUBLISH on the same connection says it was.
    pub.publish("unsubscribed/mark", b"", qos=1, pid=1)
    pub.disconnect()
    sub.reconnect()
    sub.loop_start()
    assert wait_for(lambda: len(got) >= 20)
    time.sleep(0.3)
    assert connected == [0, 1]
    assert got == [(b"%d" % i, 1) for i in range(20)]
    sub.disconnect()
    sub.loop_stop()


def test_session_expiry_ends_the_session(rtd):
    short = Raw(rtd.port, "se-short", clean=False, props=prop_u32(P_SESSION_EXPIRY, 1))
    short.subscribe("se/t", 1)
    short.disconnect()
    kept = Raw(rtd.port, "se-kept", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    kept.subscribe("se/t", 1)
    kept.disconnect()
    # Its expiry timer has fired and ended it (1 s after the disconnect, later under load).
    assert wait_for(lambda: "session.expired client=se-short" in rtd.read_log())
    publish_all(rtd.port, "se/t", [b"after"])
    again = Raw(rtd.port, "se-short", clean=False, props=prop_u32(P_SESSION_EXPIRY, 1))
    assert again.session_present == 0
    assert again.next_publish(0.5) is None
    again.disconnect()
    back = Raw(rtd.port, "se-kept", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    assert back.session_present == 1
    m = back.next_publish()
    assert (m["topic"], m["payload"]) == ("se/t", b"after")
    back.ack(PUBACK, m["pid"])
    back.disconnect(props=prop_u32(P_SESSION_EXPIRY, 0))


def test_session_expiry_set_by_disconnect_and_refused_from_zero(rtd):
    # CONNECT said 0: DISCONNECT may not make the session outlive its connection (3.14.2.2.2).
    c = Raw(rtd.port, "dx", clean=True)
    c.send(DISCONNECT << 4, bytes([0]) + bytes([5]) + prop_u32(P_SESSION_EXPIRY, 30))
    p = c.read()
    assert p is not None and p.type == DISCONNECT and p.body[0] == 0x82
    # CONNECT said 60, DISCONNECT says 0: the session ends now.
    c = Raw(rtd.port, "dz", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    c.subscribe("dz/t", 1)
    c.disconnect(props=prop_u32(P_SESSION_EXPIRY, 0))
    assert wait_for(lambda: "client.disconnected client=dz reason=" in rtd.read_log())
    again = Raw(rtd.port, "dz", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    assert again.session_present == 0
    again.disconnect(props=prop_u32(P_SESSION_EXPIRY, 0))


def test_unacknowledged_qos1_retransmitted_with_dup(rtd):
    sub = Raw(rtd.port, "dup1", version=4, clean=False)
    sub.subscribe("dup/t", 1)
    publish_all(rtd.port, "dup/t", [b"a"])
    first = sub.next_publish()
    assert (first["payload"], first["dup"]) == (b"a", 0)
    sub.close()  # no PUBACK
    back = Raw(rtd.port, "dup1", version=4, clean=False)
    assert back.session_present == 1
    again = back.next_publish()
    assert (again["payload"], again["pid"], again["dup"]) == (b"a", first["pid"], 1)
    back.ack(PUBACK, again["pid"])
    publish_all(rtd.port, "dup/t", [b"b"])
    nxt = back.next_publish()
    assert (nxt["payload"], nxt["dup"]) == (b"b", 0)
    back.ack(PUBACK, nxt["pid"])
    assert back.next_publish(0.3) is None  # acknowledged messages are not sent again
    back.disconnect()
    Raw(rtd.port, "dup1", version=4, clean=True).disconnect()


def test_qos2_outbound_pubrel_retransmitted_and_no_duplicate(rtd):
    sub = Raw(rtd.port, "q2s", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    sub.subscribe("q2/t", 2)
    publish_all(rtd.port, "q2/t", [b"once"], qos=2)
    m = sub.next_publish()
    assert (m["payload"], m["qos"]) == (b"once", 2)
    sub.ack(PUBREC, m["pid"])
    rel = sub.expect(PUBREL)
    assert rel.body[:2] == m["pid"].to_bytes(2, "big")
    sub.close()  # no PUBCOMP
    back = Raw(rtd.port, "q2s", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    assert back.session_present == 1
    rel = back.expect(PUBREL)  # the exchange resumes where it stopped
    assert rel.body[:2] == m["pid"].to_bytes(2, "big")
    back.ack(PUBCOMP, m["pid"])
    assert back.read(0.4) is None  # and the message itself is never sent twice
    back.disconnect(props=prop_u32(P_SESSION_EXPIRY, 0))


def test_receive_maximum_limits_inflight(rtd):
    sub = Raw(rtd.port, "rm", props=prop_u16(P_RECEIVE_MAXIMUM, 2))
    sub.subscribe("rm/t", 1)
    publish_all(rtd.port, "rm/t", [b"%d" % i for i in range(6)])
    first = [sub.next_publish(), sub.next_publish()]
    assert [m["payload"] for m in first] == [b"0", b"1"]
    assert sub.next_publish(0.4) is None  # the window is full
    sub.ack(PUBACK, first[0]["pid"])
    third = sub.next_publish()
    assert third["payload"] == b"2"
    assert sub.next_publish(0.3) is None
    sub.ack(PUBACK, first[1]["pid"])
    sub.ack(PUBACK, third["pid"])
    rest = sub.drain()
    assert [m["payload"] for m in rest] == [b"3", b"4", b"5"]
    sub.disconnect()


def test_inflight_bytes_are_bounded_by_the_memory_budget():
    # max_inflight (1024) allows far more than this; the bytes bound is what stops the
    # window: half of the client's memory budget (40,000 bytes here) in flight, so
    # ~14,000-byte messages leave 3 unacknowledged, and all 5 fit the budget.
    broker = Rtd("max_client_memory=80000")
    try:
        sub = Raw(broker.port, "ib")
        sub.subscribe("ib/t", 1)
        publish_all(broker.port, "ib/t", [b"%d" % i + b"." * 13999 for i in range(5)])
        first = [sub.next_publish() for _ in range(3)]
        assert [m["payload"][:1] for m in first] == [b"0", b"1", b"2"]
        assert sub.next_publish(0.4) is None  # the window is full by bytes
        sub.ack(PUBACK, first[0]["pid"])
        fourth = sub.next_publish()
        assert fourth["payload"][:1] == b"3"
        assert sub.next_publish(0.3) is None
        for m in first[1:] + [fourth]:
            sub.ack(PUBACK, m["pid"])
        rest = sub.drain()
        assert [m["payload"][:1] for m in rest] == [b"4"]
        sub.disconnect()
    finally:
        code, log = broker.stop()
    assert code == 0, log


def test_packet_ids_wrap_around_an_unacknowledged_message(rtd):
    # The first message (id 1) stays unacknowledged while 65,538 more pass through; when
    # the ids wrap, 1 is still taken and must be skipped, and so must nothing else.
    total = 65540
    sub = Raw(rtd.port, "wrap")
    sub.subscribe("wrap/t", 1)
    pub = Raw(rtd.port, "wrap-pub")
    held, ids, seqs = None, [], []
    batch = 500
    for start in range(0, total, batch):
        n = min(batch, total - start)
        blob = b""
        for i in range(start, start + n):
            body = mqtt_str("wrap/t") + struct.pack("!H", i % 65535 + 1) + b"\0" + b"%d" % i
            blob += bytes([(PUBLISH << 4) | 2]) + varint(len(body)) + body
        pub.sock.sendall(blob)
        for _ in range(n):
            m = sub.next_publish()
            assert m is not None, f"stalled after {len(seqs)} messages"
            seqs.append(int(m["payload"]))
            if held is None:
                held = m["pid"]
            else:
                ids.append(m["pid"])
                sub.ack(PUBACK, m["pid"])
        for _ in range(n):
            pub.expect(PUBACK)
    assert seqs == list(range(total))
    assert held not in ids
    assert len(ids) == total - 1 and len(set(ids[:65534])) == 65534  # every other id in use
    sub.ack(PUBACK, held)
    pub.disconnect()
    sub.disconnect()


def test_offline_queue_is_bounded_and_keeps_the_oldest(small_queue):
    sub = Raw(small_queue.port, "bq", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    sub.subscribe("bq/t", 1)
    sub.disconnect()
    small_queue.wait_offline("bq")
    publish_all(small_queue.port, "bq/t", [b"%d" % i for i in range(10)])
    back = Raw(small_queue.port, "bq", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    got = back.drain()
    assert [m["payload"] for m in got] == [b"0", b"1", b"2"]
    back.disconnect(props=prop_u32(P_SESSION_EXPIRY, 0))


def test_message_expiry_for_queued_and_retained(rtd):
    sub = Raw(rtd.port, "mx", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    sub.subscribe("mx/t", 1)
    sub.disconnect()
    rtd.wait_offline("mx")
    pub = Raw(rtd.port, "mx-pub")
    pub.publish("mx/t", b"short", qos=1, pid=1, props=prop_u32(P_MESSAGE_EXPIRY, 1))
    pub.publish("mx/t", b"long", qos=1, pid=2, props=prop_u32(P_MESSAGE_EXPIRY, 30))
    pub.publish("mx/r1", b"gone", qos=1, pid=3, retain=True, props=prop_u32(P_MESSAGE_EXPIRY, 1))
    pub.publish("mx/r2", b"kept", qos=1, pid=4, retain=True, props=prop_u32(P_MESSAGE_EXPIRY, 30))
    pub.disconnect()
    time.sleep(2.1)
    back = Raw(rtd.port, "mx", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    got = back.drain()
    assert [m["payload"] for m in got] == [b"long"]
    assert 1 <= got[0]["props"][P_MESSAGE_EXPIRY] <= 28  # what is left is sent on
    back.disconnect(props=prop_u32(P_SESSION_EXPIRY, 0))
    fresh = Raw(rtd.port, "mx-late")
    fresh.subscribe("mx/+", 1)
    got = fresh.drain()
    assert [(m["topic"], m["payload"], m["retain"]) for m in got] == [("mx/r2", b"kept", 1)]
    assert got[0]["props"][P_MESSAGE_EXPIRY] <= 28
    fresh.disconnect()


def test_shared_subscription_unacked_message_goes_to_other_member(rtd):
    a = Raw(rtd.port, "sh-a")
    b = Raw(rtd.port, "sh-b")
    a.subscribe("$share/g/sh/t", 1)
    b.subscribe("$share/g/sh/t", 1)
    publish_all(rtd.port, "sh/t", [b"m1", b"m2"])
    ma = a.next_publish()
    mb = b.next_publish()
    assert {ma["payload"], mb["payload"]} == {b"m1", b"m2"}  # round robin
    b.ack(PUBACK, mb["pid"])
    a.close()  # leaves without acknowledging
    moved = b.next_publish()
    assert moved is not None and moved["payload"] == ma["payload"]
    b.ack(PUBACK, moved["pid"])
    assert b.next_publish(0.3) is None
    b.disconnect()


def test_shared_member_offline_session_hands_over_and_gets_nothing_new(rtd):
    a = Raw(rtd.port, "sho-a", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    b = Raw(rtd.port, "sho-b")
    a.subscribe("$share/g/sho/t", 1)
    b.subscribe("$share/g/sho/t", 1)
    a.disconnect()  # its session stays, but an offline member takes no group messages
    # Until rtd has read the DISCONNECT, a is a connected member and may be sent a message
    # (kept in its session, rightly): the publishing waits until rtd says a is offline.
    assert wait_for(lambda: rtd.ctl_json("clients", "show", "sho-a")["state"] == "offline", 10)
    publish_all(rtd.port, "sho/t", [b"%d" % i for i in range(4)])
    got = b.drain()
    assert sorted(m["payload"] for m in got) == [b"0", b"1", b"2", b"3"]
    back = Raw(rtd.port, "sho-a", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    assert back.session_present == 1
    assert back.drain(0.3) == []
    publish_all(rtd.port, "sho/t", [b"x", b"y"])  # rejoined: the group is two again
    got_a, got_b = back.drain(), b.drain()
    assert sorted(m["payload"] for m in got_a + got_b) == [b"x", b"y"]
    assert len(got_a) == 1 and len(got_b) == 1
    back.disconnect(props=prop_u32(P_SESSION_EXPIRY, 0))
    b.disconnect()


def test_takeover_of_connected_persistent_session(rtd):
    old = Raw(rtd.port, "tk", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    old.subscribe("tk/t", 1)
    new = Raw(rtd.port, "tk", clean=False, props=prop_u32(P_SESSION_EXPIRY, 60))
    assert new.session_present == 1
    p = old.read()
    assert p is not None and p.type == DISCONNECT and p.body[0] == 0x8E
    publish_all(rtd.port, "tk/t", [b"still"])
    m = new.next_publish()
    assert m["payload"] == b"still"
    new.ack(PUBACK, m["pid"])
    new.disconnect(props=prop_u32(P_SESSION_EXPIRY, 0))


def test_order_kept_across_reconnects_under_load(rtd):
    total = 600
    seen = []
    lock = threading.Lock()
    sub = mqtt.Client(client_id="ord", protocol=mqtt.MQTTv311, clean_session=False)

    def on_message(_c, _u, m):
        with lock:
            seen.append(int(m.payload))

    sub.on_message = on_message
    sub.connect("127.0.0.1", rtd.port)
    sub.loop_start()
    subscribe(sub, "ord/t", 1)
    pub = client(rtd.port, "ord-pub")

    def produce():
        for i in range(total):
            pub.publish("ord/t", b"%d" % i, qos=1)
            time.sleep(0.001)

    t = threading.Thread(target=produce)
    t.start()
    for _ in range(3):
        time.sleep(0.15)
        sub.disconnect()
        sub.loop_stop()
        time.sleep(0.1)
        sub.reconnect()
        sub.loop_start()
    t.join(30)
    assert wait_for(lambda: len(set(seen)) >= total, timeout=15)
    with lock:
        first = []
        known = set()
        for v in seen:
            if v not in known:
                known.add(v)
                first.append(v)
    assert first == list(range(total))  # none lost, first deliveries in publish order
    sub.disconnect()
    sub.loop_stop()
    pub.disconnect()


def test_v5_ack_reason_codes_and_response_information(rtd):
    c = Raw(rtd.port, "rr", props=bytes([0x19, 1]))  # Request Response Information
    assert c.connack_props[0x1A] == b"rt/response/rr"
    plain = Raw(rtd.port, "rr-plain")
    assert 0x1A not in plain.connack_props  # only when asked for
    plain.disconnect()
    # PUBACK / PUBREC say 0x10 when nobody subscribes, 0 when someone got it (3.4.2.1).
    c.send((PUBLISH << 4) | 2, b"\x00\x04none\x00\x01\x00x")
    ack = c.expect(PUBACK)
    assert ack.body[:3] == b"\x00\x01\x10"
    c.subscribe("some", 0)
    c.send((PUBLISH << 4) | 4, b"\x00\x04some\x00\x02\x00x")
    rec = c.expect(PUBREC)
    assert rec.body[:2] == b"\x00\x02" and rec.body[2:3] in (b"", b"\x00")
    c.disconnect()


def test_enhanced_auth_method_refused(rtd):
    method = b"SCRAM-SHA-1"
    c = Raw(rtd.port, "am", props=bytes([0x15]) + len(method).to_bytes(2, "big") + method)
    assert c.connack_code == 0x8C  # bad authentication method: none is configured
    with pytest.raises(ConnectionError):
        c.read(2)  # and the connection is closed
