"""`rtctl retained list|show|delete` (issue 28, part 5; EMQX's retainer commands) against a
real rtd with retained messages published by paho: a filter and pages, one topic's message,
and a delete that delivers nothing, survives a restart and is gone for new subscribers."""
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
import pytest

from conftest import Rtd, client, subscribe, wait_for


@pytest.fixture
def retained(tmp_path):
    """rtd holding retained r/a (text, QoS 1), r/b/c (bytes), r/d (expires in 100 s) and
    other/x, all from the client "pub"."""
    b = Rtd(data_dir=str(tmp_path))
    pub = client(b.port, "pub", protocol=mqtt.MQTTv5)
    expiring = Properties(PacketTypes.PUBLISH)
    expiring.MessageExpiryInterval = 100
    for topic, payload, qos, props in (("r/a", b"hello", 1, None), ("r/b/c", b"\x00\xff", 1, None),
                                       ("r/d", b"soon", 1, expiring), ("other/x", b"x", 1, None)):
        pub.publish(topic, payload, qos=qos, retain=True, properties=props).wait_for_publish(5)
    pub.disconnect()
    pub.loop_stop()
    yield b
    code, log = b.stop()
    assert code == 0, log[-3000:]


def topics(rows):
    return [r["topic"] for r in rows]


def test_list_with_filter_and_pages(retained):
    b = retained
    rows = b.ctl_json("retained", "list")
    assert topics(rows) == ["other/x", "r/a", "r/b/c", "r/d"]  # '#' leaves $SYS out
    a = rows[1]
    assert (a["qos"], a["payload_bytes"], a["from_clientid"], a["expires_in_s"]) == \
        (1, 5, "pub", None)
    assert 90 <= rows[3]["expires_in_s"] <= 100
    assert topics(b.ctl_json("retained", "list", "--filter", "r/#")) == ["r/a", "r/b/c", "r/d"]
    assert topics(b.ctl_json("retained", "list", "--filter", "r/+")) == ["r/a", "r/d"]
    # Pages: N at a time in byte order, each after the last topic of the one before.
    page = b.ctl_json("retained", "list", "--filter", "r/#", "--limit", "2")
    assert topics(page) == ["r/a", "r/b/c"]
    page = b.ctl_json("retained", "list", "--filter", "r/#", "--limit", "2", "--after", "r/b/c")
    assert topics(page) == ["r/d"]
    assert b.ctl_json("retained", "list", "--after", "r/d") == []
    sys = b.ctl_json("retained", "list", "--filter", "$SYS/#", "--limit", "3")
    assert len(sys) == 3 and all(t.startswith("$SYS/") for t in topics(sys))
    text = b.ctl("retained", "list", "--filter", "r/#")[1].splitlines()
    assert text[0].split()[:3] == ["topic", "qos", "payload_bytes"] and len(text) == 4
    for bad in (["--filter", "a/#/b"], ["--filter", "$share/g/#"], ["--limit", "1001"]):
        code, _, err = b.ctl("retained", "list", *bad)
        assert code == 1 and err, bad


def test_show(retained):
    b = retained
    j = b.ctl_json("retained", "show", "r/a")
    assert (j["topic"], j["qos"], j["payload"], j["from_clientid"]) == ("r/a", 1, "hello", "pub")
    j = b.ctl_json("retained", "show", "r/b/c")
    assert j["payload_hex"] == "00ff" and "payload" not in j
    # Text goes to a terminal: its bytes escaped.
    out = b.ctl("retained", "show", "r/b/c")[1]
    assert 'payload        "\\x00\\xff"' in out, out
    code, _, err = b.ctl("retained", "show", "r/none")
    assert code == 1 and "no retained message" in err
    code, _, err = b.ctl("retained", "show", "r/+")
    assert code == 1 and "not a topic name" in err


def test_delete_delivers_nothing_and_lasts(retained, tmp_path):
    b = retained
    sub = client(b.port, "watcher")
    subscribe(sub, "r/#", 1)
    assert wait_for(lambda: len(sub.got) == 3)  # the retained ones, on subscribe
    code, out, err = b.ctl("retained", "delete", "r/a")
    assert code == 0 and out.split() == ["deleted", "r/a"], err
    # Nothing reached the subscriber: a marker published after the delete comes first.
    pub = client(b.port, "marker")
    pub.publish("r/marker", b"m", qos=1).wait_for_publish(5)
    assert wait_for(lambda: len(sub.got) == 4)
    assert sub.got[3] == ("r/marker", b"m", 1)
    for c in (sub, pub):
        c.disconnect()
        c.loop_stop()
    assert topics(b.ctl_json("retained", "list", "--filter", "r/#")) == ["r/b/c", "r/d"]
    code, _, err = b.ctl("retained", "delete", "r/a")
    assert code == 1 and "no retained message" in err
    # Gone from the disk too: a restart on the same state.db does not bring it back.
    code, log = b.stop()
    assert code == 0, log
    again = Rtd(data_dir=str(tmp_path))
    try:
        assert topics(again.ctl_json("retained", "list", "--filter", "r/#")) == ["r/b/c", "r/d"]
        fresh = client(again.port, "fresh")
        subscribe(fresh, "r/#", 1)
        assert wait_for(lambda: len(fresh.got) == 2)
        assert sorted(t for t, _, _ in fresh.got) == ["r/b/c", "r/d"]
        fresh.disconnect()
        fresh.loop_stop()
    finally:
        code, log = again.stop()
        assert code == 0, log
    b.proc = again.proc  # the fixture's stop finds it stopped
