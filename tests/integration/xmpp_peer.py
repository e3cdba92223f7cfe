"""ejabberd 23.01 and Prosody 0.12 from Debian as plain processes, for the XMPP differential
run (xmpp_server.py, xmpp_differential.sh) and the benchmark beside them
(tests/bench/xmpp_peers.sh): each gets its config and data in a folder of the caller's, a
loopback port, accounts by in-band registration (XEP-0077, open to 127.0.0.1 only), and is
ended by the PID started here. Nothing here installs anything: `tools/install-deps.sh --for
test` installs both, without their system services (test_xmpp_s2s_peers.py federates with
them in every run); by hand:

    printf '#!/bin/sh\\nexit 101\\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
    apt-get install -y ejabberd prosody; rm /usr/sbin/policy-rc.d

Two profiles. "bench" (and "bench-anon", Prosody's anonymous-only host) is what the benchmark
compares: what rtd has too (roster, presence, offline, ping, disco), accounts stored as
SCRAM-SHA-256 keys ("bench-plain": ejabberd as its package ships it, passwords stored in
clear, so that each SCRAM login derives the keys). "tests" is what the functional tests need and rtd serves: also carbons,
stream management, blocking, vcard-temp, caps, roster versioning, an anonymous host, and
plain stored passwords, so that both SCRAM-SHA-1 and SCRAM-SHA-256 are offered, as rtd does;
and, for a module that asks (muc=True), multi-user chat (XEP-0045) at conference.HOST; and
for one that asks (s2s=(address, PEM, CA), ejabberd), federation on address:5269 with
STARTTLS and dialback, and SASL EXTERNAL for certificates from CA (None: none trusted).

Also a command, for the benchmark's shell script:
    xmpp_peer.py config ejabberd|prosody DIR PORT bench|bench-anon|bench-plain   (DIR's config)
"""
import os
import re
import socket
import subprocess
import sys

EJABBERD_LIB = "/usr/lib/x86_64-linux-gnu"
EJABBERD_DIR = EJABBERD_LIB + "/ejabberd-23.01"
PROSODY = "/usr/bin/prosody"
START_S = 60  # ejabberd's first start makes its mnesia tables; seconds, on a loaded machine
INSTALL_HINT = "run tools/install-deps.sh --for test (or see xmpp_peer.py's header)"


def installed(name):
    return os.path.isdir(EJABBERD_DIR) if name == "ejabberd" else os.access(PROSODY, os.X_OK)


def lua_list(items):
    return "{ " + ", ".join(f'"{i}"' for i in items) + " }"


