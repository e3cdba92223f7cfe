#!/usr/bin/env python3
"""xmpp_load.py: the one XMPP load client that xmpp_peers.sh drives every server with (rtd,
ejabberd, Prosody alike), asyncio over raw sockets, SASL SCRAM done with hashlib.

    xmpp_load.py idle  --port P [--anon | --users u%d:pw:K [--offset I]] -n N [--hold S]
                                 [--ifaddr A,B]
    xmpp_load.py login --port P --users u%d:pw:K -n LOGINS [-C CONCURRENCY]
    xmpp_load.py chat  --port P --users u%d:pw:K --pairs P -n MESSAGES [-w WINDOW] [--port2 Q]
    xmpp_load.py register --port P --users u%d:pw:K     (XEP-0077, for the peers)
    xmpp_load.py roster --port P --users u%d:pw%d:K:1 [--contacts 18]

Every session does what a client does at login: stream, SASL (ANONYMOUS or SCRAM-SHA-256),
stream restart, bind, roster get, initial presence. idle holds N of them and prints
"ready N" once all are up, then waits for stdin to close (or --hold seconds). login opens
and closes sessions as fast as CONCURRENCY at a time allows and prints logins/s. chat logs
in 2 x PAIRS accounts and has each send MESSAGES / (2 PAIRS) messages to its partner with at
most WINDOW unreceived, counting what arrives (with --port2, each pair's second session logs in
there: another node of a cluster, so that every message crosses between nodes). roster gives each of the K accounts
--contacts mutual subscriptions (its neighbours i-9..i+9 modulo K, for 18): all K online at
once, each asks each contact and approves each request, until each has every approval and
its roster holds each contact with subscription "both". Every loop is bounded by a count and by
--deadline seconds; a session that stalls past --step-timeout is counted as failed.

It parses no XML: it waits for the end tags it expects in the byte stream, which is enough
for servers that answer a well-behaved client, and costs little client CPU (the client
shares the 2 cores with the server measured). The salted password is cached per salt, as
RFC 5802 allows a client to, so the client's PBKDF2 runs once per account, not per login.
The result goes to stdout as one JSON line.
"""
import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import re
import resource
import sys
import time

SASL_NS = "urn:ietf:params:xml:ns:xmpp-sasl"
_salted = {}


class Failed(Exception):
    pass


def b64(b):
    return base64.b64encode(b).decode()


class Session:
    def __init__(self, args, user=None, password=None, src=None, port=None):
        self.a = args
        self.user, self.password, self.src = user, password, src
        self.port = port or args.port
        self.buf = b""
        self.jid = None
        self.reader = self.writer = None

    async def expect(self, pattern):
        rx = re.compile(pattern, re.S)
        while True:
            m = rx.search(self.buf)
            if m:
                self.buf = self.buf[m.end():]
                return m
            if re.search(rb"<failure|</stream:stream>|<stream:error", self.buf):
                raise Failed(self.buf[:300].decode(errors="replace"))
            data = await asyncio.wait_for(self.reader.read(65536), self.a.step_timeout)
            if not data:
                raise Failed("closed: " + self.buf[:200].decode(errors="replace"))
            self.buf += data

    def send(self, s):
        self.writer.write(s.encode() if isinstance(s, str) else s)

    async def open_stream(self):
        self.send("<?xml version='1.0'?><stream:stream to='%s' xmlns='jabber:client' "
                  "xmlns:stream='http://etherx.jabber.org/streams' version='1.0'>" % self.a.host)
        return (await self.expect(rb"<(?:stream:)?features.*?</(?:stream:)?features>")).group(0)

    async def scram(self):
        nonce = b64(os.urandom(18))
        bare = "n=%s,r=%s" % (self.user, nonce)
        self.send("<auth xmlns='%s' mechanism='SCRAM-SHA-256'>%s</auth>"
                  % (SASL_NS, b64(("n,," + bare).encode())))
        m = await self.expect(rb"<challenge[^>]*>([^<]*)</challenge>")
        first = base64.b64decode(m.group(1)).decode()
        f = dict(kv.split("=", 1) for kv in first.split(","))
        if not f["r"].startswith(nonce):
            raise Failed("server nonce")
        salt, rounds = base64.b64decode(f["s"]), int(f["i"])
        key = (self.password, salt, rounds)
        sp = _salted.get(key)
        if sp is None:
            sp = _salted[key] = hashlib.pbkdf2_hmac("sha256", self.password.encode(), salt, rounds)
        ck = hmac.digest(sp, b"Client Key", "sha256")
        stored = hashlib.sha256(ck).digest()
        final = "c=biws,r=" + f["r"]
        msg = (bare + "," + first + "," + final).encode()
        proof = bytes(x ^ y for x, y in zip(ck, hmac.digest(stored, msg, "sha256")))
        self.send("<response xmlns='%s'>%s</response>"
                  % (SASL_NS, b64((final + ",p=" + b64(proof)).encode())))
        m = await self.expect(rb"<success[^>]*?(?:/>|>([^<]*)</success>)")
        sk = hmac.digest(sp, b"Server Key", "sha256")
        want = "v=" + b64(hmac.digest(sk, msg, "sha256"))
        got = base64.b64decode(m.group(1) or b"").decode()
        if got and got != want:
            raise Failed("server signature")

    async def login(self, presence=True):
        kw = {"local_addr": (self.src, 0)} if self.src else {}
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20, **kw),
            self.a.step_timeout)
        await self.open_stream()
        if self.user is None:
            self.send("<auth xmlns='%s' mechanism='ANONYMOUS'/>" % SASL_NS)
            await self.expect(rb"<success[^>]*?(?:/>|>[^<]*</success>)")
        else:
            await self.scram()
        feats = await self.open_stream()
        self.send("<iq type='set' id='b1'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'>"
                  "<resource>r%d</resource></bind></iq>" % id(self))
        self.jid = (await self.expect(rb"<jid>([^<]+)</jid>.*?</iq>")).group(1).decode()
        # RFC 3921's session only where the server still requires it (no <optional/>).
        if b"xmpp-session" in feats and b"<optional" not in feats:
            self.send("<iq type='set' id='s1'>"
                      "<session xmlns='urn:ietf:params:xml:ns:xmpp-session'/></iq>")
            await self.expect(rb"<iq[^>]*id=['\"]s1['\"][^>]*?(?:/>|>.*?</iq>)")
        if presence:
            self.send("<iq type='get' id='r1'><query xmlns='jabber:iq:roster'/></iq>")
            await self.expect(rb"<iq[^>]*id=['\"]r1['\"][^>]*?(?:/>|>.*?</iq>)")
            self.send("<presence/>")

    async def close(self):
        if self.writer:
            try:
                self.send("</stream:stream>")
                await self.writer.drain()
            except (ConnectionError, OSError):
                pass
            self.writer.close()


