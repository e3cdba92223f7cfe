/*
** `top`, `actors list` and `actors info`: one walk over every actor
** (rt_snapshot_actors: no stop, O(actors), bounded memory), the top N kept in a
** small heap by the sort key, and per-interval figures from the previous
** sample of the same admin connection (a pid -> counters table). rtctl renders
** nothing: `top` returns the screen as text sized to the terminal, or JSON.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_impl.h"
#include "cluster.h"
#include "conn.h"

#define TOP_ROWS_MAX 1000000 /* -n, --limit */
#define TOP_SCHED_MAX 64
#define TOP_WIDTH_DEFAULT 132
#define TOP_HEIGHT_DEFAULT 40

typedef enum {
    SORT_REDS, /* reductions over the interval */
    SORT_REDS_TOTAL,
    SORT_MEMORY, /* rt__admin_actor_memory */
    SORT_MAILBOX,
    SORT_CPU, /* CPU time over the interval */
    SORT_CPU_TOTAL,
    SORT_GC_PAUSE, /* its longest collection */
} sort_t;

static const char *const sort_names[] = {"reductions", "reductions_total", "memory", "mailbox",
                                         "cpu",        "cpu_total",        "gc_pause"};
static const char *const sort_titles[] = {
    "reductions per interval", "reductions (total)", "memory (state + heap + binaries + ext)",
    "mailbox length",          "CPU per interval",   "CPU time (total)",
    "longest collection"};

typedef struct {
    rt_pid_t pid; /* 0: free slot */
    uint64_t reds, cpu_ns;
} prev_t;

struct rt_admin_top_s {
    prev_t *slots; /* open addressing on pid; load kept <= 1/2 */
    size_t cap;
    uint64_t at_ns; /* CLOCK_MONOTONIC of the sample */
    uint64_t msgs_in, msgs_out, gcs;
    size_t nsched;
    uint64_t busy[TOP_SCHED_MAX], wall[TOP_SCHED_MAX];
};

typedef struct {
    rt_actor_info_t info;
    uint64_t dreds, dcpu_ns;
    uint64_t key;
} row_t;

typedef struct {
    sort_t sort;
    const rt_admin_top_t *prev; /* NULL: per-interval figures are since the actor started */
    rt_admin_top_t *next;       /* the table being built for the next call; NULL: none */
    size_t next_count;          /* entries in next */
    row_t *rows;                /* min-heap on key, at most limit */
    size_t nrows, limit;
    uint64_t actors, heap, bin, mailbox;
    uint64_t by_status[RT_STATUS_EXITING + 1];
    bool oom;
} sample_t;

