/*
** Stream management (XEP-0198 v1.6, urn:xmpp:sm:3): acknowledgements both ways and resumption.
**
** A session that enabled it counts the stanzas it receives (h_in, answered to <r/>) and keeps
** each stanza it writes until the client acknowledges it (<a h=.../>). When its connection
** drops without the stream's close, a resumable session stays in its actor, detached, as an
** MQTT persistent session does: bound, available to its contacts, collecting what is sent to
** it in the same queue, for xmpp.resume_timeout. A client that logs in again on a new connection
** and sends <resume previd=.../> gets its session back: the new connection's actor asks the
** old one (C2S_MSG_SM_ASK, which says yes or no and, on yes, waits for the socket), then hands
** it the socket with its transport (C2S_MSG_SM_SOCKET, owned by the message until taken), and
** the old actor answers <resumed/> and writes again what the client did not acknowledge. A
** session whose time runs out puts the messages it still holds into its user's offline store
** (XEP-0160), so nothing accepted for it is lost, then ends as any session does.
**
** The resumption id is the actor's pid and a random token: the pid finds the session, the
** token (compared in constant time) proves the client was given it, and the login must be the
** same account's.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "broker.h"
#include "c2s_impl.h"
#include "log.h"

#define NS_SM "urn:xmpp:sm:3"
#define C2S_SM_QUEUE_MAX 1000      /* unacknowledged stanzas; more ends the stream */
#define C2S_SM_QUEUE_BYTES (4u << 20)
#define C2S_SM_REQUEST_EVERY 8     /* an <r/> after this many unacknowledged stanzas */
#define C2S_SM_TOKEN 16            /* hex characters of the token */

typedef struct sm_entry_s {
    uint32_t len;
    uint32_t count; /* stanzas in it (presence held while inactive goes out together) */
} sm_entry_t;

struct c2s_sm_s {
    uint32_t h_in, h_out, acked;
    uint32_t nq, capq;   /* entries queued */
    uint32_t qbytes;     /* bytes queued */
    bool resumable;
    bool detached;
    bool promised; /* said yes to a resume: the socket is on its way */
    char token[C2S_SM_TOKEN + 1];
    sm_entry_t *q;  /* leaf */
    uint8_t *bytes; /* leaf: the entries' bytes, one after another */
};

/* The message a resuming connection's actor asks with. */
typedef struct sm_ask_s {
    char token[C2S_SM_TOKEN + 1];
    uint16_t bare_len;
    char bare[RT_JID_TEXT_MAX + 1];
} sm_ask_t;

/* The socket's hand-over: rt_msg_owned_t (the transport), then this. */
typedef struct sm_socket_s {
    uint32_t h; /* what the client says it handled */
    uint8_t listener;
    uint32_t head_len;   /* SASL2 (XEP-0388): the start of its <success/>, which the */
    uint32_t unread_len; /* resumed session ends; then the bytes read after <resume/> */
    uint8_t bytes[];
} sm_socket_t;

bool rt__c2s_sm_on(const c2s_t *c)
{
    return c->sm != NULL;
}

bool rt__c2s_sm_detached(const c2s_t *c)
{
    return c->sm && c->sm->detached;
}

static void write_nonza(c2s_t *c, const char *fmt, uint32_t v)
{
    char buf[128];
    int n = snprintf(buf, sizeof(buf), fmt, NS_SM, v);
    rt__c2s_write(c, buf, (size_t)n);
}

static bool queue_add(rt_actor_t *self, c2s_t *c, const void *p, size_t n, uint32_t count)
{
    c2s_sm_t *sm = c->sm;
    if (sm->nq >= C2S_SM_QUEUE_MAX || sm->qbytes + n > C2S_SM_QUEUE_BYTES)
        return false;
    if (sm->nq == sm->capq) {
        uint32_t cap = sm->capq ? sm->capq * 2 : 8;
        sm_entry_t *q = rt_realloc(self, sm->q, cap * sizeof(*q), RT_OBJ_LEAF);
        if (!q)
            return false;
        sm->q = q;
        sm->capq = cap;
    }
    uint8_t *b = rt_realloc(self, sm->bytes, sm->qbytes + n, RT_OBJ_LEAF);
    if (!b)
        return false;
    memcpy(b + sm->qbytes, p, n);
    sm->bytes = b;
    sm->qbytes += (uint32_t)n;
    sm->q[sm->nq++] = (sm_entry_t){.len = (uint32_t)n, .count = count};
    return true;
}

