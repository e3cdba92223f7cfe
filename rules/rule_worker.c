/*
** The rule worker actor: runs the rules a hand-over names in its own Lua state, batches
** their rows per sink target, submits the batches, and answers durable publishes once
** their rows are committed.
**
** Durable acks: a publish that waits for its rows gets an entry (dur_t) holding one count
** while its rules run and one per batch its rows went into; a submitted batch becomes a
** flight slot (flight_t), with those entries, that the sink's commit (or refusal)
** resolves. The publisher's ack goes when the count drops to zero, with the first
** failure seen.
**
** Restarts: a flight keeps its rows until the sink answers, so a batch that a dying sink
** never took (it answers RT_ENOPROC) is submitted again to its next incarnation; rows
** that arrive that way may follow rows submitted meanwhile, so order within a topic can
** break once, at a sink's restart, and nothing is lost or written twice. A worker that
** dies answers its durable publishers RT_ENOPROC (those whose hand-over it never ran
** too, from its mailbox); the next one starts with a fresh Lua state.
*/
#include <stdlib.h>
#include <string.h>

#include "message.h"
#include "rule_internal.h"

typedef struct batch_s {
    rt_buf_t rows; /* BSON documents back to back */
    uint32_t nrows;
    uint32_t *durs; /* durable entries with rows in this batch */
    uint32_t ndurs;
    size_t capdurs;
} batch_t;

typedef struct dur_s {
    rt_pid_t pid; /* 0: the entry is free */
    uint64_t token;
    uint32_t remaining; /* holds: one while the message runs, one per batch holding its rows */
    int32_t status;
    uint32_t next_free;
} dur_t;

typedef struct flight_s {
    uint32_t gen; /* in the submit's token, so a late ack (an earlier try, a reused slot) is
                     ignored */
    bool used;
    bool parked; /* its sink died before taking it: submitted again at RT_RULES_TAG_RESUBMIT */
    uint32_t *durs;
    uint32_t ndurs;
    size_t capdurs;
    uint32_t next_free;
    uint32_t nrows;
    rt_sink_t *sink;
    rt_bin_t *rows;     /* the worker's own references, until the sink answers */
    rt_bin_t *opts;     /* NULL: none */
    uint64_t parked_ms; /* when the sink first failed to take it; 0: it has not */
} flight_t;

typedef struct worker_s {
    unsigned index;
    rt_pid_t self;
    rt_rule_worker_stats_t *st;
    rt_rule_set_t *set; /* the set the batches belong to (a reference), or NULL */
    batch_t *batches;   /* one per target of set */
    uint32_t nbatches;
    bool flush_pending;       /* a RT_RULES_TAG_FLUSH is on its way */
    bool resubmit_pending;    /* a RT_RULES_TAG_RESUBMIT is on its way */
    rt_buf_t stage;           /* the rows of the rule that just ran */
    dur_t *durs;              /* durable entries: in use, or chained from dur_free */
    uint32_t ndurs, dur_free; /* entries ever used; the first free one (or NONE) */
    size_t cap_durs;
    flight_t *flights; /* flight slots: in use, or chained from flight_free */
    uint32_t nflights, flight_free;
    size_t cap_flights;
    size_t charged; /* bytes rt_charge'd to the actor: c_bytes and its Lua state (settle) */
    char err[512];
} worker_t;

static void count_bytes(worker_t *w, size_t before, size_t after)
{
    if (after >= before)
        atomic_fetch_add_explicit(&w->st->c_bytes, after - before, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&w->st->c_bytes, before - after, memory_order_relaxed);
}

/* rt_grow, with the growth counted in the worker's c_bytes. */
static bool grow_counted(worker_t *w, void *arr, size_t *cap, size_t need, size_t elem)
{
    size_t before = *cap;
    if (rt_grow(arr, cap, need, elem, 8))
        return false;
    count_bytes(w, before * elem, *cap * elem);
    return true;
}

