"""HTTP file upload (XEP-0363) on a real rtd: slixmpp's xep_0363 plugin finds the service,
asks for a slot and PUTs the file with aiohttp, as a client would; then what the XEP and a
careful operator ask of the service, with a raw stream and raw HTTP: the bounds (size, quota,
the slot's time), every refused PUT (another size, type or name, twice, chunked, no slot, a
path that climbs), what a GET is served with (its type, a sandbox, CORS for web clients), a
body written to its file as it comes rather than held, expiry, and a configuration that could
not serve refused at start.
"""
import hashlib
import http.client
import io
import os
import re
import socket
import time
import urllib.parse

import pytest

import xmpp_util as X
from conftest import Rtd, free_port, wait_for
from test_xmpp_muc import C, PW, Client, show

pytestmark = pytest.mark.rtd_only("the upload service is rtd's own (its settings and files)")

NS_UPLOAD = "urn:xmpp:http:upload:0"
NS_STANZAS = "{urn:ietf:params:xml:ns:xmpp-stanzas}"
MAX = 10 * 1024 * 1024
QUOTA = 12 * 1024 * 1024
STALL = 2  # http.request_timeout: what a body may pause for
USERS = "sli raw quota big slow late gone".split()


class Server:
    def __init__(self, data_dir, settings=""):
        X.add_users(str(data_dir), [(f"{u}@localhost", PW) for u in USERS])
        self.xport, self.hport = free_port(), free_port()
        self.rtd = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{self.xport}" }}'
                       f', upload_host = "upload.@HOST@", upload_max_size = {MAX}'
                       f', upload_quota = {QUOTA}{settings} }}',
                       f'http={{ bind = "127.0.0.1:{self.hport}", request_timeout = {STALL} }}',
                       "auth_max_delay_ms=0",
                       data_dir=str(data_dir))

    def stop(self):
        code, log = self.rtd.stop()
        assert code == 0, log[-3000:]
        return log


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("upload"))
    yield s
    s.stop()


def slot(c, name, size, ctype=None):
    """The answer to a slot request (an iq result or error)."""
    attrs = f"filename='{name}' size='{size}'" + (f" content-type='{ctype}'" if ctype else "")
    return c.iq("get", "upload.localhost", f"<request xmlns='{NS_UPLOAD}' {attrs}/>")


def urls(ans):
    s = ans.find(f"{{{NS_UPLOAD}}}slot")
    assert ans.get("type") == "result" and s is not None, show([ans])
    return s.find(f"{{{NS_UPLOAD}}}put").get("url"), s.find(f"{{{NS_UPLOAD}}}get").get("url")


def condition(ans):
    err = ans.find(C + "error")
    assert ans.get("type") == "error" and err is not None, show([ans])
    names = [c.tag.replace(NS_STANZAS, "") for c in err if c.tag.startswith(NS_STANZAS)]
    return err.get("type"), [n for n in names if n != "text"][0], err