/* Drops the entries the client acknowledged with h. */
static void queue_ack(rt_actor_t *self, c2s_sm_t *sm, uint32_t h)
{
    uint32_t done = 0, bytes = 0, upto = sm->acked;
    while (done < sm->nq && (uint32_t)(h - upto) >= sm->q[done].count) {
        upto += sm->q[done].count;
        bytes += sm->q[done].len;
        done++;
    }
    if (!done)
        return;
    sm->acked = upto;
    memmove(sm->q, sm->q + done, (sm->nq - done) * sizeof(*sm->q));
    sm->nq -= done;
    memmove(sm->bytes, sm->bytes + bytes, sm->qbytes - bytes);
    sm->qbytes -= bytes;
    if (!sm->qbytes) {
        rt_free(self, sm->bytes);
        sm->bytes = NULL;
    }
}

void rt__c2s_write_stanzas(rt_actor_t *self, c2s_t *c, const void *p, size_t n, uint32_t count)
{
    c2s_sm_t *sm = c->sm;
    if (sm) {
        if (!queue_add(self, c, p, n, count)) {
            rt__c2s_stream_error(self, c, RT_XML_COND_POLICY_VIOLATION,
                                 "too many unacknowledged stanzas");
            return;
        }
        sm->h_out += count;
    }
    rt__c2s_write(c, p, n);
    if (sm && !sm->detached && sm->nq % C2S_SM_REQUEST_EVERY == 0)
        rt__c2s_write(c, "<r xmlns='" NS_SM "'/>", sizeof("<r xmlns='" NS_SM "'/>") - 1);
}

void rt__c2s_write_stanza_buf(rt_actor_t *self, c2s_t *c, rt_buf_t *b)
{
    if (b->oom)
        c->closing = true;
    else
        rt__c2s_write_stanzas(self, c, b->data, b->len, 1);
    rt_buf_free(b);
}

void rt__c2s_sm_count_in(c2s_t *c)
{
    if (c->sm)
        c->sm->h_in++;
}

int rt__c2s_sm_enable(rt_actor_t *self, c2s_t *c, bool resume, rt_buf_t *out)
{
    if (c->sm || c->phase != PH_ACTIVE) {
        rt_buf_printf(out, "<failed xmlns='%s'><unexpected-request xmlns='%s'/></failed>", NS_SM,
                      RT_XML_NS_STANZA_ERRORS);
        return 0;
    }
    c->sm = rt_alloc(self, sizeof(*c->sm), RT_OBJ_SCAN);
    if (!c->sm)
        return RT_ENOMEM;
    c->sm->resumable = resume && !c->anonymous && rt__c2s.conf->resume_timeout > 0;
    rt_buf_printf(out, "<enabled xmlns='%s'", NS_SM);
    if (c->sm->resumable) {
        uint8_t t[C2S_SM_TOKEN / 2];
        if (RAND_bytes(t, sizeof(t)) != 1) {
            c->sm->resumable = false;
        } else {
            for (size_t i = 0; i < sizeof(t); i++)
                snprintf(c->sm->token + 2 * i, 3, "%02x", t[i]);
            rt_buf_printf(out, " id='%llx-%s' resume='true' max='%ld'",
                          (unsigned long long)rt_self(self), c->sm->token,
                          rt__c2s.conf->resume_timeout);
        }
    }
    rt_buf_printf(out, "/>");
    return 0;
}

static void enable(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el)
{
    const char *r = rt_xml_attr(el, "resume");
    rt_buf_t b = {0};
    if (rt__c2s_sm_enable(self, c, r && (strcmp(r, "true") == 0 || strcmp(r, "1") == 0), &b) != 0) {
        rt_buf_free(&b);
        rt__c2s_stream_error(self, c, RT_XML_COND_RESOURCE_CONSTRAINT, NULL);
        return;
    }
    rt__c2s_write_buf(c, &b);
}

