"""Delayed publish (docs/AUTH.md, "Delayed publish"), against rtd with real clients: a
PUBLISH to $delayed/SECONDS/topic reaches topic's subscribers SECONDS later, never before and
never on the $delayed topic itself; malformed delays and a full list are refused with MQTT 5
reason codes and counted; the ACL judges the real topic; `rtctl delayed list|del` shows and
deletes held messages; with persistence a held message survives a restart and its row goes
once it was delivered. Clients: raw MQTT 5, paho (3.1.1), mosquitto_pub and MQTT.js."""
import json
import os
import shutil
import subprocess
import time

import pytest

from conftest import ROOT, Rtd, client, rtd_with_users, subscribe, wait_for
from test_http import call, start_http
from mqtt_raw import PUBACK, PUBLISH, Raw, mqtt_str, prop_u32, u16, varint

TOPIC_NAME_INVALID, NOT_AUTHORIZED, QUOTA_EXCEEDED = 0x90, 0x87, 0x97
NODE_DIR = os.path.join(ROOT, "tests", "node")


def puback_reason(c, topic, payload=b"x", pid=1, qos=1):
    """Publishes at QoS 1 and returns the PUBACK's reason code (0 when it has none)."""
    c.send((PUBLISH << 4) | (qos << 1), mqtt_str(topic) + u16(pid) + varint(0) + payload)
    ack = c.expect(PUBACK)
    return ack.body[2] if len(ack.body) > 2 else 0


def metric(broker, name):
    code, out, err = broker.ctl("metrics", "prometheus")
    assert code == 0, err
    return [ln for ln in out.splitlines() if ln.startswith(name)]


def test_arrives_after_its_delay_and_only_on_its_topic(rtd):
    sub = Raw(rtd.port, "sub")
    sub.subscribe("d/t", qos=1)
    spy = Raw(rtd.port, "spy")
    spy.subscribe("$delayed/#")
    pub = Raw(rtd.port, "pub")
    sent = time.time()
    assert puback_reason(pub, "$delayed/2/d/t", b"later") == 0
    m = sub.next_publish(timeout=2 + 30)
    got = time.time()
    assert m is not None and m["topic"] == "d/t" and m["payload"] == b"later" and m["qos"] == 1
    # The broker's due time is its receipt plus 2 s, so nothing can come sooner than that
    # after the PUBLISH left here (1 ms for clock granularity).
    assert got - sent >= 2 - 0.001, got - sent
    # Had $delayed/2/d/t been routed as it is, the spy would have had it 2 s ago.
    assert spy.drain(timeout=0.2) == []
    assert metric(rtd, "rt_delayed_published_total") == ["rt_delayed_published_total 1"]
    assert metric(rtd, "rt_delayed ") == ["rt_delayed 0"]


def test_malformed_delays_are_refused_and_counted(rtd):
    pub = Raw(rtd.port, "pub")
    for topic in ["$delayed/abc/t", "$delayed/10", "$delayed/10/", "$delayed/4294968/t",
                  "$delayed//t", "$delayed/-1/t"]:
        assert puback_reason(pub, topic) == TOPIC_NAME_INVALID, topic
    assert puback_reason(pub, "$delayed/4294967/far/away") == 0  # EMQX's longest delay
    assert metric(rtd, "rt_delayed_refused_total") == [
        'rt_delayed_refused_total{reason="limit"} 0',
        'rt_delayed_refused_total{reason="invalid"} 6']
    assert "event=client.delayed_invalid client=pub topic=$delayed/abc/t" in rtd.read_log()
    [held] = rtd.ctl_json("delayed", "list")
    assert held["topic"] == "far/away" and held["due_in_s"] > 4294967 - 60


def test_a_full_list_refuses_and_a_deleted_message_never_comes(stopper):
    broker = Rtd("max_delayed=2")
    stopper(broker)
    sub = Raw(broker.port, "sub")
    sub.subscribe("lim/#")
    pub = Raw(broker.port, "pub")
    assert puback_reason(pub, "$delayed/3/lim/a", b"a") == 0
    assert puback_reason(pub, "$delayed/3/lim/b", b"b") == 0
    assert puback_reason(pub, "$delayed/3/lim/c", b"c") == QUOTA_EXCEEDED
    held = broker.ctl_json("delayed", "list")
    assert [h["topic"] for h in held] == ["lim/a", "lim/b"]
    assert held[0]["from"] == "pub" and held[0]["payload"] == 1
    code, out, err = broker.ctl("delayed", "del", str(held[0]["id"]))
    assert code == 0, err
    assert broker.ctl("delayed", "del", str(held[0]["id"]))[0] != 0  # gone
    assert broker.ctl("delayed", "del", "nope")[0] != 0
    # Room again; c is due after b, and a (deleted) before b: only b and c come, in order.
    assert puback_reason(pub, "$delayed/3/lim/c", b"c") == 0
    got = [m["payload"] for m in (sub.next_publish(timeout=30), sub.next_publish(timeout=30))]
    assert got == [b"b", b"c"]
    assert sub.drain(timeout=0.2) == []
    assert metric(broker, "rt_delayed_refused_total") == [
        'rt_delayed_refused_total{reason="limit"} 1',
        'rt_delayed_refused_total{reason="invalid"} 0']
    assert metric(broker, "rt_delayed_deleted_total") == ["rt_delayed_deleted_total 1"]


