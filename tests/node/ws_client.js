// MQTT.js over WebSocket (ws:// or wss://): one client subscribes to TOPIC at QoS 1 and
// publishes COUNT messages to it at QoS 1 (0, 1, ... as payloads); prints what it got as JSON
// ({"received": n, "in_order": bool, "subprotocol": "...", "alpn": "..."}) once all came back,
// or after TIMEOUT_MS (exit code 1 then, 2 on a connection error).
//   node ws_client.js URL CLIENT_ID TOPIC COUNT [CA_FILE] [TIMEOUT_MS] [PROTOCOL_VERSION]
// With CA_FILE the server's certificate is verified against it (wss); without, a wss URL is
// refused unless the system trusts the server.
'use strict';
const fs = require('fs');
const mqtt = require('mqtt');
const WebSocket = require('ws'); // MQTT.js's own dependency: to see the upgrade's result

const [url, clientId, topic] = process.argv.slice(2, 5);
const count = Number(process.argv[5]);
const caFile = process.argv[6] || '';
const timeoutMs = Number(process.argv[7] || 20000);
const protocolVersion = Number(process.argv[8] || 4);

const opts = { clientId, clean: true, protocolVersion, reconnectPeriod: 0, connectTimeout: 10000 };
if (caFile) {
  opts.ca = fs.readFileSync(caFile);
  opts.rejectUnauthorized = true;
}
let socket = null;
opts.createWebsocket = (u, protocols, o) => {
  socket = new WebSocket(u, protocols, o.wsOptions);
  return socket;
};
const got = [];
let finished = false;
const client = mqtt.connect(url, opts);

function finish(code) {
  if (finished) return;
  finished = true;
  const ws = socket;
  let subprotocol = '';
  let alpn = '';
  try {
    subprotocol = ws && ws.protocol ? ws.protocol : '';
    const raw = ws && ws._socket;
    alpn = raw && raw.alpnProtocol ? raw.alpnProtocol : '';
  } catch (e) { /* not every stream exposes them */ }
  const inOrder = got.every((v, i) => v === i);
  console.log(JSON.stringify({ received: got.length, in_order: inOrder, subprotocol, alpn }));
  client.end(true, () => process.exit(code));
  setTimeout(() => process.exit(code), 1000).unref();
}

const timer = setTimeout(() => finish(1), timeoutMs);
client.on('error', (e) => { console.error('error:', e.message); clearTimeout(timer); finished = true; process.exit(2); });
client.on('message', (t, payload) => {
  got.push(Number(payload.toString()));
  if (got.length === count) { clearTimeout(timer); finish(0); }
});
client.on('connect', () => {
  client.subscribe(topic, { qos: 1 }, (err) => {
    if (err) { console.error('subscribe:', err.message); process.exit(2); }
    for (let i = 0; i < count; i++) client.publish(topic, String(i), { qos: 1 });
  });
});
