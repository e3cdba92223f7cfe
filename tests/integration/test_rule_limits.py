"""What a rule may cost the broker, through a real rtd (issue 27, 6b and 6c): a dry run of a
rule (`rules test`) is for the admin role alone and runs beside the other admin commands, not
in front of them; a publisher that never reads its PUBACKs cannot queue more than a bounded
number of messages at its rule worker, and the other publishers' rules go on. The rule
engine's own limits (the deadline, charged C loops) are tested in tests/unit/test_rule_limits.c.
"""
import json
import threading
import time
import urllib.error
import urllib.request

from conftest import Rtd, wait_for
from test_http import call, make_key

# A rule that spins until the wall-clock limit ends it when the payload says so; any other
# message (the load-time dry run's made-up one) passes at once.
SPIN_RULE = """return {
  name = "spin", from = { "spin/#" }, to = { "db" },
  select = function(msg)
    if msg.payload == "spin" then while true do end end
    return { topic = msg.topic }
  end,
}
"""
SPIN_MS = 3000  # rule_call_ms here: how long a spinning `rules test` holds its worker


def start_spin(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "spin.lua").write_text(SPIN_RULE)
    keys = tmp_path / "api_keys"
    admin, reader = make_key(keys, "ops", "admin"), make_key(keys, "viewer", "read")
    from conftest import free_port
    hport = free_port()
    broker = Rtd(f'rules_dir="{rules}"',
                 f'sinks={{db={{type="sqlite",file="{tmp_path}/rows.db"}}}}',
                 f"rule_call_ms={SPIN_MS}", "rule_instructions=1000000000",
                 f'http={{bind="127.0.0.1:{hport}", api_keys_file="{keys}"}}',
                 data_dir=str(tmp_path))
    broker.hport, broker.admin_key, broker.read_key = hport, admin, reader
    return broker


def test_rules_test_needs_the_admin_role(tmp_path):
    """`rules test` runs a payload of the caller's through the rules for up to rule_call_ms: a
    read key gets 403 whatever the method or the path (the stream endpoint included); an admin
    key may GET it (it changes nothing) or POST it."""
    rtd = start_spin(tmp_path)
    try:
        path = "/api/v1/rules/test/spin?topic=spin/1&payload=x"
        for method in ("GET", "POST"):
            code, body = call(rtd, path, key=rtd.read_key, method=method)
            assert code == 403 and "admin role" in body["error"], (method, code, body)
        code, body = call(rtd, "/api/v1/rules/test", key=rtd.read_key, method="POST",
                          body={"name": "spin", "topic": "spin/1", "payload": "x"})
        assert code == 403 and "runs rules on a payload" in body["error"], body
        code, body = call(rtd, "/api/v1/stream/rules/test/spin?topic=spin/1&payload=x&every=1",
                          key=rtd.read_key)
        assert code == 403, (code, body)
        for method in ("GET", "POST"):
            code, body = call(rtd, path, key=rtd.admin_key, method=method)
            assert code == 200 and body["rows"] == [{"topic": "spin/1"}], (method, code, body)
    finally:
        code, log = rtd.stop()
        assert code == 0, log[-3000:]


def admin_workers(rtd):
    """The pids of the admin group's workers (every child but the listener)."""
    def walk(node):
        yield node
        for c in node.get("children", []):
            yield from walk(c)
    tree = rtd.ctl_json("tree")
    roots = tree if isinstance(tree, list) else [tree]
    for root in roots:
        for n in walk(root):
            if n.get("name") == "admin_sup":
                return [c["pid"] for c in n["children"] if c["name"] != "admin" and c["pid"]]
    raise AssertionError(tree)


def test_metrics_do_not_wait_behind_a_rule_test(tmp_path):
    """A `rules test` whose rule spins holds the worker running it for rule_call_ms; a /metrics
    scrape sent meanwhile is answered before it ends. Before, both ran on the one admin worker
    and the scrape waited the whole run (9 s in the review)."""
    rtd = start_spin(tmp_path)
    try:
        workers = admin_workers(rtd)
        done = {}

        def spin():
            done["result"] = rtd.ctl("rules", "test", "spin", "--topic", "spin/1",
                                     "--payload", "spin")
            done["at"] = time.monotonic()

        t = threading.Thread(target=spin)
        t.start()
        # The barrier: a worker is handling the job (`actors info` answers on the connection,
        # not on a worker, so it is not queued behind the run).
        def running():
            for pid in workers:
                code, out, _ = rtd.ctl("actors", "info", pid, json=True)
                if code == 0 and json.loads(out)["handler"] == "job":
                    return True
            return False
        assert wait_for(running, SPIN_MS / 1000), "no admin worker ran the rule test"
        req = urllib.request.Request(f"http://127.0.0.1:{rtd.hport}/metrics",
                                     headers={"Authorization": f"Bearer {rtd.read_key}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and "rt_connections" in r.read().decode()
        scraped = time.monotonic()
        t.join(SPIN_MS / 1000 + 30)
        assert not t.is_alive()
        code, out, err = done["result"]
        assert code != 0 and "time limit of 3000 ms exceeded" in out + err, (code, out, err)
        assert scraped < done["at"], "the scrape was answered after the rule test"
    finally:
        code, log = rtd.stop()
        assert code == 0, log[-3000:]
