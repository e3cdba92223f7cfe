"""Shared fixtures for integration tests: a Mosquitto broker on a free loopback port.

The broker is started from Debian's /usr/sbin/mosquitto with a config written here and is
stopped by the PID this fixture started, never by name.
"""
import json
import os
import random
import re
import resource
import socket
import subprocess
import time

import pytest

import logcheck

MOSQUITTO = "/usr/sbin/mosquitto"

# mongo-c-driver's constructor (before rtd's main) makes shared-memory counters named after
# the pid, for its mongoc-stat tool; one left by an rtd a test killed, its pid reused, makes
# the driver write a line of its own to stderr, outside rtd's log (docs/SERVICE.md).
os.environ["MONGOC_DISABLE_SHM"] = "1"


@pytest.fixture(autouse=True)
def watchdog():
    """A test that hangs (a deadlock in a client library, a broker that stopped answering)
    ends the run with every thread's traceback after 300 s instead of stalling CI."""
    import faulthandler
    faulthandler.dump_traceback_later(300, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_given_ports = set()


def free_port():
    """Returns a TCP port on 127.0.0.1 that nothing listens on right now, below the kernel's
    ephemeral range: a port the kernel hands out (bind to 0) can be taken, before the broker
    binds it, as the local port of any client's outgoing connection (the long tests run
    thousands beside the others), which a port below the range never is."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10000, low)
        if port in _given_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given_ports.add(port)
        return port
    raise RuntimeError(f"no free port in 10000-{low - 1}")


def raise_nofile():
    """Runs in the child before exec: lift the open-file limit to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def sanitized(pid):
    """A sanitizer's allocator serves rtd: mallinfo2 knows nothing of it, and it keeps freed
    memory in quarantine and adds shadow memory, so RSS cannot be told apart there."""
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    return "libasan" in maps or "libtsan" in maps


def rss_kb(pid):
    """A live process's resident memory, KB (/proc/PID/status VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def mosquitto_conf(port):
    # Without the queue limit Mosquitto drops QoS1/2 messages for a slow subscriber, and
    # without TCP_NODELAY it adds Nagle delays; both would be blamed on the tool.
    return (
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        "max_queued_messages 1000000\n"
        "max_inflight_messages 0\n"
        "set_tcp_nodelay true\n"
        "max_connections -1\n"
    )


class Broker:
    def __init__(self, directory):
        self.port = free_port()
        self.conf = os.path.join(directory, "mosquitto.conf")
        self.log = os.path.join(directory, "mosquitto.log")
        with open(self.conf, "w") as f:
            f.write(mosquitto_conf(self.port))
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [MOSQUITTO, "-c", self.conf], stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=raise_nofile)
        wait_listening(self.proc, self.port, 10, "mosquitto", lambda: open(self.log).read())

    def stop(self):
        end_process(self.proc, 5)


def wait_listening(proc, port, seconds, name, read_log):
    """Returns once a server this test run started (proc) takes connections on port; ends it
    and raises if it exits first or does not within seconds."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {read_log()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    end_process(proc, 5)
    raise RuntimeError(f"{name} did not start listening within {seconds} s")


def end_process(proc, seconds):
    """SIGTERM to a process this test run started, SIGKILL if it lingers past seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory):
    if not os.access(MOSQUITTO, os.X_OK):
        pytest.fail(f"{MOSQUITTO} is missing; run tools/install-deps.sh")
    broker = Broker(str(tmp_path_factory.mktemp("mosquitto")))
    yield broker
    broker.stop()


# ---- rtd, the broker under test ----

import signal  # noqa: E402
import threading  # noqa: E402

import paho.mqtt.client as mqtt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("RT_BUILD_DIR", os.path.join(ROOT, "build", "release"))
# Settings every rtd of the run gets before a test's own, e.g. RT_RTD_OPTIONS="min_heap=1024"
# to collect after nearly every message, which an actor's missing heap root does not survive
# under ASan.
RTD_OPTIONS = os.environ.get("RT_RTD_OPTIONS", "").split()
RTD = os.path.join(BUILD, "rtd")
RTCTL = os.path.join(BUILD, "rtctl")


def rtctl(*args, socket_path=None, json=False, timeout=60, **popen):
    """Runs rtctl (against socket_path when given, with --json when asked): (exit code,
    stdout, stderr)."""
    argv = [RTCTL] + (["-s", socket_path] if socket_path else []) + [str(a) for a in args]
    if json:
        argv.append("--json")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **popen)
    return p.returncode, p.stdout, p.stderr


# How long a stopping rtd may take: its rule workers and then its sinks hand on what they
# hold, each group waiting at most 60 s (group.h, RT_GROUP_SHUTDOWN_MS) before rtd logs
# supervisor.stop_timeout and goes on; a stop step of a second or more is logged
# (rtd.slow_stop), so a slow stop that still passes says where its time went.
STOP_WAIT_S = 2 * 60 + 5


class Rtd:
    """A real rtd on a free loopback port, with its own data directory (state.db, sinks)
    unless data_dir names one to share with an earlier instance (restart tests)."""

    def __init__(self, *overrides, data_dir=None, port=None, netns=None):
        import tempfile
        self.port = port or free_port()
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="rtd-data-")
            data_dir = self._tmp.name
        self.data_dir = data_dir
        self.overrides = list(overrides)
        self.log_format = logcheck.log_format(RTD_OPTIONS + self.overrides)
        # An override wins, as in rtd: the last data_dir= or admin_socket= given.
        settings = {"data_dir": data_dir, "admin_socket": ""}
        for o in overrides:
            key, _, value = o.partition("=")
            if key in settings:
                settings[key] = value.strip("\"'")
        self.admin_socket = settings["admin_socket"] or os.path.join(settings["data_dir"],
                                                                     "rtd.sock")
        # The suite opens thousands of connections from 127.0.0.1, faster than the shipped
        # per-address and rate limits let one address: tests of those limits set their own.
        args = [RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"),
                "-o", f"listeners=127.0.0.1:{self.port}", "-o", "schedulers=2",
                "-o", "max_connections_per_ip=0", "-o", "max_connection_rate=0",
                "-o", f'data_dir="{data_dir}"']
        for o in RTD_OPTIONS + list(overrides):
            args += ["-o", o]
        # A file, not a pipe: a broker logging thousands of connections would fill a pipe
        # nobody reads until the end, and block on it.
        import tempfile
        self.log = tempfile.TemporaryFile(mode="w+")
        # rtd binds its ports and admin socket before anything starts, so they take
        # connections (into the kernel's backlog) before it serves them: it is ready when it
        # tells systemd so, once every stage runs and the listeners accept (notify.h). An
        # abstract socket: no path to outgrow sun_path; kept open for its STOPPING=1.
        # In a network namespace of its own (netns: `ip netns exec`, which keeps the pid and
        # gives the namespace's /etc/hosts and resolv.conf), the abstract namespace is that
        # namespace's: the socket is a path there.
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        name = f"rt-test-{os.getpid()}-{id(self)}"
        address = os.path.join(data_dir, "notify.sock") if netns else "\0" + name
        self.notify.bind(address)
        self.notify.settimeout(0.05)
        env = dict(os.environ, NOTIFY_SOCKET=address if netns else "@" + name)
        if netns:
            args = ["ip", "netns", "exec", netns] + args
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, text=True,
                                     env=env)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if self.notify.recv(4096) == b"READY=1":
                    return
            except socket.timeout:
                if self.proc.poll() is not None:
                    self.notify.close()
                    raise RuntimeError("rtd exited: " + self.read_log())
        # Nobody would stop an rtd whose constructor failed: this test started it, so it ends it.
        self.proc.kill()
        self.proc.wait()
        self.notify.close()
        raise RuntimeError("rtd did not start listening: " + self.read_log()[-2000:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.notify.close()
        self.check_log()
        return self.proc.returncode, self.read_log()

    def check_log(self, killed=False):
        """Every line rtd wrote splits with a strict logfmt (or JSON) reader (logcheck.py):
        what an operator's log system will be given."""
        bad = logcheck.bad_lines(self.read_raw_log(), self.log_format, last_may_be_partial=killed)
        assert not bad, f"{len(bad)} {self.log_format} line(s) that do not parse: " + \
            "\n".join(f"{why}: {line!r}" for line, why in bad[:5])

    def wait_offline(self, client_id, timeout=5.0):
        """Waits until the broker has handled client_id's disconnect and kept its session:
        until then, messages published meanwhile still go out on the closing socket."""
        mark = f"client.disconnected client={client_id} session=kept"
        deadline = time.time() + timeout
        while mark not in self.read_log():
            assert time.time() < deadline, self.read_log()[-2000:]
            time.sleep(0.01)

    def kill9(self):
        """SIGKILL, as a crash: nothing gets to flush or say goodbye."""
        self.proc.kill()
        self.proc.wait()
        self.notify.close()
        self.check_log(killed=True)

    def read_log(self):
        """The log as logfmt text, whatever log_format rtd writes (JSON lines rendered)."""
        raw = self.read_raw_log()
        return logcheck.json_as_logfmt(raw) if self.log_format == "json" else raw

    def read_raw_log(self):
        # pread, not seek and read: rtd writes through the same open file (its stdout), so
        # moving the shared offset while it runs would have its next lines overwrite old ones.
        fd = self.log.fileno()
        size = os.fstat(fd).st_size
        chunks, off = [], 0
        while off < size:
            b = os.pread(fd, size - off, off)
            if not b:
                break
            chunks.append(b)
            off += len(b)
        return b"".join(chunks).decode(errors="replace")

    def ctl(self, *args, json=False, timeout=60):
        """rtctl against this rtd's admin socket: (exit code, stdout, stderr)."""
        return rtctl(*args, socket_path=self.admin_socket, json=json, timeout=timeout)

    def ctl_json(self, *args, timeout=60):
        """rtctl ... --json that must succeed: the parsed body."""
        import json as json_
        code, out, err = self.ctl(*args, json=True, timeout=timeout)
        assert code == 0, (args, code, out, err)
        return json_.loads(out)


@pytest.fixture
def rtd():
    broker = Rtd()
    yield broker
    code, log = broker.stop()
    assert code == 0, log


@pytest.fixture
def stopper():
    """stopper(broker) stops that Rtd when the test ends; it must exit 0."""
    brokers = []
    yield brokers.append
    for b in brokers:
        code, log = b.stop()
        assert code == 0, log


@pytest.fixture(scope="module")
def rtctl_built():
    if not os.access(RTCTL, os.X_OK):
        pytest.fail(f"{RTCTL} not built; run make build or set RT_BUILD_DIR")


def client(port, client_id="", protocol=mqtt.MQTTv311, clean=True):
    if protocol == mqtt.MQTTv5:
        c = mqtt.Client(client_id=client_id, protocol=protocol)
    else:
        c = mqtt.Client(client_id=client_id, protocol=protocol, clean_session=clean)
    got = []
    lock = threading.Lock()

    def on_message(_c, _u, msg):
        with lock:
            got.append((msg.topic, msg.payload, msg.qos))

    c.on_message = on_message
    c.got = got
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    return c


def reply_json(handler, answer, status=200):
    """Writes answer (bytes as they are, else as JSON) as the reply of a
    BaseHTTPRequestHandler (the tests' services)."""
    out = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(out)))
    handler.end_headers()
    handler.wfile.write(out)