def ejabberd_config(port, hosts, anonymous, profile, max_stanza_size=262144, resume_timeout=300,
                    max_offline=None, tls_port=None, tls_pem=None, muc=False,
                    muc_max_occupants=None, s2s=None):
    bench = profile.startswith("bench")
    lines = [f"hosts: [{', '.join(repr(h) for h in hosts)}]",
             "loglevel: warning", "log_rotate_count: 0",
             "listen:", f"  - port: {port}", '    ip: "127.0.0.1"', "    module: ejabberd_c2s",
             f"    max_stanza_size: {max_stanza_size}", "    backlog: 4096",
             "    access: c2s", "    starttls_required: false"]
    if tls_port:  # direct TLS (XEP-0368) beside it, for clients with no SCRAM (Tsung's PLAIN)
        lines += [f"  - port: {tls_port}", '    ip: "127.0.0.1"', "    module: ejabberd_c2s",
                  "    tls: true", f"    max_stanza_size: {max_stanza_size}",
                  "    backlog: 4096", "    access: c2s", f'certfiles: ["{tls_pem}"]']
    if s2s:  # (address, PEM, CA or None): federation on address:5269, STARTTLS, dialback
        lines += ["  - port: 5269", f'    ip: "{s2s[0]}"', "    module: ejabberd_s2s_in",
                  f'certfiles: ["{s2s[1]}"]', "s2s_use_starttls: optional"]
        if s2s[2]:  # certificates from that CA prove their domains (SASL EXTERNAL)
            lines += [f'ca_file: "{s2s[2]}"']
    lines += ["allow_multiple_connections: true", "registration_timeout: infinity"]
    if bench:
        # Both methods on one host: internal (SCRAM-SHA-256 keys) and SASL ANONYMOUS.
        lines += ["auth_method: [internal, anonymous]", "anonymous_protocol: sasl_anon"]
        lines += (["auth_password_format: plain"] if profile == "bench-plain" else
                  ["auth_password_format: scram", "auth_scram_hash: sha256"])
    else:
        lines += ["auth_method: [internal]", "auth_password_format: plain"]
        if anonymous:
            lines += ["host_config:"]
            for h in anonymous:
                lines += [f"  {h!r}:", "    auth_method: [anonymous]",
                          "    anonymous_protocol: sasl_anon"]
    lines += ["acl:", "  loopback:", '    ip: ["127.0.0.0/8"]',
              "access_rules:", "  c2s:", "    allow: all", "  register:", "    allow: all",
              "  register_from:", "    allow: loopback", "  local:", "    allow: all"]
    if max_offline is not None:
        lines += ["shaper_rules:", f"  max_user_offline_messages: {max_offline}"]
    mods = {"mod_disco": "{}", "mod_offline": "{}", "mod_ping": "{}", "mod_roster": "{}",
            "mod_register": "\n    ip_access: register_from\n    access: register"}
    if not bench:
        mods.update({
            "mod_roster": "\n    versioning: true",
            "mod_offline": "\n    access_max_user_messages: max_user_offline_messages"
            if max_offline is not None else "{}",
            "mod_carboncopy": "{}", "mod_blocking": "{}", "mod_privacy": "{}",
            "mod_vcard": "\n    search: false", "mod_caps": "{}", "mod_client_state": "{}",
            # PEP (XEP-0163), as ejabberd's own default configuration has it.
            "mod_pubsub": '\n    plugins: ["flat", "pep"]',
            # As rtd (XEP-0198 5 allows an error to the sender too): what a session that
            # timed out held goes to the offline store; ejabberd's default bounces it.
            "mod_stream_mgmt": f"\n    resume_timeout: {resume_timeout}\n"
                               "    resend_on_timeout: true"})
    if s2s:
        mods["mod_s2s_dialback"] = "{}"
    if muc:
        # XEP-0045 at conference.HOST, as rtd's muc_host: anyone may make a room, which is
        # temporary, public, semi-anonymous (real JIDs to moderators), keeps 20 messages of history and
        # lets occupants change the subject and invite; at most muc_max_occupants in a room
        # (ejabberd's own limit on the room's max_users; its owners and the service's admins
        # may still pass it by max_users_admin_threshold, at least 1: the tests fill a room
        # with a user who is neither).
        limit = muc_max_occupants if muc_max_occupants is not None else 200
        mods["mod_muc"] = ('\n    host: "conference.@HOST@"\n    access: all\n'
                           "    access_create: all\n    access_persistent: all\n"
                           f"    history_size: 20\n    max_users: {limit}\n"
                           "    default_room_options:\n      public: true\n"
                           "      persistent: false\n      allow_change_subj: true\n"
                           "      allow_user_invites: true\n"
                           "      allow_private_messages: true\n      mam: false\n"
                           f"      max_users: {limit}")
        if bench:  # tests/bench/xmpp_muc.sh: every presence broadcast (as rtd), no shaper
            mods["mod_muc"] += (f"\n    max_users_presence: {limit}\n    room_shaper: none\n"
                                "    user_message_shaper: none\n    user_presence_shaper: none\n"
                                "    min_message_interval: 0\n    min_presence_interval: 0")
    lines += ["modules:"] + [f"  {m}:{v if v.startswith(chr(10)) else ' ' + v}"
                             for m, v in sorted(mods.items())]
    return "\n".join(lines) + "\n"


