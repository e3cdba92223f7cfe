/*
** The admin socket (docs/ADMIN.md): a unix stream socket, mode 0600, where
** rtctl sends one command line and reads a status line ("CODE LENGTH") and a
** body. A listener actor accepts; each client gets its own actor, so `rtctl top`
** holding a connection never delays another command; commands that block
** (loading rule files, reading password files) run on one actor of the blocking
** pool. Everything is read through the runtime's snapshot API and the
** broker's, rules' and sinks' counters: nothing stops the world.
*/
#ifndef RT_ADMIN_H
#define RT_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "rt.h"

#define RT_ADMIN_LINE_MAX (64 * 1024) /* bytes in one request line */
#define RT_ADMIN_ARGS_MAX 64          /* words in one request */
/*
** Unsent reply bytes past which a client's further requests wait, unread, until
** its replies drain: a client that pipelines requests and never reads holds at
** most this plus one reply in rtd (the rest stays in the kernel, then in the client).
*/
#define RT_ADMIN_OUT_MAX (256 * 1024)

#define RT_ADMIN_GROUP "admin_sup" /* the admin actors' supervisor (group.h) */

/*
** Binds the socket (conf->admin_socket, or data_dir/rtd.sock) and starts the
** admin actors, the listener and the worker, permanent children of the group
** supervisor RT_ADMIN_GROUP under sup (0: of nobody); a restarted listener binds
** the socket again. Refuses (RT_EEXIST) when another process answers on the path;
** replaces a stale socket file left by a crash; never removes anything that is
** not a socket. conf must outlive the admin actors (rtd's lives in main);
** `rtctl config set` changes it (under a lock of its own). From outside any actor.
*/
int rt_admin_start(rt_conf_t *conf, const char *version, rt_pid_t sup, char *err, size_t errlen);
/*
** Binds the socket before anything runs (rtd binds every socket it serves first), for
** rt_admin_start's listener to take: the same refusals, with err set. rt_admin_unbind
** closes and removes it if no listener took it.
*/
int rt_admin_bind(const rt_conf_t *conf, char *err, size_t errlen);
void rt_admin_unbind(void);
/*
** Stops answering: the listener (and with it every admin connection) and the
** worker end, and the socket file goes. rtd stops it first, so no command runs
** against a broker half stopped; rt_shutdown would end the actors too. From
** outside any actor: it waits for them.
*/
void rt_admin_stop(void);

/*
** Reloads what SIGHUP reloads: the password and ACL files, then the rules.
** Serialised with `rtctl auth reload` / `rtctl rules reload`. Returns 0, or the
** first error with err naming what failed (a bad file leaves the old one running).
*/
int rt_admin_reload_auth(char *err, size_t errlen);
/*
** Reads the TLS listeners' certificates, keys, CAs and CRLs again: new handshakes use them,
** open connections keep theirs; a listener whose files do not load keeps its old ones.
** err gets one line per TLS listener; 0 when all reloaded.
*/
int rt_admin_reload_tls(char *err, size_t errlen);
int rt_admin_reload_rules(char *err, size_t errlen);

/*
** The command layer for other front ends (the HTTP API): a request line is answered now or
** later, and the caller frames the answer (code and body: JSON with --json, else text).
*/
#define RT_ADMIN_CHANGES 4u /* a command that changes rtd (kick, reload, set): refusable */
/* A command for the admin role alone, whatever the method: it shows clients' traffic (trace)
   or runs a payload of the caller's through the rules (rules test). Refusable. */
