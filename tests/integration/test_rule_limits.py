"""What a rule may cost the broker, through a real rtd (issue 27, 6b and 6c): a dry run of a
rule (`rules test`) is for the admin role alone and runs beside the other admin commands, not
in front of them; a publisher that never reads its PUBACKs cannot queue more than a bounded
number of messages at its rule worker, and the other publishers' rules go on. The rule
engine's own limits (the deadline, charged C loops) are tested in tests/unit/test_rule_limits.c.
"""
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import paho.mqtt.client as mqtt
import pytest

import mqtt_raw
from conftest import Rtd, free_port, wait_for
from test_http import call, make_key

# A rule that spins until the wall-clock limit ends it when the payload says so; any other
# message (the load-time dry run's made-up one) passes at once.
SPIN_RULE = """return {
  name = "spin", from = { "spin/#" }, to = { "db" },
  select = function(msg)
    if msg.payload == "spin" then while true do end end
    return { topic = msg.topic }
  end,
}
"""
SPIN_MS = 3000  # rule_call_ms here: how long a spinning `rules test` holds its worker


def start_spin(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "spin.lua").write_text(SPIN_RULE)
    keys = tmp_path / "api_keys"
    admin, reader = make_key(keys, "ops", "admin"), make_key(keys, "viewer", "read")
    hport = free_port()
    broker = Rtd(f'rules_dir="{rules}"',
                 f'sinks={{db={{type="sqlite",file="{tmp_path}/rows.db"}}}}',
                 f"rule_call_ms={SPIN_MS}", "rule_instructions=1000000000",
                 f'http={{bind="127.0.0.1:{hport}", api_keys_file="{keys}"}}',
                 data_dir=str(tmp_path))
    broker.hport, broker.admin_key, broker.read_key = hport, admin, reader
    return broker


def test_rules_test_needs_the_admin_role(tmp_path):
    """`rules test` runs a payload of the caller's through the rules for up to rule_call_ms: a
    read key gets 403 whatever the method or the path (the stream endpoint included); an admin
    key may GET it (it changes nothing) or POST it."""
    rtd = start_spin(tmp_path)
    try:
        path = "/api/v1/rules/test/spin?topic=spin/1&payload=x"
        for method in ("GET", "POST"):
            code, body = call(rtd, path, key=rtd.read_key, method=method)
            assert code == 403 and "admin role" in body["error"], (method, code, body)
        code, body = call(rtd, "/api/v1/rules/test", key=rtd.read_key, method="POST",
                          body={"name": "spin", "topic": "spin/1", "payload": "x"})
        assert code == 403 and "runs rules on a payload" in body["error"], body
        code, body = call(rtd, "/api/v1/stream/rules/test/spin?topic=spin/1&payload=x&every=1",
                          key=rtd.read_key)
        assert code == 403, (code, body)
        for method in ("GET", "POST"):
            code, body = call(rtd, path, key=rtd.admin_key, method=method)
            assert code == 200 and body["rows"] == [{"topic": "spin/1"}], (method, code, body)
    finally:
        code, log = rtd.stop()
        assert code == 0, log[-3000:]


def admin_workers(rtd):
    """The pids of the admin group's workers (every child but the listener)."""
    def walk(node):
        yield node
        for c in node.get("children", []):
            yield from walk(c)
    tree = rtd.ctl_json("tree")
    roots = tree if isinstance(tree, list) else [tree]
    for root in roots:
        for n in walk(root):
            if n.get("name") == "admin_sup":
                return [c["pid"] for c in n["children"] if c["name"] != "admin" and c["pid"]]
    raise AssertionError(tree)


