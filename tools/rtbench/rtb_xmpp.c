/*
 * rtb_xmpp: one rtbench process of an XMPP command (rtb_xmpp.h), all of its sessions on
 * one libuv loop, through the phases
 *   UP     log in the held sessions (xidle's, xchat's pairs), --conn-parallel at a time;
 *   WAIT   with --procs or --go-stdin, report ready and wait for the parent's go;
 *   RUN    for -d seconds: pairs send on their schedule, connectors log in (xlogin's
 *          loop, xchat's --storm, xroster's two passes) until their share is done;
 *   DRAIN  up to --drain seconds for the messages still on their way;
 *   CLOSE  </stream:stream> to every session; each socket is closed once the server has
 *          closed its side (forcibly after RTB_X_CLOSE_MS), so that TIME_WAIT stays on
 *          the server's side and our ports are free for the next login.
 * Every phase has a deadline, so the loop always ends. Bytes read are appended to the
 * session's `in` buffer and consumed as the expected end tags appear; a session whose
 * unconsumed bytes pass RTB_X_IN_MAX is a protocol error.
 */
#define _GNU_SOURCE /* memmem */
#include "rtb_xmpp.h"
#include "rtb_loop.h"
#include "rtb_mqtt.h"
#include "rtb_xkeys.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define RTB_X_READ_BUF (256 * 1024) /* shared read buffer per process, bytes */
#define RTB_X_IN_MAX (4u << 20)     /* unconsumed input of one session, bytes */
#define RTB_X_TICK_MS 1000          /* per-second report and timeout sweep */
#define RTB_X_PACE_MS 1             /* chat schedule tick */
#define RTB_X_CHECK_MS 50           /* how often the run's end is evaluated */
#define RTB_X_CLOSE_MS 2000         /* grace for the server to close after ours */
#define RTB_X_CONTACTS 9            /* xroster: contacts on each side, 18 in all */

enum { PH_UP, PH_WAIT, PH_RUN, PH_DRAIN, PH_CLOSE };
enum { ROLE_HELD, ROLE_CONN }; /* held: logged in once (UP); conn: a login loop (RUN) */
enum {
    XS_IDLE,   /* no connection */
    XS_TCP,    /* connecting */
    XS_FEAT1,  /* stream opened, waiting for the features */
    XS_CHAL,   /* SCRAM client-first sent */
    XS_SUCC,   /* SCRAM client-final sent */
    XS_FEAT2,  /* restarted, waiting for the features */
    XS_SESS,   /* RFC 3921 session, where still required */
    XS_BIND,   /* bind sent */
    XS_ROSTER, /* roster get sent */
    XS_SYNC,   /* xchat's pairs: presence and a ping sent, waiting for the ping's answer */
    XS_SETUP,  /* xroster: presences sent, waiting for the ping's answer */
    XS_JOIN,   /* xmuc: join presence sent, waiting for the room's subject */
    XS_READY,  /* logged in: presence sent */
    XS_BYE,    /* </stream:stream> sent, waiting for the server to close */
};

typedef struct xw_s xw_t;

typedef struct xc_s {
    uv_tcp_t tcp;
    uv_connect_t creq;
    uv_write_t wreq;
    xw_t *w;
    rtb_buf_t in;     /* bytes read and not yet consumed */
    rtb_buf_t out;    /* bytes waiting for the next flush */
    rtb_buf_t busy;   /* bytes owned by wreq while a write is in flight */
    uint64_t t_start; /* ns, this login's connection start */
    uint32_t pos;     /* index in the worker's array */
    uint32_t acct;    /* account index of the current login */
    uint32_t peer;    /* xchat: the partner's position in the worker's array */
    uint8_t role, state, open, writing, dirty, counted;
    uint8_t auth_sig[32]; /* the ServerSignature this login expects */
    char bare[128];       /* client-first-message-bare */
    char jid[128];        /* the bound full JID */
    uint64_t k;           /* xchat: messages sent */
    uint64_t next_seq;    /* xchat: the next sequence number expected from the partner */
    double phase;         /* xchat: offset of the send schedule, in messages (0..1) */
    uint64_t t_join;      /* xmuc: ns, this join's presence sent */
    uint32_t occ;         /* xmuc: occupant index (account index less -n) */
    uint32_t room;        /* xmuc: occ % --rooms */
    uint32_t *seqs;       /* xmuc: next sequence expected from each sender of the room */
    uint8_t joined;       /* xmuc: in the room */
    uint8_t retry;        /* xmuc: join refused (room not ready): try again at the tick */
    uint8_t tries;        /* xmuc: joins sent */
    struct xc_s *next_dirty;
} xc_t;

struct xw_s {
    const rtb_opts_t *o;
    uint32_t proc;
    uv_loop_t loop;
    uv_timer_t tick, pace, close_timer;
    uv_prepare_t flush; /* writes the sessions marked dirty, once per loop iteration */
    uv_pipe_t go;
    int go_fd;
    int phase;
    xc_t *cl; /* held sessions first, then connectors */
    uint32_t nheld, ncl;
    uint32_t up_next, up_active, up_done;
    uint32_t acct_lo, acct_n; /* connectors: global login numbers [acct_lo, acct_lo + n) */
    uint32_t logins_started;  /* connectors: logins begun of acct_n */
    int left;                 /* xchat --leave-at: the storm's sessions were dropped */
    uint32_t conn_lo;         /* held: first account index */
    uint64_t run_start_ms, run_end_ms, drain_end_ms, close_end_ms, wait_end_ms, next_check_ms;
    double rate_per_sender;          /* xchat: messages/s of each pair member */
    uint32_t join_next, join_active; /* xmuc --hold: joins started in RUN, and in flight */
    uint32_t spr;                    /* xmuc: senders per room, at most */
    uint64_t drain_start_ns;         /* xmuc: when the drain began */
    uint64_t last_read_ns;           /* xmuc: the last bytes read, any session */
    uint64_t own_expected;           /* xmuc: deliveries due to this process's occupants */
    uint64_t settle_end_ns;          /* xmuc: joined; ready once quiet, or at this time */
    xc_t *dirty;
    rtb_report_t rep;
    uint64_t tick_no;
    rtb_emit_fn emit;
    void *ctx;
    rtb_xkeys_t keys; /* the SCRAM keys of our password, per salt */
};

static uint8_t xread_buf[RTB_X_READ_BUF];

rtb_xmuc_opts_t rtb_xmuc = {.rooms = 1, .senders = 10, .room_fmt = "r%i"};

#define RTB_X_JOIN_TRIES 30    /* xmuc: joins of one occupant refused before it gives up */
#define RTB_X_QUIET_MS 1000    /* xmuc: the drain ends after this long with no delivery */
#define RTB_X_SETTLE_MAX_S 180 /* xmuc: longest wait for quiet input after the joins */

int rtb_xmpp_cmd(rtb_cmd_t cmd)
{
    return cmd == RTB_CMD_XLOGIN || cmd == RTB_CMD_XIDLE || cmd == RTB_CMD_XCHAT ||
           cmd == RTB_CMD_XROSTER || cmd == RTB_CMD_XMUC;
}

/* ---- one session ------------------------------------------------------------------ */

static void phase_next(xw_t *w);
static void login_start(xc_t *c);
static void conn_kick(xw_t *w);
static void join_end(xc_t *c, int ok, const char *why);

static void b64(char *out, const uint8_t *p, size_t n)
{
    EVP_EncodeBlock((unsigned char *)out, p, (int)n);
}

