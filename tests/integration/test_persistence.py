"""Persistence: retained messages and persistent sessions survive a restart of rtd, a clean
stop and kill -9 alike; what the broker acknowledged is never lost; QoS 2 is never delivered
twice; a state file that is not ours is refused and left untouched.
"""
import os
import sqlite3
import subprocess
import threading
import time

import pytest

from conftest import RTD, ROOT, Rtd, wait_for
from mqtt_raw import (P_SESSION_EXPIRY, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, Raw,
                      prop_u32)

EXPIRY = prop_u32(P_SESSION_EXPIRY, 600)


def restart(broker, crash):
    if crash:
        broker.kill9()
    else:
        code, log = broker.stop()
        assert code == 0, log
    return Rtd(data_dir=broker.data_dir, port=broker.port)


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "kill9"])
def test_retained_and_sessions_survive_restart(crash):
    broker = Rtd()
    try:
        sub = Raw(broker.port, "keep", clean=False, props=EXPIRY)
        sub.subscribe("p/#", 1)
        sub.subscribe("p2/#", 2)
        sub.disconnect()
        broker.wait_offline("keep")
        pub = Raw(broker.port, "p-pub")
        pub.publish("p/r", b"retained", qos=1, retain=True, pid=1)
        for i in range(5):
            pub.publish("p/q", b"%d" % i, qos=1, pid=10 + i)
        pub.publish("p2/x", b"two", qos=2, pid=20)
        pub.disconnect()
        broker = restart(broker, crash)
        back = Raw(broker.port, "keep", clean=False, props=EXPIRY)
        assert back.session_present == 1
        got = back.drain()
        assert [(m["topic"], m["payload"]) for m in got] == \
            [("p/r", b"retained")] + [("p/q", b"%d" % i) for i in range(5)] + [("p2/x", b"two")]
        # The subscription itself came back too: new messages still arrive.
        Raw(broker.port, "p-pub2").publish("p/new", b"after", qos=1)
        assert [m["payload"] for m in back.drain()] == [b"after"]
        back.disconnect()
        fresh = Raw(broker.port, "other")
        fresh.subscribe("p/+", 1)
        assert [(m["topic"], m["payload"], m["retain"]) for m in fresh.drain()] == \
            [("p/r", b"retained", 1)]
        fresh.disconnect()
    finally:
        code, log = broker.stop()
        assert code == 0, log


def test_kill9_under_qos1_load_loses_nothing_acknowledged():
    broker = Rtd()
    sub = Raw(broker.port, "k9", clean=False, props=EXPIRY)
    sub.subscribe("load/#", 1)
    sub.disconnect()
    acked = []
    pub = Raw(broker.port, "k9-pub", version=4)
    stop = threading.Event()

    def produce():
        # One PUBLISH at a time, each acknowledged before the next: acked is exact.
        for i in range(1, 20000):
            if stop.is_set():
                return
            try:
                pub.send((PUBLISH << 4) | 2, b"\x00\x06load/x" + i.to_bytes(2, "big") + b"%d" % i)
                p = pub.read(5)
            except (ConnectionError, OSError):
                return
            if p is None or p.type != PUBACK:
                return
            acked.append(i)

    t = threading.Thread(target=produce)
    t.start()
    deadline = time.time() + 10
    while len(acked) < 300 and time.time() < deadline:
        time.sleep(0.01)
    broker = restart(broker, crash=True)
    stop.set()
    t.join(10)
    assert len(acked) >= 300
    back = Raw(broker.port, "k9", clean=False, props=EXPIRY)
    assert back.session_present == 1
    got = [int(m["payload"]) for m in back.drain(1.0)]
    missing = set(acked) - set(got)
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    assert got == sorted(got)  # in order
    back.disconnect()
    code, log = broker.stop()
    assert code == 0, log


