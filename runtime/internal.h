/*
** Private structures shared by the runtime's modules (rt__ prefix). Nothing
** outside runtime/ includes this file.
*/
#ifndef RT_INTERNAL_H
#define RT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>

#include "idpool.h"
#include "rt.h"

/* ---- Spinlock: short critical sections only (run queues, mute lists). ---- */
typedef struct {
    atomic_int locked;
} rt_spinlock_t;

void rt__spin_lock(rt_spinlock_t *l);
static inline void rt__spin_unlock(rt_spinlock_t *l)
{
    atomic_store_explicit(&l->locked, 0, memory_order_release);
}

/* ---- Cycle clock for per-turn CPU accounting (rdtsc where available). ---- */
uint64_t rt__ticks(void);
uint64_t rt__ticks_to_ns(uint64_t ticks);
uint64_t rt__ns_to_ticks(uint64_t ns);

/* ---- Epoch-based reclamation ----
** Actor structs are read by senders on other threads after a pid lookup, so
** an exited actor is only freed once every thread has passed a quiescent
** point since it was retired. Scheduler threads announce quiescence between
** batches of turns, so senders pay nothing per message.
*/
typedef struct rt_retired_s {
    struct rt_retired_s *next;
    void (*reclaim)(struct rt_retired_s *r);
    uint64_t epoch; /* global epoch read after the object became unreachable */
} rt_retired_t;

#define RT_EBR_MAX_THREADS 128

typedef struct rt_ebr_thread_s {
    _Alignas(RT_CACHE_LINE) atomic_uint_fast64_t local; /* epoch << 1 | active; read by all */
    rt_retired_t *limbo_head, *limbo_tail;               /* owner only, epochs ascending */
    bool in_use;
} rt_ebr_thread_t;

rt_ebr_thread_t *rt__ebr_register(void);
void rt__ebr_unregister(rt_ebr_thread_t *t); /* reclaims what it can; rest goes to the orphan list */
void rt__ebr_enter(rt_ebr_thread_t *t);      /* start of a critical region (also a quiescent point) */
void rt__ebr_leave(rt_ebr_thread_t *t);
void rt__ebr_retire(rt_ebr_thread_t *t, rt_retired_t *r);
void rt__ebr_drain_all(void); /* shutdown only, when no other thread runs */

/* ---- Thread context ---- */
typedef struct rt_sched_s rt_sched_t;

typedef struct rt_tls_s {
    rt_sched_t *sched;      /* scheduler owning this thread, or NULL */
    bool blocking_thread;   /* a blocking-pool thread */
    rt_ebr_thread_t *ebr;   /* NULL for threads outside the runtime */
    rt_actor_t *current;    /* actor in a callback, or NULL */
    uint64_t turn_start;    /* ticks when the current actor's turn began (rt_turn_us) */
    uint64_t turn_mono_ns;  /* rt_turn_mono_ns's reading this turn, 0: none yet */
} rt_tls_t;

extern _Thread_local rt_tls_t rt__tls;

/* External threads (main, tests) enter a shared EBR record under a mutex. */
void rt__external_enter(void);
void rt__external_leave(void);

/* Gives the calling scheduler's cached socket output buffers back to malloc. */
void rt__sock_out_trim(void);

/* ---- Message pool ---- */
void rt__msg_pool_destroy(void);
/* Gives the calling thread's cached envelopes and every one in the depot back to malloc. */
void rt__msg_trim(void);
/*
** Whether freed memory is kept for reuse (the binaries' pool, the schedulers' output
** buffers): not under ASan, where every block goes back to malloc so that a stale pointer
** into one is still caught.
*/
#if defined(RT_SANITIZED) && !defined(RT_TSAN)
#define RT_REUSE_FREED 0
#else
#define RT_REUSE_FREED 1
#endif
#define RT_BIN_STEP 64        /* bytes between the binaries' pool classes (heap.c) */
#define RT_BIN_DEPOT_MAX 8    /* batches of free binaries the pool's depot keeps per class */
#define RT_BIN_BATCH 32       /* free binaries moved between a thread and the depot at once */
#define RT_BIN_CACHE_HIGH 128 /* free binaries a thread keeps per class */
/* Gives the calling thread's pooled free binaries and the shared ones back to malloc. */
void rt__bin_pool_trim(void);
size_t rt__bin_pool_free_bytes(void); /* pooled binaries no one holds */
/* Bytes of envelopes handed out, and malloc'd for the pool in all (handed out or free). */
void rt__msg_pool_stats(size_t *in_use, size_t *held);

