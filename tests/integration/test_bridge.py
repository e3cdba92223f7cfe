"""Bridges to other brokers (docs/BRIDGES.md), against real remotes: Debian's Mosquitto and a
second rtd. Messages go both ways with their topics mapped, in order; nothing loops; a remote
killed mid-stream and started again loses no QoS 1 message (each one arrives, duplicates
allowed: at least once); a remote that refuses the login is retried and said; the queue is
bounded; a durable bridge's local PUBACK waits for the remote's; `rtctl bridges` shows and
restarts. Clients: paho (3.1.1 and 5), mosquitto_pub and mosquitto_sub."""
import json
import os
import shutil
import subprocess
import threading

import paho.mqtt.client as mqtt
import pytest

from conftest import (MOSQUITTO, ROOT, Rtd, client, end_process, free_port, mosquitto_conf,
                      password_file, raise_nofile, subscribe, wait_for, wait_listening)
from test_http import call, make_key
from test_tls import tls_listener
from transports import listeners, lua
from mqtt_raw import PUBACK, PUBLISH, Raw, mqtt_str, u16, varint

# A wait's ceiling: each waits on a state rtd reports or on messages counted, and returns as
# soon as it holds; the ceiling only bounds a test that would otherwise hang.
CEILING = 60


class Mosquitto:
    """Debian's Mosquitto on a given port (so a test can stop and start it again), started
    and stopped by its pid."""

    def __init__(self, directory, port=None, extra=""):
        self.port = port or free_port()
        self.dir = directory
        conf = os.path.join(directory, f"mosquitto-{self.port}.conf")
        with open(conf, "w") as f:
            f.write(mosquitto_conf(self.port) + extra)
        self.log_path = os.path.join(directory, f"mosquitto-{self.port}.log")
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen([MOSQUITTO, "-c", conf], stdout=log,
                                     stderr=subprocess.STDOUT, preexec_fn=raise_nofile)
        log.close()
        wait_listening(self.proc, self.port, 10, "mosquitto", lambda: open(self.log_path).read())

    def stop(self):
        end_process(self.proc, 5)


def bridge_rtd(remote_port, *settings, name="up", out=("local/# -> remote/#",),
               into=("cmd/# -> fromremote/#",), scheme="mqtt", port=None, **keys):
    keys.setdefault("reconnect_min_ms", 50)
    keys.setdefault("reconnect_max_ms", 400)
    table = {"remote": f"{scheme}://127.0.0.1:{remote_port}", "out": list(out),
             "in": list(into)}
    table.update(keys)
    return Rtd(f"bridges={{ {name} = {lua(table)} }}", *settings, port=port)


def show(broker, name="up"):
    code, out, err = broker.ctl("bridges", "show", name, json=True)
    assert code == 0, err
    return json.loads(out)


def wait_state(broker, state, name="up"):
    assert wait_for(lambda: show(broker, name)["state"] == state, CEILING), show(broker, name)


def collector(port, topic, version=mqtt.MQTTv311, client_id="", clean=True):
    c = client(port, client_id=client_id, protocol=version, clean=clean)
    subscribe(c, topic, qos=1)
    return c


@pytest.fixture
def ended():
    """ended(broker): that Rtd ends with the test, passed or failed, by its pid (a test that
    stops it itself checks its exit code there)."""
    started = []
    yield started.append
    for b in started:
        if b.proc.poll() is None:
            b.stop()


def done(*clients):
    for c in clients:
        c.loop_stop()
        c.disconnect()


