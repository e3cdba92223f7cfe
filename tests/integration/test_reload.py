"""Hot reload of the rule set through a real rtd (rules/rule_engine.h, rt_rules_reload).

Under load: rtbench publishes QoS 1 at 10,000 msg/s for 30 s into a durable rule (so a PUBACK
means the row is committed) while the rule files are rewritten and reloaded every second,
alternating shapes (the version's field is `v` or `ver`; a second rule into another table comes
and goes). Each file carries its version number into the rows it writes, so the database alone
proves that every message was handled by exactly one version: its row in `msgs` is there once,
with the field its version's shape uses, and it has a row in `extra` exactly when that version
had the extra rule, written by that same version.

Bad reloads (a syntax error, an unknown sink, a runtime error in the dry run, a bad field) are
refused with the file and line while the old set keeps handling messages in its own shape.

Reloads alternate between `rtctl rules reload --json` (its reply checked: {"reloaded": true,
"version": N, "rules": K}, or exit 1 with {"error": "rules not reloaded, the running set is
unchanged: path:line: reason"}) and SIGHUP, whose outcome is read from rtd's log
(`rules.reloaded version=N rules=K ms=T`, `rules.reload_failed ms=T error="path:line: reason"`); both
must do the same, and the log line (with the time rt_rules_reload took) comes with each.
"""
import json
import os
import re
import signal
import socket
import sqlite3
import struct
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pytest

import logcheck

from conftest import BUILD, Rtd, rtctl_built  # noqa: F401 (a fixture)

RTBENCH = os.path.join(BUILD, "tools", "rtbench", "rtbench")

RATE = 10000         # msg/s over all rtbench publishers
SECONDS = 30         # rtbench's run phase, and how long the rule set keeps changing
PUBS = 20            # rtbench publishers (one topic each: rl/<index>)
PROBE_PUB = 100000   # publisher index the PUBACK-latency probe puts in its headers


# ---- rule files ----

def shape(n):
    """Version n's shape: the name of its version field, and whether it has the extra rule."""
    return ("v" if n % 2 == 0 else "ver"), n % 3 == 2


RULE = '''-- version {n}
return {{
    name = "{name}",
    from = "rl/#",
    durable = true,
    sample = {{ topic = "rl/0", payload = string.pack("<I4I4I8", 1, 2, 3) }},
    select = function(msg)
        local p, s = string.unpack("<I4I4", msg.payload)
        return {{ pub = p, seq = s, {field} = {n} }}
    end,
    to = {{ db = {{ table = "{table}" }} }},
}}
'''


