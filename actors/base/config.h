/*
** rtd's configuration. The file (etc/rtd.conf) is Lua: a list of top-level
** assignments such as `max_connections = 100000`. Lua gives operators comments,
** arithmetic (`max_client_memory = 64 * 1024 * 1024`) and a familiar syntax;
** the loader runs it in an empty environment (no library at all) with an
** instruction budget, records the line of every assignment, and checks each
** key against one schema table, so every error names the file, the line and
** the reason. Command-line overrides use the same syntax and checks.
*/
#ifndef RT_CONFIG_H
#define RT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define RT_CONF_MAX_LISTENERS 16
#define RT_CONF_ERR_LEN 512 /* bytes for an error message */

/*
** An address range of anonymous_from: IPv4 as v4-mapped IPv6 (::ffff:a.b.c.d), so
** one comparison covers both families; bits counts from the top of the 128.
*/
#define RT_CONF_MAX_NETS 16
typedef struct rt_conf_net_s {
    unsigned char addr[16];
    unsigned bits;
} rt_conf_net_t;

/* 127.0.0.0/8 and ::1: anonymous_from's default. */
#define RT_CONF_NLOOPBACK 2
extern const rt_conf_net_t rt_conf_loopback[RT_CONF_NLOOPBACK];

/* A token bucket's refill per second and size; 0: no limit of that kind. */
typedef struct rt_conf_rate_s {
    double messages, bytes;             /* PUBLISH packets and bytes read, per second */
    double burst_messages, burst_bytes; /* the bucket: 0 means one second's worth */
} rt_conf_rate_t;

/*
** The Receive Maximum MQTT 5 clients are told. An inbound PUBLISH in flight costs rtd two
** bytes (a QoS 2 id until PUBREL), so 16,384 costs a client 32 KiB of its budget at most;
** it is far above what a client that waits for its acks uses, and leaves room for the many
** that do not (MQTT.js 5 sends a whole burst before it reads a PUBREC). Answering that many
** PUBRECs to a client that reads none is 64 KiB of output, so one that overruns it while not
** reading still reaches the 0x93 disconnect instead of stalling behind unread output.
*/
#define RT_CONF_RECEIVE_MAXIMUM 16384

#define RT_CONF_PATH_MAX 256
#define RT_CONF_NODE_MAX 33 /* a cluster node's name, with its NUL */
#define RT_CONF_REPLAY_MARGIN 5
#define RT_CONF_MAX_NATS 8 /* NATS server URLs a node knows at start (it learns the rest) */
#define RT_CONF_URL_MAX 256

/*
** In the order of their choices in the schema (tls.verify, tls.min_version). REQUEST asks for
** a certificate and verifies it but takes the connection whatever it shows: for server-to-server
** streams, where an untrusted certificate means dialback, not a refusal.
*/
typedef enum {
    RT_TLS_VERIFY_NONE,
    RT_TLS_VERIFY_OPTIONAL,
    RT_TLS_VERIFY_REQUIRED,
    RT_TLS_VERIFY_REQUEST
} rt_tls_verify_t;
extern const char *const rt_conf_tls_verify_names[]; /* by rt_tls_verify_t, then NULL */
typedef enum { RT_TLS_1_2, RT_TLS_1_3 } rt_tls_version_t;

/* A certificate served to clients that ask for name by SNI (tls.sni). */
#define RT_CONF_MAX_SNI 4
typedef struct rt_conf_sni_s {
    char name[128]; /* a host name, or "*.domain" for any one label in front of domain */
    char cert[RT_CONF_PATH_MAX], key[RT_CONF_PATH_MAX];
} rt_conf_sni_t;

/* A listener's TLS (actors/transport/tls.h); files are PEM, paths absolute after load. */
typedef struct rt_conf_tls_s {
    char cert[RT_CONF_PATH_MAX], key[RT_CONF_PATH_MAX]; /* served without a matching SNI name */
    unsigned nsni;
    rt_conf_sni_t sni[RT_CONF_MAX_SNI];
    char ca[RT_CONF_PATH_MAX];  /* client certificates are verified against it; "": none */
    char crl[RT_CONF_PATH_MAX]; /* revoked client certificates; "": no revocation check */
    rt_tls_verify_t verify;
    bool identity_as_username; /* the client certificate's subject CN is the user name */
    rt_tls_version_t min_version; /* the oldest version accepted */
} rt_conf_tls_t;

/* Bytes of a mountpoint, NUL included (a listener's, before %u and %c are expanded). */
#define RT_CONF_MOUNT_MAX 128

