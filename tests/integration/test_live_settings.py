"""`rtctl config set`: what may change while rtd runs takes effect at once for new work
(limits, the log level, the password and ACL files), and what may not says it needs a restart
and changes nothing."""
import os
import subprocess

import paho.mqtt.client as mqtt

from conftest import RTD, Rtd, wait_for


def connects(port, client_id, user=None, password=None):
    """The CONNACK's return code for one MQTT 3.1.1 client (0 accepted), or None if the
    socket was closed before any CONNACK."""
    result = {}
    c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv311)
    if user:
        c.username_pw_set(user, password)
    c.on_connect = lambda _c, _u, _f, rc: result.setdefault("rc", rc)
    c.on_disconnect = lambda *a: result.setdefault("rc", None)
    try:
        c.connect("127.0.0.1", port, keepalive=30)
    except OSError:
        return None
    c.loop_start()
    wait_for(lambda: "rc" in result, 5)
    c.disconnect()
    c.loop_stop()
    return result.get("rc")


def setting(broker, key):
    rows = broker.ctl_json("config", "show")
    return next(r for r in rows if r["setting"] == key)


def test_a_limit_changes_live():
    b = Rtd()
    try:
        assert setting(b, "max_connections")["changes"] == "live"
        code, out, err = b.ctl("config", "set", "max_connections", "2")
        assert code == 0, err
        assert setting(b, "max_connections")["value"] == "2"
        held = []
        for i in range(2):
            c = mqtt.Client(client_id=f"held-{i}", protocol=mqtt.MQTTv311)
            c.connect("127.0.0.1", b.port)
            c.loop_start()
            held.append(c)
        assert wait_for(lambda: b.ctl_json("broker", "stats")["connections"]["count"] == 2)
        assert connects(b.port, "third") != 0  # refused at the listener
        assert b.ctl_json("listeners")[0]["refused_max_conns"] >= 1
        assert b.ctl("config", "set", "max_connections", "100")[0] == 0
        assert connects(b.port, "third") == 0
        for c in held:
            c.disconnect()
            c.loop_stop()
        # A bad value is refused with the reason, and the setting stays.
        code, _, err = b.ctl("config", "set", "max_connections", "-5")
        assert code == 1 and "max_connections" in err
        assert setting(b, "max_connections")["value"] == "100"
    finally:
        code, log = b.stop()
        assert code == 0, log
    assert "config.set setting=max_connections value=2 was=100" in log


def test_what_needs_a_restart_says_so_and_changes_nothing():
    b = Rtd()
    try:
        for key, value in [("listeners", "127.0.0.1:1"), ("data_dir", "/tmp"),
                           ("schedulers", "1"), ("persistence", "false")]:
            assert setting(b, key)["changes"] == "restart"
            code, _, err = b.ctl("config", "set", key, value)
            assert code == 1 and "restart" in err, (key, err)
            assert setting(b, key)["value"] != value
        code, _, err = b.ctl("config", "set", "no_such_setting", "1")
        assert code == 1 and "unknown setting" in err
    finally:
        code, log = b.stop()
        assert code == 0, log


def test_a_new_password_file_takes_over_live(tmp_path):
    pw = str(tmp_path / "passwd")
    assert subprocess.run([RTD, "passwd", "-c", "-b", pw, "alice", "a-secret"]).returncode == 0
    b = Rtd("allow_anonymous=false")
    try:
        assert connects(b.port, "anon") in (4, 5)  # refused: no user name
        code, out, err = b.ctl("config", "set", "password_file", pw)
        assert code == 0, err
        assert connects(b.port, "alice-1", "alice", "a-secret") == 0
        assert connects(b.port, "alice-2", "alice", "wrong") == 4
        # A file that cannot be read is refused and the one in force stays.
        code, _, err = b.ctl("config", "set", "password_file", str(tmp_path / "missing"))
        assert code == 1 and "missing" in err
        assert setting(b, "password_file")["value"] == pw
        assert connects(b.port, "alice-3", "alice", "a-secret") == 0
    finally:
        code, log = b.stop()
        assert code == 0, log
