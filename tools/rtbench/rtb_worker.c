/*
 * One rtbench process: all of its clients on one libuv loop, driven through phases
 *   SUBS  connect (and subscribe) the subscribers, or the idle clients of `conn`;
 *   PUBS  connect the publishers;
 *   WAIT  with --procs, tell the parent we are ready and wait for its go, so that all
 *         processes publish over the same interval;
 *   RUN   publish for -d seconds or until -L messages per publisher;
 *   DRAIN wait up to --drain seconds for outstanding acks and deliveries;
 *   CLOSE send DISCONNECT and close each connection once the broker has closed its
 *         side, forcibly after RTB_CLOSE_MS. Letting the broker close first leaves the
 *         TIME_WAIT sockets on its side, so our ephemeral ports are free for the next run.
 * Every phase has a deadline, so the loop always ends.
 *
 * Writes are batched: encoders append to a client's `out` buffer and mark it dirty;
 * a prepare callback (run once per loop iteration, before polling) swaps `out` with
 * `busy` and issues a single uv_write per client. The read side decodes straight out
 * of one shared read buffer; only a packet split across reads is copied, into the
 * client's `pend` buffer. Buffers are reused, so steady state allocates nothing.
 *
 * With --tls or --ws a client has a transport (rtb_xport.h) between MQTT and the socket:
 * reads go through it before the MQTT decoder, and a flush encodes `out` into the
 * client's `wire` buffer, which then takes the place of `out` in the write path. Plain
 * clients have no transport and take the same path as before: one test per read and
 * per flush.
 *
 * The `hs` command measures connection setup: each client connects, completes TLS (or
 * the WebSocket upgrade) and CONNECT/CONNACK, sends DISCONNECT (and TLS close_notify),
 * waits for the broker to close, and starts again, until -d ends or it has done -L.
 */
#include "rtbench.h"
#include "rtb_loop.h"
#include "rtb_mqtt.h"
#include "rtb_xmpp.h"
#include "rtb_xport.h"

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <uv.h>

#define RTB_READ_BUF (256 * 1024) /* shared read buffer per process, bytes */
#define RTB_OUT_HIGH (256 * 1024) /* stop publishing while this many bytes are unsent */
#define RTB_TICK_MS 1000          /* per-second report and keepalive/timeout sweep */
#define RTB_PACE_OPEN_MS 1        /* open-loop pacing tick */
#define RTB_PACE_CLOSED_MS 10     /* closed-loop safety kick (sends are event driven) */
#define RTB_BURST_MAX 1024        /* messages one publisher may send per kick */
#define RTB_CLOSE_MS 2000         /* grace for DISCONNECT to be written */
#define RTB_MAX_SEQ (1u << 30)    /* sequence numbers beyond this are a protocol error */
#define RTB_CHECK_MS 50           /* how often the run's end conditions are evaluated */
#define RTB_COALESCE_READS 32     /* an iteration with fewer reads pauses before polling */
#define RTB_PACE_FB_MS 1          /* closed-loop kick when deliveries arrive in other processes */

/* Layout of a process's row in the shared feedback region (see rtb_fb_size). */
enum { FB_EXPECTED, FB_UNIQUE, FB_DONE, FB_DELIV };

enum { PH_SUBS, PH_PUBS, PH_WAIT, PH_RUN, PH_DRAIN, PH_CLOSE };
enum { ROLE_CONN, ROLE_SUB, ROLE_PUB, ROLE_HS };
enum { CS_NEW, CS_TCP, CS_CONNACK, CS_SUBACK, CS_READY, CS_CLOSING, CS_DEAD };

typedef struct rtb_worker_s rtb_worker_t;

/* Per subscriber, per publisher: which sequence numbers arrived. */
typedef struct rtb_stream_s {
    uint32_t key;    /* publisher index + 1; 0 marks a free hash slot */
    uint32_t next;   /* one past the highest seq seen */
    uint64_t unique; /* distinct seqs seen */
    uint64_t *bits;  /* seen bitmap indexed by seq, grown by doubling */
    uint32_t nwords; /* 64-bit words in bits */
} rtb_stream_t;

typedef struct rtb_client_s rtb_client_t;
struct rtb_client_s {
    uv_tcp_t tcp;
    uv_connect_t creq;
    uv_write_t wreq;
    rtb_worker_t *w;
    rtb_buf_t out;  /* packets waiting for the next flush */
    rtb_buf_t busy; /* bytes owned by wreq while a write is in flight */
    rtb_buf_t pend; /* an incomplete packet carried to the next read */
    rtb_buf_t wire; /* with a transport: encoded bytes waiting for the next write */
    rtb_xport_t *x; /* TLS/WebSocket below MQTT, owned; NULL for plain TCP */
    rtb_client_t *next_dirty;
    uint64_t t_start;      /* ns, connection start */
    uint64_t t_last_tx_ms; /* loop ms of the last flush, for keepalive */
    char *id;              /* client id, owned */
    char *topic;           /* expanded topic or filter, owned */
    uint32_t idx;          /* client sequence number (%i) */
    uint32_t pos;          /* position in the worker's client array */
    uint8_t role, state, writing, dirty, open, pending;
    uint8_t xopen;      /* the transport finished its handshake on this connection */
    uint8_t shut;       /* close_notify queued on this connection */
    uint8_t hs_resumed; /* this connection's TLS session was resumed */
    /* Publisher. */
    uint32_t gidx;       /* publisher index written into payloads */
    uint32_t tgt_base;   /* %i of the first target topic */
    uint32_t tgt_stride; /* %i step between target topics */
    uint32_t ntgt;       /* target topics, used round robin */
    uint32_t fanout;     /* deliveries each PUBLISH should produce */
    uint64_t k;          /* messages counted as sent */
    uint64_t delivered;  /* deliveries of our messages seen by local subscribers */
    uint32_t inflight;   /* unacked QoS1/2 messages */
    uint8_t refill;      /* a window was full: wait until it is half empty */
    double phase;        /* open loop: offset of our schedule, in messages (0..1) */
    uint32_t pid_n;      /* next packet id - 1, cycles through a multiple of slot cap */
    uint16_t *slot_pid;  /* in-flight packet id per slot, 0 when free */
    uint64_t *slot_ts;   /* send time per slot, ns */
    /* Subscriber. */
    rtb_stream_t *streams; /* open-addressing hash by publisher index */
    uint32_t scap, scount;
    uint64_t received;
};

