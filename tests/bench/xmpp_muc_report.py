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


def table(path):
    with open(path) as f:
        head = f.readline().rstrip("\n").split("\t")
        rows = [dict(zip(head, l.rstrip("\n").split("\t"))) for l in f if l.strip()]
    servers = list(dict.fromkeys(r["server"] for r in rows))
    room = [r for r in rows if r["case"] == "room"]
    if room:
        print("### One room, medians of %d round(s)\n" % max(int(r["round"]) for r in room))
        print("| server | occupants | senders | msg/s | deliveries | lost | server CPU-s per "
              "million deliveries | deliveries per server CPU-s | latency p50 ms | p99 ms | "
              "worst second p99 ms | rtbench CPU-s (run) | load1 |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for s in servers:
            rs = [r for r in room if r["server"] == s]
            if not rs:
                continue
            print(f"| {s} | {fmt(med(rs, 'occupants'), 0)} | {fmt(med(rs, 'senders'), 0)} | "
                  f"{fmt(med(rs, 'rate'), 0)} | {fmt(med(rs, 'delivered'), 0)} | "
                  f"{fmt(med(rs, 'lost'), 0)} | {fmt(med(rs, 'cpu_s_per_M'))} | "
                  f"{fmt(med(rs, 'deliveries_per_cpu_s'), 0)} | {fmt(med(rs, 'p50_ms'))} | "
                  f"{fmt(med(rs, 'p99_ms'))} | {fmt(med(rs, 'worst_second_p99_ms'))} | "
                  f"{fmt(med(rs, 'client_cpu_s'))} | {fmt(med(rs, 'load1'))} |")
        print()
    rooms = [r for r in rows if r["case"] == "rooms"]
    if rooms:
        print("### Small rooms, medians of %d round(s)\n" % max(int(r["round"]) for r in rooms))
        print("| server | rooms | occupants | joined | failed | RSS bare KB | RSS logged in KB | "
              "RSS joined KB | bytes per session | bytes per room | join s | load1 |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for s in servers:
            rs = [r for r in rooms if r["server"] == s]
            if not rs:
                continue
            print(f"| {s} | {fmt(med(rs, 'rooms'), 0)} | {fmt(med(rs, 'occupants'), 0)} | "
                  f"{fmt(med(rs, 'joined'), 0)} | {fmt(med(rs, 'failed'), 0)} | "
                  f"{fmt(med(rs, 'rss0_kb'), 0)} | {fmt(med(rs, 'rss_login_kb'), 0)} | "
                  f"{fmt(med(rs, 'rss_joined_kb'), 0)} | {fmt(med(rs, 'bytes_per_session'), 0)} | "
                  f"{fmt(med(rs, 'bytes_per_room'), 0)} | {fmt(med(rs, 'join_s'))} | "
                  f"{fmt(med(rs, 'load1'))} |")
        print()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "window":
        window(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    else:
        sys.exit(__doc__)
