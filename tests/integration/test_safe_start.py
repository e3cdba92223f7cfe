"""What a default rtd exposes, and where it reads and writes, whatever directory it starts in:
anonymous clients only from anonymous_from (loopback by default), relative config paths
against the config file's directory, a private data_dir (0700, files 0600)."""
import os
import sqlite3
import stat
import subprocess

import paho.mqtt.client as mqtt
import pytest

from conftest import ROOT, RTD, Rtd, free_port, wait_for
from mqtt_raw import Raw

CONF = os.path.join(ROOT, "etc", "rtd.conf")


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---- Anonymous clients ----

@pytest.mark.parametrize("version", [4, 5])
def test_anonymous_refused_from_outside_anonymous_from(version):
    # Tests can only reach 127.0.0.0/8: "local" is narrowed to 127.0.0.1 so that a client
    # from 127.0.0.2 is what a client from the Internet is to the default.
    broker = Rtd('anonymous_from="127.0.0.1/32"')
    try:
        inside = Raw(broker.port, "in", version=version, bind="127.0.0.1")
        assert inside.connack_code == 0
        inside.disconnect()
        outside = Raw(broker.port, "out", version=version, bind="127.0.0.2")
        assert outside.connack_code == (0x87 if version == 5 else 5)  # not authorized
        # With no password file nothing vouches for a user name: it opens nothing more.
        named = Raw(broker.port, "named", version=version, bind="127.0.0.2", username="u",
                    password="any")
        assert named.connack_code == (0x87 if version == 5 else 5)
        log = broker.read_log()
        assert (f'listener.access listener=127.0.0.1:{broker.port} '
                f'anonymous="from 127.0.0.1/32" users="none: no password_file, a user name is anonymous"'
                in log), log
        assert "reason=anonymous_refused" in log
    finally:
        code, log = broker.stop()
    assert code == 0, log


def test_default_takes_local_anonymous_clients_only():
    broker = Rtd()
    try:
        for source in ("127.0.0.1", "127.0.0.2"):  # all of 127/8 is this machine
            c = Raw(broker.port, "local-" + source, version=4, bind=source)
            assert c.connack_code == 0
            c.disconnect()
        assert 'anonymous="from 127.0.0.0/8, ::1/128"' in broker.read_log()
    finally:
        code, log = broker.stop()
    assert code == 0, log


def test_ipv6_listener_checks_ipv4_clients_as_ipv4():
    """On an IPv6 socket ("[::]", here its loopback part) an IPv4 client arrives as
    ::ffff:a.b.c.d; it must be matched against the IPv4 ranges."""
    port = free_port()
    broker = Rtd(f'listeners={{"[::ffff:127.0.0.1]:{port}", "[::1]:{port}"}}',
                 'anonymous_from={"127.0.0.1/32", "::1"}', port=port)
    try:
        assert Raw(port, "v4in", version=5, bind="127.0.0.1").connack_code == 0
        assert Raw(port, "v4out", version=5, bind="127.0.0.2").connack_code == 0x87
        assert Raw(port, "v6in", version=5, host="::1").connack_code == 0
        log = broker.read_log()
        assert f'listener=[::ffff:127.0.0.1]:{port} anonymous="from 127.0.0.1/32, ::1/128"' in log
        assert f'listener=[::1]:{port} anonymous="from 127.0.0.1/32, ::1/128"' in log
    finally:
        code, log = broker.stop()
    assert code == 0, log


def test_anonymous_from_anywhere_when_the_config_says_so():
    broker = Rtd('anonymous_from={"0.0.0.0/0", "::/0"}')
    try:
        assert Raw(broker.port, "any", version=5, bind="127.0.0.2").connack_code == 0
        assert 'anonymous="from 0.0.0.0/0, ::/0"' in broker.read_log()
    finally:
        code, log = broker.stop()
    assert code == 0, log