/*
** Appends to b, its growth counted in c_bytes. False when out of memory: b keeps what it
** had and stays usable (its sticky oom is cleared), as one batch's failure must not refuse
** every later row.
*/
static bool append_counted(worker_t *w, rt_buf_t *b, const void *p, size_t n)
{
    size_t before = b->cap, at = b->len;
    rt_buf_add(b, p, n);
    count_bytes(w, before, b->cap);
    if (!b->oom)
        return true;
    rt_buf_truncate(b, at);
    return false;
}

static void free_counted(worker_t *w, rt_buf_t *b)
{
    count_bytes(w, b->cap, 0);
    rt_buf_free(b);
}

static void dur_done(worker_t *w, uint32_t d)
{
    dur_t *e = &w->durs[d];
    rt__rules_ack_durable(e->pid, e->token, e->status);
    e->pid = 0;
    e->next_free = w->dur_free;
    w->dur_free = d;
    atomic_fetch_sub_explicit(&w->st->pending_durable, 1, memory_order_relaxed);
}

/* Drops one of entry d's holds, noting status if it is the first failure. */
static void dur_put(worker_t *w, uint32_t d, int32_t status)
{
    RT_ASSERT(d < w->ndurs && w->durs[d].pid != 0 && w->durs[d].remaining > 0);
    dur_t *e = &w->durs[d];
    if (status < 0 && e->status == 0)
        e->status = status;
    if (--e->remaining == 0)
        dur_done(w, d);
}

/* A new durable entry (remaining 1), or RT_RULES_NONE if out of memory (then no ack can be
   promised). */
static uint32_t dur_new(worker_t *w, rt_pid_t pid, uint64_t token)
{
    RT_ASSERT(pid != 0);
    uint32_t d = w->dur_free;
    if (d != RT_RULES_NONE)
        w->dur_free = w->durs[d].next_free;
    else if (grow_counted(w, &w->durs, &w->cap_durs, w->ndurs + 1, sizeof(dur_t)))
        d = w->ndurs++;
    else
        return RT_RULES_NONE;
    w->durs[d] = (dur_t){pid, token, 1, 0, RT_RULES_NONE};
    atomic_fetch_add_explicit(&w->st->pending_durable, 1, memory_order_relaxed);
    return d;
}

/* A free flight slot, or RT_RULES_NONE if out of memory. */
static uint32_t flight_new(worker_t *w)
{
    uint32_t slot = w->flight_free;
    if (slot != RT_RULES_NONE)
        w->flight_free = w->flights[slot].next_free;
    else if (grow_counted(w, &w->flights, &w->cap_flights, w->nflights + 1, sizeof(flight_t)))
        w->flights[slot = w->nflights++] = (flight_t){0};
    else
        return RT_RULES_NONE;
    RT_ASSERT(!w->flights[slot].used && w->flights[slot].ndurs == 0);
    w->flights[slot].used = true;
    return slot;
}

static void flight_resolve(worker_t *w, uint32_t slot, int32_t status)
{
    flight_t *f = &w->flights[slot];
    RT_ASSERT(f->used);
    for (uint32_t i = 0; i < f->ndurs; i++)
        dur_put(w, f->durs[i], status);
    rt_bin_release(f->rows);
    rt_bin_release(f->opts);
    f->rows = f->opts = NULL;
    f->ndurs = 0;
    f->used = f->parked = false;
    f->parked_ms = 0;
    f->gen++;
    f->next_free = w->flight_free;
    w->flight_free = slot;
}

/* The flight's sink did not take it (its actor died): it waits for the next incarnation. */
static void park_flight(worker_t *w, uint32_t slot)
{
    flight_t *f = &w->flights[slot];
    f->parked = true;
    if (!f->parked_ms)
        f->parked_ms = rt_mono_ms();
    if (!w->resubmit_pending &&
        rt_send_after_tag(RT_RULES_RESUBMIT_MS, w->self, RT_RULES_TAG_RESUBMIT, NULL) == 0)
        w->resubmit_pending = true;
    if (!w->resubmit_pending) /* no timer (no memory): it would wait for good */
        flight_resolve(w, slot, RT_ENOMEM);
}

