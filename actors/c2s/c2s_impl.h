/*
** Inside the c2s layer: the session actor's state and the parts its files share.
**   c2s.c           the actor: socket, transport, stream callbacks, timers, the end
**   c2s_stream.c    what the server writes at stream level: headers, features, errors
**   c2s_sasl.c      SASL: SCRAM (credentials from the store actor), PLAIN, ANONYMOUS, EXTERNAL
**   c2s_register.c  in-band registration (XEP-0077): make, change and cancel an account
**   c2s_session.c   resource binding, the legacy session, iq, presence, message routing
**   c2s_registry.c  who is online: bare JID -> its resources and their actors
**   c2s_store.c     the blocking actor over xmpp.db
**   c2s_mam.c       the message archive, the session's side (c2s_store_mam.c: its actor)
**   c2s_pep.c       PEP (XEP-0163), the session's side (c2s_store_pep.c: the store's)
**   c2s_start.c     the global settings, the store's start
**   c2s_cluster.c   XMPP across the cluster: other nodes' bindings, stanzas to their sessions
*/
#ifndef RT_C2S_IMPL_H
#define RT_C2S_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "accounts.h"
#include "auth.h"
#include "c2s.h"
#include "jid.h"
#include "scram.h"
#include "xml.h"
#include "xml_stream.h"
#include "xml_write.h"
#include "xport.h"

/* ---- Messages ---- */
#define RT_C2S_MSG_BASE (RT_MSG_USER + 0x5800)
#define C2S_MSG_CONNECT_TIMEOUT (RT_C2S_MSG_BASE + 1) /* not authenticated in time */
#define C2S_MSG_STORE_REPLY (RT_C2S_MSG_BASE + 2)     /* the store actor's answer */
#define C2S_MSG_STANZA (RT_C2S_MSG_BASE + 3)          /* bytes of a stanza for our client */
#define C2S_MSG_REPLACED (RT_C2S_MSG_BASE + 4)        /* a newer session took our resource */
#define C2S_MSG_RATE_RESUME (RT_C2S_MSG_BASE + 7)     /* the rate limit lets reading go on */
#define C2S_MSG_FAIL_DELAY (RT_C2S_MSG_BASE + 8)      /* a SASL failure's delay is over */
#define C2S_MSG_STORE_REQ (RT_C2S_MSG_BASE + 9)       /* to the store actor */
#define C2S_MSG_KICK (RT_C2S_MSG_BASE + 11)           /* rtctl xmpp kick */
#define C2S_MSG_IDLE (RT_C2S_MSG_BASE + 16)           /* the idle check (xmpp.idle_timeout) */
#define C2S_MSG_SM_ASK (RT_C2S_MSG_BASE + 17)         /* may this connection resume you? */
#define C2S_MSG_SM_ANSWER (RT_C2S_MSG_BASE + 18)      /* one byte: yes (the socket follows) */
#define C2S_MSG_SM_SOCKET (RT_C2S_MSG_BASE + 19)      /* the resuming connection's socket */
#define C2S_MSG_SM_TIMEOUT (RT_C2S_MSG_BASE + 20)     /* a detached session's time ran out */
#define C2S_MSG_SM_STATE (RT_C2S_MSG_BASE + 27)       /* a session moving here from another node */
#define C2S_MSG_HIBERNATE (RT_C2S_MSG_BASE + 21)      /* quiet long enough: compact the heap */
#define C2S_MSG_SLOW_CHECK (RT_C2S_MSG_BASE + 25)     /* still behind on its output? */
#define C2S_HELD_OUT_MAX (64 * 1024) /* presence held for an inactive client (XEP-0352) */
/* A session whose client has left more than RT_SOCK_HIGH_WATER unsent this long is slow: rooms
   stop sending to it (they drop it from the room, XEP-0045's 333, rather than wait), and its
   socket's pressure mark goes up to C2S_SLOW_HIGH_WATER so that nothing stays parked on it. */
#define C2S_SLOW_MS 1000
#define C2S_SLOW_HIGH_WATER (4u << 20)

/*
** A bound session quiet this long (no message handled) is collected down to its live data
** (BEAM's erlang:hibernate; MongooseIM hibernates its c2s processes): what a login or a burst
** left in its heap (the SASL exchange, parse trees, emptied chunks) is given back, so an idle
** session costs what it holds.
*/
#define C2S_HIBERNATE_MS 5000
/* Entities a session remembers sending directed presence to (RFC 6121 4.6), so that its
   unavailable reaches them: a client in many rooms (XEP-0045 joins are directed presence) sends
   tens; past this the presence is refused (resource-constraint) rather than left dangling. */
#define C2S_DIRECTED_MAX 128
#define C2S_MSG_ROSTER (RT_C2S_MSG_BASE + 12)         /* the whole roster, packed (c2s_roster.c) */
#define C2S_MSG_ROSTER_ITEM (RT_C2S_MSG_BASE + 13)    /* one item changed, and its push */
#define C2S_MSG_PROBE (RT_C2S_MSG_BASE + 14) /* a contact (its full JID) wants our presence */
#define C2S_MSG_PRESENCE_TO (RT_C2S_MSG_BASE + 15)    /* send our presence (or unavailable) to */
/* Far above the session's own tags, which grow as it learns XEPs. */
#define C2S_MSG_QUERY (RT_C2S_MSG_BASE + 0x80) /* rt_c2s_query (c2s_admin.c) */
#define C2S_MSG_BLOCKLIST (RT_C2S_MSG_BASE + 22)      /* the blocklist, and a push (c2s_blocking.c) */
/* C2S_OP_ROSTER_GET_FIRST found nothing the initial presence must fetch (c2s_roster.c). */
#define C2S_MSG_PRESENCE_READY (RT_C2S_MSG_BASE + 23)
/* One byte, C2S_STALE_*: a message was kept, or a subscription request made, for the account
   since C2S_MSG_PRESENCE_READY; the session asks the store after all (c2s_roster.c). */
#define C2S_MSG_PRESENCE_STALE (RT_C2S_MSG_BASE + 24)
enum { C2S_STALE_KEPT = 1, C2S_STALE_PENDING };
/* Registration's (c2s_register.c), apart from the session's own tags as they grow. */
#define C2S_MSG_ACCOUNT_GONE (RT_C2S_MSG_BASE + 0x40) /* the account was cancelled: end */

/* Subscription kinds of C2S_OP_SUB (RFC 6121 3). */
enum {
    C2S_SUB_SUBSCRIBE = 1,
    C2S_SUB_SUBSCRIBED,
    C2S_SUB_UNSUBSCRIBE,
    C2S_SUB_UNSUBSCRIBED,
    C2S_SUB_PROBE /* C2S_OP_SUB_IN only: another server's contact asks for the presence */
};

/*
** A packed roster entry, as C2S_MSG_ROSTER carries them one after another and a session keeps
** them: its RT_ROSTER_* state, the bare JID's length and bytes. C2S_MSG_ROSTER_ITEM carries one,
** state C2S_ROSTER_GONE for a removed item, then the push to write to interested resources.
*/
#define C2S_ROSTER_GONE 0xffu
#define C2S_ENTRY_HEAD 3 /* state byte, length (2 bytes, little-endian) */

