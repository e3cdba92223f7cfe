"""rtd under a Type=notify unit: READY=1 once its listeners accept, STOPPING=1 as it stops,
sent to the socket systemd names in NOTIFY_SOCKET (sd_notify's datagram protocol), here a
socket this test binds in systemd's place."""
import os
import signal
import socket
import subprocess
import tempfile

import pytest

from conftest import ROOT, RTD, free_port, rtctl, wait_for


@pytest.mark.parametrize("abstract", [False, True])
def test_ready_once_listeners_accept_and_stopping_at_sigterm(tmp_path, abstract):
    name = f"@rt-notify-test-{os.getpid()}" if abstract else str(tmp_path / "notify")
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind("\0" + name[1:] if abstract else name)
    manager.settimeout(30)
    port, data = free_port(), tmp_path / "data"
    env = dict(os.environ, NOTIFY_SOCKET=name)
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"),
                             "-o", f"listeners=127.0.0.1:{port}", "-o", f'data_dir="{data}"'],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert manager.recv(4096) == b"READY=1"
        # Ready means serving: the MQTT listener accepts and the admin socket answers.
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        code, out, err = rtctl("status", socket_path=str(data / "rtd.sock"))
        assert code == 0 and "running" in out, (out, err)
        proc.send_signal(signal.SIGTERM)
        assert manager.recv(4096) == b"STOPPING=1"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        manager.close()
        log.seek(0)
        text = log.read()
    assert "rtd.notify" not in text, text


def test_a_failed_start_never_says_ready(tmp_path):
    """A start that fails (exit 2: a rule that does not load) sends no READY=1: systemd sees
    the unit fail instead of running."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "bad.lua").write_text("return {\n")
    conf = tmp_path / "rtd.conf"
    conf.write_text(f'listeners = {{ "127.0.0.1:{free_port()}" }}\n')
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(str(tmp_path / "notify"))
    manager.setblocking(False)
    r = subprocess.run([RTD, "-c", str(conf), "-o", f'data_dir="{tmp_path / "data"}"'],
                       env=dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify")),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    with pytest.raises(BlockingIOError):  # rtd has exited: anything it sent is queued
        manager.recv(4096)
    manager.close()


def test_a_notify_socket_nobody_binds_is_logged_not_fatal(tmp_path):
    port, data = free_port(), tmp_path / "data"
    proc = subprocess.Popen([RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"),
                             "-o", f"listeners=127.0.0.1:{port}", "-o", f'data_dir="{data}"'],
                            env=dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "nobody")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # The admin socket opens last: once it answers, READY=1 has been tried.
        assert wait_for(lambda: rtctl("status", socket_path=str(data / "rtd.sock"))[0] == 0,
                        30), "rtd did not start"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "rtd.notify" in out and "cannot tell systemd READY=1" in out, out
    assert "cannot tell systemd STOPPING=1" in out, out
