"""Logs a log system can read (issue 28): logfmt lines that split whatever a client sends,
JSON lines with the same keys, a log file reopened on SIGHUP, the journal's priorities, ACL
denials and failed logins logged and counted, certificate expiry as a gauge, and every change
made through the admin layer logged with who made it.

Every rtd the suite starts has each line of its log parsed when it stops (conftest.Rtd,
logcheck.py); RT_RTD_OPTIONS="log_format=json" runs the suite with JSON lines.
"""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import time

import paho.mqtt.client as mqtt
import pytest

import logcheck
from conftest import RTD, ROOT, Rtd, free_port, password_file, wait_for
from mqtt_raw import PUBACK, PUBLISH, Raw, mqtt_str, u16, varint

# ---- Every format in the tree follows the log's rule (actors/base/log.h) ----

CALL = re.compile(r"\b(rt_log|log_peer|log_tls)\s*\(")
FORMAT_ARG = {"rt_log": 2, "log_peer": 2, "log_tls": 2}  # the format's index in the call
EVENT_ARG = {"rt_log": 1, "log_peer": 0, "log_tls": 1}
PRI = {"PRId64": "ld", "PRIu64": "lu", "PRIu32": "u", "PRId32": "d", "PRIx64": "lx"}
RESERVED = {"ts", "level", "event", "msg", "truncated"}
KEY_WORD = re.compile(r"^([a-z][a-z0-9_.]*)=(.*)$")


def calls(text):
    """(name, line number, argument texts) of each call of a logging function in C text."""
    for m in CALL.finditer(text):
        i, depth, instr, args, cur = m.end(), 1, False, [], ""
        while depth:
            c = text[i]
            if instr:
                if c == "\\":
                    cur += c
                    i += 1
                    c = text[i]
                elif c == '"':
                    instr = False
            elif c == '"':
                instr = True
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
            elif c == "," and depth == 1:
                args.append(cur.strip())
                cur = ""
                i += 1
                continue
            if depth:
                cur += c
            i += 1
        args.append(cur.strip())
        yield m.group(1), text.count("\n", 0, m.start()) + 1, args


def literal(expr):
    """A C string literal expression (adjacent literals, PRI macros) as its text; None if it
    is not one."""
    if re.sub(r'"(?:[^"\\]|\\.)*"|\bPRI[diux]\d+\b|\s', "", expr):
        return None
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"|\b(PRI[diux]\d+)\b', expr)
    return "".join(s if not p else PRI[p] for s, p in parts).encode().decode("unicode_escape")


def format_problems(fmt):
    """What is wrong with a format under the log's rule."""
    out, keys = [], set()
    if '"' in fmt:
        out.append("a literal quote: values are quoted by the log, when they need it")
    for word in fmt.split():
        m = KEY_WORD.match(word)
        if m and m.group(1) not in RESERVED:
            key, value = m.groups()
            if key in keys:
                out.append(f"{key}= twice")
            keys.add(key)
            if value[-1:] in (":", ";", ",", ")") or value[:1] == "(":
                out.append(f"{word!r}: prose punctuation in a value")
        elif re.search(r"[a-z]=", word):
            out.append(f"{word!r}: a key=value the log reads as a message word")
    return out


def test_every_log_format_follows_the_rule():
    """A format's literal text is its keys and fixed words, and values come from conversions
    (log.h): a key never comes from a value, a value never holds prose that belongs to msg."""
    sources = sorted(glob.glob(os.path.join(ROOT, "actors", "**", "*.c"), recursive=True) +
                     glob.glob(os.path.join(ROOT, "rules", "*.c")))
    problems, checked = [], 0
    for path in sources:
        if path.endswith(os.path.join("base", "log.c")):
            continue
        text = open(path).read()
        for name, line, args in calls(text):
            if any(a.startswith("const ") for a in args):
                continue  # a wrapper's declaration or definition
            where = f"{os.path.relpath(path, ROOT)}:{line}"
            fmt_expr, event = args[FORMAT_ARG[name]], args[EVENT_ARG[name]]
            if fmt_expr == "fmt" and name == "rt_log":
                continue  # a wrapper passing its callers' formats, checked at their calls
            fmt = literal(fmt_expr)
            if fmt is None:
                problems.append(f"{where}: the format is not a string literal: {fmt_expr}")
                continue
            checked += 1
            ev = literal(event)
            if ev is not None and not re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", ev):
                problems.append(f"{where}: event {ev!r} is not a dotted lower-case name")
            problems += [f"{where}: {p}" for p in format_problems(fmt)]
            for arg in args[FORMAT_ARG[name] + 1:]:
                for s in re.findall(r'"((?:[^"\\]|\\.)*)"', arg):
                    if re.search(r"(^|\s)[a-z_]+=", s):
                        problems.append(f"{where}: a field inside a value: {s!r}")
    assert checked > 100, checked
    assert not problems, "\n".join(problems)


