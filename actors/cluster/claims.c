/*
** Client ids unique cluster-wide, sessions that move between nodes, and other nodes' questions
** to this one's administrator (cluster.h): requests and answers in parts over NATS.
*/
#include "cluster_impl.h"

#define CLAIM_ATTEMPTS 4

#define TAKEOVER_WAIT_MS 2000

/* How far apart the nodes' wall clocks may be (NTP keeps them much closer). */
#define CLOCKS_APART_MS 2000

/* A claim made before this node's first lease waits this long for it at most. */
#define LEASE_TAKE_WAIT_MS 1000

#define H_PART "Rt-Part" /* "<i> <n>": part i of an answer in n parts; "0 0": nothing */

#define H_WANT "Rt-Want" /* "session": the claimer resumes the session, which moves */

/*
** Sends subject a request for id and collects the answer's parts (cluster.h, "Sessions that
** move"): *out (malloc'ed) and *len, none when the holder had nothing to move. false when
** no answer came in time (a node gone) or it was not one.
*/
/* An inbox for answers; on the one connection: NATS has it before any request sent after. */
static natsStatus open_inbox(natsInbox **inbox, natsSubscription **sub)
{
    *inbox = NULL;
    *sub = NULL;
    natsStatus s = natsInbox_Create(inbox);
    if (s == NATS_OK)
        s = natsConnection_SubscribeSync(sub, rt__cluster.nc, *inbox);
    return s;
}

/* The next answer on sub that verifies, by deadline (NATS_TIMEOUT after): anyone may publish
   on an inbox, and what does not verify is dropped. */
static natsStatus next_answer(natsSubscription *sub, uint64_t deadline, natsMsg **answer)
{
    for (;;) {
        uint64_t now = rt_mono_ms();
        natsStatus s = now < deadline
                           ? natsSubscription_NextMsg(answer, sub, (int64_t)(deadline - now))
                           : NATS_TIMEOUT;
        int64_t age;
        if (s != NATS_OK || rt__cluster_verified(*answer, "answer", false, &age))
            return s;
        natsMsg_Destroy(*answer);
    }
}

/* Publishes a signed request (data, Rt-Want if want) to be answered on inbox. */
static natsStatus ask(const char *subject, const char *inbox, const char *data, bool want)
{
    natsMsg *req = NULL;
    natsStatus s = natsMsg_Create(&req, subject, inbox, data, (int)strlen(data));
    if (s == NATS_OK && want)
        s = natsMsgHeader_Set(req, H_WANT, "session");
    if (s == NATS_OK)
        s = rt__cluster_sign(req);
    if (s == NATS_OK)
        s = natsConnection_PublishMsg(rt__cluster.nc, req);
    natsMsg_Destroy(req);
    return s;
}

static bool request_parts(const char *subject, const char *id, bool want, uint8_t **out,
                          size_t *len)
{
    *out = NULL;
    *len = 0;
    natsInbox *inbox = NULL;
    natsSubscription *sub = NULL;
    natsStatus s = open_inbox(&inbox, &sub);
    if (s == NATS_OK)
        s = ask(subject, inbox, id, want);
    rt_buf_t buf = {0};
    /* Each part within TAKEOVER_WAIT_MS of the one before (what does not verify does not
       extend the wait). */
    uint64_t deadline = rt_mono_ms() + TAKEOVER_WAIT_MS;
    for (unsigned got = 0, parts = 1; s == NATS_OK && got < parts;) {
        natsMsg *part = NULL;
        s = next_answer(sub, deadline, &part);
        if (s != NATS_OK)
            break;
        const char *h = NULL;
        unsigned i = 0, n = 0;
        size_t dlen = (size_t)natsMsg_GetDataLength(part);
        if (natsMsgHeader_Get(part, H_PART, &h) != NATS_OK || sscanf(h, "%u %u", &i, &n) != 2 ||
            (n && i != got + 1) || n > RT_CLUSTER_MOVE_MAX / 1024 ||
            buf.len + dlen > RT_CLUSTER_MOVE_MAX) {
            s = NATS_PROTOCOL_ERROR;
        } else if ((parts = n) != 0) {
            rt_buf_add(&buf, natsMsg_GetData(part), dlen);
            s = buf.oom ? NATS_NO_MEMORY : NATS_OK;
            got++;
            deadline = rt_mono_ms() + TAKEOVER_WAIT_MS;
        }
        natsMsg_Destroy(part);
    }
    natsSubscription_Destroy(sub);
    natsInbox_Destroy(inbox);
    if (s != NATS_OK) {
        rt_buf_free(&buf);
        return false;
    }
    *out = (uint8_t *)buf.data;
    *len = buf.len;
    return true;
}

/* The holder node's subject for a request about its clients ("takeover", "handover"). */
void rt__cluster_node_subject(const char *holder, const char *what, char *out, size_t cap)
{
    char node[RT_CONF_NODE_MAX] = "";
    sscanf(holder, "%32s", node);
    snprintf(out, cap, "%s_ctl.node.%s.%s", rt__cluster.prefix, node, what);
}

