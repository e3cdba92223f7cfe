"""XMPP across the cluster's nodes, what it costs. Pairs (the default): 1:1 chats (xmpp_load.py chat, PAIRS pairs,
a window of 10 each) on one rtd alone, on two rtd nodes of a cluster with both sessions of
every pair on the same node, and with the two sessions of every pair on different nodes (each
message crosses NATS once); the rate and the CPU-seconds per million messages of the rtd
processes and of the nats-server (utime + stime from /proc), medians of ROUNDS. One
nats-server with JetStream on loopback; the load client runs on the same 2 cores and is not
counted.
  cd tests/integration && /usr/bin/python3 ../bench/xmpp_cluster.py 200000 3 [PAIRS]
(arguments: messages a round, rounds, pairs). A room (`room OCCUPANTS SECONDS ROUNDS`): two
nodes with xmpp.cluster_home on the first, one room there, its occupants (rtbench xmuc, SASL
ANONYMOUS) all on the second, 5 senders at 20 messages/s for SECONDS: every copy the room sends
goes from its node to the occupant's session on the other through the occupant's proxy; the
deliveries and the CPU-seconds per million deliveries of each rtd and of nats-server, medians.
  cd tests/integration && /usr/bin/python3 ../bench/xmpp_cluster.py room 500 10 3
BENCH_DEBUG=1 prints rtbench's own report and, when a round fails, the nodes' last log lines.
RT_BUILD_DIR picks the build (an A/B against another commit's). Needs make build."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, ".")
import xmpp_util as X  # noqa: E402
from cluster_harness import NATS_SERVER, cluster_option  # noqa: E402
from conftest import Rtd, free_port, wait_listening  # noqa: E402

ROOM = sys.argv[1] == "room"
if ROOM:
    OCCUPANTS, SECONDS, ROUNDS = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    N, PAIRS = 0, 1
else:
    N, ROUNDS = int(sys.argv[1]), int(sys.argv[2])
    PAIRS = int(sys.argv[3]) if len(sys.argv) > 3 else 50
RTBENCH = os.path.join(os.environ.get("RT_BUILD_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "release")),
    "tools", "rtbench", "rtbench")
DOMAIN = "c.test"
PW = "bench pw"
TICK = os.sysconf("SC_CLK_TCK")
LOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xmpp_load.py")
base = tempfile.mkdtemp(prefix="rt-xmpp-cluster-bench-")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def node(name=None, urls=None, extra=""):
    d = tempfile.mkdtemp(dir=base)
    X.add_users(d, [(f"u{i}@{DOMAIN}", PW) for i in range(2 * PAIRS)])
    port = free_port()
    over = [cluster_option(name, urls)] if name else []
    r = Rtd(*over, f'xmpp={{ hosts = {{ "{DOMAIN}" }}, listeners = {{ "127.0.0.1:{port}" }}'
            f'{extra} }}', "auth_max_delay_ms=0", data_dir=d)
    r.xport = port
    return r


def chat(port, port2=0):
    argv = [sys.executable, LOAD, "chat", "--port", str(port), "--host", DOMAIN,
            "--users", f"u%d:{PW}:{2 * PAIRS}", "--pairs", str(PAIRS), "-n", str(N),
            "--deadline", "600"]
    if port2:
        argv += ["--port2", str(port2)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=True).stdout
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def measure(pids, port, port2=0):
    before = [cpu_s(p) for p in pids]
    r = chat(port, port2)
    spent = [cpu_s(p) - b for p, b in zip(pids, before)]
    assert r["received"] == r["sent"], r
    return r["msgs_per_s"], [s * 1e6 / r["received"] for s in spent]


def room_round(pids, port):
    before = [cpu_s(p) for p in pids]
    out = subprocess.run([RTBENCH, "xmuc", "-p", str(port), "--anon", "--domain", DOMAIN,
                          "-c", str(OCCUPANTS), "--senders", "5", "--rate", "20", "-d",
                          str(SECONDS), "--drain", "10", "--json"],
                         capture_output=True, text=True, timeout=600)
    if os.environ.get("BENCH_DEBUG"):
        print(out.stderr[-3000:])
    out = out.stdout
    spent = [cpu_s(p) - b for p, b in zip(pids, before)]
    r = json.loads(out)
    assert r["delivered"] and r["lost_deliveries"] == 0 and r["delivered"] == r["expected"], r
    return r["delivered"], [s * 1e6 / r["delivered"] for s in spent]


def room_main(nats, urls):
    extra = (f', anonymous = {{ "{DOMAIN}" }}, muc_host = "conference.@HOST@", '
             f'muc_max_occupants = {OCCUPANTS + 10}, muc_room_locking = false, cluster_home = "b1"')
    n1, n2 = node("b1", urls, extra), node("b2", urls, extra)
    try:
        deadline = time.monotonic() + 30
        while not all(X.metric(n, "rt_xmpp_cluster_nodes") == 1 for n in (n1, n2)):
            assert time.monotonic() < deadline, "the nodes never synced"
            time.sleep(0.05)
        try:
            runs = [room_round([n1.proc.pid, n2.proc.pid, nats.pid], n2.xport)
                    for _ in range(ROUNDS)]
        except AssertionError:
            if os.environ.get("BENCH_DEBUG"):
                for n in (n1, n2):
                    print("\n".join(ln for ln in n.read_log().splitlines()[-40:]))
            raise
        cpus = [statistics.median(c[i] for _, c in runs) for i in range(3)]
        print(f"one room on b1, {OCCUPANTS} occupants on b2, 5 senders at 20 msg/s for "
              f"{SECONDS} s, medians of {ROUNDS}: {statistics.median(d for d, _ in runs):,.0f} "
              f"deliveries; CPU-s per million deliveries: b1 (the room) {cpus[0]:.1f}, "
              f"b2 (the sessions) {cpus[1]:.1f}, nats-server {cpus[2]:.1f}")
    finally:
        for r in (n1, n2):
            r.stop()


def main():
    nport = free_port()
    nats = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", str(nport), "-js", "-sd",
                             os.path.join(base, "js")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_listening(nats, nport, 10, "nats-server", lambda: "")
    urls = [f"nats://127.0.0.1:{nport}"]
    if ROOM:
        try:
            room_main(nats, urls)
        finally:
            nats.terminate()
            nats.wait()
            shutil.rmtree(base, ignore_errors=True)
        return
    alone = node()
    n1, n2 = node("b1", urls), node("b2", urls)
    try:
        # Each node has the other's bindings whole before the clock starts.
        deadline = time.monotonic() + 30
        while not all(X.metric(n, "rt_xmpp_cluster_nodes") == 1 for n in (n1, n2)):
            assert time.monotonic() < deadline, "the nodes never synced"
            time.sleep(0.05)
        runs = {"alone": [], "same node": [], "across": []}
        for _ in range(ROUNDS):  # interleaved, so that the machine's drift hits all alike
            runs["alone"].append(measure([alone.proc.pid], alone.xport))
            runs["same node"].append(measure([n1.proc.pid, n2.proc.pid, nats.pid], n1.xport))
            runs["across"].append(measure([n1.proc.pid, n2.proc.pid, nats.pid], n1.xport,
                                          n2.xport))
        print(f"{N} messages a round, {PAIRS} pairs, medians of {ROUNDS}")
        for name, rs in runs.items():
            rate = statistics.median(r for r, _ in rs)
            cpus = [statistics.median(c[i] for _, c in rs) for i in range(len(rs[0][1]))]
            parts = (f"rtd {cpus[0]:.1f}" if len(cpus) == 1 else
                     f"rtd n1 {cpus[0]:.1f} + n2 {cpus[1]:.1f} = {cpus[0] + cpus[1]:.1f}, "
                     f"nats-server {cpus[2]:.1f}")
            print(f"{name:10} {rate:9,.0f} msg/s   CPU-s per million: {parts}")
    finally:
        for r in (alone, n1, n2):
            r.stop()
        nats.terminate()
        nats.wait()
        shutil.rmtree(base, ignore_errors=True)


main()