struct rtb_worker_s {
    const rtb_opts_t *o;
    uint32_t proc;
    uv_loop_t loop;
    uv_timer_t tick, conn_timer, pace, close_timer;
    uv_prepare_t flush;
    uint32_t iter_reads; /* reads since the last flush, i.e. in this loop iteration */
    uint64_t t_read;     /* ns, taken once per read; stamps every packet decoded from it */
    long coalesce_ns;    /* closed loop: pause before polling in a quiet iteration */
    uv_pipe_t go;        /* read end of the parent's go pipe, when go_fd >= 0 */
    int go_fd;
    uint64_t wait_end_ms;   /* start anyway if the parent never says go */
    uint64_t next_check_ms; /* next evaluation of the run's end conditions */
    rtb_client_t *clients;
    uint32_t nclients;
    rtb_client_t **subs, **pubs;
    uint32_t nsubs, npubs;
    uint32_t pub_base; /* gidx of pubs[0]; local pubs have consecutive gidx */
    rtb_client_t **cq; /* connect queue of the current phase */
    uint32_t ncq, cq_pos, cq_active, cq_pending;
    int phase;
    rtb_client_t *dirty;
    rtb_report_t rep;
    uint64_t run_start_ms, run_end_ms, drain_end_ms, close_end_ms;
    double rate_per_pub; /* open loop msgs/s per publisher, 0 = unpaced */
    int closed_loop;
    uint32_t slot_cap; /* power of two >= effective inflight */
    uint32_t max_inflight;
    uint32_t open_handles;
    uint64_t tick_no;
    rtb_emit_fn emit;
    void *ctx;
    char *topic_tmpl;  /* template for multi-target publishers */
    uint64_t *fb;      /* shared feedback rows, NULL in one process; see rtb_fb_size */
    rtb_xctx_t *xctx;  /* TLS/WebSocket settings, NULL for plain TCP */
    int xerr_shown;    /* the first transport error was printed */
    uint32_t fb_words; /* u64 per row, a multiple of a cache line */
};

static uint8_t read_buf[RTB_READ_BUF];

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* Expands %i and %c (and %% ) in tmpl; returns the length, or -1 if it does not fit. */
static int expand(const char *tmpl, uint32_t idx, const char *id, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *s = tmpl; *s; s++) {
        char num[16];
        const char *ins = NULL;
        if (s[0] == '%' && s[1] == 'i') {
            snprintf(num, sizeof(num), "%u", idx);
            ins = num;
        } else if (s[0] == '%' && s[1] == 'c') {
            ins = id;
        } else if (s[0] == '%' && s[1] == '%') {
            ins = "%";
        }
        if (ins) {
            size_t l = strlen(ins);
            if (n + l >= cap)
                return -1;
            memcpy(out + n, ins, l);
            n += l;
            s++;
            continue;
        }
        if (n + 1 >= cap)
            return -1;
        out[n++] = *s;
    }
    out[n] = 0;
    return (int)n;
}

static uint32_t fb_row_words(const rtb_opts_t *o)
{
    return (FB_DELIV + o->pubs + 7) & ~7u;
}

size_t rtb_fb_size(const rtb_opts_t *o)
{
    if (o->procs < 2 || (o->cmd != RTB_CMD_FANIN && o->cmd != RTB_CMD_FANOUT))
        return 0;
    return (size_t)o->procs * fb_row_words(o) * sizeof(uint64_t);
}

/* Only the owning process writes its row; other processes read it concurrently. */
static void fb_put(rtb_worker_t *w, uint32_t i, uint64_t v)
{
    __atomic_store_n(&w->fb[(size_t)w->proc * w->fb_words + i], v, __ATOMIC_RELEASE);
}

static uint64_t fb_mine(rtb_worker_t *w, uint32_t i)
{
    return w->fb[(size_t)w->proc * w->fb_words + i];
}

static uint64_t fb_sum(rtb_worker_t *w, uint32_t i)
{
    uint64_t t = 0;
    for (uint32_t p = 0; p < w->o->procs; p++)
        t += __atomic_load_n(&w->fb[(size_t)p * w->fb_words + i], __ATOMIC_ACQUIRE);
    return t;
}

/* Deliveries of a publisher's messages seen by all subscribers, in every process. */
static uint64_t pub_delivered(rtb_client_t *c)
{
    return c->w->fb ? fb_sum(c->w, FB_DELIV + c->gidx) : c->delivered;
}

/* This process's publishers are done; every row set means nothing more will be sent. */
static void fb_done(rtb_worker_t *w)
{
    if (w->fb && !fb_mine(w, FB_DONE)) {
        fb_put(w, FB_EXPECTED, w->rep.s.expected);
        fb_put(w, FB_DONE, 1);
    }
}

static void phase_next(rtb_worker_t *w);
static void try_send(rtb_client_t *c);
static void on_write(uv_write_t *req, int status);
static void hs_begin(rtb_client_t *c);

static void mark_dirty(rtb_client_t *c)
{
    if (c->dirty)
        return;
    c->dirty = 1;
    c->next_dirty = c->w->dirty;
    c->w->dirty = c;
}

static void on_close(uv_handle_t *h)
{
    rtb_client_t *c = h->data;
    c->open = 0;
    c->w->open_handles--;
    if (c->role == ROLE_HS && c->w->phase == PH_RUN)
        hs_begin(c);
}

/* The client stops counting toward the current phase's connect queue. */
static void settle(rtb_client_t *c)
{
    rtb_worker_t *w = c->w;
    if (!c->pending)
        return;
    c->pending = 0;
    w->cq_pending--;
    w->cq_active--;
    if (w->cq_pending == 0 && w->cq_pos == w->ncq && w->phase <= PH_PUBS)
        phase_next(w);
}

static void client_close(rtb_client_t *c)
{
    if (c->open && !uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_close);
    c->state = CS_DEAD;
}

/* A client failed: before CONNACK it counts as a failed connection, later as lost. */
static void client_fail(rtb_client_t *c)
{
    rtb_stats_t *s = &c->w->rep.s;
    if (c->state == CS_DEAD || c->state == CS_CLOSING) {
        client_close(c);
        return;
    }
    if (c->state <= CS_CONNACK)
        s->conn_fail++;
    else if (c->state == CS_SUBACK)
        s->sub_fail++;
    if (c->state > CS_CONNACK && c->w->phase < PH_CLOSE)
        s->conn_lost++;
    client_close(c);
    settle(c);
}

/* Writes src (`out`, or `wire` under a transport) through rtb_write and `busy`. */
static void write_buf(rtb_client_t *c, rtb_buf_t *src)
{
    c->t_last_tx_ms = uv_now(&c->w->loop);
    int r = rtb_write((uv_stream_t *)&c->tcp, &c->wreq, src, &c->busy, on_write);
    c->writing = r == 1;
    if (r < 0)
        client_fail(c);
}

/* Prints the first transport failure of a process: a refused certificate or upgrade
 * would otherwise show only as failed connections. */
