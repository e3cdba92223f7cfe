# xmpp_servers.sh: sourced by xmpp_peers.sh and xmpp_tsung.sh; starts, stops and fills the
# servers they compare (rtd, ejabberd 23.01, Prosody 0.12), each a process of ours with its
# own config and data under $WORK/NAME, on its own loopback port, ended by its PID.
#
# The caller sets WORK (a mktemp -d folder), RTD (rtd's binary), LOAD (xmpp_load.py) and
# CASE_TIMEOUT_S, and may set TLS_PEM (a PEM file holding a certificate for "localhost" and
# its key): then rtd and ejabberd also serve direct TLS (XEP-0368) on TLS_PORT. start_server
# sets SERVER_PID, PORT (plain TCP, where SASL is allowed from loopback) and TLS_PORT.
# RTD_LOG_LEVEL (default warning, the peers' level) sets rtd's log_level.

free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
load1() { cut -d' ' -f1 /proc/loadavg; }

# rtd's direct TLS listener in its config, when TLS_PEM is set (nothing otherwise); the
# peers get theirs from xmpp_peer.py.
tls_listener() {
    [[ -n "${TLS_PEM:-}" ]] || return 0
    printf ',\n    { bind = "127.0.0.1:%s", tls = { cert = "%s", key = "%s" } }' \
        "$TLS_PORT" "$TLS_PEM" "$TLS_PEM"
}

# Writes NAME's config for MODE (anon|scram) under $WORK/NAME; prints nothing.
write_config() {
    local name=$1 mode=$2 port=$3 dir="$WORK/$1"
    mkdir -p "$dir/data" "$dir/rules"
    case "$name" in
    rtd)
        cat >"$dir/rtd.conf" <<EOF
listeners = { "127.0.0.1:$(free_port)" }
data_dir = "$dir/data"
rules_dir = "$dir/rules"
max_connections_per_ip = 0
max_connection_rate = 0
-- Warnings and errors only, as the peers' configs have it (ejabberd's loglevel: warning,
-- Prosody's log = { warn = ... }): at info rtd writes a line a login (its peer and JID).
log_level = "${RTD_LOG_LEVEL:-warning}"
-- A login waits behind the roster set-up's writes in the store: 10 s (the default) is
-- too short for xroster's storm on a busy machine.
connect_timeout = 120
xmpp = { hosts = { "localhost" }, anonymous = { "localhost" },
         listeners = { "127.0.0.1:$port"$(tls_listener) }, archive = ${RTD_ARCHIVE:-false} }
EOF
        ;;
    ejabberd | ejabberd-plain | prosody)
        # The peers' configs are the functional tests' too (tests/integration/xmpp_peer.py,
        # its "bench" profiles): only what rtd has as well (roster, presence, offline, ping,
        # disco), SCRAM-SHA-256 keys, ejabberd's ANONYMOUS beside them on the one host and
        # Prosody's on an anonymous-only host (mode anon).
        local profile=bench peer=$name
        [[ "$name" == prosody && "$mode" == anon ]] && profile=bench-anon
        [[ "$name" == ejabberd-plain ]] && peer=ejabberd profile=bench-plain
        python3 "$ROOT/tests/integration/xmpp_peer.py" config "$peer" "$dir" "$port" "$profile" \
            ${TLS_PEM:+"$TLS_PORT" "$TLS_PEM"}
        ;;
    esac
}

