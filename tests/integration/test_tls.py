"""MQTT over TLS against a real rtd (transport interface of issue 15): Debian's mosquitto_pub and
mosquitto_sub, paho and Python's ssl module as clients; TLS 1.2 and 1.3 with ECDSA P-256 and
RSA 2048 server certificates; ALPN "mqtt"; session resumption; client certificates
(verify=required/optional, a CRL, identity_as_username with the ACL); live reload of the
certificate files (SIGHUP, `rtctl tls reload`, a broken file); `rtctl listeners`; hostile
input (plaintext, stalled handshakes, garbage after the handshake); and testssl.sh's verdict
on what is offered.

Certificates are made at run time with the openssl CLI (certs.py).
"""
import datetime
import json
import os
import re
import selectors
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from certs import cert_field, serial_of
from conftest import Rtd, free_port, subscribe, wait_for
from mqtt_raw import PUBACK, mqtt_str, u16
from transports import (RawOn, closed_or_reset, connect_packet, find_key, listeners, tls_connect,
                        tls_context, wait_log)

VERSIONS = {"1.2": (ssl.TLSVersion.TLSv1_2, "tlsv1.2", "TLSv1.2"),
            "1.3": (ssl.TLSVersion.TLSv1_3, "tlsv1.3", "TLSv1.3")}


def tls_listener(port, cert, key, **tls):
    return {"bind": f"127.0.0.1:{port}", "tls": {"cert": cert, "key": key, **tls}}


def start(pki, *overrides, kind="ec", cert=None, key=None, **tls):
    """rtd with a plain listener (rtd.port) and a TLS one (rtd.tls_port)."""
    port, tls_port = free_port(), free_port()
    if cert is None:
        cert, key = pki.server[kind]
    broker = Rtd(listeners(port, tls_listener(tls_port, cert, key, **tls)), *overrides,
                 port=port)
    broker.tls_port = tls_port
    return broker


def stop_ok(broker):
    code, log = broker.stop()
    assert code == 0, log[-3000:]
    return log


def der(cert):
    return ssl.PEM_cert_to_DER_cert(open(cert).read())


def subscriptions(broker):
    return broker.ctl_json("broker", "stats")["subscriptions"]["count"]


def paho_tls(port, ctx, client_id, topic=None, protocol=mqtt.MQTTv311):
    """A connected paho client over TLS (loop running); topic: subscribed at QoS 1."""
    c = mqtt.Client(client_id=client_id, protocol=protocol)
    c.tls_set_context(ctx)
    c.got = []
    c.on_message = lambda _c, _u, m: c.got.append((m.topic, m.payload))
    c.disconnects = []
    c.on_disconnect = lambda _c, _u, rc, *a: c.disconnects.append(rc)
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    if topic:
        subscribe(c, topic, 1)
    return c


def paho_stop(c):
    c.disconnect()
    c.loop_stop()