static void xport_failed(rtb_client_t *c, int r)
{
    if (r == -EPROTO && !c->w->xerr_shown && c->w->phase < PH_CLOSE) {
        c->w->xerr_shown = 1;
        fprintf(stderr, "rtbench: %s: %s\n", c->id, rtb_xport_error(c->x));
    }
    client_fail(c);
}

/* Under a transport: MQTT bytes become frames and records in `wire`, which is written. */
static void flush_xport(rtb_client_t *c)
{
    if (c->writing || c->state == CS_DEAD)
        return;
    int r = rtb_xport_output(c->x, &c->out, &c->wire);
    if (!r && c->state == CS_CLOSING && !c->shut && c->out.len == 0 && rtb_xport_open(c->x)) {
        /* After the DISCONNECT: a TLS session closed cleanly stays resumable. */
        c->shut = 1;
        rtb_xport_shutdown(c->x);
        r = rtb_xport_output(c->x, &c->out, &c->wire);
    }
    if (r) {
        xport_failed(c, r);
        return;
    }
    if (c->wire.len)
        write_buf(c, &c->wire);
}

static void flush_client(rtb_client_t *c)
{
    if (c->x) {
        flush_xport(c);
        return;
    }
    if (c->writing || c->out.len == 0 || c->state == CS_DEAD)
        return;
    write_buf(c, &c->out);
}

static void on_write(uv_write_t *req, int status)
{
    rtb_client_t *c = req->data;
    c->writing = 0;
    c->busy.len = 0;
    if (status < 0) {
        client_fail(c);
        return;
    }
    if (c->out.len || (c->x && (c->wire.len || rtb_xport_pending(c->x))))
        mark_dirty(c);
    if (c->role == ROLE_PUB)
        try_send(c);
}

static void on_prepare(uv_prepare_t *h)
{
    rtb_worker_t *w = h->data;
    /* Bounded: each client is on the list at most once. */
    while (w->dirty) {
        rtb_client_t *c = w->dirty;
        w->dirty = c->next_dirty;
        c->dirty = 0;
        flush_client(c);
    }
    /*
     * In a closed loop, an iteration that found little to read sleeps briefly before
     * polling again, so that the next poll finds many sockets with several packets each.
     * Waking per delivery costs a wakeup and a read per message; on this VM that was
     * most of rtbench's CPU. Deliveries wait at most coalesce_ns longer; open-loop
     * (latency) runs never sleep.
     */
    uint32_t reads = w->iter_reads;
    w->iter_reads = 0;
    if (w->coalesce_ns && w->phase == PH_RUN && reads < RTB_COALESCE_READS) {
        struct timespec ts = {0, w->coalesce_ns};
        nanosleep(&ts, NULL);
    }
}

static int send_or_fail(rtb_client_t *c, int r)
{
    if (r) {
        client_fail(c);
        return r;
    }
    mark_dirty(c);
    return 0;
}

static rtb_stream_t *stream_get(rtb_client_t *c, uint32_t pub)
{
    uint32_t key = pub + 1;
    if (c->scount * 2 >= c->scap) {
        uint32_t ncap = c->scap ? c->scap * 2 : 8;
        rtb_stream_t *nt = calloc(ncap, sizeof(*nt));
        if (!nt)
            return NULL;
        for (uint32_t i = 0; i < c->scap; i++) {
            if (!c->streams[i].key)
                continue;
            uint32_t h = (c->streams[i].key * 2654435761u) & (ncap - 1);
            while (nt[h].key)
                h = (h + 1) & (ncap - 1);
            nt[h] = c->streams[i];
        }
        free(c->streams);
        c->streams = nt;
        c->scap = ncap;
    }
    uint32_t h = (key * 2654435761u) & (c->scap - 1);
    while (c->streams[h].key && c->streams[h].key != key)
        h = (h + 1) & (c->scap - 1);
    if (!c->streams[h].key) {
        c->streams[h].key = key;
        c->scount++;
    }
    return &c->streams[h];
}

static void on_publish(rtb_client_t *c, const rtb_pkt_t *pkt)
{
    rtb_worker_t *w = c->w;
    rtb_stats_t *s = &w->rep.s;
    uint64_t t = w->t_read;
    if (pkt->qos == 1)
        send_or_fail(c, rtb_mqtt_ack(&c->out, RTB_PUBACK, pkt->pid));
    else if (pkt->qos == 2)
        send_or_fail(c, rtb_mqtt_ack(&c->out, RTB_PUBREC, pkt->pid));
    s->received++;
    c->received++;
    s->t_recv_last = t;
    if (pkt->payload_len < RTB_HDR_SIZE) {
        s->foreign++;
        return;
    }
    uint32_t pub = get32(pkt->payload), seq = get32(pkt->payload + 4);
    uint64_t ts = get64(pkt->payload + 8);
    rtb_hist_record(&w->rep.e2e, t > ts ? t - ts : 0);

    rtb_stream_t *st = stream_get(c, pub);
    if (!st || seq >= RTB_MAX_SEQ) {
        s->proto_err++;
        return;
    }
    if (seq / 64 >= st->nwords) {
        uint32_t nw = st->nwords ? st->nwords : 16;
        while (seq / 64 >= nw)
            nw *= 2;
        uint64_t *nb = realloc(st->bits, (size_t)nw * sizeof(uint64_t));
        if (!nb) {
            s->proto_err++;
            return;
        }
        memset(nb + st->nwords, 0, (size_t)(nw - st->nwords) * sizeof(uint64_t));
        st->bits = nb;
        st->nwords = nw;
    }
    uint64_t bit = (uint64_t)1 << (seq % 64);
    if (st->bits[seq / 64] & bit) {
        s->dups++;
    } else {
        st->bits[seq / 64] |= bit;
        st->unique++;
        s->unique++;
        if (w->fb)
            fb_put(w, FB_UNIQUE, s->unique);
        if (seq + 1 < st->next)
            s->ooo++;
        else
            st->next = seq + 1;
    }
    if (w->fb && pub < w->o->pubs)
        fb_put(w, FB_DELIV + pub, fb_mine(w, FB_DELIV + pub) + 1);
    if (pub >= w->pub_base && pub - w->pub_base < w->npubs) {
        rtb_client_t *p = w->pubs[pub - w->pub_base];
        p->delivered++;
        if (w->closed_loop)
            try_send(p);
    }
}

/* Frees the slot of an acknowledged packet id; returns 0 if it was in flight. */
static int slot_take(rtb_client_t *c, uint16_t pid, uint64_t *ts)
{
    uint32_t slot = (uint32_t)(pid - 1) & (c->w->slot_cap - 1);
    if (pid == 0 || c->slot_pid == NULL || c->slot_pid[slot] != pid)
        return -1;
    *ts = c->slot_ts[slot];
    c->slot_pid[slot] = 0;
    c->inflight--;
    return 0;
}