def prosody_config(directory, port, hosts, anonymous, profile, max_stanza_size=262144,
                   resume_timeout=300, max_offline=None, muc=False, muc_max_occupants=None):
    bench = profile.startswith("bench")
    modules = ["roster", "saslauth", "disco", "ping", "register", "offline", "posix"]
    if not bench:
        modules += ["carbons", "blocklist", "vcard", "smacks", "csi_simple", "pep"]
    out = ['run_as_root = true', f'pidfile = "{directory}/prosody.pid"',
           f'data_path = "{directory}/data"', f'log = {{ warn = "{directory}/prosody.log" }}',
           'network_backend = "epoll"',
           "network_settings = { tcp_backlog = 4096 } -- as rtd's and ejabberd's (default 128)",
           f"c2s_ports = {{ {port} }}", 'c2s_interfaces = { "127.0.0.1" }',
           "s2s_ports = { }", "http_ports = { }", "https_ports = { }",
           "c2s_direct_tls_ports = { }", "c2s_require_encryption = false",
           "allow_registration = true", 'registration_whitelist = { "127.0.0.1" }',
           'password_hash = "SHA-256"', "default_iteration_count = 4096",
           f"modules_enabled = {lua_list(modules)}", 'modules_disabled = { "s2s" }']
    if not bench:
        out += [f"c2s_stanza_size_limit = {max_stanza_size}",
                f"smacks_hibernation_time = {resume_timeout}"]
    if profile == "bench":
        auth = "internal_hashed"
    elif profile == "bench-anon":
        auth = "anonymous"  # Prosody serves ANONYMOUS only on a host with nothing else
    else:
        auth = "internal_plain"
    for h in hosts:
        out += [f'VirtualHost "{h}"',
                f'    authentication = "{"anonymous" if h in anonymous else auth}"']
    if muc:
        # XEP-0045 at conference.HOST (components after the hosts). Prosody 0.12 has no
        # occupant limit of its own (muc_max_occupants is ignored: a test of it skips here);
        # its new rooms stay locked until configured (muc_room_locking, as XEP-0045 10.1.2),
        # which the tests do; public rooms, as ejabberd's default.
        for h in hosts:
            if h not in anonymous:
                out += [f'Component "conference.{h}" "muc"', "    muc_room_default_public = true",
                        "    muc_room_default_history_length = 20",
                        "    max_history_messages = 20"]
                if bench:  # tests/bench/xmpp_muc.sh: rooms open at once, as ejabberd's
                    # (rooms kept in memory: 100 by default, past which every join of a
                    # new room tries to evict an occupied one; xmpp_muc.sh makes 10,000)
                    out += ["    muc_room_locking = false",
                            f"    muc_max_occupants = {muc_max_occupants or 200}",
                            "    muc_room_cache_size = 100000"]
    return "\n".join(out) + "\n"


def write_config(name, directory, port, profile, hosts=("localhost",), anonymous=(), **bounds):
    """Writes NAME's config into directory (made, with its data folder); returns its path."""
    os.makedirs(os.path.join(directory, "data"), exist_ok=True)
    if name == "ejabberd":
        path, text = os.path.join(directory, "ejabberd.yml"), ejabberd_config(
            port, hosts, anonymous, profile, **bounds)
    elif name == "prosody":
        path, text = os.path.join(directory, "prosody.cfg.lua"), prosody_config(
            directory, port, hosts, anonymous, profile, **bounds)
    else:
        raise ValueError(f"unknown peer {name!r}")
    with open(path, "w") as f:
        f.write(text)
    return path


