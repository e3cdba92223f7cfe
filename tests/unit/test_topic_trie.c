/*
** Tests for the routing trie (actors/mqtt/topic_trie.c, topic_tree.c):
** the MQTT spec's matching examples, the '$' rule, MQTT 5 aggregation of
** overlapping subscriptions, shared-group round robin, memory returning to
** baseline, a concurrency stress run and a randomized comparison against a
** brute-force matcher. "test_topic_trie bench" measures ns per match instead
** (printed on stderr; not part of ctest since timings flake on shared machines).
*/
#include "topic_trie.h"

#include "check.h"
#include "common.h"
#include "heap.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* Deliveries recorded by the callback, ids copied since their pointer is only lent. */
#define MAXREC 256
typedef struct {
    rt_pid_t pid;
    int qos, rap, shared;
    size_t nids;
    uint32_t ids[16];
} rec_t;

typedef struct {
    rec_t r[MAXREC];
    size_t n;
} recs_t;

static void record(void *arg, const rt_trie_delivery_t *d)
{
    recs_t *rs = arg;
    if (rs->n >= MAXREC)
        return;
    rec_t *r = &rs->r[rs->n++];
    r->pid = d->pid;
    r->qos = d->qos;
    r->rap = d->retain_as_published;
    r->shared = d->shared;
    r->nids = d->n_sub_ids < 16 ? d->n_sub_ids : 16;
    memcpy(r->ids, d->sub_ids, r->nids * sizeof(uint32_t));
}

static rt_trie_opts_t qos(int q)
{
    return (rt_trie_opts_t){.qos = (uint8_t)q};
}

static int sub(rt_trie_t *t, const char *f, rt_pid_t pid, rt_trie_opts_t o)
{
    int ex = -1;
    int rc = rt_trie_subscribe(t, f, strlen(f), pid, &o, &ex);
    return rc ? rc : ex;
}

static int unsub(rt_trie_t *t, const char *f, rt_pid_t pid)
{
    int ex = -1;
    int rc = rt_trie_unsubscribe(t, f, strlen(f), pid, &ex);
    return rc ? rc : ex;
}

static recs_t recs;
static rt_trie_scratch_t scratch;

/* Matches and returns the number of deliveries, leaving them in recs. */
static long match_pub(rt_trie_t *t, const char *topic, rt_pid_t publisher)
{
    size_t n = 0;
    recs.n = 0;
    int rc = rt_trie_match(t, topic, strlen(topic), publisher, NULL, record, &recs, &scratch, &n);
    return rc ? rc : (long)n;
}

static long match(rt_trie_t *t, const char *topic)
{
    return match_pub(t, topic, 0);
}

static const rec_t *find_rec(rt_pid_t pid, int shared)
{
    for (size_t i = 0; i < recs.n; i++)
        if (recs.r[i].pid == pid && recs.r[i].shared == shared)
            return &recs.r[i];
    return NULL;
}

static int matches(const char *filter, const char *topic)
{
    rt_trie_t *t;
    if (rt_trie_new(&t) != 0)
        return -1;
    sub(t, filter, 1, qos(0));
    long n = match(t, topic);
    rt_trie_free(t);
    return (int)n;
}

static void test_syntax(void)
{
    /* Syntax itself is test_topic.c's; the trie refuses what it refuses. */
    rt_trie_t *t;
    CHECK_EQ(rt_trie_new(&t), 0);
    CHECK_EQ(sub(t, "a/#/b", 1, qos(0)), RT_EINVAL);
    rt_trie_opts_t o = {.qos = 3};
    CHECK_EQ(sub(t, "a", 1, o), RT_EINVAL);
    o = (rt_trie_opts_t){.no_local = 1};
    CHECK_EQ(sub(t, "$share/g/a", 1, o), RT_EINVAL); /* MQTT 5 §3.8.3.1 */
    CHECK_EQ(sub(t, "a", 0, qos(0)), RT_EINVAL);
    CHECK_EQ(match(t, "a/+"), RT_EINVAL);
    rt_trie_free(t);
}

/* The examples of MQTT 3.1.1 / 5.0 §4.7.1. */
static void test_spec_examples(void)
{
    CHECK_EQ(matches("sport/tennis/player1/#", "sport/tennis/player1"), 1);
    CHECK_EQ(matches("sport/tennis/player1/#", "sport/tennis/player1/ranking"), 1);
    CHECK_EQ(matches("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon"), 1);
    CHECK_EQ(matches("sport/#", "sport"), 1);
    CHECK_EQ(matches("#", "sport/tennis"), 1);
    CHECK_EQ(matches("#", "/"), 1);
    CHECK_EQ(matches("sport/tennis/+", "sport/tennis/player1"), 1);
    CHECK_EQ(matches("sport/tennis/+", "sport/tennis/player2"), 1);
    CHECK_EQ(matches("sport/tennis/+", "sport/tennis/player1/ranking"), 0);
    CHECK_EQ(matches("sport/+", "sport"), 0);
    CHECK_EQ(matches("sport/+", "sport/"), 1);
    CHECK_EQ(matches("+/+", "/finance"), 1);
    CHECK_EQ(matches("/+", "/finance"), 1);
    CHECK_EQ(matches("+", "/finance"), 0);
    CHECK_EQ(matches("+/tennis/#", "sport/tennis"), 1);
    CHECK_EQ(matches("+/tennis/#", "sport/tennis/x/y"), 1);
    CHECK_EQ(matches("a//b", "a//b"), 1);
    CHECK_EQ(matches("a/+/b", "a//b"), 1);
    CHECK_EQ(matches("a/b", "a//b"), 0);
    CHECK_EQ(matches("a/b", "a/b/"), 0);
    CHECK_EQ(matches("a/b/+", "a/b/"), 1);
    CHECK_EQ(matches("+", ""), RT_EINVAL);
    CHECK_EQ(matches("ACCOUNTS", "Accounts"), 0); /* case sensitive */
}