static void on_ack(rtb_client_t *c, const rtb_pkt_t *pkt)
{
    rtb_worker_t *w = c->w;
    uint64_t ts;
    if (pkt->type == RTB_PUBREC && pkt->rc < 0x80) {
        uint32_t slot = (uint32_t)(pkt->pid - 1) & (w->slot_cap - 1);
        if (!c->slot_pid || c->slot_pid[slot] != pkt->pid) {
            w->rep.s.proto_err++;
            return;
        }
        send_or_fail(c, rtb_mqtt_ack(&c->out, RTB_PUBREL, pkt->pid));
        return;
    }
    if (slot_take(c, pkt->pid, &ts)) {
        w->rep.s.proto_err++;
        return;
    }
    if (pkt->rc >= 0x80) {
        w->rep.s.proto_err++; /* the broker rejected the message */
    } else {
        w->rep.s.acked++;
        rtb_hist_record(&w->rep.ack, w->t_read > ts ? w->t_read - ts : 0);
    }
    try_send(c);
}

static void on_packet(rtb_client_t *c, const rtb_pkt_t *pkt)
{
    rtb_worker_t *w = c->w;
    rtb_stats_t *s = &w->rep.s;
    switch (pkt->type) {
    case RTB_CONNACK:
        if (c->state != CS_CONNACK || pkt->rc != 0) {
            client_fail(c);
            return;
        }
        s->conn_ok++;
        s->t_conn_last = rtb_now_ns();
        rtb_hist_record(&w->rep.conn, s->t_conn_last - c->t_start);
        if (c->role == ROLE_HS) {
            /* One cycle done; the broker's close (or the tick's deadline) ends it. */
            if (w->phase == PH_RUN) {
                c->k++;
                if (c->hs_resumed)
                    s->hs_resumed++;
                else
                    s->hs_full++;
            }
            c->state = CS_CLOSING;
            send_or_fail(c, rtb_mqtt_empty(&c->out, RTB_DISCONNECT));
            return;
        }
        if (c->role == ROLE_SUB) {
            c->state = CS_SUBACK;
            send_or_fail(c, rtb_mqtt_subscribe(&c->out, w->o->version, 1, c->topic, w->o->qos));
            return;
        }
        c->state = CS_READY;
        settle(c);
        return;
    case RTB_SUBACK:
        if (c->state != CS_SUBACK)
            break;
        if (pkt->rc >= 0x80) {
            client_fail(c);
            return;
        }
        s->sub_ok++;
        c->state = CS_READY;
        settle(c);
        return;
    case RTB_PUBLISH:
        on_publish(c, pkt);
        return;
    case RTB_PUBACK:
    case RTB_PUBREC:
    case RTB_PUBCOMP:
        if (c->role != ROLE_PUB || (pkt->type == RTB_PUBACK) != (w->o->qos == 1))
            break;
        on_ack(c, pkt);
        return;
    case RTB_PUBREL:
        send_or_fail(c, rtb_mqtt_ack(&c->out, RTB_PUBCOMP, pkt->pid));
        return;
    case RTB_PINGRESP:
        return;
    case RTB_DISCONNECT:
        client_fail(c);
        return;
    }
    s->proto_err++;
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    *buf = uv_buf_init((char *)read_buf, sizeof(read_buf));
}

/* Decodes and handles the MQTT packets in p[0..n), carrying a partial one in `pend`. */
static void feed(void *arg, const uint8_t *p, size_t n)
{
    rtb_client_t *c = arg;
    if (c->state == CS_DEAD)
        return;
    if (c->pend.len) {
        if (rtb_buf_append(&c->pend, p, n)) {
            client_fail(c);
            return;
        }
        p = c->pend.p;
        n = c->pend.len;
    }
    size_t off = 0;
    while (off < n && c->state != CS_DEAD) {
        rtb_pkt_t pkt;
        size_t used;
        int r = rtb_mqtt_parse(p + off, n - off, c->w->o->version, &pkt, &used);
        if (r == 1)
            break;
        if (r < 0) {
            c->w->rep.s.proto_err++;
            client_fail(c);
            break;
        }
        on_packet(c, &pkt);
        off += used;
    }
    size_t left = n - off;
    if (c->state == CS_DEAD) {
        c->pend.len = 0;
    } else if (p == c->pend.p) {
        memmove(c->pend.p, c->pend.p + off, left);
        c->pend.len = left;
    } else if (left && rtb_buf_append(&c->pend, p + off, left)) {
        client_fail(c);
    }
}

/* Bytes off the socket under a transport: handshake, upgrade, records and frames. */
static void xport_read(rtb_client_t *c, const uint8_t *p, size_t n)
{
    rtb_stats_t *s = &c->w->rep.s;
    int r = rtb_xport_input(c->x, p, n, feed, c);
    if (c->state == CS_DEAD)
        return;
    if (r) {
        xport_failed(c, r);
        return;
    }
    if (!c->xopen && rtb_xport_open(c->x)) {
        c->xopen = 1;
        c->hs_resumed = (uint8_t)rtb_xport_resumed(c->x);
        if (c->w->o->tls) {
            if (c->hs_resumed)
                s->tls_resumed++;
            else
                s->tls_full++;
        }
    }
    if (c->out.len || rtb_xport_pending(c->x))
        mark_dirty(c);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    rtb_client_t *c = st->data;
    c->w->iter_reads++;
    if (nread == 0)
        return;
    if (nread < 0) {
        client_fail(c);
        return;
    }
    c->w->t_read = rtb_now_ns();
    if (c->x)
        xport_read(c, (const uint8_t *)buf->base, (size_t)nread);
    else
        feed(c, (const uint8_t *)buf->base, (size_t)nread);
}

static void on_connect(uv_connect_t *req, int status)
{
    rtb_client_t *c = req->data;
    if (c->state != CS_TCP)
        return;
    if (status < 0) {
        client_fail(c);
        return;
    }
    const rtb_opts_t *o = c->w->o;
    rtb_connect_t cc = {o->version, c->id, o->user, o->pass, o->clean, o->keepalive};
    c->state = CS_CONNACK;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read)) {
        client_fail(c);
        return;
    }
    /* Under a transport the CONNECT waits in `out` until the transport is open. */
    if (c->x && rtb_xport_start(c->x)) {
        xport_failed(c, -ENOMEM);
        return;
    }
    send_or_fail(c, rtb_mqtt_connect(&c->out, &cc));
}

