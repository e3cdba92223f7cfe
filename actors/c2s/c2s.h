/*
** XMPP client sessions (RFC 6120, RFC 6121): one c2s actor per client connection, from accept
** to the stream's end, on the same transports as MQTT (actors/transport: TLS from accept or by
** STARTTLS, WebSocket per RFC 7395, PROXY headers, rate limits). The actor parses its stream
** (actors/xmpp/xml_stream.h), authenticates with SASL against the accounts in xmpp.db (read by
** one blocking actor, xmpp_store, so no file I/O or PBKDF2 runs on a scheduler), binds a
** resource in the session registry, and routes stanzas to other sessions by message: the
** sender writes a stanza's bytes once, stamped with its full JID, and each receiver copies
** them to its socket without parsing them again.
**
** Nothing here runs unless rtd.conf has an xmpp table (rt_conf_t.xmpp.on).
*/
#ifndef RT_C2S_H
#define RT_C2S_H

#include <stdatomic.h>
#include <stdint.h>

#include "auth.h"
#include "config.h"
#include "rt.h"

/* The XMPP listeners' indexes follow the MQTT listeners' and the HTTP listener's, so one
   table of TLS contexts and listener counters serves them all (tls.h: RT_TLS_XMPP). */
#define RT_C2S_STORE_NAME "xmpp_store"
#define RT_C2S_GROUP "xmpp_sup"

typedef struct rt_c2s_arg_s {
    int fd;
    unsigned listener; /* index in rt_conf_t.xmpp.listeners */
} rt_c2s_arg_t;

extern const rt_actor_type_t rt_c2s_type;

/* What every c2s actor adds to; read by /metrics, rtctl and the tests. */
typedef struct rt_c2s_stats_s {
    _Atomic uint64_t sessions;         /* open streams */
    _Atomic uint64_t bound;            /* sessions with a resource bound */
    _Atomic uint64_t logins;           /* successful SASL exchanges */
    _Atomic uint64_t login_failures;   /* <failure/> sent */
    _Atomic uint64_t stanzas_in;       /* stanzas parsed after authentication */
    _Atomic uint64_t stanzas_routed;   /* sent on to another session */
    _Atomic uint64_t stream_errors;    /* streams ended by an error of ours */
    _Atomic uint64_t offline_stored;   /* messages kept for an unavailable user */
    _Atomic uint64_t offline_refused;  /* offline messages past a user's bound */
    _Atomic uint64_t replaced;         /* sessions ended by a newer one binding their resource */
    _Atomic uint64_t connect_timeouts; /* streams not authenticated within connect_timeout */
} rt_c2s_stats_t;

extern rt_c2s_stats_t rt_c2s_stats;

/*
** At start, before the XMPP listeners, with the broker's settings made (conf must outlive the
** sessions: the broker's): checks the hosts, builds the stream settings and starts the store
** actor (xmpp.db in conf->data_dir) under the group RT_C2S_GROUP of sup. admit_peer counts a
** client a trusted proxy named under its real address (the listeners' per-address limit),
** or refuses it. 0, or an error with err. Nothing to do when conf has no xmpp table.
*/
int rt_c2s_start(rt_pid_t sup, const rt_conf_t *conf,
                 bool (*admit_peer)(int fd, const rt_auth_addr_t *addr), char *err,
                 size_t errlen);

#endif
