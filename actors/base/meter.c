/* Library memory charged to the actor it was allocated for (meter.h). */
#include "meter.h"

void rt_meter_begin(rt_meter_t *m, rt_meter_lib_t *lib)
{
    m->mark = lib->thread_bytes();
}

void rt_meter_end(rt_meter_t *m, rt_meter_lib_t *lib, rt_actor_t *self)
{
    m->bytes += lib->thread_bytes() - m->mark;
    m->bytes += atomic_exchange_explicit(&m->outside, 0, memory_order_acquire);
    /* Freeing what no window saw made (the library's, or another meter's) would go below 0. */
    if (m->bytes < 0)
        m->bytes = 0;
    if (m->bytes == m->charged)
        return;
    rt_charge(self, (ptrdiff_t)(m->bytes - m->charged));
    atomic_fetch_add_explicit(&lib->charged, m->bytes - m->charged, memory_order_relaxed);
    m->charged = m->bytes;
}

void rt_meter_add(rt_meter_t *m, rt_meter_lib_t *lib, int64_t mark)
{
    atomic_fetch_add_explicit(&m->outside, lib->thread_bytes() - mark, memory_order_release);
}

void rt_meter_release(rt_meter_t *m, rt_meter_lib_t *lib, rt_actor_t *self)
{
    if (!m->charged)
        return;
    rt_charge(self, -(ptrdiff_t)m->charged);
    atomic_fetch_sub_explicit(&lib->charged, m->charged, memory_order_relaxed);
    m->charged = 0;
}