/*
** The last value of key in the clients bucket, as its stream's leader has it (value: NUL-
** terminated, cut to cap). Not a direct get: those go to any replica, and one that lags (or
** whose server is stopped) would answer late or not at all; a holder's lease must be read
** where its renewals are decided. NATS_NOT_FOUND when the key has no value.
*/
natsStatus rt__cluster_read_key(jsCtx *js, const char *key, char *value, size_t cap,
                                uint64_t *revision)
{
    char stream[sizeof(rt__cluster.prefix) + 16], subject[3 * RT_CLIENT_TEXT_MAX + 48];
    snprintf(stream, sizeof(stream), "KV_%s_clients", rt__cluster.prefix);
    snprintf(subject, sizeof(subject), "$KV.%s_clients.%s", rt__cluster.prefix, key);
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetLastMsg(&m, js, stream, subject, NULL, &jerr);
    if (s != NATS_OK)
        return s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr ? NATS_NOT_FOUND : s;
    const char *op = NULL;
    if (natsMsgHeader_Get(m, "KV-Operation", &op) == NATS_OK) { /* DEL or PURGE */
        natsMsg_Destroy(m);
        return NATS_NOT_FOUND;
    }
    snprintf(value, cap, "%.*s", natsMsg_GetDataLength(m), natsMsg_GetData(m));
    *revision = natsMsg_GetSequence(m);
    natsMsg_Destroy(m);
    return NATS_OK;
}

/* The node of a holder's value ("<node> <run>"). */
static void holder_node(const char *holder, char *node, size_t cap)
{
    snprintf(node, cap, "%.*s", (int)strcspn(holder, " "), holder);
}

/* The run of a holder's value ("<node> <run>"), for the log; "" if it names none. */
static const char *holder_run(const char *holder)
{
    const char *run = strchr(holder, ' ');
    return run ? run + 1 : "";
}

/* What a claimer learns from a holder's lease key (lease.c). */
typedef enum {
    HOLDER_GONE,    /* the holder's run ended: its lease key names another run, or it was seen
                       lapsed at this revision */
    HOLDER_LEASED,  /* it may be serving: ask it, and wait out its lease if it is silent */
    HOLDER_UNKNOWN, /* JetStream did not answer */
} holder_state_t;

static holder_state_t holder_lease(const char *holder, uint64_t *revision)
{
    char node[RT_CONF_NODE_MAX], key[RT_CONF_NODE_MAX + 8];
    holder_node(holder, node, sizeof(node));
    rt__cluster_lease_key(node, key, sizeof(key));
    *revision = 0;
    char value[32];
    natsStatus s = rt__cluster_read_key(rt__cluster.js, key, value, sizeof(value), revision);
    if (s == NATS_NOT_FOUND)
        return HOLDER_LEASED; /* no key yet: wait it out as if it were renewed just now */
    if (s != NATS_OK)
        return HOLDER_UNKNOWN;
    const char *run = strchr(holder, ' ');
    if (!run || strcmp(value, run + 1) != 0)
        return HOLDER_GONE;
    for (unsigned i = 0; i < rt__cluster.nlapsed; i++)
        if (strcmp(rt__cluster.lapsed[i].value, holder) == 0 &&
            rt__cluster.lapsed[i].revision == *revision)
            return HOLDER_GONE;
    return HOLDER_LEASED;
}

static void remember_lapsed(const char *holder, uint64_t revision)
{
    unsigned i = 0;
    while (i < rt__cluster.nlapsed && strcmp(rt__cluster.lapsed[i].value, holder) != 0)
        i++;
    if (i == rt__cluster.nlapsed) {
        unsigned cap = sizeof(rt__cluster.lapsed) / sizeof(rt__cluster.lapsed[0]);
        i = rt__cluster.nlapsed < cap ? rt__cluster.nlapsed++ : (unsigned)(revision % cap);
    }
    snprintf(rt__cluster.lapsed[i].value, sizeof(rt__cluster.lapsed[i].value), "%s", holder);
    rt__cluster.lapsed[i].revision = revision;
}

/*
** A holder that did not answer: whether its lease ran out. The lease key was read at
** read_ms (after its answer came) at revision; a renewal the holder sent before then has a
** revision no higher, and holds until LEASE_MS after it was sent. So once the key is still
** at that revision LEASE_MS + LEASE_MARGIN_MS after read_ms, the holder has served nothing
** for a while (it ends its clients when its lease runs out) and the id can be taken.
*/
static holder_state_t wait_out_lease(const char *holder, uint64_t revision, uint64_t read_ms)
{
    uint64_t until = read_ms + LEASE_MS + LEASE_MARGIN_MS, now = rt_mono_ms();
    atomic_fetch_add_explicit(&rt__cluster.lease_waits, 1, memory_order_relaxed);
    if (until > now)
        nats_Sleep((int64_t)(until - now));
    uint64_t again = 0;
    holder_state_t st = holder_lease(holder, &again);
    if (st == HOLDER_LEASED && again == revision) {
        remember_lapsed(holder, revision);
        st = HOLDER_GONE;
    }
    return st;
}

