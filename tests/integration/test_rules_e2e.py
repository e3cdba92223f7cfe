"""The rule engine end to end through a real rtd: rules from their own rules_dir reshape MQTT
messages and broker events into rows, and the sinks (SQLite, MongoDB through rt_mongo_test,
republish) store or forward them. Broken and hostile rules are isolated or refused.
test_sinks.py covers the archive sink's count, order, spill and replay with the shipped rules.
"""
import json
import os
import signal
import sqlite3
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pytest

import mqtt_raw
from conftest import BUILD, ROOT, Broker, RTD, Rtd, free_port, password_file, wait_for
from mongo_wire import Mongo

MONGO_TEST = os.path.join(BUILD, "tools", "mongotest", "rt_mongo_test")


# ---- helpers ----

def write_rules(tmp_path, **files):
    """A fresh rules_dir holding name.lua = text for each keyword."""
    d = tmp_path / "rules"
    d.mkdir()
    for name, text in files.items():
        (d / f"{name}.lua").write_text(text)
    return str(d)


def sqlite_sink(db, name="db"):
    return ('%s={type="sqlite",file="%s",batch=100,flush_ms=10,backoff_ms=20,'
            'backoff_max_ms=200}' % (name, db))


def start(tmp_path, rules, *sinks, extra=()):
    """rtd with tmp_path as its data_dir (a restart on the same tmp_path finds its state)."""
    return Rtd(f'rules_dir="{rules}"', "sinks={%s}" % ",".join(sinks), *extra,
               data_dir=str(tmp_path))


def stop_ok(rtd):
    code, log = rtd.stop()
    assert code == 0, log
    return log


def query(db, sql):
    """Rows of sql, or None while the table does not exist yet."""
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e) or "no such column" in str(e):
            return None
        raise


def poll_count(db, table, n, timeout=10.0):
    """Waits until table holds exactly n rows; returns the last count seen."""
    got = [None]

    def ok():
        r = query(db, f"SELECT count(*) FROM {table}")
        got[0] = r[0][0] if r else None
        return got[0] == n

    wait_for(ok, timeout)
    return got[0]


def paho_client(port, client_id="", inflight=100):
    c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv311, clean_session=True)
    c.max_inflight_messages_set(inflight)
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    return c


def publish_qos1(c, items):
    """Publishes (topic, payload) pairs at QoS 1 and waits for every PUBACK."""
    infos = [c.publish(t, p, qos=1) for t, p in items]
    for info in infos:
        info.wait_for_publish(30)
        assert info.is_published()


def mosquitto_pub(port, topic, payload, client_id):
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-q", "1",
                    "-i", client_id, "-t", topic, "-m", payload],
                   check=True, timeout=10, capture_output=True)


def now_ms():
    return int(time.time() * 1000)


# ---- 1. filtering and reshaping ----

TEMP_RULE = '''
return {
    name = "temp",
    from = { "sensors/+/temp" },
    sample = { topic = "sensors/s1/temp", payload = '{"t": 5}' },
    select = function(msg)
        local d = json.decode(msg.payload)
        if d.t < 0 then return nil end
        return { device = topic.split(msg.topic)[2], t = d.t, ts = msg.timestamp }
    end,
    to = { db = { table = "temps" } },
}
'''

FOREACH_RULE = '''
return {
    name = "foreach",
    from = "sensors/+/batch",
    sample = { topic = "sensors/s1/batch", payload = '[{"k": "a", "v": 1}]' },
    select = function(msg)
        local rows = {}
        for i, item in ipairs(json.decode(msg.payload)) do
            rows[#rows + 1] = { device = topic.split(msg.topic)[2], idx = i, k = item.k,
                                v = item.v }
        end
        return rows
    end,
    to = { db = { table = "items" } },
}
'''


def test_filter_and_reshape_into_sqlite(tmp_path):
    db = str(tmp_path / "out.db")
    rules = write_rules(tmp_path, temp=TEMP_RULE, foreach=FOREACH_RULE)
    rtd = start(tmp_path, rules, sqlite_sink("out.db"))  # relative: in data_dir
    try:
        t0 = now_ms()
        mosquitto_pub(rtd.port, "sensors/m1/temp", '{"t": 21.5}', "mp1")
        mosquitto_pub(rtd.port, "sensors/m2/temp", '{"t": -3}', "mp2")  # filtered out
        c = paho_client(rtd.port, "p1")
        temps = [("d%d" % i, t) for i, t in enumerate([10, -1, 0, 7.25, -40, 33])]
        publish_qos1(c, [(f"sensors/{d}/temp", json.dumps({"t": t})) for d, t in temps])
        # Not JSON: the rule fails for this message only; an empty array writes no rows.
        publish_qos1(c, [("sensors/bad/temp", "not json"), ("sensors/e/batch", "[]"),
                         ("sensors/b1/batch",
                          json.dumps([{"k": f"k{i}", "v": i * 10} for i in range(1, 6)])),
                         ("sensors/b2/batch", json.dumps([{"k": "only", "v": -1}]))])
        c.disconnect()
        c.loop_stop()
        t1 = now_ms()
        want = sorted([("m1", 21.5)] + [(d, float(t)) for d, t in temps if t >= 0])
        assert poll_count(db, "temps", len(want)) == len(want)
        assert poll_count(db, "items", 6) == 6
        rows = query(db, "SELECT device, t, ts FROM temps ORDER BY device")
        assert [(d, float(t)) for d, t, _ in rows] == want
        assert all(isinstance(ts, int) and t0 - 1000 <= ts <= t1 + 1000 for *_, ts in rows)
        items = query(db, "SELECT device, idx, k, v FROM items ORDER BY device, idx")
        assert items == [("b1", i, f"k{i}", i * 10) for i in range(1, 6)] + [("b2", 1, "only", -1)]
    finally:
        log = stop_ok(rtd)
    assert "sink.stopped sink=db in=11 written=11 spilled=0 dropped=0" in log, log


