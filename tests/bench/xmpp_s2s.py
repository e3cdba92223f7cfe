"""Federation's cost: one user sends N chat messages to a user on another server, over one
server-to-server stream (STARTTLS, dialback), for two rtds, two Prosody 0.12s and two
ejabberd 23.01s side by side in one run; the rate (first send to last receipt) and each
server's CPU-seconds per million messages (utime + stime from /proc), medians of ROUNDS. Every
pair serves a.test and b.test on the same two loopback addresses, in a network namespace whose
hosts file names them (dns_util.Netns; its DNS server has no SRV records), so each server finds
the other by the domain's address, as it would with no SRV records in DNS. The clients are raw
sockets on the same 2 cores: their CPU is not counted.
  cd tests/integration && /usr/bin/python3 ../bench/xmpp_s2s.py 20000 3 [rtd,prosody,ejabberd]
(arguments: messages a round, rounds, which pairs). Needs root (the namespace), make build,
prosody and ejabberd (install-deps --for test)."""
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, ".")
import xmpp_peer  # noqa: E402
import xmpp_util as X  # noqa: E402
from certs import Pki  # noqa: E402
from conftest import Rtd, free_port, wait_listening  # noqa: E402
from dns_util import DnsServer, Netns  # noqa: E402
from test_xmpp_s2s_peers import prosody_config  # noqa: E402

N, ROUNDS = int(sys.argv[1]), int(sys.argv[2])
PAIRS = (sys.argv[3] if len(sys.argv) > 3 else "rtd,prosody,ejabberd").split(",")
DOMAINS = (("a.test", "127.0.0.11", "b.test"), ("b.test", "127.0.0.12", "a.test"))
PW = "bench pw"
TICK = os.sysconf("SC_CLK_TCK")
base = tempfile.mkdtemp(prefix="rt-s2s-bench-")
pki = Pki(os.path.join(base, "pki"))
cert, key = pki.server["ec"]


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rtd_pair():
    out = []
    for dom, addr, _ in DOMAINS:
        d = tempfile.mkdtemp(dir=base)
        X.add_users(d, [(f"u@{dom}", PW)])
        port = free_port()
        r = Rtd(f'xmpp={{ hosts = {{ "{dom}" }}, listeners = {{ "127.0.0.1:{port}", '
                f'{{ bind = "{addr}:5269", s2s = true, starttls = true, '
                f'tls = {{ cert = "{cert}", key = "{key}" }} }} }} }}', "auth_max_delay_ms=0",
                data_dir=d, netns=ns.name)
        out.append((r, r.proc.pid, port, dom))
    return out, lambda: [r.stop() for r, *_ in out]


def ejabberd_pair():
    out = []
    pem = os.path.join(base, "ejabberd.pem")  # ejabberd takes the key in the same file
    with open(pem, "w") as f, open(cert) as c, open(key) as k:
        f.write(c.read() + k.read())
    for dom, addr, _ in DOMAINS:
        p = xmpp_peer.Peer("ejabberd", tempfile.mkdtemp(dir=base), free_port(), [dom], [], ["u"],
                           PW, netns=ns, s2s=(addr, pem, None))
        out.append((p, p.proc.pid, p.xport, dom))
    return out, lambda: [p.stop() for p, *_ in out]


def prosody_pair():
    out, procs = [], []
    for dom, addr, peer in DOMAINS:
        paddr = next(a for d, a, _ in DOMAINS if d == peer)
        d = tempfile.mkdtemp(dir=base)
        os.makedirs(os.path.join(d, "data"))
        with open(os.path.join(d, "hosts"), "w") as f:  # libunbound reads these, not /etc's
            f.write(f"{paddr} {peer}\n")
        with open(os.path.join(d, "resolv.conf"), "w") as f:
            f.write("nameserver 127.0.0.1\n")
        port = free_port()
        with open(os.path.join(d, "prosody.cfg.lua"), "w") as f:
            f.write(prosody_config(d, port, addr, cert, key, domain=dom))
        argv, env = xmpp_peer.command("prosody", d)
        p = subprocess.Popen(ns.command(argv), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=d,
                             env=dict(os.environ, **env))
        wait_listening(p, port, 30, "prosody", lambda: "")
        xmpp_peer.register(port, f"u@{dom}", PW)
        procs.append(p)
        out.append((p, p.pid, port, dom))

    def stop():
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    return out, stop


def round_of(servers):
    (_, apid, aport, adom), (_, bpid, bport, bdom) = servers
    snd, rcv = X.Raw(aport), X.Raw(bport)
    snd.login("u", PW, resource="s", to=adom, mech="SCRAM-SHA-1")
    rcv.login("u", PW, resource="r", to=bdom, mech="SCRAM-SHA-1")
    # One message first: the streams both ways set up (TLS, dialback) outside the measure.
    snd.send(f"<message to='u@{bdom}/r' type='chat'><body>warm</body></message>")
    rcv.read_until(rb"<body>warm</body>.*?</message>", timeout=60)
    got, done = [0], threading.Event()

    def reader():
        rcv.sock.settimeout(120)
        buf, end = rcv.buf, b"</message>"
        while got[0] < N:
            chunk = rcv.sock.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
            n = buf.count(end)
            got[0] += n
            buf = buf[buf.rfind(end) + len(end):] if n else buf[-len(end):]
        done.set()
    threading.Thread(target=reader, daemon=True).start()
    c0 = cpu_s(apid) + cpu_s(bpid)
    ca0, t0 = cpu_s(apid), time.monotonic()
    msg = f"<message to='u@{bdom}/r' type='chat'><body>hello over federation</body></message>"
    batch = msg * 100
    for _ in range(N // 100):
        snd.sock.sendall(batch.encode())
    done.wait(180)
    t1 = time.monotonic()
    ca1, c1 = cpu_s(apid), cpu_s(apid) + cpu_s(bpid)
    snd.close()
    rcv.close()
    return got[0], N / (t1 - t0), (c1 - c0) / N * 1e6, (ca1 - ca0) / N * 1e6


ns = Netns(f"rt-s2s-bench-{os.getpid()}", {a: [d] for d, a, _ in DOMAINS})
try:
    with ns.inside():
        dns = DnsServer({})
        makers = {"rtd": rtd_pair, "prosody": prosody_pair, "ejabberd": ejabberd_pair}
        for name in PAIRS:
            servers, stop = makers[name]()
            try:
                rounds = [round_of(servers) for _ in range(ROUNDS)]
            finally:
                stop()
            assert all(r[0] >= N for r in rounds), f"{name}: lost {[r[0] for r in rounds]}"
            rate = statistics.median(r[1] for r in rounds)
            cpu = statistics.median(r[2] for r in rounds)
            cpu_a = statistics.median(r[3] for r in rounds)
            print(f"{name:8} {N} messages a round: {rate:,.0f} msg/s, both servers "
                  f"{cpu:.1f} CPU-s per million (sender's {cpu_a:.1f}); rounds "
                  + ", ".join(f"{r[1]:,.0f}/s {r[2]:.1f}" for r in rounds), flush=True)
        dns.close()
finally:
    ns.delete()