/*
** In cluster_kv: the id recorded as this node's, by compare-and-swap, under the lease
** generation *lease (the claim is void if the lease does not hold at the swap). A holder is
** asked first; one that does not answer is waited out (wait_out_lease). A session that moves
** here (want_session) is imported, and *moving says the claim is answered later. verify:
** keep the id if this node (this run or an earlier one) holds it or nobody does, RT_EEXIST if
** another node does.
*/
static int claim(const claim_t *cl, const char *id, bool *moving, uint32_t *lease)
{
    char key[3 * RT_CLIENT_TEXT_MAX + 1];
    if (rt_kv_key_of_topic(id, strlen(id), key, sizeof(key)) <= 0)
        return RT_EINVAL;
    /* Cut off from NATS, or the lease lapsed: say so now rather than after JetStream's
       timeout, and claim nothing this node could not keep. */
    if (natsConnection_Status(rt__cluster.nc) != NATS_CONN_STATUS_CONNECTED)
        return RT_EAGAIN;
    /* Just started: the first lease comes within a renewal or two. (After a lapse claims
       fail at once until it holds again: a stalled node must not queue them a second each.) */
    for (int i = 0; i < LEASE_TAKE_WAIT_MS / 10 && !atomic_load(&rt__cluster.lease_until_ms); i++)
        nats_Sleep(10);
    *lease = rt_cluster_lease_generation();
    if (!rt_cluster_lease_holds(*lease))
        return RT_EAGAIN;
    bool alive_silent = false;
    for (int attempt = 0; attempt < CLAIM_ATTEMPTS; attempt++) {
        char holder[sizeof(rt__cluster.value)], node[RT_CONF_NODE_MAX];
        uint64_t rev = 0;
        natsStatus s = rt__cluster_read_key(rt__cluster.js, key, holder, sizeof(holder), &rev);
        if (s == NATS_NOT_FOUND) {
            s = kvStore_CreateString(&rev, rt__cluster.clients, key, rt__cluster.value);
            if (s == NATS_OK)
                return rt_cluster_lease_holds(*lease) ? 0 : RT_EAGAIN;
            continue; /* another node made it first */
        }
        if (s != NATS_OK)
            return RT_EAGAIN;
        if (strcmp(holder, rt__cluster.value) == 0)
            return rt_cluster_lease_holds(*lease) ? 0 : RT_EAGAIN;
        /* An earlier run of this node is gone: nobody to ask or wait for. */
        holder_node(holder, node, sizeof(node));
        bool earlier_run = strcmp(node, rt__cluster.node) == 0;
        if (cl->verify && !earlier_run)
            return RT_EEXIST;
        uint64_t lease_rev = 0;
        holder_state_t st = earlier_run ? HOLDER_GONE : holder_lease(holder, &lease_rev);
        uint64_t read_ms = rt_mono_ms();
        if (st == HOLDER_UNKNOWN)
            return RT_EAGAIN;
        char subject[RT_CONF_NODE_MAX * 2 + 24];
        rt__cluster_node_subject(holder, "takeover", subject, sizeof(subject));
        uint8_t *session = NULL;
        size_t len = 0;
        bool answered =
            st == HOLDER_LEASED && request_parts(subject, id, cl->want_session, &session, &len);
        if (st == HOLDER_LEASED && !answered) {
            if (alive_silent)
                return RT_EBUSY; /* asked twice, renewing its lease all along */
            st = wait_out_lease(holder, lease_rev, read_ms);
        }
        if (st == HOLDER_UNKNOWN)
            return RT_EAGAIN;
        if (st == HOLDER_LEASED && !answered) {
            alive_silent = true; /* it renewed its lease meanwhile: ask once more */
            continue;
        }
        if (kvStore_UpdateString(NULL, rt__cluster.clients, key, rt__cluster.value, rev) !=
            NATS_OK) {
            if (len)
                rt_log(RT_LOG_WARNING, "cluster.session_lost",
                       "client=%s from=%s run=%s another node claimed the id while its session "
                       "moved",
                       id, node, holder_run(holder));
            free(session);
            continue;
        }
        if (!rt_cluster_lease_holds(*lease)) {
            free(session);
            return RT_EAGAIN;
        }
        if (cl->verify)
            return 0;
        atomic_fetch_add_explicit(&rt__cluster.claims_taken_over, 1, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "cluster.client_taken_over",
               "client=%s from=%s run=%s session_bytes=%zu %s", id, node, holder_run(holder), len,
               answered ? "" : "(it did not answer; its lease ran out)");
        /* Its node is gone (no answer): durable mode has the session's record. */
        int64_t replay_from_ms = 0;
        if (!answered && cl->want_session &&
            atomic_load_explicit(&rt__cluster.durable_ready, memory_order_acquire))
            session = rt__cluster_session_record(key, &len, &replay_from_ms);
        rt_pid_t imported = len && rt__cluster.import ? rt__cluster.import(id, session, len) : 0;
        free(session);
        if (len && !imported) {
            atomic_fetch_add_explicit(&rt__cluster.sessions_move_failed, 1, memory_order_relaxed);
            rt_log(RT_LOG_ERROR, "cluster.session_lost",
                   "client=%s from=%s run=%s its session could not be read here", id, node,
                   holder_run(holder));
        }
        if (!imported)
            return 0;
        /* Through the cluster actor, after the session's subscriptions (cluster.h). */
        rt_msg_t *m = rt_msg_new(MSG_MOVE_SYNC, sizeof(move_t) + strlen(id));
        if (!m)
            return 0;
        move_t *mv = (move_t *)(void *)m->data;
        mv->reply_to = cl->reply_to;
        mv->session = imported;
        mv->lease = *lease;
        mv->replay_from_ms = replay_from_ms;
        snprintf(mv->holder, sizeof(mv->holder), "%s", node);
        mv->len = (uint32_t)strlen(id);
        memcpy(mv->id, id, mv->len);
        *moving =
            rt_send_msg(atomic_load_explicit(&rt__cluster.out_pid, memory_order_acquire), m) == 0;
        return 0;
    }
    return alive_silent ? RT_EBUSY : RT_EAGAIN;
}

static void remember_claimer(const char *id, rt_pid_t pid);

