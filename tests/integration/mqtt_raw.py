"""A minimal MQTT client over a raw socket, for tests that must control every packet: hold
back acknowledgements, drop the connection mid-exchange, read DUP flags and properties.
Real clients (paho, mosquitto_*) cover the ordinary paths; this covers the protocol's corners.
"""
import socket
import struct
import time

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14

# MQTT 5 property identifiers used by the tests.
P_MESSAGE_EXPIRY = 0x02
P_SESSION_EXPIRY = 0x11
P_RECEIVE_MAXIMUM = 0x21


def varint(n):
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_varint(buf, pos):
    n, mult = 0, 1
    while True:
        b = buf[pos]
        pos += 1
        n += (b & 0x7F) * mult
        mult *= 128
        if not b & 0x80:
            return n, pos


def u16(v):
    return struct.pack("!H", v)


def mqtt_str(s):
    if isinstance(s, str):
        s = s.encode()
    return u16(len(s)) + s


def prop_u32(pid, v):
    return bytes([pid]) + struct.pack("!I", v)


def prop_u16(pid, v):
    return bytes([pid]) + u16(v)


def parse_props(buf):
    """Decodes the scalar properties the tests read into {id: value}."""
    props, pos = {}, 0
    while pos < len(buf):
        pid = buf[pos]
        pos += 1
        if pid in (0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A):
            props[pid] = buf[pos]
            pos += 1
        elif pid in (0x13, 0x21, 0x22, 0x23):
            props[pid] = struct.unpack("!H", buf[pos:pos + 2])[0]
            pos += 2
        elif pid in (0x02, 0x11, 0x18, 0x27):
            props[pid] = struct.unpack("!I", buf[pos:pos + 4])[0]
            pos += 4
        elif pid == 0x0B:
            v, pos = read_varint(buf, pos)
            props.setdefault(pid, []).append(v)
        elif pid == 0x26:
            for _ in range(2):
                n = struct.unpack("!H", buf[pos:pos + 2])[0]
                pos += 2 + n
        else:  # strings and binary data
            n = struct.unpack("!H", buf[pos:pos + 2])[0]
            props[pid] = bytes(buf[pos + 2:pos + 2 + n])
            pos += 2 + n
    return props


class Packet:
    def __init__(self, ptype, flags, body):
        self.type, self.flags, self.body = ptype, flags, body

    def __repr__(self):
        return f"Packet(type={self.type}, flags={self.flags:#x}, body={self.body!r})"