# ---- 2. broker events ----

EVENTS = ["client.connected", "client.disconnected", "session.subscribed",
          "session.unsubscribed", "message.delivered", "message.acked", "message.dropped"]

EVENT_RULE = '''
return {
    name = "events",
    from = { %s },
    select = function(e)
        return { event = e.event, clientid = e.clientid, topic = e.topic, qos = e.qos,
                 reason = e.reason, reason_code = e.reason_code, proto_ver = e.proto_ver,
                 keepalive = e.keepalive, clean_start = e.clean_start,
                 from_clientid = e.from_clientid, from_username = e.from_username,
                 payload = e.payload, peer = e.peer,
                 username = e.username, retain = e.retain, at = e.timestamp }
    end,
    to = { db = { table = "events" } },
}
''' % ", ".join(f'"{e}"' for e in EVENTS)


def test_every_event_kind_lands_as_a_row(tmp_path):
    db = str(tmp_path / "ev.db")
    pw = password_file(tmp_path / "rtd.pw", {"alice": "a"})  # a user name rules can see
    rtd = start(tmp_path, write_rules(tmp_path, events=EVENT_RULE), sqlite_sink(db),
                extra=(f'password_file="{pw}"',))
    try:
        # The subscriber takes packets of at most 64 bytes: a bigger message is dropped.
        t0 = now_ms()
        sub = mqtt_raw.Raw(rtd.port, "sub1", version=5, keepalive=30, username="alice",
                           password="a",
                           props=mqtt_raw.prop_u32(0x27, 64))
        sub.subscribe("ev/#", qos=1)
        pub = mqtt_raw.Raw(rtd.port, "pub1", version=4, keepalive=20)
        pub.publish("ev/a", b"hello", qos=1)
        p = sub.next_publish()
        assert (p["topic"], p["payload"], p["qos"]) == ("ev/a", b"hello", 1)
        sub.ack(mqtt_raw.PUBACK, p["pid"])
        pub.publish("ev/big", b"x" * 200, qos=0)
        # Dropped before the subscriber moves on: else it may be gone when the message comes.
        wait_for(lambda: query(db, "SELECT 1 FROM events WHERE event = 'message.dropped'"), 10)
        sub.send((mqtt_raw.UNSUBSCRIBE << 4) | 2,
                 mqtt_raw.u16(2) + mqtt_raw.varint(0) + mqtt_raw.mqtt_str("ev/#"))
        sub.expect(mqtt_raw.UNSUBACK)
        sub.disconnect()
        pub.disconnect()
        # DISCONNECT with reason 0x04 (send the will): the rule sees that code.
        mqtt_raw.Raw(rtd.port, "bye", version=5).disconnect(reason=4)
        n = poll_count(db, "events", 11)
        t1 = now_ms()
        assert n == 11, "\n".join(map(str, query(db, "SELECT * FROM events")))
        rows = query(db, "SELECT event, clientid, topic, qos, reason, proto_ver, keepalive, "
                         "clean_start, payload, reason_code, peer, username, retain, at "
                         "FROM events ORDER BY rowid")
    finally:
        stop_ok(rtd)
    by = {}
    for r in rows:
        assert r[10].startswith("127.0.0.1:"), r
        assert r[11] == ("alice" if r[1] == "sub1" else None), r
        assert r[12] == (0 if r[0].startswith("message.") else None), r
        assert t0 <= r[13] <= t1, r
        by.setdefault((r[1], r[0]), []).append(r[:10])
    assert sorted(by) == sorted([("sub1", e) for e in EVENTS] +
                                [(c, e) for c in ("pub1", "bye")
                                 for e in ("client.connected", "client.disconnected")])
    assert all(len(v) == 1 for v in by.values()), by
    one = {k: v[0] for k, v in by.items()}
    N = None
    assert one[("sub1", "client.connected")] == \
        ("client.connected", "sub1", N, N, N, 5, 30, 1, N, N)
    assert one[("pub1", "client.connected")] == \
        ("client.connected", "pub1", N, N, N, 4, 20, 1, N, N)
    assert one[("sub1", "session.subscribed")] == \
        ("session.subscribed", "sub1", "ev/#", 1, N, N, N, N, N, N)
    assert one[("sub1", "session.unsubscribed")] == \
        ("session.unsubscribed", "sub1", "ev/#", N, N, N, N, N, N, N)
    assert one[("sub1", "message.delivered")] == \
        ("message.delivered", "sub1", "ev/a", 1, N, N, N, N, "hello", N)
    assert one[("sub1", "message.acked")] == \
        ("message.acked", "sub1", "ev/a", 1, N, N, N, N, "hello", N)
    assert one[("sub1", "message.dropped")] == \
        ("message.dropped", "sub1", "ev/big", 0, "too_large", N, N, N, "x" * 200, N)
    for who, code in (("sub1", 0), ("pub1", 0), ("bye", 4)):
        assert one[(who, "client.disconnected")] == \
            ("client.disconnected", who, N, N, "normal", N, N, N, N, code)


