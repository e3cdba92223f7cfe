"""Tsung 1.7's jabber plugin (the load tool of ProcessOne's ejabberd benchmarks) against rtd's
XMPP server: the benchmark's scenario (tests/bench/xmpp_tsung.py) at a few hundred users, each
with 18 contacts. Every session connects and authenticates (SASL PLAIN over direct TLS: the
plugin has no SCRAM), binds, gets its roster, sends presence, chats to online users; Tsung
counts no error, every chat message sent arrives once (each by its stamp in Tsung's dump), and
rtd's /metrics agree: one login per session, no failure, no stream error, nothing stored
offline.
"""
import os
import re
import ssl
import subprocess
import sys
import tempfile
import urllib.request

import pytest

import xmpp_util as X
from conftest import ROOT, Rtd, free_port
from test_http import make_key

sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
import xmpp_tsung  # noqa: E402

USERS, CONTACTS = 200, 18
MESSAGES, INTERVAL_S, RATE = 5, 2, 40  # chat messages a session, seconds apart; arrivals/s


@pytest.fixture(scope="module")
def server(pki):
    """rtd with USERS accounts, each with CONTACTS mutual subscriptions, a plain listener
    (where xmpp_load.py made the rosters) and a direct TLS one (Tsung's)."""
    tmp = tempfile.TemporaryDirectory(prefix="rtd-xtsung-")
    X.add_users(tmp.name, [(f"{xmpp_tsung.USER}{i}@localhost", f"{xmpp_tsung.PASSWORD}{i}")
                           for i in range(1, USERS + 1)])
    cert, key = pki.server["ec"]
    port, tport, hport = free_port(), free_port(), free_port()
    keys = f"{tmp.name}/api_keys"
    reader = make_key(keys, "viewer", "read")
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{port}", '
                 f'{{ bind = "127.0.0.1:{tport}", tls = {{ cert = "{cert}", key = "{key}" }} }}'
                 f' }} }}',
                 f'http={{bind="127.0.0.1:{hport}", api_keys_file="{keys}"}}', data_dir=tmp.name)
    broker.xport, broker.tport, broker.hport, broker.read_key = port, tport, hport, reader
    try:
        out = subprocess.run(
            [sys.executable, os.path.join(ROOT, "tests", "bench", "xmpp_load.py"), "roster",
             "--port", str(port), "--users", f"{xmpp_tsung.USER}%d:{xmpp_tsung.PASSWORD}%d:"
             f"{USERS}:1", "--contacts", str(CONTACTS), "--deadline", "120"],
            capture_output=True, text=True, timeout=180)
        assert out.returncode == 0 and f'"complete": {USERS}' in out.stdout, out
        yield broker
    finally:
        code, log = broker.stop()
        tmp.cleanup()
    assert code == 0, log[-3000:]


def metrics(broker):
    req = urllib.request.Request(f"http://127.0.0.1:{broker.hport}/metrics",
                                 headers={"Authorization": f"Bearer {broker.read_key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): int(float(m.group(2)))
            for m in re.finditer(r"^(rt_xmpp_\w+) (\S+)$", text, re.M)}


@pytest.mark.long
def test_tsung_ejabberd_scenario(server, tmp_path):
    roster = server.ctl_json("xmpp", "roster", f"{xmpp_tsung.USER}1@localhost")
    assert len(roster) == CONTACTS and {r["subscription"] for r in roster} == {"both"}, roster
    before = metrics(server)
    xml = tmp_path / "xmpp.xml"
    xml.write_text(xmpp_tsung.scenario(server.tport, USERS, RATE, MESSAGES, INTERVAL_S, 64))
    length = xmpp_tsung.timeline(USERS, RATE, MESSAGES, INTERVAL_S)[3]
    with xmpp_tsung.running(xml, str(tmp_path)) as tsung:
        out, _ = tsung.communicate(timeout=length + 120)
    assert tsung.returncode == 0, out
    after = metrics(server)
    r = xmpp_tsung.result(str(tmp_path / "log"))

    # Tsung: every session through each step, no error of any kind, every message once.
    ended = [line for line in server.read_log().splitlines()
             if "event=xmpp.stream_error" in line or "event=xmpp.connect_timeout" in line]
    assert (r["users_started"], r["connected"], r["auth"], r["bind"], r["roster"],
            r["finished"]) == (USERS,) * 6, (r, ended[:10])
    assert r["errors"] == {}, (r, ended[:10])
    assert r["sent"] == USERS * MESSAGES, r
    assert (r["received"], r["lost"], r["extra"]) == (r["sent"], 0, 0), r
    # rtd: one PLAIN login a session and nothing refused, ended or kept for later.
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert d["rt_xmpp_logins_total"] == USERS, d
    for k in ("rt_xmpp_login_failures_total", "rt_xmpp_stream_errors_total",
              "rt_xmpp_offline_stored_total", "rt_xmpp_connect_timeouts_total"):
        assert d[k] == 0, (k, d)
    # Each chat message was routed once, beside the presences to and from online contacts.
    assert d["rt_xmpp_stanzas_routed_total"] >= r["sent"], d


def test_stream_restart_after_plain(server):
    """What Tsung does: PLAIN, then at once (after <success/>) the new stream's header, which
    the server reads as a new stream (its parser reset when the store's answer came)."""
    r = X.Raw(server.tport)
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    r.sock = ctx.wrap_socket(r.sock, server_hostname="localhost")
    r.open()
    r.sasl("PLAIN", f"\0{xmpp_tsung.USER}1\0{xmpp_tsung.PASSWORD}1".encode())
    assert r.sasl_reply()[0] == "success"
    feats = r.open()
    assert f"<bind xmlns='{X.NS_BIND}'" in feats, feats
    r.close()
