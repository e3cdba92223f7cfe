"""The dashboard at / (issue 16 part 5) in a real browser: Debian's headless Chromium driven
over the DevTools protocol (cdp.py) against a real rtd. The page must load without errors,
draw live figures while messages flow, kick a real MQTT client, show a rule's dry run, keep
to a phone's width, and show the API's refusals in the page. Screenshots for a person to
look at: RT_BUILD_DIR/dashboard-desktop.png, dashboard-phone.png (390x844) and
dashboard-phone-full.png (the whole page at that width)."""
import os
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


@pytest.fixture
def browser():
    b = Browser()
    try:
        for domain in ("Page", "Runtime", "Log"):
            b.call(f"{domain}.enable")
        yield b
    finally:
        b.close()


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


def publish_for(port, seconds, stop):
    """A client publishing ~200 messages a second until stop or seconds pass."""
    c = mqtt.Client(client_id="dash-publisher", protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    end = time.monotonic() + seconds
    while time.monotonic() < end and not stop.is_set():
        for _ in range(20):
            c.publish("sensors/s1/temp", b'{"temp": 21}')
        time.sleep(0.1)
    c.loop_stop()
    c.disconnect()


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
    stop = threading.Event()
    pub = threading.Thread(target=publish_for, args=(rtd.port, 8, stop), daemon=True)
    pub.start()
    try:
        n0 = b.wait_eval("rtdash.samples.length", 5)
        assert n0, "no live sample from the stream"
        drawn = b.eval("document.getElementById('chart-msgs').toDataURL()")
        shown = b.wait_eval("parseFloat(document.getElementById('fig-in').textContent) > 0 && "
                            "document.getElementById('fig-in').textContent", 6)
        assert shown, "the messages-in figure stayed at 0 while messages flowed"
        assert b.eval("rtdash.samples.length") > n0  # the charts' points move
        assert b.eval("document.getElementById('chart-msgs').toDataURL()") != drawn
        assert b.eval("Math.max(...rtdash.samples.map(s => s.in))") > 0
        assert b.eval("rtdash.samples.at(-1).scheds.length") >= 2
        assert b.eval("document.querySelectorAll('#actors-table tbody tr').length") > 0
        # Sorting by a column header re-sorts the busiest actors.
        b.eval("document.querySelector('#actors-table th[data-key=memory]').click()")
        mem = b.wait_eval("(() => { const by = new Map(rtdash.actors.map(a => [a.pid, a]));"
                          " return [...document.querySelectorAll('#actors-table tbody tr')]"
                          ".map(r => by.get(r.cells[0].textContent).memory); })()", 3)
        assert mem and mem == sorted(mem, reverse=True)
        stop.set()
        pub.join(10)

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
        stop.set()
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
    # At a phone's width nothing but the tables' own scroll boxes is wider than the screen.
    assert b.eval("document.documentElement.scrollWidth") <= 390
    b.screenshot(os.path.join(BUILD, "dashboard-phone-full.png"), 390, 844, mobile=True,
                 scale=2, full=True)
    assert b.errors() == [], b.errors()

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
