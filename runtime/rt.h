/*
** rt: Erlang-style lightweight actors in C.
**
** An actor is a type (a small vtable) plus a state block, a private
** garbage-collected heap and a mailbox. Actors are addressed by 64-bit pids
** (slot + generation), so a message to a dead actor is detected, counted as a
** dead letter and dropped, never a dangling pointer. One scheduler thread per
** core runs actors whose mailboxes are non-empty, a budget of messages per
** turn (an actor may end its turn sooner: rt_yield); an actor runs where it
** was woken, and an idle scheduler steals from a busy one's queue. Actors of
** a type marked RT_TYPE_BLOCKING run on a separate small
** thread pool, so blocking drivers never stall a scheduler.
**
** There is one runtime per process: rt_init() starts it, rt_shutdown() stops
** every actor and returns every byte. Functions that act on "the current
** actor" must be called from that actor's init/handle/terminate callbacks.
*/
#ifndef RT_H
#define RT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "heap.h"

typedef uint64_t rt_pid_t; /* 0 is never a valid pid */
typedef uint64_t rt_ref_t; /* monitor and timer references; 0 is none */
typedef struct rt_actor_s rt_actor_t;
typedef struct rt_sock_s rt_sock_t;

/* ---- Exit reasons (Erlang atoms); user reasons start at RT_REASON_USER. ---- */
typedef int32_t rt_reason_t;
#define RT_REASON_NORMAL 0     /* ordinary exit; does not take links down */
#define RT_REASON_KILL 1       /* untrappable exit signal (exit(Pid, kill)) */
#define RT_REASON_KILLED 2     /* what an actor killed by RT_REASON_KILL exits with */
#define RT_REASON_SHUTDOWN 3   /* orderly stop, as from a supervisor or rt_shutdown */
#define RT_REASON_HEAP_LIMIT 4 /* the actor's heap passed its max_heap */
#define RT_REASON_NOPROC 5     /* link or monitor to an actor that does not exist */
#define RT_REASON_INIT 6       /* the type's init callback failed */
#define RT_REASON_ERROR 7      /* the actor reported an error */
#define RT_REASON_USER 100

/* The reason's name: "normal", "killed", ..., a word given to rt_reason_parse, else "user". */
const char *rt_reason_name(rt_reason_t reason);
/*
** The reason a word names, for exit reasons typed by people (rtctl's exit signals):
** the names above (normal, kill, shutdown, ...), or any other word of 1 to
** RT_REASON_WORD_MAX - 1 letters, digits and underscores, starting with a letter, which
** becomes a reason of its own that rt_reason_name gives back (the same word, the same
** reason). 0; RT_EINVAL for a malformed word; RT_ELIMIT once RT_REASON_WORDS_MAX words
** are taken. Any thread.
*/
#define RT_REASON_WORD_MAX 32  /* bytes of a word, NUL included */
#define RT_REASON_WORDS_MAX 64 /* distinct words a process may turn into reasons */
int rt_reason_parse(const char *word, rt_reason_t *out);

/* ---- Messages ---- */
/* Tags below RT_MSG_USER are the runtime's; user tags start at RT_MSG_USER. */
#define RT_MSG_EXIT 1   /* trapped exit signal: data is rt_exit_msg_t */
#define RT_MSG_DOWN 2   /* monitor fired: data is rt_down_msg_t */
#define RT_MSG_SOCKET 3 /* socket event: data is rt_sock_event_t */
#define RT_MSG_USER 256

/*
** A message envelope. data[] holds len inline bytes; bin optionally carries a
** shared binary that is released when the message is freed (take it with
** rt_msg_take_bin to keep it). The receiver must not keep the envelope past
** its handle callback: the runtime frees it.
*/
typedef struct rt_msg_s {
    struct rt_msg_s *_Atomic next; /* mailbox link (runtime only); must stay first */
    uint32_t tag;
    uint32_t len;       /* bytes in data */
    rt_pid_t from;      /* sender, or 0 when sent from outside any actor */
    rt_bin_t *bin;      /* optional shared payload */
    uint8_t size_class; /* pool class (runtime only) */
    uint8_t flags;      /* runtime only */
    uint16_t reserved;
    uint32_t reserved2;
    _Alignas(16) unsigned char data[];
} rt_msg_t;

typedef struct rt_exit_msg_s {
    rt_pid_t from;
    rt_reason_t reason;
} rt_exit_msg_t;

typedef struct rt_down_msg_s {
    rt_ref_t ref;
    rt_pid_t pid;
    rt_reason_t reason;
} rt_down_msg_t;

/* Allocates an envelope with len bytes of (uninitialised) inline data. */
rt_msg_t *rt_msg_new(uint32_t tag, size_t len);
/* Frees a message that was never sent. */
void rt_msg_free(rt_msg_t *m);
/* Takes the binary out of a received message; the caller owns that reference. */
rt_bin_t *rt_msg_take_bin(rt_msg_t *m);
/*
** A message that carries a file descriptor (a socket handed from one actor to
** another). The message owns fd until the receiver takes it: freeing a message
** that still holds one (a dead letter, a receiver that exited first, or one that
** did not take it) closes it, so a handed-over socket can never leak.
*/
rt_msg_t *rt_msg_new_fd(uint32_t tag, int fd, size_t len);
/* Takes the descriptor out of a received message; -1 if it carries none. */
int rt_msg_take_fd(rt_msg_t *m);
/*
** An object the message owns besides an fd (a connection's TLS state handed over with its
** socket): drop(obj) runs if the message is freed before the receiver takes it. The
** message's data begins with this record, so len must include it.
*/
typedef struct rt_msg_owned_s {
    void *obj;
    void (*drop)(void *obj);
} rt_msg_owned_t;
void rt_msg_own(rt_msg_t *m, void *obj, void (*drop)(void *obj));
/* Takes the owned object out of a received message; NULL if it carries none. */
void *rt_msg_take_owned(rt_msg_t *m);