/* queued: the connection counts toward the phase's connect queue (not in `hs`). */
static void start_connect(rtb_client_t *c, int queued)
{
    rtb_worker_t *w = c->w;
    const rtb_opts_t *o = w->o;
    c->t_start = rtb_now_ns();
    if (!w->rep.s.t_conn_first)
        w->rep.s.t_conn_first = c->t_start;
    c->state = CS_TCP;
    c->out.len = c->wire.len = c->pend.len = 0;
    c->xopen = c->shut = c->hs_resumed = 0;
    if (queued) {
        c->pending = 1;
        w->cq_active++;
    }
    const struct sockaddr *src =
        o->nifaddr ? (const struct sockaddr *)&o->ifaddr[c->pos % o->nifaddr] : NULL;
    if (uv_tcp_init_ex(&w->loop, &c->tcp, src ? src->sa_family : AF_UNSPEC)) {
        client_fail(c);
        return;
    }
    c->open = 1;
    w->open_handles++;
    c->tcp.data = c;
    c->creq.data = c;
    c->wreq.data = c;
    uv_tcp_nodelay(&c->tcp, 1);
    if (src && rtb_tcp_source(&c->tcp, src)) {
        client_fail(c);
        return;
    }
    const struct sockaddr_storage *to = &o->addr;
    if (c->role == ROLE_SUB && o->nsub_addr)
        /* seed --copies: copy c (of idx = c * subs + s) goes to node c. */
        to = &o->sub_addr[(o->copies > 1 ? c->idx / o->subs : c->idx) % (uint32_t)o->nsub_addr];
    else if (c->role == ROLE_PUB && o->npub_addr)
        to = &o->pub_addr[c->idx % (uint32_t)o->npub_addr];
    if (uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)to, on_connect))
        client_fail(c);
}

/* Starts as many queued connections as the pacing and the parallel cap allow. */
static void connect_some(rtb_worker_t *w, int from_timer)
{
    const rtb_opts_t *o = w->o;
    uint32_t budget = o->conn_interval_ms ? (from_timer ? 1 : 0) : o->conn_parallel;
    while (budget-- && w->cq_pos < w->ncq && w->cq_active < o->conn_parallel) {
        rtb_client_t *c = w->cq[w->cq_pos++];
        w->cq_pending++;
        start_connect(c, 1);
    }
}

/* hs: the next cycle of a connector, unless it has done its -L cycles. */
static void hs_begin(rtb_client_t *c)
{
    const rtb_opts_t *o = c->w->o;
    if (o->limit && c->k >= o->limit)
        return;
    start_connect(c, 0);
}

static void on_conn_timer(uv_timer_t *t)
{
    rtb_worker_t *w = t->data;
    if (w->phase <= PH_PUBS)
        connect_some(w, 1);
}

/*
 * Sends as many messages as the publisher may: limited by -L, the QoS1/2 in-flight
 * window, the closed-loop window of undelivered messages, the open-loop schedule, and
 * unsent bytes in its buffer.
 */
static void try_send(rtb_client_t *c)
{
    rtb_worker_t *w = c->w;
    const rtb_opts_t *o = w->o;
    int64_t win = (int64_t)o->window * (int64_t)c->fanout;
    uint64_t delivered = w->closed_loop ? pub_delivered(c) : 0;
    uint64_t ts = 0;
    if (c->refill) {
        /*
         * Refilling a window only once it is half empty makes each write carry many
         * messages instead of one per delivery or ack; on loopback the syscalls, not
         * the encoding, are what a load generator spends its CPU on.
         */
        if (o->qos && c->inflight > w->max_inflight / 2)
            return;
        if (w->closed_loop && (int64_t)(c->k * c->fanout - delivered) > win / 2)
            return;
        c->refill = 0;
    }
    for (int n = 0; n < RTB_BURST_MAX; n++) {
        if (c->state != CS_READY || w->phase != PH_RUN || c->ntgt == 0)
            return;
        if (o->limit && c->k >= o->limit)
            return;
        if ((o->qos && c->inflight >= w->max_inflight) ||
            (w->closed_loop && (int64_t)(c->k * c->fanout - delivered) >= win)) {
            c->refill = 1;
            return;
        }
        if (w->rate_per_pub > 0) {
            double el = (double)(uv_now(&w->loop) - w->run_start_ms) / 1000.0;
            if ((double)c->k + c->phase > el * w->rate_per_pub)
                return;
        }
        if (c->out.len + c->busy.len + c->wire.len >= RTB_OUT_HIGH)
            return;

        uint64_t k = c->k;
        uint32_t t = (uint32_t)(k % c->ntgt);
        uint32_t seq = (uint32_t)(k / c->ntgt);
        uint16_t pid = 0;
        uint32_t slot = 0;
        if (o->qos) {
            slot = c->pid_n & (w->slot_cap - 1);
            if (c->slot_pid[slot])
                return; /* an older id in this slot is still unacked */
            pid = (uint16_t)(c->pid_n + 1);
        }
        char tbuf[256];
        const char *topic = c->topic;
        int tlen;
        if (c->ntgt == 1) {
            tlen = (int)strlen(topic);
        } else {
            tlen =
                expand(w->topic_tmpl, c->tgt_base + t * c->tgt_stride, c->id, tbuf, sizeof(tbuf));
            topic = tbuf;
        }
        if (tlen < 0) {
            w->rep.s.proto_err++;
            client_fail(c);
            return;
        }
        rtb_stats_t *s = &w->rep.s;
        c->k++;
        s->sent++;
        s->expected += c->fanout;
        if (w->fb)
            fb_put(w, FB_EXPECTED, s->expected);
        if (o->test_skip_seq >= 0 && c->gidx == 0 && t == 0 && seq == (uint64_t)o->test_skip_seq) {
            /* Test hook: behave as if the broker accepted this message and lost it. */
            if (o->qos)
                s->acked++;
            continue;
        }
        uint8_t head[RTB_HDR_SIZE];
        if (!ts)
            ts = rtb_now_ns(); /* one stamp per burst: the burst leaves in one write */
        put32(head, c->gidx);
        put32(head + 4, seq);
        put64(head + 8, ts);
        if (o->qos) {
            c->slot_pid[slot] = pid;
            c->slot_ts[slot] = ts;
            c->inflight++;
            c->pid_n = (c->pid_n + 1) % (65535u / w->slot_cap * w->slot_cap);
        }
        if (send_or_fail(c, rtb_mqtt_publish(&c->out, o->version, o->qos, pid, topic, (size_t)tlen,
                                             head, o->size < RTB_HDR_SIZE ? 0 : sizeof(head),
                                             o->size)))
            return;
    }
}