/* fmt (-u or -P) with its %i replaced by the account's index. */
static void of_account(const char *fmt, uint32_t acct, char *out, size_t cap)
{
    const char *at = strstr(fmt, "%i");
    if (!at) {
        snprintf(out, cap, "%s", fmt);
        return;
    }
    snprintf(out, cap, "%.*s%u%s", (int)(at - fmt), fmt, acct, at + 2);
}

/* The account's local part. */
static void user_of(const xw_t *w, uint32_t acct, char *out, size_t cap)
{
    of_account(w->o->user, acct, out, cap);
}

static void mark_dirty(xc_t *c)
{
    if (c->dirty)
        return;
    c->dirty = 1;
    c->next_dirty = c->w->dirty;
    c->w->dirty = c;
}

/* Appends printf output to the session's unsent bytes; the next flush writes them. */
static int xsend(xc_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || rtb_buf_reserve(&c->out, (size_t)n + 1))
        return -ENOMEM;
    va_start(ap, fmt);
    vsnprintf((char *)c->out.p + c->out.len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    c->out.len += (size_t)n;
    mark_dirty(c);
    return 0;
}

static void on_xclose(uv_handle_t *h)
{
    xc_t *c = h->data;
    xw_t *w = c->w;
    c->open = 0;
    c->state = XS_IDLE;
    if (c->role == ROLE_CONN && w->phase == PH_RUN && !w->o->hold)
        login_start(c);
}

static void sock_close(xc_t *c)
{
    if (c->open && !uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_xclose);
}

/* A login step or an open session is over: the login counts once, as done or failed. */
static void login_settle(xc_t *c, int ok)
{
    xw_t *w = c->w;
    if (c->counted)
        return;
    c->counted = 1;
    if (!ok)
        w->rep.s.conn_fail++;
    if (c->role == ROLE_HELD) {
        w->up_active--;
        w->up_done++;
        if (w->phase == PH_UP && w->up_done == w->nheld && w->o->cmd == RTB_CMD_XMUC && !w->o->hold)
            /* The joins' presences still on their way to the occupants (n x n of them in
             * one room) would be in the run: the tick goes on once the input is quiet. */
            w->settle_end_ns = rtb_now_ns() + (uint64_t)RTB_X_SETTLE_MAX_S * 1000000000u;
        else if (w->phase == PH_UP && w->up_done == w->nheld)
            phase_next(w);
        else if (w->phase == PH_UP)
            for (; w->up_next < w->nheld && w->up_active < w->o->conn_parallel; w->up_active++)
                login_start(&w->cl[w->up_next++]);
        return;
    }
    w->up_active--;
    if (w->o->hold)
        conn_kick(w);
}

static void xfail(xc_t *c, const char *why)
{
    xw_t *w = c->w;
    if (c->state == XS_IDLE || !c->open)
        return;
    if (c->state == XS_JOIN || c->retry)
        join_end(c, 0, why);
    if (c->state < XS_READY || c->state == XS_SETUP) {
        if (w->rep.s.conn_fail < 3 && w->phase < PH_CLOSE) {
            size_t n = c->in.len < 200 ? c->in.len : 200;
            char u[64];
            user_of(w, c->acct, u, sizeof(u));
            fprintf(stderr, "rtbench: login of %s: %s: %.*s\n", u, why, (int)n,
                    c->in.p ? (const char *)c->in.p : "");
        }
        login_settle(c, 0);
    } else if (c->state == XS_READY && w->phase < PH_CLOSE) {
        w->rep.s.conn_lost++;
    }
    c->state = XS_BYE;
    sock_close(c);
}

static void on_xwrite(uv_write_t *req, int status)
{
    xc_t *c = req->data;
    c->writing = 0;
    c->busy.len = 0;
    if (status < 0) {
        xfail(c, "write failed");
        return;
    }
    if (c->out.len)
        mark_dirty(c);
}

