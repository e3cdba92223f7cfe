/*
** Inside the bridges: the record each bridge shares between its actor (bridge.c), which
** alone writes it but for the counters' readers, and the set of bridges (bridge_set.c),
** which makes it at start and reads it for rtctl and the metrics. Only bridge*.c include
** this.
*/
#ifndef RT_BRIDGE_IMPL_H
#define RT_BRIDGE_IMPL_H

#include <netinet/in.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "bridge.h"

typedef enum { RT_BRIDGE_DOWN = 0, RT_BRIDGE_CONNECTING, RT_BRIDGE_UP } rt_bridge_state_t;

typedef struct rt_bridge_s {
    rt_conf_bridge_t conf;
    rt_bridge_map_t out[RT_CONF_MAX_BRIDGE_MAPS], in[RT_CONF_MAX_BRIDGE_MAPS];
    unsigned nout, nin;
    char client_id[128];          /* at the remote */
    char publisher[72];           /* what the messages it routes here name as their client id */
    struct sockaddr_storage addr; /* the remote's, resolved at start */
    socklen_t addrlen;
    char regname[80]; /* "bridge:<name>", its actor's registered name */
    SSL_CTX *tls;     /* mqtts://: the client context; NULL: plain TCP */
    char spill_path[512]; /* data_dir/bridge-<name>.db */
    char tls_name[256]; /* the name verified and sent as SNI */

    _Atomic rt_pid_t pid;
    atomic_int state; /* rt_bridge_state_t */
    atomic_uint_fast64_t connects, failures, sent, acked, resent, received, ignored, dropped;
    atomic_uint_fast64_t queued, queued_bytes, inflight, up_since_ms, starts;
    atomic_uint_fast64_t spilled, spilled_bytes; /* rows in the spill file, and their bytes */
    pthread_mutex_t err_lock;
    char last_error[256];
} rt_bridge_t;

extern const rt_actor_type_t rt__bridge_type;

/* Records why the bridge's last connect or message failed ("" clears it); any thread. */
void rt__bridge_error(rt_bridge_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Asks the actor pid to drop its connection and connect again at once. */
int rt__bridge_restart(rt_pid_t pid);

#endif
