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

from conftest import ROOT, RTD, Rtd, free_port, password_file, wait_for

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


# ---- The broker enforcing them (actors/conn) ----

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
    def logged_delays(peer):
        return [int(re.search(r" delay_ms=(\d+) ", ln).group(1))
                for ln in secured.read_log().splitlines()
                if "client.auth_failed user=alice " in ln and f" peer={peer}:" in ln]

    # 100 ms, doubling: the refusal (CONNACK) is sent by a timer of that length, which never
    # fires early, so each refusal takes at least its delay however busy the machine is.
    for i in range(4):
        t0 = time.monotonic()
        r = Raw(secured.port, f"g{i}", username="alice", password="wrong")
        assert r.connack_code == 0x86
        assert time.monotonic() - t0 >= 0.1 * 2 ** i
    assert wait_for(lambda: logged_delays("127.0.0.1") == [100, 200, 400, 800]), \
        logged_delays("127.0.0.1")
    # Another source address is not slowed down by the first one's failures: its first
    # refusal gets the first delay.
    other = Raw(secured.port, "g-other", username="alice", password="wrong", bind="127.0.0.2")
    assert other.connack_code == 0x86
    assert wait_for(lambda: logged_delays("127.0.0.2") == [100]), logged_delays("127.0.0.2")
    good = Raw(secured.port, "g-ok", username="alice", password="secret")
    assert good.connack_code == 0


def test_acl_publish_and_subscribe(secured):
    alice = Raw(secured.port, "alice-1", username="alice", password="secret")
    bob = Raw(secured.port, "bob-1", username="bob", password="hunter2", version=4)
    codes = alice.subscribe("alice/#", 1).body[3:]
    assert codes == b"\x01"
    # Granted in part: what she may not read is withheld at delivery (acl.h).
    assert alice.subscribe("#", 1).body[3:] == b"\x01"
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
    bob.publish("clients/bob-1/x", b"bob's own", qos=1, pid=5)    # not readable by alice
    bob.publish("shared/news", b"marker", qos=1, pid=6)  # comes behind those two, in order
    assert alice.next_publish()["payload"] == b"marker"
    alice.publish("clients/alice-1/state", b"ok", qos=0)          # %c
    alice.disconnect()
    bob.disconnect()


def test_sighup_picks_up_a_new_user(secured):
    assert Raw(secured.port, "c1", username="carol", password="pw").connack_code == 0x86
    assert passwd("-b", str(secured.pw), "carol", "pw").returncode == 0
    secured.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "rtd.reloaded" in secured.read_log())
    assert Raw(secured.port, "c2", username="carol", password="pw").connack_code == 0


# ---- Full password hashes run on the verifier, off the schedulers (auth.h) ----

import socket  # noqa: E402
import threading  # noqa: E402

from mqtt_raw import CONNACK, SUBACK, mqtt_str, u16, varint  # noqa: E402

SLOW_ROUNDS = "300000"  # ~0.1-0.3 s a hash: a burst of them would stall a scheduler for seconds


def connect_packet(client_id, username=None, password=None):
    """An MQTT 5 CONNECT (clean start), as bytes, for clients that pipeline after it."""
    flags = 0x02 | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = mqtt_str("MQTT") + bytes([5, flags]) + u16(60) + varint(0) + mqtt_str(client_id)
    if username is not None:
        body += mqtt_str(username)
    if password is not None:
        body += mqtt_str(password)
    return bytes([0x10]) + varint(len(body)) + body


def slow_hash_seconds(broker):
    """What one slow hash costs here: a wrong password for u9, from an address of its own."""
    t0 = time.time()
    assert Raw(broker.port, "probe", username="u9", password="no",
               bind="127.0.0.99").connack_code == 0x86
    return time.time() - t0 - 0.1  # less the 100 ms refusal delay


@pytest.fixture
def slow_hashes(tmp_path):
    """Users whose first login costs a slow PBKDF2: u0..u9 (password pw-N), and w, a cheap one."""
    pw = tmp_path / "slow.pw"
    assert passwd("-c", "-I", "1000", "-b", str(pw), "w", "w").returncode == 0
    for i in range(10):
        assert passwd("-I", SLOW_ROUNDS, "-b", str(pw), f"u{i}", f"pw-{i}").returncode == 0
    broker = Rtd(f'password_file="{pw}"', "allow_anonymous=false")
    yield broker
    code, log = broker.stop()
    assert code == 0, log


