/*
** The PROXY protocol (HAProxy's proxy-protocol.txt, versions 1 and 2): the header a
** load balancer sends before the client's bytes, naming the client's address; and the
** client named by X-Forwarded-For behind the proxies a listener trusts.
** Codecs without I/O or allocation, like ws.h.
*/
#ifndef RT_PROXY_H
#define RT_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"   /* rt_auth_addr_t */
#include "config.h" /* rt_conf_net_t, rt_conf_net_match: the trusted proxies */

#define RT_PROXY_V1_MAX 107 /* a v1 line, CRLF included */
#define RT_PROXY_MAX 4096   /* a v2 header (16 + its length) is refused past this */

typedef struct rt_proxy_info_s {
    bool has_addr;       /* false: LOCAL (v2) or UNKNOWN (v1): the connection's own address counts */
    rt_auth_addr_t src;  /* the client's address, IPv4 v4-mapped */
    uint16_t src_port;
} rt_proxy_info_t;

/*
** Parses the header at the start of buf. Returns 0 with *used its length and *out filled;
** RT_EAGAIN when buf is a proper prefix of a header that could still be valid (the caller
** reads more; a v1 line is at most RT_PROXY_V1_MAX bytes, a v2 header RT_PROXY_MAX);
** RT_EPROTO when it is not one (no signature, a bad field, a truncated or oversized v2
** length, an unknown version or command, an address family whose length does not fit),
** with *why for the log. TLVs are skipped. TCP over IPv4 and IPv6 give an address;
** UNIX and UDP families are accepted without one (has_addr false). A v1 line's fields are
** separated by single spaces, and its numbers have no leading zeros, as the spec requires;
** a prefix that no valid header starts with is refused without waiting for the rest.
*/
int rt_proxy_parse(const uint8_t *buf, size_t len, size_t *used, rt_proxy_info_t *out,
                   const char **why);

/*
** The client behind trusted proxies from an X-Forwarded-For value: its entries read from
** the right, skipping those in trusted, the first that is not trusted (RFC 7239's advice
** for a list any hop may have appended to). An entry may carry a port ("192.0.2.1:80",
** "[2001:db8::1]:80"), which is dropped. Returns false when there is none or an entry read
** is not an address.
*/
bool rt_forwarded_client(const char *xff, const rt_conf_net_t *trusted, unsigned n,
                         rt_auth_addr_t *out);

#endif