def try_handshake(port, ctx, client_id="probe", timeout=5):
    """Handshake and CONNECT over TLS: ("connack", code), ("refused", error text) when the
    broker ends it (an alert, a reset, EOF), or ("timeout", "") when nothing comes; and the
    client's local port (what rtd logs as peer)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    lport = raw.getsockname()[1]
    try:
        try:
            s = ctx.wrap_socket(raw, server_hostname="localhost")
        except socket.timeout:
            return ("timeout", ""), lport
        except (ssl.SSLError, OSError) as e:
            return ("refused", str(e)), lport
        try:
            s.sendall(connect_packet(client_id))
            s.settimeout(timeout)
            head = s.recv(4)
            if not head:
                return ("refused", "EOF"), lport
            assert head[0] >> 4 == 2, head
            return ("connack", head[3] if len(head) > 3 else s.recv(1)[0]), lport
        except socket.timeout:
            return ("timeout", ""), lport
        except (ssl.SSLError, OSError) as e:
            return ("refused", str(e)), lport
        finally:
            s.close()
    finally:
        raw.close()


def handshake_failure(broker, lport):
    """The reason rtd logged for the handshake from local port lport."""
    found = wait_log(broker, rf"tls\.handshake_failed peer=127\.0\.0\.1:{lport} reason=(.*)")
    return found[0].strip().strip('"')


# ---- 1. clients, versions, key types ----

@pytest.mark.parametrize("version", ["1.2", "1.3"])
@pytest.mark.parametrize("kind", ["ec", "rsa"])
def test_mosquitto_clients_over_tls(pki, kind, version):
    """mosquitto_sub and mosquitto_pub (TLS pinned to one version, the server verified against
    the test CA by its IP SAN) exchange QoS 0 and QoS 1 messages through rtd."""
    broker = start(pki, kind=kind)
    try:
        tls_args = ["--cafile", pki.ca.cert, "--tls-version", VERSIONS[version][1]]
        sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.tls_port),
                                "-i", "tls-sub", "-t", "tls/#", "-q", "1", "-C", "2", "-W", "20",
                                "-v", *tls_args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert wait_for(lambda: subscriptions(broker) == 1, 10), sub.poll()
            for qos, msg in (("0", "zero"), ("1", "one")):
                p = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p",
                                    str(broker.tls_port), "-i", f"tls-pub{qos}", "-q", qos,
                                    "-t", f"tls/{msg}", "-m", msg, *tls_args],
                                   capture_output=True, text=True, timeout=20)
                assert p.returncode == 0, p.stderr
            out, err = sub.communicate(timeout=20)
        finally:
            if sub.poll() is None:
                sub.kill()
                sub.wait()
        assert sub.returncode == 0, err
        assert out.splitlines() == ["tls/zero zero", "tls/one one"]
        # The same tools without the CA do not accept rtd's certificate (it is really checked).
        p = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.tls_port),
                            "-t", "x", "-m", "x", "--cafile", pki.other_ca.cert],
                           capture_output=True, text=True, timeout=20)
        assert p.returncode != 0
    finally:
        stop_ok(broker)


@pytest.mark.parametrize("version", ["1.2", "1.3"])
@pytest.mark.parametrize("kind", ["ec", "rsa"])
def test_paho_over_tls(pki, kind, version):
    """paho over TLS with one version pinned: the negotiated version is that one, the
    certificate served is the configured one, and a QoS 1 message makes the round trip."""
    broker = start(pki, kind=kind)
    try:
        ctx = tls_context(pki.ca.cert, version=VERSIONS[version][0])
        c = paho_tls(broker.tls_port, ctx, f"paho-{kind}-{version}", "rt/tls")
        sock = c.socket()
        assert sock.version() == VERSIONS[version][2]
        assert sock.getpeercert(binary_form=True) == der(pki.server[kind][0])
        if version == "1.2":  # TLS 1.2 suites name the key type: ECDHE-ECDSA-... / ECDHE-RSA-...
            assert ("ECDSA" if kind == "ec" else "RSA") in sock.cipher()[0], sock.cipher()
        c.publish("rt/tls", b"over tls", qos=1).wait_for_publish(10)
        assert wait_for(lambda: c.got == [("rt/tls", b"over tls")]), c.got
        assert c.disconnects == []
        paho_stop(c)
    finally:
        stop_ok(broker)


def test_alpn_mqtt(pki):
    """ALPN: a client offering "mqtt" (among others) gets it; one offering none still
    connects (ALPN is optional for MQTT clients such as mosquitto's)."""
    broker = start(pki)
    try:
        for offer in (["mqtt"], ["x-unknown", "mqtt"]):
            s = tls_connect(broker.tls_port, tls_context(pki.ca.cert, alpn=offer))
            assert s.selected_alpn_protocol() == "mqtt", offer
            assert RawOn(s, "alpn", version=4).connack_code == 0
            s.close()
        s = tls_connect(broker.tls_port, tls_context(pki.ca.cert, alpn=None))
        assert s.selected_alpn_protocol() is None
        assert RawOn(s, "no-alpn", version=4).connack_code == 0
        s.close()
    finally:
        stop_ok(broker)


def test_sni_selects_the_certificate(pki, tmp_path):
    """tls.sni: a client asking for a configured name (exactly, or under a "*." pattern) is
    served that name's certificate; one asking for another name, or none, gets the
    listener's own. A bad SNI file fails the start, naming it; a reload reads them too."""
    made = {}
    for name, cn in (("sni-a", "a.rt.test"), ("sni-wild", "x.wild.test")):
        made[cn] = pki.ca.issue(str(tmp_path), name, cn, ext="server_ext", org=f"rt sni {name}")
    sni = [{"name": "a.rt.test", "cert": made["a.rt.test"][0], "key": made["a.rt.test"][1]},
           {"name": "*.wild.test", "cert": made["x.wild.test"][0],
            "key": made["x.wild.test"][1]}]
    broker = start(pki, sni=sni)
    try:
        ctx = tls_context(pki.ca.cert)
        ctx.check_hostname = False  # the names checked here are the certificates' subjects

        def served(host):
            s = tls_connect(broker.tls_port, ctx, server_hostname=host)
            subject = dict(x[0] for x in s.getpeercert()["subject"])
            assert RawOn(s, f"sni-{host}", version=4).connack_code == 0
            s.close()
            return subject["commonName"]
        assert served("a.rt.test") == "a.rt.test"
        assert served("A.RT.TEST") == "a.rt.test"  # host names ignore case
        assert served("x.wild.test") == "x.wild.test"
        assert served("y.wild.test") == "x.wild.test"
        assert served("b.y.wild.test") == "localhost"  # "*." covers one label only
        assert served("other.test") == "localhost"
        assert served("localhost") == "localhost"
        listed = broker.ctl_json("listeners")
        tls = [ls["tls"] for ls in listed if "tls" in ls][0]
        assert tls["sni"] == ["a.rt.test", "*.wild.test"]
        code, out, err = broker.ctl("tls", "reload")
        assert code == 0, (out, err)
        assert served("a.rt.test") == "a.rt.test"
    finally:
        stop_ok(broker)
    bad = [dict(sni[0], key=str(tmp_path / "missing.key"))]
    port, tls_port = free_port(), free_port()
    with pytest.raises(RuntimeError, match="missing.key"):
        Rtd(listeners(port, tls_listener(tls_port, *pki.server["ec"], sni=bad)), port=port)


@pytest.mark.parametrize("version", ["1.2", "1.3"])
def test_session_resumption(pki, version):
    """A second connection offering the first one's session (a ticket) resumes it: no full
    handshake. With TLS 1.3 the ticket comes after the handshake, so the first connection
    reads its CONNACK before its session is taken."""
    broker = start(pki)
    try:
        ctx = tls_context(pki.ca.cert, version=VERSIONS[version][0])
        first = tls_connect(broker.tls_port, ctx)
        c = RawOn(first, "resume-1", version=4)
        assert c.connack_code == 0
        assert not first.session_reused
        session = first.session
        assert session is not None
        c.disconnect()
        for i in range(2):  # a ticket may be used more than once (stateless tickets)
            again = tls_connect(broker.tls_port, ctx, session=session)
            assert again.session_reused, (version, i)
            c2 = RawOn(again, f"resume-{i + 2}", version=4)
            assert c2.connack_code == 0
            c2.disconnect()
    finally:
        stop_ok(broker)


def test_many_tls_clients_at_once(pki):
    """100 TLS clients (half TLS 1.2, half 1.3) connect from 10 threads at once, each sends a
    QoS 1 message to itself and gets it back; the listener counts 100 open connections, and
    none once they have all disconnected (nothing is left behind)."""
    broker = start(pki)
    n, threads = 100, 10
    held, errors = [], []
    lock = threading.Lock()

    def worker(k):
        try:
            for i in range(k, n, threads):
                v = ssl.TLSVersion.TLSv1_2 if i % 2 else ssl.TLSVersion.TLSv1_3
                c = RawOn(tls_connect(broker.tls_port, tls_context(pki.ca.cert, version=v),
                                      timeout=20), f"many-{i}", version=4)
                assert c.connack_code == 0
                assert c.subscribe(f"many/{i}", 1).body[2:] == b"\x01"
                c.send((3 << 4) | 2, mqtt_str(f"many/{i}") + u16(1) + b"%d" % i)
                got = [c.read(20), c.read(20)]   # its PUBACK and the message, either order
                assert None not in got, (i, got)
                assert sorted(p.type for p in got) == [3, PUBACK], got
                m = c.publish_fields(next(p for p in got if p.type == 3))
                assert (m["topic"], m["payload"]) == (f"many/{i}", b"%d" % i), m
                c.ack(PUBACK, m["pid"])
                with lock:
                    held.append(c)
        except Exception as e:  # reported below
            errors.append(repr(e))

    try:
        ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not errors, errors[:3]
        assert len(held) == n

        def open_conns():
            rows = {r["listener"]: r for r in broker.ctl_json("listeners")}
            return rows[f"127.0.0.1:{broker.tls_port}"]["connections"]
        assert wait_for(lambda: open_conns() == n, 10), open_conns()
        for c in held:
            c.disconnect()
        assert wait_for(lambda: open_conns() == 0, 10), open_conns()
    finally:
        stop_ok(broker)


# ---- 2. client certificates ----

def mtls(pki, verify="required", **more):
    return dict(ca=pki.ca.cert, crl=pki.ca.crl, verify=verify, **more)


@pytest.mark.parametrize("version", ["1.2", "1.3"])
def test_verify_required_refuses_bad_client_certificates(pki, version):
    """verify=required: no certificate, an expired one, one from an unknown CA and a revoked one
    (in the CRL) are each refused, and each refusal is logged with OpenSSL's reason; a good
    certificate gets in. (With TLS 1.3 the client's handshake ends before the server checks
    its certificate, so the refusal may come as an alert on the first read.)"""
    broker = start(pki, **mtls(pki))
    v = VERSIONS[version][0]
    try:
        outcome, _ = try_handshake(broker.tls_port, tls_context(pki.ca.cert, *pki.client,
                                                                version=v))
        assert outcome == ("connack", 0)
        cases = [("none", None, "certificate"),
                 ("expired", pki.expired, "certificate has expired"),
                 ("unknown CA", pki.unknown, "unable to get local issuer certificate"),
                 ("revoked", pki.revoked, "certificate revoked")]
        for name, pair, reason in cases:
            ctx = tls_context(pki.ca.cert, *(pair or ()), version=v)
            outcome, lport = try_handshake(broker.tls_port, ctx)
            assert outcome[0] == "refused", (name, outcome)
            why = handshake_failure(broker, lport)
            assert reason in why, (name, why)
        # Still serving: a good client after the refusals.
        outcome, _ = try_handshake(broker.tls_port, tls_context(pki.ca.cert, *pki.client,
                                                                version=v))
        assert outcome == ("connack", 0)
    finally:
        stop_ok(broker)


def test_verify_required_with_mosquitto_clients(pki):
    """mosquitto_pub with the good client certificate publishes; with the expired one, or with
    none, it fails."""
    broker = start(pki, **mtls(pki))
    base = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.tls_port), "-t", "m/x",
            "-m", "x", "--cafile", pki.ca.cert]
    try:
        p = subprocess.run(base + ["--cert", pki.client[0], "--key", pki.client[1]],
                           capture_output=True, text=True, timeout=20)
        assert p.returncode == 0, p.stderr
        for extra in (["--cert", pki.expired[0], "--key", pki.expired[1]], []):
            p = subprocess.run(base + extra + ["-q", "1"], capture_output=True, text=True,
                               timeout=20)
            assert p.returncode != 0, (extra, p.stdout, p.stderr)
        assert wait_for(lambda: broker.read_log().count("tls.handshake_failed") >= 2)
    finally:
        stop_ok(broker)


