/*
** XMPP across the cluster (docs/CLUSTER.md, "XMPP"). Every node knows every bound resource of
** the cluster, as ejabberd's session table is on every node: a sender's node applies RFC
** 6121's rules over all of an account's resources at once (the highest priority, the offline
** store when none is available, service-unavailable for a resource that is not there) and
** sends each stanza straight to the node of the session that takes it. Routing by interest
** alone (a node subscribed for the JIDs it holds) could not tell a sender that no node holds
** a JID without a round trip for every stanza.
**
** What the nodes say to one another, on the cluster's channel (cluster.h), each message
** starting with its kind and the sender's incarnation (a random number of its run):
**   SYNC     "tell me every binding of yours": answered with a BIND each and SYNCED
**   BIND     a binding made or changed (priority, availability, carbons), and whom it replaced
**   UNBIND   a binding gone
**   DELIVER  a tag and its bytes for one of the receiver's sessions (rt__c2s_send)
**   CALL     a session's message for the home node's store, archive or rooms (below)
** A node hears of a new node (or a new run of one, a new incarnation) by its heartbeat or its
** first message: it drops what it held of that node and asks it for its bindings. A node not
** heard from for RT_CLUSTER_SILENT_MS is taken as gone, and its bindings are dropped: its
** sessions ended with it (kill -9, a cut link). This actor, xmpp_cluster, applies all of it
** and is charged the other nodes' bindings.
**
** With xmpp.cluster_home, one node (the home) keeps xmpp.db (accounts, rosters, offline
** messages, the archive, PEP) and the rooms for all: the others send their sessions' requests
** there (CALL). On the home node each calling session has a proxy, an actor of its own that
** stands for it there (Erlang's remote pid from the other side): the store, the archive and
** the rooms answer the proxy, monitor it and count it as they would a session here, and it
** sends all they send it on to its session. A proxy ends with its session's binding (or after
** PROXY_IDLE_MS without one: a login that never bound) and when its node goes.
*/
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c2s_impl.h"
#include "cluster.h"
#include "log.h"

#define C2S_MSG_CLUSTER_TICK (RT_C2S_MSG_BASE + 0x50) /* once a second: nodes come and go */
#define C2S_MSG_PROXY_CALL (RT_C2S_MSG_BASE + 0x51)   /* to a proxy: where, tag, the message */
#define C2S_MSG_PROXY_BOUND (RT_C2S_MSG_BASE + 0x52)  /* its session bound a resource */
#define C2S_MSG_PROXY_END (RT_C2S_MSG_BASE + 0x53)    /* its session's binding is gone */
#define C2S_MSG_PROXY_TICK (RT_C2S_MSG_BASE + 0x54)
#define TICK_MS 1000
#define PROXY_IDLE_MS 60000
#define PROXY_NAME_MAX 48
#define PID_LOCAL_MASK (~((rt_pid_t)0xff << C2S_NODE_SHIFT))

enum { K_SYNC = 1, K_BIND, K_UNBIND, K_SYNCED, K_DELIVER, K_CALL };
enum { F_AVAILABLE = 1, F_CARBONS = 2 };

typedef struct {
    char name[RT_CONF_NODE_MAX];
    uint64_t incarnation; /* of its run heard last; 0: none since its bindings were dropped */
    bool synced;          /* its answer to SYNC came whole */
} node_t;

static struct {
    atomic_bool on;
    _Atomic rt_pid_t pid; /* xmpp_cluster's */
    uint64_t incarnation;
    pthread_mutex_t lock; /* nodes' names: read by any sender, written by xmpp_cluster alone */
    node_t nodes[C2S_NODES_MAX + 1]; /* by index; [0] is this node */
    unsigned nnodes;                 /* indices 1..nnodes are in use */
} cl = {.lock = PTHREAD_MUTEX_INITIALIZER};

bool rt__c2s_cluster_on(void)
{
    return atomic_load_explicit(&cl.on, memory_order_acquire);
}

