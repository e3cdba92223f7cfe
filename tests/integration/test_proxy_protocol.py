"""The PROXY protocol (v1 and v2) and X-Forwarded-For against a real rtd: a header from a
trusted proxy sets the client's address everywhere rtd uses one (rtctl clients, the log, the
rules' msg.peer and client.connected peer, the per-address connection limit, the anonymous_from
rule); a header from an untrusted address, a truncated or malformed one, garbage, or none at all
is refused with a proxy.refused line; other clients carry on.

Only 127.0.0.0/8 is used, for the connections and for the addresses the headers claim (the
latter also keeps them inside the default anonymous_from).
"""
import socket
import sqlite3
import time

import pytest

from conftest import Rtd, free_port, wait_for
from mqtt_raw import Raw, mqtt_str
from transports import (RawOn, V2_SIG, WebSocket, connect_packet, listeners, proxy_v1, proxy_v2,
                        read_http_head, tls_context, upgrade_request, wait_log)

PEER_RULE = '''
return {
    name = "peers",
    from = { "peer/#", "client.connected" },
    select = function(m)
        return { kind = m.event or "message", clientid = m.clientid, peer = m.peer }
    end,
    to = { db = { table = "peers" } },
}
'''


def start(tmp_path, *overrides, ws_trusted=True, connect_timeout=None):
    """rtd with: port (plain), pport (PROXY, trusting 127.0.0.0/8), uport (PROXY, trusting
    127.0.0.2/32 only), xport (WebSocket trusting 127.0.0.1/32 for X-Forwarded-For) and
    wport (WebSocket trusting nobody); a rule writes every peer it sees to peers.db."""
    port, pport, uport, xport, wport = (free_port() for _ in range(5))
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "peers.lua").write_text(PEER_RULE)
    db = str(tmp_path / "peers.db")
    sink = ('sinks={db={type="sqlite",file="%s",batch=100,flush_ms=10,backoff_ms=20,'
            'backoff_max_ms=200}}' % db)
    extra = [f"connect_timeout={connect_timeout}"] if connect_timeout else []
    b = Rtd(listeners(port,
                      {"bind": f"127.0.0.1:{pport}", "proxy_protocol": True,
                       "trusted_proxies": ["127.0.0.0/8"]},
                      {"bind": f"127.0.0.1:{uport}", "proxy_protocol": True,
                       "trusted_proxies": ["127.0.0.2/32"]},
                      {"bind": f"127.0.0.1:{xport}", "websocket": "/mqtt",
                       "trusted_proxies": ["127.0.0.1/32"]},
                      {"bind": f"127.0.0.1:{wport}", "websocket": "/mqtt"}),
            f'rules_dir="{rules}"', sink, *extra, *overrides, port=port,
            data_dir=str(tmp_path))
    b.pport, b.uport, b.xport, b.wport, b.db = pport, uport, xport, wport, db
    return b


def stop_ok(b):
    code, log = b.stop()
    assert code == 0, log[-3000:]
    return log


def peers(db):
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return con.execute("SELECT kind, clientid, peer FROM peers ORDER BY rowid").fetchall()
        finally:
            con.close()
    except sqlite3.OperationalError:
        return []


