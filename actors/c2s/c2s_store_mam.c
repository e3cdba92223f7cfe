/*
** xmpp_archive: the actor that writes and reads the message archive (XEP-0313, archive.c in
** xmpp.db) for the sessions, on the blocking pool beside the store actor (c2s_store.c), with
** its own connection to the file. Its own actor so that a burst of chats, or a slow disk,
** delays queries of the archive and nothing else: logins, rosters and offline messages go on
** in the store, whatever the archive has queued (SQLite's WAL lets both connections read,
** and their writes take turns). Sessions send it what it takes with rt_send_unmuted: a
** session is never parked on the archive's account.
**
** Batching. A copy (C2S_OP_ARCHIVE) is added to the batch; the first one of a batch sets a
** timer (C2S_ARCHIVE_BATCH_MS), and when it fires one transaction writes every copy that came
** meanwhile, sharing the pages they touch. It is written sooner at C2S_ARCHIVE_BATCH_BYTES,
** before a query (which then sees every copy routed before it was asked: no client waits for
** the timer) and when the actor ends; what a crash loses is what had not been written.
*/
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "c2s_impl.h"
#include "group.h"
#include "log.h"
#include "xeps.h"

#define NS_MAM "urn:xmpp:mam:2"
#define NS_RSM "http://jabber.org/protocol/rsm"
#define C2S_MSG_ARCHIVE_FLUSH (RT_C2S_MSG_BASE + 0x40) /* the actor's timer: write the batch */

typedef struct c2s_batch_s {
    rt_buf_t recs;    /* the copies waiting to be written */
    uint32_t n;       /* how many (a chat between two accounts is two) */
    uint64_t charged; /* their bytes in rt__c2s_archive_inflight */
    bool flush_due;   /* a C2S_MSG_ARCHIVE_FLUSH timer is set */
} c2s_batch_t;

typedef struct archive_s {
    rt_accounts_t *accounts;
    c2s_batch_t batch;
} archive_t;

static char archive_dir[sizeof(((rt_conf_t *)0)->data_dir)];

static void flush(rt_accounts_t *a, c2s_batch_t *batch);

/*
** A copy in the batch: this header, then host, user (the sender), the receiver's host and
** user, the sender's and the receiver's bare JIDs, each NUL-terminated, then the stanza.
*/
typedef struct rec_s {
    c2s_archive_t h;
    uint32_t strings; /* bytes of the six strings */
    uint32_t stanza;  /* bytes of the stanza */
} rec_t;

static void put_str(rt_buf_t *b, const char *s, size_t len)
{
    rt_buf_add(b, s, len);
    rt_buf_add(b, "", 1);
}

static void add(rt_accounts_t *a, c2s_batch_t *batch, const char *host, const char *user,
                const uint8_t *data, size_t len)
{
    batch->charged += len;
    rec_t r;
    if (len < sizeof(r.h))
        return;
    memcpy(&r.h, data, sizeof(r.h));
    if (r.h.to_len > len - sizeof(r.h))
        return;
    const char *to = (const char *)data + sizeof(r.h), *at = memchr(to, '@', r.h.to_len);
    if (!at)
        return;
    size_t ulen = (size_t)(at - to), hlen = r.h.to_len - ulen - 1;
    r.stanza = (uint32_t)(len - sizeof(r.h) - r.h.to_len);
    size_t start = batch->recs.len;
    rt_buf_add(&batch->recs, &r, sizeof(r));
    put_str(&batch->recs, host, strlen(host));
    put_str(&batch->recs, user, strlen(user));
    put_str(&batch->recs, at + 1, hlen);
    put_str(&batch->recs, to, ulen);
    rt_buf_printf(&batch->recs, "%s@%s", user, host);
    rt_buf_add(&batch->recs, "", 1);
    put_str(&batch->recs, to, r.h.to_len);
    r.strings = (uint32_t)(batch->recs.len - start - sizeof(r));
    rt_buf_add(&batch->recs, to + r.h.to_len, r.stanza);
    if (batch->recs.oom) { /* the copy is lost, not the batch */
        rt_buf_truncate(&batch->recs, start);
        atomic_fetch_add_explicit(&rt_c2s_stats.archive_dropped, 1, memory_order_relaxed);
        return;
    }
    memcpy(batch->recs.data + start, &r, sizeof(r));
    batch->n += (r.h.out_id != 0) + (r.h.in_id != 0 && !r.h.room);
    if (batch->recs.len >= C2S_ARCHIVE_BATCH_BYTES)
        flush(a, batch);
}

