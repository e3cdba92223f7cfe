/*
** xmpp_store: the one actor that opens xmpp.db for the sessions. It runs on the blocking pool
** (RT_TYPE_BLOCKING): reading credentials is file I/O and checking a PLAIN password is PBKDF2,
** neither of which may run on a scheduler. One actor, not a pool: a login storm then takes one
** core of the blocking pool, queued in its mailbox in arrival order, bounded by the sessions
** waiting (each waits for one answer at most); SCRAM's own work stays in the sessions.
**
** Offline messages: the sender's session asks the store to keep a message it could deliver to
** no one, with the error the sender gets when it cannot be kept (no such account, or the
** user's bound reached), so the sender never waits for the answer. At a user's first
** available presence the store sends the kept messages to that session, oldest first, each
** deleted once it is in the session's mailbox (rt_offline_take), with a XEP-0203 delay.
*/
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#include "accounts.h"
#include "broker.h"
#include "c2s_impl.h"
#include "c2s_store.h"
#include "group.h"
#include "log.h"
#include "xeps.h"

#define NS_DELAY "urn:xmpp:delay"

/*
** How long the store's read snapshot may outlive the turn that began it. In a login storm the
** store's turns are small (one or two requests: 1.4 a login), and each snapshot is a WAL read
** lock taken and dropped (two fcntl) and the file's size checked (an fstat); kept a few ms, the
** turns of a storm share one. What other connections write (the admin's account changes) is
** seen that much later at most; what the store writes ends the snapshot first.
*/
#define STORE_SNAPSHOT_MS 5
#define STORE_MSG_SNAPSHOT_END (RT_C2S_MSG_BASE + 0x41) /* the snapshot's time is up */
#define STORE_MSG_CHANGED (RT_C2S_MSG_BASE + 0x42)      /* rt_c2s_accounts_changed */

typedef struct store_s {
    rt_accounts_t *accounts;
    bool snapshot_timed; /* a STORE_MSG_SNAPSHOT_END is on its way */
} store_t;

static char store_dir[sizeof(((rt_conf_t *)0)->data_dir)];

rt_msg_t *rt__c2s_store_msg(uint32_t op, uint32_t seq, const char *host, size_t host_len,
                            const char *user, size_t user_len, uint32_t hash, size_t data_len)
{
    if (host_len > UINT16_MAX || user_len > UINT16_MAX || data_len > UINT32_MAX / 2)
        return NULL;
    size_t len = sizeof(c2s_req_t) + host_len + user_len + data_len;
    rt_msg_t *m = rt_msg_new(C2S_MSG_STORE_REQ, len);
    if (!m)
        return NULL;
    c2s_req_t *r = (c2s_req_t *)(void *)m->data;
    *r = (c2s_req_t){.op = op,
                     .seq = seq,
                     .host_len = (uint16_t)host_len,
                     .user_len = (uint16_t)user_len,
                     .data_len = (uint32_t)data_len,
                     .hash = hash};
    memcpy(r->bytes, host, host_len);
    memcpy(r->bytes + host_len, user, user_len);
    return m;
}

uint8_t *rt__c2s_store_data(rt_msg_t *m)
{
    c2s_req_t *r = (c2s_req_t *)(void *)m->data;
    return (uint8_t *)r->bytes + r->host_len + r->user_len;
}

int rt__c2s_store_req(const rt_msg_t *m, c2s_req_view_t *v)
{
    if (m->tag != C2S_MSG_STORE_REQ || m->len < sizeof(c2s_req_t))
        return RT_EINVAL;
    const c2s_req_t *r = (const void *)m->data;
    if (sizeof(c2s_req_t) + (size_t)r->host_len + r->user_len + r->data_len > m->len ||
        r->host_len > RT_JID_PART_MAX || r->user_len > RT_JID_PART_MAX)
        return RT_EINVAL;
    v->r = r;
    memcpy(v->host, r->bytes, r->host_len);
    v->host[r->host_len] = 0;
    memcpy(v->user, r->bytes + r->host_len, r->user_len);
    v->user[r->user_len] = 0;
    v->data = (const uint8_t *)r->bytes + r->host_len + r->user_len;
    return 0;
}

