"""Stream management (XEP-0198, issue 29 section 4) against a real rtd, over raw sockets so each
element is the test's: acknowledgements both ways, a dropped connection's session resumed on a
new one with what the client had not acknowledged sent again, a wrong resumption id refused
(the stream then binds as usual), and a detached session whose time runs out putting the
messages it held into the offline store, delivered at the next login."""
import re
import tempfile
import time

import pytest

import xmpp_util as X
from conftest import Rtd, free_port

PW = "sm secret"
NS_SM = "urn:xmpp:sm:3"


def start(resume_timeout, users):
    tmp = tempfile.TemporaryDirectory(prefix="rtd-xmpp-sm-")
    for u in users:
        X.add_user(tmp.name, f"{u}@localhost", PW)
    port = free_port()
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{port}" }}, '
                 f'resume_timeout = {resume_timeout} }}', "auth_max_delay_ms=0",
                 data_dir=tmp.name)
    broker.xport, broker.tmp = port, tmp
    return broker


def stop(broker):
    code, log = broker.stop()
    broker.tmp.cleanup()
    assert code == 0, log[-3000:]


@pytest.fixture(scope="module")
def xmpp():
    broker = start(60, ["smuser", "smpeer", "tokuser"])
    yield broker
    stop(broker)


def wait_log(broker, pattern, timeout=10):
    deadline = time.monotonic() + timeout
    while not re.search(pattern, broker.read_log()):
        assert time.monotonic() < deadline, broker.read_log()[-2000:]
        time.sleep(0.02)


def enable(r):
    r.send(f"<enable xmlns='{NS_SM}' resume='true'/>")
    text = r.read_until(rb"<enabled[^>]*/>")
    m = re.search(r"id='([^']+)'", text)
    assert m and "resume='true'" in text, text
    return m.group(1)


def acked(r):
    r.send(f"<r xmlns='{NS_SM}'/>")
    text = r.read_until(rb"<a xmlns='" + NS_SM.encode() + rb"' h='\d+'/>")
    return int(re.search(r"h='(\d+)'", text).group(1))


def chat(r, to, body):
    r.send(f"<message to='{to}' type='chat' id='{body}'><body>{body}</body></message>")


def relogin(port, user):
    """A new connection authenticated as user, stopped where it would bind or resume."""
    r = X.Raw(port)
    r.open()
    assert r.scram("SCRAM-SHA-256", user, PW) == ("success", None)
    feats = r.open()
    assert f"<sm xmlns='{NS_SM}'/>" in feats, feats
    return r


def test_acks_and_resumption(xmpp):
    a = X.Raw(xmpp.xport)
    assert a.login("smuser", PW, resource="phone") == "smuser@localhost/phone"
    smid = enable(a)
    assert acked(a) == 0
    a.send("<iq type='get' id='p1'><ping xmlns='urn:xmpp:ping'/></iq>")
    a.read_until(rb"<iq[^>]*id='p1'[^>]*/>")
    assert acked(a) == 1  # the ping, counted once enabled

    b = X.Raw(xmpp.xport)
    b.login("smpeer", PW, resource="desk")
    chat(b, "smuser@localhost/phone", "m1")
    a.read_until(rb"<body>m1</body>.*?</message>")
    a.sock.close()  # gone without a close and without acknowledging m1
    wait_log(xmpp, r"xmpp.session_detached jid=smuser@localhost/phone")
    chat(b, "smuser@localhost/phone", "m2")  # kept for the detached session

    a2 = relogin(xmpp.xport, "smuser")
    a2.send(f"<resume xmlns='{NS_SM}' previd='{smid}' h='0'/>")
    text = a2.read_until(rb"<body>m2</body>.*?</message>")
    assert re.search(r"<resumed xmlns='urn:xmpp:sm:3' h='1' previd='" + re.escape(smid), text)
    assert text.index("<body>m1</body>") < text.index("<body>m2</body>"), text
    # The session is the same one: its full JID, its counters, its routes.
    a2.send(f"<a xmlns='{NS_SM}' h='2'/>")
    assert acked(a2) == 1
    chat(a2, "smpeer@localhost/desk", "back")
    text = b.read_until(rb"<body>back</body>.*?</message>")
    assert "from='smuser@localhost/phone'" in text, text
    a2.send("</stream:stream>")
    b.send("</stream:stream>")
    a2.read_to_close()
    b.read_to_close()


def test_wrong_token_fails_and_binds(xmpp):
    a = X.Raw(xmpp.xport)
    a.login("tokuser", PW, resource="one")
    smid = enable(a)
    a.sock.close()
    wait_log(xmpp, r"xmpp.session_detached jid=tokuser@localhost/one")
    pid = smid.split("-")[0]
    r = relogin(xmpp.xport, "tokuser")
    r.send(f"<resume xmlns='{NS_SM}' previd='{pid}-0123456789abcdef' h='0'/>")
    text = r.read_until(rb"</failed>")
    assert "<item-not-found" in text, text
    # The stream goes on: a new session binds (and replaces the detached one).
    r.send("<iq type='set' id='b2'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'>"
           "<resource>one</resource></bind></iq>")
    assert "<jid>tokuser@localhost/one</jid>" in r.read_until(rb"</iq>")
    r.send("</stream:stream>")
    r.read_to_close()


def test_expired_session_keeps_messages_offline():
    broker = start(1, ["expuser", "exppeer"])
    try:
        a = X.Raw(broker.xport)
        a.login("expuser", PW, resource="phone")
        enable(a)
        b = X.Raw(broker.xport)
        b.login("exppeer", PW, resource="desk")
        chat(b, "expuser@localhost/phone", "kept")
        a.read_until(rb"<body>kept</body>.*?</message>")
        a.sock.close()  # never acknowledged
        wait_log(broker, r"xmpp.session_expired jid=expuser@localhost/phone offline=1")
        a2 = X.Raw(broker.xport)
        a2.login("expuser", PW, resource="laptop")
        a2.send("<presence/>")
        text = a2.read_until(rb"<body>kept</body>.*?</message>")
        assert "urn:xmpp:delay" in text, text
        for r in (a2, b):
            r.send("</stream:stream>")
            r.read_to_close()
    finally:
        stop(broker)