static void xflush(xc_t *c)
{
    if (c->writing || !c->out.len || !c->open || uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    int r = rtb_write((uv_stream_t *)&c->tcp, &c->wreq, &c->out, &c->busy, on_xwrite);
    c->writing = r == 1;
    if (r < 0)
        xfail(c, "write failed");
}

static void on_prepare(uv_prepare_t *h)
{
    xw_t *w = h->data;
    while (w->dirty) {
        xc_t *c = w->dirty;
        w->dirty = c->next_dirty;
        c->dirty = 0;
        xflush(c);
    }
}

static const uint8_t *find(const xc_t *c, size_t from, const char *pat)
{
    if (from >= c->in.len)
        return NULL;
    return memmem(c->in.p + from, c->in.len - from, pat, strlen(pat));
}

/* Drops the first n input bytes. */
static void consume(xc_t *c, size_t n)
{
    memmove(c->in.p, c->in.p + n, c->in.len - n);
    c->in.len -= n;
}

static size_t off_of(const xc_t *c, const uint8_t *p)
{
    return (size_t)(p - c->in.p);
}

/* The end (one past) of the stream features, or 0 while they are incomplete. */
static size_t features_end(const xc_t *c)
{
    const uint8_t *e = find(c, 0, "</stream:features>");
    if (e)
        return off_of(c, e) + strlen("</stream:features>");
    e = find(c, 0, "</features>");
    return e ? off_of(c, e) + strlen("</features>") : 0;
}

/* The end of the stanza that carries id='ID' (or "ID"), or 0 while it is incomplete. */
static size_t stanza_end(const xc_t *c, const char *id, const char *end_tag)
{
    char a[32], b[32];
    snprintf(a, sizeof(a), "id='%s'", id);
    snprintf(b, sizeof(b), "id=\"%s\"", id);
    const uint8_t *p = find(c, 0, a);
    if (!p)
        p = find(c, 0, b);
    if (!p)
        return 0;
    const uint8_t *gt = memchr(p, '>', c->in.len - off_of(c, p));
    if (!gt)
        return 0;
    if (gt[-1] == '/')
        return off_of(c, gt) + 1;
    const uint8_t *e = find(c, off_of(c, gt), end_tag);
    return e ? off_of(c, e) + strlen(end_tag) : 0;
}

static size_t count_in(const xc_t *c, size_t n, const char *pat)
{
    size_t k = 0, l = strlen(pat);
    for (const uint8_t *p = c->in.p, *e = c->in.p + n; (p = memmem(p, (size_t)(e - p), pat, l));
         p += l)
        k++;
    return k;
}

static void stream_open(xc_t *c)
{
    xsend(c,
          "<?xml version='1.0'?><stream:stream to='%s' xmlns='jabber:client' "
          "xmlns:stream='http://etherx.jabber.org/streams' version='1.0'>",
          c->w->o->domain);
}

static int scram_first(xc_t *c)
{
    uint8_t rnd[18];
    char nonce[32], user[64], msg[192];
    if (RAND_bytes(rnd, sizeof(rnd)) != 1)
        return -EIO;
    b64(nonce, rnd, sizeof(rnd));
    user_of(c->w, c->acct, user, sizeof(user));
    snprintf(c->bare, sizeof(c->bare), "n=%s,r=%s", user, nonce);
    char gs2[sizeof(c->bare) + 4];
    int n = snprintf(gs2, sizeof(gs2), "n,,%s", c->bare);
    b64(msg, (const uint8_t *)gs2, (size_t)n);
    return xsend(c,
                 "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' "
                 "mechanism='SCRAM-SHA-256'>%s</auth>",
                 msg);
}

/* The value of attribute k (one letter) in a SCRAM message, and its length. */
static const char *scram_attr(const char *m, char k, size_t *n)
{
    for (const char *p = m; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        if (p[0] == k && p[1] == '=') {
            const char *e = strchr(p, ',');
            *n = e ? (size_t)(e - p - 2) : strlen(p + 2);
            return p + 2;
        }
    }
    return NULL;
}

/* server-first-message in, client-final-message out. */
static int scram_final(xc_t *c, const char *b64in, size_t len)
{
    char first[512], final[512], proof64[64], out[1024];
    if (len >= sizeof(first) || len % 4)
        return -EPROTO;
    int n = EVP_DecodeBlock((unsigned char *)first, (const unsigned char *)b64in, (int)len);
    if (n <= 0)
        return -EPROTO;
    first[n] = 0; /* the decoder's padding zeros, if any, end the string earlier */
    size_t rn = 0, sn = 0, in = 0;
    const char *r = scram_attr(first, 'r', &rn), *s = scram_attr(first, 's', &sn),
               *i = scram_attr(first, 'i', &in);
    const char *mine = strstr(c->bare, ",r=") + 3;
    if (!r || !s || !i || rn < strlen(mine) || memcmp(r, mine, strlen(mine)))
        return -EPROTO;
    char pass[128];
    of_account(c->w->o->pass, c->acct, pass, sizeof(pass));
    const rtb_xkey_t *k = rtb_xkeys_get(&c->w->keys, pass, s, sn, (uint32_t)strtoul(i, NULL, 10));
    c->w->rep.s.pbkdf2 = c->w->keys.pbkdf2;
    if (!k)
        return -EPROTO;
    int fl = snprintf(final, sizeof(final), "c=biws,r=%.*s", (int)rn, r);
    char auth[1600];
    int al = snprintf(auth, sizeof(auth), "%s,%s,%s", c->bare, first, final);
    if (fl <= 0 || (size_t)fl >= sizeof(final) || al <= 0 || (size_t)al >= sizeof(auth))
        return -EPROTO;
    uint8_t sig[32], proof[32];
    unsigned hl = 32;
    HMAC(EVP_sha256(), k->stored_key, 32, (const uint8_t *)auth, (size_t)al, sig, &hl);
    for (int j = 0; j < 32; j++)
        proof[j] = k->client_key[j] ^ sig[j];
    HMAC(EVP_sha256(), k->server_key, 32, (const uint8_t *)auth, (size_t)al, c->auth_sig, &hl);
    b64(proof64, proof, 32);
    fl += snprintf(final + fl, sizeof(final) - (size_t)fl, ",p=%s", proof64);
    b64(out, (const uint8_t *) final, (size_t)fl);
    return xsend(c, "<response xmlns='urn:ietf:params:xml:ns:xmpp-sasl'>%s</response>", out);
}

/* <success/> or <success>v=..</success>: the server's signature checked when present. */
static int scram_check(xc_t *c, const uint8_t *p, const uint8_t *e)
{
    const uint8_t *gt = memchr(p, '>', (size_t)(e - p));
    if (!gt || gt[-1] == '/' || gt + 1 == e)
        return 0;
    char dec[128], want[64];
    size_t n = (size_t)(e - gt - 1);
    if (n >= sizeof(dec) || n % 4)
        return -EPROTO;
    if (EVP_DecodeBlock((unsigned char *)dec, gt + 1, (int)n) <= 0)
        return -EPROTO;
    b64(want, c->auth_sig, 32);
    return strncmp(dec, "v=", 2) || strncmp(dec + 2, want, strlen(want)) ? -EPROTO : 0;
}

static void contact_presences(xc_t *c)
{
    const rtb_opts_t *o = c->w->o;
    uint32_t n = o->count, me = c->acct - o->start;
    for (uint32_t d = 1; d <= RTB_X_CONTACTS; d++) {
        for (int side = -1; side <= 1; side += 2) {
            char u[64];
            uint32_t j = (me + n + (uint32_t)side * d) % n;
            user_of(c->w, o->start + j, u, sizeof(u));
            xsend(c,
                  "<presence to='%s@%s' type='subscribed'/>"
                  "<presence to='%s@%s' type='subscribe'/>",
                  u, o->domain, u, o->domain);
        }
    }
    xsend(c, "<iq type='get' id='p1'><ping xmlns='urn:xmpp:ping'/></iq>");
}

/* xroster: approves the subscription requests in in[0..n). */
static void approve(xc_t *c, size_t n)
{
    for (const uint8_t *p = c->in.p, *e = c->in.p + n;
         (p = memmem(p, (size_t)(e - p), "<presence", 9));) {
        const uint8_t *gt = memchr(p, '>', (size_t)(e - p));
        if (!gt)
            break;
        size_t tl = (size_t)(gt - p);
        const uint8_t *f = memmem(p, tl, "from=", 5);
        if ((memmem(p, tl, "type='subscribe'", 16) || memmem(p, tl, "type=\"subscribe\"", 16)) &&
            f) {
            char q = (char)f[5];
            const uint8_t *fe = memchr(f + 6, q, (size_t)(gt - f - 6));
            if (fe)
                xsend(c, "<presence to='%.*s' type='subscribed'/>", (int)(fe - f - 6), f + 6);
        }
        p = gt;
    }
}

/* A login is through: counted, and its time recorded. */
static void login_count(xc_t *c)
{
    xw_t *w = c->w;
    rtb_stats_t *s = &w->rep.s;
    uint64_t t = rtb_now_ns();
    s->conn_ok++;
    rtb_hist_record(&w->rep.conn, t - c->t_start);
    if (c->role == ROLE_CONN && w->phase == PH_RUN) {
        s->hs_full++;
        s->t_conn_last = t;
    }
}

static void login_done(xc_t *c)
{
    login_count(c);
    login_settle(c, 1);
}

/* ---- xmuc: joins and deliveries ------------------------------------------------- *
 * Stats fields of xmuc: sub_ok / sub_fail = joins done / given up, the `ack` histogram
 * = join time (presence sent to the subject's arrival), expected = the occupants of the
 * sender's room per message sent, received = every groupchat delivery of ours,
 * unique / gaps / dups by each sender's sequence at each occupant, tls_full / tls_resumed
 * = this process's CPU (us) when the run began / when the drain ended.
 */

static void room_name(uint32_t room, char *out, size_t cap)
{
    of_account(rtb_xmuc.room_fmt, room, out, cap);
}

/* The occupants of room r: those i < -c with i % rooms == r. */
static uint32_t room_occupants(const rtb_opts_t *o, uint32_t r)
{
    return o->count / rtb_xmuc.rooms + (r < o->count % rtb_xmuc.rooms);
}

static void muc_join(xc_t *c)
{
    char room[64];
    room_name(c->room, room, sizeof(room));
    c->retry = 0;
    c->tries++;
    c->t_join = rtb_now_ns();
    c->state = XS_JOIN;
    xsend(c, "<presence to='%s@%s/n%u'><x xmlns='http://jabber.org/protocol/muc'/></presence>",
          room, rtb_xmuc.muc_host, c->occ);
}

/* --hold: joins in the run, --conn-parallel at a time. */
static void join_kick(xw_t *w)
{
    while (w->phase == PH_RUN && w->join_next < w->nheld && w->join_active < w->o->conn_parallel) {
        xc_t *c = &w->cl[w->join_next++];
        if (c->open && c->state == XS_READY) {
            w->join_active++;
            muc_join(c);
        }
    }
}

/* A join is over: in (ok) or given up. The session's place in the login phase or in the
 * --hold joins is freed; a refused session stays logged in, out of the room. */
static void join_end(xc_t *c, int ok, const char *why)
{
    xw_t *w = c->w;
    if (ok) {
        c->joined = 1;
        w->rep.s.sub_ok++;
        rtb_hist_record(&w->rep.ack, rtb_now_ns() - c->t_join);
    } else {
        if (w->rep.s.sub_fail < 3 && w->phase < PH_CLOSE) {
            size_t n = c->in.len < 300 ? c->in.len : 300;
            fprintf(stderr, "rtbench: join of n%u: %s: %.*s\n", c->occ, why, (int)n,
                    c->in.p ? (const char *)c->in.p : "");
        }
        w->rep.s.sub_fail++;
    }
    c->retry = 0;
    c->state = XS_READY;
    if (w->o->hold) {
        w->join_active--;
        join_kick(w);
    } else if (!c->counted) {
        login_settle(c, 1);
    }
}

/* XS_JOIN's input: 1 when the join is over (in, or given up), 0 while more is needed. */
static int join_input(xc_t *c)
{
    const uint8_t *p = find(c, 0, "<subject");
    const uint8_t *err = find(c, 0, "type='error'");
    if (!err)
        err = find(c, 0, "type=\"error\"");
    if (err && (!p || err < p)) {
        const uint8_t *e = find(c, off_of(c, err), "</presence>");
        if (!e)
            return 0;
        if (c->tries < RTB_X_JOIN_TRIES && c->w->phase < PH_DRAIN &&
            !memmem(c->in.p, off_of(c, e), "service-unavailable", 19)) {
            /* e.g. a room still locked for its creator: again at the next tick */
            consume(c, off_of(c, e) + 11);
            c->state = XS_READY;
            c->retry = 1;
            return 1;
        }
        join_end(c, 0, "refused");
        consume(c, off_of(c, e) + 11);
        return 1;
    }
    if (!p)
        return 0;
    const uint8_t *e = find(c, off_of(c, p), "</message>");
    if (!e)
        return 0;
    consume(c, off_of(c, e) + 10);
    join_end(c, 1, NULL);
    return 1;
}

/* The next complete <message>'s body text in c's input from *at (NULL: no more); *at moves
   past that message, one without a body skipped. */
static const char *next_body(xc_t *c, size_t *at)
{
    const uint8_t *e;
    while ((e = find(c, *at, "</message>"))) {
        size_t end = off_of(c, e) + 10;
        const uint8_t *b = memmem(c->in.p + *at, end - *at, "<body>", 6);
        *at = end;
        if (b)
            return (const char *)b + 6;
    }
    return NULL;
}

/* One delivery of sequence number seq where *next was expected: unique, a gap, or a dup. */
static void count_seq(rtb_stats_t *s, uint64_t *next, uint64_t seq)
{
    if (seq < *next) {
        s->dups++;
        return;
    }
    s->unique++;
    s->gaps += seq - *next;
    *next = seq + 1;
}

/* What the input holds from at on that may begin a message not yet complete is kept. */
static void keep_partial(xc_t *c, size_t at)
{
    const uint8_t *m = find(c, at, "<message");
    consume(c, m ? off_of(c, m) : c->in.len > at + 16 ? c->in.len - 16 : at);
}

/* Groupchat deliveries: "ts seq sender" bodies; latency, and sequence per sender. */
static void muc_input(xc_t *c)
{
    xw_t *w = c->w;
    rtb_stats_t *s = &w->rep.s;
    size_t at = 0;
    const char *q;
    uint64_t t = rtb_now_ns();
    while ((q = next_body(c, &at))) {
        char *q2;
        unsigned long long ts = strtoull(q, &q2, 10), seq = 0, from = 0;
        bool ok = q2 != q && *q2 == ' ';
        if (ok)
            seq = strtoull(q = q2 + 1, &q2, 10), ok = q2 != q && *q2 == ' ';
        if (ok)
            from = strtoull(q = q2 + 1, &q2, 10), ok = q2 != q && *q2 == '<';
        uint32_t k = (uint32_t)(from / rtb_xmuc.rooms);
        if (ok) {
            s->received++;
            s->t_recv_last = t;
            rtb_hist_record(&w->rep.e2e, t > ts ? t - ts : 0);
        }
        if (!ok || !c->seqs || from % rtb_xmuc.rooms != c->room || k >= w->spr) {
            s->foreign++;
            continue;
        }
        uint64_t next = c->seqs[k];
        count_seq(s, &next, seq);
        c->seqs[k] = (uint32_t)next;
    }
    keep_partial(c, at);
}

/* Sender j's schedule offset, in messages (as build sets c->phase). */
static double muc_phase(const rtb_opts_t *o, uint32_t j)
{
    return fmod((double)(o->start + j) * 0.6180339887498949, 1.0);
}

/* Messages sender j sends in the run: k = 0.. while k + phase <= -d x its rate. */
static uint64_t muc_sends_of(const xw_t *w, uint32_t j)
{
    double last = w->o->duration_s * w->rate_per_sender - muc_phase(w->o, j);
    return last < 0 ? 0 : (uint64_t)floor(last) + 1;
}

/*
 * The deliveries this process's joined occupants should see once every sender has sent
 * its schedule: the drain waits for them (other processes' senders included), then for
 * no more than --drain.
 */
static uint64_t muc_own_expected(const xw_t *w)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < w->nheld; i++) {
        const xc_t *c = &w->cl[i];
        if (!c->joined || c->state != XS_READY)
            continue;
        for (uint32_t j = c->room; j < rtb_xmuc.senders; j += rtb_xmuc.rooms)
            n += muc_sends_of(w, j);
    }
    return n;
}