def users_of(spec):
    """FORMAT:PASSWORD:COUNT[:FIRST]: accounts FIRST.. (0 by default), the password numbered
    too if it has a %d."""
    fmt, pw, k, *first = spec.split(":")
    base = int(first[0]) if first else 0
    return [(fmt % i, pw % i if "%d" in pw else pw) for i in range(base, base + int(k))]


def srcs_of(a):
    return a.ifaddr.split(",") if a.ifaddr else [None]


async def cmd_idle(a):
    users = users_of(a.users) if a.users else None
    srcs = srcs_of(a)
    sem = asyncio.Semaphore(a.concurrency)
    sessions, failed = [], [0]

    async def one(i):
        async with sem:
            u, p = users[(a.offset + i) % len(users)] if users else (None, None)
            s = Session(a, u, p, srcs[i % len(srcs)])
            try:
                await s.login()
                sessions.append(s)
            except (Failed, OSError, asyncio.TimeoutError, KeyError, ValueError) as e:
                failed[0] += 1
                if failed[0] <= 3:
                    print("idle: session %d: %r" % (i, e), file=sys.stderr)
                await s.close()

    t0 = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(a.n))), a.deadline)
    up = time.monotonic() - t0
    print("ready %d" % len(sessions), flush=True)
    # Keep reading so that pings and presences do not fill the kernel buffers; stop when
    # stdin closes (the driver has sampled the server) or after --hold seconds.
    drains = [asyncio.ensure_future(drain(s)) for s in sessions]
    loop = asyncio.get_running_loop()
    stdin_done = loop.run_in_executor(None, sys.stdin.read)
    try:
        await asyncio.wait_for(stdin_done, a.hold)
    except asyncio.TimeoutError:
        pass
    for d in drains:
        d.cancel()
    for s in sessions:
        s.writer.close()
    report({"mode": "idle", "sessions": len(sessions), "failed": failed[0], "setup_s": up})


async def drain(s):
    try:
        while await s.reader.read(65536):
            pass
    except (ConnectionError, OSError, asyncio.CancelledError):
        pass