def via_proxy(port, header, client_id=None, source=None):
    """A socket that sent header; with client_id, an MQTT client (RawOn) over it."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5,
                                 source_address=(source, 0) if source else None)
    s.sendall(header)
    if client_id is None:
        return s
    return RawOn(s, client_id, version=4)


def client_peer(broker, client_id):
    rows = {c["client_id"]: c for c in broker.ctl_json("clients", "list")}
    return rows[client_id]["peer"] if client_id in rows else None


def refused_at_once(s, timeout=5.0):
    """Whether the broker closes s (EOF or reset) within timeout without answering with a
    successful CONNACK; anything it sends first must not be a CONNACK 0."""
    s.settimeout(timeout)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        return False
    return not got.startswith(b"\x20\x02\x00\x00")


def healthy_via_proxy(broker, n):
    c = via_proxy(broker.pport, proxy_v1("127.99.0.1", 50000 + n, dport=broker.pport),
                  f"healthy-{n}")
    assert c.connack_code == 0
    assert c.subscribe("h/x", 0).body[2:] == b"\x00"
    c.publish("h/x", b"ok")
    assert c.next_publish()["payload"] == b"ok"
    c.disconnect()


def test_v1_and_v2_set_the_client_address(tmp_path):
    """A v1 line, a v2 header over IPv4 and one over IPv6 (with a TLV, skipped) from a trusted
    proxy: rtctl, the rules (client.connected's peer and a message's msg.peer) and the log see
    the address the header names, not the proxy's. A v2 LOCAL header (a health check) keeps
    the connection's own address."""
    broker = start(tmp_path)
    try:
        cases = [("pp-v1", proxy_v1("127.66.0.1", 40001, dport=broker.pport), "127.66.0.1:40001"),
                 ("pp-v2", proxy_v2("127.66.0.2", 40002, dport=broker.pport), "127.66.0.2:40002"),
                 ("pp-v2-tlv", proxy_v2("127.66.0.3", 40003, dport=broker.pport,
                                        tlvs=b"\x04\x00\x03abc"), "127.66.0.3:40003")]
        clients = []
        for cid, header, want in cases:
            c = via_proxy(broker.pport, header, cid)
            assert c.connack_code == 0, cid
            c.publish(f"peer/{cid}", b"hi")
            clients.append(c)
            assert client_peer(broker, cid) == want, broker.ctl_json("clients", "list")
        local = socket.create_connection(("127.0.0.1", broker.pport), timeout=5)
        lport = local.getsockname()[1]
        local.sendall(proxy_v2("127.66.0.9", 1, dport=broker.pport, command=0))
        c = RawOn(local, "pp-local", version=4)
        assert c.connack_code == 0
        assert client_peer(broker, "pp-local") == f"127.0.0.1:{lport}"
        clients.append(c)

        want = {(k, cid, peer) for cid, _, peer in cases for k in ("message", "client.connected")}
        assert wait_for(lambda: want <= set(peers(broker.db)), 10), peers(broker.db)
        assert not [r for r in peers(broker.db) if r[1].startswith("pp-v") and
                    r[2].startswith("127.0.0.1:")]
        # The log names the real address too: a bad packet from a proxied client is logged
        # with it.
        bad = via_proxy(broker.pport, proxy_v1("127.66.0.7", 40007, dport=broker.pport))
        bad.sendall(b"\x10\x0c" + mqtt_str("XQTT") + b"\x04\x02\x00\x3c\x00\x00")
        assert refused_at_once(bad)
        wait_log(broker, r"peer=127\.66\.0\.7:40007\b")
        for c in clients:
            c.disconnect()
    finally:
        stop_ok(broker)


def test_per_address_limit_counts_the_real_address(tmp_path):
    """max_connections_per_ip=2 with every connection coming from the proxy (127.0.0.1): five
    clients with five addresses are all admitted (the proxy's own address is not what is
    counted), two with the same address are, and a third with that address is refused and
    logged with it (last_per_ip)."""
    broker = start(tmp_path, "max_connections_per_ip=2")
    held = []
    try:
        for i in range(5):
            c = via_proxy(broker.pport, proxy_v2(f"127.66.1.{i + 1}", 41000 + i,
                                                 dport=broker.pport), f"many-{i}")
            assert c.connack_code == 0, i
            held.append(c)
        for i in range(2):
            c = via_proxy(broker.pport, proxy_v1("127.66.9.9", 42000 + i, dport=broker.pport),
                          f"same-{i}")
            assert c.connack_code == 0, i
            held.append(c)
        s = via_proxy(broker.pport, proxy_v1("127.66.9.9", 42002, dport=broker.pport))
        s.sendall(connect_packet("same-2"))
        assert refused_at_once(s), "a third connection from 127.66.9.9 was admitted"
        s.close()
        # Logged with the address that was refused (the listener's summary line, or a
        # proxy.refused line for the connection).
        wait_log(broker, r"listener\.refused .*last_per_ip=127\.66\.9\.9|"
                         r"proxy\.refused peer=127\.66\.9\.9:42002 reason=max_connections_per_ip")
        # Another address still gets in.
        c = via_proxy(broker.pport, proxy_v1("127.66.9.10", 42003, dport=broker.pport), "other")
        assert c.connack_code == 0
        held.append(c)
    finally:
        for c in held:
            c.close()
        stop_ok(broker)


