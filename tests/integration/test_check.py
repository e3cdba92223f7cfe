"""rtd --check (the start's checks of the config and every file it names, with nothing bound,
started or created), rtd --help and its subcommands' --help, rtd -v."""
import os
import re
import socket
import subprocess

import pytest

from conftest import ROOT, RTD, free_port, password_file

RULE = """return {
    name = "keep",
    from = { "t/#" },
    select = function(msg) return { topic = msg.topic } end,
    to = { "store" },
}
"""


def make_conf(tmp_path, body, rules=None):
    """An etc/ directory with rtd.conf (body, then a store sink unless body has sinks) and
    rules/ holding rules ({file name: text}); returns the config's path."""
    etc = tmp_path / "etc"
    (etc / "rules").mkdir(parents=True)
    for name, text in (rules if rules is not None else {"keep.lua": RULE}).items():
        (etc / "rules" / name).write_text(text)
    if "sinks" not in body:
        body += '\nsinks = { store = { type = "sqlite", file = "store.db" } }\n'
    conf = etc / "rtd.conf"
    conf.write_text(body)
    return conf


def check(conf, *overrides):
    argv = [RTD, "--check", "-c", str(conf)]
    for o in overrides:
        argv += ["-o", o]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_check_says_what_would_listen_where_and_for_whom_and_binds_nothing(tmp_path, pki):
    held = socket.socket()  # the plain listener's port, taken: a start would fail on it
    held.bind(("127.0.0.1", 0))
    held.listen()
    plain = held.getsockname()[1]
    wss = free_port()
    cert, key = pki.server["ec"]
    users = password_file(tmp_path / "passwd", {"alice": "secret"})
    (tmp_path / "acl").write_text("topic readwrite t/#\n")
    keys = tmp_path / "keys"
    assert subprocess.run([RTD, "apikey", "ops", "read", "-f", str(keys)], capture_output=True,
                          timeout=30).returncode == 0
    http = free_port()
    conf = make_conf(tmp_path, f"""
listeners = {{ "127.0.0.1:{plain}",
              {{ bind = "127.0.0.1:{wss}", websocket = "/mqtt",
                tls = {{ cert = "{cert}", key = "{key}" }} }} }}
password_file = "{users}"
acl_file = "{tmp_path / 'acl'}"
http = {{ bind = "127.0.0.1:{http}", api_keys_file = "{keys}" }}
""")
    data = tmp_path / "data"
    try:
        r = check(conf, f'data_dir="{data}"')
    finally:
        held.close()
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"config.paths config={conf} rules_dir={tmp_path}/etc/rules data_dir={data} " \
           f"password_file={users} acl_file={tmp_path}/acl admin_socket={data}/rtd.sock" in out
    assert f"data_dir {data} missing: made 0700 at start" in out
    who = f'anonymous="from 127.0.0.0/8, ::1/128" users="users in {users}"'
    assert f"listener.access listener=127.0.0.1:{plain} {who} transport=mqtt\n" in out, out
    m = re.search(rf"listener.access listener=127.0.0.1:{wss} {re.escape(who)} "
                  r"transport=websocket\+tls path=/mqtt cert=\"[^\"]*localhost[^\"]*\" "
                  r"not_after=\S+ days_left=(\d+)", out)
    assert m and int(m.group(1)) > 0, out
    assert f"http listener=127.0.0.1:{http} transport=http api_keys_file={keys} " \
           "metrics_public=false" in out
    assert "sinks enabled=store\n" in out and f"rules rules=1 rules_dir={tmp_path}/etc/rules" in out
    assert f"rtd --check: {conf} would start" in out
    # Nothing was made: no data_dir, so no state.db, sink database or admin socket.
    assert not data.exists()


def run_start(conf, data):
    """The real start of the same config: it must fail as --check did (exit 2)."""
    argv = [RTD, "-c", str(conf), "-o", f'data_dir="{data}"']
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("rtd started with a config --check refused")
    return p.returncode, out + err