/* The senders (occupants 0..S-1, joined) send what their schedule says is due. */
static void muc_send(xw_t *w)
{
    double el = (double)(uv_now(&w->loop) - w->run_start_ms) / 1000.0;
    if (el > w->o->duration_s)
        el = w->o->duration_s; /* the schedule ends exactly at -d: see muc_sends_of */
    uint64_t ts = rtb_now_ns();
    for (uint32_t i = 0; i < w->nheld; i++) {
        xc_t *c = &w->cl[i];
        if (c->occ >= rtb_xmuc.senders)
            break; /* the senders come first in process order */
        if (c->state != XS_READY || !c->joined)
            continue;
        char room[64];
        room_name(c->room, room, sizeof(room));
        uint64_t occupants = room_occupants(w->o, c->room);
        while ((double)c->k + c->phase <= el * w->rate_per_sender) {
            if (xsend(c, "<message to='%s@%s' type='groupchat'><body>%llu %llu %u</body></message>",
                      room, rtb_xmuc.muc_host, (unsigned long long)ts, (unsigned long long)c->k,
                      c->occ)) {
                xfail(c, "out of memory");
                break;
            }
            c->k++;
            w->rep.s.sent++;
            w->rep.s.expected += occupants;
        }
    }
}

static void bye(xc_t *c)
{
    c->state = XS_BYE;
    xsend(c, "</stream:stream>");
}

/* Chat deliveries in the input: latency from the sender's stamp, sequence per partner. */
static void chat_input(xc_t *c)
{
    xw_t *w = c->w;
    rtb_stats_t *s = &w->rep.s;
    size_t at = 0;
    const char *q;
    uint64_t t = rtb_now_ns();
    while ((q = next_body(c, &at))) {
        unsigned long long ts = 0, seq = 0;
        if (sscanf(q, "%llu %llu", &ts, &seq) != 2) {
            s->foreign++;
            continue;
        }
        s->received++;
        s->t_recv_last = t;
        rtb_hist_record(&w->rep.e2e, t > ts ? t - ts : 0);
        count_seq(s, &c->next_seq, seq);
    }
    keep_partial(c, at);
}

