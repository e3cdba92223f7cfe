"""The banned list and flapping detection (docs/AUTH.md, "Banned clients"), against rtd with
real clients: a ban by client id, user name or address range refuses the CONNECT with MQTT 5
reason 0x8A or 3.1.1 code 5, is counted and logged, and leaves other clients alone; bans
expire, are deleted, kept across a restart with persistence on, and managed through rtctl
and the HTTP API; a client id that reconnects flapping_max_connects times within the window
is banned by the connect that makes it so (paho in a reconnect loop)."""
import time

import paho.mqtt.client as paho
import pytest

from conftest import Rtd, wait_for
from mqtt_raw import Raw
from test_http import call, start_http

BANNED_V5, REFUSED_V311 = 0x8A, 5


def connack(broker, cid, version=5, **kw):
    c = Raw(broker.port, cid, version=version, **kw)
    code = c.connack_code
    if code == 0:
        c.disconnect()
    return code


def metric(broker, line_start):
    code, out, err = broker.ctl("metrics", "prometheus")
    assert code == 0, err
    return [ln for ln in out.splitlines() if ln.startswith(line_start)]


@pytest.mark.parametrize("version", [4, 5])
def test_each_kind_of_ban_refuses_only_what_it_names(rtd, version):
    refused = BANNED_V5 if version == 5 else REFUSED_V311
    for kind, value in [("clientid", "evil"), ("username", "mallory"),
                        ("address", "127.0.0.2/32")]:
        code, out, err = rtd.ctl("banned", "add", kind, value, "--reason", f"no {kind}")
        assert code == 0, err
    assert connack(rtd, "evil", version) == refused
    assert connack(rtd, "good", version, username="mallory", password="x") == refused
    assert connack(rtd, "good", version, bind="127.0.0.2") == refused
    # Neighbours of each ban connect.
    assert connack(rtd, "evil2", version) == 0
    assert connack(rtd, "good", version, username="mallory2", password="x") == 0
    assert connack(rtd, "good", version, bind="127.0.0.3") == 0
    log = rtd.read_log()
    assert "event=client.banned client=evil " in log and "kind=clientid" in log
    assert 'kind=username value=mallory reason="no username"' in log
    assert "kind=address value=127.0.0.2/32" in log
    assert metric(rtd, "rt_banned_refusals_total") == [
        'rt_banned_refusals_total{kind="clientid"} 1',
        'rt_banned_refusals_total{kind="username"} 1',
        'rt_banned_refusals_total{kind="address"} 1']
    assert metric(rtd, "rt_banned ") == ["rt_banned 3"]


def test_open_connections_stay_and_a_deleted_ban_lets_in(rtd):
    inside = Raw(rtd.port, "inside")
    assert inside.connack_code == 0
    assert rtd.ctl("banned", "add", "clientid", "inside")[0] == 0
    inside.subscribe("still/served")  # answered: a ban refuses CONNECTs from now on
    assert connack(rtd, "inside") == BANNED_V5  # (it takes the session over when let in)
    code, out, err = rtd.ctl("banned", "del", "clientid", "inside")
    assert code == 0, err
    assert rtd.ctl("banned", "del", "clientid", "inside")[0] != 0  # 404: gone
    assert connack(rtd, "inside") == 0


def test_a_ban_runs_out(rtd):
    body = rtd.ctl_json("banned", "add", "clientid", "brief", "--duration", "3")
    until = body["until"]
    assert until >= time.time() + 2 - 1  # whole seconds: at least 2 s from the add
    assert connack(rtd, "brief") == BANNED_V5
    # Refused until `until` (Unix seconds), let in once it passed.
    assert wait_for(lambda: connack(rtd, "brief") == 0, timeout=until - time.time() + 5)
    assert time.time() >= until
    assert [b for b in rtd.ctl_json("banned", "list") if b["value"] == "brief"] == []


def test_bad_requests_are_refused_with_reasons(rtd):
    for args, says in [(("banned", "add", "hostname", "x"), "kind: clientid, username or address"),
                       (("banned", "add", "address", "10.0.0.300"), "an IPv4 or IPv6 address"),
                       (("banned", "add", "address", "10.0.0.0/40"), "an IPv4 or IPv6 address"),
                       (("banned", "add", "clientid"), "usage: banned add"),
                       (("banned", "add", "clientid", "x", "--duration", "-1"), "--duration")]:
        code, out, err = rtd.ctl(*args)
        assert code != 0 and says in err + out, (args, out, err)
    assert rtd.ctl_json("banned", "list") == []


