/*
** Where rtd's memory is, for `vm` and the `top` node panel: the process's resident set
** (RSS) told apart by kind, down to a remainder nothing explains.
**
** The kinds partition what the process holds, so they add up to RSS less that remainder:
**   - every actor's own memory, by type: its struct and state (slab), its heap (chunks, and
**     large objects from malloc) and what it is charged for outside the heap (rt_charge: a
**     Lua state, SQLite's and libbson's memory, its buffers; all from malloc);
**   - shared binaries, each counted once (actors' bin_bytes count one per holder, so they
**     are shown by type but not added);
**   - the runtime's own: what it maps itself (the actor slab, the heap chunk pool, its
**     reserved tables) as resident less what the actors' figures already hold, and what it
**     mallocs (message envelopes, sockets, schedulers);
**   - the broker's shared tables, the rule sets and the Lua states no worker holds, and
**     what SQLite and libbson hold that no actor is charged for;
**   - malloc itself (mallinfo2): what it holds in use that no line above names (per-block
**     overhead included), and what it keeps free;
**   - the program and the libraries it maps from files (RssFile, RssShmem).
** The remainder is RSS less all that: thread stacks, the libraries' static data, and
** malloc's free memory that is not resident make most of it.
*/
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "admin_impl.h"
#include "bson_mem.h"
#include "conn.h"
#include "rule_engine.h"
#include "sink.h"
#include "sqlite_mem.h"
#include "topic_trie.h"
#include "xport.h"

#define SINKS_MAX 64

/* VmRSS from /proc/self/status: what the kernel says this process holds. */
static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof(line), f) && sscanf(line, "VmRSS: %llu kB", &kb) != 1)
        kb = 0;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/*
** What only the kernel's map of the process can tell (/proc/self/smaps, per mapping): the
** program and its libraries as mapped from files, with the pages of theirs that were
** written (relocated data: anonymous copies) and the .bss each has right after its file
** mapping; SQLite's WAL index (its -shm files, mapped shared); and the threads' stacks (the
** main one, and each thread's mapping of at least RT_ADMIN_STACK_MIN bytes that follows its
** guard page).
*/
#define RT_ADMIN_STACK_MIN (64 * 1024)
#define RT_ADMIN_GUARD_MAX (64 * 1024)

typedef struct {
    uint64_t program, wal_index, stacks;
} maps_mem_t;

typedef struct {
    unsigned long start, end, inode;
    char perms[5];
    bool shm; /* a -shm file */
    bool stack, bss;
} mapping_t;

static void maps_mem(maps_mem_t *mm)
{
    memset(mm, 0, sizeof(*mm));
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return;
    char line[512];
    mapping_t cur = {0}, prev = {0};
    while (fgets(line, sizeof(line), f)) {
        unsigned long start, end, off, inode;
        char perms[5], dev[16];
        int path = 0;
        /*
        ** A mapping's header starts with its address in lower-case hex, its fields with a
        ** capitalised name, and only Rss matters: the first byte tells them apart, which keeps
        ** sscanf off some twenty lines per mapping: at 19,900 connections that took a scrape
        ** (admin_metrics.c) from 2.3 to 1.6 ms of CPU, before readings were reused (below).
        */
        bool header = (line[0] >= '0' && line[0] <= '9') || (line[0] >= 'a' && line[0] <= 'f');
        if (!header && strncmp(line, "Rss:", 4) != 0)
            continue;
        if (header && sscanf(line, "%lx-%lx %4s %lx %15s %lu %n", &start, &end, perms, &off, dev,
                             &inode, &path) == 6) {
            prev = cur;
            cur = (mapping_t){.start = start, .end = end, .inode = inode};
            memcpy(cur.perms, perms, sizeof(perms));
            const char *name = line + path;
            size_t n = strcspn(name, "\n");
            cur.shm = inode && n >= 4 && memcmp(name + n - 4, "-shm", 4) == 0;
            cur.stack = strncmp(name, "[stack]", 7) == 0;
            if (!inode && !n && prev.end == start) {
                cur.bss = prev.inode && !prev.shm;
                cur.stack = prev.perms[0] == '-' && prev.end - prev.start <= RT_ADMIN_GUARD_MAX &&
                            end - start >= RT_ADMIN_STACK_MIN;
            }
            continue;
        }
        unsigned long long kb;
        if (sscanf(line, "Rss: %llu kB", &kb) != 1)
            continue;
        uint64_t b = (uint64_t)kb * 1024;
        if (cur.shm)
            mm->wal_index += b;
        else if (cur.inode || cur.bss)
            mm->program += b;
        else if (cur.stack)
            mm->stacks += b;
    }
    fclose(f);
}

