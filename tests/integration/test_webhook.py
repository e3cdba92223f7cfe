"""The HTTP webhook sink (docs/SINKS.md, "Webhooks") end to end: MQTT publishes through a rule
into a sink of type "http", against a receiver written here on Python's http.server that
records every request. Rows in = rows received, in order, a request per row and a batch per
request, with the configured headers over kept-alive connections; a slow receiver; one that
answers 500 for a while (also part way through a batch, whose answered rows are not sent
again); one that goes away (its listening socket and connections closed) and comes back on the
same port, the rows of meanwhile spilled and all delivered; one that answers 400 (rows
rejected for good, the spill left alone); a durable rule whose PUBACK waits for the 2xx; a bad
url refused at start (exit 2). Rows carry a sequence number in their payload: "received" is
counted from the requests answered 2xx, and duplicates are looked for, not tolerated (no case
here times out, the only way the sink sends a row twice)."""
import json
import os
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import RTD, ROOT, Rtd, free_port, wait_for
from test_sinks import publisher


class Receiver:
    """A webhook receiver. answer(i) gives the status of the i-th request (from 0); delay
    holds every answer that long; gate, when set, holds each answer until released. Every
    request is recorded with the status it got, its body, headers and peer (the client's port:
    one per TCP connection). go_away closes the listening socket and every connection, between
    two requests (one being answered is answered first), so nothing is received unanswered."""

    def __init__(self, port=None):
        self.port = port or free_port()
        self.lock = threading.Lock()
        self.requests = []  # (status, body, headers, peer), in the order they came
        self.conns = set()
        self.read = 0  # requests read, answered or not
        self.answer = lambda i: 200
        self.delay = 0.0
        self.gate = None
        self.down = False
        self.server = None
        self.come_back()

    def come_back(self):
        recv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive

            def log_message(self, *a):
                pass

            def setup(self):
                super().setup()
                with recv.lock:
                    recv.conns.add(self.connection)

            def finish(self):
                with recv.lock:
                    recv.conns.discard(self.connection)
                super().finish()

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with recv.lock:
                    recv.read += 1
                if recv.gate:
                    recv.gate.acquire()
                if recv.delay:
                    time.sleep(recv.delay)
                with recv.lock:
                    if recv.down:
                        self.close_connection = True
                        return
                    status = recv.answer(len(recv.requests))
                    recv.requests.append((status, json.loads(body), dict(self.headers),
                                          self.client_address))
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                    self.wfile.flush()

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        server.block_on_close = False
        self.server = server
        self.down = False
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def go_away(self):
        with self.lock:
            self.down = True
            self.server.shutdown()
            self.server.server_close()
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self):
        if not self.down:
            self.go_away()

    def rows(self):
        """The rows of every request answered 2xx, in the order they came."""
        with self.lock:
            out = []
            for status, body, _, _ in self.requests:
                if 200 <= status < 300:
                    out.extend(body if isinstance(body, list) else [body])
            return out

    def seqs(self):
        return [int(r["payload"]) for r in self.rows()]

    def count(self):
        with self.lock:
            return len(self.requests)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.stop()


def hook_rtd(tmp_path, url, durable=False, **settings):
    """rtd with one rule sending every message on w/# to the sink `hook` (type http)."""
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "hook.lua").write_text(
        'return { name = "hook", from = "w/#", to = { "hook" }, durable = %s,\n'
        '  select = function(msg) return { topic = msg.topic, payload = msg.payload } end }\n'
        % ("true" if durable else "false"))
    keys = {"type": "http", "url": url, "flush_ms": 10, "backoff_ms": 20, "backoff_max_ms": 200,
            "timeout_ms": 5000}
    keys.update(settings)
    body = ",".join(f"{k}={v}" if isinstance(v, int) or v.startswith("{") else f'{k}="{v}"'
                    for k, v in keys.items())
    return Rtd(f"data_dir={tmp_path}", f"rules_dir={rules}", "sinks={hook={" + body + "}}")


def publish(port, seqs, topic="w/0"):
    """Publishes each seq as a QoS 1 payload; returns how many the broker acknowledged."""
    c = publisher(port)
    infos = [c.publish(topic, str(i), qos=1) for i in seqs]
    acked = 0
    for info in infos:
        info.wait_for_publish(10)
        acked += info.is_published()
    c.disconnect()
    c.loop_stop()
    return acked


def show(rtd):
    return rtd.ctl_json("sinks", "show", "hook")


def settled(rtd, written):
    """The sink's counters once it has taken the answers to what the receiver recorded (the
    receiver records a request before it answers)."""
    assert wait_for(lambda: show(rtd)["written"] >= written, 10), show(rtd)
    return show(rtd)