def test_kept_across_a_restart_with_persistence(tmp_path):
    broker = Rtd("persistence=true", data_dir=str(tmp_path))
    try:
        assert broker.ctl("banned", "add", "address", "127.0.0.9", "--reason", "scanner")[0] == 0
        assert broker.ctl("banned", "add", "clientid", "short", "--duration", "3600")[0] == 0
    finally:
        assert broker.stop()[0] == 0
    again = Rtd("persistence=true", data_dir=str(tmp_path))
    try:
        bans = {b["value"]: b for b in again.ctl_json("banned", "list")}
        assert set(bans) == {"127.0.0.9/32", "short"}
        assert bans["127.0.0.9/32"]["reason"] == "scanner" and bans["127.0.0.9/32"]["until"] is None
        assert bans["short"]["until"] > time.time() + 3500
        assert connack(again, "x", bind="127.0.0.9") == BANNED_V5
        assert "event=store.banned_loaded bans=2" in again.read_log()
    finally:
        assert again.stop()[0] == 0


def test_through_the_http_api(tmp_path):
    broker = start_http(tmp_path)
    try:
        st, body = call(broker, "/api/v1/banned/add", broker.admin_key, "POST",
                        body={"kind": "username", "value": "api-user", "reason": "from the API",
                              "duration": "600"})
        assert st == 200 and body["banned"] == "username", body
        st, body = call(broker, "/api/v1/banned/add", broker.read_key, "POST",
                        body={"kind": "clientid", "value": "nope"})
        assert st == 403, body  # a read key changes nothing
        st, body = call(broker, "/api/v1/banned/list", broker.read_key)
        assert st == 200 and [(b["kind"], b["value"], b["reason"]) for b in body] == \
            [("username", "api-user", "from the API")]
        assert connack(broker, "c", username="api-user", password="x") == BANNED_V5
        st, body = call(broker, "/api/v1/banned/del", broker.admin_key, "POST",
                        body={"kind": "username", "value": "api-user"})
        assert st == 200, body
        assert connack(broker, "c", username="api-user", password="x") == 0
    finally:
        code, log = broker.stop()
        assert code == 0, log[-3000:]


def test_flapping_client_is_banned_by_a_reconnect_loop():
    max_connects = 5
    broker = Rtd(f"flapping_max_connects={max_connects}", "flapping_window_s=600",
                 "flapping_ban_s=120")
    try:
        results = []
        for _ in range(max_connects + 2):  # bounded: the loop ends on its own count
            c = paho.Client(client_id="flapper", protocol=paho.MQTTv5)
            got = []
            c.on_connect = lambda _c, _u, _f, rc, _p=None: got.append(rc.value)
            c.connect("127.0.0.1", broker.port)
            c.loop_start()
            assert wait_for(lambda: got, timeout=10)
            c.disconnect()
            c.loop_stop()
            results.append(got[0])
        # The connects before the one that makes max_connects are served; it and those after
        # are refused as banned.
        assert results == [0] * (max_connects - 1) + [BANNED_V5] * 3, results
        log = broker.read_log()
        assert (f"event=client.flapping client=flapper connects={max_connects} window_s=600 "
                "ban_s=120") in log
        [ban] = broker.ctl_json("banned", "list")
        assert ban["value"] == "flapper" and ban["by"] == "flapping"
        assert ban["until"] - ban["at"] == 120
        assert metric(broker, "rt_flapping_bans_total") == ["rt_flapping_bans_total 1"]
        # Another client id is not affected.
        assert connack(broker, "steady") == 0
    finally:
        code, log = broker.stop()
        assert code == 0, log[-3000:]


def test_live_settings_switch_flapping_on(rtd):
    assert rtd.ctl("config", "set", "flapping_max_connects", "2")[0] == 0
    assert connack(rtd, "twice") == 0
    assert connack(rtd, "twice") == BANNED_V5
    assert rtd.ctl("config", "set", "flapping_max_connects", "0")[0] == 0
    assert rtd.ctl("banned", "del", "clientid", "twice")[0] == 0
    assert all(connack(rtd, "twice") == 0 for _ in range(3))


def test_max_banned_bounds_the_list(rtd):
    assert rtd.ctl("config", "set", "max_banned", "2")[0] == 0
    assert rtd.ctl("banned", "add", "clientid", "a")[0] == 0
    assert rtd.ctl("banned", "add", "clientid", "b")[0] == 0
    code, out, err = rtd.ctl("banned", "add", "clientid", "c")
    assert code != 0 and "max_banned" in err + out
    assert rtd.ctl("banned", "add", "clientid", "b", "--reason", "replaced")[0] == 0
    assert len(rtd.ctl_json("banned", "list")) == 2