def test_anonymous_from_sees_the_real_address(tmp_path):
    """anonymous_from (an address rule) is checked against the address the header names: an
    anonymous client claiming 127.66.0.0/16 gets in through the proxy, one claiming
    127.77.0.1 is refused (CONNACK 5), as is a direct anonymous client from 127.0.0.1."""
    broker = start(tmp_path, 'anonymous_from={"127.66.0.0/16"}')
    try:
        ok = via_proxy(broker.pport, proxy_v1("127.66.5.5", 43000, dport=broker.pport), "anon-ok")
        assert ok.connack_code == 0
        no = via_proxy(broker.pport, proxy_v1("127.77.0.1", 43001, dport=broker.pport), "anon-no")
        assert no.connack_code == 5
        assert Raw(broker.port, "direct", version=4).connack_code == 5
        ok.disconnect()
    finally:
        stop_ok(broker)


def test_header_from_an_untrusted_address_is_refused(tmp_path):
    """A listener trusting only 127.0.0.2/32: a valid header from 127.0.0.1 is refused
    (proxy.refused reason=untrusted), the same from 127.0.0.2 is accepted."""
    broker = start(tmp_path)
    try:
        # Refused at accept: the header and the CONNECT may meet a closed socket.
        s = socket.create_connection(("127.0.0.1", broker.uport), timeout=5)
        lport = s.getsockname()[1]
        try:
            s.sendall(proxy_v1("127.66.0.1", 44000, dport=broker.uport) +
                      connect_packet("untrusted"))
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert refused_at_once(s)
        s.close()
        # Refusals at accept may be summed per address (count=N), the port then shown as 0.
        wait_log(broker, rf"proxy\.refused peer=127\.0\.0\.1:(?:{lport}|0) reason=untrusted")
        c = via_proxy(broker.uport, proxy_v1("127.66.0.2", 44001, dport=broker.uport), "trusted",
                      source="127.0.0.2")
        assert c.connack_code == 0
        assert client_peer(broker, "trusted") == "127.66.0.2:44001"
        c.disconnect()
        healthy_via_proxy(broker, 0)
    finally:
        stop_ok(broker)


def test_malformed_headers_are_refused(tmp_path):
    """Each closed at once with proxy.refused reason=malformed, naming the connection's own
    address: a v2 header whose length is too short for its address family, an unknown v2
    version, a v1 line with a bad address, a v1 line longer than 107 bytes, garbage, and a
    plain MQTT CONNECT with no header. Other clients are unaffected."""
    broker = start(tmp_path)
    short_v2 = V2_SIG + b"\x21\x11\x00\x04" + b"\x7f\x42\x00\x01"
    bad_version = V2_SIG + b"\x31\x11\x00\x0c" + bytes(12)
    cases = [("short v2", short_v2),
             ("v2 version 3", bad_version),
             ("v1 bad address", b"PROXY TCP4 999.1.1.1 127.0.0.1 1 2\r\n"),
             ("v1 too long", b"PROXY TCP4 " + b"1" * 120 + b"\r\n"),
             ("garbage", b"HELLO WORLD\r\n\r\n" + bytes(range(64))),
             ("no header", connect_packet("no-header"))]
    try:
        for i, (name, data) in enumerate(cases):
            s = socket.create_connection(("127.0.0.1", broker.pport), timeout=5)
            lport = s.getsockname()[1]
            s.sendall(data)
            t0 = time.monotonic()
            assert refused_at_once(s), name
            assert time.monotonic() - t0 < 2, name   # at once: not the connect timeout
            s.close()
            wait_log(broker, rf"proxy\.refused peer=127\.0\.0\.1:{lport} reason=malformed")
            healthy_via_proxy(broker, i)
    finally:
        stop_ok(broker)