/*
** A listener: "host:port" in the file, or a table with bind and the transport's
** settings (TRANSPORTS.md): { bind = "host:port", tls = {...}, websocket = "/mqtt",
** proxy_protocol = true, trusted_proxies = {...}, rate_limit = {...} }.
*/
typedef struct rt_listen_s {
    char host[64]; /* numeric address; "0.0.0.0" or "::" for all */
    int port;
    bool tls_on;
    bool proxy_protocol; /* a PROXY protocol header (v1 or v2) comes first on every connection */
    bool starttls; /* TLS starts when the client asks (XMPP STARTTLS, RFC 6120 5) instead of at
                      accept; xmpp.listeners only, and with a tls table (its certificate) */
    bool s2s;      /* other servers' streams (RFC 6120 server-to-server), not clients';
                      xmpp.listeners only */
    char websocket[128]; /* WebSocket on this path (MQTT, or XMPP: RFC 7395); "": none */
    unsigned ntrusted;
    rt_conf_net_t trusted_proxies[RT_CONF_MAX_NETS]; /* PROXY headers and X-Forwarded-For from
                                                        these only */
    rt_conf_rate_t rate_limit;                       /* per client */
    char mountpoint[RT_CONF_MOUNT_MAX]; /* its clients' topics live under it (a tenant, %u and
                                           %c expanded; TENANTS.md); "": none */
    rt_conf_tls_t tls;
    int line; /* the config file's line that set it; 0: a default, -o or rtctl */
} rt_listen_t;

/*
** The XMPP server's settings (the xmpp table; docs/XMPP.md). Its listeners are rt_listen_t as
** MQTT's are: one with tls and no starttls is direct TLS (XEP-0368), one with websocket is
** XMPP over WebSocket (RFC 7395). Nothing in it changes while rtd runs.
*/
#define RT_CONF_MAX_XMPP_HOSTS 16
#define RT_CONF_MAX_XMPP_LISTENERS 8
#define RT_CONF_XMPP_HOST_MAX 256 /* bytes of a host name, NUL included */
#define RT_CONF_XMPP_PORT 5222    /* the default listener's port (RFC 6120 14.7) */
/*
** Every listener has one index among all of them, for the tables kept per listener (TLS
** contexts, counters): the MQTT listeners' first (conf.listeners[i] is i), the HTTP
** listener's, then the XMPP listeners'.
*/
#define RT_CONF_HTTP_LISTENER RT_CONF_MAX_LISTENERS
#define RT_CONF_XMPP_LISTENER(i) (RT_CONF_MAX_LISTENERS + 1 + (i))
#define RT_CONF_ALL_LISTENERS (RT_CONF_MAX_LISTENERS + 1 + RT_CONF_MAX_XMPP_LISTENERS)
typedef struct rt_conf_xmpp_s {
    bool on; /* an xmpp table was given: else no XMPP code runs */
    char hosts[RT_CONF_MAX_XMPP_HOSTS][RT_CONF_XMPP_HOST_MAX];     /* domains served, lowercase */
    unsigned nhosts;                                               /* >= 1 when on */
    char anonymous[RT_CONF_MAX_XMPP_HOSTS][RT_CONF_XMPP_HOST_MAX]; /* hosts allowing SASL
                                     ANONYMOUS; each must be one of hosts */
    unsigned nanonymous;
    char registration[RT_CONF_MAX_XMPP_HOSTS][RT_CONF_XMPP_HOST_MAX]; /* xmpp.register: hosts
                                     allowing in-band registration (XEP-0077); each of hosts */
    unsigned nregistration;
    long register_rate; /* registrations one address may try an hour (the limiter's bucket:
                           as many at once, then one each 3600/rate s); default 6, 1..100000 */
    rt_listen_t listeners[RT_CONF_MAX_XMPP_LISTENERS];
    unsigned nlisteners;                            /* default: one, "0.0.0.0:5222" */
    rt_conf_net_t plaintext_from[RT_CONF_MAX_NETS]; /* who may authenticate without TLS */
    unsigned nplaintext_from;   /* default { "127.0.0.0/8", "::1/128" } like anonymous_from */
    long max_stanza_size;       /* bytes, default 262144, 1024 .. 67108864 */
    char resource_conflict[16]; /* "replace" (default: the older session is ended, as
                                   ejabberd does) or "refuse" */
    long max_resources;         /* sessions of one account at once, default 16, 1..1000 */
    long max_roster_items;      /* default 1000, 1..100000 */
    long max_offline_messages;  /* per account, default 1000, 0..1000000 (0: none kept) */
    long max_offline_bytes;     /* per account, default 1 MiB, 0..1e9 */
    long idle_timeout;          /* s without a byte from the client before it is pinged
                                   (XEP-0199), and as long again before it is dropped;
                                   default 300, 0 = never; 0..86400 */
    bool channel_binding;       /* offer SCRAM-*-PLUS (default true) */
    long resume_timeout;        /* s a detached session waits for its client (XEP-0198);
                                   default 300, 0 = no resumption */
    long max_vcard_size;        /* bytes of one account's vCard (XEP-0054), default 64 KiB */
    bool archive;               /* keep the message archive (XEP-0313), default true */
    long max_archive_messages;  /* per account, default 10000: the oldest go past it */
    /* Group chat (XEP-0045): the MUC service's domain, @HOST@ standing for each of hosts
       ("conference.@HOST@" as ejabberd writes it); "": no MUC service. */
    char muc_host[RT_CONF_XMPP_HOST_MAX];
    long muc_max_occupants; /* in one room, default 200 (ejabberd's max_users) */
    long muc_history;       /* groupchat messages a room keeps for joiners, default 20 */
    long muc_history_bytes; /* and at most this many bytes of them, default 256 KiB */
    long muc_max_rooms;     /* rooms on this node at once, default 10000 */
    long muc_message_rate;  /* groupchat messages an occupant may send a second (as many at
                               once), default 50; 0 = no limit */
    bool muc_room_locking;  /* a new room refuses others until its owner configures it
                               (XEP-0045 7.2.10), default true */
    long muc_max_rooms_per_user; /* rooms one bare JID made that exist at once, default 100 */
    bool sasl2;                  /* offer SASL2 with Bind2 (XEP-0388, XEP-0386), default on */
    bool fast;                   /* offer FAST tokens inside SASL2 (XEP-0484), default on */
    long fast_token_lifetime;    /* s a FAST token is good for, default 14 days */
    bool pep;                    /* PEP (XEP-0163): each account a pubsub service, default on */
    long pep_max_nodes;          /* nodes of one account, default 64 */
    long pep_max_items;          /* items one node keeps at most, default 256 */
    long pep_max_bytes;          /* bytes of one account's items, default 1 MiB */
    /* HTTP file upload (XEP-0363): the service's domain as muc_host's ("": none), the URL
       base the slots name ("": the http listener's, at each host's domain) and the bounds. */
    char upload_host[RT_CONF_XMPP_HOST_MAX];
    char upload_url[256];
    long upload_max_size;     /* bytes of one file, default 10 MiB */
    long upload_quota;        /* bytes of one account's files, default 100 MiB; 0 = none */
    long upload_expire;       /* s a file is served, default 7 days; 0 = kept */
    long upload_slot_timeout; /* s a slot waits for its PUT, default 300 */
    /* Federation (RFC 6120 server-to-server): where another server's domain is reached,
       "domain=host:port" (numeric host), in place of a DNS lookup; at most 255 bytes each. */
    char s2s_peers[RT_CONF_MAX_XMPP_HOSTS][RT_CONF_XMPP_HOST_MAX];
    unsigned ns2s_peers;
    bool s2s_dns;         /* a domain not in s2s_peers is looked up in DNS, default true */
    bool s2s_secure;      /* certificates both ways, never dialback, default false */
    char cluster_home[RT_CONF_NODE_MAX]; /* the node keeping xmpp.db and rooms ("": each its own) */
    long s2s_queue_bytes; /* stanzas one outgoing stream holds while it is set up, default
                             1 MiB: past it they are bounced */
} rt_conf_xmpp_t;