void rt__c2s_cluster_node_name(unsigned node, char out[RT_CONF_NODE_MAX])
{
    if (!node) {
        snprintf(out, RT_CONF_NODE_MAX, "%s", rt_cluster_node());
        return;
    }
    pthread_mutex_lock(&cl.lock);
    snprintf(out, RT_CONF_NODE_MAX, "%s", node <= cl.nnodes ? cl.nodes[node].name : "");
    pthread_mutex_unlock(&cl.lock);
}

/* The index of the node named name, made when new (0 when all are taken: not routed). Only
   xmpp_cluster makes one; a node dropped and not heard from since gives up its index to a new
   name when every index is in use. */
static unsigned node_index(const char *name, bool make)
{
    pthread_mutex_lock(&cl.lock);
    unsigned i = 1, free_at = 0;
    for (; i <= cl.nnodes && strcmp(cl.nodes[i].name, name) != 0; i++)
        if (!free_at && !cl.nodes[i].incarnation)
            free_at = i;
    if (i > cl.nnodes && make) {
        if (cl.nnodes < C2S_NODES_MAX)
            i = ++cl.nnodes;
        else
            i = free_at;
        if (i) {
            cl.nodes[i] = (node_t){0};
            snprintf(cl.nodes[i].name, RT_CONF_NODE_MAX, "%s", name);
        }
    }
    unsigned found = i <= cl.nnodes ? i : 0;
    pthread_mutex_unlock(&cl.lock);
    return found;
}

/* What is known of node i's run (any thread; xmpp_cluster alone writes it, by node_set). */
static uint64_t node_incarnation(unsigned i, bool *synced)
{
    pthread_mutex_lock(&cl.lock);
    uint64_t v = cl.nodes[i].incarnation;
    if (synced)
        *synced = cl.nodes[i].synced;
    pthread_mutex_unlock(&cl.lock);
    return v;
}

static void node_set(unsigned i, uint64_t incarnation, bool synced)
{
    pthread_mutex_lock(&cl.lock);
    cl.nodes[i].incarnation = incarnation;
    cl.nodes[i].synced = synced;
    uint64_t n = 0;
    for (unsigned k = 1; k <= cl.nnodes; k++)
        n += cl.nodes[k].synced;
    pthread_mutex_unlock(&cl.lock);
    atomic_store_explicit(&rt_c2s_stats.cluster_nodes, n, memory_order_relaxed);
}

rt_pid_t rt__c2s_pid_at(const char *node, rt_pid_t pid)
{
    if (pid & ~PID_LOCAL_MASK)
        return 0;
    if (!node[0] || strcmp(node, rt_cluster_node()) == 0)
        return pid;
    unsigned i = rt__c2s_cluster_on() ? node_index(node, false) : 0;
    return i ? pid | (rt_pid_t)i << C2S_NODE_SHIFT : 0;
}

/* ---- The wire: numbers most significant byte first, lengths before strings ---- */

static void put_head(rt_buf_t *b, uint8_t kind)
{
    rt_buf_put_uint(b, kind, 1);
    rt_buf_put_uint(b, cl.incarnation, 8);
}

/* ---- Out ---- */

static int send_to(const char *node, const rt_buf_t *b)
{
    int rc = b->oom ? RT_ENOMEM : rt_cluster_channel_send(node, b->data, b->len);
    atomic_fetch_add_explicit(rc ? &rt_c2s_stats.cluster_not_sent : &rt_c2s_stats.cluster_sent, 1,
                              memory_order_relaxed);
    return rc;
}

/* What a session takes from another node: from its sessions, and from the home node's store
   and rooms through its proxy there. Each is bytes only (no pointer, no pid). */
static bool portable(uint32_t tag)
{
    switch (tag) {
    case C2S_MSG_STANZA:
    case C2S_MSG_PROBE:
    case C2S_MSG_PRESENCE_TO:
    case C2S_MSG_REPLACED:
    case C2S_MSG_STORE_REPLY:
    case C2S_MSG_ROSTER:
    case C2S_MSG_ROSTER_ITEM:
    case C2S_MSG_PRESENCE_READY:
    case C2S_MSG_PRESENCE_STALE:
    case C2S_MSG_BLOCKLIST:
    case C2S_MSG_PEP_EVENT:
    case C2S_MSG_ACCOUNT_GONE:
    case C2S_MSG_SM_ASK:
    case C2S_MSG_SM_ANSWER:
    case C2S_MSG_SM_STATE:
        return true;
    default:
        return false;
    }
}