async def cmd_login(a):
    users = users_of(a.users)
    srcs = srcs_of(a)
    nxt, done, failed = [0], [0], [0]
    t_end = time.monotonic() + a.deadline

    async def worker(w):
        while nxt[0] < a.n and time.monotonic() < t_end:
            i = nxt[0]
            nxt[0] += 1
            u, p = users[i % len(users)]
            s = Session(a, u, p, srcs[i % len(srcs)])
            try:
                await s.login(presence=not a.no_presence)
                done[0] += 1
            except (Failed, OSError, asyncio.TimeoutError, KeyError, ValueError) as e:
                failed[0] += 1
                if failed[0] <= 3:
                    print("login %d: %r" % (i, e), file=sys.stderr)
            await s.close()

    # One login per account first, outside the clock: the client's PBKDF2 (once per
    # account) is not part of the storm, and each server has every account in its caches.
    warm = a.n
    a.n = min(len(users), warm)
    await asyncio.gather(*(worker(w) for w in range(a.concurrency)))
    if failed[0]:
        raise SystemExit("login: %d warm-up logins failed" % failed[0])
    nxt[0], done[0], a.n = 0, 0, warm
    t0 = time.monotonic()
    print("start", flush=True)
    await asyncio.gather(*(worker(w) for w in range(a.concurrency)))
    dt = time.monotonic() - t0
    report({"mode": "login", "logins": done[0], "failed": failed[0], "seconds": dt,
            "logins_per_s": done[0] / dt if dt else 0})


async def cmd_chat(a):
    users = users_of(a.users)
    if len(users) < 2 * a.pairs:
        raise SystemExit("chat: needs 2 x pairs accounts")
    srcs = srcs_of(a)
    sess = [Session(a, u, p, srcs[i % len(srcs)], a.port2 if i % 2 and a.port2 else None)
            for i, (u, p) in enumerate(users[:2 * a.pairs])]
    sem = asyncio.Semaphore(a.concurrency)

    async def up(s):
        async with sem:
            await s.login()

    await asyncio.wait_for(asyncio.gather(*(up(s) for s in sess)), a.deadline)
    per = a.n // len(sess)
    got = [0] * len(sess)
    ev = [asyncio.Event() for _ in sess]
    end_tag = b"</message>"

    async def recv(i):
        s = sess[i]
        tail = s.buf
        try:
            while got[i] < per:
                data = await s.reader.read(65536)
                if not data:
                    return
                data = tail + data
                got[i] += data.count(end_tag)
                tail = data[-(len(end_tag) - 1):]
                ev[i].set()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass

    async def send(i):
        s, j = sess[i], i ^ 1  # 0<->1, 2<->3, ...
        to = sess[j].jid
        body = "x" * max(0, a.size)
        sent = 0
        while sent < per:
            if sent - got[j] >= a.window:
                ev[j].clear()
                await ev[j].wait()
                continue
            k = min(per - sent, a.window - (sent - got[j]))
            s.send("".join("<message to='%s' type='chat'><body>%s%d</body></message>"
                           % (to, body, sent + n) for n in range(k)))
            sent += k
            await s.writer.drain()

    # Let presences and roster results settle before the clock starts.
    await asyncio.sleep(1)
    for s in sess:
        s.buf = b""
    print("start", flush=True)
    t0 = time.monotonic()
    recvs = [asyncio.ensure_future(recv(i)) for i in range(len(sess))]
    try:
        await asyncio.wait_for(asyncio.gather(*(send(i) for i in range(len(sess)))), a.deadline)
        await asyncio.wait_for(asyncio.gather(*recvs), a.step_timeout)
    except asyncio.TimeoutError:
        for r in recvs:
            r.cancel()
    dt = time.monotonic() - t0
    total = sum(got)
    for s in sess:
        await s.close()
    report({"mode": "chat", "pairs": a.pairs, "sent": per * len(sess), "received": total,
            "seconds": dt, "msgs_per_s": total / dt if dt else 0})


async def cmd_register(a):
    users = users_of(a.users)
    sem = asyncio.Semaphore(a.concurrency)
    failed = [0]

    async def one(u, p):
        async with sem:
            s = Session(a)
            try:
                s.reader, s.writer = await asyncio.open_connection("127.0.0.1", a.port)
                await s.open_stream()
                s.send("<iq type='set' id='g1'><query xmlns='jabber:iq:register'>"
                       "<username>%s</username><password>%s</password></query></iq>" % (u, p))
                m = await s.expect(rb"<iq[^>]*id=['\"]g1['\"][^>]*?(?:/>|>.*?</iq>)")
                if b"type='result'" not in m.group(0) and b'type="result"' not in m.group(0):
                    raise Failed(m.group(0)[:200].decode(errors="replace"))
            except (Failed, OSError, asyncio.TimeoutError) as e:
                failed[0] += 1
                if failed[0] <= 3:
                    print("register %s: %r" % (u, e), file=sys.stderr)
            await s.close()

    await asyncio.wait_for(asyncio.gather(*(one(u, p) for u, p in users)), a.deadline)
    report({"mode": "register", "users": len(users), "failed": failed[0]})


PRESENCE_TAG = re.compile(rb"<presence\b[^>]*>")


def attr(tag, name):
    m = re.search(rb"\s" + name + rb"=(['\"])([^'\"]*)\1", tag)
    return m.group(2).decode() if m else None