static int run_finished(rtb_worker_t *w)
{
    const rtb_opts_t *o = w->o;
    if (uv_now(&w->loop) >= w->run_end_ms)
        return 1;
    if (o->cmd == RTB_CMD_HS) {
        for (uint32_t i = 0; i < w->nclients; i++)
            if (w->clients[i].open || !o->limit || w->clients[i].k < o->limit)
                return 0;
        return 1;
    }
    uint32_t alive = 0, busy = 0, pubs_busy = 0, subs_alive = 0;
    for (uint32_t i = 0; i < w->nclients; i++) {
        rtb_client_t *c = &w->clients[i];
        if (c->state != CS_READY)
            continue;
        alive++;
        subs_alive += c->role == ROLE_SUB;
        if (c->role == ROLE_PUB && (o->limit == 0 || c->k < o->limit))
            pubs_busy++;
        if (c->role == ROLE_SUB && o->cmd == RTB_CMD_SUB &&
            (o->limit == 0 || c->received < o->limit))
            busy++;
        if (c->role == ROLE_CONN)
            busy++;
        if (c->role == ROLE_SUB && o->cmd != RTB_CMD_SUB && w->npubs == 0 && !w->fb)
            busy++;
    }
    busy += pubs_busy;
    if (w->fb) {
        /* Subscribers listen until the publishers of every process are done. */
        if (pubs_busy == 0)
            fb_done(w);
        if (subs_alive && fb_sum(w, FB_DONE) < o->procs)
            busy++;
    }
    return alive == 0 || busy == 0;
}

static int drained(rtb_worker_t *w)
{
    if (w->o->cmd == RTB_CMD_HS)
        return w->open_handles == 0;
    for (uint32_t i = 0; i < w->npubs; i++)
        if (w->pubs[i]->state == CS_READY && w->pubs[i]->inflight)
            return 0;
    const rtb_stats_t *s = &w->rep.s;
    if (w->fb)
        return fb_sum(w, FB_DONE) == w->o->procs && fb_sum(w, FB_UNIQUE) >= fb_sum(w, FB_EXPECTED);
    return !s->expected_known || s->unique >= s->expected;
}

static void on_close_timer(uv_timer_t *t)
{
    rtb_worker_t *w = t->data;
    if (w->open_handles && uv_now(&w->loop) < w->close_end_ms)
        return;
    for (uint32_t i = 0; i < w->nclients; i++)
        client_close(&w->clients[i]);
    uv_close((uv_handle_t *)&w->close_timer, NULL);
    uv_close((uv_handle_t *)&w->flush, NULL);
}

static void start_close(rtb_worker_t *w)
{
    w->phase = PH_CLOSE;
    fb_done(w);
    if (!w->rep.s.t_run_end)
        w->rep.s.t_run_end = rtb_now_ns();
    uv_close((uv_handle_t *)&w->pace, NULL);
    uv_close((uv_handle_t *)&w->conn_timer, NULL);
    uv_close((uv_handle_t *)&w->tick, NULL);
    if (w->go_fd >= 0)
        uv_close((uv_handle_t *)&w->go, NULL);
    for (uint32_t i = 0; i < w->nclients; i++) {
        rtb_client_t *c = &w->clients[i];
        if (c->state == CS_READY && !rtb_mqtt_empty(&c->out, RTB_DISCONNECT)) {
            c->state = CS_CLOSING;
            mark_dirty(c);
        } else {
            client_close(c);
        }
    }
    w->close_end_ms = uv_now(&w->loop) + RTB_CLOSE_MS;
    uv_timer_start(&w->close_timer, on_close_timer, 10, 10);
}

static void on_pace(uv_timer_t *t)
{
    rtb_worker_t *w = t->data;
    if (w->phase == PH_RUN) {
        for (uint32_t i = 0; i < w->npubs; i++)
            try_send(w->pubs[i]);
        uint64_t now = uv_now(&w->loop);
        if (now < w->next_check_ms)
            return;
        w->next_check_ms = now + RTB_CHECK_MS;
        if (run_finished(w)) {
            w->phase = PH_DRAIN;
            fb_done(w);
            w->rep.s.t_run_end = rtb_now_ns();
            w->drain_end_ms = uv_now(&w->loop) + (uint64_t)(w->o->drain_s * 1000);
        }
        return;
    }
    if (w->phase == PH_DRAIN && (drained(w) || uv_now(&w->loop) >= w->drain_end_ms))
        start_close(w);
}

static void start_queue(rtb_worker_t *w, rtb_client_t **q, uint32_t n)
{
    w->cq = q;
    w->ncq = n;
    w->cq_pos = w->cq_pending = w->cq_active = 0;
    connect_some(w, 1);
}

static void start_run(rtb_worker_t *w)
{
    const rtb_opts_t *o = w->o;
    if (w->phase != PH_WAIT)
        return;
    w->phase = PH_RUN;
    uv_update_time(&w->loop);
    w->run_start_ms = uv_now(&w->loop);
    w->run_end_ms = w->run_start_ms + (uint64_t)(o->duration_s * 1000);
    w->rep.s.t_run_start = rtb_now_ns();
    if (o->cmd == RTB_CMD_HS)
        for (uint32_t i = 0; i < w->nclients; i++)
            hs_begin(&w->clients[i]);
    uint64_t pace = w->rate_per_pub > 0 ? RTB_PACE_OPEN_MS
                    : w->fb             ? RTB_PACE_FB_MS
                                        : RTB_PACE_CLOSED_MS;
    uv_timer_start(&w->pace, on_pace, 0, pace);
}

/* Any byte, EOF or error from the parent releases the run; the run itself is bounded. */
static void on_go(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    rtb_worker_t *w = st->data;
    if (nread == 0)
        return;
    uv_read_stop(st);
    start_run(w);
}

static void phase_next(rtb_worker_t *w)
{
    if (w->phase == PH_SUBS) {
        w->phase = PH_PUBS;
        if (w->npubs) {
            start_queue(w, w->pubs, w->npubs);
            return;
        }
    }
    w->phase = PH_WAIT;
    w->wait_end_ms = uv_now(&w->loop) + (uint64_t)(RTB_GO_WAIT_MAX_S * 1000);
    if (rtb_go_wait(&w->go, w->go_fd, on_go, w->emit, w->ctx, &w->rep))
        start_run(w);
}