/* previd "PID-TOKEN": the pid, and the token into token; false if it is not that shape. */
static bool parse_id(const char *id, rt_pid_t *pid, char *token)
{
    char *end;
    unsigned long long v = strtoull(id, &end, 16);
    if (end == id || *end != '-' || strlen(end + 1) != C2S_SM_TOKEN || !v)
        return false;
    *pid = (rt_pid_t)v;
    memcpy(token, end + 1, C2S_SM_TOKEN + 1);
    return true;
}

static void resume_failed(c2s_t *c, const char *cond)
{
    rt_buf_t b = {0};
    rt__c2s_sm_put_failed(&b, cond);
    rt__c2s_write_buf(c, &b);
}

/* Asks the session previd names to take this connection (h: what the client handled): true
   when asked, and the answer comes as C2S_MSG_SM_ANSWER (parsing waits). */
static bool ask_resume(c2s_t *c, const char *previd, const char *h)
{
    sm_ask_t ask = {0};
    rt_pid_t old;
    char *end = NULL;
    unsigned long hv = h ? strtoul(h, &end, 10) : 0;
    if (!previd || !h || *end || !parse_id(previd, &old, ask.token))
        return false;
    ask.bare_len = (uint16_t)rt_jid_bare_len(c->jid);
    memcpy(ask.bare, c->jid->s, ask.bare_len);
    c->resume_h = (uint32_t)hv;
    c->resume_pid = old;
    if (rt_send(old, C2S_MSG_SM_ASK, &ask, sizeof(ask)) != 0) {
        c->resume_pid = 0;
        return false;
    }
    rt__c2s_wait(c);
    return true;
}

/* The new connection's side: <resume/> after SASL, in place of a bind. */
static int resume(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el)
{
    (void)self;
    if (c->phase != PH_BIND || !ask_resume(c, rt_xml_attr(el, "previd"), rt_xml_attr(el, "h"))) {
        resume_failed(c, "item-not-found");
        return 0;
    }
    return RT_XML_STOP;
}

bool rt__c2s_sm_resume_inline(c2s_t *c, const char *previd, const char *h)
{
    return !c->anonymous && ask_resume(c, previd, h);
}

void rt__c2s_sm_put_failed(rt_buf_t *b, const char *cond)
{
    rt_buf_printf(b, "<failed xmlns='%s'><%s xmlns='%s'/></failed>", NS_SM, cond,
                  RT_XML_NS_STANZA_ERRORS);
}

/* The old session's side of the question: yes only for its own token and account. */
void rt__c2s_sm_asked(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    const sm_ask_t *a = (const void *)m->data;
    bool yes = m->len == sizeof(*a) && c->sm && c->sm->resumable && !c->sm->promised &&
               c->phase == PH_ACTIVE && !c->closing &&
               CRYPTO_memcmp(a->token, c->sm->token, C2S_SM_TOKEN) == 0 &&
               a->bare_len == rt_jid_bare_len(c->jid) &&
               memcmp(a->bare, c->jid->s, a->bare_len) == 0;
    uint8_t answer = yes;
    if (yes) {
        c->sm->promised = true;
        if (c->sock) /* the client came back before its old connection was seen to drop */
            rt__c2s_sm_detach(self, c);
    }
    rt_send(m->from, C2S_MSG_SM_ANSWER, &answer, 1);
}