def test_truncated_header_times_out(tmp_path):
    """A v2 header cut short (its length promises more) and then silence: closed after
    connect_timeout (2 s) with proxy.refused reason=timeout; a v1 line without its CRLF
    likewise. The bound: not before the timeout, and within it plus a second for a timer
    sweep plus a second of slack for a loaded machine."""
    broker = start(tmp_path, connect_timeout=2)
    try:
        full = proxy_v2("127.66.0.1", 45000, dport=broker.pport)
        for data in (full[:20], b"PROXY TCP4 127.66.0.1 127.0.0.1 45001"):
            s = socket.create_connection(("127.0.0.1", broker.pport), timeout=10)
            lport = s.getsockname()[1]
            t0 = time.monotonic()
            s.sendall(data)
            assert refused_at_once(s, 10)
            waited = time.monotonic() - t0
            s.close()
            assert 2 - 0.1 <= waited <= 2 + 2.0, waited
            wait_log(broker, rf"proxy\.refused peer=127\.0\.0\.1:{lport} reason=timeout")
        healthy_via_proxy(broker, 0)
    finally:
        stop_ok(broker)


def test_x_forwarded_for_on_websocket(tmp_path):
    """A WebSocket listener with trusted_proxies (here 127.0.0.1, where the test connects
    from) takes the client's address from X-Forwarded-For (rtctl and the rules see it); one
    without trusted_proxies ignores the header (the connection's own address)."""
    broker = start(tmp_path)
    try:
        ws = WebSocket.connect(broker.xport, extra=["X-Forwarded-For: 127.88.0.7"])
        c = RawOn(ws, "xff", version=4)
        assert c.connack_code == 0
        c.publish("peer/xff", b"hi")
        peer = client_peer(broker, "xff")
        assert peer is not None and peer.split(":")[0] == "127.88.0.7", peer
        assert wait_for(lambda: any(r[1] == "xff" and r[0] == "message" and
                                    r[2].startswith("127.88.0.7") for r in peers(broker.db)),
                        10), peers(broker.db)

        # A chain is read from the right, past the trusted proxies: the nearest address that
        # is not a trusted proxy is the client (what is left of it may be forged by the
        # client itself).
        for i, (xff, want) in enumerate((("127.88.0.9, 127.0.0.1", "127.88.0.9"),
                                         ("127.88.0.5, 127.88.0.6", "127.88.0.6"))):
            w = WebSocket.connect(broker.xport, extra=[f"X-Forwarded-For: {xff}"])
            cc = RawOn(w, f"xff-chain-{i}", version=4)
            assert cc.connack_code == 0
            peer = client_peer(broker, f"xff-chain-{i}")
            assert peer is not None and peer.split(":")[0] == want, (xff, peer)
            cc.disconnect()

        ws2 = WebSocket.connect(broker.wport, extra=["X-Forwarded-For: 127.88.0.8"])
        lport = ws2.sock.getsockname()[1]
        c2 = RawOn(ws2, "xff-ignored", version=4)
        assert c2.connack_code == 0
        assert client_peer(broker, "xff-ignored") == f"127.0.0.1:{lport}"
        c.disconnect()
        c2.disconnect()
    finally:
        stop_ok(broker)


@pytest.mark.parametrize("kind", ["tls", "ws", "wss"])
def test_proxy_header_before_tls_and_websocket(pki, kind):
    """A load balancer in front of a TLS or WebSocket listener sends the PROXY header before
    the ClientHello / the upgrade request: the client's address is the header's."""
    port, lport_ = free_port(), free_port()
    listener = {"bind": f"127.0.0.1:{lport_}", "proxy_protocol": True,
                "trusted_proxies": ["127.0.0.1/32"]}
    if kind in ("tls", "wss"):
        listener["tls"] = {"cert": pki.server["ec"][0], "key": pki.server["ec"][1]}
    if kind in ("ws", "wss"):
        listener["websocket"] = "/mqtt"
    b = Rtd(listeners(port, listener), port=port)
    try:
        s = via_proxy(lport_, proxy_v2("127.66.3.3", 46000, dport=lport_))
        if kind in ("tls", "wss"):
            s = tls_context(pki.ca.cert, alpn=None).wrap_socket(s, server_hostname="localhost")
        if kind in ("ws", "wss"):
            req, key = upgrade_request()
            s.sendall(req)
            ans = read_http_head(s)
            assert ans.status == 101, ans.headers
            ws = WebSocket(s)
            ws.inbuf = ans.rest
            s = ws
        c = RawOn(s, f"behind-lb-{kind}", version=4)
        assert c.connack_code == 0
        assert client_peer(b, f"behind-lb-{kind}") == "127.66.3.3:46000"
        c.disconnect()
    finally:
        stop_ok(b)
