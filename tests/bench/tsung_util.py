"""tsung_util.py: Tsung 1.7 (Debian's tsung) run and read back, for the tests and benchmarks
that drive rtd with it (tests/integration/test_tsung.py, MQTT; xmpp_tsung.py, XMPP).

Loopback only and bounded: Tsung's Erlang nodes use 127.0.0.1 (their distribution port is
bound there) and a private epmd on a free loopback port (stopped by its PID), its web GUI is
off, and the caller bounds the run.
"""
import collections
import contextlib
import os
import re
import shutil
import socket
import subprocess

TSUNG = shutil.which("tsung")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(xml, workdir):
    """Tsung started on scenario file xml (logs under workdir/log): yields its Popen (output
    on its stdout pipe); on leaving, Tsung (if still running) and its private epmd end."""
    if TSUNG is None:
        raise RuntimeError("tsung is missing; run tools/install-deps.sh --for test")
    epmd_port = free_port()
    epmd = subprocess.Popen(["epmd", "-address", "127.0.0.1", "-port", str(epmd_port)])
    tsung = None
    try:
        # The Erlang distribution port listens on loopback only, like the epmd.
        env = dict(os.environ, ERL_EPMD_PORT=str(epmd_port), HOME=str(workdir),
                   ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}")
        tsung = subprocess.Popen([TSUNG, "-n", "-I", "127.0.0.1", "-w", "0", "-f", str(xml),
                                  "-l", os.path.join(workdir, "log"), "start"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=env)
        yield tsung
    finally:
        if tsung is not None and tsung.poll() is None:
            tsung.kill()
            tsung.wait()
        epmd.terminate()
        epmd.wait(timeout=10)


def run_dir(logdir):
    runs = [os.path.join(logdir, d) for d in os.listdir(logdir)]
    assert len(runs) == 1, runs
    return runs[0]


def totals(logdir, name=r"\w+"):
    """The last cumulative value of each counter in Tsung's tsung.log whose name matches
    name ("stats: NAME n total"); sampled statistics, with more fields, are samples()'s."""
    out = {}
    with open(os.path.join(run_dir(logdir), "tsung.log")) as f:
        for line in f:
            m = re.match(rf"stats: ({name}) (\S+) (\S+)", line.strip())
            if m:
                fields = line.split()
                if len(fields) == 4:
                    out[m.group(1)] = int(float(fields[3]))
    return out


def samples(logdir):
    """Each sampled statistic's total count over the run (tsung.log gives each 10 s window's
    count: "stats: NAME count mean stdvar max min meanfb countfb")."""
    out = collections.Counter()
    with open(os.path.join(run_dir(logdir), "tsung.log")) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 9 and fields[0] == "stats:":
                out[fields[1]] += int(fields[2])
    return out