/* ---- The store actor's requests (c2s_store.c) ---- */
enum {
    C2S_OP_CRED = 1,         /* SCRAM credentials of user@host: reply rt_scram_cred_t */
    C2S_OP_PLAIN,            /* check a PLAIN password */
    C2S_OP_OFFLINE_PUSH,     /* keep a message for an unavailable user */
    C2S_OP_OFFLINE_TAKE,     /* send the kept messages to the asking session */
    C2S_OP_ROSTER_GET,       /* data: iq id NUL client's ver: the result and C2S_MSG_ROSTER */
    C2S_OP_ROSTER_SET,       /* data: c2s_roster_set (c2s_roster.c): put or remove, pushes */
    C2S_OP_SUB,              /* data: kind byte, contact bare JID NUL, the stanza for the contact */
    C2S_OP_PRESENCE_INIT,    /* initial presence: C2S_MSG_ROSTER, kept messages, requests */
    C2S_OP_BLOCK_GET,        /* data: iq id: C2S_MSG_BLOCKLIST, then the result */
    C2S_OP_BLOCK_SET,        /* data: block byte, iq id NUL, (JID NUL)*: pushes, the result */
    C2S_OP_VCARD_GET,        /* data: iq id NUL, from (another account's bare JID; none: own) */
    C2S_OP_VCARD_SET,        /* data: iq id NUL, the vCard element's bytes */
    C2S_OP_ARCHIVE,          /* data: c2s_archive_t, the receiver's bare JID, the stanza */
    C2S_OP_MAM_QUERY,        /* data: c2s_mam_query_t, iq id, queryid, full JID, iq's to (each
                                NUL-terminated), the with filter's bare JID (none: empty) */
    C2S_OP_SUB_IN,           /* data as C2S_OP_SUB: from another server's contact to host/user */
    C2S_OP_ROSTER_GET_FIRST, /* a roster get before the initial presence: as ROSTER_GET, and
                                C2S_MSG_BLOCKLIST, then C2S_MSG_PRESENCE_READY if nothing is
                                pending or kept */
};
/* SASL EXTERNAL's and registration's, apart from the others as they grow: answered with a
   c2s_reply_t (registration's with the iq id, NUL and the user after it: len bytes). */
enum {
    C2S_OP_EXTERNAL = 64, /* whether user@host exists */
    C2S_OP_REGISTER,      /* data: iq id NUL password: make the account */
    C2S_OP_PASSWD,        /* data: iq id NUL password: new keys */
    C2S_OP_UNREGISTER,    /* data: iq id: delete it, end its sessions (C2S_MSG_ACCOUNT_GONE) */
};
/* PEP (XEP-0163; c2s_pep.c, c2s_store_pep.c): host and user are the node owner's. Each is
   answered with the finished iq (C2S_MSG_STANZA); a change goes on as C2S_MSG_PEP_EVENT. */
enum {
    C2S_OP_PEP_PUBLISH = 96, /* data: iq id, node, item id, c2s_pep_publish_t, the payload */
    C2S_OP_PEP_DELETE,       /* data: iq id, node, item id (empty: the node), a notify byte */
    C2S_OP_PEP_ITEMS,        /* data: iq id, from, reader, node, item id, max (uint32_t) */
    C2S_OP_PEP_LAST,         /* data: full JID, one contact (empty: all and the account's),
                                the nodes the session wants (each NUL-ended) */
};
/* FAST (XEP-0484; c2s_sasl2.c, c2s_store.c): a client's tokens. GET is answered with a
   c2s_reply_t followed by each token valid now (a length byte, its bytes). */
enum {
    C2S_OP_FAST_GET = 112, /* data: agent, mechanism (each NUL-ended) */
    C2S_OP_FAST_PUT,       /* data: agent, mechanism (NUL-ended), expiry (int64_t), the token */
    C2S_OP_FAST_DEL,       /* data: agent (NUL-ended): nothing is answered */
};
/* Push (XEP-0357; c2s_push.c): ENABLE and DISABLE are answered with the finished iq. */
enum {
    C2S_OP_PUSH_ENABLE = 120, /* data: iq id, JID, node (each NUL-ended), the options' form */
    C2S_OP_PUSH_DISABLE,      /* data: iq id, JID, node ("\1": every node), each NUL-ended */
    C2S_OP_PUSH_NOTIFY,       /* no data: a message waits for the account; nothing answered */
};
#define RT_C2S_FAST_MECH "HT-SHA-256-NONE"
#define RT_C2S_FAST_AGENTS_MAX                                                                     \
    32 /* clients of one account holding tokens: past it, the                                      \
          tokens expiring first go */
typedef struct c2s_pep_publish_s {
    uint32_t max_items;
    uint8_t access;  /* RT_PEP_* */
    uint8_t options; /* the publish gave publish-options (XEP-0060 7.1.5): a precondition */
} c2s_pep_publish_t;
/* An event for a session's client, if it wants the node's: this, node, from (the owner's bare
   JID), the message's head, then its tail (the session's to='full JID' goes between). */
#define C2S_MSG_PEP_EVENT (RT_C2S_MSG_BASE + 26)
typedef struct c2s_pep_event_s {
    uint16_t node_len, from_len;
    uint32_t head_len;
} c2s_pep_event_t;
#define RT_C2S_NS_PUBSUB "http://jabber.org/protocol/pubsub"
/* A persistent room's state (host: the MUC service's domain, user: the room's localpart; data:
   the room's blob, none: forget the room). Nothing is answered. */
#define C2S_OP_MUC_PUT 80
#define C2S_OP_IS_REGISTER(op) ((op) >= C2S_OP_REGISTER && (op) <= C2S_OP_UNREGISTER)

/* A chat to archive (C2S_OP_ARCHIVE; the request's host and user are the sender's). */
typedef struct c2s_archive_s {
    int64_t stamp_ms;
    int64_t out_id;  /* the sender's copy's archive id; 0: the sender keeps none (anonymous) */
    int64_t in_id;   /* the receiver's; 0: none */
    uint32_t to_len; /* the receiver's bare JID, after this header (a room's: the sender's
                        occupant JID, room@service/nick, what the room's copy is "with") */
    uint32_t room;   /* 1: a room's copy (host, user: its service and localpart), out_id only */
} c2s_archive_t;

/* An archive query (C2S_OP_MAM_QUERY), checked by the session: as rt_archive_query_t. */
typedef struct c2s_mam_query_s {
    int64_t start_ms, end_ms, after, before;
    uint32_t max; /* 0: only the count (XEP-0059 2.6) */
    uint32_t last;
    rt_pid_t reply_to; /* the asking session; 0: the request's sender (a room asks for one) */
} c2s_mam_query_t;

/*
** The archive's bounds (XEP-0313). A page has C2S_MAM_PAGE_DEFAULT messages unless the client
** asks for another max, at most C2S_MAM_PAGE_MAX (more asked: that many, as XEP-0059 2.1
** lets a server answer), and at most C2S_MAM_PAGE_BYTES of stanzas (or one stanza, however
** big): what one query puts in its session's mailbox. Copies on their way to the store's
** batch: at most C2S_ARCHIVE_INFLIGHT_MAX bytes for the server, then dropped (counted).
*/
#define C2S_MAM_PAGE_DEFAULT 50
#define C2S_MAM_PAGE_MAX 250
#define C2S_MAM_PAGE_BYTES (1024 * 1024)
#define C2S_ARCHIVE_INFLIGHT_MAX (32u * 1024 * 1024)
#define C2S_ARCHIVE_BATCH_BYTES (1024 * 1024) /* the store writes its batch at this size */
/* A copy or a query (a C2S_MSG_STORE_REQ) to the archive actor, here or on the home node
   (xmpp.cluster_home); a copy is counted in flight until written. m is taken. 0 or RT_E*. */
int rt__c2s_archive_send(rt_msg_t *m);
/* Archive ids per microsecond with a shared archive, and this node's (c2s_cluster.c). */
#define C2S_ID_SLOTS 1024
int64_t rt__c2s_id_slot(void);
#define C2S_ARCHIVE_BATCH_MS 10               /* or this long after its first copy */
extern _Atomic uint64_t rt__c2s_archive_inflight; /* bytes of C2S_OP_ARCHIVE data unwritten */

