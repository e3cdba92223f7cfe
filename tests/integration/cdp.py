"""A headless Chromium driven over the DevTools protocol (CDP), with the standard library
only: the browser in its own process group (so the test ends it and every child it started,
and nothing else), and the minimal WebSocket client CDP needs (RFC 6455: masked text frames
out; text, continuation, ping and close frames in)."""
import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

CHROMIUM = "/usr/bin/chromium"


class WebSocket:
    def __init__(self, url, timeout=10):
        assert url.startswith("ws://")
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the WebSocket handshake was cut")
            head += chunk
        head, _, self.buf = head.partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise ConnectionError(head.decode(errors="replace"))

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the WebSocket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send(self, opcode, data):
        mask = os.urandom(4)
        n = len(data)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def send(self, text):
        self._send(0x1, text.encode())

    def recv(self, timeout):
        """One whole text message, or None when none came within timeout seconds."""
        self.sock.settimeout(timeout)
        message = b""
        try:
            while True:
                b0, b1 = self._read(2)
                n = b1 & 0x7F
                if n == 126:
                    n = struct.unpack(">H", self._read(2))[0]
                elif n == 127:
                    n = struct.unpack(">Q", self._read(8))[0]
                data = self._read(n)  # a server does not mask
                opcode = b0 & 0x0F
                if opcode == 0x9:
                    self._send(0xA, data)
                elif opcode == 0x8:
                    raise ConnectionError("the WebSocket closed")
                elif opcode in (0x0, 0x1):
                    message += data
                    if b0 & 0x80:
                        return message.decode()
        except socket.timeout:
            return None

    def close(self):
        self.sock.close()


class Browser:
    """Chromium with one page; call() sends a CDP command and returns its result, keeping the
    events that came meanwhile in self.events."""

    def __init__(self, timeout=15):
        self.profile = tempfile.mkdtemp(prefix="rt-chromium-")
        # --no-sandbox: the tests may run as root, where Chromium's sandbox refuses to start.
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.ws = None
        try:
            port_file = os.path.join(self.profile, "DevToolsActivePort")
            deadline = time.monotonic() + timeout
            while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.05)
            port = int(open(port_file).read().split("\n")[0])
            while True:
                pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                                         timeout=5))
                pages = [p for p in pages if p["type"] == "page"]
                if pages:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("chromium opened no page")
                time.sleep(0.05)
            self.ws = WebSocket(pages[0]["webSocketDebuggerUrl"])
        except BaseException:
            self.close()
            raise
        self.next_id = 0
        self.events = []

    def call(self, method, timeout=15, **params):
        self.next_id += 1
        me = self.next_id
        self.ws.send(json.dumps({"id": me, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            raw = self.ws.recv(max(0.01, deadline - time.monotonic()))
            if raw is None:
                break
            m = json.loads(raw)
            if m.get("id") == me:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]
            if "method" in m:
                self.events.append(m)
        raise TimeoutError(f"{method}: no answer in {timeout} s")

    def pump(self, seconds):
        """Collects events for a while (they come only while someone reads)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            raw = self.ws.recv(max(0.01, deadline - time.monotonic()))
            if raw is None:
                return
            m = json.loads(raw)
            if "method" in m:
                self.events.append(m)

    def eval(self, expression, timeout=15):
        """The value of a JavaScript expression (awaited if it is a promise)."""
        r = self.call("Runtime.evaluate", timeout=timeout, expression=expression,
                      returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_eval(self, expression, timeout=10, interval=0.2):
        """Polls an expression until it is truthy: its value, or None after timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = self.eval(expression)
            if v:
                return v
            time.sleep(interval)
        return None

    def navigate(self, url, timeout=15):
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired", timeout)

    def reload(self, timeout=15):
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        self.call("Page.reload", ignoreCache=True)
        self.wait_event("Page.loadEventFired", timeout)

    def wait_event(self, method, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e["method"] == method for e in self.events):
                return
            self.pump(0.1)
        raise TimeoutError(f"no {method} in {timeout} s")

    def screenshot(self, path, width, height, mobile=False, scale=1, full=False, at=None):
        """A PNG of the page at width x height (full: as tall as the whole page; at: a CSS
        selector, scrolled to the top of the screen first)."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=scale, mobile=mobile)
        if full:
            height = max(height, self.eval("document.documentElement.scrollHeight"))
            self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                      deviceScaleFactor=scale, mobile=mobile)
        self.pump(0.5)  # the page redraws its charts on resize
        if at:
            self.eval(f"document.querySelector({json.dumps(at)}).scrollIntoView()")
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def errors(self):
        """What the page reported as wrong: exceptions, console errors, logged errors."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(p["exceptionDetails"])
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error",
                                                                                 "assert"):
                out.append(p)
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(p["entry"])
        return out

    def close(self):
        if self.ws:
            self.ws.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # chromium and its children
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)
