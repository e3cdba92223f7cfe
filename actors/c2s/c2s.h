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
#define RT_C2S_ARCHIVE_NAME "xmpp_archive"
#define RT_C2S_GROUP "xmpp_sup"

struct rt_auth_addr_s;
typedef struct rt_c2s_arg_s {
    int fd;
    unsigned listener;                 /* index in rt_conf_t.xmpp.listeners */
    const struct rt_auth_addr_s *peer; /* the address accept gave, or NULL: not kept */
} rt_c2s_arg_t;

extern const rt_actor_type_t rt_c2s_type;
/* Another server's stream on an s2s listener (federation; the same argument). */
extern const rt_actor_type_t rt_c2s_s2s_in_type;

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
    _Atomic uint64_t push_enabled, push_disabled; /* XEP-0357 registrations made, removed */
    _Atomic uint64_t push_sent;                   /* notifications sent to an app server */
    _Atomic uint64_t push_undeliverable; /* notifications whose app server is not reachable */
    _Atomic uint64_t orphans_rerouted; /* messages left in an ended session's mailbox, sent on */
    _Atomic uint64_t orphan_iqs;       /* iq requests an ended session left: answered */
    _Atomic uint64_t replaced;         /* sessions ended by a newer one binding their resource */
    _Atomic uint64_t connect_timeouts; /* streams not authenticated within connect_timeout */
    _Atomic uint64_t registrations;    /* accounts made in-band (XEP-0077) */
    _Atomic uint64_t registrations_limited; /* refused past xmpp.register_rate */
    _Atomic uint64_t archived;         /* copies written to the message archive (XEP-0313) */
    _Atomic uint64_t archive_dropped;  /* copies not archived: the store behind or failing */
    _Atomic uint64_t muc_rooms;        /* group chat rooms open (XEP-0045) */
    _Atomic uint64_t muc_rooms_refused; /* joins that would have made a room past muc_max_rooms */
    _Atomic uint64_t muc_messages;      /* groupchat messages a room took and sent on */
    _Atomic uint64_t muc_limited;       /* groupchat messages refused past muc_message_rate */
    _Atomic uint64_t muc_dropped;       /* stanzas to a room that ended as they came */
    _Atomic uint64_t muc_lagging;       /* occupants removed: their client stopped reading (333) */
    _Atomic uint64_t upload_slots;      /* upload slots handed out (XEP-0363) */
    _Atomic uint64_t upload_refused;    /* slot requests refused: too large, or past the quota */
    _Atomic uint64_t upload_stored;     /* files whose PUT came whole (actors/http) */
    _Atomic uint64_t upload_bytes;      /* their bytes */
    _Atomic uint64_t upload_served;     /* GETs of uploaded files answered with the file */
    _Atomic uint64_t upload_expired;    /* files and abandoned slots the sweep removed */
    _Atomic uint64_t s2s_in, s2s_out;   /* open server-to-server streams, each way */
    _Atomic uint64_t s2s_stanzas_in;    /* stanzas other servers delivered here */
    _Atomic uint64_t s2s_stanzas_out;   /* stanzas written to other servers */
    _Atomic uint64_t s2s_bounced;       /* stanzas for another server sent back as errors */
    _Atomic uint64_t s2s_errors_out;    /* errors sent back to other servers' senders */
    _Atomic uint64_t s2s_dialback_failed; /* keys that did not verify, either way */
    _Atomic uint64_t s2s_external_ok;     /* streams SASL EXTERNAL proved, either way */
    _Atomic uint64_t s2s_external_failed; /* EXTERNAL refused, either way (dialback next) */
    _Atomic uint64_t s2s_stream_errors;   /* server-to-server streams ended by an error */
    /* In a cluster (c2s_cluster.c): */
    _Atomic uint64_t cluster_resources; /* other nodes' bound resources known here */
    _Atomic uint64_t cluster_available; /* of them, those that sent available presence */
    _Atomic uint64_t cluster_nodes;     /* other nodes whose bindings this node has whole */
    _Atomic uint64_t cluster_sent;      /* messages to other nodes (bindings, stanzas) */
    _Atomic uint64_t cluster_received;  /* messages from other nodes taken */
    _Atomic uint64_t cluster_refused;   /* messages from other nodes that made no sense */
    _Atomic uint64_t cluster_not_sent;  /* messages the cluster's channel did not take */
    _Atomic uint64_t cluster_dropped;   /* bindings dropped with a node gone or restarted */
} rt_c2s_stats_t;

extern rt_c2s_stats_t rt_c2s_stats;

/* A server-to-server stream as `rtctl xmpp servers` shows it (c2s_s2s.c keeps the list). */
typedef struct rt_c2s_s2s_info_s {
    rt_pid_t pid;
    bool incoming, tls;
    const char *state; /* out: connecting, ready, down; in: open, verified (static text) */
    const char *auth;  /* "", dialback, external (static text) */
    char local[RT_CONF_XMPP_HOST_MAX];  /* in: the header's to ("" before it) */
    char remote[RT_CONF_XMPP_HOST_MAX]; /* in: the first domain proved ("" before) */
    char peer[64];                      /* "address:port" */
    uint64_t since_ms;                  /* rt_mono_ms at its start */
    uint32_t queued_bytes;              /* out: stanzas held while it is set up */
    uint32_t domains;                   /* in: pairs of domains proved */
} rt_c2s_s2s_info_t;
/* fn for each stream, under the list's lock: it copies what it needs and returns at once. */
void rt_c2s_s2s_each(void (*fn)(const rt_c2s_s2s_info_t *s, void *arg), void *arg);
/* Reads the certificate outgoing streams show (the first s2s listener's) and xmpp.s2s_secure's
   CA again, for streams set up from now on (`rtctl tls reload`, SIGHUP): 0, or RT_EINVAL with
   err, the running one kept. 0 without federation. */