/* A claim's outcome, counted, logged when it failed, and told to its CONNECT. */
static void claim_settled(const claim_t *cl, rt_cluster_claimed_t r, bool moving)
{
    char id[RT_CLIENT_TEXT_MAX];
    snprintf(id, sizeof(id), "%.*s", (int)cl->len, cl->id);
    if (r.status == 0)
        remember_claimer(id, cl->reply_to);
    if (cl->verify) {
        if (r.status == RT_EEXIST)
            atomic_fetch_add_explicit(&rt__cluster.claims_failed, 1, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(r.status ? &rt__cluster.claims_failed : &rt__cluster.claims, 1,
                                  memory_order_relaxed);
    }
    if (r.status && r.status != RT_EEXIST)
        rt_log(RT_LOG_WARNING, "cluster.claim_failed", "client=%s %s", id,
               r.status == RT_EBUSY    ? "its holder renews its lease but does not give the id up"
               : r.status == RT_EAGAIN ? "JetStream did not answer, this node's lease does not "
                                         "hold, or other nodes kept claiming it"
                                       : "the id cannot be a key");
    if (!moving)
        rt_send(cl->reply_to, RT_CLUSTER_MSG_CLAIMED, &r, sizeof(r));
}

/*
** Claims in flight. Most CONNECTs bring an id no node holds, and for those one create of the
** key decides (a JetStream publish that expects no message on the key's subject): cluster_kv
** sends it without waiting and goes on with the next CONNECT, and JetStream's answer settles
** the claim on the context's reply thread (claim_answered). Only an id in use (the create
** refused) takes the sequential claim() above, with its reads, questions and waits: back in
** cluster_kv, in the order the answers came. libnats hands claim_answered the message and
** nothing else, so each claim is found here by its message; at most CLAIMS_IN_FLIGHT wait
** (past it cluster_kv waits for room, as the CONNECTs behind it wait for cluster_kv).
*/
#define CLAIMS_IN_FLIGHT 1024

typedef struct {
    natsMsg *msg;
    uint32_t lease;
    claim_t *cl; /* malloc'ed, with its id */
} flight_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t room;
    flight_t f[CLAIMS_IN_FLIGHT];
    unsigned n;
} flights = {.lock = PTHREAD_MUTEX_INITIALIZER, .room = PTHREAD_COND_INITIALIZER};

/*
** Who claimed an id here lately. Between its claim's answer and its CONNECT going on, a client
** is not in the broker's registry yet, and a takeover request from the node that claims the id
** next would find nobody to end: both would serve the id. So rt__cluster_give_up looks here
** too (claimer_of): the claims in flight, and those made in the last RECENT_CLAIM_MS, in a
** table of sets of RECENT_WAYS slots indexed by the id's hash (under flights.lock). A new
** claim takes its id's slot or the set's oldest: with one slot a set, two ids of one burst
** that shared it (1,000 claims in 8,192 slots share ~60) left the first unfindable, and both
** nodes served it (test_cluster's race, once under ASan).
*/
#define RECENT_CLAIMS 8192
#define RECENT_WAYS 8
#define RECENT_CLAIM_MS 10000

static struct {
    uint64_t hash, at_ms;
    rt_pid_t pid;
} recent[RECENT_CLAIMS];

/* The first slot of id's set in recent[] (hash h). */
static unsigned recent_set(uint64_t h)
{
    return (unsigned)(h % (RECENT_CLAIMS / RECENT_WAYS)) * RECENT_WAYS;
}

/* Under flights.lock: id (its hash h) claimed for pid now. */
static void remember_locked(uint64_t h, rt_pid_t pid)
{
    unsigned set = recent_set(h), at = set;
    for (unsigned i = set; i < set + RECENT_WAYS && recent[at].hash != h; i++)
        if (recent[i].hash == h || recent[i].at_ms < recent[at].at_ms)
            at = i;
    recent[at].hash = h;
    recent[at].at_ms = rt_mono_ms();
    recent[at].pid = pid;
}

static void remember_claimer(const char *id, rt_pid_t pid)
{
    uint64_t h = rt_hash(id, strlen(id));
    pthread_mutex_lock(&flights.lock);
    remember_locked(h, pid);
    pthread_mutex_unlock(&flights.lock);
}

/* A claim remembered before its write that did not get the id. */
static void forget_claimer(const char *id, rt_pid_t pid)
{
    uint64_t h = rt_hash(id, strlen(id));
    unsigned set = recent_set(h);
    pthread_mutex_lock(&flights.lock);
    for (unsigned i = set; i < set + RECENT_WAYS; i++)
        if (recent[i].hash == h && recent[i].pid == pid)
            recent[i].hash = 0;
    pthread_mutex_unlock(&flights.lock);
}

static rt_pid_t claimer_of(const char *id)
{
    size_t len = strlen(id);
    uint64_t h = rt_hash(id, len), now = rt_mono_ms();
    unsigned set = recent_set(h);
    rt_pid_t pid = 0;
    pthread_mutex_lock(&flights.lock);
    for (unsigned i = 0; i < flights.n && !pid; i++)
        if (flights.f[i].cl->len == len && memcmp(flights.f[i].cl->id, id, len) == 0)
            pid = flights.f[i].cl->reply_to;
    for (unsigned i = set; i < set + RECENT_WAYS && !pid; i++)
        if (recent[i].hash == h && now - recent[i].at_ms < RECENT_CLAIM_MS)
            pid = recent[i].pid;
    pthread_mutex_unlock(&flights.lock);
    return pid;
}

unsigned rt__cluster_claims_in_flight(void)
{
    pthread_mutex_lock(&flights.lock);
    unsigned n = flights.n;
    pthread_mutex_unlock(&flights.lock);
    return n;
}

