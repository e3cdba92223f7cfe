"""What rtd says when it cannot start as configured (issue 28, section 2: "errors at start
that today say too little"): each names the setting or file and the system's reason."""
import os
import socket
import subprocess

from conftest import ROOT, RTD, free_port

CONF = os.path.join(ROOT, "etc", "rtd.conf")


def start(tmp_path, *overrides):
    argv = [RTD, "-c", CONF, "-o", f'data_dir="{tmp_path / "data"}"']
    for o in overrides:
        argv += ["-o", o]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_two_listeners_on_one_address_refused_when_read(tmp_path):
    port = free_port()
    for pair in ((f"127.0.0.1:{port}", f"127.0.0.1:{port}"),
                 (f"127.0.0.1:{port}", f"0.0.0.0:{port}")):
        r = start(tmp_path, "listeners={%s}" % ",".join(f'"{a}"' for a in pair))
        assert r.returncode == 2, r.stderr[-2000:]
        assert (f"listeners[1] ({pair[0]}) and listeners[2] ({pair[1]}) take one address"
                in r.stderr), r.stderr[-2000:]
        assert "listener.started" not in r.stdout + r.stderr  # refused before any start


def test_an_address_not_on_this_machine_is_named(tmp_path):
    # 192.0.2.0/24 is TEST-NET-1: no machine has it, and nothing is sent to it.
    r = start(tmp_path, f'listeners="192.0.2.1:{free_port()}"')
    assert r.returncode != 0
    assert "address not on this machine" in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]


def test_missing_or_bad_tls_files_are_named(tmp_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    cases = ((str(tmp_path / "missing.pem"), "tls.cert", "No such file or directory"),
             (str(bad), str(bad), "no start line"))
    for cert, named, reason in cases:
        r = start(tmp_path, 'listeners={"127.0.0.1:%d", {bind="127.0.0.1:%d", tls={cert="%s", '
                  'key="%s"}}}' % (free_port(), free_port(), cert, cert))
        assert r.returncode != 0
        out = r.stdout + r.stderr
        assert named in out and reason in out, out[-2000:]


def test_a_port_in_use_fails_the_start_before_anything_starts(tmp_path):
    """Every port rtd serves is bound before the store, the sinks, the rules and the cluster
    start: a port another socket holds ends the start at once (exit 2, for systemd not to
    restart it), naming the listener's setting and line. Neither the sink's database nor
    any of the rules' lines may appear: they would have started first before."""
    rules = tmp_path / "rules"
    rules.mkdir()
    archive = open(os.path.join(ROOT, "etc", "rules", "archive.lua")).read()
    for i in range(50):
        (rules / f"r{i}.lua").write_text(archive.replace('name = "archive"', f'name = "r{i}"'))
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        head = (f'data_dir = "{tmp_path / "data"}"\n'
                f'rules_dir = "{rules}"\n'
                'sinks = { archive = { type = "sqlite", file = "rt.db", table = "messages" } }\n')
        cases = (('listeners = { "127.0.0.1:%d", "127.0.0.1:%d" }\n'
                  % (free_port(), port), 4, f"listeners[2] 127.0.0.1:{port}"),
                 ('listeners = "127.0.0.1:%d"\nhttp = { bind = "127.0.0.1:%d" }\n'
                  % (free_port(), port), 5, f"http.bind 127.0.0.1:{port}"))
        for tail, line, named in cases:
            conf = tmp_path / "rtd.conf"
            conf.write_text(head + tail)
            r = subprocess.run([RTD, "-c", str(conf)], capture_output=True, text=True,
                               timeout=30)
            out = r.stdout + r.stderr
            assert r.returncode == 2, out[-2000:]
            assert (f"{conf}:{line}: {named}: cannot listen: address already in use"
                    in r.stderr), out[-2000:]
            for started in ("sink.started", "rules.started", "rule.", "store.",
                            "listener.started", "rtd.started"):
                assert started not in out, out[-2000:]
            assert not (tmp_path / "data" / "rt.db").exists()  # the sink never opened it
    finally:
        held.close()
