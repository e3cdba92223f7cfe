"""Clients for rtd's transports, for tests that must see every byte: TLS sockets from
Python's ssl module, a raw WebSocket client (RFC 6455, written here so that tests can send
what real clients never do: unmasked frames, fragments, huge lengths), PROXY protocol headers
(v1 and v2), and RawOn, mqtt_raw's client over any of those sockets.

Real clients (mosquitto_pub/sub, paho, MQTT.js) cover the ordinary paths in the test files.
"""
import base64
import hashlib
import ipaddress
import os
import re
import socket
import ssl
import struct
import time

from conftest import wait_for
from mqtt_raw import CONNECT, Raw, mqtt_str, u16, varint

# ---- rtd configuration ----


LUA_KEYWORDS = {"and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto",
                "if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true",
                "until", "while"}


def lua_key(k):
    """A table key as Lua takes it: a name as it is, a keyword (bridges' "in") in brackets."""
    return k if k.isidentifier() and k not in LUA_KEYWORDS else f'["{k}"]'


def lua(v):
    """A Python value as a Lua literal (str, bool, int, list, dict)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "{" + ", ".join(lua(x) for x in v) + "}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{lua_key(k)}={lua(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def listeners(port, *extra):
    """The listeners= override: a plain listener on port first (Rtd's constructor waits for
    it), then each extra listener, given as a dict ({"bind": ..., "tls": {...}})."""
    return "listeners=" + lua([f"127.0.0.1:{port}", *extra])


def wait_log(broker, pattern, timeout=10.0, count=1):
    """Waits until the log holds count matches of the regular expression; returns them."""
    rx = re.compile(pattern)
    found = []

    def ok():
        found[:] = rx.findall(broker.read_log())
        return len(found) >= count
    assert wait_for(ok, timeout), (pattern, broker.read_log()[-3000:])
    return found


# ---- TLS ----


def tls_context(ca, cert=None, key=None, version=None, alpn=("mqtt",)):
    """A client context that verifies the server against ca (name: localhost); version
    pins one protocol version (ssl.TLSVersion)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    if version:
        ctx.minimum_version = version
        ctx.maximum_version = version
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


def tls_connect(port, ctx, session=None, server_hostname="localhost", timeout=5,
                source=None):
    """A TLS socket to 127.0.0.1:port after a completed handshake."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                   source_address=(source, 0) if source else None)
    try:
        return ctx.wrap_socket(raw, server_hostname=server_hostname, session=session)
    except BaseException:
        raw.close()
        raise


def closed_or_reset(sock, timeout=5.0):
    """Whether the peer ends the connection (EOF, reset, or a TLS alert) within timeout,
    reading and discarding anything before it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        sock.settimeout(max(0.01, deadline - time.time()))
        try:
            if not sock.recv(65536):
                return True
        except socket.timeout:
            return False
        except (ConnectionError, ssl.SSLError, OSError):
            return True
    return False


# ---- MQTT over any socket ----


class RawOn(Raw):
    """mqtt_raw.Raw over a socket that is already connected (TLS, a WebSocket, a socket that
    sent a PROXY header): anything with sendall, recv, settimeout and close."""

    def __init__(self, sock, client_id, **kw):
        super().__init__(None, client_id, sock=sock, **kw)