static void flush(rt_accounts_t *a, c2s_batch_t *batch)
{
    rt_archive_entry_t *e = batch->n ? malloc(sizeof(*e) * batch->n) : NULL;
    int64_t *ids = batch->n ? malloc(sizeof(*ids) * batch->n) : NULL;
    size_t n = 0;
    if (!ids) {
        free(e);
        e = NULL;
    }
    for (size_t at = 0; e && at + sizeof(rec_t) <= batch->recs.len;) {
        rec_t r;
        memcpy(&r, batch->recs.data + at, sizeof(r));
        const char *s[6], *p = (const char *)batch->recs.data + at + sizeof(r);
        for (int i = 0; i < 6; i++, p += strlen(p) + 1)
            s[i] = p;
        const void *stanza = batch->recs.data + at + sizeof(r) + r.strings;
        if (r.h.out_id && n < batch->n)
            e[n++] = (rt_archive_entry_t){s[0],     s[1],       s[5],         stanza,
                                          r.stanza, r.h.out_id, r.h.stamp_ms, r.h.room != 0};
        if (r.h.in_id && !r.h.room && n < batch->n)
            e[n++] = (rt_archive_entry_t){s[2],     s[3],      s[4],         stanza,
                                          r.stanza, r.h.in_id, r.h.stamp_ms, false};
        at += sizeof(r) + r.strings + r.stanza;
    }
    int rc = e          ? rt_archive_put(a, e, n, (int64_t)rt_wall_ms(),
                                         (uint32_t)rt__c2s.conf->max_archive_messages, ids)
             : batch->n ? RT_ENOMEM
                        : 0;
    if (rc == 0) {
        size_t kept = 0; /* not those of no account (an anonymous receiver) */
        for (size_t i = 0; i < n; i++)
            kept += ids[i] != 0;
        atomic_fetch_add_explicit(&rt_c2s_stats.archived, kept, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&rt_c2s_stats.archive_dropped, batch->n, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "xmpp.archive_failed", "copies=%u reason=%s", batch->n,
               rt_strerror(rc));
    }
    free(e);
    free(ids);
    atomic_fetch_sub_explicit(&rt__c2s_archive_inflight, batch->charged, memory_order_relaxed);
    batch->charged = 0;
    batch->n = 0;
    rt_buf_truncate(&batch->recs, 0);
}

/* ---- Queries ---- */

typedef struct page_s {
    rt_buf_t items; /* each: id, stamp (8 bytes each), length (4), the stanza */
    uint32_t n;
    size_t budget;
    int64_t first, last;
} page_t;

static int take_row(int64_t id, int64_t stamp_ms, const void *stanza, size_t len, void *arg)
{
    page_t *p = arg;
    if (p->n && p->items.len + len > p->budget)
        return 1; /* the page's bytes: the rest another time */
    uint32_t l = (uint32_t)len;
    rt_buf_add(&p->items, &id, sizeof(id));
    rt_buf_add(&p->items, &stamp_ms, sizeof(stamp_ms));
    rt_buf_add(&p->items, &l, sizeof(l));
    rt_buf_add(&p->items, stanza, len);
    if (!p->n++)
        p->first = id;
    p->last = id;
    return 0;
}

void rt__c2s_put_stamp(rt_buf_t *b, int64_t ms)
{
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    char s[32];
    strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%S", &tm);
    rt_buf_printf(b, "%s.%03dZ", s, (int)(ms % 1000));
}

