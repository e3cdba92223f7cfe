"""rtctl, the admin socket client (docs/ADMIN.md), against a real rtd: its error cases
(no rtd, nothing listening, permission, long socket paths, broken and late replies, usage)
and every command of the table in text and in JSON, with real MQTT clients connected,
checking what the replies say and what the commands do.

Run: RT_BUILD_DIR=$PWD/build/release /usr/bin/python3 -m pytest -q tests/integration/test_rtctl.py
"""
import json
import re
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from admin_wire import Admin
from conftest import RTCTL, Rtd, client, rtctl, subscribe, wait_for


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
    """rtctl ARGS that must succeed: its text reply."""
    code, out, err = broker.ctl(*args)
    assert code == 0, (args, code, out, err)
    assert err == "" and out.endswith("\n"), (args, out, err)
    return out


def js(broker, *args):
    return broker.ctl_json(*args)


def table(text):
    """The rows of a text table as dicts: a header line of names, each column's values
    starting where its name does (a value may be empty)."""
    import re
    lines = [line for line in text.splitlines() if line.strip()]
    cols = [(m.group(), m.start()) for m in re.finditer(r"\S+", lines[0])]
    bounds = [(name, start, cols[i + 1][1] if i + 1 < len(cols) else None)
              for i, (name, start) in enumerate(cols)]
    return [{name: line[a:b].strip() for name, a, b in bounds} for line in lines[1:]]


