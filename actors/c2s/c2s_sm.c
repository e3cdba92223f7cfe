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
** same account's. In a cluster the id names the node too ("PID-TOKEN-NODE"), and a client that
** resumes through another node takes its session there: the old actor sends its state (the
** resource, presence, roster, blocklist, directed presence, the counts and what the client
** never acknowledged) to the new connection's actor, which binds the resource, replacing the
** old binding, and goes on as the session; the old actor forwards what still reaches it
** until that binding replaces it, then ends saying nothing (its presence lives on there).
** A session moved so has its new node's id, which the client does not learn (<resumed/> names
** the id it resumed): its next resumption through another node than the new one fails into a
** bind, which gets what the session held (rt__c2s_sm_unacked).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "broker.h"
#include "c2s_impl.h"
#include "cluster.h"
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
    rt_pid_t moved_to; /* its state went to that session on another node, which goes on as it */
    bool moved_done;   /* and that one's binding replaced it: it ends saying nothing */
};

/* The message a resuming connection's actor asks with. */
typedef struct sm_ask_s {
    char token[C2S_SM_TOKEN + 1];
    uint16_t bare_len;
    char bare[RT_JID_TEXT_MAX + 1];
    char node[RT_CONF_NODE_MAX]; /* another node's asker: its node and pid there ("": m->from) */
    uint64_t asker;
    uint32_t cookie;
} sm_ask_t;

/* "PID-TOKEN", and "-NODE" in a cluster. */
static void put_id(rt_buf_t *b, rt_pid_t pid, const char *token)
{
    rt_buf_printf(b, "%llx-%s", (unsigned long long)pid, token);
    if (rt__c2s_cluster_on())
        rt_buf_printf(b, "-%s", rt_cluster_node());
}

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
            rt_buf_printf(out, " id='");
            put_id(out, rt_self(self), c->sm->token);
            rt_buf_printf(out, "' resume='true' max='%ld'", rt__c2s.conf->resume_timeout);
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

/* previd "PID-TOKEN[-NODE]": the pid, the token into token, the node ("": none) into node;
   false if it is not that shape. */
