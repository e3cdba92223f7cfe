"""One rule language across MQTT and XMPP (issue 32 section 5), end to end with paho and
slixmpp: the shipped examples etc/rules/xmpp_alarm.lua (a hot MQTT reading becomes a line in a
group chat room, through the xmpp sink) and etc/rules/xmpp_commands.lua ("/set lamp on" said
in a room publishes "on" to home/lamp/set, through the republish sink), run as shipped but
enabled; and the xmpp sink to a user, online (a chat to its session) and offline (kept, then
delivered at its next presence), and to a room that is not there (the row rejected, counted as dropped).
"""
import asyncio
import os
import re
import tempfile

import pytest

import xmpp_util as X
from conftest import ROOT, Rtd, client, free_port, subscribe, wait_for

PW = "bridge-pw"
ROOM = "alerts@conference.localhost"

DOOR_RULE = """
return {
    name = "door",
    from = "sensors/+/door",
    select = function(msg)
        return { who = "ops", text = topic.split(msg.topic)[2] .. " door " .. msg.payload }
    end,
    to = { "direct" },
}
"""

NOWHERE_RULE = """
return {
    name = "nowhere",
    from = "sensors/+/lost",
    select = function(msg) return { text = msg.payload } end,
    to = { "nowhere" },
}
"""


def enabled_copy(name, rules):
    """A shipped rule, as etc/rules has it but enabled."""
    with open(os.path.join(ROOT, "etc", "rules", name)) as f:
        text = f.read()
    assert "enabled = false" in text
    with open(os.path.join(rules, name), "w") as f:
        f.write(text.replace("enabled = false", "enabled = true"))


@pytest.fixture(scope="module")
def server():
    tmp = tempfile.TemporaryDirectory(prefix="rtd-xmpp-mqtt-")
    rules = os.path.join(tmp.name, "rules")
    os.mkdir(rules)
    enabled_copy("xmpp_alarm.lua", rules)
    enabled_copy("xmpp_commands.lua", rules)
    for name, text in (("door.lua", DOOR_RULE), ("nowhere.lua", NOWHERE_RULE)):
        with open(os.path.join(rules, name), "w") as f:
            f.write(text)
    X.add_users(tmp.name, [(f"{u}@localhost", PW) for u in ("watcher", "juliet", "ops")])
    xport = free_port()
    sinks = ('alerts={type="xmpp",to="%s",body="${sensor}: ${temp} at ${at}",nick="alarm"},'
             'direct={type="xmpp",to="${who}@localhost",body="${text}",from="sensors@localhost"},'
             'nowhere={type="xmpp",to="nobody@conference.localhost"},'
             'republish={type="republish",topic="unused"}' % ROOM)
    rtd = Rtd(f'xmpp={{ hosts = {{ "localhost" }}, listeners = {{ "127.0.0.1:{xport}" }}, '
              f'muc_host = "conference.@HOST@" }}', f'rules_dir="{rules}"', "sinks={%s}" % sinks,
              "auth_max_delay_ms=0", data_dir=tmp.name)
    rtd.xport = xport
    yield rtd
    code, log = rtd.stop()
    tmp.cleanup()
    assert code == 0, log[-3000:]


def test_hot_mqtt_reading_reaches_the_room(server):
    """paho publishes two readings; the alarm rule passes the hot one only, which the room's
    occupants get as a groupchat from alerts@.../alarm, rendered by the sink's body template;
    the cool one never comes (the marker published after it does)."""
    async def t():
        w = await X.login(server.xport, "watcher@localhost/r", PW,
                          plugins=("xep_0045", "xep_0004"))
        muc = w.plugin["xep_0045"]
        await muc.join_muc_wait(ROOM, "watcher", timeout=X.TIMEOUT)
        await muc.set_room_config(ROOM, w.plugin["xep_0004"].make_form(ftype="submit"))
        pub = client(server.port)
        for temp in (20, 35, 40):
            pub.publish("sensors/s1/temp", f'{{"temp": {temp}}}', qos=1).wait_for_publish()
        got = [await X.next_of(w.messages, lambda m: m["type"] == "groupchat" and
                               m["body"].startswith("s1: ")) for _ in range(2)]
        assert [str(m["from"]) for m in got] == [f"{ROOM}/alarm"] * 2, got
        assert [m["body"].split(" at ")[0] for m in got] == ["s1: 35", "s1: 40"], got
        assert re.fullmatch(r"s1: 35 at \d{4}-\d\d-\d\dT.*", got[0]["body"]), got[0]["body"]
        pub.disconnect()
        await X.logout(w)
    X.run(t())