def command(name, directory):
    """(argv, env) that start NAME from the config write_config put in directory; the
    process started is the server's own (erl execs erlexec, which execs beam.smp)."""
    if name == "prosody":
        return [PROSODY, "--config", os.path.join(directory, "prosody.cfg.lua"), "-F"], {}
    os.makedirs(os.path.join(directory, "spool"), exist_ok=True)
    env = {"ERL_LIBS": EJABBERD_LIB, "EJABBERD_CONFIG_PATH": os.path.join(directory, "ejabberd.yml"),
           "EJABBERD_LOG_PATH": os.path.join(directory, "ejabberd.log"), "ERL_MAX_PORTS": "65536",
           "ERL_CRASH_DUMP": os.path.join(directory, "erl_crash.dump")}
    # No -sname: a bare node needs no epmd.
    return ["erl", "+K", "true", "+P", "1000000", "-noinput", "-noshell", "-mnesia", "dir",
            f'"{directory}/spool"', "-s", "ejabberd"], env


def _stream(host):
    return (f"<?xml version='1.0'?><stream:stream to='{host}' version='1.0' "
            "xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>")


def register(port, jid, password, timeout=30):
    """An account by XEP-0077 in-band registration on a stream of its own."""
    user, _, host = jid.partition("@")
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall((_stream(host) + "<iq type='set' id='reg'><query xmlns='jabber:iq:register'>"
                   f"<username>{user}</username><password>{password}</password></query></iq>")
                  .encode())
        buf = b""
        rx = re.compile(rb"<iq[^>]*id=['\"]reg['\"][^>]*(/>|>.*?</iq>)", re.S)
        while not rx.search(buf):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    m = rx.search(buf)
    if not m or b"type='result'" not in m.group(0) and b'type="result"' not in m.group(0):
        raise RuntimeError(f"registering {jid}: {buf[-1000:]!r}")


class Peer:
    """NAME serving hosts on port from directory, with users registered (password for all).
    stop() answers as an Rtd's: (exit code, the server's log text)."""

    def __init__(self, name, directory, port, hosts, anonymous, users, password, netns=None,
                 **bounds):
        if not installed(name):
            raise RuntimeError(f"{name} is not installed: {INSTALL_HINT}")
        self.name, self.dir, self.xport = name, directory, port
        write_config(name, directory, port, "tests", hosts, anonymous, **bounds)
        argv, env = command(name, directory)
        if netns:  # a dns_util.Netns: the server runs there (the caller's thread is too)
            argv = netns.command(argv)
        self.log_path = os.path.join(directory, "server.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         env=dict(os.environ, **env), cwd=directory)
        # The port opens after the modules start (ejabberd listens last), so a connection
        # that is taken is one that is served.
        from conftest import wait_listening
        wait_listening(self.proc, port, START_S, name, self.read_log)
        try:
            for u in users:
                register(port, u if "@" in u else f"{u}@{hosts[0]}", password)
        except Exception:
            self.stop()
            raise

    def read_log(self):
        out = []
        for f in sorted(os.listdir(self.dir)):
            if f.endswith(".log"):
                with open(os.path.join(self.dir, f), errors="replace") as fh:
                    out.append(f"== {f}\n" + fh.read())
        return "\n".join(out)

    def stop(self):
        from conftest import end_process
        end_process(self.proc, 20)
        # A peer's exit status on SIGTERM is its own business (beam exits 143): not checked.
        return 0, self.read_log()


if __name__ == "__main__":
    muc = {}
    if "--muc" in sys.argv:  # config ... --muc N: XEP-0045, N occupants a room (xmpp_muc.sh)
        i = sys.argv.index("--muc")
        muc = {"muc": True, "muc_max_occupants": int(sys.argv[i + 1])}
        del sys.argv[i:i + 2]
    if len(sys.argv) not in (6, 8) or sys.argv[1] != "config" or sys.argv[5] not in (
            "bench", "bench-anon", "bench-plain") or (len(sys.argv) == 8 and sys.argv[2] != "ejabberd"):
        sys.exit("usage: xmpp_peer.py config ejabberd|prosody DIR PORT bench|bench-anon|bench-plain "
                 "[TLS_PORT PEM (ejabberd)] [--muc MAX_OCCUPANTS]")
    tls = {"tls_port": int(sys.argv[6]), "tls_pem": sys.argv[7]} if len(sys.argv) == 8 else {}
    write_config(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], **tls, **muc)