def pairs(text):
    """`key  value` lines as a dict (a value may be empty or hold spaces)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith(" ") and not line.endswith(":"):
            key, _, value = line.partition(" ")
            out[key] = value.strip()
    return out


def fails(broker, want, *args, json_=False):
    """rtctl exits 1 with rtd's reply on stderr (JSON {"error": ...} with --json), and the
    status code rtd answered on the wire is want."""
    code, out, err = broker.ctl(*args, json=json_)
    assert code == 1 and out == "", (args, code, out, err)
    assert err.endswith("\n")
    if json_:
        assert set(json.loads(err)) == {"error"}
    a = Admin(broker.admin_socket)
    try:
        assert a.ask(*args)[0] == want, (args, err)
    finally:
        a.close()
    return err


def test_status_and_help(broker):
    out = ok(broker, "status")
    assert out == f"rtd 0.1.0 is running (pid {broker.proc.pid}, up " + out.split(" up ")[1]
    j = js(broker, "status")
    assert j["status"] == "running" and j["pid"] == broker.proc.pid
    assert j["version"] == "0.1.0" and j["uptime_s"] >= 0
    code, out, err = broker.ctl("help")
    assert code == 0 and out.startswith("usage: rtctl"), err
    server = out.split("rtd commands:\n")[1]
    for cmd in ("clients kick CLIENT_ID", "rules reload", "config set", "top [-n N]"):
        assert cmd in server, server
    assert "clients kick CLIENT_ID" in js(broker, "help")


def test_long_socket_path(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    b = Rtd(data_dir=str(deep))
    try:
        assert len(b.admin_socket) > 108
        code, out, err = b.ctl("status")
        assert code == 0 and "is running" in out, err
    finally:
        code, log = b.stop()
    assert code == 0, log


def rtctl_as_nobody(*args, socket_path):
    """rtctl run as UID 65534 from a copy nobody can execute: the build tree may sit in a
    directory only its owner can enter (a CI checkout under a 0700 temp directory)."""
    with tempfile.TemporaryDirectory(prefix="rtctl-nobody-") as d:
        os.chmod(d, 0o755)
        exe = os.path.join(d, "rtctl")
        shutil.copy(RTCTL, exe)
        os.chmod(exe, 0o755)
        p = subprocess.run([exe, "-s", socket_path, *args], capture_output=True, text=True,
                           timeout=60, user=65534)
        return p.returncode, p.stdout, p.stderr


def test_permission_denied(broker):
    """The admin socket is 0600: another user's connect is refused with EACCES and rtctl
    names the owner. As root, rtctl runs as nobody (65534); otherwise the owner closes the
    socket to itself (mode 0000), which the kernel checks the same way for a non-root user."""
    path = broker.admin_socket
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    if os.getuid() == 0:
        os.chmod(broker.data_dir, 0o755)  # nobody may reach the socket, not open it
        code, out, err = rtctl_as_nobody("status", socket_path=path)
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
        code, out, err = rtctl_as_nobody("status", socket_path=path)
        assert (code, out) == (2, "")
        assert err == (f"rtctl: permission denied on {path} (its directory is closed to UID "
                       "65534: run rtctl as the user rtd runs as)\n")
    assert ok(broker, "status")


@pytest.fixture
def clients(broker):
    """Two real MQTT clients: c-sub (3.1.1, subscribed to t/# at QoS 1) and c-pub (MQTT 5),
    and one message from c-pub to c-sub."""
    sub = client(broker.port, "c-sub")
    subscribe(sub, "t/#", 1)
    pub = client(broker.port, "c-pub", protocol=mqtt.MQTTv5)
    pub.publish("t/one", b"hello", qos=1).wait_for_publish(5)
    assert wait_for(lambda: len(sub.got) == 1)
    yield sub, pub
    for c in (sub, pub):
        c.disconnect()
        c.loop_stop()


def test_broker_commands(broker, clients):
    b = pairs(ok(broker, "broker"))
    assert b["version"] == "0.1.0" and b["pid"] == str(broker.proc.pid)
    j = js(broker, "broker")
    assert j["pid"] == broker.proc.pid and j["started_at"].endswith("Z")

    stats = pairs(ok(broker, "broker", "stats"))
    assert stats["connections/count"] == ": 2" and stats["subscriptions/count"] == ": 1"
    j = js(broker, "broker", "stats")
    assert j["connections"]["count"] == 2 and j["connections"]["max"] >= 2
    assert j["subscriptions"]["count"] == 1 and j["sessions"]["count"] == 2

    out = ok(broker, "broker", "metrics")
    assert "packets_in:" in out and "messages:" in out
    j = js(broker, "broker", "metrics")
    assert j["packets_in"]["connect"] == 2 and j["packets_in"]["subscribe"] == 1
    assert j["packets_in"]["publish"] >= 1 and j["messages"]["in"] >= 1
    assert j["bytes"]["in"] > 0 and j["bytes"]["out"] > 0

    rows = table(ok(broker, "listeners"))
    assert rows[0]["listener"] == f"127.0.0.1:{broker.port}" and rows[0]["connections"] == "2"
    j = js(broker, "listeners")
    assert j[0]["listener"] == f"127.0.0.1:{broker.port}" and j[0]["accepted"] >= 2

    out = ok(broker, "vm")
    assert "schedulers:" in out and "files:" in out
    j = js(broker, "vm")
    assert j["actors"]["count"] >= 4 and j["files"]["limit"] > j["files"]["used"] > 0
    assert j["memory"]["rss"] > 0
    assert [s["kind"] for s in j["schedulers"]].count("scheduler") == 2


def test_clients_and_subscriptions(broker, clients):
    rows = {r["client_id"]: r for r in table(ok(broker, "clients", "list"))}
    assert set(rows) == {"c-sub", "c-pub"}
    assert rows["c-sub"]["subscriptions"] == "1"
    j = {c["client_id"]: c for c in js(broker, "clients", "list")}
    assert j["c-pub"]["protocol"] == "5.0" and j["c-sub"]["protocol"] == "3.1.1"
    assert j["c-sub"]["state"] == "connected" and j["c-sub"]["peer"].startswith("127.0.0.1:")
    assert len(js(broker, "clients", "list", "--limit", "1")) == 1
    assert len(table(ok(broker, "clients", "list", "--limit", "1"))) == 1

    out = ok(broker, "clients", "show", "c-sub")
    assert pairs(out)["peer"] == j["c-sub"]["peer"]
    assert out.split("subscription_list:\n")[1].split()[7:9] == ["t/#", "1"]
    c = js(broker, "clients", "show", "c-sub")
    assert [(s["topic"], s["qos"]) for s in c["subscription_list"]] == [("t/#", 1)]
    assert c["pid"].startswith("<")
    err = fails(broker, 404, "clients", "show", "nobody-here")
    assert "nobody-here" in err
    fails(broker, 404, "clients", "show", "nobody-here", json_=True)

    want = [("c-sub", "t/#", "1")]
    assert [(r["client_id"], r["topic"], r["qos"])
            for r in table(ok(broker, "subscriptions"))] == want
    assert len(table(ok(broker, "subscriptions", "list", "--limit", "5"))) == 1
    j = js(broker, "subscriptions", "show", "c-sub")
    assert [(r["client_id"], r["topic"], r["qos"]) for r in j] == [("c-sub", "t/#", 1)]
    assert table(ok(broker, "subscriptions", "show", "c-pub")) == []
    assert js(broker, "topics", "--limit", "10") == [{"topic": "t/#", "subscribers": 1}]
    assert table(ok(broker, "topics")) == [{"topic": "t/#", "subscribers": "1"}]


def test_clients_kick(broker, clients):
    sub, pub = clients
    gone, reasons = threading.Event(), []
    sub.on_disconnect = lambda *a: gone.set()
    pub.on_disconnect = lambda c, u, rc, props=None: reasons.append(rc)
    for c in (sub, pub):
        c.reconnect_delay_set(60, 120)  # paho would reconnect at once otherwise
    ok(broker, "clients", "kick", "c-sub")
    assert gone.wait(5)
    ok(broker, "clients", "kick", "c-pub")
    assert wait_for(lambda: reasons, 5)
    assert reasons[0] == 0x98  # MQTT 5: administrative action
    assert wait_for(lambda: js(broker, "clients", "list") == [], 5)
    fails(broker, 404, "clients", "kick", "c-sub")


def test_actors(broker, clients):
    rows = table(ok(broker, "actors", "list", "--limit", "5"))
    assert len(rows) == 5 and all(r["pid"].startswith("<") for r in rows)
    j = js(broker, "actors", "list", "--limit", "1000", "--sort", "memory")
    assert len(j) == js(broker, "vm")["actors"]["count"]
    mem = [r["memory"] for r in j]
    assert mem == sorted(mem, reverse=True)
    assert [r["type"] for r in j].count("mqtt_conn") == 2
    pid = js(broker, "clients", "show", "c-sub")["pid"]
    info = pairs(ok(broker, "actors", "info", pid))
    assert info["pid"] == pid and info["type"] == "mqtt_conn"
    j = js(broker, "actors", "info", pid)
    assert j["type"] == "mqtt_conn" and j["reductions"] >= 1
    assert js(broker, "actors", "info", str(j["pid_number"]))["pid"] == pid
    fails(broker, 404, "actors", "info", "<999999.9>")


def test_rules(broker, clients):
    assert [r["name"] for r in table(ok(broker, "rules", "list"))] == ["t_rule"]
    j = js(broker, "rules", "list")
    assert j[0]["name"] == "t_rule" and j[0]["state"] == "enabled" and j[0]["to"] == "db"
    assert wait_for(lambda: js(broker, "rules", "metrics", "t_rule")[0]["passed"] == 1)
    show = pairs(ok(broker, "rules", "show", "t_rule"))
    assert show["from"] == "t/#" and show["matched"] == "1"
    assert table(ok(broker, "rules", "metrics"))[0]["rows_out"] == "1"
    out = ok(broker, "rules", "test", "t_rule", "--topic", "t/x", "--payload", 'say "hi"')
    assert pairs(out)["topic"] == "t/x"
    j = js(broker, "rules", "test", "t_rule", "--topic", "t/x", "--payload", 'say "hi"\n',
           "--qos", "1")
    assert j["rows"] == [{"topic": "t/x", "payload": 'say "hi"\n'}]
    assert js(broker, "rules", "metrics", "t_rule")[0]["matched"] == 1  # tests count nothing
    ok(broker, "rules", "disable", "t_rule")
    assert js(broker, "rules", "show", "t_rule")["state"] == "disabled"
    ok(broker, "rules", "enable", "t_rule")
    assert pairs(ok(broker, "rules", "show", "t_rule"))["state"] == "enabled"
    fails(broker, 404, "rules", "show", "no_rule")

    (broker.rules_dir / "t_two.lua").write_text(RULE % "t_two")
    ok(broker, "rules", "reload")
    assert [r["name"] for r in js(broker, "rules", "list")] == ["t_rule", "t_two"]
    (broker.rules_dir / "t_bad.lua").write_text("return {")
    err = fails(broker, 409, "rules", "reload")
    assert "t_bad.lua" in err
    assert [r["name"] for r in js(broker, "rules", "list")] == ["t_rule", "t_two"]


def test_sinks(broker, clients):
    rows = table(ok(broker, "sinks", "list"))
    assert [(r["name"], r["type"]) for r in rows] == [("db", "sqlite")]
    assert wait_for(lambda: js(broker, "sinks", "show", "db")["written"] == 1)
    assert js(broker, "sinks", "list")[0]["in"] == 1
    assert pairs(ok(broker, "sinks", "show", "db"))["state"] == "connected"
    fails(broker, 404, "sinks", "show", "no_sink")


def test_log_config_auth(broker):
    assert ok(broker, "log", "level") == "log level info\n"
    ok(broker, "log", "level", "debug")
    assert js(broker, "log", "level") == {"level": "debug"}
    fails(broker, 400, "log", "level", "chatty")

    def connect_logged(client_id):
        """Whether rtd logs a connection (an info line) at the level it runs at now."""
        c = client(broker.port, client_id)
        c.disconnect()
        c.loop_stop()
        return wait_for(lambda: f"client.disconnected client={client_id}" in broker.read_log(),
                        1)
    ok(broker, "log", "level", "error")
    assert not connect_logged("c-quiet")
    ok(broker, "log", "level", "info")
    assert connect_logged("c-loud")

    rows = {r["setting"]: r for r in js(broker, "config", "show")}
    assert rows["max_connections"]["changes"] == "live"
    assert "max_connections" in ok(broker, "config", "show")
    assert rows["max_subscriptions"]["default"] == "0"
    assert rows["max_subscriptions"]["from"] in ("default", "-o") or \
        re.fullmatch(r".*rtd\.conf:\d+", rows["max_subscriptions"]["from"])
    ok(broker, "config", "set", "max_subscriptions", "7")
    row = {r["setting"]: r for r in js(broker, "config", "show")}["max_subscriptions"]
    assert row["value"] == "7" and row["from"] == "config set" and row["default"] == "0"
    ok(broker, "config", "set", "log_level", "warning")
    assert js(broker, "log", "level") == {"level": "warning"}
    err = fails(broker, 409, "config", "set", "schedulers", "4")
    assert "restart" in err
    ok(broker, "auth", "reload")


def test_top_command(broker, clients):
    j = js(broker, "top", "-n", "5")
    assert j["sort"] == "reductions" and len(j["actors"]) == 5
    assert j["node"]["connections"] == 2
    out = ok(broker, "top", "--once", "-n", "5", "--width", "80", "--height", "30")
    assert all(len(line) <= 80 for line in out.splitlines())
    # rtctl knows top's sort keys: a wrong one is a usage error, before any request.
    code, out, err = broker.ctl("top", "--sort", "nope")
    assert code == 2 and "unknown sort key" in err, (code, out, err)


def test_unknown_command(broker):
    err = fails(broker, 400, "frobnicate")
    assert "frobnicate" in err
    fails(broker, 400, "frobnicate", json_=True)


# ---- finding rtd, help, disabled sinks (issue 28, part 5) ----

def test_socket_from_config_as_rtd_resolves_it(tmp_path, stopper):
    """rtctl -c CONFIG asks the rtd that CONFIG starts, from any directory: admin_socket, else
    data_dir/rtd.sock, relative paths against the config's directory as rtd takes them."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "rtd.conf").write_text(
        'data_dir = "../state"\nrules_dir = "%s"\n' % os.path.abspath("etc/rules"))
    (tmp_path / "state").mkdir(mode=0o700)
    b = Rtd(data_dir=str(tmp_path / "state"))
    stopper(b)
    env = {k: v for k, v in os.environ.items() if k != "RTCTL_SOCKET"}
    code, out, err = rtctl("-c", str(etc / "rtd.conf"), "status", cwd="/", env=env)
    assert code == 0 and f"(pid {b.proc.pid}," in out, err
    # -c wins over $RTCTL_SOCKET (a flag over the environment); -s and -c together are refused.
    code, out, _ = rtctl("--config", str(etc / "rtd.conf"), "status", cwd="/",
                         env={**env, "RTCTL_SOCKET": "/nonexistent"})
    assert code == 0
    code, out, err = rtctl("-c", str(etc / "rtd.conf"), "-s", b.admin_socket, "status")
    assert code == 2 and "give one" in err
    code, out, err = rtctl("status", cwd="/", env={**env, "RTCTL_SOCKET": b.admin_socket})
    assert code == 0 and f"(pid {b.proc.pid}," in out
    (etc / "other.conf").write_text('admin_socket = "elsewhere.sock"\n')
    code, _, err = rtctl("-c", str(etc / "other.conf"), "status", cwd="/", env=env)
    assert code == 2 and f"no socket at {etc}/elsewhere.sock" in err
    code, _, err = rtctl("-c", str(etc / "none.conf"), "status", env=env)
    assert code == 2 and "none.conf: cannot open" in err
    (etc / "bad.conf").write_text("max_connections = 'many'\n")
    code, _, err = rtctl("-c", str(etc / "bad.conf"), "status", env=env)
    assert code == 2 and "bad.conf:1:" in err


