/*
** rtd's supervision groups. Each layer starts its long-lived actors (sinks, rule
** workers, the store, the login verifier, listeners, $SYS, the admin socket) as the
** children of one group supervisor, registered under the group's name: one_for_one,
** restart_intensity restarts within restart_period (config.h says why those), every
** restart, exit and give-up logged. rtd starts the groups under its top supervisor;
** tests start them on their own (sup 0).
*/
#ifndef RT_GROUP_H
#define RT_GROUP_H

#include "config.h"
#include "rt.h"

/* How long a group's stop waits for its children, one after another, to finish. */
#define RT_GROUP_SHUTDOWN_MS 60000

/* Takes the intensity settings from conf; groups started later use them. */
void rt_groups_configure(const rt_conf_t *conf);
/*
** Starts group name (a static string) under sup (rt_supervisor_start_child; 0: on its
** own), with no children yet: add them with rt_supervisor_start_child(*out, ...).
** restart is how sup treats the group: RT_PERMANENT for what the broker cannot do
** without, RT_TEMPORARY for what it can. 0 or an rt_spawn error.
*/
int rt_group_start(rt_pid_t sup, const char *name, rt_restart_t restart, rt_pid_t *out);
/* A group of one child: rt_group_start, then child under it. 0 or an rt_spawn error. */
int rt_group_start_one(rt_pid_t sup, const char *name, rt_restart_t restart,
                       const rt_child_spec_t *child);
/*
** From outside any actor: stops group name (started under sup) child by child, and
** waits for it, up to RT_GROUP_SHUTDOWN_MS. A group not running is fine.
*/
void rt_group_stop(rt_pid_t sup, const char *name);
/* Logs a supervisor's event (rt_sup_spec_t.on_event). */
void rt_group_log_event(const rt_sup_event_t *e, void *ud);

#endif