static bool parse_id(const char *id, rt_pid_t *pid, char *token, char *node)
{
    char *end;
    unsigned long long v = strtoull(id, &end, 16);
    if (end == id || *end != '-' || strlen(end + 1) < C2S_SM_TOKEN || !v)
        return false;
    const char *rest = end + 1 + C2S_SM_TOKEN;
    if (*rest && (*rest != '-' || !rest[1] || strlen(rest + 1) >= RT_CONF_NODE_MAX))
        return false;
    *pid = (rt_pid_t)v;
    memcpy(token, end + 1, C2S_SM_TOKEN);
    token[C2S_SM_TOKEN] = 0;
    snprintf(node, RT_CONF_NODE_MAX, "%s", *rest ? rest + 1 : "");
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
static bool ask_resume(c2s_t *c, const char *previd, const char *h, bool here_only)
{
    sm_ask_t ask = {0};
    rt_pid_t old;
    char *end = NULL, node[RT_CONF_NODE_MAX];
    unsigned long hv = h ? strtoul(h, &end, 10) : 0;
    if (!previd || !h || *end || !parse_id(previd, &old, ask.token, node))
        return false;
    if (node[0] && strcmp(node, rt_cluster_node()) != 0) { /* held by another node */
        if (here_only || !(old = rt__c2s_pid_at(node, old)) || !rt__c2s_pid_node(old))
            return false;
        snprintf(ask.node, sizeof(ask.node), "%s", rt_cluster_node());
        ask.asker = rt__c2s_current_pid();
        if (rt_random(&ask.cookie, sizeof(ask.cookie)) != 0)
            return false;
        c->resume_cookie = ask.cookie;
    }
    ask.bare_len = (uint16_t)rt_jid_bare_len(c->jid);
    memcpy(ask.bare, c->jid->s, ask.bare_len);
    c->resume_h = (uint32_t)hv;
    c->resume_pid = old;
    if (rt__c2s_send(old, C2S_MSG_SM_ASK, &ask, sizeof(ask)) != 0) {
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
    if (c->phase != PH_BIND ||
        !ask_resume(c, rt_xml_attr(el, "previd"), rt_xml_attr(el, "h"), false)) {
        resume_failed(c, "item-not-found");
        return 0;
    }
    return RT_XML_STOP;
}

/* SASL2's inline resumption wraps <resumed/> in its <success/>, which a session moving from
   another node does not do: there, the client binds (Bind2) and gets what the old one held. */
bool rt__c2s_sm_resume_inline(c2s_t *c, const char *previd, const char *h)
{
    return !c->anonymous && ask_resume(c, previd, h, true);
}

void rt__c2s_sm_put_failed(rt_buf_t *b, const char *cond)
{
    rt_buf_printf(b, "<failed xmlns='%s'><%s xmlns='%s'/></failed>", NS_SM, cond,
                  RT_XML_NS_STANZA_ERRORS);
}

static void state_out(rt_actor_t *self, c2s_t *c, rt_pid_t to, uint32_t cookie);

/* The old session's side of the question: yes only for its own token and account. */
void rt__c2s_sm_asked(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    const sm_ask_t *a = (const void *)m->data;
    bool yes = m->len == sizeof(*a) && c->sm && c->sm->resumable && !c->sm->promised &&
               !c->sm->moved_to && c->phase == PH_ACTIVE && !c->closing &&
               CRYPTO_memcmp(a->token, c->sm->token, C2S_SM_TOKEN) == 0 &&
               a->bare_len == rt_jid_bare_len(c->jid) &&
               memcmp(a->bare, c->jid->s, a->bare_len) == 0;
    if (m->len == sizeof(*a) && a->node[0]) { /* from another node: the state goes there */
        char node[RT_CONF_NODE_MAX];
        snprintf(node, sizeof(node), "%.*s", RT_CONF_NODE_MAX - 1, a->node);
        rt_pid_t asker = rt__c2s_pid_at(node, (rt_pid_t)a->asker);
        if (!asker || !rt__c2s_pid_node(asker))
            return;
        if (yes) {
            state_out(self, c, asker, a->cookie);
            return;
        }
        uint8_t no[5] = {0};
        memcpy(no + 1, &a->cookie, 4);
        rt__c2s_send(asker, C2S_MSG_SM_ANSWER, no, sizeof(no));
        return;
    }
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
    if (!c->waiting || !c->resume_pid)
        return;
    if (rt__c2s_pid_node(c->resume_pid) ? m->len != 5 || memcmp(m->data + 1, &c->resume_cookie, 4)
                                        : m->from != c->resume_pid)
        return; /* another node's answer is its no, naming the question */
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
    rt_sock_low_at_hangup(c->sock);
    /* Lost, the session went to the low lane (c2s_init); resumed, its traffic goes first. */
    rt_set_priority(self, RT_PRIORITY_NORMAL);
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
    rt_buf_printf(&b, "<resumed xmlns='%s' h='%u' previd='", NS_SM, c->sm->h_in);
    put_id(&b, rt_self(self), c->sm->token);
    rt_buf_printf(&b, "'/>");
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

/* ---- Moving to another node ---- */

enum {
    MV_AVAILABLE = 1,
    MV_CARBONS = 2,
    MV_INACTIVE = 4,
    MV_INTERESTED = 8,
    MV_ROSTER = 16,
    MV_BLOCKLIST = 32,
    MV_BLOCK_INTERESTED = 64,
    MV_SESSION = 128
};

/*
** Yes to another node's asker: this session's state goes to it (C2S_MSG_SM_STATE: the
** question's cookie, this session's id, then what rt__c2s_sm_moved_in reads), and from now on
** what reaches this actor goes there too. The queue stays until the new binding replaces this
** one: if none does (the new node failed), the session expires here as if never asked.
*/
static void state_out(rt_actor_t *self, c2s_t *c, rt_pid_t to, uint32_t cookie)
{
    c2s_sm_t *sm = c->sm;
    c2s_route_t own = {0};
    rt__c2s_reg_lookup(c->jid->s, rt_jid_bare_len(c->jid), rt_jid_resource(c->jid),
                       c->jid->resource, &own, 1);
    rt_buf_t b = {0}, id = {0};
    rt_buf_put_uint(&b, cookie, 4);
    put_id(&id, rt_self(self), sm->token);
    rt_buf_put_bytes(&b, id.data, id.len);
    rt_buf_free(&id);
    rt_buf_put_bytes(&b, rt_jid_resource(c->jid), c->jid->resource);
    rt_buf_put_uint(&b,
                    (c->available ? MV_AVAILABLE : 0) | (own.carbons ? MV_CARBONS : 0) |
                        (c->inactive ? MV_INACTIVE : 0) | (c->interested ? MV_INTERESTED : 0) |
                        (c->roster_loaded ? MV_ROSTER : 0) | (c->block_loaded ? MV_BLOCKLIST : 0) |
                        (c->block_interested ? MV_BLOCK_INTERESTED : 0) |
                        (c->session ? MV_SESSION : 0),
                    1);
    rt_buf_put_uint(&b, (uint8_t)c->priority, 1);
    rt_buf_put_bytes(&b, c->pres, c->pres_len);
    rt_buf_put_bytes(&b, c->roster, c->roster_len);
    rt_buf_put_bytes(&b, c->blocked, c->blocked_len);
    rt_buf_put_bytes(&b, c->directed, c->directed_len);
    rt_buf_put_bytes(&b, c->held_out, c->held_out_len);
    rt_buf_put_uint(&b, c->held_out_count, 4);
    rt_buf_put_uint(&b, sm->h_in, 4);
    rt_buf_put_uint(&b, sm->h_out, 4);
    rt_buf_put_uint(&b, sm->acked, 4);
    rt_buf_add(&b, sm->token, C2S_SM_TOKEN);
    rt_buf_put_uint(&b, sm->nq, 4);
    for (uint32_t i = 0; i < sm->nq; i++) {
        rt_buf_put_uint(&b, sm->q[i].len, 4);
        rt_buf_put_uint(&b, sm->q[i].count, 4);
    }
    rt_buf_put_bytes(&b, sm->bytes, sm->qbytes);
    int rc = b.oom ? RT_ENOMEM : rt__c2s_send(to, C2S_MSG_SM_STATE, b.data, b.len);
    rt_buf_free(&b);
    if (rc) { /* too big for the cluster's channel, or none: the client binds instead */
        uint8_t no[5] = {0};
        memcpy(no + 1, &cookie, 4);
        rt__c2s_send(to, C2S_MSG_SM_ANSWER, no, sizeof(no));
        return;
    }
    if (c->sock)
        rt__c2s_sm_detach(self, c);
    sm->moved_to = to;
    char node[RT_CONF_NODE_MAX];
    rt__c2s_cluster_node_name(rt__c2s_pid_node(to), node);
    rt_log(RT_LOG_INFO, "xmpp.session_moving", "jid=%s to=%s queued=%u", c->jid->s, node, sm->nq);
}

/* A copy of n bytes on the session's heap (NULL for none): false when out of memory. */
static bool heap_copy(rt_actor_t *self, const uint8_t *p, size_t n, uint8_t **out)
{
    *out = n ? rt_alloc(self, n, RT_OBJ_LEAF) : NULL;
    if (n && *out)
        memcpy(*out, p, n);
    return !n || *out;
}

/* The moved session's state into this new connection's actor; NULL, or why not. */
static const char *restore(rt_actor_t *self, c2s_t *c, rt_reader_t *r, rt_buf_t *previd)
{
    size_t idlen, rlen, plen, rolen, bllen, dlen, hlen, qbytes;
    const uint8_t *id = rt_reader_bytes(r, &idlen, 128);
    const uint8_t *res = rt_reader_bytes(r, &rlen, RT_JID_PART_MAX);
    uint8_t flags = (uint8_t)rt_reader_uint(r, 1);
    int8_t priority = (int8_t)rt_reader_uint(r, 1);
    const uint8_t *pres = rt_reader_bytes(r, &plen, C2S_SM_QUEUE_BYTES);
    const uint8_t *roster = rt_reader_bytes(r, &rolen, RT_CLUSTER_CHANNEL_MAX);
    const uint8_t *blocked = rt_reader_bytes(r, &bllen, RT_CLUSTER_CHANNEL_MAX);
    const uint8_t *directed = rt_reader_bytes(r, &dlen, RT_CLUSTER_CHANNEL_MAX);
    const uint8_t *held = rt_reader_bytes(r, &hlen, C2S_HELD_OUT_MAX);
    uint32_t held_count = (uint32_t)rt_reader_uint(r, 4);
    uint32_t h_in = (uint32_t)rt_reader_uint(r, 4), h_out = (uint32_t)rt_reader_uint(r, 4),
             acked = (uint32_t)rt_reader_uint(r, 4);
    const uint8_t *token = rt_reader_take(r, C2S_SM_TOKEN);
    uint32_t nq = (uint32_t)rt_reader_uint(r, 4);
    if (r->bad || nq > C2S_SM_QUEUE_MAX)
        return "malformed";
    const uint8_t *entries = rt_reader_take(r, (size_t)nq * 8);
    const uint8_t *queue = rt_reader_bytes(r, &qbytes, C2S_SM_QUEUE_BYTES);
    uint64_t sum = 0;
    rt_reader_t er = {.p = entries, .len = entries ? (size_t)nq * 8 : 0};
    for (uint32_t i = 0; i < nq && !er.bad; i++, rt_reader_uint(&er, 4))
        sum += rt_reader_uint(&er, 4); /* each entry's length, then its count */
    if (r->bad || r->at != r->len || sum != qbytes || !rlen)
        return "malformed";
    rt_buf_add(previd, id, idlen);
    const char *why = rt__c2s_bind_as(self, c, (const char *)res, rlen);
    if (why)
        return why;
    c2s_sm_t *sm = rt_alloc(self, sizeof(*sm), RT_OBJ_SCAN);
    if (!sm || !heap_copy(self, pres, plen, &c->pres) ||
        !heap_copy(self, roster, rolen, &c->roster) ||
        !heap_copy(self, blocked, bllen, &c->blocked) ||
        !heap_copy(self, directed, dlen, &c->directed) ||
        !heap_copy(self, held, hlen, &c->held_out) || !heap_copy(self, queue, qbytes, &sm->bytes))
        return "out of memory";
    sm->q = nq ? rt_alloc(self, nq * sizeof(*sm->q), RT_OBJ_LEAF) : NULL;
    if (nq && !sm->q)
        return "out of memory";
    er.at = 0;
    for (uint32_t i = 0; i < nq; i++)
        sm->q[i] = (sm_entry_t){.len = (uint32_t)rt_reader_uint(&er, 4),
                                .count = (uint32_t)rt_reader_uint(&er, 4)};
    sm->nq = sm->capq = nq;
    sm->qbytes = (uint32_t)qbytes;
    sm->h_in = h_in;
    sm->h_out = h_out;
    sm->acked = acked;
    sm->resumable = true;
    memcpy(sm->token, token, C2S_SM_TOKEN);
    c->sm = sm;
    c->pres_len = (uint32_t)plen;
    c->roster_len = (uint32_t)rolen;
    c->blocked_len = (uint32_t)bllen;
    c->directed_len = (uint32_t)dlen;
    c->held_out_len = (uint32_t)hlen;
    c->held_out_count = held_count;
    c->available = flags & MV_AVAILABLE;
    c->priority = priority;
    c->inactive = flags & MV_INACTIVE;
    c->interested = flags & MV_INTERESTED;
    c->roster_loaded = flags & MV_ROSTER;
    c->block_loaded = flags & MV_BLOCKLIST;
    c->block_interested = flags & MV_BLOCK_INTERESTED;
    c->session = flags & MV_SESSION;
    size_t blen = rt_jid_bare_len(c->jid);
    rt__c2s_reg_presence(c->jid->s, blen, rt_jid_resource(c->jid), c->jid->resource, rt_self(self),
                         c->available, c->priority);
    if (flags & MV_CARBONS)
        rt__c2s_reg_carbons(c->jid->s, blen, rt_jid_resource(c->jid), c->jid->resource,
                            rt_self(self), true);
    return NULL;
}

void rt__c2s_sm_moved_in(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    rt_reader_t r = {.p = m->data, .len = m->len};
    if (!c->waiting || !rt__c2s_pid_node(c->resume_pid) || c->phase != PH_BIND ||
        (uint32_t)rt_reader_uint(&r, 4) != c->resume_cookie || r.bad)
        return;
    c->waiting = false;
    c->resume_pid = 0;
    rt_buf_t previd = {0};
    const char *why = restore(self, c, &r, &previd);
    if (why) {
        rt_log(RT_LOG_WARNING, "xmpp.session_move_failed", "jid=%s reason=%s", c->jid->s, why);
        rt_buf_free(&previd);
        if (c->phase == PH_ACTIVE) { /* bound, then out of memory: as any failing session */
            rt__c2s_stream_error(self, c, RT_XML_COND_RESOURCE_CONSTRAINT, NULL);
            return;
        }
        resume_failed(c, "item-not-found"); /* parsing goes on: the client binds instead */
        return;
    }
    queue_ack(self, c->sm, c->resume_h);
    rt_buf_t b = {0};
    rt_buf_printf(&b, "<resumed xmlns='%s' h='%u'", NS_SM, c->sm->h_in);
    rt_xml_put_attr_len(&b, "previd", previd.data ? previd.data : "", previd.len);
    rt_buf_printf(&b, "/>");
    rt_buf_free(&previd);
    rt__c2s_write_buf(c, &b);
    if (c->sm->qbytes) /* what the client never acknowledged, again, in order */
        rt__c2s_write(c, c->sm->bytes, c->sm->qbytes);
    rt_log(RT_LOG_INFO, "xmpp.session_resumed", "peer=%s jid=%s resent=%u moved=true",
           rt__c2s_peer(self, c), c->jid->s, c->sm->nq);
}

bool rt__c2s_sm_forward(rt_actor_t *self, c2s_t *c, rt_msg_t *m)
{
    c2s_sm_t *sm = c->sm;
    if (!sm || !sm->moved_to)
        return false;
    switch (m->tag) {
    case C2S_MSG_STANZA:
    case C2S_MSG_PROBE:
    case C2S_MSG_PRESENCE_TO:
        if (rt__c2s_send(sm->moved_to, m->tag, m->data, m->len) != 0 && m->tag == C2S_MSG_STANZA)
            rt__c2s_orphan(m, rt_self(self));
        return true;
    case C2S_MSG_REPLACED: /* the new session's binding: it goes on as this one */
        sm->moved_done = true;
        queue_ack(self, sm, sm->h_out);
        c->closing = true;
        return true;
    default:
        return false;
    }
}

bool rt__c2s_sm_moved_away(const c2s_t *c)
{
    return c->sm && c->sm->moved_done;
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
