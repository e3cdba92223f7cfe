/*
** Delayed publish (delayed.h): the held messages in one min-heap by due time under a mutex,
** and the actor that publishes them when they come due.
*/
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "delayed.h"
#include "group.h"
#include "log.h"
#include "message.h"
#include "route.h"
#include "rule_engine.h"
#include "store.h"

enum {
    DELAYED_WAKE = RT_MSG_USER + 0x5900, /* the earliest message changed: look again */
    DELAYED_TICK,                        /* the timer for the earliest one fired */
};

#define DELAYED_PER_TURN 256 /* messages one turn publishes; the rest in the next */

typedef struct {
    int64_t due_ms;
    uint64_t id;
    rt_bin_t *bin;
} held_t;

static struct {
    pthread_mutex_t lock;
    held_t *heap; /* a binary min-heap by (due_ms, id): the earliest at 0 */
    size_t n, cap;
    uint64_t bytes;
    uint64_t next_id;
    _Atomic(rt_pid_t) pid;
    atomic_uint_fast64_t published, refused_limit, refused_invalid, deleted;
} dl = {.lock = PTHREAD_MUTEX_INITIALIZER, .next_id = 1};

/* What one held message costs the list: its binary and its slot. */
static uint64_t held_bytes(const rt_bin_t *bin)
{
    return rt_bin_len(bin) + sizeof(held_t);
}

static bool earlier(const held_t *a, const held_t *b)
{
    return a->due_ms < b->due_ms || (a->due_ms == b->due_ms && a->id < b->id);
}

static void swap_held(size_t i, size_t j)
{
    held_t t = dl.heap[i];
    dl.heap[i] = dl.heap[j];
    dl.heap[j] = t;
}