/* §4.7.2: wildcards at the first level do not match topics starting with '$'. */
static void test_dollar(void)
{
    CHECK_EQ(matches("#", "$SYS/monitor/Clients"), 0);
    CHECK_EQ(matches("+/monitor/Clients", "$SYS/monitor/Clients"), 0);
    CHECK_EQ(matches("$SYS/#", "$SYS/monitor/Clients"), 1);
    CHECK_EQ(matches("$SYS/monitor/+", "$SYS/monitor/Clients"), 1);
    CHECK_EQ(matches("$share/g/#", "$SYS/x"), 0);
    CHECK_EQ(matches("$share/g/$SYS/#", "$SYS/x"), 1);
    CHECK_EQ(matches("a/+", "a/$b"), 1); /* only the first level is special */
    CHECK_EQ(matches("#", "a$"), 1);
}

static void test_overlap(void)
{
    rt_trie_t *t;
    CHECK_EQ(rt_trie_new(&t), 0);
    CHECK_EQ(sub(t, "a/+", 1, ((rt_trie_opts_t){.qos = 0, .sub_id = 7})), 0);
    CHECK_EQ(sub(t, "a/b", 1, ((rt_trie_opts_t){.qos = 2, .sub_id = 5})), 0);
    CHECK_EQ(sub(t, "#", 1, ((rt_trie_opts_t){.qos = 1, .retain_as_published = 1})), 0);
    CHECK_EQ(sub(t, "a/#", 1, ((rt_trie_opts_t){.qos = 0, .sub_id = 5})), 0);
    CHECK_EQ(sub(t, "a/b", 2, qos(1)), 0);
    CHECK_EQ(match(t, "a/b"), 2);
    const rec_t *r = find_rec(1, 0);
    CHECK(r != NULL);
    if (r) {
        CHECK_EQ(r->qos, 2);
        CHECK_EQ(r->rap, 1);
        CHECK_EQ(r->nids, 2); /* 5 twice is one identifier; "#" has none */
        CHECK_EQ(r->ids[0], 5);
        CHECK_EQ(r->ids[1], 7);
    }
    r = find_rec(2, 0);
    CHECK(r && r->qos == 1 && r->nids == 0 && r->rap == 0);

    /* Re-subscribing replaces the options and reports that the subscription existed. */
    CHECK_EQ(sub(t, "a/b", 1, ((rt_trie_opts_t){.qos = 0, .sub_id = 9})), 1);
    CHECK_EQ(match(t, "a/b"), 2);
    r = find_rec(1, 0);
    CHECK(r && r->qos == 1 && r->nids == 3);

    /* no_local drops only the subscriptions that asked for it. */
    CHECK_EQ(sub(t, "x", 1, ((rt_trie_opts_t){.qos = 1, .no_local = 1})), 0);
    CHECK_EQ(sub(t, "x", 2, ((rt_trie_opts_t){.qos = 1, .no_local = 1})), 0);
    CHECK_EQ(match_pub(t, "x", 1), 2); /* pid 1 via "#", pid 2 via "x" */
    r = find_rec(1, 0);
    CHECK(r && r->qos == 1 && r->nids == 0);
    CHECK_EQ(sub(t, "#", 1, ((rt_trie_opts_t){.qos = 1, .no_local = 1})), 1);
    CHECK_EQ(match_pub(t, "x", 1), 1);
    CHECK(find_rec(2, 0) != NULL);

    CHECK_EQ(unsub(t, "a/b", 1), 1);
    CHECK_EQ(unsub(t, "a/b", 1), 0);
    CHECK_EQ(unsub(t, "nothing/here", 1), 0);
    rt_trie_free(t);
}

static int dead_pid;
static int alive_fn(void *arg, rt_pid_t pid)
{
    return (int)pid != dead_pid && pid != 99;
}

static void test_shared(void)
{
    rt_trie_t *t;
    CHECK_EQ(rt_trie_new(&t), 0);
    for (rt_pid_t p = 1; p <= 3; p++)
        CHECK_EQ(sub(t, "$share/g/s/+", p, qos(1)), 0);
    CHECK_EQ(sub(t, "$share/g/s/+", 2, qos(2)), 1);
    CHECK_EQ(sub(t, "$share/h/s/#", 4, ((rt_trie_opts_t){.sub_id = 3})), 0);
    CHECK_EQ(sub(t, "s/+", 1, qos(0)), 0); /* an ordinary subscription gets its own copy */
    int got[5] = {0};
    for (int i = 0; i < 6; i++) {
        CHECK_EQ(match(t, "s/x"), 3);
        int gmembers = 0;
        for (size_t j = 0; j < recs.n; j++) {
            if (!recs.r[j].shared)
                continue;
            got[recs.r[j].pid]++;
            if (recs.r[j].pid <= 3)
                gmembers++;
            if (recs.r[j].pid == 4)
                CHECK(recs.r[j].nids == 1 && recs.r[j].ids[0] == 3);
            if (recs.r[j].pid == 2)
                CHECK_EQ(recs.r[j].qos, 2);
        }
        CHECK_EQ(gmembers, 1); /* each group gets each message once */
    }
    CHECK(got[1] == 2 && got[2] == 2 && got[3] == 2 && got[4] == 6);

    /* A dead member is skipped; its turn goes to the next one. */
    dead_pid = 2;
    memset(got, 0, sizeof(got));
    for (int i = 0; i < 6; i++) {
        size_t n = 0;
        recs.n = 0;
        CHECK_EQ(rt_trie_match(t, "s/y", 3, 0, alive_fn, record, &recs, &scratch, &n), 0);
        CHECK_EQ(n, 3);
        for (size_t j = 0; j < recs.n; j++)
            if (recs.r[j].shared)
                got[recs.r[j].pid]++;
    }
    CHECK(got[2] == 0 && got[1] + got[3] == 6 && got[1] >= 2 && got[3] >= 2);

    /* A group whose members are all gone delivers nothing. */
    CHECK_EQ(sub(t, "$share/dead/q", 99, qos(0)), 0);
    recs.n = 0;
    size_t n = 9;
    CHECK_EQ(rt_trie_match(t, "q", 1, 0, alive_fn, record, &recs, &scratch, &n), 0);
    CHECK_EQ(n, 0);

    CHECK_EQ(unsub(t, "$share/g/s/+", 2), 1);
    CHECK_EQ(unsub(t, "$share/g/s/+", 2), 0);
    CHECK_EQ(unsub(t, "$share/other/s/+", 1), 0);
    rt_trie_stats_t st;
    rt_trie_stats(t, &st);
    CHECK_EQ(st.groups, 3);
    CHECK_EQ(st.subs, 5);
    rt_trie_free(t);
}