/* A user's own rate limit (user_rate_limits), in place of its listener's. */
#define RT_CONF_MAX_USER_RATES 64
typedef struct rt_conf_user_rate_s {
    char user[64];
    rt_conf_rate_t rate;
} rt_conf_user_rate_t;

/* A tenant's own quotas (tenants), in place of the tenant_max_* settings: -1 takes those. */
#define RT_CONF_MAX_TENANTS 64
typedef struct rt_conf_tenant_s {
    char mount[RT_CONF_MOUNT_MAX]; /* the tenant's mountpoint, as its clients get it */
    long max_connections, max_subscriptions, max_publish_rate, max_retained_bytes;
} rt_conf_tenant_t;

/* A subscription made for each client at CONNECT (auto_subscribe): %c and %u in topic are the
   client id and user name. */
#define RT_CONF_MAX_AUTO_SUBS 16
typedef struct rt_conf_auto_sub_s {
    char topic[256];
    long qos, retain_handling;
    bool no_local, retain_as_published;
} rt_conf_auto_sub_t;

/*
** A topic rewrite rule (rewrite, EMQX's): a topic (of a PUBLISH) or filter (of a SUBSCRIBE or
** UNSUBSCRIBE) that source matches and the POSIX extended regular expression re matches
** becomes dest, $1..$9 replaced by re's groups.
*/
/*
** One authenticator of the login chain (auth, EMQX's authentication chain; actors/auth/auth.h):
** the password file, or JSON Web Tokens in the password field.
*/
#define RT_CONF_MAX_AUTH 4
typedef enum { RT_AUTHN_FILE, RT_AUTHN_JWT, RT_AUTHN_HTTP } rt_authn_kind_t;
typedef enum {
    RT_AUTHN_ON_ERROR_DENY,
    RT_AUTHN_ON_ERROR_IGNORE,
    RT_AUTHN_ON_ERROR_CACHE
} rt_authn_on_error_t;
typedef struct rt_conf_auth_s {
    int kind;                           /* rt_authn_kind_t */
    char secret_file[RT_CONF_PATH_MAX]; /* jwt: HS256's shared secret */
    char public_key[RT_CONF_PATH_MAX];  /* jwt: an RSA (RS256) or P-256 (ES256) key, PEM */
    char jwks_file[RT_CONF_PATH_MAX];   /* jwt: a JWKS of RSA and P-256 keys, by kid */
    char audience[256], issuer[256];    /* jwt: aud and iss the token must carry; "": any */
    char username_claim[64];            /* jwt: a claim that must equal the user name */
    char client_id_claim[64];           /* jwt: ... the client id */
    char acl_claim[64];                 /* jwt: {pub, sub, all} topic lists: the client's ACL */
    char mountpoint_claim[64];          /* jwt: the client's mountpoint (a tenant) */
    bool disconnect_after_expire;       /* jwt, http: the connection ends at its expiry */
    char url[512];                      /* http: where logins are POSTed */
    char ca_file[RT_CONF_PATH_MAX];     /* http: an https url's CA; "": the system's */
    long timeout_ms;                    /* http: a call's whole time */
    long pool_size;                     /* http: calls at once (threads, kept connections) */
    long cache_ttl_s;                   /* http: how long an answer is reused; 0: never */
    long cache_max;                     /* http: answers kept */
    int on_error;                       /* http: rt_authn_on_error_t */
    bool send_password_hash;            /* http: SHA-256 of the password, not the password */
} rt_conf_auth_t;