/*
** The map changes slowly (libraries load at start, threads are few, a WAL index keeps its
** size), but reading it costs about half a scrape's CPU at 20,000 connections (the kernel
** walks every mapping's pages), and Prometheus, a dashboard and rtctl may all ask each
** second: a reading younger than RT_ADMIN_MAPS_MAX_AGE_MS is reused. The kinds still add
** up to RSS, read fresh each time: what moved since goes to "unexplained".
*/
#define RT_ADMIN_MAPS_MAX_AGE_MS 1000

static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;
static maps_mem_t maps_cached; /* under maps_lock */
static uint64_t maps_read_ms;
static bool maps_valid;

static void maps_mem_recent(maps_mem_t *mm)
{
    pthread_mutex_lock(&maps_lock);
    uint64_t now = rt_mono_ms();
    if (!maps_valid || now - maps_read_ms >= RT_ADMIN_MAPS_MAX_AGE_MS) {
        maps_mem(&maps_cached);
        maps_read_ms = now;
        maps_valid = true;
    }
    *mm = maps_cached;
    pthread_mutex_unlock(&maps_lock);
}

void rt__admin_memory(rt_admin_mem_t *m, uint64_t heap_bytes, uint64_t bin_bytes)
{
    memset(m, 0, sizeof(*m));
    rt_stats_t rs;
    rt_stats(&rs);
    size_t pool_mapped, pool_chunks, bins_count, bins_bytes;
    rt_heap_pool_stats(&pool_mapped, &pool_chunks);
    rt_bin_totals(&bins_count, &bins_bytes);
    rt_rules_stats_t rules = {0};
    rt_rules_stats(&rules);
    rt_sink_info_t sinks[SINKS_MAX];
    size_t nsinks = rt_sinks_snapshot(sinks, SINKS_MAX);
    for (size_t i = 0; i < nsinks && i < SINKS_MAX; i++)
        m->sink_queues += sinks[i].bytes;
    if (rt_broker) {
        rt_trie_stats_t ts = {0};
        size_t count = 0, msgs = 0, mem = 0;
        rt_trie_stats(rt_broker->trie, &ts);
        rt_retained_stats(rt_broker->retained, &count, &msgs, &mem);
        m->topic_trie = ts.bytes;
        m->retained = msgs + mem;
    }
    m->rss = rss_bytes();
    m->actors = rs.actor_bytes_in_use;
    m->actors_mapped = rs.actor_bytes_mapped;
    m->heaps = heap_bytes;
    m->heap_chunks_mapped = pool_mapped;
    m->binaries = bins_bytes;
    m->binaries_count = bins_count;
    m->binaries_held = bin_bytes;
    m->lua = rules.lua_bytes;
    m->rules_index = rules.index_bytes + rules.text_bytes;
}

void rt__admin_memory_doc(rt_doc_t *parent, const rt_admin_mem_t *m)
{
    rt_doc_t *o = rt_doc_add_object(parent, "memory");
    rt_doc_add_bytes(o, "rss", m->rss);
    rt_doc_add_bytes(o, "actors", m->actors);
    rt_doc_add_bytes(o, "actors_mapped", m->actors_mapped);
    rt_doc_add_bytes(o, "actor_heaps", m->heaps);
    rt_doc_add_bytes(o, "heap_chunks_mapped", m->heap_chunks_mapped);
    rt_doc_add_bytes(o, "binaries", m->binaries);
    rt_doc_add_u64(o, "binaries_count", m->binaries_count);
    rt_doc_add_bytes(o, "binaries_held", m->binaries_held);
    rt_doc_add_bytes(o, "lua_states", m->lua);
    rt_doc_add_bytes(o, "rules_index", m->rules_index);
    rt_doc_add_bytes(o, "sink_queues", m->sink_queues);
    rt_doc_add_bytes(o, "topic_trie", m->topic_trie);
    rt_doc_add_bytes(o, "retained", m->retained);
}

