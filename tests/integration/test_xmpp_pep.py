"""PEP (XEP-0163, on XEP-0060's nodes and items) on a real rtd with slixmpp clients (Debian's
1.8.3: its xep_0060, xep_0163, xep_0172 nicknames, xep_0223 private storage and xep_0115
capabilities plugins, which advertise +notify as Conversations and Gajim do), and the raw
client where exact errors matter.

One server serves the module (rtd, or the differential run's peer: xmpp_server.py); every
test has its own accounts.
"""
import xml.etree.ElementTree as ET

import pytest

import xmpp_server as S
import xmpp_util as X

PW = "s3cret-pw"
NS_PUBSUB = "http://jabber.org/protocol/pubsub"
NS_NICK = "http://jabber.org/protocol/nick"
NODES = 6          # pep_max_nodes here
BYTES = 16 * 1024  # pep_max_bytes here

USERS = """nickpub nicksub nickdeaf latepub latesub readpub readfriend readstranger
privowner privfriend maxpub maxsub optpub openpub openstranger boundpub delpub
delfriend newpub newsub""".split()


@pytest.fixture(scope="module")
def xmpp():
    server = S.serve(USERS, PW, rtd_settings=f", pep_max_nodes = {NODES}, "
                     f"pep_max_bytes = {BYTES}", rtd_options=("auth_max_delay_ms=0",))
    yield server
    S.stop(server)


def jid(user):
    return f"{user}@localhost"


async def online(xmpp, user, plugins=(), notify=()):
    """Logged in with plugins, roster fetched, initial presence sent (with caps when
    xep_0115 is among the plugins' dependencies), asking to be told of the nodes notify
    (their +notify features) as well."""
    c = await X.login(xmpp.xport, jid(user) + "/r", PW,
                      plugins=list(plugins) + (["xep_0115"] if notify else []))
    for node in notify:
        c.plugin["xep_0030"].add_feature(node + "+notify")
    if notify:
        await c.plugin["xep_0115"].update_caps()
    await c.get_roster()
    c.send_presence()
    return c


async def friends(a, b):
    """a and b subscribed to each other's presence (both ways): each has had the other's
    "subscribed", which the server sends once it has changed both rosters."""
    for x, y in ((a, b), (b, a)):
        x.send_presence(pto=y.boundjid.bare, ptype="subscribe")
        await X.next_of(y.presences, lambda p: p["type"] == "subscribe")
        y.send_presence(pto=x.boundjid.bare, ptype="subscribed")
        await X.next_of(x.presences, lambda p: p["type"] == "subscribed")


def queue_of(c, event):
    import asyncio
    q = asyncio.Queue()
    c.add_event_handler(event, q.put_nowait)
    return q


def all_events(c):
    """A queue of every pubsub event message c gets, whatever its plugins (slixmpp's own
    message event needs a body, which events have not)."""
    import asyncio
    from slixmpp.xmlstream.handler import Callback
    from slixmpp.xmlstream.matcher import MatchXPath
    q = asyncio.Queue()
    c.register_handler(Callback("all pubsub events", MatchXPath(
        f"{{jabber:client}}message/{{{NS_PUBSUB}#event}}event"), q.put_nowait))
    return q


def nick_of(msg):
    payload = msg["pubsub_event"]["items"]["item"]["payload"]
    return payload.text if payload.tag == f"{{{NS_NICK}}}nick" else None


def options(c, **fields):
    """A publish-options form (XEP-0060 7.1.5): fields as pubsub#NAME=value."""
    form = c.plugin["xep_0004"].stanza.Form()
    form["type"] = "submit"
    form.add_field(var="FORM_TYPE", ftype="hidden",
                   value="http://jabber.org/protocol/pubsub#publish-options")
    for name, value in fields.items():
        form.add_field(var="pubsub#" + name, value=value)
    return form


async def iq_error(coro):
    from slixmpp.exceptions import IqError
    with pytest.raises(IqError) as e:
        await coro
    return e.value.iq["error"]["condition"]


# ejabberd 23.01 sends a subscriber made after both logged in no event, live or last, though it
# sends the last item at the subscriber's next login (test_last_item_comes_at_login).
EJABBERD_LATE_SUBSCRIBER = pytest.mark.skipif(
    S.PEER == "ejabberd", reason="ejabberd 23.01 tells a subscription made while online nothing")