def test_verify_optional(pki):
    """verify=optional: a client without a certificate is accepted, and so is one with a good
    certificate."""
    broker = start(pki, **mtls(pki, verify="optional"))
    try:
        assert try_handshake(broker.tls_port, tls_context(pki.ca.cert))[0] == ("connack", 0)
        assert try_handshake(broker.tls_port,
                             tls_context(pki.ca.cert, *pki.client))[0] == ("connack", 0)
    finally:
        stop_ok(broker)


def test_verify_optional_still_checks_a_presented_certificate(pki):
    """verify=optional makes the certificate optional, not its check: one from an unknown CA,
    an expired one and a revoked one are refused (logged with the reason); a good one gets
    in. (rtd refuses identity_as_username without verify="required" at start, so an
    unchecked CN never becomes a user name.)"""
    broker = start(pki, **mtls(pki, verify="optional"))
    try:
        for name, pair, reason in (("unknown CA", pki.unknown,
                                    "unable to get local issuer certificate"),
                                   ("expired", pki.expired, "certificate has expired"),
                                   ("revoked", pki.revoked, "certificate revoked")):
            outcome, lport = try_handshake(broker.tls_port, tls_context(pki.ca.cert, *pair))
            assert outcome[0] == "refused", (name, outcome)
            assert reason in handshake_failure(broker, lport), name
        assert try_handshake(broker.tls_port,
                             tls_context(pki.ca.cert, *pki.client))[0] == ("connack", 0)
    finally:
        stop_ok(broker)


