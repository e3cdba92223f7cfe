/*
** The event loop of rt_mongo_test: one thread, epoll, non-blocking sockets.
** Requests on a connection are answered in order; a stalled reply holds back
** the connection's next request, as a slow server would.
*/
#ifndef MT_SERVER_H
#define MT_SERVER_H

#include "mt_cmd.h"

#define MT_CONNS_MAX 1024     /* open connections; more are closed on accept */
#define MT_OUT_HIGH (4 << 20) /* unsent reply bytes above which a connection is not read */

/* Binds and listens on host:port (port 0 picks one); host must be in 127.0.0.0/8. */
int mt_listen(const char *host, int port, int *fd, int *bound_port);

/*
** Serves clients on listen_fd until stop_fd (a signalfd) becomes readable.
** Returns 0, or a negative errno if epoll itself fails.
*/
int mt_server_run(mt_state_t *st, int listen_fd, int stop_fd);

#endif
