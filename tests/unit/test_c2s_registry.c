/*
** The XMPP session registry (actors/c2s/c2s_registry.c): binding, lookups by bare JID and by
** resource, presence and carbons flags, a newer session replacing an older one (whose late
** unbind must not remove the newer entry), refusal and the resource bound, growth past the
** first buckets, threads binding, looking up and unbinding the same accounts at once
** (run under TSan in the suite), and other nodes' bindings under their remote pids (what a
** cluster's xmpp_cluster actor applies: made, brought up to date, taking over one they
** replaced, counted apart, dropped with their node).
*/
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "c2s_impl.h"
#include "check.h"

#define BARE(s) s, strlen(s)

static size_t routes(const char *bare, const char *res, c2s_route_t *r, size_t max)
{
    return rt__c2s_reg_lookup(bare, strlen(bare), res, res ? strlen(res) : 0, r, max);
}

static size_t local_count(void)
{
    size_t local, remote, bytes;
    rt__c2s_reg_counts(&local, &remote, &bytes);
    return local;
}

static void test_bind_lookup_unbind(void)
{
    size_t before = local_count();
    rt_pid_t old = 99;
    CHECK_EQ(rt__c2s_reg_bind(BARE("a@x"), BARE("phone"), 11, true, 16, &old), 0);
    CHECK_EQ(old, 0);
    CHECK_EQ(rt__c2s_reg_bind(BARE("a@x"), BARE("desk"), 12, true, 16, &old), 0);
    CHECK_EQ(rt__c2s_reg_bind(BARE("b@x"), BARE("phone"), 13, true, 16, &old), 0);
    CHECK_EQ(local_count(), before + 3);
    c2s_route_t r[8];
    CHECK_EQ(routes("a@x", NULL, r, 8), 2);
    CHECK_EQ(routes("a@x", "desk", r, 8), 1);
    CHECK_EQ(r[0].pid, 12);
    CHECK(!r[0].available);
    CHECK_EQ(routes("a@x", "tablet", r, 8), 0);
    CHECK_EQ(routes("a@xx", NULL, r, 8), 0); /* a bare JID is compared whole */
    CHECK_EQ(routes("a@x", NULL, r, 1), 1);  /* no more than asked */

    rt__c2s_reg_presence(BARE("a@x"), BARE("desk"), 12, true, -3);
    rt__c2s_reg_carbons(BARE("a@x"), BARE("desk"), 12, true);
    rt__c2s_reg_presence(BARE("a@x"), BARE("desk"), 77, false, 0); /* not its entry: ignored */
    CHECK_EQ(routes("a@x", "desk", r, 8), 1);
    CHECK(r[0].available && r[0].carbons);
    CHECK_EQ(r[0].priority, -3);

    rt__c2s_reg_unbind(BARE("a@x"), BARE("desk"), 12);
    rt__c2s_reg_unbind(BARE("a@x"), BARE("phone"), 11);
    rt__c2s_reg_unbind(BARE("b@x"), BARE("phone"), 13);
    rt__c2s_reg_unbind(BARE("b@x"), BARE("phone"), 13); /* twice: nothing left to remove */
    CHECK_EQ(routes("a@x", NULL, r, 8), 0);
    CHECK_EQ(local_count(), before);
}