def test_messages_go_both_ways_mapped_and_in_order(tmp_path):
    remote = Mosquitto(str(tmp_path))
    broker = bridge_rtd(remote.port)
    try:
        wait_state(broker, "connected")
        far = collector(remote.port, "remote/#")
        near = collector(broker.port, "fromremote/#")
        pub = client(broker.port, "local-pub")
        n = 300
        for i in range(n):
            pub.publish(f"local/a/{i % 3}", str(i).encode(), qos=1).wait_for_publish(CEILING)
        assert wait_for(lambda: len(far.got) >= n, CEILING), len(far.got)
        assert [int(p) for _, p, _ in far.got] == list(range(n))
        assert {t for t, _, _ in far.got} == {"remote/a/0", "remote/a/1", "remote/a/2"}
        # In: a remote publish under cmd/ comes here under fromremote/, QoS 0 and 1.
        subprocess.run(["mosquitto_pub", "-p", str(remote.port), "-t", "cmd/x/y", "-m", "c1",
                        "-q", "1"], check=True, timeout=CEILING)
        subprocess.run(["mosquitto_pub", "-p", str(remote.port), "-t", "cmd/z", "-m", "c2"],
                       check=True, timeout=CEILING)
        assert wait_for(lambda: len(near.got) >= 2, CEILING), near.got
        assert sorted((t, p) for t, p, _ in near.got) == [("fromremote/x/y", b"c1"),
                                                          ("fromremote/z", b"c2")]
        s = show(broker)
        assert s["sent"] == n and s["acked"] == n and s["received"] == 2, s
        assert s["queued"] == 0 and s["inflight"] == 0 and s["dropped"] == 0, s
        done(far, near, pub)
    finally:
        code, log = broker.stop()
        remote.stop()
    assert code == 0, log
    assert "event=bridge.up" in log or '"bridge.up"' in log


@pytest.mark.parametrize("version", [4, 5])
def test_no_loop_when_in_and_out_overlap(tmp_path, version, rtd):
    """Out and in on the same topics: what goes out does not come back, what comes in does
    not go out again. MQTT 5's no-local does it at the remote; on 3.1.1 the remote (rtd)
    sends the bridge its own messages back, and the bridge's local no-local keeps them from
    going out again, but they arrive here a second time (docs/BRIDGES.md says so)."""
    broker = bridge_rtd(rtd.port, out=("t/#",), into=("t/#",), version=version)
    try:
        wait_state(broker, "connected")
        near = collector(broker.port, "t/#", client_id="near")
        far = collector(rtd.port, "t/#", client_id="far")
        client(broker.port, "p1").publish("t/from-near", b"n", qos=1).wait_for_publish(CEILING)
        client(rtd.port, "p2").publish("t/from-far", b"f", qos=1).wait_for_publish(CEILING)
        assert wait_for(lambda: len(near.got) >= 2 and len(far.got) >= 2, CEILING)
        # Let any echo arrive: the bridge's counters say when everything it got has been
        # handled (received from the remote, sent to it).
        assert wait_for(lambda: show(broker)["sent"] >= 1 and show(broker)["received"] >= 1,
                        CEILING)
        marker = client(rtd.port, "p3")
        marker.publish("t/marker", b"m", qos=1).wait_for_publish(CEILING)
        assert wait_for(lambda: any(p == b"m" for _, p, _ in near.got), CEILING)
        assert wait_for(lambda: any(p == b"m" for _, p, _ in far.got), CEILING)
        far_topics = sorted(t for t, _, _ in far.got)
        assert far_topics == ["t/from-far", "t/from-near", "t/marker"], far_topics
        near_topics = sorted(t for t, _, _ in near.got)
        if version == 5:
            assert near_topics == ["t/from-far", "t/from-near", "t/marker"], near_topics
        else:
            assert near_topics.count("t/from-far") == 1 and near_topics.count("t/marker") == 1
        assert show(broker)["sent"] == 1, show(broker)
    finally:
        code, log = broker.stop()
    assert code == 0, log