def request(url, method="GET", body=None, headers=None):
    """(status, headers, body) of one request on its own connection."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection("127.0.0.1", u.port, timeout=X.TIMEOUT)
    conn.request(method, u.path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def test_slixmpp_uploads_and_the_file_is_served(server):
    """slixmpp's xep_0363: disco finds upload.localhost (the host's items, then its info with
    max-file-size), the slot comes, the PUT is taken (aiohttp); the GET URL serves the same
    bytes with the slot's type, shown inline (an image), in a sandbox, readable by any page."""
    payload = os.urandom(200_000)

    async def t():
        c = await X.login(server.xport, "sli@localhost/r", PW, plugins=["xep_0363"])
        # The disco a client does, with xep_0030 (1.8.3's find_upload_service hands
        # asyncio.wait coroutines, which Python 3.11 refuses): the host's items, their info.
        items = await c.plugin["xep_0030"].get_items(jid="localhost")
        services = [i[0] for i in items["disco_items"]["items"]]
        assert "upload.localhost" in services, services
        info = await c.plugin["xep_0030"].get_info(jid="upload.localhost")
        assert NS_UPLOAD in info["disco_info"]["features"]
        form = [f for f in info["disco_info"].iterables
                if f["values"].get("FORM_TYPE") == [NS_UPLOAD]][0]
        assert int(form["values"]["max-file-size"]) == MAX
        up = c.plugin["xep_0363"]
        up.upload_service = "upload.localhost"
        url = await up.upload_file("pic of the day.png", size=len(payload),
                                   content_type="image/png", input_file=io.BytesIO(payload))
        await X.logout(c)
        return url

    url = X.run(t())
    assert url.startswith(f"http://localhost:{server.hport}/upload/") and \
        url.endswith("/pic%20of%20the%20day.png"), url
    status, headers, body = request(url)
    assert status == 200 and body == payload
    assert headers["content-type"] == "image/png"
    assert headers["content-disposition"].startswith("inline;")
    assert "sandbox" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["access-control-allow-origin"] == "*"
    status, headers, body = request(url, "HEAD")
    assert status == 200 and body == b"" and headers["content-length"] == str(len(payload))


def test_bounds_and_refused_puts(server):
    """A slot too large is refused with file-too-large naming the bound; a bad name or size is
    bad-request. Each PUT that does not fit its slot is refused and leaves the slot open: another
    size (400), another type (415), chunked (411), another name or no such slot (404), a name
    that climbs out of its folder (404); the right one is taken (201), a second is 409, and a
    page's preflight is answered for the PUT."""
    c = Client(server.xport, "raw")
    kind, cond, err = condition(slot(c, "big.bin", MAX + 1))
    assert (kind, cond) == ("modify", "not-acceptable")
    assert err.find(f"{{{NS_UPLOAD}}}file-too-large/{{{NS_UPLOAD}}}max-file-size").text == str(MAX)
    for name, size in (("a/b", 1), ("..", 1), ("x", 0), ("x", -1), ("x", "many")):
        assert condition(slot(c, name, size))[:2] == ("modify", "bad-request"), (name, size)
    put, get = urls(slot(c, "notes.txt", 5, "text/plain"))
    assert put == get
    assert request(get)[0] == 404  # nothing to serve before its PUT
    status, headers, _ = request(put, "OPTIONS", headers={"Origin": "https://web.example",
                                                          "Access-Control-Request-Method": "PUT"})
    assert status == 200 and "PUT" in headers["access-control-allow-methods"]
    assert request(put, "PUT", b"hello!", {"Content-Type": "text/plain"})[0] == 400
    assert request(put, "PUT", b"hello", {"Content-Type": "text/html"})[0] == 415
    u = urllib.parse.urlsplit(put)
    for path in (u.path.rsplit("/", 1)[0] + "/other.txt",
                 u.path.rsplit("/", 2)[0] + "/" + "0" * 32 + "/notes.txt",
                 u.path.rsplit("/", 1)[0] + "/..%2F..%2F.key"):
        assert request(f"http://127.0.0.1:{u.port}{path}", "PUT", b"hello",
                       {"Content-Type": "text/plain"})[0] == 404, path
    conn = http.client.HTTPConnection("127.0.0.1", u.port, timeout=X.TIMEOUT)
    conn.putrequest("PUT", u.path)
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"5\r\nhello\r\n0\r\n\r\n")
    assert conn.getresponse().status == 411
    conn.close()
    status, headers, _ = request(put, "PUT", b"hello", {"Content-Type": "text/plain"})
    assert status == 201 and headers["access-control-allow-origin"] == "*"
    assert request(put, "PUT", b"hello", {"Content-Type": "text/plain"})[0] == 409
    status, headers, body = request(get)
    assert (status, body) == (200, b"hello")
    assert headers["content-type"] == "text/plain"
    c.close()