def put(path, text):
    """Replaces path in one rename, so a reload never reads half a file (dot files are not
    rules)."""
    d, base = os.path.split(path)
    tmp = os.path.join(d, "." + base + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_version(rules, n):
    field, extra = shape(n)
    put(os.path.join(rules, "main.lua"), RULE.format(n=n, name="main", table="msgs", field=field))
    path = os.path.join(rules, "extra.lua")
    if extra:
        put(path, RULE.format(n=n, name="extra", table="extra", field="v"))
    elif os.path.exists(path):
        os.unlink(path)


def sink(db):
    return 'sinks={db={type="sqlite",file="%s",batch=500,flush_ms=5}}' % db


def start(tmp_path, version=1):
    rules = tmp_path / "rules"
    rules.mkdir()
    write_version(str(rules), version)
    db = str(tmp_path / "out.db")
    rtd = Rtd(f'rules_dir="{rules}"', sink(db), data_dir=str(tmp_path))
    return rtd, str(rules), db


# ---- reloading and reading the outcome ----

RELOADED = re.compile(r"rules\.reloaded version=(\d+) rules=(\d+) ms=([\d.]+)")
FAILED = re.compile(r"rules\.reload_failed ms=([\d.]+) ")


REFUSED = "rules not reloaded, the running set is unchanged: "


class Reloader:
    """Reloads the rule set the way an operator does and reports the outcome: (True, version,
    ms) or (False, "path:line: reason", ms), ms being what rtd logged for rt_rules_reload."""

    def __init__(self, rtd):
        self.rtd = rtd

    def outcomes(self):
        out = []
        for line in self.rtd.read_log().splitlines():
            m = RELOADED.search(line)
            if m:
                out.append((True, int(m.group(1)), float(m.group(3))))
                continue
            m = FAILED.search(line)
            if m:
                out.append((False, dict(logcheck.parse_logfmt(line))["error"], float(m.group(1))))
        return out

    def logged(self, before, timeout=10.0):
        """The one outcome logged after the first `before` ones."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.outcomes()
            if len(got) > before:
                assert len(got) == before + 1, got
                return got[-1]
            time.sleep(0.005)
        raise AssertionError("no reload outcome in the log: " + self.rtd.read_log()[-2000:])

    def sighup(self):
        before = len(self.outcomes())
        self.rtd.proc.send_signal(signal.SIGHUP)
        return self.logged(before)

    def rtctl(self):
        before = len(self.outcomes())
        code, out, err = self.rtd.ctl("rules", "reload", json=True, timeout=30)
        ok, what, ms = self.logged(before)  # logged before the reply is sent
        if code == 0:
            body = json.loads(out)
            assert body["reloaded"] is True and body["rules"] >= 1, body
            assert ok and body["version"] == what, (body, what)
            return True, body["version"], ms
        assert code == 1, (code, out, err)  # rtctl: a 4xx reply
        e = json.loads(err)["error"]
        assert e.startswith(REFUSED), e
        assert not ok and e[len(REFUSED):] == what, (e, what)
        return False, what, ms


def rule_metrics(log):
    """name -> counters from the rule.stopped lines rtd logs at stop."""
    out = {}
    for m in re.finditer(r"rule\.stopped rule=(\S+) ((?:\w+=\d+ ?)+)", log):
        out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out


def query(db, sql):
    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# ---- a QoS 1 publisher that times each PUBACK ----

class Probe(threading.Thread):
    """Publishes one QoS 1 message at a time (rtbench's header, publisher PROBE_PUB) and notes
    (send time, PUBACK latency) of each, to see what a swap does to a publisher's acks."""

    def __init__(self, port, topic="rl/probe", pause=0.002, limit=20000):
        super().__init__(daemon=True)
        self.c = mqtt.Client(client_id="probe", protocol=mqtt.MQTTv311, clean_session=True)
        self.c.connect("127.0.0.1", port, keepalive=30)
        self.c.loop_start()
        self.topic, self.pause, self.limit = topic, pause, limit
        self.samples = []  # (monotonic send time, seconds to PUBACK)
        self.failed = 0
        self.stop_flag = threading.Event()

    def run(self):
        for seq in range(self.limit):
            if self.stop_flag.is_set():
                break
            t0 = time.monotonic()
            info = self.c.publish(self.topic, struct.pack("<IIQ", PROBE_PUB, seq, 0), qos=1)
            info.wait_for_publish(10)
            if not info.is_published():
                self.failed += 1
                break
            self.samples.append((t0, time.monotonic() - t0))
            time.sleep(self.pause)

    def finish(self):
        self.stop_flag.set()
        self.join(15)
        self.c.disconnect()
        self.c.loop_stop()


def publish_some(port, first, n, topic="rl/py"):
    """n QoS 1 messages (publisher 7, seqs first..first+n-1), each PUBACK awaited."""
    c = mqtt.Client(client_id=f"py{first}", protocol=mqtt.MQTTv311, clean_session=True)
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    try:
        infos = [c.publish(topic, struct.pack("<IIQ", 7, first + i, 0), qos=1) for i in range(n)]
        for info in infos:
            info.wait_for_publish(10)
            assert info.is_published()
    finally:
        c.disconnect()
        c.loop_stop()


def rows_by_seq(db, first, n):
    """{seq: (v, ver)} of publisher 7's rows with seq in [first, first + n) (a column no
    version has written yet reads as None)."""
    con = sqlite3.connect(db, timeout=10)
    try:
        cur = con.execute(f"SELECT * FROM msgs WHERE pub = 7 AND seq >= {first} "
                          f"AND seq < {first + n}")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        con.close()
    return {r["seq"]: (r.get("v"), r.get("ver")) for r in rows}


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


# ---- the tests ----

@pytest.mark.long
def test_reload_under_load(tmp_path, rtctl_built):
    """30 s of 10,000 msg/s QoS 1 into a durable rule while the rule set changes every second:
    0 lost, 0 duplicated, each message handled by exactly one installed version, metrics carried
    by name, ~30 reloads and none failed."""
    assert os.access(RTBENCH, os.X_OK), f"{RTBENCH} not built"
    rtd, rules, db = start(tmp_path)
    installed = {1: shape(1)}
    reloads, swaps = [], []  # (version, ms); monotonic time of each SIGHUP
    probe = None
    bench = None
    try:
        probe = Probe(rtd.port)
        per_pub = RATE * SECONDS // PUBS
        bench = subprocess.Popen(
            [RTBENCH, "pub", "-p", str(rtd.port), "-c", str(PUBS), "-t", "rl/%i", "-q", "1",
             "-s", "32", "-L", str(per_pub), "--rate", str(RATE), "-d", str(SECONDS),
             "--inflight", "200", "-V", "4", "-i", "0", "--drain", "10", "--json", "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        probe.start()
        r = Reloader(rtd)
        t_end = time.monotonic() + SECONDS + 60  # a bound on the loop, whatever rtbench does
        n = 1
        next_at = time.monotonic() + 1.0
        while bench.poll() is None and time.monotonic() < t_end and n < SECONDS + 5:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += 1.0
            if bench.poll() is not None:
                break
            n += 1
            write_version(rules, n)
            swaps.append(time.monotonic())
            ok, version, ms = r.rtctl() if n % 2 else r.sighup()
            assert ok, version
            # The engine's version moves on by one per reload: it is the files' number.
            assert version == n, (version, n, r.outcomes())
            installed[n] = shape(n)
            reloads.append((version, ms))
        out, errout = bench.communicate(timeout=60)
        bench = None
        probe.finish()
        live = {m["name"]: m for m in rtd.ctl_json("rules", "metrics")}
    finally:
        if bench is not None:
            bench.kill()
            bench.wait()
        if probe is not None and probe.is_alive():
            probe.finish()
        code, log = rtd.stop()
    assert code == 0, log[-3000:]
    s = json.loads(out)

    # rtbench: every message acknowledged, at the rate asked for.
    assert s["failed"] == 0 and s["lost"] == 0 and s["protocol_errors"] == 0, s
    assert s["sent"] == s["acked"], s
    assert s["sent"] >= 0.95 * RATE * SECONDS, s
    assert probe.failed == 0
    probes = len(probe.samples)

    # Reloads: ~one a second, every one installed, none failed.
    assert len(reloads) >= SECONDS - 3, reloads
    assert "rules.reload_failed" not in log

    # 0 lost, 0 duplicated: each (publisher, seq) once, no gap in any publisher's sequence.
    total = s["sent"] + probes
    assert query(db, "SELECT count(*) FROM msgs")[0][0] == total
    assert query(db, "SELECT count(*) FROM (SELECT DISTINCT pub, seq FROM msgs)")[0][0] == total
    per = query(db, "SELECT pub, count(*), min(seq), max(seq) FROM msgs GROUP BY pub")
    assert sum(c for p, c, *_ in per if p != PROBE_PUB) == s["sent"]
    assert all(lo == 0 and hi == c - 1 for _, c, lo, hi in per), per
    assert {p for p, *_ in per} == set(range(PUBS)) | {PROBE_PUB}

    # Each message handled by exactly one installed version, in that version's shape.
    by_version = dict(query(db, "SELECT coalesce(v, ver), count(*) FROM msgs GROUP BY 1"))
    assert set(by_version) <= set(installed), (sorted(by_version), sorted(installed))
    assert len(by_version) >= SECONDS - 5, by_version  # the swaps happened under traffic
    assert query(db, "SELECT count(*) FROM msgs WHERE (v IS NULL) = (ver IS NULL)")[0][0] == 0
    for n, (field, _) in installed.items():
        other = "ver" if field == "v" else "v"
        assert query(db, f"SELECT count(*) FROM msgs WHERE {other} = {n}")[0][0] == 0, n
    # One client's messages stay in order and the current set only moves forward, so along
    # each publisher's sequence the version never goes back.
    assert query(db, "SELECT count(*) FROM (SELECT coalesce(v, ver) AS n, lag(coalesce(v, ver)) "
                     "OVER (PARTITION BY pub ORDER BY seq) AS prev FROM msgs) "
                     "WHERE n < prev")[0][0] == 0
    extra_versions = [n for n, (_, e) in installed.items() if e]
    want_extra = sum(by_version.get(n, 0) for n in extra_versions)
    assert want_extra > 0
    assert query(db, "SELECT count(*) FROM extra")[0][0] == want_extra
    assert query(db, "SELECT count(*) FROM (SELECT DISTINCT pub, seq FROM extra)")[0][0] == \
        want_extra
    # The extra row of a message was written by the same version as its main row.
    assert query(db, "SELECT count(*) FROM extra e JOIN msgs m USING (pub, seq) "
                     "WHERE coalesce(m.v, m.ver) = e.v")[0][0] == want_extra

    # Metrics carried over by name: main's counts span every version; extra's restart with the
    # run of versions since it last came back (a removed rule's metrics go with it).
    m = rule_metrics(log)
    assert m["main"]["matched"] == m["main"]["passed"] == m["main"]["rows"] == total, m
    assert live["main"]["passed"] == live["main"]["rows_out"] == total, live
    last = max(installed)
    if installed[last][1]:
        run = []
        for n in range(last, 0, -1):
            if not installed[n][1]:
                break
            run.append(n)
        want = sum(by_version.get(n, 0) for n in run)
        assert m["extra"]["passed"] == live["extra"]["passed"] == want, (m["extra"], run)
    else:
        assert "extra" not in m and "extra" not in live
    assert re.search(r"sink\.stopped sink=db in=\d+ written=\d+ spilled=0 dropped=0", log)

    # Figures (pytest -s shows them).
    ms = [x for _, x in reloads]
    lat = [x for _, x in probe.samples]
    near = [x for t, x in probe.samples if any(0 <= t - w < 0.3 for w in swaps)]
    far = [x for t, x in probe.samples if all(not (0 <= t - w < 0.3) for w in swaps)]
    print(f"\nreload under load: {len(reloads)} reloads, rt_rules_reload p50 "
          f"{percentile(ms, 0.5):.1f} ms max {max(ms):.1f} ms; rtbench {s['pub_rate']:.0f} msg/s "
          f"sent {s['sent']} acked {s['acked']}, PUBACK p50 {s['ack']['p50_ms']:.1f} "
          f"p99 {s['ack']['p99_ms']:.1f} max {s['ack']['max_ms']:.1f} ms; probe {probes} PUBACKs p50 "
          f"{percentile(lat, 0.5) * 1e3:.1f} ms p99 {percentile(lat, 0.99) * 1e3:.1f} ms, "
          f"within 300 ms after a swap p99 {percentile(near, 0.99) * 1e3:.1f} ms max "
          f"{max(near, default=0) * 1e3:.1f} ms vs elsewhere p99 "
          f"{percentile(far, 0.99) * 1e3:.1f} ms max {max(far, default=0) * 1e3:.1f} ms; "
          f"{len(by_version)} versions in the rows")


BAD = {
    # kind: (file, text, line, reason fragment)
    "syntax": ("main.lua", '''return {
    name = "main",
    from = "rl/#",
    select = function(msg)
        return { pub = 1 ]
    end,
    to = { db = { table = "msgs" } },
}
''', 5, "expected"),
    "unknown sink": ("other.lua", '''return {
    name = "other",
    from = "rl/#",
    select = function(msg) return { x = 1 } end,
    to = { "nosuchsink" },
}
''', 5, 'to: no sink named "nosuchsink"'),
    "dry run": ("other.lua", '''return {
    name = "other",
    from = "rl/#",
    sample = { topic = "rl/0", payload = "not json" },
    select = function(msg)
        local d = json.decode(msg.payload)
        return { x = d.x }
    end,
    to = { db = { table = "other" } },
}
''', 6, "dry run on its sample message failed: json.decode:"),
    "bad field": ("other.lua", '''return {
    name = "other",
    from = "rl/#",
    select = function(msg) return { x = 1 } end,
    durable = "yes",
    to = { db = { table = "other" } },
}
''', 5, "durable must be true or false"),
}


def test_bad_reloads_keep_the_old_set(tmp_path, rtctl_built):
    """Each bad rule set is refused naming file:line, by rtctl and by SIGHUP alike; the running
    set (version 1, field `ver`) keeps handling messages in its shape and its metrics keep
    counting; good sets then swap in by either way, the version counting on."""
    rtd, rules, db = start(tmp_path)
    r = Reloader(rtd)
    seq = 0
    try:
        publish_some(rtd.port, seq, 20)
        seq += 20
        for kind, (name, text, line, why) in BAD.items():
            write_version(rules, 1)
            path = os.path.join(rules, name)
            put(path, text)
            ok, e, _ = r.rtctl()
            assert not ok, kind
            assert e.startswith(f"{path}:{line}: ") and why in e, (kind, e)
            assert r.sighup() == (False, e, r.outcomes()[-1][2]), kind  # the same refusal
            # The old set runs on: messages flow, in version 1's shape, counted.
            publish_some(rtd.port, seq, 20)
            got = rows_by_seq(db, seq, 20)
            assert got == {s: (None, 1) for s in range(seq, seq + 20)}, (kind, got)
            seq += 20
            main = rtd.ctl_json("rules", "show", "main")
            assert main["version"] == 1 and main["passed"] == seq, (kind, main)
            if name != "main.lua":
                os.unlink(path)
        # Fixed: version 2 (field v) by rtctl, then version 3 (field ver) by SIGHUP.
        for n, how in ((2, r.rtctl), (3, r.sighup)):
            write_version(rules, n)
            ok, version, _ = how()
            assert ok and version == n, (n, version)
            publish_some(rtd.port, seq, 20)
            field_v = shape(n)[0] == "v"
            want = (n, None) if field_v else (None, n)
            assert rows_by_seq(db, seq, 20) == {s: want for s in range(seq, seq + 20)}
            seq += 20
        main = rtd.ctl_json("rules", "show", "main")
        assert main["version"] == 3 and main["passed"] == main["rows_out"] == seq, main
    finally:
        code, log = rtd.stop()
    assert code == 0, log[-3000:]
    assert query(db, "SELECT count(*) FROM msgs")[0][0] == seq
    assert [o[0] for o in Reloader(rtd).outcomes()] == [False] * 2 * len(BAD) + [True] * 2
    # main's counters span the refused reloads and the good ones.
    m = rule_metrics(log)
    assert m["main"]["passed"] == m["main"]["rows"] == seq, m
    assert "other" not in m


def test_disable_survives_reload(tmp_path, rtctl_built):
    """`rtctl rules disable` outlasts a reload that leaves the rule's file saying what it said;
    a file that changes its own `enabled` wins."""
    rtd, rules, db = start(tmp_path)
    r = Reloader(rtd)
    try:
        assert rtd.ctl("rules", "disable", "main")[0] == 0
        write_version(rules, 3)  # new code, same enabled (none: true)
        assert r.rtctl()[:2] == (True, 2)
        main = rtd.ctl_json("rules", "show", "main")
        assert main["state"] == "disabled" and main["state_set_by"] == "rtctl", main
        publish_some(rtd.port, 0, 5, topic="rl/off")  # PUBACKs come: no rule takes them
        assert query(db, "SELECT count(*) FROM sqlite_master WHERE name = 'msgs'")[0][0] == 0
        assert r.sighup()[:2] == (True, 3)
        assert rtd.ctl_json("rules", "show", "main")["state"] == "disabled"
        # The file now says enabled = false, then true: the file's word wins.
        text = open(os.path.join(rules, "main.lua")).read()
        put(os.path.join(rules, "main.lua"), text.replace('durable = true,',
                                                          'durable = true, enabled = false,'))
        assert r.rtctl()[0]
        main = rtd.ctl_json("rules", "show", "main")
        assert main["state"] == "disabled" and main["state_set_by"] == "file", main
        put(os.path.join(rules, "main.lua"), text.replace('durable = true,',
                                                          'durable = true, enabled = true,'))
        assert r.rtctl()[0]
        assert rtd.ctl_json("rules", "show", "main")["state"] == "enabled"
        publish_some(rtd.port, 5, 5)
        assert rows_by_seq(db, 5, 5) == {s: (None, 3) for s in range(5, 10)}
    finally:
        code, log = rtd.stop()
    assert code == 0, log[-3000:]
