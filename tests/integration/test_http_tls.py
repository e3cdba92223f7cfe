"""The HTTP listener over TLS (issue 16: `http = { bind, tls = { cert, key } }`): curl and
Python's ssl module as clients, /healthz and the API with a key over HTTPS, keep-alive,
answers bigger than a TLS record, an event stream (output from timer turns), a packet
trace's stream, plaintext to the TLS port, a handshake that trickles in and is cut at the
request deadline, the listener's certificate in `rtctl status` and its live reload, and the
config's refusals.

Certificates are made at run time with the openssl CLI (certs.py).
"""
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import time

import pytest

from certs import serial_of
from conftest import ROOT, Rtd, free_port, wait_for
from test_http import make_key, read_response
from test_trace import publish_once, sse_events
from transports import closed_or_reset, tls_connect, tls_context, wait_log


# http.request_timeout of the handshake-deadline test: what it proves (a handshake that has
# not ended is cut at the deadline armed at accept, not before) does not depend on its
# length, and the default 10 s cost 10 s per pass.
REQUEST_S = 2


def start_https(pki, tmp_path, cert=None, key=None, extra=""):
    keys = tmp_path / "api_keys"
    admin, reader = make_key(keys, "ops", "admin"), make_key(keys, "viewer", "read")
    if cert is None:
        cert, key = pki.server["ec"]
    hport = free_port()
    broker = Rtd(f'http={{bind="127.0.0.1:{hport}", tls={{cert="{cert}", key="{key}"}}, '
                 f'api_keys_file="{keys}"{extra}}}')
    broker.hport, broker.admin_key, broker.read_key = hport, admin, reader
    return broker


@pytest.fixture
def https(pki, tmp_path):
    broker = start_https(pki, tmp_path)
    yield broker
    code, log = broker.stop()
    assert code == 0, log[-3000:]


def tls_http(broker, pki):
    """An HTTPS connection to rtd's HTTP listener, offering ALPN http/1.1."""
    return tls_connect(broker.hport, tls_context(pki.ca.cert, alpn=("http/1.1",)), timeout=15)


def request(method, path, key=None, body=None, close=False):
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    if close:
        head += "Connection: close\r\n"
    return (head + "\r\n").encode() + (body or b"")


