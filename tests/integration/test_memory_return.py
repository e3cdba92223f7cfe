"""Memory goes back to the system when connections leave (issue 14): 19,000 idle clients
connect and leave, twice, and rtd's RSS returns to within 10% of where it was before they
came, plus what the id tables keep at their high-water mark: a pid's or timer's id keeps its
generation for good (so a stale pid or timer reference can never name a new actor), and the
pages of the pid slot table, the id pools and the timer state table that a peak touched stay.
Per client that is at most ID_TABLES_BYTES; the second wave adds nothing to it.

What gives it back (runtime/sched.c idle_trim): once no actor has exited for 200 ms, an idle
scheduler drops its timers for exited actors, hands its cached actor structs, heap chunks
and envelopes to the shared pools, gives back every slab page with no live actor on it
(MADV_DONTNEED), unmaps empty heap arenas and calls malloc_trim. A trim that found pages
still in use retries after 1 s, then 2 s, 4 s...: the deadline below is the quiet period
plus three such retries, with the rest of the time for the clients to go.

Run: /usr/bin/python3 -m pytest tests/integration/test_memory_return.py
"""
import json
import os
import subprocess
import time

import pytest

from conftest import BUILD, Rtd, raise_nofile, rss_kb

RTBENCH = os.path.join(BUILD, "tools", "rtbench", "rtbench")
CLIENTS = 19000
# Per connection, at the high-water mark: its pid (8 B slot, 4 B generation, 4 B free link)
# and up to three timer ids at once (8 B state, 4 + 4 B in their pool).
ID_TABLES_BYTES = 16 + 3 * 16

# Sanitizer allocators keep freed memory in quarantine by design: RSS says nothing there.
pytestmark = pytest.mark.skipif(any(s in BUILD for s in ("asan", "tsan")),
                                reason="RSS is only meaningful with the release allocator")


def wave(broker, base):
    """19,000 clients connect, stay 3 s and leave; returns the peak RSS, KB."""
    # Two processes: one may hold at most 20,000 descriptors here.
    bench = subprocess.Popen(
        [RTBENCH, "conn", "-c", str(CLIENTS), "-i", "0", "--procs", "2", "-d", "3",
         "--ifaddr", "127.0.0.1,127.0.0.2", "-p", str(broker.port), "--json", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = base
    deadline = time.time() + 120
    while bench.poll() is None:
        assert time.time() < deadline, "rtbench did not finish"
        peak = max(peak, rss_kb(broker.proc.pid))
        time.sleep(0.1)
    out, err = bench.communicate()
    summary = json.loads(out)
    assert summary["connected"] == CLIENTS and summary["failed"] == 0, err
    # The clients were really held: a few hundred bytes each at the least.
    assert (peak - base) * 1024 >= CLIENTS * 300, (base, peak)
    return peak


def settle(broker, limit):
    """RSS once it is at most limit KB, or when the trims' deadline has passed."""
    deadline = time.time() + 0.2 + 1 + 2 + 4 + 10
    now = rss_kb(broker.proc.pid)
    while now > limit and time.time() < deadline:
        time.sleep(0.2)
        now = rss_kb(broker.proc.pid)
    return now


def test_rss_returns_after_clients_leave(stopper):
    raise_nofile()  # here, not per child: rtd and both rtbench processes hold thousands
    broker = Rtd("persistence=false")
    stopper(broker)
    time.sleep(0.5)  # start-up allocations (rule workers, sinks) settle
    base = rss_kb(broker.proc.pid)
    limit = base * 1.10 + CLIENTS * ID_TABLES_BYTES / 1024
    for n in (1, 2):
        peak = wave(broker, base)
        now = settle(broker, limit)
        print(f"wave {n}: RSS before {base} KB, peak {peak} KB, after {now} KB (limit {limit:.0f})")
        assert now <= limit, f"wave {n}: RSS {now} KB after the clients left; {base} KB before"