static void test_replace_refuse_and_bound(void)
{
    rt_pid_t old = 0;
    CHECK_EQ(rt__c2s_reg_bind(BARE("c@x"), BARE("r"), 21, true, 16, &old), 0);
    rt__c2s_reg_presence(BARE("c@x"), BARE("r"), 21, true, 5);
    CHECK_EQ(rt__c2s_reg_bind(BARE("c@x"), BARE("r"), 22, true, 16, &old), 0);
    CHECK_EQ(old, 21);
    c2s_route_t r[4];
    CHECK_EQ(routes("c@x", "r", r, 4), 1);
    CHECK_EQ(r[0].pid, 22);
    CHECK(!r[0].available); /* the newer session has sent no presence yet */
    rt__c2s_reg_unbind(BARE("c@x"), BARE("r"), 21); /* the replaced one ends late */
    CHECK_EQ(routes("c@x", "r", r, 4), 1);
    CHECK_EQ(rt__c2s_reg_bind(BARE("c@x"), BARE("r"), 23, false, 16, &old), RT_EEXIST);
    CHECK_EQ(routes("c@x", "r", r, 4), 1);
    CHECK_EQ(r[0].pid, 22);
    rt__c2s_reg_unbind(BARE("c@x"), BARE("r"), 22);

    char res[16];
    for (int i = 0; i < 3; i++) {
        snprintf(res, sizeof(res), "r%d", i);
        CHECK_EQ(rt__c2s_reg_bind(BARE("d@x"), res, strlen(res), 30 + (rt_pid_t)i, true, 3, &old),
                 0);
    }
    CHECK_EQ(rt__c2s_reg_bind(BARE("d@x"), BARE("r9"), 40, true, 3, &old), RT_ELIMIT);
    CHECK_EQ(rt__c2s_reg_bind(BARE("d@x"), BARE("r1"), 41, true, 3, &old), 0); /* a replace */
    CHECK_EQ(old, 31);
    for (int i = 0; i < 3; i++) {
        snprintf(res, sizeof(res), "r%d", i);
        rt__c2s_reg_unbind(BARE("d@x"), res, strlen(res), i == 1 ? 41 : 30 + (rt_pid_t)i);
    }
    CHECK_EQ(routes("d@x", NULL, r, 4), 0);
}

static void test_many(void)
{
    size_t before = local_count();
    enum { N = 20000 };
    char bare[32];
    rt_pid_t old;
    for (int i = 0; i < N; i++) {
        snprintf(bare, sizeof(bare), "user%d@x", i);
        CHECK_EQ(rt__c2s_reg_bind(bare, strlen(bare), BARE("r"), 1000 + (rt_pid_t)i, true, 16,
                                  &old),
                 0);
    }
    CHECK_EQ(local_count(), before + N);
    int found = 0;
    for (int i = 0; i < N; i++) {
        snprintf(bare, sizeof(bare), "user%d@x", i);
        c2s_route_t r;
        found += rt__c2s_reg_lookup(bare, strlen(bare), NULL, 0, &r, 1) == 1 &&
                 r.pid == 1000 + (rt_pid_t)i;
    }
    CHECK_EQ(found, N);
    for (int i = 0; i < N; i++) {
        snprintf(bare, sizeof(bare), "user%d@x", i);
        rt__c2s_reg_unbind(bare, strlen(bare), BARE("r"), 1000 + (rt_pid_t)i);
    }
    CHECK_EQ(local_count(), before);
}

/* Threads on the same ten accounts: each binds its own resource, flags it, looks up, unbinds. */
static void *churn(void *arg)
{
    int t = (int)(intptr_t)arg;
    char bare[16], res[16];
    snprintf(res, sizeof(res), "t%d", t);
    long seen = 0;
    for (int i = 0; i < 20000; i++) {
        snprintf(bare, sizeof(bare), "s%d@x", i % 10);
        rt_pid_t pid = (rt_pid_t)(t + 1) << 32 | (rt_pid_t)i, old;
        if (rt__c2s_reg_bind(bare, strlen(bare), res, strlen(res), pid, true, 16, &old) != 0)
            return (void *)-1;
        rt__c2s_reg_presence(bare, strlen(bare), res, strlen(res), pid, true, (int8_t)(i % 7));
        c2s_route_t r[16];
        size_t n = rt__c2s_reg_lookup(bare, strlen(bare), NULL, 0, r, 16);
        for (size_t k = 0; k < n; k++)
            seen += r[k].pid == pid;
        rt__c2s_reg_unbind(bare, strlen(bare), res, strlen(res), pid);
    }
    return (void *)(intptr_t)seen;
}

static void test_threads(void)
{
    size_t before = local_count();
    pthread_t th[4];
    for (int t = 0; t < 4; t++)
        pthread_create(&th[t], NULL, churn, (void *)(intptr_t)t);
    for (int t = 0; t < 4; t++) {
        void *seen;
        pthread_join(th[t], &seen);
        CHECK_EQ((long)(intptr_t)seen, 20000); /* each saw its own entry every time */
    }
    CHECK_EQ(local_count(), before);
}

#define REMOTE(node, pid) ((rt_pid_t)(pid) | (rt_pid_t)(node) << C2S_NODE_SHIFT)