/*
** Sends m to pid; ownership of m always passes to the runtime. Returns 0, or
** RT_ENOPROC if pid is dead (the message is counted as a dead letter).
** Messages from one sender to one receiver arrive in the order sent.
*/
int rt_send_msg(rt_pid_t to, rt_msg_t *m);
/*
** Load shedding. An actor that knows it cannot use more of some kind of
** message (a connection whose client stopped reading, for QoS 0 traffic)
** turns shedding on; senders of such messages use rt_send_optional, which
** drops the message at the source (RT_ELIMIT, counted in rt_stats as `shed`;
** not per actor, which would cost every actor 8 bytes) instead of queueing it: the receiver's
*mailbox stays short and the
** sender is not muted on its account. Other sends are unaffected.
*/
void rt_shed(rt_actor_t *self, bool on);
/*
** Memory backpressure: socket pressure (see "Sockets") without a socket. While on,
** an actor that sends to self is parked at the end of the callback in which it sent,
** and self handles only its socket events and the messages it sent itself; the rest
** waits in its mailbox, in order, until it turns this off (or its socket pressure
** lifts, whichever is later). For an actor whose memory is at its budget and that
** frees some by reading its socket (a subscriber waiting for acknowledgements).
*/
void rt_hold_senders(rt_actor_t *self, bool on);
bool rt_holding_senders(const rt_actor_t *self);
int rt_send_optional(rt_pid_t to, rt_msg_t *m);
/*
** rt_send_msg that never parks the sender, whatever the receiver's overload or socket
** pressure: for a sender that must not be slowed by that receiver, and that bounds what it
** queues there by other means (a packet trace: trace.h bounds the bytes on their way).
*/
int rt_send_unmuted(rt_pid_t to, rt_msg_t *m);
/* Copies len bytes of data into a new message and sends it. */
int rt_send(rt_pid_t to, uint32_t tag, const void *data, size_t len);
/*
** As rt_send_msg, but m->from is kept as the caller set it: for a message passed on for its
** first sender (a dead letter sent where it should have gone), so that the receiver answers
** that sender and not the actor passing it on.
*/
int rt_forward(rt_pid_t to, rt_msg_t *m);

/* ---- Actor types ---- */
#define RT_TYPE_BLOCKING 1u /* runs on the blocking pool, never on a scheduler */

typedef struct rt_actor_type_s {
    const char *name;
    size_t state_size;
    /* Returns 0, or an error: the spawn then fails and nothing is left behind. */
    int (*init)(rt_actor_t *self, void *state, void *arg);
    void (*handle)(rt_actor_t *self, void *state, rt_msg_t *msg);
    /* Marks the heap roots held in state; NULL scans state conservatively. */
    void (*trace)(void *state, rt_gc_t *gc);
    /* Called once when the actor exits, for any reason (optional). */
    void (*terminate)(rt_actor_t *self, void *state, rt_reason_t reason);
    /* Names a message tag for introspection ("current handler"); optional. */
    const char *(*tag_name)(uint32_t tag);
    /*
    ** Optional: called once for each user message (tag >= RT_MSG_USER) the actor never
    ** handled, those left in its mailbox when it exited and those sent as it exited, so
    ** that whoever waits for an answer to one can be told it is lost. It runs after
    ** terminate, outside any actor callback, on any thread, possibly concurrently with a
    ** new incarnation of the actor; state is the dead actor's state as terminate left it,
    ** to read only. It may send and take the message's binary, never keep the envelope.
    ** Not called once rt_shutdown has begun: nobody waits for an answer then.
    */
    void (*dead_letter)(void *state, rt_msg_t *msg);
    /*
    ** Optional: called at the end of a turn in which the actor handled messages and is not
    ** exiting, before its sockets' output is sent: for output it gathers over a turn (a TLS
    ** connection encrypts one record for a turn's packets instead of one per packet).
    */
    void (*turn_end)(rt_actor_t *self, void *state);
    uint32_t flags;
    /*
    ** Bytes after the state (a multiple of 16, at most RT_HEAP_INLINE_MAX) where the
    ** actor's first small objects live, so that one holding a few (a client id, one
    ** subscription) pays for no heap: a heap's smallest growth step is its header with
    ** its first block (RT_HEAP_FIRST bytes). Objects there are roots of every collection and
    ** stay until rt_free or the actor's exit; what does not fit goes to the heap.
    */
    uint16_t heap_inline;
} rt_actor_type_t;

#define RT_HEAP_INLINE_MAX 256

typedef struct rt_spawn_opts_s {
    bool link;         /* link the new actor to the calling actor */
    rt_ref_t *monitor; /* if set, the caller monitors the new actor; ref stored here */
    size_t max_heap;   /* bytes; 0 takes the runtime default (0 there = unlimited) */
    const char *name;  /* register under this name (fails with RT_EEXIST if taken) */
} rt_spawn_opts_t;

int rt_spawn(const rt_actor_type_t *type, void *arg, rt_pid_t *out);
int rt_spawn_opt(const rt_actor_type_t *type, void *arg, const rt_spawn_opts_t *opts,
                 rt_pid_t *out);

/* "<slot.generation>", the way rtd's log and rtctl show pid (rtctl reads it back). */
void rt_pid_text(rt_pid_t pid, char *out, size_t n);