/*
** The flight of msg, out of the table; made: its create got the id, so its claimer is
** remembered in the same hold of the lock: between the two, a takeover request would find
** the id's client neither in flight nor recent (nor in the broker yet) and end nobody.
*/
static bool flight_take(natsMsg *msg, flight_t *out, bool made)
{
    pthread_mutex_lock(&flights.lock);
    unsigned i = 0;
    while (i < flights.n && flights.f[i].msg != msg)
        i++;
    bool found = i < flights.n;
    RT_ASSERT(flights.n <= CLAIMS_IN_FLIGHT);
    if (found) {
        if (made)
            remember_locked(rt_hash(flights.f[i].cl->id, flights.f[i].cl->len),
                            flights.f[i].cl->reply_to);
        *out = flights.f[i];
        flights.f[i] = flights.f[--flights.n];
        pthread_cond_signal(&flights.room);
    }
    pthread_mutex_unlock(&flights.lock);
    return found;
}

/* Back to cluster_kv, whose claim() decides, or failed when it cannot get there. */
static void claim_again(claim_t *cl, uint32_t lease)
{
    rt_msg_t *m = rt_msg_new(MSG_CLAIM, sizeof(claim_t) + cl->len);
    if (m) {
        memcpy(m->data, cl, sizeof(claim_t) + cl->len);
        ((claim_t *)(void *)m->data)->taken = true;
        if (rt_send_msg(atomic_load_explicit(&rt__cluster.kv_pid, memory_order_acquire), m) == 0)
            return;
    }
    claim_settled(cl, (rt_cluster_claimed_t){.status = RT_EAGAIN, .lease = lease}, false);
}

/* On the claims context's reply thread: JetStream's answer to a create, or libnats's timeout. */
static void claim_answered(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
    (void)js;
    (void)closure;
    RT_ASSERT(!rt_current()); /* libnats's reply thread: it hands over, never runs ours */
    flight_t f;
    bool made = pa && !pae;
    bool found = flight_take(msg, &f, made);
    natsMsg_Destroy(msg);
    if (!found) /* cluster_kv gave it up: the node stops */
        return;
    if (pae && pae->ErrCode == JSStreamWrongLastSequenceErr) {
        claim_again(f.cl, f.lease);
    } else {
        atomic_fetch_add_explicit(&rt__cluster.claims_pipelined, made, memory_order_relaxed);
        rt_cluster_claimed_t r = {.lease = f.lease};
        r.status = made && rt_cluster_lease_holds(f.lease) ? 0 : RT_EAGAIN;
        claim_settled(f.cl, r, false);
    }
    free(f.cl);
}

/* In cluster_kv: the claim's create sent, to be settled by claim_answered; false if it could
   not be (cluster_kv claims it the sequential way). */
static bool claim_pipelined(const claim_t *cl, const char *key)
{
    RT_ASSERT(RT_CLUSTER_ON(kv_pid) && !cl->taken);
    if (!rt__cluster.cjs || !atomic_load(&rt__cluster.lease_until_ms))
        return false;
    uint32_t lease = rt_cluster_lease_generation();
    if (!rt_cluster_lease_holds(lease))
        return false;
    char subject[3 * RT_CLIENT_TEXT_MAX + 48];
    snprintf(subject, sizeof(subject), "$KV.%s_clients.%s", rt__cluster.prefix, key);
    natsMsg *msg = NULL;
    claim_t *copy = malloc(sizeof(claim_t) + cl->len);
    if (!copy || natsMsg_Create(&msg, subject, NULL, rt__cluster.value,
                                (int)strlen(rt__cluster.value)) != NATS_OK) {
        free(copy);
        return false;
    }
    memcpy(copy, cl, sizeof(claim_t) + cl->len);
    pthread_mutex_lock(&flights.lock);
    while (flights.n == CLAIMS_IN_FLIGHT)
        pthread_cond_wait(&flights.room, &flights.lock); /* each answers within MaxWait */
    RT_ASSERT(flights.n < CLAIMS_IN_FLIGHT);
    flights.f[flights.n++] = (flight_t){.msg = msg, .lease = lease, .cl = copy};
    pthread_mutex_unlock(&flights.lock);
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = JETSTREAM_WAIT_MS;
    po.ExpectNoMessage = true;
    natsMsg *sent = msg;
    if (js_PublishMsgAsync(rt__cluster.cjs, &sent, &po) == NATS_OK)
        return true;
    flight_t f;
    if (flight_take(msg, &f, false))
        free(f.cl);
    natsMsg_Destroy(msg);
    return false;
}

/* In cluster_kv, once the clients bucket is bound: the context the claims go out on. */
natsStatus rt__cluster_claims_open(void)
{
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = JETSTREAM_WAIT_MS;
    jo.PublishAsync.AckHandler = claim_answered;
    jo.PublishAsync.MaxPending = CLAIMS_IN_FLIGHT;
    return natsConnection_JetStream(&rt__cluster.cjs, rt__cluster.nc, &jo);
}

/* The claims still in flight as the node stops: their CONNECTs end with the node. */
void rt__cluster_claims_close(void)
{
    jsCtx_Destroy(rt__cluster.cjs);
    rt__cluster.cjs = NULL;
    pthread_mutex_lock(&flights.lock);
    while (flights.n)
        free(flights.f[--flights.n].cl);
    pthread_mutex_unlock(&flights.lock);
}