def test_curl_over_https(https, pki):
    url = f"https://localhost:{https.hport}"
    p = subprocess.run(["curl", "-sS", "--cacert", pki.ca.cert, "-w", "\n%{http_code} %{http_version}",
                        "--resolve", f"localhost:{https.hport}:127.0.0.1", f"{url}/healthz"],
                       capture_output=True, text=True, timeout=30)
    body, _, status = p.stdout.rpartition("\n")
    assert p.returncode == 0 and status == "200 1.1", (p.stdout, p.stderr)
    assert json.loads(body) == {"status": "ok"}
    # An API call with a key, and a change with a JSON body.
    p = subprocess.run(["curl", "-sS", "--cacert", pki.ca.cert, "--resolve",
                        f"localhost:{https.hport}:127.0.0.1", "-H",
                        f"Authorization: Bearer {https.admin_key}", "-H",
                        "Content-Type: application/json", "--data",
                        '{"setting": "log_level", "value": "debug"}',
                        f"{url}/api/v1/config/set"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and json.loads(p.stdout)["applied"] is True, (p.stdout, p.stderr)
    assert https.ctl_json("log", "level")["level"] == "debug"
    # Without the CA, curl refuses rtd's certificate: it is the one configured.
    p = subprocess.run(["curl", "-sS", "--resolve", f"localhost:{https.hport}:127.0.0.1",
                        f"{url}/healthz"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0


def test_python_ssl_keep_alive_and_api(https, pki):
    s = tls_http(https, pki)
    assert s.selected_alpn_protocol() == "http/1.1"
    assert s.getpeercert(binary_form=True) == ssl.PEM_cert_to_DER_cert(
        open(pki.server["ec"][0]).read())
    # Pipelined requests on one TLS connection, answered in order.
    s.sendall(request("GET", "/healthz") + request("GET", "/api/v1/status", https.read_key))
    assert read_response(s) == (200, b'{"status": "ok"}\n')
    status, body = read_response(s)
    assert status == 200 and json.loads(body)["http"]["kind"] == "https"
    # Without a key, over TLS as in the clear: 401.
    s.sendall(request("GET", "/api/v1/status"))
    assert read_response(s)[0] == 401
    # An answer longer than a TLS record (16 KiB): the dashboard's script, whole.
    script = open(os.path.join(ROOT, "actors", "http", "www", "app.js"), "rb").read()
    assert len(script) > 16384
    s.sendall(request("GET", "/ui/app.js", close=True))
    assert read_response(s) == (200, script)
    assert closed_or_reset(s)  # Connection: close; a close_notify, then the end
    s.close()


def test_event_stream_over_tls(https, pki):
    """An event stream's events are written in timer turns, with no read before them: the
    turn's end still encrypts them."""
    s = tls_http(https, pki)
    s.sendall(request("GET", "/api/v1/stream/status?every=1", https.read_key))
    f = s.makefile("rb")
    assert f.readline().startswith(b"HTTP/1.1 200")
    events = []
    deadline = time.monotonic() + 10
    while len(events) < 2 and time.monotonic() < deadline:
        line = f.readline()
        if line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
    assert len(events) == 2 and all(e["status"] == "running" for e in events)
    s.close()


def test_trace_over_tls(https, pki):
    """A packet trace's parts come in messages from the traced connection and the admin
    layer: they go out encrypted too, and the stream ends with the trace."""
    s = tls_http(https, pki)
    s.sendall(request("GET", "/api/v1/trace/client/tls-c?duration=2", https.admin_key))
    f = s.makefile("rb")
    assert f.readline().startswith(b"HTTP/1.1 200")
    publish_once(https.port, "tls-c", "tls/t", b"x")
    events = sse_events(f.read())
    kinds = [e.get("type") for e in events if e["event"] == "packet"]
    assert kinds[:3] == ["CONNECT", "CONNACK", "PUBLISH"], events
    assert events[-1]["event"] == "ended"
    s.close()


def test_plaintext_to_the_tls_port(https, pki):
    """Plain HTTP to the HTTPS port: the handshake fails on its first bytes, the connection is
    closed and logged; rtd goes on serving."""
    s = socket.create_connection(("127.0.0.1", https.hport), timeout=15)
    lport = s.getsockname()[1]
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert closed_or_reset(s, timeout=5)
    s.close()
    wait_log(https, rf'tls\.handshake_failed peer=127\.0\.0\.1:{lport} listener=http '
                    r'reason="http request"')
    t = tls_http(https, pki)
    t.sendall(request("GET", "/healthz", close=True))
    assert read_response(t)[0] == 200
    t.close()


@pytest.fixture
def https_short(pki, tmp_path):
    broker = start_https(pki, tmp_path, extra=f", request_timeout={REQUEST_S}")
    yield broker
    code, log = broker.stop()
    assert code == 0, log[-3000:]


def test_slow_handshake_is_cut(https_short, pki):
    """A ClientHello that trickles in a byte at a time never finishes the handshake: the
    connection is closed at the request deadline, which starts at accept and which the
    handshake's bytes do not move. Others are served meanwhile."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = tls_context(pki.ca.cert, alpn=("http/1.1",)).wrap_bio(
        incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    hello = outgoing.read()
    s = socket.create_connection(("127.0.0.1", https_short.hport), timeout=15)
    t0 = time.monotonic()
    lport = s.getsockname()[1]
    step = REQUEST_S / 20
    assert len(hello) * step > 2 * REQUEST_S  # it cannot end in time
    closed_at = None
    for b in hello:
        try:
            s.sendall(bytes([b]))
        except OSError:
            closed_at = time.monotonic()
            break
        s.settimeout(step)
        try:
            if not s.recv(100):
                closed_at = time.monotonic()
                break
        except socket.timeout:
            pass
        except OSError:
            closed_at = time.monotonic()
            break
        if time.monotonic() - t0 > REQUEST_S + 5:
            break
    s.close()
    assert closed_at is not None, "the handshake was not cut"
    # Not before the deadline (armed at accept, which connect's return precedes but for a
    # race of a few ms), and soon after it: the timer, one turn of the connection actor and
    # one of our recv steps.
    assert REQUEST_S - 0.05 <= closed_at - t0 <= REQUEST_S + 4, closed_at - t0
    wait_log(https_short, rf'tls\.handshake_failed peer=127\.0\.0\.1:{lport} listener=http '
                    r'reason=timeout')


def test_status_and_reload(pki, tmp_path):
    """`rtctl status` shows the HTTP listener's certificate; `rtctl tls reload` reads its
    files again with the MQTT listeners' (new handshakes get the new certificate)."""
    live = (str(tmp_path / "live.pem"), str(tmp_path / "live.key"))
    shutil.copy(pki.server["ec"][0], live[0])
    shutil.copy(pki.server["ec"][1], live[1])
    broker = start_https(pki, tmp_path, *live)
    try:
        status = broker.ctl_json("status")["http"]
        assert status["listener"] == f"127.0.0.1:{broker.hport}" and status["kind"] == "https"
        assert "rt server ec" in status["tls"]["subject"] and status["tls"]["reloads"] == 0
        code, out, _ = broker.ctl("status")
        assert f"http listener 127.0.0.1:{broker.hport} (https)" in out

        def served_serial():
            s = tls_http(broker, pki)
            der = s.getpeercert(binary_form=True)
            s.close()
            pem = ssl.DER_cert_to_PEM_cert(der)
            path = tmp_path / "served.pem"
            path.write_text(pem)
            return serial_of(str(path))

        assert served_serial() == serial_of(live[0])
        new = pki.new_server(kind="rsa")
        shutil.copy(new[0], live[0])
        shutil.copy(new[1], live[1])
        code, out, err = broker.ctl("tls", "reload")
        assert code == 0 and f"127.0.0.1:{broker.hport} reloaded" in out, (out, err)
        assert served_serial() == serial_of(new[0])
        assert broker.ctl_json("status")["http"]["tls"]["reloads"] == 1
    finally:
        code, log = broker.stop()
        assert code == 0, log[-3000:]


@pytest.mark.parametrize("tls, why", [
    ('{cert="c.pem"}', "http.tls needs cert and key"),
    ('{cert="c.pem", key="k.pem", colour="red"}', 'http.tls: unknown key "colour"'),
    ('{cert="c.pem", key="k.pem", ca="ca.pem", verify="required", identity_as_username=true}',
     "identity_as_username is for MQTT listeners"),
])
def test_config_refusals(tls, why):
    with pytest.raises(RuntimeError, match=re.escape(why)):
        Rtd(f'http={{bind="127.0.0.1:{free_port()}", tls={tls}}}')


def test_unreadable_certificate_refuses_start(tmp_path):
    with pytest.raises(RuntimeError, match=r"http 127\.0\.0\.1:\d+: TLS: .*missing\.pem"):
        Rtd(f'http={{bind="127.0.0.1:{free_port()}", tls={{cert="{tmp_path}/missing.pem", '
            f'key="{tmp_path}/missing.key"}}}}')
