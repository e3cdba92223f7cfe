/*
** The MQTT side of the broker: the connection actor (one per client socket, and the
** client's session, which outlives the socket when the client asked for that), the
** listener actors that accept sockets for it, and the sessions restored from the
** store at start. Administrators reach the client actors through the queries below.
*/
#ifndef RT_CONN_H
#define RT_CONN_H

#include "broker.h"

extern const rt_actor_type_t rt_listener_type; /* arg: const rt_listen_t * */
extern const rt_actor_type_t rt_conn_type;     /* arg: const rt_conn_arg_t * */

/*
** A listener's kind for people and metrics' labels, by its index among all listeners
** (RT_CONF_*_LISTENER; an MQTT listener's is its place in conf.listeners): an MQTT
** listener's transport, "tcp", "tls", "ws" or "wss" (as before there was XMPP), the HTTP
** listener's "http" or "https", an XMPP listener's protocol and transport, "xmpp/tcp",
** "xmpp/starttls", "xmpp/tls", "xmpp/ws" or "xmpp/wss" (rt_broker_listener_protocol).
*/
const char *rt_listener_kind(unsigned listener);
/* "ip:port" of the socket's peer into buf ("?:0" if unknown), for the log. */
void rt_conn_format_peer(int fd, char *buf, size_t len);

/* A connection actor's start: its socket and the listener that accepted it. */
typedef struct rt_conn_arg_s {
    int fd;
    unsigned listener; /* index in conf.listeners */
} rt_conn_arg_t;

/*
** Brings MQTT up: the broker's state, the persistent sessions and retained messages
** the store kept (with persistence on; offline until their clients return), the login
** verifier, then one listener per configured address, each group supervised on its
** own (tests; rtd starts the steps under its tree). err names what failed.
*/
int rt_mqtt_start(const rt_conf_t *conf, char *err, size_t errlen);
/*
** The restore step of rt_mqtt_start: opens data_dir/state.db (its store actor under
** sup: rt_store_open) and loads it.
*/
int rt_sessions_restore(rt_pid_t sup, char *err, size_t errlen);
/*
** Its last step (rtd runs the steps as stages): one listener actor per configured
** address, permanent children of the group supervisor RT_LISTENERS_GROUP (group.h)
** under sup (0: of nobody). A listener that dies listens again when restarted; the
** connections it accepted carry on.
*/
#define RT_LISTENERS_GROUP "listeners_sup"
int rt_listeners_start(rt_pid_t sup, char *err, size_t errlen);

/*
** Asks every client actor (connections and offline sessions) to check its
** subscriptions against the current ACL and end those it no longer allows
** (logged as client.acl_revoked). Call after the ACL was replaced; the checks
** run in the actors' own turns, shortly after. *asked (may be NULL) is set to
** the actors asked. Returns 0, or RT_ENOMEM (then none was asked).
*/
int rt_broker_recheck_acl(size_t *asked);

/*
** Asks the connection (or offline session) actor conn to send reply_to one
** RT_MSG_CLIENT_INFO message carrying cookie, with its subscriptions if
** with_subs. 0 once asked, RT_ENOPROC if conn is gone. An actor that exits
** before reading the query never answers: wait with a timeout (or monitor conn).
*/
int rt_client_query(rt_pid_t conn, rt_pid_t reply_to, uint64_t cookie, bool with_subs);
/* The info in an RT_MSG_CLIENT_INFO message, or NULL if m is not a whole one. */
const rt_client_info_t *rt_client_info_of(const rt_msg_t *m);
/*
** Iterates the subscriptions of a reply: start with *pos = 0; each call fills
** *out (pointing into m, valid while m is) and returns true, or false at the end
** or at a malformed entry.
*/
bool rt_client_info_subs_next(const rt_msg_t *m, size_t *pos, rt_client_sub_t *out);

/*
** Administrative disconnect: a connected client is sent DISCONNECT 0x98
** (Administrative action; MQTT 5 clients only, older ones just see the socket
** close) and its session ends whatever its expiry: subscriptions removed, the
** will published as for any close by the server, the stored session deleted.
** An offline session is ended the same way. Logged as "client.kicked".
** 0 once asked, RT_ENOPROC if conn is gone.
*/
int rt_client_kick(rt_pid_t conn);

#endif
