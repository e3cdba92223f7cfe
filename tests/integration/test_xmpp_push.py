"""Push notifications (XEP-0357) on a real rtd, over raw sockets so every element is the test's:
a client enables an app server (a local session here: one on another domain needs federation)
with a node and publish options; a message the account cannot take itself (kept offline, or
queued for a session detached under stream management) makes the server publish a summary to
each app server enabled, with the options sent back and nothing of the message's content; a
chat state wakes nobody; a disabled node hears nothing more; bad requests get the errors the
XEP names. Slixmpp 1.8.3 has no XEP-0357 plugin, so the raw client speaks it."""
import re
import time

import pytest

import xmpp_server as S
import xmpp_util as X

PW = "push secret"
NS_PUSH = "urn:xmpp:push:0"
NS_SM = "urn:xmpp:sm:3"
APP = "pushapp@localhost/svc"
FORM = ("<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE'><value>"
        "http://jabber.org/protocol/pubsub#publish-options</value></field>"
        "<field var='secret'><value>{secret}</value></field></x>")


@pytest.fixture(scope="module")
def xmpp():
    server = S.serve(["pushapp", "pushsend", "off1", "off2", "off3", "det1", "bad1", "far1"],
                     PW, resume_timeout=60, rtd_options=("auth_max_delay_ms=0",))
    yield server
    S.stop(server)


@pytest.fixture
def app(xmpp):
    """The app server: a local session that answers each publish it is sent."""
    r = X.Raw(xmpp.xport)
    assert r.login("pushapp", PW, resource="svc") == APP
    yield r
    r.close()


def enable(r, node, secret=None, jid=APP, id_="e1"):
    form = FORM.format(secret=secret) if secret else ""
    r.send(f"<iq type='set' id='{id_}'><enable xmlns='{NS_PUSH}' jid='{jid}' node='{node}'>"
           f"{form}</enable></iq>")
    return r.read_until(rf"<iq[^>]*id='{id_}'[^>]*(/>|>.*?</iq>)".encode())


def online(xmpp, user):
    r = X.Raw(xmpp.xport)
    r.login(user, PW, resource="phone")
    return r


def leave(r):
    r.send("</stream:stream>")
    r.read_to_close()


def chat(sender, to, body):
    sender.send(f"<message to='{to}' type='chat' id='{body}'><body>{body}</body></message>")


def next_push(app):
    """The next publish the app server gets, answered with a result as an app server does."""
    text = app.read_until(rb"<iq[^>]*type='set'.*?</iq>")
    iq = X.first_el(text, "iq")
    app.send(f"<iq type='result' id='{iq.get('id')}' to='{iq.get('from')}'/>")
    return text, iq


def sent(xmpp):
    return X.metric(xmpp, "rt_xmpp_push_sent_total")


def test_the_account_advertises_push(xmpp):
    r = online(xmpp, "off1")
    r.send("<iq type='get' id='d1' to='off1@localhost'>"
           "<query xmlns='http://jabber.org/protocol/disco#info'/></iq>")
    text = r.read_until(rb"<iq[^>]*id='d1'.*?</iq>")
    assert f"<feature var='{NS_PUSH}'/>" in text, text
    leave(r)


def test_an_offline_message_notifies_the_app_server(xmpp, app):
    before = sent(xmpp)
    u = online(xmpp, "off2")
    assert "type='result'" in enable(u, "node-off2", secret="s3cr3t-off2")
    leave(u)
    s = online(xmpp, "pushsend")
    chat(s, "off2@localhost", "private words")
    text, iq = next_push(app)
    assert iq.get("from") == "off2@localhost" and iq.get("to") == APP, text
    assert "<publish node='node-off2'>" in text, text
    assert "urn:xmpp:push:summary" in text and "message-count" in text, text
    assert "<value>s3cr3t-off2</value>" in text and "<publish-options>" in text, text
    assert "private words" not in text and "pushsend" not in text, text  # neither body nor sender
    assert sent(xmpp) == before + 1
    # The message itself waits for the account, as before.
    u = online(xmpp, "off2")
    u.send("<presence/>")
    u.read_until(rb"<body>private words</body>")
    leave(u)
    leave(s)