async def cmd_roster(a):
    users = users_of(a.users)
    k, half = len(users), a.contacts // 2
    if a.contacts % 2 or k <= a.contacts:
        raise SystemExit("roster: --contacts wants an even number below the account count")
    srcs = srcs_of(a)
    sess = [Session(a, u, p, srcs[i % len(srcs)]) for i, (u, p) in enumerate(users)]
    index = {u: i for i, (u, _) in enumerate(users)}
    sem = asyncio.Semaphore(a.concurrency)

    async def up(s):
        async with sem:
            await s.login()

    await asyncio.wait_for(asyncio.gather(*(up(s) for s in sess)), a.deadline)

    def contacts(i):
        return {(i + d) % k for d in range(-half, half + 1) if d}

    async def one(i):
        """Asks each contact, approves each request, returns once every contact approved."""
        s, mine, approved = sess[i], contacts(i), set()
        s.send("".join("<presence to='%s@%s' type='subscribe'/>" % (users[j][0], a.host)
                       for j in sorted(mine)))
        buf = s.buf
        while approved != mine:
            tags = list(PRESENCE_TAG.finditer(buf))
            for m in tags:
                kind, frm = attr(m.group(0), b"type"), attr(m.group(0), b"from")
                j = index.get((frm or "").split("@")[0])
                if j not in mine:
                    continue
                if kind == "subscribe":
                    s.send("<presence to='%s' type='subscribed'/>" % frm.split("/")[0])
                elif kind == "subscribed":
                    approved.add(j)
            # Keep what may be the start of a tag not yet whole: a start tag has no "<".
            rest = buf[tags[-1].end():] if tags else buf
            cut = rest.rfind(b"<")
            buf = rest[cut:] if cut >= 0 else b""
            if approved != mine:
                data = await asyncio.wait_for(s.reader.read(65536), a.step_timeout)
                if not data:
                    raise Failed("closed")
                buf += data
        s.buf = buf

    t0 = time.monotonic()
    failed = 0
    for r in await asyncio.wait_for(
            asyncio.gather(*(one(i) for i in range(k)), return_exceptions=True), a.deadline):
        if isinstance(r, BaseException):
            failed += 1
            if failed <= 3:
                print("roster: %r" % r, file=sys.stderr)
    # What each roster holds now, asked after every approval came back.
    both = 0

    async def check(s):
        nonlocal both
        async with sem:
            s.send("<iq type='get' id='r2'><query xmlns='jabber:iq:roster'/></iq>")
            m = await s.expect(rb"<iq[^>]*id=['\"]r2['\"][^>]*?(?:/>|>.*?</iq>)")
            if len(re.findall(rb"subscription=['\"]both['\"]", m.group(0))) == a.contacts:
                both += 1

    if not failed:
        await asyncio.wait_for(asyncio.gather(*(check(s) for s in sess)), a.deadline)
    dt = time.monotonic() - t0
    for s in sess:
        await s.close()
    report({"mode": "roster", "users": k, "contacts": a.contacts, "failed": failed,
            "complete": both, "seconds": dt})


def report(d):
    ru = resource.getrusage(resource.RUSAGE_SELF)
    d["client_cpu_s"] = round(ru.ru_utime + ru.ru_stime, 3)
    print(json.dumps(d), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["idle", "login", "chat", "register", "roster"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--port2", type=int, default=0, help="chat: the pairs' second sessions' port")
    p.add_argument("--host", default="localhost")
    p.add_argument("--users", help="FORMAT:PASSWORD:COUNT, e.g. u%%d:pw:200")
    p.add_argument("--anon", action="store_true")
    p.add_argument("-n", type=int, default=100)
    p.add_argument("-C", "--concurrency", type=int, default=100)
    p.add_argument("--pairs", type=int, default=50)
    p.add_argument("-w", "--window", type=int, default=10)
    p.add_argument("--size", type=int, default=16, help="body bytes")
    p.add_argument("--hold", type=float, default=120)
    p.add_argument("--deadline", type=float, default=300)
    p.add_argument("--step-timeout", type=float, default=30)
    p.add_argument("--ifaddr", default="")
    p.add_argument("--offset", type=int, default=0, help="idle: first account's index")
    p.add_argument("--no-presence", action="store_true")
    p.add_argument("--contacts", type=int, default=18, help="roster: contacts per account")
    a = p.parse_args()
    if a.mode != "register" and not a.anon and not a.users:
        p.error("--anon or --users")
    if a.anon:
        a.users = None
    asyncio.run({"idle": cmd_idle, "login": cmd_login, "chat": cmd_chat,
                 "register": cmd_register, "roster": cmd_roster}[a.mode](a))


if __name__ == "__main__":
    main()
