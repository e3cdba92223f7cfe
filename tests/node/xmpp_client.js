// An @xmpp/client (xmpp.js 0.14) session against rtd, driven by tests/integration/
// test_xmpp_node.py: it logs in with the mechanism asked for over the service's transport
// (xmpp:// plain TCP, xmpps:// direct TLS, ws:// XMPP over WebSocket), then runs the steps it
// was given in order. Every event is one JSON line on stdout as it happens, the last one
// {"event":"done"} (exit 0) or {"event":"fail","error":"..."} (exit 1, 2 on a timeout); the
// test reads them while it runs and acts between steps (a "wait" step reads one stdin line).
//   node xmpp_client.js '{"service":..., "domain":..., "username":..., "password":...,
//                          "mech": "SCRAM-SHA-256"|"SCRAM-SHA-1", "resource":..., "sm": bool,
//                          "timeout_ms": n, "steps": [...]}'
// Steps: {"send": {"to", "body"}}, {"expect": {"body"}} (a chat with that body, its sender
// printed), {"acked": n} (XEP-0198: n stanzas sent since enable acknowledged by the server),
// {"drop": true} (the socket destroyed without a close; the library reconnects and resumes),
// {"resumed": true} (waits for the resumption), {"wait": true}; group chat (XEP-0045):
// {"join": {"room", "nick", "configure"}} (joined once its own presence, 110, and the subject
// came; configure: the instant-room form as the room's owner), {"groupchat": {"room", "body"}}.
// @xmpp/client ships SCRAM-SHA-1 only; SCRAM-SHA-256 (RFC 7677) is added here on the
// library's SASL factory. The server's signature (v= in <success/>, or in SASL2's
// additional-data) is checked for both, which the library does not do itself. Where the
// server offers SASL2 the library logs in with it, Bind2 and FAST (XEP-0388, 0386, 0484): the
// online event says so (sasl2, fast_token), the resumed one which mechanism logged in again.
// A server certificate is checked against NODE_EXTRA_CA_CERTS (the test CA), not skipped.
'use strict';
const crypto = require('crypto');
const readline = require('readline');

const conf = JSON.parse(process.argv[2]);
const NS_SASL = 'urn:ietf:params:xml:ns:xmpp-sasl';
const NS_SASL2 = 'urn:xmpp:sasl:2'; // XEP-0388: the library logs in so where it is offered
const NS_SM = 'urn:xmpp:sm:3';

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

let finished = false;
function finish(code, extra) {
  if (finished) return;
  finished = true;
  out(Object.assign({ event: code === 0 ? 'done' : 'fail' }, extra || {}));
  setTimeout(() => process.exit(code), 50);
}
setTimeout(() => finish(2, { error: 'timed out' }), conf.timeout_ms || 20000).unref();

// RFC 5802 client side with SHA-256, the interface of the `saslmechanisms` factory that
// @xmpp/sasl drives: response(cred) gives the next client message, challenge(text) takes the
// server's.
class ScramSha256 {
  constructor() {
    this.stage = 'first';
  }

  response(cred) {
    if (this.stage === 'first') {
      this.cnonce = crypto.randomBytes(18).toString('base64');
      const user = cred.username.replace(/=/g, '=3D').replace(/,/g, '=2C');
      this.firstBare = `n=${user},r=${this.cnonce}`;
      this.stage = 'final';
      return 'n,,' + this.firstBare;
    }
    if (this.stage === 'final') {
      const f = Object.fromEntries(this.serverFirst.split(',').map((p) => {
        const i = p.indexOf('=');
        return [p.slice(0, i), p.slice(i + 1)];
      }));
      if (!f.r.startsWith(this.cnonce)) throw new Error('server nonce without ours');
      const salted = crypto.pbkdf2Sync(cred.password, Buffer.from(f.s, 'base64'), Number(f.i),
                                       32, 'sha256');
      const hmac = (k, m) => crypto.createHmac('sha256', k).update(m).digest();
      const clientKey = hmac(salted, 'Client Key');
      const stored = crypto.createHash('sha256').update(clientKey).digest();
      const noProof = 'c=' + Buffer.from('n,,').toString('base64') + ',r=' + f.r;
      const authMsg = `${this.firstBare},${this.serverFirst},${noProof}`;
      const sig = hmac(stored, authMsg);
      const proof = Buffer.from(clientKey.map((b, i) => b ^ sig[i]));
      this._serverSignature = hmac(hmac(salted, 'Server Key'), authMsg);
      this.stage = 'done';
      return noProof + ',p=' + proof.toString('base64');
    }
    return '';
  }