def test_crl_reloaded_live(pki, tmp_path):
    """A certificate revoked after start: once the CRL file is replaced and rtd reloads
    (SIGHUP), the next handshake with it is refused ("certificate revoked"); other clients
    still get in."""
    late = pki.ca.issue(str(tmp_path), "client-late", "late-cert")
    live_crl = str(tmp_path / "live-crl.pem")
    shutil.copyfile(pki.ca.crl, live_crl)
    broker = start(pki, **dict(mtls(pki), crl=live_crl))
    try:
        assert try_handshake(broker.tls_port, tls_context(pki.ca.cert, *late))[0] == \
            ("connack", 0)
        pki.ca.revoke(late[0])
        shutil.copyfile(pki.ca.crl, live_crl + ".new")
        os.rename(live_crl + ".new", live_crl)
        broker.proc.send_signal(signal.SIGHUP)
        wait_log(broker, rf"tls\.reloaded listener=127\.0\.0\.1:{broker.tls_port}")
        outcome, lport = try_handshake(broker.tls_port, tls_context(pki.ca.cert, *late))
        assert outcome[0] == "refused", outcome
        assert "certificate revoked" in handshake_failure(broker, lport)
        assert try_handshake(broker.tls_port,
                             tls_context(pki.ca.cert, *pki.client))[0] == ("connack", 0)
    finally:
        stop_ok(broker)


def test_identity_as_username(pki, tmp_path):
    """identity_as_username: the certificate's CN is the user the ACL sees; the user name and
    password in CONNECT are ignored. alice-cert may use only alice-cert/#, bob-cert only
    bob-cert/#."""
    acl = tmp_path / "cn.acl"
    acl.write_text("user alice-cert\ntopic readwrite alice-cert/#\n"
                   "user bob-cert\ntopic readwrite bob-cert/#\n"
                   "user mallory\ntopic readwrite #\n")
    broker = start(pki, f'acl_file="{acl}"', **mtls(pki, identity_as_username=True))
    try:
        alice_s = tls_connect(broker.tls_port, tls_context(pki.ca.cert, *pki.client))
        # Claims to be mallory (who may do anything): ignored, the certificate decides.
        alice = RawOn(alice_s, "cn-alice", username="mallory", password="x")
        assert alice.connack_code == 0
        bob = RawOn(tls_connect(broker.tls_port, tls_context(pki.ca.cert, *pki.client_bob)),
                    "cn-bob")
        assert bob.connack_code == 0
        assert alice.subscribe("alice-cert/#", 1).body[3:] == b"\x01"
        assert alice.subscribe("bob-cert/#", 1, pid=2).body[3:] == b"\x87"
        assert bob.subscribe("bob-cert/#", 1).body[3:] == b"\x01"
        alice.publish("alice-cert/x", b"mine", qos=1, pid=3)
        m = alice.next_publish()
        assert (m["topic"], m["payload"]) == ("alice-cert/x", b"mine")
        alice.ack(PUBACK, m["pid"])
        alice.send((3 << 4) | 2, b"\x00\x0abob-cert/x\x00\x04\x00no")
        assert alice.expect(PUBACK).body[2:3] == b"\x87"   # not authorized
        assert bob.next_publish(0.5) is None
        users = {c["client_id"]: c.get("user", c.get("username"))
                 for c in broker.ctl_json("clients", "list")}
        assert users["cn-alice"] == "alice-cert" and users["cn-bob"] == "bob-cert", users
        alice.disconnect()
        bob.disconnect()
    finally:
        stop_ok(broker)


