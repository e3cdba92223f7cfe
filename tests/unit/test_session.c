/*
** Session message lists: FIFO order, lookup and removal by packet id anywhere
** in the list, and byte accounting that returns to zero (including after a
** QoS 2 message gives up its payload at PUBREC).
*/
#include <string.h>

#include "check.h"
#include "heap.h"
#include "session.h"

static void test_fifo_and_ids(void)
{
    rt_bin_t *bin = rt_bin_new("0123456789", 10);
    rt_qlist_t l = {0};
    uint32_t ids[3] = {7, 8, 9};
    for (uint16_t i = 1; i <= 5; i++) {
        rt_qmsg_t *m = rt_qmsg_new(bin, 1, 0, 0, 0, ids, i % 4);
        CHECK(m != NULL);
        m->packet_id = i;
        rt_qlist_push(&l, m);
    }
    CHECK_EQ(rt_bin_refs(bin), 6);
    CHECK_EQ(l.n, 5);
    CHECK_EQ(l.bytes, 50);
    /* More subscription ids than a message keeps are cut, not overrun. */
    rt_qmsg_t *big = rt_qmsg_new(bin, 0, 0, 0, 0, (uint32_t[12]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 12);
    CHECK_EQ(big->n_sub_ids, RT_QMSG_MAX_SUB_IDS);
    rt_qmsg_free(big);

    CHECK(rt_qlist_find_id(&l, 3) != NULL);
    CHECK(rt_qlist_find_id(&l, 6) == NULL);
    rt_qmsg_t *mid = rt_qlist_take_id(&l, 3);
    CHECK(mid && mid->packet_id == 3 && mid->n_sub_ids == 3 && mid->sub_ids[2] == 9);
    rt_qmsg_free(mid);
    rt_qmsg_t *tail = rt_qlist_take_id(&l, 5);
    CHECK(tail && l.tail && l.tail->packet_id == 4);
    rt_qmsg_free(tail);
    uint16_t order[3];
    for (int i = 0; i < 3; i++) {
        rt_qmsg_t *m = rt_qlist_pop(&l);
        order[i] = m->packet_id;
        rt_qmsg_free(m);
    }
    CHECK(order[0] == 1 && order[1] == 2 && order[2] == 4);
    CHECK(rt_qlist_pop(&l) == NULL);
    CHECK(l.head == NULL && l.tail == NULL && l.n == 0 && l.bytes == 0);
    CHECK_EQ(rt_bin_refs(bin), 1);
    rt_bin_release(bin);
}

static void test_session_free_releases_everything(void)
{
    rt_bin_t *bin = rt_bin_new("x", 1);
    rt_session_t *s = calloc(1, sizeof(*s));
    for (int i = 0; i < 100; i++) {
        rt_qlist_push(&s->queued, rt_qmsg_new(bin, 1, 0, 0, 0, NULL, 0));
        rt_qlist_push(&s->inflight, rt_qmsg_new(bin, 2, 0, 0, 1, NULL, 0));
    }
    CHECK_EQ(rt_bin_refs(bin), 201);
    /* A QoS 2 message past PUBREC keeps only its id; its bytes leave the count with it. */
    rt_qmsg_t *m = s->inflight.head;
    rt_qlist_drop_payload(&s->inflight, m);
    CHECK_EQ(s->inflight.bytes, 99);
    rt_qmsg_free(rt_qlist_pop(&s->inflight));
    CHECK_EQ(s->inflight.bytes, 99);
    rt_session_free(s);
    rt_session_free(NULL);
    CHECK_EQ(rt_bin_refs(bin), 1);
    rt_bin_release(bin);
}

int main(void)
{
    RUN(test_fifo_and_ids);
    RUN(test_session_free_releases_everything);
    return CHECK_SUMMARY();
}