/* How many deliveries "n/x" gets, and whether pid got an ordinary or a shared one. */
static long got(rt_trie_t *t, rt_pid_t pid, int shared)
{
    long n = match(t, "n/x");
    return find_rec(pid, shared) ? n : -n;
}

/*
** One filter through every form its node takes: one subscription kept in the node, then
** a group beside it, two and more subscriptions, the group gone, back to one and to none
** (and '+' and '#' children coming and going under the same parent). Each step matches
** as it should, and the bytes return to the baseline.
*/
static void test_node_forms(void)
{
    rt_trie_t *t;
    CHECK_EQ(rt_trie_new(&t), 0);
    rt_trie_stats_t base, st;
    rt_trie_stats(t, &base);
    CHECK_EQ(sub(t, "n/x", 1, qos(1)), 0);
    CHECK_EQ(got(t, 1, 0), 1);
    CHECK_EQ(sub(t, "$share/g/n/x", 2, qos(0)), 0); /* a group beside the one in the node */
    CHECK_EQ(got(t, 2, 1), 2);
    CHECK_EQ(got(t, 1, 0), 2);
    CHECK_EQ(unsub(t, "n/x", 1), 1); /* the group alone */
    CHECK_EQ(got(t, 2, 1), 1);
    for (rt_pid_t p = 10; p < 20; p++) /* an array that grows */
        CHECK_EQ(sub(t, "n/x", p, qos(1)), 0);
    CHECK_EQ(got(t, 15, 0), 11);
    CHECK_EQ(unsub(t, "$share/g/n/x", 2), 1);
    CHECK_EQ(got(t, 19, 0), 10);
    for (rt_pid_t p = 10; p < 19; p++) /* and shrinks back to the one in the node */
        CHECK_EQ(unsub(t, "n/x", p), 1);
    CHECK_EQ(got(t, 19, 0), 1);
    CHECK_EQ(sub(t, "n/+", 3, qos(0)), 0);
    CHECK_EQ(sub(t, "n/#", 4, qos(0)), 0);
    CHECK_EQ(got(t, 3, 0), 3);
    CHECK_EQ(got(t, 4, 0), 3);
    CHECK_EQ(unsub(t, "n/+", 3), 1);
    CHECK_EQ(got(t, 4, 0), 2);
    CHECK_EQ(got(t, 3, 0), -2);
    CHECK_EQ(unsub(t, "n/#", 4), 1);
    CHECK_EQ(got(t, 19, 0), 1);
    CHECK_EQ(sub(t, "n/+", 5, qos(0)), 0); /* a '+' child made again after its removal */
    CHECK_EQ(got(t, 5, 0), 2);
    CHECK_EQ(unsub(t, "n/+", 5), 1);
    CHECK_EQ(unsub(t, "n/x", 19), 1);
    CHECK_EQ(match(t, "n/x"), 0);
    rt_trie_stats(t, &st);
    CHECK(st.nodes == 0 && st.subs == 0 && st.groups == 0 && st.filters == 0);
    CHECK_EQ(st.bytes, base.bytes);
    rt_trie_free(t);
}

static void test_memory_baseline(void)
{
    rt_trie_t *t;
    CHECK_EQ(rt_trie_new(&t), 0);
    rt_trie_stats_t base, st;
    rt_trie_stats(t, &base);
    CHECK_EQ(base.nodes, 0);
    const char *filters[] = {"a/b/c",
                             "a/+/c",
                             "#",
                             "a/#",
                             "$share/g/a/b",
                             "$share/h/+/#",
                             "x//y",
                             "/",
                             "deep/1/2/3/4/5/6/7/8/9",
                             "$SYS/+"};
    size_t lens[10];
    for (int i = 0; i < 10; i++)
        lens[i] = strlen(filters[i]);
    long n = check_scale(2000);
    for (long p = 1; p <= n; p++)
        for (int i = 0; i < 10; i++)
            CHECK_EQ(sub(t, filters[i], (rt_pid_t)p, qos(1)) == 0, 1);
    rt_trie_stats(t, &st);
    CHECK_EQ(st.subs, (size_t)n * 10);
    CHECK(st.bytes > base.bytes);
    for (long p = 1; p <= n; p++) {
        size_t removed = 0;
        for (int i = 0; i < 10; i++) {
            int existed = 0;
            CHECK_EQ(rt_trie_unsubscribe(t, filters[i], lens[i], (rt_pid_t)p, &existed), 0);
            removed += (size_t)existed;
        }
        CHECK_EQ(removed, 10);
    }
    rt_trie_stats(t, &st);
    CHECK_EQ(st.subs, 0);
    CHECK_EQ(st.groups, 0);
    CHECK_EQ(st.nodes, 0);
    CHECK_EQ(st.bytes, base.bytes);
    CHECK_EQ(match(t, "a/b/c"), 0);
    rt_trie_free(t);
}