/* ---- By kind ---- */

static void add_type(const rt_actor_info_t *info, void *ud)
{
    rt_admin_kinds_t *k = ud;
    size_t i = 0;
    while (i < k->ntypes && strcmp(k->type[i].type, info->type) != 0)
        i++;
    if (i == k->ntypes) {
        if (k->ntypes == RT_ADMIN_TYPES_MAX)
            i = RT_ADMIN_TYPES_MAX;
        else
            k->type[k->ntypes++].type = info->type;
    }
    rt_admin_type_mem_t *t = &k->type[i];
    if (!t->type)
        t->type = "other";
    t->count++;
    t->state += info->state_bytes;
    t->heap += info->heap_bytes;
    t->heap_malloc += info->heap_malloc_bytes;
    t->ext += info->ext_bytes;
    t->bin += info->bin_bytes;
    t->mailbox += info->mailbox_len;
}

static void kind(rt_admin_kinds_t *k, const char *name, int64_t bytes, const char *what)
{
    RT_ASSERT(k->nkinds < RT_ADMIN_KINDS_MAX);
    rt_admin_kind_t *o = &k->kind[k->nkinds++];
    snprintf(o->name, sizeof(o->name), "%s", name);
    o->bytes = bytes;
    o->what = what;
}

void rt__admin_memory_kinds_read(rt_admin_kinds_t *k)
{
    memset(k, 0, sizeof(*k));
    rt_snapshot_actors(add_type, k);
    rt_mem_stats_t rm;
    rt_mem_stats(&rm);
    size_t bins_count, bins;
    rt_bin_totals(&bins_count, &bins);
    uint64_t lua_all, lua_workers;
    rt_rules_lua_memory(&lua_all, &lua_workers);
    rt_rules_stats_t rules = {0};
    rt_rules_stats(&rules);
    size_t sq_used, sq_charged, bs_used, bs_charged;
    rt_sqlite_mem_stats(&sq_used, &sq_charged);
    rt_bson_mem_stats(&bs_used, &bs_charged);
    uint64_t trie = 0, retained = 0;
    if (rt_broker) {
        rt_trie_stats_t st = {0};
        size_t mem = 0;
        rt_trie_stats(rt_broker->trie, &st);
        rt_retained_stats(rt_broker->retained, NULL, NULL, &mem);
        trie = st.bytes;
        retained = mem;
    }
    struct mallinfo2 mi = mallinfo2();
    maps_mem_t mm;
    maps_mem_recent(&mm);
    k->rss = rss_bytes(); /* last: what it is compared with was read just before */

    int64_t sum = 0, in_malloc = 0; /* all the lines; those from malloc */
    uint64_t state = 0, chunks = 0;
#define KIND(name, bytes, from_malloc, what)                                                       \
    do {                                                                                           \
        int64_t b_ = (int64_t)(bytes);                                                             \
        kind(k, name, b_, what);                                                                   \
        sum += b_;                                                                                 \
        in_malloc += (from_malloc) ? b_ : 0;                                                       \
    } while (0)
    for (size_t i = 0; i <= RT_ADMIN_TYPES_MAX; i++) {
        const rt_admin_type_mem_t *t = &k->type[i];
        if (!t->count)
            continue;
        char name[80];
        snprintf(name, sizeof(name), "actors: %s", t->type);
        KIND(name, t->state + t->heap + t->ext, false, "state, heap and charged (ext), see actors");
        in_malloc += (int64_t)(t->heap_malloc + t->ext);
        state += t->state;
        chunks += t->heap - t->heap_malloc;
    }
    KIND("binaries", bins, true, "shared payloads, each counted once");
    KIND("binaries, free", rm.binaries_free, true, "pooled for the next payloads");
    KIND("runtime: actor slab, free", (int64_t)rm.slab_resident - (int64_t)state, false,
         "resident slab memory no actor struct holds");
    KIND("runtime: heap chunks, free", (int64_t)rm.chunks_resident - (int64_t)chunks, false,
         "resident chunk pool memory no heap holds");
    KIND("runtime: tables", rm.tables_resident, false, "pid, timer and fd tables, arena map");
    KIND("runtime: message envelopes", rm.envelopes_in_use + rm.envelopes_free, true,
         "queued, in hand, or free in the pools");
    KIND("runtime: sockets", rm.sockets - rm.sockets_cached, true,
         "socket structs and unsent output");
    KIND("runtime: socket buffers, free", rm.sockets_cached, true,
         "drained output buffers the schedulers keep for the next write");
    KIND("transports", rt_xport_total_memory(), true,
         "TLS, WebSocket and PROXY states of connections, outside OpenSSL");
    KIND("runtime: schedulers", rm.schedulers, true, "scheduler structs and read buffers");
    KIND("broker: topic trie", trie, true, "subscriptions by filter");
    KIND("broker: retained index", retained, true, "topics of retained messages");
    KIND("rules: sets", rules.index_bytes + rules.text_bytes, true,
         "the current set's index, tables and rule texts");
    KIND("rules: Lua, no worker", lua_all > lua_workers ? lua_all - lua_workers : 0, true,
         "states being loaded or tested, old versions");
    KIND("sqlite: no actor", sq_used > sq_charged ? sq_used - sq_charged : 0, true,
         "SQLite memory no actor is charged for");
    KIND("libbson: no actor", bs_used > bs_charged ? bs_used - bs_charged : 0, true,
         "libbson and mongo-c-driver memory no actor is charged for");
    KIND("malloc: in use, other", (int64_t)(mi.uordblks + mi.hblkhd) - in_malloc, false,
         "what no line above names, per-block overhead included");
    KIND("malloc: free", mi.fordblks, false, "kept by malloc for reuse");
    KIND("sqlite: WAL index", mm.wal_index, false, "-shm files, mapped shared");
    KIND("thread stacks", mm.stacks, false, "pages the threads' stacks touched");
    KIND("program and libraries", mm.program, false, "code and data from files, and .bss");
#undef KIND
    k->explained = sum;
    kind(k, "unexplained", (int64_t)k->rss - sum,
         "RSS less the above (negative: counted but not resident)");
}

