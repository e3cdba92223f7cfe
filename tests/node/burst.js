// One MQTT.js publisher sends COUNT messages at QoS 0, 1 and 2 in turn, as fast as it can,
// to one QoS 2 subscriber on the same broker; prints what the subscriber got, per QoS, how
// long it took and every disconnect the publisher was given, as JSON, once the subscriber
// has them all or after the timeout (whichever comes first).
//   node burst.js PORT COUNT [--version 4|5] [--recv-max N] [--persistent] [--timeout MS]
// --version: both clients' MQTT version (default 5). --recv-max: the subscriber's Receive
// Maximum (MQTT 5), so the broker queues the rest of the burst for it. --persistent: the
// subscriber keeps its session (clean start 0, an hour's expiry), so a broker with
// persistence stores every copy for it before it acknowledges the publisher.
'use strict';
const mqtt = require('mqtt');

const port = Number(process.argv[2]);
const count = Number(process.argv[3]);
const opts = { version: 5, recvMax: 0, persistent: false, timeoutMs: 60000 };
for (let i = 4; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (a === '--version') opts.version = Number(process.argv[++i]);
  else if (a === '--recv-max') opts.recvMax = Number(process.argv[++i]);
  else if (a === '--persistent') opts.persistent = true;
  else if (a === '--timeout') opts.timeoutMs = Number(process.argv[++i]);
  else { console.error(`burst.js: unknown argument ${a}`); process.exit(2); }
}
const url = `mqtt://127.0.0.1:${port}`;
const got = [0, 0, 0];
const seen = new Set();
const disconnects = [];
let done = false;
let started = 0;

function finish(sub, pub) {
  if (done) return;
  done = true;
  console.log(JSON.stringify({
    received: seen.size, by_qos: got, duplicates: got[0] + got[1] + got[2] - seen.size,
    ms: Date.now() - started, disconnects,
  }));
  sub.end(true);
  pub.end(true);
}

const subProps = {};
if (opts.recvMax) subProps.receiveMaximum = opts.recvMax;
if (opts.persistent && opts.version === 5) subProps.sessionExpiryInterval = 3600;
const sub = mqtt.connect(url, {
  clientId: 'burst-sub', protocolVersion: opts.version, clean: !opts.persistent,
  properties: opts.version === 5 ? subProps : undefined,
});
sub.on('error', (e) => { console.error('subscriber:', e.message); process.exit(2); });
sub.once('connect', () => {
  sub.subscribe('burst/t', { qos: 2 }, (err) => {
    if (err) { console.error('subscribe:', err.message); process.exit(2); }
    const pub = mqtt.connect(url, {
      clientId: 'burst-pub', protocolVersion: opts.version, clean: true,
    });
    // A broker that disconnects the publisher is reported, not fatal: MQTT.js reconnects and
    // sends its QoS 1/2 messages again, and the caller decides what the disconnect means.
    pub.on('disconnect', (p) => disconnects.push(p.reasonCode));
    pub.on('error', (e) => disconnects.push(e.message));
    const timer = setTimeout(() => finish(sub, pub), opts.timeoutMs);
    sub.on('message', (topic, payload) => {
      const i = Number(payload.toString());
      got[i % 3]++;
      seen.add(i);
      if (seen.size === count) { clearTimeout(timer); finish(sub, pub); }
    });
    pub.once('connect', () => {
      started = Date.now();
      for (let i = 0; i < count; i++) pub.publish('burst/t', String(i), { qos: i % 3 });
    });
  });
});
