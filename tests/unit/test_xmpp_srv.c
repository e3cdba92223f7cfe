/*
** Federation's SRV answers (actors/xmpp/srv.c): DNS answers built here byte by byte (RFC 1035
** 4.1, RFC 2782's RDATA), read back; the malformed refused; RFC 2782's order: priorities
** ascending, weight 0 last, and the weighted draw's shares.
*/
#include <string.h>

#include "rt_test.h"
#include "srv.h"

typedef struct {
    uint8_t b[1024];
    size_t n;
} msg_t;

static void put16(msg_t *m, unsigned v)
{
    m->b[m->n++] = (uint8_t)(v >> 8);
    m->b[m->n++] = (uint8_t)v;
}

static void put_name(msg_t *m, const char *name)
{
    while (*name) {
        const char *dot = strchr(name, '.');
        size_t len = dot ? (size_t)(dot - name) : strlen(name);
        m->b[m->n++] = (uint8_t)len;
        memcpy(m->b + m->n, name, len);
        m->n += len;
        name += len + (dot ? 1 : 0);
    }
    m->b[m->n++] = 0;
}

static void header(msg_t *m, unsigned answers)
{
    m->n = 0;
    put16(m, 0x1234);
    put16(m, 0x8180); /* a response, recursion desired and available, no error */
    put16(m, 1);
    put16(m, answers);
    put16(m, 0);
    put16(m, 0);
    put_name(m, "_xmpp-server._tcp.example.net");
    put16(m, 33); /* SRV */
    put16(m, 1);  /* IN */
}

/* An answer record's head, named by a pointer to the question's name: its RDATA follows. */
static void record_head(msg_t *m, unsigned type, unsigned rdlen)
{
    put16(m, 0xc00c);
    put16(m, type);
    put16(m, 1);
    put16(m, 0);
    put16(m, 300); /* TTL */
    put16(m, rdlen);
}

static void srv(msg_t *m, unsigned prio, unsigned weight, unsigned port, const char *target)
{
    record_head(m, 33, 0);
    size_t rdlen_at = m->n - 2;
    size_t start = m->n;
    put16(m, prio);
    put16(m, weight);
    put16(m, port);
    put_name(m, target);
    m->b[rdlen_at] = (uint8_t)((m->n - start) >> 8);
    m->b[rdlen_at + 1] = (uint8_t)(m->n - start);
}

static void test_records_read(void)
{
    msg_t m;
    header(&m, 3);
    srv(&m, 10, 5, 5269, "xmpp1.example.net");
    /* a CNAME among the answers is not a server */
    record_head(&m, 5, 2);
    put16(&m, 0xc00c);
    srv(&m, 20, 0, 5270, "xmpp2.example.net");
    rt_xmpp_srv_t s[RT_XMPP_SRV_MAX];
    CHECK_EQ(rt_xmpp_srv_parse(m.b, m.n, s, RT_XMPP_SRV_MAX), 2);
    CHECK_EQ(s[0].priority, 10);
    CHECK_EQ(s[0].weight, 5);
    CHECK_EQ(s[0].port, 5269);
    CHECK(strcmp(s[0].target, "xmpp1.example.net") == 0);
    CHECK_EQ(s[1].priority, 20);
    CHECK_EQ(s[1].port, 5270);
    CHECK(strcmp(s[1].target, "xmpp2.example.net") == 0);
    /* max bounds what is kept */
    CHECK_EQ(rt_xmpp_srv_parse(m.b, m.n, s, 1), 1);

    /* RFC 2782: "." says the service is decidedly not available */
    header(&m, 1);
    srv(&m, 0, 0, 0, "");
    CHECK_EQ(rt_xmpp_srv_parse(m.b, m.n, s, RT_XMPP_SRV_MAX), 1);
    CHECK_EQ(s[0].target[0], 0);

    header(&m, 0); /* NODATA */
    CHECK_EQ(rt_xmpp_srv_parse(m.b, m.n, s, RT_XMPP_SRV_MAX), 0);
}