/*
** A bridge to another broker (bridges, docs/BRIDGES.md; actors/bridge): one MQTT client
** connection, messages out (local filter -> remote topic) and in (remote filter -> local
** topic), queued in memory while the remote is away.
*/
#define RT_CONF_MAX_BRIDGES 8
#define RT_CONF_MAX_BRIDGE_MAPS 8
#define RT_CONF_BRIDGE_MAP_LEN 200
typedef struct rt_conf_bridge_maps_s {
    char map[RT_CONF_MAX_BRIDGE_MAPS][RT_CONF_BRIDGE_MAP_LEN]; /* "filter -> topic", or a filter */
    unsigned n;
} rt_conf_bridge_maps_t;
typedef struct rt_conf_bridge_s {
    char name[64];
    char remote[256];          /* mqtt://host:port or mqtts://host:port */
    rt_conf_bridge_maps_t out; /* local messages to the remote */
    rt_conf_bridge_maps_t in;  /* the remote's messages here */
    long version;              /* 4 (3.1.1) or 5 */
    long qos;                  /* 0 or 1: subscriptions on both sides and PUBLISHes out */
    char client_id[128];       /* "": rtd-bridge-<name> */
    char username[128];
    char password[256];
    bool clean_start;
    long session_expiry_s; /* MQTT 5: the remote keeps the bridge's session this long */
    long keepalive_s;
    long max_inflight;       /* QoS 1 PUBLISHes out waiting for their PUBACK */
    long max_queue_bytes;    /* bytes of messages out held while the remote is away */
    long connect_timeout_ms; /* TCP connect plus CONNACK */
    long reconnect_min_ms, reconnect_max_ms;
    bool durable; /* a local publisher's PUBACK waits for the remote's */
    bool spill;   /* past max_memory_bytes, QoS 1 messages out wait in a file */
    long max_memory_bytes; /* of messages out held in memory */
    /* mqtts:// */
    char ca_file[RT_CONF_PATH_MAX];   /* "": the system's CAs */
    char cert_file[RT_CONF_PATH_MAX]; /* a client certificate (mutual TLS); "": none */
    char key_file[RT_CONF_PATH_MAX];
    char server_name[256]; /* checked in the certificate and sent as SNI; "": the host */
    bool tls_verify;       /* false: any certificate (tests only) */
} rt_conf_bridge_t;

#define RT_CONF_MAX_REWRITES 32
typedef enum { RT_REWRITE_PUBLISH, RT_REWRITE_SUBSCRIBE, RT_REWRITE_ALL } rt_rewrite_action_t;
typedef struct rt_conf_rewrite_s {
    int action; /* rt_rewrite_action_t */
    char source[256], re[256], dest[256];
} rt_conf_rewrite_t;