static size_t sift_up(size_t i)
{
    while (i > 0 && earlier(&dl.heap[i], &dl.heap[(i - 1) / 2])) {
        swap_held(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    return i;
}

static void sift_down(size_t i)
{
    for (;;) {
        size_t least = i, l = 2 * i + 1, r = l + 1;
        if (l < dl.n && earlier(&dl.heap[l], &dl.heap[least]))
            least = l;
        if (r < dl.n && earlier(&dl.heap[r], &dl.heap[least]))
            least = r;
        if (least == i)
            return;
        swap_held(i, least);
        i = least;
    }
}

/* Under the lock: adds one; RT_ENOMEM. Sets *first when it is now the earliest. */
static int push_held(int64_t due_ms, uint64_t id, rt_bin_t *bin, bool *first)
{
    if (dl.n == dl.cap) {
        size_t cap = dl.cap ? 2 * dl.cap : 64;
        held_t *h = realloc(dl.heap, cap * sizeof(*h));
        if (!h)
            return RT_ENOMEM;
        dl.heap = h;
        dl.cap = cap;
    }
    dl.heap[dl.n] = (held_t){.due_ms = due_ms, .id = id, .bin = bin};
    *first = sift_up(dl.n++) == 0;
    dl.bytes += held_bytes(bin);
    return 0;
}

/* Under the lock: takes the one at i out. */
static held_t take_held(size_t i)
{
    held_t h = dl.heap[i];
    dl.heap[i] = dl.heap[--dl.n];
    if (i < dl.n) {
        sift_down(i);
        sift_up(i);
    }
    dl.bytes -= held_bytes(h.bin);
    return h;
}

bool rt_delayed_wanted(const mqtt_str_t *topic)
{
    return topic->len >= sizeof(RT_DELAYED_PREFIX) - 1 &&
           memcmp(topic->p, RT_DELAYED_PREFIX, sizeof(RT_DELAYED_PREFIX) - 1) == 0 &&
           RT_LIVE(delayed_publish);
}

int rt_delayed_split(mqtt_str_t *topic, uint32_t *seconds)
{
    const uint8_t *p = topic->p + sizeof(RT_DELAYED_PREFIX) - 1, *end = topic->p + topic->len;
    uint64_t s = 0;
    const uint8_t *digits = p;
    while (p < end && *p >= '0' && *p <= '9' && p - digits < 10)
        s = s * 10 + (uint64_t)(*p++ - '0');
    if (p == digits || s > RT_DELAYED_MAX_S || p == end || *p != '/' || p + 1 == end)
        return RT_EINVAL;
    p++;
    *seconds = (uint32_t)s;
    *topic = (mqtt_str_t){p, (uint32_t)(end - p)};
    return 0;
}

void rt_delayed_count_invalid(void)
{
    atomic_fetch_add(&dl.refused_invalid, 1);
}

int rt_delayed_add(rt_bin_t *bin, uint32_t seconds, rt_pid_t ack_pid, uint64_t token,
                   uint32_t *waits)
{
    *waits = 0;
    int64_t due = (int64_t)rt_wall_ms() + (int64_t)seconds * 1000;
    uint64_t bytes = held_bytes(bin);
    pthread_mutex_lock(&dl.lock);
    if (dl.n >= (size_t)RT_LIVE(max_delayed) ||
        dl.bytes + bytes > (uint64_t)RT_LIVE(max_delayed_bytes)) {
        pthread_mutex_unlock(&dl.lock);
        atomic_fetch_add(&dl.refused_limit, 1);
        return RT_ELIMIT;
    }
    uint64_t id = dl.next_id++;
    bool first;
    int rc = push_held(due, id, rt_bin_retain(bin), &first);
    if (rc) {
        pthread_mutex_unlock(&dl.lock);
        rt_bin_release(bin);
        return rc;
    }
    /* Sent under the lock: the actor cannot take it, and send its row's delete, first. */
    if (rt_store_enabled()) {
        rt_store_delayed_add(id, due, bin, ack_pid, token);
        *waits = ack_pid != 0;
    }
    pthread_mutex_unlock(&dl.lock);
    rt_pid_t pid = atomic_load(&dl.pid);
    if (first && pid)
        rt_send(pid, DELAYED_WAKE, NULL, 0);
    return 0;
}

static int by_due(const void *a, const void *b)
{
    return earlier(a, b) ? -1 : earlier(b, a) ? 1 : 0;
}

size_t rt_delayed_each(void (*fn)(const rt_delayed_entry_t *e, void *arg), void *arg, size_t max)
{
    pthread_mutex_lock(&dl.lock);
    size_t n = dl.n;
    /* The heap's order is not by time: a sorted copy of its slots (not of the messages). */
    held_t *sorted = fn && n ? malloc(n * sizeof(*sorted)) : NULL;
    if (sorted) {
        memcpy(sorted, dl.heap, n * sizeof(*sorted));
        qsort(sorted, n, sizeof(*sorted), by_due);
        for (size_t i = 0; i < n && i < max; i++)
            fn(&(rt_delayed_entry_t){.id = sorted[i].id,
                                     .due_ms = sorted[i].due_ms,
                                     .bin = sorted[i].bin},
               arg);
        free(sorted);
    }
    pthread_mutex_unlock(&dl.lock);
    return n;
}

int rt_delayed_del(uint64_t id)
{
    pthread_mutex_lock(&dl.lock);
    size_t i = 0;
    while (i < dl.n && dl.heap[i].id != id)
        i++;
    if (i == dl.n) {
        pthread_mutex_unlock(&dl.lock);
        return RT_ENOTFOUND;
    }
    held_t h = take_held(i);
    if (rt_store_enabled())
        rt_store_delayed_del(id);
    pthread_mutex_unlock(&dl.lock);
    rt_bin_release(h.bin);
    atomic_fetch_add(&dl.deleted, 1);
    return 0;
}

/* ---- The publishing actor ---- */

/* A published message whose row stays until every copy it made is stored. */
typedef struct {
    uint64_t id;
    uint32_t remaining;
    bool failed;
} wait_t;

typedef struct {
    rt_ref_t timer;
    int64_t armed_due; /* when the pending timer fires (Unix ms); 0: none */
    int64_t charged;   /* the list's bytes this actor carries (rt_charge) */
    wait_t *waits;
    size_t nwaits, capwaits;
} delayed_state_t;

/* Routes one message that came due, and has the rules see it, as its client's PUBLISH would. */
static void publish_held(rt_actor_t *self, delayed_state_t *st, held_t *h)
{
    bool keep = rt_store_enabled();
    rt_pid_t me = keep ? rt_self(self) : 0;
    rt_route_out_t out = {0};
    rt_route(0, h->bin, me, h->id, &out);
    uint32_t waits = out.nacks;
    if (rt_rules_wants_publish()) {
        rt_message_t m;
        rt_message_view(h->bin, &m);
        rt_rule_origin_t o = {.clientid = m.clientid ? m.clientid : "",
                              .username = m.username,
                              .ts_ms = rt_wall_ms()};
        bool promised = false;
        rt_rules_publish(&o, h->bin, me, h->id, &promised);
        waits += promised;
    }
    atomic_fetch_add(&dl.published, 1);
    rt_bin_release(h->bin);
    if (!keep)
        return;
    if (waits && rt_grow_on(self, &st->waits, &st->capwaits, st->nwaits + 1, sizeof(wait_t), 8,
                            RT_OBJ_LEAF) == 0) {
        st->waits[st->nwaits++] = (wait_t){.id = h->id, .remaining = waits};
        return;
    }
    rt_store_delayed_del(h->id); /* nothing to wait for (or no memory to: not waited) */
}

/* A copy of a published message was stored (status 0) or not. */
static void copy_committed(delayed_state_t *st, uint64_t id, int32_t status)
{
    for (size_t i = 0; i < st->nwaits; i++) {
        wait_t *w = &st->waits[i];
        if (w->id != id)
            continue;
        w->failed |= status < 0;
        if (--w->remaining)
            return;
        if (w->failed) /* kept: the next start publishes it again rather than lose a copy */
            rt_log(RT_LOG_WARNING, "delayed.copy_not_stored",
                   "id=%llu kept in state.db, published again at the next start",
                   (unsigned long long)id);
        else
            rt_store_delayed_del(id);
        st->waits[i] = st->waits[--st->nwaits];
        return;
    }
}

/* Publishes what is due (a turn's worth), then sets the timer for the next. */
static void run_due(rt_actor_t *self, delayed_state_t *st)
{
    int64_t now = (int64_t)rt_wall_ms();
    int64_t next = 0;
    size_t done = 0;
    for (;;) {
        pthread_mutex_lock(&dl.lock);
        bool due = dl.n && dl.heap[0].due_ms <= now && done < DELAYED_PER_TURN;
        held_t h = due ? take_held(0) : (held_t){0};
        if (!due)
            next = dl.n ? dl.heap[0].due_ms : 0;
        pthread_mutex_unlock(&dl.lock);
        if (!due)
            break;
        publish_held(self, st, &h);
        done++;
    }
    if (next && next <= now) { /* the turn's budget ran out: carry on after the others */
        rt_send(rt_self(self), DELAYED_WAKE, NULL, 0);
        return;
    }
    if (next && (!st->armed_due || next < st->armed_due)) {
        if (st->timer)
            rt_cancel_timer(st->timer); /* one that fired meanwhile only looks again */
        if (rt_send_after_tag((uint64_t)(next - now), rt_self(self), DELAYED_TICK, &st->timer) == 0)
            st->armed_due = next;
    }
}

static void delayed_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    delayed_state_t *st = state;
    switch (m->tag) {
    case DELAYED_TICK:
        st->timer = 0;
        st->armed_due = 0;
        run_due(self, st);
        break;
    case DELAYED_WAKE:
        run_due(self, st);
        break;
    case RT_STORE_MSG_COMMITTED:
        if (m->len >= sizeof(rt_store_committed_t)) {
            rt_store_committed_t c;
            memcpy(&c, m->data, sizeof(c));
            copy_committed(st, c.token, c.status);
        }
        break;
    case RT_RULES_MSG_DURABLE:
        if (m->len >= sizeof(rt_rules_durable_t)) {
            rt_rules_durable_t d;
            memcpy(&d, m->data, sizeof(d));
            copy_committed(st, d.token, d.status);
        }
        break;
    }
    pthread_mutex_lock(&dl.lock);
    int64_t bytes = (int64_t)dl.bytes;
    pthread_mutex_unlock(&dl.lock);
    rt_charge(self, bytes - st->charged);
    st->charged = bytes;
}

static int delayed_init(rt_actor_t *self, void *state, void *arg)
{
    (void)state;
    (void)arg;
    atomic_store(&dl.pid, rt_self(self));
    /* What came due while rtd was down (or this actor was being restarted) goes now. */
    return rt_send(rt_self(self), DELAYED_WAKE, NULL, 0);
}

static void delayed_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    (void)state;
    (void)reason;
    rt_pid_t me = rt_self(self);
    atomic_compare_exchange_strong(&dl.pid, &me, 0);
}