/* A request: this header, then host, user and the operation's bytes, each after the other. */
typedef struct c2s_req_s {
    uint32_t op;
    uint32_t seq;      /* the session's, echoed: a late answer to an abandoned request is
                          recognised and dropped */
    uint16_t host_len; /* bytes, no NUL */
    uint16_t user_len;
    uint32_t data_len;
    uint32_t hash; /* C2S_OP_CRED: rt_scram_hash_t */
    char bytes[];  /* host, user, data */
} c2s_req_t;

/* The answer, tag C2S_MSG_STORE_REPLY. */
typedef struct c2s_reply_s {
    uint32_t op;
    uint32_t seq;
    int32_t rc; /* 0, or an RT_E* code: RT_ENOTFOUND, RT_EACCES, RT_EAGAIN, RT_ENOSPC */
    uint32_t len; /* bytes after the struct */
    union {
        rt_scram_cred_t cred;
    } u;
} c2s_reply_t;

/* Asks the store actor; the answer comes tagged C2S_MSG_STORE_REPLY. 0, RT_ENOPROC, RT_ENOMEM. */
/* m (a C2S_MSG_STORE_REQ) to the store, here or on the home node (xmpp.cluster_home), which
   answers from (when m is not sent from an actor: from another, from 0: nobody). m is taken. */
int rt__c2s_store_send(rt_msg_t *m, rt_pid_t from);
int rt__c2s_store_ask(uint32_t op, uint32_t seq, const char *host, size_t host_len,
                      const char *user, size_t user_len, uint32_t hash, const void *data,
                      size_t data_len);
/* A request with room for data_len bytes at rt__c2s_store_data (NULL: too big, no memory). */
rt_msg_t *rt__c2s_store_msg(uint32_t op, uint32_t seq, const char *host, size_t host_len,
                            const char *user, size_t user_len, uint32_t hash, size_t data_len);
uint8_t *rt__c2s_store_data(rt_msg_t *m);
/* A request as its receiver reads it, checked against the message's length. */
typedef struct c2s_req_view_s {
    const c2s_req_t *r;
    char host[RT_JID_PART_MAX + 1], user[RT_JID_PART_MAX + 1]; /* NUL-terminated */
    const uint8_t *data;                                       /* r->data_len bytes */
} c2s_req_view_t;
int rt__c2s_store_req(const rt_msg_t *m, c2s_req_view_t *v); /* 0, or RT_EINVAL */
int rt__c2s_store_start(rt_pid_t sup, const rt_conf_t *conf, char *err, size_t errlen);
/*
** A service's domain for each host from its setting's pattern (@HOST@ standing for the host;
** without it, one host only), into out[host]: 0, or RT_EINVAL with err naming setting when one
** is too long, not a domain as JIDs have it, or one of the hosts.
*/
int rt__c2s_service_domains(const char *setting, const char *pattern,
                            char (*out)[RT_CONF_XMPP_HOST_MAX], char *err, size_t errlen);
/* Opens xmpp.db in dir for an actor's init, logging event with the error if it cannot. */
int rt__c2s_accounts_open(const char *dir, rt_accounts_t **a, const char *event);
/* The archive's actor (c2s_store_mam.c), in the store's group; it takes C2S_OP_ARCHIVE and
   C2S_OP_MAM_QUERY requests, sent with rt_send_unmuted. */
int rt__c2s_archive_start(rt_pid_t group, const char *data_dir);

/* ---- The global settings (c2s_start.c) ---- */
typedef struct c2s_global_s {
    const rt_conf_xmpp_t *conf;
    rt_xml_stream_config_t stream_tcp; /* shared by every session: the callbacks, the limits */
    rt_xml_stream_config_t stream_ws;
    rt_xml_stream_config_t stream_s2s; /* other servers' streams, in and out (jabber:server) */
    rt_auth_limiter_t *limiter;     /* failed logins per address */
    rt_auth_limiter_t *reg_limiter; /* registrations per address (xmpp.register_rate) */
    bool replace;               /* resource_conflict = replace */
    /* The per-address connection count takes a proxied client's real address (the MQTT
       listener's table, actors/conn); NULL: not counted. */
    bool (*admit_peer)(int fd, const rt_auth_addr_t *addr);
    /* Group chat (c2s_muc.c): each host's MUC service domain ("" when xmpp.muc_host is). */
    char muc[RT_CONF_MAX_XMPP_HOSTS][RT_CONF_XMPP_HOST_MAX];
} c2s_global_t;

extern c2s_global_t rt__c2s;

/* The host in conf->hosts a stream's to= names (prepared), or -1. */
int rt__c2s_host_index(const char *domain, size_t len);
bool rt__c2s_host_anonymous(unsigned host);
/* Whether host (an index in conf->hosts) is one of xmpp.register. */
bool rt__c2s_host_register(unsigned host);

/* ---- The session ---- */
typedef enum {
    PH_HEADER = 0, /* waiting for the stream header */
    PH_FEATURES,   /* header answered, features sent: STARTTLS or SASL */
    PH_SASL,       /* an exchange running */
    PH_AUTHED,     /* SASL succeeded, waiting for the restart's header */
    PH_BIND,       /* features after SASL sent: waiting for bind */
    PH_ACTIVE,     /* a resource bound */
} c2s_phase_t;

typedef struct c2s_sm_s c2s_sm_t;     /* stream management (c2s_sm.c) */
typedef struct c2s_caps_s c2s_caps_t; /* the client's capabilities, as PEP needs them */
typedef struct c2s_inline_s c2s_inline_t; /* what a SASL2 login asked for at its success */

enum { C2S_PLAIN_UNKNOWN, C2S_PLAIN_NO, C2S_PLAIN_YES }; /* c2s_t.plain_from */

typedef struct c2s_s {
    rt_sock_t *sock;
    rt_xport_t *xp;
    rt_xml_stream_t xs;
    rt_jid_t *jid;        /* user@host once authenticated, user@host/resource once bound */
    char stream_id[17];   /* this stream's id: 16 hex digits */
    rt_scram_t *scram;    /* the exchange running, or NULL */
    uint8_t *held;        /* bytes read while parsing waits (the store's answer) */
    uint8_t *frame;       /* WebSocket: the message being gathered */

    uint8_t *roster;      /* packed entries (C2S_ENTRY_HEAD each), once the store sent them */
    uint8_t *pres;        /* the last available presence broadcast, as sent */
    uint32_t roster_len, pres_len;
    uint32_t held_len, frame_len, frame_cap;
    uint32_t seq; /* of the store request awaited */
    uint64_t last_rx_ms;
    int8_t priority;
    uint8_t listener; /* index in conf.xmpp.listeners */
    uint8_t host;     /* index in conf.xmpp.hosts */
    uint8_t phase;    /* c2s_phase_t */
    uint8_t scram_hash;
    uint8_t cb_type; /* the channel binding a -PLUS exchange uses (RT_SCRAM_CB_*), 0: none */
    uint8_t fails; /* SASL failures on this stream */
    uint8_t fail;  /* the failure written when its delay is over (c2s_sasl.c); 0: none */
    bool secure;   /* TLS runs */
    bool waiting;  /* parsing waits for the store's answer */
    bool starttls; /* the client asked: TLS starts once this feed ends */
    bool restart;  /* a stream restart (SASL success) once this feed ends */
    bool closing;
    bool dropped; /* the transport failed: the connection is lost once its input returns */
    bool available;  /* initial presence sent, not unavailable since */
    bool interested; /* asked for the roster */
    bool session;    /* the legacy session was established (or not needed) */
    bool anonymous;
    bool registered; /* an account was made in-band on this stream (one a stream) */
    bool plus;      /* the exchange is a -PLUS one */
    bool counted;   /* counted in rt_c2s_stats.sessions */
    bool preauthed; /* the pre-auth budget still counts this stream */
    bool roster_loaded;
    bool pinged; /* the idle check sent a ping the client has not answered with any byte */
    bool inactive; /* XEP-0352: presence is held until the client is active again */
    uint8_t *held_out; /* presence held while inactive, as it would have been written */
    uint32_t held_out_len, held_out_count;
    c2s_sm_t *sm;         /* XEP-0198 once enabled, or NULL */
    rt_pid_t resume_pid;  /* <resume/>: the session asked to take this connection */
    uint32_t resume_h;    /* and what the client said it handled */
    uint32_t resume_cookie; /* a resumption asked of another node: its answer names this */
    bool reopening;       /* the stream is reopened for a resumed session: no header goes out */
    bool hibernate_armed; /* a C2S_MSG_HIBERNATE timer is on its way */
    bool slow_check;      /* a C2S_MSG_SLOW_CHECK timer is on its way */
    bool shedding;        /* slow: rooms' sends are dropped at their source (rt_shed) */
    uint64_t last_active_ms; /* the last message handled (the hibernation's clock) */
    bool broadcast_due; /* initial presence waits for the roster to be broadcast */
    bool presence_ready; /* C2S_MSG_PRESENCE_READY came, and nothing changed since */
    bool presence_fast;  /* the initial presence went out on it, asking the store nothing */
    bool traffic;        /* sent a message, a presence or an iq to another: normal priority */
    bool block_loaded;     /* XEP-0191: blocked holds the account's blocklist */
    bool block_interested; /* asked for the blocklist: gets its pushes */
    uint8_t plain_from;    /* C2S_PLAIN_*: whether the peer is in xmpp.plaintext_from */
    uint8_t *blocked;      /* the blocked JIDs, each 2 bytes of length (LE) then its bytes */
    uint32_t blocked_len;
    uint8_t *directed; /* where directed presence went that no broadcast reaches, packed so */
    uint32_t directed_len;
    c2s_caps_t *caps; /* XEP-0115, once the client's presence named them (c2s_pep.c) */
    c2s_inline_t *inl; /* during a SASL2 exchange (c2s_sasl2.c) */
    bool sasl2;        /* the exchange running (or failing) is SASL2's (XEP-0388) */
} c2s_t;

