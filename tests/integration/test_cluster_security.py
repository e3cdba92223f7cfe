"""The nodes' control requests signed with the cluster's secret (docs/CLUSTER.md, "Security"):
a NATS client without the secret (here one speaking NATS's text protocol over a socket) that
sends a takeover, asks for a session or asks an administrator's question is refused and
counted (control_refused), and nothing is ended, moved or told; a request replayed from the
wire is refused too. And the secret's file: required, only rtd's to read.
"""
import os
import socket
import time

import pytest

from cluster_harness import (WAIT, Mq, cluster_option, mq, nats, pfx,  # noqa: F401 (fixtures)
                             until)
from conftest import Rtd


class NatsRaw:
    """A NATS client over a raw socket: what anyone who reaches NATS can do."""

    def __init__(self, url):
        host, port = url.rsplit("/", 1)[1].split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.buf = b""
        assert self._line().startswith(b"INFO ")
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,'
                          b'"no_responders":false,"name":"attacker"}\r\nPING\r\n')
        self.sid = 0
        self.msgs = []
        self.flush()

    def _line(self):
        while b"\r\n" not in self.buf:
            data = self.sock.recv(65536)
            assert data, "NATS closed the connection"
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            data = self.sock.recv(65536)
            assert data, "NATS closed the connection"
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n + 2:]
        return out

    def flush(self, timeout=5.0):
        """PING, and read everything until its PONG (messages kept in msgs)."""
        self.sock.sendall(b"PING\r\n")
        self.sock.settimeout(timeout)
        while True:
            line = self._line()
            if line == b"PONG":
                return
            if line.startswith(b"MSG ") or line.startswith(b"HMSG "):
                parts = line.split()
                total = int(parts[-1])
                body = self._exact(total)
                hdr_len = int(parts[-2]) if parts[0] == b"HMSG" else 0
                self.msgs.append((parts[1].decode(), body[:hdr_len], body[hdr_len:]))
            elif line.startswith(b"-ERR"):
                pytest.fail(f"NATS: {line!r}")

    def sub(self, subject):
        self.sid += 1
        self.sock.sendall(b"SUB %s %d\r\n" % (subject.encode(), self.sid))
        self.flush()

    def hpub(self, subject, payload, headers=(), reply=""):
        hdr = b"NATS/1.0\r\n" + b"".join(b"%s: %s\r\n" % (k.encode(), v.encode())
                                          for k, v in headers) + b"\r\n"
        self.sock.sendall(b"HPUB %s %s %d %d\r\n" % (
            subject.encode(), reply.encode(), len(hdr), len(hdr) + len(payload)) + hdr +
            payload + b"\r\n")
        self.flush()

    def raw_pub(self, subject, hdr, payload, reply=""):
        """A message as it was seen on the wire (headers block and payload), sent again."""
        self.sock.sendall(b"HPUB %s %s %d %d\r\n" % (
            subject.encode(), reply.encode(), len(hdr), len(hdr) + len(payload)) + hdr +
            payload + b"\r\n")
        self.flush()

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def signed_nodes(nats):
    made = []
    try:
        for i in range(2):
            made.append(Rtd(cluster_option(f"s{i + 1}", nats.urls())))
        for n in made:
            until(lambda: n.ctl_json("cluster", "status")["lease"] == "held", WAIT,
                  lambda: n.read_log()[-2000:])
        yield made
    finally:
        for n in made:
            code, log = n.stop()
            assert code == 0, log[-3000:]


def refused(node):
    return node.ctl_json("cluster", "status")["control_refused"]