/* Whether pid names a live actor right now (it may exit a moment later). */
bool rt_alive(rt_pid_t pid);

/* The actor running on this thread, or NULL outside any actor callback. */
rt_actor_t *rt_current(void);
rt_pid_t rt_self(const rt_actor_t *self);
void *rt_state(rt_actor_t *self);

/* Ends the calling actor with reason once its current callback returns. */
void rt_exit(rt_actor_t *self, rt_reason_t reason);
/*
** Erlang exit/2: sends an exit signal. RT_REASON_KILL cannot be trapped; other
** reasons become RT_MSG_EXIT messages in an actor trapping exits, are ignored
** when RT_REASON_NORMAL, and end the target otherwise.
*/
int rt_exit_signal(rt_pid_t pid, rt_reason_t reason);
void rt_trap_exit(rt_actor_t *self, bool on);

/* Links are bidirectional; an abnormal exit travels along them. */
int rt_link(rt_actor_t *self, rt_pid_t pid);
int rt_unlink(rt_actor_t *self, rt_pid_t pid);
/* A monitor delivers one RT_MSG_DOWN; demonitor guarantees none arrives after it. */
int rt_monitor(rt_actor_t *self, rt_pid_t pid, rt_ref_t *ref);
int rt_demonitor(rt_actor_t *self, rt_ref_t ref);

/* Names are released when the actor exits. */
int rt_register(rt_actor_t *self, const char *name);
int rt_unregister(const char *name);
rt_pid_t rt_whereis(const char *name);

/* Allocates from the actor's own heap (zeroed, 16-byte aligned); NULL on failure. */
void *rt_alloc(rt_actor_t *self, size_t size, rt_obj_kind_t kind);
/* Frees an object of the actor's heap now (rt_heap_free); NULL is ignored. */
void rt_free(rt_actor_t *self, void *p);
/*
** Resizes an object of the actor's heap (p NULL allocates): its contents up to the
** smaller size are kept, the rest is zeroed. NULL on failure, with p unchanged.
*/
void *rt_realloc(rt_actor_t *self, void *p, size_t size, rt_obj_kind_t kind);
/* A NUL-terminated copy of the n bytes at s, on the actor's heap (leaf); NULL on failure. */
char *rt_strndup(rt_actor_t *self, const void *s, size_t n);
/* rt_grow for an array on the actor's heap (objects of kind): see rt_grow. */
int rt_grow_on(rt_actor_t *self, void *arr, size_t *cap, size_t need, size_t elem, size_t min,
               rt_obj_kind_t kind);
/*
** Counts memory the actor holds outside its heap (what a library it drives
** allocates: a Lua state, a database handle) as its own, in its memory figures
** and against its max_heap; collection never frees it. delta < 0 gives it back.
*/
void rt_charge(rt_actor_t *self, ptrdiff_t delta);
/* The actor's memory outside its slab: heap, binaries held and what it was charged. */
size_t rt_memory(const rt_actor_t *self);
/*
** An object on the actor's heap whose first word owns bin (reference transferred),
** released when the object is freed or collected; see rt_heap_alloc_bin. Never in
** the inline region. NULL (bin released) on failure.
*/
void *rt_alloc_bin(rt_actor_t *self, size_t size, rt_obj_kind_t kind, rt_bin_t *bin);
/* Keeps a binary alone: rt_alloc_bin of one pointer, not scanned. */
void *rt_hold_bin(rt_actor_t *self, rt_bin_t *bin);
/* Releases the binary of an rt_alloc_bin object now; the object stays, its first word NULL. */
void rt_drop_bin(rt_actor_t *self, void *obj);
/* Counts n extra work units (reductions) for this actor, for fairness and introspection. */
void rt_consume(rt_actor_t *self, uint32_t n);
/*
** Ends the calling actor's turn once the current message is handled, however
** much of its batch is left: with messages still waiting it stays runnable and
** goes to the back of its run queue, so the actors queued there, and the
** scheduler's sockets and timers, get their turn first (BEAM swaps a process
** out when its reductions run out). Nothing is lost or reordered: the next turn
** resumes with the next message. A turn that yields with messages waiting
** counts as one that used its whole batch: turn after turn, the actor is
** overloaded and the actors sending to it are muted, as when its batch runs
** out. An actor whose messages can be costly (a user script, say) calls it
** when rt_turn_us passes its own budget. Call from handle only.
*/
void rt_yield(rt_actor_t *self);
/*
** Priority, two levels (BEAM's normal and low). A low actor waits behind the
** normal ones queued on its scheduler, and never takes the runnext slot, so a
** crowd of background work does not delay the latency-bound actors. It is not
** starved: once RT_LOW_EVERY normal turns in a row have run while low actors
** waited, one low actor gets the next turn. For work whose latency matters less
** than its neighbours' (a connection logging in or tearing down, beside ones in
** session). Takes effect the next time the actor is queued; every actor starts
** normal. Call from the actor's own callbacks (init included). Actors of a
** blocking type have one lane and ignore it.
*/
typedef enum { RT_PRIORITY_NORMAL, RT_PRIORITY_LOW } rt_priority_t;
#define RT_LOW_EVERY 8 /* normal turns in a row, while low actors wait, before a low one runs */
void rt_set_priority(rt_actor_t *self, rt_priority_t prio);
/* Microseconds the calling actor's current turn has run so far (from handle). */
uint64_t rt_turn_us(const rt_actor_t *self);
/*
** Forces a collection now (tests, or after dropping a large structure). The
** only roots are the actor's state: objects reachable only from the calling
** handler's local variables are freed, so call it with none held there.
*/
void rt_gc(rt_actor_t *self);

