"""rtctl, the admin socket client (docs/ADMIN.md), against a real rtd: its error cases
(no rtd, nothing listening, permission, long socket paths, broken and late replies, usage)
and every command of the table in text and in JSON, with real MQTT clients connected,
checking what the replies say and what the commands do.

Run: RT_BUILD_DIR=$PWD/build/release /usr/bin/python3 -m pytest -q tests/integration/test_rtctl.py
"""
import json
import os
import socket
import stat
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from conftest import Rtd, client, rtctl, subscribe, wait_for


pytestmark = pytest.mark.usefixtures("rtctl_built")


# ---- error cases ----

def test_no_socket(tmp_path):
    path = str(tmp_path / "rtd.sock")
    code, out, err = rtctl("status", socket_path=path)
    assert (code, out) == (2, "")
    assert err == f"rtctl: rtd is not running (no socket at {path})\n"


def test_socket_from_env_then_default(tmp_path):
    path = str(tmp_path / "env.sock")
    code, _, err = rtctl("status", env={**os.environ, "RTCTL_SOCKET": path})
    assert code == 2 and f"no socket at {path}" in err
    code, _, err = rtctl("status", cwd=tmp_path, env={k: v for k, v in os.environ.items()
                                                       if k != "RTCTL_SOCKET"})
    assert code == 2 and "no socket at data/rtd.sock" in err