def test_chat_command_publishes_to_the_device_topic(server):
    """juliet says "/set lamp on" in a room: the commands rule publishes "on" to
    home/lamp/set, which a paho subscriber gets; a line that is no command, and one whose
    device name would reach another topic level, publish nothing (the valid command sent
    after them is the marker that they would have come by then)."""
    sub = client(server.port)
    subscribe(sub, "home/#", qos=1)

    async def t():
        j = await X.login(server.xport, "juliet@localhost/phone", PW,
                          plugins=("xep_0045", "xep_0004"))
        muc = j.plugin["xep_0045"]
        room = "home@conference.localhost"
        await muc.join_muc_wait(room, "juliet", timeout=X.TIMEOUT)
        await muc.set_room_config(room, j.plugin["xep_0004"].make_form(ftype="submit"))
        for line in ("good morning", "/set lamp/../door open", "/set lamp on"):
            j.send_message(mto=room, mbody=line, mtype="groupchat")
        deadline = asyncio.get_running_loop().time() + X.TIMEOUT
        while not sub.got:  # slixmpp writes from this loop: wait in it, not beside it
            assert asyncio.get_running_loop().time() < deadline, "nothing published"
            await asyncio.sleep(0.01)
        await X.logout(j)
    X.run(t())
    assert sub.got == [("home/lamp/set", b"on", 1)], sub.got
    sub.disconnect()


def test_xmpp_sink_to_a_user_online_and_offline(server):
    """The door rule's rows go to ops@localhost through the "direct" sink: while ops is
    offline the message is kept (XEP-0160) and comes at its next presence; while it is online,
    it comes at once, from the sink's from JID."""
    pub = client(server.port)
    pub.publish("sensors/back/door", "opened", qos=1).wait_for_publish()
    assert wait_for(lambda: re.search(r"^rt_xmpp_offline_stored_total (\d+)",
                                      server.ctl("metrics", "prometheus")[1], re.M)
                    .group(1) != "0", timeout=X.TIMEOUT)

    async def t():
        ops = await X.login(server.xport, "ops@localhost/desk", PW)
        ops.send_presence()  # available: what was kept comes now, and the next goes here
        kept = await X.next_of(ops.messages, lambda m: m["body"] == "back door opened")
        assert str(kept["from"]) == "sensors@localhost"
        pub.publish("sensors/front/door", "closed", qos=1).wait_for_publish()
        live = await X.next_of(ops.messages, lambda m: m["body"] == "front door closed")
        assert (str(live["from"]), live["type"]) == ("sensors@localhost", "chat")
        await X.logout(ops)
    X.run(t())
    pub.disconnect()


def test_xmpp_sink_to_a_room_that_is_not_there(server):
    """A row for a room that does not exist is rejected for good (counted as dropped, with the
    reason as the sink's last error), not retried for ever."""
    pub = client(server.port)
    pub.publish("sensors/x/lost", "hello", qos=1).wait_for_publish()
    pub.disconnect()

    def dropped():
        doc = server.ctl_json("sinks", "show", "nowhere")
        return doc if doc.get("dropped", 0) >= 1 else None
    doc = wait_for(dropped, timeout=X.TIMEOUT) and dropped()
    assert doc, server.ctl_json("sinks", "show", "nowhere")
    assert doc["written"] == 0 and doc["queued"] == 0, doc
    assert "no such room" in doc.get("last_error", ""), doc
