"""The HTTP API's keys while rtd runs (issue 28, part 4): `rtctl apikey list|add|revoke|reload`
and the same over HTTP, the key file read again on SIGHUP, rewritten atomically (0600) by
rtd while `rtd apikey` adds to it, `rtd apikey` finding the file from the config, and an
http table without a key file said at start. Real rtd, rtctl, `rtd apikey` and urllib."""
import json
import os
import signal
import stat
import subprocess
import threading

import pytest

from conftest import RTD, Rtd, free_port, rtctl, wait_for
from test_http import call, make_key, start_http


@pytest.fixture
def http(tmp_path):
    broker = start_http(tmp_path)
    broker.keys = tmp_path / "api_keys"
    yield broker
    code, log = broker.stop()
    assert code == 0, log[-3000:]


def works(broker, key):
    """Whether key opens the API (200), or is refused as unknown (401)."""
    code = call(broker, "/api/v1/status", key=key)[0]
    assert code in (200, 401), code
    return code == 200


def names_in(path):
    return [line.split()[0] for line in open(path) if line.strip() and line[0] != "#"]


def test_add_list_revoke_while_running(http):
    before = os.stat(http.keys)
    code, key, err = http.ctl("apikey", "add", "ci", "read")
    key = key.strip()
    assert code == 0 and key.startswith("rtk_") and len(key) == 68, err
    assert works(http, key)  # at once: no reload, no restart
    # Rewritten, not edited in place: a new file renamed over the old, still 0600.
    after = os.stat(http.keys)
    assert after.st_ino != before.st_ino and stat.S_IMODE(after.st_mode) == 0o600
    assert names_in(http.keys) == ["ops", "viewer", "ci"] and key not in http.keys.read_text()

    rows = http.ctl_json("apikey", "list")
    assert [(r["name"], r["role"]) for r in rows] == [("ops", "admin"), ("viewer", "read"),
                                                       ("ci", "read")]
    assert all(r["created"].endswith("Z") for r in rows)
    assert {r["name"] for r in rows if r["last_used"]} == {"ci"}  # the admin key: not yet
    text = http.ctl("apikey", "list")[1]
    assert text.split("\n")[0].split() == ["name", "role", "created", "last_used"]
    secrets = [key, http.admin_key, http.read_key] + [line.split()[2] for line in
                                                      open(http.keys)]
    assert not any(s in text or s in json.dumps(rows) for s in secrets)

    # Refusals: a taken name, a bad role or name, no such key to revoke.
    code, _, err = http.ctl("apikey", "add", "ci", "admin")
    assert code == 1 and 'a key named "ci" exists' in err
    assert http.ctl("apikey", "add", "x", "root")[0] == 1
    assert http.ctl("apikey", "add", "a#b", "read")[0] == 1
    code, out, err = http.ctl("apikey", "revoke", "ci")
    assert code == 0, err
    assert not works(http, key)  # at once
    assert names_in(http.keys) == ["ops", "viewer"]
    code, _, err = http.ctl("apikey", "revoke", "ci")
    assert code == 1 and 'no key named "ci"' in err


def test_keys_over_http(http):
    """The key list is the admin role's; adding one over HTTP is a POST with an admin key."""
    assert call(http, "/api/v1/apikey/list", key=http.read_key)[0] == 403
    code, rows = call(http, "/api/v1/apikey/list", key=http.admin_key)
    assert code == 200 and [r["name"] for r in rows] == ["ops", "viewer"]
    assert call(http, "/api/v1/apikey/add/web/read", key=http.read_key, method="POST")[0] == 403
    code, body = call(http, "/api/v1/apikey/add", key=http.admin_key, method="POST",
                      body={"name": "web", "role": "read"})
    assert code == 200 and (body["name"], body["role"]) == ("web", "read"), body
    assert body["file"] == str(http.keys) and works(http, body["key"])
    code, body2 = call(http, "/api/v1/apikey/revoke/web", key=http.admin_key, method="POST")
    assert code == 200 and body2 == {"revoked": "web"}
    assert not works(http, body["key"])


def reloads(broker, event):
    return broker.read_log().count(f"{event} file={broker.keys}")