def test_every_command_has_help(broker):
    usages = js(broker, "help")
    assert len(usages) >= 40
    for usage in usages:
        words = [w for w in usage.split()[:3] if w.isalpha() and w.islower()]
        if words == ["top"]:
            continue  # rtctl runs top itself: its help is rtctl's (below)
        out = ok(broker, *words, "--help")
        assert out.startswith(f"usage: rtctl {usage}\n"), (words, out)
        about, http = out.splitlines()[1:3]
        assert len(about.strip()) > 20 and "/api/v1/" in http, out
        assert ok(broker, "help", *words) == out
    # A changing command's help changes nothing, and says how HTTP takes it.
    out = ok(broker, "clients", "kick", "--help")
    assert "Changes rtd; over HTTP: POST /api/v1/clients/kick with an admin key" in out
    assert "with a read or admin key" in ok(broker, "status", "--help")
    # A word with sub-commands describes them all; top's own options are rtctl's.
    assert ok(broker, "trace", "--help").count("usage: rtctl trace") == 2
    code, out, err = broker.ctl("top", "--help")
    assert code == 0 and out.startswith("usage: rtctl top") and "--once" in out
    err = fails(broker, 400, "frobnicate", "--help")
    assert "unknown command" in err


def test_disabled_sink_is_shown_so(tmp_path, stopper):
    b = Rtd('sinks={db={type="sqlite",file="%s",enabled=false}}' % (tmp_path / "x.db"),
            'rules_dir="%s"' % tmp_path)
    stopper(b)
    show = pairs(ok(b, "sinks", "show", "db"))
    assert (show["type"], show["state"]) == ("sqlite", "disabled")
    assert show["note"].startswith("enabled = false in rtd.conf")
    assert js(b, "sinks", "show", "db")["state"] == "disabled"
    assert [(r["name"], r["state"]) for r in js(b, "sinks", "list")] == [("db", "disabled")]
    fails(b, 404, "sinks", "show", "other")


