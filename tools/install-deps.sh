#!/usr/bin/env bash
# Installs the Debian 12 packages rt needs, and only those that are missing, so a prepared
# machine pays nothing and a fresh one needs this one command.
#   --for run   (the default; make build, make run): what building and running rtd needs
#   --for test  (make test): that, and the test toolchain
set -euo pipefail

usage() { echo "usage: $0 [--for run|test]" >&2; exit 2; }
purpose=run
while (($#)); do
    case "$1" in
        --for) (($# >= 2)) || usage; purpose=$2; shift 2 ;;
        --for=*) purpose=${1#--for=}; shift ;;
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
    packages+=(
        libuv1-dev  # tools/rtbench, the load generator (rtd itself does not use libuv)
        sqlite3 mosquitto python3-paho-mqtt python3-pytest
        erlang-base gnuplot-nox valgrind procps
        openssl testssl.sh  # certificates made at test time; the TLS listener's protocol and cipher audit
        tsung  # tests/integration/test_tsung.py: its MQTT 3.1 client is one rtd must serve
        clang libclang-rt-14-dev # clang, libFuzzer and its sanitizers: the fuzz targets (make test-fuzz)
        prometheus  # promtool: tests/integration/test_metrics.py checks the scrape's format with it
        chromium  # headless: tests/integration/test_dashboard.py drives the dashboard at / over CDP
        nats-server  # the cluster's tests run NATS servers
        python3-slixmpp  # tests/integration/test_xmpp_*.py: the XMPP client the sessions are tested with
        python3-jwt python3-cryptography  # tests/integration/test_jwt.py: tokens and keys made in the test
        lintian systemd  # tests/integration/test_package.py: the .deb's lint, systemd-analyze on the unit
    )
fi

missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

# MQTT.js (npm's mqtt) and xmpp.js (@xmpp/client), the Node clients the integration tests drive
# rtd with, pinned by tests/node/package-lock.json; node and npm come with the machine. Either
# one missing (a checkout from before the other was added) runs npm ci again.
root=$(cd "$(dirname "$0")/.." && pwd)
nm="$root/tests/node/node_modules"
if [[ "$purpose" == test && ( ! -d "$nm/mqtt" || ! -d "$nm/@xmpp/client" ) ]] &&
    command -v npm >/dev/null; then
    echo "install-deps: npm ci in tests/node" >&2
    npm ci --prefix "$root/tests/node" --no-audit --no-fund >/dev/null
fi

if ((${#missing[@]} == 0)); then
    exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
    sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
