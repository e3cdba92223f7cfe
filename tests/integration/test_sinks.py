"""Sinks end to end: MQTT publishes through rtd's rule engine into the SQLite archive sink.

Exact row counts and per-topic order, a durable rule whose PUBACK comes only once the row is
committed, rows spilled while the database is locked by another connection and replayed by
the next rtd after a restart, a bad sinks table refused at start (exit 2), and retention:
what the start log says a sink keeps, and its deletions counted in rtctl and /metrics.
"""
import os
import sqlite3
import subprocess

import paho.mqtt.client as mqtt
import pytest

from conftest import RTD, ROOT, Rtd, wait_for


def sinks_override(db, extra=""):
    return ('sinks={archive={type="sqlite",file="%s",batch=100,flush_ms=10,busy_ms=20,'
            'backoff_ms=20,backoff_max_ms=200%s}}' % (db, extra))


def count(db, table="messages"):
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        finally:
            con.close()
    except sqlite3.OperationalError:
        return -1  # no table yet


def publisher(port):
    c = mqtt.Client(client_id="", protocol=mqtt.MQTTv311, clean_session=True)
    c.max_inflight_messages_set(100)
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    return c


def publish_all(port, n, topics=5):
    c = publisher(port)
    infos = [c.publish(f"s/{i % topics}", f"{i}", qos=1) for i in range(n)]
    for info in infos:
        info.wait_for_publish(10)
        assert info.is_published()
    c.disconnect()
    c.loop_stop()


def start(tmp_path, *extra):
    """rtd with the shipped rules (the archive rule takes every message) and a test sink."""
    return Rtd(f"data_dir={tmp_path}", f"rules_dir={os.path.join(ROOT, 'etc', 'rules')}",
               sinks_override(os.path.join(tmp_path, "rt.db")), *extra)


def test_archive_exact_count_and_order(tmp_path):
    db = os.path.join(tmp_path, "rt.db")
    rtd = start(tmp_path)
    try:
        n = 2000
        publish_all(rtd.port, n)
        assert wait_for(lambda: count(db) == n, 10), count(db)
        con = sqlite3.connect(db)
        rows = con.execute("SELECT topic, payload FROM messages ORDER BY rowid").fetchall()
        con.close()
        assert len(rows) == n and len({p for _, p in rows}) == n
        last = {}
        for topic, payload in rows:
            seq = int(payload)
            assert seq > last.get(topic, -1), (topic, seq)
            last[topic] = seq
    finally:
        code, log = rtd.stop()
    assert code == 0, log
    assert "sink.stopped sink=archive in=2000 written=2000 spilled=0 dropped=0" in log, log


def test_durable_puback_after_commit(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "durable.lua").write_text(
        'return { name = "durable", from = "d/#", to = { "archive" }, durable = true,\n'
        '  select = function(msg) return { topic = msg.topic, payload = msg.payload } end }\n')
    db = os.path.join(tmp_path, "rt.db")
    # A long flush interval: only the commit, not the timer, can explain a quick PUBACK.
    rtd = Rtd(f"data_dir={tmp_path}", f"rules_dir={rules}",
              sinks_override(db).replace("flush_ms=10", "flush_ms=300"))
    try:
        c = publisher(rtd.port)
        for i in range(5):
            info = c.publish("d/x", f"v{i}", qos=1)
            info.wait_for_publish(5)
            assert info.is_published()
            # The PUBACK came: the row must already be in the database.
            assert count(db) == i + 1
        c.disconnect()
        c.loop_stop()
    finally:
        code, log = rtd.stop()
    assert code == 0, log


def test_spill_while_locked_then_replay_after_restart(tmp_path):
    db = os.path.join(tmp_path, "rt.db")
    spill = os.path.join(tmp_path, "spill-archive.db")
    lock = sqlite3.connect(db, isolation_level=None, timeout=5)
    lock.execute("PRAGMA journal_mode=WAL")
    lock.execute("BEGIN EXCLUSIVE")
    n = 500
    rtd = start(tmp_path)
    try:
        publish_all(rtd.port, n)
        assert wait_for(lambda: count(spill, "spill") == n, 10), count(spill, "spill")
    finally:
        code, log = rtd.stop()
    assert code == 0, log
    assert f"spilled={n}" in log, log
    lock.execute("COMMIT")
    lock.close()
    assert count(db) == -1  # nothing reached the database yet
    rtd = start(tmp_path)
    try:
        assert wait_for(lambda: count(db) == n, 10), count(db)
    finally:
        code, log = rtd.stop()
    assert code == 0, log
    assert f"sink.recovered sink=archive rows={n}" in log, log
    assert count(spill, "spill") in (0, -1)


def test_bad_sinks_table_exits_2(tmp_path):
    proc = subprocess.run(
        [RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"), "-o", "listeners=127.0.0.1:1",
         "-o", f"data_dir={tmp_path}", "-o", 'sinks={archive={type="sqlite",tabel="x"}}'],
        capture_output=True, text=True, timeout=10)
    assert proc.returncode == 2, proc.stderr
    assert "sinks.archive: unknown key tabel" in proc.stderr, proc.stderr


def test_retention_keeps_the_newest_and_says_so(tmp_path):
    """The archive with retention = { max_rows = 100 }: the start log says what it keeps,
    the newest rows stay (between 15/16 of 100 and 100: partitions of 7 rows go whole), the
    view reads them in the order they came, and the rest are counted expired in rtctl and
    /metrics."""
    db = os.path.join(tmp_path, "rt.db")
    rtd = Rtd(f"data_dir={tmp_path}", f"rules_dir={os.path.join(ROOT, 'etc', 'rules')}",
              sinks_override(db, ",retention={max_rows=100}"))
    try:
        assert "sink.started sink=archive type=sqlite batch=100 flush_ms=10 " \
               "retention_max_rows=100 retention_max_age_s=0 retention_max_bytes=0" \
               in rtd.read_log()
        publish_all(rtd.port, 500)

        def settled():
            show = rtd.ctl_json("sinks", "show", "archive")
            kept = count(db)
            return show["written"] == 500 and kept <= 100 and show["expired"] + kept == 500
        assert wait_for(settled, 20)
        show = rtd.ctl_json("sinks", "show", "archive")
        expired = show["expired"]
        assert 400 <= expired < 400 + 7
        assert show["retention"] == "rows deleted beyond the newest 100 of a table"
        with sqlite3.connect(db) as con:
            payloads = [int(p) for (p,) in con.execute("SELECT payload FROM messages")]
        assert payloads == list(range(expired, 500)), payloads[:10]
        code, metrics, err = rtd.ctl("metrics", "prometheus")
        assert code == 0, err
        assert f'rt_sink_rows_expired_total{{sink="archive",type="sqlite"}} {expired}' in metrics
    finally:
        code, log = rtd.stop()
        assert code == 0, log
    assert "sink.stopped sink=archive in=500 written=500 spilled=0 dropped=0 " \
           f"expired={expired}" in log