def stop_ok(rtd):
    code, log = rtd.stop()
    assert code == 0, log
    return log


@pytest.mark.parametrize("mode", ["row", "batch"])
def test_rows_in_order_with_headers_over_kept_alive_connections(tmp_path, receiver, mode):
    n = 300
    rtd = hook_rtd(tmp_path, f"http://127.0.0.1:{receiver.port}/hook?x=1", per_request=mode,
                   batch=25, headers='{Authorization="Bearer t0ken",["X-Rt-Test"]="a b"}')
    try:
        assert publish(rtd.port, range(n)) == n
        assert wait_for(lambda: len(receiver.rows()) >= n, 30), len(receiver.rows())
        assert receiver.seqs() == list(range(n))
        with receiver.lock:
            requests = list(receiver.requests)
        for status, body, headers, _ in requests:
            assert status == 200
            assert headers["Authorization"] == "Bearer t0ken" and headers["X-Rt-Test"] == "a b"
            assert headers["Content-Type"] == "application/json"
            if mode == "row":
                assert isinstance(body, dict) and body["topic"] == "w/0"
            else:
                assert isinstance(body, list) and 1 <= len(body) <= 25
        assert len(requests) == n if mode == "row" else len(requests) <= n // 2
        peers = {peer for _, _, _, peer in requests}
        assert len(peers) * 10 <= len(requests), (len(peers), len(requests))
        s = settled(rtd, n)
        assert s["type"] == "http" and s["written"] == n and s["dropped"] == 0, s
        code, metrics, err = rtd.ctl("metrics", "prometheus")
        assert code == 0, err
        assert f'rt_sink_rows_written_total{{sink="hook",type="http"}} {n}' in metrics
    finally:
        log = stop_ok(rtd)
    assert f"sink.stopped sink=hook in={n} written={n} spilled=0 dropped=0" in log, log
    assert "t0ken" not in log  # a header's value is a secret


@pytest.mark.parametrize("mode", ["row", "batch"])
def test_slow_receiver_loses_nothing_and_repeats_nothing(tmp_path, receiver, mode):
    n = 40 if mode == "row" else 400
    receiver.delay = 0.05  # far below timeout_ms
    rtd = hook_rtd(tmp_path, f"http://127.0.0.1:{receiver.port}/", per_request=mode, batch=40,
                   timeout_ms=5000)
    try:
        assert publish(rtd.port, range(n)) == n
        assert wait_for(lambda: len(receiver.rows()) >= n, 60), len(receiver.rows())
        assert receiver.seqs() == list(range(n))
        s = settled(rtd, n)
        assert s["written"] == n and s["failed"] == 0 and s["dropped"] == 0, s
    finally:
        stop_ok(rtd)


@pytest.mark.parametrize("mode", ["row", "batch"])
def test_500s_for_a_while_are_retried_and_nothing_is_lost(tmp_path, receiver, mode):
    """The first request is held until every row is in the sink, so the next write is a whole
    batch; requests 3 to 6 get 500: in a request per row that is part way through that batch,
    whose rows answered before are not sent again when it is retried."""
    n = 60 if mode == "row" else 200  # more than 7 requests
    receiver.gate = threading.Semaphore(0)
    receiver.answer = lambda i: 500 if 3 <= i < 7 else 200
    rtd = hook_rtd(tmp_path, f"http://127.0.0.1:{receiver.port}/", per_request=mode, batch=20)
    try:
        assert publish(rtd.port, range(n)) == n
        assert wait_for(lambda: show(rtd)["in"] == n, 10), show(rtd)
        gate, receiver.gate = receiver.gate, None
        gate.release()  # the first request, held
        assert wait_for(lambda: len(receiver.rows()) >= n, 30), len(receiver.rows())
        assert receiver.seqs() == list(range(n))  # in order, each once
        with receiver.lock:
            statuses = [status for status, _, _, _ in receiver.requests]
        assert statuses.count(500) == 4, statuses
        s = settled(rtd, n)
        assert s["written"] == n and s["failed"] >= 1 and s["retried"] > 0, s
        assert s["dropped"] == 0 and s["spilled"] == 0, s
    finally:
        stop_ok(rtd)