int rt__c2s_send(rt_pid_t to, uint32_t tag, const void *p, size_t n)
{
    unsigned node = rt__c2s_pid_node(to);
    if (RT_LIKELY(!node))
        return rt_send(to, tag, p, n);
    if (!portable(tag))
        return RT_EINVAL;
    char name[RT_CONF_NODE_MAX];
    rt__c2s_cluster_node_name(node, name);
    if (!name[0])
        return RT_ENOPROC;
    rt_buf_t b = {0};
    put_head(&b, K_DELIVER);
    rt_buf_put_uint(&b, to & PID_LOCAL_MASK, 8);
    rt_buf_put_uint(&b, tag, 4);
    rt_buf_add(&b, p, n);
    int rc = send_to(name, &b);
    rt_buf_free(&b);
    return rc;
}

static void put_binding(rt_buf_t *b, uint8_t kind, const char *bare, size_t bare_len,
                        const char *res, size_t res_len, const c2s_route_t *r, rt_pid_t replaced)
{
    put_head(b, kind);
    rt_buf_put_uint(b, r->pid, 8);
    rt_buf_put_uint(b, (uint8_t)r->priority, 1);
    rt_buf_put_uint(b, (uint8_t)((r->available ? F_AVAILABLE : 0) | (r->carbons ? F_CARBONS : 0)),
                    1);
    rt_buf_put_bytes(b, bare, bare_len);
    rt_buf_put_bytes(b, res, res_len);
    /* whom it replaced, by node name ("": nobody) and the pid that node gave it */
    char name[RT_CONF_NODE_MAX] = "";
    if (replaced)
        rt__c2s_cluster_node_name(rt__c2s_pid_node(replaced), name);
    rt_buf_put_bytes(b, name, strlen(name));
    rt_buf_put_uint(b, replaced & PID_LOCAL_MASK, 8);
}

static void send_binding(const char *node, uint8_t kind, const char *bare, size_t bare_len,
                         const char *res, size_t res_len, const c2s_route_t *r, rt_pid_t replaced)
{
    rt_buf_t b = {0};
    put_binding(&b, kind, bare, bare_len, res, res_len, r, replaced);
    send_to(node, &b);
    rt_buf_free(&b);
}

void rt__c2s_cluster_announce(const char *bare, size_t bare_len, const char *res, size_t res_len,
                              const c2s_route_t *r, bool bound, rt_pid_t replaced)
{
    send_binding(NULL, bound ? K_BIND : K_UNBIND, bare, bare_len, res, res_len, r, replaced);
}

static void snapshot_one(const char *bare, size_t bare_len, const char *res, size_t res_len,
                         const c2s_route_t *r, void *arg)
{
    send_binding(arg, K_BIND, bare, bare_len, res, res_len, r, 0);
}

/* A message of kind with nothing after its head (SYNC, SYNCED) to node. */
static void send_word(const char *node, uint8_t kind)
{
    rt_buf_t b = {0};
    put_head(&b, kind);
    send_to(node, &b);
    rt_buf_free(&b);
}

/* Every binding of this node's to node, then SYNCED. */
static void answer_sync(const char *node)
{
    rt__c2s_reg_each_local(snapshot_one, (void *)node);
    send_word(node, K_SYNCED);
}

/* ---- The home node ---- */

bool rt__c2s_home_elsewhere(void)
{
    const char *home = rt__c2s.conf ? rt__c2s.conf->cluster_home : "";
    return home[0] && rt__c2s_cluster_on() && strcmp(home, rt_cluster_node()) != 0;
}

bool rt__c2s_store_shared(void)
{
    return rt__c2s.conf && rt__c2s.conf->cluster_home[0] && rt__c2s_cluster_on();
}