def test_remote_killed_mid_stream_loses_no_qos1_message(tmp_path):
    """The remote is a second rtd keeping its sessions in state.db: killed with SIGKILL in
    the middle of the stream and started again on the same port and data, it gets every
    message the bridge took, the in-flight ones sent again."""
    remote_dir = str(tmp_path / "remote")
    os.mkdir(remote_dir)
    remote_port = free_port()
    remote = Rtd(port=remote_port, data_dir=remote_dir)
    far = client(remote_port, "far-sub", clean=False)
    subscribe(far, "remote/#", qos=1)
    done(far)
    broker = bridge_rtd(remote_port, max_inflight=8)
    try:
        wait_state(broker, "connected")
        pub = client(broker.port, "local-pub")
        n = 3000
        killed = threading.Event()

        def publish_all():
            for i in range(n):
                pub.publish("local/s", str(i).encode(), qos=1).wait_for_publish(CEILING)
                if i == n // 3:
                    killed.wait(CEILING)

        t = threading.Thread(target=publish_all)
        t.start()
        # Killed once the bridge has sent some and while it is sending.
        assert wait_for(lambda: show(broker)["sent"] > 100, CEILING)
        remote.kill9()
        killed.set()
        wait_state(broker, "disconnected")
        t.join(CEILING)
        assert not t.is_alive()
        # Every message the local publisher had acknowledged is held by the bridge now.
        s = show(broker)
        assert s["queued"] + s["acked"] >= n, s
        remote = Rtd(port=remote_port, data_dir=remote_dir)
        wait_state(broker, "connected")
        far = client(remote_port, "far-sub", clean=False)
        subscribe(far, "remote/#", qos=1)
        assert wait_for(lambda: len({int(p) for _, p, _ in far.got}) >= n, CEILING), \
            (len(far.got), show(broker))
        assert {int(p) for _, p, _ in far.got} == set(range(n))
        s = show(broker)
        assert s["connects"] >= 2 and s["queued"] == 0 and s["acked"] >= n, s
        done(far, pub)
    finally:
        code, log = broker.stop()
        remote.stop()
    assert code == 0, log


def test_a_remote_that_refuses_the_login_is_retried_and_said(tmp_path, stopper):
    pw = password_file(tmp_path / "pw", {"bridge": "right"})
    remote = Rtd(f'password_file="{pw}"', "allow_anonymous=false")
    stopper(remote)
    broker = bridge_rtd(remote.port, username="bridge", password="wrong")
    stopper(broker)
    assert wait_for(lambda: show(broker)["failures"] >= 2, CEILING), show(broker)
    s = show(broker)
    assert s["state"] != "connected" and s["connects"] == 0
    assert "refused the CONNECT: reason 0x86" in s["last_error"], s
    assert "bridge.refused" in broker.read_log()
    # The right password, given through a restart of the broker with the same settings,
    # connects: the refusal was the password's.
    good = bridge_rtd(remote.port, username="bridge", password="right")
    stopper(good)
    wait_state(good, "connected")


def test_queue_is_bounded_and_drops_are_counted(tmp_path, stopper):
    down = free_port()  # nothing listens there
    broker = bridge_rtd(down, max_queue_bytes=4096, into=())
    stopper(broker)
    pub = client(broker.port, "p")
    n = 100
    for i in range(n):
        pub.publish("local/x", b"x" * 100, qos=1).wait_for_publish(CEILING)
    s = show(broker)
    assert s["state"] != "connected"
    assert 0 < s["queued"] < n and s["queued"] + s["dropped"] == n, s
    code, out, _ = broker.ctl("bridges", "list", json=True)
    assert json.loads(out)[0]["queued_bytes"] <= 4096
    done(pub)
    # What was held goes once the remote is there: it acknowledges each one.
    remote = Mosquitto(str(tmp_path), port=down)
    try:
        assert wait_for(lambda: show(broker)["acked"] == s["queued"], CEILING), show(broker)
        assert show(broker)["queued"] == 0
    finally:
        remote.stop()


