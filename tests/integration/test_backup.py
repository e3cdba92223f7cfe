"""rtctl backup DIR: copies of state.db and the sinks' databases taken while rtd works, from
which a new rtd starts (data_dir = DIR) with everything acknowledged before the backup
began: the queued messages of persistent sessions, retained messages, and the rows of a
durable rule (its PUBACK waits for the row's commit, to the database or the spill). And the
command's refusals: a relative or non-empty directory.
"""
import os
import sqlite3
import threading
import time

from conftest import Rtd, wait_for
from mqtt_raw import P_SESSION_EXPIRY, PUBACK, PUBLISH, Raw, prop_u32

EXPIRY = prop_u32(P_SESSION_EXPIRY, 600)
SESSIONS = ["keep-0", "keep-1"]
TOPICS = 10  # load/0 .. load/9, each message retained too
RULE = """return {
    name = "durable_archive",
    from = "load/#",
    select = function(msg) return { topic = msg.topic, seq = tonumber(msg.payload) } end,
    to = { "archive" },
    durable = true,
}
"""


class Load(threading.Thread):
    """QoS 1 retained PUBLISHes 1, 2, 3 ... in windows of 50, until stopped (at most 60 s):
    acked is the highest seq whose PUBACK came (they come in order)."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.c = Raw(port, "loader")
        self.acked = 0
        self.stop = threading.Event()
        self.error = None

    def run(self):
        try:
            seq, deadline = 0, time.time() + 60
            while not self.stop.is_set() and time.time() < deadline:
                window = []
                for _ in range(50):
                    seq += 1
                    pid = seq % 65535 + 1
                    body = len("load/x").to_bytes(2, "big") + b"load/%d" % (seq % TOPICS) + \
                        pid.to_bytes(2, "big") + b"\x00" + b"%d" % seq
                    self.c.send((PUBLISH << 4) | 2 | 1, body)
                    window.append(seq)
                for s in window:
                    self.c.expect(PUBACK, timeout=10)
                    self.acked = s
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.c.close()


def test_backup_under_load_restores_everything_acknowledged_before_it(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir(mode=0o700)
    (rules / "durable.lua").write_text(RULE)
    os.chmod(rules / "durable.lua", 0o600)
    broker = Rtd(f'rules_dir="{rules}"')
    backup = tmp_path / "backup"
    load = None
    try:
        for cid in SESSIONS:
            c = Raw(broker.port, cid, clean=False, props=EXPIRY)
            c.subscribe("load/#", 1)
            c.disconnect()
            broker.wait_offline(cid)
        load = Load(broker.port)
        load.start()
        deadline = time.time() + 30
        while load.acked < 500 and load.error is None:
            assert time.time() < deadline, "the load did not get going"
            time.sleep(0.01)
        before = load.acked  # everything up to here was acknowledged before the backup began
        code, out, err = broker.ctl("backup", str(backup))
        assert code == 0, (out, err)
        # rtd carried on: acknowledgements still come.
        assert wait_for(lambda: load.acked >= before + 200 or load.error, 30), load.acked
        load.stop.set()
        load.join(30)
        assert load.error is None, load.error
    finally:
        if load:
            load.stop.set()
        broker.kill9()  # the backup is all that is left
    assert "state.db" in out and "rt.db" in out, out

    restored = Rtd(f'rules_dir="{rules}"', data_dir=str(backup))
    try:
        for cid in SESSIONS:
            c = Raw(restored.port, cid, clean=False, props=EXPIRY)
            assert c.session_present == 1, cid
            seqs = {int(m["payload"]) for m in c.receive_all()}
            c.disconnect()
            missing = set(range(1, before + 1)) - seqs
            assert not missing, (cid, sorted(missing)[:10], len(missing), before)
        fresh = Raw(restored.port, "reader")
        fresh.subscribe("load/#", 1)
        retained = {m["topic"]: int(m["payload"]) for m in fresh.receive_all()}
        fresh.disconnect()
        for k in range(TOPICS):
            newest_before = max(s for s in range(1, before + 1) if s % TOPICS == k)
            assert retained.get(f"load/{k}", 0) >= newest_before, (k, retained, before)
        # The rows: those in the copy of the database, and those its spill held, replayed.
        assert wait_for(lambda: restored.ctl_json("sinks", "show", "archive")["spilled"] == 0, 30)
    finally:
        code, log = restored.stop()
        assert code == 0, log
    db = sqlite3.connect(backup / "rt.db")
    rows = {s for (s,) in db.execute("SELECT seq FROM messages")}
    db.close()
    missing = set(range(1, before + 1)) - rows
    assert not missing, (sorted(missing)[:10], len(missing), before)


def test_backup_refuses_a_relative_or_used_directory(tmp_path, rtd):
    code, out, err = rtd.ctl("backup", "relative/dir")
    assert code != 0 and "absolute path" in out + err
    used = tmp_path / "used"
    used.mkdir()
    (used / "something").write_text("x")
    code, out, err = rtd.ctl("backup", str(used))
    assert code != 0 and "not empty" in out + err
    assert os.listdir(used) == ["something"]
    # An empty one is taken.
    empty = tmp_path / "empty"
    empty.mkdir()
    body = rtd.ctl_json("backup", str(empty))
    assert {f["file"] for f in body["files"]} >= {"state.db", "rt.db"}
    assert all(os.stat(empty / f["file"]).st_mode & 0o777 == 0o600 for f in body["files"])


def test_backup_is_for_admin_keys_only(tmp_path):
    from test_http import call, start_http
    broker = start_http(tmp_path)
    try:
        target = tmp_path / "by-reader"
        code, body = call(broker, "/api/v1/backup", key=broker.read_key, method="POST",
                          body={"dir": str(target)})
        assert code == 403 and "admin role" in body["error"], (code, body)
        assert not target.exists()
        code, body = call(broker, "/api/v1/backup", key=broker.admin_key, method="POST",
                          body={"dir": str(target)})
        assert code == 200 and os.path.exists(target / "state.db"), (code, body)
    finally:
        code, log = broker.stop()
        assert code == 0, log