@EJABBERD_LATE_SUBSCRIBER
def test_publish_reaches_contacts_that_asked_and_no_others(xmpp):
    """XEP-0163 4.3: a nickname published goes to the owner's contacts subscribed to its
    presence whose client asked for the node (+notify in its caps); a contact whose client
    did not ask gets nothing, nor does the owner's one that did not."""
    async def t():
        pub = await online(xmpp, "nickpub")
        sub = await online(xmpp, "nicksub", plugins=["xep_0172"])
        deaf = await online(xmpp, "nickdeaf")
        heard = all_events(deaf)
        events = queue_of(sub, "user_nick_publish")
        await friends(pub, sub)
        await friends(pub, deaf)
        pub.register_plugin("xep_0172")
        await pub.plugin["xep_0172"].publish_nick("Romeo Montague")
        got = await X.next_of(events, lambda m: nick_of(m) == "Romeo Montague")
        assert got["from"] == jid("nickpub")
        assert got["type"] == "headline"
        assert got["to"] == sub.boundjid  # the full JID of the resource told
        # A chat sent after the publish's answer reaches deaf after anything it was sent.
        pub.send_message(mto=deaf.boundjid, mbody="marker", mtype="chat")
        await X.next_of(deaf.messages, lambda m: m["body"] == "marker")
        assert heard.empty(), heard.get_nowait()
        await X.logout(pub, sub, deaf)
    X.run(t())


def test_last_item_comes_at_login(xmpp):
    """XEP-0163 4.3.4: a contact that logs in asking for the node gets its last item; the
    owner's own later resource too."""
    async def t():
        pub = await online(xmpp, "latepub")
        sub = await online(xmpp, "latesub")
        await friends(pub, sub)
        pub.register_plugin("xep_0172")
        await pub.plugin["xep_0172"].publish_nick("first")
        await pub.plugin["xep_0172"].publish_nick("second")
        await X.logout(sub)
        later = await X.login(xmpp.xport, jid("latesub") + "/later", PW, plugins=["xep_0172"])
        events = queue_of(later, "user_nick_publish")
        await later.get_roster()
        later.send_presence()
        got = await X.next_of(events)
        assert nick_of(got) == "second" and got["from"] == jid("latepub")
        own = await X.login(xmpp.xport, jid("latepub") + "/other", PW, plugins=["xep_0172"])
        own_events = queue_of(own, "user_nick_publish")
        await own.get_roster()
        own.send_presence()
        assert nick_of(await X.next_of(own_events)) == "second"
        await X.logout(pub, later, own)
    X.run(t())


@EJABBERD_LATE_SUBSCRIBER
def test_last_item_comes_when_the_subscription_starts(xmpp):
    """XEP-0163 4.3 (XEP-0060's send_last_published_item on_sub_and_presence): a contact online
    and asking for the node gets its last item as soon as it is subscribed to the owner's
    presence, not at its next login."""
    async def t():
        pub = await online(xmpp, "newpub", plugins=["xep_0172"])
        await pub.plugin["xep_0172"].publish_nick("already there")
        sub = await online(xmpp, "newsub", plugins=["xep_0172"])
        events = queue_of(sub, "user_nick_publish")
        await friends(sub, pub)
        got = await X.next_of(events)
        assert nick_of(got) == "already there" and got["from"] == jid("newpub"), got
        await X.logout(pub, sub)
    X.run(t())


def test_items_readable_by_subscribers_not_strangers(xmpp):
    """XEP-0060 6.5 with the presence access model (XEP-0163's default): the owner and a
    contact subscribed to its presence read the node; someone else gets an error."""
    async def t():
        pub = await online(xmpp, "readpub", plugins=["xep_0172"])
        friend = await online(xmpp, "readfriend", plugins=["xep_0060"])
        stranger = await online(xmpp, "readstranger", plugins=["xep_0060"])
        await friends(pub, friend)
        await pub.plugin["xep_0172"].publish_nick("Juliet")
        for reader in (pub, friend):
            items = await reader.plugin["xep_0060"].get_items(jid("readpub"), NS_NICK)
            got = [i["payload"].text for i in items["pubsub"]["items"]]
            assert got == ["Juliet"]
        cond = await iq_error(stranger.plugin["xep_0060"].get_items(jid("readpub"), NS_NICK))
        assert cond in ("item-not-found", "not-authorized", "forbidden"), cond
        await X.logout(pub, friend, stranger)
    X.run(t())


