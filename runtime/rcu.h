/*
** Read-mostly pointers that a reload swaps while many threads read them: the
** password table and the ACL. A reader brackets its use with rt_rcu_enter /
** rt_rcu_leave (cheap: one atomic add on a cache line of its own thread, no
** shared write); rt_rcu_swap publishes a new pointer and returns the old one
** only once no reader can still hold it, so the caller may free it at once.
**
** Each thread that reads gets one of RT_RCU_SLOTS slots on first use, given
** back when the thread exits; past that many threads, readers share one
** counter (correct, but a swap then waits for a moment with no such reader).
** Sections nest on one thread. A thread must not call rt_rcu_swap inside a
** section (it would wait for itself), nor block for long inside one (the
** swapping thread waits for it).
*/
#ifndef RT_RCU_H
#define RT_RCU_H

#define RT_RCU_SLOTS 256 /* reader threads with a slot of their own */

typedef struct rt_rcu_s {
    void *_Atomic ptr; /* the published object; NULL is a valid value */
} rt_rcu_t;

/* Enters a read section and returns the pointer to use until rt_rcu_leave. */
void *rt_rcu_enter(rt_rcu_t *r);
void rt_rcu_leave(void);

/*
** Publishes p and returns the previous pointer once every read section that
** might have seen it has ended. Swaps are serialized; any thread outside a
** read section may call it.
*/
void *rt_rcu_swap(rt_rcu_t *r, void *p);

#endif