/* Hands the flight's rows to its sink (again); its durable entries wait on the answer. */
static void submit_flight(worker_t *w, uint32_t slot)
{
    flight_t *f = &w->flights[slot];
    f->gen++; /* an answer to an earlier try is not this one's */
    int rc = rt_sink_submit(f->sink, rt_bin_retain(f->rows), f->nrows,
                            f->opts ? rt_bin_retain(f->opts) : NULL, w->self,
                            (uint64_t)f->gen << 32 | slot);
    atomic_fetch_add_explicit(&w->st->batches, 1, memory_order_relaxed);
    if (rc == RT_ENOPROC)
        park_flight(w, slot);
    else if (rc) /* refused: the rows are gone; the refusal's ack finds gen moved on */
        flight_resolve(w, slot, rc);
}

/* The flights parked by a sink's restart go again, or fail once they waited too long. */
static void resubmit_parked(worker_t *w)
{
    w->resubmit_pending = false;
    uint64_t now = rt_mono_ms();
    for (uint32_t i = 0; i < w->nflights; i++) {
        flight_t *f = &w->flights[i];
        if (!f->used || !f->parked)
            continue;
        f->parked = false;
        if (now - f->parked_ms >= RT_RULES_RESUBMIT_MAX_MS)
            flight_resolve(w, i, RT_ENOPROC);
        else
            submit_flight(w, i);
    }
}

/* Submits target t's batch as a flight that holds its rows and durable entries. */
static void flush_batch(worker_t *w, uint32_t t)
{
    RT_ASSERT(t < w->nbatches && w->nbatches == w->set->ntargets);
    batch_t *b = &w->batches[t];
    if (b->nrows == 0)
        return;
    rt_rule_target_t *tg = &w->set->targets[t];
    rt_bin_t *rows = rt_bin_new(b->rows.data, b->rows.len);
    uint32_t nrows = b->nrows;
    rt_buf_truncate(&b->rows, 0);
    b->nrows = 0;
    uint32_t slot = rows ? flight_new(w) : RT_RULES_NONE;
    if (slot == RT_RULES_NONE) {
        /* No memory to keep it: the rows go unwatched, if at all, and whoever waits fails. */
        for (uint32_t i = 0; i < b->ndurs; i++)
            dur_put(w, b->durs[i], RT_ENOMEM);
        b->ndurs = 0;
        if (rows) {
            rt_sink_submit(tg->sink, rows, nrows, tg->opts ? rt_bin_retain(tg->opts) : NULL, 0, 0);
            atomic_fetch_add_explicit(&w->st->batches, 1, memory_order_relaxed);
        }
        return;
    }
    /* The batch's list moves to the flight; the flight's (empty) one comes back. */
    flight_t *f = &w->flights[slot];
    uint32_t *tmp = f->durs;
    size_t tc = f->capdurs;
    f->durs = b->durs, f->capdurs = b->capdurs, f->ndurs = b->ndurs;
    b->durs = tmp, b->capdurs = tc;
    b->ndurs = 0;
    f->sink = tg->sink;
    f->rows = rows;
    f->nrows = nrows;
    f->opts = tg->opts ? rt_bin_retain(tg->opts) : NULL;
    submit_flight(w, slot);
}

static void flush_all(worker_t *w)
{
    for (uint32_t t = 0; t < w->nbatches; t++)
        flush_batch(w, t);
}

static void free_batches(worker_t *w)
{
    for (uint32_t t = 0; t < w->nbatches; t++) {
        free_counted(w, &w->batches[t].rows);
        free(w->batches[t].durs);
        count_bytes(w, w->batches[t].capdurs * sizeof(uint32_t), 0);
    }
    free(w->batches);
    count_bytes(w, w->nbatches * sizeof(batch_t), 0);
    w->batches = NULL;
    w->nbatches = 0;
}