def test_private_storage_is_the_owners_alone(xmpp):
    """XEP-0223 (how bookmarks and other private data are kept in PEP): publish-options with
    the whitelist access model; the owner reads it back, a contact subscribed both ways can
    neither read it nor is told of it."""
    async def t():
        owner = await online(xmpp, "privowner", plugins=["xep_0223", "xep_0048"])
        friend = await online(xmpp, "privfriend", plugins=["xep_0060"],
                              notify=["storage:bookmarks"])
        await friends(owner, friend)
        told = all_events(friend)
        bookmarks = owner.plugin["xep_0048"].stanza.Bookmarks()
        bookmarks.add_conference("room@conference.localhost", "nick", name="The room",
                                 autojoin=True)
        await owner.plugin["xep_0223"].store(bookmarks, node="storage:bookmarks", id="current")
        items = await owner.plugin["xep_0060"].get_items(jid("privowner"), "storage:bookmarks")
        [item] = items["pubsub"]["items"]
        assert "room@conference.localhost" in str(item)
        cond = await iq_error(friend.plugin["xep_0060"].get_items(jid("privowner"),
                                                                  "storage:bookmarks"))
        assert cond in ("item-not-found", "not-allowed", "forbidden"), cond  # 6.5.9.4
        owner.send_message(mto=friend.boundjid, mbody="marker", mtype="chat")
        await X.next_of(friend.messages, lambda m: m["body"] == "marker")
        assert told.empty()
        await X.logout(owner, friend)
    X.run(t())


@pytest.mark.skipif(S.PEER == "ejabberd", reason="ejabberd 23.01 refuses pubsub#max_items in "
                    "publish-options (resource-constraint, 'Unknown field')")
def test_max_items_keeps_the_newest_and_retract_is_told(xmpp):
    """XEP-0060 7.1.5 publish-options pubsub#max_items: the node keeps the newest; an item
    published again with its id is replaced; a retract with notify='true' is told to the
    contacts that asked (7.2.2.1)."""
    node = "urn:example:pep:list"

    async def t():
        pub = await online(xmpp, "maxpub", plugins=["xep_0060", "xep_0004"])
        sub = await online(xmpp, "maxsub", plugins=["xep_0060"], notify=[node])
        await friends(pub, sub)
        published = queue_of(sub, "pubsub_publish")
        retracted = queue_of(sub, "pubsub_retract")
        form = options(pub, max_items="2")
        for i in ("a", "b", "c", "b"):
            payload = ET.fromstring(f"<entry xmlns='urn:example:pep'>{i}</entry>")
            await pub.plugin["xep_0060"].publish(jid("maxpub"), node, id=i, payload=payload,
                                                 options=form)
        items = await pub.plugin["xep_0060"].get_items(jid("maxpub"), node)
        assert [i["id"] for i in items["pubsub"]["items"]] == ["c", "b"]
        await X.next_of(published, lambda m: m["pubsub_event"]["items"]["item"]["id"] == "c")
        await pub.plugin["xep_0060"].retract(jid("maxpub"), node, "c", notify=True)
        got = await X.next_of(retracted)
        assert got["pubsub_event"]["items"]["retract"]["id"] == "c"
        items = await pub.plugin["xep_0060"].get_items(jid("maxpub"), node)
        assert [i["id"] for i in items["pubsub"]["items"]] == ["b"]
        await X.logout(pub, sub)
    X.run(t())


