#!/usr/bin/python3
"""Makes tests/data/state-v1.db, a state.db of schema version 1 as rtd wrote it, and
tests/data/state-v1.json, what it holds, for test_upgrade.py: retained messages, persistent
sessions of MQTT 5 and 3.1.1 with subscriptions (QoS, options, identifiers) and queued QoS 1
and 2 messages, and inbound QoS 2 packet ids awaiting their PUBREL.

It starts the rtd of RT_BUILD_DIR (default build/release) on a fresh data_dir, makes all of
that over MQTT, stops rtd with SIGTERM (the WAL is checkpointed into the file), and copies
the file. Made once, with the rtd of schema version 1; kept as it was made from then on:
    RT_BUILD_DIR=build/release /usr/bin/python3 tests/data/make_state_v1.py
"""
import json
import os
import shutil
import sqlite3
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

from conftest import Rtd  # noqa: E402
from mqtt_raw import P_SESSION_EXPIRY, PUBREC, PUBLISH, Raw, prop_u32  # noqa: E402

NEVER = prop_u32(P_SESSION_EXPIRY, 0xFFFFFFFF)
P_SUBSCRIPTION_ID = 0x0B

# Sessions: client id -> (protocol version, [(filter, subscription options byte, sub id)]).
# Options: QoS in bits 0-1, no local 2, retain as published 3, retain handling 4-5.
SESSIONS = {
    "v1-five": (5, [("a/#", 1, 0), ("b/+", 2 | 0x08, 7)]),
    "v1-three": (4, [("c/#", 1, 0)]),
    "v1-options": (5, [("e/#", 1 | 0x04 | 0x20, 0)]),
    "v1-qos2": (5, [("d/1", 2, 0)]),
}
RETAINED = [("r/plain", b"hello", 1), ("r/binary", bytes(range(0, 256, 7)), 2),
            ("r/deep/er/topic", b"x" * 300, 0), ("r/utf8", "grüß".encode(), 1)]
QUEUED = [("a/x", b"a1", 1), ("b/y", b"b1", 2), ("a/x/y", b"a2", 1), ("c/1", b"c1", 1),
          ("c/2", b"c2", 2), ("d/1", b"d1", 2), ("b/z", b"b2", 1), ("e/f", b"e1", 1),
          ("c/3", b"c3", 1)]
QOS2_IN = {"v1-qos2": [7, 9]}


def subscribe(c, flt, options, sub_id, version):
    props = b""
    if sub_id:
        props = bytes([P_SUBSCRIPTION_ID, sub_id])
    body = b"\x00\x01"
    if version == 5:
        body += bytes([len(props)]) + props
    body += len(flt).to_bytes(2, "big") + flt.encode() + bytes([options])
    c.send((8 << 4) | 2, body)
    ack = c.read()
    assert ack is not None and ack.type == 9 and ack.body[-1] < 0x80, ack


def matches(flt, topic):
    """MQTT's filter match, for the filters above."""
    f, t = flt.split("/"), topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


def main():
    data = tempfile.mkdtemp(prefix="state-v1-")
    broker = Rtd("persistence=true", "max_session_expiry=4294967295",
                 'rules_dir="' + tempfile.mkdtemp(prefix="norules-") + '"', data_dir=data)
    expect = {"retained": {}, "sessions": {}}
    try:
        for cid, (version, subs) in SESSIONS.items():
            c = Raw(broker.port, cid, version=version, clean=False,
                    props=NEVER if version == 5 else b"")
            for flt, options, sub_id in subs:
                subscribe(c, flt, options, sub_id, version)
            for pid in QOS2_IN.get(cid, []):
                # Sent, PUBREC read, PUBREL never sent: the id waits in the session.
                c.send((PUBLISH << 4) | 4, len("q2").to_bytes(2, "big") + b"q2" +
                       pid.to_bytes(2, "big") + b"\x00" + b"held %d" % pid)
                c.expect(PUBREC)
            c.disconnect()
            broker.wait_offline(cid)
            expect["sessions"][cid] = {
                "version": version,
                "subscriptions": [{"filter": f, "options": o, "sub_id": s} for f, o, s in subs],
                "queued": [], "qos2_in": QOS2_IN.get(cid, [])}
        pub = Raw(broker.port, "v1-publisher")
        for i, (topic, payload, qos) in enumerate(RETAINED):
            pub.publish(topic, payload, qos=qos, pid=100 + i, retain=True)
            expect["retained"][topic] = {"payload": payload.hex(), "qos": qos}
        for i, (topic, payload, qos) in enumerate(QUEUED):
            pub.publish(topic, payload, qos=qos, pid=200 + i)
        pub.disconnect()
        # Who gets what: the session's matching filter with the highest QoS.
        for cid, (_, subs) in SESSIONS.items():
            for topic, payload, qos in QUEUED:
                best = [o & 3 for f, o, _ in subs if matches(f, topic)]
                if best:
                    expect["sessions"][cid]["queued"].append(
                        {"topic": topic, "payload": payload.hex(), "qos": min(qos, max(best)),
                         "sub_ids": [i for f, _, i in subs if i and matches(f, topic)]})
    finally:
        code, log = broker.stop()
        assert code == 0, log
    db = sqlite3.connect(os.path.join(data, "state.db"))
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    stored = db.execute("SELECT client_id, count(*) FROM msgs GROUP BY client_id").fetchall()
    db.close()
    assert {c: n for c, n in stored} == \
        {c: len(s["queued"]) for c, s in expect["sessions"].items() if s["queued"]}, stored
    shutil.copyfile(os.path.join(data, "state.db"), os.path.join(HERE, "state-v1.db"))
    with open(os.path.join(HERE, "state-v1.json"), "w") as f:
        json.dump(expect, f, indent=1, sort_keys=True)
        f.write("\n")
    shutil.rmtree(data)
    print("wrote", os.path.join(HERE, "state-v1.db"), "and state-v1.json")


if __name__ == "__main__":
    main()