int rt__c2s_call_home(uint8_t to, rt_pid_t from, rt_msg_t *m)
{
    RT_ASSERT(!rt__c2s_pid_node(from));
    /* Not before the home is heard from and has told its bindings: a call NATS would carry
       to nobody waits for no answer (a login would wait for its connect_timeout). */
    bool synced = false;
    unsigned home = node_index(rt__c2s.conf->cluster_home, false);
    if (!home || !node_incarnation(home, &synced) || !synced) {
        rt_msg_free(m);
        return RT_EAGAIN;
    }
    if (!from) /* not from an actor: what comes back is routed by its to (route_by_to) */
        from = atomic_load_explicit(&cl.pid, memory_order_acquire);
    rt_buf_t b = {0};
    put_head(&b, K_CALL);
    rt_buf_put_uint(&b, from, 8);
    rt_buf_put_uint(&b, to, 1);
    rt_buf_put_uint(&b, m->tag, 4);
    rt_buf_add(&b, m->data, m->len);
    rt_msg_free(m);
    int rc = send_to(rt__c2s.conf->cluster_home, &b);
    rt_buf_free(&b);
    return rc;
}

/*
** This node's archive ids' slot (C2S_ID_SLOTS of them): FNV-1a of its name, a hash every node
** must compute alike (not rt_hash, keyed per process). Two names on one slot would make the
** same ids: a node that hears of one says so (xmpp.cluster_id_clash).
*/
static int64_t slot_of(const char *name)
{
    uint32_t h = 2166136261u;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return (int64_t)(h % C2S_ID_SLOTS);
}

int64_t rt__c2s_id_slot(void)
{
    return slot_of(rt_cluster_node());
}

/* The registered name of the proxy for pid of node (index) in its run incarnation. */
static void proxy_name(unsigned node, uint64_t incarnation, rt_pid_t pid, char *out)
{
    snprintf(out, PROXY_NAME_MAX, "xmpp_proxy:%u:%" PRIx64 ":%" PRIx64, node, incarnation,
             (uint64_t)pid);
}

typedef struct {
    rt_pid_t remote; /* the session it stands for (a remote pid) */
    uint64_t incarnation, last_ms;
    bool bound;
} proxy_t;

static int proxy_init(rt_actor_t *self, void *state, void *arg)
{
    proxy_t *p = state;
    *p = *(const proxy_t *)arg;
    p->last_ms = rt_mono_ms();
    return rt_send_after_tag(PROXY_IDLE_MS / 2, rt_self(self), C2S_MSG_PROXY_TICK, NULL);
}

/* A call its session made: to the actor named by its first byte, as the session would. */
static void proxy_call(const rt_msg_t *m)
{
    rt_reader_t r = {.p = m->data, .len = m->len};
    uint8_t to = (uint8_t)rt_reader_uint(&r, 1);
    uint32_t tag = (uint32_t)rt_reader_uint(&r, 4);
    /* Each actor is given the one kind of message a session sends it, nothing else. */
    static const uint32_t takes[] = {[C2S_TO_STORE] = C2S_MSG_STORE_REQ,
                                     [C2S_TO_ARCHIVE] = C2S_MSG_STORE_REQ,
                                     [C2S_TO_ROOM] = C2S_MSG_STANZA,
                                     [C2S_TO_MUC_SERVICE] = C2S_MSG_MUC,
                                     [C2S_TO_ROOM_POST] = C2S_MSG_MUC_POST};
    if (r.bad || !to || to >= sizeof(takes) / sizeof(takes[0]) || takes[to] != tag) {
        atomic_fetch_add_explicit(&rt_c2s_stats.cluster_refused, 1, memory_order_relaxed);
        return;
    }
    rt_msg_t *out = rt_msg_new(tag, r.len - r.at);
    if (!out)
        return;
    memcpy(out->data, r.p + r.at, r.len - r.at);
    switch (to) {
    case C2S_TO_STORE:
        rt_send_msg(rt_whereis(RT_C2S_STORE_NAME), out);
        return;
    case C2S_TO_ARCHIVE:
        rt__c2s_archive_send(out);
        return;
    case C2S_TO_ROOM:
        out->from = rt__c2s_current_pid(); /* the proxy: the occupant the room sees */
        rt__c2s_muc_reroute(out, true);
        break;
    case C2S_TO_MUC_SERVICE:
        rt_send_msg(rt_whereis(RT_C2S_MUC_NAME), out);
        return;
    default: /* C2S_TO_ROOM_POST */
        rt__c2s_muc_post_bytes(out->data, out->len);
    }
    rt_msg_free(out);
}

