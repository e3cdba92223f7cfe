/*
** Session message lists: FIFO order, lookup and removal by packet id anywhere
** in the list, and byte accounting that returns to zero (including after a
** QoS 2 message gives up its payload at PUBREC). Messages live on the owning
** actor's heap: their binaries count in its bin_bytes, a collection keeps what
** the session reaches and frees the rest, and the heap's end releases them all.
*/
#include <string.h>

#include "rt_test.h"
#include "session.h"

static rt_bin_t *shared_bin; /* the one binary the messages of a test hold */

static rt_actor_info_t self_info(rt_actor_t *self)
{
    rt_actor_info_t info;
    CHECK_EQ(rt_actor_info(rt_self(self), &info), 0);
    return info;
}

static void fifo_and_ids(rt_actor_t *self)
{
    rt_bin_t *bin = shared_bin;
    rt_qlist_t l = {0};
    uint32_t ids[3] = {7, 8, 9};
    for (uint16_t i = 1; i <= 5; i++) {
        rt_qmsg_t *m = rt_qmsg_new(self, bin, 1, 0, 0, 0, ids, i % 4);
        CHECK(m != NULL);
        m->packet_id = i;
        rt_qlist_push(&l, m);
    }
    CHECK_EQ(rt_bin_refs(bin), 6);
    CHECK_EQ(l.n, 5);
    CHECK_EQ(l.bytes, 50);
    /* More subscription ids than a message keeps are cut, not overrun. */
    rt_qmsg_t *big = rt_qmsg_new(self, bin, 0, 0, 0, 0,
                                 (uint32_t[12]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 12);
    CHECK_EQ(big->n_sub_ids, RT_QMSG_MAX_SUB_IDS);
    rt_qmsg_free(self, big);

    CHECK(rt_qlist_find_id(&l, 3) != NULL);
    CHECK(rt_qlist_find_id(&l, 6) == NULL);
    rt_qmsg_t *mid = rt_qlist_take_id(&l, 3);
    CHECK(mid && mid->packet_id == 3 && mid->n_sub_ids == 3 && mid->sub_ids[2] == 9);
    rt_qmsg_free(self, mid);
    rt_qmsg_t *tail = rt_qlist_take_id(&l, 5);
    CHECK(tail && l.tail && l.tail->packet_id == 4);
    rt_qmsg_free(self, tail);
    uint16_t order[3];
    for (int i = 0; i < 3; i++) {
        rt_qmsg_t *m = rt_qlist_pop(&l);
        order[i] = m->packet_id;
        rt_qmsg_free(self, m);
    }
    CHECK(order[0] == 1 && order[1] == 2 && order[2] == 4);
    CHECK(rt_qlist_pop(&l) == NULL);
    CHECK(l.head == NULL && l.tail == NULL && l.n == 0 && l.bytes == 0);
    CHECK_EQ(rt_bin_refs(bin), 1);
    CHECK_EQ(self_info(self).bin_bytes, 0);
}

static void test_fifo_and_ids(void)
{
    shared_bin = rt_bin_new("0123456789", 10);
    test_in_actor(fifo_and_ids);
    rt_bin_release(shared_bin);
}

/*
** Each message counts its binary in the actor's bin_bytes (a handle per message); giving up
** the payload or freeing a message takes its bytes back at once, and the messages still
** held when the actor exits are released with its heap.
*/
static void bytes_follow_the_heap(rt_actor_t *self)
{
    rt_bin_t *bin = shared_bin;
    rt_session_t *s = rt_alloc(self, sizeof(*s), RT_OBJ_SCAN);
    for (int i = 0; i < 100; i++) {
        rt_qlist_push(&s->queued, rt_qmsg_new(self, bin, 1, 0, 0, 0, NULL, 0));
        rt_qlist_push(&s->inflight, rt_qmsg_new(self, bin, 2, 0, 0, 1, NULL, 0));
    }
    CHECK_EQ(rt_bin_refs(bin), 201);
    CHECK_EQ(self_info(self).bin_bytes, 200 * rt_bin_len(bin));
    /* A QoS 2 message past PUBREC keeps only its id; its bytes leave the count with it. */
    rt_qmsg_t *m = s->inflight.head;
    rt_qlist_drop_payload(self, &s->inflight, m);
    CHECK_EQ(s->inflight.bytes, 99 * rt_bin_len(bin));
    CHECK_EQ(self_info(self).bin_bytes, 199 * rt_bin_len(bin));
    rt_qmsg_free(self, rt_qlist_pop(&s->inflight));
    CHECK_EQ(s->inflight.bytes, 99 * rt_bin_len(bin));
    CHECK_EQ(rt_bin_refs(bin), 200);
}

static void test_heap_end_releases_everything(void)
{
    shared_bin = rt_bin_new("0123456789abcdef", 16);
    test_in_actor(bytes_follow_the_heap);
    CHECK_EQ(rt_bin_refs(shared_bin), 1);
    rt_bin_release(shared_bin);
}

/*
** A collection keeps every message the session reaches (through the records' links, so the
** records must be scanned) with its binary, and frees what was unlinked without a free,
** releasing those binaries.
*/
typedef struct {
    rt_session_t *sess;
} holder_t;

static void holder_trace(void *state, rt_gc_t *gc)
{
    rt_gc_mark(gc, ((holder_t *)state)->sess);
}

#define GC_KEPT 1000
#define GC_DROPPED 500

static int holder_init(rt_actor_t *self, void *state, void *arg)
{
    (void)arg;
    holder_t *h = state;
    h->sess = rt_alloc(self, sizeof(*h->sess), RT_OBJ_SCAN);
    for (uint16_t i = 1; i <= GC_KEPT + GC_DROPPED; i++) {
        rt_qmsg_t *m = rt_qmsg_new(self, shared_bin, 1, 0, 0, 0, (uint32_t[1]){i}, 1);
        m->packet_id = i;
        rt_qlist_push(i % 2 ? &h->sess->queued : &h->sess->inflight, m);
    }
    /* Unlinked and forgotten: only the collector can give these back. */
    for (int i = 0; i < GC_DROPPED; i++)
        (void)rt_qlist_pop(&h->sess->queued);
    rt_gc(self);
    CHECK_EQ(rt_bin_refs(shared_bin), 1 + GC_KEPT);
    CHECK_EQ(h->sess->queued.n + h->sess->inflight.n, GC_KEPT);
    int wrong = 0;
    uint16_t want = 2;
    for (rt_qmsg_t *m = h->sess->inflight.head; m; m = m->next, want += 2)
        wrong += m->packet_id != want || m->sub_ids[0] != want || rt_qmsg_bin(m) != shared_bin;
    CHECK_EQ(wrong, 0);
    rt_exit(self, RT_REASON_NORMAL);
    return 0;
}

static void holder_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    (void)self, (void)state, (void)m;
}

static void test_collection_keeps_what_the_session_reaches(void)
{
    static const rt_actor_type_t holder_type = {.name = "holder",
                                                .state_size = sizeof(holder_t),
                                                .init = holder_init,
                                                .handle = holder_handle,
                                                .trace = holder_trace};
    shared_bin = rt_bin_new("x", 1);
    CHECK_EQ(rt_spawn(&holder_type, NULL, NULL), 0);
    CHECK(wait_alive(0));
    CHECK_EQ(rt_bin_refs(shared_bin), 1);
    rt_bin_release(shared_bin);
}

int main(void)
{
    test_start(1);
    RUN(test_fifo_and_ids);
    RUN(test_heap_end_releases_everything);
    RUN(test_collection_keeps_what_the_session_reaches);
    rt_shutdown();
    return CHECK_SUMMARY();
}
