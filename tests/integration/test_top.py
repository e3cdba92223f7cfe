"""`rtctl top` against a real rtd: the live screen driven in a pseudo-terminal (the node panel
and actor rows, sort keys, a resize, quitting with the terminal restored, rtd going away),
the batch modes (--once, -n, --json), and one sample's cost with 20,000 actors.

Run: RT_BUILD_DIR=$PWD/build/release /usr/bin/python3 -m pytest -q -s tests/integration/test_top.py
(-s shows the 20,000-actor figures.)
"""
import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time

import pytest

from admin_wire import Admin
from conftest import BUILD, RTCTL, Rtd, client, subscribe, wait_for

RTBENCH = os.path.join(BUILD, "tools", "rtbench", "rtbench")
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
CLEAR = b"\x1b[H\x1b[2J"


pytestmark = pytest.mark.usefixtures("rtctl_built")


@pytest.fixture
def broker():
    b = Rtd()
    assert wait_for(lambda: os.path.exists(b.admin_socket), 5)
    clients = [client(b.port, f"top-{i}") for i in range(3)]
    subscribe(clients[0], "a/#", 1)
    yield b
    for c in clients:
        c.disconnect()
        c.loop_stop()
    code, log = b.stop()
    assert code == 0, log


def set_size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """rtctl top in a pseudo-terminal that is its controlling terminal (so a resize sends it
    SIGWINCH, as a terminal emulator's does). out collects everything it wrote."""

    def __init__(self, socket_path, *args, rows=40, cols=120):
        self.master, slave = os.openpty()
        set_size(slave, rows, cols)
        self.cooked = termios.tcgetattr(slave)

        def controlling_tty():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen([RTCTL, "-s", socket_path, "top", *args], stdin=slave,
                                     stdout=slave, stderr=slave, preexec_fn=controlling_tty)
        os.close(slave)
        self.out = b""

    def read(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            r, _, _ = select.select([self.master], [], [], 0.05)
            if r:
                try:
                    data = os.read(self.master, 1 << 16)
                except OSError:  # EIO: the slave side is closed, rtctl is gone
                    return
                if not data:
                    return
                self.out += data

    def until(self, cond, seconds=10):
        """Reads until cond(self) holds; fails with the last frame after seconds."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if cond(self):
                return
            self.read(0.1)
        assert cond(self), self.frame_text()

    def frames(self):
        return self.out.split(CLEAR)[1:]

    def frame_lines(self, i=-1):
        """The lines of a frame as the screen shows them (escape codes removed); the last
        complete one by default (a frame is complete once a later one began)."""
        fr = self.frames()
        if not fr:
            return []
        return [ANSI.sub(b"", line).decode("utf-8", "replace")
                for line in fr[i].split(b"\r\n")]

    def frame_text(self, i=-1):
        return "\n".join(self.frame_lines(i))

    def key(self, k):
        os.write(self.master, k)

    def mode(self):
        return termios.tcgetattr(self.master)  # a pty master reports its slave's settings

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        os.close(self.master)


@pytest.fixture
def terminal():
    made = []

    def make(*a, **k):
        made.append(Terminal(*a, **k))
        return made[-1]
    yield make
    for t in made:
        t.close()


def actor_rows(lines):
    """The rows of the actor table: lines that start with a pid `<slot.gen>`."""
    return [line for line in lines if re.match(r"\s*<\d+\.\d+>", line)]


def number(text):
    """A figure as rtd prints it: 4328, 15.7K, 2.1M, 1.0G."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return float(text.rstrip("KMG")) * scale


def column(lines, name):
    """The values of column name in the actor rows (every field but the last is one word)."""
    head = next(line for line in lines if line.startswith("PID "))
    i = head.split().index(name)
    return [number(row.split()[i]) for row in actor_rows(lines)]


def complete(t, cond):
    """cond over the last frame, once it is complete: drawn down to rtctl's own bottom line
    (the sort and the keys)."""
    lines = t.frame_lines()
    return bool(lines) and "q quit" in lines[-1] and cond(lines)


def test_live_screen_keys_resize_quit(broker, terminal):
    t = terminal(broker.admin_socket, "-d", "0.5", rows=40, cols=120)
    t.until(lambda t: b"\x1b[?1049h" in t.out and complete(t, lambda ls: actor_rows(ls)))
    assert t.mode()[3] & termios.ICANON == 0  # raw mode while it runs
    lines = t.frame_lines()
    text = "\n".join(lines)
    assert "actors" in text.lower()  # the node panel
    assert len(actor_rows(lines)) >= 3
    assert len(lines) <= 40 and all(len(line) <= 120 for line in lines)
    assert "sort: reductions" in lines[-1]

    t.out = b""
    t.key(b"m")
    t.until(lambda t: complete(t, lambda ls: "sort: memory" in ls[-1]), 3)
    lines = t.frame_lines()
    assert any(line.startswith("sort: memory") for line in lines[:-1])  # rtd's header
    mem = column(lines, "MEMORY")
    assert len(mem) >= 3 and mem == sorted(mem, reverse=True), lines
    t.out = b""
    t.key(b"b")
    t.until(lambda t: complete(t, lambda ls: "sort: mailbox" in ls[-1]), 3)

    t.out = b""
    set_size(t.master, 20, 60)
    t.until(lambda t: complete(t, lambda ls: len(ls) <= 20 and actor_rows(ls)), 3)
    lines = t.frame_lines()
    assert all(len(line) <= 60 for line in lines), lines
    assert len(lines) <= 20

    t.out = b""
    t.key(b"q")
    assert t.proc.wait(5) == 0
    t.read(0.2)
    assert t.out.endswith(b"\x1b[?25h\x1b[?1049l"), t.out[-100:]
    assert t.mode() == t.cooked


def test_live_tiny_terminal_and_server_errors(broker, terminal):
    """A terminal smaller than the smallest screen rtd renders (20x8) gets rtd's smallest,
    clipped; an error reply shows in the bottom line and the view keeps running."""
    t = terminal(broker.admin_socket, "-d", "0.3", rows=6, cols=15)
    t.until(lambda t: len(t.frames()) >= 2)
    lines = t.frame_lines(-2)  # complete: a later frame began
    assert lines[0].startswith("rtd 0.1.0") and lines[-1] == "sort: reduction"
    assert len(lines) == 6 and all(len(line) <= 15 for line in lines), lines
    t.key(b"q")
    assert t.proc.wait(5) == 0

    t = terminal(broker.admin_socket, "-d", "0.3", "-n", "1000001")
    error = "rtctl: rtd says 400: -n must be a whole number from 0 to 1000000"
    t.until(lambda t: len(t.frames()) >= 3 and t.frame_lines()[-1] == error)
    assert t.proc.poll() is None
    t.key(b"q")
    assert t.proc.wait(5) == 0 and t.mode() == t.cooked


def test_live_ctrl_c_and_sigterm_restore(broker, terminal):
    t = terminal(broker.admin_socket)
    t.until(lambda t: complete(t, lambda ls: actor_rows(ls)))
    t.key(b"\x1b[C")  # an arrow key is not `C`
    t.until(lambda t: len(t.frames()) >= 2)
    assert "sort: reductions" in t.frame_lines()[-1]
    t.key(b"\x03")
    assert t.proc.wait(5) == 0
    t.read(0.2)
    assert b"\x1b[?1049l" in t.out and t.mode() == t.cooked

    t = terminal(broker.admin_socket)
    t.until(lambda t: complete(t, lambda ls: actor_rows(ls)))
    t.proc.send_signal(signal.SIGTERM)
    assert t.proc.wait(5) == 0
    t.read(0.2)
    assert b"\x1b[?1049l" in t.out and t.mode() == t.cooked


def test_live_rtd_goes_away(terminal):
    b = Rtd()
    try:
        assert wait_for(lambda: os.path.exists(b.admin_socket), 5)
        t = terminal(b.admin_socket, "-d", "5")
        t.until(lambda t: complete(t, lambda ls: actor_rows(ls)))
    finally:
        code, log = b.stop()
    assert code == 0, log
    assert t.proc.wait(5) == 1
    t.read(0.3)
    assert t.mode() == t.cooked
    tail = t.out.split(b"\x1b[?1049l")[-1]
    assert b"rtctl: lost connection to rtd" in tail, t.out[-300:]


def run_top(broker, *args, timeout=30):
    p = subprocess.run([RTCTL, "-s", broker.admin_socket, "top", *args], capture_output=True,
                       text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def test_once_and_rows(broker):
    code, out, err = run_top(broker, "--once")
    assert code == 0, err
    assert "\x1b" not in out
    lines = out.splitlines()
    assert all(len(line) <= 132 for line in lines)
    assert len(actor_rows(lines)) >= 3
    # Not a terminal and no --once: the same plain frame.
    code, out2, _ = run_top(broker)
    assert code == 0 and "\x1b" not in out2 and actor_rows(out2.splitlines())
    code, out, _ = run_top(broker, "--once", "-n", "2", "--sort", "memory")
    assert code == 0
    assert len(actor_rows(out.splitlines())) == 2
    assert "memory" in out.lower()


def test_json_samples(broker):
    start = time.monotonic()
    code, out, err = run_top(broker, "--json", "--count", "3", "-d", "0.3", "-n", "4")
    assert code == 0, err
    assert time.monotonic() - start >= 0.6
    lines = out.splitlines()
    assert len(lines) == 3
    samples = [json.loads(line) for line in lines]
    for s in samples:
        assert isinstance(s, dict)
        rows = top_rows(s)
        assert 1 <= len(rows) <= 4
        assert "pid" in rows[0]
    code, out, _ = run_top(broker, "--json", "--once", "--sort", "memory", "-n", "5")
    assert code == 0 and len(out.splitlines()) == 1
    rows = top_rows(json.loads(out))
    mem = [r["memory"] for r in rows]
    assert mem == sorted(mem, reverse=True)
    code, out, _ = run_top(broker, "--json", "--once", "--sort", "gc_pause", "-n", "5")
    assert code == 0
    pauses = [r["gc_max_pause_us"] for r in top_rows(json.loads(out))]
    assert pauses == sorted(pauses, reverse=True) and len(pauses) == 5


def top_rows(sample):
    """The actor rows of a JSON top sample."""
    return sample["actors"]


# ---- 20,000 actors ----

def proc_cpu_s(pid):
    """utime + stime of pid, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_top_with_20000_actors(tmp_path):
    """~20,000 actors (idle MQTT connections from rtbench over two processes and four
    loopback addresses, plus rtd's own): every actor in a sample, and what a sample costs."""
    if not os.access(RTBENCH, os.X_OK):
        pytest.fail(f"{RTBENCH} not built")
    b = Rtd()
    bench = None
    try:
        assert wait_for(lambda: os.path.exists(b.admin_socket), 5)
        # Connection actors do not count: an earlier client's may still be ending now. The
        # one serving this request does, as one serves each later sample.
        rows = top_rows(b.ctl_json("top", "-n", "100000"))
        base = 1 + sum(1 for r in rows if r["type"] not in ("mqtt_conn", "admin_conn"))
        # rtd holds one descriptor per connection under a 20,000 limit; its own (~25, and
        # the admin connections) and the 64 that MQTT clients may not take (listener.c's
        # RT_LISTEN_FD_RESERVE, kept for rtctl and HTTP) take the rest.
        conns = 19_880
        bench = subprocess.Popen(
            [RTBENCH, "conn", "-p", str(b.port), "-c", str(conns), "-i", "0", "--procs", "2",
             "-d", "45", "--ifaddr", "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 30
        actors = 0
        while time.monotonic() < deadline and actors < base + conns:
            time.sleep(0.5)
            actors = b.ctl_json("top", "-n", "1")["node"]["actors"]
            assert bench.poll() is None, bench.stderr.read()
        assert actors >= base + conns, actors

        def cost(argv, samples=10):
            """rtd's CPU seconds and the round trips of samples runs of rtctl argv."""
            cpu0, times = proc_cpu_s(b.proc.pid), []
            for _ in range(samples):
                t0 = time.monotonic()
                p = subprocess.run([RTCTL, "-s", b.admin_socket, *argv], capture_output=True,
                                   text=True, timeout=30)
                times.append(time.monotonic() - t0)
                assert p.returncode == 0, p.stderr
            return (proc_cpu_s(b.proc.pid) - cpu0) / samples, sorted(times), p.stdout

        cpu, times, out = cost(["top", "--once", "--json", "-n", "100000"])
        sample = json.loads(out)
        assert len(top_rows(sample)) == sample["node"]["actors"] >= base + conns
        n = sample["node"]["actors"]
        print(f"\n{n} actors. rtctl top --once --json -n 100000 (every actor, "
              f"{len(out) / 1e6:.1f} MB): round trip median {times[5] * 1000:.0f} ms, "
              f"max {times[-1] * 1000:.0f} ms; rtd CPU {cpu * 1000:.0f} ms a sample")
        cpu, times, out = cost(["top", "--once", "--json", "-n", "30"])
        assert len(top_rows(json.loads(out))) == 30
        print(f"rtctl top --once --json -n 30: round trip median {times[5] * 1000:.0f} ms, "
              f"rtd CPU {cpu * 1000:.0f} ms a sample")
        cpu, times, out = cost(["top", "--once", "-n", "30", "--width", "132"])
        assert len(actor_rows(out.splitlines())) == 30
        print(f"rtctl top --once -n 30 (text): round trip median {times[5] * 1000:.0f} ms, "
              f"rtd CPU {cpu * 1000:.0f} ms a sample")
        # What a live `rtctl top` costs: one connection, a screen every second.
        a = Admin(b.admin_socket)
        try:
            cpu0, t0 = proc_cpu_s(b.proc.pid), time.monotonic()
            for _ in range(10):
                code, body = a.ask("top", "--width", "132", "--height", "50")
                assert code == 200 and len(actor_rows(body.splitlines())) > 30
            wall = (time.monotonic() - t0) / 10
            cpu = (proc_cpu_s(b.proc.pid) - cpu0) / 10
        finally:
            a.close()
        print(f"live top (one connection, 132x50 screens): {wall * 1000:.0f} ms a screen, "
              f"rtd CPU {cpu * 1000:.0f} ms a screen")
    finally:
        if bench:
            # rtbench and the processes it forked: their own group, started here.
            try:
                os.killpg(bench.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            bench.wait(15)
        code, log = b.stop()
    assert code == 0, log[-3000:]