static void proxy_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    proxy_t *p = state;
    unsigned node = rt__c2s_pid_node(p->remote);
    switch (m->tag) {
    case C2S_MSG_PROXY_CALL:
        p->last_ms = rt_mono_ms();
        proxy_call(m);
        break;
    case C2S_MSG_PROXY_BOUND:
        p->bound = true;
        break;
    case C2S_MSG_PROXY_END:
        rt_exit(self, RT_REASON_NORMAL);
        break;
    case C2S_MSG_PROXY_TICK:
        /* Its node gone or restarted, or a login that never bound: nobody to stand for. */
        if (node_incarnation(node, NULL) != p->incarnation ||
            (!p->bound && rt_mono_ms() - p->last_ms >= PROXY_IDLE_MS)) {
            rt_exit(self, RT_REASON_NORMAL);
            break;
        }
        rt_send_after_tag(PROXY_IDLE_MS / 2, rt_self(self), C2S_MSG_PROXY_TICK, NULL);
        break;
    default:
        if (rt__c2s_send(p->remote, m->tag, m->data, m->len) != 0)
            atomic_fetch_add_explicit(&rt_c2s_stats.cluster_not_sent, 1, memory_order_relaxed);
    }
}

static const char *proxy_tag_name(uint32_t tag)
{
    return tag == C2S_MSG_PROXY_CALL    ? "call"
           : tag == C2S_MSG_PROXY_BOUND ? "bound"
           : tag == C2S_MSG_PROXY_END   ? "end"
           : tag == C2S_MSG_PROXY_TICK  ? "tick"
                                        : NULL;
}

static const rt_actor_type_t proxy_type = {
    .name = "xmpp_proxy",
    .state_size = sizeof(proxy_t),
    .init = proxy_init,
    .handle = proxy_handle,
    .tag_name = proxy_tag_name,
};

/* Tells pid's proxy here (if any) of its binding: made, or gone. */
static void proxy_tell(unsigned node, rt_pid_t pid, uint32_t tag)
{
    char name[PROXY_NAME_MAX];
    proxy_name(node, cl.nodes[node].incarnation, pid, name);
    rt_pid_t proxy = rt_whereis(name);
    if (proxy)
        rt_send(proxy, tag, NULL, 0);
}

/* A call from a session of node (index): to its proxy, made on its first call. */
static void call_in(unsigned node, rt_reader_t *r)
{
    rt_pid_t pid = rt_reader_uint(r, 8);
    const uint8_t *rest = r->p + r->at;
    size_t n = r->len - r->at;
    if (r->bad || !pid || (pid & ~PID_LOCAL_MASK) || n < 5) {
        atomic_fetch_add_explicit(&rt_c2s_stats.cluster_refused, 1, memory_order_relaxed);
        return;
    }
    char name[PROXY_NAME_MAX];
    proxy_name(node, cl.nodes[node].incarnation, pid, name);
    for (int attempt = 0; attempt < 2; attempt++) {
        rt_pid_t proxy = rt_whereis(name);
        proxy_t arg = {.remote = pid | (rt_pid_t)node << C2S_NODE_SHIFT,
                       .incarnation = cl.nodes[node].incarnation};
        rt_spawn_opts_t o = {.name = name};
        int rc = proxy ? 0 : rt_spawn_opt(&proxy_type, &arg, &o, &proxy);
        if (rc == RT_EEXIST)
            continue;
        rt_msg_t *m = rc ? NULL : rt_msg_new(C2S_MSG_PROXY_CALL, n);
        if (!m)
            break;
        memcpy(m->data, rest, n);
        if (rt_send_msg(proxy, m) == 0)
            return;
    }
    atomic_fetch_add_explicit(&rt_c2s_stats.cluster_not_sent, 1, memory_order_relaxed);
}

