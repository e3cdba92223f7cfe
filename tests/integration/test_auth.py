"""`rtd passwd` and the password/ACL files as rtd loads them: users created, added, changed and
deleted; the file's mode and atomic rewrite; prompts; errors that name the file and line; a file
shared with mosquitto_passwd (each edits what the other wrote, and rtd loads the result); rtd
refusing to start on a bad file, and keeping the old tables when a SIGHUP reload meets one.
Whether rtd enforces them on CONNECT/PUBLISH/SUBSCRIBE is tested once the connection actor calls
them.
"""
import os
import re
import signal
import stat
import subprocess
import time

import pytest

from conftest import ROOT, RTD, Rtd, free_port, wait_for

MOSQUITTO_PASSWD = "/usr/bin/mosquitto_passwd"
LINE = re.compile(r"^([^:]+):\$7\$10000\$([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+)$")


def passwd(*args, stdin=None):
    return subprocess.run([RTD, "passwd", *args], input=stdin, capture_output=True, text=True,
                          timeout=30)


def users(path):
    with open(path) as f:
        return {line.split(":", 1)[0]: line.rstrip("\n") for line in f if ":" in line}


def test_create_add_change_delete(tmp_path):
    pw = str(tmp_path / "rtd.pw")
    r = passwd("-c", "-b", pw, "alice", "secret")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(pw).st_mode) == 0o600
    first = users(pw)
    assert list(first) == ["alice"]
    assert LINE.match(first["alice"])

    assert passwd("-b", pw, "bob", "b0b pass:word").returncode == 0
    after_add = users(pw)
    assert list(after_add) == ["alice", "bob"]
    assert after_add["alice"] == first["alice"]  # untouched

    assert passwd("-b", pw, "alice", "other").returncode == 0
    changed = users(pw)
    assert list(changed) == ["alice", "bob"]  # changed in place, order kept
    assert changed["alice"] != first["alice"] and LINE.match(changed["alice"])
    assert changed["bob"] == after_add["bob"]

    assert passwd("-D", pw, "alice").returncode == 0
    assert list(users(pw)) == ["bob"]
    assert stat.S_IMODE(os.stat(pw).st_mode) == 0o600

    r = passwd("-D", pw, "alice")
    assert r.returncode == 1 and "no user alice" in r.stderr

    # -I sets the rounds of the new hash.
    assert passwd("-I", "1000", "-b", pw, "dave", "d").returncode == 0
    assert users(pw)["dave"].startswith("dave:$7$1000$")
    assert passwd("-I", "0", "-b", pw, "dave", "d").returncode == 2

    # -c replaces an existing file.
    assert passwd("-c", "-b", pw, "carol", "c").returncode == 0
    assert list(users(pw)) == ["carol"]
    # No temporary files are left behind.
    assert sorted(os.listdir(tmp_path)) == ["rtd.pw"]


def test_mode_fixed_and_other_lines_kept(tmp_path):
    pw = str(tmp_path / "rtd.pw")
    assert passwd("-c", "-b", pw, "alice", "a").returncode == 0
    with open(pw, "a") as f:
        f.write("# a comment the operator wrote\n\n")
    os.chmod(pw, 0o644)
    assert passwd("-b", pw, "bob", "b").returncode == 0
    assert stat.S_IMODE(os.stat(pw).st_mode) == 0o600
    text = open(pw).read()
    assert "# a comment the operator wrote\n" in text
    assert text.index("alice:") < text.index("# a comment") < text.index("bob:")


def test_prompt_twice(tmp_path):
    pw = str(tmp_path / "rtd.pw")
    r = passwd("-c", pw, "alice", stdin="typed\ntyped\n")
    assert r.returncode == 0, r.stderr
    assert "alice" in users(pw)
    r = passwd(pw, "bob", stdin="one\ntwo\n")
    assert r.returncode == 1 and "do not match" in r.stderr
    r = passwd(pw, "bob", stdin="")
    assert r.returncode == 1 and "no password" in r.stderr
    r = passwd(pw, "bob", stdin="\n\n")
    assert r.returncode == 1 and "empty" in r.stderr
    assert list(users(pw)) == ["alice"]