/*
** Named sections (the `sinks` table): name = { key = value, ... }. The loader only
** checks the shape (string keys; string, number, boolean or nested-table values);
** the module that owns the section checks its keys at start, naming where and line.
** Nested tables are flattened with dots ("columns.topic"; arrays as "columns.1").
*/
/*
** ms a rule worker holds a partial sink batch before submitting it (rule_flush_ms).
** Each submission is a message, a wake-up and a queue entry at the sink; flushing
** at the end of every turn made ~1.6 rows per submission at 40k msg/s. The sink
** waits up to its flush_ms (50) for a full batch anyway, so 2 ms adds little.
*/
#define RT_CONF_RULE_FLUSH_MS 2
/*
** Microseconds of rule runs after which a worker ends its turn (rule_turn_us),
** so the other actors on its scheduler run: a rule that burns its whole instruction
** budget takes a few ms a message, and a 100-message turn of it held every
** connection on that scheduler (their PUBACKs) for ~0.5 s. A typical rule call
** takes microseconds, so a healthy worker seldom ends a turn early.
*/
#define RT_CONF_RULE_TURN_US 2000
/*
** Wall-clock ms one rule call may run (rule_call_ms), whatever it calls: the
** backstop for time the budget does not see (inside C library functions, or
** a state near its memory cap collecting). A call of the whole default budget
** takes a few ms on an idle core, but wall time stretches with load: a rule
** filling an 8 MB cap took 100-480 ms on a box running 6 builds at once.
*/
#define RT_CONF_RULE_CALL_MS 1000
/*
** http.request_timeout's default and range, in seconds: a request must arrive whole
** within it (slowloris), and the first one, a TLS handshake included, within it of accept.
*/
#define RT_CONF_HTTP_REQUEST_TIMEOUT 10
#define RT_CONF_HTTP_REQUEST_TIMEOUT_MAX 3600
/* Rows one rule call may return (rule_output_rows). */
#define RT_CONF_RULE_OUTPUT_ROWS 10000
/*
** BSON bytes the rows of one rule call may make (rule_output_bytes); they also
** count against rule_memory (rules/rule_vm.h). A row may repeat one table many
** times, so its BSON can dwarf what the Lua state holds.
*/
#define RT_CONF_RULE_OUTPUT_BYTES (16 << 20)
/*
** The restart intensity of every group supervisor (restart_intensity restarts within
** restart_period seconds; actors/base/group.h). Five in ten seconds is more than
** one-off failures explain (an operator's kill, a heap limit hit by one burst, a
** sink killed mid-replay), and fewer than a crash loop makes: a restart takes
** milliseconds, so a child that dies as it starts passes five within a second and
** rtd stops (exit 3, for systemd to start it clean) instead of spinning. Ten
** seconds still catches a loop paced by a backoff of a few seconds.
*/
#define RT_CONF_RESTART_INTENSITY 5
#define RT_CONF_RESTART_PERIOD 10
#define RT_CONF_MAX_SECTIONS 8
#define RT_CONF_MAX_SECTION_KEYS 24
#define RT_CONF_KEY_LEN 48
#define RT_CONF_VALUE_LEN 200

typedef enum { RT_CONF_V_STRING, RT_CONF_V_NUMBER, RT_CONF_V_BOOL } rt_conf_vtype_t;

typedef struct rt_conf_kv_s {
    char key[RT_CONF_KEY_LEN];
    rt_conf_vtype_t type;
    double num;                  /* numbers */
    bool b;                      /* booleans */
    char str[RT_CONF_VALUE_LEN]; /* strings; numbers and booleans also as text, as written */
} rt_conf_kv_t;

typedef struct rt_conf_section_s {
    char name[64];
    unsigned nkeys;
    rt_conf_kv_t keys[RT_CONF_MAX_SECTION_KEYS];
} rt_conf_section_t;

typedef struct rt_conf_sections_s {
    char where[256]; /* file the table was set in, or "command line" */
    int line;        /* line of the assignment; 0 if unknown */
    unsigned n;      /* sections, sorted by name */
    rt_conf_section_t s[RT_CONF_MAX_SECTIONS];
} rt_conf_sections_t;

/*
** The settings schema: every setting rtd reads, declared once with what the loader, `rtctl
** config show`, docs/CONFIG.md and rtd.conf(5) need (config_schema.c; `rtd --print-schema`).
** A name is a dotted path: "max_connections", "listeners[].tls.cert", "http.bind",
** "sinks.<name>.batch", "sinks.<name>(sqlite).file" (a key of one sink type's).
*/
typedef enum {
    RT_SET_INT,     /* a whole number in [min, max] */
    RT_SET_NUMBER,  /* a number in [min, max] */
    RT_SET_BOOL,    /* true or false */
    RT_SET_STRING,  /* text; one of choices when they are given */
    RT_SET_PATH,    /* text naming a file or directory, relative to the config file's directory */
    RT_SET_ADDRESS, /* "host:port", a numeric host ("[v6]:port") */
    RT_SET_NETS,    /* "address/bits" or a list of them */
    RT_SET_TABLE,   /* a table of the settings named under it */
    RT_SET_LIST,    /* one of what it names under it, or a list of them */
    RT_SET_MAP,     /* name = { ... } entries of the settings named under "<name>" */
    RT_SET_PREFIX   /* any key under it ("columns.<name>"), a string each */
} rt_set_type_t;

