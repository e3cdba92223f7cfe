"""The HTTP authenticator (docs/AUTH.md, "HTTP authentication"), against rtd with real clients
and a service written here on Python's http.server: the request's fields, allow / deny /
ignore, the answer's ACL and expiry, answers cached (refusals too) so that a reconnect makes no
call, keep-alive connections reused, a service that is down or slow handled as on_error says
(deny: 0x88, cache: users it knew), HTTPS verified against a CA, an answer's expiry, a mutual-TLS
client's certificate in the request and in the cache's key."""
import hashlib
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from certs import cert_field
from conftest import Rtd, free_port, reply_json
from mqtt_raw import PUBACK, PUBLISH, Raw, mqtt_str, u16, varint
from transports import RawOn, listeners, tls_connect, tls_context

BAD_CREDENTIALS, NOT_AUTHORIZED, UNAVAILABLE = 0x86, 0x87, 0x88


class Service:
    """A login service: user names say what to answer (allow*, deny*, ignore*, slow*, junk*;
    cert*: allow the client certificate named alice-cert only)."""

    def __init__(self, tls=None):
        self.requests, self.peers = [], set()
        self.down = False
        self.lock = threading.Lock()
        svc = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive

            def log_message(self, *a):
                pass

            def do_POST(self):
                if svc.down:  # a kept-alive connection outlives shutdown(): it answers nothing
                    self.close_connection = True
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with svc.lock:
                    svc.requests.append(body)
                    svc.peers.add(self.client_address)
                user = body.get("username") or ""
                if user.startswith("slow"):
                    time.sleep(3)
                if user.startswith("junk"):
                    answer = b"not json"
                else:
                    alice = (body.get("tls") or {}).get("cn") == "alice-cert"
                    answer = {"result": "allow" if user.startswith("allow") else
                              ("allow" if alice else "deny") if user.startswith("cert") else
                              "deny" if user.startswith("deny") else "ignore"}
                    if user.startswith("allow-acl"):
                        answer["acl"] = {"pub": ["in/%c"], "sub": ["out/%c"]}
                    if user.startswith("allow-brief"):
                        answer["expire_at"] = int(time.time()) + 2
                reply_json(self, answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        if tls:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def calls(self, user=None):
        with self.lock:
            return len([r for r in self.requests if user is None or r.get("username") == user])

    def stop(self):
        self.down = True
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service():
    s = Service()
    yield s
    s.stop()


def http_rtd(stopper, url, *settings, **kw):
    opts = "".join(f", {k} = {json.dumps(v) if isinstance(v, str) else str(v).lower()}"
                   for k, v in kw.items())
    broker = Rtd("allow_anonymous=false",
                 "auth={" + f'{{ kind = "http", url = "{url}"{opts} }}' + "}",
                 *settings)
    stopper(broker)
    return broker


def connack(broker, user, pw="pw", cid="c1", bind=None, **kw):
    c = Raw(broker.port, cid, username=user, password=pw, bind=bind, **kw)
    return c.connack_code, c


def puback_reason(c, topic, pid=1):
    c.send((PUBLISH << 4) | 2, mqtt_str(topic) + u16(pid) + varint(0) + b"x")
    ack = c.expect(PUBACK)
    return ack.body[2] if len(ack.body) > 2 else 0


def test_answers_request_fields_and_the_acl(service, stopper):
    broker = http_rtd(stopper, f"http://127.0.0.1:{service.port}/auth")
    assert connack(broker, "allow-1")[0] == 0
    req = service.requests[-1]
    assert req["clientid"] == "c1" and req["username"] == "allow-1" and req["password"] == "pw"
    assert req["peerhost"] == "127.0.0.1" and req["listener"] == f"127.0.0.1:{broker.port}"
    assert "tls" in req and req["tls"] is None  # plain TCP: no certificate
    assert connack(broker, "deny-1", bind="127.0.0.2")[0] == BAD_CREDENTIALS
    assert connack(broker, "ignore-1", bind="127.0.0.3")[0] == NOT_AUTHORIZED  # nobody took it
    assert connack(broker, "junk-1", bind="127.0.0.4")[0] == UNAVAILABLE  # on_error deny
    for attempt in range(2):  # the second from the cache: its ACL with it
        code, c = connack(broker, "allow-acl", cid="dev1")
        assert code == 0
        assert puback_reason(c, "in/dev1") < 0x80
        assert puback_reason(c, "in/dev2") == NOT_AUTHORIZED
        assert c.subscribe("out/dev1", qos=1).body[-1] == 1
        assert c.subscribe("elsewhere/#", qos=1, pid=2).body[-1] == NOT_AUTHORIZED
    assert service.calls("allow-acl") == 1
    log = broker.read_log()
    assert "event=auth.http_failed" in log and "no result of allow" in log


def test_answers_are_cached_refusals_too_and_connections_kept(service, stopper):
    broker = http_rtd(stopper, f"http://127.0.0.1:{service.port}/auth", cache_ttl_s=3600,
                      pool_size=2)
    for _ in range(5):
        assert connack(broker, "allow-cached")[0] == 0
    assert service.calls("allow-cached") == 1  # one call, four answers from the cache
    for i in range(3):
        assert connack(broker, "deny-cached", bind=f"127.0.0.{10 + i}")[0] == BAD_CREDENTIALS
    assert service.calls("deny-cached") == 1
    assert connack(broker, "allow-cached", pw="another")[0] == 0  # another password: a call
    assert service.calls("allow-cached") == 2
    for i in range(10):
        assert connack(broker, f"allow-{i}")[0] == 0
    assert len(service.peers) <= 2, service.peers  # kept alive: at most pool_size connections
    code, out, err = broker.ctl("metrics", "prometheus")
    assert 'rt_auth_http_cache_total{outcome="hit"} 6' in out, out
    assert "rt_auth_http_calls_total 13" in out


def test_no_cache_calls_every_time(service, stopper):
    broker = http_rtd(stopper, f"http://127.0.0.1:{service.port}/auth", cache_ttl_s=0)
    for _ in range(3):
        assert connack(broker, "allow-nc")[0] == 0
    assert service.calls("allow-nc") == 3


def test_a_service_down_or_slow(service, stopper):
    url = f"http://127.0.0.1:{service.port}/auth"
    deny = http_rtd(stopper, url, timeout_ms=1000)
    cache = http_rtd(stopper, url, timeout_ms=1000, on_error="cache", cache_ttl_s=1)
    assert connack(cache, "allow-known")[0] == 0
    # Slower than the timeout: no answer, so deny says 0x88 and the login is not admitted.
    assert connack(deny, "slow-1")[0] == UNAVAILABLE
    service.stop()
    time.sleep(1.1)  # allow-known's answer is now past its TTL: only on_error=cache uses it
    assert connack(deny, "allow-new", bind="127.0.0.5")[0] == UNAVAILABLE
    assert connack(cache, "allow-known")[0] == 0
    assert connack(cache, "allow-unknown", bind="127.0.0.6")[0] == UNAVAILABLE
    assert 'reason=unavailable' in deny.read_log()


def test_https_against_a_ca(pki, stopper):
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert, key = pki.server["ec"]
    ctx.load_cert_chain(cert, key)
    svc = Service(tls=ctx)
    try:
        good = http_rtd(stopper, f"https://localhost:{svc.port}/auth", ca_file=pki.ca.cert)
        assert connack(good, "allow-tls")[0] == 0
        bad = http_rtd(stopper, f"https://localhost:{svc.port}/auth")  # the system's CAs
        assert connack(bad, "allow-tls")[0] == UNAVAILABLE
        assert "TLS handshake failed" in bad.read_log()
    finally:
        svc.stop()


def test_the_answers_expiry_ends_the_connection(service, stopper):
    broker = http_rtd(stopper, f"http://127.0.0.1:{service.port}/auth")
    code, c = connack(broker, "allow-brief")
    assert code == 0
    p = c.read(timeout=2 + 30)
    assert p is not None and p.body[0] == 0xA0, p


def test_the_client_certificate_in_the_request_and_the_caches_key(service, pki, stopper):
    """A mutual-TLS listener (verify optional): the request names the client's verified
    certificate (CN, RFC 2253 subject, SHA-256 of the DER); a TLS client without one and a
    plain one send tls null. The service here allows cert* users only with alice-cert's
    certificate: with one user name and password, bob's certificate and no certificate each
    make their own call and are refused, never given alice's cached allow, and each answer is
    cached for its own certificate."""
    port, tls_port = free_port(), free_port()
    cert, key = pki.server["ec"]
    mtls = {"bind": f"127.0.0.1:{tls_port}",
            "tls": {"cert": cert, "key": key, "ca": pki.ca.cert, "verify": "optional"}}
    broker = Rtd("allow_anonymous=false", "auth_max_delay_ms=0",  # refusals answered at once
                 f'auth={{ {{ kind = "http", url = "http://127.0.0.1:{service.port}/auth", '
                 "cache_ttl_s = 3600 } }",
                 listeners(port, mtls), port=port)
    stopper(broker)

    def over_tls(pair, cid):
        ctx = tls_context(pki.ca.cert, *(pair or ()))
        c = RawOn(tls_connect(tls_port, ctx), cid, username="cert-user", password="pw")
        code = c.connack_code
        c.close()
        return code

    assert over_tls(pki.client, "alice-1") == 0
    req = service.requests[-1]
    der = ssl.PEM_cert_to_DER_cert(open(pki.client[0]).read())
    assert req["tls"] == {"cn": "alice-cert", "subject": cert_field(pki.client[0], "subject"),
                          "fingerprint_sha256": hashlib.sha256(der).hexdigest()}, req
    assert sorted(req["tls"]["subject"].split(",")) == ["CN=alice-cert", "O=rt tests"]
    assert req["listener"] == f"127.0.0.1:{tls_port}"
    assert over_tls(pki.client_bob, "bob-1") == BAD_CREDENTIALS  # not alice's cached allow
    assert service.requests[-1]["tls"]["cn"] == "bob-cert"
    assert service.calls("cert-user") == 2
    assert over_tls(None, "nocert-1") == BAD_CREDENTIALS  # TLS, no certificate
    assert service.requests[-1]["tls"] is None
    # Plain TCP tells the service what TLS without a certificate told: that answer, cached.
    assert connack(broker, "cert-user", cid="plain-1")[0] == BAD_CREDENTIALS
    assert service.calls("cert-user") == 3
    # Each answer now comes from the cache, for its own certificate.
    assert over_tls(pki.client, "alice-2") == 0
    assert over_tls(pki.client_bob, "bob-2") == BAD_CREDENTIALS
    assert over_tls(None, "nocert-2") == BAD_CREDENTIALS
    assert service.calls("cert-user") == 3