/* ---- Memory accounting ---- */
/* Bytes of the pages of [p, p + len) in memory (mincore); p page-aligned. 0 on error. */
size_t rt__resident(const void *p, size_t len);

/* ---- Actor memory (slab.c) ---- */
void *rt__slab_alloc(size_t size, uint8_t *cls);
void rt__slab_free(void *p, uint8_t cls);
void rt__slab_stats(size_t *mapped, size_t *in_use);
size_t rt__slab_resident(void); /* bytes of its regions in memory */
void rt__slab_destroy(void);
/* Bytes of slab pages held but not in use: what a trim could give back at best. */
size_t rt__slab_idle_bytes(void);
/* Moves the calling thread's cached free actor structs to the shared depot. */
void rt__slab_flush_thread(void);
/* Gives the pages holding no live actor back to the OS; returns the bytes given back. */
size_t rt__slab_trim(void);

/* Runtime-internal flags in rt_msg_t.flags. */
#define RT_MSGF_LINKED 1u /* exit signal caused by a link */
#define RT_MSGF_FORCE 2u  /* exit signal that cannot be trapped (shutdown) */
#define RT_MSGF_FD 4u     /* reserved2 holds a file descriptor the message owns */
#define RT_MSGF_OWNED 8u  /* data begins with an rt_msg_owned_t the message owns */

/* Signal tags live below RT_MSG_USER too, and never reach handle(). */
#define RT_SIG_WAKE 16    /* pushed into the mailbox to get signals looked at */
#define RT_SIG_LINK 17
#define RT_SIG_UNLINK 18
#define RT_SIG_EXIT 19
#define RT_SIG_MONITOR 20
#define RT_SIG_DEMONITOR 21

typedef struct rt_sig_s {
    rt_pid_t from;
    rt_reason_t reason;
    rt_ref_t ref;
} rt_sig_t;

/* ---- Actors ---- */
typedef enum {
    RT_REL_LINK = 1,
    RT_REL_MONITORING,   /* I monitor pid */
    RT_REL_MONITORED_BY, /* pid monitors me */
} rt_rel_kind_t;

typedef struct rt_rel_s {
    rt_pid_t pid;
    rt_ref_t ref;
    uint32_t kind;
} rt_rel_t;

/* Flags in rt_actor_t.sync_flags (atomic, touched by other threads). */
#define RT_AF_OVERLOADED 1u /* exhausted its batch with messages left */
#define RT_AF_PRESSURE 2u   /* its socket cannot take more output */
#define RT_AF_DEAD 4u       /* exited; sends are dead letters */
#define RT_AF_SHEDDING 8u   /* refuses optional messages (rt_shed) */
#define RT_AF_HOLD 16u      /* holds its senders back for memory (rt_hold_senders) */
#define RT_AF_LOW 32u       /* the low lane (rt_set_priority, rt_sock_low_at_hangup) */
/* Either kind of backpressure: senders are parked, and it handles only its own events. */
#define RT_AF_BACKPRESSURE (RT_AF_PRESSURE | RT_AF_HOLD)

struct rt_actor_s {
    /* Touched by senders on any thread. */
    rt_msg_t *_Atomic mbox_head;  /* Pony: low bit set = empty and not scheduled */
    rt_msg_t *_Atomic sigs;       /* signal stack (LIFO, reversed on take) */
    atomic_uint_fast64_t sent;    /* messages pushed; mailbox length = sent - received */
    atomic_uint sync_flags;       /* RT_AF_* */
    rt_spinlock_t mute_lock;      /* guards muted */
    rt_actor_t *muted;            /* senders parked until this actor drains */