/* Moves the worker to set s: what was buffered for the old set is submitted first. */
static bool switch_set(worker_t *w, rt_rule_set_t *s)
{
    flush_all(w);
    for (uint32_t t = 0; t < w->nbatches; t++)
        RT_ASSERT(w->batches[t].nrows == 0 && w->batches[t].ndurs == 0);
    free_batches(w);
    rt__rule_set_release(w->set);
    w->set = NULL;
    if (s->ntargets) {
        w->batches = calloc(s->ntargets, sizeof(batch_t));
        if (!w->batches)
            return false;
        count_bytes(w, 0, s->ntargets * sizeof(batch_t));
    }
    w->nbatches = s->ntargets;
    w->set = rt__rule_set_retain(s);
    return true;
}

static void record_failure(rt_rule_t *r, rt_rule_outcome_t o, const char *err)
{
    RT_ASSERT(o >= RT_RULE_FAIL_EXCEPTION && o <= RT_RULE_FAIL_MEMORY);
    atomic_fetch_add_explicit(&r->m->failed[o - RT_RULE_FAIL_EXCEPTION], 1, memory_order_relaxed);
    pthread_mutex_lock(&r->m->lock);
    size_t n = strnlen(err, sizeof(r->m->last_error) - 1);
    memcpy(r->m->last_error, err, n); /* cut to fit */
    r->m->last_error[n] = 0;
    pthread_mutex_unlock(&r->m->lock);
}

/* Adds the staged rows of rule r to its targets' batches, for durable entry d (or NONE). */
static void route_rows(worker_t *w, rt_rule_t *r, uint32_t nrows, uint32_t d)
{
    for (uint32_t i = 0; i < r->ntargets; i++) {
        uint32_t t = r->targets[i];
        RT_ASSERT(t < w->nbatches);
        batch_t *b = &w->batches[t];
        if (!append_counted(w, &b->rows, w->stage.data, w->stage.len)) {
            if (d != RT_RULES_NONE)
                w->durs[d].status = RT_ENOMEM;
            continue;
        }
        b->nrows += nrows;
        if (d != RT_RULES_NONE && (b->ndurs == 0 || b->durs[b->ndurs - 1] != d)) {
            if (grow_counted(w, &b->durs, &b->capdurs, b->ndurs + 1, sizeof(uint32_t))) {
                b->durs[b->ndurs++] = d;
                w->durs[d].remaining++;
            } else {
                w->durs[d].status = RT_ENOMEM;
            }
        }
        if (b->nrows >= RT_RULES_BATCH_ROWS || b->rows.len >= RT_RULES_BATCH_BYTES)
            flush_batch(w, t);
    }
}

/* What the rules of one hand-over read: its strings, and the message it carries. */
static rt_rule_input_t work_input(const rt_rule_work_t *wk, const rt_bin_t *bin)
{
    const char *strs[RT_RULE_NSTRS];
    const char *p = (const char *)(wk->rules + wk->nrules);
    for (int i = 0; i < RT_RULE_NSTRS; i++) {
        strs[i] = wk->slen[i] == UINT32_MAX ? NULL : p;
        p += wk->slen[i] == UINT32_MAX ? 0 : wk->slen[i] + 1;
    }
    rt_rule_input_t in = {
        .event = wk->event ? rt_rule_event_name(wk->event) : NULL,
        .topic = strs[RT_RULE_STR_TOPIC],
        .topic_len = strs[RT_RULE_STR_TOPIC] ? wk->slen[RT_RULE_STR_TOPIC] : 0,
        .qos = wk->qos,
        .retain = -1,
        .clientid = strs[RT_RULE_STR_CLIENTID],
        .username = strs[RT_RULE_STR_USERNAME],
        .peer = strs[RT_RULE_STR_PEER],
        .ts_ms = wk->ts_ms,
        .reason_code = wk->reason_code,
        .reason = strs[RT_RULE_STR_REASON],
        .from_clientid = strs[RT_RULE_STR_FROM_CLIENTID],
        .from_username = strs[RT_RULE_STR_FROM_USERNAME],
        .proto_ver = wk->proto_ver,
        .keepalive = wk->keepalive,
        .clean_start = wk->clean_start,
        .protocol = strs[RT_RULE_STR_PROTOCOL],
        .from = strs[RT_RULE_STR_FROM],
        .to = strs[RT_RULE_STR_TO],
        .type = strs[RT_RULE_STR_TYPE],
    };
    if (strs[RT_RULE_STR_BODY]) {
        in.payload = (const uint8_t *)strs[RT_RULE_STR_BODY];
        in.payload_len = wk->slen[RT_RULE_STR_BODY];
    }
    if (bin) {
        /* The connection made the canonical message once; its parts are read in place. */
        rt_message_t msg;
        rt_message_view(bin, &msg);
        in.topic = (const char *)msg.topic.p;
        in.topic_len = msg.topic.len;
        in.payload = msg.payload.p;
        in.payload_len = msg.payload.len;
        in.qos = msg.qos;
        in.retain = msg.retain;
        in.props = msg.props;
    }
    return in;
}

