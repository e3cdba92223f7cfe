#!/usr/bin/env bash
# Installs the Debian 12 packages rt needs, and only those that are missing, so a prepared
# machine pays nothing and a fresh one needs this one command.
#   --for run   (the default; make build, make run): what building and running rtd needs
#   --for test  (make test): that, and the test toolchain
#   --build-first (with --for test): what configuring and building needs now, and the rest in
#               the background, so that the compiler runs while apt unpacks chromium and
#               erlang; the next call without it waits for that install, then checks again.
# Every install holds a lock (flock on /tmp/rt-install-deps.lock): one at a time, and a call
# waits for the background one rather than fighting it for apt's lock.
set -euo pipefail

usage() { echo "usage: $0 [--for run|test] [--build-first]" >&2; exit 2; }
purpose=run
build_first=false
while (($#)); do
    case "$1" in
        --for) (($# >= 2)) || usage; purpose=$2; shift 2 ;;
        --for=*) purpose=${1#--for=}; shift ;;
        --build-first) build_first=true; shift ;;
        *) usage ;;
    esac
done
[[ "$purpose" == run || "$purpose" == test ]] || usage

# Building rtd and rtctl, and the libraries rtd runs on.
packages=(
    build-essential cmake pkg-config git
    liblua5.4-dev libssl-dev libhttp-parser-dev libsqlite3-dev libbson-dev libmongoc-dev
    libnats-dev  # the cluster (actors/cluster): the NATS C client
    libidn-dev  # actors/xmpp: stringprep (nodeprep, resourceprep, SASLprep) and IDNA for JIDs
    libexpat1-dev  # the XMPP stream parser (actors/xmpp): expat, streaming, no DTD
    mosquitto-clients  # mosquitto_sub and _pub, to try the broker make run starts
)
if [[ "$purpose" == test ]]; then
    # What the test build's configure looks for: without them it builds less (no rtbench, no
    # valgrind runs), so they come before the build, with the packages above.
    packages+=(
        libuv1-dev  # tools/rtbench, the load generator (rtd itself does not use libuv)
        valgrind
    )
fi
build_packages=("${packages[@]}")
if [[ "$purpose" == test ]]; then
    packages+=(
        sqlite3 mosquitto python3-paho-mqtt python3-pytest
        python3-pytest-xdist  # make test: the integration pass's short tests on two workers
        erlang-base gnuplot-nox procps
        openssl testssl.sh  # certificates made at test time; the TLS listener's protocol and cipher audit
        tsung  # tests/integration/test_tsung.py: its MQTT 3.1 client is one rtd must serve
        clang libclang-rt-14-dev # clang, libFuzzer and its sanitizers: the fuzz targets (make test-fuzz)
        prometheus  # promtool: tests/integration/test_metrics.py checks the scrape's format with it
        chromium  # headless: tests/integration/test_dashboard.py drives the dashboard at / over CDP
        nats-server  # the cluster's tests run NATS servers
        python3-slixmpp  # tests/integration/test_xmpp_*.py: the XMPP client the sessions are tested with
        prosody  # tests/integration/test_xmpp_s2s_peers.py: another server to federate with
        lua-unbound  # prosody's resolver that reads the test's hosts file (only recommended)
        ejabberd  # test_xmpp_s2s_peers.py: the other server to federate with
        iproute2 python3-dnspython  # test_xmpp_s2s_dns.py: a network namespace, a DNS server
        python3-aiohttp  # slixmpp's XEP-0363 plugin uploads with it (tests/integration/test_xmpp_upload.py)
        python3-jwt python3-cryptography  # tests/integration/test_jwt.py: tokens and keys made in the test
        lintian systemd  # tests/integration/test_package.py: the .deb's lint, systemd-analyze on the unit
    )
fi

missing_of() {
    missing=()
    local p status
    for p in "$@"; do
        status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        [[ "$status" == "install ok installed" ]] || missing+=("$p")
    done
}

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
    sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
updated=false
# Servers among the packages (mosquitto, prosody, ...) are the tests' to start on their own
# ports: their system services are not started at install (policy-rc.d refuses, as Debian's
# chroots do), so none holds 1883 or 5269 on every address.
apt_install() {
    echo "install-deps: installing $*" >&2
    $updated || "${sudo_cmd[@]}" apt-get update -qq
    updated=true
    local policy=/usr/sbin/policy-rc.d made=false
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy" >/dev/null
        "${sudo_cmd[@]}" chmod +x "$policy"
        made=true
    fi
    local rc=0
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
    if $made; then "${sudo_cmd[@]}" rm -f "$policy"; fi
    return $rc
}

# MQTT.js (npm's mqtt) and xmpp.js (@xmpp/client), the Node clients the integration tests drive
# rtd with, and converse.js, the web client tests/integration/test_xmpp_converse.py runs in
# Chromium, pinned by tests/node/package-lock.json; node and npm come with the machine. Any
# one missing (a checkout from before it was added) runs npm ci again.
root=$(cd "$(dirname "$0")/.." && pwd)
nm="$root/tests/node/node_modules"
node_clients() {
    if [[ "$purpose" == test && ( ! -d "$nm/mqtt" || ! -d "$nm/@xmpp/client" ||
                                 ! -d "$nm/converse.js" ) ]] &&
        command -v npm >/dev/null; then
        echo "install-deps: npm ci in tests/node" >&2
        npm ci --prefix "$root/tests/node" --no-audit --no-fund >/dev/null
    fi
}

lock=${TMPDIR:-/tmp}/rt-install-deps-$(id -u).lock
log=${TMPDIR:-/tmp}/rt-install-deps-$(id -u).log
exec 9>>"$lock"
if $build_first && [[ "$purpose" == test ]]; then
    missing_of "${build_packages[@]}"
    # All there, and the rest being installed by an earlier call: nothing to wait for.
    ((${#missing[@]} == 0)) && ! flock -n 9 && exit 0
    flock 9
    ((${#missing[@]} == 0)) || apt_install "${missing[@]}"
    missing_of "${packages[@]}"
    # The background install keeps the lock (fd 9, inherited) until it is done; the next call
    # without --build-first waits for it and prints its log.
    (node_clients && { ((${#missing[@]} == 0)) || apt_install "${missing[@]}"; } ||
        echo "install-deps: the background install failed") </dev/null >"$log" 2>&1 &
    exit 0
fi
flock 9
if [[ -s "$log" ]]; then
    cat "$log" >&2
    rm -f "$log"
fi
node_clients
missing_of "${packages[@]}"
((${#missing[@]} == 0)) || apt_install "${missing[@]}"