static void on_tick(uv_timer_t *t)
{
    rtb_worker_t *w = t->data;
    const rtb_opts_t *o = w->o;
    uint64_t now = rtb_now_ns(), now_ms = uv_now(&w->loop);
    uint64_t tmo = (uint64_t)(o->conn_timeout_s * 1e9);
    /* Bounded by the client count; one pass per second. */
    for (uint32_t i = 0; i < w->nclients; i++) {
        rtb_client_t *c = &w->clients[i];
        if (c->state >= CS_TCP && c->state < CS_READY && now - c->t_start > tmo) {
            client_fail(c);
            continue;
        }
        if (c->role == ROLE_HS && c->state == CS_CLOSING && now - c->t_start > 2 * tmo) {
            client_close(c); /* the broker never closed after our DISCONNECT */
            continue;
        }
        if (c->state == CS_READY && o->keepalive &&
            now_ms - c->t_last_tx_ms >= (uint64_t)o->keepalive * 1000 &&
            !rtb_mqtt_empty(&c->out, RTB_PINGREQ))
            mark_dirty(c);
    }
    if (w->phase == PH_WAIT && now_ms >= w->wait_end_ms)
        start_run(w);
    w->tick_no++;
    w->rep.s.tick = w->tick_no;
    w->rep.s.cpu_us = rtb_cpu_us();
    w->emit(w->ctx, RTB_EMIT_TICK, &w->rep);
}

uint32_t rtb_groups(const rtb_opts_t *o)
{
    switch (o->cmd) {
    case RTB_CMD_PAIRS:
        return o->count;
    case RTB_CMD_SEED:
        return o->pubs;
    case RTB_CMD_FANIN:
        return o->pubs;
    case RTB_CMD_FANOUT:
        return o->subs;
    case RTB_CMD_XCHAT:
        return o->pairs;
    default:
        return o->count;
    }
}

static int client_setup(rtb_worker_t *w, rtb_client_t *c, int role, uint32_t idx, const char *tmpl)
{
    const rtb_opts_t *o = w->o;
    char buf[512];
    const char *tag = "";
    if (o->cmd >= RTB_CMD_FANIN)
        tag = role == ROLE_SUB ? "s" : "p";
    snprintf(buf, sizeof(buf), "%s%s%u", o->prefix, tag, idx);
    c->id = strdup(buf);
    c->w = w;
    c->role = (uint8_t)role;
    c->idx = idx;
    c->pos = (uint32_t)(c - w->clients);
    c->ntgt = 1;
    c->tgt_base = idx;
    if (!c->id)
        return -ENOMEM;
    if (w->xctx && rtb_xport_new(w->xctx, &c->x))
        return -ENOMEM;
    if (tmpl) {
        /* seed --copies: subscriber c * subs + s is a copy of the one on test/s. */
        uint32_t ti = o->cmd == RTB_CMD_SEED && role == ROLE_SUB ? idx % o->subs : idx;
        if (expand(tmpl, ti, c->id, buf, sizeof(buf)) < 0)
            return -ENAMETOOLONG;
        c->topic = strdup(buf);
        if (!c->topic)
            return -ENOMEM;
    }
    if (role == ROLE_PUB && o->qos) {
        c->slot_pid = calloc(w->slot_cap, sizeof(uint16_t));
        c->slot_ts = calloc(w->slot_cap, sizeof(uint64_t));
        if (!c->slot_pid || !c->slot_ts)
            return -ENOMEM;
    }
    return 0;
}

/* Lays out this process's subscribers and publishers; see rtbench.c for the shapes. */
static int build(rtb_worker_t *w)
{
    const rtb_opts_t *o = w->o;
    uint32_t lo, hi, nsub = 0, npub = 0;
    rtb_range(rtb_groups(o), o->procs, w->proc, &lo, &hi);
    switch (o->cmd) {
    case RTB_CMD_CONN:
    case RTB_CMD_SUB:
        nsub = hi - lo;
        break;
    case RTB_CMD_HS:
        break; /* connectors, set up below: they belong to no connect phase */
    default:
        return -EINVAL; /* the XMPP commands run in rtb_xmpp.c */
    case RTB_CMD_PUB:
        npub = hi - lo;
        break;
    case RTB_CMD_FANIN:
        /* The publishers are split; process 0 also holds the one subscriber. */
        nsub = w->proc == 0;
        npub = hi - lo;
        break;
    case RTB_CMD_FANOUT:
        /* The subscribers are split; process 0 also holds the one publisher. */
        nsub = hi - lo;
        npub = w->proc == 0;
        break;
    case RTB_CMD_PAIRS:
        nsub = npub = hi - lo;
        break;
    case RTB_CMD_SEED:
        npub = hi - lo;
        for (uint32_t s = 0; s < o->subs; s++)
            nsub += (s % o->pubs >= lo && s % o->pubs < hi);
        nsub *= o->copies;
        break;
    }
    w->nclients = nsub + npub;
    w->clients = calloc(w->nclients ? w->nclients : 1, sizeof(rtb_client_t));
    w->subs = calloc(nsub ? nsub : 1, sizeof(rtb_client_t *));
    w->pubs = calloc(npub ? npub : 1, sizeof(rtb_client_t *));
    if (o->cmd == RTB_CMD_HS) {
        w->nclients = hi - lo;
        free(w->clients);
        w->clients = calloc(w->nclients ? w->nclients : 1, sizeof(rtb_client_t));
    }
    if (!w->clients || !w->subs || !w->pubs)
        return -ENOMEM;
    w->rep.s.clients = w->nclients;
    w->rep.s.expected_known = o->cmd >= RTB_CMD_FANIN && o->cmd != RTB_CMD_HS;

    int role_sub = o->cmd == RTB_CMD_CONN ? ROLE_CONN : ROLE_SUB;
    uint32_t ci = 0, seed_s = 0;
    int r = 0;
    if (o->cmd == RTB_CMD_HS)
        for (uint32_t k = 0; k < w->nclients && !r; k++)
            r = client_setup(w, &w->clients[ci++], ROLE_HS, o->start + lo + k, NULL);
    for (uint32_t k = 0; k < nsub && !r; k++) {
        rtb_client_t *c = &w->clients[ci++];
        uint32_t idx;
        const char *tmpl;
        switch (o->cmd) {
        case RTB_CMD_FANIN:
            idx = 0, tmpl = "test/fanin/+";
            break;
        case RTB_CMD_FANOUT:
            idx = lo + k, tmpl = "test/fanout";
            break;
        case RTB_CMD_PAIRS:
            idx = lo + k, tmpl = "test/%i";
            break;
        case RTB_CMD_SEED:
            /*
             * The next topic that belongs to one of our publishers, then its --copies
             * subscribers one after the other (each to its own node with --sub-ports).
             */
            if (k % o->copies == 0) {
                while (seed_s < o->subs && !(seed_s % o->pubs >= lo && seed_s % o->pubs < hi))
                    seed_s++;
                seed_s++;
            }
            idx = (k % o->copies) * o->subs + seed_s - 1, tmpl = "test/%i";
            break;
        default:
            idx = o->start + lo + k, tmpl = o->cmd == RTB_CMD_SUB ? o->topic : NULL;
        }
        r = client_setup(w, c, role_sub, idx, tmpl);
        w->subs[w->nsubs++] = c;
    }
    for (uint32_t k = 0; k < npub && !r; k++) {
        rtb_client_t *c = &w->clients[ci++];
        uint32_t idx = o->cmd == RTB_CMD_PUB      ? o->start + lo + k
                       : o->cmd == RTB_CMD_FANOUT ? 0
                                                  : lo + k;
        const char *tmpl = o->cmd == RTB_CMD_PUB      ? o->topic
                           : o->cmd == RTB_CMD_FANIN  ? "test/fanin/%i"
                           : o->cmd == RTB_CMD_FANOUT ? "test/fanout"
                                                      : "test/%i";
        r = client_setup(w, c, ROLE_PUB, idx, tmpl);
        c->gidx = idx;
        /*
         * Open-loop publishers are spread over the interval by the golden ratio, with no
         * coordination between processes; in step they would hit the broker in bursts
         * and measure their own queueing instead of the broker's latency.
         */
        c->phase = fmod((double)idx * 0.6180339887498949, 1.0);
        c->fanout = o->cmd == RTB_CMD_FANOUT ? o->subs
                    : o->cmd == RTB_CMD_PUB  ? 0
                    : o->cmd == RTB_CMD_SEED ? o->copies
                                             : 1;
        if (o->cmd == RTB_CMD_SEED) {
            c->tgt_base = idx;
            c->tgt_stride = o->pubs;
            c->ntgt = idx < o->subs ? (o->subs - idx + o->pubs - 1) / o->pubs : 0;
        }
        if (k == 0)
            w->pub_base = idx;
        w->pubs[w->npubs++] = c;
    }
    return r;
}