/* ------------------------------------------------------------------------------------------ */
/* Randomized comparison with a brute-force matcher. */

static int bf_match(const char *f, const char *t)
{
    if (t[0] == '$' && (f[0] == '+' || f[0] == '#'))
        return 0;
    for (;;) {
        const char *fe = strchr(f, '/'), *te = strchr(t, '/');
        size_t fl = fe ? (size_t)(fe - f) : strlen(f), tl = te ? (size_t)(te - t) : strlen(t);
        if (fl == 1 && f[0] == '#')
            return 1;
        if (!(fl == 1 && f[0] == '+') && (fl != tl || memcmp(f, t, fl) != 0))
            return 0;
        if (!fe && !te)
            return 1;
        if (!fe)
            return 0;
        if (!te)
            return strcmp(fe + 1, "#") == 0;
        f = fe + 1;
        t = te + 1;
    }
}

typedef struct {
    char filter[48];
    rt_pid_t pid;
    rt_trie_opts_t o;
    int live;
} model_t;

static void rand_levels(char *out, int filter)
{
    static const char *lv[] = {"a", "b", "c", "", "$s", "+"};
    int depth = 1 + (int)(rnd() % 4);
    out[0] = 0;
    for (int i = 0; i < depth; i++) {
        if (i)
            strcat(out, "/");
        strcat(out, lv[rnd() % (filter ? 6 : 5)]);
    }
    if (filter && rnd() % 4 == 0)
        strcat(out, rnd() % 3 ? "/#" : "");
    if (filter && rnd() % 10 == 0)
        strcpy(out, "#");
    if (!out[0]) /* neither topics nor filters may be empty */
        strcpy(out, "c");
}

static void test_random_vs_bruteforce(void)
{
    rt_trie_t *t;
    CHECK_EQ(rt_trie_new(&t), 0);
    enum { NMODEL = 400, NPID = 12 };
    static model_t m[NMODEL];
    memset(m, 0, sizeof(m));
    size_t nm = 0;
    long rounds = check_scale(4000);
    long mismatches = 0;
    for (long r = 0; r < rounds; r++) {
        int op = (int)(rnd() % 10);
        if (op < 4 && nm < NMODEL) {
            char f[48];
            rand_levels(f, 1);
            rt_pid_t pid = 1 + rnd() % NPID;
            rt_trie_opts_t o = {.qos = (uint8_t)(rnd() % 3),
                                .sub_id = (uint32_t)(rnd() % 6),
                                .no_local = (uint8_t)(rnd() % 4 == 0),
                                .retain_as_published = (uint8_t)(rnd() % 2)};
            int found = 0, slot = 0;
            for (size_t i = 0; i < nm; i++)
                if (m[i].pid == pid && strcmp(m[i].filter, f) == 0) {
                    found = m[i].live;
                    m[i].o = o;
                    m[i].live = 1;
                    slot = 1;
                }
            if (!slot) {
                strcpy(m[nm].filter, f);
                m[nm].pid = pid;
                m[nm].o = o;
                m[nm++].live = 1;
            }
            CHECK_EQ(sub(t, f, pid, o), found);
        } else if (op < 6 && nm) {
            model_t *e = &m[rnd() % nm];
            CHECK_EQ(unsub(t, e->filter, e->pid), e->live);
            e->live = 0;
        } else {
            char topic[48];
            rand_levels(topic, 0);
            rt_pid_t publisher = rnd() % (NPID + 1);
            long n = match_pub(t, topic, publisher);
            /* The expected aggregate per pid. */
            int exp_qos[NPID + 1], exp_rap[NPID + 1], any[NPID + 1];
            uint32_t idmask[NPID + 1];
            memset(any, 0, sizeof(any));
            memset(exp_qos, 0, sizeof(exp_qos));
            memset(exp_rap, 0, sizeof(exp_rap));
            memset(idmask, 0, sizeof(idmask));
            long nexp = 0;
            for (size_t i = 0; i < nm; i++) {
                if (!m[i].live || !bf_match(m[i].filter, topic))
                    continue;
                if (m[i].o.no_local && m[i].pid == publisher)
                    continue;
                rt_pid_t p = m[i].pid;
                nexp += !any[p];
                any[p] = 1;
                if (m[i].o.qos > exp_qos[p])
                    exp_qos[p] = m[i].o.qos;
                exp_rap[p] |= m[i].o.retain_as_published;
                if (m[i].o.sub_id)
                    idmask[p] |= 1u << m[i].o.sub_id;
            }
            int ok = n == nexp;
            for (size_t i = 0; ok && i < recs.n; i++) {
                const rec_t *rc = &recs.r[i];
                uint32_t mask = 0;
                for (size_t k = 0; k < rc->nids; k++) {
                    if (k && rc->ids[k] <= rc->ids[k - 1])
                        ok = 0; /* ascending, no duplicates */
                    mask |= 1u << rc->ids[k];
                }
                ok = ok && !rc->shared && any[rc->pid] && rc->qos == exp_qos[rc->pid] &&
                     rc->rap == exp_rap[rc->pid] && mask == idmask[rc->pid];
                any[rc->pid] = 0; /* each pid once */
            }
            if (!ok && mismatches++ < 5)
                fprintf(stderr, "mismatch on topic '%s': got %ld expected %ld\n", topic, n, nexp);
        }
    }
    CHECK_EQ(mismatches, 0);
    /* Remove the rest: the trie must come back empty. */
    for (size_t i = 0; i < nm; i++)
        if (m[i].live)
            CHECK_EQ(unsub(t, m[i].filter, m[i].pid), 1);
    rt_trie_stats_t st;
    rt_trie_stats(t, &st);
    CHECK_EQ(st.nodes, 0);
    CHECK_EQ(st.subs, 0);
    rt_trie_free(t);
}