def test_the_rule_catches_what_broke_parsing():
    """The check above finds the shapes issue 28 found in the tree."""
    assert format_problems('reason="%s"')
    assert format_problems("client=%s: closing")
    assert format_problems("%s:%d: %u refused (max_connections=%u)")
    assert not format_problems("client=%s packet_id=%u closing, so the client sends it again")


# ---- What clients send cannot break a line ----

ODD_ID = 'id with "quotes" and=equals\\'


def connect_as(port, client_id, **kw):
    c = mqtt.Client(client_id=client_id, **kw)
    c.connect("127.0.0.1", port)
    c.loop_start()
    assert wait_for(c.is_connected, 5)
    return c


def fields(text, event):
    """The fields of each line of event in a logfmt log, as dicts."""
    out = []
    for line in text.splitlines():
        if f" event={event} " in line + " ":
            out.append(dict(logcheck.parse_logfmt(line)))
    return out


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_client_values_are_one_value(fmt):
    """A client id with spaces, quotes, '=' and a backslash is one quoted value; every line
    splits (conftest checks each at stop); JSON lines carry the same keys, numbers as
    numbers."""
    broker = Rtd(f"log_format={fmt}")
    try:
        c = connect_as(broker.port, ODD_ID)
        c.disconnect()
        c.loop_stop()
        assert wait_for(lambda: fields(broker.read_log(), "client.disconnected"), 5)
    finally:
        code, log = broker.stop()
    assert code == 0, log[-2000:]
    connected = fields(log, "client.connected")
    assert [f["client"] for f in connected] == [ODD_ID], connected
    if fmt == "json":
        raw = broker.read_raw_log().splitlines()
        line = json.loads(next(x for x in raw if '"client.connected"' in x))
        assert line["client"] == ODD_ID and line["keepalive"] == 60 and line["level"] == "info"
        assert list(line)[:3] == ["ts", "level", "event"]
    else:
        assert 'client="id with \\"quotes\\" and=equals\\\\"' in log


def test_connect_lines_name_the_peer_as_it_sees_itself(tmp_path):
    """A CONNECT reads its peer's address from the socket once for its checks and its lines
    (conn_peer_t): the connected line, a ban by address and a refused login each name the
    client's own address and port, as the client's socket has them."""
    broker = Rtd(f'password_file="{password_file(tmp_path / "pw", {"pu": "right"})}"')
    try:
        assert broker.ctl("banned", "add", "address", "127.0.0.13")[0] == 0
        ok = Raw(broker.port, "peer-ok", version=4, bind="127.0.0.12",
                 username="pu", password="right")
        assert ok.connack_code == 0
        banned = Raw(broker.port, "peer-banned", version=4, bind="127.0.0.13")
        wrong = Raw(broker.port, "peer-wrong", version=4, bind="127.0.0.14",
                    username="pu", password="wrong")
        assert (banned.connack_code, wrong.connack_code) != (0, 0)
        want = {name: "%s:%d" % c.sock.getsockname()[:2]
                for name, c in (("ok", ok), ("banned", banned), ("wrong", wrong))}
        assert wait_for(lambda: fields(broker.read_log(), "client.auth_failed"), 5)
        log = broker.read_log()
        assert [f["peer"] for f in fields(log, "client.connected")] == [want["ok"]]
        assert [f["peer"] for f in fields(log, "client.banned")] == [want["banned"]]
        assert [f["peer"] for f in fields(log, "client.auth_failed")] == [want["wrong"]]
        for c in (ok, banned, wrong):
            c.close()
    finally:
        code, log = broker.stop()
    assert code == 0, log[-2000:]