def test_past_memory_messages_wait_in_the_spill_and_survive_a_restart(tmp_path, ended):
    """The remote is down: QoS 1 messages past max_memory_bytes go to the spill file, QoS 0
    ones there are dropped; `rtctl backup` copies the spill, rtd starts on the copy and, the
    remote up, the remote acknowledges every QoS 1 message the spill held."""
    data = str(tmp_path / "data")
    os.mkdir(data)
    down = free_port()
    settings = (f'data_dir="{data}"',)
    broker = bridge_rtd(down, *settings, max_memory_bytes=4096, into=())
    ended(broker)
    pub = client(broker.port, "p")
    n = 500
    for i in range(n):
        pub.publish("local/s", str(i).encode(), qos=1).wait_for_publish(CEILING)
    pub.publish("local/zero", b"q0", qos=0).wait_for_publish(CEILING)
    s = show(broker)
    assert s["spilled"] > 0 and s["queued"] + s["spilled"] == n and s["dropped"] == 1, s
    assert s["queued_bytes"] <= 4096, s
    done(pub)
    # A backup takes the spill; the restart is from the backup.
    copy = str(tmp_path / "copy")
    code, out, err = broker.ctl("backup", copy, json=True)
    assert code == 0, err
    assert {"file": "bridge-up.db", "bridge": "up"}.items() <= json.loads(out)["files"][-1].items()
    code, log = broker.stop()
    assert code == 0, log
    remote = Mosquitto(str(tmp_path), port=down)
    try:
        # The memory part went with the restart; the spill's rows come, in order, and go.
        broker = bridge_rtd(down, f'data_dir="{copy}"', max_memory_bytes=4096, into=())
        ended(broker)
        assert wait_for(lambda: show(broker)["spilled"] == 0, CEILING), show(broker)
        assert show(broker)["acked"] == s["spilled"]
        assert "bridge.spill_found" in broker.read_log()
        code, log = broker.stop()
        assert code == 0, log
    finally:
        remote.stop()


def test_durable_spill_loses_nothing_across_a_kill(tmp_path, ended):
    """Durable with a spill, the remote down: PUBACKs keep their order (4.6), so the client is
    acknowledged nothing while the oldest messages wait in memory for the remote, though the
    newer ones are in the spill. rtd killed with SIGKILL and started again, the client's
    session resumed: it sends again what was not acknowledged, the spill gives what it kept,
    and every message reaches the remote once it is up (at least once)."""
    data = str(tmp_path / "data")
    os.mkdir(data)
    port = free_port()
    settings = (f'data_dir="{data}"',)
    broker = bridge_rtd(port, *settings, durable=True, max_memory_bytes=4096, into=())
    ended(broker)
    pub = client(broker.port, "p", clean=False)
    pub.max_inflight_messages_set(1000)  # paho's default of 20 would wait on the memory part
    n = 300
    infos = [pub.publish("local/d", str(i).encode(), qos=1) for i in range(n)]
    assert wait_for(lambda: show(broker)["queued"] + show(broker)["spilled"] == n, CEILING), \
        show(broker)
    assert show(broker)["spilled"] > 0 and not any(m.is_published() for m in infos)
    broker.kill9()
    remote = Mosquitto(str(tmp_path), port=port)
    try:
        far = collector(remote.port, "remote/#")
        broker = bridge_rtd(port, *settings, port=broker.port, durable=True,
                            max_memory_bytes=4096, into=())
        ended(broker)
        assert wait_for(lambda: pub.is_connected(), CEILING)  # paho reconnects by itself
        assert wait_for(lambda: {int(p) for _, p, _ in far.got} == set(range(n)), CEILING), \
            (len(far.got), show(broker))
        assert wait_for(lambda: all(m.is_published() for m in infos), CEILING)
        done(far, pub)
        code, log = broker.stop()
        assert code == 0, log
    finally:
        remote.stop()


def test_durable_bridge_acknowledges_once_the_remote_has_it(tmp_path, stopper):
    port = free_port()
    broker = bridge_rtd(port, durable=True, into=())
    stopper(broker)
    pub = Raw(broker.port, "durable-pub")
    pub.send((PUBLISH << 4) | 2, mqtt_str("local/d") + u16(7) + varint(0) + b"payload")
    # The message is with the bridge (queued: the remote is down); no PUBACK came with it.
    assert wait_for(lambda: show(broker)["queued"] == 1, CEILING)
    assert pub.drain(timeout=0.2) == []
    remote = Mosquitto(str(tmp_path), port=port)
    try:
        ack = pub.expect(PUBACK, timeout=CEILING)
        assert ack.body[:2] == b"\x00\x07"
        assert show(broker)["acked"] == 1
    finally:
        pub.close()
        remote.stop()