def test_identity_as_username_on_a_resumed_session(pki, tmp_path):
    """A session kept by alice-cert and resumed (same client id, clean start 0) by a
    connection with bob-cert's certificate belongs to bob-cert from then on: the user name is
    the new connection's certificate's, for rtctl and the ACL (alice-cert/# is refused)."""
    acl = tmp_path / "cn.acl"
    acl.write_text("user alice-cert\ntopic readwrite alice-cert/#\n"
                   "user bob-cert\ntopic readwrite bob-cert/#\n")
    broker = start(pki, f'acl_file="{acl}"', **mtls(pki, identity_as_username=True))
    expiry = bytes([0x11]) + (300).to_bytes(4, "big")
    try:
        a = RawOn(tls_connect(broker.tls_port, tls_context(pki.ca.cert, *pki.client)),
                  "shared-id", clean=False, props=expiry)
        assert a.connack_code == 0
        a.disconnect()
        broker.wait_offline("shared-id")
        b = RawOn(tls_connect(broker.tls_port, tls_context(pki.ca.cert, *pki.client_bob)),
                  "shared-id", clean=False, props=expiry, username="alice-cert")
        assert b.connack_code == 0 and b.session_present
        show = broker.ctl_json("clients", "show", "shared-id")
        assert show.get("username", show.get("user")) == "bob-cert", show
        b.send((3 << 4) | 2, b"\x00\x0calice-cert/x\x00\x05\x00no")
        assert b.expect(PUBACK).body[2:3] == b"\x87"
        b.publish("bob-cert/x", b"ok", qos=1, pid=6)
        b.disconnect(props=bytes([0x11]) + (0).to_bytes(4, "big"))
    finally:
        stop_ok(broker)


# ---- 3. live reload ----

def install(src_pair, dst_pair):
    """Replaces the live certificate and key files atomically (write, then rename)."""
    for src, dst in zip(src_pair, dst_pair):
        shutil.copyfile(src, dst + ".new")
        os.chmod(dst + ".new", 0o600)
        os.rename(dst + ".new", dst)


def served(port, ca):
    """(serial, subject O) of the certificate a new handshake gets."""
    s = tls_connect(port, tls_context(ca))
    try:
        cert = s.getpeercert()
        org = dict(x[0] for x in cert["subject"])["organizationName"]
        return cert["serialNumber"], org
    finally:
        s.close()


@pytest.mark.parametrize("how", ["sighup", "rtctl"])
def test_reload_certificate_live(pki, tmp_path, how):
    """New certificate files and a reload (SIGHUP or `rtctl tls reload`): the next handshake
    gets the new certificate (serial and subject), a connection opened before goes on
    publishing and receiving. Then a broken file: the reload fails with a reason (rtctl exits
    non-zero; the log says tls.reload_failed) and the current certificate is still served."""
    live = (str(tmp_path / "live.pem"), str(tmp_path / "live.key"))
    install(pki.server["ec"], live)
    broker = start(pki, cert=live[0], key=live[1])
    where = f"127.0.0.1:{broker.tls_port}"

    def reload():
        if how == "sighup":
            before = broker.read_log().count("tls.reload")
            broker.proc.send_signal(signal.SIGHUP)
            assert wait_for(lambda: broker.read_log().count("tls.reload") > before, 10), \
                broker.read_log()[-2000:]
            return None
        return broker.ctl("tls", "reload")

    try:
        assert served(broker.tls_port, pki.ca.cert) == (serial_of(live[0]), "rt server ec")
        old = RawOn(tls_connect(broker.tls_port, tls_context(pki.ca.cert)), "before-reload")
        assert old.subscribe("live/#", 1).body[3:] == b"\x01"

        new = pki.new_server(kind="rsa")
        install(new, live)
        r = reload()
        if r is not None:
            assert r[0] == 0, r
        wait_log(broker, rf"tls\.reloaded listener={re.escape(where)}")
        serial, org = served(broker.tls_port, pki.ca.cert)
        assert serial == serial_of(new[0]) and org.startswith("rt server reloaded"), (serial, org)
        # The connection from before the reload still works, both ways.
        fresh = RawOn(tls_connect(broker.tls_port, tls_context(pki.ca.cert)), "after-reload")
        fresh.publish("live/a", b"to the old one", qos=1, pid=1)
        m = old.next_publish()
        assert m["payload"] == b"to the old one"
        old.ack(PUBACK, m["pid"])
        old.publish("live/b", b"from the old one", qos=1, pid=2)
        m = old.next_publish()
        assert m["payload"] == b"from the old one"
        old.ack(PUBACK, m["pid"])

        # Broken: a truncated certificate; then a key that does not match the certificate.
        good_serial = serial_of(new[0])
        other = pki.new_server()
        for broken in ("truncated", "mismatch"):
            if broken == "truncated":
                with open(live[0], "w") as f:
                    f.write(open(other[0]).read()[:200])
            else:
                install((other[0], new[1]), live)
            failures = broker.read_log().count("tls.reload_failed")
            r = reload()
            if r is not None:
                code, out, err = r
                assert code != 0, (broken, r)
                assert (out + err).strip(), "no reason given"
            found = wait_log(broker, rf"tls\.reload_failed listener={re.escape(where)} "
                                     r"reason=(\S.*)", count=failures + 1)
            assert found[-1].strip(), broken
            assert served(broker.tls_port, pki.ca.cert)[0] == good_serial, broken
        old.publish("live/c", b"still", qos=1, pid=3)
        assert old.next_publish()["payload"] == b"still"
        old.disconnect()
        fresh.disconnect()
    finally:
        stop_ok(broker)