# Starts NAME in MODE on a new port: sets SERVER_PID and PORT, waits until it listens.
start_server() {
    local name=$1 mode=$2 dir="$WORK/$1" i
    PORT=$(free_port)
    TLS_PORT=$(free_port)
    write_config "$name" "$mode" "$PORT"
    case "$name" in
    rtd)
        "$RTD" -c "$dir/rtd.conf" >>"$dir/server.log" 2>&1 &
        ;;
    ejabberd | ejabberd-plain)
        mkdir -p "$dir/spool"
        # erl execs erlexec, which execs beam.smp: $! is the VM's PID.
        env ERL_LIBS=/usr/lib/x86_64-linux-gnu EJABBERD_CONFIG_PATH="$dir/ejabberd.yml" \
            EJABBERD_LOG_PATH="$dir/ejabberd.log" ERL_MAX_PORTS=65536 \
            ERL_CRASH_DUMP="$dir/erl_crash.dump" \
            erl +K true +P 1000000 -noinput -noshell \
            -mnesia dir "\"$dir/spool\"" -s ejabberd >>"$dir/server.log" 2>&1 &
        ;;
    prosody)
        prosody --config "$dir/prosody.cfg.lua" -F >>"$dir/server.log" 2>&1 &
        ;;
    esac
    SERVER_PID=$!
    for ((i = 0; i < 1200; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
            sleep 1 # let it finish starting (modules, mnesia tables) before the first sample
            return 0
        fi
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "xmpp_servers.sh: $name did not listen on $PORT:" >&2
    tail -20 "$dir/server.log" "$dir"/*.log >&2 || true
    exit 1
}

stop_server() {
    local i
    kill "$SERVER_PID" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=''
}

# Registers accounts FIRST..FIRST+COUNT-1 on NAME (stopped on return): account i is the
# user USER with {} replaced by i, its password PASSWORD likewise ("u{}" "pw": u0, u1, ...
# with password pw; "tsung{}" "pw{}": Tsung's tsungN with pwN).
register() {
    local name=$1 first=$2 count=$3 user=$4 pw=$5 dir="$WORK/$1"
    echo "xmpp_servers.sh: registering $count accounts on $name" >&2
    if [[ "$name" == rtd && -n "${SEED_DATA:-}" ]]; then
        mkdir -p "$dir/data"
        cp "$SEED_DATA"/xmpp.db* "$dir/data/"
        return
    fi
    if [[ "$name" == rtd ]]; then
        mkdir -p "$dir/data"
        seq "$first" $((first + count - 1)) |
            awk -v u="$user" -v p="$pw" '{ a = u; b = p; gsub(/\{\}/, $0, a); gsub(/\{\}/, $0, b)
                                           print a "@localhost " b }' |
            "$RTD" xmpp user import -I 4096 -d "$dir/data"
        return
    fi
    start_server "$name" scram
    local out
    out=$(timeout "$CASE_TIMEOUT_S" python3 "$LOAD" register --port "$PORT" \
        --users "${user//\{\}/%d}:${pw//\{\}/%d}:$count:$first" -C 20 \
        --deadline $((CASE_TIMEOUT_S - 20)))
    stop_server
    [[ "$out" == *'"failed": 0'* ]] || { echo "xmpp_servers.sh: $name: $out" >&2; exit 1; }
}

# ejabberd's accounts FIRST..FIRST+COUNT-1 (names and passwords as register's), each with the
# contacts i+-1..9 (mod COUNT) at subscription both, the rosters rtbench xroster makes
# in-band, loaded as one XEP-0227 file by ejabberd's own importer (ejabberd_piefxis) on a
# process started for it and stopped after: in-band the fill ran at 14 logins/s here (each
# login subscribes to 18 and approves 18), 45 minutes for 19,000 accounts. Prints nothing.
load_rosters_piefxis() {
    local name=$1 first=$2 count=$3 user=$4 pw=$5 dir="$WORK/$1" i
    echo "xmpp_servers.sh: $name: $count accounts with 18 contacts each (XEP-0227 import)" >&2
    mkdir -p "$dir/spool"
    python3 - "$first" "$count" "$user" "$pw" "$dir/rosters.xml" <<'PY'
import sys
first, count, user, pw, path = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:]
name = lambda i: user.replace("{}", str(first + i))
with open(path, "w") as f:
    f.write("<?xml version='1.0' encoding='UTF-8'?>\n"
            "<server-data xmlns='urn:xmpp:pie:0'><host jid='localhost'>\n")
    for i in range(count):
        items = "".join(f"<item jid='{name((i + d) % count)}@localhost' subscription='both'/>"
                        for d in range(-9, 10) if d)
        f.write(f"<user name='{name(i)}' password='{pw.replace('{}', str(first + i))}'>"
                f"<query xmlns='jabber:iq:roster'>{items}</query></user>\n")
    f.write("</host></server-data>\n")
PY
    write_config "$name" scram "$(free_port)"
    rm -f "$dir/imported"
    env ERL_LIBS=/usr/lib/x86_64-linux-gnu EJABBERD_CONFIG_PATH="$dir/ejabberd.yml" \
        EJABBERD_LOG_PATH="$dir/ejabberd.log" ERL_CRASH_DUMP="$dir/erl_crash.dump" \
        erl +K true -noinput -noshell -mnesia dir "\"$dir/spool\"" -s ejabberd \
        -eval "R = ejabberd_piefxis:import_file(<<\"$dir/rosters.xml\">>),
               file:write_file(\"$dir/imported\", io_lib:format(\"~p~n\", [R])), init:stop()." \
        >>"$dir/server.log" 2>&1 &
    SERVER_PID=$!
    # The VM stops itself once the file is in: wait for that, bounded like the cases.
    for ((i = 0; i < CASE_TIMEOUT_S * 10; i++)); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    stop_server
    [[ "$(cat "$dir/imported" 2>/dev/null)" == ok ]] || {
        echo "xmpp_servers.sh: $name: the XEP-0227 import failed:" >&2
        cat "$dir/imported" 2>/dev/null >&2
        tail -20 "$dir/server.log" "$dir"/*.log >&2 || true
        exit 1
    }
}