static void worker_free(rtb_worker_t *w)
{
    for (uint32_t i = 0; w->clients && i < w->nclients; i++) {
        rtb_client_t *c = &w->clients[i];
        rtb_buf_free(&c->out);
        rtb_buf_free(&c->busy);
        rtb_buf_free(&c->pend);
        rtb_buf_free(&c->wire);
        rtb_xport_free(c->x);
        free(c->id);
        free(c->topic);
        free(c->slot_pid);
        free(c->slot_ts);
        for (uint32_t j = 0; j < c->scap; j++)
            free(c->streams[j].bits);
        free(c->streams);
    }
    free(w->clients);
    free(w->subs);
    free(w->pubs);
    rtb_xctx_free(w->xctx);
}

int rtb_worker_run(const rtb_opts_t *o, uint32_t proc, int go_fd, uint64_t *fb, rtb_emit_fn emit,
                   void *ctx)
{
    if (rtb_xmpp_cmd(o->cmd))
        return rtb_xmpp_run(o, proc, go_fd, emit, ctx);
    rtb_worker_t w;
    memset(&w, 0, sizeof(w));
    w.o = o;
    w.proc = proc;
    w.emit = emit;
    w.ctx = ctx;
    w.go_fd = go_fd;
    w.topic_tmpl = "test/%i";
    w.fb = rtb_fb_size(o) ? fb : NULL;
    w.fb_words = fb_row_words(o);
    rtb_hist_init(&w.rep.e2e);
    rtb_hist_init(&w.rep.ack);
    rtb_hist_init(&w.rep.conn);
    w.max_inflight = o->inflight;
    w.slot_cap = 1;
    while (w.slot_cap < w.max_inflight)
        w.slot_cap *= 2;
    if (o->rate > 0) {
        uint32_t total = o->cmd == RTB_CMD_PUB      ? o->count
                         : o->cmd == RTB_CMD_FANOUT ? 1
                         : o->cmd == RTB_CMD_PAIRS  ? o->count
                                                    : o->pubs;
        w.rate_per_pub = o->rate / (total ? total : 1);
    } else if (o->pub_interval_ms > 0) {
        w.rate_per_pub = 1000.0 / o->pub_interval_ms;
    }
    w.closed_loop = o->cmd >= RTB_CMD_FANIN && o->cmd != RTB_CMD_HS && w.rate_per_pub == 0;
    if (w.closed_loop)
        w.coalesce_ns = (long)o->coalesce_us * 1000;

    int r = 0;
    if (o->tls || o->ws) {
        char err[256];
        rtb_xconf_t cf = {o->tls,  o->cafile, o->cert,       o->key, o->sni,
                          o->host, o->port,   o->tls_resume, o->ws};
        r = rtb_xctx_new(&w.xctx, &cf, err, sizeof(err));
        if (r) {
            fprintf(stderr, "rtbench: %s\n", err);
            return r;
        }
    }
    r = build(&w);
    if (r) {
        worker_free(&w);
        return r;
    }
    r = uv_loop_init(&w.loop);
    if (r) {
        worker_free(&w);
        return r;
    }
    uv_timer_init(&w.loop, &w.tick);
    uv_timer_init(&w.loop, &w.conn_timer);
    uv_timer_init(&w.loop, &w.pace);
    uv_timer_init(&w.loop, &w.close_timer);
    uv_prepare_init(&w.loop, &w.flush);
    w.tick.data = w.conn_timer.data = w.pace.data = w.close_timer.data = w.flush.data = &w;
    uv_prepare_start(&w.flush, on_prepare);
    /* Without the pipe there is no barrier: start as soon as connected. */
    w.go_fd = rtb_go_open(&w.loop, &w.go, go_fd, &w);
    uv_timer_start(&w.tick, on_tick, RTB_TICK_MS, RTB_TICK_MS);
    uint64_t ci = o->conn_interval_ms ? o->conn_interval_ms : 1;
    uv_timer_start(&w.conn_timer, on_conn_timer, ci, ci);

    w.phase = PH_SUBS;
    if (w.nsubs)
        start_queue(&w, w.subs, w.nsubs);
    else
        phase_next(&w);
    uv_run(&w.loop, UV_RUN_DEFAULT);

    /* Gaps: per stream, seqs below the highest seen that never arrived. */
    for (uint32_t i = 0; i < w.nclients; i++) {
        rtb_client_t *c = &w.clients[i];
        for (uint32_t j = 0; j < c->scap; j++)
            if (c->streams[j].key)
                w.rep.s.gaps += c->streams[j].next - c->streams[j].unique;
    }
    w.rep.s.cpu_us = rtb_cpu_us();
    w.rep.s.tick = w.tick_no;
    emit(ctx, RTB_EMIT_FINAL, &w.rep);
    uv_loop_close(&w.loop);
    worker_free(&w);
    return 0;
}
