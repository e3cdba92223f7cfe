#!/usr/bin/env python3
"""xmpp_report.py ROWS.tsv: the median table of an xmpp_peers.sh run (markdown on stdout).

Per server and case, over the rounds: idle cases give KB of server RSS per session,
login gives server CPU ms per login and logins/s, chat gives server CPU-seconds per million
messages routed and messages/s; every figure is a median of the rounds, and rt's ratio
to each peer follows; for rtd's chat-storm, the most heap collections over 1 ms in a round.
The client's own CPU (it shares the 2 cores) and the 1-minute load
average at the end of each case are shown so a reader can judge the split.
"""
import csv
import statistics
import sys


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
    servers = list(dict.fromkeys(r["server"] for r in rows))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig = {}
    for s in servers:
        for c in cases:
            rs = [r for r in rows if r["server"] == s and r["case"] == c]
            if not rs:
                continue
            n = med([float(r["count"]) for r in rs])
            failed = sum(int(r["failed"]) for r in rs)
            load = max(float(r["load1"]) for r in rs)
            ccpu = med([float(r["client_cpu_s"]) for r in rs])
            if c.startswith("idle"):
                per = [(int(r["rss_after_kb"]) - int(r["rss_before_kb"])) / max(1, int(r["count"]))
                       for r in rs]
                main_fig, unit = med(per), "KB/session"
                rate = "%d up in %.1f s" % (n, med([float(r["seconds"]) for r in rs]))
            elif c.startswith("login"):
                main_fig = med([1000 * float(r["cpu_s"]) / max(1, int(r["count"])) for r in rs])
                unit = "CPU ms/login"
                rate = "%.0f logins/s" % med([int(r["count"]) / max(1e-9, float(r["seconds"])) for r in rs])
            else:
                main_fig = med([1e6 * float(r["cpu_s"]) / max(1, int(r["count"])) for r in rs])
                unit = "CPU-s/M msgs"
                rate = "%.0f msgs/s" % med([int(r["count"]) / max(1e-9, float(r["seconds"])) for r in rs])
            # rtbench's cases: the latency p99 (login, or chat overall / its worst second).
            p99 = [float(r["p99_ms"]) for r in rs if r.get("p99_ms")]
            worst = [float(r["worst_second_p99_ms"]) for r in rs if r.get("worst_second_p99_ms")]
            if p99:
                rate += ", p99 %.2f ms" % med(p99)
            if worst:
                rate += " (worst second %.2f ms)" % med(worst)
            over = [int(r["gc_over_1ms"]) for r in rs if r.get("gc_over_1ms")]
            if over:
                rate += ", GC pauses > 1 ms: %d" % max(over)
            fig[s, c] = (main_fig, unit, rate, failed, len(rs), ccpu, load, n)
    print("| case | server | figure (median) | rate | rounds | failed/lost | client CPU s | max load1 |")
    print("|---|---|---|---|---|---|---|---|")
    for c in cases:
        for s in servers:
            if (s, c) in fig:
                f, unit, rate, failed, k, ccpu, load, n = fig[s, c]
                print("| %s | %s | %.2f %s | %s | %d | %d | %.1f | %.2f |"
                      % (c, s, f, unit, rate, k, failed, ccpu, load))
    if "rtd" in servers and len(servers) > 1:
        print()
        print("| case | " + " | ".join("rtd / %s" % s for s in servers if s != "rtd") + " |")
        print("|---|" + "---|" * (len(servers) - 1))
        for c in cases:
            cells = []
            for s in servers:
                if s == "rtd":
                    continue
                a, b = fig.get(("rtd", c)), fig.get((s, c))
                cells.append("%.2f" % (a[0] / b[0]) if a and b and b[0] else "-")
            print("| %s | %s |" % (c, " | ".join(cells)))


if __name__ == "__main__":
    main()
