#!/usr/bin/python3
"""How fast a cluster takes new clients (issue 30, part 8; docs/CLUSTER.md, "What a connect
costs"): K rtd nodes over three clustered nats-servers with JetStream (the tests'
NatsCluster), each node waiting until its NATS connection, its buckets and its lease are up;
then one `rtbench conn` per node at once, --clients in all (split evenly), fresh client
ids, clean sessions unless --persistent (MQTT 3.1.1 then), every CONNECT claimed cluster-
wide. Per run: clients connected, the rate (all of them over the slowest node's connect
span), CONNACK p50/p99, the claims each node settled with one create (`client_ids_claimed_
at_once`) and those that failed, CPU-seconds of the rtd nodes and of the nats-servers over
the connect phase. Medians over --runs, each run on fresh servers; every process started
here is stopped by its PID, every phase is bounded.

The three nats-servers run with GOMAXPROCS=1 unless --nats-gomaxprocs says otherwise (0: Go's
default, one per core): each of them has a third of this machine's two cores, and with two
each, Go's idle threads spin for work the others are doing (a fifth of the servers' CPU per
claim here; docs/CLUSTER.md, "What a connect costs").

    RT_BUILD_DIR=$PWD/build/release /usr/bin/python3 tests/bench/cluster_connect.py \\
        [--nodes 3] [--clients 19000] [--runs 3] [--conn-parallel 200] [--persistent]
        [--nats-gomaxprocs 1]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from conftest import BUILD, Rtd  # noqa: E402
from cluster_harness import NatsCluster, cluster_option, until  # noqa: E402
from cluster_emqttd import cpu_s, log  # noqa: E402

RTBENCH = os.path.join(BUILD, "tools", "rtbench", "rtbench")


def ready(node):
    st = node.ctl_json("cluster", "status")
    return st["nats"] == "connected" and st["retained"] == "replicated" and st["lease"] == "held"


def one_run(a, run_no, tmp):
    nats = NatsCluster(tempfile.mkdtemp(prefix="nats-", dir=tmp))
    rules = tempfile.mkdtemp(prefix="rules-", dir=tmp)
    nodes, benches = [], []
    try:
        for i in range(a.nodes):
            nodes.append(Rtd(cluster_option(f"c{i + 1}", nats.urls()), f'rules_dir="{rules}"'))
        for node in nodes:
            until(lambda: ready(node), 60, lambda: node.read_log()[-2000:])
        pids = [n.proc.pid for n in nodes] + [s["proc"].pid for s in nats.servers]
        cpu0 = {p: cpu_s(p) for p in pids}
        per_node = a.clients // a.nodes
        for i, node in enumerate(nodes):
            cmd = [RTBENCH, "conn", "-p", str(node.port), "-c", str(per_node), "-i", "0",
                   "--conn-parallel", str(a.conn_parallel), "--conn-timeout", "60",
                   "--procs", str(a.procs), "-d", "1", "--prefix", f"r{run_no}n{i}-",
                   "--ifaddr", ",".join(f"127.0.{i + 1}.{k + 1}" for k in range(a.procs)),
                   "--json", "--quiet"]
            cmd += ["-C", "false", "-V", "4"] if a.persistent else ["-C", "true"]
            benches.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        outs = []
        for b in benches:
            out, _ = b.communicate(timeout=a.timeout)
            outs.append(json.loads(out.strip().splitlines()[-1]))
        cpu = {p: cpu_s(p) - cpu0[p] for p in pids}
        st = [n.ctl_json("cluster", "status") for n in nodes]
        span = max(o["connect_seconds"] for o in outs)
        connected = sum(o["connected"] for o in outs)
        row = {
            "run": run_no, "clients": per_node * a.nodes, "connected": connected,
            "failed": sum(o["failed"] for o in outs), "connect_s": span,
            "rate": connected / span if span else 0,
            "connack_p50_ms": statistics.median(o["connack"]["p50_ms"] for o in outs),
            "connack_p99_ms": max(o["connack"]["p99_ms"] for o in outs),
            "claimed": sum(s["client_ids_claimed"] for s in st),
            "claimed_at_once": sum(s["client_ids_claimed_at_once"] for s in st),
            "claims_failed": sum(s["client_id_claims_failed"] for s in st),
            "cpu_rtd_s": sum(cpu[n.proc.pid] for n in nodes),
            "cpu_nats_s": sum(cpu[s["proc"].pid] for s in nats.servers),
            "cpu_rtbench_s": sum(o["cpu_seconds"] for o in outs),
        }
        log(json.dumps(row))
        return row
    finally:
        for b in benches:
            if b.poll() is None:
                b.kill()
                b.wait()
        for n in nodes:
            n.stop()
        nats.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--clients", type=int, default=19000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--procs", type=int, default=1, help="rtbench processes per node")
    ap.add_argument("--conn-parallel", type=int, default=200, help="CONNECTs in flight per "
                    "rtbench process")
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--timeout", type=float, default=300, help="bound on a connect phase, s")
    ap.add_argument("--nats-gomaxprocs", type=int, default=1, help="GOMAXPROCS of the "
                    "nats-servers (0: Go's default)")
    a = ap.parse_args()
    if a.nats_gomaxprocs > 0:  # inherited by the nats-servers; rtd and rtbench are not Go
        os.environ["GOMAXPROCS"] = str(a.nats_gomaxprocs)
    else:
        os.environ.pop("GOMAXPROCS", None)
    tmp = tempfile.mkdtemp(prefix="cluster-connect-")
    try:
        rows = [one_run(a, r + 1, tmp) for r in range(a.runs)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keys = ["connected", "failed", "connect_s", "rate", "connack_p50_ms", "connack_p99_ms",
            "claimed_at_once", "claims_failed", "cpu_rtd_s", "cpu_nats_s", "cpu_rtbench_s"]
    print("| | " + " | ".join(f"run {r['run']}" for r in rows) + " | median |")
    print("|---|" + "---:|" * (len(rows) + 1))
    for k in keys:
        vals = [r[k] for r in rows]
        fmt = "{:,.0f}" if k in ("connected", "failed", "rate", "claimed_at_once",
                                 "claims_failed") else "{:.2f}"
        print(f"| {k} | " + " | ".join(fmt.format(v) for v in vals) +
              f" | {fmt.format(statistics.median(vals))} |")


if __name__ == "__main__":
    main()