class Raw:
    def __init__(self, port, client_id, version=5, clean=True, keepalive=60, props=b"",
                 username=None, password=None, host="127.0.0.1", bind=None, sock=None):
        """Connects to host:port, or speaks over sock (a TLS or WebSocket socket already
        connected: anything with sendall, recv, settimeout and close), and sends CONNECT."""
        self.version = version
        self.sock = sock or socket.create_connection((host, port), timeout=5,
                                                     source_address=(bind, 0) if bind else None)
        self.buf = b""
        flags = (0x02 if clean else 0) | (0x80 if username is not None else 0) | \
                (0x40 if password is not None else 0)
        var = mqtt_str("MQTT") + bytes([version, flags]) + u16(keepalive)
        if version == 5:
            var += varint(len(props)) + props
        payload = mqtt_str(client_id)
        if username is not None:
            payload += mqtt_str(username)
        if password is not None:
            payload += mqtt_str(password)
        self.send(CONNECT << 4, var + payload)
        ack = self.read()
        assert ack is not None, "no CONNACK"
        assert ack.type == CONNACK, ack
        self.session_present = ack.body[0] & 1
        self.connack_code = ack.body[1]
        self.connack_props = {}
        if version == 5 and len(ack.body) > 2:
            n, pos = read_varint(ack.body, 2)
            self.connack_props = parse_props(ack.body[pos:pos + n])

    def send(self, first_byte, body):
        self.sock.sendall(bytes([first_byte]) + varint(len(body)) + body)

    def _fill(self, deadline):
        self.sock.settimeout(max(0.01, deadline - time.time()))
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the broker")
        self.buf += data

    def read(self, timeout=5.0):
        """The next packet, or None if none arrives within timeout."""
        deadline = time.time() + timeout
        while True:
            if len(self.buf) >= 2:
                try:
                    n, pos = read_varint(self.buf, 1)
                except IndexError:
                    n, pos = None, None
                if n is not None and len(self.buf) >= pos + n:
                    p = Packet(self.buf[0] >> 4, self.buf[0] & 0x0F, self.buf[pos:pos + n])
                    self.buf = self.buf[pos + n:]
                    return p
            if time.time() >= deadline:
                return None
            try:
                self._fill(deadline)
            except socket.timeout:
                return None

    def expect(self, ptype, timeout=5.0):
        p = self.read(timeout)
        assert p is not None, f"no packet of type {ptype}"
        assert p.type == ptype, p
        return p

    def publish_fields(self, p):
        """topic, packet id, payload, dup, qos, retain, properties of a PUBLISH."""
        qos = (p.flags >> 1) & 3
        n = struct.unpack("!H", p.body[:2])[0]
        topic = p.body[2:2 + n].decode()
        pos = 2 + n
        pid = None
        if qos:
            pid = struct.unpack("!H", p.body[pos:pos + 2])[0]
            pos += 2
        props = {}
        if self.version == 5:
            plen, pos2 = read_varint(p.body, pos)
            props = parse_props(p.body[pos2:pos2 + plen])
            pos = pos2 + plen
        return {"topic": topic, "pid": pid, "payload": p.body[pos:], "dup": (p.flags >> 3) & 1,
                "qos": qos, "retain": p.flags & 1, "props": props}

    def next_publish(self, timeout=5.0):
        p = self.read(timeout)
        if p is None:
            return None
        assert p.type == PUBLISH, p
        return self.publish_fields(p)

    def drain(self, timeout=0.5):
        """Every PUBLISH that arrives until the connection is quiet for timeout, each
        acknowledged as its QoS asks (QoS 2 through PUBCOMP)."""
        got = []
        while True:
            m = self.next_publish(timeout)
            if m is None:
                return got
            got.append(m)
            if m["qos"] == 1:
                self.ack(PUBACK, m["pid"])
            elif m["qos"] == 2:
                self.ack(PUBREC, m["pid"])
                self.expect(PUBREL)
                self.ack(PUBCOMP, m["pid"])

    def receive_all(self, quiet=0.5):
        """Every PUBLISH until the connection is quiet for `quiet` seconds, acknowledged as it
        comes, with no wait in between: a broker sends a window of messages, so a QoS 2
        message's PUBREL may come after later PUBLISHes (drain waits for it at once)."""
        got = []
        while (p := self.read(quiet)) is not None:
            if p.type == PUBREL:
                self.ack(PUBCOMP, struct.unpack("!H", p.body[:2])[0])
                continue
            assert p.type == PUBLISH, p
            m = self.publish_fields(p)
            got.append(m)
            if m["qos"]:
                self.ack(PUBACK if m["qos"] == 1 else PUBREC, m["pid"])
        return got

    def subscribe(self, topic_filter, qos=0, pid=1, props=b""):
        body = u16(pid)
        if self.version == 5:
            body += varint(len(props)) + props
        body += mqtt_str(topic_filter) + bytes([qos])
        self.send((SUBSCRIBE << 4) | 2, body)
        return self.expect(SUBACK)

    def publish(self, topic, payload, qos=0, pid=1, retain=False, props=b""):
        body = mqtt_str(topic)
        if qos:
            body += u16(pid)
        if self.version == 5:
            body += varint(len(props)) + props
        self.send((PUBLISH << 4) | (qos << 1) | (1 if retain else 0), body + payload)
        if qos == 1:
            self.expect(PUBACK)
        elif qos == 2:
            self.expect(PUBREC)
            self.send((PUBREL << 4) | 2, u16(pid))
            self.expect(PUBCOMP)

    def ack(self, ptype, pid):
        flags = 2 if ptype == PUBREL else 0
        self.send((ptype << 4) | flags, u16(pid))

    def disconnect(self, reason=0, props=b""):
        body = b""
        if self.version == 5:
            body = bytes([reason]) + varint(len(props)) + props
        self.send(DISCONNECT << 4, body)
        self.sock.close()

    def close(self):
        self.sock.close()