def test_rtctl_restart_reconnects_and_keeps_counting(rtd):
    broker = bridge_rtd(rtd.port)
    try:
        wait_state(broker, "connected")
        code, out, err = broker.ctl("bridges", "restart", "up")
        assert code == 0, err
        assert wait_for(lambda: show(broker)["connects"] == 2, CEILING), show(broker)
        code, out, err = broker.ctl("bridges", "show", "nosuch")
        assert code != 0 and "no bridge nosuch" in err
        code, out, _ = broker.ctl("metrics", "prometheus")
        assert 'rt_bridge_connects_total{bridge="up"} 2' in out
        assert 'rt_bridge_up{bridge="up"} 1' in out
    finally:
        code, log = broker.stop()
    assert code == 0, log


def tls_remote(pki, **tls):
    """A remote rtd with a TLS listener (the test CA's localhost certificate) besides its
    plain one; returns it and its TLS port."""
    port, tls_port = free_port(), free_port()
    remote = Rtd(listeners(port, tls_listener(tls_port, *pki.server["ec"], **tls)), port=port)
    return remote, tls_port


def test_tls_to_the_remote_both_ways(pki, stopper):
    remote, tls_port = tls_remote(pki, ca=pki.ca.cert, verify="required")
    stopper(remote)
    alice_cert, alice_key = pki.client
    broker = bridge_rtd(tls_port, scheme="mqtts", ca_file=pki.ca.cert, server_name="localhost",
                        cert_file=alice_cert, key_file=alice_key)
    stopper(broker)
    wait_state(broker, "connected")
    far = collector(remote.port, "remote/#")
    near = collector(broker.port, "fromremote/#")
    pub = client(broker.port, "tls-pub")
    n = 200
    for i in range(n):
        pub.publish("local/t", str(i).encode(), qos=1).wait_for_publish(CEILING)
    client(remote.port, "far-pub").publish("cmd/c", b"in", qos=1).wait_for_publish(CEILING)
    assert wait_for(lambda: len(far.got) >= n and len(near.got) >= 1, CEILING)
    assert [int(p) for _, p, _ in far.got] == list(range(n))
    assert near.got == [("fromremote/c", b"in", 1)]
    done(far, near, pub)
    # The remote saw the bridge's certificate: it requires one, and the session is there.
    code, out, _ = remote.ctl("clients", "list", json=True)
    assert code == 0 and "rtd-bridge-up" in out


@pytest.mark.parametrize("case", ["unknown-ca", "wrong-name", "no-client-cert"])
def test_tls_failures_are_said_and_retried(pki, stopper, case):
    remote, tls_port = tls_remote(pki, ca=pki.ca.cert,
                                  verify="required" if case == "no-client-cert" else "none")
    stopper(remote)
    keys = {"ca_file": pki.other_ca.cert if case == "unknown-ca" else pki.ca.cert,
            "server_name": "not-localhost" if case == "wrong-name" else "localhost"}
    broker = bridge_rtd(tls_port, scheme="mqtts", **keys)
    stopper(broker)
    assert wait_for(lambda: show(broker)["failures"] >= 2, CEILING), show(broker)
    s = show(broker)
    assert s["connects"] == 0 and s["state"] != "connected", s
    # OpenSSL's reason, or for a refused client certificate the remote's alert (TLS 1.3 sends
    # it after the handshake, so it may come as the end of the stream instead).
    says = {"unknown-ca": "TLS: self-signed certificate in certificate chain",
            "wrong-name": "TLS: hostname mismatch", "no-client-cert": "TLS: "}[case]
    assert says in s["last_error"] or (case == "no-client-cert" and "ended" in s["last_error"]), s


NODE_DIR = os.path.join(ROOT, "tests", "node")


@pytest.mark.skipif(
    not shutil.which("node") or not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "mqtt")),
    reason="MQTT.js not installed (tools/install-deps.sh runs npm ci)")