static void test_malformed_refused(void)
{
    msg_t m;
    rt_xmpp_srv_t s[RT_XMPP_SRV_MAX];
    header(&m, 1);
    srv(&m, 10, 5, 5269, "xmpp1.example.net");
    for (size_t cut = 0; cut < m.n; cut++) /* every truncation */
        CHECK_EQ(rt_xmpp_srv_parse(m.b, cut, s, RT_XMPP_SRV_MAX), RT_EPROTO);

    /* RDATA too short for the three numbers and a name */
    header(&m, 1);
    record_head(&m, 33, 4);
    put16(&m, 10);
    put16(&m, 5);
    CHECK_EQ(rt_xmpp_srv_parse(m.b, m.n, s, RT_XMPP_SRV_MAX), RT_EPROTO);

    /* a target that runs past its record's RDATA into what follows */
    header(&m, 1);
    srv(&m, 10, 5, 5269, "xmpp1.example.net");
    size_t rdlen_at = m.n - (6 + strlen("xmpp1.example.net") + 2) - 2;
    m.b[rdlen_at + 1] = (uint8_t)(m.b[rdlen_at + 1] - 4);
    m.n -= 4; /* the message ends where the shorter record says */
    CHECK_EQ(rt_xmpp_srv_parse(m.b, m.n, s, RT_XMPP_SRV_MAX), RT_EPROTO);

    /* a compression pointer that points at itself */
    header(&m, 1);
    record_head(&m, 33, 8);
    put16(&m, 10);
    put16(&m, 5);
    put16(&m, 5269);
    size_t self = m.n;
    put16(&m, 0xc000 | (unsigned)self);
    CHECK_EQ(rt_xmpp_srv_parse(m.b, m.n, s, RT_XMPP_SRV_MAX), RT_EPROTO);
}

typedef struct {
    const uint32_t *v;
    unsigned i;
} script_t;

static uint32_t scripted(void *arg)
{
    script_t *s = arg;
    return s->v[s->i++];
}

static rt_xmpp_srv_t rec(unsigned prio, unsigned weight, const char *target)
{
    rt_xmpp_srv_t s = {.priority = (uint16_t)prio, .weight = (uint16_t)weight, .port = 5269};
    snprintf(s.target, sizeof(s.target), "%s", target);
    return s;
}

static void test_order(void)
{
    /* priorities ascending, whatever the draw */
    rt_xmpp_srv_t s[4] = {rec(30, 1, "c"), rec(10, 1, "a"), rec(20, 1, "b"), rec(5, 0, "z")};
    uint32_t zeros[8] = {0};
    script_t sc = {zeros, 0};
    rt_xmpp_srv_order(s, 4, scripted, &sc);
    CHECK(strcmp(s[0].target, "z") == 0 && strcmp(s[1].target, "a") == 0 &&
          strcmp(s[2].target, "b") == 0 && strcmp(s[3].target, "c") == 0);
    CHECK_EQ(sc.i, 0); /* one record a priority: no draw */

    /* one priority, weights 1, 3 and 0: a draw of 1 of 1..4 passes the 1 and takes the 3; then
       the 1 of what is left; weight 0 last */
    rt_xmpp_srv_t t[3] = {rec(10, 1, "one"), rec(10, 0, "zero"), rec(10, 3, "three")};
    uint32_t draws[] = {1, 0};
    script_t sd = {draws, 0};
    rt_xmpp_srv_order(t, 3, scripted, &sd);
    CHECK(strcmp(t[0].target, "three") == 0);
    CHECK(strcmp(t[1].target, "one") == 0);
    CHECK(strcmp(t[2].target, "zero") == 0);
}

static uint32_t lcg(void *arg)
{
    uint64_t *x = arg;
    *x = *x * 6364136223846793005u + 1442695040888963407u;
    return (uint32_t)(*x >> 33);
}

static void test_weighted_shares(void)
{
    /* weights 1 and 3: the second first in 3/4 of draws. 4,000 draws: mean 3,000, standard
       deviation sqrt(4000 * 3/4 * 1/4) ~ 27; the bound is 7 deviations */
    uint64_t x = 42;
    unsigned heavy_first = 0;
    for (unsigned i = 0; i < 4000; i++) {
        rt_xmpp_srv_t s[2] = {rec(1, 1, "light"), rec(1, 3, "heavy")};
        rt_xmpp_srv_order(s, 2, lcg, &x);
        heavy_first += strcmp(s[0].target, "heavy") == 0;
    }
    CHECK(heavy_first > 3000 - 190 && heavy_first < 3000 + 190);
}

int main(void)
{
    RUN(test_records_read);
    RUN(test_malformed_refused);
    RUN(test_order);
    RUN(test_weighted_shares);
    return CHECK_SUMMARY();
}