void rt__cluster_claim_one(const claim_t *cl)
{
    RT_ASSERT(RT_CLUSTER_ON(kv_pid));
    char id[RT_CLIENT_TEXT_MAX], key[3 * RT_CLIENT_TEXT_MAX + 1];
    snprintf(id, sizeof(id), "%.*s", (int)cl->len, cl->id);
    if (!cl->taken && natsConnection_Status(rt__cluster.nc) == NATS_CONN_STATUS_CONNECTED &&
        rt_kv_key_of_topic(id, strlen(id), key, sizeof(key)) > 0 && claim_pipelined(cl, key))
        return;
    bool moving = false;
    rt_cluster_claimed_t r = {0};
    /* Remembered before the write that may make it this node's (flight_take says why). */
    remember_claimer(id, cl->reply_to);
    r.status = claim(cl, id, &moving, &r.lease);
    if (r.status)
        forget_claimer(id, cl->reply_to);
    claim_settled(cl, r, moving);
}

/*
** In cluster_kv, before a moving session's old holder is asked for the rest: a request to
** every other node, published after the session's subscriptions on the same connection.
** A NATS route carries what one server learned in the order it learned it, so a node's
** answer proves that its server has the new interest: no server can then see the old
** holder's interest end first and drop a publisher's message into no interest
** (docs/CLUSTER.md, "Sessions that move"). Nodes silent for a heartbeat's three periods are
** not waited for; the wait is bounded as a takeover's answer is. Each node's own subject,
** not one they all hear: its NATS user may already subscribe to that and no more.
*/
static void sync_every_server(const char *id)
{
    static char others[RT_CLUSTER_NODES_MAX][RT_CONF_NODE_MAX]; /* cluster_kv's own */
    size_t waiting = rt__cluster_others_up(others, RT_CLUSTER_NODES_MAX);
    if (!waiting)
        return;
    natsInbox *inbox = NULL;
    natsSubscription *sub = NULL;
    natsStatus s = open_inbox(&inbox, &sub);
    for (size_t i = 0; i < waiting && s == NATS_OK; i++) {
        char subject[RT_CONF_NODE_MAX * 2 + 24];
        rt__cluster_node_subject(others[i], "sync", subject, sizeof(subject));
        s = ask(subject, inbox, id, false);
    }
    uint64_t deadline = rt_mono_ms() + TAKEOVER_WAIT_MS;
    while (s == NATS_OK && waiting) {
        natsMsg *nm = NULL;
        s = next_answer(sub, deadline, &nm);
        if (s != NATS_OK)
            break;
        char node[RT_CONF_NODE_MAX];
        int len = natsMsg_GetDataLength(nm);
        if (len > 0 && (size_t)len < sizeof(node)) {
            snprintf(node, sizeof(node), "%.*s", len, natsMsg_GetData(nm));
            for (size_t i = 0; i < waiting; i++)
                if (strcmp(others[i], node) == 0) {
                    memcpy(others[i], others[--waiting], sizeof(others[i]));
                    break;
                }
        }
        natsMsg_Destroy(nm);
    }
    natsSubscription_Destroy(sub);
    natsInbox_Destroy(inbox);
    if (waiting) {
        atomic_fetch_add_explicit(&rt__cluster.move_syncs_incomplete, 1, memory_order_relaxed);
        rt_log(RT_LOG_WARNING, "cluster.move_sync_incomplete",
               "client=%s nodes_unanswered=%zu (first: %s) %s; what their servers' publishers "
               "send as the old holder lets go may find no interest",
               id, waiting, others[0], natsStatus_GetText(s));
    }
}

/* A CONNECT whose session moved here but will not merge the rest (it ended, or the rest could
   not be asked for): the id is this node's, and the CONNECT goes on with what is here. */
static void claim_ours(rt_pid_t claimer, uint32_t lease)
{
    RT_ASSERT(claimer);
    rt_cluster_claimed_t r = {.status = 0, .lease = lease};
    rt_send(claimer, RT_CLUSTER_MSG_CLAIMED, &r, sizeof(r));
}

/* In cluster_kv: what the old holder queued since phase 1, to the imported session (none
   if the old node is gone); then the CONNECT goes on. */
void rt__cluster_move_tail(const move_t *mv)
{
    RT_ASSERT(RT_CLUSTER_ON(kv_pid)); /* it waits on JetStream: never the forwarding actor */
    char id[RT_CLIENT_TEXT_MAX], subject[RT_CONF_NODE_MAX * 2 + 24], node[RT_CONF_NODE_MAX];
    snprintf(id, sizeof(id), "%.*s", (int)mv->len, mv->id);
    holder_node(mv->holder, node, sizeof(node));
    rt__cluster_node_subject(mv->holder, "handover", subject, sizeof(subject));
    uint8_t *tail = NULL;
    size_t len = 0, replayed = 0;
    bool answered;
    if (mv->replay_from_ms) {
        answered = (tail = rt__cluster_replay_bytes(mv->replay_from_ms, &len, &replayed)) != NULL;
        atomic_fetch_add_explicit(&rt__cluster.replays, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&rt__cluster.replayed, replayed, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "cluster.session_replayed",
               "client=%s from=%s run=%s since_ms=%" PRId64 " messages=%zu", id, node,
               holder_run(mv->holder), mv->replay_from_ms, replayed);
    } else {
        sync_every_server(id);
        answered = request_parts(subject, id, true, &tail, &len);
    }
    /* The session answers the claim once it has merged the rest: the CONNECT's hand-over
       reaches it after that, whatever way each message takes. */
    rt_msg_t *m = rt_msg_new(RT_CLUSTER_MSG_MOVE_IN, offsetof(rt_cluster_move_in_t, bytes) + len);
    bool delivered = false;
    if (m) {
        ((rt_cluster_move_in_t *)(void *)m->data)->claimer = mv->reply_to;
        ((rt_cluster_move_in_t *)(void *)m->data)->lease = mv->lease;
        if (len)
            memcpy(((rt_cluster_move_in_t *)(void *)m->data)->bytes, tail, len);
        delivered = rt_send_msg(mv->session, m) == 0;
    }
    free(tail);
    atomic_fetch_add_explicit(answered && delivered ? &rt__cluster.sessions_moved_in
                                                    : &rt__cluster.sessions_move_failed,
                              1, memory_order_relaxed);
    if (m && !delivered) { /* the session ended before MOVE_IN could reach it */
        rt_cluster_move_ended(mv->reply_to, mv->lease, id);
        return;
    }
    if (!answered || !delivered)
        rt_log(RT_LOG_WARNING, "cluster.session_tail_lost",
               "client=%s from=%s run=%s what its old node queued after the move did not arrive",
               id, node, holder_run(mv->holder));
    if (!delivered)
        rt__cluster_move_unmerged(mv);
}

