/*
** Another server's address (srv.h): the SRV answer read with libresolv's ns_* parser, ordered
** as RFC 2782 says, each target looked up with getaddrinfo (so /etc/hosts holds too).
*/
#define _GNU_SOURCE /* res_ninit */
#include <arpa/nameser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <resolv.h>
#include <stdio.h>
#include <string.h>

#include "rt.h"
#include "srv.h"

int rt_xmpp_srv_parse(const uint8_t *answer, size_t len, rt_xmpp_srv_t *out, unsigned max)
{
    ns_msg msg;
    if (len > NS_MAXMSG || ns_initparse(answer, (int)len, &msg) < 0)
        return RT_EPROTO;
    unsigned n = 0;
    int count = ns_msg_count(msg, ns_s_an);
    for (int i = 0; i < count && n < max; i++) {
        ns_rr rr;
        if (ns_parserr(&msg, ns_s_an, i, &rr) < 0)
            return RT_EPROTO;
        if (ns_rr_type(rr) != ns_t_srv || ns_rr_class(rr) != ns_c_in)
            continue;
        const uint8_t *rd = ns_rr_rdata(rr);
        if (ns_rr_rdlen(rr) < 7)
            return RT_EPROTO;
        rt_xmpp_srv_t *s = &out[n];
        s->priority = ns_get16(rd);
        s->weight = ns_get16(rd + 2);
        s->port = ns_get16(rd + 4);
        /* The target must end inside its record, not borrow the next record's bytes. */
        int used =
            dn_expand(ns_msg_base(msg), rd + ns_rr_rdlen(rr), rd + 6, s->target, sizeof(s->target));
        if (used < 0 || used != ns_rr_rdlen(rr) - 6)
            return RT_EPROTO;
        if (strcmp(s->target, ".") == 0)
            s->target[0] = 0;
        n++;
    }
    return (int)n;
}

/* s[from] moved to s[to] (to <= from), the ones between shifted up: their order kept. */
static void move_to(rt_xmpp_srv_t *s, unsigned from, unsigned to)
{
    rt_xmpp_srv_t t = s[from];
    memmove(&s[to + 1], &s[to], (from - to) * sizeof(*s));
    s[to] = t;
}

void rt_xmpp_srv_order(rt_xmpp_srv_t *s, unsigned n, uint32_t (*rnd)(void *arg), void *arg)
{
    for (unsigned i = 1; i < n; i++)
        for (unsigned j = i; j > 0 && s[j - 1].priority > s[j].priority; j--)
            move_to(s, j, j - 1);
    for (unsigned start = 0; start < n;) {
        unsigned end = start + 1;
        while (end < n && s[end].priority == s[start].priority)
            end++;
        for (unsigned i = start; i + 1 < end; i++) {
            uint32_t total = 0;
            for (unsigned j = i; j < end; j++)
                total += s[j].weight;
            if (!total)
                break; /* only weight 0 left: as listed */
            uint32_t r = 1 + rnd(arg) % total, run = 0;
            unsigned pick = i;
            for (unsigned j = i; j < end; j++) {
                run += s[j].weight;
                if (run >= r) {
                    pick = j;
                    break;
                }
            }
            move_to(s, pick, i);
        }
        start = end;
    }
}

static uint32_t random32(void *arg)
{
    (void)arg;
    uint32_t r = 0;
    rt_random(&r, sizeof(r));
    return r;
}

/* The SRV records of _xmpp-server._tcp.domain: their count, or -1 for no usable answer. */
static int query_srv(const char *domain, rt_xmpp_srv_t *srv, unsigned max)
{
    char qname[NS_MAXDNAME];
    int qlen = snprintf(qname, sizeof(qname), "_xmpp-server._tcp.%s", domain);
    if (qlen < 0 || (size_t)qlen >= sizeof(qname))
        return -1;
    struct __res_state rs;
    memset(&rs, 0, sizeof(rs));
    if (res_ninit(&rs) != 0)
        return -1;
    rs.retrans = 2; /* seconds a try, two tries a name server: a dead resolver costs ~4 s */
    rs.retry = 2;
    uint8_t answer[NS_PACKETSZ * 8];
    int len = res_nquery(&rs, qname, ns_c_in, ns_t_srv, answer, sizeof(answer));
    res_nclose(&rs);
    if (len <= 0)
        return -1;
    int n = rt_xmpp_srv_parse(answer, len < (int)sizeof(answer) ? (size_t)len : sizeof(answer), srv,
                              max);
    return n > 0 ? n : -1;
}

int rt_xmpp_s2s_resolve(const char *domain, rt_xmpp_s2s_addr_t *out, unsigned max)
{
    rt_xmpp_srv_t srv[RT_XMPP_SRV_MAX];
    int nsrv = query_srv(domain, srv, RT_XMPP_SRV_MAX);
    if (nsrv == 1 && srv[0].target[0] == 0)
        return RT_ENOTFOUND;
    if (nsrv > 0) {
        rt_xmpp_srv_order(srv, (unsigned)nsrv, random32, NULL);
    } else {
        nsrv = 1;
        srv[0] = (rt_xmpp_srv_t){.port = RT_XMPP_S2S_PORT};
        snprintf(srv[0].target, sizeof(srv[0].target), "%s", domain);
    }
    unsigned n = 0;
    for (int i = 0; i < nsrv && n < max; i++) {
        if (!srv[i].target[0])
            continue;
        char port[8];
        snprintf(port, sizeof(port), "%u", (unsigned)srv[i].port);
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
        if (getaddrinfo(srv[i].target, port, &hints, &res) != 0)
            continue;
        unsigned taken = 0;
        for (struct addrinfo *ai = res; ai && n < max && taken < RT_XMPP_SRV_TARGET_ADDRS;
             ai = ai->ai_next) {
            if (ai->ai_addrlen > sizeof(out[n].addr))
                continue;
            memcpy(&out[n].addr, ai->ai_addr, ai->ai_addrlen);
            out[n].len = (uint32_t)ai->ai_addrlen;
            n++;
            taken++;
        }
        freeaddrinfo(res);
    }
    return (int)n;
}