    /* Owner (the thread running the actor) only, except where noted. */
    rt_msg_t *mbox_tail;
    rt_msg_t *_Atomic stub_next;  /* the mailbox's initial stub node: only its next field */
    atomic_uint_fast64_t received;  /* written by owner, read by snapshots */
    atomic_uint_fast64_t reductions;
    atomic_uint_fast64_t cpu_ticks;
    atomic_uint current_tag;
    atomic_int status;            /* rt_actor_status_t, read by snapshots */
    rt_pid_t pid;                 /* immutable */
    const rt_actor_type_t *type;  /* immutable */
    rt_actor_t *runq_next;        /* run queue or mute list link */
    rt_actor_t *mute_target;      /* set during a turn that sent to an overloaded actor */
    int16_t last_sched;           /* scheduler of its latest turn, -1: none yet (snapshots) */
    uint8_t trap_exit;
    uint8_t exiting;
    uint8_t init_done;
    uint8_t over_heap;
    uint8_t overload_turns;       /* consecutive turns that exhausted the batch */
    uint8_t slab_class;           /* how this struct was allocated (slab.c) */
    rt_reason_t exit_reason;
    uint32_t nrels, caprels;
    uint32_t max_heap_kib;        /* 0: unlimited; KiB so the limit fits beside nrels */
    /* Dead once the actor has exited (links told, sockets closed, held messages dropped),
       when the grace period's link takes their place. */
    union {
        struct {
            rt_rel_t *rels;       /* links and monitors (runtime memory) */
            rt_sock_t *socks;     /* sockets this actor owns */
            rt_msg_t *held;       /* the last of the messages held back under socket pressure
                                     (a ring through next: held->next is the oldest); NULL: none */
        };
        rt_retired_t retired;
    };
    char *_Atomic name;           /* registered name (registry lock) */
    uint8_t yielded;              /* rt_yield was called: the turn ends after this message */
    uint8_t last_waker;           /* a tag of the actor whose send woke it last (place): set
                                     by that waker, the one a wake-up has, before it queues it */
    /* The inline heap (rt_actor_type_t.heap_inline), one bit per 16-byte granule: the
       granules in use, those that begin an object, and those of RT_OBJ_SCAN objects. */
    uint16_t inline_used, inline_start, inline_scan;
    /* Created by the first allocation: an actor that never allocates (most idle ones)
       pays 8 bytes, not sizeof(rt_heap_t). Read by snapshots, freed after the grace period. */
    rt_heap_t *_Atomic heap;
    _Alignas(16) unsigned char state[];
};
_Static_assert(sizeof(rt_actor_t) == 192, "an idle connection's actor, state and inline heap fit 384 bytes");

/* Where an actor's inline heap begins, counted from its state (16-byte aligned). */
static inline size_t rt__inline_offset(const rt_actor_type_t *t)
{
    return (t->state_size + 15) & ~(size_t)15;
}

/* ---- Schedulers ---- */
#define RT_SCRATCH_BYTES (64 * 1024) /* per-scheduler socket read buffer */

/* 32 bytes, by value in the scheduler's heap: one per connection's keepalive. */
typedef struct rt_timer_node_s {
    uint64_t due_ns;
    rt_pid_t to;
    union {
        rt_msg_t *msg; /* tag == 0: the message to send */
        rt_pid_t from; /* tag-only: the actor that armed it (the message is made at firing) */
    };
    uint32_t tag; /* 0 for a timer with a message */
    uint32_t id;  /* timer id in the timer idpool; its generation is in the timer's state */
} rt_timer_node_t;
_Static_assert(sizeof(rt_timer_node_t) == 32, "a timer node is most of what a keepalive costs");

typedef struct rt_timer_heap_s {
    rt_timer_node_t *nodes; /* binary min-heap on due_ns, by value */
    size_t len, cap;
    size_t compact_at;      /* len that triggers dropping cancelled timers */
} rt_timer_heap_t;

/* A timer handed to a scheduler by a thread that does not own it. */
typedef struct rt_timer_handoff_s {
    struct rt_timer_handoff_s *next;
    rt_timer_node_t node;
} rt_timer_handoff_t;

#define RT_PRIORITY_LANES 2 /* a run queue lane per rt_priority_t */

/* What a scheduler is doing about its next piece of work (rt_sched_t.sleeping). */
#define RT_SLEEP_AWAKE 0 /* running, or about to look at its queues again */
#define RT_SLEEP_DEEP 1  /* parked on its own wake_fd: woken by a write there */
#define RT_SLEEP_POLL 2  /* the poller, parked on the socket set: woken by rt->kick_fd */

