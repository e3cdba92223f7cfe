"""Exclusive subscriptions (docs/AUTH.md, "Exclusive subscriptions"), against rtd with real
clients: one client at a time holds $exclusive/filter, others get 0x97 (3.1.1: 0x80, which
mosquitto_sub reports as a denied subscription) while ordinary subscriptions to the filter go
on; the claim ends with an UNSUBSCRIBE by either name, an ordinary SUBSCRIBE or the session's
end, survives its client's absence and a restart for a persistent session, and is not lost
to a takeover by the same client id."""
import subprocess

from conftest import Rtd, wait_for
from mqtt_raw import UNSUBACK, UNSUBSCRIBE, Raw, mqtt_str, prop_u32, u16, varint

QUOTA_EXCEEDED, FILTER_INVALID = 0x97, 0x8F
NEVER_ENDS = prop_u32(0x11, 3600)


def granted(c, topic_filter, qos=1, pid=1):
    """The SUBACK's one reason code."""
    return c.subscribe(topic_filter, qos=qos, pid=pid).body[-1]


def unsuback(c, topic_filter, pid=2):
    c.send((UNSUBSCRIBE << 4) | 2, u16(pid) + varint(0) + mqtt_str(topic_filter))
    return c.expect(UNSUBACK).body[-1]


def ended(broker, client_id, times=1):
    """Waits for the log line a connection actor writes last, after its claims went."""
    mark = f"event=client.disconnected client={client_id} reason="
    assert wait_for(lambda: broker.read_log().count(mark) >= times, timeout=60), \
        broker.read_log()[-2000:]


def metric(broker, name):
    code, out, err = broker.ctl("metrics", "prometheus")
    assert code == 0, err
    return [ln for ln in out.splitlines() if ln.startswith(name)]


def test_one_holder_at_a_time_and_ordinary_subscribers_unaffected(rtd):
    a, b = Raw(rtd.port, "a"), Raw(rtd.port, "b")
    assert granted(a, "$exclusive/ex/t") == 1
    assert granted(a, "$exclusive/ex/t") == 1  # its own: subscribing again keeps it
    assert granted(b, "$exclusive/ex/t") == QUOTA_EXCEEDED
    assert granted(b, "ex/t") == 1  # not exclusive: beside the holder
    pub = Raw(rtd.port, "pub")
    pub.publish("ex/t", b"both", qos=1)
    assert a.next_publish()["payload"] == b"both"
    assert b.next_publish()["payload"] == b"both"
    assert granted(b, "$exclusive/$share/g/ex/t") == FILTER_INVALID
    assert granted(b, "$exclusive/") == FILTER_INVALID
    [sub] = [s for s in rtd.ctl_json("subscriptions", "list") if s["client_id"] == "a"]
    assert sub["topic"] == "ex/t" and sub["exclusive"] is True
    assert metric(rtd, "rt_exclusive_subscriptions") == ["rt_exclusive_subscriptions 1"]
    assert metric(rtd, "rt_exclusive_refused_total") == ["rt_exclusive_refused_total 1"]
    assert "event=client.exclusive_refused client=b filter=ex/t" in rtd.read_log()
    # Given up by an UNSUBSCRIBE under its $exclusive name: b takes it.
    assert unsuback(a, "$exclusive/ex/t") == 0
    assert granted(b, "$exclusive/ex/t") == 1
    # ... or under its own name, or by an ordinary SUBSCRIBE to the filter.
    assert unsuback(b, "ex/t") == 0
    assert granted(a, "$exclusive/ex/t") == 1
    assert granted(a, "ex/t") == 1
    assert granted(b, "$exclusive/ex/t") == 1
    assert metric(rtd, "rt_exclusive_subscriptions") == ["rt_exclusive_subscriptions 1"]


def test_the_sessions_end_gives_it_up_and_mosquitto_sub_is_refused(rtd):
    holder = Raw(rtd.port, "holder", version=4)
    assert granted(holder, "$exclusive/m/t") == 1
    p = subprocess.run(["mosquitto_sub", "-p", str(rtd.port), "-h", "127.0.0.1", "-V", "311",
                        "-t", "$exclusive/m/t", "-C", "1", "-W", "5"],
                       capture_output=True, text=True, timeout=30)
    assert "All subscription requests were denied." in p.stderr, (p.returncode, p.stderr)
    holder.disconnect()
    ended(rtd, "holder")  # its actor ended: the claim went with it
    taker = Raw(rtd.port, "taker", version=4)
    assert granted(taker, "$exclusive/m/t") == 1


def test_a_takeover_by_the_same_client_keeps_it(rtd):
    first = Raw(rtd.port, "same")
    assert granted(first, "$exclusive/tk/t") == 1
    # A new connection with the id takes the session over and claims again at once, while
    # the old actor may still be ending: its end must not give the new claim up.
    second = Raw(rtd.port, "same")
    assert granted(second, "$exclusive/tk/t") == 1
    other = Raw(rtd.port, "other")
    assert granted(other, "$exclusive/tk/t") == QUOTA_EXCEEDED
    second.disconnect()
    ended(rtd, "same", times=2)
    assert granted(other, "$exclusive/tk/t", pid=2) == 1


def test_a_persistent_session_keeps_it_while_away_and_across_a_restart(tmp_path):
    broker = Rtd("persistence=true", data_dir=str(tmp_path))
    try:
        away = Raw(broker.port, "away", clean=False, props=NEVER_ENDS)
        assert granted(away, "$exclusive/p/t") == 1
        away.disconnect()
        assert granted(Raw(broker.port, "rival"), "$exclusive/p/t") == QUOTA_EXCEEDED
    finally:
        assert broker.stop()[0] == 0
    again = Rtd("persistence=true", data_dir=str(tmp_path))
    try:
        assert granted(Raw(again.port, "rival"), "$exclusive/p/t") == QUOTA_EXCEEDED
        back = Raw(again.port, "away", clean=False, props=NEVER_ENDS)
        assert back.session_present
        [sub] = [s for s in again.ctl_json("subscriptions", "list") if s["client_id"] == "away"]
        assert sub["topic"] == "p/t" and sub["exclusive"] is True
        assert unsuback(back, "p/t") == 0
        assert granted(Raw(again.port, "rival2"), "$exclusive/p/t") == 1
    finally:
        assert again.stop()[0] == 0