/* Advances the login by what has arrived; returns when more bytes are needed. */
static void advance(xc_t *c)
{
    xw_t *w = c->w;
    size_t end;
    const uint8_t *p;
    int r = 0;
    for (;;) {
        if (c->state < XS_READY && (find(c, 0, "<failure") || find(c, 0, "<stream:error") ||
                                    find(c, 0, "</stream:stream>"))) {
            xfail(c, "refused");
            return;
        }
        switch (c->state) {
        case XS_FEAT1:
            if (!(end = features_end(c)))
                return;
            consume(c, end);
            if (rtb_xmuc.anon) {
                r = xsend(c, "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' "
                             "mechanism='ANONYMOUS'/>");
                c->state = XS_SUCC;
                break;
            }
            r = scram_first(c);
            c->state = XS_CHAL;
            break;
        case XS_CHAL: {
            const uint8_t *e = find(c, 0, "</challenge>");
            if (!e || !(p = find(c, 0, "<challenge")))
                return;
            const uint8_t *gt = memchr(p, '>', (size_t)(e - p));
            if (!gt)
                return;
            r = scram_final(c, (const char *)gt + 1, (size_t)(e - gt - 1));
            consume(c, off_of(c, e) + 12);
            c->state = XS_SUCC;
            break;
        }
        case XS_SUCC: {
            if (!(p = find(c, 0, "<success")))
                return;
            const uint8_t *gt = find(c, off_of(c, p), ">");
            if (!gt)
                return;
            const uint8_t *e = gt[-1] == '/' ? gt : find(c, off_of(c, p), "</success>");
            if (!e)
                return;
            r = rtb_xmuc.anon ? 0 : scram_check(c, p, e);
            consume(c, off_of(c, e) + (gt == e ? 1 : 10));
            c->state = XS_FEAT2;
            if (!r)
                stream_open(c);
            break;
        }
        case XS_FEAT2:
            if (!(end = features_end(c)))
                return;
            /* RFC 3921's session only where the server still requires it. */
            if (memmem(c->in.p, end, "xmpp-session", 12) && !memmem(c->in.p, end, "<optional", 9)) {
                xsend(c, "<iq type='set' id='s1'>"
                         "<session xmlns='urn:ietf:params:xml:ns:xmpp-session'/></iq>");
                c->state = XS_SESS;
            } else {
                c->state = XS_BIND;
            }
            consume(c, end);
            xsend(c,
                  "<iq type='set' id='b1'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'>"
                  "<resource>rtb%u-%u-%llu</resource></bind></iq>",
                  w->proc, c->pos, (unsigned long long)w->rep.s.conn_ok);
            break;
        case XS_SESS:
            if (!(end = stanza_end(c, "s1", "</iq>")))
                return;
            consume(c, end);
            c->state = XS_BIND;
            break;
        case XS_BIND: {
            if (!(end = stanza_end(c, "b1", "</iq>")))
                return;
            const uint8_t *j = memmem(c->in.p, end, "<jid>", 5);
            const uint8_t *je = j ? memmem(j, end - off_of(c, j), "</jid>", 6) : NULL;
            if (!je || (size_t)(je - j - 5) >= sizeof(c->jid)) {
                xfail(c, "bind");
                return;
            }
            snprintf(c->jid, sizeof(c->jid), "%.*s", (int)(je - j - 5), j + 5);
            consume(c, end);
            xsend(c, "<iq type='get' id='r1'><query xmlns='jabber:iq:roster'/></iq>");
            c->state = XS_ROSTER;
            break;
        }
        case XS_ROSTER:
            if (!(end = stanza_end(c, "r1", "</iq>")))
                return;
            w->rep.s.roster_both +=
                count_in(c, end, "subscription='both'") + count_in(c, end, "subscription=\"both\"");
            consume(c, end);
            xsend(c, "<presence/>");
            if (c->role == ROLE_HELD && w->o->cmd == RTB_CMD_XCHAT) {
                /* A message to a bare JID before the partner's presence is in force would
                 * go offline and come back out of order: chat only after this answer. */
                xsend(c, "<iq type='get' id='p0'><ping xmlns='urn:xmpp:ping'/></iq>");
                c->state = XS_SYNC;
                break;
            }
            if (c->role == ROLE_HELD && w->o->cmd == RTB_CMD_XMUC && !w->o->hold) {
                /* The session is up once it is in its room. */
                login_count(c);
                muc_join(c);
                break;
            }
            login_done(c);
            if (w->o->cmd == RTB_CMD_XROSTER) {
                contact_presences(c);
                c->state = XS_SETUP;
                c->k = 0; /* pings answered */
            } else if (c->role == ROLE_CONN && !w->o->hold) {
                bye(c);
            } else {
                c->state = XS_READY;
            }
            break;
        case XS_SYNC:
            if (!(end = stanza_end(c, "p0", "</iq>")))
                return;
            consume(c, end);
            login_done(c);
            c->state = XS_READY;
            break;
        case XS_SETUP: {
            /* p1 follows our presences; p2 follows the approvals sent before p1 came. */
            char id[4] = {'p', (char)('1' + c->k), 0};
            end = stanza_end(c, id, "</iq>");
            const uint8_t *gt = c->in.len ? memrchr(c->in.p, '>', c->in.len) : NULL;
            size_t upto = end ? end : gt ? off_of(c, gt) + 1 : 0;
            approve(c, upto);
            consume(c, upto);
            if (!end)
                return;
            if (++c->k == 2) {
                bye(c);
                break;
            }
            xsend(c, "<iq type='get' id='p2'><ping xmlns='urn:xmpp:ping'/></iq>");
            break;
        }
        case XS_JOIN:
            if (!join_input(c))
                return;
            break;
        case XS_READY:
            if (c->role == ROLE_HELD && w->o->cmd == RTB_CMD_XCHAT)
                chat_input(c);
            else if (w->o->cmd == RTB_CMD_XMUC)
                muc_input(c);
            else
                c->in.len = 0;
            return;
        default:
            c->in.len = 0; /* XS_BYE: the server's last words */
            return;
        }
        if (r) {
            xfail(c, r == -EPROTO ? "bad SCRAM exchange" : "out of memory");
            return;
        }
    }
}

static void on_xalloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    *buf = uv_buf_init((char *)xread_buf, sizeof(xread_buf));
}

static void on_xread(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    xc_t *c = st->data;
    if (nread == 0)
        return;
    if (nread < 0) {
        if (c->state == XS_BYE)
            sock_close(c);
        else
            xfail(c, "closed by the server");
        return;
    }
    if (c->in.len + (size_t)nread > RTB_X_IN_MAX) {
        c->w->rep.s.proto_err++;
        xfail(c, "input past its bound");
        return;
    }
    c->w->last_read_ns = rtb_now_ns();
    if (rtb_buf_append(&c->in, buf->base, (size_t)nread)) {
        xfail(c, "out of memory");
        return;
    }
    advance(c);
}

static void on_xconnect(uv_connect_t *req, int status)
{
    xc_t *c = req->data;
    if (c->state != XS_TCP)
        return;
    if (status < 0) {
        xfail(c, uv_strerror(status));
        return;
    }
    if (uv_read_start((uv_stream_t *)&c->tcp, on_xalloc, on_xread)) {
        xfail(c, "read");
        return;
    }
    c->state = XS_FEAT1;
    stream_open(c);
}

/* Account of a session: held ones in order from -n; connectors by login number. */
static uint32_t account_of(const xw_t *w, const xc_t *c)
{
    const rtb_opts_t *o = w->o;
    if (c->role == ROLE_HELD)
        return w->conn_lo + c->pos;
    uint32_t j = w->acct_lo + w->logins_started;
    switch (o->cmd) {
    case RTB_CMD_XCHAT:
        return o->start + 2 * o->pairs + j % (o->accounts - 2 * o->pairs);
    case RTB_CMD_XROSTER:
        return o->start + j % o->count;
    default:
        return o->start + j % o->accounts;
    }
}