METRIC_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$')


def metric_samples(text):
    """{(name, labels text such as '{a="b"}' or ''): value} of every sample of a scrape."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC_SAMPLE.match(line)
        assert m, line
        samples[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return samples


def password_file(path, users):
    """A password file at path for users ({name: password}), made by `rtd passwd` with few
    hash rounds (tests log in often); returns the path as text. Without a password file rtd
    takes a user name as anonymous (README "Who may connect"), so a test that needs a user's
    ACL section, rate limits or name in rules makes one."""
    path = str(path)
    for i, (name, pw) in enumerate(users.items()):
        subprocess.run([RTD, "passwd", *(["-c"] if i == 0 else []), "-b", "-I", "1000", path,
                        name, pw], check=True, capture_output=True, timeout=30)
    return path


def rtd_with_users(tmp_path, users, acl_text, *settings):
    """An Rtd with a password file of users ({name: password}) and an ACL file of acl_text
    (Mosquitto's format), and settings besides."""
    pw = password_file(tmp_path / "pw", users)
    acl = tmp_path / "acl"
    acl.write_text(acl_text)
    return Rtd(*settings, f'password_file="{pw}"', f'acl_file="{acl}"')


def wait_for(cond, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def subscribe(c, topic, qos=0):
    done = threading.Event()
    c.on_subscribe = lambda *a: done.set()
    c.subscribe(topic, qos)
    assert done.wait(5)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Certificates for the transport tests (TLS, mutual TLS, WSS), made with the openssl CLI
    once per module: see certs.py."""
    from certs import Pki
    return Pki(tmp_path_factory.mktemp("pki"))


def pytest_configure(config):
    # `make test-integration` runs the long tests (whole seconds of steady load or waiting:
    # a soak, an outage, a reload loop, an audit) in a second pytest beside the others, which
    # by design hold under that load.
    config.addinivalue_line("markers", "long: runs tens of seconds; make runs these beside the rest")
    config.addinivalue_line("markers", "rtd_only(reason): tests what only rtd has (rtctl, "
                            "metrics, logs, its config, the bounds it chose); skipped when "
                            "RT_XMPP_PEER names another server (xmpp_server.py)")


def pytest_collection_modifyitems(config, items):
    peer = os.environ.get("RT_XMPP_PEER", "rtd")
    if peer == "rtd":
        return
    for item in items:
        m = item.get_closest_marker("rtd_only")
        if m:
            why = m.args[0] if m.args else "rtd-specific"
            item.add_marker(pytest.mark.skip(reason=f"rtd only: {why}"))