/* ------------------------------------------------------------------------------------------ */
/* Concurrency: matchers see permanent subscriptions while churn goes on around them. */

enum { STRESS_TOPICS = 64, CHURN_PIDS = 40 };

typedef struct {
    rt_trie_t *t;
    long iters;
    int id;
    atomic_long *errors;
    atomic_int *stop;
} stress_arg_t;

typedef struct {
    int need_a, need_b;
    rt_pid_t a, b;
} stress_seen_t;

static void stress_deliver(void *arg, const rt_trie_delivery_t *d)
{
    stress_seen_t *s = arg;
    if (d->pid == s->a && !d->shared)
        s->need_a = 0;
    if (d->pid == s->b && !d->shared)
        s->need_b = 0;
}

static void *matcher(void *p)
{
    stress_arg_t *a = p;
    rt_trie_scratch_t s;
    rt_trie_scratch_init(&s);
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(a->id + 1);
    for (long i = 0; i < a->iters; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % STRESS_TOPICS);
        char topic[32];
        snprintf(topic, sizeof(topic), "t/%d", k);
        stress_seen_t seen = {1, 1, 1000 + (rt_pid_t)k, 999};
        size_t n = 0;
        if (rt_trie_match(a->t, topic, strlen(topic), 0, NULL, stress_deliver, &seen, &s, &n) ||
            seen.need_a || seen.need_b)
            atomic_fetch_add(a->errors, 1);
    }
    rt_trie_scratch_destroy(&s);
    return NULL;
}

static const char *churn_filter(int variant, int k, char *buf, size_t cap)
{
    switch (variant) {
    case 0:
        return "t/+";
    case 1:
        snprintf(buf, cap, "t/%d", k);
        return buf;
    case 2:
        snprintf(buf, cap, "+/%d", k);
        return buf;
    case 3:
        return "$share/g/t/+";
    default:
        snprintf(buf, cap, "t/%d/#", k);
        return buf;
    }
}

static void *churner(void *p)
{
    stress_arg_t *a = p;
    uint64_t x = 0x51ed27ull * (uint64_t)(a->id + 7);
    char buf[32];
    for (long i = 0; i < a->iters; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* Each churner owns its own pids, so its subscribe/unsubscribe pairs are its own. */
        rt_pid_t pid = 1 + (rt_pid_t)(a->id * CHURN_PIDS) + x % CHURN_PIDS;
        const char *f =
            churn_filter((int)(x % 5), (int)((x >> 8) % STRESS_TOPICS), buf, sizeof(buf));
        rt_trie_opts_t o = {.qos = 1, .sub_id = (uint32_t)(x % 100)};
        int ex;
        if (rt_trie_subscribe(a->t, f, strlen(f), pid, &o, &ex) != 0)
            atomic_fetch_add(a->errors, 1);
        if (rt_trie_unsubscribe(a->t, f, strlen(f), pid, &ex) != 0 || !ex)
            atomic_fetch_add(a->errors, 1);
        if (i % 3 == 0) /* leave some behind for matchers to walk over */
            rt_trie_subscribe(a->t, f, strlen(f), pid, &o, &ex);
    }
    return NULL;
}

/* share_pick skips the leaver. */
static void test_share_pick(void)
{
    rt_trie_t *t;
    CHECK_EQ(rt_trie_new(&t), 0);
    for (rt_pid_t p = 1; p <= 3; p++)
        CHECK_EQ(sub(t, "$share/g/s/+", p, ((rt_trie_opts_t){.qos = 1, .sub_id = (uint32_t)p})), 0);
    int picked[4] = {0};
    for (int i = 0; i < 6; i++) {
        rt_pid_t pid = 0;
        rt_trie_opts_t o;
        CHECK_EQ(rt_trie_share_pick(t, "$share/g/s/+", 12, 1, NULL, NULL, &pid, &o), 0);
        CHECK(pid == 2 || pid == 3);
        CHECK_EQ(o.sub_id, (uint32_t)pid); /* the member's own options come back */
        picked[pid]++;
    }
    CHECK(picked[2] >= 2 && picked[3] >= 2);
    dead_pid = 2;
    rt_pid_t pid = 0;
    rt_trie_opts_t o;
    CHECK_EQ(rt_trie_share_pick(t, "$share/g/s/+", 12, 3, alive_fn, NULL, &pid, &o), 0);
    CHECK_EQ(pid, 1);
    CHECK_EQ(rt_trie_share_pick(t, "$share/h/s/+", 12, 0, NULL, NULL, &pid, &o), RT_ENOTFOUND);
    CHECK_EQ(rt_trie_share_pick(t, "s/+", 3, 0, NULL, NULL, &pid, &o), RT_EINVAL);
    dead_pid = 0;
    rt_trie_free(t);
}