/* Runs the rules of one hand-over and batches their rows. */
static void run_work(worker_t *w, rt_msg_t *m)
{
    rt_rule_work_t *wk = (rt_rule_work_t *)(void *)m->data;
    rt_rule_set_t *s = wk->set;
    RT_ASSERT(s && wk->nrules > 0 && w->index < s->nvms);
    RT_ASSERT(!wk->ack_pid || wk->event == 0); /* only a publish waits for its rows */
    atomic_fetch_add_explicit(&w->st->messages, 1, memory_order_relaxed);
    rt_rule_input_t in = work_input(wk, m->bin);
    if (w->set != s && !switch_set(w, s)) {
        /* No memory for the batches: every rule on this message fails. */
        for (uint32_t i = 0; i < wk->nrules; i++)
            record_failure(&s->rules[wk->rules[i]], RT_RULE_FAIL_MEMORY, "out of memory");
        if (wk->ack_pid)
            rt__rules_ack_durable(wk->ack_pid, wk->ack_token, RT_ENOMEM);
        rt__rule_set_release(s);
        return;
    }
    uint32_t d = RT_RULES_NONE;
    int32_t early = 0;
    if (wk->ack_pid && (d = dur_new(w, wk->ack_pid, wk->ack_token)) == RT_RULES_NONE)
        early = RT_ENOMEM;
    rt_rule_vm_t *vm = s->vms[w->index];
    for (uint32_t i = 0; i < wk->nrules; i++) {
        RT_ASSERT(wk->rules[i] < s->nrules);
        rt_rule_t *r = &s->rules[wk->rules[i]];
        uint32_t nrows = 0;
        size_t staged = w->stage.cap;
        rt_buf_truncate(&w->stage, 0);
        rt_rule_outcome_t o =
            rt_rule_vm_run(vm, wk->rules[i], &in, &w->stage, &nrows, w->err, sizeof(w->err));
        count_bytes(w, staged, w->stage.cap);
        switch (o) {
        case RT_RULE_PASSED:
            RT_ASSERT(nrows > 0 && w->stage.len > 0);
            atomic_fetch_add_explicit(&r->m->passed, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&r->m->rows_out, nrows, memory_order_relaxed);
            route_rows(w, r, nrows, d);
            break;
        case RT_RULE_FILTERED:
            atomic_fetch_add_explicit(&r->m->filtered, 1, memory_order_relaxed);
            break;
        default:
            record_failure(r, o, w->err);
            if (d != RT_RULES_NONE && r->durable && w->durs[d].status == 0)
                w->durs[d].status = RT_EINVAL;
        }
        /* Counted last, so whoever sees matched move also sees the outcome and its error. */
        atomic_fetch_add_explicit(&r->m->matched, 1, memory_order_release);
    }
    if (d != RT_RULES_NONE)
        dur_put(w, d, 0);
    else if (early)
        rt__rules_ack_durable(wk->ack_pid, wk->ack_token, early);
    rt__rule_set_release(s);
    bool buffered = false;
    for (uint32_t t = 0; t < w->nbatches && !buffered; t++)
        buffered = w->batches[t].nrows > 0;
    /* With flush_ms 0 the flush message queues behind what is already in the mailbox:
       one submit per turn. Otherwise a timer: rows gather for flush_ms (or until a batch
       is full) so the sink gets a few large submissions, not one per message. */
    if (buffered && !w->flush_pending &&
        (rt__rules.flush_ms
             ? rt_send_after_tag(rt__rules.flush_ms, w->self, RT_RULES_TAG_FLUSH, NULL)
             : rt_send(w->self, RT_RULES_TAG_FLUSH, NULL, 0)) == 0)
        w->flush_pending = true;
}