static inline const rt_listen_t *rt__c2s_listen(const c2s_t *c)
{
    return &rt__c2s.conf->listeners[c->listener];
}

/* c2s.c */
void rt__c2s_stream_configs(const rt_conf_xmpp_t *conf);
void rt__c2s_write(c2s_t *c, const void *p, size_t n);
void rt__c2s_write_buf(c2s_t *c, rt_buf_t *b);
void rt__c2s_close(rt_actor_t *self, c2s_t *c);
/* The socket and its transport closed (a close_notify, a WebSocket close), counted out. */
void rt__c2s_close_socket(c2s_t *c);
const char *rt__c2s_peer(rt_actor_t *self, c2s_t *c);
int rt__c2s_peer_addr(const c2s_t *c, rt_auth_addr_t *out);
bool rt__c2s_framed(const c2s_t *c);
void rt__c2s_wait(c2s_t *c);
/* Arms the idle check (xmpp.idle_timeout) at bind. */
void rt__c2s_idle_arm(rt_actor_t *self, c2s_t *c);

void rt__c2s_feed_more(rt_actor_t *self, c2s_t *c, const uint8_t *p, size_t n);
/* A resumed session's stream, open on its new connection as the old one was. */
int rt__c2s_stream_reopen(rt_actor_t *self, c2s_t *c);

/* c2s_sm.c: stream management. Stanzas to the client go through these (counted, kept). */
void rt__c2s_write_stanzas(rt_actor_t *self, c2s_t *c, const void *p, size_t n, uint32_t count);
void rt__c2s_write_stanza_buf(rt_actor_t *self, c2s_t *c, rt_buf_t *b);
void rt__c2s_sm_count_in(c2s_t *c);
bool rt__c2s_sm_on(const c2s_t *c);
bool rt__c2s_sm_detached(const c2s_t *c); /* kept for a resumption, no connection */
int rt__c2s_sm_nonza(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el);
/* The connection dropped: a resumable session stays, detached; false: it ends. */
bool rt__c2s_sm_detach(rt_actor_t *self, c2s_t *c);
void rt__c2s_sm_timeout(rt_actor_t *self, c2s_t *c);
/* The session ends unresumed: its unacknowledged messages go on, or to the offline store. */
void rt__c2s_sm_unacked(rt_actor_t *self, c2s_t *c);
/*
** Resumption through another node of a cluster: the detached session's state goes to the new
** connection's actor there (C2S_MSG_SM_STATE), which binds its resource and goes on as it;
** the old session forwards what it is still sent until the new one's binding replaces it,
** then ends without a word to anyone (rt__c2s_sm_moved_away). rt__c2s_sm_forward: true when
** m was the moved session's to forward (or its end). rt__c2s_sm_moved_in: the state came.
*/
bool rt__c2s_sm_forward(rt_actor_t *self, c2s_t *c, rt_msg_t *m);
bool rt__c2s_sm_moved_away(const c2s_t *c);
void rt__c2s_sm_moved_in(rt_actor_t *self, c2s_t *c, rt_msg_t *m);
void rt__c2s_sm_asked(rt_actor_t *self, c2s_t *c, rt_msg_t *m);
void rt__c2s_sm_answered(rt_actor_t *self, c2s_t *c, rt_msg_t *m);
int rt__c2s_sm_take_socket(rt_actor_t *self, c2s_t *c, rt_msg_t *m);
/* <enabled/> (or <failed/>) to out, the session counting from now: 0 or RT_ENOMEM. */
int rt__c2s_sm_enable(rt_actor_t *self, c2s_t *c, bool resume, rt_buf_t *out);
/* A resumption asked inside SASL2's <authenticate/>: true when the session previd names was
   asked (C2S_MSG_SM_ANSWER follows). */
bool rt__c2s_sm_resume_inline(c2s_t *c, const char *previd, const char *h);
void rt__c2s_sm_put_failed(rt_buf_t *b, const char *cond);

/* c2s_stream.c */
void rt__c2s_stream_header(rt_actor_t *self, c2s_t *c);
void rt__c2s_features(rt_actor_t *self, c2s_t *c);
/* The features of an authenticated stream, bound or not, to b. */
void rt__c2s_bound_features(rt_buf_t *b, const c2s_t *c);
/* Ends the stream with RFC 6120 4.9's error (its text to the client and the log). */
void rt__c2s_stream_error(rt_actor_t *self, c2s_t *c, rt_xml_cond_t cond, const char *text);
/* A stanza error answering el (RFC 6120 8.3): type and condition, as the RFC names them. */
void rt__c2s_stanza_error(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const char *type,
                          const char *cond);
/* The same with an application-specific condition (app: its element, written as given). */
void rt__c2s_stanza_error_app(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const char *type,
                              const char *cond, const char *app);
void rt__c2s_stream_end(c2s_t *c);
bool rt__c2s_tls_required(c2s_t *c);
/* Whether the stream may authenticate now (TLS, or an address in plaintext_from). */
bool rt__c2s_may_auth(c2s_t *c);
/* <starttls/>, then TLS from the next byte. */
int rt__c2s_on_top_level(rt_actor_t *self, c2s_t *c, rt_xml_el_t *el);

/* c2s_sasl.c: SASL in RFC 6120's profile (rt__c2s_sasl) and XEP-0388's (rt__c2s_sasl2) */
#define RT_C2S_NS_SASL2 "urn:xmpp:sasl:2"
int rt__c2s_sasl(rt_actor_t *self, c2s_t *c, rt_xml_el_t *el);
int rt__c2s_sasl2(rt_actor_t *self, c2s_t *c, rt_xml_el_t *el);
/* The <mechanisms/> feature (with SASL2's <authentication/> when xmpp.sasl2), and the
   <mechanism/> elements alone. */
