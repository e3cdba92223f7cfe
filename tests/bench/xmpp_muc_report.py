#!/usr/bin/env python3
"""xmpp_muc_report.py: the arithmetic of tests/bench/xmpp_muc.sh.

    xmpp_muc_report.py window SAMPLES START END   server CPU-seconds between two wall-clock
        times (Unix seconds), from SAMPLES: lines "unix_time cpu_ticks" of /proc/PID/stat's
        utime+stime taken every ~0.2 s; each end is interpolated between its neighbours.
    xmpp_muc_report.py table ROWS.tsv             the medians per server and case, markdown.
"""
import os
import statistics
import sys

HZ = os.sysconf("SC_CLK_TCK")


def at(samples, t):
    """CPU ticks at time t, linear between the samples around it (clamped at the ends)."""
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
    return samples[-1][1]


def window(path, start, end):
    samples = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 2:
                samples.append((float(p[0]), float(p[1])))
    if len(samples) < 2 or end <= start:
        print("nan")
        return
    print(f"{(at(samples, end) - at(samples, start)) / HZ:.3f}")


def num(v):
    try:
        return float(v)
    except ValueError:
        return None


def med(rows, key):
    vals = [num(r[key]) for r in rows if num(r.get(key, "")) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, digits=2):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def table(rows, servers, case, title, columns):
    """One case's table: a row per server of the medians of columns (header, key, digits)."""
    picked = [r for r in rows if r["case"] == case]
    if not picked:
        return
    print("### %s, medians of %d round(s)\n" % (title, max(int(r["round"]) for r in picked)))
    print("| server | " + " | ".join(h for h, _, _ in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for s in servers:
        rs = [r for r in picked if r["server"] == s]
        if rs:
            print(f"| {s} | " + " | ".join(fmt(med(rs, k), d) for _, k, d in columns) + " |")
    print()


def table(path):
    with open(path) as f:
        head = f.readline().rstrip("\n").split("\t")
        rows = [dict(zip(head, l.rstrip("\n").split("\t"))) for l in f if l.strip()]
    servers = list(dict.fromkeys(r["server"] for r in rows))
    table(rows, servers, "room", "One room", [
        ("occupants", "occupants", 0), ("senders", "senders", 0), ("msg/s", "rate", 0),
        ("deliveries", "delivered", 0), ("lost", "lost", 0),
        ("server CPU-s per million deliveries", "cpu_s_per_M", 2),
        ("deliveries per server CPU-s", "deliveries_per_cpu_s", 0),
        ("latency p50 ms", "p50_ms", 2), ("p99 ms", "p99_ms", 2),
        ("worst second p99 ms", "worst_second_p99_ms", 2),
        ("rtbench CPU-s (run)", "client_cpu_s", 2), ("load1", "load1", 2)])
    table(rows, servers, "rooms", "Small rooms", [
        ("rooms", "rooms", 0), ("occupants", "occupants", 0), ("joined", "joined", 0),
        ("failed", "failed", 0), ("RSS bare KB", "rss0_kb", 0),
        ("RSS logged in KB", "rss_login_kb", 0), ("RSS joined KB", "rss_joined_kb", 0),
        ("bytes per session", "bytes_per_session", 0), ("bytes per room", "bytes_per_room", 0),
        ("join s", "join_s", 2), ("load1", "load1", 2)])


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "window":
        window(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    else:
        sys.exit(__doc__)