/* ---- Timers ---- */
/* Delivers m to pid after ms milliseconds. ref (optional) can cancel it. */
int rt_send_after(uint64_t ms, rt_pid_t to, rt_msg_t *m, rt_ref_t *ref);
/*
** A timer whose message is only a tag (no data): the envelope is made when it
** fires, so a pending one costs a heap entry and no envelope (one keepalive
** timer per connection is the use).
*/
int rt_send_after_tag(uint64_t ms, rt_pid_t to, uint32_t tag, rt_ref_t *ref);
/* Returns 0 if the timer was cancelled before firing, RT_ENOTFOUND otherwise. */
int rt_cancel_timer(rt_ref_t ref);

/* ---- Sockets ----
** TCP sockets owned by actors, all in one epoll set that whichever scheduler
** is idle (or between turns) polls; events arrive as RT_MSG_SOCKET messages
** and are handled in the owner's turn, on the scheduler that took the event
** (owners are not pinned). Reads land in the scheduler's scratch buffer, so an idle
** connection holds no read buffer. Writes are buffered and sent once at the
** end of the owner's turn (one system call for many packets); what the kernel
** does not take stays buffered.
**
** Output backpressure. Once a write leaves more than the socket's mark
** (RT_SOCK_HIGH_WATER, or rt_sock_set_high_water) buffered, the owner is under
** pressure until that buffer drains completely (or the mark is raised above
** it). Meanwhile:
**  - the owner handles only its socket events and the messages it sent itself
**    (its timers included); every other message, exits and DOWNs too, waits in
**    its mailbox, in order, and is handled once the pressure lifts;
**  - an actor that sends to it is parked (RT_STATUS_MUTED) at the end of the
**    callback in which it sent, and runs again when the pressure lifts; an
**    actor under pressure itself is not parked, so no cycle of parked actors
**    can form. Only sends from outside any actor are never parked.
**  - the owner, meanwhile, is still parked by an overloaded actor it sends to
**    that is running (not under pressure, not parked itself), as any sender is:
**    that one drains without it, and lets it go if it parks or comes under
**    pressure in turn. So a connection whose client reads nothing cannot fill
**    another actor's mailbox for being under pressure.
** The guarantee, independent of timing: a socket's buffer passes its mark by at
** most what the one handler call that crossed it wrote, plus what the owner's
** socket-event and self-sent handlers write under pressure (nothing, for an
** owner that only writes what it is fed). Each actor feeding the owner adds to
** its mailbox at most the messages of one more callback (one message, for a
** feeder that sends one per callback) after the crossing; a sender waits for
** one actor at a time, so one whose callback was parked by another actor it
** sent to first adds one callback's worth each time that one lets it go, until
** this pressure lifts. What the feeders queued before the crossing stays in the
** mailbox, not in the socket buffer.
** With several sockets the owner is under pressure while any one of them is.
** Every function here must be called by the owning actor.
*/
#define RT_SOCK_READABLE 1u            /* data, EOF or an error is waiting: call rt_sock_read */
#define RT_SOCK_WRITABLE 2u            /* buffered output drained completely */
#define RT_SOCK_HIGH_WATER (64 * 1024) /* default mark: buffered bytes past which feeders wait */

typedef struct rt_sock_event_s {
    rt_sock_t *sock;
    uint32_t events;
} rt_sock_event_t;

/* Listens on host:port (port 0 picks one; see rt_sock_local_port), taking the socket
   rt_tcp_bind_early bound for it if one waits: 0, or RT_EEXIST (the address is in use),
   RT_ENOTFOUND (not an address of this machine), RT_EACCES (a port this process may not
   bind), RT_EINVAL (anything else). */
int rt_tcp_listen(rt_actor_t *self, const char *host, int port, int backlog, rt_sock_t **out);
/*
** Binds host:port and listens, before any actor runs (rtd binds every port it serves
** before it starts anything else, so a port in use fails its start at once): the kernel
** queues connections until the rt_tcp_listen for the same host and port takes the socket
** and accepting begins. Returns rt_tcp_listen's codes, or RT_ELIMIT when too many wait.
** rt_tcp_close_early closes those no rt_tcp_listen took.
*/
int rt_tcp_bind_early(const char *host, int port);
void rt_tcp_close_early(void);
/* What an rt_tcp_listen or rt_tcp_bind_early code means to whoever configured the address. */
const char *rt_tcp_listen_strerror(int rc);
/*
** Descriptors kept in reserve: the kernel gives the lowest free number, so an fd at or past
** the open-file limit (soft) less reserve means fewer than reserve are left. A listener whose
** sockets must not take the last ones (so that the admin socket and HTTP still accept)
** closes such an fd at once.
*/
long rt_fd_limit(
    void); /* RLIMIT_NOFILE's soft limit, read at most once a second (LONG_MAX: none) */
