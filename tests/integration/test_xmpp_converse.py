"""A web XMPP client in a real browser: converse.js 14 (npm, tests/node) in headless Chromium
logs in to rtd over WebSocket (RFC 7395), joins a group chat room and uploads a file into it
(XEP-0363): the upload service found through the host's disco, the slot asked for, the PUT
made from the page's own origin (CORS and its preflight), the file's URL said in the room. A
raw occupant of the room sees the page join and gets the URL, whose GET serves the bytes the
page uploaded.
"""
import functools
import http.server
import os
import threading
import urllib.request

import pytest

import xmpp_util as X
from cdp import CHROMIUM, Browser
from conftest import ROOT, Rtd, free_port
from test_xmpp_muc import C, PW, Client, presence_from

pytestmark = [pytest.mark.rtd_only("a browser against rtd's own WebSocket and HTTP listeners"),
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason="chromium is not installed (tools/install-deps.sh)")]

DIST = os.path.join(ROOT, "tests", "node", "node_modules", "converse.js", "dist")
ROOM = "web@conference.localhost"
WS_PATH = "/xmpp-websocket"

PAGE = """<!doctype html>
<html><head><meta charset="utf-8">
<link rel="stylesheet" href="/dist/converse.min.css">
<script type="module" src="/dist/converse.min.js"></script></head>
<body><script type="module">
converse.plugins.add('rt-test', { initialize () { window.rt = this._converse; } });
converse.initialize({
  assets_path: '/dist/', websocket_url: '%(ws)s', discover_connection_methods: false,
  jid: 'webuser@localhost', password: '%(pw)s', auto_login: true,
  whitelisted_plugins: ['rt-test'], view_mode: 'fullscreen', loglevel: 'warn',
  auto_join_rooms: ['%(room)s'], nickname: 'webuser', muc_instant_rooms: true,
  persistent_store: 'sessionStorage', play_sounds: false, show_controlbox_by_default: false,
});
</script></body></html>
"""


@pytest.fixture
def served(tmp_path):
    """rtd with XMPP over WebSocket, a MUC service and the upload service on its http
    listener; and the page, from a server of its own (another origin than rtd's)."""
    if not os.path.exists(os.path.join(DIST, "converse.min.js")):
        pytest.fail("converse.js is not installed: npm ci --prefix tests/node")
    X.add_users(str(tmp_path), [(f"{u}@localhost", PW) for u in ("webuser", "watcher")])
    xport, wsport, hport = free_port(), free_port(), free_port()
    rtd = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{xport}", '
              f'{{ bind = "127.0.0.1:{wsport}", websocket = "{WS_PATH}" }} }}, '
              f'muc_host = "conference.@HOST@", upload_host = "upload.@HOST@" }}',
              f'http={{ bind = "127.0.0.1:{hport}" }}', "auth_max_delay_ms=0",
              data_dir=str(tmp_path))
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(PAGE % {"ws": f"ws://127.0.0.1:{wsport}{WS_PATH}",
                                             "pw": PW, "room": ROOM})
    os.symlink(DIST, site / "dist")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    pages = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=pages.serve_forever, daemon=True).start()
    rtd.xport, rtd.hport, rtd.page = xport, hport, f"http://127.0.0.1:{pages.server_port}/"
    yield rtd
    pages.shutdown()
    pages.server_close()
    code, log = rtd.stop()
    assert code == 0, log[-3000:]


def test_converse_joins_a_room_and_uploads(served):
    watcher = Client(served.xport, "watcher")
    # The watcher makes the room (an instant room: open at once) before the page comes.
    watcher.send(f"<presence to='{ROOM}/watcher'><x xmlns='http://jabber.org/protocol/muc'/>"
                 "</presence>")
    watcher.wait(presence_from(f"{ROOM}/watcher"), "the watcher's own presence")
    ans = watcher.iq("set", ROOM, "<query xmlns='http://jabber.org/protocol/muc#owner'>"
                                  "<x xmlns='jabber:x:data' type='submit'/></query>")
    assert ans.get("type") == "result"
    b = Browser()
    try:
        for domain in ("Page", "Runtime", "Log"):
            b.call(f"{domain}.enable")
        b.navigate(served.page)
        # Logged in over the WebSocket listener (the only one the page was given).
        assert b.wait_eval("window.rt && window.rt.api.connection.connected()", X.TIMEOUT), \
            b.errors()
        watcher.wait(presence_from(f"{ROOM}/webuser"), "the page's join", timeout=X.TIMEOUT * 2)
        assert b.wait_eval(f"window.rt.api.rooms.get('{ROOM}').then(m => m && "
                           "m.session.get('connection_status') === 5)", X.TIMEOUT), b.errors()
        payload = "uploaded from a browser, " + os.urandom(8).hex()
        b.eval(f"window.rt.api.rooms.get('{ROOM}').then(m => m.sendFiles([new File("
               f"[{payload!r}], 'from the page.txt', {{type: 'text/plain'}})]))")
        said = watcher.wait(lambda s: s.tag == C + "message" and s.get("type") == "groupchat"
                            and s.get("from") == f"{ROOM}/webuser"
                            and "/upload/" in (s.findtext(C + "body") or ""),
                            "the upload's URL in the room", timeout=X.TIMEOUT * 2)
        url = said.findtext(C + "body").strip()
        assert url.startswith(f"http://localhost:{served.hport}/upload/"), url
        assert url.endswith("/from%20the%20page.txt"), url
        with urllib.request.urlopen(url.replace("localhost", "127.0.0.1"),
                                    timeout=X.TIMEOUT) as r:
            assert r.read().decode() == payload
            assert r.headers["Content-Type"] == "text/plain"
    finally:
        b.close()
        watcher.close()
