"""Operating XMPP sessions (issue 29, section 5): `rtctl xmpp sessions|show|kick|roster`, the
same commands over the HTTP API with its roles, and the XMPP listener in `rtctl listeners` and
/metrics. A real rtd with an xmpp table and accounts, real slixmpp clients (xmpp_util.py).
"""
import asyncio
import re
import tempfile
import threading
import time
import urllib.request

import pytest

import xmpp_util as X
from conftest import Rtd, free_port
from test_http import call, make_key

PW = "s3cret-pw"
USERS = ["alice", "bob", "carol", "dave", "erin", "frank"]


@pytest.fixture(scope="module")
def xmpp():
    tmp = tempfile.TemporaryDirectory(prefix="rtd-xadmin-")
    X.add_users(tmp.name, [(f"{u}@localhost", PW) for u in USERS])
    keys = f"{tmp.name}/api_keys"
    admin, reader = make_key(keys, "ops", "admin"), make_key(keys, "viewer", "read")
    port, hport = free_port(), free_port()
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost", "other.localhost" }}, '
                 f'listeners = {{ "127.0.0.1:{port}" }} }}',
                 f'http={{bind="127.0.0.1:{hport}", api_keys_file="{keys}"}}',
                 "auth_max_delay_ms=0", data_dir=tmp.name)
    broker.xport, broker.hport, broker.admin_key, broker.read_key = port, hport, admin, reader
    yield broker
    code, log = broker.stop()
    tmp.cleanup()
    assert code == 0, log[-3000:]


async def ctl_json(broker, *args):
    """rtctl ... --json that must succeed, off the event loop (the clients keep running)."""
    return await asyncio.to_thread(broker.ctl_json, *args)


async def ctl(broker, *args):
    return await asyncio.to_thread(broker.ctl, *args)


