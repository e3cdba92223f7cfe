/*
** Where another XMPP server's domain is reached (RFC 6120 3.2.1): the SRV records of
** _xmpp-server._tcp.DOMAIN tried in RFC 2782's order, each target's addresses in the order
** getaddrinfo gives them; with no records (or no answer), the domain itself on 5269
** (3.2.2). A lone "." target says the domain offers no server-to-server service.
*/
#ifndef RT_XMPP_SRV_H
#define RT_XMPP_SRV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define RT_XMPP_S2S_PORT 5269
#define RT_XMPP_SRV_MAX 8          /* records of one answer used; the rest are not tried */
#define RT_XMPP_SRV_TARGET_ADDRS 4 /* addresses of one target tried */

typedef struct {
    uint16_t priority, weight, port;
    char target[256]; /* "" for the root: no service */
} rt_xmpp_srv_t;

/* The SRV records of a DNS answer, at most max into out: their count, or RT_EPROTO for an
   answer that is not a well-formed DNS message. Records of other types (a CNAME) are
   skipped. */
int rt_xmpp_srv_parse(const uint8_t *answer, size_t len, rt_xmpp_srv_t *out, unsigned max);

/* Puts n records in the order they are tried: by priority, and within one priority by
   RFC 2782's weighted draw, each record drawn with a chance in proportion to its weight (the
   RFC's draw from 0 to the sum inclusive would favour the first; weight 0 comes last, as
   Prosody orders it). rnd: a uniform 32-bit number each call. */
void rt_xmpp_srv_order(rt_xmpp_srv_t *s, unsigned n, uint32_t (*rnd)(void *arg), void *arg);

typedef struct {
    struct sockaddr_storage addr;
    uint32_t len;
} rt_xmpp_s2s_addr_t;

/* A lookup's answer as one message carries it: rc addresses in the order to try them, or an
   error (RT_ENOTFOUND: the domain offers no service; RT_EAGAIN: not looked up). */
#define RT_XMPP_S2S_ADDRS 8
typedef struct {
    int32_t rc;
    rt_xmpp_s2s_addr_t a[RT_XMPP_S2S_ADDRS];
} rt_xmpp_s2s_found_t;

/*
** BLOCKING (DNS through the system's resolver, /etc/resolv.conf and /etc/hosts): up to max
** addresses of domain's server-to-server service, in the order to try them. Returns their
** count (0: the domain has no address), or RT_ENOTFOUND when its SRV answer is the lone "."
** of "no service here".
*/
int rt_xmpp_s2s_resolve(const char *domain, rt_xmpp_s2s_addr_t *out, unsigned max);

#endif
