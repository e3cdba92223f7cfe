"""rtbench against a real Mosquitto: exact counts, process aggregation, topic expansion,
loss detection, refused connections and flag errors.

Run: /usr/bin/python3 -m pytest tests/integration/test_rtbench.py
The binary is <RT_BUILD_DIR>/tools/rtbench/rtbench (default build/release).
"""
import json
import os
import struct
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from conftest import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("RT_BUILD_DIR", os.path.join(ROOT, "build", "release"))
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
RTBENCH = os.path.join(BUILD, "tools", "rtbench", "rtbench")


@pytest.fixture(scope="session", autouse=True)
def binary():
    if not os.access(RTBENCH, os.X_OK):
        pytest.fail(f"{RTBENCH} not built; build target rtbench or set RT_BUILD_DIR")


def run(*args, timeout=60, check=True):
    """Runs rtbench with --json and returns (summary dict, completed process)."""
    p = subprocess.run([RTBENCH, *map(str, args), "--json", "--quiet"], capture_output=True,
                       text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout), p
    return None, p


def start(*args):
    return subprocess.Popen([RTBENCH, *map(str, args), "--json", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_ready(*args):
    """Starts rtbench with --go-stdin and returns once its clients are connected (and
    subscribed: a subscriber is ready at its SUBACK); go() lets it run."""
    proc = subprocess.Popen([RTBENCH, *map(str, args), "--go-stdin", "--json", "--quiet"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    if line != "rtbench: ready\n":
        proc.kill()
        raise AssertionError(line + proc.communicate()[1])
    return proc


def go(proc):
    proc.stdin.write("\n")
    proc.stdin.flush()


def finish(proc, timeout=60):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, err
    return json.loads(out)


def assert_exact(s, messages, qos):
    assert s["failed"] == 0 and s["lost"] == 0
    assert s["sent"] == messages
    assert s["expected"] == messages
    assert s["received"] == messages
    assert s["unique"] == messages
    assert s["missing"] == 0
    assert s["duplicates"] == 0
    assert s["out_of_order"] == 0
    assert s["protocol_errors"] == 0
    assert s["acked"] == (messages if qos else 0)
    assert s["e2e"]["count"] == messages
    assert s["ack"]["count"] == (messages if qos else 0)
    assert 0 < s["e2e"]["p50_ms"] <= s["e2e"]["p99_ms"] <= s["e2e"]["max_ms"]


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_pairs_exact_counts(mosquitto, qos, version):
    s, _ = run("pairs", "-p", mosquitto.port, "-c", 5, "-L", 300, "-q", qos, "-V", version,
               "-d", 30)
    assert s["connected"] == 10 and s["subscribed"] == 5
    assert_exact(s, 1500, qos)


def test_mqtt31_exact_counts(mosquitto):
    s, _ = run("pairs", "-p", mosquitto.port, "-c", 3, "-L", 200, "-q", 2, "-V", 3, "-d", 30)
    assert s["mqtt"] == 3
    assert_exact(s, 600, 2)


def test_fanin_fanout_exact_counts(mosquitto):
    s, _ = run("fanin", "-p", mosquitto.port, "-c", 20, "-L", 100, "-q", 1, "-d", 30)
    assert_exact(s, 2000, 1)
    s, _ = run("fanout", "-p", mosquitto.port, "-c", 30, "-L", 40, "-q", 1, "-s", 16, "-d", 30)
    assert s["sent"] == 40 and s["acked"] == 40
    assert s["expected"] == s["received"] == s["unique"] == 1200
    assert s["missing"] == 0 and s["duplicates"] == 0


@pytest.mark.parametrize("qos", [0, 1])
def test_fanin_fanout_procs_exact_counts(mosquitto, qos):
    """--procs splits fanin's publishers and fanout's subscribers; totals stay exact."""
    s, _ = run("fanin", "-p", mosquitto.port, "-c", 20, "-L", 150, "-q", qos, "--procs", 2,
               "-d", 30)
    assert s["procs"] == 2 and s["clients"] == 21 and s["connected"] == 21
    assert s["subscribed"] == 1
    assert_exact(s, 3000, qos)
    s, _ = run("fanout", "-p", mosquitto.port, "-c", 31, "-L", 60, "-q", qos, "--procs", 2,
               "-d", 30)
    assert s["procs"] == 2 and s["clients"] == 32 and s["connected"] == 32
    assert s["subscribed"] == 31
    assert s["sent"] == 60 and s["acked"] == (60 if qos else 0)
    assert s["expected"] == s["received"] == s["unique"] == 60 * 31
    assert s["e2e"]["count"] == 60 * 31 and s["ack"]["count"] == s["acked"]
    assert s["missing"] == 0 and s["duplicates"] == 0 and s["out_of_order"] == 0
    assert s["gaps"] == 0 and s["protocol_errors"] == 0
    # The run ends when the deliveries are complete, not at -d or after --drain.
    assert s["run_seconds"] < 10


def test_procs_aggregation(mosquitto):
    s, _ = run("pairs", "-p", mosquitto.port, "-c", 20, "-L", 100, "-q", 1, "--procs", 4,
               "-d", 30)
    assert s["procs"] == 4 and s["connected"] == 40
    assert_exact(s, 2000, 1)
    s, _ = run("seed", "-p", mosquitto.port, "--subs", 120, "--pubs", 6, "--rate", 600,
               "-L", 50, "--procs", 3, "-d", 30)
    assert s["connected"] == 126 and s["subscribed"] == 120
    assert_exact(s, 300, 0)
    s, _ = run("conn", "-p", mosquitto.port, "-c", 60, "-i", 0, "-d", 0.5, "--procs", 3,
               "--ifaddr", "127.0.0.1,127.0.0.2")
    assert s["clients"] == 60 and s["connected"] == 60 and s["failed"] == 0
    assert s["connack"]["count"] == 60


@pytest.mark.parametrize("qos", [0, 1])
def test_seed_copies(mosquitto, tmp_path, qos):
    """seed --copies K: every topic gets K subscribers, each message K deliveries, counted
    exactly across processes; copy c goes to --sub-ports[c % n]."""
    s, _ = run("seed", "-p", mosquitto.port, "--subs", 60, "--copies", 3, "--pubs", 6,
               "--rate", 600, "-L", 40, "--procs", 3, "-q", qos, "-d", 30)
    assert s["connected"] == 186 and s["subscribed"] == 180
    assert s["sent"] == 240 and s["acked"] == (240 if qos else 0)
    assert s["expected"] == s["received"] == s["unique"] == 720
    assert s["missing"] == 0 and s["duplicates"] == 0 and s["out_of_order"] == 0
    assert s["gaps"] == 0 and s["protocol_errors"] == 0 and s["e2e"]["count"] == 720
    # Copy 1 of every topic on a second broker that no publisher reaches: exactly the
    # copies on the first one arrive, the others are missing.
    from conftest import Broker
    other = Broker(str(tmp_path))
    try:
        s, _ = run("seed", "-p", mosquitto.port, "--subs", 30, "--copies", 2, "--pubs", 3,
                   "--rate", 300, "-L", 20, "--procs", 3, "-q", qos, "-d", 30, "--drain", 1,
                   "--sub-ports", f"{mosquitto.port},{other.port}",
                   "--pub-ports", str(mosquitto.port))
    finally:
        other.stop()
    assert s["connected"] == 63 and s["subscribed"] == 60
    assert s["sent"] == 60 and s["expected"] == 120
    assert s["received"] == s["unique"] == 60 and s["missing"] == 60
    assert s["duplicates"] == 0 and s["out_of_order"] == 0


def test_go_stdin(mosquitto):
    """--go-stdin: connected, rtbench says ready and publishes nothing until a line comes."""
    argv = ["pairs", "-p", mosquitto.port, "-c", 4, "-L", 50, "-q", 1, "-d", 30, "--procs", 2,
            "--go-stdin", "--json", "--quiet"]
    p = subprocess.Popen([RTBENCH, *map(str, argv)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert p.stderr.readline() == "rtbench: ready\n"
        time.sleep(0.5)
        assert p.poll() is None
        p.stdin.write("\n")
        p.stdin.flush()
        s = finish(p)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert_exact(s, 200, 1)
    assert s["run_seconds"] < 5  # from the go, not from the connects


def paho_client(port, on_message=None):
    c = mqtt.Client(client_id=f"pytest-{os.getpid()}-{time.monotonic_ns()}")
    if on_message:
        c.on_message = on_message
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def test_topic_expansion_pub(mosquitto):
    got = []
    lock = threading.Lock()
    subscribed = threading.Event()

    def on_message(client, userdata, msg):
        with lock:
            got.append((msg.topic, msg.payload))

    c = paho_client(mosquitto.port, on_message)
    c.on_subscribe = lambda *a: subscribed.set()
    c.subscribe("exp/#", qos=1)
    assert subscribed.wait(5)
    s, _ = run("pub", "-p", mosquitto.port, "-c", 3, "-n", 5, "-t", "exp/%i/%c", "-L", 2,
               "-I", 5, "-q", 1, "--prefix", "tp", "-s", 40)
    assert s["sent"] == 6 and s["acked"] == 6 and s["expected"] is None
    deadline = time.monotonic() + 5
    while len(got) < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    c.disconnect()
    c.loop_stop()
    topics = sorted(t for t, _ in got)
    assert topics == ["exp/5/tp5", "exp/5/tp5", "exp/6/tp6", "exp/6/tp6", "exp/7/tp7",
                      "exp/7/tp7"]
    for topic, payload in got:
        assert len(payload) == 40
        pub, seq, ts = struct.unpack_from("<IIQ", payload)
        assert pub == int(topic.split("/")[1]) and seq in (0, 1) and ts > 0


def test_raw_payload_pub(mosquitto):
    got = []
    subscribed = threading.Event()
    c = paho_client(mosquitto.port, lambda client, userdata, msg: got.append(msg.payload))
    c.on_subscribe = lambda *a: subscribed.set()
    c.subscribe("raw/#", qos=1)
    assert subscribed.wait(5)
    s, _ = run("pub", "-p", mosquitto.port, "-c", 2, "-t", "raw/%i", "-L", 3, "-I", 5, "-q", 1,
               "-s", 10)
    assert s["sent"] == 6 and s["acked"] == 6
    deadline = time.monotonic() + 5
    while len(got) < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    c.disconnect()
    c.loop_stop()
    assert got == [b"x" * 10] * 6


def test_topic_expansion_sub(mosquitto):
    """rtbench sub subscribes to sx/%i; a paho publisher sends rtbench-shaped payloads."""
    sub = start_ready("sub", "-p", mosquitto.port, "-c", 2, "-n", 3, "-t", "sx/%i", "-q", 1,
                      "-L", 3, "-d", 10, "-i", 0)
    go(sub)
    c = paho_client(mosquitto.port)
    for seq in range(3):
        for i in (3, 4):
            head = struct.pack("<IIQ", i, seq, time.monotonic_ns())
            c.publish(f"sx/{i}", head + b"z" * 10, qos=1).wait_for_publish(5)
        c.publish("sx/99", b"nobody listens", qos=1).wait_for_publish(5)
    c.disconnect()
    c.loop_stop()
    s = finish(sub, timeout=20)
    assert s["subscribed"] == 2
    assert s["received"] == 6 and s["unique"] == 6 and s["missing"] == 0
    assert s["foreign"] == 0 and s["duplicates"] == 0


def test_missing_reported_test_hook(mosquitto):
    """--test-skip-seq makes publisher 0 count message 10 as sent without sending it."""
    s, _ = run("pairs", "-p", mosquitto.port, "-c", 2, "-L", 50, "-q", 1,
               "--test-skip-seq", 10, "--drain", 1, "-d", 20)
    assert s["expected"] == 100 and s["received"] == 99
    assert s["missing"] == 1 and s["gaps"] == 1


def test_missing_reported_late_subscriber(mosquitto):
    """A subscriber that joins late misses the first messages and says how many. Publisher 0's
    first 50 messages (rtbench's payload header) are acknowledged before it subscribes, the
    next 100 after its SUBACK: it gets those 100 (-L) and reports the 50 as missing."""
    c = paho_client(mosquitto.port)

    def publish(seqs):
        for seq in seqs:
            head = struct.pack("<IIQ", 0, seq, time.monotonic_ns())
            c.publish("late/x", head + b"z" * 10, qos=1).wait_for_publish(5)

    publish(range(50))
    sub = start_ready("sub", "-p", mosquitto.port, "-c", 1, "-t", "late/x", "-q", 1, "-L", 100,
                      "-d", 20)
    go(sub)
    publish(range(50, 150))
    c.disconnect()
    c.loop_stop()
    s = finish(sub, timeout=30)
    assert s["received"] == s["unique"] == 100
    assert s["missing"] == 50 and s["missing_basis"] == "gaps"


def test_refused_connection_counted(mosquitto):
    port = free_port()
    t0 = time.monotonic()
    s, _ = run("conn", "-p", port, "-c", 5, "-i", 0, "-d", 30, timeout=20)
    assert s["connected"] == 0 and s["failed"] == 5
    assert time.monotonic() - t0 < 10
    s, _ = run("pairs", "-p", port, "-c", 2, "-d", 30, timeout=20)
    assert s["failed"] == 4 and s["sent"] == 0


@pytest.mark.parametrize("args,needle", [
    (["pub", "-q", "3", "-t", "x"], "-q"),
    (["pub", "-t", "x", "-c", "abc"], "-c"),
    (["pub", "-t", "x", "-s", "0"], "-s"),
    (["pairs", "-s", "8"], "-s"),
    (["pub", "-t", "x", "-V", "6"], "-V"),
    (["pub", "-t", "x", "--frobnicate"], "--frobnicate"),
    (["pub", "-t", "x", "-p"], "-p"),
    (["pub"], "-t"),
    (["warp"], "warp"),
    (["pub", "-t", "x", "-h", "10.1.2.3"], "--allow-remote"),
    (["conn", "--ifaddr", "192.0.2.1"], "--allow-remote"),
    (["fanin", "-c", "2", "--procs", "3"], "--procs"),
    (["fanout", "-c", "2", "--procs", "3"], "--procs"),
    (["conn", "-C", "maybe"], "-C"),
    (["conn", "-V", "3", "--prefix", "a-very-long-client-id-prefix"], "23 bytes"),
    (["pairs", "-t", "x"], "-t"),
    (["pairs", "--copies", "2"], "--copies"),
    (["seed", "--copies", "0"], "--copies"),
])
def test_bad_flags(args, needle):
    p = subprocess.run([RTBENCH, *args], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2
    assert p.stdout == ""
    assert needle in p.stderr and p.stderr.startswith("rtbench: ")


def test_help():
    p = subprocess.run([RTBENCH, "--help"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 0 and "-h host" in p.stdout and "--procs" in p.stdout