void rt__c2s_sasl_mechanisms(rt_buf_t *b, const c2s_t *c);
void rt__c2s_sasl_put_mechanisms(rt_buf_t *b, const c2s_t *c);
void rt__c2s_put_base64(rt_buf_t *b, const void *data, size_t len);
void rt__c2s_sasl_reply(rt_actor_t *self, c2s_t *c, const c2s_reply_t *r);
void rt__c2s_sasl_fail_due(rt_actor_t *self, c2s_t *c);

/* c2s_sasl2.c: SASL2's feature; the inline requests of <authenticate/> kept (0, RT_EINVAL,
   RT_ENOMEM) and forgotten; the success, written with their results (resume_failed: the
   condition of a resumption refused, or NULL), or a resumption asked first; the start of
   <success/> a resumed session ends (its length; out NULL: only that). */
void rt__c2s_sasl2_feature(rt_buf_t *b, const c2s_t *c);
int rt__c2s_sasl2_inline(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *authenticate);
void rt__c2s_sasl2_forget(rt_actor_t *self, c2s_t *c);
void rt__c2s_sasl2_success(rt_actor_t *self, c2s_t *c, const void *data, size_t len);
void rt__c2s_sasl2_finish(rt_actor_t *self, c2s_t *c, const char *resume_failed);
size_t rt__c2s_sasl2_head(const c2s_t *c, uint8_t *out);
/* FAST: the user-agent id of a SASL2 exchange that asked to use a token (<fast/>), else NULL;
   the client's proof (HT's initiator HMAC) kept for the store's answer, and read back. */
const char *rt__c2s_sasl2_fast_agent(const c2s_t *c);
void rt__c2s_sasl2_keep_proof(c2s_t *c, const uint8_t proof[32]);
const uint8_t *rt__c2s_sasl2_proof(const c2s_t *c);

/* c2s_register.c: in-band registration (XEP-0077) */
#define RT_C2S_NS_REGISTER "jabber:iq:register"
/* The stream feature, before authentication, where registration is on and may go. */
void rt__c2s_register_feature(rt_buf_t *b, const c2s_t *c);
/* Whether el, before authentication, is a registration iq (then rt__c2s_register_iq). */
bool rt__c2s_register_preauth(const rt_xml_el_t *el);
/* A jabber:iq:register query q in iq: before authentication, or to the server once bound. */
void rt__c2s_register_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q);
/* The store's answer to a registration request (m: a C2S_MSG_STORE_REPLY of such an op). */
void rt__c2s_register_reply(rt_actor_t *self, c2s_t *c, const rt_msg_t *m);

/* c2s_session.c */
int rt__c2s_stanza(rt_actor_t *self, c2s_t *c, rt_xml_el_t *el);
/* Binds the resource given (NULL or empty: a random one): NULL, or the stanza error's
   condition when it cannot be (RFC 6120 7.6.2). */
const char *rt__c2s_bind_as(rt_actor_t *self, c2s_t *c, const char *given, size_t given_len);
void rt__c2s_deliver(rt_actor_t *self, c2s_t *c, rt_msg_t *m);
/* A stanza the session gone can no longer take: a message sent on, never lost; an iq request
   answered with an error (c2s_session.c). */
void rt__c2s_orphan(const rt_msg_t *m, rt_pid_t gone);
/* An iq get or set no session will take (p, len: as its sender's session wrote it): its sender
   is answered service-unavailable. Any thread. */
void rt__c2s_iq_unanswered(const uint8_t *p, size_t len);
/* A message (p, len: with its to and from) routed as RFC 6121 8.5.3.2.1 has one to a resource
   that is gone (gone: a session not to pick): to the account's available resources, else
   offline; the offline store's refusal goes to sender. Any thread. */
void rt__c2s_message_rerouted(const uint8_t *p, size_t len, rt_pid_t gone, rt_pid_t sender);
/* A stanza a local session sent that cannot go on (p, len: with its to and from): a message or
   an iq request comes back to its sender's full JID as an error with cond; false when none
   was sent (an error, a result, presence, a sender gone). Any thread. */
bool rt__c2s_bounce(const uint8_t *p, size_t len, const char *cond);
void rt__c2s_flush_held(rt_actor_t *self, c2s_t *c);
void rt__c2s_session_end(rt_actor_t *self, c2s_t *c);
bool rt__c2s_send_bytes(rt_pid_t to, const rt_buf_t *b); /* false: not sent (gone, no memory) */
void rt__c2s_put_stanza(rt_buf_t *b, const rt_xml_el_t *el, const char *from, const char *to);
/* The same for el parsed in el_ns (another server's stanza: jabber:server), written as a
   local session gets it (in jabber:client). */
void rt__c2s_put_stanza_from(rt_buf_t *b, const rt_xml_el_t *el, const char *from,
                             const char *to_text, const char *el_ns);
/* el's attributes as a stanza passed on keeps them: all but from and to, xml:lang too. */
void rt__c2s_put_attrs(rt_buf_t *b, const rt_xml_el_t *el);
/* A XEP-0082 DateTime of unix ms, in UTC with milliseconds. */
void rt__c2s_put_stamp(rt_buf_t *b, int64_t ms);
/* Asks the store about the session's own account (its host and user). */
int rt__c2s_ask_own(const c2s_t *c, uint32_t op, const void *data, size_t len);
/* <presence type='unavailable'/> from the session's full JID. */
void rt__c2s_put_unavailable(rt_buf_t *b, const c2s_t *c);
/* <iq type='result' id from to, not closed: the start of an answer to iq. */
void rt__c2s_iq_result_start(rt_buf_t *b, const c2s_t *c, const rt_xml_el_t *iq);

/* c2s_rules.c: the rules' events */
void rt__c2s_rule_message(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const char *to);
void rt__c2s_rule_presence(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, bool available);
void rt__c2s_rule_session(rt_actor_t *self, c2s_t *c, bool connected, const char *reason);

/* c2s_roster.c: the session's side of rosters and presence */
void rt__c2s_roster_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                       bool get);
void rt__c2s_subscription(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to,
                          const char *type);
void rt__c2s_presence_out(rt_actor_t *self, c2s_t *c, const rt_buf_t *b, bool initial);
void rt__c2s_roster_msg(rt_actor_t *self, c2s_t *c, rt_msg_t *m);
/* Sends bytes to every available session of bare (len bytes). */
void rt__c2s_to_available(const char *bare, size_t len, const void *p, size_t n);
/* Directed presence (RFC 6121 4.6): remembers (or, unavailable, forgets) `to` before the
   presence goes; false when it was refused (C2S_DIRECTED_MAX), answered already. */
bool rt__c2s_directed(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to,
                      bool available);
/* The unavailable presence b to each entity remembered above, which are then forgotten. */
void rt__c2s_directed_end(rt_actor_t *self, c2s_t *c, const rt_buf_t *b);
/* Unavailable from this resource to the contacts and directed-presence entities that the
   blocklist `list` blocks and the session's current one does not (XEP-0191 3.3). */
void rt__c2s_unavailable_to_blocked(rt_actor_t *self, c2s_t *c, const uint8_t *list, size_t llen);

