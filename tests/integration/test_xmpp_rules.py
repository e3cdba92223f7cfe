"""Rules see XMPP (issue 29 section 5): a Lua rule selects XMPP messages, presence and sessions
by from, to, type and body and routes rows into the same SQLite sink as MQTT's, through the
same engine (the protocol-neutral view: protocol, clientid = full JID, username = bare JID,
from, to, type, payload = the body); its dry run (`rtctl rules test`) shows an XMPP sample.
A real rtd, raw XMPP clients, the rows read back from the sink's file."""
import json
import os
import tempfile

import xmpp_util as X
from conftest import Rtd, free_port, wait_for
from test_rules_e2e import query, sqlite_sink

PW = "rules secret"

RULE = """
return {
    name = "chats",
    from = { "xmpp.message", "xmpp.presence", "client.connected", "client.disconnected" },
    select = function(msg)
        if msg.protocol ~= "xmpp" then return nil end
        if msg.event == "xmpp.message" and msg.type ~= "chat" then return nil end
        return {
            event = msg.event, sender = msg.from or msg.clientid, rcpt = msg.to,
            kind = msg.type, body = msg.payload, bare = msg.username,
        }
    end,
    to = { "db" },
}
"""


def test_rules_route_xmpp_rows():
    tmp = tempfile.TemporaryDirectory(prefix="rtd-xmpp-rules-")
    rules = os.path.join(tmp.name, "rules")
    os.mkdir(rules)
    with open(os.path.join(rules, "chats.lua"), "w") as f:
        f.write(RULE)
    db = os.path.join(tmp.name, "rows.db")
    X.add_users(tmp.name, [(f"{u}@localhost", PW) for u in ("romeo", "juliet")])
    port = free_port()
    broker = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{port}" }} }}',
                 f'rules_dir="{rules}"', "sinks={%s}" % sqlite_sink(db), data_dir=tmp.name)
    try:
        r = X.Raw(port)
        r.login("romeo", PW, resource="garden")
        j = X.Raw(port)
        j.login("juliet", PW, resource="balcony")
        j.send("<presence><status>on the balcony</status></presence>")
        r.send("<message to='juliet@localhost' type='chat' id='m1'><body>But soft!</body>"
               "</message>")
        r.send("<message to='juliet@localhost' type='headline' id='m2'><body>news</body>"
               "</message>")  # not a chat: the rule drops it
        j.read_until(rb"<body>news</body>")
        for c in (r, j):
            c.send("</stream:stream>")
            c.read_to_close()

        def rows():
            got = query(db, "SELECT event, sender, rcpt, kind, body, bare FROM messages")
            return got if got and sum(1 for g in got if g[0] == "client.disconnected") == 2 \
                else None
        assert wait_for(rows, timeout=10), query(db, "SELECT * FROM messages")
        got = rows()
        assert ("xmpp.message", "romeo@localhost/garden", "juliet@localhost", "chat",
                "But soft!", "romeo@localhost") in got, got
        assert ("xmpp.presence", "juliet@localhost/balcony", None, "available",
                "on the balcony", "juliet@localhost") in got, got
        assert not [g for g in got if g[3] == "headline"], got
        assert sorted(g[1] for g in got if g[0] == "client.connected") == \
            ["juliet@localhost/balcony", "romeo@localhost/garden"], got

        # rtctl rules test: the rows the rule makes of an XMPP message given on the command line.
        code, out, err = broker.ctl("rules", "test", "chats", "--event", "xmpp.message",
                                    "--from", "a@localhost/x", "--to", "b@localhost", "--type",
                                    "chat", "--payload", "hi", json=True)
        assert code == 0, err
        rows = json.loads(out)["rows"]
        assert rows == [{"event": "xmpp.message", "sender": "a@localhost/x",
                         "rcpt": "b@localhost", "kind": "chat", "body": "hi"}], rows
        code, out, err = broker.ctl("rules", "test", "chats", "--event", "xmpp.message",
                                    "--type", "headline", json=True)
        assert code == 0 and json.loads(out)["rows"] == [], (out, err)
    finally:
        code, log = broker.stop()
        tmp.cleanup()
    assert code == 0, log[-3000:]
