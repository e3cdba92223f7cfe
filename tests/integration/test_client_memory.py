"""A connection's memory as rtctl reports it: what a session holds (its queue, its
subscriptions) is on its actor's heap and among the binaries that heap holds, so `actors
info`, `actors list`, `top` and `clients show` count it, and it is all given back when the
client leaves.

The broker here runs with nothing else that holds messages or allocates on a heap of its
own accord (no persistence, no rules, no $SYS), so what moves is the clients'.
"""
import time

import paho.mqtt.client as mqtt
import pytest

from conftest import Rtd, client, subscribe, wait_for

QUEUED = 10_000
PAYLOAD = 1024

# The smallest heap object is 16 bytes; a queued message is one object, its record (40
# bytes and its subscription ids: 48 bytes) holding its binary in its first word. A
# subscription is a 16-byte list entry and its filter's copy (at least one 16-byte object).
MSG_HEAP_MIN = 48
SUB_HEAP_MIN = 16 + 16
# What a heap keeps beyond its live objects once they are freed: at most one empty chunk of
# 1 KiB per size class, of which there are ten.
HEAP_SLACK = 10 * 1024
# A connection's first objects live in its actor (RT_CONN_HEAP_INLINE), not on its heap.
INLINE = 48


@pytest.fixture
def quiet(tmp_path, stopper):
    rules = tmp_path / "rules"
    rules.mkdir()
    b = Rtd("persistence=false", f'rules_dir="{rules}"', "sys_interval=0",
            f"max_queued_messages={QUEUED}", f"max_client_memory={4 * QUEUED * PAYLOAD}")
    stopper(b)
    return b


def vm_memory(b):
    m = b.ctl_json("vm")["memory"]
    return {k: m[k] for k in ("actors", "actor_heaps", "binaries", "binaries_held")}


def publish_all(port, topic, n, size):
    p = mqtt.Client(client_id="mem-pub")
    p.max_inflight_messages_set(100)
    p.max_queued_messages_set(0)
    p.connect("127.0.0.1", port)
    p.loop_start()
    try:
        infos = [p.publish(topic, b"x" * size, qos=1) for _ in range(n)]
        for i in infos:
            i.wait_for_publish(30)
            assert i.is_published()
    finally:
        p.disconnect()
        p.loop_stop()


def test_offline_queue_is_the_sessions_memory(quiet):
    b = quiet
    before = vm_memory(b)
    s = client(b.port, "mem-sub", clean=False)
    subscribe(s, "mem/#", 1)
    s.disconnect()
    s.loop_stop()
    b.wait_offline("mem-sub")
    publish_all(b.port, "mem/t", QUEUED, PAYLOAD)
    assert wait_for(lambda: b.ctl_json("clients", "show", "mem-sub")["queued"] == QUEUED, 30)

    show = b.ctl_json("clients", "show", "mem-sub")
    info = b.ctl_json("actors", "info", show["pid"])
    # Each queued message holds its canonical PUBLISH (the payload and more) as a binary,
    # through its record on the heap.
    for fig in (show, info):
        assert fig["bin_bytes"] >= QUEUED * PAYLOAD, fig
        assert fig["heap_bytes"] >= QUEUED * MSG_HEAP_MIN - INLINE, fig
        assert fig["memory"] == (fig["state_bytes"] + fig["heap_bytes"] + fig["bin_bytes"] +
                                 fig["ext_bytes"]), fig
        assert fig["memory"] >= 10_000_000
    assert info["gcs"] >= 1 and info["gc_max_pause_us"] >= info["gc_last_pause_us"]
    listed = b.ctl_json("actors", "list", "--sort", "memory", "--limit", "1")
    assert listed[0]["pid"] == show["pid"] and listed[0]["memory"] >= 10_000_000
    top = b.ctl_json("top", "--sort", "memory", "-n", "1")
    assert top["actors"][0]["pid"] == show["pid"]
    row = [r for r in b.ctl_json("clients", "list") if r["client_id"] == "mem-sub"][0]
    assert row["memory"] >= 10_000_000
    mid = vm_memory(b)
    assert mid["binaries_held"] - before["binaries_held"] >= QUEUED * PAYLOAD

    # Once the session ends its heap goes whole with the binaries it held, and its actor
    # struct is freed. Nothing else here holds a message, so the binaries fall back to what
    # they were; actor structs too (or below: an admin connection alive at the first sample
    # may be gone); other heaps (the admin actors that answer rtctl) may keep up to a heap's
    # slack of empty chunks more than before.
    assert b.ctl("clients", "kick", "mem-sub")[0] == 0

    def returned():
        now = vm_memory(b)
        return (now["binaries"] <= before["binaries"] and
                now["binaries_held"] <= before["binaries_held"] and
                now["actors"] <= before["actors"] and
                now["actor_heaps"] <= before["actor_heaps"] + HEAP_SLACK)
    assert wait_for(returned, 10), (before, vm_memory(b))


def test_subscriptions_are_the_clients_memory(quiet):
    b = quiet
    c = client(b.port, "many-subs")
    try:
        subscribe(c, "many/0/#", 1)
        one = b.ctl_json("clients", "show", "many-subs")
        n = 1000
        for k in range(1, n, 111):
            done = []
            c.on_subscribe = lambda *a: done.append(1)
            c.subscribe([(f"many/{i}/#", 1) for i in range(k, min(k + 111, n))])
            assert wait_for(lambda: done)
        full = b.ctl_json("clients", "show", "many-subs")
        assert full["subscriptions"] == n and len(full["subscription_list"]) == n
        assert full["heap_bytes"] >= n * SUB_HEAP_MIN - INLINE, (one, full)
        assert full["memory"] - one["memory"] >= (n - 1) * SUB_HEAP_MIN - INLINE, (one, full)
        info = b.ctl_json("actors", "info", full["pid"])
        assert info["memory"] == full["memory"]

        # Unsubscribing frees each filter at once; the list keeps its capacity (n entries,
        # doubled from one: 1024 of them, one large object of 16 bytes each and its header).
        done = []
        c.on_unsubscribe = lambda *a: done.append(1)
        c.unsubscribe([f"many/{i}/#" for i in range(1, n)])
        assert wait_for(lambda: done)
        after = b.ctl_json("clients", "show", "many-subs")
        assert after["subscriptions"] == 1
        assert after["heap_bytes"] <= one["heap_bytes"] + 1024 * 16 + 64 + HEAP_SLACK, (one,
                                                                                      after)
    finally:
        c.disconnect()
        c.loop_stop()
