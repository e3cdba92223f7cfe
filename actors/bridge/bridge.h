/*
** Bridges to other brokers (docs/BRIDGES.md), as Mosquitto's and EMQX's: each configured
** bridge is one actor holding one MQTT client connection (3.1.1 or 5) to a remote broker.
** Out: the actor subscribes here to its out filters and PUBLISHes what matches to the
** remote, the topic mapped; in: it subscribes there to its in filters and routes what comes
** here, mapped likewise. Messages out wait in the actor's queue, bounded in bytes, while
** the remote is away or slow, and go in order once it is back; one sent and not yet
** acknowledged when the connection drops is sent again (QoS 1: at least once). With
** durable set, the local publisher's PUBACK waits for the remote's.
**
** Loops: the bridge's local subscriptions are no-local (what it routes here from the
** remote does not go back out), and so are its MQTT 5 subscriptions at the remote.
*/
#ifndef RT_BRIDGE_H
#define RT_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "rt.h"

#define RT_BRIDGE_GROUP "bridge_sup"

/*
** Checks every bridge of c (their maps, the remote's address, which is resolved now) and
** starts one actor each under a group of sup. 0, or an RT_E* code with why (a setting's
** fault: RT_EINVAL).
*/
int rt_bridges_start(const rt_conf_t *c, rt_pid_t sup, char *why, size_t whylen);
/* Checks bridges without starting them (rtd --check): as rt_bridges_start. */
int rt_bridges_check(const rt_conf_t *c, char *why, size_t whylen);
void rt_bridges_free(void);

/* A bridge as rtctl bridges and the metrics show it. */
typedef struct rt_bridge_info_s {
    char name[64];
    char remote[256];
    const char *state; /* "connected", "connecting" or "disconnected" */
    uint64_t connects; /* CONNACKs that accepted the bridge */
    uint64_t failures; /* connects that failed (refused, no answer, no route) */
    uint64_t sent;     /* PUBLISHes written to the remote */
    uint64_t acked;    /* QoS 1 ones it acknowledged */
    uint64_t resent;   /* sent again after a connection dropped */
    uint64_t received; /* PUBLISHes from the remote routed here */
    uint64_t ignored;  /* PUBLISHes from the remote that no in map matched */
    uint64_t dropped;  /* messages out dropped: the queue full, or too large for the remote */
    uint64_t queued;   /* messages out held in memory now (inflight included) */
    uint64_t queued_bytes;
    uint64_t inflight;      /* sent, waiting for the PUBACK */
    uint64_t spilled;       /* QoS 1 messages out waiting in the spill file */
    uint64_t spilled_bytes; /* their bytes */
    uint64_t up_since_ms; /* wall clock of the last CONNACK, 0 while not connected */
    unsigned version, qos;
    bool durable;
    unsigned nout, nin;
    const char *out[RT_CONF_MAX_BRIDGE_MAPS], *in[RT_CONF_MAX_BRIDGE_MAPS];
    char last_error[256];
} rt_bridge_info_t;

/* Fills up to max bridges' infos; returns how many bridges there are. */
size_t rt_bridges_snapshot(rt_bridge_info_t *out, size_t max);
/*
** The bridges' spill files (data_dir/bridge-<name>.db) as paths, up to max, for `rtctl backup`;
** returns how many bridges there are. A file is there only once something was spilled.
*/
size_t rt_bridges_spill_files(char (*out)[512], char (*names)[64], size_t max);
/* Drops name's connection and connects again at once (its queue kept): 0 or RT_ENOTFOUND. */
int rt_bridge_reconnect(const char *name);

/*
** A topic map, "filter -> topic": a topic the filter matches becomes the right side, whose
** trailing "#" (a "#" level) stands for the part of the topic after the filter's fixed
** levels; a right side without "#" replaces the whole topic. A filter alone keeps the topic.
*/
typedef struct rt_bridge_map_s {
    char filter[RT_CONF_BRIDGE_MAP_LEN];
    char dest[RT_CONF_BRIDGE_MAP_LEN]; /* without its "#"; "" when the topic is kept */
    uint16_t flen, dlen;
    uint16_t fixed; /* bytes of the filter before its first wildcard level */
    bool keep;      /* no right side */
    bool tail;      /* the right side ends with "#" */
} rt_bridge_map_t;

/* Parses text into m: 0, or RT_EINVAL with why. */
int rt_bridge_map_parse(const char *text, rt_bridge_map_t *m, char *why, size_t whylen);
/*
** Maps topic if m's filter matches it: the mapped topic's length (written to out when it
** fits in cap), or -1 when the filter does not match.
*/
long rt_bridge_map_apply(const rt_bridge_map_t *m, const char *topic, size_t len, char *out,
                         size_t cap);

#endif
