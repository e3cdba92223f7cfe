# xmpp_servers.sh: sourced by xmpp_peers.sh and xmpp_tsung.sh; starts, stops and fills the
# servers they compare (rtd, ejabberd 23.01, Prosody 0.12), each a process of ours with its
# own config and data under $WORK/NAME, on its own loopback port, ended by its PID.
#
# The caller sets WORK (a mktemp -d folder), RTD (rtd's binary), LOAD (xmpp_load.py) and
# CASE_TIMEOUT_S, and may set TLS_PEM (a PEM file holding a certificate for "localhost" and
# its key): then rtd and ejabberd also serve direct TLS (XEP-0368) on TLS_PORT. start_server
# sets SERVER_PID, PORT (plain TCP, where SASL is allowed from loopback) and TLS_PORT.

free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
load1() { cut -d' ' -f1 /proc/loadavg; }

# The direct TLS listener's lines in NAME's config, when TLS_PEM is set (nothing otherwise).
tls_listener() {
    [[ -n "${TLS_PEM:-}" ]] || return 0
    case "$1" in
    rtd) printf ',\n    { bind = "127.0.0.1:%s", tls = { cert = "%s", key = "%s" } }' \
        "$TLS_PORT" "$TLS_PEM" "$TLS_PEM" ;;
    ejabberd) cat <<EOF
  - port: $TLS_PORT
    ip: "127.0.0.1"
    module: ejabberd_c2s
    tls: true
    max_stanza_size: 262144
    backlog: 4096
    access: c2s
certfiles: ["$TLS_PEM"]
EOF
        ;;
    esac
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
xmpp = { hosts = { "localhost" }, anonymous = { "localhost" },
         listeners = { "127.0.0.1:$port"$(tls_listener rtd) } }
EOF
        ;;
    ejabberd)
        # Both auth methods on one host: internal (SCRAM-SHA-256 keys) and SASL ANONYMOUS.
        # Only what rtd has too: roster, presence, offline, ping, disco; no stream
        # management, MUC, vCard, MAM, pubsub, CAPS.
        cat >"$dir/ejabberd.yml" <<EOF
hosts: ["localhost"]
loglevel: warning
log_rotate_count: 0
listen:
  - port: $port
    ip: "127.0.0.1"
    module: ejabberd_c2s
    max_stanza_size: 262144
    backlog: 4096
    access: c2s
    starttls_required: false
$(tls_listener ejabberd)
auth_method: [internal, anonymous]
anonymous_protocol: sasl_anon
allow_multiple_connections: true
auth_password_format: scram
auth_scram_hash: sha256
registration_timeout: infinity
acl:
  loopback:
    ip: ["127.0.0.0/8"]
access_rules:
  c2s:
    allow: all
  register:
    allow: all
  register_from:
    allow: loopback
  local:
    allow: all
modules:
  mod_disco: {}
  mod_offline: {}
  mod_ping: {}
  mod_register:
    ip_access: register_from
    access: register
  mod_roster: {}
EOF
        ;;
    prosody)
        local auth=internal_hashed
        [[ "$mode" == anon ]] && auth=anonymous
        cat >"$dir/prosody.cfg.lua" <<EOF
run_as_root = true
pidfile = "$dir/prosody.pid"
data_path = "$dir/data"
log = { warn = "$dir/prosody.log" }
network_backend = "epoll"
network_settings = { tcp_backlog = 4096 } -- as rtd's and ejabberd's here (default 128)
c2s_ports = { $port }
c2s_interfaces = { "127.0.0.1" }
s2s_ports = { }
http_ports = { }
https_ports = { }
c2s_direct_tls_ports = { }
c2s_require_encryption = false
allow_registration = true
registration_whitelist = { "127.0.0.1" }
password_hash = "SHA-256"
default_iteration_count = 4096
modules_enabled = { "roster", "saslauth", "disco", "ping", "register", "offline", "posix" }
modules_disabled = { "s2s" }
VirtualHost "localhost"
    authentication = "$auth"
EOF
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
    ejabberd)
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
    for ((i = 0; i < 300; i++)); do
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
    if [[ "$name" == rtd ]]; then
        mkdir -p "$dir/data"
        seq "$first" $((first + count - 1)) | xargs -P 2 -I{} \
            "$RTD" xmpp user add -b -I 4096 -d "$dir/data" "$user@localhost" "$pw" >/dev/null
        return
    fi
    start_server "$name" scram
    local out
    out=$(timeout "$CASE_TIMEOUT_S" python3 "$LOAD" register --port "$PORT" \
        --users "${user//\{\}/%d}:${pw//\{\}/%d}:$count:$first" -C 20 --deadline 280)
    stop_server
    [[ "$out" == *'"failed": 0'* ]] || { echo "xmpp_servers.sh: $name: $out" >&2; exit 1; }
}