/* ---- In ---- */

static void drop_node(unsigned i, const char *why)
{
    size_t n = rt__c2s_reg_purge_node(i);
    node_set(i, 0, false);
    atomic_fetch_add_explicit(&rt_c2s_stats.cluster_dropped, n, memory_order_relaxed);
    rt_log(RT_LOG_INFO, "xmpp.cluster_node_dropped", "node=%s bindings=%zu reason=%s",
           cl.nodes[i].name, n, why);
}

/* A binding's pid as this node numbers it: the sender's own session, or one it names. */
static rt_pid_t pid_here(const char *node, size_t len, uint64_t pid)
{
    char name[RT_CONF_NODE_MAX];
    if (!len || len >= sizeof(name) || (pid & ~PID_LOCAL_MASK))
        return 0;
    memcpy(name, node, len);
    name[len] = 0;
    if (strcmp(name, rt_cluster_node()) == 0)
        return pid;
    unsigned i = node_index(name, true);
    return i ? pid | (rt_pid_t)i << C2S_NODE_SHIFT : 0;
}

static void binding_in(unsigned from, const char *from_name, rt_reader_t *r, bool bound)
{
    uint64_t pid = rt_reader_uint(r, 8);
    c2s_route_t route = {.priority = (int8_t)(uint8_t)rt_reader_uint(r, 1)};
    uint8_t flags = (uint8_t)rt_reader_uint(r, 1);
    size_t bare_len, res_len, rnode_len;
    const char *bare = (const char *)rt_reader_bytes(r, &bare_len, RT_JID_TEXT_MAX);
    const char *res = (const char *)rt_reader_bytes(r, &res_len, RT_JID_TEXT_MAX);
    const char *rnode = (const char *)rt_reader_bytes(r, &rnode_len, RT_CONF_NODE_MAX - 1);
    uint64_t replaced = rt_reader_uint(r, 8);
    if (r->bad || !bare_len || !res_len || (pid & ~PID_LOCAL_MASK) || !pid) {
        atomic_fetch_add_explicit(&rt_c2s_stats.cluster_refused, 1, memory_order_relaxed);
        return;
    }
    route.pid = pid | (rt_pid_t)from << C2S_NODE_SHIFT;
    route.available = flags & F_AVAILABLE;
    route.carbons = flags & F_CARBONS;
    if (!bound) {
        rt__c2s_reg_unbind(bare, bare_len, res, res_len, route.pid);
        proxy_tell(from, pid, C2S_MSG_PROXY_END);
        return;
    }
    proxy_tell(from, pid, C2S_MSG_PROXY_BOUND);
    rt_pid_t was = rnode_len ? pid_here(rnode, rnode_len, replaced) : 0;
    if (rt__c2s_reg_apply(bare, bare_len, res, res_len, &route, was) != 0)
        rt_log(RT_LOG_WARNING, "xmpp.cluster_binding_lost", "node=%s reason=out of memory",
               from_name);
}

/* A stanza for a session that is gone: on as a session's own leftovers go (rt__c2s_orphan). */
static void stanza_orphaned(rt_actor_t *self, rt_pid_t gone, const uint8_t *p, size_t n)
{
    rt_msg_t *m = rt_msg_new(C2S_MSG_STANZA, n);
    if (!m)
        return;
    memcpy(m->data, p, n);
    m->from = rt_self(self); /* a refusal of the offline store comes here, and on (route_by_to) */
    rt__c2s_orphan(m, gone);
    rt_msg_free(m);
}

