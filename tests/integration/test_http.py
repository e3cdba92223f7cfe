"""rtd over HTTP (issue 16): /healthz, /readyz, the API under /api/v1/ on the admin command
layer with API keys (read and admin roles), JSON request bodies, and the listener's bounds
(request size, slow requests, many connections). Real clients: urllib and raw sockets, paho
for a kick. Over TLS: test_http_tls.py."""
import contextlib
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import paho.mqtt.client as mqtt
import pytest

from conftest import RTD, Rtd, free_port, wait_for


def make_key(path, name, role):
    p = subprocess.run([RTD, "apikey", name, role, "-f", str(path)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    key = p.stdout.strip()
    assert key.startswith("rtk_") and len(key) == 4 + 64
    return key


def start_http(tmp_path, extra=""):
    keys = tmp_path / "api_keys"
    admin, reader = make_key(keys, "ops", "admin"), make_key(keys, "viewer", "read")
    assert admin not in keys.read_text() and reader not in keys.read_text()  # hashes only
    hport = free_port()
    broker = Rtd(f'http={{bind="127.0.0.1:{hport}", api_keys_file="{keys}"{extra}}}')
    broker.hport, broker.admin_key, broker.read_key = hport, admin, reader
    return broker


@pytest.fixture
def http(tmp_path):
    broker = start_http(tmp_path)
    yield broker
    code, log = broker.stop()
    assert code == 0, log[-3000:]


# http.request_timeout for the tests of the deadline itself: what they prove (a request or
# handshake that has not arrived whole is cut at the deadline, not before, while others are
# served) does not depend on its length, and the default 10 s cost 10 s per test per pass.
REQUEST_TIMEOUT_S = 2


@pytest.fixture
def http_short(tmp_path):
    broker = start_http(tmp_path, f", request_timeout={REQUEST_TIMEOUT_S}")
    yield broker
    code, log = broker.stop()
    assert code == 0, log[-3000:]


def call(broker, path, key=None, method="GET", header="Authorization", body=None,
         content_type="application/json"):
    """(status, parsed JSON body) of one request; body: bytes as they are, else as JSON."""
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{broker.hport}{path}", method=method,
                                 data=body)
    if body is not None and content_type:
        req.add_header("Content-Type", content_type)
    if key:
        req.add_header(header, f"Bearer {key}" if header == "Authorization" else key)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_health_and_ready(http):
    assert call(http, "/healthz") == (200, {"status": "ok"})
    assert call(http, "/readyz") == (200, {"ready": True})


def test_keys_and_roles(http):
    code, body = call(http, "/api/v1/status")
    assert code == 401 and "API key" in body["error"]
    assert call(http, "/api/v1/status", key="rtk_" + "0" * 64)[0] == 401
    code, body = call(http, "/api/v1/status", key=http.read_key)
    assert code == 200 and body["status"] == "running"
    assert call(http, "/api/v1/status", key=http.read_key, header="X-API-Key")[0] == 200
    # A command that changes rtd: admin role and POST, nothing less.
    code, body = call(http, "/api/v1/rules/reload", key=http.read_key, method="POST")
    assert code == 403 and "admin role" in body["error"]
    code, body = call(http, "/api/v1/rules/reload", key=http.admin_key, method="POST")
    assert code == 200 and body["reloaded"] is True
    assert call(http, "/nowhere", key=http.read_key)[0] == 404
    assert call(http, "/api/v1/status", key=http.read_key, method="DELETE")[0] == 405
    # The same answers rtctl gets, from the same code.
    assert call(http, "/api/v1/listeners", key=http.read_key)[1] == http.ctl_json("listeners")


def answer(broker, path, key=None, method="GET"):
    """(status, headers, parsed body) of one request, refusals included."""
    req = urllib.request.Request(f"http://127.0.0.1:{broker.hport}{path}", method=method)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_answers_by_method_and_command(http):
    """A changing command sent with GET is 405 with Allow: POST (whatever the key), an unknown
    command 404, a read key on a changing command 403; a command's help is for anyone."""
    for key in (http.admin_key, http.read_key):
        for path in ("/api/v1/rules/reload", "/api/v1/clients/kick/x", "/api/v1/apikey/add/a/read"):
            code, headers, body = answer(http, path, key=key)
            assert code == 405 and headers["Allow"] == "POST", (path, code, body)
            assert "POST" in json.loads(body)["error"]
    code, headers, _ = answer(http, "/api/v1/status", key=http.read_key, method="DELETE")
    assert code == 405 and headers["Allow"] == "GET, HEAD, POST, PUT"
    for path in ("/api/v1/nonsense", "/api/v1/rules/relaod", "/api/v1/clients/frob/x"):
        code, _, body = answer(http, path, key=http.read_key)
        assert code == 404 and "no such command" in json.loads(body)["error"], path
    code, _, body = answer(http, "/api/v1/rules/reload", key=http.read_key, method="POST")
    assert code == 403 and "admin role" in json.loads(body)["error"]
    # The refusals come after the key: an unknown command without one is 401.
    assert answer(http, "/api/v1/nonsense")[0] == 401
    # GET /api/v1/help/WORD/SUB and ?help describe a command, a changing one too.
    code, _, body = answer(http, "/api/v1/clients/kick?help", key=http.read_key)
    (help_,) = json.loads(body)
    assert code == 200 and help_["usage"] == "clients kick CLIENT_ID"
    assert (help_["http_method"], help_["http_role"], help_["changes"]) == ("POST", "admin", True)
    code, _, body = answer(http, "/api/v1/help/retained", key=http.read_key)
    assert code == 200 and [h["usage"].split()[1] for h in json.loads(body)] == \
        ["list", "show", "delete"]


SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def test_security_headers(http):
    """Every kind of answer carries them: the dashboard's files, API answers and refusals,
    probes, metrics, an event stream's head and a trace's."""
    k = http.admin_key
    for path, key, method in (("/", None, "GET"), ("/ui/app.js", None, "GET"),
                              ("/healthz", None, "GET"), ("/readyz", None, "GET"),
                              ("/api/v1/status", k, "GET"), ("/api/v1/status", None, "GET"),
                              ("/api/v1/nonsense", k, "GET"), ("/api/v1/rules/reload", k, "GET"),
                              ("/api/v1/rules/reload", http.read_key, "POST"),
                              ("/metrics", k, "GET"), ("/nowhere", None, "GET")):
        code, headers, _ = answer(http, path, key=key, method=method)
        for name, value in SECURITY_HEADERS.items():
            assert headers[name] == value, (path, code, name, headers[name])
    for path in ("/api/v1/stream/status?every=1", "/api/v1/trace/client/nobody?duration=1"):
        req = urllib.request.Request(f"http://127.0.0.1:{http.hport}{path}",
                                     headers={"Authorization": f"Bearer {k}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"] == "text/event-stream", path
            for name, value in SECURITY_HEADERS.items():
                assert r.headers[name] == value, (path, name)


@contextlib.contextmanager
def victim(broker, client_id):
    """A connected MQTT client to kick; yields the event its disconnection sets."""
    c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv311)
    lost = threading.Event()
    c.on_disconnect = lambda *a: lost.set()
    c.connect("127.0.0.1", broker.port, keepalive=30)
    c.loop_start()
    try:
        yield lost
    finally:
        c.disconnect()  # kicked: ends its reconnect wait, which loop_stop alone sleeps out
        c.loop_stop()


def test_clients_list_show_kick(http):
    with victim(http, "http-victim") as lost:
        assert wait_for(lambda: any(x.get("client_id") == "http-victim" for x in
                                    call(http, "/api/v1/clients/list?limit=10",
                                         key=http.read_key)[1]))
        code, body = call(http, "/api/v1/clients/show/http-victim", key=http.read_key)
        assert code == 200 and body["client_id"] == "http-victim"
        assert call(http, "/api/v1/clients/show/nobody%20here", key=http.read_key)[0] == 404
        code, _ = call(http, "/api/v1/clients/kick/http-victim", key=http.admin_key,
                       method="POST")
        assert code == 200
        assert lost.wait(10), "the client was not disconnected"


def test_json_bodies(http):
    """A POST's (or PUT's) JSON object gives the command's arguments, named by its usage;
    the path and query still do, and the two mix."""
    with victim(http, "json-victim") as lost:
        assert wait_for(lambda: call(http, "/api/v1/clients/show/json-victim",
                                     key=http.read_key)[0] == 200)
        code, _ = call(http, "/api/v1/clients/kick", key=http.admin_key, method="POST",
                       body={"client_id": "json-victim"})
        assert code == 200
        assert lost.wait(10), "the client was not disconnected"
    admin = dict(key=http.admin_key, method="POST")
    code, body = call(http, "/api/v1/config/set", **admin,
                      body={"setting": "log_level", "value": "debug"})
    assert code == 200 and body == {"setting": "log_level", "value": "debug", "applied": True}
    # A setting's value may be a number; PUT is POST's synonym.
    code, body = call(http, "/api/v1/config/set", key=http.admin_key, method="PUT",
                      body={"setting": "max_connections", "value": 5000})
    assert code == 200 and body["value"] == "5000"
    # A dry run of a rule (admin only: test_rule_limits.py); the rule's name from the body or
    # from the path.
    message = {"topic": "t/1", "payload": "42", "qos": 1}
    for path, extra in (("rules/test", {"name": "archive"}), ("rules/test/archive", {})):
        code, body = call(http, f"/api/v1/{path}", key=http.admin_key, method="POST",
                          body={**extra, **message})
        assert code == 200, body
        row = body["rows"][0]
        assert (row["topic"], row["payload"], row["qos"]) == ("t/1", "42", 1)
    # An alias gets its command's members ("log" is "log level").
    assert call(http, "/api/v1/log", **admin, body={"level": "info"}) == (200, {"level": "info"})
    # A client id starting with '-' is an argument, not an option.
    code, body = call(http, "/api/v1/clients/kick", **admin, body={"client_id": "-x"})
    assert code == 404 and '"-x"' in body["error"]
    # A change still needs the admin role, whatever carries its arguments.
    code, body = call(http, "/api/v1/clients/kick", key=http.read_key, method="POST",
                      body={"client_id": "x"})
    assert code == 403


@pytest.mark.parametrize("body, why", [
    (b'{"client_id": ', "the body is not JSON"),
    (b'{"client_id": "a"} trailing', "the body is not JSON"),
    (b'{}{}', "the body is not JSON: more after the object"),
    (b'["client_id"]', "the body must be a JSON object"),
    (b'"c1"', "the body must be a JSON object"),
    (b'{"a":' * 5000 + b'1' + b'}' * 5000, "the body is not JSON"),  # nesting past libbson's
    ({"client": "c1"}, 'unknown member "client" (this command takes: client_id)'),
    ({"client_id": 17}, '"client_id" must be a string'),
    ({"client_id": ["c1"]}, '"client_id" must be a string'),
    ({"client_id": "a\u0000b"}, "holds a NUL character"),  # json.dumps writes \u0000
    ({"client_id": "a", "client_id ": "b"}, "unknown member"),
])
def test_json_body_refusals(http, body, why):
    code, answer = call(http, "/api/v1/clients/kick", key=http.admin_key, method="POST",
                        body=body)
    assert code == 400 and why in answer["error"], (code, answer)
    assert call(http, "/healthz")[0] == 200


def test_json_body_types_and_bounds(http):
    admin = dict(key=http.admin_key, method="POST")
    code, answer = call(http, "/api/v1/clients/list", **admin, body={"limit": "5"})
    assert code == 400 and answer["error"] == '"limit" must be an integer'
    assert call(http, "/api/v1/clients/list", **admin, body={"limit": 5}) == (200, [])
    code, answer = call(http, "/api/v1/actors/kill", **admin, body={"reason": "x"})
    assert code == 400 and answer["error"] == '"reason" needs "pid" before it'
    code, answer = call(http, "/api/v1/clients/kick", **admin, body={"client_id": "a",
                                                                      "client_id2": 1})
    assert code == 400 and "unknown member" in answer["error"]
    code, answer = call(http, "/api/v1/clients/kick/a", **admin, body={"client_id": "a"})
    assert code == 400 and "given twice" in answer["error"]
    # Another media type: 415, the body is not guessed at.
    code, answer = call(http, "/api/v1/clients/kick", **admin, body=b'{"client_id": "a"}',
                        content_type="text/plain")
    assert code == 415 and "application/json" in answer["error"]
    # Past RT_HTTP_BODY_MAX: 413 (refused at its head).
    big = {"client_id": "x" * (64 * 1024)}
    code, answer = call(http, "/api/v1/clients/kick", **admin, body=big)
    assert code == 413


def test_json_integers_past_int64_refused(http):
    """libbson reads 2^64 + 5,000,000 as 5,000,000: such a number is refused before it is
    read, so no setting takes a value nobody sent; the largest int64 still goes through."""
    admin = dict(key=http.admin_key, method="POST", content_type="application/json")
    before = call(http, "/api/v1/config/show", key=http.read_key)[1]
    for big in (b"18446744073709551616", b"18446744073714551616", b"-9223372036854775809",
                b"9" * 40):
        code, answer = call(http, "/api/v1/config/set", **admin,
                            body=b'{"setting": "max_packet_size", "value": ' + big + b"}")
        assert code == 400 and "out of range" in answer["error"], (big, code, answer)
    assert call(http, "/api/v1/config/show", key=http.read_key)[1] == before
    # In a string it is text, not a number: the setting's own check answers.
    code, answer = call(http, "/api/v1/config/set", **admin,
                        body=b'{"setting": "max_packet_size", "value": "18446744073709551616"}')
    assert code == 400 and "out of range" not in answer["error"], answer
    code, answer = call(http, "/api/v1/config/set", **admin,
                        body=b'{"setting": "max_packet_size", "value": 9223372036854775807}')
    assert code == 400 and "out of range" not in answer["error"], answer  # the range check


def raw(broker):
    return socket.create_connection(("127.0.0.1", broker.hport), timeout=15)


_readers = {}


def read_response(s):
    """One HTTP response from s (a buffered reader per socket keeps what follows it):
    (status, body bytes); (None, b"") if the connection ended first."""
    f = _readers.setdefault(s, s.makefile("rb"))
    status_line = f.readline()
    if not status_line:
        return None, b""
    status = int(status_line.split(b" ")[1])
    length = 0
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    return status, f.read(length)


def test_keep_alive_and_pipelining(http):
    s = raw(http)
    req = (f"GET /api/v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {http.read_key}"
           "\r\n\r\n").encode()
    s.sendall(req * 3)  # three requests in one write: answered in order on one connection
    for _ in range(3):
        status, body = read_response(s)
        assert status == 200 and json.loads(body)["status"] == "running"
    s.sendall(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert read_response(s)[0] == 200
    assert read_response(s) == (None, b"")  # closed after Connection: close
    s.close()


def test_bounds(http):
    # A head past RT_HTTP_HEAD_MAX (8 KiB): 431, closed.
    s = raw(http)
    s.sendall(b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 9000 + b"\r\n\r\n")
    assert read_response(s)[0] == 431
    s.close()
    # A body past RT_HTTP_BODY_MAX (64 KiB), refused at its head: 413 before it is sent.
    s = raw(http)
    s.sendall(b"POST /api/v1/status HTTP/1.1\r\nContent-Length: 10000000\r\n\r\n")
    assert read_response(s)[0] == 413
    s.close()
    # Garbage: 400.
    s = raw(http)
    s.sendall(b"\x16\x03\x01garbage\r\n\r\n")
    assert read_response(s)[0] == 400
    s.close()
    # Nothing else was disturbed.
    assert call(http, "/healthz")[0] == 200


def test_slow_request_is_cut(http_short):
    """A request that does not arrive whole within http.request_timeout of its first byte
    gets 408 and the connection ends; 50 such slow clients do not stop the listener
    answering."""
    http = http_short
    slow = [raw(http) for _ in range(50)]
    # Before slow[0]'s first byte, so before its deadline is armed (at that byte).
    t0 = time.monotonic()
    for s in slow:
        s.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
    assert call(http, "/healthz")[0] == 200
    status, _ = read_response(slow[0])
    assert status == 408
    # Not before the deadline (but for the timer's few ms), and soon after it: the timer and
    # one turn of the connection actor.
    elapsed = time.monotonic() - t0
    assert REQUEST_TIMEOUT_S - 0.05 <= elapsed <= REQUEST_TIMEOUT_S + 4, elapsed
    for s in slow:
        s.close()


def test_200_concurrent_connections(http):
    held = [raw(http) for _ in range(200)]
    req = (f"GET /api/v1/broker HTTP/1.1\r\nAuthorization: Bearer {http.read_key}"
           "\r\n\r\n").encode()
    for s in held:
        s.sendall(req)
    for s in held:
        assert read_response(s)[0] == 200
        s.close()


def test_apikey_usage_errors(tmp_path):
    for args, why in ((["x", "root"], 'role "root": read or admin'),
                      (["a b", "read"], 'key name "a b": 1 to 63 printable characters'),
                      (["x" * 64, "read"], "1 to 63 printable characters"),
                      (["x"], "usage: rtd apikey"), (["x", "read", "extra"], "usage: rtd apikey")):
        p = subprocess.run([RTD, "apikey", *args, "-f", str(tmp_path / "k")],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and why in p.stderr, (args, p.stderr)
    assert not os.path.exists(tmp_path / "k")


def test_metrics_over_http(http, tmp_path):
    """/metrics: a key is needed unless metrics_public; the scrape is the Prometheus text
    `rtctl metrics prometheus` gives, clean under promtool."""
    assert call(http, "/metrics")[0] == 401
    req = urllib.request.Request(f"http://127.0.0.1:{http.hport}/metrics",
                                 headers={"Authorization": f"Bearer {http.read_key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    assert "# TYPE rt_connections gauge" in text
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    public = Rtd(f'http={{bind="127.0.0.1:{free_port()}", metrics_public=true}}')
    try:
        public.hport = int(public.read_log().split("http.started listener=127.0.0.1:")[1]
                           .split()[0])
        assert urllib.request.urlopen(f"http://127.0.0.1:{public.hport}/metrics",
                                      timeout=10).status == 200
        assert call(public, "/api/v1/status")[0] == 401  # no keys file: no API
    finally:
        code, log = public.stop()
        assert code == 0, log[-2000:]


def test_event_stream(http):
    """GET /api/v1/stream/top?every=1: one `top` event a second with the command's JSON, for
    as long as the client reads; a command that changes rtd is not streamed."""
    s = raw(http)
    s.sendall((f"GET /api/v1/stream/top?n=2&every=1 HTTP/1.1\r\nAuthorization: Bearer "
               f"{http.read_key}\r\n\r\n").encode())
    f = s.makefile("rb")
    assert f.readline().startswith(b"HTTP/1.1 200")
    while f.readline() not in (b"\r\n", b""):
        pass
    t0 = time.monotonic()
    events = []
    while len(events) < 3:
        line = f.readline()
        assert line, "the stream ended"
        if line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
    assert all(len(e["actors"]) == 2 and "node" in e for e in events)
    assert 1.5 <= time.monotonic() - t0 <= 6  # three events a second apart: two intervals
    s.close()
    code, body = call(http, "/api/v1/stream/clients/kick/x", key=http.admin_key)
    assert code == 403 and "admin role" in body["error"]  # refused before any event
    assert call(http, "/api/v1/stream/nonsense", key=http.read_key)[0] == 400


def test_clients_pages(http):
    """60 clients, listed 25 a page with after=: every client exactly once over three pages
    (the largest id of a page is the next page's cursor); prefix= keeps one group."""
    clients = []
    try:
        for i in range(60):
            c = mqtt.Client(client_id=f"{'ab'[i % 2]}-page-{i:03d}", protocol=mqtt.MQTTv311)
            c.connect("127.0.0.1", http.port, keepalive=30)
            c.loop_start()
            clients.append(c)
        assert wait_for(lambda: len(call(http, "/api/v1/clients/list?limit=100",
                                         key=http.read_key)[1]) == 60, 10)
        seen, after = [], ""  # after= (empty): the first page, in id order
        for _ in range(3):
            q = f"/api/v1/clients/list?limit=25&after={after}"
            code, page = call(http, q, key=http.read_key)
            assert code == 200 and page
            ids = sorted(x["client_id"] for x in page)
            assert not seen or ids[0] > seen[-1]  # pages follow each other in id order
            seen += ids
            after = ids[-1]
        assert seen == sorted(f"{'ab'[i % 2]}-page-{i:03d}" for i in range(60))
        code, page = call(http, f"/api/v1/clients/list?limit=25&after={after}", key=http.read_key)
        assert code == 200 and page == []
        code, page = call(http, "/api/v1/clients/list?prefix=b-page-&limit=100",
                          key=http.read_key)
        assert sorted(x["client_id"] for x in page) == [f"b-page-{i:03d}" for i in range(1, 60, 2)]
    finally:
        for c in clients:
            c.disconnect()
            c.loop_stop()