typedef struct rt_setting_s {
    const char *name;
    rt_set_type_t type;
    double num;                 /* numbers and booleans: the default */
    const char *text;           /* the default as rtd.conf writes it; NULL: a number's, or none */
    const char *unit;           /* "bytes", "seconds", "ms"...; NULL: none */
    double min, max;            /* numbers: accepted range */
    const char *const *choices; /* strings: the values allowed (NULL-terminated), or NULL */
    bool live;                  /* `rtctl config set` changes it while rtd runs */
    bool secret;                /* config show says whether it is set, never what it is */
    const char *doc;            /* one line */
    size_t offset, size;        /* top-level settings: their rt_conf_t field, strings' size */
} rt_setting_t;

/*
** A table of settings another layer reads itself (the sinks' keys, actors/sinks), added to the
** schema at start, before any thread reads it (rtd's main): one declaration format, one list.
** The table ends with an entry whose name is NULL and stays valid for good.
*/
#define RT_CONF_MAX_TABLES 8
void rt_conf_schema_add(const rt_setting_t *table);
/* Every setting in the schema's order (then the tables added, in their order). */
void rt_conf_schema_each(void (*fn)(const rt_setting_t *s, void *ud), void *ud);
/* A setting's default as rtd.conf writes it ("" for a table or none) into out. */
void rt_conf_default_text(const rt_setting_t *s, char *out, size_t n);
/* The schema as a reference: "markdown" (docs/CONFIG.md) or "man" (rtd.conf(5)); RT_EINVAL. */
int rt_conf_schema_print(const char *format, FILE *out);

/*
** Checks one flattened key of a named section (a sink's) against its schema entry s, as the
** loader checks a setting: 0, or RT_EINVAL with why naming the key and what it must be.
*/
int rt_conf_check_kv(const rt_setting_t *s, const rt_conf_kv_t *kv, char *why, size_t whylen);

/* A string setting's choices as "a, b or c" (errors and the reference say them so). */
void rt_conf_choices_text(const char *const *choices, char *out, size_t n);

/* Where a top-level setting's value came from (rt_conf_each). */
typedef enum {
    RT_FROM_DEFAULT = 0, /* the built-in default */
    RT_FROM_FILE,        /* the config file, at its line */
    RT_FROM_OPTION,      /* rtd -o */
    RT_FROM_SET          /* rtctl config set */
} rt_conf_from_t;

typedef struct rt_conf_origin_s {
    unsigned char from; /* rt_conf_from_t */
    int line;           /* RT_FROM_FILE: the assignment's line */
} rt_conf_origin_t;

#define RT_CONF_MAX_SETTINGS 96 /* top-level settings */