@pytest.mark.parametrize("kept", [True, False], ids=["session_kept", "clean_start"])
def test_takeover_events_and_peers(tmp_path, kept):
    """A second connection with the same client id (from another address) takes over: the rules
    see the first one disconnect (takeover, 0x8E) and the second connect, each with its own
    peer. With a kept session the same actor goes on with a new socket."""
    db = str(tmp_path / "tk.db")
    rtd = start(tmp_path, write_rules(tmp_path, events=EVENT_RULE), sqlite_sink(db))
    props = mqtt_raw.prop_u32(mqtt_raw.P_SESSION_EXPIRY, 60 if kept else 0)
    try:
        a = mqtt_raw.Raw(rtd.port, "tk", version=5, clean=not kept, props=props)
        b = mqtt_raw.Raw(rtd.port, "tk", version=5, clean=not kept, props=props,
                         bind="127.0.0.2")
        assert b.session_present == (1 if kept else 0)
        a.close()
        b.disconnect(props=mqtt_raw.prop_u32(mqtt_raw.P_SESSION_EXPIRY, 0))
        assert poll_count(db, "events", 4) == 4
        rows = query(db, "SELECT event, reason, reason_code, substr(peer, 1, 10) FROM events "
                         "WHERE clientid = 'tk' ORDER BY rowid")
    finally:
        stop_ok(rtd)
    assert sorted(rows, key=lambda r: (r[3], r[0] != "client.connected")) == [
        ("client.connected", None, None, "127.0.0.1:"),
        ("client.disconnected", "takeover", 0x8E, "127.0.0.1:"),
        ("client.connected", None, None, "127.0.0.2:"),
        ("client.disconnected", "normal", 0, "127.0.0.2:")]


def test_event_from_clientid(tmp_path):
    """message.delivered / acked / dropped name the publisher (from_clientid, from_username),
    which rides with the message outside the PUBLISH: the subscriber sees no trace of it."""
    db = str(tmp_path / "ev.db")
    pw = password_file(tmp_path / "rtd.pw", {"bob": "b"})
    rtd = start(tmp_path, write_rules(tmp_path, events=EVENT_RULE), sqlite_sink(db),
                extra=(f'password_file="{pw}"',))
    try:
        # The subscriber takes packets of at most 64 bytes: a bigger message is dropped.
        sub = mqtt_raw.Raw(rtd.port, "sub1", version=5, props=mqtt_raw.prop_u32(0x27, 64))
        sub.subscribe("ev/#", qos=1)
        pub = mqtt_raw.Raw(rtd.port, "pub1", version=5, username="bob", password="b")
        pub.publish("ev/a", b"hello", qos=1)
        p = sub.next_publish()
        assert (p["payload"], p["props"]) == (b"hello", {}), p
        sub.ack(mqtt_raw.PUBACK, p["pid"])
        pub.publish("ev/big", b"x" * 200, qos=0)
        # Dropped before the subscriber moves on: else it may be gone when the message comes.
        wait_for(lambda: query(db, "SELECT 1 FROM events WHERE event = 'message.dropped'"), 10)
        anon = mqtt_raw.Raw(rtd.port, "anon", version=4)
        anon.publish("ev/b", b"hi", qos=0)
        p = sub.next_publish()
        assert (p["payload"], p["props"]) == (b"hi", {}), p
        pub.disconnect()
        anon.disconnect()
        sub.disconnect()
        assert poll_count(db, "events", 11) == 11
        rows = query(db, "SELECT event, topic, from_clientid, from_username FROM events "
                         "WHERE event LIKE 'message.%' ORDER BY event, topic")
    finally:
        stop_ok(rtd)
    assert rows == [("message.acked", "ev/a", "pub1", "bob"),
                    ("message.delivered", "ev/a", "pub1", "bob"),
                    ("message.delivered", "ev/b", "anon", None),
                    ("message.dropped", "ev/big", "pub1", "bob")], rows


# ---- 3. broken rules are isolated ----

GOOD_RULE = '''
return {
    name = "good",
    from = "load/#",
    select = function(msg) return { n = tonumber(msg.payload), client = msg.clientid } end,
    to = { db = { table = "good" } },
}
'''

# Each misbehaves only on real traffic (payload is a number), so the dry run on a made-up
# message ("{}") passes and the file loads.
BAD_RULES = {
    "err": 'if msg.payload ~= "{}" then error("boom " .. msg.payload) end',
    "loop": 'if msg.payload ~= "{}" then while true do end end',
    "bomb": 'if msg.payload ~= "{}" then local t = {} for i = 1, 1e9 do '
            't[i] = string.rep("x", 4096) .. i end end',
    "patt": 'if msg.payload ~= "{}" then string.find(string.rep("a", 40), '
            'string.rep("a*", 40) .. "b") end',
    # Rows that cannot be stored: a cycle, nesting deeper than any document, a function.
    "cycle": 'if msg.payload ~= "{}" then local t = {} t.me = t return t end',
    "deep": 'if msg.payload ~= "{}" then local t = {} for i = 1, 300 do t = { t } end '
            'return { d = t } end',
    "func": 'if msg.payload ~= "{}" then return { f = print or function() end } end',
    "keys": 'if msg.payload ~= "{}" then return { [true] = 1, [2.5] = 2 } end',
}


