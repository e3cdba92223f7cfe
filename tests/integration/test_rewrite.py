"""Topic rewrite (docs/AUTH.md, "Topic rewrite"), against rtd with raw MQTT clients: a PUBLISH's
topic and a SUBSCRIBE's or UNSUBSCRIBE's filter become the first applying rule's dest, with
$1..$9 from its expression, before the ACL and routing (retained messages, subscriptions
shown, the ACL all see the new one); the rule's action picks what it rewrites; a rule whose
result is no topic refuses the PUBLISH (0x90) or filter (0x8F); a bad rule stops the start.
What must not arrive is shown by a marker published after it on a topic the client does get:
one publisher's messages keep their order."""
import subprocess

import pytest

from conftest import RTD, ROOT, Rtd, rtd_with_users
from mqtt_raw import PUBACK, SUBACK, UNSUBACK, Raw, mqtt_str, u16, varint

RULES = ('rewrite={'
         '{action="publish",source="old/#",re="^old/(.+)$",dest="new/$1"},'
         '{action="subscribe",source="legacy/+/data",re="^legacy/([^/]+)/data$",'
         'dest="devices/$1/telemetry"},'
         '{action="all",source="both/#",re="^both/(.*)$",dest="moved/$1"},'
         '{action="all",source="bad/#",re="^bad/(.*)$",dest="x/$1/#"},'
         '{action="subscribe",source="worse/#",re="^worse/(.*)$",dest="x/#/$1"}}')


@pytest.fixture
def rw(tmp_path):
    # Only the rewritten topics are granted: the ACL sees what the rules made.
    broker = rtd_with_users(tmp_path, {"dev": "d-pw"},
                            "user dev\ntopic readwrite new/#\ntopic readwrite devices/#\n"
                            "topic readwrite moved/#\ntopic readwrite marker\n", RULES)
    yield broker
    code, log = broker.stop()
    assert code == 0, log[-3000:]


def client(broker, cid):
    c = Raw(broker.port, cid, username="dev", password="d-pw")
    assert c.connack_code == 0
    return c


def until_marker(c, marker):
    got = []
    while True:
        m = c.next_publish()
        assert m is not None, f"no marker after {got}"
        if m["payload"] == marker:
            return got
        got.append((m["topic"], m["payload"]))


def test_published_topics_and_filters_rewritten(rw):
    sub = client(rw, "sub")
    sub.subscribe("new/#")
    sub.subscribe("legacy/d1/data")  # as devices/d1/telemetry
    sub.subscribe("marker")
    pub = client(rw, "pub")
    pub.publish("old/a/b", b"one", qos=1)
    pub.publish("devices/d1/telemetry", b"two")
    pub.publish("legacy/d1/data", b"not rewritten: publish rules only for old/#")
    pub.publish("marker", b"m1")
    assert until_marker(sub, b"m1") == [("new/a/b", b"one"), ("devices/d1/telemetry", b"two")]
    shown = sorted(s["topic"] for s in rw.ctl_json("subscriptions", "show", "sub"))
    assert shown == ["devices/d1/telemetry", "marker", "new/#"]
    # UNSUBSCRIBE is rewritten as SUBSCRIBE was, so the client's own filter takes it back.
    sub.send(0xA2, u16(7) + varint(0) + mqtt_str("legacy/d1/data"))
    unsuback = sub.expect(UNSUBACK)
    assert unsuback.body[-1] == 0x00, unsuback
    pub.publish("devices/d1/telemetry", b"after the unsubscribe")
    pub.publish("marker", b"m2")
    assert until_marker(sub, b"m2") == []


def test_retained_messages_are_kept_under_the_new_topic(rw):
    pub = client(rw, "pub2")
    pub.publish("both/kept", b"r", qos=1, retain=True)
    later = client(rw, "later")
    later.subscribe("moved/kept")  # the rewritten topic holds it
    m = later.next_publish()
    assert (m["topic"], m["payload"], m["retain"]) == ("moved/kept", b"r", 1)
    again = client(rw, "again")
    again.subscribe("both/kept")  # all: the filter is rewritten too
    m = again.next_publish()
    assert (m["topic"], m["payload"]) == ("moved/kept", b"r")


def test_a_rule_that_makes_no_topic_refuses(rw):
    pub = client(rw, "pub3")
    pub.send(0x32, mqtt_str("bad/z") + u16(3) + varint(0) + b"x")  # QoS 1, v5
    ack = pub.expect(PUBACK)
    assert ack.body[2] == 0x90, ack  # Topic Name invalid: x/z/# is no topic name
    sub = client(rw, "sub3")
    sub.send(0x82, u16(4) + varint(0) + mqtt_str("worse/y") + bytes([0]))
    assert sub.expect(SUBACK).body[-1] == 0x8F  # Topic Filter invalid: x/#/y
    # bad/y makes x/y/#, a filter, which the ACL (seeing the new one) does not grant.
    sub.send(0x82, u16(5) + varint(0) + mqtt_str("bad/y") + bytes([0]))
    assert sub.expect(SUBACK).body[-1] == 0x87
    log = rw.read_log()
    assert "event=client.rewrite_invalid client=pub3 topic=bad/z" in log
    assert "event=client.rewrite_invalid client=sub3 filter=worse/y" in log


@pytest.mark.parametrize("setting, says", [
    ('rewrite={{source="a/#",re="(",dest="b"}}', "rewrite[1].re"),
    ('rewrite={{source="a/#",re="x"}}', "source, re and dest are required"),
    ('rewrite={{action="read",source="a",re="a",dest="b"}}', "rewrite[1].action"),
])
def test_bad_rules_are_refused_at_start(setting, says):
    r = subprocess.run([RTD, "-c", f"{ROOT}/etc/rtd.conf", "-o", setting, "--check"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and says in r.stderr + r.stdout, r.stderr + r.stdout


def test_a_source_that_is_no_filter_stops_the_start():
    with pytest.raises(RuntimeError, match="source"):
        Rtd('rewrite={{source="a/#/b",re="a",dest="b"}}')
