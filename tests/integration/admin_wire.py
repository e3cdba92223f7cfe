"""The admin socket's wire protocol (docs/ADMIN.md), spoken directly: for tests of the server
itself, where rtctl would hide what went over the socket."""
import json
import socket


def quote(word):
    if isinstance(word, str):
        word = word.encode()
    out = bytearray(b'"')
    for b in word:
        if b in (0x22, 0x5C):
            out += b"\\" + bytes([b])
        elif b < 0x20 or b >= 0x7F:
            out += b"\\x%02x" % b
        else:
            out.append(b)
    return bytes(out + b'"')


class Admin:
    """One connection to rtd's admin socket; requests go one after another on it."""

    def __init__(self, path, timeout=30):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def close(self):
        self.sock.close()

    def send_raw(self, data):
        self.sock.sendall(data)

    def _read_exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("admin socket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self):
        """(code, body bytes); checks the status line's form and the body's length."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("admin socket closed")
            self.buf += chunk
        head, self.buf = self.buf.split(b"\n", 1)
        parts = head.split(b" ")
        assert len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit(), head
        return int(parts[0]), self._read_exact(int(parts[1]))

    def ask(self, *words, as_json=False):
        line = b" ".join(quote(w) for w in words)
        if as_json:
            line += b" --json"
        self.send_raw(line + b"\n")
        code, body = self.read_response()
        return code, (json.loads(body) if as_json else body.decode())


def admin_path(rtd):
    return rtd.admin_socket
