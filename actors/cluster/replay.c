/* The replay record's codec (replay.h). */
#include "replay.h"

#include <string.h>

static void put_be(rt_buf_t *b, uint64_t v, int bytes)
{
    uint8_t out[8];
    for (int i = 0; i < bytes; i++)
        out[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    rt_buf_add(b, out, (size_t)bytes);
}

static uint64_t get_be(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

void rt_replay_start(rt_buf_t *b)
{
    RT_ASSERT(b->len == 0);
    rt_buf_add(b, RT_REPLAY_MAGIC, RT_REPLAY_HEAD);
}

void rt_replay_put(rt_buf_t *b, uint64_t origin_key, uint64_t origin_seq, const void *publish,
                   uint32_t len)
{
    RT_ASSERT(b->len >= RT_REPLAY_HEAD || b->oom);
    if (!rt_buf_reserve(b, RT_REPLAY_ENTRY_MIN + (size_t)len))
        return;
    put_be(b, origin_key, 8);
    put_be(b, origin_seq, 8);
    put_be(b, len, 4);
    rt_buf_add(b, publish, len);
}

int rt_replay_next(const uint8_t *p, size_t len, size_t *at, rt_replay_entry_t *e)
{
    if (*at == 0) {
        if (len < RT_REPLAY_HEAD || memcmp(p, RT_REPLAY_MAGIC, RT_REPLAY_HEAD) != 0)
            return RT_EPROTO;
        *at = RT_REPLAY_HEAD;
    }
    RT_ASSERT(*at <= len);
    if (*at == len)
        return 0;
    if (len - *at < RT_REPLAY_ENTRY_MIN)
        return RT_EPROTO;
    const uint8_t *q = p + *at;
    e->origin_key = get_be(q, 8);
    e->origin_seq = get_be(q + 8, 8);
    e->len = (uint32_t)get_be(q + 16, 4);
    if (len - *at - RT_REPLAY_ENTRY_MIN < e->len)
        return RT_EPROTO;
    e->publish = q + RT_REPLAY_ENTRY_MIN;
    *at += RT_REPLAY_ENTRY_MIN + e->len;
    return 1;
}