def test_metrics_count_slots_files_and_gets(server):
    """Each slot, refusal, file kept (and its bytes) and file served is counted in /metrics."""
    names = ["slots", "refused", "stored", "stored_bytes", "served"]
    before = {n: X.metric(server.rtd, f"rt_xmpp_upload_{n}_total") for n in names}
    c = Client(server.xport, "raw")
    condition(slot(c, "huge.bin", MAX + 1))
    put, get = urls(slot(c, "counted.bin", 1000))
    assert request(put, "PUT", b"x" * 1000)[0] == 201
    assert request(get)[0] == 200
    after = {n: X.metric(server.rtd, f"rt_xmpp_upload_{n}_total") for n in names}
    assert {n: after[n] - before[n] for n in names} == \
        {"slots": 1, "refused": 1, "stored": 1, "stored_bytes": 1000, "served": 1}
    c.close()


def test_html_is_a_download(server):
    """A page uploaded as text/html is not shown by the origin the dashboard is served from: it
    comes as an attachment, sandboxed, never sniffed."""
    c = Client(server.xport, "raw")
    page = b"<script>alert('x')</script>\n"
    put, get = urls(slot(c, "page.html", len(page), "text/html"))
    assert request(put, "PUT", page, {"Content-Type": "text/html"})[0] == 201
    status, headers, _ = request(get)
    assert status == 200 and headers["content-disposition"].startswith("attachment;")
    assert "sandbox" in headers["content-security-policy"]
    c.close()


def test_quota_counts_open_slots(server):
    """xmpp.upload_quota holds the user's files and its open slots: a slot takes its place
    before its PUT, so two slots cannot together pass it; the error says how much is in use."""
    c = Client(server.xport, "quota")
    urls(slot(c, "one.bin", 7 * 1024 * 1024))
    kind, cond, err = condition(slot(c, "two.bin", 6 * 1024 * 1024))
    assert (kind, cond) == ("wait", "resource-constraint")
    assert str(7 * 1024 * 1024) in err.find(NS_STANZAS + "text").text
    urls(slot(c, "three.bin", 5 * 1024 * 1024))
    c.close()