def test_errors(tmp_path):
    pw = str(tmp_path / "rtd.pw")
    r = passwd("-b", pw, "alice", "x")
    assert r.returncode == 1 and "cannot open" in r.stderr and "-c" in r.stderr
    assert not os.path.exists(pw)
    for bad in ("a:b", "#hash", ""):
        r = passwd("-c", "-b", pw, bad, "x")
        assert r.returncode == 1 and "user name" in r.stderr, bad
    for args in ([], [pw], ["-b", pw, "u"], [pw, "u", "extra"], ["-D", "-b", pw, "u"],
                 ["-c", "-D", pw, "u"], ["-x", pw, "u"]):
        r = passwd(*args)
        assert r.returncode == 2 and "usage" in r.stderr, args
    # A malformed file is named with its line and left as it was.
    with open(pw, "w") as f:
        f.write("# users\nalice:plaintext\n")
    r = passwd("-b", pw, "bob", "x")
    assert r.returncode == 1
    assert f"{pw}:2: the password is not a $7$" in r.stderr
    assert open(pw).read() == "# users\nalice:plaintext\n"


@pytest.mark.skipif(not os.path.exists(MOSQUITTO_PASSWD), reason="no mosquitto_passwd")
def test_files_shared_with_mosquitto_passwd(tmp_path):
    """mosquitto_passwd edits rtd's file and rtd edits mosquitto_passwd's: both stay loadable."""
    pw = str(tmp_path / "mixed.pw")
    subprocess.run([MOSQUITTO_PASSWD, "-c", "-b", pw, "m1", "one"], check=True)
    subprocess.run([MOSQUITTO_PASSWD, "-H", "sha512", "-b", pw, "m6", "six"], check=True)
    assert passwd("-b", pw, "r1", "two").returncode == 0
    subprocess.run([MOSQUITTO_PASSWD, "-b", pw, "m2", "three"], check=True)
    assert passwd("-D", pw, "m2").returncode == 0
    assert list(users(pw)) == ["m1", "m6", "r1"]
    # rtd loads it (start would fail with file:line otherwise).
    broker = Rtd(f"password_file={pw}")
    code, log = broker.stop()
    assert code == 0, log


def test_rtd_refuses_bad_files_at_start(tmp_path):
    pw = tmp_path / "bad.pw"
    pw.write_text("ok:$7$101$ohRixXecVWcf6OX+$mLvJLNehbDabQwvAgPmUqDkor/svNjxC/bOMLPrQFanzPS35AalK"
                  "+WU677VN9NCPS40L3kK2SUVYd/Vtl6Sodw==\nbroken line\n")
    acl = tmp_path / "bad.acl"
    acl.write_text("user alice\ntopic raed a/#\n")
    conf = os.path.join(ROOT, "etc", "rtd.conf")
    for setting, where in ((f"password_file={pw}", f"{pw}:2: expected user:hash"),
                           (f"acl_file={acl}", f"{acl}:2: unknown access \"raed\""),
                           (f"password_file={tmp_path}/missing.pw", "missing.pw: cannot open")):
        r = subprocess.run([RTD, "-c", conf, "-o", f"listeners=127.0.0.1:{free_port()}", "-o",
                            setting], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, r.stderr
        assert where in r.stderr, r.stderr


def test_sighup_reloads_and_keeps_old_tables_on_error(tmp_path):
    pw = tmp_path / "rtd.pw"
    assert passwd("-c", "-b", str(pw), "alice", "a").returncode == 0
    acl = tmp_path / "rtd.acl"
    acl.write_text("user alice\ntopic readwrite alice/#\n")
    broker = Rtd(f"password_file={pw}", f"acl_file={acl}", "allow_anonymous=false")
    try:
        broker.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "rtd.reloaded" in broker.read_log())
        acl.write_text("user alice\ntopic readwrite alice/#\nbogus line\n")
        broker.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "rtd.reload_failed" in broker.read_log())
        assert f"{acl}:3: unknown keyword" in broker.read_log()
        assert broker.proc.poll() is None  # still serving with the old tables
    finally:
        code, log = broker.stop()
    assert code == 0, log


# ---- The broker enforcing them (conn.c) ----

from mqtt_raw import PUBACK, Raw  # noqa: E402