def test_socket_file_nobody_listens(tmp_path):
    path = str(tmp_path / "rtd.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)  # bound, never listening, then closed: the file stays behind
    s.close()
    code, _, err = rtctl("status", socket_path=path)
    assert code == 2
    assert err == f"rtctl: rtd is not running (nothing listens on {path})\n"


def serve_once(path, reply, hold=0.0):
    """A unix listener that is not rtd: it accepts one connection, reads the request line,
    writes reply (bytes) and holds the connection hold seconds. Used only to show what rtctl
    does with replies rtd never sends."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    seen = []

    def run():
        c, _ = srv.accept()
        with c:
            c.settimeout(5)
            data = b""
            while not data.endswith(b"\n"):
                chunk = c.recv(4096)
                if not chunk:
                    break
                data += chunk
            seen.append(data)
            c.sendall(reply)
            time.sleep(hold)
        srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, seen


def test_reply_not_following_protocol(tmp_path):
    path = str(tmp_path / "x.sock")
    t, seen = serve_once(path, b"HELLO\n")
    code, out, err = rtctl("status", socket_path=path)
    t.join(5)
    assert (code, out) == (2, "")
    assert "does not follow the protocol" in err
    assert seen == [b'"status"\n']


def test_reply_cut_short_and_late(tmp_path):
    path = str(tmp_path / "x.sock")
    t, _ = serve_once(path, b"200 10\nabc")
    code, _, err = rtctl("status", socket_path=path)
    t.join(5)
    assert code == 2 and "lost connection to rtd" in err
    path = str(tmp_path / "y.sock")
    t, _ = serve_once(path, b"", hold=3)
    start = time.monotonic()
    code, _, err = rtctl("--timeout", "0.3", "status", socket_path=path)
    assert code == 2 and "no complete reply" in err
    assert time.monotonic() - start < 2.5
    t.join(5)


def test_words_are_quoted_and_escaped(tmp_path):
    path = str(tmp_path / "x.sock")
    t, seen = serve_once(path, b"200 3\nok\n")
    code, out, _ = rtctl("rules", "test", "r", "--payload", 'a "b" \\c\t\x01\x7fé', "--json",
                         socket_path=path)
    t.join(5)
    assert (code, out) == (0, "ok\n")
    assert seen == [b'"rules" "test" "r" "--payload" "a \\"b\\" \\\\c\\x09\\x01\\x7f\xc3\xa9" '
                    b'"--json"\n']


def test_usage_errors():
    for args in ([], ["--bogus"], ["-s"], ["--timeout", "0", "status"],
                 ["top", "--sort", "nope"], ["top", "-n", "x"], ["top", "--what"]):
        code, out, err = rtctl(*args)
        assert code == 2, (args, out, err)
        assert "rtctl" in err and out == ""


def test_help_without_rtd(tmp_path):
    code, out, err = rtctl("help", socket_path=str(tmp_path / "none.sock"))
    assert code == 0
    assert out.startswith("usage: rtctl") and "top" in out
    assert "rtd is not running" in err


# ---- against a real rtd ----

RULE = """return {
    name = "%s",
    from = "t/#",
    select = function(msg) return { topic = msg.topic, payload = msg.payload } end,
    to = { "db" },
    enabled = true,
}
"""


@pytest.fixture
def broker(tmp_path, stopper):
    """rtd with a rules_dir of its own (one rule, t_rule, into an SQLite sink)."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "t_rule.lua").write_text(RULE % "t_rule")
    db = tmp_path / "t.db"
    b = Rtd(f'rules_dir="{rules}"',
            'sinks={db={type="sqlite",file="%s",batch=10,flush_ms=10}}' % db)
    b.rules_dir = rules
    stopper(b)
    return b


def ok(broker, *args):
    code, out, err = broker.ctl(*args)
    assert code == 0, (args, code, out, err)
    assert err == "" and out.endswith("\n"), (args, out, err)
    return out


def js(broker, *args):
    return broker.ctl_json(*args)


def raw(broker, *words):
    """One request straight on the admin socket, for the status code rtctl folds into its
    exit code: (code, body)."""
    def quote(w):
        return '"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"'
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(broker.admin_socket)
        s.sendall((" ".join(quote(w) for w in words) + "\n").encode())
        data = b""
        while b"\n" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        status, body = data.split(b"\n", 1)
        code, length = map(int, status.split(b" "))
        while len(body) < length:
            chunk = s.recv(65536)
            assert chunk, (status, body)
            body += chunk
        assert len(body) == length
        return code, body.decode()


def fails(broker, want, *args, json_=False):
    """rtctl exits 1 with rtd's reply on stderr, and rtd's status code is want."""
    code, out, err = broker.ctl(*args, json=json_)
    assert code == 1 and out == "", (args, code, out, err)
    assert err.endswith("\n")
    if json_:
        assert "error" in json.loads(err)
    assert raw(broker, *args)[0] == want, (args, err)
    return err


def test_status_and_help(broker):
    out = ok(broker, "status")
    assert "running" in out and str(broker.proc.pid) in out
    assert len(out.splitlines()) == 1
    j = js(broker, "status")
    assert json.dumps(j).find(str(broker.proc.pid)) >= 0
    code, out, err = broker.ctl("help")
    assert code == 0 and out.startswith("usage: rtctl")
    for cmd in ("clients", "subscriptions", "actors", "rules", "sinks", "top"):
        assert cmd in out.split("rtd commands:")[1], out


def test_long_socket_path(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    b = Rtd(data_dir=str(deep))
    try:
        assert len(b.admin_socket) > 108
        assert wait_for(lambda: os.path.exists(b.admin_socket), 5)
        code, out, err = b.ctl("status")
        assert code == 0 and "running" in out, err
    finally:
        code, log = b.stop()
    assert code == 0, log


def test_permission_denied(broker):
    """The admin socket is 0600: another user's connect is refused with EACCES and rtctl
    names the owner. As root, rtctl runs as nobody (65534); otherwise the owner closes the
    socket to itself (mode 0000), which the kernel checks the same way for a non-root user."""
    path = broker.admin_socket
    assert wait_for(lambda: os.path.exists(path), 5)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    if os.getuid() == 0:
        os.chmod(broker.data_dir, 0o755)  # nobody may reach the socket, not open it
        code, out, err = rtctl("status", socket_path=path, user=65534)
    else:
        os.chmod(path, 0)
        try:
            code, out, err = rtctl("status", socket_path=path)
        finally:
            os.chmod(path, 0o600)
    assert (code, out) == (2, "")
    mode = "0600" if os.getuid() == 0 else "0000"
    assert err == (f"rtctl: permission denied on {path} (the admin socket is mode {mode}, "
                   f"owned by UID {os.getuid()}: run rtctl as that user)\n")
    if os.getuid() == 0:
        os.chmod(broker.data_dir, 0o700)  # now nobody cannot even see the socket's mode
        code, out, err = rtctl("status", socket_path=path, user=65534)
        assert (code, out) == (2, "")
        assert err == (f"rtctl: permission denied on {path} (its directory is closed to UID "
                       "65534: run rtctl as the user rtd runs as)\n")
    assert ok(broker, "status")


@pytest.fixture
def clients(broker):
    """Two real MQTT clients: c-sub (subscribed to t/# at QoS 1) and c-pub (MQTT 5)."""
    sub = client(broker.port, "c-sub")
    subscribe(sub, "t/#", 1)
    pub = client(broker.port, "c-pub", protocol=mqtt.MQTTv5)
    pub.publish("t/one", b"hello", qos=1).wait_for_publish(5)
    assert wait_for(lambda: len(sub.got) == 1)
    yield sub, pub
    for c in (sub, pub):
        c.loop_stop()
        c.disconnect()


def test_broker_commands(broker, clients):
    out = ok(broker, "broker")
    assert "uptime" in out.lower()
    j = js(broker, "broker")
    assert isinstance(j, dict) and j
    out = ok(broker, "broker", "stats")
    assert "connections" in out and "subscriptions" in out
    j = js(broker, "broker", "stats")
    assert "connections" in json.dumps(j)
    out = ok(broker, "broker", "metrics")
    assert "bytes" in out
    js(broker, "broker", "metrics")
    out = ok(broker, "listeners")
    assert str(broker.port) in out
    assert str(broker.port) in json.dumps(js(broker, "listeners"))
    out = ok(broker, "vm")
    assert "actors" in out.lower()
    js(broker, "vm")


def test_clients_and_subscriptions(broker, clients):
    sub, pub = clients
    out = ok(broker, "clients", "list")
    assert "c-sub" in out and "c-pub" in out
    assert "c-sub" in json.dumps(js(broker, "clients", "list"))
    out = ok(broker, "clients", "list", "--limit", "1")
    assert ("c-sub" in out) != ("c-pub" in out)
    out = ok(broker, "clients", "show", "c-sub")
    assert "t/#" in out and "127.0.0.1" in out
    j = js(broker, "clients", "show", "c-sub")
    assert "t/#" in json.dumps(j)
    err = fails(broker, 404, "clients", "show", "nobody-here")
    assert "nobody-here" in err
    fails(broker, 404, "clients", "show", "nobody-here", json_=True)

    out = ok(broker, "subscriptions")
    assert "c-sub" in out and "t/#" in out
    assert "t/#" in ok(broker, "subscriptions", "list", "--limit", "5")
    assert "t/#" in ok(broker, "subscriptions", "show", "c-sub")
    assert "t/#" in json.dumps(js(broker, "subscriptions", "show", "c-sub"))
    out = ok(broker, "topics")
    assert "t/#" in out
    assert "t/#" in json.dumps(js(broker, "topics", "--limit", "10"))


def test_clients_kick(broker, clients):
    sub, _ = clients
    gone = threading.Event()
    sub.on_disconnect = lambda *a: gone.set()
    sub.reconnect_delay_set(60, 120)  # paho would reconnect at once otherwise
    out = ok(broker, "clients", "kick", "c-sub")
    assert gone.wait(5), out
    assert wait_for(lambda: "c-sub" not in ok(broker, "clients", "list"), 5)
    fails(broker, 404, "clients", "kick", "c-sub")


def test_actors(broker, clients):
    out = ok(broker, "actors", "list", "--limit", "5")
    assert len(out.splitlines()) <= 7
    j = js(broker, "actors", "list", "--limit", "1000", "--sort", "memory")
    rows = j if isinstance(j, list) else next(v for v in j.values() if isinstance(v, list))
    assert len(rows) >= 3
    pid = rows[0]["pid"]
    out = ok(broker, "actors", "info", str(pid))
    assert "reductions" in out
    assert "reductions" in json.dumps(js(broker, "actors", "info", str(pid)))
    fails(broker, 404, "actors", "info", "<999999.9>")


def test_rules(broker, clients):
    assert "t_rule" in ok(broker, "rules", "list")
    assert "t_rule" in json.dumps(js(broker, "rules", "list"))
    out = ok(broker, "rules", "show", "t_rule")
    assert "t/#" in out
    ok(broker, "rules", "metrics")
    assert "t_rule" in ok(broker, "rules", "metrics", "t_rule")
    js(broker, "rules", "metrics", "t_rule")
    out = ok(broker, "rules", "test", "t_rule", "--topic", "t/x", "--payload", 'say "hi"')
    assert "t/x" in out and 'say \\"hi\\"' in out or 'say "hi"' in out
    j = js(broker, "rules", "test", "t_rule", "--topic", "t/x", "--payload", "p1", "--qos", "1")
    assert "p1" in json.dumps(j)
    ok(broker, "rules", "disable", "t_rule")
    assert "disabled" in ok(broker, "rules", "show", "t_rule").lower()
    ok(broker, "rules", "enable", "t_rule")
    fails(broker, 404, "rules", "show", "no_rule")

    (broker.rules_dir / "t_two.lua").write_text(RULE % "t_two")
    ok(broker, "rules", "reload")
    assert "t_two" in ok(broker, "rules", "list")
    (broker.rules_dir / "t_bad.lua").write_text("return {")
    err = fails(broker, 409, "rules", "reload")
    assert "t_bad" in err
    assert "t_two" in ok(broker, "rules", "list")  # the old set still runs


def test_sinks(broker, clients):
    out = ok(broker, "sinks", "list")
    assert "db" in out
    assert "db" in json.dumps(js(broker, "sinks", "list"))
    assert "db" in ok(broker, "sinks", "show", "db")
    js(broker, "sinks", "show", "db")
    fails(broker, 404, "sinks", "show", "no_sink")


def test_log_config_auth(broker):
    assert "info" in ok(broker, "log", "level")
    ok(broker, "log", "level", "debug")
    assert "debug" in ok(broker, "log", "level")
    assert "debug" in json.dumps(js(broker, "log", "level"))
    fails(broker, 400, "log", "level", "chatty")
    out = ok(broker, "config", "show")
    assert "max_connections" in out
    assert "max_connections" in json.dumps(js(broker, "config", "show"))
    ok(broker, "config", "set", "log_level", "warning")
    assert "warning" in ok(broker, "log", "level")
    code, _, err = broker.ctl("config", "set", "listeners", "127.0.0.1:1")
    assert code == 1 and err  # needs a restart (409) or is refused
    ok(broker, "auth", "reload")


def test_top_command(broker, clients):
    j = js(broker, "top", "-n", "5")
    assert isinstance(j, dict)
    out = ok(broker, "top", "-n", "5", "--width", "80", "--height", "30")
    assert all(len(line) <= 80 for line in out.splitlines())
    # rtctl knows top's sort keys: a wrong one is a usage error, before any request.
    code, out, err = broker.ctl("top", "--sort", "nope")
    assert code == 2 and "unknown sort key" in err, (code, out, err)


def test_unknown_command(broker):
    err = fails(broker, 400, "frobnicate")
    assert "frobnicate" in err or "usage" in err.lower()
    fails(broker, 400, "frobnicate", json_=True)