def find_key(obj, key):
    """The first value under key anywhere in a parsed JSON answer (None if none)."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            r = find_key(v, key)
            if r is not None:
                return r
    return None


def connect_packet(client_id, version=4, keepalive=60, username=None):
    flags = 0x02 | (0x80 if username is not None else 0)
    var = mqtt_str("MQTT") + bytes([version, flags]) + u16(keepalive)
    if version == 5:
        var += b"\x00"
    body = var + mqtt_str(client_id) + (mqtt_str(username) if username is not None else b"")
    return bytes([CONNECT << 4]) + varint(len(body)) + body


def publish_packet(topic, payload, version=4):
    body = mqtt_str(topic) + (b"\x00" if version == 5 else b"") + payload
    return bytes([0x30]) + varint(len(body)) + body


def subscribe_packet(topic_filter, qos=0, pid=1, version=4):
    body = u16(pid) + (b"\x00" if version == 5 else b"") + mqtt_str(topic_filter) + bytes([qos])
    return bytes([0x82]) + varint(len(body)) + body


# ---- WebSocket (RFC 6455) ----

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def ws_accept(key):
    return base64.b64encode(hashlib.sha1(key.encode() + WS_GUID).digest()).decode()


def frame(opcode, payload=b"", fin=True, mask=True, length=None, rsv=0):
    """A client frame; length overrides the length field (the payload is sent as given)."""
    n = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
    mbit = 0x80 if mask else 0
    if n < 126:
        head += bytes([mbit | n])
    elif n < 65536:
        head += bytes([mbit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([mbit | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class HttpAnswer:
    def __init__(self, status, headers, rest):
        self.status, self.headers, self.rest = status, headers, rest


def read_http_head(sock, timeout=5.0):
    """Reads an HTTP response head: HttpAnswer(status, {lower-case name: value}, bytes after
    the head)."""
    sock.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed before the end of the HTTP head: {buf!r}")
        buf += chunk
        assert len(buf) < 65536, buf[:200]
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return HttpAnswer(status, headers, rest)


def upgrade_request(path="/mqtt", key=None, version="13", protocol="mqtt", host="127.0.0.1",
                    extra=()):
    key = key if key is not None else base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket",
             "Connection: Upgrade", f"Sec-WebSocket-Key: {key}"]
    if version is not None:
        lines.append(f"Sec-WebSocket-Version: {version}")
    if protocol is not None:
        lines.append(f"Sec-WebSocket-Protocol: {protocol}")
    lines += list(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), key


class WebSocket:
    """A raw WebSocket client. After the upgrade, sendall() sends one masked binary frame and
    recv() returns binary payload bytes (control frames are kept in self.control), so that
    RawOn(WebSocket(...)) speaks MQTT over it."""

    def __init__(self, sock):
        self.sock = sock
        self.inbuf = b""      # raw bytes not yet parsed into frames
        self.data = b""       # binary payload not yet returned by recv
        self.control = []     # (opcode, payload) of control frames received
        self.frames = []      # (fin, opcode, len) of every frame received
        self.closed = False   # the TCP connection ended

    @classmethod
    def connect(cls, port, path="/mqtt", protocol="mqtt", tls=None, extra=(), source=None,
                timeout=5):
        """Opens and upgrades; tls: an ssl.SSLContext for wss."""
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                     source_address=(source, 0) if source else None)
        if tls:
            s = tls.wrap_socket(s, server_hostname="localhost")
        req, key = upgrade_request(path, protocol=protocol, extra=extra)
        s.sendall(req)
        ans = read_http_head(s, timeout)
        assert ans.status == 101, (ans.status, ans.headers)
        assert ans.headers.get("sec-websocket-accept") == ws_accept(key), ans.headers
        ws = cls(s)
        ws.inbuf = ans.rest
        ws.answer = ans
        return ws

    def settimeout(self, t):
        self.sock.settimeout(t)

    def send_frame(self, opcode, payload=b"", **kw):
        self.sock.sendall(frame(opcode, payload, **kw))

    def sendall(self, data):
        self.send_frame(OP_BINARY, data)

    def _parse(self):
        """One frame from inbuf, or None if it is incomplete."""
        b = self.inbuf
        if len(b) < 2:
            return None
        fin, op = b[0] >> 7, b[0] & 0x0F
        assert not b[1] & 0x80, "a server frame must not be masked"
        n, pos = b[1] & 0x7F, 2
        if n == 126:
            if len(b) < 4:
                return None
            n, pos = struct.unpack("!H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, pos = struct.unpack("!Q", b[2:10])[0], 10
        if len(b) < pos + n:
            return None
        self.inbuf = b[pos + n:]
        return fin, op, b[pos:pos + n]

    def read_frame(self, timeout=5.0):
        """The next frame (fin, opcode, payload); None on timeout; raises ConnectionError at
        EOF. Frames read here are not given to recv()."""
        deadline = time.time() + timeout
        while True:
            f = self._parse()
            if f is not None:
                self.frames.append((f[0], f[1], len(f[2])))
                return f
            if time.time() >= deadline:
                return None
            self.sock.settimeout(max(0.01, deadline - time.time()))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return None
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
                raise ConnectionError("closed by the broker")
            self.inbuf += chunk

    def recv(self, n):
        while not self.data:
            f = self.read_frame(self.sock.gettimeout() or 5.0)
            if f is None:
                raise socket.timeout("no frame")
            fin, op, payload = f
            if op in (OP_BINARY, OP_CONT):
                self.data += payload
            else:
                self.control.append((op, payload))
                if op == OP_CLOSE:
                    return b""
        out, self.data = self.data[:n], self.data[n:]
        return out

    def expect_close(self, timeout=5.0):
        """Reads until a close frame comes: its status code (None if it had none). Then
        checks that the broker also ends the TCP connection."""
        deadline = time.time() + timeout
        while True:
            f = self.read_frame(max(0.01, deadline - time.time()))
            assert f is not None, ("no close frame within", timeout, self.frames)
            if f[1] == OP_CLOSE:
                code = struct.unpack("!H", f[2][:2])[0] if len(f[2]) >= 2 else None
                self.close_code = code
                return code

    def tcp_closed(self, timeout=5.0):
        """Whether the broker closes the TCP connection within timeout (bytes before it are
        parsed as frames)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.read_frame(max(0.01, deadline - time.time())) is None:
                    return False
            except ConnectionError:
                return True
            except OSError:
                return True
        return False

    def close(self):
        self.sock.close()


# ---- PROXY protocol ----

V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def proxy_v1(src, sport, dst="127.0.0.1", dport=1883):
    fam = "TCP6" if ":" in src else "TCP4"
    return f"PROXY {fam} {src} {dst} {sport} {dport}\r\n".encode()


def proxy_v2(src, sport, dst="127.0.0.1", dport=1883, command=1, tlvs=b""):
    """A v2 header (PROXY command unless command=0, LOCAL) for TCP over IPv4 or IPv6."""
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    fam = 0x11 if s.version == 4 else 0x21
    addrs = s.packed + d.packed + struct.pack("!HH", sport, dport) + tlvs
    return V2_SIG + bytes([0x20 | command, fam]) + struct.pack("!H", len(addrs)) + addrs