def run_away(tmp_path, receiver, away_s):
    """Rows published before, while and after the receiver is away for away_s seconds."""
    rtd = hook_rtd(tmp_path, f"http://127.0.0.1:{receiver.port}/", per_request="batch",
                   batch=50)
    try:
        before, total = 100, 100
        assert publish(rtd.port, range(before)) == before
        assert wait_for(lambda: len(receiver.rows()) >= before, 30)
        receiver.go_away()
        # While it is away: a publisher at a steady rate, and the sink seen to notice.
        t_end = time.monotonic() + away_s
        while time.monotonic() < t_end or show(rtd)["failed"] == 0:
            assert publish(rtd.port, range(total, total + 20)) == 20
            total += 20
            time.sleep(0.2)
        assert wait_for(lambda: show(rtd)["spilled"] > 0, 10), show(rtd)
        away_rows = total - before
        receiver.come_back()
        assert publish(rtd.port, range(total, total + 100)) == 100
        total += 100
        assert wait_for(lambda: len(receiver.rows()) >= total, 60), (len(receiver.rows()), total)
        seqs = receiver.seqs()
        assert sorted(set(seqs)) == list(range(total))  # none missing
        assert len(seqs) == total  # none twice: nothing timed out
        assert seqs == list(range(total))  # and in order
        s = settled(rtd, total)
        assert s["written"] == total and s["spilled"] == 0 and s["dropped"] == 0, s
        assert s["retried"] >= away_rows // 2, s
        assert s["state"] == "connected", s
    finally:
        log = stop_ok(rtd)
    assert "sink.write_failed sink=hook" in log or "sink.connect_failed sink=hook" in log


def test_receiver_away_then_back(tmp_path, receiver):
    run_away(tmp_path, receiver, 3)


@pytest.mark.long
def test_receiver_away_30s_then_back(tmp_path, receiver):
    run_away(tmp_path, receiver, 30)


def test_400_rejects_rows_for_good_without_spilling(tmp_path, receiver):
    n = 30
    receiver.answer = lambda i: 400
    rtd = hook_rtd(tmp_path, f"http://127.0.0.1:{receiver.port}/hook", batch=10)
    try:
        assert publish(rtd.port, range(n)) == n
        assert wait_for(lambda: show(rtd)["dropped"] == n, 10), show(rtd)
        s = show(rtd)
        assert s["written"] == 0 and s["spilled"] == 0 and s["failed"] == 0, s
        assert f"rows rejected: http://127.0.0.1:{receiver.port}/hook answered HTTP 400" \
            in s["last_error"], s
        assert receiver.count() == n  # each tried once: not retried
        assert not os.path.exists(os.path.join(tmp_path, "spill-hook.db"))  # never opened
        rejected = [line for line in rtd.read_log().splitlines()
                    if "sink.row_rejected sink=hook" in line]
        assert rejected and "answered HTTP 400" in rejected[0], rejected
    finally:
        stop_ok(rtd)


def test_durable_puback_after_the_2xx(tmp_path, receiver):
    """Each answer waits for the test: the PUBACK of a durable rule's message must not come
    while the receiver holds the request, and comes once it answers."""
    receiver.gate = threading.Semaphore(0)
    rtd = hook_rtd(tmp_path, f"http://127.0.0.1:{receiver.port}/", durable=True, flush_ms=0)
    try:
        c = publisher(rtd.port)
        for i in range(3):
            info = c.publish("w/d", str(i), qos=1)
            # The request is in; its answer held. Anything acked now would be acked early.
            assert wait_for(lambda: receiver.read == i + 1, 10)
            time.sleep(0.3)
            assert not info.is_published()
            assert receiver.count() == i
            receiver.gate.release()
            info.wait_for_publish(10)
            assert info.is_published()
            assert receiver.seqs() == list(range(i + 1))
        c.disconnect()
        c.loop_stop()
    finally:
        receiver.gate = None
        stop_ok(rtd)


@pytest.mark.parametrize("keys, why", [
    ('url="ftp://example.com/"', 'url ftp://example.com/: not an http:// or https:// URL'),
    ('url="http://127.0.0.1:99999/x"', "the port must be 1 to 65535"),
    ('url="http:///x"', "not an http:// or https:// URL with a host"),
    ('per_request="row"', "url is required"),
    ('url="http://127.0.0.1:8080/",headers={Host="x"}', "header Host: not a name"),
])
def test_bad_config_exits_2(tmp_path, keys, why):
    proc = subprocess.run(
        [RTD, "-c", os.path.join(ROOT, "etc", "rtd.conf"), "-o", "listeners=127.0.0.1:1",
         "-o", f"data_dir={tmp_path}", "-o", 'sinks={hook={type="http",' + keys + "}}"],
        capture_output=True, text=True, timeout=10)
    assert proc.returncode == 2, proc.stderr
    assert "sinks.hook: " in proc.stderr and why in proc.stderr, proc.stderr