int rt__c2s_store_ask(uint32_t op, uint32_t seq, const char *host, size_t host_len,
                      const char *user, size_t user_len, uint32_t hash, const void *data,
                      size_t data_len)
{
    if (host_len > UINT16_MAX || user_len > UINT16_MAX || data_len > UINT32_MAX / 2)
        return RT_EINVAL;
    rt_msg_t *m = rt__c2s_store_msg(op, seq, host, host_len, user, user_len, hash, data_len);
    if (!m)
        return RT_ENOMEM;
    if (data_len)
        memcpy(rt__c2s_store_data(m), data, data_len);
    return rt__c2s_store_send(m, rt__c2s_current_pid());
}

int rt__c2s_store_send(rt_msg_t *m, rt_pid_t from)
{
    if (rt__c2s_home_elsewhere())
        return rt__c2s_call_home(C2S_TO_STORE, from, m);
    m->from = from; /* sent from an actor, the sender is that actor's pid anyway */
    return rt_send_msg(rt_whereis(RT_C2S_STORE_NAME), m); /* none: freed, RT_ENOPROC */
}

void rt_c2s_accounts_changed(void)
{
    rt_pid_t store = rt__c2s.conf ? rt_whereis(RT_C2S_STORE_NAME) : 0;
    if (store)
        rt_send(store, STORE_MSG_CHANGED, NULL, 0);
}

int rt__c2s_ask_own(const c2s_t *c, uint32_t op, const void *data, size_t len)
{
    const char *host = rt__c2s.conf->hosts[c->host];
    return rt__c2s_store_ask(op, 0, host, strlen(host), rt_jid_local(c->jid), c->jid->local, 0,
                             data, len);
}

int rt__c2s_accounts_open(const char *dir, rt_accounts_t **a, const char *event)
{
    char err[RT_ACCOUNTS_ERR_LEN];
    int rc = rt_accounts_open(dir, a, err, sizeof(err));
    if (rc)
        rt_log(RT_LOG_ERROR, event, "error=%s", err);
    return rc;
}

static int store_init(rt_actor_t *self, void *state, void *arg)
{
    (void)self;
    (void)arg;
    store_t *s = state;
    return rt__c2s_accounts_open(store_dir, &s->accounts, "xmpp.store_failed");
}

static void reply(rt_pid_t to, const c2s_reply_t *r)
{
    rt_send(to, C2S_MSG_STORE_REPLY, r, sizeof(*r));
}

/* The stanza with a XEP-0203 delay before its end tag, sent to the session. */
typedef struct take_s {
    rt_pid_t to;
    const char *host;
} take_t;

static int send_kept(const void *stanza, size_t len, int64_t stamp_ms, void *arg)
{
    const take_t *t = arg;
    const char *s = stanza;
    static const char end[] = "</message>";
    size_t end_len = sizeof(end) - 1;
    /* Ours already (kept again after a session that had it ended unacknowledged): the first
       stamp stays, as XEP-0203 wants one delay per entity that held the stanza. */
    char ours[RT_JID_TEXT_MAX + 64];
    int n = snprintf(ours, sizeof(ours), "<delay xmlns='%s' from='%s' ", NS_DELAY, t->host);
    if (len < end_len || memcmp(s + len - end_len, end, end_len) != 0 ||
        (n > 0 && (size_t)n < sizeof(ours) && memmem(s, len, ours, (size_t)n)))
        return rt_send(t->to, C2S_MSG_STANZA, stanza, len) == 0 ? 0 : 1;
    time_t secs = (time_t)(stamp_ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    char stamp[32];
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm);
    rt_buf_t b = {0};
    rt_buf_add(&b, s, len - end_len);
    rt_buf_printf(&b, "<delay xmlns='%s' from='%s' stamp='%s'/>%s", NS_DELAY, t->host, stamp,
                  end);
    int rc = b.oom ? 1 : rt_send(t->to, C2S_MSG_STANZA, b.data, b.len) == 0 ? 0 : 1;
    rt_buf_free(&b);
    return rc;
}