static void test_other_nodes(void)
{
    size_t local0, remote0, bytes0, local, remote, bytes;
    rt__c2s_reg_counts(&local0, &remote0, &bytes0);
    uint64_t avail0 = atomic_load(&rt_c2s_stats.cluster_available);
    rt_pid_t old = 0;
    CHECK_EQ(rt__c2s_reg_bind(BARE("n@x"), BARE("here"), 31, true, 16, &old), 0);
    c2s_route_t far = {.pid = REMOTE(2, 31), .priority = 7, .available = true};
    CHECK_EQ(rt__c2s_reg_apply(BARE("n@x"), BARE("there"), &far, 0), 0);
    far.priority = 9; /* told again (a presence, a snapshot): brought up to date, not doubled */
    CHECK_EQ(rt__c2s_reg_apply(BARE("n@x"), BARE("there"), &far, 0), 0);
    c2s_route_t r[8];
    CHECK_EQ(routes("n@x", NULL, r, 8), 2);
    CHECK_EQ(routes("n@x", "there", r, 8), 1);
    CHECK_EQ(r[0].pid, REMOTE(2, 31)); /* pid 31 of node 2 is not pid 31 here */
    CHECK_EQ(rt__c2s_pid_node(r[0].pid), 2);
    CHECK_EQ(r[0].priority, 9);
    rt__c2s_reg_counts(&local, &remote, &bytes);
    CHECK_EQ(local, local0 + 1);
    CHECK_EQ(remote, remote0 + 1);
    CHECK_EQ(bytes, bytes0 + rt__c2s_reg_entry_bytes(3, 5));
    CHECK_EQ(atomic_load(&rt_c2s_stats.cluster_available), avail0 + 1);
    far.available = false; /* its unavailable */
    CHECK_EQ(rt__c2s_reg_apply(BARE("n@x"), BARE("there"), &far, 0), 0);
    CHECK_EQ(atomic_load(&rt_c2s_stats.cluster_available), avail0);
    far.available = true;
    CHECK_EQ(rt__c2s_reg_apply(BARE("n@x"), BARE("there"), &far, 0), 0);

    /* Node 3 binds "here", saying it replaced this node's session 31: it takes the entry. */
    c2s_route_t took = {.pid = REMOTE(3, 44), .available = true};
    CHECK_EQ(rt__c2s_reg_apply(BARE("n@x"), BARE("here"), &took, 31), 0);
    CHECK_EQ(routes("n@x", "here", r, 8), 1);
    CHECK_EQ(r[0].pid, REMOTE(3, 44));
    rt__c2s_reg_unbind(BARE("n@x"), BARE("here"), 31); /* the replaced session's late unbind */
    CHECK_EQ(routes("n@x", "here", r, 8), 1);
    rt__c2s_reg_counts(&local, &remote, &bytes);
    CHECK_EQ(local, local0);
    CHECK_EQ(remote, remote0 + 2);

    /* A binding here replaces another node's: counted as this node's again. */
    CHECK_EQ(rt__c2s_reg_bind(BARE("n@x"), BARE("there"), 32, true, 16, &old), 0);
    CHECK_EQ(old, REMOTE(2, 31));
    rt__c2s_reg_counts(&local, &remote, &bytes);
    CHECK_EQ(local, local0 + 1);
    CHECK_EQ(remote, remote0 + 1);

    /* Node 3 gone: its bindings with it, no other's. */
    CHECK_EQ(rt__c2s_reg_purge_node(3), 1);
    CHECK_EQ(routes("n@x", NULL, r, 8), 1);
    CHECK_EQ(r[0].pid, 32);
    rt__c2s_reg_unbind(BARE("n@x"), BARE("there"), 32);
    rt__c2s_reg_counts(&local, &remote, &bytes);
    CHECK_EQ(local, local0);
    CHECK_EQ(remote, remote0);
    CHECK_EQ(bytes, bytes0);
    CHECK_EQ(atomic_load(&rt_c2s_stats.cluster_available), avail0);
}

int main(void)
{
    RUN(test_bind_lookup_unbind);
    RUN(test_replace_refuse_and_bound);
    RUN(test_many);
    RUN(test_threads);
    RUN(test_other_nodes);
    return CHECK_SUMMARY();
}