  challenge(text) {
    this.serverFirst = text;
    return this;
  }
}
ScramSha256.prototype.name = 'SCRAM-SHA-256';
ScramSha256.prototype.clientFirst = true;

(async () => {
  const { client, xml } = await import('@xmpp/client');
  const userAgent = xml('user-agent', { id: crypto.randomUUID() });
  const xmpp = client({
    service: conf.service,
    domain: conf.domain,
    resource: conf.resource,
    // The password, and a FAST token (XEP-0484) once the server gave one: the library logs in
    // with the token when it has one (a reconnection), naming itself by its user-agent id.
    credentials: async (authenticate, mechanisms, fast) => {
      out({ event: 'mechanisms', offered: mechanisms });
      if (!mechanisms.includes(conf.mech)) throw new Error(`${conf.mech} not offered`);
      const token = fast ? await fast.fetch() : undefined;
      await authenticate({ username: conf.username, password: conf.password, token }, conf.mech,
                         userAgent);
    },
  });
  xmpp.saslFactory.use(ScramSha256);
  // The mechanism instance of the exchange, to check the server's signature with.
  let mech = null;
  const create = xmpp.saslFactory.create.bind(xmpp.saslFactory);
  xmpp.saslFactory.create = (names) => (mech = create(names));
  let verified = null;
  let sasl2 = false;
  let lastMech = null; // the mechanism of the last SASL2 login (a reconnection's, once resumed)
  let gotToken = false;
  xmpp.on('send', (el) => {
    if (el.is('authenticate', NS_SASL2)) lastMech = el.attrs.mechanism;
  });
  xmpp.on('nonza', (el) => {
    // RFC 6120's <success/> holds the server's last SCRAM message, SASL2's its additional-data.
    const v2 = el.is('success', NS_SASL2) ? el.getChildText('additional-data') : null;
    if (el.is('success', NS_SASL2) && el.getChild('token', 'urn:xmpp:fast:0')) gotToken = true;
    // A FAST login's additional-data is HT's responder HMAC (the library checks none of it).
    const scram = !(lastMech || '').startsWith('HT-');
    if ((el.is('success', NS_SASL) || v2 !== null) && mech && scram) {
      sasl2 = v2 !== null;
      const v = Buffer.from(sasl2 ? v2 : el.text(), 'base64').toString();
      verified = v === 'v=' + Buffer.from(mech._serverSignature).toString('base64');
      if (!verified) finish(1, { error: `server signature wrong: ${v}` });
    }
  });
  if (!conf.sm) xmpp.streamFeatures.use('sm', 'urn:xmpp:sm:3', (_ctx, next) => next());
  // Reconnect only where a step drops the socket on purpose.
  xmpp.reconnect.delay = 200;
  if (!conf.steps.some((s) => s.drop)) xmpp.reconnect.stop();

  const waiters = []; // [predicate, resolve]: the next stanza or event each is after
  const seen = [];
  function deliver(item) {
    const i = waiters.findIndex(([pred]) => pred(item));
    if (i >= 0) waiters.splice(i, 1)[0][1](item);
    else seen.push(item);
  }
  function next(pred) {
    const i = seen.findIndex(pred);
    if (i >= 0) return Promise.resolve(seen.splice(i, 1)[0]);
    return new Promise((resolve) => waiters.push([pred, resolve]));
  }
  if (process.env.XMPP_TRACE) {
    xmpp.on('element', (el) => process.stderr.write(`IN  ${el}\n`));
    xmpp.on('send', (el) => process.stderr.write(`OUT ${el}\n`));
  }
  xmpp.on('error', (err) => out({ event: 'error', error: String(err) }));
  const NS_MUC = 'http://jabber.org/protocol/muc';
  xmpp.on('stanza', (st) => {
    if (st.is('presence')) {
      const x = st.getChild('x', NS_MUC + '#user');
      const codes = x ? x.getChildren('status').map((c) => c.attrs.code) : [];
      deliver({ kind: 'presence', from: st.attrs.from, type: st.attrs.type, codes });
    }
    if (st.is('message') && st.attrs.type === 'groupchat' && st.getChild('subject') &&
        !st.getChild('body')) {
      deliver({ kind: 'subject', room: (st.attrs.from || '').split('/')[0] });
      return;
    }
    if (st.is('message') && st.attrs.type !== 'error') {
      const m = { kind: 'message', from: st.attrs.from, body: st.getChildText('body') };
      out({ event: 'message', from: m.from, body: m.body });
      deliver(m);
    }
  });
  let acked = 0;
  xmpp.streamManagement.on('ack', () => {
    acked += 1;
    deliver({ kind: 'ack', n: acked });
  });
  // The library enables XEP-0198 after binding (or inside SASL2's Bind2 request); it emits
  // nothing when the server answers, so the answer itself is watched, alone or in <bound/>.
  xmpp.on('nonza', (el) => {
    const bound = el.is('success', NS_SASL2) ? el.getChild('bound', 'urn:xmpp:bind:0') : null;
    if (el.is('enabled', NS_SM) || (bound && bound.getChild('enabled', NS_SM)))
      setImmediate(() => deliver({ kind: 'enabled' }));
  });
  xmpp.streamManagement.on('resumed', () => deliver({ kind: 'resumed' }));
  let stopping = false;
  xmpp.on('offline', () => stopping || finish(1, { error: 'offline before the steps ended' }));

  const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

  // start() waits for the stream's 'open' only after its header's write has called back: a
  // server answering before that (TLS on loopback) is missed and start() times out though the
  // session goes online (xmpp.js issues 570, 592, 889); RFC 6120's restart after SASL hid it,
  // SASL2 has none. So the session's own 'online' is awaited, bounded by timeout_ms.
  const online = new Promise((resolve) => xmpp.once('online', resolve));
  xmpp.start().catch((err) => {
    if (err.name !== 'TimeoutError') finish(1, { error: String(err.stack || err) });
  });
  const address = await online;
  await xmpp.send(xml('presence'));
  const sm = xmpp.streamManagement;
  if (conf.sm) await next((x) => x.kind === 'enabled');
  out({ event: 'online', jid: address.toString(), mech: mech && mech.name, verified, sasl2,
        fast_token: gotToken,
        secure: xmpp.isSecure(), sm_enabled: sm.enabled, sm_id: sm.id });

  for (const step of conf.steps) {
    if (step.send) {
      await xmpp.send(xml('message', { to: step.send.to, type: 'chat' },
                          xml('body', {}, step.send.body)));
    } else if (step.expect) {
      const m = await next((x) => x.kind === 'message' && x.body === step.expect.body);
      out({ event: 'expected', from: m.from, body: m.body });
    } else if (step.acked) {
      await next((x) => x.kind === 'ack' && x.n >= step.acked);
      out({ event: 'acked', n: acked, queued: sm.outbound_q.length });
    } else if (step.drop) {
      // No </stream:stream>, no FIN first: what a phone losing its network looks like.
      const s = xmpp.socket; // net.Socket for TCP, a wrapper holding tls.TLSSocket for TLS
      (s.socket || s).destroy();
      out({ event: 'dropped' });
    } else if (step.resumed) {
      await next((x) => x.kind === 'resumed');
      out({ event: 'resumed', sm_id: sm.id, inbound: sm.inbound, mech: lastMech });
    } else if (step.wait) {
      await lines.next();
    } else if (step.join) {
      const { room, nick } = step.join;
      await xmpp.send(xml('presence', { to: `${room}/${nick}` }, xml('x', { xmlns: NS_MUC })));
      const self = await next((x) => x.kind === 'presence' && x.from === `${room}/${nick}`);
      if (self.type === 'error') throw new Error(`join of ${room} refused`);
      await next((x) => x.kind === 'subject' && x.room === room);
      if (step.join.configure) {
        await xmpp.iqCaller.set(xml('query', { xmlns: NS_MUC + '#owner' },
                                    xml('x', { xmlns: 'jabber:x:data', type: 'submit' })), room);
      }
      out({ event: 'joined', room, nick, codes: self.codes });
    } else if (step.groupchat) {
      await xmpp.send(xml('message', { to: step.groupchat.room, type: 'groupchat' },
                          xml('body', {}, step.groupchat.body)));
    }
  }
  stopping = true;
  xmpp.reconnect.stop();
  await xmpp.stop();
  finish(0, { acked });
})().catch((err) => finish(1, { error: String(err && err.stack ? err.stack : err) }));