static void deliver_in(rt_actor_t *self, rt_reader_t *r)
{
    rt_pid_t pid = rt_reader_uint(r, 8);
    uint32_t tag = (uint32_t)rt_reader_uint(r, 4);
    if (r->bad || (pid & ~PID_LOCAL_MASK) || !portable(tag)) {
        atomic_fetch_add_explicit(&rt_c2s_stats.cluster_refused, 1, memory_order_relaxed);
        return;
    }
    const uint8_t *p = r->p + r->at;
    size_t n = r->len - r->at;
    if (rt_send(pid, tag, p, n) != 0 && tag == C2S_MSG_STANZA)
        stanza_orphaned(self, pid, p, n);
}

static void one_in(rt_actor_t *self, const rt_cluster_channel_in_t *in, const uint8_t *p,
                   size_t len)
{
    rt_reader_t r = {.p = p, .len = len};
    uint8_t kind = (uint8_t)rt_reader_uint(&r, 1);
    uint64_t incarnation = rt_reader_uint(&r, 8);
    char name[RT_CONF_NODE_MAX];
    snprintf(name, sizeof(name), "%.*s", RT_CONF_NODE_MAX - 1, in->node);
    bool known = node_index(name, false) != 0;
    unsigned from = r.bad || !incarnation ? 0 : node_index(name, true);
    if (from && !known && rt__c2s_store_shared() && slot_of(name) == rt__c2s_id_slot())
        rt_log(RT_LOG_ERROR, "xmpp.cluster_id_clash",
               "node=%s reason=it and this node make the same archive ids: rename one", name);
    if (!from) {
        atomic_fetch_add_explicit(&rt_c2s_stats.cluster_refused, 1, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(&rt_c2s_stats.cluster_received, 1, memory_order_relaxed);
    if (cl.nodes[from].incarnation != incarnation) {
        /* A node new to this one, or a new run of it: what was held of it is stale. */
        if (cl.nodes[from].incarnation)
            drop_node(from, "restarted");
        node_set(from, incarnation, false);
        if (kind != K_SYNC)
            send_word(name, K_SYNC);
    }
    switch (kind) {
    case K_SYNC:
        answer_sync(name);
        if (!cl.nodes[from].synced)
            send_word(name, K_SYNC);
        break;
    case K_SYNCED:
        node_set(from, incarnation, true);
        break;
    case K_BIND:
    case K_UNBIND:
        binding_in(from, name, &r, kind == K_BIND);
        break;
    case K_DELIVER:
        deliver_in(self, &r);
        break;
    case K_CALL:
        call_in(from, &r);
        break;
    default:
        atomic_fetch_add_explicit(&rt_c2s_stats.cluster_refused, 1, memory_order_relaxed);
    }
}

/* A node's messages, one after another (the channel's batch). */
static void channel_in(rt_actor_t *self, const rt_msg_t *m)
{
    const rt_cluster_channel_in_t *in = (const rt_cluster_channel_in_t *)(const void *)m->data;
    rt_reader_t r = {.p = in->data, .len = m->len - sizeof(*in)};
    size_t n;
    const uint8_t *one;
    while (r.at < r.len && (one = rt_reader_bytes(&r, &n, RT_CLUSTER_CHANNEL_MAX)) != NULL)
        one_in(self, in, one, n);
    if (r.bad)
        atomic_fetch_add_explicit(&rt_c2s_stats.cluster_refused, 1, memory_order_relaxed);
}

/* The nodes up now (by their heartbeats): new ones are asked, silent ones dropped. */
static void tick(void)
{
    rt_cluster_node_t *up = malloc(RT_CLUSTER_NODES_MAX * sizeof(*up));
    size_t n = up ? rt_cluster_nodes(up, RT_CLUSTER_NODES_MAX) : 0;
    for (unsigned i = 1; up && i <= cl.nnodes; i++) {
        bool heard = false;
        for (size_t k = 0; k < n && !heard; k++)
            heard = up[k].up && strcmp(up[k].node, cl.nodes[i].name) == 0;
        if (!heard && cl.nodes[i].incarnation)
            drop_node(i, "silent");
    }
    for (size_t k = 0; k < n; k++) {
        if (!up[k].up || strcmp(up[k].node, rt_cluster_node()) == 0)
            continue;
        unsigned i = node_index(up[k].node, false);
        if (!i || !cl.nodes[i].synced)
            send_word(up[k].node, K_SYNC);
    }
    free(up);
}

/* Route a stanza by its to (a full JID's session, here or on its node): the offline store's
   refusal for a sender on another node. */
static void route_by_to(const rt_msg_t *m)
{
    char to[RT_JID_TEXT_MAX + 1];
    int n = rt__c2s_first_tag_attr(m->data, m->len, "to", to, sizeof(to) - 1);
    rt_jid_buf_t jb;
    c2s_route_t r;
    if (n > 0 && rt_jid_prep(to, (size_t)n, &jb, NULL) == 0 && jb.jid.resource &&
        rt__c2s_reg_lookup(jb.jid.s, rt_jid_bare_len(&jb.jid), rt_jid_resource(&jb.jid),
                           jb.jid.resource, &r, 1))
        rt__c2s_send(r.pid, C2S_MSG_STANZA, m->data, m->len);
}

typedef struct {
    size_t charged; /* the other nodes' bindings, as last charged to this actor */
} xc_state_t;

static void settle(rt_actor_t *self, xc_state_t *st)
{
    size_t local, remote, bytes;
    rt__c2s_reg_counts(&local, &remote, &bytes);
    rt_charge(self, (ptrdiff_t)bytes - (ptrdiff_t)st->charged);
    st->charged = bytes;
}

static int xc_init(rt_actor_t *self, void *state, void *arg)
{
    (void)state;
    (void)arg;
    rt_cluster_set_channel(rt_self(self));
    atomic_store_explicit(&cl.pid, rt_self(self), memory_order_release);
    atomic_store_explicit(&cl.on, true, memory_order_release);
    return rt_send(rt_self(self), C2S_MSG_CLUSTER_TICK, NULL, 0);
}

static void xc_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (m->tag == RT_CLUSTER_MSG_CHANNEL && m->len >= sizeof(rt_cluster_channel_in_t)) {
        channel_in(self, m);
    } else if (m->tag == C2S_MSG_CLUSTER_TICK) {
        tick();
        rt_send_after_tag(TICK_MS, rt_self(self), C2S_MSG_CLUSTER_TICK, NULL);
    } else if (m->tag == C2S_MSG_STANZA) {
        route_by_to(m);
    }
    settle(self, state);
}

static void xc_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)self;
    (void)state;
    (void)reason;
    rt_cluster_set_channel(0); /* a restart's init sets it again, and asks every node anew */
}