struct rt_sched_s {
    unsigned index;
    int wake_fd;                  /* eventfd: the doorbell of a deep sleep */
    pthread_t thread;
    rt_ebr_thread_t *ebr;
    rt_actor_t *runnext;          /* owner only: the actor this thread just woke */
    unsigned runnext_streak;
    unsigned low_passed;          /* owner only: normal turns in a row while low actors waited */
    unsigned char *scratch;       /* socket read buffer of the actors running here */
    rt_timer_heap_t timers;       /* owner only */
    uint64_t timer_due_ns;        /* owner only: the earliest timer in the heap, 0 if none */
    uint64_t trim_after_ms;       /* owner only: no memory trim before this (sched.c idle_trim) */
    uint64_t trim_backoff_ms;     /* owner only: the wait after a trim that gave nothing back */
    uint64_t trim_exited;         /* owner only: actors exited when it last looked */
    uint64_t trim_returned;       /* owner only: heap chunks returned when it last looked */
    uint8_t trim_own;             /* owner only: its own timers and caches are yet to trim */
    uint64_t trim_epoch_seen;     /* owner only: the last rt->trim_epoch it trimmed for */

    _Alignas(RT_CACHE_LINE) rt_spinlock_t qlock;
    rt_actor_t *qhead[RT_PRIORITY_LANES]; /* qlock: a FIFO per rt_priority_t */
    rt_actor_t *qtail[RT_PRIORITY_LANES]; /* qlock */
    atomic_size_t qlen;           /* actors queued in both lanes: what work and sleep go by */
    atomic_size_t qlen_low;       /* of which in the low lane */
    atomic_int sleeping;          /* RT_SLEEP_*: set by the owner, taken back by a waker */
    atomic_bool stopping;
    rt_timer_handoff_t *_Atomic timer_inbox; /* timers handed over by other threads */

    _Alignas(RT_CACHE_LINE) atomic_uint_fast64_t busy_ticks;
    atomic_uint_fast64_t turns;
    atomic_uint_fast64_t steals;
    uint64_t started_ns;
};

typedef struct rt_blocking_pool_s {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    rt_actor_t *head, *tail;
    size_t len;
    bool stopping;
    unsigned nthreads;
    pthread_t *threads;
    atomic_uint_fast64_t busy_ticks;
    atomic_uint_fast64_t turns;
    uint64_t started_ns;
} rt_blocking_pool_t;

typedef struct rt_slot_s {
    rt_actor_t *_Atomic actor;
} rt_slot_t;

typedef struct rt_runtime_s {
    rt_config_t cfg;
    rt_slot_t *slots;             /* mmap'd, max_actors entries, touched lazily */
    rt_idpool_t ids;              /* slot indexes */
    unsigned nsched;
    rt_sched_t *sched;
    rt_blocking_pool_t blocking;

    /* The memory trimmer (sched.c): the shared pools' trim, asked for by idle schedulers. */
    pthread_t trimmer;
    pthread_mutex_t trim_lock;
    pthread_cond_t trim_cond;
    bool trim_asked, trim_stopping;
    atomic_size_t trim_given_back; /* slab bytes the latest trim gave back */
    atomic_uint rr;               /* round robin for external wake-ups */
    atomic_bool stopping;

    /* Sockets: one edge-triggered epoll set for all of them. At most one idle scheduler,
       the poller, sleeps on it; busy schedulers look at it between turns while nobody
       sleeps there. Events carry fds, looked up in by_fd (see sock.c). */
    int epfd;
    int kick_fd;                  /* eventfd in epfd (level-triggered): wakes the poller */
    rt_sock_t *_Atomic *by_fd;    /* mmap'd, by_fd_len entries, touched lazily */
    size_t by_fd_len;             /* the hard limit on descriptors at start */
    atomic_size_t sock_bytes;     /* socket structs and output buffers (malloc; those the
                                     schedulers cache included), for rtctl vm */
    atomic_size_t sock_cached_bytes; /* ... of which cached by schedulers, free for reuse */
    _Alignas(RT_CACHE_LINE) atomic_bool poller_taken;

    atomic_uint_fast64_t spawned, exited, alive, dead_letters;
    atomic_uint_fast64_t trim_epoch; /* bumped when a burst of exits is over (sched.c idle_trim) */
    atomic_uint_fast64_t shed; /* optional messages refused by shedding receivers */
    atomic_uint_fast64_t gcs;  /* heap collections, all actors (rtctl top's GCs per second) */
    atomic_uint_fast64_t heap_limit_kills, next_ref, timers_pending;

    pthread_mutex_t idle_lock;    /* rt_wait_idle */
    pthread_cond_t idle_cond;

    pthread_rwlock_t reg_lock;    /* name registry */
    struct rt_reg_entry_s **reg;
    size_t reg_cap, reg_len;
} rt_runtime_t;

