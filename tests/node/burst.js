// One MQTT.js publisher sends COUNT messages at QoS 0, 1 and 2 in turn, as fast as it can,
// to one QoS 2 subscriber on the same broker; prints what the subscriber got, per QoS, as
// JSON once it has them all or after TIMEOUT_MS (whichever comes first). The subscriber
// takes at most RECV_MAX QoS 1/2 messages in flight (its Receive Maximum), so the broker
// queues the rest of the burst for it.
//   node burst.js PORT COUNT RECV_MAX [TIMEOUT_MS]
'use strict';
const mqtt = require('mqtt');

const port = Number(process.argv[2]);
const count = Number(process.argv[3]);
const recvMax = Number(process.argv[4]);
const timeoutMs = Number(process.argv[5] || 60000);
const url = `mqtt://127.0.0.1:${port}`;
const got = [0, 0, 0];
const seen = new Set();
let done = false;

function finish(sub, pub) {
  if (done) return;
  done = true;
  console.log(JSON.stringify({ received: seen.size, by_qos: got, duplicates: got[0] + got[1] + got[2] - seen.size }));
  sub.end(true);
  pub.end(true);
}

const sub = mqtt.connect(url, {
  clientId: 'burst-sub', protocolVersion: 5, clean: true, properties: { receiveMaximum: recvMax },
});
sub.on('error', (e) => { console.error('subscriber:', e.message); process.exit(2); });
sub.on('connect', () => {
  sub.subscribe('burst/t', { qos: 2 }, (err) => {
    if (err) { console.error('subscribe:', err.message); process.exit(2); }
    const pub = mqtt.connect(url, { clientId: 'burst-pub', protocolVersion: 5, clean: true });
    pub.on('error', (e) => { console.error('publisher:', e.message); process.exit(2); });
    const timer = setTimeout(() => finish(sub, pub), timeoutMs);
    sub.on('message', (topic, payload) => {
      const i = Number(payload.toString());
      got[i % 3]++;
      seen.add(i);
      if (seen.size === count) { clearTimeout(timer); finish(sub, pub); }
    });
    pub.on('connect', () => {
      for (let i = 0; i < count; i++) pub.publish('burst/t', String(i), { qos: i % 3 });
    });
  });
});