def test_forged_takeover_and_session_request_are_refused(signed_nodes, nats, mq, pfx):
    """Without the secret: a takeover for a connected client, and one asking for an offline
    session with its queued messages (Rt-Want: session), are refused and counted; the client
    stays connected, nothing comes back on the attacker's inbox, and the offline session
    resumes later with its queue (session present)."""
    s1, s2 = signed_nodes
    victim = mq(s1, name="victim")
    keeper = Mq(s1, cid="keep-" + pfx, clean=False, expiry=300)
    keeper.subscribe(f"{pfx}/q", 1)
    keeper.close()
    s1.wait_offline(keeper.id)
    pub = mq(s2, name="pub")
    watch = mq(s1, name="watch")
    watch.subscribe(f"{pfx}/q", 1)
    pub.publish(f"{pfx}/q", b"queued", qos=1)
    watch.wait_count(1)  # it reached s1, where the offline session queues it too
    attacker = NatsRaw(nats.urls()[0])
    try:
        attacker.sub("_INBOX.attacker.>")
        before = refused(s1)
        attacker.hpub("rt_ctl.node.s1.takeover", victim.id.encode(), reply="_INBOX.attacker.1")
        attacker.hpub("rt_ctl.node.s1.takeover", keeper.id.encode(),
                      headers=[("Rt-Want", "session")], reply="_INBOX.attacker.2")
        # A signature made up, in the right form.
        attacker.hpub("rt_ctl.node.s1.takeover", keeper.id.encode(),
                      headers=[("Rt-Want", "session"),
                               ("Rt-Auth", "%d 0123456789abcdef %s" % (time.time() * 1000,
                                                                        "ab" * 32))],
                      reply="_INBOX.attacker.3")
        until(lambda: refused(s1) >= before + 3, WAIT,
              lambda: s1.read_log()[-2000:])
        attacker.flush()
        assert attacker.msgs == [], attacker.msgs
    finally:
        attacker.close()
    assert victim.c.is_connected() and not victim.disconnects
    log = s1.read_log()
    assert "cluster.auth_refused" in log
    assert "cluster.session_moved_out" not in log and "client_given_up" not in log
    back = mq(s1, cid=keeper.id, clean=False, expiry=300)
    assert back.session_present
    back.wait_count(1)
    assert [m.payload for m in back.msgs] == [b"queued"]


def test_forged_admin_question_is_refused(signed_nodes, nats, pfx):
    """`config show` and `clients list` asked over NATS without the secret: no answer."""
    s1, _ = signed_nodes
    attacker = NatsRaw(nats.urls()[1])
    try:
        attacker.sub("_INBOX.attacker.>")
        before = refused(s1)
        for i, line in enumerate((b"config show", b"clients list --json")):
            attacker.hpub("rt_ctl.node.s1.admin", line, reply=f"_INBOX.attacker.a{i}")
        until(lambda: refused(s1) >= before + 2, WAIT, lambda: s1.read_log()[-2000:])
        attacker.flush()
        assert attacker.msgs == [], attacker.msgs
    finally:
        attacker.close()


def test_signed_request_replayed_is_refused(signed_nodes, nats, mq, pfx):
    """A real takeover seen on the wire (anyone may subscribe to the control subjects) and sent
    again: refused (its nonce was taken), and the client that holds the id now stays."""
    s1, s2 = signed_nodes
    cid = "rp-" + pfx
    spy = NatsRaw(nats.urls()[2])
    try:
        spy.sub("rt_ctl.node.s1.takeover")
        first = mq(s1, cid=cid)
        second = mq(s2, cid=cid)  # takes the id: s2 asks s1, signed
        until(lambda: first.disconnects, WAIT, "the first client was not taken over")
        until(lambda: (spy.flush() or spy.msgs), WAIT, "no takeover seen on the wire")
        subject, hdr, body = spy.msgs[0]
        assert b"Rt-Auth" in hdr and body == cid.encode()
        again = mq(s1, cid=cid)  # the id is s1's again, second ended
        until(lambda: second.disconnects, WAIT, "the second client was not taken over")
        before = refused(s1)
        spy.raw_pub(subject, hdr, body, reply="_INBOX.spy.1")
        until(lambda: refused(s1) > before, WAIT, lambda: s1.read_log()[-2000:])
        time.sleep(0.2)  # a look: nothing ends the client that holds the id
        assert again.c.is_connected() and not again.disconnects
    finally:
        spy.close()


def test_cluster_needs_a_secret_only_rtd_can_read(nats, tmp_path):
    """No secret_file: rtd does not start and says what to do; a secret file others can read,
    or a short one, is refused; secret_file = false starts and warns."""
    url = nats.urls()[0]

    def refused_start(secret, why):
        with pytest.raises(RuntimeError) as e:
            Rtd('cluster={node="x1",%snats={"%s"}}' % (secret, url))
        assert why in str(e.value), str(e.value)[-2000:]
    refused_start("", "cluster needs secret_file")
    for name, text, mode, why in (("loose", "0123456789abcdef0123456789abcdef\n", 0o644,
                                   "can be read by others"),
                                  ("short", "abc\n", 0o600, "fewer than 16 bytes")):
        path = tmp_path / f"{name}.secret"
        path.write_text(text)
        os.chmod(path, mode)
        refused_start(f'secret_file="{path}",', why)
    node = Rtd('cluster={node="x1",secret_file=false,nats={"%s"}}' % url)
    code, log = node.stop()
    assert code == 0 and "cluster.unsigned" in log, log[-2000:]