static size_t slot_of(rt_pid_t pid, size_t cap)
{
    uint64_t h = pid * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

static const prev_t *prev_find(const rt_admin_top_t *t, rt_pid_t pid)
{
    if (!t || !t->cap)
        return NULL;
    for (size_t i = slot_of(pid, t->cap);; i = (i + 1) & (t->cap - 1)) {
        if (t->slots[i].pid == pid)
            return &t->slots[i];
        if (!t->slots[i].pid)
            return NULL;
    }
}

static bool prev_put(rt_admin_top_t *t, rt_pid_t pid, uint64_t reds, uint64_t cpu_ns, size_t *n)
{
    if ((*n + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        prev_t *slots = calloc(cap, sizeof(*slots));
        if (!slots)
            return false;
        for (size_t i = 0; i < t->cap; i++) {
            if (!t->slots[i].pid)
                continue;
            size_t j = slot_of(t->slots[i].pid, cap);
            while (slots[j].pid)
                j = (j + 1) & (cap - 1);
            slots[j] = t->slots[i];
        }
        free(t->slots);
        t->slots = slots;
        t->cap = cap;
    }
    size_t j = slot_of(pid, t->cap);
    while (t->slots[j].pid && t->slots[j].pid != pid)
        j = (j + 1) & (t->cap - 1);
    if (!t->slots[j].pid)
        (*n)++;
    t->slots[j] = (prev_t){pid, reds, cpu_ns};
    return true;
}

void rt__admin_top_free(rt_admin_top_t *t)
{
    if (t)
        free(t->slots);
    free(t);
}

uint64_t rt__admin_actor_memory(const rt_actor_info_t *i)
{
    return i->state_bytes + i->heap_bytes + i->bin_bytes + i->ext_bytes;
}

static uint64_t key_of(sort_t sort, const row_t *r)
{
    switch (sort) {
    case SORT_REDS:
        return r->dreds;
    case SORT_REDS_TOTAL:
        return r->info.reductions;
    case SORT_MEMORY:
        return rt__admin_actor_memory(&r->info);
    case SORT_MAILBOX:
        return r->info.mailbox_len;
    case SORT_CPU:
        return r->dcpu_ns;
    case SORT_CPU_TOTAL:
        return r->info.cpu_ns;
    case SORT_GC_PAUSE:
        return r->info.gc_max_pause_us;
    }
    return 0;
}

/* Top keeps the rows of the largest keys: the smallest kept is the root. */
static bool row_worse(const void *a, const void *b)
{
    return ((const row_t *)a)->key < ((const row_t *)b)->key;
}

static void sample_actor(const rt_actor_info_t *info, void *ud)
{
    sample_t *s = ud;
    s->actors++;
    s->heap += info->heap_bytes;
    s->bin += info->bin_bytes;
    s->mailbox += info->mailbox_len;
    if ((unsigned)info->status <= RT_STATUS_EXITING)
        s->by_status[info->status]++;
    row_t r = {.info = *info};
    const prev_t *p = prev_find(s->prev, info->pid);
    r.dreds = p && info->reductions >= p->reds ? info->reductions - p->reds : info->reductions;
    r.dcpu_ns = p && info->cpu_ns >= p->cpu_ns ? info->cpu_ns - p->cpu_ns : info->cpu_ns;
    r.key = key_of(s->sort, &r);
    if (s->next && !prev_put(s->next, info->pid, info->reductions, info->cpu_ns, &s->next_count))
        s->oom = true;
    rt_admin_heap_t h = {s->rows, sizeof(row_t), s->nrows, s->limit, row_worse};
    if (rt__admin_heap_wants(&h, &r))
        rt__admin_heap_put(&h, &r, NULL);
    s->nrows = h.n;
}

static int cmp_rows(const void *a, const void *b)
{
    const row_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    return x->info.pid < y->info.pid ? -1 : x->info.pid > y->info.pid;
}

static int parse_sort(rt_admin_cmd_t *c, sort_t def, sort_t *out)
{
    const char *v = rt__admin_opt(c, "sort", NULL);
    *out = def;
    if (!v)
        return 0;
    for (size_t i = 0; i < sizeof(sort_names) / sizeof(sort_names[0]); i++)
        if (strcmp(v, sort_names[i]) == 0) {
            *out = (sort_t)i;
            return 0;
        }
    return rt__admin_fail(c, 400,
                          "--sort must be reductions, reductions_total, memory, mailbox, cpu, "
                          "cpu_total or gc_pause");
}

/* Walks every actor; the rows come back sorted, best first. */
static int sample_actors(rt_admin_cmd_t *c, sample_t *s)
{
    s->rows = malloc((s->limit ? s->limit : 1) * sizeof(row_t));
    if (!s->rows)
        return rt__admin_fail(c, 500, "out of memory");
    rt_snapshot_actors(sample_actor, s);
    if (s->oom)
        return rt__admin_fail(c, 500, "out of memory");
    qsort(s->rows, s->nrows, sizeof(row_t), cmp_rows);
    return 0;
}

static void row_doc(rt_doc_t *o, const row_t *r, double interval_s, bool full)
{
    char pid[32];
    rt__admin_pid_text(r->info.pid, pid, sizeof(pid));
    rt_doc_add_str(o, "pid", pid);
    rt_doc_add_str(o, "type", r->info.type);
    rt_doc_add_str(o, "name", r->info.name);
    rt_doc_add_str(o, "state", rt_status_name(r->info.status));
    rt_doc_add_u64(o, "reductions", r->info.reductions);
    if (interval_s > 0)
        rt_doc_add_u64(o, "reductions_delta", r->dreds);
    rt_doc_add_u64(o, "mailbox", r->info.mailbox_len);
    rt_doc_add_bytes(o, "memory", rt__admin_actor_memory(&r->info));
    rt_doc_add_bytes(o, "state_bytes", r->info.state_bytes);
    rt_doc_add_bytes(o, "heap_bytes", r->info.heap_bytes);
    rt_doc_add_bytes(o, "bin_bytes", r->info.bin_bytes);
    rt_doc_add_bytes(o, "ext_bytes", r->info.ext_bytes);
    rt_doc_add_u64(o, "gcs", r->info.gc_count);
    rt_doc_add_duration(o, "gc_max_pause_us", r->info.gc_max_pause_us, 1000000);
    rt_doc_add_bytes(o, "live_bytes", r->info.live_bytes);
    rt_doc_add_bytes(o, "next_gc", r->info.next_gc);
    if (interval_s > 0)
        rt_doc_add_double(o, "cpu_pct", (double)r->dcpu_ns / 1e7 / interval_s, 1);
    rt_doc_add_duration(o, "cpu_us", r->info.cpu_ns / 1000, 1000000);
    rt_doc_add_str(o, "handler", r->info.current_handler ? r->info.current_handler : "");
    if (!full)
        return;
    rt_doc_add_duration(o, "gc_last_pause_us", r->info.gc_last_pause_us, 1000000);
    rt_doc_add_i64(o, "scheduler", r->info.scheduler);
}

/* ---- actors list / info ---- */

int rt__admin_actors_list(rt_admin_cmd_t *c)
{
    long limit;
    sample_t s = {0};
    if (rt__admin_opt_long(c, "limit", 100, 0, TOP_ROWS_MAX, &limit) ||
        parse_sort(c, SORT_REDS_TOTAL, &s.sort))
        return c->code;
    /* No previous sample here: per-interval keys mean the totals. */
    if (s.sort == SORT_REDS)
        s.sort = SORT_REDS_TOTAL;
    if (s.sort == SORT_CPU)
        s.sort = SORT_CPU_TOTAL;
    s.limit = (size_t)limit;
    if (sample_actors(c, &s)) {
        free(s.rows);
        return c->code;
    }
    c->doc = rt_doc_array();
    for (size_t i = 0; i < s.nrows; i++)
        row_doc(rt_doc_add_object(c->doc, NULL), &s.rows[i], 0, false);
    free(s.rows);
    return 200;
}

int rt__admin_actors_info(rt_admin_cmd_t *c)
{
    rt_pid_t pid;
    if (c->argc < 3 || rt__admin_parse_pid(c->argv[2], &pid) != 0)
        return rt__admin_fail(c, 400, "usage: actors info PID (as <slot.gen> or a number)");
    row_t r = {0};
    if (rt_actor_info(pid, &r.info) != 0)
        return rt__admin_fail(c, 404, "no actor %s", c->argv[2]);
    if (!(c->doc = rt_doc_object()))
        return rt__admin_fail(c, 500, "out of memory");
    row_doc(c->doc, &r, 0, true);
    rt_doc_add_u64(c->doc, "pid_number", pid);
    return 200;
}

/* ---- top ---- */

/* A size in the text style of every command (rt_doc_bytes_text): "4.2K", "11.8M". */
static const char *human_size(uint64_t v, char *buf, size_t n)
{
    rt_doc_bytes_text((int64_t)v, buf, n);
    return buf;
}

typedef struct {
    double interval_s;
    double util[TOP_SCHED_MAX];
    bool blocking[TOP_SCHED_MAX];
    uint64_t run_queue[TOP_SCHED_MAX];
    size_t nsched;
    double in_per_s, out_per_s, gcs_per_s;
    rt_admin_mem_t mem;
    uint64_t connections, sessions;
} node_t;

static void node_panel(node_t *n, const rt_admin_top_t *prev, rt_admin_top_t *next,
                       const sample_t *s)
{
    uint64_t now = rt_mono_ns();
    n->interval_s = prev ? (double)(now - prev->at_ns) / 1e9 : (double)rt__admin_uptime_ms() / 1e3;
    if (n->interval_s <= 0)
        n->interval_s = 1e-3;
    rt_sched_info_t info[TOP_SCHED_MAX];
    n->nsched = rt_snapshot_schedulers(info, TOP_SCHED_MAX);
    for (size_t i = 0; i < n->nsched; i++) {
        bool same = prev && i < prev->nsched;
        uint64_t db = info[i].busy_ns - (same ? prev->busy[i] : 0);
        uint64_t dw = info[i].wall_ns - (same ? prev->wall[i] : 0);
        n->util[i] = dw ? (double)db / (double)dw : 0;
        n->blocking[i] = info[i].blocking_pool;
        n->run_queue[i] = info[i].run_queue;
        next->busy[i] = info[i].busy_ns;
        next->wall[i] = info[i].wall_ns;
    }
    next->nsched = n->nsched;
    rt_stats_t rs;
    rt_stats(&rs);
    next->gcs = rs.gcs;
    if (rt_broker) {
        rt_broker_metrics_t bm;
        rt_broker_metrics(&bm);
        next->msgs_in = bm.msgs_in;
        next->msgs_out = bm.msgs_out;
        n->connections = atomic_load(&rt_broker->stats.connections);
        n->sessions = atomic_load(&rt_broker->stats.sessions);
    }
    uint64_t p_in = prev ? prev->msgs_in : 0, p_out = prev ? prev->msgs_out : 0;
    uint64_t p_gcs = prev ? prev->gcs : 0;
    n->in_per_s = (double)(next->msgs_in - p_in) / n->interval_s;
    n->out_per_s = (double)(next->msgs_out - p_out) / n->interval_s;
    n->gcs_per_s = (double)(next->gcs - p_gcs) / n->interval_s;
    next->at_ns = now;
    rt__admin_memory(&n->mem, s->heap, s->bin);
}

static void top_json(rt_admin_cmd_t *c, const node_t *n, const sample_t *s)
{
    rt_stats_t rs;
    rt_stats(&rs);
    c->doc = rt_doc_object();
    rt_doc_t *node = rt_doc_add_object(c->doc, "node");
    rt_doc_add_str(node, "version", rt__admin_version());
    if (rt_cluster_on())
        rt_doc_add_str(node, "cluster_node", rt_cluster_node());
    rt_doc_add_duration(node, "uptime_s", rt__admin_uptime_ms() / 1000, 1);
    rt_doc_add_double(node, "interval_s", n->interval_s, 3);
    rt_doc_add_u64(node, "actors", s->actors);
    rt_doc_add_u64(node, "actors_limit", rs.max_actors);
    rt_doc_add_u64(node, "connections", n->connections);
    rt_doc_add_u64(node, "sessions", n->sessions);
    rt_doc_add_u64(node, "mailboxes", s->mailbox);
    rt_doc_t *sched = rt_doc_add_array(node, "schedulers");
    for (size_t i = 0; i < n->nsched; i++) {
        rt_doc_t *o = rt_doc_add_object(sched, NULL);
        rt_doc_add_u64(o, "id", i);
        rt_doc_add_str(o, "kind", n->blocking[i] ? "blocking" : "scheduler");
        rt_doc_add_double(o, "utilisation", n->util[i], 3);
        rt_doc_add_u64(o, "run_queue", n->run_queue[i]);
    }
    rt_doc_add_double(node, "messages_in_per_s", n->in_per_s, 1);
    rt_doc_add_double(node, "messages_out_per_s", n->out_per_s, 1);
    rt_doc_add_double(node, "gcs_per_s", n->gcs_per_s, 1);
    rt__admin_memory_doc(node, &n->mem);
    rt_doc_add_str(c->doc, "sort", sort_names[s->sort]);
    rt_doc_t *rows = rt_doc_add_array(c->doc, "actors");
    for (size_t i = 0; i < s->nrows; i++)
        row_doc(rt_doc_add_object(rows, NULL), &s->rows[i], n->interval_s, false);
}

/*
** The node panel as "label value" fields that wrap to the next line instead of
** being cut, so a narrow terminal loses no figure (up to `max_lines` lines).
*/
typedef struct {
    rt_buf_t *out;
    int width, col, lines, max_lines;
} panel_t;

static void panel_field(panel_t *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void panel_field(panel_t *f, const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n > f->width)
        n = f->width;
    if (f->col && f->col + 2 + n > f->width) {
        rt_buf_add(f->out, "\n", 1);
        f->col = 0;
        f->lines++;
    }
    if (f->lines >= f->max_lines)
        return;
    if (f->col) {
        rt_buf_add(f->out, "  ", 2);
        f->col += 2;
    }
    rt_buf_add(f->out, text, (size_t)n);
    f->col += n;
}

/* Ends the current group of fields: what follows starts a line of its own. */
static void panel_break(panel_t *f)
{
    if (f->col && f->lines < f->max_lines) {
        rt_buf_add(f->out, "\n", 1);
        f->lines++;
    }
    f->col = 0;
}

enum {
    C_PID,
    C_TYPE,
    C_STATE,
    C_REDS,
    C_DREDS,
    C_MBOX,
    C_MEM,
    C_BIN,
    C_GCS,
    C_GCMAX,
    C_CPU,
    C_HANDLER,
    NCOLS
};

static const struct {
    const char *title;
    int width; /* the handler takes what is left, at least its title */
    bool left;
} columns[NCOLS] = {
    {"PID", 15, true},    {"TYPE/NAME", 22, true}, {"STATE", 8, true},   {"REDS", 12, false},
    {"+REDS", 10, false}, {"MBOX", 7, false},      {"MEMORY", 8, false}, {"BIN", 8, false},
    {"GCS", 7, false},    {"GCMAX", 8, false},     {"CPU%", 6, false},   {"HANDLER", 7, true},
};

/*
** Which columns a screen of `width` shows: the pid, the type and the sort's
** own column first, then the others by how much an operator looks at them;
** shown in their usual order.
*/
static void pick_columns(sort_t sort, int width, bool shown[NCOLS])
{
    static const int by_sort[] = {
        [SORT_REDS] = C_DREDS,   [SORT_REDS_TOTAL] = C_REDS, [SORT_MEMORY] = C_MEM,
        [SORT_MAILBOX] = C_MBOX, [SORT_CPU] = C_CPU,         [SORT_CPU_TOTAL] = C_CPU,
        [SORT_GC_PAUSE] = C_GCMAX};
    int order[] = {C_PID, by_sort[sort], C_TYPE, C_CPU, C_DREDS, C_MBOX,   C_MEM,
                   C_REDS, C_STATE,      C_BIN,  C_GCS, C_GCMAX, C_HANDLER};
    int used = 0;
    memset(shown, 0, NCOLS * sizeof(bool));
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        int k = order[i];
        if (shown[k])
            continue;
        int need = columns[k].width + (used ? 1 : 0);
        if (used + need > width)
            continue;
        shown[k] = true;
        used += need;
    }
}

static void put_row(rt_buf_t *o, int width, const bool shown[NCOLS], char cells[NCOLS][64])
{
    char line[1024];
    size_t len = 0;
    for (int k = 0; k < NCOLS && len < sizeof(line); k++) {
        if (!shown[k])
            continue;
        int w = k == C_HANDLER ? 0 : columns[k].width;
        len += (size_t)snprintf(line + len, sizeof(line) - len, "%s%*.*s", len ? " " : "",
                                columns[k].left ? -w : w, k == C_HANDLER ? 63 : w, cells[k]);
    }
    if (len >= sizeof(line))
        len = sizeof(line) - 1;
    while (len && line[len - 1] == ' ')
        len--;
    rt_buf_add(o, line, len > (size_t)width ? (size_t)width : len);
    rt_buf_add(o, "\n", 1);
}

#define TOP_PANEL_LINES_MAX 8

static void top_text(rt_admin_cmd_t *c, const node_t *n, const sample_t *s, int width, int height)
{
    rt_buf_t *o = &c->text;
    char h[8][16];
    rt_stats_t rs;
    rt_stats(&rs);
    uint64_t up = rt__admin_uptime_ms() / 1000;
    panel_t f = {o, width, 0, 0,
                 height - 3 < TOP_PANEL_LINES_MAX ? height - 3 : TOP_PANEL_LINES_MAX};
    panel_field(&f, "rtd %s", rt__admin_version());
    if (rt_cluster_on())
        panel_field(&f, "node %s", rt_cluster_node());
    char up_text[32];
    rt_doc_seconds_text((double)up, up_text, sizeof(up_text));
    panel_field(&f, "up %s", up_text);
    panel_field(&f, "actors %llu/%llu", (unsigned long long)s->actors,
                (unsigned long long)rs.max_actors);
    panel_field(&f, "connections %llu", (unsigned long long)n->connections);
    panel_field(&f, "sessions %llu", (unsigned long long)n->sessions);
    panel_field(&f, "interval %.2fs", n->interval_s);
    panel_break(&f);
    for (size_t i = 0; i < n->nsched; i++)
        panel_field(&f, "%s%zu %5.1f%% rq %llu", n->blocking[i] ? "blk" : "sched", i,
                    n->util[i] * 100, (unsigned long long)n->run_queue[i]);
    panel_break(&f);
    const rt_admin_mem_t *m = &n->mem;
    panel_field(&f, "memory rss %s", human_size(m->rss, h[0], 16));
    panel_field(&f, "heaps %s", human_size(m->heaps, h[1], 16));
    panel_field(&f, "binaries %s", human_size(m->binaries, h[2], 16));
    panel_field(&f, "actors %s", human_size(m->actors, h[3], 16));
    panel_field(&f, "lua %s", human_size(m->lua, h[4], 16));
    panel_field(&f, "sinks %s", human_size(m->sink_queues, h[5], 16));
    panel_field(&f, "trie %s", human_size(m->topic_trie, h[6], 16));
    panel_field(&f, "retained %s", human_size(m->retained, h[7], 16));
    panel_break(&f);
    panel_field(&f, "msgs/s in %.0f", n->in_per_s);
    panel_field(&f, "out %.0f", n->out_per_s);
    panel_field(&f, "gcs/s %.0f", n->gcs_per_s);
    panel_field(&f, "mailboxes %llu", (unsigned long long)s->mailbox);
    panel_field(&f, "runnable %llu", (unsigned long long)s->by_status[RT_STATUS_RUNNABLE]);
    panel_field(&f, "muted %llu", (unsigned long long)s->by_status[RT_STATUS_MUTED]);
    panel_break(&f);
    panel_field(&f, "sort: %s", sort_titles[s->sort]);
    panel_field(&f, "keys: r R m b c C sort, q quits");
    panel_break(&f);

    bool shown[NCOLS];
    pick_columns(s->sort, width, shown);
    char cells[NCOLS][64];
    for (int k = 0; k < NCOLS; k++)
        snprintf(cells[k], sizeof(cells[k]), "%s", columns[k].title);
    put_row(o, width, shown, cells);
    int room = height - f.lines - 1;
    for (size_t i = 0; i < s->nrows && (int)i < room; i++) {
        const row_t *r = &s->rows[i];
        rt__admin_pid_text(r->info.pid, cells[C_PID], sizeof(cells[C_PID]));
        snprintf(cells[C_TYPE], 64, "%s%s%s", r->info.type, r->info.name[0] ? "/" : "",
                 r->info.name);
        snprintf(cells[C_STATE], 64, "%s", rt_status_name(r->info.status));
        snprintf(cells[C_REDS], 64, "%llu", (unsigned long long)r->info.reductions);
        snprintf(cells[C_DREDS], 64, "%llu", (unsigned long long)r->dreds);
        snprintf(cells[C_MBOX], 64, "%llu", (unsigned long long)r->info.mailbox_len);
        /* MEMORY is what the actor holds besides binaries, shown in BIN. */
        human_size(rt__admin_actor_memory(&r->info) - r->info.bin_bytes, cells[C_MEM], 64);
        human_size(r->info.bin_bytes, cells[C_BIN], 64);
        snprintf(cells[C_GCS], 64, "%u", r->info.gc_count);
        snprintf(cells[C_GCMAX], 64, "%.4fs", r->info.gc_max_pause_us / 1e6);
        snprintf(cells[C_CPU], 64, "%.1f", (double)r->dcpu_ns / 1e7 / n->interval_s);
        snprintf(cells[C_HANDLER], 64, "%s",
                 r->info.current_handler ? r->info.current_handler : "");
        put_row(o, width, shown, cells);
    }
}

int rt__admin_top(rt_admin_cmd_t *c)
{
    long rows, width, height;
    sample_t s = {0};
    if (rt__admin_opt_long(c, "n", 0, 0, TOP_ROWS_MAX, &rows) ||
        rt__admin_opt_long(c, "width", TOP_WIDTH_DEFAULT, 20, 1000, &width) ||
        rt__admin_opt_long(c, "height", TOP_HEIGHT_DEFAULT, 8, 1000, &height) ||
        parse_sort(c, SORT_REDS, &s.sort))
        return c->code;
    if (!rows) /* as many as the screen holds */
        rows = height;
    s.limit = (size_t)rows;
    rt_admin_top_t *prev = c->top ? *c->top : NULL;
    s.prev = prev;
    s.next = calloc(1, sizeof(rt_admin_top_t));
    if (!s.next)
        return rt__admin_fail(c, 500, "out of memory");
    if (sample_actors(c, &s)) {
        free(s.rows);
        rt__admin_top_free(s.next);
        return c->code;
    }
    node_t n = {0};
    node_panel(&n, prev, s.next, &s);
    if (c->json)
        top_json(c, &n, &s);
    else
        top_text(c, &n, &s, (int)width, (int)height);
    free(s.rows);
    if (c->top) {
        rt__admin_top_free(*c->top);
        *c->top = s.next;
    } else {
        rt__admin_top_free(s.next);
    }
    return 200;
}