def bad_rule(name, body):
    return ('return { name = "%s", from = "load/#", to = { db = { table = "bad" } },\n'
            '  select = function(msg) %s\n return { x = 1 } end }\n' % (name, body))


def test_broken_rules_isolated(tmp_path):
    db = str(tmp_path / "good.db")
    files = {k: bad_rule(k, v) for k, v in BAD_RULES.items()}
    # Files load in name order and a worker runs a message's rules in that order: once the
    # good rule's rows are all written, every bad rule has run on every message.
    rules = write_rules(tmp_path, zz_good=GOOD_RULE, **files)
    # The outcomes follow from instructions and bytes; a loaded box must not turn a memory
    # bomb into a time limit (test_c_loop_rule_is_bounded_in_time tests the clock).
    rtd = start(tmp_path, rules, sqlite_sink(db),
                extra=["rule_memory=8388608", "rule_instructions=200000", "rule_call_ms=60000"])
    try:
        n, clients = 30, 3
        cs = [paho_client(rtd.port, f"c{k}") for k in range(clients)]
        for k, c in enumerate(cs):
            publish_qos1(c, [(f"load/{k}", str(i)) for i in range(n)])
        assert poll_count(db, "good", n * clients, 30) == n * clients
        rows = query(db, "SELECT client, n FROM good ORDER BY rowid")
        for k in range(clients):
            assert [v for c, v in rows if c == f"c{k}"] == list(range(n))
        assert query(db, "SELECT count(*) FROM bad") is None  # no bad row ever written
        assert rtd.proc.poll() is None
        for c in cs:
            c.disconnect()
            c.loop_stop()
        # Still serving: a new client gets its message through.
        c = paho_client(rtd.port, "after")
        publish_qos1(c, [("load/after", "7")])
        assert poll_count(db, "good", n * clients + 1) == n * clients + 1
        c.disconnect()
        c.loop_stop()
    finally:
        log = stop_ok(rtd)
    total = n * clients + 1
    assert f"sink.stopped sink=db in={total} written={total}" in log, log
    kinds = {"err": "exception", "loop": "budget", "bomb": "memory", "patt": "budget",
             "cycle": "exception", "deep": "exception", "func": "exception", "keys": "exception"}
    for name, kind in kinds.items():
        counts = {k: 0 for k in ("exception", "budget", "memory")}
        counts[kind] = total
        line = (f"rule.stopped rule={name} matched={total} passed=0 filtered=0 "
                + " ".join(f"{k}={v}" for k, v in counts.items()) + " rows=0 last_error=")
        assert line in log, log
    assert f"rule.stopped rule=good matched={total} passed={total} " \
        f"filtered=0 exception=0 budget=0 memory=0 rows={total} last_error=\"\"\n" in log, log


# A rule that never returns on real traffic: every call burns its whole instruction budget
# (rule_instructions, 1M by default: a few ms). The dry run ("{}") passes, so it loads.
RUNAWAY_RULE = '''
return {
    name = "runaway",
    from = "slow/#",
    select = function(msg)
        if msg.payload ~= "{}" then while true do end end
        return nil
    end,
    to = { db = { table = "never" } },
}
'''


# Each rule worker loads the rules into a Lua state of its own, so a number drawn as the file
# loads names the worker running it: how a test learns which worker takes a client's
# messages (chosen by a keyed hash of the client id, so different on every run).
WHOAMI_RULE = '''
local worker = math.random(1, 1 << 40)
return {
    name = "whoami",
    from = "whoami/#",
    select = function(msg) return { client = msg.clientid, worker = worker } end,
    to = { db = { table = "whoami" } },
}
'''


def one_client_per_worker(rtd, db, prefix, workers):
    """A client id for each rule worker, found through whoami.lua (which rtd must load)."""
    ids = [f"{prefix}{k}" for k in range(32)]
    for cid in ids:
        c = mqtt_raw.Raw(rtd.port, cid, version=4)
        c.publish("whoami/x", b"?", qos=1)
        c.disconnect()
    assert poll_count(db, "whoami", len(ids)) == len(ids)
    first = {}
    for client, worker in query(db, "SELECT client, worker FROM whoami ORDER BY client"):
        first.setdefault(worker, client)
    assert len(first) == workers, first
    return sorted(first.values())