static void offline_push(store_t *s, rt_msg_t *m, const char *host, const char *user,
                         const uint8_t *data, size_t len)
{
    uint32_t slen;
    if (len < sizeof(slen))
        return;
    memcpy(&slen, data, sizeof(slen));
    if (slen > len - sizeof(slen))
        return;
    const uint8_t *stanza = data + sizeof(slen), *error = stanza + slen;
    size_t error_len = len - sizeof(slen) - slen;
    const rt_conf_xmpp_t *x = rt__c2s.conf;
    int rc = rt_offline_push(s->accounts, host, user, stanza, slen, (int64_t)rt_wall_ms(),
                             (uint32_t)x->max_offline_messages, (uint64_t)x->max_offline_bytes);
    if (rc == 0) {
        rt__c2s_store_presence_stale(host, user, C2S_STALE_KEPT);
        atomic_fetch_add_explicit(&rt_c2s_stats.offline_stored, 1, memory_order_relaxed);
        if (rt__c2s_push_worthy(stanza, slen))
            rt__c2s_store_push_notify(s->accounts, host, user);
        return;
    }
    if (rc != RT_ENOTFOUND) {
        atomic_fetch_add_explicit(&rt_c2s_stats.offline_refused, 1, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "xmpp.offline_refused", "user=%s@%s reason=%s", user, host,
               rc == RT_ELIMIT ? "full" : rt_strerror(rc));
    }
    rt_send(m->from, C2S_MSG_STANZA, error, error_len);
}

/* ---- FAST tokens (XEP-0484): the session checks the HMAC ---- */

static void add_token(const void *token, size_t len, void *arg)
{
    uint8_t n = (uint8_t)len; /* RT_FAST_TOKEN_MAX fits */
    rt_buf_add(arg, &n, 1);
    rt_buf_add(arg, token, len);
}

/* data: agent, mechanism (NUL-ended): a c2s_reply_t, then the tokens valid now. */
static void fast_get(rt_accounts_t *a, rt_pid_t to, c2s_reply_t *out, const char *host,
                     const char *user, const uint8_t *data, size_t len)
{
    const char *agent = (const char *)data, *mech;
    size_t alen = strnlen(agent, len);
    rt_buf_t b = {0};
    rt_buf_add(&b, out, sizeof(*out));
    if (alen + 1 >= len || strnlen(mech = agent + alen + 1, len - alen - 1) == len - alen - 1)
        out->rc = RT_EINVAL;
    else
        out->rc = rt_fast_get(a, host, user, agent, mech, (int64_t)rt_wall_ms(), add_token, &b);
    c2s_reply_t *r = (c2s_reply_t *)(void *)b.data;
    if (!b.oom) {
        r->rc = out->rc;
        r->len = (uint32_t)(b.len - sizeof(*r));
        rt_send(to, C2S_MSG_STORE_REPLY, b.data, b.len);
    }
    OPENSSL_cleanse(b.data, b.len);
    rt_buf_free(&b);
}

/* data: agent, mechanism (NUL-ended), expiry (int64_t), the token. */
static void fast_put(rt_accounts_t *a, const char *host, const char *user, const uint8_t *data,
                     size_t len)
{
    const char *agent = (const char *)data;
    size_t alen = strnlen(agent, len), mlen;
    if (alen + 1 >= len)
        return;
    const char *mech = agent + alen + 1;
    mlen = strnlen(mech, len - alen - 1);
    size_t at = alen + 1 + mlen + 1;
    int64_t expiry;
    if (at + sizeof(expiry) >= len)
        return;
    memcpy(&expiry, data + at, sizeof(expiry));
    at += sizeof(expiry);
    int rc = rt_fast_put(a, host, user, agent, mech, data + at, len - at, expiry,
                         RT_C2S_FAST_AGENTS_MAX);
    if (rc)
        rt_log(RT_LOG_WARNING, "xmpp.fast_token_not_kept", "user=%s@%s error=%s", user, host,
               rt_strerror(rc));
}

/* The requests that only read (an offline take writes only when something was kept): they
   share one read snapshot (STORE_SNAPSHOT_MS). */
static bool op_reads(uint32_t op)
{
    switch (op) {
    case C2S_OP_CRED:
    case C2S_OP_PLAIN:
    case C2S_OP_EXTERNAL:
    case C2S_OP_ROSTER_GET:
    case C2S_OP_ROSTER_GET_FIRST:
    case C2S_OP_BLOCK_GET:
    case C2S_OP_VCARD_GET:
    case C2S_OP_OFFLINE_TAKE:
    case C2S_OP_PRESENCE_INIT:
    case C2S_OP_PEP_ITEMS:
    case C2S_OP_PEP_LAST:
    case C2S_OP_FAST_GET:
        return true;
    default:
        return false;
    }
}

