/*
** The hand-over from connections to rule workers (rt_rules_publish, rt_rules_event): on
** the connection's own thread, find the enabled rules a message or event is for and send
** them, with what the rules will read, to the worker that takes the client's messages.
*/
#include <stdlib.h>
#include <string.h>

#include "message.h"
#include "rule_internal.h"

/* Per thread: the index's scratch, then the matched enabled rules. */
typedef struct match_scratch_s {
    rt_rule_hits_t hits;
    uint32_t *rules;
    size_t n, cap;
    bool oom;
} match_scratch_t;

static _Thread_local match_scratch_t scratch;
static _Thread_local bool scratch_ready;

static void scratch_free(void *p)
{
    match_scratch_t *t = p;
    rt_rule_hits_free(&t->hits);
    free(t->rules);
    memset(t, 0, sizeof(*t));
}

/* This thread's scratch, emptied; freed when the thread exits. */
static match_scratch_t *thread_scratch(void)
{
    if (!scratch_ready) {
        /* Without the hook a thread's scratch leaks at its exit; matching works either way. */
        (void)rt_thread_at_exit(scratch_free, &scratch);
        scratch_ready = true;
    }
    scratch.n = 0;
    scratch.oom = false;
    return &scratch;
}

static void add_if_enabled(match_scratch_t *t, const rt_rule_set_t *s, uint32_t idx)
{
    RT_ASSERT(idx < s->nrules);
    if (!atomic_load_explicit(&s->rules[idx].enabled, memory_order_relaxed))
        return;
    if (rt_grow(&t->rules, &t->cap, t->n + 1, sizeof(uint32_t), 16)) {
        t->oom = true;
        return;
    }
    t->rules[t->n++] = idx;
}

/*
** Sends the matched rules (t->rules; set retained by the caller, the message owns that
** reference) and the strings to the client's worker. Called with the engine's lock
** read-held, so rt_rules_stop (which write-locks it) knows that no hand-over is under way
** once it holds the lock.
*/
static int hand_over(match_scratch_t *t, rt_rule_set_t *set, const rt_rule_origin_t *o,
                     const rt_rule_event_t *e, rt_bin_t *bin, rt_pid_t ack_pid, uint64_t ack_token)
{
    RT_ASSERT(rt__rules_holds_read());
    RT_ASSERT(t->n > 0 && rt__rules.nworkers > 0);
    const char *strs[RT_RULE_NSTRS] = {
        [RT_RULE_STR_CLIENTID] = o->clientid,
        [RT_RULE_STR_USERNAME] = o->username,
        [RT_RULE_STR_PEER] = o->peer,
        [RT_RULE_STR_TOPIC] = e ? e->topic : NULL,
        [RT_RULE_STR_REASON] = e ? e->reason : NULL,
        [RT_RULE_STR_FROM_CLIENTID] = e ? e->from_clientid : NULL,
        [RT_RULE_STR_FROM_USERNAME] = e ? e->from_username : NULL,
        [RT_RULE_STR_PROTOCOL] = e ? e->protocol : NULL,
        [RT_RULE_STR_FROM] = e ? e->from : NULL,
        [RT_RULE_STR_TO] = e ? e->to : NULL,
        [RT_RULE_STR_TYPE] = e ? e->type : NULL,
        [RT_RULE_STR_BODY] = e ? e->body : NULL,
    };
    size_t size = sizeof(rt_rule_work_t) + t->n * sizeof(uint32_t);
    uint32_t lens[RT_RULE_NSTRS];
    for (int i = 0; i < RT_RULE_NSTRS; i++) {
        lens[i] = strs[i] ? (uint32_t)strlen(strs[i]) : UINT32_MAX;
        size += strs[i] ? lens[i] + 1 : 0;
    }
    rt_msg_t *m = rt_msg_new(RT_RULES_TAG_WORK, size);
    if (!m) {
        rt__rule_set_release(set);
        return RT_ENOMEM;
    }
    rt_rule_work_t *w = (rt_rule_work_t *)(void *)m->data;
    memset(w, 0, sizeof(*w));
    w->set = set;
    w->ack_pid = ack_pid;
    w->ack_token = ack_token;
    w->ts_ms = o->ts_ms;
    w->event = e ? (int16_t)e->kind : 0;
    w->qos = (int8_t)(e ? e->qos : -1);
    w->reason_code = e ? e->reason_code : -1;
    w->proto_ver = (int8_t)(e ? e->proto_ver : -1);
    w->keepalive = e ? e->keepalive : -1;
    w->clean_start = (int8_t)(e ? e->clean_start : -1);
    w->nrules = (uint32_t)t->n;
    memcpy(w->rules, t->rules, t->n * sizeof(uint32_t));
    char *p = (char *)(w->rules + t->n);
    for (int i = 0; i < RT_RULE_NSTRS; i++) {
        w->slen[i] = lens[i];
        if (strs[i]) {
            memcpy(p, strs[i], lens[i] + 1);
            p += lens[i] + 1;
        }
    }
    if (bin)
        m->bin = rt_bin_retain(bin);
    /* One client, one worker: its messages stay in order. */
    const char *id = o->clientid ? o->clientid : "";
    rt_pid_t to = atomic_load(&rt__rules.workers[rt_hash(id, strlen(id)) % rt__rules.nworkers].pid);
    int rc = rt_send_msg(to, m);
    if (rc)
        rt__rule_set_release(set); /* the runtime freed the message: nobody else will */
    return rc;
}

