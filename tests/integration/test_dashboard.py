"""The dashboard at / (issue 16 part 5) in a real browser: Debian's headless Chromium driven
over the DevTools protocol (cdp.py) against a real rtd. The page must load without errors,
draw live figures while messages flow, kick a real MQTT client, show a rule's dry run, keep
to a phone's width, and show the API's refusals in the page. Screenshots for a person to
look at: RT_BUILD_DIR/dashboard-desktop.png, dashboard-phone.png (390x844) and
dashboard-phone-full.png (the whole page at that width); dashboard-trace.png and
dashboard-trace-phone.png, the Trace panel showing a real client's packets."""
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

import paho.mqtt.client as mqtt
import pytest

from cdp import CHROMIUM, Browser
from conftest import BUILD, Rtd, free_port
from test_http import make_key

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason="chromium is not installed (tools/install-deps.sh)")


@pytest.fixture
def rtd(tmp_path):
    keys = tmp_path / "api_keys"
    admin, reader = make_key(keys, "ops", "admin"), make_key(keys, "viewer", "read")
    hport = free_port()
    broker = Rtd(f'http={{bind="127.0.0.1:{hport}", api_keys_file="{keys}"}}')
    broker.url, broker.admin_key, broker.read_key = f"http://127.0.0.1:{hport}", admin, reader
    yield broker
    code, log = broker.stop()
    assert code == 0, log[-3000:]


# Every Content-Security-Policy violation of the page, kept where the test can read it.
CSP_WATCH = ("window.cspViolations = [];"
             "document.addEventListener('securitypolicyviolation', e => window.cspViolations"
             ".push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));")


@pytest.fixture
def browser():
    b = Browser()
    try:
        for domain in ("Page", "Runtime", "Log"):
            b.call(f"{domain}.enable")
        b.call("Page.addScriptToEvaluateOnNewDocument", source=CSP_WATCH)
        yield b
    finally:
        b.close()


def csp_violations(b):
    """What the page's policy refused: its violation events, and the console's reports."""
    reported = [e for e in b.errors() if "Content Security Policy" in json.dumps(e)]
    return b.eval("window.cspViolations") + reported


def csp_watch_works(b):
    """A style attribute set here is refused and seen: the watch is known to see violations
    (its report stays among the page's errors: call it last)."""
    b.eval("document.body.append(Object.assign(document.createElement('i'), {id: 'csp-probe'}));"
           "document.getElementById('csp-probe').setAttribute('style', 'color: red')")
    assert b.wait_eval("window.cspViolations.length", 5) == 1, csp_violations(b)
    assert b.eval("getComputedStyle(document.getElementById('csp-probe')).color") != \
        "rgb(255, 0, 0)"