static void store_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    store_t *s = state;
    if (m->tag == STORE_MSG_SNAPSHOT_END || m->tag == STORE_MSG_CHANGED) {
        if (m->tag == STORE_MSG_SNAPSHOT_END)
            s->snapshot_timed = false;
        rt_accounts_snapshot_end(s->accounts);
        return;
    }
    c2s_req_view_t v;
    if (rt__c2s_store_req(m, &v) != 0)
        return;
    const c2s_req_t *r = v.r;
    bool reads = op_reads(r->op);
    if (reads) {
        rt_accounts_snapshot(s->accounts);
        if (!s->snapshot_timed)
            s->snapshot_timed =
                rt_send_after_tag(STORE_SNAPSHOT_MS, rt_self(self), STORE_MSG_SNAPSHOT_END,
                                  NULL) == 0;
    }
    const char *host = v.host, *user = v.user;
    const uint8_t *data = v.data;
    c2s_reply_t out = {.op = r->op, .seq = r->seq};
    switch (r->op) {
    case C2S_OP_CRED:
        out.rc = rt_accounts_get(s->accounts, host, user, (rt_scram_hash_t)r->hash, &out.u.cred);
        reply(m->from, &out);
        break;
    case C2S_OP_PLAIN:
        out.rc = rt_accounts_check_password(s->accounts, host, user, (const char *)data,
                                            r->data_len);
        reply(m->from, &out);
        break;
    case C2S_OP_EXTERNAL: { /* only whether it exists: the certificate proved the rest */
        rt_scram_cred_t cred;
        out.rc = rt_accounts_get(s->accounts, host, user, RT_SCRAM_SHA256, &cred);
        reply(m->from, &out);
        break;
    }
    case C2S_OP_REGISTER:
    case C2S_OP_PASSWD:
    case C2S_OP_UNREGISTER:
        rt__c2s_store_register(s->accounts, m->from, r, host, user, data, r->data_len);
        break;
    case C2S_OP_OFFLINE_PUSH:
        offline_push(s, m, host, user, data, r->data_len);
        break;
    case C2S_OP_OFFLINE_TAKE: {
        take_t t = {.to = m->from, .host = host};
        rt_offline_take(s->accounts, host, user, UINT32_MAX, send_kept, &t);
        break;
    }
    case C2S_OP_ROSTER_GET:
        rt__c2s_store_roster_get(s->accounts, m->from, host, user, data, r->data_len, false);
        break;
    case C2S_OP_ROSTER_GET_FIRST: /* and what the initial presence would ask for */
        rt__c2s_store_block_load(s->accounts, m->from, host, user);
        rt__c2s_store_roster_get(s->accounts, m->from, host, user, data, r->data_len, true);
        break;
    case C2S_OP_ROSTER_SET:
        rt__c2s_store_roster_set(s->accounts, m->from, host, user, data, r->data_len);
        break;
    case C2S_OP_SUB:
        rt__c2s_store_sub(s->accounts, host, user, data, r->data_len);
        break;
    case C2S_OP_SUB_IN:
        rt__c2s_store_sub_in(s->accounts, host, user, data, r->data_len);
        break;
    case C2S_OP_BLOCK_GET:
        rt__c2s_store_block_get(s->accounts, m->from, host, user, data, r->data_len);
        break;
    case C2S_OP_BLOCK_SET:
        rt__c2s_store_block_set(s->accounts, m->from, host, user, data, r->data_len);
        break;
    case C2S_OP_VCARD_GET:
        rt__c2s_store_vcard_get(s->accounts, m->from, host, user, data, r->data_len);
        break;
    case C2S_OP_VCARD_SET:
        rt__c2s_store_vcard_set(s->accounts, m->from, host, user, data, r->data_len);
        break;
    case C2S_OP_PEP_PUBLISH:
        rt__c2s_store_pep_publish(s->accounts, m->from, host, user, data, r->data_len);
        break;
    case C2S_OP_PEP_DELETE:
        rt__c2s_store_pep_delete(s->accounts, m->from, host, user, data, r->data_len);
        break;
    case C2S_OP_PEP_ITEMS:
        rt__c2s_store_pep_items(s->accounts, m->from, host, user, data, r->data_len);
        break;
    case C2S_OP_PEP_LAST:
        rt__c2s_store_pep_last(s->accounts, m->from, host, user, data, r->data_len);
        break;
    case C2S_OP_FAST_GET:
        fast_get(s->accounts, m->from, &out, host, user, data, r->data_len);
        break;
    case C2S_OP_FAST_PUT:
        fast_put(s->accounts, host, user, data, r->data_len);
        break;
    case C2S_OP_FAST_DEL:
        if (r->data_len && data[r->data_len - 1] == 0)
            rt_fast_del(s->accounts, host, user, (const char *)data);
        break;
    case C2S_OP_PUSH_ENABLE:
    case C2S_OP_PUSH_DISABLE:
        rt__c2s_store_push_set(s->accounts, m->from, r->op == C2S_OP_PUSH_ENABLE, host, user, data,
                               r->data_len);
        break;
    case C2S_OP_PUSH_NOTIFY:
        rt__c2s_store_push_notify(s->accounts, host, user);
        break;
    case C2S_OP_MUC_PUT:
        out.rc = rt_muc_room_put(s->accounts, host, user, data, r->data_len);
        if (out.rc)
            rt_log(RT_LOG_ERROR, "xmpp.muc_room_not_kept", "room=%s@%s error=%s", user, host,
                   rt_strerror(out.rc));
        break;
    case C2S_OP_PRESENCE_INIT: { /* kept messages, if any, are taken in a write transaction */
        /* The blocklist before the roster, whose arrival starts the broadcast (XEP-0191 3.3:
           no presence to a blocked contact), and before what was kept. */
        rt__c2s_store_block_load(s->accounts, m->from, host, user);
        rt__c2s_store_presence_init(s->accounts, m->from, host, user);
        take_t t = {.to = m->from, .host = host};
        rt_offline_take(s->accounts, host, user, UINT32_MAX, send_kept, &t);
        break;
    }
    }
    if (reads && !s->snapshot_timed) /* no timer: the snapshot ends with the request */
        rt_accounts_snapshot_end(s->accounts);
}