def test_login_burst_is_verified_off_the_schedulers(slow_hashes):
    """Ten first logins at once (six right, two wrong passwords, two unknown users): each gets
    its answer, and a connected client's PINGREQs are answered promptly all the while."""
    watcher = Raw(slow_hashes.port, "watcher", username="w", password="w")
    assert watcher.connack_code == 0
    hash_s = slow_hash_seconds(slow_hashes)
    cases = [(f"u{i}", f"pw-{i}", 0) for i in range(6)]
    cases += [("u6", "wrong", 0x86), ("u7", "wrong", 0x86), ("nobody1", "x", 0x86),
              ("nobody2", "x", 0x86)]
    socks = []
    for i, (user, password, _) in enumerate(cases):
        s = socket.create_connection(("127.0.0.1", slow_hashes.port), timeout=30,
                                     source_address=(f"127.0.0.{10 + i}", 0))
        socks.append(s)
    t0 = time.time()
    for i, (user, password, _) in enumerate(cases):
        socks[i].sendall(connect_packet(f"burst-{i}", user, password))
    done = threading.Event()
    pings = []

    def ping_loop():
        while not done.is_set() and len(pings) < 2000:
            p0 = time.time()
            watcher.send(0xC0, b"")
            assert watcher.read(10).type == 13  # PINGRESP
            pings.append(time.time() - p0)
            time.sleep(0.005)

    pinger = threading.Thread(target=ping_loop)
    pinger.start()
    try:
        for i, (user, _, want) in enumerate(cases):
            head = socks[i].recv(2)
            assert head[0] >> 4 == CONNACK, (user, head)
            body = socks[i].recv(head[1])
            assert body[1] == want, (user, body)
    finally:
        done.set()
        pinger.join()
    elapsed = time.time() - t0
    for s in socks:
        s.close()
    assert pings, "no ping completed"
    # No scheduler was held up by them: ten hashes on the two scheduler threads would keep the
    # watcher's ping waiting for several of them back to back (about 5 * hash_s), while the
    # machine's own load (the suite runs beside other tests) delays a ping by a fraction of one;
    # two hashes' time tells the two apart.
    assert max(pings) < 2 * hash_s, (max(pings), hash_s, elapsed)
    log = slow_hashes.read_log()
    assert "client.auth_failed user=u6 reason=bad_password delay_ms=100" in log
    assert "client.auth_failed user=nobody1 reason=unknown_user delay_ms=100" in log
    # A reconnect with a password that verified is remembered: decided at once, in place (not
    # remembered, its answer would wait for a whole hash, however idle the machine).
    t0 = time.time()
    assert Raw(slow_hashes.port, "again", username="u0", password="pw-0").connack_code == 0
    assert time.time() - t0 < hash_s
    watcher.disconnect()


def read_packet(s):
    """(type, body) of the next packet on a plain socket."""
    head = s.recv(1)
    assert head, "closed by the broker"
    n, shift = 0, 0
    while True:
        b = s.recv(1)[0]
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        assert chunk
        body += chunk
    return head[0] >> 4, body


def test_packets_after_a_verified_connect_wait_for_it(slow_hashes):
    """A client that sends SUBSCRIBE right behind its CONNECT, in one write, gets CONNACK first
    and then SUBACK; a refused one gets only its CONNACK, and nothing it sent after is run."""
    subscribe = bytes([0x82]) + varint(2 + 1 + 2 + 3 + 1) + u16(7) + varint(0) + \
        mqtt_str("a/b") + b"\x01"
    s = socket.create_connection(("127.0.0.1", slow_hashes.port), timeout=30)
    s.sendall(connect_packet("piped", "u1", "pw-1") + subscribe)
    ptype, body = read_packet(s)
    assert (ptype, body[1]) == (CONNACK, 0)
    ptype, body = read_packet(s)
    assert ptype == SUBACK and body[:2] == u16(7) and body[-1:] == b"\x01", body
    s.close()

    s = socket.create_connection(("127.0.0.1", slow_hashes.port), timeout=30,
                                 source_address=("127.0.0.77", 0))
    s.sendall(connect_packet("piped-bad", "u2", "wrong") + subscribe)
    ptype, body = read_packet(s)
    assert (ptype, body[1]) == (CONNACK, 0x86)
    assert s.recv(100) == b""  # closed, no SUBACK
    s.close()
    assert "client=piped-bad" not in slow_hashes.read_log().replace("client.auth_failed", "")


def test_client_gone_while_its_login_is_verified(slow_hashes):
    """Clients that close their socket before the verdict leave nothing behind: no connection,
    no socket, no session once the verdicts came."""
    for i in range(5):
        s = socket.create_connection(("127.0.0.1", slow_hashes.port), timeout=30)
        s.sendall(connect_packet(f"gone-{i}", f"u{3 + i}", f"pw-{3 + i}"))
        s.close()
    assert wait_for(lambda: all(f"client.disconnected client=gone-{i}" in slow_hashes.read_log()
                                for i in range(5)), timeout=30), slow_hashes.read_log()[-3000:]

    def idle():
        st = slow_hashes.ctl_json("broker", "stats")
        open_sockets = sum(x["connections"] for x in slow_hashes.ctl_json("listeners"))
        return st["connections"]["count"] == 0 and st["sessions"]["count"] == 0 and \
            open_sockets == 0
    assert wait_for(idle, timeout=10), (slow_hashes.ctl_json("broker", "stats"),
                                        slow_hashes.ctl_json("listeners"))


