/*
** Internals shared by the admin socket's files: admin.c (the socket and its
** listener), admin_conn.c (one rtctl client), admin_worker.c (blocking commands),
** admin_request.c (parsing, running, rendering), admin_live.c (changes to a running
** rtd), and the commands: admin_cmd.c, admin_clients.c, admin_top.c, admin_tree.c,
** admin_metrics.c.
*/
#ifndef RT_ADMIN_IMPL_H
#define RT_ADMIN_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "admin.h"
#include "admin_doc.h"
#include "rt.h"

#define RT_ADMIN_OPTS_MAX 16
#define RT_ADMIN_ERR_MAX 1024

typedef struct rt_admin_top_s rt_admin_top_t;

/* One request being answered. */
typedef struct rt_admin_cmd_s {
    int argc; /* positional words (the command's own words first) */
    char *argv[RT_ADMIN_ARGS_MAX];
    size_t arglen[RT_ADMIN_ARGS_MAX];
    int nopts; /* "--name value" pairs, "--" and "-n" style alike */
    const char *opt_name[RT_ADMIN_OPTS_MAX];
    const char *opt_value[RT_ADMIN_OPTS_MAX];
    size_t opt_len[RT_ADMIN_OPTS_MAX];
    bool json;            /* --json: the body is JSON */
    bool help;            /* --help: the command's help is the answer (cmd_help) */
    rt_actor_t *self;     /* the actor answering */
    rt_admin_top_t **top; /* the asking connection's previous top sample (kept by the
                             worker, where `top` runs); NULL on a connection actor */
    /* The answer: a code, and a body as a tree, as text, or an error message. */
    int code;
    rt_doc_t *doc;
    rt_buf_t text;
    char error[RT_ADMIN_ERR_MAX];
    struct rt_admin_gather_s *gather; /* a gathering command's state (admin_clients.c) */
    struct rt_admin_xgather_s *xgather; /* or an XMPP one's (admin_xmpp_sessions.c) */
    struct rt_admin_trace_s *trace;   /* a trace started, for the exec to stream (admin_trace.c) */
} rt_admin_cmd_t;

/* Command flags. */
#define RT_ADMIN_BLOCKING 1u /* runs on the admin worker (blocking pool): file I/O, Lua loading */
#define RT_ADMIN_GATHER 2u   /* asks connection actors; answered when they have replied */
/* With BLOCKING: on a worker of its own, as its caller can make it run long (a rule run). */
#define RT_ADMIN_OWN_WORKER 16u
/*
** "COMMAND CLIENT_ID" about one client: in a cluster, a 404 here (this node holds no such
** client) is asked of the node that holds the id (`cluster client ID --command "WORD SUB"`),
** whose answer comes back with its name first.
*/
#define RT_ADMIN_HOLDER 32u

typedef struct rt_admin_command_s {
    const char *word, *sub; /* "rules", "reload"; sub NULL: the word alone */
    int (*run)(rt_admin_cmd_t *c);
    unsigned flags;
    const char *usage; /* for help; NULL: an alias (a word alone that lists) */
    const char *about; /* what it does, for `COMMAND --help` (NULL only for an alias) */
} rt_admin_command_t;

extern const rt_admin_command_t rt__admin_commands[];

/* ---- admin_request.c ---- */

/* A request answered by the actor self (c->self), on its heap; NULL on OOM. Free it there. */
rt_admin_cmd_t *rt__admin_cmd_new(rt_actor_t *self);
void rt__admin_cmd_free(rt_admin_cmd_t *c);
/*
** Splits a request line in place into c's words and options and finds the
** command it names: the command, or NULL with c's answer set to the error (400).
*/
const rt_admin_command_t *rt__admin_parse(rt_admin_cmd_t *c, char *line, size_t len);
/*
** Runs k for c here and now: on the worker if k is RT_ADMIN_BLOCKING, on the asking
** connection otherwise. c->code is then the answer's, or 0 for a gathering command
** still waiting for replies.
*/
void rt__admin_run(rt_admin_cmd_t *c, const rt_admin_command_t *k);
/* Fills the answer's body into out (status line not included). */
void rt__admin_render(rt_admin_cmd_t *c, rt_buf_t *out);

