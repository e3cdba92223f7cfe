"""Shared fixtures for integration tests: a Mosquitto broker on a free loopback port.

The broker is started from Debian's /usr/sbin/mosquitto with a config written here and is
stopped by the PID this fixture started, never by name.
"""
import os
import resource
import socket
import subprocess
import time

import pytest

MOSQUITTO = "/usr/sbin/mosquitto"


def free_port():
    """Returns a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_nofile():
    """Runs in the child before exec: lift the open-file limit to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


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
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {open(self.log).read()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("mosquitto did not start listening within 10 s")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory):
    if not os.access(MOSQUITTO, os.X_OK):
        pytest.fail(f"{MOSQUITTO} is missing; run tools/install-deps.sh")
    broker = Broker(str(tmp_path_factory.mktemp("mosquitto")))
    yield broker
    broker.stop()