def test_bad_anonymous_from_refused_at_start():
    r = subprocess.run([RTD, "-c", CONF, "-o", f"listeners=127.0.0.1:{free_port()}",
                        "-o", 'anonymous_from={"127.0.0.1/40"}'],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert 'anonymous_from[1]: "127.0.0.1/40" is not a numeric address' in r.stderr


# ---- Paths ----

def start_from(cwd, conf, *overrides, port, logdir):
    """rtd -c conf started in cwd, logging into logdir; returns (process, log file)."""
    log = open(os.path.join(logdir, f"rtd-{port}.log"), "w+")
    argv = [RTD, "-c", conf, "-o", f"listeners=127.0.0.1:{port}", "-o", "schedulers=2"]
    for o in overrides:
        argv += ["-o", o]
    proc = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    return proc, log


def wait_started(proc, log):
    assert wait_for(lambda: "rtd.started" in open(log.name).read() or proc.poll() is not None,
                    30), open(log.name).read()
    assert proc.poll() is None, open(log.name).read()


def stop(proc, log):
    proc.terminate()
    assert proc.wait(timeout=30) == 0, open(log.name).read()
    return open(log.name).read()


def publish_one(port, topic, payload, retain=False):
    """One QoS 1 message, acknowledged (so rtd has taken it) before this returns."""
    c = mqtt.Client(client_id="", protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    info = c.publish(topic, payload, qos=1, retain=retain)
    info.wait_for_publish(10)
    assert info.is_published()
    c.disconnect()
    c.loop_stop()


def rows(db):
    try:
        with sqlite3.connect(db) as c:
            return c.execute("SELECT count(*) FROM messages").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_shipped_config_from_another_directory_loads_its_rules(tmp_path):
    port = free_port()
    data = tmp_path / "data"
    proc, log = start_from("/", CONF, f'data_dir="{data}"', port=port, logdir=tmp_path)
    try:
        wait_started(proc, log)
        text = open(log.name).read()
        assert f"rules_dir={ROOT}/etc/rules " in text, text
        assert "rules.started rules=0" not in text, text
        assert f"config.paths config={CONF} rules_dir={ROOT}/etc/rules data_dir={data} " in text
        publish_one(port, "paths/1", "x")
        # The shipped archive rule writes every message into data_dir/rt.db.
        assert wait_for(lambda: rows(data / "rt.db") == 1, 10), open(log.name).read()
    finally:
        stop(proc, log)


def test_relative_paths_are_the_config_files(tmp_path):
    """Every relative path of a config file is found next to it, started from /."""
    (tmp_path / "myrules").mkdir()
    (tmp_path / "myrules" / "all.lua").write_text(
        'return { name = "all", from = "#", to = { "archive" },\n'
        '         select = function(m) return { topic = m.topic } end }\n')
    (tmp_path / "acl").write_text("topic readwrite #\n")
    (tmp_path / "etc").mkdir()
    conf = tmp_path / "etc" / "rtd.conf"
    conf.write_text('rules_dir = "../myrules"\ndata_dir = "../state"\nacl_file = "../acl"\n'
                    'admin_socket = "ctl.sock"\n'
                    'sinks = { archive = { type = "sqlite", file = "out.db" } }\n')
    port = free_port()
    proc, log = start_from("/", str(conf), port=port, logdir=tmp_path)
    try:
        wait_started(proc, log)
        text = open(log.name).read()
        assert (f"config.paths config={conf} rules_dir={tmp_path}/myrules "
                f"data_dir={tmp_path}/state password_file=- acl_file={tmp_path}/acl "
                f"admin_socket={tmp_path}/etc/ctl.sock" in text), text
        assert "rules.started rules=1" in text, text
        assert stat.S_ISSOCK(os.lstat(tmp_path / "etc" / "ctl.sock").st_mode)
        publish_one(port, "rel/1", "x")
        assert wait_for(lambda: rows(tmp_path / "state" / "out.db") == 1, 10), \
            open(log.name).read()
    finally:
        stop(proc, log)
    # -o paths are the shell's: relative to the directory rtd starts in.
    port = free_port()
    (tmp_path / "other").mkdir()
    proc, log = start_from(str(tmp_path), str(conf), 'data_dir="other"', port=port,
                           logdir=tmp_path)
    try:
        wait_started(proc, log)
        assert f"data_dir={tmp_path}/other " in open(log.name).read()
    finally:
        stop(proc, log)


def test_missing_rules_dir_or_file_refused_at_start(tmp_path):
    conf = tmp_path / "rtd.conf"
    conf.write_text('rules_dir = "no-such-rules"\n')
    r = subprocess.run([RTD, "-c", str(conf), "-o", f"listeners=127.0.0.1:{free_port()}"],
                       cwd="/", capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert f"rules_dir {tmp_path}/no-such-rules: No such file or directory" in r.stderr
    conf.write_text(f'rules_dir = "{ROOT}/etc/rules"\ndata_dir = "d"\nacl_file = "none.acl"\n')
    r = subprocess.run([RTD, "-c", str(conf), "-o", f"listeners=127.0.0.1:{free_port()}"],
                       cwd="/", capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert f"{tmp_path}/none.acl: cannot open" in r.stderr, r.stderr


# ---- data_dir ----

def test_data_dir_and_its_files_are_private(tmp_path):
    data = tmp_path / "data"
    old = os.umask(0o022)  # what a shell usually has: files 0644 unless rtd sees to it
    try:
        broker = Rtd(data_dir=str(data))
    finally:
        os.umask(old)
    try:
        publish_one(broker.port, "private/1", "secret payload", retain=True)
        assert wait_for(lambda: rows(data / "rt.db") == 1, 10), broker.read_log()
        names = set(os.listdir(data))
        # Both databases in WAL mode, open: each with its -wal and -shm.
        for db in ("state.db", "rt.db"):
            assert {db, db + "-wal", db + "-shm"} <= names, names
        assert mode(data) == 0o700
        for name in names:
            assert mode(data / name) == 0o600, (name, oct(mode(data / name)))
    finally:
        code, log = broker.stop()
    assert code == 0, log
    # Rows for a database that cannot be opened spill to data_dir/spill-archive.db.
    old = os.umask(0o022)
    try:
        broker = Rtd('sinks={archive={type="sqlite", file="/proc/rt-no-such/x.db"}}',
                     data_dir=str(data))
    finally:
        os.umask(old)
    try:
        publish_one(broker.port, "private/2", "spilled payload")
        spill = data / "spill-archive.db"
        assert wait_for(lambda: spill.exists(), 10), broker.read_log()
        for name in os.listdir(data):
            assert mode(data / name) == 0o600, (name, oct(mode(data / name)))
    finally:
        code, log = broker.stop()
    assert code == 0, log


@pytest.mark.parametrize("perm,who", [(0o777, "every user"), (0o770, "its group")])
def test_data_dir_others_can_write_is_refused(tmp_path, perm, who):
    data = tmp_path / "open"
    data.mkdir()
    os.chmod(data, perm)
    r = subprocess.run([RTD, "-c", CONF, "-o", f"listeners=127.0.0.1:{free_port()}",
                        "-o", f'data_dir="{data}"'], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert f"data_dir {data} is writable by {who} (mode 0{perm:o})" in r.stderr, r.stderr
    assert os.listdir(data) == []  # nothing was written into it
    assert mode(data) == perm


def test_data_dir_readable_by_others_is_made_private(tmp_path):
    data = tmp_path / "readable"
    data.mkdir()
    os.chmod(data, 0o755)  # as an older rtd left it
    broker = Rtd(data_dir=str(data))
    try:
        assert mode(data) == 0o700
        assert f"data_dir.mode data_dir={data} was=0755 now=0700" in broker.read_log()
    finally:
        code, log = broker.stop()
    assert code == 0, log


# ---- Files that give rights: config, rules, password, ACL and API keys ----

def private_copy(tmp_path):
    """The shipped config and its rules in a directory of this test's own (so their modes
    can change), a password file, an ACL and an API-key file beside them."""
    import shutil
    d = tmp_path / "etc"
    d.mkdir()
    shutil.copy(CONF, d / "rtd.conf")
    shutil.copytree(os.path.join(ROOT, "etc", "rules"), d / "rules")
    subprocess.run([RTD, "passwd", "-c", "-b", str(d / "rtd.pw"), "alice", "a"], check=True,
                   capture_output=True, timeout=30)
    (d / "rtd.acl").write_text("user alice\ntopic readwrite a/#\n")
    (d / "api_keys").write_text("# none yet\n")
    for f in d.rglob("*"):
        os.chmod(f, 0o755 if f.is_dir() else 0o644)
    os.chmod(d, 0o755)
    return d


def run_rtd(d, tmp_path):
    return subprocess.run(
        [RTD, "-c", str(d / "rtd.conf"), "-o", f"listeners=127.0.0.1:{free_port()}",
         "-o", f'data_dir="{tmp_path / "data"}"', "-o", f'password_file="{d / "rtd.pw"}"',
         "-o", f'acl_file="{d / "rtd.acl"}"',
         "-o", f'http={{bind="127.0.0.1:{free_port()}", api_keys_file="{d / "api_keys"}"}}'],
        capture_output=True, text=True, timeout=30, input="")


@pytest.mark.parametrize("name,what", [
    ("rtd.conf", "config file"), ("rules", "rules_dir"), ("rules/archive.lua", "rule file"),
    ("rtd.pw", "password_file"), ("rtd.acl", "acl_file"), ("api_keys", "api_keys_file")])
@pytest.mark.parametrize("perm,who", [(0o002, "every user"), (0o020, "its group")])
def test_files_others_could_change_are_refused(tmp_path, name, what, perm, who):
    """Each file that gives rights (a user, an ACL line, an admin key, Lua to run) is refused
    at start when others may write it, as data_dir is; so is one whose directory they may
    write (they could replace it)."""
    d = private_copy(tmp_path)
    target = d / name
    os.chmod(target, stat.S_IMODE(os.stat(target).st_mode) | perm)
    r = run_rtd(d, tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert f"{what} {target} can be changed by {who}" in r.stderr, r.stderr[-2000:]


def test_a_directory_others_could_write_is_refused_for_its_files(tmp_path):
    d = private_copy(tmp_path)
    os.chmod(d, 0o777)
    r = run_rtd(d, tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"config file {d}/rtd.conf is in {d}, which every user can change" in r.stderr
    os.chmod(d, 0o1777)  # sticky, like /tmp: others may add files, not replace these
    broker_ok = run_rtd_until_started(d, tmp_path)
    assert broker_ok


def run_rtd_until_started(d, tmp_path):
    """Whether rtd with d's files gets as far as serving (then it is stopped)."""
    port = free_port()
    argv = [RTD, "-c", str(d / "rtd.conf"), "-o", f"listeners=127.0.0.1:{port}",
            "-o", f'data_dir="{tmp_path / "data2"}"']
    with open(tmp_path / "rtd2.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        return wait_for(lambda: "rtd.started" in (tmp_path / "rtd2.log").read_text()
                        or proc.poll() is not None, 15) and proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)


def test_reload_of_a_password_file_others_could_change_is_refused(tmp_path):
    d = private_copy(tmp_path)
    broker = Rtd(f'password_file="{d / "rtd.pw"}"')
    try:
        os.chmod(d / "rtd.pw", 0o666)
        code, out, err = broker.ctl("auth", "reload")
        assert code != 0 and "password_file" in (out + err) and "every user" in (out + err)
        code, out, err = broker.ctl("config", "set", "acl_file", str(d / "rtd.acl"))
        assert code != 0, out  # the password file it would load again is refused too
        # The tables in force stay: alice still logs in.
        c = Raw(broker.port, "alice-1", version=5, username="alice", password="a")
        assert c.connack_code == 0
        c.disconnect()
    finally:
        code, log = broker.stop()
    assert code == 0, log[-2000:]


def test_apikey_file_made_private_and_root_warned(tmp_path):
    keys = tmp_path / "keys"
    old = os.umask(0o022)
    try:
        r = subprocess.run([RTD, "apikey", "ci", "read", "-f", str(keys)], capture_output=True,
                           text=True, timeout=30)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    assert mode(keys) == 0o600
    if os.geteuid() == 0:
        broker = Rtd()
        try:
            assert "rtd.root" in broker.read_log()
        finally:
            broker.stop()


# What etc/rtd.conf says differs from the built-in default only here, each on purpose: the
# paths are the config file's own; the shipped file wires the example rule to its sinks and
# turns persistence on (an rtd with no config file writes nothing it was not asked to).
SHIPPED_ON_PURPOSE = {"rules_dir", "data_dir", "sinks", "persistence"}


def test_shipped_config_agrees_with_the_built_in_defaults(tmp_path):
    """A limit the shipped file sets and the built-in default leaves open (max_retained_messages
    once was unlimited without the file) would protect only those who kept the file."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "empty.conf").write_text("-- nothing: every setting its built-in default\n")
    shown = []
    for conf in (str(tmp_path / "empty.conf"), CONF):
        port = free_port()
        data = tmp_path / f"data-{port}"
        argv = [RTD, "-c", conf, "-o", f"listeners=127.0.0.1:{port}", "-o", f'data_dir="{data}"']
        with open(tmp_path / f"log-{port}", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            assert wait_for(lambda: (data / "rtd.sock").exists(), 10), \
                (tmp_path / f"log-{port}").read_text()[-2000:]
            r = subprocess.run([os.path.join(os.path.dirname(RTD), "rtctl"), "-s",
                                str(data / "rtd.sock"), "config", "show", "--json"],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            shown.append({s["setting"]: s["value"] for s in __import__("json").loads(r.stdout)})
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    built_in, shipped = shown
    differ = {k for k in built_in
              if not k.startswith("listeners") and built_in[k] != shipped.get(k)}
    assert differ == SHIPPED_ON_PURPOSE, {k: (built_in[k], shipped.get(k)) for k in differ}