bool rt_fd_in_reserve(int fd, long reserve);
struct sockaddr_storage;
/*
** Accepts one pending connection: 0 with *fd set, RT_EAGAIN when none is waiting. With peer,
** the peer's address goes there (accept gives it for free; getpeername later is a syscall).
*/
int rt_sock_accept(rt_sock_t *listener, int *fd, struct sockaddr_storage *peer);
/*
** Takes ownership of a socket that is already bound and listening (a unix
** socket whose path and mode the caller set up, say); accept with rt_sock_accept.
*/
int rt_sock_adopt_listener(rt_actor_t *self, int fd, rt_sock_t **out);
/*
** Takes ownership of a connected, non-blocking socket fd (rt_sock_accept's are; one handed
** from another actor's rt_sock_detach is). TCP_NODELAY comes from the listener (our
** listening sockets set it; Linux's accepted sockets inherit it).
*/
int rt_sock_adopt(rt_actor_t *self, int fd, rt_sock_t **out);
/*
** Reads what is available into the scheduler's scratch buffer: 0 with *data and
** *len valid until the handler returns; RT_EAGAIN when nothing is waiting (a new
** RT_SOCK_READABLE event will come); RT_ECLOSED at end of stream or on error.
** A handler that stops before RT_EAGAIN gets another readable event later, so
** it can bound its work per turn; rt_sock_pause_reading stops those events.
*/
int rt_sock_read(rt_sock_t *s, const void **data, size_t *len);
void rt_sock_pause_reading(rt_sock_t *s, bool paused);
/*
** The owner's turn that finds the peer gone runs in the low lane: a poller that sees the peer's
** end (EPOLLRDHUP, EPOLLHUP, EPOLLERR) on this socket puts its owner there (rt_set_priority)
** before telling it, and the owner stays there until it sets its priority again. When
** thousands of connections drop at once, their ends (reads of nothing, unsubscribes, goodbyes
** to contacts, closes) wait behind the traffic of those still connected instead of ahead of it
** in one queue.
*/
void rt_sock_low_at_hangup(rt_sock_t *s);
/*
** Sends or buffers all len bytes; RT_ECLOSED if the peer is gone. Output is sent at
** the end of the owner's turn, or at once when RT_SOCK_FLUSH_AT bytes wait: so after
** a write either fewer than RT_SOCK_FLUSH_AT bytes are buffered or the kernel refused
** a send, and an RT_SOCK_WRITABLE event will say when it takes more.
*/
#define RT_SOCK_FLUSH_AT (64 * 1024) /* buffered bytes that are sent at once, mid-turn */
int rt_sock_write(rt_sock_t *s, const void *data, size_t len);
/*
** Writing in place, without a copy: rt_sock_reserve returns room for len bytes at the end
** of the output (grown, counted and bounded as rt_sock_write's), or NULL if the peer is gone
** or memory is short (rt_sock_write then says which). rt_sock_commit makes the first len of
** them (no more than reserved) output, sent as rt_sock_write's are, and returns its codes.
** Nothing else may touch the socket between the two, and one reservation waits at a time.
*/
void *rt_sock_reserve(rt_sock_t *s, size_t len);
int rt_sock_commit(rt_sock_t *s, size_t len);
size_t rt_sock_pending(const rt_sock_t *s); /* buffered output bytes */
/*
** Sends what is buffered now instead of at the end of the turn: 0 when all of it went,
** RT_EAGAIN when the kernel refused some (an RT_SOCK_WRITABLE event will say when it has
** drained), RT_ECLOSED if the peer is gone. For an owner that decides by whether output
** is still waiting (one pending answer at most).
*/
int rt_sock_flush(rt_sock_t *s);
/*
** Whether the kernel took any of the socket's output since the last call (which clears
** it): a peer that reads, however slowly, though its input waits for that output.
*/
bool rt_sock_output_taken(rt_sock_t *s);
/*
** Buffered bytes past which the owner counts as under pressure (0: the default
** RT_SOCK_HIGH_WATER). Raising it lifts pressure at once: for an owner that has
** decided its peer is slow and will drop what it cannot send, instead of muting
** the actors feeding it.
*/
void rt_sock_set_high_water(rt_sock_t *s, size_t bytes);
void rt_sock_close(rt_sock_t *s);
/*
** Closing a connection its owner ends while the peer may still be writing: the last bytes
** go, then the write side is shut and what the peer still sends is read and dropped for a
** bounded while before the close (runtime/linger.c), so that the peer reads those last
** bytes instead of a reset. A peer that has closed already is closed at once.
*/
void rt_sock_close_lingering(rt_sock_t *s);
unsigned rt_sock_lingering(void); /* sockets lingering now */
/*
** Gives up the socket without closing it and returns its fd (to hand to another
** actor with rt_msg_new_fd); s is invalid after. Buffered output is sent first:
** RT_EAGAIN (and the socket stays, s valid) when the kernel does not take all of it.
*/
int rt_sock_detach(rt_sock_t *s);
int rt_sock_fd(const rt_sock_t *s);
int rt_sock_local_port(const rt_sock_t *s);

/* ---- Hashing ----
** One keyed hash (SipHash-1-3, keyed from getrandom on first use) for every
** table, above all those whose keys a client chooses: their collisions cannot
** be planned. Values change from run to run; never store them. tweak is mixed
** into the key (a parent node's address, say), so equal bytes under different
** tweaks land apart.
*/
uint64_t rt_hash(const void *data, size_t len);
uint64_t rt_hash_with(uint64_t tweak, const void *data, size_t len);

/* ---- Random bytes ----
** For what a peer must not guess (stream ids, nonces, made-up names): the kernel's CSPRNG
** (getrandom), buffered per thread. rt_random fills out with n bytes; rt_random_hex writes
** 2 x bytes lowercase hex digits and a NUL (bytes <= 32). 0, or RT_EAGAIN when the kernel
** gives none.
*/
int rt_random(void *out, size_t n);
int rt_random_hex(char *out, size_t bytes);

