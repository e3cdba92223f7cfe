/*
** Memory a C library allocates on an actor's behalf (SQLite, libbson and mongo-c-driver),
** charged to that actor with rt_charge, so rtctl shows it as the actor's ext_bytes.
**
** Such a library allocates through its own allocator, which knows nothing of actors. Its
** allocator is wrapped (sqlite_mem.c, sink_mongo.c) to keep, per thread, the net bytes the
** library has allocated there (a library's object may be freed on another thread than the
** one that made it, so one thread's count can go negative; only differences are read). An
** actor's turn runs on one thread, so the bytes the library gained between two points of a
** turn are what the actor's calls made it hold: a meter opens a window before such calls
** and closes it after, and adds the difference to the memory of the objects it covers (a
** database connection, a client). Windows may also be opened outside any actor, while an
** object is made before its actor runs (the store opens its database at start): what they
** measure is handed to the owner (atomically: the owner may run meanwhile) and charged at
** its next window, in its own turn, since only the owner may charge its heap.
**
** What no window sees (a library's global state, its background threads) is the library's
** total less what actors are charged for: rtctl vm shows it on its own line.
*/
#ifndef RT_METER_H
#define RT_METER_H

#include <stdatomic.h>
#include <stdint.h>

#include "rt.h"

/* One library: its per-thread count and the bytes actors are charged for, process-wide. */
typedef struct rt_meter_lib_s {
    int64_t (*thread_bytes)(void); /* net bytes the library allocated on this thread */
    _Atomic int64_t charged;       /* sum of every meter's charged */
} rt_meter_lib_t;

/* The memory of some objects of one library, owned by one actor. Zeroed is empty. */
typedef struct rt_meter_s {
    int64_t mark;            /* the owner's thread count when its window opened */
    int64_t bytes;           /* what the objects hold, as measured (never below 0); owner only */
    int64_t charged;         /* of which charged to the owner; owner only */
    _Atomic int64_t outside; /* measured outside the owner, not yet in bytes */
} rt_meter_t;

/* The owner's window, in its turn: opened before its calls into the library ... */
void rt_meter_begin(rt_meter_t *m, rt_meter_lib_t *lib);
/*
** ... and closed after: adds what the library allocated less what it freed on this thread
** since rt_meter_begin (and what windows outside measured), and charges self what it is
** not charged for yet, or gives back what it no longer holds.
*/
void rt_meter_end(rt_meter_t *m, rt_meter_lib_t *lib, rt_actor_t *self);
/* A window outside the owner: its mark is lib->thread_bytes() before the calls. */
void rt_meter_add(rt_meter_t *m, rt_meter_lib_t *lib, int64_t mark);
/*
** The owner stops holding the objects (its terminate): its charge is given back. A later
** window (another incarnation of the owner) starts from what the objects still hold.
*/
void rt_meter_release(rt_meter_t *m, rt_meter_lib_t *lib, rt_actor_t *self);

#endif
