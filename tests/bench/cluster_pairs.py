#!/usr/bin/python3
"""What a hop between cluster nodes costs (docs/BENCHMARKS.md, "Cluster: pairs across nodes"):
rtbench pairs at QoS 1, each publisher on one rtd node and its subscriber on the next one, with
1 node (no cluster: both on the one node, no NATS), 3 and 5 nodes (a cluster over three
clustered nats-servers with JetStream). For each: delivered messages a second, and the
CPU-seconds per million delivered messages of the rtd processes, of the nats-servers and of
rtbench itself, read from /proc (every thread) over the run. Runs alternate between the
shapes; each figure is the median of --runs.

    RT_BUILD_DIR=$PWD/build/release /usr/bin/python3 tests/bench/cluster_pairs.py \\
        [--pairs 100] [--seconds 10] [--runs 3] [--nodes 1,3,5]

On 2 cores every process shares them: the rates say what the machine does with all of it
on, the CPU per million what each part costs.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from conftest import BUILD, Rtd  # noqa: E402
from cluster_harness import NatsCluster, cluster_option, until  # noqa: E402

RTBENCH = os.path.join(BUILD, "tools", "rtbench", "rtbench")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """utime + stime of every thread of pid so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start_nodes(n, nats):
    if n == 1:
        return [Rtd()]
    nodes = []
    try:
        for i in range(n):
            nodes.append(Rtd(cluster_option(f"b{i + 1}", nats.urls())))
        for node in nodes:
            until(lambda: node.ctl_json("cluster", "status")["nats"] == "connected", 30,
                  lambda: node.read_log()[-2000:])
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


def run_once(n, nats, pairs, seconds):
    nodes = start_nodes(n, nats)
    try:
        ports = [node.port for node in nodes]
        subs = ports[1:] + ports[:1]  # pair i: publisher on node i % n, subscriber on the next
        argv = [RTBENCH, "pairs", "-c", str(pairs), "-q", "1", "-d", str(seconds), "--json",
                "--quiet", "-p", str(ports[0]), "--pub-ports", ",".join(map(str, ports)),
                "--sub-ports", ",".join(map(str, subs))]
        pids = [node.proc.pid for node in nodes]
        npids = [s["proc"].pid for s in nats.servers] if n > 1 else []
        r0, n0 = sum(cpu_s(p) for p in pids), sum(cpu_s(p) for p in npids)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
        r1, n1 = sum(cpu_s(p) for p in pids), sum(cpu_s(p) for p in npids)
        if p.returncode != 0:
            raise RuntimeError(f"rtbench failed ({p.returncode}): {p.stderr[-2000:]}")
        res = json.loads(p.stdout.strip().splitlines()[-1])
        got = res["received"]
        if res.get("missing") or res.get("duplicates") or res.get("out_of_order"):
            raise RuntimeError(f"rtbench saw loss or disorder: {res}")
        per_m = 1e6 / got if got else float("nan")
        return {"nodes": n, "delivered_per_s": res["recv_rate"],
                "rtd_cpu_s_per_m": (r1 - r0) * per_m, "nats_cpu_s_per_m": (n1 - n0) * per_m,
                "rtbench_cpu_s_per_m": res["cpu_seconds"] * per_m,
                "p99_ms": res["e2e"]["p99_ms"], "received": got}
    finally:
        for node in nodes:
            node.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nodes", default="1,3,5")
    a = ap.parse_args()
    shapes = [int(x) for x in a.nodes.split(",")]
    nats = NatsCluster(tempfile.mkdtemp(prefix="bench-nats-"))
    results = {n: [] for n in shapes}
    try:
        for run in range(a.runs):
            for n in shapes:
                r = run_once(n, nats, a.pairs, a.seconds)
                results[n].append(r)
                print(f"run {run + 1} nodes {n}: " + ", ".join(
                    f"{k} {v:.3g}" for k, v in r.items() if k != "nodes"), flush=True)
    finally:
        nats.stop()
    print("\nmedians of", a.runs, "runs, pairs", a.pairs, "QoS 1,", a.seconds, "s each:")
    print(f"{'nodes':>5} {'delivered/s':>12} {'p99 ms':>8} {'rtd CPU-s/M':>12} "
          f"{'nats CPU-s/M':>13} {'rtbench CPU-s/M':>16}")
    for n in shapes:
        med = {k: statistics.median(r[k] for r in results[n])
               for k in ("delivered_per_s", "p99_ms", "rtd_cpu_s_per_m", "nats_cpu_s_per_m",
                         "rtbench_cpu_s_per_m")}
        print(f"{n:>5} {med['delivered_per_s']:>12.0f} {med['p99_ms']:>8.1f} "
              f"{med['rtd_cpu_s_per_m']:>12.2f} {med['nats_cpu_s_per_m']:>13.2f} "
              f"{med['rtbench_cpu_s_per_m']:>16.2f}")


if __name__ == "__main__":
    main()
