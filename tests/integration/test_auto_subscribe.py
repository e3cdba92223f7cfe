"""auto_subscribe (docs/AUTH.md, "Subscriptions made at CONNECT"), against rtd with raw MQTT
clients: each client gets the configured filters with %c and %u filled in, without sending a
SUBSCRIBE (and without a SUBACK), with their retained messages as retain_handling says, under
the ACL (a refused filter is logged); a client id or user name with a wildcard does not widen
a filter, and a user name nothing vouched for fills no %u. What must not arrive is shown by a
marker published after it on a topic the client does get: one publisher's messages keep their
order, so the marker coming first means the other never comes."""
import subprocess

import pytest

from conftest import RTD, ROOT, rtd_with_users
from mqtt_raw import PUBACK, Raw

AUTO = ('auto_subscribe={{topic="devices/%c/cmd",qos=1,retain_handling=1},'
        '{topic="users/%u/#"},{topic="broadcast",retain_handling=2},{topic="secret/%c"}}')


@pytest.fixture
def auto(tmp_path):
    # Mosquitto's ACL: topic lines before the first user are the anonymous clients'.
    broker = rtd_with_users(
        tmp_path, {"alice": "a-pw", "pub": "p-pw"},
        "pattern read devices/%c/cmd\npattern read users/%u/#\ntopic read broadcast\n"
        "user alice\ntopic read broadcast\nuser pub\ntopic write #\n", AUTO)
    yield broker
    code, log = broker.stop()
    assert code == 0, log[-3000:]


def publisher(broker):
    return Raw(broker.port, "pub", username="pub", password="p-pw")


def topics_until_marker(client, marker):
    got = []
    while True:
        m = client.next_publish()
        assert m is not None, f"no marker {marker!r} after {got}"
        if m["payload"] == marker:
            return got
        got.append((m["topic"], m["payload"], m["qos"], m["retain"]))


def test_filters_filled_in_and_subscribed_at_connect(auto):
    pub = publisher(auto)
    pub.publish("devices/dev1/cmd", b"kept", qos=1, retain=True)  # held once PUBACKed
    dev = Raw(auto.port, "dev1", username="alice", password="a-pw")
    assert dev.connack_code == 0
    first = dev.next_publish()  # nothing was sent but the CONNECT: no SUBACK comes first
    assert (first["topic"], first["payload"], first["qos"], first["retain"]) == \
        ("devices/dev1/cmd", b"kept", 1, 1)
    dev.ack(PUBACK, first["pid"])
    pub.publish("devices/other/cmd", b"not for dev1")
    pub.publish("users/alice/inbox", b"for alice")
    pub.publish("devices/dev1/cmd", b"live", qos=1)
    pub.publish("broadcast", b"marker-1")
    got = topics_until_marker(dev, b"marker-1")
    assert [(t, p) for t, p, _, _ in got] == [("users/alice/inbox", b"for alice"),
                                              ("devices/dev1/cmd", b"live")], got
    subs = auto.ctl_json("subscriptions", "show", "dev1")
    assert sorted((s["topic"], s["qos"]) for s in subs) == \
        [("broadcast", 0), ("devices/dev1/cmd", 1), ("users/alice/#", 0)]
    # secret/%c: the ACL grants no read there, so it is refused and said so.
    assert "event=client.auto_subscribe_refused client=dev1 filter=secret/dev1" in auto.read_log()


def test_a_wildcard_in_the_client_id_widens_nothing(auto):
    pub = publisher(auto)
    sly = Raw(auto.port, "x/+")  # devices/x/+/cmd would match other clients' topics
    assert sly.connack_code == 0
    pub.publish("devices/x/victim/cmd", b"leak")
    pub.publish("broadcast", b"marker-2")
    assert topics_until_marker(sly, b"marker-2") == []
    assert [s["topic"] for s in auto.ctl_json("subscriptions", "show", "x/+")] == ["broadcast"]


def test_an_unvouched_user_name_fills_no_placeholder(auto):
    pub = publisher(auto)
    anon = Raw(auto.port, "anon1", username="alice", password="wrong")
    assert anon.connack_code == 0x86  # a password file: a wrong password is refused
    nobody = Raw(auto.port, "anon2")  # no user name: users/%u/# is not made
    assert nobody.connack_code == 0
    pub.publish("users//x", b"nobody's")
    pub.publish("broadcast", b"marker-3")
    assert topics_until_marker(nobody, b"marker-3") == []


def test_a_resumed_session_is_not_sent_its_retained_again(auto):
    pub = publisher(auto)
    pub.publish("devices/dev2/cmd", b"once", qos=1, retain=True)
    expiry = bytes([0x11, 0, 0, 1, 0x2C])  # Session Expiry Interval 300 s
    first = Raw(auto.port, "dev2", clean=False, props=expiry)
    m = first.next_publish()
    assert m["payload"] == b"once"
    first.ack(PUBACK, m["pid"])
    first.disconnect()
    again = Raw(auto.port, "dev2", clean=False, props=expiry)
    assert again.session_present == 1
    pub.publish("broadcast", b"marker-4")
    # retain_handling 1: the subscription exists, so its retained message is not sent again.
    assert topics_until_marker(again, b"marker-4") == []


@pytest.mark.parametrize("setting, says", [
    ('auto_subscribe={{topic="a/%x"}}', "%c, %u and %% are its placeholders"),
    ('auto_subscribe={topic="a"}', "auto_subscribe must be a list"),
    ('auto_subscribe={{qos=1}}', "topic is required"),
    ('auto_subscribe={{topic="a",qos=3}}', "qos must be a whole number from 0 to 2"),
])
def test_bad_settings_are_refused_at_start(tmp_path, setting, says):
    r = subprocess.run([RTD, "-c", f"{ROOT}/etc/rtd.conf", "-o", setting, "--check"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and says in r.stderr + r.stdout, r.stderr + r.stdout