/* The new connection's actor got its answer: the socket goes, or the session starts here. */
void rt__c2s_sm_answered(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    if (!c->waiting || !c->resume_pid || m->from != c->resume_pid)
        return;
    c->waiting = false;
    if (m->len != 1 || !m->data[0]) {
        c->resume_pid = 0;
        if (c->sasl2)
            rt__c2s_sasl2_finish(self, c, "item-not-found");
        else
            resume_failed(c, "item-not-found");
        return; /* parsing goes on: the client binds instead */
    }
    rt_xport_flush(c->xp);
    int fd = c->sock ? rt_sock_detach(c->sock) : -1;
    if (fd < 0) {
        rt_exit(self, RT_REASON_NORMAL); /* the old session times out; the client retries */
        return;
    }
    rt__broker_count_socket(RT_CONF_XMPP_LISTENER(c->listener), -1);
    c->sock = NULL;
    size_t head = rt__c2s_sasl2_head(c, NULL), extra = head + c->held_len;
    rt_msg_t *out = rt_msg_new_fd(C2S_MSG_SM_SOCKET, fd,
                                  sizeof(rt_msg_owned_t) + sizeof(sm_socket_t) + extra);
    if (!out) {
        close(fd);
        rt_exit(self, RT_REASON_NORMAL);
        return;
    }
    memset(out->data, 0, sizeof(rt_msg_owned_t));
    if (c->xp)
        rt_msg_own(out, c->xp, rt_xport_free);
    c->xp = NULL;
    sm_socket_t *s = (sm_socket_t *)(void *)(out->data + sizeof(rt_msg_owned_t));
    s->h = c->resume_h;
    s->listener = c->listener;
    s->head_len = (uint32_t)head;
    s->unread_len = (uint32_t)c->held_len;
    rt__c2s_sasl2_head(c, s->bytes);
    if (c->held_len)
        memcpy(s->bytes + head, c->held, c->held_len);
    rt_send_msg(c->resume_pid, out);
    c->closing = true;
    rt_exit(self, RT_REASON_NORMAL);
}

/* The socket came: the session goes on over it. */
int rt__c2s_sm_take_socket(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    const sm_socket_t *s = (const void *)(m->data + sizeof(rt_msg_owned_t));
    if (!c->sm || !c->sm->promised || c->sock ||
        m->len < sizeof(rt_msg_owned_t) + sizeof(sm_socket_t) ||
        m->len - sizeof(rt_msg_owned_t) - sizeof(sm_socket_t) !=
            (size_t)s->head_len + s->unread_len)
        return RT_EINVAL; /* the message closes the fd and frees the transport */
    int fd = rt_msg_take_fd(m);
    rt_xport_t *xp = rt_msg_take_owned(m);
    if (rt_sock_adopt(self, fd, &c->sock) != 0) {
        close(fd);
        rt_xport_free(xp);
        return RT_ENOMEM;
    }
    c->xp = xp;
    rt_xport_adopt(xp, c->sock);
    c->listener = s->listener;
    rt__broker_count_socket(RT_CONF_XMPP_LISTENER(c->listener), +1);
    c->sm->detached = false;
    c->sm->promised = false;
    c->last_rx_ms = rt_mono_ms();
    c->pinged = false;
    int rc = rt__c2s_stream_reopen(self, c);
    if (rc)
        return rc;
    queue_ack(self, c->sm, s->h);
    rt_buf_t b = {0};
    if (s->head_len) { /* inside SASL2's <success/>, after whom it authorized */
        rt_buf_add(&b, s->bytes, s->head_len);
        rt_buf_printf(&b, "<authorization-identifier>");
        rt_xml_put_text(&b, c->jid->s, rt_jid_len(c->jid));
        rt_buf_printf(&b, "</authorization-identifier>");
    }
    rt_buf_printf(&b, "<resumed xmlns='%s' h='%u' previd='%llx-%s'/>", NS_SM, c->sm->h_in,
                  (unsigned long long)rt_self(self), c->sm->token);
    if (s->head_len) {
        rt_buf_printf(&b, "</success>");
        rt__c2s_bound_features(&b, c);
    }
    rt__c2s_write_buf(c, &b);
    if (c->sm->qbytes) /* what the client never acknowledged, again, in order */
        rt__c2s_write(c, c->sm->bytes, c->sm->qbytes);
    rt_log(RT_LOG_INFO, "xmpp.session_resumed", "peer=%s jid=%s resent=%u",
           rt__c2s_peer(self, c), c->jid->s, c->sm->nq);
    rt__c2s_idle_arm(self, c);
    if (s->unread_len)
        rt__c2s_feed_more(self, c, s->bytes + s->head_len, s->unread_len);
    return 0;
}

