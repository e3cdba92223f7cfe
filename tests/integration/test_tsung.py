"""Tsung 1.7 (Debian `tsung`, the load tool of the ejabberd benchmarks) against rtd: MQTT 3.1
subscribers and QoS 1 publishers. Tsung's MQTT client sends SUBSCRIBE and UNSUBSCRIBE with
fixed-header flags 0000, which rtd tolerates from level-3 clients only (and counts); before it
did, every subscriber was dropped. Every message published must reach every subscriber.

Loopback only and bounded: tests/bench/tsung_util.py runs Tsung, and the whole run has a
timeout.
"""
import datetime
import os
import sys
import time

import pytest

from conftest import ROOT, Rtd

sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
from tsung_util import TSUNG, running, totals  # noqa: E402

SUBSCRIBERS, PUBLISHERS, MESSAGES = 20, 5, 20  # each publisher sends MESSAGES at QoS 1
PUBLISHERS_START_S = 3   # after the subscribers' start (checked below, not assumed)
WAIT_FOR_MESSAGES_S = 8  # how long each subscriber listens after subscribing
RUN_TIMEOUT_S = 120

# Keepalives tell the two kinds apart in rtd's log (client.connected ... keepalive=N).
SUB_KEEPALIVE, PUB_KEEPALIVE = 11, 12


def scenario(port):
    users = "\n".join(['    <user session="sub" start_time="0" unit="second"/>'] * SUBSCRIBERS +
                      [f'    <user session="pub" start_time="{PUBLISHERS_START_S}" '
                       'unit="second"/>'] * PUBLISHERS)
    return f"""<?xml version="1.0"?>
<!DOCTYPE tsung SYSTEM "/usr/share/tsung/tsung-1.0.dtd">
<tsung loglevel="notice" version="1.0">
  <clients><client host="localhost" use_controller_vm="true" maxusers="1000"/></clients>
  <servers><server host="127.0.0.1" port="{port}" type="tcp"/></servers>
  <load duration="{RUN_TIMEOUT_S}" unit="second">
{users}
  </load>
  <sessions>
    <session name="sub" probability="0" type="ts_mqtt">
      <request><mqtt type="connect" clean_start="true" keepalive="{SUB_KEEPALIVE}"/></request>
      <request><mqtt type="subscribe" topic="tsung/news" qos="1"/></request>
      <request><mqtt type="waitForMessages" timeout="{WAIT_FOR_MESSAGES_S}"/></request>
      <request><mqtt type="unsubscribe" topic="tsung/news"/></request>
      <request><mqtt type="disconnect"/></request>
    </session>
    <session name="pub" probability="0" type="ts_mqtt">
      <request><mqtt type="connect" clean_start="true" keepalive="{PUB_KEEPALIVE}"/></request>
      <for from="1" to="{MESSAGES}" incr="1" var="i">
        <request><mqtt type="publish" topic="tsung/news" qos="1">hello</mqtt></request>
      </for>
      <request><mqtt type="disconnect"/></request>
    </session>
  </sessions>
</tsung>
"""


def log_time(line):
    stamp = line.split(" ", 1)[0].removeprefix("ts=").rstrip("Z")
    return datetime.datetime.fromisoformat(stamp).replace(
        tzinfo=datetime.timezone.utc).timestamp()


@pytest.mark.long
def test_tsung_mqtt_subscribers_and_qos1_publishers(tmp_path):
    if TSUNG is None:
        pytest.fail("tsung is missing; run tools/install-deps.sh")
    broker = Rtd()
    try:
        xml = tmp_path / "mqtt.xml"
        xml.write_text(scenario(broker.port))
        before = broker.ctl_json("broker", "metrics")
        with running(xml, str(tmp_path)) as tsung:
            # When every subscriber's subscription was in place, seen from outside (so no
            # earlier than it really was): the publishers must have connected after that.
            deadline = time.time() + RUN_TIMEOUT_S
            all_subscribed = None
            while tsung.poll() is None and time.time() < deadline:
                if all_subscribed is None:
                    subs = broker.ctl_json("broker", "stats")["subscriptions"]["count"]
                    if subs == SUBSCRIBERS:
                        all_subscribed = time.time()
                time.sleep(0.05)
            if tsung.poll() is None:
                tsung.kill()
            out, _ = tsung.communicate(timeout=30)
        assert tsung.returncode == 0, out
        after = broker.ctl_json("broker", "metrics")
    finally:
        code, log = broker.stop()
    assert code == 0, log
    connects = [line for line in log.splitlines() if " event=client.connected " in line]
    subs = [line for line in connects if f"keepalive={SUB_KEEPALIVE}" in line]
    pubs = [line for line in connects if f"keepalive={PUB_KEEPALIVE}" in line]
    assert (len(subs), len(pubs)) == (SUBSCRIBERS, PUBLISHERS), connects
    assert "client.bad_packet" not in log
    assert all_subscribed is not None and all_subscribed < min(map(log_time, pubs)), \
        "the publishers started before every subscriber had subscribed: raise PUBLISHERS_START_S"

    published = PUBLISHERS * MESSAGES
    # What Tsung saw: every PUBLISH acknowledged, every copy received (and acknowledged).
    t = totals(str(tmp_path / "log"), r"mqtt_\w+")
    assert t["mqtt_connected"] == SUBSCRIBERS + PUBLISHERS, t
    assert t["mqtt_published"] == t["mqtt_server_pubacked"] == published, t
    assert t["mqtt_server_published"] == published * SUBSCRIBERS, t
    # What rtd saw: the same messages in and copies out, and one tolerated SUBSCRIBE and
    # UNSUBSCRIBE per subscriber.
    msgs_in = after["messages"]["in"] - before["messages"]["in"]
    msgs_out = after["messages"]["out"] - before["messages"]["out"]
    assert (msgs_in, msgs_out) == (published, published * SUBSCRIBERS)
    tolerated = (after["tolerated"]["v31_subscribe_flags"] -
                 before["tolerated"]["v31_subscribe_flags"])
    assert tolerated == 2 * SUBSCRIBERS
