"""The supervision tree: rtd's long-lived actors are restarted when they die, and nothing
acknowledged is lost on the way.

Under a QoS 1 load into a durable rule (an SQLite sink) with a persistent subscriber (so
PUBACKs wait for the store too), each kind of long-lived actor is killed in turn with
`rtctl actors kill`: every message acknowledged with success ends up in the table and at
the subscriber, the broker carries on, and `rtctl tree` shows each restart. Then: a group
that exceeds its restart intensity ends rtd with exit status 3, except $SYS, which is given
up on alone; and the command's errors.
"""
import os
import re
import sqlite3
import struct
import threading
import time

import pytest

from conftest import ROOT, Rtd, wait_for
from mqtt_raw import PUBACK, PUBLISH, Raw, mqtt_str, u16, varint

DURABLE_RULE = (
    'return { name = "durable", from = "d/#", to = { "archive" }, durable = true,\n'
    '  select = function(msg) return { topic = msg.topic, payload = msg.payload } end }\n')
WINDOW = 20           # QoS 1 PUBLISHes each publisher keeps in flight
LOAD_SECONDS = 120    # bound on the load phase, whatever happens
AHEAD = 300           # acknowledgements each publisher gets between two kills
SUB_ID = "sup-subscriber"


def start(tmp_path, *extra):
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "durable.lua").write_text(DURABLE_RULE)
    db = os.path.join(tmp_path, "rt.db")
    sinks = ('sinks={archive={type="sqlite",file="%s",batch=100,flush_ms=10,busy_ms=20,'
             'backoff_ms=20,backoff_max_ms=200}}' % db)
    return Rtd(f"data_dir={tmp_path}", f"rules_dir={rules}", sinks, "persistence=true", *extra), db


def rows(db):
    con = sqlite3.connect(db, timeout=10)
    try:
        return {r[0] for r in con.execute("SELECT payload FROM messages")}
    except sqlite3.OperationalError:
        return set()
    finally:
        con.close()


def ctl_retry(rtd, *args, timeout=20):
    """rtctl ... --json, again while the admin socket is away (its listener restarting)."""
    deadline = time.time() + timeout
    while True:
        try:
            return rtd.ctl_json(*args)
        except AssertionError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


def find(tree, name):
    """The node called name anywhere in `rtctl tree --json`, or None."""
    for node in tree:
        if node["name"] == name:
            return node
        found = find(node.get("children", []), name)
        if found:
            return found
    return None


def child(rtd, name):
    return find(ctl_retry(rtd, "tree"), name)


class Publisher(threading.Thread):
    """QoS 1 PUBLISHes with unique payloads, WINDOW in flight, until told to stop. MQTT 5
    PUBACK reason codes say success or failure; an MQTT 3.1.1 publisher (persistent session)
    is disconnected instead of failed, and sends what was not acknowledged again, as a
    client does (MQTT 4.4)."""

    def __init__(self, port, name, version):
        super().__init__(daemon=True)
        self.port, self.name, self.version = port, name, version
        self.acked, self.failed = set(), set()
        self.reconnects = 0
        self.stop = threading.Event()
        self.error = None

    def connect(self):
        return Raw(self.port, self.name, version=self.version, clean=self.version == 5)

    def send(self, conn, pid, payload, dup=False):
        body = mqtt_str(f"d/{self.name}") + u16(pid)
        if self.version == 5:
            body += varint(0)
        conn.send((PUBLISH << 4) | (1 << 1) | (8 if dup else 0), body + payload.encode())

    def run(self):
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = repr(e)

    def _run(self):
        conn = self.connect()
        inflight, seq, free = {}, 0, list(range(1, WINDOW + 1))
        deadline = time.time() + LOAD_SECONDS
        while (not self.stop.is_set() or inflight) and time.time() < deadline:
            try:
                while free and not self.stop.is_set():
                    pid = free.pop()
                    inflight[pid] = f"{self.name}-{seq}"
                    seq += 1
                    self.send(conn, pid, inflight[pid])
                p = conn.read(timeout=0.5)
            except (ConnectionError, OSError):
                # What was not acknowledged goes again on the new connection, DUP set.
                conn.close()
                conn = self.connect()
                self.reconnects += 1
                assert conn.session_present, "the publisher's session was lost"
                for pid, payload in inflight.items():
                    self.send(conn, pid, payload, dup=True)
                continue
            if p is None or p.type != PUBACK:
                continue
            pid = struct.unpack("!H", p.body[:2])[0]
            reason = p.body[2] if len(p.body) > 2 else 0
            payload = inflight.pop(pid, None)
            if payload is None:
                continue
            (self.acked if reason < 0x80 else self.failed).add(payload)
            free.append(pid)
        conn.close()