def test_a_chat_state_wakes_nobody_and_a_disabled_node_hears_nothing(xmpp, app):
    u = online(xmpp, "off3")
    assert "type='result'" in enable(u, "gone-node", id_="e1")
    assert "type='result'" in enable(u, "kept-node", id_="e2")
    u.send(f"<iq type='set' id='x1'><disable xmlns='{NS_PUSH}' jid='{APP}' node='gone-node'/>"
           "</iq>")
    assert "type='result'" in u.read_until(rb"<iq[^>]*id='x1'[^>]*(/>|>.*?</iq>)")
    leave(u)
    s = online(xmpp, "pushsend")
    s.send("<message to='off3@localhost' type='chat'>"
           "<active xmlns='http://jabber.org/protocol/chatstates'/></message>")
    chat(s, "off3@localhost", "one")
    chat(s, "off3@localhost", "two")
    # The store sends in order: had the chat state or the disabled node made a publish, it
    # would be among what came before the second publish to the kept node.
    first, _ = next_push(app)
    second, _ = next_push(app)
    both = first + second
    assert both.count("<publish node='kept-node'>") == 2, both
    assert "gone-node" not in both, both
    leave(s)


def test_a_detached_session_notifies(xmpp, app):
    u = online(xmpp, "det1")
    assert "type='result'" in enable(u, "node-det1")
    u.send(f"<enable xmlns='{NS_SM}' resume='true'/>")
    u.read_until(rb"<enabled[^>]*/>")
    u.send("<presence/>")
    u.close()  # gone without a close: the session waits for a resumption
    deadline = time.monotonic() + X.TIMEOUT
    while not re.search(r"xmpp.session_detached jid=det1@localhost/phone", xmpp.read_log()):
        assert time.monotonic() < deadline, xmpp.read_log()[-2000:]
        time.sleep(0.02)
    s = online(xmpp, "pushsend")
    chat(s, "det1@localhost/phone", "while away")
    text, iq = next_push(app)
    assert iq.get("from") == "det1@localhost" and "<publish node='node-det1'>" in text, text
    leave(s)


def test_bad_requests_and_an_unreachable_app_server(xmpp):
    u = online(xmpp, "bad1")
    u.send(f"<iq type='set' id='n1'><enable xmlns='{NS_PUSH}' node='n'/></iq>")
    assert "<bad-request" in u.read_until(rb"<iq[^>]*id='n1'.*?</iq>")
    u.send(f"<iq type='set' id='n2'><enable xmlns='{NS_PUSH}' jid='{APP}'/></iq>")
    assert "<bad-request" in u.read_until(rb"<iq[^>]*id='n2'.*?</iq>")
    u.send(f"<iq type='get' id='n3'><enable xmlns='{NS_PUSH}' jid='{APP}' node='n'/></iq>")
    assert "<bad-request" in u.read_until(rb"<iq[^>]*id='n3'.*?</iq>")
    big = "v" * 5000
    u.send(f"<iq type='set' id='n4'><enable xmlns='{NS_PUSH}' jid='{APP}' node='n'>"
           f"{FORM.format(secret=big)}</enable></iq>")
    assert "<not-acceptable" in u.read_until(rb"<iq[^>]*id='n4'.*?</iq>")
    leave(u)
    # An app server on another domain: kept, and counted as not reachable (no federation yet).
    before = X.metric(xmpp, "rt_xmpp_push_undeliverable_total")
    f = online(xmpp, "far1")
    assert "type='result'" in enable(f, "far", jid="push.example.net")
    leave(f)
    s = online(xmpp, "pushsend")
    chat(s, "far1@localhost", "far away")
    deadline = time.monotonic() + X.TIMEOUT
    while X.metric(xmpp, "rt_xmpp_push_undeliverable_total") < before + 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    leave(s)