def test_metrics_do_not_wait_behind_a_rule_test(tmp_path):
    """A `rules test` whose rule spins holds the worker running it for rule_call_ms; a /metrics
    scrape sent meanwhile is answered before it ends. Before, both ran on the one admin worker
    and the scrape waited the whole run (9 s in the review)."""
    rtd = start_spin(tmp_path)
    try:
        workers = admin_workers(rtd)
        done = {}

        def spin():
            done["result"] = rtd.ctl("rules", "test", "spin", "--topic", "spin/1",
                                     "--payload", "spin")
            done["at"] = time.monotonic()

        t = threading.Thread(target=spin)
        t.start()
        # The barrier: a worker is handling the job (`actors info` answers on the connection,
        # not on a worker, so it is not queued behind the run).
        def running():
            for pid in workers:
                code, out, _ = rtd.ctl("actors", "info", pid, json=True)
                if code == 0 and json.loads(out)["handler"] == "job":
                    return True
            return False
        assert wait_for(running, SPIN_MS / 1000), "no admin worker ran the rule test"
        req = urllib.request.Request(f"http://127.0.0.1:{rtd.hport}/metrics",
                                     headers={"Authorization": f"Bearer {rtd.read_key}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and "rt_connections" in r.read().decode()
        scraped = time.monotonic()
        t.join(SPIN_MS / 1000 + 30)
        assert not t.is_alive()
        code, out, err = done["result"]
        # Whichever limit ends the spin first: on a quick core 1e9 instructions (the most
        # rule_instructions may be) run out before rule_call_ms does.
        ended = (f"time limit of {SPIN_MS} ms exceeded",
                 "instruction budget of 1000000000 exceeded")
        assert code != 0 and any(e in out + err for e in ended), (code, out, err)
        assert scraped < done["at"], "the scrape was answered after the rule test"
    finally:
        code, log = rtd.stop()
        assert code == 0, log[-3000:]


# ---- 6c: a publisher that never reads its PUBACKs ----

FLOOD_RULE = """return {
  name = "flood", from = { "flood/#" }, to = { "gdb" }, durable = %s,
  select = function(msg) local d = json.decode(msg.payload) return nil end,
}
"""
GOOD_RULE = """return {
  name = "good", from = { "good/#" }, to = { "gdb" },
  select = function(msg) return { topic = msg.topic, n = msg.payload } end,
}
"""
# What a rule worker's mailbox may hold (README, "Design notes"; rt.h): overload is a mailbox
# past 1,000 messages, looked at every 64 sends, and each publisher feeding the worker is muted
# at the end of the socket event that sent past it, which routes at most RT_CONN_ROUTE_BUDGET
# (8,192) messages. Two publishers here.
MAILBOX_BOUND = 1000 + 64 + 2 * 8192
FLOOD_MORE = 1_000_000  # PUBLISHes sent once rtd's output to the flooder must be stuck
FLOOD_MAX_S = 30  # and the flood's bound in time
PUBACK = 4  # bytes of a v3.1.1 PUBACK
HIGH_WATER = 64 * 1024  # RT_SOCK_HIGH_WATER: unsent bytes past which a socket's owner is under
                        # pressure


def publish_packets(topic, n, first_pid):
    out = bytearray()
    t = mqtt_raw.mqtt_str(topic)
    for i in range(n):
        body = t + mqtt_raw.u16((first_pid + i) % 65535 + 1) + b'{"v":1}'
        out += bytes([mqtt_raw.PUBLISH << 4 | 2]) + mqtt_raw.varint(len(body)) + body
    return bytes(out)


def tree_pid(rtd, name):
    def walk(node):
        yield node
        for c in node.get("children", []):
            yield from walk(c)
    tree = rtd.ctl_json("tree")
    for root in (tree if isinstance(tree, list) else [tree]):
        for n in walk(root):
            if n.get("name") == name:
                return n["pid"]
    raise AssertionError(tree)


@pytest.mark.long
@pytest.mark.parametrize("durable", [False, True])
def test_publisher_that_never_reads_cannot_flood_its_rule_worker(tmp_path, durable):
    """A QoS 1 publisher that never reads its socket (so no PUBACK): once rtd's output to it is
    stuck it is under socket pressure, and was then never muted; its rule worker's mailbox
    reached millions of messages. Now the worker's overload mutes it like any publisher: the
    mailbox stays under MAILBOX_BOUND and a second publisher's rule rows still arrive. With a
    durable rule the worker answers the flooder for each message: it sends those answers
    unmuted, as waiting for that publisher (the runtime parks whoever sends to an actor under
    pressure) would stall every rule on the worker until its client read."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "flood.lua").write_text(FLOOD_RULE % ("true" if durable else "false"))
    (rules / "good.lua").write_text(GOOD_RULE)
    db = tmp_path / "good.db"
    rtd = Rtd(f'rules_dir="{rules}"', f'sinks={{gdb={{type="sqlite",file="{db}"}}}}',
              "rule_workers=1", data_dir=str(tmp_path))
    flooder = None
    try:
        worker = tree_pid(rtd, "rule_worker:0")
        flooder = socket.socket()
        # A small receive window: rtd's PUBACKs back up into its own output buffer soon.
        flooder.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        flooder.connect(("127.0.0.1", rtd.port))
        # Its PUBACKs fill its receive buffer, then rtd's send buffer (at most tcp_wmem's
        # largest), then rtd's own past the mark: by then its connection is under pressure.
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            wmem_max = int(f.read().split()[2])
        pressured_after = (flooder.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) + wmem_max +
                           HIGH_WATER) // PUBACK
        flood_max = pressured_after + FLOOD_MORE
        flooder.sendall(bytes([mqtt_raw.CONNECT << 4]) + mqtt_raw.varint(14) +
                        mqtt_raw.mqtt_str("MQTT") + bytes([4, 2]) + mqtt_raw.u16(60) +
                        mqtt_raw.mqtt_str("fl"))
        chunk = publish_packets("flood/1", 20000, 0)
        state = {"sent": 0, "stop": False, "peak": 0}

        def flood():
            flooder.settimeout(0.2)
            end = time.monotonic() + FLOOD_MAX_S
            view, off = memoryview(chunk), 0
            while (not state["stop"] and state["sent"] < flood_max
                   and time.monotonic() < end):
                try:
                    off += flooder.send(view[off:])
                except socket.timeout:
                    continue  # rtd stopped reading it (muted): that is the point
                except OSError:
                    return
                if off == len(chunk):
                    state["sent"] += 20000
                    off = 0

        t = threading.Thread(target=flood)
        t.start()
        # The well-behaved publisher: its rows must arrive while the flood goes on.
        good = mqtt.Client(client_id="good", protocol=mqtt.MQTTv311)
        good.connect("127.0.0.1", rtd.port)
        good.loop_start()
        samples, good_rows = 0, None
        deadline = time.monotonic() + FLOOD_MAX_S
        while t.is_alive() and time.monotonic() < deadline:
            code, out, _ = rtd.ctl("actors", "info", worker, json=True)
            assert code == 0, out
            state["peak"] = max(state["peak"], json.loads(out)["mailbox"])
            samples += 1
            if samples == 20:
                for i in range(200):
                    good.publish("good/1", str(i), qos=1)
            if good_rows is None and (sqlite_count(db) or 0) >= 200:
                # And how far the flood was, and that it was still going.
                good_rows = (sqlite_count(db), state["sent"], t.is_alive())
            if state["peak"] > MAILBOX_BOUND:
                break
        state["stop"] = True
        t.join(30)
        good.loop_stop()
        good.disconnect()
        handled = rtd.ctl_json("rules", "metrics", "flood")[0]["matched"]
        print(f"flood: {state['sent']} PUBLISHes sent, {handled} handled by the rule, worker "
              f"mailbox peaked at {state['peak']} ({samples} samples); the good rows (count, "
              f"flood sent then, flooding then): {good_rows}")
        assert state["peak"] <= MAILBOX_BOUND, state
        # rtd acknowledged more than its buffers to the flooder hold: it was under pressure. Or
        # (durable) what it held back under pressure, the worker's answers, passed its budget.
        # Or rtd stopped reading it once its unsent output passed the mark (README, "unsent
        # output"), which comes first whenever the kernel's buffers take less than their most.
        cut = "client.over_budget client=fl " in rtd.read_log()
        code, text, _ = rtd.ctl("metrics", "prometheus")
        holds = [ln for ln in text.splitlines() if ln.startswith("rt_output_holds_total ")]
        held = code == 0 and holds and int(holds[0].split()[1]) >= 1
        assert handled > pressured_after or cut or held, ("never under pressure", pressured_after)
        assert good_rows is not None and good_rows[0] == 200 and good_rows[2], good_rows
    finally:
        if flooder:
            flooder.close()
        code, log = rtd.stop()
        assert code == 0, log[-3000:]


def sqlite_count(db):
    import sqlite3
    try:
        con = sqlite3.connect(str(db), timeout=5)
        try:
            return con.execute("SELECT count(*) FROM messages").fetchone()[0]
        finally:
            con.close()
    except sqlite3.OperationalError:
        return None
