/*
** rtd's supervision groups (group.h): the one spec every group supervisor runs with,
** and the log of what supervisors do.
*/
#include <stdio.h>

#include "group.h"
#include "log.h"

static rt_sup_spec_t group_spec = {
    .strategy = RT_ONE_FOR_ONE,
    .intensity = RT_CONF_RESTART_INTENSITY,
    .period_ms = RT_CONF_RESTART_PERIOD * 1000,
    .on_event = rt_group_log_event,
};

void rt_groups_configure(const rt_conf_t *conf)
{
    group_spec.intensity = (unsigned)conf->restart_intensity;
    group_spec.period_ms = (unsigned)conf->restart_period * 1000;
}

int rt_group_start(rt_pid_t sup, const char *name, rt_restart_t restart, rt_pid_t *out)
{
    rt_child_spec_t c = {.name = name,
                         .type = &rt_supervisor_type,
                         .arg = &group_spec,
                         .restart = restart,
                         .shutdown_ms = RT_GROUP_SHUTDOWN_MS};
    return rt_supervisor_start_child(sup, &c, out);
}

int rt_group_start_one(rt_pid_t sup, const char *name, rt_restart_t restart,
                       const rt_child_spec_t *child)
{
    rt_pid_t group;
    int rc = rt_group_start(sup, name, restart, &group);
    return rc ? rc : rt_supervisor_start_child(group, child, NULL);
}

void rt_group_stop(rt_pid_t sup, const char *name)
{
    rt_pid_t group = rt_whereis(name);
    if (!group)
        return;
    /* If sup is gone, it stopped the group already, or does so now. */
    rt_supervisor_terminate_child(sup, group);
    if (rt_wait_exit(group, RT_GROUP_SHUTDOWN_MS) != 0)
        rt_log(RT_LOG_ERROR, "supervisor.stop_timeout", "supervisor=%s still running after %d ms",
               name, RT_GROUP_SHUTDOWN_MS);
}

void rt_group_log_event(const rt_sup_event_t *e, void *ud)
{
    (void)ud;
    char pid[32], old[32];
    rt_pid_text(e->pid, pid, sizeof(pid));
    rt_pid_text(e->old_pid, old, sizeof(old));
    const char *sup = e->sup_name[0] ? e->sup_name : "-";
    const char *why = rt_reason_name(e->reason);
    /* An orderly end (rtd stopping, a temporary child done) is no news. */
    rt_log_level_t ended = e->reason == RT_REASON_NORMAL || e->reason == RT_REASON_SHUTDOWN
                               ? RT_LOG_DEBUG
                               : RT_LOG_WARNING;
    switch (e->kind) {
    case RT_SUP_RESTARTED:
        rt_log(RT_LOG_WARNING, "supervisor.restart",
               "supervisor=%s child=%s reason=%s old=%s pid=%s restarts=%llu", sup, e->child, why,
               old, pid, (unsigned long long)e->restarts);
        break;
    case RT_SUP_EXITED:
        rt_log(ended, "supervisor.child_exited", "supervisor=%s child=%s reason=%s pid=%s", sup,
               e->child, why, old);
        break;
    case RT_SUP_START_FAILED:
        rt_log(RT_LOG_ERROR, "supervisor.start_failed",
               "supervisor=%s child=%s reason=%s error=%s giving up", sup, e->child, why,
               rt_strerror(e->error));
        break;
    case RT_SUP_GAVE_UP:
        rt_log(RT_LOG_ERROR, "supervisor.gave_up",
               "supervisor=%s child=%s reason=%s pid=%s more than %u restarts within %u ms, "
               "stopping its children",
               sup, e->child, why, old, e->intensity, e->period_ms);
        break;
    case RT_SUP_STOPPED:
        rt_log(ended, "supervisor.stopped", "supervisor=%s reason=%s", sup, why);
        break;
    }
}