class Subscriber(threading.Thread):
    """A persistent session on d/#: its stored copies are part of what a PUBACK waits for."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.conn = Raw(port, SUB_ID, version=4, clean=False)
        self.conn.subscribe("d/#", qos=1)
        self.got = set()
        self.stop = threading.Event()

    def run(self):
        deadline = time.time() + LOAD_SECONDS + 30
        while not self.stop.is_set() and time.time() < deadline:
            try:
                m = self.conn.next_publish(timeout=0.2)
            except (ConnectionError, OSError, AssertionError):
                return
            if m is None:
                continue
            self.got.add(m["payload"].decode())
            if m["qos"] == 1:
                self.conn.ack(PUBACK, m["pid"])


def kill_and_wait_restart(rtd, name, reason=None):
    """Kills child name through rtctl and waits for its next incarnation in the tree."""
    before = child(rtd, name)
    assert before and before["pid"], name
    args = ["actors", "kill", before["pid"]] + ([reason] if reason else [])
    code, out, err = rtd.ctl(*args)
    # Killing the admin listener ends the connection asking, maybe before the answer.
    assert code == 0 or name == "admin", (name, code, out, err)
    # A restart takes milliseconds; the bound covers a loaded machine and the ASan build.
    assert wait_for(lambda: (lambda n: n and n["pid"] and n["pid"] != before["pid"])(
        child(rtd, name)), 20), (name, child(rtd, name))
    after = child(rtd, name)
    assert after["restarts"] == before["restarts"] + 1, (name, before, after)
    assert after["last_exit"]["reason"] == (reason or "killed"), (name, after)
    return after


KILLED = ["sink:archive", "rule_worker:0", "store", "rule_worker:1", "auth_verifier",
          "sys", "admin_worker", "admin"]


def test_kill_each_actor_under_load_loses_nothing_acknowledged(tmp_path):
    rtd, db = start(tmp_path)
    pubs = []
    try:
        listener = f"listener:127.0.0.1:{rtd.port}"
        sub = Subscriber(rtd.port)
        sub.start()
        pubs = [Publisher(rtd.port, "p5", 5), Publisher(rtd.port, "p3", 4)]
        for p in pubs:
            p.start()
        assert wait_for(lambda: all(len(p.acked) >= AHEAD for p in pubs), 30), \
            [(len(p.acked), p.error) for p in pubs]
        for i, name in enumerate(KILLED + [listener]):
            seen = [len(p.acked) for p in pubs]
            kill_and_wait_restart(rtd, name, reason="crash" if i % 2 else None)
            # The load carries on past each restart, long enough to be under way at the next.
            assert wait_for(lambda: all(len(p.acked) >= s + AHEAD for p, s in zip(pubs, seen)),
                            30), \
                (name, [(len(p.acked), len(p.failed), p.reconnects, p.error) for p in pubs])
        for p in pubs:
            p.stop.set()
        for p in pubs:
            p.join(60)
            assert not p.is_alive() and p.error is None, p.error
        acked = set().union(*(p.acked for p in pubs))
        # Every success PUBACK means the row is committed, and the subscriber's copy stored.
        # (A row acknowledged from the sink's spill reaches the table when it is replayed.)
        assert wait_for(lambda: acked <= rows(db), 30), sorted(acked - rows(db))[:10]
        assert wait_for(lambda: acked <= sub.got, 30), sorted(acked - sub.got)[:10]

        # The broker carries on: a new connection publishes, the rule still fires.
        late = Raw(rtd.port, "late", version=5)
        late.publish("d/late", b"after-all-kills", qos=1)
        late.disconnect()
        assert "after-all-kills" in rows(db)

        # The tree shows every restart; the log names each with its reason.
        tree = ctl_retry(rtd, "tree")
        assert tree[0]["name"] == "rtd_sup" and tree[0]["intensity"] == 0
        for name in KILLED + [listener]:
            assert find(tree, name)["restarts"] == 1, (name, find(tree, name))
        log = rtd.read_log()
        for name in KILLED + [listener]:
            assert f"supervisor.restart supervisor=" in log and f"child={name} " in log, name
        code, text, _ = rtd.ctl("tree")
        assert code == 0 and "sink:archive" in text and "crash" in text, text
    finally:
        for p in pubs:
            p.stop.set()
        code, log = rtd.stop()
    assert code == 0, log[-3000:]
    assert 'rtd.stopped msg="clean shutdown"' in log
    # The sink's books balance across its restart: every row taken in was written, none
    # dropped (rows its dead incarnation never took were taken back and submitted again).
    stopped = re.search(r"sink\.stopped sink=archive in=(\d+) written=(\d+) spilled=0 dropped=0",
                        log)
    assert stopped and stopped.group(1) == stopped.group(2), log[-3000:]


def test_past_the_restart_intensity_rtd_stops_with_status_3(tmp_path):
    rtd, _ = start(tmp_path, "restart_intensity=1", "restart_period=60")
    try:
        kill_and_wait_restart(rtd, "auth_verifier")
        verifier = child(rtd, "auth_verifier")
        code, out, err = rtd.ctl("actors", "kill", verifier["pid"])
        # The admin socket may go with the tree before the answer.
        assert code == 0 or "lost connection" in err, (out, err)
        # The second restart within the period is one too many for auth_sup, and rtd_sup
        # allows none: the tree stops in order (each child within its shutdown_ms; nothing
        # here has anything to flush), then rtd.
        rtd.proc.wait(timeout=60)
    finally:
        code, log = rtd.stop()
    assert code == 3, log[-3000:]
    assert ("supervisor.gave_up supervisor=auth_sup child=auth_verifier reason=killed" in log), \
        log[-3000:]
    assert "rtd.failed supervisor=rtd_sup" in log, log[-3000:]


def test_sys_giving_up_leaves_the_broker_running(tmp_path):
    rtd, db = start(tmp_path, "restart_intensity=1", "restart_period=60")
    try:
        kill_and_wait_restart(rtd, "sys")
        code, out, err = rtd.ctl("actors", "kill", child(rtd, "sys")["pid"])
        assert code == 0, (out, err)
        assert wait_for(lambda: "supervisor.gave_up supervisor=sys_sup" in rtd.read_log(), 20)
        assert wait_for(lambda: not (child(rtd, "sys_sup") or {}).get("pid"), 20)
        c = Raw(rtd.port, "still-up", version=5)
        c.publish("d/x", b"still-serving", qos=1)
        c.disconnect()
        assert "still-serving" in rows(db)
        assert rtd.proc.poll() is None
    finally:
        code, log = rtd.stop()
    assert code == 0, log[-3000:]


def test_actors_kill_errors(rtd):
    code, out, err = rtd.ctl("actors", "kill", "<999999.7>")
    assert code == 1 and "no actor <999999.7>" in err, (out, err)
    code, out, err = rtd.ctl("actors", "kill", "nonsense")
    assert code == 1 and "bad pid" in err, (out, err)
    verifier = find(rtd.ctl_json("tree"), "auth_verifier")["pid"]
    code, out, err = rtd.ctl("actors", "kill", verifier, "not a word!")
    assert code == 1 and "bad reason" in err, (out, err)
    code, out, err = rtd.ctl("actors", "kill", "<999999.7>", json=True)
    assert code == 1 and '"error"' in out + err, (out, err)
    # exit/2 with normal ends nothing that does not trap exits.
    body = rtd.ctl_json("actors", "kill", verifier, "normal")
    assert body["reason"] == "normal"
    time.sleep(0.2)
    assert find(rtd.ctl_json("tree"), "auth_verifier")["pid"] == verifier
    code, out, err = rtd.ctl("actors", "kill")
    assert code == 1 and "usage" in err, (out, err)