def test_bad_log_settings_are_refused(tmp_path):
    for o, why in ((f'log_file="{tmp_path}/no/such/dir/rtd.log"', "No such file or directory"),
                   ("log_format=xml", "log_format must be one of: logfmt or json"),
                   ("log_journal=maybe", "log_journal must be one of: auto, on or off")):
        r = subprocess.run([RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"), "-o",
                            f"listeners=127.0.0.1:{free_port()}", "-o",
                            f'data_dir="{tmp_path}"', "-o", o],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and why in r.stderr, (o, r.returncode, r.stderr)


# ---- A log file logrotate can rotate ----

def test_log_file_reopened_on_sighup(tmp_path):
    path = tmp_path / "rtd.log"
    broker = Rtd(f'log_file="{path}"', "log_format=logfmt")
    try:
        assert "event=rtd.started" in path.read_text()
        assert broker.read_raw_log() == ""  # nothing to stderr
        os.rename(path, tmp_path / "rtd.log.1")  # logrotate's move
        broker.proc.send_signal(signal.SIGHUP)  # its postrotate
        # SIGHUP also reloads the password and ACL files: its line is the new file's first.
        assert wait_for(lambda: path.exists() and "event=rtd.reloaded" in path.read_text(), 10)
    finally:
        code, _ = broker.stop()
    assert code == 0
    old, new = (tmp_path / "rtd.log.1").read_text(), path.read_text()
    assert "event=rtd.started" in old and "event=rtd.reloaded" not in old
    assert "event=rtd.started" not in new and "event=rtd.stopped" in new
    assert os.stat(path).st_mode & 0o777 == 0o600
    for text in (old, new):
        assert logcheck.bad_lines(text) == []


# ---- The journal's priorities ----

def start_on(port, stderr_path, env_stream, *options):
    """rtd with stderr to a file and JOURNAL_STREAM as systemd sets it (or not): its exit
    status once it has stopped on SIGTERM or by itself."""
    with open(stderr_path, "wb") as err:
        st = os.fstat(err.fileno())
        env = dict(os.environ)
        env.pop("JOURNAL_STREAM", None)
        if env_stream:
            env["JOURNAL_STREAM"] = env_stream(st)
        data = os.path.join(os.path.dirname(stderr_path), f"data-{port}")
        argv = [RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"), "-o",
                f"listeners=127.0.0.1:{port}", "-o", f'data_dir="{data}"']
        for o in options:
            argv += ["-o", o]
        return subprocess.run(argv, stdout=err, stderr=err, env=env, timeout=30).returncode


def test_journal_priorities(tmp_path):
    """Under systemd (JOURNAL_STREAM names stderr) each line starts with its priority, so
    journalctl -p err shows the errors; anywhere else, no prefix."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        journal = tmp_path / "journal"
        assert start_on(port, str(journal), lambda st: f"{st.st_dev}:{st.st_ino}") == 2
        plain = tmp_path / "plain"
        assert start_on(port, str(plain), lambda st: f"{st.st_dev}:{st.st_ino + 1}") == 2
        forced = tmp_path / "forced"
        assert start_on(port, str(forced), None, "log_journal=on") == 2
    finally:
        taken.close()
    lines = journal.read_text().splitlines()
    assert lines and all(re.match(r"<[3467]>ts=", x) for x in lines), lines
    assert any(x.startswith("<3>") and "event=listener.failed" in x for x in lines), lines
    assert any(x.startswith("<6>") and "event=config.paths" in x for x in lines), lines
    assert logcheck.bad_lines("\n".join(x[3:] for x in lines) + "\n") == []
    assert all(x.startswith("ts=") for x in plain.read_text().splitlines())
    assert forced.read_text().startswith("<")


# ---- ACL denials, failed logins ----

def metric(text, name, **labels):
    """The value of one sample in Prometheus text."""
    want = sorted(labels.items())
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in want):
            return float(m.group(3))
    return None


def test_acl_denials_logged_once_a_second_and_counted(tmp_path):
    """A client publishing where the ACL forbids it, 200 times in a burst: at most a line a
    second (plus the one that tells the rest), the lines' counts add up to every denial, and
    the client, its listener and /metrics count each."""
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite open/#\n")
    broker = Rtd(f'acl_file="{acl}"')
    try:
        c = Raw(broker.port, "greedy")
        started = time.monotonic()
        burst = b""
        for i in range(200):
            body = mqtt_str(f"secret/{i}") + u16(i + 1) + b"\x00" + b"x"
            burst += bytes([PUBLISH << 4 | 2]) + varint(len(body)) + body
        c.sock.sendall(burst)
        acks = [c.expect(PUBACK).body[2] for _ in range(200)]
        assert set(acks) == {0x87}, acks  # not authorized
        assert c.subscribe("secret/#", qos=1).body[-1] == 0x87

        def told():  # every denial, in the lines or their suppressed= counts
            lines = fields(broker.read_log(), "acl.denied")
            return sum(1 + int(x["suppressed"]) if "action" in x else int(x["suppressed"])
                       for x in lines), lines
        # The burst's rest is told by the timer at the end of its second.
        assert wait_for(lambda: told()[0] == 201, 5), told()
        elapsed = time.monotonic() - started
        total, lines = told()
        assert len(lines) <= 2 + elapsed, lines  # one a second, and the timer's
        first = lines[0]
        assert (first["client"], first["action"], first["topic"], first["suppressed"]) == \
            ("greedy", "publish", "secret/0", "0")
        assert first["listener"] == f"127.0.0.1:{broker.port}"
        show = broker.ctl_json("clients", "show", "greedy")
        assert (show["acl_denied_publish"], show["acl_denied_subscribe"]) == (200, 1), show
        code, text, _ = broker.ctl("metrics", "prometheus")
        assert code == 0
        where = f"127.0.0.1:{broker.port}"
        assert metric(text, "rt_listener_acl_denied_total", listener=where,
                      action="publish") == 200
        assert metric(text, "rt_listener_acl_denied_total", listener=where,
                      action="subscribe") == 1
        assert metric(text, "rt_acl_denied_total", action="publish") == 200
        stats = broker.ctl_json("broker", "stats")
        assert stats["acl_denied"]["subscribe"] == 1, stats
        c.disconnect()
    finally:
        code, log = broker.stop()
    assert code == 0, log[-2000:]


def test_failed_logins_by_reason(tmp_path):
    pw = password_file(tmp_path / "pw", {"alice": "right"})
    broker = Rtd(f'password_file="{pw}"', "allow_anonymous=false", "auth_max_delay_ms=0")
    try:
        for user, password, n in (("alice", "wrong", 2), ("mallory", "x", 1), (None, None, 1)):
            for _ in range(n):
                c = Raw(broker.port, "", username=user, password=password)
                assert c.connack_code in (0x86, 0x87), c.connack_code  # bad login, not allowed
                c.close()
        stats = broker.ctl_json("broker", "stats")
        assert stats["auth_failures"] == {"bad_password": 2, "unknown_user": 1,
                                          "anonymous_refused": 1,
                                          "no_certificate_identity": 0, "unavailable": 0}, stats
        code, text, _ = broker.ctl("metrics", "prometheus")
        assert metric(text, "rt_auth_failures_total", reason="bad_password") == 2
        assert metric(text, "rt_auth_failures_total", reason="unknown_user") == 1
        code, text, _ = broker.ctl("broker", "stats")
        assert re.search(r"^auth_failures/bad_password\s+: 2$", text, re.M), text
    finally:
        code, log = broker.stop()
    assert code == 0, log[-2000:]
    failed = fields(log, "client.auth_failed")
    assert sorted(f["reason"] for f in failed) == \
        ["anonymous_refused", "bad_password", "bad_password", "unknown_user"]


# ---- Certificates' expiry ----

def test_certificate_not_after_gauge(pki):
    from certs import cert_field
    from test_tls import start, stop_ok
    import email.utils
    broker = start(pki)
    try:
        code, text, _ = broker.ctl("metrics", "prometheus")
        assert code == 0
    finally:
        stop_ok(broker)
    cert = pki.server["ec"][0]
    when = email.utils.parsedate_to_datetime(cert_field(cert, "enddate").replace(" GMT", " +0000"))
    got = metric(text, "rt_tls_certificate_not_after_seconds",
                 listener=f"127.0.0.1:{broker.tls_port}", kind="tls", sni="")
    assert got == when.timestamp(), (got, when, [x for x in text.splitlines() if "not_after" in x])


# ---- Who changed what ----

def test_admin_changes_logged_with_who(tmp_path):
    from test_http import call, start_http
    broker = start_http(tmp_path)
    try:
        code, _, err = broker.ctl("config", "set", "max_connections", "5000")
        assert code == 0, err
        code, _, _ = broker.ctl("config", "set", "schedulers", "3")  # needs a restart: 409
        assert code != 0
        broker.ctl("status")  # looking changes nothing: not logged
        admin = dict(key=broker.admin_key, method="POST")
        assert call(broker, "/api/v1/log", **admin, body={"level": "info"})[0] == 200
        code, _ = call(broker, "/api/v1/clients/kick", key=broker.read_key, method="POST",
                       body={"client_id": "x"})
        assert code == 403
        assert wait_for(lambda: len(fields(broker.read_log(), "admin.change")) == 4, 5)
    finally:
        code, log = broker.stop()
    assert code == 0, log[-2000:]
    changes = fields(log, "admin.change")
    uid = str(os.getuid())
    assert [(c["via"], c.get("uid") or c.get("api_key"), c["command"], c["status"])
            for c in changes] == [
        ("rtctl", uid, "config set max_connections 5000", "200"),
        ("rtctl", uid, "config set schedulers 3", "409"),
        ("http", "ops", "log level info", "200"),
        ("http", "viewer", "clients kick x", "403")], changes
    assert all(int(c["pid"]) > 0 for c in changes if c["via"] == "rtctl")
    assert all(c["peer"].startswith("127.0.0.1:") for c in changes if c["via"] == "http")