/* ---- Group chat (XEP-0045): c2s_muc.c, the service; c2s_muc_room.c, a room an actor ---- */
#define NS_MUC "http://jabber.org/protocol/muc"
#define NS_MUC_USER NS_MUC "#user"
#define NS_MUC_ADMIN NS_MUC "#admin"
#define NS_MUC_OWNER NS_MUC "#owner"
/* A stanza for the MUC service or a room, as the sending session wrote it (from stamped). */
#define C2S_MSG_MUC (RT_C2S_MSG_BASE + 0x60)
/* A room to the service: c2s_muc_info_t then the room's bare JID and its name. */
#define C2S_MSG_MUC_INFO (RT_C2S_MSG_BASE + 0x61)
#define RT_C2S_MUC_NAME "xmpp_muc"
typedef struct c2s_muc_info_s {
    uint32_t occupants;
    uint16_t jid_len, name_len;
    bool listed; /* public (muc#roomconfig_publicroom) and alive */
} c2s_muc_info_t;
/* The host whose MUC service domain this is, or -1. */
int rt__c2s_muc_index(const char *domain, size_t len);
/* A stanza the session routes to a MUC domain (to is prepared): to the service, or to the room
   (made by a join when there is none); answered with an error where nothing takes it. */
void rt__c2s_muc_route(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to,
                       const rt_buf_t *bytes);
/* On the home node (xmpp.cluster_home), a post another node's rule made (data as
   rt__c2s_muc_post sends it there). */
void rt__c2s_muc_post_bytes(const uint8_t *p, size_t len);
/* A stanza that reached a room as it ended (may_make: a join makes the room again), one from
   another server's user (no room made for it), or one another node's session sent the home
   node (made: its proxy's): to the room, as m->from's (the occupant: the session, the incoming
   stream, the proxy, which the caller sets); false when none took it (an iq from a local
   session is answered). */
bool rt__c2s_muc_reroute(rt_msg_t *m, bool may_make);
int rt__c2s_muc_start(rt_pid_t group, const char *data_dir, char *err, size_t errlen);

/* ---- Federation (c2s_s2s.c, c2s_s2s_out.c: RFC 6120 server-to-server, XEP-0220) ---- */

#define C2S_MSG_S2S_OUT (RT_C2S_MSG_BASE + 40)      /* to s2s_out: a stanza's bytes */
#define C2S_MSG_S2S_VERIFY (RT_C2S_MSG_BASE + 41)   /* to s2s_out: c2s_s2s_verify_t, key */
#define C2S_MSG_S2S_VERIFIED (RT_C2S_MSG_BASE + 42) /* to s2s_in: c2s_s2s_verify_t, answer */
#define C2S_MSG_S2S_RETRY (RT_C2S_MSG_BASE + 43)    /* s2s_out: its quiet time after a failure */
#define C2S_MSG_S2S_IDLE (RT_C2S_MSG_BASE + 44)     /* s2s_in, s2s_out: unused long enough? */
#define C2S_MSG_S2S_TIMEOUT (RT_C2S_MSG_BASE + 45)  /* s2s_out: not ready in time */
#define C2S_MSG_S2S_RESOLVE (RT_C2S_MSG_BASE + 46)  /* to the resolver: a domain, NUL-ended */
#define C2S_MSG_S2S_RESOLVED (RT_C2S_MSG_BASE + 47) /* to s2s_out: rt_xmpp_s2s_found_t */
#define C2S_S2S_KEY_HEX 64                          /* a dialback key: HMAC-SHA256 in hex */
#define C2S_S2S_RESOLVER_NAME "xmpp_resolver"

/* A dialback key to verify (XEP-0220 2.3): asked of the authoritative server through the
   outgoing stream to it, answered to the incoming stream that received it. */
typedef struct c2s_s2s_verify_s {
    rt_pid_t in;   /* the incoming stream that asks */
    bool valid;    /* the answer */
    uint8_t local; /* the receiving domain: rt__c2s_s2s_local_index's */
    char id[17];   /* the incoming stream's id */
    char key[C2S_S2S_KEY_HEX + 1];
} c2s_s2s_verify_t; /* then the originating domain, NUL-terminated */

/* A stream's entry in the list rt_c2s_s2s_each walks: in the actor's state, its info written
   under rt__c2s_s2s_lock (the admin reads it from another thread). */
typedef struct c2s_s2s_entry_s {
    struct c2s_s2s_entry_s *prev, *next;
    bool listed;
    rt_c2s_s2s_info_t info;
} c2s_s2s_entry_t;
void rt__c2s_s2s_lock(void);
void rt__c2s_s2s_unlock(void);
void rt__c2s_s2s_listed(c2s_s2s_entry_t *e, bool on); /* takes the lock itself */

extern const rt_actor_type_t rt__c2s_s2s_out_type;
/* The arguments of an outgoing stream: the local domain (one of hosts) and the remote one. */
typedef struct c2s_s2s_out_arg_s {
    const char *local, *remote;
} c2s_s2s_out_arg_t;

/* Whether federation is on: an s2s listener, so other servers can verify this one's keys. */
bool rt__c2s_s2s_on(void);
/* The key this server gives for a stream from originating to receiving with that id
   (XEP-0185), into out (C2S_S2S_KEY_HEX + 1 bytes). */
void rt__c2s_s2s_key(const char *receiving, const char *originating, const char *id, char *out);
/* The stanza (bytes as a local session wrote them, from one of hosts) to another server's
   domain: handed to the outgoing stream of that pair, made if need be. false: not taken (the
   caller bounces it). Any thread. */
bool rt__c2s_s2s_send(const char *local, size_t local_len, const char *remote, size_t remote_len,
                      const void *p, size_t len);
/* This server's domains as federation knows them: hosts (0 .. nhosts-1), then their MUC
   services' (nhosts ..): an index, or -1 for none of ours; the domain of an index. */
int rt__c2s_s2s_local_index(const char *domain, size_t len);
const char *rt__c2s_s2s_local_domain(unsigned i);
/* Whether domain is another server's, reached through federation (on, and none of ours). */
bool rt__c2s_domain_remote(const char *domain, size_t len);
/* A presence the session wrote with no to (p, n) for jid (len bytes): when jid is another
   server's, sent there with to added, and true; false: jid is local. */
bool rt__c2s_s2s_presence_to(const char *jid, size_t len, const void *p, size_t n);
/* The pid of the outgoing stream from local to remote, made if need be; 0: none. */
rt_pid_t rt__c2s_s2s_out(const char *local, const char *remote);
/* Where remote is reached (xmpp.s2s_peers): 0, or RT_ENOTFOUND. */
struct sockaddr_storage;
int rt__c2s_s2s_peer(const char *remote, struct sockaddr_storage *addr, unsigned *len);
/* Asks the resolver (c2s_s2s_dns.c) for remote's addresses, answered to the calling actor with
   C2S_MSG_S2S_RESOLVED: 0, RT_ELIMIT (too many lookups wait), RT_ENOTFOUND (no resolver). */
int rt__c2s_s2s_resolve(const char *remote);
int rt__c2s_s2s_resolver_start(rt_pid_t group); /* when federating with xmpp.s2s_dns */
/* A stanza from another server, in jabber:server, for a local entity. reply: the incoming
   stream's pid, which sends back what is answered. */
void rt__c2s_s2s_deliver(rt_actor_t *self, const rt_xml_el_t *el, const rt_jid_t *from,
                         const rt_jid_t *to);
/* A client-side SSL for an outgoing stream, from the context of the moment (rebuilt by
   rt_c2s_s2s_reload_tls); NULL before start, or out of memory. */
struct ssl_st *rt__c2s_s2s_ssl_new(void);
int rt__c2s_s2s_start(const rt_conf_xmpp_t *x, char *err, size_t errlen);
void rt__c2s_s2s_stream_config(void); /* rt__c2s.stream_s2s, from stream_tcp */
void rt__c2s_s2s_out_config(const rt_xml_stream_config_t *base); /* the outgoing one's */

/* ---- Push notifications (c2s_push.c, XEP-0357) ---- */

void rt__c2s_push_features(rt_buf_t *b, const c2s_t *c); /* the account's disco#info */
/* An iq in urn:xmpp:push:0 (enable, disable) handled: true; false: not push's. */
bool rt__c2s_push_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                     bool get);
bool rt__c2s_push_worthy(const void *stanza, size_t len);
void rt__c2s_push_detached(const c2s_t *c); /* a worthy stanza came while detached */
/* In the store: an enable or disable (data as rt__c2s_push_iq sends it), answered to to; the
   notifications of user@host's app servers. */