/* ---- Base64 (RFC 4648, the standard alphabet) ----
** One codec for the password file's hashes and SASL's messages. rt_base64_encode writes
** RT_BASE64_LEN(n) characters and a NUL into out and returns their count. rt_base64_decode
** decodes s[0..n) into out (cap bytes) and returns the byte count, or -1 if s is not base64
** or decodes to more than cap bytes. Without flags the padding is optional (the password
** file's form); RT_BASE64_STRICT asks for one text per value, as SCRAM's do: padding to a
** multiple of 4 characters and the unused bits of the last character zero. RT_BASE64_URL
** decodes the URL alphabet instead ('-' and '_' for '+' and '/': JSON Web Tokens, RFC 7515).
*/
#define RT_BASE64_LEN(n) (4 * (((n) + 2) / 3))
#define RT_BASE64_STRICT 1u
#define RT_BASE64_URL 2u
size_t rt_base64_encode(const void *in, size_t n, char *out);
long rt_base64_decode(const char *s, size_t n, void *out, size_t cap, unsigned flags);

/* ---- Files ----
** Whether rtd may act on a file (or directory) that gives it rights: its configuration,
** rules, password, ACL and API-key files. Refused when someone other than rtd's user and
** root could change what it says: it belongs to another user, its group or others may
** write it, or its directory lets them replace it (writable by group or others without
** the sticky bit). fd is the opened file (checked, not the name, so nothing can be swapped
** in between), or -1 to look at path; path also names its directory. 0 (also for a file
** that is not there: its opener says so), or RT_EACCES (err says why and what to do,
** naming what, e.g. "password_file").
*/
int rt_file_trusted(int fd, const char *path, const char *what, char *err, size_t errlen);

/* ---- Per-thread state ----
** Runs fini(obj) when the calling thread exits: for a _Thread_local object that owns
** memory (scratch space kept per thread rather than per actor, so an idle actor costs
** nothing). Register once per thread and object, on its first use there; RT_ENOMEM if
** it could not be registered (then fini will not run).
*/
int rt_thread_at_exit(void (*fini)(void *obj), void *obj);

/* ---- Clocks ---- */
uint64_t rt_mono_ns(void); /* CLOCK_MONOTONIC: intervals, deadlines, timers */
uint64_t rt_mono_ms(void);
uint64_t rt_wall_ms(void); /* CLOCK_REALTIME, unix ms: what logs, records and clients see */
/*
** CLOCK_MONOTONIC read once per actor turn, and again when that reading is older than
** not_before (a time read since, on another thread): for records of work one turn finishes
** together, such as copies its sockets send at its end. Outside a turn, rt_mono_ns.
*/
uint64_t rt_turn_mono_ns(uint64_t not_before);