static void login_start(xc_t *c)
{
    xw_t *w = c->w;
    const rtb_opts_t *o = w->o;
    if (c->role == ROLE_CONN) {
        if (w->logins_started >= w->acct_n ||
            w->up_active >= (o->hold ? o->conn_parallel : UINT32_MAX))
            return;
        c->acct = account_of(w, c);
        w->logins_started++;
        w->up_active++;
        if (!w->rep.s.t_conn_first)
            w->rep.s.t_conn_first = rtb_now_ns();
    } else {
        c->acct = account_of(w, c);
    }
    c->t_start = rtb_now_ns();
    c->state = XS_TCP;
    c->counted = 0;
    c->in.len = c->out.len = 0;
    if (uv_tcp_init(&w->loop, &c->tcp)) {
        c->state = XS_IDLE;
        login_settle(c, 0);
        return;
    }
    c->open = 1;
    c->tcp.data = c->creq.data = c->wreq.data = c;
    uv_tcp_nodelay(&c->tcp, 1);
    if (o->nifaddr &&
        rtb_tcp_source(&c->tcp, (const struct sockaddr *)&o->ifaddr[c->pos % o->nifaddr])) {
        xfail(c, "bind to --ifaddr");
        return;
    }
    if (uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)&o->addr, on_xconnect))
        xfail(c, "connect");
}

/* Held storm sessions (--hold): start logins while fewer than --conn-parallel are on. */
static void conn_kick(xw_t *w)
{
    if (w->phase != PH_RUN || !w->o->hold || w->left)
        return;
    while (w->logins_started < w->acct_n && w->up_active < w->o->conn_parallel) {
        uint32_t before = w->logins_started;
        login_start(&w->cl[w->nheld + w->logins_started]);
        if (w->logins_started == before)
            return;
    }
}

/* ---- the process's phases ------------------------------------------------------- */

/* xchat: every pair member sends what its schedule says is due, in one write. */
static void chat_send(xw_t *w)
{
    double el = (double)(uv_now(&w->loop) - w->run_start_ms) / 1000.0;
    uint64_t ts = rtb_now_ns();
    for (uint32_t i = 0; i < w->nheld; i++) {
        xc_t *c = &w->cl[i];
        xc_t *p = &w->cl[c->peer];
        if (c->state != XS_READY || p->state != XS_READY)
            continue;
        char u[64];
        user_of(w, p->acct, u, sizeof(u));
        while ((double)c->k + c->phase <= el * w->rate_per_sender) {
            if (xsend(c, "<message to='%s@%s' type='chat'><body>%llu %llu</body></message>", u,
                      w->o->domain, (unsigned long long)ts, (unsigned long long)c->k)) {
                xfail(c, "out of memory");
                break;
            }
            c->k++;
            w->rep.s.sent++;
            w->rep.s.expected++;
        }
    }
}

static int run_finished(xw_t *w)
{
    const rtb_opts_t *o = w->o;
    if (uv_now(&w->loop) >= w->run_end_ms)
        return 1;
    if (o->cmd == RTB_CMD_XIDLE || o->cmd == RTB_CMD_XCHAT || o->cmd == RTB_CMD_XMUC)
        return 0;
    /* Login loops end when their share is done and no login is on its way. */
    if (w->logins_started < w->acct_n || w->up_active)
        return 0;
    for (uint32_t i = w->nheld; i < w->ncl; i++)
        if (w->cl[i].open && w->cl[i].state != XS_READY)
            return 0;
    return 1;
}

static void on_close_timer(uv_timer_t *t)
{
    xw_t *w = t->data;
    uint32_t open = 0;
    for (uint32_t i = 0; i < w->ncl; i++)
        open += w->cl[i].open;
    if (open && uv_now(&w->loop) < w->close_end_ms)
        return;
    for (uint32_t i = 0; i < w->ncl; i++)
        sock_close(&w->cl[i]);
    uv_close((uv_handle_t *)&w->close_timer, NULL);
    uv_close((uv_handle_t *)&w->flush, NULL);
}

static void start_close(xw_t *w)
{
    if (w->phase == PH_DRAIN)
        w->rep.s.tls_resumed = rtb_cpu_us(); /* xmuc: the CPU at the drain's end */
    w->phase = PH_CLOSE;
    if (!w->rep.s.t_run_end)
        w->rep.s.t_run_end = rtb_now_ns();
    uv_close((uv_handle_t *)&w->pace, NULL);
    uv_close((uv_handle_t *)&w->tick, NULL);
    if (w->go_fd >= 0)
        uv_close((uv_handle_t *)&w->go, NULL);
    for (uint32_t i = 0; i < w->ncl; i++) {
        xc_t *c = &w->cl[i];
        if (c->open && c->state >= XS_FEAT1 && c->state != XS_BYE)
            bye(c);
        else if (c->state != XS_BYE)
            sock_close(c);
    }
    w->close_end_ms = uv_now(&w->loop) + RTB_X_CLOSE_MS;
    uv_timer_start(&w->close_timer, on_close_timer, 10, 10);
}

/* --leave-at: every storm session's connection closes in one pass of the loop. */
static void storm_leave(xw_t *w)
{
    uint32_t n = 0;
    w->left = 1;
    for (uint32_t i = w->nheld; i < w->ncl; i++)
        if (w->cl[i].open && !uv_is_closing((uv_handle_t *)&w->cl[i].tcp)) {
            sock_close(&w->cl[i]);
            n++;
        }
    fprintf(stderr, "rtbench: process %u dropped %u storm sessions at %.1f s\n", w->proc, n,
            w->o->leave_at_s);
}

static void on_pace(uv_timer_t *t)
{
    xw_t *w = t->data;
    uint64_t now = uv_now(&w->loop);
    if (w->phase == PH_RUN && w->o->leave_at_s > 0 && w->proc > 0 && !w->left &&
        now >= w->run_start_ms + (uint64_t)(w->o->leave_at_s * 1000))
        storm_leave(w);
    if (w->phase == PH_RUN) {
        if (w->o->cmd == RTB_CMD_XCHAT)
            chat_send(w);
        else if (w->o->cmd == RTB_CMD_XMUC && !w->o->hold)
            muc_send(w);
        if (now < w->next_check_ms)
            return;
        w->next_check_ms = now + RTB_X_CHECK_MS;
        if (run_finished(w)) {
            if (w->o->cmd == RTB_CMD_XMUC && !w->o->hold)
                muc_send(w); /* the schedule's last messages */
            w->phase = PH_DRAIN;
            w->own_expected = w->o->cmd == RTB_CMD_XMUC ? muc_own_expected(w) : 0;
            w->rep.s.t_run_end = w->drain_start_ns = rtb_now_ns();
            w->drain_end_ms = now + (uint64_t)(w->o->drain_s * 1000);
        }
        return;
    }
    if (w->phase == PH_DRAIN && w->o->cmd == RTB_CMD_XMUC) {
        /* Every delivery the schedules promise is in (muc_own_expected), or --drain. */
        if (w->rep.s.unique >= w->own_expected || now >= w->drain_end_ms)
            start_close(w);
        return;
    }
    if (w->phase == PH_DRAIN &&
        (w->rep.s.unique + w->rep.s.dups >= w->rep.s.sent || now >= w->drain_end_ms))
        start_close(w);
}

static void start_run(xw_t *w)
{
    if (w->phase != PH_WAIT)
        return;
    w->phase = PH_RUN;
    uv_update_time(&w->loop);
    w->run_start_ms = uv_now(&w->loop);
    w->run_end_ms = w->run_start_ms + (uint64_t)(w->o->duration_s * 1000);
    w->rep.s.t_run_start = rtb_now_ns();
    w->rep.s.tls_full = rtb_cpu_us(); /* xmuc: the CPU at the run's start */
    if (w->o->cmd == RTB_CMD_XMUC) {
        if (w->o->hold)
            join_kick(w);
    } else if (w->o->hold)
        conn_kick(w);
    else
        for (uint32_t i = w->nheld; i < w->ncl; i++)
            login_start(&w->cl[i]);
    uv_timer_start(&w->pace, on_pace, 0, RTB_X_PACE_MS);
}