bool rt__c2s_sm_detach(rt_actor_t *self, c2s_t *c)
{
    if (!c->sm || !c->sm->resumable || c->phase != PH_ACTIVE)
        return false;
    rt__c2s_close_socket(c);
    rt_xml_stream_reset(&c->xs);
    rt_free(self, c->held);
    c->held = NULL;
    c->held_len = 0;
    c->waiting = false;
    if (!c->sm->detached) {
        c->sm->detached = true;
        rt_send_after_tag((uint64_t)rt__c2s.conf->resume_timeout * 1000, rt_self(self),
                          C2S_MSG_SM_TIMEOUT, NULL);
        rt_log(RT_LOG_INFO, "xmpp.session_detached", "jid=%s queued=%u resume_s=%ld", c->jid->s,
               c->sm->nq, rt__c2s.conf->resume_timeout);
    }
    return true;
}

/* Still detached when its time ran out: the session ends (rt__c2s_sm_unacked then). */
void rt__c2s_sm_timeout(rt_actor_t *self, c2s_t *c)
{
    (void)self;
    if (!c->sm || !c->sm->detached || c->sock || c->sm->promised)
        return;
    rt_log(RT_LOG_INFO, "xmpp.session_expired", "jid=%s queued=%u", c->jid->s, c->sm->nq);
    c->closing = true;
}

/*
** A session ending without a resumption (its time ran out detached, a new session took its
** resource, here or on another node, the client closed): what it was sent and the client never
** acknowledged goes on as what is sent to a resource that is gone (XEP-0198 5, RFC 6121
** 8.5.3.2.1): a message to the account's other available resources, else to its offline
** store; an iq request is answered with an error. Nothing accepted for the session is lost
** with it. Called while it is still bound (its own entry is left out).
*/
void rt__c2s_sm_unacked(rt_actor_t *self, c2s_t *c)
{
    if (!c->sm || !c->sm->nq)
        return;
    static const char message[] = "<message", iq[] = "<iq ";
    size_t at = 0, rerouted = 0;
    for (uint32_t i = 0; i < c->sm->nq; i++) {
        const uint8_t *p = c->sm->bytes + at;
        uint32_t len = c->sm->q[i].len;
        at += len;
        if (len > sizeof(iq) && memcmp(p, iq, sizeof(iq) - 1) == 0) {
            rt__c2s_iq_unanswered(p, len);
        } else if (len > sizeof(message) && memcmp(p, message, sizeof(message) - 1) == 0) {
            rt__c2s_message_rerouted(p, len, rt_self(self), 0);
            rerouted++;
        }
    }
    rt_log(RT_LOG_INFO, "xmpp.unacked_rerouted", "jid=%s messages=%zu", c->jid->s, rerouted);
    queue_ack(self, c->sm, c->sm->h_out);
}

int rt__c2s_sm_nonza(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el)
{
    if (strcmp(el->name, "enable") == 0) {
        enable(self, c, el);
        return 0;
    }
    if (strcmp(el->name, "resume") == 0)
        return resume(self, c, el);
    if (!c->sm) {
        rt__c2s_stream_error(self, c, RT_XML_COND_UNSUPPORTED_STANZA_TYPE,
                             "stream management is not enabled");
        return RT_XML_STOP;
    }
    if (strcmp(el->name, "r") == 0) {
        write_nonza(c, "<a xmlns='%s' h='%u'/>", c->sm->h_in);
        return 0;
    }
    if (strcmp(el->name, "a") == 0) {
        const char *h = rt_xml_attr(el, "h");
        char *end = NULL;
        unsigned long v = h ? strtoul(h, &end, 10) : 0;
        if (!h || *end || (uint32_t)((uint32_t)v - c->sm->acked) > c->sm->h_out - c->sm->acked) {
            rt__c2s_stream_error(self, c, RT_XML_COND_UNDEFINED_CONDITION,
                                 "handled-count-too-high");
            return RT_XML_STOP;
        }
        queue_ack(self, c->sm, (uint32_t)v);
        return 0;
    }
    rt__c2s_stream_error(self, c, RT_XML_COND_UNSUPPORTED_STANZA_TYPE, NULL);
    return RT_XML_STOP;
}
