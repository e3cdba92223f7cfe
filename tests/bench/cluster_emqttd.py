#!/usr/bin/python3
"""The emqttd seed's shape scaled to a cluster (docs/BENCHMARKS.md, "Cluster: the emqttd
shape (issue 17)"): `rtbench seed --subs T --copies K` puts K subscribers on every topic
test/0..T-1, copy c on node c (one subscriber of every topic on every node: T x K in all),
QoS 1, and 40 publishers (spread over the nodes) at --rate QoS 1 messages/s in total, so
each message is delivered K times. Two systems, alternating run by run:

  rt    K rtd nodes clustered over three clustered nats-servers with JetStream (the
        tests' NatsCluster), rules off (rules_dir = an empty directory), persistence as
        the default (on; every session is clean, so nothing is stored per message).
  nats  K nats-servers clustered with JetStream, each with an MQTT listener: nats-server's
        own MQTT (3.1.1 only, so both run -V 4).

For each run: connect time (all subscribers connected and subscribed), the wait until
the routes are in force everywhere (rt: every node holds T routes and every nats-server
sees every node's subscriptions; nats: the servers' subscription counts stop moving),
then the publishing window (rtbench --go-stdin: the script says go). Over the window:
CPU-seconds of the brokers, of the nats-servers and of rtbench (every process and thread,
from /proc), RSS of each at its end; from rtbench: published, delivered (must be K x
published), missing, duplicates, out of order, end-to-end latency. Every phase has a
timeout; every process started here is stopped by its PID.

    RT_BUILD_DIR=$PWD/build/release /usr/bin/python3 tests/bench/cluster_emqttd.py \\
        [--topics 19000] [--copies 5] [--seconds 60] [--runs 2] [--systems rt,nats] \\
        [--out docs/bench/issue17-cluster]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from conftest import BUILD, Rtd, free_port  # noqa: E402
from cluster_harness import NATS_SERVER, NatsCluster, cluster_option  # noqa: E402

RTBENCH = os.path.join(BUILD, "tools", "rtbench", "rtbench")
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def log(msg):
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def cpu_s(pid):
    """utime + stime of every thread of pid so far, in seconds (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_b(pid):
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except OSError:
        return 0


def hwm_b(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def descendants(pid):
    """pid and its children (rtbench's workers)."""
    out = [pid]
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def machine_busy_s():
    """CPU-seconds the whole machine has spent busy: user, nice, system, irq, softirq
    (not idle, iowait, steal, nor guest, which user already counts)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / TICK


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def http_json(port, path, timeout=5):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return json.loads(r.read())


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s: {what() if callable(what) else what}")
        time.sleep(0.5)


class NatsMqtt:
    """n nats-servers as one cluster with JetStream, each with an MQTT listener."""

    def __init__(self, base, n, mqtt_opts=""):
        self.base = base
        self.servers = []
        names = [f"m{i + 1}" for i in range(n)]
        ports = [(free_port(), free_port(), free_port(), free_port()) for _ in range(n)]
        for i in range(n):
            port, cport, mport, qport = ports[i]
            d = os.path.join(base, names[i])
            os.makedirs(d, exist_ok=True)
            routes = ", ".join(f'"nats://127.0.0.1:{p[1]}"' for j, p in enumerate(ports) if j != i)
            conf = os.path.join(d, "nats.conf")
            with open(conf, "w") as f:
                f.write(f"""server_name: {names[i]}
listen: "127.0.0.1:{port}"
http: "127.0.0.1:{mport}"
max_payload: 4194304
jetstream {{ store_dir: "{d}" }}
cluster {{ name: mq, listen: "127.0.0.1:{cport}", routes: [{routes}] }}
mqtt {{
  listen: "127.0.0.1:{qport}"
  {mqtt_opts}
}}
""")
            self.servers.append(dict(name=names[i], port=port, mport=mport, mqtt=qport,
                                     log=os.path.join(d, "nats.log"), conf=conf, proc=None))
        try:
            for s in self.servers:
                with open(s["log"], "ab") as lg:
                    s["proc"] = subprocess.Popen([NATS_SERVER, "-c", s["conf"]], stdout=lg,
                                                 stderr=subprocess.STDOUT)
            for s in self.servers:
                wait_for(lambda: self.ready(s), 60, lambda: self.logs())
        except BaseException:
            self.stop()
            raise

    def ready(self, s):
        if s["proc"].poll() is not None:
            raise RuntimeError(f"nats-server {s['name']} exited:\n{self.logs()}")
        try:
            return (http_json(s["mport"], "/routez").get("num_routes") == len(self.servers) - 1
                    and http_json(s["mport"], "/healthz").get("status") == "ok")
        except (OSError, ValueError):
            return False

    def logs(self, tail=3000):
        out = []
        for s in self.servers:
            try:
                with open(s["log"], errors="replace") as f:
                    out.append(f"--- {s['name']} ---\n" + f.read()[-tail:])
            except OSError:
                pass
        return "\n".join(out)

    def stop(self):
        for s in self.servers:
            if s["proc"] is not None and s["proc"].poll() is None:
                s["proc"].terminate()
        for s in self.servers:
            if s["proc"] is None:
                continue
            try:
                s["proc"].wait(timeout=30)
            except subprocess.TimeoutExpired:
                s["proc"].kill()
                s["proc"].wait(timeout=10)


def nats_subs(ports):
    out = []
    for p in ports:
        try:
            out.append(http_json(p, "/subsz").get("num_subscriptions", 0))
        except (OSError, ValueError):
            out.append(-1)
    return out


class System:
    """What one run measures: broker pids, nats-server pids, the MQTT ports."""

    def __init__(self, kind, a, tmp):
        self.kind, self.a = kind, a
        self.nodes, self.nats, self.mq = [], None, None
        if kind == "rt":
            self.nats = NatsCluster(tempfile.mkdtemp(prefix="nats-", dir=tmp))
            rules = tempfile.mkdtemp(prefix="rules-", dir=tmp)
            try:
                for i in range(a.copies):
                    self.nodes.append(Rtd(cluster_option(f"e{i + 1}", self.nats.urls()),
                                          f'rules_dir="{rules}"'))
                # Connected, and the buckets bound (`retained: replicated`): before that a
                # node lets clean sessions in unclaimed, which would make connecting cheaper.
                for node in self.nodes:
                    wait_for(lambda: (lambda st: st["nats"] == "connected" and
                                      st["retained"] == "replicated")(
                                          node.ctl_json("cluster", "status")),
                             60, lambda: node.read_log()[-2000:])
            except BaseException:
                self.stop()
                raise
            self.ports = [n.port for n in self.nodes]
            self.broker_pids = [n.proc.pid for n in self.nodes]
            self.nats_pids = [s["proc"].pid for s in self.nats.servers]
            self.mports = [s["mport"] for s in self.nats.servers]
        else:
            self.mq = NatsMqtt(tempfile.mkdtemp(prefix="natsmq-", dir=tmp),
                               a.nats_servers or a.copies,
                               a.nats_mqtt_opts.replace("\\n", "\n"))
            self.ports = [s["mqtt"] for s in self.mq.servers]
            self.broker_pids = []
            self.nats_pids = [s["proc"].pid for s in self.mq.servers]
            self.mports = [s["mport"] for s in self.mq.servers]

    def alive(self):
        procs = [n.proc for n in self.nodes] + [
            s["proc"] for s in (self.nats.servers if self.nats else self.mq.servers)]
        return all(p.poll() is None for p in procs)

    def connections(self):
        """Client connections each server holds now (rtd: cluster nodes; nats: varz)."""
        if self.kind == "rt":
            try:
                return {n["node"]: n["connections"]
                        for n in self.nodes[0].ctl_json("cluster", "nodes", timeout=20)}
            except Exception as e:  # noqa: BLE001 - evidence
                return repr(e)
        out = []
        for p in self.mports:
            try:
                out.append(http_json(p, "/varz", timeout=20).get("connections"))
            except (OSError, ValueError) as e:
                out.append(repr(e))
        return out

    def status(self):
        """rtctl cluster status --json of every rtd node (rt only)."""
        out = {}
        for i, n in enumerate(self.nodes):
            try:
                out[f"e{i + 1}"] = n.ctl_json("cluster", "status", timeout=20)
            except Exception as e:  # noqa: BLE001 - evidence, not control flow
                out[f"e{i + 1}"] = repr(e)
        return out

    def logs(self):
        if self.kind == "rt":
            return "\n".join(f"--- rtd e{i + 1} ---\n" + n.read_log()[-3000:]
                             for i, n in enumerate(self.nodes)) + "\n" + self.nats.logs()
        return self.mq.logs()

    def routes_in_force(self, base):
        """The nats-servers' subscription counts (the caller waits until they stand
        still); rt: only once every node holds T routes and every nats-server has at least
        T more subscriptions than before the connects (a server holds its own clients'
        subscriptions and one per subject for each route that has interest, so K x T is
        not the figure to wait for)."""
        subs = nats_subs(self.mports)
        if self.kind == "rt":
            for n in self.nodes:
                if n.ctl_json("cluster", "status", timeout=20)["routes"] < self.a.topics:
                    return None
            if not all(s - b >= self.a.topics for s, b in zip(subs, base)):
                return None
        return subs

    def stop(self):
        for n in self.nodes:
            n.stop()
        if self.nats:
            self.nats.stop()
        if self.mq:
            self.mq.stop()


def run_once(kind, a, tmp, run_no):
    row = {"system": kind, "run": run_no, "nats_mqtt_opts": a.nats_mqtt_opts,
           "nats_servers": a.nats_servers or a.copies, "topics": a.topics, "copies": a.copies,
           "subscribers": a.topics * a.copies, "rate": a.rate, "seconds": a.seconds}
    t0 = time.monotonic()
    sysm = System(kind, a, tmp)
    bench = None
    try:
        pids = sysm.broker_pids + sysm.nats_pids
        base_subs = nats_subs(sysm.mports)
        cpu_start = {p: cpu_s(p) for p in pids}
        ports = ",".join(map(str, sysm.ports))
        argv = [RTBENCH, "seed", "--subs", a.topics, "--copies", a.copies, "--pubs", a.pubs,
                "--rate", a.rate, "-q", 1, "-V", 4, "-d", a.seconds, "--drain", 10,
                "--procs", a.procs, "--conn-parallel", a.conn_parallel,
                "--conn-timeout", a.conn_timeout, "-p", sysm.ports[0],
                "--sub-ports", ports, "--pub-ports", ports, "--prefix", f"e{kind}{run_no}_",
                "--ifaddr", ",".join(f"127.0.0.{i + 1}" for i in range(a.ifaddrs)),
                "--go-stdin", "--json", "--quiet"]
        row["command"] = " ".join(map(str, argv[1:]))
        errlog = os.path.join(tmp, f"rtbench-{kind}-{run_no}.err")
        ready = threading.Event()
        bench = subprocess.Popen([str(x) for x in argv], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        errlines = []

        def read_err():
            for line in bench.stderr:
                errlines.append(line)
                if line.strip() == "rtbench: ready":
                    ready.set()
        threading.Thread(target=read_err, daemon=True).start()
        t_conn = time.monotonic()
        log(f"{kind} run {run_no}: connecting {a.topics * a.copies} subscribers")
        # Connect phase, bounded; the brokers must stay up.
        deadline = time.monotonic() + a.connect_timeout
        while not ready.wait(2):
            rss_mb = sum(map(rss_b, sysm.broker_pids + sysm.nats_pids)) / 1e6
            if bench.poll() is not None or not sysm.alive() or time.monotonic() > deadline \
                    or rss_mb > a.rss_cap_mb:
                row["error"] = ("connect phase: " + ("rtbench exited" if bench.poll() is not None
                                                     else "a server exited" if not sysm.alive()
                                                     else f"RSS {rss_mb:.0f} MB over --rss-cap-mb"
                                                     if rss_mb > a.rss_cap_mb
                                                     else f"over {a.connect_timeout} s"))
                row["connections_seen"] = sysm.connections()
                row["connect_s"] = time.monotonic() - t_conn
                row["subs_seen"] = nats_subs(sysm.mports)
                row["rss_mb_at_failure"] = {"brokers": sum(map(rss_b, sysm.broker_pids)) / 1e6,
                                            "nats": sum(map(rss_b, sysm.nats_pids)) / 1e6}
                log(f"{kind} run {run_no}: {row['error']}")
                return row, sysm.logs(), "".join(errlines)
        row["connect_s"] = time.monotonic() - t_conn
        row["connect_cpu_brokers_s"] = sum(cpu_s(p) - cpu_start[p] for p in sysm.broker_pids)
        row["connect_cpu_nats_s"] = sum(cpu_s(p) - cpu_start[p] for p in sysm.nats_pids)
        log(f"{kind} run {run_no}: connected in {row['connect_s']:.1f} s; waiting for routes")
        t_r = time.monotonic()
        last, still = None, 0
        while True:
            v = sysm.routes_in_force(base_subs)
            still = still + 1 if v and v == last else 0
            last = v
            if still >= 6:  # 3 s without a change
                break
            if time.monotonic() - t_r > a.route_timeout or not sysm.alive():
                row["error"] = f"routes not in force after {a.route_timeout} s"
                row["subs_seen"] = nats_subs(sysm.mports)
                row["cluster_status"] = sysm.status()
                log(f"{kind} run {run_no}: {row['error']}")
                return row, sysm.logs(), "".join(errlines)
            time.sleep(0.5)
        row["routes_s"] = time.monotonic() - t_r
        row["nats_subscriptions"] = nats_subs(sysm.mports)
        bpids = descendants(bench.pid)
        c1 = {p: cpu_s(p) for p in pids + bpids}
        m1 = machine_busy_s()
        row["load_before"] = loadavg()
        bench.stdin.write("\n")
        bench.stdin.flush()
        log(f"{kind} run {run_no}: routes in {row['routes_s']:.1f} s; publishing {a.seconds} s")
        # The machine's busy CPU and the share of it not ours, over the window less its
        # last second (rtbench's workers may be gone by its end).
        time.sleep(a.seconds - 1)
        cm = {p: cpu_s(p) for p in pids + bpids}
        row["cpu_machine_s"] = machine_busy_s() - m1
        row["cpu_others_s"] = row["cpu_machine_s"] - sum(cm[p] - c1[p] for p in pids + bpids)
        row["cpu_machine_window_s"] = a.seconds - 1
        time.sleep(1.5)
        c2 = {p: cpu_s(p) for p in pids + bpids}
        row["load_after"] = loadavg()
        row["rss_brokers_mb"] = sum(map(rss_b, sysm.broker_pids)) / 1e6
        row["rss_nats_mb"] = sum(map(rss_b, sysm.nats_pids)) / 1e6
        row["hwm_brokers_mb"] = sum(map(hwm_b, sysm.broker_pids)) / 1e6
        row["hwm_nats_mb"] = sum(map(hwm_b, sysm.nats_pids)) / 1e6
        row["rss_per_node_mb"] = [round(rss_b(p) / 1e6, 1) for p in sysm.broker_pids]
        row["rss_per_nats_mb"] = [round(rss_b(p) / 1e6, 1) for p in sysm.nats_pids]
        row["cpu_brokers_s"] = sum(c2[p] - c1[p] for p in sysm.broker_pids)
        row["cpu_nats_s"] = sum(c2[p] - c1[p] for p in sysm.nats_pids)
        row["cpu_rtbench_connect_s"] = sum(c1[p] for p in bpids)
        try:
            out, _ = bench.communicate(timeout=a.seconds + 120)
        except subprocess.TimeoutExpired:
            bench.kill()
            bench.communicate()
            row["error"] = "rtbench did not end"
            return row, sysm.logs(), "".join(errlines)
        if kind == "rt":
            row["cluster_status"] = sysm.status()
        if bench.returncode != 0 or not out.strip():
            row["error"] = f"rtbench exit {bench.returncode}"
            return row, sysm.logs(), "".join(errlines)
        res = json.loads(out.strip().splitlines()[-1])
        row["rtbench"] = res
        got = res["received"]
        per_m = 1e6 / got if got else float("nan")
        subs = a.topics * a.copies
        row.update({
            "connected": res["connected"], "subscribed": res["subscribed"],
            "published": res["sent"], "acked": res["acked"], "delivered": got,
            "expected": res["expected"], "unique": res["unique"], "missing": res["missing"],
            "duplicates": res["duplicates"], "out_of_order": res["out_of_order"],
            "delivered_per_s": res["recv_rate"],
            "p50_ms": res["e2e"]["p50_ms"], "p99_ms": res["e2e"]["p99_ms"],
            "p999_ms": res["e2e"]["p999_ms"], "max_ms": res["e2e"]["max_ms"],
            "cpu_brokers_s_per_m": row["cpu_brokers_s"] * per_m,
            "cpu_nats_s_per_m": row["cpu_nats_s"] * per_m,
            # After the go: publishing, the drain and the disconnects (its workers are
            # gone by the end, so this is its total less what it had spent connecting).
            "cpu_rtbench_run_s": res["cpu_seconds"] - row["cpu_rtbench_connect_s"],
            "cpu_rtbench_run_s_per_m": (res["cpu_seconds"] - row["cpu_rtbench_connect_s"]) * per_m,
            "cpu_rtbench_total_s": res["cpu_seconds"],
            "bytes_per_subscriber": (row["rss_brokers_mb"] + row["rss_nats_mb"]) * 1e6 / subs,
        })
        row["failed"], row["lost"] = res["failed"], res["lost"]
        if res["missing"] or res["duplicates"] or res["out_of_order"] or \
                got != a.copies * res["sent"]:
            row["error"] = "loss, duplicates or disorder"
        if res["subscribed"] < subs or res["failed"] or res["lost"]:
            row["error"] = (f"{res['subscribed']} of {subs} subscribed, {res['failed']} failed "
                            f"to connect, {res['lost']} lost; " + row.get("error", ""))
        if res["sent"] < 0.95 * a.rate * a.seconds:
            row["error"] = (f"published {res['sent']}, short of the rate; "
                            + row.get("error", ""))
        row["wall_s"] = time.monotonic() - t0
        return row, sysm.logs() if row.get("error") else "", "".join(errlines)
    finally:
        if bench is not None and bench.poll() is None:
            bench.kill()
            bench.wait()
        sysm.stop()


COLS = [("delivered", "{:.0f}"), ("published", "{:.0f}"), ("missing", "{:.0f}"),
        ("duplicates", "{:.0f}"), ("out_of_order", "{:.0f}"), ("connect_s", "{:.1f}"),
        ("routes_s", "{:.1f}"), ("p50_ms", "{:.2f}"), ("p99_ms", "{:.2f}"),
        ("rss_brokers_mb", "{:.0f}"), ("rss_nats_mb", "{:.0f}"),
        ("bytes_per_subscriber", "{:.0f}"), ("cpu_brokers_s", "{:.1f}"),
        ("cpu_nats_s", "{:.1f}"), ("cpu_brokers_s_per_m", "{:.2f}"),
        ("cpu_nats_s_per_m", "{:.2f}"), ("cpu_rtbench_run_s", "{:.1f}"),
        ("cpu_rtbench_run_s_per_m", "{:.2f}"),
        ("cpu_rtbench_total_s", "{:.1f}"), ("cpu_machine_s", "{:.1f}"), ("cpu_others_s", "{:.1f}"), ("connect_cpu_brokers_s", "{:.1f}"),
        ("connect_cpu_nats_s", "{:.1f}")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topics", type=int, default=19000)
    ap.add_argument("--copies", type=int, default=5, help="nodes, and subscribers per topic")
    ap.add_argument("--pubs", type=int, default=40)
    ap.add_argument("--rate", type=float, default=4000)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--systems", default="rt,nats")
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--ifaddrs", type=int, default=8)
    ap.add_argument("--conn-parallel", type=int, default=64)
    ap.add_argument("--conn-timeout", type=float, default=60)
    ap.add_argument("--connect-timeout", type=float, default=600,
                    help="bound on the whole connect phase, s")
    ap.add_argument("--route-timeout", type=float, default=240)
    ap.add_argument("--nats-servers", type=int, default=0,
                    help="nats-servers with MQTT (nats system; default --copies)")
    ap.add_argument("--rss-cap-mb", type=float, default=9000,
                    help="stop a connect phase when the servers' RSS passes this")
    ap.add_argument("--nats-mqtt-opts", default="",
                    help="more settings in nats-server's mqtt block, e.g. "
                    "'consumer_replicas: 1\\n consumer_memory_storage: true'")
    ap.add_argument("--out", help="directory for raw rows (JSON lines) and failure logs")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-emq-")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    systems = a.systems.split(",")
    results = {k: [] for k in systems}
    tag = f"t{a.topics}-k{a.copies}-r{int(a.rate)}-d{a.seconds}"
    log(f"load average at start: {loadavg()}")
    for run in range(1, a.runs + 1):
        for kind in systems:
            row, logs, err = run_once(kind, a, tmp, run)
            results[kind].append(row)
            brief = {k: row.get(k) for k, _ in COLS if k in row}
            log(f"{kind} run {run}: " + ("ERROR " + row["error"] + " " if row.get("error") else "")
                + json.dumps(brief))
            if a.out:
                with open(os.path.join(a.out, f"rows-{tag}.jsonl"), "a") as f:
                    f.write(json.dumps(row) + "\n")
                if row.get("error"):
                    with open(os.path.join(a.out, f"failure-{tag}-{kind}-{run}.log"), "w") as f:
                        f.write(json.dumps(row, indent=1) + "\n\n" + logs + "\n--- rtbench stderr\n"
                                + err)
    log(f"load average at end: {loadavg()}")
    shutil.rmtree(tmp, ignore_errors=True)  # the nats-servers' JetStream stores, rtbench logs
    print(f"\nmedians over runs: {a.topics} topics x {a.copies} subscribers, {a.pubs} publishers "
          f"at {a.rate:g} msg/s QoS 1, {a.seconds} s")
    print("| | " + " | ".join(systems) + " |")
    print("|---|" + "---:|" * len(systems))
    for k, fmt in COLS:
        cells = []
        for kind in systems:
            # Runs that ended with an error count too (a shortfall is a figure); the list
            # of errors below says which.
            vals = [r[k] for r in results[kind] if k in r]
            cells.append(fmt.format(statistics.median(vals)) if vals else "-")
        print(f"| {k} | " + " | ".join(cells) + " |")
    bad = [r for rs in results.values() for r in rs if r.get("error")]
    if bad:
        print("\nruns with errors:", [(r["system"], r["run"], r["error"]) for r in bad])
        sys.exit(1)


if __name__ == "__main__":
    main()