def test_publish_options_that_do_not_match_are_refused(xmpp):
    """XEP-0060 7.1.5: a node made private, then a publish whose options ask for the presence
    access model: conflict with precondition-not-met, the item not kept."""
    async def t():
        pub = await online(xmpp, "optpub", plugins=["xep_0060", "xep_0004"])
        one = ET.fromstring("<secret xmlns='urn:example:pep'>one</secret>")
        await pub.plugin["xep_0060"].publish(
            jid("optpub"), "urn:example:pep:secret", id="one", payload=one,
            options=options(pub, access_model="whitelist", persist_items="true"))
        two = ET.fromstring("<secret xmlns='urn:example:pep'>two</secret>")
        cond = await iq_error(pub.plugin["xep_0060"].publish(
            jid("optpub"), "urn:example:pep:secret", id="two", payload=two,
            options=options(pub, access_model="presence")))
        assert cond == "conflict"
        items = await pub.plugin["xep_0060"].get_items(jid("optpub"), "urn:example:pep:secret")
        assert [i["id"] for i in items["pubsub"]["items"]] == ["one"]
        await X.logout(pub)
    X.run(t())


def test_open_node_is_read_by_anyone(xmpp):
    """The open access model (an OMEMO device list is published so): someone with no
    subscription reads it."""
    node = "eu.siacs.conversations.axolotl.devicelist"

    async def t():
        pub = await online(xmpp, "openpub", plugins=["xep_0060", "xep_0004"])
        stranger = await online(xmpp, "openstranger", plugins=["xep_0060"])
        form = options(pub, access_model="open")
        devices = ET.fromstring("<list xmlns='eu.siacs.conversations.axolotl'>"
                                "<device id='12345'/></list>")
        await pub.plugin["xep_0060"].publish(jid("openpub"), node, id="current",
                                             payload=devices, options=form)
        items = await stranger.plugin["xep_0060"].get_items(jid("openpub"), node)
        [item] = items["pubsub"]["items"]
        assert "12345" in str(item)
        await X.logout(pub, stranger)
    X.run(t())


@pytest.mark.rtd_only("pep_max_nodes and pep_max_bytes are rtd's settings")
def test_bounds_refuse_with_not_acceptable(xmpp):
    """pep_max_nodes and pep_max_bytes: a publish that would make one node more, or keep more
    bytes for the account, is refused (not-acceptable) and nothing is kept; an item replaced
    frees its bytes."""
    async def t():
        r = X.Raw(xmpp.xport)
        r.login("boundpub", PW, resource="r")

        def publish(node, payload, id_):
            r.send(f"<iq type='set' id='{id_}'><pubsub xmlns='{NS_PUBSUB}'>"
                   f"<publish node='{node}'><item id='x'>{payload}</item></publish>"
                   f"</pubsub></iq>")
            return r.read_until(rb"<iq[^>]*id='" + id_.encode() + rb"'[^>]*(/>|>.*?</iq>)")
        for i in range(NODES):
            assert "type='result'" in publish(f"n{i}", f"<v xmlns='urn:x'>{i}</v>", f"p{i}")
        refused = publish("one-more", "<v xmlns='urn:x'/>", "over")
        assert "type='error'" in refused and "not-acceptable" in refused, refused
        big = "<v xmlns='urn:x'>" + "x" * (BYTES // 2) + "</v>"
        assert "type='result'" in publish("n0", big, "big1")
        refused = publish("n1", big, "big2")
        assert "not-acceptable" in refused, refused
        assert "type='result'" in publish("n0", "<v xmlns='urn:x'/>", "small")
        assert "type='result'" in publish("n1", big, "big3")  # n0's bytes were freed
        r.close()
    X.run(t())


@pytest.mark.rtd_only("rtctl is rtd's")
def test_removed_account_loses_its_nodes(xmpp):
    """Deleting an account deletes its PEP nodes with it: a new account of the name has none,
    and its contacts cannot read the old items."""
    async def t():
        pub = await online(xmpp, "delpub", plugins=["xep_0172"])
        await pub.plugin["xep_0172"].publish_nick("old name")
        await X.logout(pub)
        code, out, err = xmpp.ctl("xmpp", "user", "del", jid("delpub"))
        assert code == 0, (out, err)
        code, out, err = xmpp.ctl("xmpp", "user", "add", jid("delpub"), "--password", PW)
        assert code == 0, (out, err)
        again = await online(xmpp, "delpub", plugins=["xep_0172"])
        cond = await iq_error(again.plugin["xep_0060"].get_items(jid("delpub"), NS_NICK))
        assert cond == "item-not-found"
        await X.logout(again)
    X.run(t())
