#!/usr/bin/env bash
# xmpp_differential.sh: the XMPP functional tests (issue 29) against rtd, ejabberd 23.01 and
# Prosody 0.12 in turn, and a pass/fail table: where RFC or XEP text says what a server does,
# the same test should pass on all three. Tests of what only rtd has are skipped on the peers
# (@pytest.mark.rtd_only); each peer is started by the tests' fixture (xmpp_server.py,
# xmpp_peer.py) with its config and data in a temporary folder, on a loopback port, and ended
# by its PID. Not part of `make test`: it needs the peers, which tools/install-deps.sh does
# not install, and it takes minutes.
#
#   tests/integration/xmpp_differential.sh [--servers rtd,ejabberd,prosody] [--out DIR]
#                                          [pytest file or -k ... arguments]
#
# Nothing is installed at run time. The peers come from Debian, once, without their system
# services (the policy-rc.d keeps the packages from starting them):
#   printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
#   apt-get install -y ejabberd prosody; rm /usr/sbin/policy-rc.d
# rtd comes from RT_BUILD_DIR (default build/release). Exit status: 0 when every test passed
# (or was skipped) on rtd; the peers' failures are findings, listed in the table.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SERVERS=rtd,ejabberd,prosody
OUT=''
ARGS=()
while (($#)); do
    case "$1" in
    --servers) SERVERS=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --help | -h) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
    esac
done
((${#ARGS[@]})) || ARGS=(tests/integration/test_xmpp_c2s.py tests/integration/test_xmpp_xeps.py
    tests/integration/test_xmpp_sm.py tests/integration/test_xmpp_hostile.py
    tests/integration/test_xmpp_muc.py tests/integration/test_xmpp_pep.py)
export RT_BUILD_DIR=${RT_BUILD_DIR:-$ROOT/build/release}

IFS=, read -r -a LIST <<<"$SERVERS"
for s in "${LIST[@]}"; do
    case "$s" in
    rtd) [[ -x "$RT_BUILD_DIR/rtd" ]] || {
        echo "xmpp_differential.sh: $RT_BUILD_DIR/rtd not built" >&2; exit 2; } ;;
    ejabberd | prosody)
        python3 -c "import sys; sys.path.insert(0, '$ROOT/tests/integration'); import xmpp_peer
sys.exit(0 if xmpp_peer.installed('$s') else 1)" || {
            echo "xmpp_differential.sh: $s is not installed; once, as root:" >&2
            sed -n '15,16p' "$0" | sed 's/^#  //' >&2
            exit 2
        } ;;
    *) echo "xmpp_differential.sh: unknown server '$s'" >&2; exit 2 ;;
    esac
done

WORK=$(mktemp -d /tmp/xmpp-differential.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT" || exit 2
REPORT=()
rc=0
for s in "${LIST[@]}"; do
    echo "xmpp_differential.sh: $s" >&2
    RT_XMPP_PEER=$s /usr/bin/python3 -m pytest -q -rs -p no:cacheprovider \
        --junitxml="$WORK/$s.xml" "${ARGS[@]}" >"$WORK/$s.txt" 2>&1
    code=$?
    tail -1 "$WORK/$s.txt" >&2
    [[ "$s" == rtd ]] && ((code != 0)) && rc=1
    REPORT+=("$s=$WORK/$s.xml")
done
python3 "$ROOT/tests/integration/xmpp_differential_report.py" "${REPORT[@]}"
if [[ -n "$OUT" ]]; then
    mkdir -p "$OUT" && cp "$WORK"/*.txt "$WORK"/*.xml "$OUT"/
fi
exit "$rc"