typedef struct rt_conf_s {
    /* Listeners: "host:port" strings; "[v6]:port" for IPv6. */
    rt_listen_t listeners[RT_CONF_MAX_LISTENERS];
    unsigned nlisteners;
    /* The HTTP listener (actors/http): metrics, health, the API. */
    struct {
        bool on; /* an http table was given */
        rt_listen_t where;
        char api_keys_file[RT_CONF_PATH_MAX]; /* name role sha256 lines; "": no API */
        bool metrics_public;                  /* /metrics without a key */
        long request_timeout; /* seconds from a request's first byte (from accept for the
                                 first, a TLS handshake included) to the whole request */
    } http;
    /* The cluster (actors/cluster): this node's name and the NATS servers it joins through. */
    struct {
        bool on;                                      /* a cluster table was given */
        char node[RT_CONF_NODE_MAX];                  /* [A-Za-z0-9_-], unique in the cluster */
        char nats[RT_CONF_MAX_NATS][RT_CONF_URL_MAX]; /* nats:// or tls:// URLs */
        unsigned nnats;
        char prefix[RT_CONF_NODE_MAX]; /* first token of every subject rtd uses; "rt" */
        long replicas; /* copies JetStream keeps of the retained store: 1..5; 0: min(3, nnats) */
        bool durable;  /* QoS 1/2 messages kept in JetStream, acknowledged once there; sessions
                          resume on another node after their node's crash (docs/CLUSTER.md) */
        long replay_margin; /* s: how far before a session's last all-acknowledged moment a
                               resume after a crash replays from (0..3600) */
        /* NATS authentication: any of these (or a user in a URL) counts as credentials. */
        char user[RT_CONF_VALUE_LEN], password[RT_CONF_VALUE_LEN], token[RT_CONF_VALUE_LEN];
        char creds[RT_CONF_PATH_MAX];     /* a credentials file: user JWT and nkey seed */
        char nkey[RT_CONF_VALUE_LEN];     /* a user nkey (public key, U...) ... */
        char nkey_seed[RT_CONF_PATH_MAX]; /* ... and the file of its seed (SU...) */
        char tls_ca[RT_CONF_PATH_MAX];    /* verify the NATS servers against it; "": plain */
        char tls_cert[RT_CONF_PATH_MAX], tls_key[RT_CONF_PATH_MAX]; /* a client certificate */
        char secret_file[RT_CONF_PATH_MAX]; /* the key that signs the nodes' control requests
                                               and answers (docs/CLUSTER.md "Security") */
        bool unsigned_control;              /* secret_file = false: they go unsigned */
        bool nats_without_credentials;      /* a NATS server off this host is reached with none */
    } cluster;
    rt_conf_xmpp_t xmpp; /* the XMPP server (actors/xmpp); off unless an xmpp table is given */
    rt_conf_user_rate_t user_rates[RT_CONF_MAX_USER_RATES]; /* user_rate_limits */
    unsigned nuser_rates;
    rt_conf_auth_t auth[RT_CONF_MAX_AUTH]; /* the login chain, in order; none: the file */
    unsigned nauth;
    rt_conf_auto_sub_t auto_subs[RT_CONF_MAX_AUTO_SUBS]; /* auto_subscribe */
    unsigned nauto_subs;
    rt_conf_rewrite_t rewrites[RT_CONF_MAX_REWRITES]; /* rewrite, in order: the first applies */
    unsigned nrewrites;
    rt_conf_bridge_t bridges[RT_CONF_MAX_BRIDGES]; /* bridges, by name */
    unsigned nbridges;
    long connect_timeout; /* seconds from accept to an accepted CONNECT (the TLS handshake,
                             WebSocket upgrade and PROXY header included) */

    /* Limits (MQTT). */
    long max_connections;        /* connections at once */
    long max_connections_per_ip; /* connections at once from one address; 0: unlimited */
    long max_connection_rate;    /* new connections per second per listener; 0: unlimited */
    long max_connect_size;       /* bytes a packet before authentication may have (a CONNECT) */
    long max_preauth_memory;     /* bytes all connections not authenticated yet may hold */
    long max_packet_size;        /* bytes, both directions */
    long max_inflight;           /* QoS 1/2 messages in flight to a client, per session */
    long receive_maximum;        /* QoS 1/2 PUBLISHes from an MQTT 5 client not yet acknowledged
                                    (the Receive Maximum its CONNACK tells) */
    long max_queued_messages;    /* per offline or slow session; 0 = no count (the budget rules) */
    long max_client_memory;      /* bytes one client may make rtd hold (its actor's heap, the
                                    messages queued and in flight for it, its unsent output) */
    long client_memory_hold_ms;  /* at the budget: ms its publishers are held back before
                                    messages are dropped (policy "hold") */
    char client_memory_policy[16]; /* hold, drop_newest or drop_oldest */
    long max_topic_alias;          /* inbound topic aliases per connection (MQTT 5) */
    long max_topic_levels;         /* levels in a topic name or filter; 0 = unlimited */
    long max_topic_length;         /* bytes in a topic name or filter; 0 = unlimited */
    long max_subscriptions;        /* per client; 0 = unlimited */
    long max_retained_messages;    /* 0 = unlimited */
    long max_retained_bytes;       /* 0 = unlimited */
    long max_keepalive;            /* seconds; longer client keepalives are lowered (MQTT 5) */
    long max_session_expiry;       /* seconds */
    bool queue_qos0;               /* queue QoS 0 messages for offline sessions */
    bool persistence;              /* retained messages and persistent sessions survive restarts */
    bool allow_zero_length_clientid;
    /* Delayed publish (conn/delayed.h). */
    bool delayed_publish;   /* $delayed/SECONDS/topic is held, not routed */
    long max_delayed;       /* messages held at once */
    long max_delayed_bytes; /* their bytes */
    /* The banned list (broker/banned.h). */
    long max_banned;            /* bans held at once (flapping adds them); 0 = unlimited */
    /* Quotas of each tenant (broker/tenant.h); 0: none. */
    long tenant_max_connections;
    long tenant_max_subscriptions;
    long tenant_max_publish_rate; /* PUBLISHes a second */
    long tenant_max_retained_bytes;
    rt_conf_tenant_t tenants[RT_CONF_MAX_TENANTS]; /* tenants: quotas of their own */
    unsigned ntenants;
    long flapping_max_connects; /* connects of one client id within the window that ban it; 0:
                                   no flapping detection */
    long flapping_window_s;
    long flapping_ban_s;

    /* Authentication and authorization (actors/auth.h, actors/acl.h). */
    bool allow_anonymous;                           /* accept a CONNECT without a user name, */
    rt_conf_net_t anonymous_from[RT_CONF_MAX_NETS]; /* from these addresses only */
    unsigned nanonymous_from;
    char password_file[256]; /* user:hash lines; "" = no passwords checked */
    char acl_file[256];      /* Mosquitto ACL format; "" = every topic allowed */
    long auth_max_delay_ms;  /* cap of the delay before a refused CONNACK */

    /* Runtime. */
    long schedulers; /* 0: one per core */
    long blocking_threads;
    long batch;    /* messages per actor turn */
    long min_heap; /* bytes */
    double gc_factor;
    long max_heap; /* bytes per actor; 0: unlimited */

    /* Rules (rules/rule_engine.h). */
    char rules_dir[256];    /* directory of rule files (*.lua) */
    long rule_workers;      /* rule worker actors, one Lua state each */
    long rule_instructions; /* Lua instructions one rule call may run */
    long rule_flush_ms;     /* ms a worker holds a partial sink batch; 0 = one per turn */
    long rule_turn_us;      /* microseconds of rules a worker runs before it yields a turn */
    long rule_memory;       /* bytes one worker's Lua state may hold */
    long rule_call_ms;      /* wall-clock ms one rule call may run */
    long rule_output_rows;  /* rows one rule call may return */
    long rule_output_bytes; /* BSON bytes of the rows one rule call may return */

    /* Operations. */
    long sys_interval;      /* seconds between $SYS updates; 0: no $SYS tree */
    long restart_intensity; /* restarts a group supervisor allows (actors/base/group.h) */
    long restart_period;    /* ... within this many seconds */
    char data_dir[256];
    char log_level[16];     /* error, warning, info, debug */
    char log_format[8];     /* logfmt or json (actors/base/log.h) */
    char log_file[256];     /* "" = stderr; else a file reopened on SIGHUP */
    char log_journal[8];    /* auto, on, off: the journal's priority prefixes on stderr */
    char admin_socket[256]; /* rtctl's unix socket; "" = data_dir/rtd.sock */

    /* Sinks (actors/sink.h checks each one's keys). */
    rt_conf_sections_t sinks;

    /* Where each top-level setting came from, by its place in the schema. */
    char file[RT_CONF_PATH_MAX]; /* the config file loaded; "": none */
    rt_conf_origin_t origin[RT_CONF_MAX_SETTINGS];
} rt_conf_t;