def test_static_files_need_no_key(rtd):
    for path, kind in (("/", "text/html"), ("/ui/app.js", "text/javascript"),
                       ("/ui/app.css", "text/css")):
        with urllib.request.urlopen(rtd.url + path, timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith(kind), path
            assert len(r.read()) > 100
    for path in ("/ui/nothing.js", "/ui/", "/index.html"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(rtd.url + path, timeout=10)
        assert e.value.code == 404, path


def rtbench_load(port, seconds):
    """rtbench: 10 publisher/subscriber pairs at 500 messages a second in all, for seconds."""
    return subprocess.Popen([os.path.join(BUILD, "tools", "rtbench", "rtbench"), "pairs",
                             "-p", str(port), "-c", "10", "--rate", "500", "-d", str(seconds),
                             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_dashboard(rtd, browser):
    b = browser
    # Without a key: the page loads cleanly and asks for one.
    b.navigate(rtd.url + "/")
    assert b.wait_eval("document.getElementById('error').textContent.includes('API key')", 5)
    assert b.errors() == []

    # With the admin key (as the key box keeps it), the live figures come.
    b.eval(f"sessionStorage.setItem('rtd.apiKey', '{rtd.admin_key}')")
    b.reload()
    victim = mqtt.Client(client_id="dash-victim", protocol=mqtt.MQTTv311)
    kicked = threading.Event()
    victim.on_disconnect = lambda *a: kicked.set()
    victim.connect("127.0.0.1", rtd.port, keepalive=30)
    victim.loop_start()
    load = rtbench_load(rtd.port, 8)
    try:
        n0 = b.wait_eval("rtdash.samples.length", 5)
        assert n0, "no live sample from the stream"
        drawn = b.eval("document.getElementById('chart-msgs').toDataURL()")
        shown = b.wait_eval("parseFloat(document.getElementById('fig-in').textContent) > 0 && "
                            "document.getElementById('fig-in').textContent", 6)
        assert shown, "the messages-in figure stayed at 0 while messages flowed"
        # The charts' points move: the stream sends a sample a second, so one more comes
        # within a few (the figure above can show in the sample n0 already counted).
        assert b.wait_eval(f"rtdash.samples.length > {n0}", 5), "no sample after the first"
        # Each sample redraws the charts; the canvas is read back from the renderer, which may
        # show the new picture a frame later than the sample that drew it (CI once read the
        # old one), so the change is awaited over the next samples, not read once.
        assert b.wait_eval("document.getElementById('chart-msgs').toDataURL() !== "
                           f"{json.dumps(drawn)}", 5), "the messages chart was not redrawn"
        assert b.eval("Math.max(...rtdash.samples.map(s => s.in))") > 0
        assert b.eval("rtdash.samples.at(-1).scheds.length") >= 2
        assert b.eval("document.querySelectorAll('#actors-table tbody tr').length") > 0
        # Sorting by a column header re-sorts the busiest actors.
        b.eval("document.querySelector('#actors-table th[data-key=memory]').click()")
        mem = b.wait_eval("(() => { const by = new Map(rtdash.actors.map(a => [a.pid, a]));"
                          " return [...document.querySelectorAll('#actors-table tbody tr')]"
                          ".map(r => by.get(r.cells[0].textContent).memory); })()", 3)
        assert mem and mem == sorted(mem, reverse=True)
        load.terminate()

        # A kick from the UI (two clicks: arm, then kick) ends a real client's connection.
        b.eval("document.getElementById('clients-prefix').value = 'dash-v';"
               "document.querySelector('#clients-form button').click()")
        assert b.wait_eval("!!document.querySelector('tr[data-client=\"dash-victim\"]')", 5)
        assert b.eval("document.querySelectorAll('#clients-table tbody tr').length") == 1
        b.eval("document.querySelector('tr[data-client=\"dash-victim\"]').click()")
        assert b.wait_eval("document.getElementById('client-detail').textContent"
                           ".includes('inflight_window')", 5)
        b.eval("{ const k = document.querySelector('tr[data-client=\"dash-victim\"] .kick');"
               " k.click(); k.click(); }")
        assert kicked.wait(10), "the kick from the page did not disconnect the client"
    finally:
        if load.poll() is None:
            load.kill()
        load.wait(10)
        victim.disconnect()  # kicked: ends its reconnect wait, which loop_stop alone sleeps out
        victim.loop_stop()

    # A dry run of the archive rule (etc/rules/archive.lua) shows the row it would write.
    b.eval("document.getElementById('dry-rule').value = 'archive';"
           "document.getElementById('dry-topic').value = 'dash/t';"
           "document.getElementById('dry-payload').value = 'hello';"
           "document.querySelector('#dry-form button').click()")
    assert b.wait_eval("document.querySelectorAll('#dry-rows tbody tr').length", 5) == 1
    assert "hello" in b.eval("document.getElementById('dry-rows').textContent")
    assert b.wait_eval("document.querySelectorAll('#rules-table tbody tr').length", 6)
    assert b.wait_eval("document.querySelector('#sinks-table tbody td')?.textContent", 6) \
        == "archive"
    assert b.eval("document.getElementById('error').hidden"), b.eval("rtdash.errors")

    b.eval("refresh()")  # the screenshots show the counters of the messages sent above
    b.pump(0.5)

    b.screenshot(os.path.join(BUILD, "dashboard-desktop.png"), 1280, 900, full=True)
    b.screenshot(os.path.join(BUILD, "dashboard-phone.png"), 390, 844, mobile=True, scale=2)
    # At a phone's width nothing is wider than the screen.
    assert b.eval("document.documentElement.scrollWidth") <= 390
    b.screenshot(os.path.join(BUILD, "dashboard-phone-full.png"), 390, 844, mobile=True,
                 scale=2, full=True)
    assert b.errors() == [], b.errors()
    # The page runs under rtd's policy (no inline script or style) and broke none of it.
    assert csp_violations(b) == [], csp_violations(b)

    # A read key may look but not kick: the 403 is told in the page.
    b.eval(f"sessionStorage.setItem('rtd.apiKey', '{rtd.read_key}')")
    b.reload()
    b.eval("document.querySelector('#clients-form button').click()")
    assert b.wait_eval("document.querySelectorAll('#rules-table .toggle').length", 5)
    b.eval("document.querySelector('#rules-table .toggle').click()")
    assert b.wait_eval("document.getElementById('error').textContent.includes('403')", 5)
    assert not b.eval("document.getElementById('error').hidden")
    # An unknown key: 401, in the page as well.
    b.eval("sessionStorage.setItem('rtd.apiKey', 'rtk_' + '0'.repeat(64))")
    b.reload()
    assert b.wait_eval("document.getElementById('error').textContent.includes('401')", 5)
    assert not [e for e in b.errors() if e.get("source") != "network"], b.errors()
    assert csp_violations(b) == [], csp_violations(b)
    csp_watch_works(b)


# Shown as text, never as markup: a topic and a payload that would run script if they were.
HOSTILE = '<img src=x onerror="window.pwned=1">'

TRACE_ROWS = ("[...document.querySelectorAll('#trace-table tbody tr')]"
              ".map(r => [...r.cells].map(c => c.textContent))")


def start_trace(b, kind, what, duration=60, payload=0):
    b.eval(f"document.getElementById('trace-kind').value = {json.dumps(kind)};"
           f"document.getElementById('trace-what').value = {json.dumps(what)};"
           f"document.getElementById('trace-duration').value = '{duration}';"
           f"document.getElementById('trace-payload').value = '{payload}';"
           "document.getElementById('trace-start').click()")


def packets(b, kind=None):
    """The packet rows shown: (dir, client, type, qos, topic/details, payload) each."""
    rows = [r for r in b.eval(TRACE_ROWS) if len(r) > 1]
    return [(r[1].split()[-1], r[3], r[2], r[6], r[4], r[9]) for r in rows
            if kind is None or r[2] == kind]


def open_api_trace(rtd, what):
    req = urllib.request.Request(f"{rtd.url}/api/v1/trace/client/{what}?duration=60",
                                 headers={"Authorization": f"Bearer {rtd.admin_key}"})
    return urllib.request.urlopen(req, timeout=10)


def test_dashboard_trace(rtd, browser):
    b = browser
    b.navigate(rtd.url + "/")
    b.eval(f"sessionStorage.setItem('rtd.apiKey', '{rtd.admin_key}')")
    b.reload()
    b.eval("document.querySelector('#tabs button[data-tab=trace]').click()")
    assert b.eval("document.getElementById('trace').hidden") is False
    start_trace(b, "client", "dash-traced", 60, 64)
    assert b.wait_eval("!!rtdash.trace?.started", 5), b.eval("rtdash.errors")
    assert b.eval("document.getElementById('trace-stop').disabled") is False

    c = mqtt.Client(client_id="dash-traced", protocol=mqtt.MQTTv5)
    subscribed = threading.Event()
    c.on_subscribe = lambda *a: subscribed.set()
    c.connect("127.0.0.1", rtd.port, keepalive=30)
    c.loop_start()
    try:
        c.subscribe("dash/#", qos=1)
        assert subscribed.wait(5)
        c.publish("dash/t", b"hello from paho", qos=1).wait_for_publish(5)
        c.publish("dash/x/" + HOSTILE, HOSTILE.encode(), qos=0)
        # Its packets, in and out, with the topic and the payload (cut at 64 bytes).
        assert b.wait_eval("document.getElementById('trace-table').textContent"
                           ".includes('dash/x/<img')", 5), b.eval(TRACE_ROWS)
        seen = packets(b)
        assert ("in", "dash-traced", "CONNECT") == seen[0][:3], seen
        assert ("out", "dash-traced", "CONNACK") == seen[1][:3], seen
        assert any(p[2] == "SUBSCRIBE" and "dash/#" in p[4] for p in seen), seen
        assert any(p[2] == "SUBACK" for p in seen), seen
        pub = [p for p in packets(b, "PUBLISH") if p[4] == "dash/t"]
        assert pub and pub[0][0] == "in" and pub[0][3].startswith("1"), pub
        assert pub[0][5].endswith("hello from paho"), pub
        assert any(p[2] == "PUBACK" for p in seen), seen
        # The hostile topic and payload are text: no element was made of them, nothing ran.
        hostile = [p for p in packets(b, "PUBLISH") if p[4] == "dash/x/" + HOSTILE]
        assert hostile and hostile[0][5].endswith(HOSTILE), hostile
        assert b.eval("document.querySelectorAll('#trace img, #trace-table [onerror]').length") \
            == 0
        assert b.eval("window.pwned === undefined")

        b.screenshot(os.path.join(BUILD, "dashboard-trace.png"), 1280, 900, at="#trace")
        b.screenshot(os.path.join(BUILD, "dashboard-trace-phone.png"), 390, 844, mobile=True,
                     scale=2, at="#trace")
        # At a phone's width the trace's rows are cards: the page is no wider than the screen.
        assert b.eval("document.documentElement.scrollWidth") <= 390

        # The table keeps the last traceMax rows and says how many were cut; it follows the
        # newest row at the bottom, unless the user scrolled up.
        b.eval("rtdash.traceMax = 40")
        for i in range(40):
            c.publish(f"dash/n/{i}", b"x", qos=0)
        assert b.wait_eval("rtdash.trace.cut > 0 && document.getElementById('trace-table')"
                           ".textContent.includes('dash/n/39')", 5), b.eval("rtdash.trace")
        assert b.eval("document.querySelectorAll('#trace-table tbody tr').length") == 40
        assert "oldest rows were cut" in b.eval("document.getElementById('trace-info')"
                                                ".textContent")
        at_bottom = ("(() => { const x = document.getElementById('trace-box');"
                     " return x.scrollHeight > x.clientHeight &&"
                     " x.scrollTop + x.clientHeight >= x.scrollHeight - 8; })()")
        box = "(b => [b.scrollTop, b.clientHeight, b.scrollHeight])(" \
              "document.getElementById('trace-box'))"
        assert b.wait_eval(at_bottom, 5), b.eval(box)
        # The user scrolls up; once the page saw it (its scroll event), new rows leave it there.
        b.eval("document.getElementById('trace-box').scrollTop = 0")
        assert b.wait_eval("rtdash.traceFollow === false", 5), b.eval(box)
        shown = b.eval("rtdash.trace.packets")
        c.publish("dash/late", b"y", qos=0)
        assert b.wait_eval(f"rtdash.trace.packets > {shown}", 5)
        assert b.eval("document.getElementById('trace-box').scrollTop") == 0
        b.eval("rtdash.traceMax = 500")
        # Every packet the trace sent is in the page, the first after its ticks (`: alive`,
        # one a second, several during the screenshots above) too: 10 before, 2 x 41 since.
        assert b.wait_eval("rtdash.trace.packets === 92", 5), b.eval("rtdash.trace.packets")
    finally:
        gone = threading.Event()  # its loop sent DISCONNECT and closed (loop_stop may not)
        c.on_disconnect = lambda *a: gone.set()
        c.disconnect()
        gone.wait(5)
        c.loop_stop()
    assert b.wait_eval("document.querySelector('#trace-table tr[data-type=DISCONNECT]') "
                       "!== null", 5), b.eval(TRACE_ROWS)[-4:]
    assert b.eval("document.getElementById('trace-state').textContent").startswith("tracing")

    assert b.errors() == [], b.errors()
    assert csp_violations(b) == [], csp_violations(b)

    # Stop closes the stream, and rtd ends the trace: all 8 traces can be had again (within a
    # bounded wait for rtd to see the connection go).
    b.eval("document.getElementById('trace-stop').click()")
    assert b.eval("document.getElementById('trace-state').textContent") == "stopped"
    assert b.eval("document.getElementById('trace-start').disabled") is False
    held = []
    try:
        deadline = time.monotonic() + 10
        while len(held) < 8:
            try:
                held.append(open_api_trace(rtd, f"held-{len(held)}"))
            except urllib.error.HTTPError as e:
                assert e.code == 503 and time.monotonic() < deadline, \
                    "the stopped trace was not ended"
                time.sleep(0.1)
        # A ninth from the page: 503, told in the page.
        start_trace(b, "client", "one-too-many")
        assert b.wait_eval("document.getElementById('error').textContent.includes('503')", 5)
        assert "traces are on already" in b.eval("document.getElementById('error').textContent")
        assert b.eval("document.getElementById('trace-state').textContent") == "refused"
    finally:
        for r in held:
            r.close()

    # A topic filter that is not one: 400, in the page.
    start_trace(b, "topic", "a/#/b")
    assert b.wait_eval("document.getElementById('error').textContent.includes('400')", 5)
    assert "not a topic filter" in b.eval("document.getElementById('error').textContent")

    # A read key may not trace (a trace shows clients' traffic): 403, in the page.
    b.eval(f"document.getElementById('key').value = '{rtd.read_key}';"
           "document.querySelector('#key-form button[type=submit]').click()")
    start_trace(b, "client", "dash-traced")
    assert b.wait_eval("document.getElementById('error').textContent.includes('403')", 5)
    assert "admin role" in b.eval("document.getElementById('error').textContent")
    assert not b.eval("document.getElementById('error').hidden")
    # Only the refused requests' own log lines, no script error.
    assert not [e for e in b.errors() if e.get("source") != "network"], b.errors()


# ---- The overview: what an operator looks at first (issue 28 part 9) ----

# Every table the page shows (those of the tab on screen have a width): whether one is wider
# than its box, which would hide a column behind a scrollbar; and whether the page is.
OVERFLOWS = ("[...document.querySelectorAll('main > section:not([hidden]) table')]"
             ".filter(t => t.offsetParent && (t.scrollWidth > t.clientWidth ||"
             " t.offsetWidth > t.parentElement.clientWidth))"
             ".map(t => `${t.id}: ${t.scrollWidth} in ${t.parentElement.clientWidth}`)"
             ".concat(document.documentElement.scrollWidth > window.innerWidth ?"
             " [`page: ${document.documentElement.scrollWidth} in ${window.innerWidth}`] : [])")

LISTENER_ROW = ("[...document.querySelector('#listeners-table tr[data-listener=\"{}\"]').cells]"
                ".map(c => c.textContent)")


def api_get(rtd, path):
    req = urllib.request.Request(f"{rtd.url}/api/v1/{path}",
                                 headers={"Authorization": f"Bearer {rtd.read_key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def mqtt_client(rtd, client_id, user, password, port=None):
    c = mqtt.Client(client_id=client_id, protocol=mqtt.MQTTv311)
    c.username_pw_set(user, password)
    c.connected, c.refused, c.gone = threading.Event(), threading.Event(), threading.Event()
    c.on_connect = lambda _c, _u, _f, rc: (c.connected if rc == 0 else c.refused).set()
    c.on_disconnect = lambda *a: c.gone.set()
    c.connect("127.0.0.1", port or rtd.port, keepalive=30)
    c.loop_start()
    return c


@pytest.mark.long  # some 10 s: two widths, four tabs, eight screenshots
def test_dashboard_overview(tmp_path, pki, browser):
    """The first screen: listeners with their connections and TLS days left, the refusals a
    client makes in the per-minute figures, a client found and kicked (403 with a read key),
    memory bars that add up to RSS, and every table within its box at 1,400 and 390 px.
    Screenshots: tmp_path/overview-1400.png, overview-390.png, actors-390.png, rules-390.png."""
    from test_tls import tls_listener
    from transports import listeners
    from conftest import password_file
    from certs import cert_field
    import email.utils
    keys = tmp_path / "api_keys"
    admin, reader = make_key(keys, "ops", "admin"), make_key(keys, "viewer", "read")
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite open/#\n")
    users = password_file(tmp_path / "passwd", {"alice": "wonderland"})
    port, tls_port, hport = free_port(), free_port(), free_port()
    rtd = Rtd(listeners(port, tls_listener(tls_port, *pki.server["ec"])),
              f'http={{bind="127.0.0.1:{hport}", api_keys_file="{keys}"}}',
              f'password_file="{users}"', f'acl_file="{acl}"', port=port)
    rtd.url, rtd.read_key = f"http://127.0.0.1:{hport}", reader
    b = browser
    victim = None
    try:
        # A read key sees the whole overview: every call it makes is one a read key may make.
        b.navigate(rtd.url + "/")
        b.eval(f"sessionStorage.setItem('rtd.apiKey', '{reader}')")
        b.reload()
        assert b.wait_eval("rtdash.counts.length >= 1 && !!rtdash.memory", 10), \
            b.eval("rtdash.errors")
        assert b.eval("document.getElementById('error').hidden"), b.eval("rtdash.errors")
        assert b.eval("document.getElementById('listeners').hidden") is False
        assert b.eval("document.getElementById('actors').hidden")  # its own tab

        victim = mqtt_client(rtd, "dash-kick-me", "alice", "wonderland")
        assert victim.connected.wait(5)
        # One failed login and one ACL denial, made after the page's first look.
        intruder = mqtt_client(rtd, "dash-intruder", "alice", "not-her-password")
        assert intruder.refused.wait(5)
        intruder.disconnect()
        intruder.loop_stop()
        denied = threading.Event()
        victim.on_subscribe = lambda _c, _u, _m, granted: granted == (128,) and denied.set()
        victim.subscribe("closed/x", 0)
        assert denied.wait(5)

        b.eval("refresh()")
        plain = LISTENER_ROW.format(f"127.0.0.1:{port}")
        assert b.wait_eval(f"{plain}[3].startsWith('1 / ')", 5), b.eval(plain)
        assert b.eval(plain)[:3] == [f"127.0.0.1:{port}", "tcp", "running"]
        # Whole days to the certificate's notAfter, as the API says (checked with the
        # certificate itself, at either side of the call).
        before = time.time()
        days = [x for x in api_get(rtd, "listeners") if x.get("tls")][0]["tls"]["days_left"]
        after = time.time()
        end = email.utils.parsedate_to_datetime(
            cert_field(pki.server["ec"][0], "enddate").replace(" GMT", " +0000")).timestamp()
        assert days in (int((end - before) // 86400), int((end - after) // 86400)), days
        tls_row = b.eval(LISTENER_ROW.format(f"127.0.0.1:{tls_port}"))
        assert tls_row[1] == "tls" and tls_row[4] == str(days), tls_row
        # The test's own refusals, one each, in the last minute's figures.
        assert b.wait_eval("document.getElementById('fig-auth').textContent === '1' && "
                           "document.getElementById('fig-acl').textContent", 5) == "1"
        rows = b.eval("[...document.querySelectorAll('#refusals-table tbody tr')]"
                      ".map(r => [...r.cells].map(c => c.textContent))")
        assert ["auth failures", "bad password", "1", "1"] in rows, rows
        assert ["ACL denials", "subscribe", "1", "1"] in rows, rows

        # Memory: the bars are vm's memory_by_kind grouped, whose last kind is RSS less the
        # others in the same answer: they add up to its RSS to the byte (tolerance 0).
        mem = b.eval("rtdash.memory")
        assert sum(x["bytes"] for x in mem["bars"]) == mem["rss"], mem
        named = {x["name"]: x["bytes"] for x in mem["bars"]}
        assert named["actors: structs and heaps"] > 0 and named["code and static data"] > 0
        assert b.eval("document.querySelectorAll('#mem-table tbody tr').length") == \
            len(mem["bars"]) + 1
        print("memory bars:", {k: v for k, v in named.items()}, "rss", mem["rss"])

        # Search, then kick: a read key is refused (403, said in the page), an admin key kicks.
        b.eval("document.getElementById('clients-prefix').value = 'dash-k';"
               "document.querySelector('#clients-form button').click()")
        row = "document.querySelector('tr[data-client=\"dash-kick-me\"]')"
        assert b.wait_eval(f"!!{row}", 5)
        assert b.eval("document.querySelectorAll('#clients-table tbody tr').length") == 1
        kick = f"{{ const k = {row}.querySelector('.kick'); k.click(); k.click(); }}"
        b.eval(kick)
        assert b.wait_eval("document.getElementById('error').textContent.includes('kick: 403')",
                           5)
        assert "admin role" in b.eval("document.getElementById('error').textContent")
        assert not victim.gone.is_set()
        b.eval(f"document.getElementById('key').value = '{admin}';"
               "document.querySelector('#key-form button[type=submit]').click()")
        b.eval("document.querySelector('#clients-form button').click()")
        assert b.wait_eval(f"!!{row} && document.getElementById('error').hidden", 5)
        b.eval(kick)
        assert victim.gone.wait(10), "the kick from the page did not disconnect the client"

        # Every table fits its box, at a desktop's width and a phone's, on every tab.
        b.eval("refresh()")
        b.pump(0.5)
        for width, height, mobile, scale in ((1400, 900, False, 1), (390, 844, True, 2)):
            for tab in ("overview", "actors", "rules", "trace"):
                b.eval(f"showTab('{tab}')")
                if tab == "trace":
                    start_trace(b, "client", "dash-traced")
                    assert b.wait_eval("!!rtdash.trace?.started", 5)
                    b.eval("document.getElementById('trace-stop').click()")
                shot = tmp_path / f"{tab}-{width}.png"
                b.screenshot(str(shot), width, height, mobile=mobile, scale=scale, full=True)
                assert b.eval("document.querySelectorAll('main > section:not([hidden]) table')"
                              ".length") > 0, tab
                assert b.eval(OVERFLOWS) == [], (width, tab)
        print("screenshots:", tmp_path)
        assert not [e for e in b.errors() if e.get("source") != "network"], b.errors()
        assert csp_violations(b) == [], csp_violations(b)
    finally:
        if victim:
            victim.disconnect()
            victim.loop_stop()
        code, log = rtd.stop()
    assert code == 0, log[-3000:]