extern rt_runtime_t *rt__rt;

/* Slots (slots.c) */
int rt__slots_init(rt_runtime_t *rt);
void rt__slots_destroy(rt_runtime_t *rt);
/* Returns the live actor for pid, or NULL; caller must be inside an EBR region. */
rt_actor_t *rt__lookup(rt_pid_t pid);
/* Whether pid is a live actor of type (any thread). */
bool rt__is_type(rt_pid_t pid, const rt_actor_type_t *type);
/*
** Keeps a live actor of type allocated (an EBR region) and gives its state, for reading
** under a lock of the state's own: 0, then rt__unpin_state(*external) when done;
** RT_ENOPROC (no such actor) or RT_EINVAL (another type), with nothing to undo.
*/
int rt__pin_state(rt_pid_t pid, const rt_actor_type_t *type, void **state, bool *external);
void rt__unpin_state(bool external);

/* Actors (actor.c) */
void rt__schedule(rt_actor_t *a);                 /* its mailbox just became non-empty */
void rt__requeue(rt_actor_t *a);                  /* still has work: back of a queue */
void rt__actors_release_external(void);
/* Runs one turn (CPU time counted from start, in ticks); reschedules or parks the actor.
   Returns the tick count at the end of the turn, so the caller reads the clock once a turn. */
uint64_t rt__run_turn(rt_actor_t *a, unsigned batch, uint64_t start);
void rt__shutdown_actors(void);
void rt__registry_init(rt_runtime_t *rt);
void rt__registry_destroy(rt_runtime_t *rt);
void rt__registry_remove_actor(rt_actor_t *a);
void rt__set_pressure(rt_actor_t *a, bool on);

/* Schedulers (sched.c) */
void rt__sched_wake(rt_sched_t *s); /* s may be asleep with work for it: ring its bell */
void rt__blocking_push(rt_actor_t *a);

/* Timers (timer.c) */
void rt__timers_init(rt_sched_t *s);
void rt__timers_destroy(rt_sched_t *s);
void rt__timers_trim(rt_sched_t *s); /* drop cancelled timers and the room they took */
void rt__timers_run(rt_sched_t *s);  /* fire what is due, adopt handed-over timers */
int rt__timers_slots_init(void);
void rt__timers_slots_destroy(void);
/* The timer id and state tables: reserved, and touched as timers are made. */
void rt__timers_slots_mem(size_t *mapped, size_t *resident);

/* Hashing (hash.c): SipHash-2-4 under a given key, for the reference test vectors. */
uint64_t rt__siphash24(uint64_t k0, uint64_t k1, const void *data, size_t len);

/* Sockets (sock.c) */
int rt__sock_init(rt_runtime_t *rt);     /* the runtime's epoll set, with kick_fd in it */
void rt__fd_linger(int fd); /* takes fd: shut for writing, drained, closed (linger.c) */
void rt__sock_destroy(rt_runtime_t *rt);
#define RT_SOCK_BATCH 256                /* events taken per epoll_wait */
/* Waits up to timeout_ms (0: only looks) for socket events; any thread, any region. */
int rt__sock_wait(struct epoll_event *evs, int timeout_ms);
/* Posts what rt__sock_wait returned to the sockets' owners, which then run next on
   this thread; the kick is cleared only by the poller. The caller is a scheduler
   inside its EBR region. */
void rt__sock_dispatch(const struct epoll_event *evs, int n, bool poller);
void rt__sock_close_all(rt_actor_t *a);
bool rt__sock_event_deliver(rt_actor_t *a, rt_msg_t *m); /* false: drop the message */
void rt__sock_after_event(rt_msg_t *m);
void rt__sock_flush_turn(rt_actor_t *a); /* end of the owner's turn: send buffered output */
void rt__sock_msg_dropped(rt_msg_t *m);

#endif