void rt_cluster_move_ended(rt_pid_t claimer, uint32_t lease, const char *client_id)
{
    rt_log(RT_LOG_WARNING, "cluster.session_move_ended",
           "client=%s a session that moved here ended before it took the rest; its CONNECT goes "
           "on without it",
           client_id);
    claim_ours(claimer, lease);
}

void rt__cluster_move_unmerged(const move_t *mv)
{
    claim_ours(mv->reply_to, mv->lease);
}

static bool send_claim(rt_pid_t reply_to, const char *id, size_t len, bool want_session,
                       bool verify)
{
    if (!rt__cluster.on)
        return false;
    rt_msg_t *m = rt_msg_new(MSG_CLAIM, sizeof(claim_t) + len);
    /* No registry reachable yet (JetStream not answering since the start): unclaimed. */
    if (!m || len >= RT_CLIENT_TEXT_MAX ||
        !atomic_load_explicit(&rt__cluster.kv_ready, memory_order_acquire)) {
        rt_msg_free(m);
        atomic_fetch_add_explicit(&rt__cluster.claims_failed, !verify, memory_order_relaxed);
        rt_cluster_claimed_t r = {.status = RT_EAGAIN};
        return rt_send(reply_to, RT_CLUSTER_MSG_CLAIMED, &r, sizeof(r)) == 0;
    }
    claim_t *cl = (claim_t *)(void *)m->data;
    cl->reply_to = reply_to;
    cl->want_session = want_session;
    cl->verify = verify;
    cl->taken = false;
    cl->len = (uint32_t)len;
    memcpy(cl->id, id, len);
    return rt_send_msg(atomic_load_explicit(&rt__cluster.kv_pid, memory_order_acquire), m) == 0;
}

bool rt_cluster_claim(rt_pid_t reply_to, const char *id, size_t len, bool want_session)
{
    return send_claim(reply_to, id, len, want_session, false);
}

bool rt_cluster_verify(rt_pid_t reply_to, const char *id, size_t len)
{
    return send_claim(reply_to, id, len, false, true);
}

void rt_cluster_set_importer(rt_cluster_import_fn fn)
{
    rt__cluster.import = fn;
}

/* An answer for the cluster actor to send, in parts (rt__cluster_send_reply). */
static void answer(const char *reply, size_t rlen, const void *bytes, size_t len)
{
    rt_msg_t *m = rlen ? rt_msg_new(MSG_REPLY, sizeof(reply_t) + rlen + len) : NULL;
    if (!m)
        return;
    reply_t *r = (reply_t *)(void *)m->data;
    r->subject_len = (uint32_t)rlen;
    r->data_len = (uint32_t)len;
    memcpy(r->text, reply, rlen);
    if (len)
        memcpy(r->text + rlen, bytes, len);
    rt_send_msg(atomic_load_explicit(&rt__cluster.out_pid, memory_order_acquire), m);
}

void rt_cluster_move_answer(const rt_cluster_move_t *req, const void *bytes, size_t len)
{
    if (len)
        atomic_fetch_add_explicit(&rt__cluster.sessions_moved_out, req->phase == 1,
                                  memory_order_relaxed);
    answer(req->reply, req->reply_len, bytes, len);
}

void rt_cluster_answer(const char *reply, const void *bytes, size_t len)
{
    answer(reply, strlen(reply), bytes, len);
}

void rt_cluster_set_admin(rt_cluster_admin_fn fn)
{
    rt__cluster.admin = fn;
}

/* In cluster_in: another node's administrator asks this node (a request line). */
void rt__cluster_admin_asked(natsMsg *nm)
{
    RT_ASSERT(RT_CLUSTER_ON(in_pid));
    const char *reply = natsMsg_GetReply(nm);
    int len = natsMsg_GetDataLength(nm);
    int64_t age;
    if (!reply || !reply[0] || !rt__cluster_verified(nm, "admin question", true, &age))
        return;
    static const char busy[] = "503 this node cannot answer now\n";
    if (!rt__cluster.admin || len <= 0 || len > 4096 ||
        !rt__cluster.admin(natsMsg_GetData(nm), (size_t)len, reply))
        answer(reply, strlen(reply), busy, sizeof(busy) - 1);
}

bool rt_cluster_client_holder(const char *id, char *node, size_t cap)
{
    char key[3 * RT_CLIENT_TEXT_MAX + 1];
    if (!atomic_load_explicit(&rt__cluster.kv_ready, memory_order_acquire) ||
        rt_kv_key_of_topic(id, strlen(id), key, sizeof(key)) <= 0)
        return false;
    kvEntry *e = NULL;
    if (kvStore_Get(&e, rt__cluster.clients, key) != NATS_OK)
        return false;
    snprintf(node, cap, "%.*s", (int)strcspn(kvEntry_ValueString(e), " "), kvEntry_ValueString(e));
    kvEntry_Destroy(e);
    return node[0] != 0;
}