@pytest.fixture
def secured(tmp_path):
    pw = tmp_path / "rtd.pw"
    assert passwd("-c", "-b", str(pw), "alice", "secret").returncode == 0
    assert passwd("-b", str(pw), "bob", "hunter2").returncode == 0
    acl = tmp_path / "rtd.acl"
    acl.write_text("user alice\ntopic readwrite alice/#\ntopic read shared/#\n"
                   "user bob\ntopic write shared/news\n"
                   "pattern readwrite clients/%c/#\npattern read users/%u/inbox\n")
    broker = Rtd(f'password_file="{pw}"', f'acl_file="{acl}"', "allow_anonymous=false")
    broker.pw = pw
    yield broker
    code, log = broker.stop()
    assert code == 0, log


@pytest.mark.parametrize("version", [4, 5])
def test_logins_accepted_and_refused_per_spec(secured, version):
    ok = Raw(secured.port, "a1", version=version, username="alice", password="secret")
    assert ok.connack_code == 0
    ok.disconnect()
    bad = Raw(secured.port, "a2", version=version, username="alice", password="nope")
    assert bad.connack_code == (0x86 if version == 5 else 4)
    unknown = Raw(secured.port, "a3", version=version, username="mallory", password="x")
    assert unknown.connack_code == (0x86 if version == 5 else 4)
    anon = Raw(secured.port, "a4", version=version)
    assert anon.connack_code == (0x87 if version == 5 else 5)
    log = secured.read_log()
    assert "client.auth_failed user=alice reason=bad_password" in log
    assert "reason=anonymous_refused" in log


def test_failed_logins_are_slowed_per_address(secured):
    delays = []
    for i in range(4):
        t0 = time.time()
        r = Raw(secured.port, f"g{i}", username="alice", password="wrong")
        delays.append(time.time() - t0)
        assert r.connack_code == 0x86
    # 100 ms, doubling: the fourth refusal waits about 800 ms.
    assert delays[3] > 0.5 and delays[3] > 3 * delays[0]
    # Another source address is not slowed down by the first one's failures.
    t0 = time.time()
    other = Raw(secured.port, "g-other", username="alice", password="wrong", bind="127.0.0.2")
    assert other.connack_code == 0x86 and time.time() - t0 < 0.5
    good = Raw(secured.port, "g-ok", username="alice", password="secret")
    assert good.connack_code == 0


def test_acl_publish_and_subscribe(secured):
    alice = Raw(secured.port, "alice-1", username="alice", password="secret")
    bob = Raw(secured.port, "bob-1", username="bob", password="hunter2", version=4)
    codes = alice.subscribe("alice/#", 1).body[3:]
    assert codes == b"\x01"
    assert alice.subscribe("#", 1).body[3:] == b"\x87"          # not covered by any read rule
    assert alice.subscribe("shared/+", 0).body[3:] == b"\x00"
    assert alice.subscribe("users/alice/inbox", 0).body[3:] == b"\x00"  # %u
    assert alice.subscribe("users/bob/inbox", 0).body[3:] == b"\x87"
    assert bob.subscribe("alice/#", 0).body[2:] == b"\x80"      # v3 failure code
    # Publish: allowed lands, denied is refused with 0x87 (v5) and never delivered.
    alice.publish("alice/x", b"mine", qos=1, pid=1)
    m = alice.next_publish()
    assert (m["topic"], m["payload"]) == ("alice/x", b"mine")
    alice.ack(PUBACK, m["pid"])
    alice.send((3 << 4) | 2, b"\x00\x05other\x00\x02\x00x")
    ack = alice.expect(PUBACK)
    assert ack.body[2:3] == b"\x87"
    bob.publish("shared/news", b"hello", qos=1, pid=3)            # bob may write here
    assert alice.next_publish()["payload"] == b"hello"
    bob.publish("alice/x", b"intrude", qos=1, pid=4)              # v3: acked, dropped
    assert alice.next_publish(0.5) is None
    alice.publish("clients/alice-1/state", b"ok", qos=0)          # %c
    alice.disconnect()
    bob.disconnect()


def test_sighup_picks_up_a_new_user(secured):
    assert Raw(secured.port, "c1", username="carol", password="pw").connack_code == 0x86
    assert passwd("-b", str(secured.pw), "carol", "pw").returncode == 0
    secured.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "rtd.reloaded" in secured.read_log())
    assert Raw(secured.port, "c2", username="carol", password="pw").connack_code == 0