void rt__c2s_store_push_set(rt_accounts_t *a, rt_pid_t to, bool enable, const char *host,
                            const char *user, const uint8_t *data, size_t len);
void rt__c2s_store_push_notify(rt_accounts_t *a, const char *host, const char *user);
/* The store's answer to an iq (c2s_store_xeps.c): result (with payload) or rc's error. */
void rt__c2s_store_iq_answer(rt_pid_t to, const char *id, size_t idlen, int rc, const char *payload,
                             size_t plen);

/* ---- HTTP file upload (c2s_upload.c, XEP-0363) ---- */
/* The host whose upload service domain this is, or -1. */
int rt__c2s_upload_index(const char *domain, size_t len);
/* The service as an item of host's disco#items (nothing when there is none). */
void rt__c2s_upload_disco_item(rt_buf_t *b, unsigned host);
/* An iq to host's upload service, to (prepared) its address: disco, and slot requests. */
void rt__c2s_upload_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_jid_t *to,
                       int host);
/* user@host's account is gone: its uploaded files go too (as ejabberd's rm_on_unregister). */
void rt__c2s_upload_forget(const char *host, const char *user);
/* Checks the upload settings and starts the upload actor in group when xmpp.upload_host. */
int rt__c2s_upload_start(rt_pid_t group, const rt_conf_t *conf, char *err, size_t errlen);
/* The xmpp sink's entry (rt_sink_xmpp_fn, c2s_session.c), and its part for rooms: a groupchat
   from room/nick with the body to the room's occupants (C2S_MSG_MUC_POST), kept in its history
   and archive; RT_ENOTFOUND when there is no such room. */
int rt__c2s_sink_send(const char *to, const char *from, const char *nick, const char *type,
                      const char *body, size_t len);
int rt__c2s_muc_post(const rt_jid_t *room, const char *nick, const char *body, size_t len);
/* data: the nick, NUL, the body's text. */
#define C2S_MSG_MUC_POST (RT_C2S_MSG_BASE + 0x62)
/* The room actor (c2s_muc_room.c), spawned with this: a new room has no state; one kept in
   xmpp.db (persistent) is made again at start with what it saved. */
typedef struct c2s_room_arg_s {
    const char *jid; /* the room's bare JID, NUL-terminated */
    const uint8_t *state;
    size_t state_len;
    const char *maker; /* the bare JID whose join makes it (counted for it already), or NULL */
    bool restored;     /* made from xmpp.db: its first owner counts as its maker */
} c2s_room_arg_t;
/* A room made by bare (len bytes) counts against xmpp.muc_max_rooms_per_user while it lasts:
   false when bare has that many (force: counted all the same, a room kept in xmpp.db). */
bool rt__c2s_muc_maker_take(const char *bare, size_t len, bool force);
void rt__c2s_muc_maker_give(const char *bare, size_t len);
extern const rt_actor_type_t rt__c2s_room_type;
/* The parser rooms and the service read their stanzas with; ctx's first field is a
   c2s_muc_parse_t. */
typedef struct c2s_muc_parse_s {
    rt_xml_stream_t xs;
    int (*on_stanza)(void *ctx, rt_xml_el_t *el);
} c2s_muc_parse_t;
int rt__c2s_muc_parse_init(c2s_muc_parse_t *p);
/* Parses one stanza's bytes (as a session wrote them), calling p->on_stanza. */
int rt__c2s_muc_parse(c2s_muc_parse_t *p, const void *data, size_t len);
void rt__c2s_muc_free(rt_xml_el_t *el);
/* A stanza error answering el as an entity other than a session writes it: from el's to, to
   el's from. */
void rt__c2s_put_error(rt_buf_t *b, const rt_xml_el_t *el, const char *from, const char *to,
                       const char *type, const char *cond);

/* c2s_pep.c: PEP (XEP-0163). An iq with a pubsub payload to the user's own account; an iq to
   another account's bare JID (true when it was PEP's, answered); the client's capabilities
   from its presence; an iq answering the server's (true when it was); an event to write if
   the client wants it; the account's disco#info identity and features. */
void rt__c2s_pep_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                    bool get);
bool rt__c2s_pep_other(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_jid_t *to);
void rt__c2s_pep_presence(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *presence);
bool rt__c2s_pep_caps_answer(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq);
void rt__c2s_pep_event(rt_actor_t *self, c2s_t *c, const rt_msg_t *m);
/* The last items the client wants of one contact's nodes (contact: its bare JID, len bytes), or
   (NULL) of its own account's and every contact's it gets the presence of. */
void rt__c2s_pep_last(c2s_t *c, const char *contact, size_t len);
void rt__c2s_pep_features(rt_buf_t *b, const c2s_t *c);
/* The one <value/> of field var in a data form (XEP-0004), or NULL (c2s_session.c). */
const char *rt__c2s_form_value(const rt_xml_el_t *form, const char *var);

/* c2s_admin.c */
void rt__c2s_on_query(rt_actor_t *self, c2s_t *c, const rt_msg_t *m);
/* c2s_blocking.c: XEP-0191 */
void rt__c2s_blocking_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                         bool get);
void rt__c2s_blocklist_msg(rt_actor_t *self, c2s_t *c, rt_msg_t *m);
/* Whether the user blocks the JID (text, prepared; len bytes). */
bool rt__c2s_blocks(const c2s_t *c, const char *jid, size_t len);
/* Whether a packed blocklist (as c2s_t.blocked) blocks the JID. */
bool rt__c2s_list_blocks(const uint8_t *list, size_t llen, const char *jid, size_t len);
/* Refuses a stanza to a blocked JID (XEP-0191 3.6): true when it did. */
bool rt__c2s_block_out(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to);
/* A stanza for the client from a blocked JID is dropped, answered as XEP-0191 3.5 says: true. */
bool rt__c2s_block_in(rt_actor_t *self, c2s_t *c, const rt_msg_t *m);
/*
** An attribute of the first tag of a stanza the server wrote (rt__c2s_put_stanza: values in
** single quotes, escaped), unescaped into out: its length, or -1 when not there or not
** readable (a character reference: no JID has one, since stringprep forbids controls).
*/
int rt__c2s_first_tag_attr(const uint8_t *p, size_t len, const char *name, char *out, size_t cap);

/* c2s_vcard.c: XEP-0054. An iq for the user's own vCard, or (other: true when it was one) a
   get of another account's, addressed to its bare JID. */
void rt__c2s_vcard_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                      bool get);
bool rt__c2s_vcard_other(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_jid_t *to);

/* c2s_mam.c: XEP-0313 and XEP-0359. A message the session routes (b: as its receivers get
   it) is archived for the sender and the receiver, and b gains the receiver's stanza-id. */
void rt__c2s_mam_message(c2s_t *c, const rt_xml_el_t *el, const rt_jid_t *to, rt_buf_t *b);
void rt__c2s_mam_iq(rt_actor_t *self, c2s_t *c, const rt_xml_el_t *iq, const rt_xml_el_t *q,
                    bool get);
/*
** A query's form (XEP-0313 4.1) and page (XEP-0059) into q and with: NULL, or the condition of
** the error refusing it (*why, its text).
*/
const char *rt__c2s_mam_parse(const rt_xml_el_t *query, c2s_mam_query_t *q, rt_jid_buf_t *with,
                              bool *has_with, const char **why);
/* Asks the archive actor for the page of the archive of user@host that q (and with: a bare JID,
   or NULL) says, answered to full (its session: q->reply_to, or the caller) from `from`, with
   the iq's id and the query's queryid. 0, or RT_ENOMEM, RT_ENOPROC. */
