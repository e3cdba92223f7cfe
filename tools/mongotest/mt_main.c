/*
** rt_mongo_test: a MongoDB-wire-compatible test server backed by SQLite, for
** the MongoDB sink's tests on machines without MongoDB. See README.md.
*/
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <bson/bson.h>

#include "common.h"
#include "mt_cmd.h"
#include "mt_server.h"
#include "mt_store.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: rt_mongo_test [--host 127.0.0.1] [--port N] [--db FILE]\n"
               "  --host ADDR  address in 127.0.0.0/8 to listen on (default 127.0.0.1)\n"
               "  --port N     TCP port; 0 picks a free one (default 27017)\n"
               "  --db FILE    SQLite file that keeps the data (default: in memory)\n"
               "Prints \"listening HOST:PORT\" once ready; SIGTERM or SIGINT stops it.\n");
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *db = NULL;
    long port = 27017;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc ||
            (strcmp(arg, "--host") && strcmp(arg, "--port") && strcmp(arg, "--db"))) {
            fprintf(stderr, "rt_mongo_test: unknown or incomplete option '%s'\n", arg);
            usage(stderr);
            return 2;
        }
        const char *val = argv[++i];
        if (!strcmp(arg, "--host")) {
            host = val;
        } else if (!strcmp(arg, "--db")) {
            db = val;
        } else {
            char *end;
            errno = 0;
            port = strtol(val, &end, 10);
            if (errno || *end || end == val || port < 0 || port > 65535) {
                fprintf(stderr, "rt_mongo_test: --port needs a number in 0..65535, not '%s'\n",
                        val);
                return 2;
            }
        }
    }

    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    signal(SIGPIPE, SIG_IGN);
    /* Blocked signals are read from a signalfd, so shutdown runs in the loop, not a handler. */
    sigprocmask(SIG_BLOCK, &stop, NULL);
    int stop_fd = signalfd(-1, &stop, SFD_CLOEXEC | SFD_NONBLOCK);
    if (stop_fd < 0) {
        fprintf(stderr, "rt_mongo_test: signalfd: %s\n", strerror(errno));
        return 1;
    }

    int listen_fd, bound;
    int rc = mt_listen(host, (int)port, &listen_fd, &bound);
    if (rc == RT_EINVAL) {
        fprintf(stderr, "rt_mongo_test: --host must be an IPv4 address in 127.0.0.0/8, not '%s'\n",
                host);
        return 2;
    }
    if (rc) {
        fprintf(stderr, "rt_mongo_test: listen on %s:%ld: %s\n", host, port, strerror(-rc));
        return 1;
    }

    mt_store_t *store;
    if (mt_store_open(&store, db)) {
        fprintf(stderr, "rt_mongo_test: cannot open database %s\n", mt_store_errmsg(NULL));
        return 1;
    }
    mt_state_t st;
    mt_state_init(&st, store);

    printf("listening %s:%d\n", strcmp(host, "localhost") ? host : "127.0.0.1", bound);
    fflush(stdout);
    rc = mt_server_run(&st, listen_fd, stop_fd);
    if (rc)
        fprintf(stderr, "rt_mongo_test: event loop failed: %s\n", strerror(-rc));

    mt_state_destroy(&st);
    mt_store_close(store);
    close(listen_fd);
    close(stop_fd);
    return rc ? 1 : 0;
}