# ---- Subscriptions re-checked when the ACL changes (conn/client_admin.c) ----

@pytest.mark.parametrize("how", ["sighup", "rtctl", "config_set"])
def test_acl_reload_revokes_subscriptions(tmp_path, how):
    """bob may read a/# until the ACL changes; after the reload (SIGHUP, `rtctl auth reload`, or
    `rtctl config set acl_file`) his subscription is gone and a/x reaches only alice, who may
    still read it. His other subscription, still allowed, keeps working."""
    acl = tmp_path / "rtd.acl"
    acl.write_text("user alice\ntopic readwrite a/#\n"
                   "user bob\ntopic read a/#\ntopic read b/#\n")
    new_acl = tmp_path / ("new.acl" if how == "config_set" else "rtd.acl")
    pw = password_file(tmp_path / "rtd.pw", {"alice": "a", "bob": "b"})
    broker = Rtd(f'acl_file="{acl}"', f'password_file="{pw}"')
    try:
        alice = Raw(broker.port, "alice-r", username="alice", password="a")
        bob = Raw(broker.port, "bob-r", username="bob", password="b")
        bob3 = Raw(broker.port, "bob-r3", username="bob", password="b", version=4)
        assert alice.subscribe("a/#", 1).body[3:] == b"\x01"
        assert bob.subscribe("a/#", 1).body[3:] == b"\x01"
        assert bob.subscribe("b/#", 0, pid=2).body[3:] == b"\x00"
        assert bob3.subscribe("a/+", 1).body[2:] == b"\x01"
        alice.publish("a/x", b"before", qos=1, pid=1)
        assert bob.next_publish()["payload"] == b"before"
        assert bob3.next_publish()["payload"] == b"before"
        alice.drain()

        new_acl.write_text("user alice\ntopic readwrite a/#\ntopic write b/#\n"
                           "user bob\ntopic read b/#\n")
        if how == "sighup":
            broker.proc.send_signal(signal.SIGHUP)
        elif how == "rtctl":
            code, out, err = broker.ctl("auth", "reload")
            assert code == 0, (out, err)
        else:
            code, out, err = broker.ctl("config", "set", "acl_file", str(new_acl))
            assert code == 0, (out, err)
        for client, f in (("bob-r", "a/#"), ("bob-r3", "a/+")):
            assert wait_for(lambda: f"client.acl_revoked client={client} filter={f}"
                            in broker.read_log()), broker.read_log()[-2000:]
        assert "client.acl_revoked client=alice-r" not in broker.read_log()

        alice.publish("a/x", b"after", qos=1, pid=2)
        m = alice.next_publish()
        assert m["payload"] == b"after"     # still allowed: still delivered
        alice.ack(PUBACK, m["pid"])
        assert bob.next_publish(0.5) is None
        assert bob3.next_publish(0.5) is None
        alice.publish("b/y", b"still", qos=0)
        assert bob.next_publish()["payload"] == b"still"
        # Subscribing again is refused under the new ACL.
        assert bob.subscribe("a/#", 1, pid=3).body[3:] == b"\x87"
        for c in (alice, bob, bob3):
            c.disconnect()
    finally:
        code, log = broker.stop()
    assert code == 0, log


def test_acl_reload_revokes_offline_session_subscriptions(tmp_path):
    """A session kept while its client is away is re-checked too: what it queues from then on
    excludes the revoked filter."""
    acl = tmp_path / "rtd.acl"
    acl.write_text("user alice\ntopic readwrite a/#\nuser bob\ntopic read a/#\n")
    pw = password_file(tmp_path / "rtd.pw", {"alice": "a", "bob": "b"})
    broker = Rtd(f'acl_file="{acl}"', f'password_file="{pw}"')
    try:
        bob = Raw(broker.port, "bob-off", username="bob", password="b", clean=False,
                  props=bytes([0x11]) + (300).to_bytes(4, "big"))
        assert bob.subscribe("a/#", 1).body[3:] == b"\x01"
        bob.disconnect()
        broker.wait_offline("bob-off")
        acl.write_text("user alice\ntopic readwrite a/#\nuser bob\ntopic read b/#\n")
        assert broker.ctl("auth", "reload")[0] == 0
        assert wait_for(lambda: "client.acl_revoked client=bob-off filter=a/#"
                        in broker.read_log()), broker.read_log()[-2000:]
        alice = Raw(broker.port, "alice-off", username="alice", password="a")
        assert alice.subscribe("a/#", 0).body[3:] == b"\x00"
        alice.publish("a/x", b"while away", qos=0)
        assert alice.next_publish()["payload"] == b"while away"  # routed by now
        bob = Raw(broker.port, "bob-off", username="bob", password="b", clean=False,
                  props=bytes([0x11]) + (300).to_bytes(4, "big"))
        assert bob.session_present
        assert bob.next_publish(0.5) is None
        bob.disconnect()
        alice.disconnect()
    finally:
        code, log = broker.stop()
    assert code == 0, log