/*
** The page: by the query's max, and by C2S_MAM_PAGE_BYTES (at least one message). A page
** cut short by its bytes is the end of the range nearest where it was asked from: forwards
** its oldest messages, backwards (before, the last page) its newest, asked again for fewer
** until they fit, so that paging on from it skips nothing.
*/
static int read_page(rt_accounts_t *a, const char *host, const char *user, rt_archive_query_t *q,
                     page_t *p, bool *complete)
{
    bool back = q->before || q->last;
    for (;;) {
        rt_buf_truncate(&p->items, 0);
        p->n = 0;
        int rc = rt_archive_query(a, host, user, q, take_row, p, complete);
        if (rc < 0)
            return rc;
        if (rc == 0 && !p->items.oom)
            return 0;
        if (p->items.oom)
            return RT_ENOMEM;
        *complete = false; /* cut by its bytes */
        if (!back)
            return 0;
        q->max = p->n; /* fewer than asked (one at least always fits): this ends */
    }
}

static void query(rt_accounts_t *a, rt_pid_t to, const char *host, const char *user,
                  const uint8_t *data, size_t len)
{
    c2s_mam_query_t mq;
    if (len < sizeof(mq))
        return;
    memcpy(&mq, data, sizeof(mq));
    if (mq.reply_to)
        to = mq.reply_to; /* a room asked for one of its occupants */
    const char *s[4], *p = (const char *)data + sizeof(mq), *end = (const char *)data + len;
    for (int i = 0; i < 4; i++) {
        const char *z = memchr(p, 0, (size_t)(end - p));
        if (!z)
            return;
        s[i] = p;
        p = z + 1;
    }
    const char *id = s[0], *queryid = s[1], *full = s[2], *from = s[3];
    char with[RT_JID_TEXT_MAX + 1];
    size_t wlen = (size_t)(end - p);
    if (wlen > RT_JID_TEXT_MAX)
        return;
    memcpy(with, p, wlen);
    with[wlen] = 0;
    rt_archive_query_t q = {.with = wlen ? with : NULL,
                            .start_ms = mq.start_ms,
                            .end_ms = mq.end_ms,
                            .after = mq.after,
                            .before = mq.before,
                            .last = mq.last != 0,
                            .max = mq.max};
    uint64_t count = 0;
    bool complete = true;
    size_t big = (size_t)rt__c2s.conf->max_stanza_size + 1024;
    page_t page = {.budget = big > C2S_MAM_PAGE_BYTES ? big : C2S_MAM_PAGE_BYTES};
    int rc = rt_archive_count(a, host, user, &q, &count);
    if (rc == 0 && q.max)
        rc = read_page(a, host, user, &q, &page, &complete);
    else
        complete = count == 0;
    rt_buf_t b = {0};
    char bare[RT_JID_TEXT_MAX + 1];
    snprintf(bare, sizeof(bare), "%s@%s", user, host);
    /* Each message, then the fin (4.3): the session writes them in this order. */
    for (size_t at = 0; rc == 0 && at < page.items.len;) {
        int64_t mid, stamp;
        uint32_t l;
        memcpy(&mid, page.items.data + at, 8);
        memcpy(&stamp, page.items.data + at + 8, 8);
        memcpy(&l, page.items.data + at + 16, 4);
        rt_buf_truncate(&b, 0);
        rt_xml_put_start(&b, "message");
        rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
        rt_xml_put_attr(&b, "from", bare);
        rt_xml_put_attr(&b, "to", full);
        rt_buf_printf(&b, "><result xmlns='%s'", NS_MAM);
        if (*queryid)
            rt_xml_put_attr(&b, "queryid", queryid);
        rt_buf_printf(&b,
                      " id='%lld'><forwarded xmlns='urn:xmpp:forward:0'>"
                      "<delay xmlns='urn:xmpp:delay' stamp='",
                      (long long)mid);
        rt__c2s_put_stamp(&b, stamp);
        rt_buf_printf(&b, "'/>");
        rt_buf_add(&b, page.items.data + at + 20, l);
        rt_buf_printf(&b, "</forwarded></result></message>");
        if (!b.oom)
            rt_send(to, C2S_MSG_STANZA, b.data, b.len);
        at += 20 + l;
    }
    rt_buf_truncate(&b, 0);
    rt_xml_put_start(&b, "iq");
    rt_xml_put_attr(&b, "xmlns", RT_XML_NS_CLIENT);
    rt_xml_put_attr(&b, "id", id);
    if (*from)
        rt_xml_put_attr(&b, "from", from);
    rt_xml_put_attr(&b, "to", full);
    if (rc == 0) {
        rt_buf_printf(&b, " type='result'><fin xmlns='%s'%s><set xmlns='%s'>", NS_MAM,
                      complete ? " complete='true'" : "", NS_RSM);
        if (page.n)
            rt_buf_printf(&b, "<first>%lld</first><last>%lld</last>", (long long)page.first,
                          (long long)page.last);
        rt_buf_printf(&b, "<count>%llu</count></set></fin></iq>", (unsigned long long)count);
    } else {
        rt_log(RT_LOG_WARNING, "xmpp.archive_query_failed", "user=%s@%s reason=%s", user, host,
               rt_strerror(rc));
        rt_buf_printf(&b,
                      " type='error'><error type='wait'><internal-server-error xmlns='%s'/>"
                      "</error></iq>",
                      RT_XML_NS_STANZA_ERRORS);
    }
    if (!b.oom)
        rt_send(to, C2S_MSG_STANZA, b.data, b.len);
    rt_buf_free(&b);
    rt_buf_free(&page.items);
}

