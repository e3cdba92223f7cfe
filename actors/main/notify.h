/*
** Telling systemd how rtd is doing (sd_notify(3)): a Type=notify unit is started when rtd
** says READY=1, once its listeners accept, not when the process exists; STOPPING=1 as it
** begins to stop.
*/
#ifndef RTD_NOTIFY_H
#define RTD_NOTIFY_H

/*
** Sends state ("READY=1", newline-separated KEY=VALUE lines) to the socket named in
** NOTIFY_SOCKET. 0 when sent or when there is no such variable (not started by systemd);
** -errno when it could not be sent, or RT_EINVAL for an address that is not "/path" or
** "@abstract".
*/
int rtd_notify(const char *state);

#endif