static void on_go(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    if (nread == 0)
        return;
    uv_read_stop(st);
    start_run(st->data);
}

static void phase_next(xw_t *w)
{
    w->phase = PH_WAIT;
    w->wait_end_ms = uv_now(&w->loop) + (uint64_t)(RTB_GO_WAIT_MAX_S * 1000);
    if (rtb_go_wait(&w->go, w->go_fd, on_go, w->emit, w->ctx, &w->rep))
        start_run(w);
}

static void on_tick(uv_timer_t *t)
{
    xw_t *w = t->data;
    uint64_t now = rtb_now_ns(), tmo = (uint64_t)(w->o->conn_timeout_s * 1e9);
    /* One pass a second over the sessions: logins past their deadline fail. */
    for (uint32_t i = 0; i < w->ncl; i++) {
        xc_t *c = &w->cl[i];
        if (c->open && c->state == XS_JOIN) {
            if (now - c->t_join > tmo)
                join_end(c, 0, "timed out");
        } else if (c->open && c->state == XS_READY && c->retry && w->phase < PH_DRAIN) {
            muc_join(c);
        } else if (c->open && (c->state < XS_READY || c->state == XS_SETUP) &&
                   now - c->t_start > tmo)
            xfail(c, "timed out");
        else if (c->open && c->state == XS_BYE && now - c->t_start > 2 * tmo)
            sock_close(c);
    }
    if (w->phase == PH_WAIT && uv_now(&w->loop) >= w->wait_end_ms)
        start_run(w);
    if (w->phase == PH_UP && w->settle_end_ns &&
        (now - w->last_read_ns >= (uint64_t)RTB_X_QUIET_MS * 1000000 || now >= w->settle_end_ns)) {
        w->settle_end_ns = 0;
        phase_next(w);
    }
    w->rep.s.tick = ++w->tick_no;
    w->rep.s.cpu_us = rtb_cpu_us();
    w->emit(w->ctx, RTB_EMIT_TICK, &w->rep);
}

/* This process's held sessions and connectors; see rtb_xmpp.h for the commands. */
static int build(xw_t *w)
{
    const rtb_opts_t *o = w->o;
    uint32_t lo, hi, nconn = 0;
    rtb_range(rtb_groups(o), o->procs, w->proc, &lo, &hi);
    /* xmuc's occupants are held sessions as xidle's */
    switch (o->cmd == RTB_CMD_XMUC ? RTB_CMD_XIDLE : o->cmd) {
    case RTB_CMD_XIDLE:
        w->nheld = hi - lo;
        w->conn_lo = o->start + lo;
        break;
    case RTB_CMD_XCHAT:
        if (o->pairs_apart) /* every pair in process 0 */
            lo = 0, hi = w->proc ? 0 : rtb_groups(o);
        w->nheld = 2 * (hi - lo);
        w->conn_lo = o->start + 2 * lo;
        if (!o->pairs_apart)
            rtb_range(o->storm, o->procs, w->proc, &w->acct_lo, &hi);
        else if (w->proc) /* the storm over the others */
            rtb_range(o->storm, o->procs - 1, w->proc - 1, &w->acct_lo, &hi);
        else
            w->acct_lo = hi = 0;
        w->acct_n = hi - w->acct_lo;
        nconn = o->hold ? w->acct_n : o->conn_parallel < w->acct_n ? o->conn_parallel : w->acct_n;
        break;
    case RTB_CMD_XROSTER:
        /* -L logins (two passes by default): a second pass approves the requests that
         * came after an account's first login, where the server has no pre-approval. */
        rtb_range((uint32_t)o->limit, o->procs, w->proc, &w->acct_lo, &hi);
        w->acct_n = hi - w->acct_lo;
        nconn = o->conn_parallel < w->acct_n ? o->conn_parallel : w->acct_n;
        break;
    default: /* xlogin: -c connectors share -L logins */
        nconn = hi - lo;
        rtb_range((uint32_t)o->limit, o->procs, w->proc, &w->acct_lo, &hi);
        w->acct_n = hi - w->acct_lo;
        break;
    }
    w->ncl = w->nheld + nconn;
    w->cl = calloc(w->ncl ? w->ncl : 1, sizeof(xc_t));
    if (!w->cl)
        return -ENOMEM;
    for (uint32_t i = 0; i < w->ncl; i++) {
        xc_t *c = &w->cl[i];
        c->w = w;
        c->pos = i;
        c->role = i < w->nheld ? ROLE_HELD : ROLE_CONN;
        c->peer = i ^ 1;
        /* Senders spread over the interval by the golden ratio, as rtb_worker.c's. */
        c->phase = fmod((double)(w->conn_lo + i) * 0.6180339887498949, 1.0);
        if (o->cmd == RTB_CMD_XMUC) {
            c->occ = w->conn_lo + i - o->start;
            c->room = c->occ % rtb_xmuc.rooms;
            if (w->spr && !(c->seqs = calloc(w->spr, sizeof(uint32_t))))
                return -ENOMEM;
        }
    }
    w->rep.s.clients = w->nheld + w->acct_n;
    w->rep.s.expected_known = o->cmd == RTB_CMD_XCHAT;
    return 0;
}

int rtb_xmpp_run(const rtb_opts_t *o, uint32_t proc, int go_fd, rtb_emit_fn emit, void *ctx)
{
    static xw_t w; /* one per process */
    memset(&w, 0, sizeof(w));
    w.o = o;
    w.proc = proc;
    w.emit = emit;
    w.ctx = ctx;
    w.go_fd = go_fd;
    w.rate_per_sender = o->rate / 2;
    if (o->cmd == RTB_CMD_XMUC) {
        w.rate_per_sender = rtb_xmuc.senders ? o->rate / rtb_xmuc.senders : 0;
        w.spr = (rtb_xmuc.senders + rtb_xmuc.rooms - 1) / rtb_xmuc.rooms;
    }
    rtb_hist_init(&w.rep.e2e);
    rtb_hist_init(&w.rep.ack);
    rtb_hist_init(&w.rep.conn);
    rtb_xkeys_init(&w.keys, o->pass, o->salt_cache);
    int r = build(&w);
    if (!r)
        r = uv_loop_init(&w.loop);
    if (r) {
        for (uint32_t i = 0; w.cl && i < w.ncl; i++)
            free(w.cl[i].seqs);
        free(w.cl);
        rtb_xkeys_destroy(&w.keys);
        return r;
    }
    uv_timer_init(&w.loop, &w.tick);
    uv_timer_init(&w.loop, &w.pace);
    uv_timer_init(&w.loop, &w.close_timer);
    uv_prepare_init(&w.loop, &w.flush);
    w.tick.data = w.pace.data = w.close_timer.data = w.flush.data = &w;
    uv_prepare_start(&w.flush, on_prepare);
    w.go_fd = rtb_go_open(&w.loop, &w.go, go_fd, &w);
    uv_timer_start(&w.tick, on_tick, RTB_X_TICK_MS, RTB_X_TICK_MS);
    w.phase = PH_UP;
    if (w.nheld)
        for (; w.up_next < w.nheld && w.up_active < o->conn_parallel; w.up_active++)
            login_start(&w.cl[w.up_next++]);
    else
        phase_next(&w);
    uv_run(&w.loop, UV_RUN_DEFAULT);

    w.rep.s.cpu_us = rtb_cpu_us();
    w.rep.s.tick = w.tick_no;
    emit(ctx, RTB_EMIT_FINAL, &w.rep);
    uv_loop_close(&w.loop);
    for (uint32_t i = 0; i < w.ncl; i++) {
        rtb_buf_free(&w.cl[i].in);
        rtb_buf_free(&w.cl[i].out);
        rtb_buf_free(&w.cl[i].busy);
        free(w.cl[i].seqs);
    }
    free(w.cl);
    rtb_xkeys_destroy(&w.keys);
    return 0;
}