BAD = {
    # name: (what is written into the config, the rules, what the error names)
    "rule syntax": ("", {"bad.lua": "return {\n  name = = 1 }\n"}, "bad.lua:2:"),
    "unknown sink": ("", {"r.lua": RULE.replace('"store"', '"nowhere"')},
                     'to: no sink named "nowhere"'),
    "disabled sink": ('sinks = { store = { type = "sqlite", file = "s.db", enabled = false } }',
                      None, 'to: no sink named "store"'),
    "sink key": ('sinks = { store = { type = "sqlite", file = "s.db", tabel = "x" } }', None,
                 "sinks.store: unknown key tabel"),
    "tls key": ('listeners = { { bind = "127.0.0.1:{port}", '
                'tls = { cert = "{cert}", key = "{tmp}/missing.key" } } }', None,
                "missing.key"),
    "password file": ('password_file = "{tmp}/no-passwd"', None, "no-passwd"),
    "acl file": ('acl_file = "{tmp}/acl"', None, "acl:1:"),
    "api keys": ('http = { bind = "127.0.0.1:{port2}", api_keys_file = "{tmp}/badkeys" }', None,
                 "badkeys:1: not "),  # the log escapes the quoted format that follows
    "rules_dir": ('rules_dir = "{tmp}/no-rules"', None, "rules_dir {tmp}/no-rules"),
    "cluster secret": ('cluster = { node = "n1", nats = { "nats://127.0.0.1:{port2}" }, '
                       'secret_file = "{tmp}/no-secret" }', None,
                       "cluster.secret_file {tmp}/no-secret"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_check_refuses_what_the_start_refuses(tmp_path, pki, case):
    text, rules, names = BAD[case]
    (tmp_path / "acl").write_text("frobnicate everything\n")
    (tmp_path / "badkeys").write_text("just-a-name\n")
    fill = {"port": free_port(), "port2": free_port(), "cert": pki.server["ec"][0],
            "tmp": tmp_path}
    for k, v in fill.items():
        text, names = text.replace("{" + k + "}", str(v)), names.replace("{" + k + "}", str(v))
    if not text.startswith("listeners"):
        text = f'listeners = {{ "127.0.0.1:{free_port()}" }}\n{text}'
    conf = make_conf(tmp_path, text + "\n", rules)
    data = tmp_path / "data"
    r = check(conf, f'data_dir="{data}"')
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert names in r.stderr, r.stderr
    assert "would start" not in r.stdout
    code, said = run_start(conf, data)
    assert code == 2 and names in said, said


def test_check_refuses_a_data_dir_others_may_write(tmp_path):
    conf = make_conf(tmp_path, 'listeners = { "127.0.0.1:1" }\n')
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o770)
    r = check(conf, f'data_dir="{data}"')
    assert r.returncode == 2 and "is writable by its group (mode 0770)" in r.stderr, r.stderr
    os.chmod(data, 0o755)  # readable only: the start makes it 0700; --check only says so
    r = check(conf, f'data_dir="{data}"')
    assert r.returncode == 0 and f"data_dir {data} mode 0755: made 0700 at start" in r.stdout
    assert os.stat(data).st_mode & 0o777 == 0o755


def subcommands():
    """The subcommands rtd --help lists."""
    r = subprocess.run([RTD, "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    section = r.stdout.split("subcommands (rtd SUBCOMMAND --help for their options):\n")[1]
    return [line.split()[0] for line in section.splitlines() if line.strip()]


def test_help_lists_every_subcommand_and_each_answers_help():
    names = subcommands()
    assert {"passwd", "apikey"} <= set(names), names
    for name in names:
        for flag in ("--help", "-h"):
            r = subprocess.run([RTD, name, flag], capture_output=True, text=True, timeout=10)
            assert r.returncode == 0 and r.stdout.startswith(f"usage: rtd {name}"), (name, r)
    r = subprocess.run([RTD, "--no-such-flag"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "unknown argument --no-such-flag" in r.stderr


def test_version_flags_print_the_projects_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        version = re.search(r"project\(rt VERSION ([0-9.]+)", f.read()).group(1)
    for flag in ("-v", "--version"):
        r = subprocess.run([RTD, flag], capture_output=True, text=True, timeout=10)
        assert r.returncode == 0 and r.stdout == f"rtd {version}\n", r