/* ---- The actor ---- */

static int archive_init(rt_actor_t *self, void *state, void *arg)
{
    (void)self;
    (void)arg;
    archive_t *s = state;
    int rc = rt__c2s_accounts_open(archive_dir, &s->accounts, "xmpp.archive_failed");
    if (rc)
        return rc;
    int64_t last;
    if (rt_archive_last_id(s->accounts, &last) == 0)
        rt__c2s_mam_floor(last);
    return 0;
}

static void archive_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    archive_t *s = state;
    if (m->tag == C2S_MSG_ARCHIVE_FLUSH) {
        s->batch.flush_due = false;
        flush(s->accounts, &s->batch);
        return;
    }
    c2s_req_view_t v;
    if (rt__c2s_store_req(m, &v) != 0)
        return;
    const c2s_req_t *r = v.r;
    const char *host = v.host, *user = v.user;
    const uint8_t *data = v.data;
    if (r->op == C2S_OP_ARCHIVE) {
        add(s->accounts, &s->batch, host, user, data, r->data_len);
        if (!s->batch.flush_due && s->batch.n)
            s->batch.flush_due = rt_send_after_tag(C2S_ARCHIVE_BATCH_MS, rt_self(self),
                                                   C2S_MSG_ARCHIVE_FLUSH, NULL) == 0;
        if (!s->batch.flush_due)
            flush(s->accounts, &s->batch);
    } else if (r->op == C2S_OP_MAM_QUERY) {
        if (s->batch.n) /* it sees what was routed before it */
            flush(s->accounts, &s->batch);
        query(s->accounts, m->from, host, user, data, r->data_len);
    }
}

static void archive_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    archive_t *s = state;
    if (s->accounts)
        flush(s->accounts, &s->batch);
    rt_buf_free(&s->batch.recs);
    rt_accounts_close(s->accounts);
    s->accounts = NULL;
}

/* A copy the actor never took: counted as dropped, its bytes no longer on their way. */
static void archive_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    c2s_req_view_t v;
    if (rt__c2s_store_req(m, &v) != 0 || v.r->op != C2S_OP_ARCHIVE)
        return;
    atomic_fetch_sub_explicit(&rt__c2s_archive_inflight, v.r->data_len, memory_order_relaxed);
    atomic_fetch_add_explicit(&rt_c2s_stats.archive_dropped, 1, memory_order_relaxed);
}

static const rt_actor_type_t archive_type = {
    .name = RT_C2S_ARCHIVE_NAME,
    .state_size = sizeof(archive_t),
    .init = archive_init,
    .handle = archive_handle,
    .terminate = archive_terminate,
    .dead_letter = archive_dead_letter,
    .flags = RT_TYPE_BLOCKING,
};

int rt__c2s_archive_start(rt_pid_t group, const char *data_dir)
{
    snprintf(archive_dir, sizeof(archive_dir), "%s", data_dir);
    rt_child_spec_t c = {
        .name = RT_C2S_ARCHIVE_NAME, .type = &archive_type, .restart = RT_PERMANENT};
    return rt_supervisor_start_child(group, &c, NULL);
}