/* ---- xmuc's report ------------------------------------------------------------------ */

static double xms(uint64_t ns)
{
    return (double)ns / 1e6;
}

void rtb_xmuc_tick_line(uint64_t second, const rtb_report_t *now, const rtb_report_t *prev,
                        const rtb_hist_t *e2e_second)
{
    const rtb_stats_t *s = &now->s, *p = &prev->s;
    fprintf(stderr,
            "rtbench[%3llus] logins=%llu failed=%llu lost=%llu joined=%llu join_failed=%llu "
            "sent/s=%llu delivered/s=%llu p50=%.3fms p99=%.3fms max=%.3fms\n",
            (unsigned long long)second, (unsigned long long)s->conn_ok,
            (unsigned long long)s->conn_fail, (unsigned long long)s->conn_lost,
            (unsigned long long)s->sub_ok, (unsigned long long)s->sub_fail,
            (unsigned long long)(s->sent - p->sent),
            (unsigned long long)(s->received - p->received),
            xms(rtb_hist_quantile(e2e_second, 0.5)), xms(rtb_hist_quantile(e2e_second, 0.99)),
            xms(e2e_second->max));
}

static void xhist_json(const char *name, const rtb_hist_t *h)
{
    printf("\"%s\":{\"count\":%llu,\"p50_ms\":%.4f,\"p99_ms\":%.4f,\"p999_ms\":%.4f,"
           "\"max_ms\":%.4f},",
           name, (unsigned long long)h->count, xms(rtb_hist_quantile(h, 0.5)),
           xms(rtb_hist_quantile(h, 0.99)), xms(rtb_hist_quantile(h, 0.999)), xms(h->max));
}

static void xhist_text(const char *name, const rtb_hist_t *h)
{
    printf("%-9s n=%llu p50=%.3fms p99=%.3fms p99.9=%.3fms max=%.3fms\n", name,
           (unsigned long long)h->count, xms(rtb_hist_quantile(h, 0.5)),
           xms(rtb_hist_quantile(h, 0.99)), xms(rtb_hist_quantile(h, 0.999)), xms(h->max));
}

void rtb_xmuc_summary(const rtb_opts_t *o, const rtb_report_t *m, uint64_t cpu_us,
                      uint64_t worst_p99_ns, uint64_t worst_max_ns)
{
    const rtb_stats_t *s = &m->s;
    double run_s =
        s->t_run_end > s->t_run_start ? (double)(s->t_run_end - s->t_run_start) / 1e9 : 0;
    uint64_t recv_end = s->t_recv_last > s->t_run_end ? s->t_recv_last : s->t_run_end;
    double recv_s = recv_end > s->t_run_start ? (double)(recv_end - s->t_run_start) / 1e9 : 0;
    uint64_t lost = s->expected > s->unique ? s->expected - s->unique : 0;
    double run_cpu =
        s->tls_resumed > s->tls_full ? (double)(s->tls_resumed - s->tls_full) / 1e6 : 0;
    struct timespec mono, wall;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &wall);
    double off = ((double)wall.tv_sec + (double)wall.tv_nsec / 1e9) -
                 ((double)mono.tv_sec + (double)mono.tv_nsec / 1e9);
#define UNIX(t) ((t) ? (double)(t) / 1e9 + off : 0)
    if (o->json) {
        printf("{\"command\":\"%s\",\"procs\":%u,\"occupants\":%u,\"rooms\":%u,\"senders\":%u,"
               "\"rate\":%.1f,\"hold\":%d,\"anon\":%d,\"logins\":%llu,\"failed\":%llu,"
               "\"lost\":%llu,\"joined\":%llu,\"join_failed\":%llu,",
               o->cmd_name, o->procs, o->count, rtb_xmuc.rooms, rtb_xmuc.senders, o->rate, o->hold,
               rtb_xmuc.anon, (unsigned long long)s->conn_ok, (unsigned long long)s->conn_fail,
               (unsigned long long)s->conn_lost, (unsigned long long)s->sub_ok,
               (unsigned long long)s->sub_fail);
        xhist_json("login", &m->conn);
        xhist_json("join", &m->ack);
        printf("\"sent\":%llu,\"expected\":%llu,\"delivered\":%llu,\"unique\":%llu,"
               "\"lost_deliveries\":%llu,\"gaps\":%llu,\"duplicates\":%llu,\"foreign\":%llu,"
               "\"protocol_errors\":%llu,",
               (unsigned long long)s->sent, (unsigned long long)s->expected,
               (unsigned long long)s->received, (unsigned long long)s->unique,
               (unsigned long long)lost, (unsigned long long)s->gaps, (unsigned long long)s->dups,
               (unsigned long long)s->foreign, (unsigned long long)s->proto_err);
        xhist_json("latency", &m->e2e);
        printf("\"worst_second_p99_ms\":%.4f,\"worst_second_max_ms\":%.4f,\"run_seconds\":%.3f,"
               "\"recv_seconds\":%.3f,\"delivered_per_s\":%.1f,\"run_start_unix\":%.6f,"
               "\"run_end_unix\":%.6f,\"recv_last_unix\":%.6f,\"run_cpu_seconds\":%.3f,"
               "\"cpu_seconds\":%.3f}\n",
               xms(worst_p99_ns), xms(worst_max_ns), run_s, recv_s,
               recv_s > 0 ? (double)s->received / recv_s : 0, UNIX(s->t_run_start),
               UNIX(s->t_run_end), UNIX(s->t_recv_last), run_cpu, (double)cpu_us / 1e6);
        return;
    }
#undef UNIX
    printf("rtbench %s: procs=%u occupants=%u rooms=%u senders=%u rate=%.1f/s%s\n", o->cmd_name,
           o->procs, o->count, rtb_xmuc.rooms, rtb_xmuc.senders, o->rate, o->hold ? " (hold)" : "");
    printf("logins    done=%llu failed=%llu lost=%llu; joined=%llu join_failed=%llu\n",
           (unsigned long long)s->conn_ok, (unsigned long long)s->conn_fail,
           (unsigned long long)s->conn_lost, (unsigned long long)s->sub_ok,
           (unsigned long long)s->sub_fail);
    xhist_text("login", &m->conn);
    xhist_text("join", &m->ack);
    printf("messages  sent=%llu expected=%llu delivered=%llu unique=%llu lost=%llu gaps=%llu "
           "duplicates=%llu foreign=%llu over %.3fs (deliveries until %.3fs: %.0f/s)\n",
           (unsigned long long)s->sent, (unsigned long long)s->expected,
           (unsigned long long)s->received, (unsigned long long)s->unique, (unsigned long long)lost,
           (unsigned long long)s->gaps, (unsigned long long)s->dups, (unsigned long long)s->foreign,
           run_s, recv_s, recv_s > 0 ? (double)s->received / recv_s : 0);
    xhist_text("latency", &m->e2e);
    printf("worst second: p99=%.3fms max=%.3fms\n", xms(worst_p99_ns), xms(worst_max_ns));
    printf("cpu       %.3fs user+sys (all processes), %.3fs from the run's start to the drain's "
           "end\n",
           (double)cpu_us / 1e6, run_cpu);
}