def test_body_goes_to_the_file_as_it_comes(server):
    """A PUT's body is written to its file as it arrives, not gathered in memory: with half of
    an 8 MiB body sent, half is on disk (the slot's file is sparse until written); the rest
    makes it whole, and the GET serves it back (in pieces, as the socket takes them)."""
    size = 8 * 1024 * 1024
    payload = os.urandom(size)
    c = Client(server.xport, "big")
    put, get = urls(slot(c, "big.bin", size))
    u = urllib.parse.urlsplit(put)
    user, slot_id = u.path.split("/")[2:4]
    part = os.path.join(server.rtd.data_dir, "upload", user, slot_id + ".part")

    def on_disk():
        try:
            return os.stat(part).st_blocks * 512
        except FileNotFoundError:
            return 0

    conn = http.client.HTTPConnection("127.0.0.1", u.port, timeout=X.TIMEOUT)
    conn.putrequest("PUT", u.path)
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    conn.send(payload[:size // 2])
    assert wait_for(lambda: on_disk() >= size // 2, X.TIMEOUT), on_disk()
    conn.send(payload[size // 2:])
    assert conn.getresponse().status == 201
    conn.close()
    status, _, body = request(get)
    assert status == 200 and hashlib.sha256(body).digest() == hashlib.sha256(payload).digest()
    c.close()


def test_a_stalled_put_is_cut_and_the_slot_stays(server):
    """A PUT whose body stops coming is cut once it has paused http.request_timeout (408); the
    slot stays open, so the client may try again within its time."""
    c = Client(server.xport, "slow")
    put, get = urls(slot(c, "slow.txt", 10))
    u = urllib.parse.urlsplit(put)
    s = socket.create_connection(("127.0.0.1", u.port), timeout=30)
    s.sendall(f"PUT {u.path} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc".encode())
    answer = b""
    while not answer.endswith(b"}\n") and b"408" not in answer:
        more = s.recv(4096)
        if not more:
            break
        answer += more
    s.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert request(put, "PUT", b"0123456789")[0] == 201
    assert request(get)[2] == b"0123456789"
    c.close()


def test_a_deleted_account_takes_its_files(server):
    """`rtctl xmpp user del` (as a cancelled registration) deletes the account's uploads, as
    ejabberd's rm_on_unregister does; another user's stay."""
    c = Client(server.xport, "gone")
    put, get = urls(slot(c, "mine.txt", 4))
    assert request(put, "PUT", b"mine")[0] == 201
    other = Client(server.xport, "raw")
    oput, oget = urls(slot(other, "theirs.txt", 6))
    assert request(oput, "PUT", b"theirs")[0] == 201
    code, out, err = server.rtd.ctl("xmpp", "user", "del", "gone@localhost")
    assert code == 0, err
    assert wait_for(lambda: re.search(r"xmpp\.upload_forgotten user=gone@localhost files=1",
                                      server.rtd.read_log()), X.TIMEOUT)
    assert request(get)[0] == 404
    assert request(oget)[2] == b"theirs"
    c.close()
    other.close()


def test_a_trickle_is_cut(server):
    """Bytes that keep coming, but fewer than 16 KiB each http.request_timeout, do not hold the
    connection: the PUT is cut (408) within a couple of those windows."""
    c = Client(server.xport, "slow")
    put, _ = urls(slot(c, "trickle.bin", 1 << 20))
    u = urllib.parse.urlsplit(put)
    s = socket.create_connection(("127.0.0.1", u.port), timeout=30)
    s.sendall(f"PUT {u.path} HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 20}\r\n\r\n".encode())
    s.setblocking(False)
    answer, deadline = b"", time.monotonic() + 5 * STALL
    while b"\r\n\r\n" not in answer and time.monotonic() < deadline:
        try:
            s.send(b"x" * 256)  # 256 bytes every 0.1 s: 5 KiB a window of 2 s
        except (BrokenPipeError, ConnectionResetError, BlockingIOError):
            pass
        time.sleep(0.1)
        try:
            answer += s.recv(4096)
        except BlockingIOError:
            pass
        except ConnectionResetError:
            break
    s.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    c.close()


@pytest.fixture
def short_lived(tmp_path):
    s = Server(tmp_path, ", upload_expire = 2, upload_slot_timeout = 1")
    yield s
    s.stop()


def test_slot_time_and_expiry(short_lived):
    """A PUT after xmpp.upload_slot_timeout is refused (403); an uploaded file is deleted once
    xmpp.upload_expire has passed (the sweep logs it) and is then 404."""
    c = Client(short_lived.xport, "late")
    late_put, _ = urls(slot(c, "late.txt", 2))
    put, get = urls(slot(c, "soon.txt", 4))
    assert request(put, "PUT", b"soon")[0] == 201
    # A PUT of another size is refused (400) while the slot is open, 403 once its time is
    # over (whole seconds from its making: within 2 s of it), which a PUT that fits gets too.
    assert wait_for(lambda: request(late_put, "PUT", b"not")[0] == 403, 5)
    assert request(late_put, "PUT", b"no")[0] == 403
    assert request(get)[0] == 200
    # Swept within a quarter of its time (1 s here) after it expires.
    assert wait_for(lambda: re.search(r"xmpp\.upload_expired files=[1-9]",
                                      short_lived.rtd.read_log()), 10)
    assert wait_for(lambda: request(get)[0] == 404, 5)
    assert X.metric(short_lived.rtd, "rt_xmpp_upload_expired_total") >= 1
    c.close()


def test_upload_needs_the_http_listener(tmp_path):
    """A service that could hand out slots nobody can PUT to is refused at start, saying why."""
    with pytest.raises(RuntimeError, match="upload_host.*http listener"):
        Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{free_port()}" }}'
            ', upload_host = "upload.@HOST@" }', data_dir=str(tmp_path))