def test_mqttjs_on_both_sides(tmp_path):
    """MQTT.js 5 subscribes at Mosquitto and publishes at rtd, then the other way round."""
    remote = Mosquitto(str(tmp_path))
    broker = bridge_rtd(remote.port)
    try:
        wait_state(broker, "connected")
        script = r"""
const mqtt = require('mqtt');
const [near, far] = process.argv.slice(1);
const limit = setTimeout(() => { console.error('timeout'); process.exit(1); }, 60000);
const opts = {protocolVersion: 5};
const n = mqtt.connect(`mqtt://127.0.0.1:${near}`, opts), f = mqtt.connect(`mqtt://127.0.0.1:${far}`, opts);
const got = [];
const finish = () => { if (got.length == 2) { console.log(JSON.stringify(got)); clearTimeout(limit); n.end(); f.end(); } };
f.on('message', (t, p) => { got.push([t, p.toString()]); finish(); });
n.on('message', (t, p) => { got.push([t, p.toString()]); finish(); });
let ready = 0;
const go = () => { if (++ready < 2) return;
  n.publish('local/js', 'out', {qos: 1}); f.publish('cmd/js', 'in', {qos: 1}); };
f.on('connect', () => f.subscribe('remote/#', {qos: 1}, go));
n.on('connect', () => n.subscribe('fromremote/#', {qos: 1}, go));
"""
        p = subprocess.run(["node", "-e", script, str(broker.port), str(remote.port)],
                           capture_output=True, text=True, timeout=90,
                           env=dict(os.environ, NODE_PATH=os.path.join(NODE_DIR, "node_modules")))
        assert p.returncode == 0, p.stderr
        assert sorted(map(tuple, json.loads(p.stdout))) == [("fromremote/js", "in"),
                                                            ("remote/js", "out")]
    finally:
        code, log = broker.stop()
        remote.stop()
    assert code == 0, log


def test_through_the_http_api(tmp_path, rtd):
    keys = tmp_path / "api_keys"
    admin, reader = make_key(keys, "ops", "admin"), make_key(keys, "viewer", "read")
    hport = free_port()
    broker = bridge_rtd(rtd.port, f'http={{bind="127.0.0.1:{hport}", api_keys_file="{keys}"}}')
    broker.hport = hport
    try:
        wait_state(broker, "connected")
        st, body = call(broker, "/api/v1/bridges/list", reader)
        assert st == 200 and [(b["name"], b["state"]) for b in body] == [("up", "connected")]
        st, body = call(broker, "/api/v1/bridges/restart", reader, "POST", body={"name": "up"})
        assert st == 403, body  # a read key changes nothing
        st, body = call(broker, "/api/v1/bridges/restart", admin, "POST", body={"name": "up"})
        assert st == 200 and body == {"restarted": "up"}, body
        assert wait_for(lambda: show(broker)["connects"] == 2, CEILING), show(broker)
    finally:
        code, log = broker.stop()
    assert code == 0, log


@pytest.mark.parametrize("bad,says", [
    ('{ b = { remote = "mqtt://127.0.0.1:1", out = { "a/+/# -> b/+" } } }', "right side"),
    ('{ b = { remote = "mqtt://127.0.0.1:1", out = { "a/#/c" } } }', "bridges.b.out"),
    ('{ b = { remote = "http://127.0.0.1:1", out = { "a" } } }', "mqtt://host:port"),
    ('{ b = { remote = "mqtts://127.0.0.1:1", out = "a", ca_file = "/nonexistent" } }',
     "ca_file does not load"),
    ('{ b = { remote = "mqtts://127.0.0.1:1", out = "a", cert_file = "/x" } }', "go together"),
    ('{ b = { remote = "mqtt://127.0.0.1:1" } }', "out, in or both"),
    ('{ b = { remote = "mqtt://127.0.0.1:1", out = "a", qos = 2 } }', "qos"),
    ('{ ["b c"] = { remote = "mqtt://127.0.0.1:1", out = "a" } }', "names are"),
])
def test_bad_bridge_settings_stop_rtd_with_exit_2(bad, says):
    from conftest import RTD, ROOT
    p = subprocess.run([RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"), "--check",
                        "-o", f"bridges={bad}"], capture_output=True, text=True, timeout=CEILING)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert says in p.stderr, p.stderr