int rt__c2s_mam_ask(const char *host, const char *user, const c2s_mam_query_t *q, const char *id,
                    const char *queryid, const char *full, const char *from, const char *with);
/* The query form (4.1.5), the payload of a result: to b. */
void rt__c2s_mam_put_form(rt_buf_t *b);
/* A room's groupchat message (b: as kept, from its occupant JID `with`) to the room's archive
   (service, room: its domain and localpart), unless archiving is off or el (NULL: a rule's
   row) is hinted not to be kept (XEP-0334): true, and *id its archive id. */
bool rt__c2s_mam_room(const rt_xml_el_t *el, const char *service, const char *room,
                      const char *with, const rt_buf_t *b, int64_t *id);
/* Whether the account keeps an archive; its disco#info features when it does. */
bool rt__c2s_mam_on(const c2s_t *c);
void rt__c2s_mam_features(rt_buf_t *b, const c2s_t *c);
/* A stanza-id a client wrote: never passed on (XEP-0359 3: only the archive sets them). */
bool rt__c2s_mam_forged(const rt_xml_el_t *el);
/* Archive ids handed out from now on are above id (the greatest in the file). */
void rt__c2s_mam_floor(int64_t id);

/* c2s_caps.c: XEP-0115, the server's own capabilities: its disco#info identity and features
   (c2s_session.c), and their SHA-1 ver, computed once at start. */
#define C2S_IDENTITY_CATEGORY "server"
#define C2S_IDENTITY_TYPE "im"
#define C2S_IDENTITY_NAME "rtd"
#define C2S_NFEATURES 8
#define C2S_CAPS_NODE "https://github.com/rt/rtd"
extern const char *const rt__c2s_features_list[C2S_NFEATURES];
void rt__c2s_caps_init(void);
/* The <c/> element for stream features; "" until rt__c2s_caps_init. */
const char *rt__c2s_caps_element(void);

/* c2s_registry.c: the sessions online. Entries are malloc'ed and charged to the session. */
typedef struct c2s_route_s {
    rt_pid_t pid;
    int8_t priority;
    bool available;
    bool carbons;
} c2s_route_t;
#define C2S_ROUTES_MAX 64 /* resources one lookup copies out (max_resources' cap is higher) */
/*
** Binds bare/resource to pid. With replace, a session holding the resource already is
** replaced (*old its pid, told by the caller); else RT_EEXIST. RT_ELIMIT past max resources.
*/
int rt__c2s_reg_bind(const char *bare, size_t bare_len, const char *res, size_t res_len,
                     rt_pid_t pid, bool replace, unsigned max, rt_pid_t *old);
void rt__c2s_reg_unbind(const char *bare, size_t bare_len, const char *res, size_t res_len,
                        rt_pid_t pid);
void rt__c2s_reg_presence(const char *bare, size_t bare_len, const char *res, size_t res_len,
                          rt_pid_t pid, bool available, int8_t priority);
void rt__c2s_reg_carbons(const char *bare, size_t bare_len, const char *res, size_t res_len,
                         rt_pid_t pid, bool on);
/* The sessions of bare (all, or only res's when res_len > 0): how many, up to max, in out. */
size_t rt__c2s_reg_lookup(const char *bare, size_t bare_len, const char *res, size_t res_len,
                          c2s_route_t *out, size_t max);
/*
** Sends tag (p, n) to the sessions of user@host, up to xmpp.max_resources of them: all, or
** (unavailable_only) those that have not sent their initial presence. How many were sent it.
*/
size_t rt__c2s_reg_to_account(const char *host, const char *user, uint32_t tag, const void *p,
                              size_t n, bool unavailable_only);
/* Bytes one binding costs (its session is charged them). */
size_t rt__c2s_reg_entry_bytes(size_t bare_len, size_t res_len);
/* Bindings of this node's sessions, of other nodes' (c2s_cluster.c), and the latter's bytes. */
void rt__c2s_reg_counts(size_t *local, size_t *remote, size_t *remote_bytes);
/* Calls fn for every binding of this node's, a stripe's lock held: fn copies what it needs
   and returns (or sends: a snapshot for another node keeps its order with the changes). */
void rt__c2s_reg_each_local(void (*fn)(const char *bare, size_t bare_len, const char *res,
                                       size_t res_len, const c2s_route_t *r, void *arg),
                            void *arg);
/*
** Another node's binding of bare/res, as it told it (r->pid its remote pid): made or brought
** up to date. One it replaced (replaced: its pid as this node knows it, or 0) gives way; one
** bound at the same time on two nodes goes to the node whose name sorts last (a session of
** this node's that loses is sent C2S_MSG_REPLACED). Its unbinding is rt__c2s_reg_unbind's.
*/
int rt__c2s_reg_apply(const char *bare, size_t bare_len, const char *res, size_t res_len,
                      const c2s_route_t *r, rt_pid_t replaced);
/* Drops every binding of node (its remote pids' node); how many. */
size_t rt__c2s_reg_purge_node(unsigned node);

/*
** c2s_cluster.c: XMPP across the cluster (docs/CLUSTER.md, "XMPP"). Another node's session
** is a remote pid, as Erlang's are: its node's index (1..C2S_NODES_MAX, this node's own
** numbering) in bits 24-31 of the pid that node gave it, which a pid of this runtime never
** sets (the pid table holds at most 2^24 actors: rt__c2s_cluster_start checks). rt_send
** finds no actor at one; rt__c2s_send carries what a session sends to another node's.
*/
#define C2S_NODE_SHIFT 24
#define C2S_NODES_MAX 255
static inline unsigned rt__c2s_pid_node(rt_pid_t pid)
{
    return (unsigned)(pid >> C2S_NODE_SHIFT) & 0xff;
}
bool rt__c2s_cluster_on(void);
int rt__c2s_cluster_start(rt_pid_t sup, char *err, size_t errlen);
/* rt_send to a session here or on another node (tags a session takes from another session:
   C2S_MSG_STANZA, C2S_MSG_PROBE, C2S_MSG_PRESENCE_TO, C2S_MSG_REPLACED). 0 or RT_E*. */
int rt__c2s_send(rt_pid_t to, uint32_t tag, const void *p, size_t n);
/* A binding of this node's changed (bound: made or changed; else gone); the registry's. */
void rt__c2s_cluster_announce(const char *bare, size_t bare_len, const char *res, size_t res_len,
                              const c2s_route_t *r, bool bound, rt_pid_t replaced);
/*
** xmpp.cluster_home: one node keeps xmpp.db and the rooms for the cluster. Elsewhere: this
** node is not it, and its sessions' requests go there (rt__c2s_call_home: m's tag and data to
** the home node's actor `to`, which takes them as from's, through from's proxy there; m is
** freed; 0 or RT_E*). Shared: a home is named (on the home node too: the store's news goes
** to an account's sessions on every node).
*/
bool rt__c2s_home_elsewhere(void);
/* The pid of the actor running this, 0 outside any. */
static inline rt_pid_t rt__c2s_current_pid(void)
{
    const rt_actor_t *a = rt_current();
    return a ? rt_self(a) : 0;
}
bool rt__c2s_store_shared(void);
enum { C2S_TO_STORE = 1, C2S_TO_ARCHIVE, C2S_TO_ROOM, C2S_TO_MUC_SERVICE, C2S_TO_ROOM_POST };
int rt__c2s_call_home(uint8_t to, rt_pid_t from, rt_msg_t *m);
/* A pid of node (by name; this node's own name: pid itself) as this node numbers it; 0 when
   the node is not known here. */
rt_pid_t rt__c2s_pid_at(const char *node, rt_pid_t pid);
/* The name of node index node (index 0: this node), into out. */
void rt__c2s_cluster_node_name(unsigned node, char out[RT_CONF_NODE_MAX]);

#endif