def test_one_unit_style(broker, clients):
    """Text shows sizes as K/M/G (1024-based) and durations in seconds, whatever the command;
    --json gives the raw numbers its keys name (bytes, _s, _ms, _us)."""
    import re
    size, seconds = re.compile(r"^-?\d+(\.\d)?[KMGT]?$"), re.compile(r"^\d+(\.\d+)?s$")
    vm = ok(broker, "vm")
    rss = re.search(r"^  rss\s+(\S+)$", vm, re.M).group(1)
    assert size.match(rss) and rss[-1] in "MG", rss
    assert isinstance(js(broker, "vm")["memory"]["rss"], int)
    rows = table(ok(broker, "actors", "list", "--limit", "50", "--sort", "memory"))
    assert all(size.match(r["memory"]) and seconds.match(r["cpu_us"]) for r in rows), rows
    assert any(r["memory"][-1] == "K" for r in rows)
    raw = js(broker, "actors", "list", "--limit", "1")[0]
    assert isinstance(raw["cpu_us"], int) and isinstance(raw["memory"], int)
    assert re.search(r", up \d+(\.\d+)?s\)$", ok(broker, "status").strip())
    assert seconds.match(pairs(ok(broker, "broker"))["uptime_s"])
    assert "uptime" not in pairs(ok(broker, "broker"))  # the EMQX-style string: JSON only
    assert js(broker, "broker")["uptime"].endswith("s")
    assert seconds.match(pairs(ok(broker, "clients", "show", "c-sub"))["session_expiry_s"])
    top = ok(broker, "top", "--once", "-n", "1")
    assert re.search(r"\bup \d+(\.\d+)?s\b", top) and re.search(r"\brss \d+(\.\d)?[MG]\b", top)