/*
** A restarted worker's Lua state for the current set is a new one, whatever its
** predecessor left in the old (what rules kept between calls, a state near its cap).
** The swap is written under the engine's lock: the admin reads a state's size.
*/
static void fresh_state(worker_t *w)
{
    rt_rule_set_t *s = rt__rules_current();
    rt_rule_vm_t *vm;
    if (s && rt__rule_set_vm(s, &vm, w->err, sizeof(w->err)) == 0) {
        rt__rules_lock_write();
        rt_rule_vm_t *old = s->vms[w->index];
        s->vms[w->index] = vm;
        rt__rules_unlock();
        rt_rule_vm_free(old);
    }
    rt__rule_set_release(s);
}

/*
** What the worker holds outside its heap is charged to it, so it shows as the worker's
** ext_bytes and counts toward its max_heap: its row buffers and durable-ack tables
** (c_bytes) and the Lua state of the set it holds. The state's memory also changes outside
** the worker's turns: it is made while the set loads, before any worker holds it, and
** freed by lua_close wherever the set's last reference goes. So the charge follows what
** the worker holds, settled at the end of each message in its own turn; the engine counts
** the states no worker holds (rt_rules_lua_memory).
*/
static void settle(rt_actor_t *self, worker_t *w)
{
    size_t lua = w->set ? rt_rule_vm_bytes(w->set->vms[w->index]) : 0;
    size_t now = atomic_load_explicit(&w->st->c_bytes, memory_order_relaxed) + lua;
    if (now != w->charged)
        rt_charge(self, (ptrdiff_t)now - (ptrdiff_t)w->charged);
    w->charged = now;
    atomic_store_explicit(&w->st->lua_bytes, lua, memory_order_relaxed);
}

static int worker_init(rt_actor_t *self, void *state, void *arg)
{
    worker_t *w = state;
    memset(w, 0, sizeof(*w));
    w->index = (unsigned)(uintptr_t)arg;
    RT_ASSERT(w->index < rt__rules.nworkers);
    w->self = rt_self(self);
    w->st = &rt__rules.workers[w->index];
    w->dur_free = w->flight_free = RT_RULES_NONE;
    /* Its supervisor's stop comes as a message, after the hand-overs sent before it. */
    rt_trap_exit(self, true);
    /* A restart's first message builds the new state: sent before the pid is published,
       so no hand-over comes first. */
    if (atomic_load(&w->st->pid))
        rt_send(w->self, RT_RULES_TAG_FRESH, NULL, 0);
    atomic_store(&w->st->pid, w->self);
    return 0;
}

static void worker_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    worker_t *w = state;
    switch (m->tag) {
    case RT_RULES_TAG_WORK:
        run_work(w, m);
        break;
    case RT_RULES_TAG_FLUSH:
        w->flush_pending = false;
        flush_all(w);
        break;
    case RT_SINK_MSG_COMMITTED: {
        rt_sink_committed_t c;
        if (m->len < sizeof(c))
            break;
        memcpy(&c, m->data, sizeof(c));
        uint32_t slot = (uint32_t)c.token;
        if (slot >= w->nflights || !w->flights[slot].used ||
            w->flights[slot].gen != (uint32_t)(c.token >> 32))
            break;
        if (c.status == RT_ENOPROC)
            park_flight(w, slot);
        else
            flight_resolve(w, slot, c.status);
        break;
    }
    case RT_RULES_TAG_RESUBMIT:
        resubmit_parked(w);
        break;
    case RT_RULES_TAG_FRESH:
        fresh_state(w);
        break;
    case RT_MSG_EXIT: {
        /* Its supervisor's stop, or exit/2 from anyone: what is buffered goes to the sinks,
           then the worker goes, as an actor that does not trap exits would. */
        const rt_exit_msg_t *e = (const rt_exit_msg_t *)(const void *)m->data;
        if (e->reason != RT_REASON_NORMAL) {
            flush_all(w);
            rt_exit(self, e->reason);
        }
        break;
    }
    }
    /*
    ** Past its time the worker lets the other actors on its scheduler run (a rule
    ** that burns its instruction budget takes ms a call). Nothing here depends on
    ** where a turn ends: rows wait for the flush (a message or a timer), durable
    ** acks for the sink's commit, and both stay queued in order across turns.
    */
    settle(self, w);
    if (rt_turn_us(self) >= rt__rules.turn_us)
        rt_yield(self);
}