int rt_c2s_s2s_reload_tls(char *err, size_t errlen);

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

/* ---- Administration (c2s_admin.c): `rtctl xmpp sessions|show|kick` ---- */

/* A bound session as the registry holds it: its bare JID and resource (not NUL-terminated). */
typedef struct rt_c2s_session_s {
    const char *bare, *resource;
    size_t bare_len, res_len;
    rt_pid_t pid;
    int8_t priority;
    bool available; /* sent available presence, not unavailable since */
} rt_c2s_session_t;

/*
** Calls fn for every bound session. fn runs with a lock of the registry held (one of its
** stripes): it copies what it needs and returns, and must send nothing nor call here again.
*/
void rt_c2s_sessions(void (*fn)(const rt_c2s_session_t *s, void *arg), void *arg);

/*
** The c2s block of message tags (0x5800 above RT_MSG_USER, broker.h's rule): the actor's own
** count up from its start; the answer to rt_c2s_query is the block's last, so whoever asks
** receives it whatever its own tags are.
*/
#define RT_MSG_C2S_INFO (RT_MSG_USER + 0x58ff) /* data: rt_c2s_info_t, then its text */

/* What a session says of itself (rt_c2s_query). */
typedef struct rt_c2s_info_s {
    uint64_t cookie;       /* the asker's, echoed */
    rt_pid_t pid;          /* the session's actor */
    uint64_t idle_ms;      /* since its client last sent bytes */
    uint32_t roster_items; /* roster entries it holds (loaded at its first presence) */
    uint32_t roster_bytes; /* their packed bytes, on its heap */
    uint32_t mailbox_len;  /* messages waiting in its mailbox as it answered */
    unsigned listener;     /* its listener's index among all (RT_CONF_XMPP_LISTENER(i)) */
    int8_t priority;
    bool bound, available, secure, roster_loaded, interested;
    bool detached;       /* no connection: resumable (XEP-0198), waiting for its client */
    char peer[64];       /* "ip:port" (a PROXY header's client address when there was one) */
    uint16_t jid_len;    /* bytes of the JID: full once bound, bare once authenticated */
    uint16_t stream_len; /* bytes of the stream id */
} rt_c2s_info_t;         /* then its text: the JID, NUL, the stream id, NUL */

/* Asks the session at pid for an RT_MSG_C2S_INFO answer to reply_to; 0 or RT_ENOPROC. */
int rt_c2s_query(rt_pid_t session, rt_pid_t reply_to, uint64_t cookie);
/* The answer in m, checked (its tag, length and text); NULL when m is none. */
const rt_c2s_info_t *rt_c2s_info_of(const rt_msg_t *m);
static inline const char *rt_c2s_info_jid(const rt_c2s_info_t *i)
{
    return (const char *)(i + 1);
}
static inline const char *rt_c2s_info_stream_id(const rt_c2s_info_t *i)
{
    return rt_c2s_info_jid(i) + i->jid_len + 1;
}
/*
** Ends the session at pid with a policy-violation stream error ("ended by the
** administrator"): its unavailable presence goes out as at any end. 0 or RT_ENOPROC.
*/
int rt_c2s_kick(rt_pid_t session);
/*
** Ends every session of user@host, its account gone (XEP-0077 3.2; `rtctl xmpp user del`):
** each with a not-authorized stream error; and its uploaded files are deleted (XEP-0363). The
** sessions told; 0 when XMPP is not running.
*/
size_t rt_c2s_account_gone(const char *host, const char *user);
/*
** rt_accounts_del's forgot (accounts.h), accounts its handle: the item of host's user for the
** removed jid is pushed to that user's sessions (their clients, and the session's own copy,
** so its presence goes no more to jid).
*/
void rt_c2s_roster_forgot(const char *host, const char *user, const char *jid, uint64_t version,
                          void *accounts);
/*
** After a change to xmpp.db made outside the store actor (an admin's account change): the
** store's read snapshot ends, so the requests that follow read the change.
*/
void rt_c2s_accounts_changed(void);

/*
** HTTP file upload (XEP-0363; c2s_upload.c): a PUT's file, come whole, handed to the upload
** actor on the blocking pool, which syncs it to disk and puts it in place (so no scheduler
** waits on the disk), then answers the caller with RT_MSG_C2S_UPLOAD_KEPT, an int: 0 or
** RT_EAGAIN. The actor owns fd from the call on: 0, or RT_ENOPROC (fd closed) with no actor.
*/
#define RT_MSG_C2S_UPLOAD_KEPT (RT_MSG_USER + 0x58fe)
int rt_c2s_upload_keep(int fd, const char *user, const char *slot);

#endif