def test_runaway_rule_does_not_stall_other_clients(tmp_path):
    """A flood through a rule that burns its budget on every message keeps both rule workers
    (rule_workers = 2, as many as schedulers) busy for seconds. A worker ends its turn once it
    has run RT_RULE_TURN_US, so an unrelated client, whose topic no rule takes, still gets its
    PUBACKs on time from whichever scheduler it lives on (a whole 100-message turn of such a
    rule took ~0.5 s, and the PUBACK waited behind it)."""
    db = str(tmp_path / "rw.db")
    rtd = start(tmp_path, write_rules(tmp_path, runaway=RUNAWAY_RULE, whoami=WHOAMI_RULE),
                sqlite_sink(db), extra=["rule_workers=2"])
    per_worker, window = 600, 1.5  # ~600 x 2.5 ms = 1.5 s of Lua per worker, past the window
    lat = []
    try:
        floods = [mqtt_raw.Raw(rtd.port, cid, version=4)
                  for cid in one_client_per_worker(rtd, db, "flood", 2)]
        probe = mqtt_raw.Raw(rtd.port, "probe", version=4)
        for f in floods:
            for i in range(per_worker):
                f.publish(f"slow/{i}", b"%d" % i, qos=0)
        deadline = time.monotonic() + window
        pid = 0
        while time.monotonic() < deadline:
            pid = pid % 65535 + 1
            t = time.monotonic()
            probe.publish("fast/x", b"ping", qos=1, pid=pid)  # waits for the PUBACK (5 s)
            lat.append(time.monotonic() - t)
            time.sleep(0.002)
        total = per_worker * len(floods)
        # The flood outlasted the window: every probe competed with busy workers.
        runaway = rtd.ctl_json("rules", "show", "runaway")
        print(f"runaway rule: {runaway['matched']} of {total} messages run in the window")
        assert runaway["matched"] < total, runaway
        assert wait_for(lambda: rtd.ctl_json("rules", "show", "runaway")["matched"] == total,
                        60), rtd.ctl_json("rules", "show", "runaway")
        for f in floods + [probe]:
            f.disconnect()
    finally:
        stop_ok(rtd)
    lat.sort()
    p99, worst = lat[int(len(lat) * 0.99)], lat[-1]
    print(f"runaway rule: {len(lat)} PUBACKs, median {lat[len(lat) // 2] * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms, max {worst * 1000:.1f} ms")
    assert p99 < 0.2, (p99, worst)
    assert len(lat) >= 50, lat

# A C loop that runs no Lua instruction: each t[i] of table.concat calls table.concat (C)
# through __index. 30 spans of 1e6 took ~5 s in one call before calls were charged to the
# budget; now the call ends after rule_instructions / RT_RULE_CALL_COST calls, or at
# rule_call_ms, whichever comes first, as a budget failure.
C_LOOP_RULE = '''
return {
    name = "cloop",
    from = "hold/#",
    select = function(msg)
        if msg.payload == "{}" then return nil end
        local t = setmetatable({}, { __index = table.concat })
        for k = 1, 30 do table.concat(t, "", 1, 1000000) end
        return { x = 1 }
    end,
    to = { db = { table = "never" } },
}
'''


def test_c_loop_rule_is_bounded_in_time(tmp_path):
    """Both rule workers run the C-loop rule while probes on several connections (so on both
    schedulers) publish at QoS 1. A probe's PUBACK can wait behind at most the rule call in
    progress on each worker sharing its scheduler (a worker ends its turn between calls once
    past rule_turn_us), so the worst wait is 2 x rule_call_ms plus ordinary latency; before,
    one call held its scheduler for seconds and the probe's 5 s wait for its PUBACK ran out.
    Every call is counted as budget."""
    db = str(tmp_path / "cl.db")
    call_ms = 100
    rtd = start(tmp_path, write_rules(tmp_path, cloop=C_LOOP_RULE, whoami=WHOAMI_RULE),
                sqlite_sink(db), extra=["rule_workers=2", f"rule_call_ms={call_ms}"])
    per_worker = 5
    lat = []
    try:
        floods = [mqtt_raw.Raw(rtd.port, cid, version=4)
                  for cid in one_client_per_worker(rtd, db, "hold", 2)]
        probes = [mqtt_raw.Raw(rtd.port, f"probe{k}", version=4) for k in range(6)]
        for f in floods:
            for i in range(per_worker):
                f.publish(f"hold/{i}", b"%d" % i, qos=0)
        total = per_worker * len(floods)
        pid = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for p in probes:
                pid = pid % 65535 + 1
                t = time.monotonic()
                p.publish("fast/x", b"ping", qos=1, pid=pid)  # waits for the PUBACK (5 s)
                lat.append(time.monotonic() - t)
            if rtd.ctl_json("rules", "show", "cloop")["matched"] == total:
                break
            time.sleep(0.002)
        show = rtd.ctl_json("rules", "show", "cloop")
        assert show["matched"] == total, show
        assert show["failed_budget"] == total and show["passed"] == 0, show
        assert "exceeded" in show["last_error"], show
        for f in floods + probes:
            f.disconnect()
    finally:
        stop_ok(rtd)
    assert query(db, "SELECT count(*) FROM never") is None
    worst = max(lat)
    print(f"C-loop rule: {len(lat)} PUBACKs, median {sorted(lat)[len(lat) // 2] * 1000:.1f} ms, "
          f"max {worst * 1000:.1f} ms")
    assert worst < 2 * call_ms / 1000 + 0.5, lat


# One message whose select returns 200,000 references to one 1 KB row: 205 MB of BSON that the
# Lua state never held. It is refused (rule_output_rows) and counted as a memory failure.
WIDE_RULE = '''
return {
    name = "wide",
    from = "wide/#",
    select = function(msg)
        if msg.payload == "{}" then return nil end
        local row, rows = { s = string.rep("x", 1000) }, {}
        for i = 1, tonumber(msg.payload) do rows[i] = row end
        return rows
    end,
    to = { db = { table = "wide" } },
}
'''