static void store_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)reason;
    store_t *s = state;
    rt_accounts_close(s->accounts);
    s->accounts = NULL;
}

/* A request the store never took: a session waiting for it is told (and fails its login). */
static void store_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag != C2S_MSG_STORE_REQ || m->len < sizeof(c2s_req_t))
        return;
    const c2s_req_t *r = (const void *)m->data;
    if (r->op == C2S_OP_CRED || r->op == C2S_OP_PLAIN || r->op == C2S_OP_EXTERNAL)
        reply(m->from, &(c2s_reply_t){.op = r->op, .seq = r->seq, .rc = RT_EAGAIN});
    else if (C2S_OP_IS_REGISTER(r->op) &&
             sizeof(c2s_req_t) + (size_t)r->host_len + r->user_len + r->data_len <= m->len)
        rt__c2s_store_register_lost(m->from, r);
}

static const rt_actor_type_t store_type = {
    .name = "xmpp_store",
    .state_size = sizeof(store_t),
    .init = store_init,
    .handle = store_handle,
    .terminate = store_terminate,
    .dead_letter = store_dead_letter,
    .flags = RT_TYPE_BLOCKING,
};

int rt__c2s_store_start(rt_pid_t sup, const rt_conf_t *conf, char *err, size_t errlen)
{
    const char *data_dir = conf->data_dir;
    snprintf(store_dir, sizeof(store_dir), "%s", data_dir);
    rt_pid_t group;
    rt_child_spec_t c = {.name = RT_C2S_STORE_NAME, .type = &store_type, .restart = RT_PERMANENT};
    int rc = rt_group_start(sup, RT_C2S_GROUP, RT_PERMANENT, &group);
    if (!rc)
        rc = rt_supervisor_start_child(group, &c, NULL);
    if (!rc) /* after the store: the file is made or migrated by then */
        rc = rt__c2s_archive_start(group, data_dir);
    if (rc) {
        snprintf(err, errlen, "cannot start the XMPP account store (%s/%s): %s", data_dir,
                 RT_ACCOUNTS_FILE, rt_strerror(rc));
        return rc;
    }
    rc = rt__c2s_muc_start(group, data_dir, err, errlen);
    if (!rc)
        rc = rt__c2s_upload_start(group, conf, err, errlen);
    if (!rc && (rc = rt__c2s_s2s_resolver_start(group)) != 0)
        snprintf(err, errlen, "cannot start federation's resolver: %s", rt_strerror(rc));
    if (!rc)
        rc = rt__c2s_cluster_start(group, err, errlen);
    return rc;
}
