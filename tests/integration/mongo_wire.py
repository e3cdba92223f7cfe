"""A minimal MongoDB OP_MSG client for tests: enough BSON to send a command and read its reply,
so a test can count and read documents (on rt_mongo_test or a real server) without a driver.
"""
import socket
import struct

OP_MSG = 2013


class Int64(int):
    """An int always encoded as BSON int64 (cursor ids must be)."""


def _cstring(s):
    return s.encode() + b"\0"


def encode(doc):
    """BSON of a dict whose values are str, bool, int, float, None, dict or list."""
    out = bytearray()
    for k, v in doc.items():
        key = _cstring(k)
        if isinstance(v, bool):
            out += b"\x08" + key + (b"\x01" if v else b"\x00")
        elif isinstance(v, Int64):
            out += b"\x12" + key + struct.pack("<q", v)
        elif isinstance(v, int):
            out += (b"\x10" + key + struct.pack("<i", v)) if -2**31 <= v < 2**31 else \
                (b"\x12" + key + struct.pack("<q", v))
        elif isinstance(v, float):
            out += b"\x01" + key + struct.pack("<d", v)
        elif isinstance(v, str):
            b = v.encode()
            out += b"\x02" + key + struct.pack("<i", len(b) + 1) + b + b"\0"
        elif v is None:
            out += b"\x0a" + key
        elif isinstance(v, dict):
            out += b"\x03" + key + encode(v)
        elif isinstance(v, list):
            out += b"\x04" + key + encode({str(i): x for i, x in enumerate(v)})
        else:
            raise TypeError(type(v))
    return struct.pack("<i", len(out) + 5) + bytes(out) + b"\0"


def decode(buf, pos=0):
    """The BSON document at buf[pos:] as a dict (arrays as lists, ObjectIds as bytes)."""
    (n,) = struct.unpack_from("<i", buf, pos)
    end, pos, doc = pos + n - 1, pos + 4, {}
    while pos < end:
        t = buf[pos]
        z = buf.index(b"\0", pos + 1)
        key, pos = buf[pos + 1:z].decode(), z + 1
        if t == 0x01:
            v, pos = struct.unpack_from("<d", buf, pos)[0], pos + 8
        elif t in (0x02, 0x0D, 0x0E):
            (ln,) = struct.unpack_from("<i", buf, pos)
            v, pos = buf[pos + 4:pos + 3 + ln].decode(), pos + 4 + ln
        elif t in (0x03, 0x04):
            (ln,) = struct.unpack_from("<i", buf, pos)
            v = decode(buf, pos)
            if t == 0x04:
                v = [v[k] for k in sorted(v, key=int)]
            pos += ln
        elif t == 0x05:
            (ln,) = struct.unpack_from("<i", buf, pos)
            v, pos = bytes(buf[pos + 5:pos + 5 + ln]), pos + 5 + ln
        elif t == 0x07:
            v, pos = bytes(buf[pos:pos + 12]), pos + 12
        elif t == 0x08:
            v, pos = buf[pos] == 1, pos + 1
        elif t in (0x09, 0x11, 0x12):
            v, pos = struct.unpack_from("<q", buf, pos)[0], pos + 8
        elif t == 0x0A:
            v = None
        elif t == 0x10:
            v, pos = struct.unpack_from("<i", buf, pos)[0], pos + 4
        else:
            raise ValueError(f"BSON type {t:#x} not handled")
        doc[key] = v
    return doc


class Mongo:
    def __init__(self, host, port, timeout=5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.req = 0

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the server")
            buf += chunk
        return buf

    def command(self, db, cmd):
        """Runs cmd (a dict; its first key is the command) on db and returns the reply."""
        self.req += 1
        body = struct.pack("<I", 0) + b"\0" + encode(dict(cmd, **{"$db": db}))
        self.sock.sendall(struct.pack("<iiii", 16 + len(body), self.req, 0, OP_MSG) + body)
        (length,) = struct.unpack("<i", self._recv(4))
        msg = self._recv(length - 4)
        assert struct.unpack_from("<i", msg, 8)[0] == OP_MSG, msg[:16]
        return decode(msg, 12 + 4 + 1)

    def find_all(self, db, coll, flt=None):
        """Every document matching flt, in the server's natural order."""
        r = self.command(db, {"find": coll, "filter": flt or {}, "batchSize": 100000})
        assert r.get("ok") == 1, r
        docs = list(r["cursor"]["firstBatch"])
        cid = r["cursor"]["id"]
        for _ in range(10000):
            if not cid:
                break
            r = self.command(db, {"getMore": Int64(cid), "collection": coll, "batchSize": 100000})
            assert r.get("ok") == 1, r
            docs += r["cursor"]["nextBatch"]
            cid = r["cursor"]["id"]
        return docs

    def count(self, db, coll):
        r = self.command(db, {"count": coll, "query": {}})
        assert r.get("ok") == 1, r
        return int(r["n"])

    def close(self):
        self.sock.close()
