"""rtd's memory as `rtctl vm` tells it apart (docs/ADMIN.md, "Memory by kind"): after a load
with rules firing into a SQLite sink, with clients connected, the kinds add up to the RSS the
kernel reports; and a rule worker is charged for its Lua state, whose memory cap still holds.

Run: RT_BUILD_DIR=$PWD/build/release /usr/bin/python3 -m pytest -q tests/integration/test_memory.py
"""
import os
import shutil
import subprocess
import time

import pytest

import mqtt_raw
from conftest import BUILD, ROOT, Rtd, sanitized, wait_for

RTBENCH = os.path.join(BUILD, "tools", "rtbench", "rtbench")
KIB = 1024

# glibc's M_TOP_PAD: how far past a request malloc grows an arena's top, memory it counts
# as held (mallinfo2) before anything touches it.
MALLOC_TOP_PAD = 128 * KIB
# What the vm command allocates for itself between reading malloc's figures and the RSS:
# the answer's tree and its rendering (a few 64 KiB arena chunks at most).
VM_OWN_WORK = 256 * KIB

HOARD_ENTRIES = 12000  # strings of HOARD_ENTRY bytes a rule keeps
HOARD_ENTRY = 1000
RULE_MEMORY = 20 * 1024 * 1024  # the hoard is more than half of it, and fits

HOARD_RULE = """local keep = {}
return {
    name = "hoard",
    from = "hoard/#",
    select = function(msg)
        if msg.payload == "grow" then
            for i = 1, %d do keep[i] = string.rep("x", %d) .. i end
        elseif msg.payload == "bomb" then
            local t = {} for i = 1, 1e9 do t[i] = string.rep("y", 1000) .. i end
        end
    end,
    to = { "archive" },
}
""" % (HOARD_ENTRIES, HOARD_ENTRY)


def rules_dir(tmp_path):
    d = tmp_path / "rules"
    d.mkdir()
    shutil.copy(os.path.join(ROOT, "etc", "rules", "archive.lua"), d / "archive.lua")
    (d / "hoard.lua").write_text(HOARD_RULE)
    return str(d)


def start(tmp_path, *extra):
    """rtd with the archive rule and the hoard, whose outcomes follow from bytes alone: its
    instruction budget and time limit are out of reach, under a sanitizer too."""
    data = tmp_path / "data"
    data.mkdir()
    return Rtd(f'rules_dir="{rules_dir(tmp_path)}"', f"rule_memory={RULE_MEMORY}",
               "rule_instructions=100000000", "rule_call_ms=60000", *extra, data_dir=str(data))


