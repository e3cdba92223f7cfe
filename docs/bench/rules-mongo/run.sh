#!/bin/bash
# Rules into the Mongo test server: same shape as rules_sqlite.sh (QoS1, 10-byte payloads,
# archive rule), the archive sink pointed at rt_mongo_test.
set -u
cd "$(dirname "$0")/../../.."
BD=${BD:-build/release}
mkdir -p /tmp/mb && rm -f /tmp/mb/mongo.db*
$BD/tools/mongotest/rt_mongo_test --port 0 --db /tmp/mb/mongo.db > /tmp/mb/mongo.out 2>&1 &
MP=$!
for _ in $(seq 1 50); do grep -q listening /tmp/mb/mongo.out && break; sleep 0.1; done
PORT=$(sed -n 's/listening 127.0.0.1:\([0-9]*\)/\1/p' /tmp/mb/mongo.out)
RATE=$1; SECS=$2
BD=$BD OUT=/tmp/mb tests/bench/rules_sqlite.sh mongo-$RATE 21999 $RATE $SECS \
  -o "sinks={archive={type=\"mongodb\",uri=\"mongodb://127.0.0.1:$PORT\",database=\"rt\",collection=\"messages\",batch=1000}}"
/usr/bin/python3 -c "
import sys; sys.path.insert(0,'tests/integration')
from mongo_wire import Mongo
m=Mongo('127.0.0.1',$PORT); print('mongo documents:', m.count('rt','messages'))"
kill $MP; wait $MP 2>/dev/null