def test_rule_output_is_bounded(tmp_path):
    db = str(tmp_path / "wide.db")
    rtd = start(tmp_path, write_rules(tmp_path, wide=WIDE_RULE), sqlite_sink(db),
                extra=["rule_instructions=10000000", "rule_output_rows=1000",
                       "rule_output_bytes=500000"])
    try:
        c = paho_client(rtd.port, "w")
        # Too many rows; then few enough rows but too many bytes; then within both.
        publish_qos1(c, [("wide/a", "200000"), ("wide/b", "1000"), ("wide/c", "3")])
        assert wait_for(lambda: rtd.ctl_json("rules", "show", "wide")["matched"] == 3, 20)
        show = rtd.ctl_json("rules", "show", "wide")
        assert show["failed_memory"] == 2 and show["passed"] == 1, show
        assert "rows larger than rule_output_bytes" in show["last_error"], show
        assert poll_count(db, "wide", 3) == 3
        c.disconnect()
        c.loop_stop()
    finally:
        stop_ok(rtd)


def run_rtd_expect_exit(tmp_path, rules, sinks, timeout=10):
    """Runs rtd that must refuse to start; returns (exit code, stderr)."""
    proc = subprocess.run(
        [RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"),
         "-o", f"listeners=127.0.0.1:{free_port()}",
         "-o", f'data_dir="{tmp_path}"', "-o", f'rules_dir="{rules}"', "-o", "sinks={%s}" % sinks],
        capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stderr


def test_syntax_error_refuses_start_with_file_and_line(tmp_path):
    rules = write_rules(tmp_path, good=GOOD_RULE, broken='return {\n  name = "broken",\n'
                        '  from = "x/#",\n  select = function(msg) return { a = } end,\n'
                        '  to = { "db" },\n}\n')
    code, err = run_rtd_expect_exit(tmp_path, rules, sqlite_sink(str(tmp_path / "x.db")))
    assert code == 2, err
    assert os.path.join(rules, "broken.lua") + ":4:" in err, err


# ---- 4. sandbox escapes ----

def escapes(marker):
    return {
        "io_open": f'io.open("{marker}", "w"):write("x")',
        "os_execute": f'os.execute("touch {marker}")',
        "require": f'require("os").execute("touch {marker}")',
        "load_bytecode": 'load("\\27LuaT\\0\\25\\147\\13\\10\\26\\10")()',
        "load_text": f'load("os.execute(\'touch {marker}\')")()',
        "dump": 'local f = string.dump(function() end)',
        "debug": 'debug.sethook(function() end, "", 1)',
        "rawget_io": f'rawget(_G, "io").open("{marker}", "w")',
        "string_meta": 'getmetatable("").__index.execute = 1',
        "dofile": f'dofile("{marker}")',
        "patch_json": 'json.decode = function() return {} end',
        "patch_string": 'string.rep = nil',
    }


def test_sandbox_escapes_fail_at_run(tmp_path):
    marker = str(tmp_path / "escaped")
    db = str(tmp_path / "sb.db")
    files = {name: ('return { name = "%s", from = "sb/#", to = { db = { table = "bad" } },\n'
                    '  select = function(msg) %s\n return { escaped = "%s" } end }\n'
                    % (name, code, name)) for name, code in escapes(marker).items()}
    rtd = start(tmp_path, write_rules(tmp_path, good=GOOD_RULE.replace("load/#", "sb/#"),
                                      **files), sqlite_sink(db))
    try:
        c = paho_client(rtd.port, "sb")
        publish_qos1(c, [("sb/x", str(i)) for i in range(5)])
        c.disconnect()
        c.loop_stop()
        assert poll_count(db, "good", 5) == 5
        assert query(db, "SELECT escaped FROM bad") is None, query(db, "SELECT escaped FROM bad")
    finally:
        log = stop_ok(rtd)
    assert not os.path.exists(marker)
    for name in files:
        assert f"rule.stopped rule={name} matched=5 passed=0 filtered=0 exception=5 budget=0 " \
            "memory=0 rows=0 last_error=" in log, log


@pytest.mark.parametrize("name", sorted(escapes("m")))
def test_sandbox_escape_at_load_refuses_start(tmp_path, name):
    marker = str(tmp_path / "escaped")
    code_text = escapes(marker)[name]
    text = ('%s\nreturn { name = "%s", from = "x/#", to = { "db" },\n'
            '  select = function(msg) return nil end }\n' % (code_text, name))
    rules = write_rules(tmp_path, **{name: text})
    code, err = run_rtd_expect_exit(tmp_path, rules, sqlite_sink(str(tmp_path / "x.db")))
    assert code == 2, err
    assert os.path.join(rules, f"{name}.lua") + ":1:" in err, err
    assert not os.path.exists(marker)


# ---- 5. MongoDB sink through an outage ----

class MongoServer:
    """rt_mongo_test on a port of its own, with its data in db (kept across restarts)."""

    def __init__(self, db, port=0):
        self.db = db
        self.proc = subprocess.Popen([MONGO_TEST, "--port", str(port), "--db", db],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("listening 127.0.0.1:"), (line, self.proc.stderr.read())
        self.port = int(line.split(":")[1])

    def kill9(self):
        self.proc.kill()
        self.proc.wait(timeout=5)

    stop = Broker.stop  # SIGTERM, then SIGKILL after 5 s: the same as for Mosquitto


MONGO_RULE = '''
return {
    name = "to_mongo",
    from = "m/+/seq",
    sample = { topic = "m/c0/seq", payload = "1" },
    select = function(msg)
        return { client = msg.clientid, seq = tonumber(msg.payload), topic = msg.topic }
    end,
    to = { mongo = { collection = "%s" } },
}
'''


def mongo_count(port, coll):
    try:
        m = Mongo("127.0.0.1", port, timeout=2)
    except OSError:
        return -1
    try:
        return m.count("rtdb", coll)
    except (OSError, ConnectionError):
        return -1
    finally:
        m.close()


@pytest.mark.long
def test_mongo_sink_exactly_once_through_an_outage(tmp_path):
    uri = os.environ.get("RT_TEST_MONGO_URI")
    # The outage is 30 s; RT_TEST_OUTAGE_S shortens it for quick local runs.
    outage = float(os.environ.get("RT_TEST_OUTAGE_S", "30"))
    coll = f"e2e_{os.getpid()}_{int(time.time())}"
    server = None
    if uri:
        hostport = uri.split("//", 1)[1].split("/", 1)[0].split(",")[0]
        host, port = hostport.rsplit(":", 1) if ":" in hostport else (hostport, "27017")
        port = int(port)
    else:
        if not os.access(MONGO_TEST, os.X_OK):
            pytest.fail(f"{MONGO_TEST} is missing; build the tools")
        server = MongoServer(str(tmp_path / "mongo.db"))
        host, port = "127.0.0.1", server.port
        uri = f"mongodb://127.0.0.1:{port}"
    sink = ('mongo={type="mongodb",uri="%s",database="rtdb",collection="other",batch=100,'
            'flush_ms=10,backoff_ms=50,backoff_max_ms=500,timeout_ms=500}' % uri)
    rtd = start(tmp_path, write_rules(tmp_path, mongo=MONGO_RULE % coll), sink)
    clients, per = 4, 500
    half = threading.Barrier(clients + 1, timeout=30)
    resume = threading.Event()
    errors = []

    def publish(k):
        try:
            c = paho_client(rtd.port, f"mc{k}", inflight=20)
            publish_qos1(c, [(f"m/mc{k}/seq", str(i)) for i in range(per // 2)])
            half.wait()
            assert resume.wait(30)
            publish_qos1(c, [(f"m/mc{k}/seq", str(i)) for i in range(per // 2, per)])
            c.disconnect()
            c.loop_stop()
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            half.abort()

    threads = [threading.Thread(target=publish, args=(k,)) for k in range(clients)]
    try:
        for t in threads:
            t.start()
        half.wait()
        if server:
            # Half of every client's messages are acknowledged; the database goes away while
            # the other half is published.
            assert wait_for(lambda: mongo_count(port, coll) > 0, 10)
            server.kill9()
            resume.set()
            down = time.monotonic()
            for t in threads:
                t.join(30)
            time.sleep(max(0.0, outage - (time.monotonic() - down)))  # the outage itself
            assert mongo_count(port, coll) == -1
            server = MongoServer(server.db, port)
        else:
            resume.set()
        for t in threads:
            t.join(30)
        assert not errors, errors
        total = clients * per
        assert wait_for(lambda: mongo_count(port, coll) == total, 30), mongo_count(port, coll)
        m = Mongo(host, port)
        docs = m.find_all("rtdb", coll)
        assert m.command("rtdb", {"drop": coll}).get("ok") == 1
        m.close()
    finally:
        resume.set()
        log = stop_ok(rtd)
        if server:
            server.stop()
    assert len(docs) == total
    for k in range(clients):
        seqs = [d["seq"] for d in docs if d["client"] == f"mc{k}"]
        assert seqs == list(range(per)), (k, seqs[:20])
        assert all(d["topic"] == f"m/mc{k}/seq" for d in docs if d["client"] == f"mc{k}")
    assert f"sink.stopped sink=mongo in={total} written={total} spilled=0 dropped=0" in log, log
    if server:  # the sink saw the outage and came back
        assert "sink.state sink=mongo state=disconnected" in log, log
        assert log.rindex("sink.state sink=mongo state=connected") > \
            log.index("sink.state sink=mongo state=disconnected"), log


# ---- 6. durable acknowledgement across a crash ----

DURABLE_RULE = '''
return {
    name = "durable",
    from = "dur/#",
    durable = true,
    select = function(msg) return { seq = tonumber(msg.payload) } end,
    to = { db = { table = "acked" } },
}
'''


def stopped(pid):
    """Whether every thread of pid has stopped (SIGSTOP): state T in /proc."""
    tasks = os.listdir(f"/proc/{pid}/task")
    for t in tasks:
        with open(f"/proc/{pid}/task/{t}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "T":
                return False
    return bool(tasks)


def test_durable_acks_survive_kill9(tmp_path):
    db = str(tmp_path / "dur.db")
    rules = write_rules(tmp_path, durable=DURABLE_RULE)
    rtd = start(tmp_path, rules, sqlite_sink(db))
    # paho calls on_publish holding its own lock, which publish() takes too: the callback only
    # records the mid (no lock of ours), and mids are mapped to messages afterwards.
    acked_mids = set()
    mids = {}
    c = mqtt.Client(client_id="dur", protocol=mqtt.MQTTv311, clean_session=True)
    c.max_inflight_messages_set(50)
    c.on_publish = lambda _c, _u, mid: acked_mids.add(mid)
    c.connect("127.0.0.1", rtd.port, keepalive=30)
    c.loop_start()
    try:
        for i in range(1000):
            mids[c.publish("dur/x", str(i), qos=1).mid] = i
        # A good part is acknowledged; rtd is frozen before the last 501 are sent, so those
        # (at least) are in flight when it crashes, however fast it acknowledged the rest.
        assert wait_for(lambda: len(acked_mids) >= 500, 20), len(acked_mids)
        rtd.proc.send_signal(signal.SIGSTOP)
        assert wait_for(lambda: stopped(rtd.proc.pid)), "rtd did not stop"
        for i in range(1000, 1501):
            mids[c.publish("dur/x", str(i), qos=1).mid] = i
        rtd.kill9()
        got = {mids[m] for m in set(acked_mids)}
        c.disconnect()  # rtd is gone: ends the reconnect wait, which loop_stop alone sleeps out
        c.loop_stop()
    finally:
        if rtd.proc.poll() is None:
            rtd.kill9()
    assert 500 <= len(got) <= 1000
    rtd = start(tmp_path, rules, sqlite_sink(db))
    try:
        def all_there():
            r = query(db, "SELECT seq FROM acked")
            return r is not None and got <= {s for (s,) in r}
        assert wait_for(all_there, 10), len(got)
        rows = [s for (s,) in query(db, "SELECT seq FROM acked")]
        assert set(rows) <= set(range(1501))
    finally:
        stop_ok(rtd)


# ---- 7. republish ----

REPUBLISH_RULE = '''
return {
    name = "reshape",
    from = "in/+/temp",
    select = function(msg)
        local d = json.decode(msg.payload)
        if d.t < 0 then return nil end
        return { device = topic.split(msg.topic)[2], celsius = d.t, f = d.t * 9 / 5 + 32 }
    end,
    to = { rp = { qos = 1 } },
}
'''

# Every message that passes through the rules lands here. Messages a republish sink
# publishes do not (rt_broker_publish routes them past the rule engine), so a rule cannot
# feed itself: exactly the inputs are seen.
COUNT_ALL_RULE = '''
return {
    name = "all",
    from = "#",
    select = function(msg) return { topic = msg.topic, payload = msg.payload } end,
    to = { db = { table = "seen" } },
}
'''


def test_republish_reshaped_without_loop(tmp_path):
    db = str(tmp_path / "seen.db")
    rules = write_rules(tmp_path, reshape=REPUBLISH_RULE, all=COUNT_ALL_RULE)
    rtd = start(tmp_path, rules, sqlite_sink(db),
                'rp={type="republish",topic="out/${device}"}')
    try:
        sub = mqtt_raw.Raw(rtd.port, "watch", version=4)
        sub.subscribe("#", qos=1)
        c = paho_client(rtd.port, "src")
        readings = [("d1", 20), ("d2", -5), ("d1", 21.5), ("d3", 0), ("d2", 100)]
        publish_qos1(c, [(f"in/{d}/temp", json.dumps({"t": t})) for d, t in readings])
        c.disconnect()
        c.loop_stop()
        kept = [(d, t) for d, t in readings if t >= 0]
        got = []
        deadline = time.time() + 10
        while len(got) < len(readings) + len(kept) and time.time() < deadline:
            p = sub.next_publish(max(0.01, deadline - time.time()))
            if p is None:
                break
            got.append(p)
            if p["qos"]:
                sub.ack(mqtt_raw.PUBACK, p["pid"])
        out = [p for p in got if p["topic"].startswith("out/")]
        assert [(p["topic"], json.loads(p["payload"]), p["qos"]) for p in out] == \
            [(f"out/{d}", {"device": d, "celsius": t, "f": t * 9 / 5 + 32}, 1) for d, t in kept]
        assert len(got) == len(readings) + len(kept)
        assert poll_count(db, "seen", len(readings)) == len(readings)
        assert [t for (t,) in query(db, "SELECT topic FROM seen ORDER BY rowid")] == \
            [f"in/{d}/temp" for d, _ in readings]
        assert sub.read(0.3) is None  # and nothing more came
    finally:
        stop_ok(rtd)


def test_durable_failure_reaches_the_v5_publisher(tmp_path):
    """A durable rule that fails on a message, or a row its sink refuses (over max_bytes),
    gives the MQTT 5 publisher a PUBACK with an error reason rather than a silent success."""
    db = str(tmp_path / "durfail.db")
    rules = write_rules(tmp_path, durable=DURABLE_RULE.replace(
        "select = function(msg)",
        'select = function(msg)\n        if msg.payload == "bad" then error("refused") end\n'
        '        if msg.payload == "big" then return { seq = -1, pad = string.rep("x", 8192) } end'))
    rtd = start(tmp_path, rules, sqlite_sink(db).replace("}", ",max_bytes=4096}"))
    try:
        pub = mqtt_raw.Raw(rtd.port, "v5pub", version=5)
        codes = []
        for pid, payload in enumerate([b"1", b"bad", b"2", b"big", b"3"], start=1):
            pub.send((mqtt_raw.PUBLISH << 4) | 2, mqtt_raw.mqtt_str("dur/x") +
                     mqtt_raw.u16(pid) + mqtt_raw.varint(0) + payload)
            ack = pub.expect(mqtt_raw.PUBACK)
            assert ack.body[:2] == mqtt_raw.u16(pid)
            codes.append(ack.body[2] if len(ack.body) > 2 else 0)
        pub.disconnect()
        # 0x10: no subscriber (still a success); 0x80: unspecified error; 0x97: quota exceeded.
        assert codes == [0x10, 0x80, 0x10, 0x97, 0x10]
        assert query(db, "SELECT seq FROM acked ORDER BY rowid") == [(1,), (2,), (3,)]
    finally:
        stop_ok(rtd)