def test_qos2_exactly_once_across_kill9():
    broker = Rtd()
    sub = Raw(broker.port, "x2-sub", clean=False, props=EXPIRY)
    sub.subscribe("x2/t", 2)
    # Inbound: PUBREC came back, then the broker dies before the PUBREL.
    pub = Raw(broker.port, "x2-pub", clean=False, props=EXPIRY)
    pub.send((PUBLISH << 4) | 4, b"\x00\x04x2/t\x00\x07\x00once")
    pub.expect(PUBREC)
    # Outbound: the subscriber got it and sent PUBREC; the broker dies before PUBCOMP.
    m = sub.next_publish()
    assert (m["payload"], m["qos"]) == (b"once", 2)
    sub.ack(PUBREC, m["pid"])
    sub.expect(PUBREL)

    def committed():  # both QoS 2 states are in the state file, as a crash would find them
        db = sqlite3.connect(f"file:{os.path.join(broker.data_dir, 'state.db')}?mode=ro", uri=True)
        try:
            inbound = db.execute("SELECT 1 FROM qos2_in WHERE client_id = 'x2-pub' AND "
                                 "packet_id = 7").fetchone()
            outbound = db.execute("SELECT state FROM msgs WHERE client_id = 'x2-sub'").fetchone()
            return inbound is not None and outbound == (2,)  # RT_QMSG_WAIT_COMP
        except sqlite3.OperationalError:  # locked by a commit in progress: look again
            return False
        finally:
            db.close()

    assert wait_for(committed)
    broker = restart(broker, crash=True)
    pub = Raw(broker.port, "x2-pub", clean=False, props=EXPIRY)
    assert pub.session_present == 1
    # The publisher resends (DUP) as it must; the broker knows the id and does not route it.
    pub.send((PUBLISH << 4) | 8 | 4, b"\x00\x04x2/t\x00\x07\x00once")
    pub.expect(PUBREC)
    pub.ack(PUBREL, 7)
    pub.expect(PUBCOMP)
    sub = Raw(broker.port, "x2-sub", clean=False, props=EXPIRY)
    assert sub.session_present == 1
    rel = sub.expect(PUBREL)  # resumes at PUBREL, never the PUBLISH again
    assert rel.body[:2] == m["pid"].to_bytes(2, "big")
    sub.ack(PUBCOMP, m["pid"])
    assert sub.read(0.5) is None
    sub.disconnect(props=prop_u32(P_SESSION_EXPIRY, 0))
    pub.disconnect(props=prop_u32(P_SESSION_EXPIRY, 0))
    code, log = broker.stop()
    assert code == 0, log


def test_session_expiry_runs_while_the_broker_is_down():
    broker = Rtd()
    short = Raw(broker.port, "brief", clean=False, props=prop_u32(P_SESSION_EXPIRY, 1))
    short.subscribe("b/t", 1)
    short.disconnect()
    broker.wait_offline("brief")  # its expiry counts from here, which the store must know
    code, log = broker.stop()
    assert code == 0, log
    time.sleep(1.5)
    broker = Rtd(data_dir=broker.data_dir, port=broker.port)
    again = Raw(broker.port, "brief", clean=False, props=prop_u32(P_SESSION_EXPIRY, 1))
    assert again.session_present == 0
    again.disconnect()
    code, log = broker.stop()
    assert code == 0, log


def start_fails(data_dir):
    r = subprocess.run([RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"), "-o",
                        "listeners=127.0.0.1:0", "-o", f'data_dir="{data_dir}"'],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode != 0
    return r.stderr + r.stdout


def test_foreign_or_corrupt_state_file_refused_untouched(tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "state.db").write_bytes(b"this is not a database at all" * 100)
    before = (junk / "state.db").read_bytes()
    err = start_fails(junk)
    assert "state.db" in err and "not an SQLite database" in err
    assert (junk / "state.db").read_bytes() == before

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    db = sqlite3.connect(foreign / "state.db")
    db.execute("CREATE TABLE accounts(id INTEGER, balance INTEGER)")
    db.execute("INSERT INTO accounts VALUES (1, 100)")
    db.commit()
    db.close()
    before = (foreign / "state.db").read_bytes()
    err = start_fails(foreign)
    assert "not an rtd state file" in err
    assert (foreign / "state.db").read_bytes() == before