bool rt_cluster_ask_node(const char *node, const char *line, uint8_t **answer_out, size_t *len)
{
    char subject[RT_CONF_NODE_MAX * 2 + 24];
    rt__cluster_node_subject(node, "admin", subject, sizeof(subject));
    return rt__cluster.on && request_parts(subject, line, false, answer_out, len) && *len;
}

/*
** In cluster_in: another node claims an id (phase 1) or takes the rest of a session that is
** moving (phase 2). A session's holder answers itself (RT_CLUSTER_MSG_MOVE_OUT); otherwise
** a client here ends as a takeover and the answer is "nothing".
*/
void rt__cluster_give_up(natsMsg *nm, uint32_t phase)
{
    RT_ASSERT(RT_CLUSTER_ON(in_pid) && (phase == 1 || phase == 2));
    char id[RT_CLIENT_TEXT_MAX];
    int len = natsMsg_GetDataLength(nm);
    int64_t age;
    if (!rt__cluster_verified(nm, phase == 1 ? "takeover" : "handover", true, &age))
        return;
    /* Its sender stopped waiting and went its lease's way: ending a client now could end one
       that claimed the id since (this node was frozen with the request in its socket). */
    if (phase == 1 && age > TAKEOVER_WAIT_MS + CLOCKS_APART_MS) {
        atomic_fetch_add_explicit(&rt__cluster.stale_requests, 1, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "cluster.takeover_stale", "client=%.*s age_ms=%" PRId64 " dropped",
               len > 200 ? 200 : len, natsMsg_GetData(nm), age);
        return;
    }
    snprintf(id, sizeof(id), "%.*s", len, natsMsg_GetData(nm));
    rt_pid_t holder = (size_t)len < sizeof(id) ? rt_broker_lookup_client(id) : 0;
    const char *reply = natsMsg_GetReply(nm), *want = NULL;
    size_t rlen = reply ? strlen(reply) : 0;
    if (holder && (phase == 2 || natsMsgHeader_Get(nm, H_WANT, &want) == NATS_OK)) {
        rt_msg_t *m = rt_msg_new(RT_CLUSTER_MSG_MOVE_OUT, sizeof(rt_cluster_move_t) + rlen);
        if (m) {
            rt_cluster_move_t *mv = (rt_cluster_move_t *)(void *)m->data;
            mv->phase = phase;
            mv->reply_len = (uint32_t)rlen;
            memcpy(mv->reply, reply, rlen);
            if (rt_send_msg(holder, m) == 0)
                return;
        }
    }
    rt_pid_t claimer = 0;
    if (!holder && phase == 1 && (size_t)len < sizeof(id))
        claimer = claimer_of(id);
    if ((holder || claimer) && phase == 1 &&
        rt_exit_signal(holder ? holder : claimer, RT_REASON_TAKEOVER) == 0) {
        atomic_fetch_add_explicit(&rt__cluster.given_up, 1, memory_order_relaxed);
        rt_log(RT_LOG_INFO, "cluster.client_given_up", "client=%s claimed by another node%s", id,
               holder ? "" : " (its claim here had just been made)");
    }
    answer(reply, rlen, NULL, 0);
}

/* In cluster_in: another node's sync request (above), answered with this node's name. */
void rt__cluster_sync_asked(natsMsg *nm)
{
    RT_ASSERT(RT_CLUSTER_ON(in_pid));
    const char *reply = natsMsg_GetReply(nm);
    int64_t age;
    if (reply && reply[0] && rt__cluster_verified(nm, "sync", true, &age))
        answer(reply, strlen(reply), rt__cluster.node, strlen(rt__cluster.node));
}

/* In the cluster actor: an answer in parts that fit NATS's max_payload ("0 0": none). */
void rt__cluster_send_reply(const reply_t *r)
{
    RT_ASSERT(RT_CLUSTER_ON(out_pid));
    char subject[RT_SUBJECT_MAX + 1];
    if (r->subject_len > RT_SUBJECT_MAX)
        return;
    memcpy(subject, r->text, r->subject_len);
    subject[r->subject_len] = 0;
    const char *data = r->text + r->subject_len;
    int64_t max = natsConnection_GetMaxPayload(rt__cluster.nc);
    size_t part = max > 8192 ? (size_t)max - 4096 : 4096; /* room for the headers */
    unsigned n = (unsigned)((r->data_len + part - 1) / part);
    natsStatus s = NATS_OK;
    for (unsigned i = 0; s == NATS_OK && i < (n ? n : 1); i++) {
        size_t at = (size_t)i * part, len = n ? r->data_len - at : 0;
        char h[32];
        snprintf(h, sizeof(h), "%u %u", n ? i + 1 : 0, n);
        natsMsg *nm = NULL;
        s = natsMsg_Create(&nm, subject, NULL, data + at, (int)(len < part ? len : part));
        if (s == NATS_OK)
            s = natsMsgHeader_Set(nm, H_PART, h);
        if (s == NATS_OK)
            s = rt__cluster_sign(nm);
        if (s == NATS_OK)
            s = natsConnection_PublishMsg(rt__cluster.nc, nm);
        natsMsg_Destroy(nm);
    }
    if (s != NATS_OK)
        rt_log(RT_LOG_WARNING, "cluster.answer_failed", "subject=%s bytes=%u %s", subject,
               r->data_len, natsStatus_GetText(s));
}