void rt_conf_defaults(rt_conf_t *c);

/*
** Loads path over the values already in c (defaults, usually). Returns 0, or
** an RT_E* code with err set to "path:line: reason". Relative paths (rules_dir,
** data_dir, password_file, acl_file, admin_socket), the defaults included, are
** made absolute against the file's directory, so the same file means the same
** files whatever directory rtd starts in (systemd starts it in /).
*/
int rt_conf_load(rt_conf_t *c, const char *path, char *err, size_t errlen);

/*
** Calls fn for every top-level setting in the schema's order with its current value as
** text (listeners joined by ", ", sinks by name), its default and where the value came
** from as text: "default", "FILE:LINE", "-o" or "config set"; after listeners, http,
** cluster and xmpp, each key of their tables (each listener's: "listeners[1].tls.cert",
** "xmpp.listeners[2].bind"), from where the table came from.
*/
typedef struct rt_conf_value_s {
    const rt_setting_t *setting;
    const char *name; /* the setting's name, a table's keys with their place ("listeners[2].bind") */
    const char *value, *dflt, *from;
} rt_conf_value_t;
void rt_conf_each(const rt_conf_t *c, void (*fn)(const rt_conf_value_t *v, void *ud), void *ud);
/* The top-level setting named key, or NULL. */
const rt_setting_t *rt_conf_setting(const char *key);

/*
** Applies one "key=value" override (Lua syntax for the value), as from `rtd -o`.
** A relative path given so is made absolute against the current directory, as a
** shell user expects of a flag.
*/
int rt_conf_set(rt_conf_t *c, const char *assignment, char *err, size_t errlen);
/* The same, from rtctl config set: errors name where ("rtctl"), and so does config show. */
int rt_conf_set_from(rt_conf_t *c, const char *where, const char *assignment, char *err,
                     size_t errlen);
/* "a.b.c.d/n" (IPv4 as v4-mapped IPv6) or "v6/n"; no "/n": one address. Host bits cleared. */
bool rt_conf_net_parse(const char *s, rt_conf_net_t *out);
/* The other way: "a.b.c.d/n" or "v6/n". */
void rt_conf_net_format(const rt_conf_net_t *n, char *buf, size_t len);
/* Whether addr (16 bytes, IPv4 v4-mapped) is in one of the n networks. */
bool rt_conf_net_match(const rt_conf_net_t *nets, unsigned n, const unsigned char addr[16]);
/*
** The admin socket's path as rtd binds it: admin_socket, else data_dir/rtd.sock (rtctl -c
** finds its rtd by the same rule). RT_EINVAL when it does not fit in n bytes.
*/
int rt_conf_admin_socket(const rt_conf_t *c, char *out, size_t n);
/* Whether key names a setting of the schema. */
bool rt_conf_known(const char *key);
/* The listener of index i among all of them (RT_CONF_*_LISTENER) in c, or NULL when there is
   none (an index past the configured ones, no HTTP listener, no xmpp table). */
const rt_listen_t *rt_conf_listener(const rt_conf_t *c, unsigned i);

#endif