def test_reload_by_rtctl_and_sighup(http):
    # `rtd apikey` writes the file; the running rtd takes it when asked.
    first = make_key(http.keys, "cli-1", "admin")
    assert not works(http, first)
    code, out, err = http.ctl("apikey", "reload")
    assert code == 0 and out.split() == ["reloaded", "true", "file", str(http.keys)], (out, err)
    assert works(http, first)
    second = make_key(http.keys, "cli-2", "read")
    seen = reloads(http, "apikey.reloaded")
    http.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: reloads(http, "apikey.reloaded") > seen, 10), http.read_log()[-2000:]
    assert works(http, second)
    # A file that does not read leaves the keys in force, and says why.
    with open(http.keys, "a") as f:
        f.write("broken line\n")
    code, _, err = http.ctl("apikey", "reload")
    assert code == 1 and f"{http.keys}:5: not" in err, err
    http.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: reloads(http, "apikey.reload_failed") == 2, 10)
    assert works(http, first) and works(http, second) and works(http, http.read_key)


def test_writers_lose_nothing(http):
    """`rtd apikey` (another process) and `rtctl apikey add` (rtd itself) add keys at the same
    time: the file's lock keeps every line of both."""
    n = 8
    added, lock = {}, threading.Lock()

    def cli(i):
        key = make_key(http.keys, f"cli-{i}", "read")
        with lock:
            added[f"cli-{i}"] = key

    def ctl(i):
        code, key, err = http.ctl("apikey", "add", f"ctl-{i}", "read")
        assert code == 0, err
        with lock:
            added[f"ctl-{i}"] = key.strip()

    threads = [threading.Thread(target=f, args=(i,)) for i in range(n) for f in (cli, ctl)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(added) == 2 * n
    assert sorted(names_in(http.keys)) == sorted(["ops", "viewer", *added])
    assert http.ctl("apikey", "reload")[0] == 0
    assert all(works(http, key) for key in added.values())
    assert stat.S_IMODE(os.stat(http.keys).st_mode) == 0o600


def test_rtd_apikey_finds_the_file_from_the_config(tmp_path):
    conf = tmp_path / "etc" / "rtd.conf"
    conf.parent.mkdir()
    conf.write_text('http = { bind = "127.0.0.1:1", api_keys_file = "keys" }\n')
    # From / : the file is the config's, relative to the config's directory, not to here.
    p = subprocess.run([RTD, "apikey", "ops", "admin", "-c", str(conf)], cwd="/",
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.startswith("rtk_"), p.stderr
    keys = conf.parent / "keys"
    assert names_in(keys) == ["ops"] and stat.S_IMODE(os.stat(keys).st_mode) == 0o600
    conf.write_text('http = { bind = "127.0.0.1:1" }\n')
    p = subprocess.run([RTD, "apikey", "ops2", "admin", "-c", str(conf)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2 and "has no http.api_keys_file" in p.stderr
    # No -c: rtd's default config, etc/rtd.conf in a checkout (here it is not there): said,
    # nothing written.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = subprocess.run([RTD, "apikey", "ops3", "admin"], cwd=elsewhere, capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2 and "rtd apikey:" in p.stderr and "cannot open" in p.stderr
    assert names_in(keys) == ["ops"]


def test_http_without_a_key_file(tmp_path, stopper):
    """A bare http table opens nothing but the probes: rtd says so when it starts, and rtctl
    has no file to add a key to."""
    hport = free_port()
    b = Rtd(f'http={{bind="127.0.0.1:{hport}"}}')
    stopper(b)
    b.hport = hport
    log = b.read_log()
    assert f"http.no_api_keys listener=127.0.0.1:{hport} msg=\"no http.api_keys_file" in log, log
    assert call(b, "/api/v1/status", key="rtk_" + "0" * 64)[0] == 401
    assert b.ctl_json("apikey", "list") == []
    code, _, err = b.ctl("apikey", "add", "x", "read")
    assert code == 1 and "http.api_keys_file is not set" in err
    # Without an http table at all, there are no keys to manage.
    plain = Rtd()
    stopper(plain)
    code, _, err = plain.ctl("apikey", "list")
    assert code == 1 and "no HTTP listener" in err
    assert "http.no_api_keys" not in plain.read_log()
