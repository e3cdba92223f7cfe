"""state.db across rtd versions: a file of schema version 1 (tests/data/state-v1.db, made by
the rtd of that version with tests/data/make_state_v1.py, its content in state-v1.json) opens
with every session (subscriptions and their options, queued messages in order, inbound QoS 2
ids) and every retained message, migrated to the current version (2: the banned list's table,
3: delayed messages') after a copy of it is taken beside it; a file of a newer schema is refused with exit status 2 and left as
it was. The migration's one transaction and a failed step are tested with a step list of the
test's own in tests/unit/test_store_migrate.c.
"""
import glob
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess

from conftest import RTD, ROOT, Rtd
from mqtt_raw import P_SESSION_EXPIRY, PUBCOMP, PUBREL, Raw, prop_u32

DATA = os.path.join(ROOT, "tests", "data")
NEVER = prop_u32(P_SESSION_EXPIRY, 0xFFFFFFFF)
P_SUBSCRIPTION_ID = 0x0B


def version_1_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir(mode=0o700)
    shutil.copyfile(os.path.join(DATA, "state-v1.db"), d / "state.db")
    os.chmod(d / "state.db", 0o600)
    return d


def user_version(path):
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def test_version_1_file_opens_with_every_session_and_retained_message(tmp_path):
    with open(os.path.join(DATA, "state-v1.json")) as f:
        want = json.load(f)
    data = version_1_dir(tmp_path)
    # The sessions were made never to expire: the file is older than any default expiry.
    broker = Rtd("max_session_expiry=4294967295", data_dir=str(data))
    try:
        assert "store.loaded sessions=%d expired=0" % len(want["sessions"]) in broker.read_log()
        assert user_version(data / "state.db") == 3
        copies = glob.glob(str(data / "state.db.v1-*.bak"))
        assert len(copies) == 1 and user_version(copies[0]) == 1, copies
        assert "event=store.migrated" in broker.read_log() and "from=1 to=3" in broker.read_log()
        # The new tables are there and work: a ban and a delayed message kept, and kept across
        # a restart below.
        code, out, err = broker.ctl("banned", "add", "clientid", "after-upgrade")
        assert code == 0, err
        Raw(broker.port, "delayer").publish("$delayed/3600/later", b"d", qos=1)

        fresh = Raw(broker.port, "upgrade-reader")
        fresh.subscribe("r/#", 2)
        got = {m["topic"]: (m["payload"].hex(), m["qos"], m["retain"]) for m in fresh.drain()}
        fresh.disconnect()
        assert got == {t: (r["payload"], r["qos"], 1) for t, r in want["retained"].items()}

        for cid, s in want["sessions"].items():
            subs = broker.ctl_json("subscriptions", "show", cid)
            assert [(x["topic"], x["qos"] | x["no_local"] << 2 |
                     x["retain_as_published"] << 3 | x["retain_handling"] << 4,
                     x["subscription_id"]) for x in subs] == \
                [(x["filter"], x["options"], x["sub_id"]) for x in s["subscriptions"]], cid
            c = Raw(broker.port, cid, version=s["version"], clean=False,
                    props=NEVER if s["version"] == 5 else b"")
            assert c.session_present == 1, cid
            queued = c.receive_all()
            # Subscription identifiers included: a message keeps those of its session's filters.
            assert [(m["topic"], m["payload"].hex(), m["qos"], m["props"].get(P_SUBSCRIPTION_ID, []))
                    for m in queued] == \
                [(q["topic"], q["payload"], q["qos"], q["sub_ids"]) for q in s["queued"]], cid
            # Inbound QoS 2 ids still wait for their PUBREL: each is completed (reason 0,
            # not 0x92 "packet identifier not found", which an id rtd lost would get).
            for pid in s["qos2_in"] + ([11] if s["version"] == 5 else []):
                c.ack(PUBREL, pid)
                comp = c.expect(PUBCOMP)
                reason = comp.body[2] if len(comp.body) > 2 else 0
                assert (pid, reason) == (pid, 0 if pid in s["qos2_in"] else 0x92), cid
            c.disconnect()
    finally:
        code, log = broker.stop()
        assert code == 0, log
    again = Rtd("max_session_expiry=4294967295", data_dir=str(data))
    try:
        assert [b["value"] for b in again.ctl_json("banned", "list")] == ["after-upgrade"]
        assert [d["topic"] for d in again.ctl_json("delayed", "list")] == ["later"]
        assert glob.glob(str(data / "*.bak")) == copies, "a file of the current version: no copy"
    finally:
        code, log = again.stop()
        assert code == 0, log


def test_newer_schema_refused_with_exit_2_and_left_as_it_was(tmp_path):
    data = version_1_dir(tmp_path)
    db = sqlite3.connect(data / "state.db")
    db.execute("PRAGMA user_version = 4")
    db.commit()
    db.close()
    before = hashlib.sha256((data / "state.db").read_bytes()).hexdigest()
    r = subprocess.run([RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"), "-o",
                        "listeners=127.0.0.1:0", "-o", f'data_dir="{data}"'],
                       capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "store.refused" in out and "schema version 4, this rtd reads 3 and older" in out, out
    assert hashlib.sha256((data / "state.db").read_bytes()).hexdigest() == before
    assert glob.glob(str(data / "*.bak")) == []
