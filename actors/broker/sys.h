/*
** The $SYS tree: one actor that publishes the broker's counters as retained
** messages under $SYS/broker/ every sys_interval seconds, with Mosquitto's
** topic names, so `mosquitto_sub -t '$SYS/#' -v` and dashboards made for
** Mosquitto read them. A topic is published when its value changes (the first
** time always), like Mosquitto. Subscribers to `#` or `+/...` never see them
** (MQTT 4.7.2: wildcards at the first level do not match topics starting with $).
**
** Topics (all under $SYS/broker/):
**   version, uptime ("N seconds")
**   clients/connected, clients/disconnected (persistent sessions offline),
**   clients/maximum (peak of connected since start), clients/total (sessions)
**   messages/received, messages/sent (PUBLISH packets), messages/dropped, messages/expired
**   bytes/received, bytes/sent, bad_packets, limits/topic|subscriptions|retained
**   tolerated/v31_subscribe_flags (MQTT 3.1 (UN)SUBSCRIBEs with flags 0000, accepted)
**   subscriptions/count, shared_subscriptions/count, retained messages/count
**   heap/current, heap/maximum (bytes the runtime accounts: see heap_bytes in sys.c)
**   connections/accepted, connections/sockets (open now),
**   connections/refused/total|max_connections|per_ip|rate|error (the listener's limits)
**   load/{messages/received,messages/sent,bytes/received,bytes/sent,connections,sockets}/
**       {1min,5min,15min}: per-minute rates, decayed as Mosquitto does
**
** The actor reads only atomics and the trie's and retained store's counters
** (rt_retained_stats takes the store's read lock for three loads); it holds no
** lock of its own and blocks nothing.
*/
#ifndef RT_SYS_H
#define RT_SYS_H

#include "config.h"
#include "rt.h"

#define RT_SYS_NAME "sys"      /* the actor's registered name */
#define RT_SYS_GROUP "sys_sup" /* its supervisor's (group.h) */

/*
** Starts the $SYS actor if conf->sys_interval > 0 (0 with nothing started
** otherwise). version (a static string) is published as "rtd version <version>".
** The actor is the permanent child of the group supervisor RT_SYS_GROUP, a temporary
** child of sup (0: of nobody): the broker serves without $SYS, so a $SYS that keeps
** dying is given up on alone. Call after rt_broker_init; rt_shutdown stops the actor
** like any other.
*/
int rt_sys_start(const rt_conf_t *conf, const char *version, rt_pid_t sup);

#endif
