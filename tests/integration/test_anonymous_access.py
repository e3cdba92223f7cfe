"""Who may connect (README "Who may connect"): every combination of allow_anonymous,
anonymous_from, a password file present or absent, and a CONNECT with no user name, a made-up
one, or a listed user with its password; from an address inside anonymous_from (127.0.0.1) and
one outside it (127.0.0.2); MQTT 3.1.1 and 5; over TCP, TLS and WebSocket; as started, and
after each change through `rtctl config set` and SIGHUP.

The rule under test: a user name no password file vouches for grants nothing more than no user
name. Without a password file such a client is anonymous (admitted where an anonymous one is,
refused elsewhere) and its name is not used once admitted (not for the ACL's user sections).
"""
import os
import signal

import pytest

from conftest import Rtd, free_port, wait_for
from mqtt_raw import PUBACK, PUBLISH, SUBACK, SUBSCRIBE, Raw, mqtt_str, u16
from test_auth import passwd
from transports import RawOn, WebSocket, listeners, tls_connect, tls_context

INSIDE, OUTSIDE = "127.0.0.1", "127.0.0.2"
USERS = {"none": (None, None), "made_up": ("mallory", "nonsense"), "alice": ("alice", "secret")}
REFUSED_ANONYMOUS = {4: 5, 5: 0x87}
BAD_CREDENTIALS = {4: 4, 5: 0x86}


@pytest.fixture
def broker(pki, tmp_path):
    port, tls_port, ws_port = free_port(), free_port(), free_port()
    cert, key = pki.server["ec"]
    acl = tmp_path / "rtd.acl"
    # A made-up "boss" must not get boss's rights: anonymous clients may read public/# only
    # (and write public/# and their own clients/ID/#).
    acl.write_text("topic readwrite public/#\npattern write clients/%c/#\n"
                   "user boss\ntopic readwrite #\n")
    b = Rtd(listeners(port, {"bind": f"127.0.0.1:{tls_port}", "tls": {"cert": cert, "key": key}},
                      {"bind": f"127.0.0.1:{ws_port}", "websocket": "/mqtt"}),
            'anonymous_from={"127.0.0.1/32"}', "auth_max_delay_ms=0", f'acl_file="{acl}"',
            port=port)
    b.tls_port, b.ws_port, b.ca = tls_port, ws_port, pki.ca.cert
    b.pw = tmp_path / "rtd.pw"
    yield b
    code, log = b.stop()
    assert code == 0, log[-3000:]


def connack(b, transport, version, source, user):
    name, password = USERS[user]
    kw = dict(version=version, username=name, password=password)
    cid = f"a-{transport}-{version}-{source[-1]}-{user}"
    if transport == "tcp":
        c = Raw(b.port, cid, bind=source, **kw)
    elif transport == "tls":
        c = RawOn(tls_connect(b.tls_port, tls_context(b.ca), source=source), cid, **kw)
    else:
        c = RawOn(WebSocket.connect(b.ws_port, source=source), cid, **kw)
    code = c.connack_code
    c.sock.close()
    return code


def expected(version, inside, user, allow, in_file):
    """What the login policy answers (README "Who may connect")."""
    anonymous_ok = allow and inside
    if in_file is None or user == "none":  # no password file, or no user name: anonymous
        return 0 if anonymous_ok else REFUSED_ANONYMOUS[version]
    return 0 if user in in_file else BAD_CREDENTIALS[version]


def check_matrix(b, allow, in_file, inside_addr=INSIDE):
    """in_file: the users of the password file in force, None when there is none."""
    wrong = []
    for transport in ("tcp", "tls", "ws"):
        for version in (4, 5):
            for source in (INSIDE, OUTSIDE):
                for user in USERS:
                    want = expected(version, source == inside_addr, user, allow, in_file)
                    got = connack(b, transport, version, source, user)
                    if got != want:
                        wrong.append(f"{transport} v{version} from {source} user={user}: "
                                     f"CONNACK {got:#x}, want {want:#x}")
    assert not wrong, "\n".join(wrong)


def ctl_set(b, key, value):
    code, out, err = b.ctl("config", "set", key, value)
    assert code == 0, (key, value, out, err)


def test_every_combination_as_started_and_after_changes(broker):
    b = broker
    # As started: allow_anonymous, anonymous_from 127.0.0.1/32, no password file.
    check_matrix(b, allow=True, in_file=None)
    assert ('anonymous="from 127.0.0.1/32" users="none: no password_file, a user name is '
            'anonymous"') in b.read_log()
    ctl_set(b, "allow_anonymous", "false")
    check_matrix(b, allow=False, in_file=None)
    ctl_set(b, "allow_anonymous", "true")
    assert passwd("-c", "-b", str(b.pw), "alice", "secret").returncode == 0
    ctl_set(b, "password_file", str(b.pw))
    check_matrix(b, allow=True, in_file={"alice"})
    # SIGHUP reads the password file again: alice gone, another user in her place.
    assert passwd("-D", str(b.pw), "alice").returncode == 0
    assert passwd("-b", str(b.pw), "carol", "c").returncode == 0
    reloads = b.read_log().count("rtd.reloaded")
    b.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: b.read_log().count("rtd.reloaded") > reloads)
    check_matrix(b, allow=True, in_file={"carol"})
    ctl_set(b, "allow_anonymous", "false")
    check_matrix(b, allow=False, in_file={"carol"})
    # No password file again, and anonymous_from moved to the other address.
    ctl_set(b, "allow_anonymous", "true")
    ctl_set(b, "password_file", '""')
    ctl_set(b, "anonymous_from", '{"127.0.0.2/32"}')
    check_matrix(b, allow=True, in_file=None, inside_addr=OUTSIDE)
    os.unlink(b.pw)


@pytest.mark.parametrize("version", [4, 5])
def test_a_made_up_user_name_gets_no_user_rights(broker, version):
    """boss's ACL section is not for a client that only says it is boss: with no password
    file it is anonymous, so it reads public/# only and writes nothing else, as with no name."""
    boss = Raw(broker.port, f"boss-{version}", version=version, username="boss", password="x")
    assert boss.connack_code == 0
    boss.send(SUBSCRIBE << 4 | 2,
              u16(1) + (b"\x00" if version == 5 else b"") + mqtt_str("#") + b"\x00")
    boss.expect(SUBACK)
    w = Raw(broker.port, "w", version=version)
    for topic in ("clients/w/secret", "public/fence"):
        w.send(PUBLISH << 4 | 2, mqtt_str(topic) + u16(1) + (b"\x00" if version == 5 else b"")
               + b"x")
        w.expect(PUBACK)
    got = boss.publish_fields(boss.expect(PUBLISH))
    assert got["topic"] == "public/fence", got  # clients/w/secret was boss's to read only
    if version == 5:
        boss.send(PUBLISH << 4 | 2, mqtt_str("private/x") + u16(7) + b"\x00" + b"x")
        assert boss.expect(PUBACK).body[2] == 0x87  # not authorized
    shown = broker.ctl_json("clients", "show", f"boss-{version}")
    assert shown.get("username", "") == "", shown
    boss.sock.close()
    w.sock.close()