def test_the_acl_judges_the_real_topic(tmp_path, stopper):
    broker = rtd_with_users(tmp_path, {"alice": "pw"}, "user alice\ntopic readwrite ok/#\n")
    stopper(broker)
    pub = Raw(broker.port, "pub", username="alice", password="pw")
    assert pub.connack_code == 0
    assert puback_reason(pub, "$delayed/1/secret/x") == NOT_AUTHORIZED
    assert puback_reason(pub, "$delayed/1/ok/x") == 0


def test_kept_across_a_restart_and_dropped_once_delivered(tmp_path):
    expiry = prop_u32(0x11, 3600)  # the subscriber's session outlives the restart
    broker = Rtd("persistence=true", data_dir=str(tmp_path))
    try:
        sub = Raw(broker.port, "keeper", clean=False, props=expiry)
        sub.subscribe("r/t", qos=1)
        sub.disconnect()
        pub = Raw(broker.port, "pub")
        assert puback_reason(pub, "$delayed/2/r/t", b"survivor") == 0  # acked: in state.db
    finally:
        assert broker.stop()[0] == 0
    again = Rtd("persistence=true", data_dir=str(tmp_path))
    try:
        assert "event=store.delayed_loaded messages=1" in again.read_log()
        sub = Raw(again.port, "keeper", clean=False, props=expiry)
        m = sub.next_publish(timeout=2 + 30)
        assert m is not None and m["topic"] == "r/t" and m["payload"] == b"survivor"
        assert again.ctl_json("delayed", "list") == []
        sub.ack(PUBACK, m["pid"])
        sub.disconnect()
    finally:
        assert again.stop()[0] == 0
    third = Rtd("persistence=true", data_dir=str(tmp_path))
    try:  # its row went with its delivery: nothing is published twice
        assert "event=store.delayed_loaded messages=0" in third.read_log()
    finally:
        assert third.stop()[0] == 0


def test_mosquitto_pub_and_paho(rtd):
    sub = client(rtd.port, "paho-sub")
    subscribe(sub, "mq/t", qos=1)
    try:
        p = subprocess.run(["mosquitto_pub", "-p", str(rtd.port), "-h", "127.0.0.1", "-q", "1",
                            "-t", "$delayed/1/mq/t", "-m", "from mosquitto_pub"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        assert wait_for(lambda: sub.got, timeout=1 + 30)
        assert sub.got == [("mq/t", b"from mosquitto_pub", 1)]
        info = sub.publish("$delayed/1/mq/t", b"from paho", qos=1)
        info.wait_for_publish(timeout=10)
        assert wait_for(lambda: len(sub.got) == 2, timeout=1 + 30)
        assert sub.got[1] == ("mq/t", b"from paho", 1)
    finally:
        sub.loop_stop()
        sub.disconnect()


@pytest.mark.skipif(
    not shutil.which("node") or not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "mqtt")),
    reason="MQTT.js not installed (tools/install-deps.sh runs npm ci)")
def test_mqttjs(rtd):
    script = r"""
const mqtt = require('mqtt');
const limit = setTimeout(() => { console.error('timeout'); process.exit(1); }, 60000);
const c = mqtt.connect(`mqtt://127.0.0.1:${process.argv[1]}`, {protocolVersion: 5});
c.on('connect', () => c.subscribe('js/t', {qos: 1}, () => {
  const sent = Date.now();
  c.on('message', (t, p) => { console.log(JSON.stringify({t, p: p.toString(), ms: Date.now() - sent}));
    clearTimeout(limit); c.end(); });
  c.publish('$delayed/1/js/t', 'from MQTT.js', {qos: 1}, (err) => { if (err) { console.error(err); process.exit(1); } });
}));
"""
    p = subprocess.run(["node", "-e", script, str(rtd.port)], capture_output=True, text=True,
                       timeout=90, env=dict(os.environ, NODE_PATH=os.path.join(NODE_DIR,
                                                                              "node_modules")))
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["t"] == "js/t" and got["p"] == "from MQTT.js" and got["ms"] >= 1000 - 1


def test_through_the_http_api(tmp_path):
    broker = start_http(tmp_path)
    try:
        pub = Raw(broker.port, "pub")
        assert puback_reason(pub, "$delayed/600/api/t", b"held") == 0
        st, body = call(broker, "/api/v1/delayed/list", broker.read_key)
        assert st == 200 and [(d["topic"], d["from"]) for d in body] == [("api/t", "pub")], body
        ident = body[0]["id"]
        st, body = call(broker, "/api/v1/delayed/del", broker.read_key, "POST",
                        body={"id": str(ident)})
        assert st == 403, body  # a read key changes nothing
        st, body = call(broker, "/api/v1/delayed/del", broker.admin_key, "POST",
                        body={"id": str(ident)})
        assert st == 200 and body["deleted"] == ident, body
        assert call(broker, "/api/v1/delayed/list", broker.read_key) == (200, [])
    finally:
        code, log = broker.stop()
        assert code == 0, log
