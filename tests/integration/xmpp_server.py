"""The XMPP server a test module runs against: rtd, or, for the differential run (issue 29:
the same test against ejabberd 23.01 and Prosody 0.12 where RFC or XEP text says what a
server does), the peer RT_XMPP_PEER names (ejabberd|prosody; xmpp_differential.sh sets it).

A module's fixture asks serve() for a server with its hosts, its accounts and the bounds the
specs leave to the server (stanza size, resumption time, offline quota), given to a peer as
its own settings; rtd's other settings go to rtd alone. Tests of what only rtd has (rtctl,
metrics, log lines, rtd's config and the exact bounds it chose) carry
@pytest.mark.rtd_only("why") and are skipped against a peer (conftest.py); a test whose
core is the spec's but which also looks at rtd's log or metrics does that under is_rtd().
"""
import os
import tempfile

import pytest

import xmpp_peer
import xmpp_util as X
from conftest import Rtd, free_port

PEER = os.environ.get("RT_XMPP_PEER", "rtd")
assert PEER in ("rtd", "ejabberd", "prosody"), f"RT_XMPP_PEER={PEER}: rtd|ejabberd|prosody"


def is_rtd(server):
    return isinstance(server, Rtd)


def rtd_deviates(why):
    """Marks a test of what the RFC or XEP says that rtd does not do yet: expected to fail on
    rtd (strict: once rtd does it, the mark must go), run as any other on a peer."""
    return pytest.mark.xfail(PEER == "rtd", reason=f"rtd deviates: {why}", strict=True)


def serve(users, password, hosts=("localhost",), anonymous=(), rtd_settings="",
          rtd_options=(), rtd_listeners="", max_stanza_size=None, resume_timeout=None,
          max_offline=None, muc=False, muc_max_occupants=None):
    """A server on a free loopback port (its .xport) with users (local parts on hosts[0])
    made with password; stop it with stop(). rtd_settings are more keys of rtd's xmpp table,
    rtd_listeners more entries of its listener list, rtd_options more -o options. muc: a
    XEP-0045 service at conference.<host> (20 messages of history), with at most
    muc_max_occupants in a room where the server has such a limit."""
    tmp = tempfile.TemporaryDirectory(prefix=f"xmpp-{PEER}-")
    port = free_port()
    bounds = {k: v for k, v in (("max_stanza_size", max_stanza_size),
                                ("resume_timeout", resume_timeout),
                                ("max_offline", max_offline)) if v is not None}
    if muc:
        bounds["muc"] = True
        if muc_max_occupants is not None:
            bounds["muc_max_occupants"] = muc_max_occupants
    if PEER != "rtd":
        server = xmpp_peer.Peer(PEER, tmp.name, port, list(hosts) + list(anonymous),
                                list(anonymous), users, password, **bounds)
        server.tmp = tmp
        return server
    X.add_users(tmp.name, [(f"{u}@{hosts[0]}", password) for u in users])
    names = {"max_offline": "max_offline_messages"}
    table = "".join(f", {names.get(k, k)} = {v}" for k, v in bounds.items() if k[:3] != "muc")
    if muc:
        table += ', muc_host = "conference.@HOST@", muc_history = 20'
        if muc_max_occupants is not None:
            table += f", muc_max_occupants = {muc_max_occupants}"
    anon = f", anonymous = {xmpp_peer.lua_list(anonymous)}" if anonymous else ""
    server = Rtd(f"xmpp={{ hosts = {xmpp_peer.lua_list(list(hosts) + list(anonymous))}{anon}, "
                 f'listeners = {{ "127.0.0.1:{port}"{rtd_listeners} }}{table}{rtd_settings} }}',
                 *rtd_options, data_dir=tmp.name)
    server.xport, server.tmp = port, tmp
    return server


def stop(server):
    code, log = server.stop()
    server.tmp.cleanup()
    assert code == 0, log[-3000:]