/*
** A thread's remembered matches (topic_trie.c) give what a walk gives: the same topic matched
** again sees every change made since, in either trie a scratch serves; matches that depend on
** the publisher (no_local) or pick a member per message (groups) are walked each time, and
** topics or results too large to remember are matched all the same.
*/
static void test_remembered_matches(void)
{
    rt_trie_t *t, *u;
    CHECK_EQ(rt_trie_new(&t), 0);
    CHECK_EQ(rt_trie_new(&u), 0);
    CHECK_EQ(sub(t, "m/a", 1, qos(0)), 0);
    CHECK_EQ(match(t, "m/a"), 1);
    CHECK_EQ(match(t, "m/a"), 1);
    CHECK_EQ(match(u, "m/a"), 0); /* the other trie, through the same scratch */
    CHECK_EQ(sub(t, "m/+", 2, qos(1)), 0);
    CHECK_EQ(match(t, "m/a"), 2);
    CHECK_EQ(match(t, "m/a"), 2);
    CHECK_EQ(sub(t, "m/a", 1, qos(2)), 1); /* options replaced */
    CHECK_EQ(match(t, "m/a"), 2);
    CHECK(find_rec(1, 0) && find_rec(1, 0)->qos == 2);
    CHECK_EQ(sub(u, "m/a", 7, qos(0)), 0);
    CHECK_EQ(match(u, "m/a"), 1);
    CHECK_EQ(match(t, "m/a"), 2);
    CHECK_EQ(unsub(t, "m/a", 1), 1);
    CHECK_EQ(match(t, "m/a"), 1);
    CHECK(find_rec(2, 0) && !find_rec(1, 0));

    rt_trie_opts_t no_local = {.qos = 0, .no_local = 1};
    CHECK_EQ(sub(t, "m/a", 3, no_local), 0);
    CHECK_EQ(match_pub(t, "m/a", 3), 1); /* not to itself */
    CHECK_EQ(match_pub(t, "m/a", 4), 2);
    CHECK_EQ(match_pub(t, "m/a", 3), 1);

    CHECK_EQ(sub(t, "$share/g/n/b", 5, qos(0)), 0);
    CHECK_EQ(sub(t, "$share/g/n/b", 6, qos(0)), 0);
    CHECK_EQ(match(t, "n/b"), 1);
    rt_pid_t first = recs.r[0].pid;
    CHECK_EQ(match(t, "n/b"), 1);
    CHECK(recs.r[0].pid != first); /* the round robin goes on */

    char longer[200];
    memset(longer, 'x', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    CHECK_EQ(sub(t, longer, 8, qos(0)), 0);
    CHECK_EQ(match(t, longer), 1);
    CHECK_EQ(match(t, longer), 1);
    for (rt_pid_t p = 10; p < 30; p++)
        CHECK_EQ(sub(t, "m/c", p, qos(0)), 0);
    CHECK_EQ(match(t, "m/c"), 21); /* m/+ too */
    CHECK_EQ(match(t, "m/c"), 21);
    rt_trie_free(u);
    rt_trie_free(t);
}

static void test_concurrency(void)
{
    rt_trie_t *t;
    CHECK_EQ(rt_trie_new(&t), 0);
    rt_trie_stats_t base, st;
    rt_trie_stats(t, &base);
    char f[32];
    for (int k = 0; k < STRESS_TOPICS; k++) {
        snprintf(f, sizeof(f), "t/%d", k);
        CHECK_EQ(sub(t, f, 1000 + (rt_pid_t)k, qos(1)), 0);
    }
    CHECK_EQ(sub(t, "t/#", 999, qos(0)), 0);
    atomic_long errors = 0;
    atomic_int stop = 0;
    enum { NM = 2, NC = 2 };
    pthread_t th[NM + NC];
    stress_arg_t args[NM + NC];
    for (int i = 0; i < NM + NC; i++) {
        args[i] =
            (stress_arg_t){t, i < NM ? check_scale(200000) : check_scale(50000), i, &errors, &stop};
        pthread_create(&th[i], NULL, i < NM ? matcher : churner, &args[i]);
    }
    for (int i = 0; i < NM + NC; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(atomic_load(&errors), 0);
    /* Unsubscribe everything the churners may have left, then the permanent ones. */
    for (int c = 0; c < NC; c++)
        for (rt_pid_t p = 1; p <= CHURN_PIDS; p++)
            for (int v = 0; v < 5; v++)
                for (int k = 0; k < STRESS_TOPICS; k++) {
                    const char *cf = churn_filter(v, k, f, sizeof(f));
                    unsub(t, cf, p + (rt_pid_t)((NM + c) * CHURN_PIDS));
                }
    for (int k = 0; k < STRESS_TOPICS; k++) {
        snprintf(f, sizeof(f), "t/%d", k);
        CHECK_EQ(unsub(t, f, 1000 + (rt_pid_t)k), 1);
    }
    CHECK_EQ(unsub(t, "t/#", 999), 1);
    rt_trie_stats(t, &st);
    CHECK_EQ(st.nodes, 0);
    CHECK_EQ(st.subs, 0);
    CHECK_EQ(st.bytes, base.bytes);
    rt_trie_free(t);
}

/* ------------------------------------------------------------------------------------------ */
/* Benchmark: "test_topic_trie bench". */

typedef struct {
    rt_trie_t *t;
    char (*topics)[48];
    long ntopics, iters;
    int id;
    double ns, cpu_ns; /* per match: wall clock, and the thread's CPU time */
    long deliveries;
    atomic_int *stop;
} bench_arg_t;

static void count_cb(void *arg, const rt_trie_delivery_t *d)
{
    (*(long *)arg)++;
}

static void *bench_matcher(void *p)
{
    bench_arg_t *a = p;
    rt_trie_scratch_t s;
    rt_trie_scratch_init(&s);
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(a->id + 3);
    long dl = 0;
    double t0 = now_s(), c0 = thread_cpu_s();
    for (long i = 0; i < a->iters; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const char *tp = a->topics[x % (uint64_t)a->ntopics];
        rt_trie_match(a->t, tp, strlen(tp), 0, NULL, count_cb, &dl, &s, NULL);
    }
    a->ns = (now_s() - t0) * 1e9 / (double)a->iters;
    a->cpu_ns = (thread_cpu_s() - c0) * 1e9 / (double)a->iters;
    a->deliveries = dl;
    rt_trie_scratch_destroy(&s);
    return NULL;
}

static void *bench_churner(void *p)
{
    bench_arg_t *a = p;
    long n = 0;
    char f[48];
    rt_trie_opts_t o = {.qos = 1};
    while (!atomic_load_explicit(a->stop, memory_order_relaxed)) {
        snprintf(f, sizeof(f), "%s", a->topics[n % a->ntopics]);
        rt_trie_subscribe(a->t, f, strlen(f), 5000000 + (rt_pid_t)(n % 1000), &o, NULL);
        rt_trie_unsubscribe(a->t, f, strlen(f), 5000000 + (rt_pid_t)(n % 1000), NULL);
        n++;
    }
    a->deliveries = n; /* subscribe+unsubscribe pairs done */
    return NULL;
}

static void bench_run(const char *name, rt_trie_t *t, char (*topics)[48], long ntopics, long iters)
{
    /* Subscribe+unsubscribe alone: a second subscriber on each filter, then gone again. */
    char f[48];
    rt_trie_opts_t o = {.qos = 1};
    long pairs = iters / 4;
    double c0 = thread_cpu_s();
    for (long n = 0; n < pairs; n++) {
        snprintf(f, sizeof(f), "%s", topics[n % ntopics]);
        rt_trie_subscribe(t, f, strlen(f), 5000000 + (rt_pid_t)(n % 1000), &o, NULL);
        rt_trie_unsubscribe(t, f, strlen(f), 5000000 + (rt_pid_t)(n % 1000), NULL);
    }
    fprintf(stderr, "bench %-9s sub+unsub alone: %.0f ns/pair (thread CPU)\n", name,
            (thread_cpu_s() - c0) * 1e9 / (double)pairs);
    for (int threads = 1; threads <= 2; threads++) {
        for (int churn = 0; churn <= 1; churn++) {
            pthread_t th[3];
            bench_arg_t a[3];
            atomic_int stop = 0;
            for (int i = 0; i < threads + churn; i++) {
                a[i] = (bench_arg_t){t, topics, ntopics, iters, i, 0, 0, 0, &stop};
                pthread_create(&th[i], NULL, i < threads ? bench_matcher : bench_churner, &a[i]);
            }
            for (int i = 0; i < threads; i++)
                pthread_join(th[i], NULL);
            atomic_store(&stop, 1);
            if (churn)
                pthread_join(th[threads], NULL);
            double ns = 0, cpu_ns = 0;
            long dl = 0;
            for (int i = 0; i < threads; i++) {
                ns += a[i].ns / threads;
                cpu_ns += a[i].cpu_ns / threads;
                dl += a[i].deliveries;
            }
            fprintf(stderr,
                    "bench %-9s %d matcher thread(s)%s: %7.0f ns/match per thread (%.0f CPU), "
                    "%.1f deliveries/match%s",
                    name, threads, churn ? " + 1 sub/unsub thread" : "", ns, cpu_ns,
                    (double)dl / (double)(iters * threads), churn ? "" : "\n");
            if (churn)
                fprintf(stderr, ", %.0f sub+unsub pairs/s\n",
                        (double)a[threads].deliveries / (ns * iters / 1e9));
        }
    }
}

static void bench(void)
{
    enum { NTOPICS = 10000, NSUBS = 100000 };
    static char topics[NTOPICS][48];
    for (int i = 0; i < NTOPICS; i++)
        snprintf(topics[i], sizeof(topics[i]), "site/%d/dev%d/temp", i / 100, i);
    long iters = check_scale(1000000);

    /* Exact: 10 subscribers per topic. */
    rt_trie_t *t;
    rt_trie_new(&t);
    rt_trie_stats_t st0, st;
    rt_trie_stats(t, &st0);
    for (int k = 0; k < NSUBS; k++) {
        rt_trie_opts_t o = {.qos = 1};
        rt_trie_subscribe(t, topics[k % NTOPICS], strlen(topics[k % NTOPICS]), (rt_pid_t)k + 1, &o,
                          NULL);
    }
    rt_trie_stats(t, &st);
    fprintf(stderr, "bench: %d shards, %d read slots per shard\n", RT_TRIE_SHARDS,
            RT_TRIE_READ_SLOTS);
    fprintf(stderr, "bench exact: %zu subs, %zu nodes, %.1f bytes/sub (trie total %zu bytes)\n",
            st.subs, st.nodes, (double)(st.bytes - st0.bytes) / (double)st.subs, st.bytes);
    bench_run("exact", t, topics, NTOPICS, iters);
    rt_trie_free(t);

    /*
    ** The emqttd seed's shape: one subscriber on each of 19,000 "test/<i>", all leaves of one
    ** node in one shard. Bytes per subscription are what malloc handed out (chunk rounding
    ** included), the figure an RSS comparison sees.
    */
    enum { NSEED = 19000 };
    static char seed[NSEED][48];
    for (int i = 0; i < NSEED; i++)
        snprintf(seed[i], sizeof(seed[i]), "test/%d", i);
    size_t heap0 = mallinfo2().uordblks;
    rt_trie_new(&t);
    rt_trie_stats(t, &st0);
    for (int k = 0; k < NSEED; k++) {
        rt_trie_opts_t o = {.qos = 1};
        rt_trie_subscribe(t, seed[k], strlen(seed[k]), (rt_pid_t)k + 1, &o, NULL);
    }
    rt_trie_stats(t, &st);
    fprintf(stderr, "bench seed: %zu subs, %.1f bytes/sub counted, %.1f malloc'd\n", st.subs,
            (double)(st.bytes - st0.bytes) / (double)st.subs,
            (double)(mallinfo2().uordblks - heap0 - st0.bytes) / (double)st.subs);
    bench_run("seed", t, seed, NSEED, iters);
    rt_trie_free(t);

    /* The per-subscription cost when every filter is its own (one subscriber per topic). */
    rt_trie_new(&t);
    for (int k = 0; k < NTOPICS; k++) {
        rt_trie_opts_t o = {.qos = 1};
        rt_trie_subscribe(t, topics[k], strlen(topics[k]), (rt_pid_t)k + 1, &o, NULL);
    }
    rt_trie_stats(t, &st);
    fprintf(stderr, "bench one subscriber per topic: %zu subs, %.1f bytes/sub\n", st.subs,
            (double)(st.bytes - st0.bytes) / (double)st.subs);
    rt_trie_free(t);

    /*
    ** Wildcard-heavy: three quarters of the 100k filters have '+' or '#' (10
    ** per topic in four shapes), plus one "site/<s>/+/temp" per site and ten
    ** "#"; every match walks both shards and several '+' branches and delivers
    ** 21 times. Pids overlap so that aggregation (the sort) is exercised.
    */
    rt_trie_new(&t);
    for (int k = 0; k < NSUBS + 110; k++) {
        int i = k % NTOPICS;
        char f[48];
        if (k >= NSUBS + 10)
            snprintf(f, sizeof(f), "site/%d/+/temp", k - NSUBS - 10);
        else if (k >= NSUBS)
            snprintf(f, sizeof(f), "#");
        else if (k % 4 == 0)
            snprintf(f, sizeof(f), "%s", topics[i]);
        else if (k % 4 == 1)
            snprintf(f, sizeof(f), "site/+/dev%d/temp", i);
        else if (k % 4 == 2)
            snprintf(f, sizeof(f), "site/%d/dev%d/#", i / 100, i);
        else
            snprintf(f, sizeof(f), "+/+/dev%d/+", i);
        rt_trie_opts_t o = {.qos = (uint8_t)(k % 3), .sub_id = (uint32_t)k % 7};
        rt_trie_subscribe(t, f, strlen(f), (rt_pid_t)(k % 30011) + 1, &o, NULL);
    }
    rt_trie_stats(t, &st);
    fprintf(stderr, "bench wildcard: %zu subs, %zu nodes, %.1f bytes/sub\n", st.subs, st.nodes,
            (double)(st.bytes - st0.bytes) / (double)st.subs);
    bench_run("wildcard", t, topics, NTOPICS, iters / 4);
    rt_trie_free(t);
}

/* Distinct filters and the high-water marks of filters and subscriptions. */
static void test_filter_counts(void)
{
    rt_trie_t *t;
    CHECK_EQ(rt_trie_new(&t), 0);
    CHECK_EQ(sub(t, "a/b", 1, qos(0)), 0);
    CHECK_EQ(sub(t, "a/b", 2, qos(1)), 0);          /* same filter: still one */
    CHECK_EQ(sub(t, "a/b", 2, qos(2)), 1);          /* replaced: nothing new */
    CHECK_EQ(sub(t, "$share/g/a/b", 3, qos(0)), 0); /* a group is a filter of its own */
    CHECK_EQ(sub(t, "$share/g/a/b", 4, qos(0)), 0);
    CHECK_EQ(sub(t, "$share/h/a/b", 3, qos(0)), 0);
    CHECK_EQ(sub(t, "+/b", 1, qos(0)), 0);
    rt_trie_stats_t st;
    rt_trie_stats(t, &st);
    CHECK_EQ(st.filters, 4);
    CHECK_EQ(st.subs, 6);
    CHECK(st.filters_max == 4 && st.subs_max == 6);
    CHECK_EQ(unsub(t, "a/b", 1), 1);
    rt_trie_stats(t, &st);
    CHECK_EQ(st.filters, 4); /* pid 2 still holds a/b */
    CHECK_EQ(unsub(t, "a/b", 2), 1);
    CHECK_EQ(unsub(t, "$share/g/a/b", 3), 1);
    CHECK_EQ(unsub(t, "$share/g/a/b", 4), 1);
    rt_trie_stats(t, &st);
    CHECK(st.filters == 2 && st.subs == 2 && st.groups == 1);
    CHECK(st.filters_max == 4 && st.subs_max == 6); /* peaks stay */
    CHECK_EQ(unsub(t, "+/b", 1), 1);
    CHECK_EQ(unsub(t, "$share/h/a/b", 3), 1);
    rt_trie_stats(t, &st);
    CHECK(st.filters == 0 && st.subs == 0 && st.groups == 0);
    rt_trie_free(t);
}

int main(int argc, char **argv)
{
    rt_trie_scratch_init(&scratch);
    if (argc > 1 && strcmp(argv[1], "bench") == 0) {
        bench();
        rt_trie_scratch_destroy(&scratch);
        return 0;
    }
    RUN(test_syntax);
    RUN(test_spec_examples);
    RUN(test_dollar);
    RUN(test_overlap);
    RUN(test_shared);
    RUN(test_node_forms);
    RUN(test_memory_baseline);
    RUN(test_random_vs_bruteforce);
    RUN(test_share_pick);
    RUN(test_remembered_matches);
    RUN(test_concurrency);
    RUN(test_filter_counts);
    rt_trie_scratch_destroy(&scratch);
    return CHECK_SUMMARY();
}