#define RT_ADMIN_SENSITIVE 8u
/*
** An answer, or a part of one: a streaming command (`trace`) answers in parts with code 206
** (each a whole line or lines; an empty one says the stream is alive), then once with its
** final code.
*/
typedef void (*rt_admin_answer_fn)(void *ctx, int code, const char *body, size_t len);
/* Who asks (rt_admin_exec_t.via), for the log of changes. */
typedef enum { RT_ADMIN_VIA_RTCTL, RT_ADMIN_VIA_HTTP, RT_ADMIN_VIA_NODE } rt_admin_via_t;
typedef struct rt_admin_exec_s {
    uint64_t cookie;                /* of the answer awaited; 0: none */
    struct rt_admin_cmd_s *waiting; /* a gathering command, or NULL */
    struct rt_admin_trace_s *trace; /* a trace being streamed, or NULL */
    rt_sock_t *sock; /* the front end's socket: a trace drops what would pile up unsent on it */
    rt_ref_t timer;
    /* Who asks, set by the front end before rt_admin_exec_start: every request that would
       change rtd is logged (admin.change) with it and the answer's code. */
    rt_admin_via_t via;
    long uid, pid;    /* rtctl: the admin socket's peer (SO_PEERCRED) */
    char who[64];     /* http: the API key's name */
    char peer[64];    /* http: the client's address */
    char change[128]; /* the changing request being answered (its words, cut); "" if none */
} rt_admin_exec_t;
/* Tags the answer to a waiting request comes in (pass every other message to exec_message). */
#define RT_ADMIN_MSG_JOB_DONE (RT_MSG_USER + 2)       /* data: rt_admin_job_done_t, the body */
#define RT_ADMIN_MSG_GATHER_TIMEOUT (RT_MSG_USER + 3) /* stop waiting for connection actors */
#define RT_ADMIN_MSG_TRACE_TICK (RT_MSG_USER + 4)     /* a trace's second: alive, drops, end */
/*
** Starts answering line (split in place) in the actor self: true when fn was called already
** (with the final answer), false when the answer comes with later messages
** (rt_admin_exec_message). Commands with a flag in refuse (RT_ADMIN_CHANGES,
** RT_ADMIN_SENSITIVE) are answered 403.
*/
bool rt_admin_exec_start(rt_actor_t *self, rt_admin_exec_t *x, char *line, size_t len,
                         unsigned refuse, rt_admin_answer_fn fn, void *ctx);
/* A message to the actor: true if it gave the waiting request its final answer. */
bool rt_admin_exec_message(rt_admin_exec_t *x, rt_msg_t *m, rt_admin_answer_fn fn, void *ctx);
/* Drops a waiting request, and ends a trace (the actor is ending). Keeps who asks. */
void rt_admin_exec_free(rt_admin_exec_t *x);

/*
** Appends rtd's figures to out in the Prometheus text exposition format 0.0.4 (docs/HTTP.md,
** "Metrics"). It walks every actor once and reads /proc/self/smaps (about as long as
** `rtctl vm`): call it from the blocking pool (the admin worker) or outside any actor, never
** from a scheduler. Returns 0, or RT_ENOMEM (out->oom set; what was appended is incomplete).
*/
int rt_admin_metrics_text(rt_buf_t *out);

/*
** Splits a request line in place into words (docs/ADMIN.md quoting). Words
** may hold NUL bytes (\x00), so each comes with its length; each is also
** NUL-terminated, which may write line[len]: the line needs len + 1 bytes.
** Returns 0, or RT_EINVAL with err set.
*/
int rt_admin_split(char *line, size_t len, char **argv, size_t *arglen, int max, int *argc,
                   char *err, size_t errlen);

/*
** The usage of the command a request's first words name (sub, sub2: its second and third
** words, NULL if none; the third counts only for a sub-command of two words, `xmpp user
** add`), as `help` shows it: "rules test NAME --topic T [--payload P] [--qos Q]"; an alias
** gives its command's. NULL when they name no command.
*/
const char *rt_admin_usage(const char *word, const char *sub, const char *sub2);
/*
** What a request line asks for, without running it (the HTTP API answers 404 and 405 by
** it): 0 with the command's flags (RT_ADMIN_CHANGES, ...; those of `help` for --help),
** RT_ENOTFOUND when it names no command, RT_EINVAL when it does not split, RT_ENOMEM.
*/
int rt_admin_lookup(const char *line, size_t len, unsigned *flags);

/*
** The HTTP API's keys, which the admin commands `apikey list|add|revoke|reload` manage: the
** HTTP layer (above this one) hands its functions in when it starts. Each returns 0 or an
** RT_E* code with err set: RT_ENOTFOUND (no such key; no key file configured), RT_EEXIST
** (the name is taken), RT_EINVAL (a bad name or role, a bad line in the file), another
** (the file could not be read or written).
*/
typedef struct rt_admin_apikeys_s {
    const char *(*file)(void); /* http.api_keys_file, "" when none */
    /* Calls fn for each key, in the file's order; created 0: not recorded; last_used_ms 0:
       not used since rtd started. */
    void (*each)(void (*fn)(void *ud, const char *name, const char *role, int64_t created_s,
                            uint64_t last_used_ms),
                 void *ud);
    /* Makes a key named name with role ("read" or "admin"): key gets it (RT_ADMIN_KEY_LEN). */
    int (*add)(const char *name, const char *role, char *key, char *err, size_t errlen);
    int (*revoke)(const char *name, char *err, size_t errlen);
    int (*reload)(char *err, size_t errlen); /* reads the file again */
} rt_admin_apikeys_t;
#define RT_ADMIN_KEY_LEN 72 /* "rtk_" and 64 hex digits, with its NUL */
/* Sets (ops: static) or clears (NULL) the key functions; before or after rt_admin_start. */
void rt_admin_set_apikeys(const rt_admin_apikeys_t *ops);

#endif