/*
** Unmuted: a worker never waits for a publisher (whose client may not read), as publishers
** wait for it (rt.h, "Output backpressure"). One ack per publish the connection keeps
** waiting for, so bounded by what that connection holds.
*/
void rt__rules_ack_durable(rt_pid_t pid, uint64_t token, int32_t status)
{
    rt_rules_durable_t ack = {token, status};
    rt_msg_t *m = rt_msg_new(RT_RULES_MSG_DURABLE, sizeof(ack));
    if (m)
        memcpy(m->data, &ack, sizeof(ack));
    rt_send_unmuted(pid, m);
}

int rt_rules_publish(const rt_rule_origin_t *o, rt_bin_t *canonical, rt_pid_t ack_pid,
                     uint64_t ack_token, bool *promised)
{
    if (promised)
        *promised = false;
    if (!rt_rules_wants_publish())
        return 0;
    rt_rule_set_t *s = rt__rules_lock_current();
    if (!s)
        return 0;
    rt_message_t msg;
    rt_message_view(canonical, &msg);
    match_scratch_t *t = thread_scratch();
    int rc = rt_rule_index_match(s->topics, (const char *)msg.topic.p, msg.topic.len, &t->hits);
    for (size_t i = 0; i < t->hits.n; i++)
        add_if_enabled(t, s, t->hits.rules[i]);
    if (rc || t->n == 0 || t->oom) {
        rt__rules_unlock();
        return rc ? rc : t->oom ? RT_ENOMEM : 0;
    }
    bool durable = false;
    for (size_t i = 0; i < t->n && ack_pid; i++)
        durable |= s->rules[t->rules[i]].durable;
    rc = hand_over(t, rt__rule_set_retain(s), o, NULL, canonical, durable ? ack_pid : 0, ack_token);
    rt__rules_unlock();
    if (rc && durable) {
        /* The publisher was promised an answer: it is that its rows will not be made (the
           worker is being restarted, or no memory). */
        rt__rules_ack_durable(ack_pid, ack_token, rc);
    } else if (rc) {
        return rc;
    }
    if (promised)
        *promised = durable;
    return 1;
}

bool rt_rules_wants_publish(void)
{
    return atomic_load_explicit(&rt__rules.wants, memory_order_relaxed) & 1u;
}

bool rt_rules_wants_event(rt_rule_event_kind_t kind)
{
    return kind >= 1 && kind <= RT_RULE_NEVENTS &&
           (atomic_load_explicit(&rt__rules.wants, memory_order_relaxed) & (1u << kind));
}

int rt_rules_event(const rt_rule_origin_t *o, const rt_rule_event_t *e)
{
    if (e->kind < 1 || e->kind > RT_RULE_NEVENTS)
        return RT_EINVAL;
    /* Called for every delivery and ack: without a rule for this kind, touch nothing shared. */
    if (!(atomic_load_explicit(&rt__rules.wants, memory_order_relaxed) & (1u << e->kind)))
        return 0;
    rt_rule_set_t *s = rt__rules_lock_current();
    if (!s)
        return 0;
    match_scratch_t *t = thread_scratch();
    for (uint32_t i = 0; i < s->nevents[e->kind - 1]; i++)
        add_if_enabled(t, s, s->events[e->kind - 1][i]);
    if (t->n == 0 || t->oom) {
        rt__rules_unlock();
        return t->oom ? RT_ENOMEM : 0;
    }
    bool with_msg = e->kind >= RT_RULE_EV_MESSAGE_DELIVERED && e->canonical;
    int rc = hand_over(t, rt__rule_set_retain(s), o, e, with_msg ? e->canonical : NULL, 0, 0);
    rt__rules_unlock();
    return rc ? rc : 1;
}