static void worker_trace(void *state, rt_gc_t *gc)
{
    /* Everything the worker holds comes from malloc (charged: settle), not its heap. */
    (void)state;
    (void)gc;
}

static void worker_terminate(rt_actor_t *self, void *state, rt_reason_t reason)
{
    worker_t *w = state;
    /* Rows made are not thrown away, however the worker ends (a no-op after its stop). */
    flush_all(w);
    /* Every promised ack is sent, even now: the publisher must not wait forever. Its rows
       may yet be committed; RT_ENOPROC says that nobody will confirm it. */
    for (uint32_t i = 0; i < w->ndurs; i++)
        if (w->durs[i].pid) {
            w->durs[i].status = RT_ENOPROC;
            w->durs[i].remaining = 1;
            dur_put(w, i, RT_ENOPROC);
        }
    free_batches(w);
    for (uint32_t i = 0; i < w->nflights; i++) {
        flight_t *f = &w->flights[i];
        /* A parked batch is in no sink yet: one last try, unwatched. */
        if (f->used && f->parked)
            rt_sink_submit(f->sink, f->rows, f->nrows, f->opts, 0, 0);
        else if (f->used)
            rt_bin_release(f->rows), rt_bin_release(f->opts);
        free(f->durs);
    }
    free(w->flights);
    free(w->durs);
    rt_buf_free(&w->stage);
    rt__rule_set_release(w->set);
    atomic_store(&w->st->c_bytes, 0);
    atomic_store(&w->st->lua_bytes, 0);
    w->set = NULL;
}

/*
** A hand-over the worker never ran: a durable publisher hears RT_ENOPROC rather than
** nothing. Its set reference stays (a set is freed only by rt_rules_stop, which this may
** run after); so a dead worker's lost hand-overs keep their set until the engine stops.
*/
static void worker_dead_letter(void *state, rt_msg_t *m)
{
    (void)state;
    if (m->tag != RT_RULES_TAG_WORK || m->len < sizeof(rt_rule_work_t))
        return;
    const rt_rule_work_t *wk = (const rt_rule_work_t *)(const void *)m->data;
    if (wk->ack_pid)
        rt__rules_ack_durable(wk->ack_pid, wk->ack_token, RT_ENOPROC);
}

static const char *worker_tag_name(uint32_t tag)
{
    switch (tag) {
    case RT_RULES_TAG_WORK:
        return "rule_work";
    case RT_RULES_TAG_FLUSH:
        return "rule_flush";
    case RT_RULES_TAG_RESUBMIT:
        return "rule_resubmit";
    case RT_RULES_TAG_FRESH:
        return "rule_fresh_state";
    case RT_SINK_MSG_COMMITTED:
        return "sink_committed";
    case RT_MSG_EXIT:
        return "exit";
    }
    return "";
}

const rt_actor_type_t rt__rule_worker_type = {
    .name = "rule_worker",
    .state_size = sizeof(worker_t),
    .init = worker_init,
    .handle = worker_handle,
    .trace = worker_trace,
    .terminate = worker_terminate,
    .tag_name = worker_tag_name,
    .dead_letter = worker_dead_letter,
};