# ---- 4. rtctl listeners ----

def parse_time(v):
    if isinstance(v, (int, float)):
        return datetime.datetime.fromtimestamp(v, datetime.timezone.utc)
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d %H:%M:%S", "%b %d %H:%M:%S %Y GMT"):
        try:
            return datetime.datetime.strptime(v, fmt).replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            pass
    raise AssertionError(f"not a time: {v!r}")


def test_rtctl_listeners_shows_kinds_tls_and_expiry(pki):
    """`rtctl listeners` and --json: each listener's kind (tcp, tls, ws, wss, and proxy), its
    TLS settings, and the certificate's expiry (the same instant as openssl's notAfter)."""
    port, tls_port, ws_port, wss_port, proxy_port = (free_port() for _ in range(5))
    cert, key = pki.server["ec"]
    broker = Rtd(listeners(
        port,
        tls_listener(tls_port, cert, key, ca=pki.ca.cert, verify="required",
                     min_version="1.3"),
        {"bind": f"127.0.0.1:{ws_port}", "websocket": "/mqtt"},
        {"bind": f"127.0.0.1:{wss_port}", "websocket": "/mqtt",
         "tls": {"cert": pki.server["rsa"][0], "key": pki.server["rsa"][1]}},
        {"bind": f"127.0.0.1:{proxy_port}", "proxy_protocol": True,
         "trusted_proxies": ["127.0.0.0/8"]}), port=port)
    try:
        rows = {r["listener"]: r for r in broker.ctl_json("listeners")}
        assert set(rows) >= {f"127.0.0.1:{p}" for p in (port, tls_port, ws_port, wss_port,
                                                        proxy_port)}, rows
        kind = {p: rows[f"127.0.0.1:{p}"].get("kind") for p in (port, tls_port, ws_port,
                                                                wss_port, proxy_port)}
        assert kind[port] == "tcp" and kind[tls_port] == "tls", kind
        assert kind[ws_port] == "ws" and kind[wss_port] == "wss", kind
        def is_proxy(row):  # "tcp+proxy", or proxy_protocol: true beside kind tcp
            return row.get("proxy_protocol") is True or "proxy" in str(row.get("kind"))
        assert is_proxy(rows[f"127.0.0.1:{proxy_port}"]), rows[f"127.0.0.1:{proxy_port}"]
        assert not is_proxy(rows[f"127.0.0.1:{port}"]), rows[f"127.0.0.1:{port}"]
        t = rows[f"127.0.0.1:{tls_port}"]
        assert find_key(t, "verify") == "required" and find_key(t, "min_version") == "1.3", t
        assert find_key(t, "ca") == pki.ca.cert, t
        for lp, c in ((tls_port, cert), (wss_port, pki.server["rsa"][0])):
            na = find_key(rows[f"127.0.0.1:{lp}"], "not_after")
            assert na is not None, rows[f"127.0.0.1:{lp}"]
            want = parse_time(cert_field(c, "enddate"))
            assert parse_time(na) == want, (na, want)
        assert find_key(rows[f"127.0.0.1:{port}"], "not_after") is None

        # The text: one block a listener, "name value" lines (TLS settings indented).
        code, out, err = broker.ctl("listeners")
        assert code == 0, err
        blocks = {}
        for block in re.split(r"\n\s*\n", out.strip()):
            m = re.search(r"^listener\s+(\S+)", block, re.M)
            if m:
                blocks[m.group(1)] = block
        for lp, k in ((port, "tcp"), (tls_port, "tls"), (ws_port, "ws"), (wss_port, "wss")):
            block = blocks.get(f"127.0.0.1:{lp}", "")
            assert re.search(rf"^kind\s+{k}\s*$", block, re.M), (k, out)
        tls_block = blocks[f"127.0.0.1:{tls_port}"]
        assert re.search(r"^\s*not_after\s+" + re.escape(find_key(t, "not_after")), tls_block,
                         re.M), tls_block
        assert re.search(r"^\s*verify\s+required\s*$", tls_block, re.M), tls_block
        assert re.search(r"^proxy_protocol\s+true\s*$|^kind\s+\S*proxy",
                         blocks[f"127.0.0.1:{proxy_port}"], re.M), out
    finally:
        stop_ok(broker)


# ---- 5. hostile input ----

def client_hello():
    """The bytes of a real ClientHello (TLS 1.2-1.3), as Python's ssl would send."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def handshake_over_bio(port, ctx):
    """A TLS connection whose bytes this test writes itself: (plain socket, SSLObject, its
    incoming and outgoing BIOs) after a completed handshake."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="localhost")
    while True:
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            data = out.read()
            if data:
                s.sendall(data)
            chunk = s.recv(65536)
            assert chunk, "closed during the handshake"
            inc.write(chunk)
    data = out.read()
    if data:
        s.sendall(data)
    return s, obj, inc, out