void rt__admin_memory_kinds(rt_doc_t *parent)
{
    rt_admin_kinds_t *k = malloc(sizeof(*k)); /* some 12 KB: not on a blocking thread's stack */
    if (!k)
        return;
    rt__admin_memory_kinds_read(k);
    rt_doc_t *o = rt_doc_add_object(parent, "memory_by_kind");
    rt_doc_add_bytes(o, "rss", k->rss);
    rt_doc_t *kinds = rt_doc_add_array(o, "kinds");
    for (size_t i = 0; i < k->nkinds; i++) {
        rt_doc_t *e = rt_doc_add_object(kinds, NULL);
        rt_doc_add_str(e, "kind", k->kind[i].name);
        rt_doc_add_bytes(e, "bytes", k->kind[i].bytes);
        rt_doc_add_double(e, "share",
                          k->rss ? 100.0 * (double)k->kind[i].bytes / (double)k->rss : 0, 1);
        rt_doc_add_str(e, "what", k->kind[i].what);
    }
    rt_doc_add_bytes(o, "explained", k->explained);

    rt_doc_t *actors = rt_doc_add_array(o, "actors");
    for (size_t i = 0; i <= RT_ADMIN_TYPES_MAX; i++) {
        const rt_admin_type_mem_t *t = &k->type[i];
        if (!t->count)
            continue;
        rt_doc_t *a = rt_doc_add_object(actors, NULL);
        rt_doc_add_str(a, "type", t->type);
        rt_doc_add_u64(a, "count", t->count);
        rt_doc_add_bytes(a, "state", t->state);
        rt_doc_add_bytes(a, "heap", t->heap);
        rt_doc_add_bytes(a, "ext", t->ext);
        rt_doc_add_bytes(a, "bytes", t->state + t->heap + t->ext);
        rt_doc_add_bytes(a, "bin_held", t->bin);
    }
    free(k);
}