/* ---- Growable arrays and byte buffers ----
** rt_grow makes room for need elements of elem bytes in *arr (a T **), doubling its
** capacity *cap from at least min; on RT_ENOMEM the array is unchanged. Callers that a
** remote party can make grow check their own bound before asking.
*/
int rt_grow(void *arr, size_t *cap, size_t need, size_t elem, size_t min);
/*
** A growable byte buffer that is always NUL-terminated (text and binary alike). A
** failed growth sets oom, which sticks: later appends do nothing, so a writer checks
** once at the end instead of after every piece.
*/
typedef struct rt_buf_s {
    char *data; /* NUL-terminated when len > 0 */
    size_t len, cap;
    bool oom;
} rt_buf_t;
bool rt_buf_reserve(rt_buf_t *b, size_t more); /* room for len + more bytes (and the NUL) */
void rt_buf_add(rt_buf_t *b, const void *p, size_t n);
void rt_buf_printf(rt_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Cuts b back to its first len bytes (len <= b->len) and clears oom: what failed came after. */
void rt_buf_truncate(rt_buf_t *b, size_t len);
void rt_buf_free(rt_buf_t *b); /* and empties it for reuse */
/* v as its low `bytes` bytes (1 to 8), most significant first: what rt_reader_uint reads. */
void rt_buf_put_uint(rt_buf_t *b, uint64_t v, int bytes);
/* n (4 bytes, as rt_buf_put_uint) then the n bytes: what rt_reader_bytes reads. */
void rt_buf_put_bytes(rt_buf_t *b, const void *p, size_t n);

/*
** Reading bytes another part wrote (a session's bytes, a message between nodes): a read past
** the end sets bad, which sticks, and gives NULL (or 0), so a reader checks once at the end.
*/
typedef struct rt_reader_s {
    const uint8_t *p;
    size_t len, at;
    bool bad;
} rt_reader_t;
const uint8_t *rt_reader_take(rt_reader_t *r, size_t n);
uint64_t rt_reader_uint(rt_reader_t *r, int bytes); /* most significant byte first */
/* rt_buf_put_bytes's: the bytes (NULL when bad), their count in *n; more than max is bad. */
const uint8_t *rt_reader_bytes(rt_reader_t *r, size_t *n, size_t max);

/* ---- Runtime ---- */
#define RT_SCHEDULERS_DEFAULT 0          /* 0: one per online core */
#define RT_BLOCKING_THREADS_DEFAULT 2    /* threads running RT_TYPE_BLOCKING actors */
#define RT_BATCH_DEFAULT 100             /* messages per turn before yielding (Pony: 100) */
#define RT_MAX_ACTORS_DEFAULT (1u << 22) /* pid table capacity; address space only */

typedef struct rt_config_s {
    unsigned schedulers;
    unsigned blocking_threads;
    unsigned batch;
    uint32_t max_actors;
    size_t min_heap; /* see heap.h */
    double gc_factor;
    size_t max_heap; /* default per-actor limit in bytes; 0 = unlimited */
} rt_config_t;

void rt_config_defaults(rt_config_t *cfg);
int rt_init(const rt_config_t *cfg);
/*
** Stops every actor (exit reason RT_REASON_SHUTDOWN, terminate callbacks run),
** joins every thread and frees everything the runtime allocated. Call from
** the thread that called rt_init, outside any actor.
*/
void rt_shutdown(void);

/* Waits until no actor is alive, up to timeout_ms; returns 0 or RT_EAGAIN. */
int rt_wait_idle(uint64_t timeout_ms);
/* From outside any actor: waits until pid has exited, up to timeout_ms; 0 or RT_EAGAIN. */
int rt_wait_exit(rt_pid_t pid, uint64_t timeout_ms);

typedef struct rt_stats_s {
    uint64_t spawned;
    uint64_t exited;
    uint64_t alive;
    uint64_t dead_letters;
    uint64_t shed;  /* optional messages dropped at the source (rt_send_optional) */
    uint64_t turns; /* actor turns run by schedulers */
    uint64_t gcs;   /* heap collections in all actors */
    uint64_t heap_limit_kills;
    uint64_t timers_pending;
    unsigned schedulers;
    uint32_t max_actors;
    size_t actor_bytes_in_use; /* actor structs and states */
    size_t actor_bytes_mapped; /* slab memory held for them (reused; released at shutdown) */
} rt_stats_t;

void rt_stats(rt_stats_t *out);

/*
** The runtime's own memory, in bytes, for rtctl vm. What it maps itself is given as mapped
** and resident (mincore): a reserved table or a region costs RSS only for the pages that
** were touched and not given back. The rest comes from malloc.
*/
typedef struct rt_mem_stats_s {
    size_t slab_mapped, slab_resident, slab_in_use; /* actor structs and states */
    size_t chunks_mapped, chunks_resident;          /* the heap chunk pool's arenas */
    size_t chunks_in_use;    /* chunks handed to heaps and to threads' chunk caches */
    size_t tables_mapped;    /* pid, timer and fd tables, the heap's arena map: reserved */
    size_t tables_resident;  /* ... and touched */
    size_t envelopes_in_use; /* message envelopes (malloc) handed out: queued or in hand */
    size_t envelopes_free;   /* ... and kept free in the pools */
    size_t sockets;          /* socket structs and their buffered output (malloc) */
    size_t sockets_cached;   /* ... of which drained buffers the schedulers keep for reuse */
    size_t binaries_free;    /* binaries' memory pooled for reuse (malloc), no one's payload */
    size_t schedulers;       /* the runtime's and the schedulers' structs and read buffers */
} rt_mem_stats_t;

void rt_mem_stats(rt_mem_stats_t *out);

/* ---- Introspection (rtctl top is built on it) ---- */
typedef enum rt_actor_status_e {
    RT_STATUS_WAITING = 0, /* mailbox empty */
    RT_STATUS_RUNNABLE,    /* queued on a scheduler */
    RT_STATUS_RUNNING,
    RT_STATUS_MUTED, /* parked by backpressure */
    RT_STATUS_EXITING,
} rt_actor_status_t;

const char *rt_status_name(rt_actor_status_t s);

typedef struct rt_actor_info_s {
    rt_pid_t pid;
    const char *type; /* static type name */
    char name[48];    /* registered name, or "" */
    rt_actor_status_t status;
    uint64_t reductions;
    uint64_t mailbox_len;
    uint64_t state_bytes;       /* the actor struct and its state (slab memory) */
    uint64_t heap_bytes;        /* chunks and large objects owned, and the heap's own header */
    uint64_t heap_malloc_bytes; /* of heap_bytes: what comes from malloc (all but chunks) */
    uint64_t bin_bytes;
    uint64_t ext_bytes;  /* memory held outside the heap on its behalf (rt_charge) */
    uint64_t live_bytes; /* object bytes the last collection kept (0 before the first) */
    uint64_t next_gc;    /* the GC trigger it set: gc_factor x (live + bin), at least min_heap */
    uint32_t gc_count;
    uint32_t gc_last_pause_us;
    uint32_t gc_max_pause_us;
    uint64_t cpu_ns;
    uint32_t current_tag;
    const char *current_handler; /* tag name, or "" */
    int scheduler;               /* scheduler of its latest turn, -1 if it has not run */
} rt_actor_info_t;

typedef struct rt_sched_info_s {
    unsigned index;
    bool blocking_pool;
    uint64_t busy_ns;   /* cumulative; utilisation is d(busy)/d(wall) */
    uint64_t wall_ns;   /* since the scheduler started */
    uint64_t run_queue; /* actors queued, both priority lanes */
    uint64_t turns;
    uint64_t steals;
} rt_sched_info_t;

/*
** Calls fn once per live actor with a consistent copy of its counters. Walks
** the pid table without stopping anyone: O(actors), O(1) extra memory. fn must
** not spawn, send or block. Returns the number of actors visited.
*/
size_t rt_snapshot_actors(void (*fn)(const rt_actor_info_t *info, void *ud), void *ud);
/* Fills up to max entries (schedulers, then blocking threads); returns how many. */
size_t rt_snapshot_schedulers(rt_sched_info_t *out, size_t max);
int rt_actor_info(rt_pid_t pid, rt_actor_info_t *out);

/* ---- Supervisors (Erlang OTP supervisor semantics, restart one_for_one/one_for_all) ----
**
** A supervisor traps exits, starts its children in order (linked) and restarts
** them by strategy: permanent always, transient after an abnormal exit (not
** normal or shutdown), temporary never. More than intensity restarts within
** period_ms and it gives up: it stops every child and exits with
** RT_REASON_SHUTDOWN, so its own supervisor restarts it or, past its intensity
** in turn, gives up too (OTP's escalation). A supervisor whose parent (or anyone:
** exit/2) sends it an exit signal other than normal stops its children in
** reverse start order, one at a time: exit(child, shutdown), and kill once the
** child's shutdown_ms pass without its exit; then it exits with that reason.
*/
typedef enum { RT_PERMANENT, RT_TRANSIENT, RT_TEMPORARY } rt_restart_t;
typedef enum { RT_ONE_FOR_ONE, RT_ONE_FOR_ALL } rt_strategy_t;

#define RT_SUP_SHUTDOWN_MS_DEFAULT 5000 /* ms a stopped child has to exit (OTP: workers) */

/*
** A child's start function (OTP's start_link), for a child that needs more than a
** spawn (a socket bound again, a state rebuilt): it starts the actor with
** rt_spawn_opt(type, its arg, opts, out). opts links the child to the supervisor and
** carries the child's name and max_heap. Runs in the supervisor's turn.
*/
typedef int (*rt_child_start_t)(void *arg, const rt_spawn_opts_t *opts, rt_pid_t *out);

/* Names and args are kept by pointer: they must outlive the supervisor. */
typedef struct rt_child_spec_s {
    const char *name;            /* the child is registered under this name (optional), so
                                    rt_whereis finds its current incarnation */
    const rt_actor_type_t *type; /* spawned with arg ... */
    rt_child_start_t start;      /* ... or started by this, with arg, when set */
    void *arg;
    rt_restart_t restart;
    size_t max_heap;      /* bytes; 0: the runtime's default */
    uint32_t shutdown_ms; /* how long a stop waits for its exit before killing it;
                             0: RT_SUP_SHUTDOWN_MS_DEFAULT */
} rt_child_spec_t;

typedef enum {
    RT_SUP_RESTARTED,    /* a child exited and runs again (pid: the new incarnation) */
    RT_SUP_EXITED,       /* a child exited and stays down: temporary, transient after a
                            normal exit, or stopped by rt_supervisor_terminate_child */
    RT_SUP_START_FAILED, /* a restart's start failed (error): the supervisor gives up */
    RT_SUP_GAVE_UP,      /* a restart past the intensity: the supervisor gives up */
    RT_SUP_STOPPED,      /* the supervisor itself is exiting, for reason */
} rt_sup_event_kind_t;

/* What a supervisor reports to its spec's on_event (strings valid during the call). */
typedef struct rt_sup_event_s {
    rt_sup_event_kind_t kind;
    rt_pid_t sup;
    const char *sup_name; /* the supervisor's registered name, or "" */
    const char *child;    /* the child's name, or "" (RT_SUP_STOPPED: "") */
    rt_pid_t old_pid;     /* the child that exited */
    rt_pid_t pid;         /* RT_SUP_RESTARTED: its new incarnation */
    rt_reason_t reason;   /* why the child exited (RT_SUP_STOPPED: why the supervisor does) */
    uint64_t restarts;    /* the child's restarts so far, this one included */
    int error;            /* RT_SUP_START_FAILED: the start's code */
    unsigned intensity;   /* the supervisor's limits, for a message that states them */
    unsigned period_ms;
} rt_sup_event_t;

typedef struct rt_sup_spec_s {
    rt_strategy_t strategy;
    unsigned intensity;              /* restarts allowed ... */
    unsigned period_ms;              /* ... within this window, else the supervisor gives up */
    size_t nchildren;                /* may be 0: children come with rt_supervisor_start_child */
    const rt_child_spec_t *children; /* copied by the supervisor */
    /* Optional, called in the supervisor's turn (say, to log restarts); must not block. */
    void (*on_event)(const rt_sup_event_t *e, void *ud);
    void *ud;
} rt_sup_spec_t;

extern const rt_actor_type_t rt_supervisor_type; /* arg: const rt_sup_spec_t * */

/*
** OTP's supervisor:start_child: adds a child after the others and starts it; *out (may
** be NULL) gets its pid. sup 0 starts it on its own, supervised by nobody (tests,
** tools). From outside any actor: it waits for the supervisor's answer. 0; RT_ENOPROC
** if sup is not a running supervisor; the child's start error (it is not added).
*/
int rt_supervisor_start_child(rt_pid_t sup, const rt_child_spec_t *spec, rt_pid_t *out);
/*
** OTP's supervisor:terminate_child: stops child as a stopping supervisor would (exit
** shutdown, kill after its shutdown_ms) and keeps it down. sup 0: a child of nobody,
** sent exit(shutdown). Returns once asked; rt_wait_exit waits for the exit.
** RT_ENOPROC if sup is not running.
*/
int rt_supervisor_terminate_child(rt_pid_t sup, rt_pid_t child);

typedef struct rt_sup_child_info_s {
    char name[48]; /* as in its spec, or "" */
    rt_pid_t pid;  /* 0: not running */
    rt_restart_t restart;
    bool supervisor; /* a supervisor itself: rt_supervisor_info answers for it */
    uint64_t restarts;
    rt_reason_t last_reason; /* why it last exited, when last_exit_ms != 0 */
    uint64_t last_exit_ms;   /* wall clock (rt_wall_ms) of its last exit; 0: never */
} rt_sup_child_info_t;

typedef struct rt_sup_info_s {
    rt_strategy_t strategy;
    unsigned intensity, period_ms;
    uint64_t restarts; /* all its children's */
    size_t nchildren;  /* may be more than the max asked for */
} rt_sup_info_t;

/*
** A supervisor's settings and up to max of its children in start order, each copied
** consistently (any thread; the supervisor is not stopped). 0; RT_ENOPROC if sup is
** not alive; RT_EINVAL if it is not a supervisor.
*/
int rt_supervisor_info(rt_pid_t sup, rt_sup_info_t *info, rt_sup_child_info_t *children,
                       size_t max);

#endif