class Pinger(threading.Thread):
    """A TLS client that publishes a QoS 1 message to itself every 20 ms and records each round
    trip, until stopped (at most 2,000 messages)."""

    def __init__(self, port, ca, client_id):
        super().__init__(daemon=True)
        self.c = RawOn(tls_connect(port, tls_context(ca)), client_id, version=4)
        assert self.c.subscribe(f"{client_id}/echo", 0).body[2:] == b"\x00"
        self.topic = f"{client_id}/echo"
        self.rtts, self.error = [], None
        self.stop_ev = threading.Event()

    def run(self):
        try:
            for i in range(2000):
                if self.stop_ev.is_set():
                    break
                t0 = time.monotonic()
                pid = 1 + i % 60000
                self.c.send((3 << 4) | 2, mqtt_str(self.topic) + u16(pid) + b"%d" % i)
                # Its PUBACK and the message itself, in either order.
                got = {self.c.read(10), self.c.read(10)}
                kinds = sorted((p.type, p.body[-len(b"%d" % i):] if p.type == 3 else p.body)
                               for p in got if p is not None)
                assert kinds == [(3, b"%d" % i), (PUBACK, u16(pid))], kinds
                self.rtts.append(time.monotonic() - t0)
                time.sleep(0.02)
        except Exception as e:  # reported by finish()
            self.error = e

    def finish(self, rounds=5):
        """Stops after at least rounds round trips (10 s at most); returns the round trips."""
        wait_for(lambda: len(self.rtts) >= rounds or self.error or not self.is_alive(), 10)
        self.stop_ev.set()
        self.join(30)
        assert not self.is_alive()
        assert self.error is None, self.error
        self.c.disconnect()
        return self.rtts


def test_plaintext_mqtt_to_the_tls_port(pki):
    """A plain MQTT CONNECT sent to the TLS port: no CONNACK, the connection is closed, the
    handshake failure is logged, and a TLS client meanwhile is unaffected."""
    broker = start(pki)
    try:
        pinger = Pinger(broker.tls_port, pki.ca.cert, "pt-pinger")
        pinger.start()
        s = socket.create_connection(("127.0.0.1", broker.tls_port), timeout=5)
        lport = s.getsockname()[1]
        s.sendall(connect_packet("plain"))
        s.settimeout(5)
        got = b""
        try:
            while chunk := s.recv(4096):
                got += chunk
                assert len(got) < 65536
        except ConnectionResetError:
            pass
        # At most a TLS alert record (type 21), never an MQTT CONNACK (0x20).
        assert not got or got[0] == 0x15, got
        s.close()
        assert handshake_failure(broker, lport)
        rtts = pinger.finish()
        assert len(rtts) >= 5
    finally:
        stop_ok(broker)


STALLED = 200
CONNECT_TIMEOUT = 2


def test_stalled_handshakes_are_cut_after_connect_timeout(pki):
    """200 connections that send half a ClientHello and wait are each closed after
    connect_timeout, each with a log line, while a TLS client goes on publishing and
    receiving: a stalled handshake holds nothing but its socket."""
    broker = start(pki, f"connect_timeout={CONNECT_TIMEOUT}")
    hello = client_hello()
    part = hello[:len(hello) // 2]
    socks, opened, closed_at, ports = [], {}, {}, {}
    sel = selectors.DefaultSelector()
    try:
        pinger = Pinger(broker.tls_port, pki.ca.cert, "stall-pinger")
        pinger.start()
        for i in range(STALLED):
            s = socket.create_connection(("127.0.0.1", broker.tls_port), timeout=5)
            s.sendall(part)
            s.setblocking(False)
            opened[s.fileno()] = time.monotonic()
            ports[s.fileno()] = s.getsockname()[1]
            socks.append(s)
            sel.register(s, selectors.EVENT_READ)
        # Bounded: every socket is closed by rtd, or 3 x connect_timeout passes.
        deadline = time.monotonic() + 3 * CONNECT_TIMEOUT + 5
        while len(closed_at) < STALLED and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.5):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except ConnectionResetError:
                    data = b""
                except BlockingIOError:
                    continue
                if not data:
                    closed_at[s.fileno()] = time.monotonic()
                    sel.unregister(s)
        assert len(closed_at) == STALLED, f"{len(closed_at)} of {STALLED} closed"
        waited = [closed_at[fd] - opened[fd] for fd in closed_at]
        # Lower bound: none is cut before connect_timeout (less 100 ms for a timer that counts
        # from accept, which comes a moment after our connect returned... never before it).
        # Upper bound: connect_timeout plus one second, for a timeout checked by a periodic
        # sweep at most a second apart, plus 1 s for 200 closes and log lines on a loaded
        # machine.
        assert min(waited) >= CONNECT_TIMEOUT - 0.1, sorted(waited)[:5]
        assert max(waited) <= CONNECT_TIMEOUT + 2.0, sorted(waited)[-5:]
        log = broker.read_log()
        logged = {int(p) for p in re.findall(
            r"tls\.handshake_failed peer=127\.0\.0\.1:(\d+) reason=\S*timeout", log)}
        assert set(ports.values()) <= logged, len(set(ports.values()) - logged)
        rtts = pinger.finish()
        # The TLS client was never held up behind the stalled handshakes: had one blocked a
        # scheduler, its round trip would have waited for the timeout.
        assert len(rtts) >= 20 and max(rtts) < CONNECT_TIMEOUT, (len(rtts), max(rtts))
    finally:
        for s in socks:
            s.close()
        sel.close()
        stop_ok(broker)