async def until(broker, args, pred, timeout=X.TIMEOUT):
    """The first `rtctl ARGS --json` answer pred accepts (rtd handles presence and session
    ends in the sessions' own actors, after the client sent them); fails at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = await ctl_json(broker, *args)
        if pred(got):
            return got
        assert time.monotonic() < deadline, got
        await asyncio.sleep(0.05)


def jids(rows):
    return [r["jid"] for r in rows]


def test_sessions_show_kick(xmpp):
    async def t():
        phone = await X.login(xmpp.xport, "alice@localhost/phone", PW)
        laptop = await X.login(xmpp.xport, "alice@localhost/laptop", PW)
        desk = await X.login(xmpp.xport, "bob@localhost/desk", PW)
        phone.send_presence(ppriority=5)

        want = ["alice@localhost/laptop", "alice@localhost/phone", "bob@localhost/desk"]
        rows = await until(xmpp, ["xmpp", "sessions"],
                           lambda rows: any(r["available"] for r in rows))
        assert jids(rows) == want  # sorted by JID
        by = {r["jid"]: r for r in rows}
        assert by["alice@localhost/phone"]["available"] is True
        assert by["alice@localhost/phone"]["priority"] == 5
        assert by["bob@localhost/desk"]["available"] is False
        for r in rows:
            assert r["memory"] > 0, r
            assert re.fullmatch(r"127\.0\.0\.1:\d+", r["peer"]), r
            assert re.fullmatch(r"<\d+\.\d+>", r["pid"]), r
        # Each peer is the client's own address: its socket's local port.
        ports = {int(r["peer"].split(":")[1]) for r in rows}
        assert ports == {c.socket.getsockname()[1] for c in (phone, laptop, desk)}

        # By host; a host with no sessions; a name that is no host.
        assert jids(await ctl_json(xmpp, "xmpp", "sessions", "LocalHost")) == want
        assert await ctl_json(xmpp, "xmpp", "sessions", "other.localhost") == []
        code, _, err = await ctl(xmpp, "xmpp", "sessions", "a@b")
        assert code == 1 and "not a host name" in err, err
        assert jids(await ctl_json(xmpp, "xmpp", "sessions", "--limit", "1")) == want[:1]
        code, out, err = await ctl(xmpp, "xmpp", "sessions")
        assert code == 0 and out.splitlines()[0].split()[:2] == ["jid", "pid"], out
        assert len(out.splitlines()) == 4 and "alice@localhost/phone" in out, out

        # One session in detail, then each of an account's.
        one = await ctl_json(xmpp, "xmpp", "show", "Alice@LOCALHOST/phone")
        assert one["jid"] == "alice@localhost/phone" and one["priority"] == 5
        assert one["listener"] == f"127.0.0.1:{xmpp.xport}" and one["kind"] == "xmpp/tcp"
        assert one["tls"] is False and re.fullmatch(r"[0-9a-f]{8,}", one["stream_id"]), one
        assert one["roster_loaded"] is True and one["roster_items"] == 0, one
        assert one["mailbox"] == 0 and one["idle_s"] >= 0
        assert one["memory"] >= one["heap_bytes"] > 0, one
        both = await ctl_json(xmpp, "xmpp", "show", "alice@localhost")
        assert jids(both) == want[:2] and all("stream_id" in r for r in both)
        assert both[0]["stream_id"] != both[1]["stream_id"]
        code, out, _ = await ctl(xmpp, "xmpp", "show", "alice@localhost/phone")
        assert code == 0 and re.search(r"^kind\s+xmpp/tcp$", out, re.M), out
        for jid, why in [("nobody@localhost", "no session of nobody@localhost"),
                         ("alice@localhost/tablet", "no session of alice@localhost/tablet"),
                         ("localhost", "a user's JID is needed"),
                         ("a@@b", "not a JID")]:
            code, _, err = await ctl(xmpp, "xmpp", "show", jid)
            assert code == 1 and why in err, (jid, err)

        # Kick one resource: that client gets the stream error, the others stay.
        code, out, err = await ctl(xmpp, "xmpp", "kick", "alice@localhost/laptop")
        assert code == 0 and out == "1 session of alice@localhost/laptop kicked\n", (out, err)
        e = await X.next_of(laptop.stream_errors)
        assert e.get_condition() == "policy-violation", e
        assert "administrator" in e["text"], e
        await asyncio.wait_for(laptop.gone.wait(), X.TIMEOUT)
        rows = await until(xmpp, ["xmpp", "sessions"], lambda rows: len(rows) == 2)
        assert jids(rows) == ["alice@localhost/phone", "bob@localhost/desk"]
        assert phone.is_connected() and desk.is_connected()
        code, _, err = await ctl(xmpp, "xmpp", "kick", "alice@localhost/laptop")
        assert code == 1 and "no session" in err, err
        log = xmpp.read_log()
        assert 'command="xmpp kick alice@localhost/laptop" status=200' in log, log[-2000:]
        assert re.search(r"event=admin\.change via=rtctl uid=\d+ .*command=\"xmpp kick "
                         r"alice@localhost/laptop\"", log), log[-2000:]

        # Over HTTP: a read key sees the sessions, only the admin role kicks (POST).
        code, body = await asyncio.to_thread(call, xmpp, "/api/v1/xmpp/sessions",
                                             key=xmpp.read_key)
        assert code == 200 and jids(body) == jids(rows), body
        code, body = await asyncio.to_thread(
            call, xmpp, "/api/v1/xmpp/show/alice@localhost%2Fphone", key=xmpp.read_key)
        assert code == 200 and body["jid"] == "alice@localhost/phone", body
        code, body = await asyncio.to_thread(call, xmpp, "/api/v1/xmpp/kick/bob@localhost",
                                             key=xmpp.read_key, method="POST")
        assert code == 403 and "admin role" in body["error"], body
        code, body = await asyncio.to_thread(call, xmpp, "/api/v1/xmpp/user/list",
                                             key=xmpp.read_key)
        assert code == 403 and "shows the XMPP accounts" in body["error"], body
        code, body = await asyncio.to_thread(call, xmpp, "/api/v1/xmpp/kick", method="POST",
                                             key=xmpp.admin_key, body={"jid": "bob@localhost"})
        assert (code, body) == (200, {"jid": "bob@localhost", "kicked": 1}), body
        e = await X.next_of(desk.stream_errors)
        assert e.get_condition() == "policy-violation"
        await until(xmpp, ["xmpp", "sessions"], lambda rows: jids(rows) == want[1:2])
        log = xmpp.read_log()
        assert re.search(r"event=admin\.change via=http api_key=ops .*command=\"xmpp kick "
                         r"bob@localhost\" status=200", log), log[-2000:]
        await X.logout(phone)
        await until(xmpp, ["xmpp", "sessions"], lambda rows: rows == [])
    X.run(t(), timeout=90)


def test_roster(xmpp):
    async def t():
        a = await X.login(xmpp.xport, "alice@localhost/r", PW)
        c = await X.login(xmpp.xport, "carol@localhost/r", PW)
        for s in (a, c):  # online: roster asked for, initial presence sent
            # slixmpp answers a request itself unless this is None (False: it refuses).
            s.roster.auto_authorize = None
            await s.get_roster()
            s.send_presence()
        await a.update_roster("bob@localhost", name="Bob B", groups=["Work", "Friends"])
        a.send_presence(pto="carol@localhost", ptype="subscribe")
        # Carol has it once her session got it: the store wrote her side before sending.
        await X.next_of(c.presences, lambda p: p["type"] == "subscribe")
        rows = await until(xmpp, ["xmpp", "roster", "alice@localhost"],
                           lambda rows: len(rows) == 2)
        assert rows == [
            {"contact": "bob@localhost", "name": "Bob B", "groups": ["Work", "Friends"],
             "subscription": "none", "ask": False, "pending_in": False, "preapproved": False},
            {"contact": "carol@localhost", "name": "", "groups": [],
             "subscription": "none", "ask": True, "pending_in": False, "preapproved": False},
        ], rows
        carol = await ctl_json(xmpp, "xmpp", "roster", "carol@localhost")
        assert carol == [{"contact": "alice@localhost", "name": "", "groups": [],
                          "subscription": "none", "ask": False, "pending_in": True,
                          "preapproved": False}], carol
        # Carol approves: both sides move (alice: to; carol: from).
        c.send_presence(pto="alice@localhost", ptype="subscribed")
        await X.next_of(a.presences, lambda p: p["type"] == "subscribed")
        rows = await until(xmpp, ["xmpp", "roster", "alice@localhost"],
                           lambda rows: rows[1]["subscription"] == "to")
        assert rows[1]["ask"] is False, rows
        carol = await until(xmpp, ["xmpp", "roster", "carol@localhost"],
                            lambda rows: rows[0]["subscription"] == "from")
        assert carol[0]["pending_in"] is False, carol
        # The session holds its roster too: `show` counts the entries.
        one = await ctl_json(xmpp, "xmpp", "show", "alice@localhost/r")
        assert one["roster_items"] == 2 and one["roster_bytes"] > 0, one

        code, out, _ = await ctl(xmpp, "xmpp", "roster", "alice@localhost")
        head = out.splitlines()[0].split()
        assert code == 0 and head[:4] == ["contact", "name", "groups", "subscription"], out
        assert re.search(r"^bob@localhost\s+Bob B\s+(Friends,Work|Work,Friends)\s+none", out,
                         re.M), out
        code, _, err = await ctl(xmpp, "xmpp", "roster", "nobody@localhost")
        assert code == 1 and "no account nobody@localhost" in err, err
        code, _, err = await ctl(xmpp, "xmpp", "roster", "localhost")
        assert code == 1 and "USER@HOST" in err, err
        code, body = await asyncio.to_thread(call, xmpp, "/api/v1/xmpp/roster/carol@localhost",
                                             key=xmpp.read_key)
        assert code == 200 and body[0]["contact"] == "alice@localhost", body
        await X.logout(a, c)
    X.run(t(), timeout=90)


def metrics(broker):
    req = urllib.request.Request(f"http://127.0.0.1:{broker.hport}/metrics",
                                 headers={"Authorization": f"Bearer {broker.read_key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def test_listeners(xmpp):
    async def t():
        a = await X.login(xmpp.xport, "alice@localhost/l", PW)
        ls = await ctl_json(xmpp, "listeners")
        where = f"127.0.0.1:{xmpp.xport}"
        assert [x["listener"] for x in ls] == [f"127.0.0.1:{xmpp.port}", where], ls
        x = ls[1]
        assert (x["protocol"], x["kind"], x["state"]) == ("xmpp/tcp", "xmpp/tcp", "running"), x
        assert x["connections"] == 1 and x["accepted"] >= 1, x
        assert (ls[0]["protocol"], ls[0]["kind"]) == ("mqtt/tcp", "tcp"), ls[0]
        text = await asyncio.to_thread(metrics, xmpp)
        label = f'{{listener="{where}",kind="xmpp/tcp"}}'
        assert f"rt_listener_up{label} 1\n" in text, text
        assert f"rt_listener_connections{label} 1\n" in text, text
        assert re.search(rf"^rt_listener_accepted_total{re.escape(label)} [1-9]", text, re.M)
        assert f'rt_listener_up{{listener="127.0.0.1:{xmpp.port}",kind="tcp"}} 1\n' in text
        await X.logout(a)
    X.run(t())


def test_help_lists_the_commands(xmpp):
    code, out, _ = xmpp.ctl("help")
    assert code == 0
    for usage in ["xmpp sessions [HOST] [--limit N]", "xmpp show JID", "xmpp kick JID",
                  "xmpp roster USER@HOST"]:
        assert usage in out, out
    code, out, _ = xmpp.ctl("xmpp", "kick", "--help")
    assert code == 0 and "policy-violation" in out, out


def test_trace_a_jid(xmpp):
    """`rtctl trace client JID` shows an XMPP session's stanzas both ways: a trace of a bare
    JID every resource's (the bind too, written to the bare JID before it was bound), a trace
    of a full JID that resource's; each event with the stanza's first tag and, with
    --payload, its bytes."""
    from test_trace import finish, start_trace
    bare = start_trace(xmpp, "client", "alice@localhost", "--duration", "3", "--payload", "400")
    full = start_trace(xmpp, "client", "bob@localhost/trb", "--duration", "3")
    a, b = X.Raw(xmpp.xport), X.Raw(xmpp.xport)
    afull = a.login("alice", PW, resource="tra")
    bfull = b.login("bob", PW, resource="trb")
    a.send(f"<message to='{bfull}' type='chat' id='m1'><body>traced hello</body></message>")
    b.read_until(rb"traced hello</body></message>")
    a.send("<iq type='get' id='tp' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>")
    a.read_until(rb"<iq[^>]*id=['\"]tp['\"][^>]*(?:/>|>.*?</iq>)")
    a.close()
    b.close()
    alice = [e for e in finish(bare) if e["event"] == "packet"]
    bob = [e for e in finish(full) if e["event"] == "packet"]
    assert all(e["protocol"] == "xmpp" for e in alice + bob)
    assert {e["client"] for e in alice} <= {"alice@localhost", afull}, alice
    ins = [e for e in alice if e["dir"] == "in"]
    outs = [e for e in alice if e["dir"] == "out"]
    assert any(e["tag"].startswith("<iq") and "bind" in e["payload"] for e in ins), ins
    sent = [e for e in ins if e["tag"].startswith("<message")]
    assert len(sent) == 1 and "traced hello" in sent[0]["payload"], ins
    assert sent[0]["client"] == afull and sent[0]["size"] == len(sent[0]["payload"])
    assert any(e["tag"].startswith("<iq") and "'tp'" in e["tag"] for e in outs), outs
    got = [e for e in bob if e["dir"] == "out" and e["tag"].startswith("<message")]
    assert len(got) == 1 and f"from='{afull}'" in got[0]["tag"], bob
    assert "payload" not in got[0]  # no --payload: the first tag only
    assert all(e["client"] == bfull for e in bob if e["client"] != "bob@localhost"), bob


def test_user_del_ends_the_accounts_sessions(xmpp):
    """`rtctl xmpp user del` while the account is logged in: each of its sessions ends with
    not-authorized, as a cancelled in-band registration's do (XEP-0077 3.2), and the answer
    says how many; a login after it fails."""
    sessions = [X.Raw(xmpp.xport) for _ in range(2)]
    for i, r in enumerate(sessions):
        assert r.login("dave", PW, resource=f"r{i}") == f"dave@localhost/r{i}"
    got = xmpp.ctl_json("xmpp", "user", "del", "dave@localhost")
    assert got == {"user": "dave", "host": "localhost", "done": "del", "sessions_ended": 2}, got
    for r in sessions:
        cond, text = r.stream_error()
        assert cond == "not-authorized", text
    r = X.Raw(xmpp.xport)
    r.open()
    assert r.scram("SCRAM-SHA-256", "dave", PW)[0] == "failure"
    r.close()


def test_passwd_takes_effect_at_once(xmpp):
    """`rtctl xmpp user passwd` while the store is busy reading (its read snapshot then lives
    a few ms across requests): a login right after the answer needs the new password, and
    the old one fails, every time."""
    reader = X.Raw(xmpp.xport)
    reader.login("frank", PW, resource="r")
    stop = threading.Event()

    def read_rosters():
        n = 0
        while not stop.is_set():
            reader.send(f"<iq type='get' id='q{n}'><query xmlns='jabber:iq:roster'/></iq>")
            reader.read_until(rb"<iq[^>]*id='q" + str(n).encode() + rb"'")
            n += 1
    t = threading.Thread(target=read_rosters)
    t.start()
    try:
        old = PW
        for i in range(5):
            new = f"pw-{i}"
            assert xmpp.ctl_json("xmpp", "user", "passwd", "erin@localhost",
                                 "--password", new)["done"] == "passwd"
            for pw, result in ((new, "success"), (old, "failure")):
                r = X.Raw(xmpp.xport)
                r.open()
                assert r.scram("SCRAM-SHA-256", "erin", pw)[0] == result, (i, pw)
                r.close()
            old = new
    finally:
        stop.set()
        t.join()
        reader.close()
