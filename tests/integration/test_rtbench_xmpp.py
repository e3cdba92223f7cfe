"""rtbench's XMPP commands against a real rtd, with small counts: logins succeed and are
counted, chat messages received == sent with latencies for each, the roster set-up gives
every account its 18 contacts with subscription both, and wrong passwords count as failed.

Run: /usr/bin/python3 -m pytest tests/integration/test_rtbench_xmpp.py
The binary is <RT_BUILD_DIR>/tools/rtbench/rtbench (default build/release).
"""
import json
import os
import re
import subprocess
import tempfile
import time

import pytest

import xmpp_util as X
from conftest import Rtd, free_port
from test_rtbench import RTBENCH

ACCOUNTS = 24  # xroster needs 19 or more: 18 contacts each


@pytest.fixture(scope="module")
def rtd():
    tmp = tempfile.TemporaryDirectory(prefix="rtd-rtbench-")
    X.add_users(tmp.name, [(f"u{i}@localhost", "pw") for i in range(ACCOUNTS)])
    port = free_port()
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{port}" }} }}',
                 "auth_max_delay_ms=0", "max_connections_per_ip=0", "max_connection_rate=0",
                 data_dir=tmp.name)
    broker.xport = port
    broker.salts = os.path.join(tmp.name, "salts")
    yield broker
    code, log = broker.stop()
    tmp.cleanup()
    assert code == 0, log[-3000:]


def bench(rtd, *args, check=True):
    p = subprocess.run([RTBENCH, *map(str, args), "-p", str(rtd.xport), "--salt-cache", rtd.salts,
                        "--json", "--quiet"], capture_output=True, text=True, timeout=120)
    if not check:
        return p
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_login_storm(rtd):
    s = bench(rtd, "xlogin", "-c", 4, "-L", 60, "--accounts", ACCOUNTS, "--procs", 2,
              "--ifaddr", "127.0.0.2,127.0.0.3")
    assert s["logins"] == s["run_logins"] == 60 and s["failed"] == 0 and s["lost"] == 0
    assert s["login"]["count"] == 60 and s["logins_per_s"] > 0
    assert 0 < s["login"]["p50_ms"] <= s["login"]["p99_ms"] <= s["login"]["max_ms"]
    # The cache: PBKDF2 once per account at most, whichever process met it first.
    assert s["pbkdf2"] <= 2 * ACCOUNTS
    again = bench(rtd, "xlogin", "-c", 2, "-L", 10, "--accounts", ACCOUNTS)
    assert again["pbkdf2"] == 0 and again["logins"] == 10


@pytest.mark.parametrize("apart", [False, True])
def test_chat_during_storm(rtd, apart):
    """The pairs and the storm shared over two processes, or (--pairs-apart) the pairs in a
    process of their own and the storm over the other two: the same counts either way."""
    split = ["--procs", 3, "--pairs-apart"] if apart else ["--procs", 2]
    s = bench(rtd, "xchat", "--pairs", 2, "--rate", 200, "-d", 2, "--storm", 12, "--hold",
              "--accounts", ACCOUNTS, *split)
    assert s["failed"] == 0 and s["lost"] == 0
    assert s["run_logins"] == 12 and s["logins"] == 4 + 12
    assert s["sent"] >= 2 * 200 * 1.5  # 2 pairs at 200/s for 2 s, whatever the load
    assert s["received"] == s["sent"] and s["missing"] == 0
    assert s["duplicates"] == 0 and s["gaps"] == 0 and s["foreign"] == 0
    assert s["chat"]["count"] == s["sent"]
    assert 0 < s["chat"]["p50_ms"] <= s["chat"]["p99_ms"] <= s["chat"]["max_ms"]


def test_storm_dropped_at_once_while_the_pairs_chat(rtd):
    """--leave-at: every held storm session's connection closes in one pass, mid-chat, with
    no stream end; the pairs' messages all arrive, and rtd ends every dropped session."""
    p = bench(rtd, "xchat", "--pairs", 2, "--rate", 200, "-d", 3, "--storm", 12, "--hold",
              "--accounts", ACCOUNTS, "--procs", 3, "--pairs-apart", "--leave-at", 1.5,
              check=False)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    # Every storm connection is open from its connect on (logged in or still logging in).
    assert sum(map(int, re.findall(r"dropped (\d+) storm sessions at 1.5 s", p.stderr))) == 12
    assert s["failed"] == 0 and s["lost"] == 0
    assert s["received"] == s["sent"] and s["missing"] == 0 and s["duplicates"] == 0
    # The pairs have logged out too: no stream is left once the dropped ones have ended.
    deadline = time.monotonic() + 60
    while X.metric(rtd, "rt_xmpp_streams") != 0:
        assert time.monotonic() < deadline, X.metric(rtd, "rt_xmpp_streams")
        time.sleep(0.05)
    assert X.metric(rtd, "rt_xmpp_sessions") == 0


def test_roster_setup_gives_18_contacts_both(rtd):
    s = bench(rtd, "xroster", "-c", ACCOUNTS)
    assert s["failed"] == 0 and s["logins"] == 2 * ACCOUNTS
    s = bench(rtd, "xidle", "-c", ACCOUNTS, "-d", 0.1)
    assert s["logins"] == ACCOUNTS and s["failed"] == 0 and s["lost"] == 0
    assert s["roster_both_per_login"] == 18.0


def test_wrong_password_counts_failed(rtd):
    p = bench(rtd, "xlogin", "-c", 1, "-L", 2, "--accounts", 1, "-P", "wrong", check=False)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["logins"] == 0 and s["failed"] == 2
    assert "login of u0: refused" in p.stderr


@pytest.mark.parametrize("args", [["xchat", "-c", 5], ["xlogin", "--hold"],
                                  ["xroster", "-c", 18], ["pairs", "--storm", 3],
                                  ["xlogin", "--tls"], ["xlogin", "--pairs-apart"],
                                  ["xchat", "--storm", 3, "--pairs-apart"],
                                  ["xlogin", "--leave-at", 1],
                                  ["xchat", "--storm", 3, "--procs", 2, "--hold", "--leave-at", 1],
                                  ["xchat", "--storm", 3, "--procs", 2, "--hold", "--pairs-apart",
                                   "-d", 1, "--leave-at", 2]])
def test_flag_errors(rtd, args):
    p = subprocess.run([RTBENCH, *map(str, args)], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and "rtbench:" in p.stderr