def status(pid, field):
    """A figure of /proc/PID/status, in bytes for the kB ones."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                parts = line.split()
                return int(parts[1]) * (KIB if parts[-1] == "kB" else 1)
    raise KeyError(field)


def by_kind(vm):
    return {k["kind"]: k["bytes"] for k in vm["memory_by_kind"]["kinds"]}


def actor_type(vm, name):
    for a in vm["memory_by_kind"]["actors"]:
        if a["type"] == name:
            return a
    return {"count": 0, "state": 0, "heap": 0, "ext": 0, "bytes": 0}


def publish(port, topic, payload, client_id="pub"):
    c = mqtt_raw.Raw(port, client_id, version=4)
    c.publish(topic, payload, qos=1, pid=1)
    c.sock.close()


def rule_metrics(rtd, name):
    return rtd.ctl_json("rules", "metrics", name)[0]


def archived(rtd):
    return rtd.ctl_json("sinks", "show", "archive")["written"]


@pytest.mark.skipif(not os.access(RTBENCH, os.X_OK), reason="rtbench not built")
def test_kinds_add_up_to_rss(tmp_path, stopper):
    rtd = start(tmp_path)
    stopper(rtd)
    pid = rtd.proc.pid

    # Clients that stay: subscribers on their own topics, as idle devices are.
    idle = []
    for i in range(200):
        c = mqtt_raw.Raw(rtd.port, f"idle-{i}", version=4)
        c.subscribe(f"idle/{i}", qos=1, pid=1)
        idle.append(c)

    # The load: publisher/subscriber pairs at QoS 1, every message archived by the rule.
    bench = subprocess.run([RTBENCH, "pairs", "-p", str(rtd.port), "-c", "50", "-q", "1",
                            "-d", "3", "--quiet", "--json"], capture_output=True, text=True,
                           timeout=60)
    assert bench.returncode == 0, bench.stderr
    published = rtd.ctl_json("broker", "metrics")["messages"]["in"]
    assert published > 1000
    assert wait_for(lambda: rule_metrics(rtd, "archive")["matched"] >= published, 30)
    assert wait_for(lambda: archived(rtd) >= published, 30)
    time.sleep(0.5)  # the last turns settle their charges

    vm = rtd.ctl_json("vm")
    rss = status(pid, "VmRSS")
    threads = status(pid, "Threads")
    kinds = by_kind(vm)
    mk = vm["memory_by_kind"]
    total = sum(b for k, b in kinds.items() if k != "unexplained")
    assert total == mk["explained"] and kinds["unexplained"] == mk["rss"] - total

    # What the kinds may miss or overcount, by mechanism:
    #  - malloc counts an arena's top padding as held before it is touched: at most
    #    MALLOC_TOP_PAD per arena, and glibc makes at most one arena per thread;
    #  - each scheduler's read buffer is allocated whole and touched only as far as reads
    #    fill it (the "runtime: schedulers" line holds them);
    #  - the vm command's own allocations, made between its reading malloc and the RSS.
    # Everything else is measured where it lives (mincore, smaps, exact counts).
    tol = threads * (MALLOC_TOP_PAD + 4 * KIB) + kinds["runtime: schedulers"] + VM_OWN_WORK
    print(f"rss {rss}, kinds {total}, unexplained {rss - total} "
          f"({100.0 * (rss - total) / rss:+.1f}%), tolerance {tol} ({100.0 * tol / rss:.1f}%)")
    for k in mk["kinds"]:
        print(f"  {k['kind']:28} {k['bytes']:>12} {k['share']:6.1f}%")
    assert sanitized(pid) or abs(rss - total) <= tol

    # The long-lived actors report their memory: the sink and the store what SQLite holds for
    # them (nearly all SQLite holds), the rule workers their Lua states.
    assert actor_type(vm, "sink")["ext"] > 0 and actor_type(vm, "store")["ext"] > 0
    assert kinds["sqlite: no actor"] < actor_type(vm, "sink")["ext"]
    assert actor_type(vm, "rule_worker")["ext"] > 0
    assert actor_type(vm, "mqtt_conn")["count"] >= len(idle)
    for c in idle:
        c.sock.close()


def test_rule_worker_charged_for_lua(tmp_path, stopper):
    rtd = start(tmp_path, "rule_workers=1")
    stopper(rtd)
    publish(rtd.port, "hoard/1", b"noop")  # the worker takes the rule set's state
    assert wait_for(lambda: rule_metrics(rtd, "hoard")["matched"] == 1, 10)
    assert wait_for(lambda: actor_type(rtd.ctl_json("vm"), "rule_worker")["ext"] > 0, 10)
    before = actor_type(rtd.ctl_json("vm"), "rule_worker")["ext"]

    publish(rtd.port, "hoard/1", b"grow")
    assert wait_for(lambda: rule_metrics(rtd, "hoard")["matched"] == 2, 10)
    # At least the kept strings' bytes, charged at the end of the message.
    grown = before + HOARD_ENTRIES * HOARD_ENTRY
    assert wait_for(lambda: actor_type(rtd.ctl_json("vm"), "rule_worker")["ext"] >= grown, 10)
    after = actor_type(rtd.ctl_json("vm"), "rule_worker")["ext"]
    assert after < before + RULE_MEMORY  # the state stays under its cap

    # The cap still stops a rule; the state is then more than half full of the hoard, so the
    # rule's environment is rebuilt, the hoard goes, and so does the charge.
    publish(rtd.port, "hoard/1", b"bomb")
    assert wait_for(lambda: rule_metrics(rtd, "hoard")["matched"] == 3, 30)
    assert rule_metrics(rtd, "hoard")["memory"] == 1
    assert wait_for(lambda: actor_type(rtd.ctl_json("vm"), "rule_worker")["ext"] <
                    after - HOARD_ENTRIES * HOARD_ENTRY, 10)