/* Sets the error answer; returns code for `return rt__admin_fail(c, 404, ...)`. */
int rt__admin_fail(rt_admin_cmd_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The value of option name (without dashes), or NULL; *len gets its length. */
const char *rt__admin_opt(const rt_admin_cmd_t *c, const char *name, size_t *len);
/* A whole-number option within [lo, hi]: 0 with *out (def when absent), or 400 set. */
int rt__admin_opt_long(rt_admin_cmd_t *c, const char *name, long def, long lo, long hi, long *out);
void rt__admin_pid_text(rt_pid_t pid, char *out, size_t n); /* "<slot.gen>" */
/*
** The best `cap` of the elements offered (top's busiest actors, a page of retained topics),
** in a heap whose root is the worst kept: worse(a, b) says a goes before b. Offering is
** O(log cap); what it keeps is in base[0, n) in no order.
*/
typedef struct rt_admin_heap_s {
    void *base; /* cap elements of size bytes, the caller's */
    size_t size, n, cap;
    bool (*worse)(const void *a, const void *b);
} rt_admin_heap_t;
/* Whether elem would be kept (there is room, or it beats the root). */
bool rt__admin_heap_wants(const rt_admin_heap_t *h, const void *elem);
/* Keeps elem, which rt__admin_heap_wants said it would; a full heap first copies the root it
   drops into dropped (when not NULL). */
void rt__admin_heap_put(rt_admin_heap_t *h, const void *elem, void *dropped);
int rt__admin_parse_pid(const char *s, rt_pid_t *out);
void rt__admin_iso_time(uint64_t unix_ms, char *out, size_t n); /* "2024-05-01T12:00:00Z" */
/* "host:port" ("[v6]:port") of a listener, as `listeners` and /metrics name it. */
void rt__admin_listener_text(const char *host, int port, char *out, size_t n);

/*
** Whether a command's sub-command ksub is named by a request's sub and sub2 (NULL: none).
** ksub may be two words ("user list": `xmpp user list`, whose siblings change rtd while it
** only reads); then sub2 must name its second, or, with prefix (help), may be absent.
*/
bool rt__admin_sub_matches(const char *ksub, const char *sub, const char *sub2, bool prefix);
/* Whether word has sub-commands ("clients" has; "status" has not). */
bool rt__admin_has_subs(const char *word);

/* ---- admin_help.c: `help [COMMAND]` and `COMMAND --help` ---- */
int rt__admin_help(rt_admin_cmd_t *c);

/* ---- admin_apikey.c: the HTTP API's keys (rt_admin_set_apikeys) ---- */
int rt__admin_apikey_list(rt_admin_cmd_t *c);
int rt__admin_apikey_add(rt_admin_cmd_t *c);
int rt__admin_apikey_revoke(rt_admin_cmd_t *c);
int rt__admin_apikey_reload(rt_admin_cmd_t *c);

/* ---- admin_xmpp.c: the XMPP accounts (xmpp user list|add|passwd|del), rosters ---- */
int rt__admin_xmpp_user(rt_admin_cmd_t *c);
int rt__admin_xmpp_roster(rt_admin_cmd_t *c);

/* ---- admin_xmpp_sessions.c: xmpp sessions|show|kick, gathering as admin_clients.c does ---- */
int rt__admin_xmpp_sessions(rt_admin_cmd_t *c);
int rt__admin_xmpp_show(rt_admin_cmd_t *c);
int rt__admin_xmpp_kick(rt_admin_cmd_t *c);
int rt__admin_xmpp_servers(rt_admin_cmd_t *c);
bool rt__admin_xmpp_gather_reply(rt_admin_cmd_t *c, rt_msg_t *m);
void rt__admin_xmpp_gather_finish(rt_admin_cmd_t *c);
void rt__admin_xmpp_gather_free(rt_admin_cmd_t *c);

/* ---- admin_delayed.c: delayed publish's messages ---- */
int rt__admin_delayed_list(rt_admin_cmd_t *c);
int rt__admin_delayed_del(rt_admin_cmd_t *c);
int rt__admin_bridges_list(rt_admin_cmd_t *c);
int rt__admin_tenants_list(rt_admin_cmd_t *c);
int rt__admin_bridges_show(rt_admin_cmd_t *c);
int rt__admin_bridges_restart(rt_admin_cmd_t *c);

/* ---- admin_banned.c: the banned list ---- */
int rt__admin_banned_list(rt_admin_cmd_t *c);
int rt__admin_banned_add(rt_admin_cmd_t *c);
int rt__admin_banned_del(rt_admin_cmd_t *c);

/* ---- admin_retained.c: the retained store's messages ---- */
int rt__admin_retained_list(rt_admin_cmd_t *c);
int rt__admin_retained_show(rt_admin_cmd_t *c);
int rt__admin_retained_delete(rt_admin_cmd_t *c);

/* ---- admin.c ---- */

const char *rt__admin_version(void);
uint64_t rt__admin_uptime_ms(void);
/* Per-scheduler utilisation over the last second, from the listener's 1 s tick. */
size_t rt__admin_sched_util(double *util, size_t max);

/* ---- admin_conn.c ---- */

extern const rt_actor_type_t rt__admin_conn_type; /* arg: the accepted socket's fd */

/* ---- admin_worker.c ---- */

/* Message tags between a connection and the worker. */
#define RT_ADMIN_MSG_JOB (RT_MSG_USER + 1) /* data: cookie, then the request line, NUL */

typedef struct rt_admin_job_done_s {
    uint64_t cookie; /* the connection's, from rt__admin_worker_ask */
    int code;
} rt_admin_job_done_t;

/* Starts the workers as permanent children of the supervisor group. */
int rt__admin_worker_start(rt_pid_t group);
/*
** From a connection actor: hands a worker (the RT_ADMIN_OWN_WORKER one with own_worker) a
** request line (copied), answered to the caller with RT_ADMIN_MSG_JOB_DONE carrying cookie.
** 0, or RT_ENOMEM or RT_ENOPROC (no worker runs).
*/
int rt__admin_worker_ask(uint64_t cookie, const char *line, size_t len, bool own_worker);
/* Whether self is a worker. */
bool rt__admin_on_worker(const rt_actor_t *self);

/* ---- admin_live.c ---- */

/* conf is rtd's: the commands read it and `config set` changes it. */
void rt__admin_live_init(rt_conf_t *conf);
const rt_conf_t *rt__admin_conf(void);
/* Every setting with its value as text, under the lock `config set` takes. */
void rt__admin_conf_each(void (*fn)(const rt_conf_value_t *v, void *ud), void *ud);
/*
** Whether key can change while rtd runs, as the schema says (log level, auth files, the
** broker's live limits: asserted to agree); *applies says what a change applies to ("" when
** nothing is known).
*/
bool rt__admin_conf_live(const char *key, const char **applies);
/* Changes a setting now: 200, or 400 (bad value), 404 (unknown), 409 (needs a restart). */
int rt__admin_conf_set(const char *key, const char *value, char *err, size_t errlen);

/* ---- admin_backup.c: copies of state.db and the sinks' files into a new directory ---- */
int rt__admin_backup(rt_admin_cmd_t *c);

/* ---- admin_clients.c ----
** Commands that ask connection actors (clients, subscriptions,
** topics). Their run() sends the questions and sets c->code to 0; each later
** message goes to gather_reply until it returns true or RT_ADMIN_GATHER_MS
** pass; then gather_finish builds the answer from what came. The three pass an
** XMPP command's (c->xgather) on to admin_xmpp_sessions.c.
*/
#define RT_ADMIN_GATHER_MS 3000
bool rt__admin_gather_reply(rt_admin_cmd_t *c, rt_msg_t *m);
void rt__admin_gather_finish(rt_admin_cmd_t *c);
void rt__admin_gather_free(rt_admin_cmd_t *c);
int rt__admin_clients_list(rt_admin_cmd_t *c);
int rt__admin_clients_show(rt_admin_cmd_t *c);
int rt__admin_clients_kick(rt_admin_cmd_t *c);
int rt__admin_subscriptions(rt_admin_cmd_t *c);
int rt__admin_topics(rt_admin_cmd_t *c);
/* "memory": all the actor at pid holds, read now; with full, its parts too. */
void rt__admin_actor_memory_doc(rt_doc_t *o, rt_pid_t pid, bool full);

/* ---- admin_remote.c: administrators across a cluster's nodes ---- */
/* Takes other nodes' questions (rt_cluster_set_admin). */
void rt__admin_remote_start(void);
/* A word of a request line, double-quoted (docs/ADMIN.md): other bytes than printable
   ASCII as \xHH. */
void rt__admin_quote_word(rt_buf_t *out, const char *w);
/* `cluster client ID` (on the worker: it waits for the bucket and the other node). */
int rt__admin_cluster_client(rt_admin_cmd_t *c);

/* ---- admin_cluster.c: `cluster status|nodes|rules` ---- */
int rt__admin_cluster_status(rt_admin_cmd_t *c); /* on the worker: it asks libnats */
int rt__admin_cluster_nodes(rt_admin_cmd_t *c);
int rt__admin_cluster_rules(rt_admin_cmd_t *c);

/* ---- admin_tree.c: the supervision tree, exit signals (on the worker) ---- */
int rt__admin_tree(rt_admin_cmd_t *c);
int rt__admin_actors_kill(rt_admin_cmd_t *c);

/* ---- admin_trace.c: `trace client|topic`, answered in parts ---- */
typedef struct rt_admin_trace_s rt_admin_trace_t;
/* Starts the trace: c->trace set and c->code 0 (with the first part in c->text), or an error. */
int rt__admin_trace(rt_admin_cmd_t *c);
/* Bytes as a quoted C-like string, for a terminal: printable ASCII as is, the rest as \xNN. */
void rt__admin_quote_bytes(rt_buf_t *b, const uint8_t *p, size_t n);
/* The exec took the trace: its ticks start. */
void rt__admin_trace_begin(rt_admin_exec_t *x);
/* An event or tick of x's trace; true when it was the end (the final answer given). */
bool rt__admin_trace_message(rt_admin_exec_t *x, rt_msg_t *m, rt_admin_answer_fn fn, void *ctx);
void rt__admin_trace_end(rt_admin_exec_t *x);

/* ---- admin_metrics.c ---- */
int rt__admin_metrics_prometheus(rt_admin_cmd_t *c);

/* ---- admin_top.c ---- */
int rt__admin_top(rt_admin_cmd_t *c);
int rt__admin_actors_list(rt_admin_cmd_t *c);
int rt__admin_actors_info(rt_admin_cmd_t *c);
void rt__admin_top_free(rt_admin_top_t *t);
/*
** All an actor holds (bytes): its struct and state, its heap, the binaries its heap holds
** and what is held outside the heap on its behalf (rt_charge). A connection's queue is in
** its binaries.
*/
uint64_t rt__admin_actor_memory(const rt_actor_info_t *i);
/* Memory by kind, as the `vm` command and the top node panel show it (bytes). */
typedef struct rt_admin_mem_s {
    uint64_t rss;           /* what the kernel says the process holds */
    uint64_t actors;        /* actor structs and states */
    uint64_t actors_mapped; /* slab memory held for them */
    uint64_t heaps;         /* actor heaps: live objects (sum over actors) */
    uint64_t heap_chunks_mapped;
    uint64_t binaries; /* shared binaries (each counted once) */
    uint64_t binaries_count;
    uint64_t binaries_held; /* binary bytes referenced by actors (a shared one per holder) */
    uint64_t lua;           /* rule workers' Lua states */
    uint64_t rules_index;   /* the rule set's index and kept texts */
    uint64_t sink_queues;   /* rows in sink memory, inflight and spill */
    uint64_t topic_trie;
    uint64_t retained;
} rt_admin_mem_t;

/* ---- admin_mem.c ---- */
void rt__admin_memory(rt_admin_mem_t *m, uint64_t heap_bytes, uint64_t bin_bytes);
void rt__admin_memory_doc(rt_doc_t *parent, const rt_admin_mem_t *m);
/* Adds "memory_by_kind": RSS told apart by kind, down to the unexplained remainder. */
void rt__admin_memory_kinds(rt_doc_t *parent);

/* What rt__admin_memory_kinds_read finds: the kinds, and the actors by type behind them. */
#define RT_ADMIN_TYPES_MAX 64                        /* types told apart; more sum as "other" */
#define RT_ADMIN_KINDS_MAX (RT_ADMIN_TYPES_MAX + 32) /* a line per type, the fixed lines */
typedef struct rt_admin_kind_s {
    char name[80];    /* "actors: conn", "malloc: free", ... "unexplained" (docs/ADMIN.md) */
    int64_t bytes;    /* negative only for free-memory lines and "unexplained" */
    const char *what; /* a phrase for people */
} rt_admin_kind_t;
typedef struct rt_admin_type_mem_s {
    const char *type; /* NULL: an unused entry */
    uint64_t count, state, heap, heap_malloc, ext, bin;
    uint64_t mailbox; /* messages waiting in their mailboxes */
} rt_admin_type_mem_t;
typedef struct rt_admin_kinds_s {
    uint64_t rss;
    int64_t explained; /* the kinds but the last ("unexplained") summed */
    rt_admin_kind_t kind[RT_ADMIN_KINDS_MAX];
    size_t nkinds;
    rt_admin_type_mem_t type[RT_ADMIN_TYPES_MAX + 1]; /* the last sums the types past the max */
    size_t ntypes;
} rt_admin_kinds_t;
/*
** Fills k (some 12 KB: the caller allocates it) from one walk of every actor and a read of
** /proc/self/smaps: O(actors), so from the admin worker or outside any actor.
*/
void rt__admin_memory_kinds_read(rt_admin_kinds_t *k);

#endif