static const char *delayed_tag_name(uint32_t tag)
{
    return tag == DELAYED_WAKE ? "wake" : tag == DELAYED_TICK ? "due" : "";
}

static const rt_actor_type_t delayed_type = {
    .name = "delayed",
    .state_size = sizeof(delayed_state_t),
    .init = delayed_init,
    .handle = delayed_handle,
    .terminate = delayed_terminate,
    .tag_name = delayed_tag_name,
};

int rt_delayed_start(rt_pid_t sup)
{
    rt_child_spec_t c = {.name = RT_DELAYED_NAME, .type = &delayed_type, .restart = RT_PERMANENT};
    return rt_group_start_one(sup, RT_DELAYED_GROUP, RT_PERMANENT, &c);
}

static void restore_one(uint64_t id, int64_t due_ms, const void *packet, size_t len, void *arg)
{
    (void)arg;
    rt_bin_t *bin = rt_message_parse(packet, len);
    bool first;
    if (!bin || push_held(due_ms, id, bin, &first) != 0) {
        rt_log(RT_LOG_ERROR, "delayed.restore_failed", "id=%llu %s", (unsigned long long)id,
               bin ? "out of memory" : "unreadable message");
        if (bin)
            rt_bin_release(bin);
        return;
    }
    if (id >= dl.next_id)
        dl.next_id = id + 1;
}

int rt_delayed_restore(void)
{
    pthread_mutex_lock(&dl.lock);
    int rc = rt_store_load_delayed(restore_one, NULL);
    pthread_mutex_unlock(&dl.lock);
    return rc;
}

void rt_delayed_free(void)
{
    pthread_mutex_lock(&dl.lock);
    for (size_t i = 0; i < dl.n; i++)
        rt_bin_release(dl.heap[i].bin);
    free(dl.heap);
    dl.heap = NULL;
    dl.n = dl.cap = 0;
    dl.bytes = 0;
    pthread_mutex_unlock(&dl.lock);
}

void rt_delayed_stats(rt_delayed_stats_t *out)
{
    pthread_mutex_lock(&dl.lock);
    out->held = dl.n;
    out->bytes = dl.bytes;
    pthread_mutex_unlock(&dl.lock);
    out->published = atomic_load(&dl.published);
    out->refused_limit = atomic_load(&dl.refused_limit);
    out->refused_invalid = atomic_load(&dl.refused_invalid);
    out->deleted = atomic_load(&dl.deleted);
}