def test_handshake_without_connect_is_closed_after_connect_timeout(pki):
    """connect_timeout covers the whole start: a client that completes the TLS handshake and
    then sends nothing is closed after connect_timeout (2 s; not before, and within a second
    for a timer sweep plus a second of slack), with a log line naming it."""
    broker = start(pki, f"connect_timeout={CONNECT_TIMEOUT}")
    try:
        s = tls_connect(broker.tls_port, tls_context(pki.ca.cert), timeout=10)
        t0 = time.monotonic()
        lport = s.getsockname()[1]
        assert closed_or_reset(s, 10)
        waited = time.monotonic() - t0
        s.close()
        assert CONNECT_TIMEOUT - 0.1 <= waited <= CONNECT_TIMEOUT + 2.0, waited
        wait_log(broker, rf"timeout\S* peer=127\.0\.0\.1:{lport}\b|"
                         rf"peer=127\.0\.0\.1:{lport}\b.*timeout")
    finally:
        stop_ok(broker)


@pytest.mark.parametrize("garbage", ["bad_record", "not_mqtt"])
def test_garbage_after_the_handshake(pki, garbage):
    """After a completed handshake: a forged application-data record (its MAC cannot check)
    or well-formed TLS carrying bytes that are not MQTT. Each connection is closed and
    logged (a line naming its peer); another TLS client is unaffected."""
    broker = start(pki)
    try:
        pinger = Pinger(broker.tls_port, pki.ca.cert, f"g-pinger-{garbage}")
        pinger.start()
        s, obj, inc, out = handshake_over_bio(broker.tls_port, tls_context(pki.ca.cert))
        lport = s.getsockname()[1]
        if garbage == "bad_record":
            s.sendall(b"\x17\x03\x03\x00\x20" + bytes(range(32)))
        else:
            obj.write(b"\x00\xff\xff\xff\xff\x7fGET / HTTP/1.1\r\n\r\n")
            s.sendall(out.read())
        assert closed_or_reset(s, 5), "still open"
        s.close()
        wait_log(broker, rf"peer=127\.0\.0\.1:{lport}\b")
        rtts = pinger.finish()
        assert len(rtts) >= 5
    finally:
        stop_ok(broker)


def test_min_version_13_refuses_12(pki):
    """min_version="1.3": a TLS 1.2-only client is refused (logged); a 1.3 client gets in."""
    broker = start(pki, min_version="1.3")
    try:
        outcome, lport = try_handshake(broker.tls_port,
                                       tls_context(pki.ca.cert, version=ssl.TLSVersion.TLSv1_2))
        assert outcome[0] == "refused", outcome
        assert handshake_failure(broker, lport)
        outcome, _ = try_handshake(broker.tls_port,
                                   tls_context(pki.ca.cert, version=ssl.TLSVersion.TLSv1_3))
        assert outcome == ("connack", 0)
    finally:
        stop_ok(broker)


# ---- 6. testssl.sh ----

TESTSSL = "/usr/bin/testssl"


@pytest.mark.long
@pytest.mark.skipif(not os.access(TESTSSL, os.X_OK), reason="testssl.sh not installed")
def test_testssl_finds_no_old_protocols_or_weak_ciphers(pki, tmp_path):
    """testssl.sh against the TLS listener (RSA certificate, where the most suites could
    apply): SSLv2, SSLv3, TLS 1.0 and 1.1 not offered, TLS 1.2 and 1.3 offered, and none of the
    weak cipher categories (NULL, anonymous, export, LOW/DES/RC4, 3DES/IDEA) offered."""
    broker = start(pki, kind="rsa")
    report = tmp_path / "testssl.json"
    try:
        t0 = time.monotonic()
        p = subprocess.run([TESTSSL, "--protocols", "--std", "--quiet", "--fast", "--color", "0",
                            "--warnings", "off", "--jsonfile", str(report), "--ip", "127.0.0.1",
                            f"127.0.0.1:{broker.tls_port}"],
                           capture_output=True, text=True, timeout=300)
        took = time.monotonic() - t0
        assert report.exists(), (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
        found = {f["id"]: f for f in json.loads(report.read_text())}
    finally:
        stop_ok(broker)
    for proto in ("SSLv2", "SSLv3", "TLS1", "TLS1_1"):
        assert proto in found, (proto, sorted(found))
        assert found[proto]["finding"].startswith("not offered"), found[proto]
    for proto in ("TLS1_2", "TLS1_3"):
        assert found[proto]["finding"].startswith("offered"), found[proto]
    weak = [k for k in found if k.startswith("cipherlist_")]
    assert len(weak) >= 5, sorted(found)
    for k in weak:
        if k in ("cipherlist_STRONG", "cipherlist_AVERAGE", "cipherlist_STRONG_NOFS",
                 "cipherlist_STRONG_FS"):
            continue
        assert "not offered" in found[k]["finding"], found[k]
    assert took < 120, took