static const char *xc_tag_name(uint32_t tag)
{
    return tag == RT_CLUSTER_MSG_CHANNEL ? "channel"
           : tag == C2S_MSG_CLUSTER_TICK ? "tick"
           : tag == C2S_MSG_STANZA       ? "stanza"
                                         : NULL;
}

static const rt_actor_type_t xc_type = {
    .name = "xmpp_cluster",
    .state_size = sizeof(xc_state_t),
    .init = xc_init,
    .handle = xc_handle,
    .terminate = xc_terminate,
    .tag_name = xc_tag_name,
};

int rt__c2s_cluster_start(rt_pid_t group, char *err, size_t errlen)
{
    if (!rt_cluster_on())
        return 0;
    rt_stats_t rs;
    rt_stats(&rs);
    if (rs.max_actors > (1u << C2S_NODE_SHIFT)) {
        snprintf(err, errlen, "XMPP in a cluster numbers at most %u actors a node (max_actors %u)",
                 1u << C2S_NODE_SHIFT, rs.max_actors);
        return RT_EINVAL;
    }
    while (!cl.incarnation)
        if (rt_random(&cl.incarnation, sizeof(cl.incarnation)) != 0)
            break;
    if (!cl.incarnation) {
        snprintf(err, errlen, "no random number for this run's incarnation");
        return RT_ENOMEM;
    }
    rt_child_spec_t c = {.name = "xmpp_cluster", .type = &xc_type, .restart = RT_PERMANENT};
    int rc = rt_supervisor_start_child(group, &c, NULL);
    if (rc)
        snprintf(err, errlen, "cannot start the XMPP cluster actor: %s", rt_strerror(rc));
    return rc;
}
