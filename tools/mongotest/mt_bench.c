/*
** rt_mongo_bench: bulk insert throughput of a MongoDB server (rt_mongo_test or
** a real one) through mongo-c-driver, the way the sink writes: batches of
** small documents, one insert command each.
**
**   rt_mongo_bench --server PATH [--db FILE] [--docs N] [--batch B]
**   rt_mongo_bench --uri mongodb://127.0.0.1:27017 [--docs N] [--batch B]
*/
#include <mongoc/mongoc.h>

#include "tests/mt_spawn.h"

/* CPU seconds (user + system) used so far by process pid, or -1 if unreadable. */
static double cpu_seconds(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    /* Fields 14 and 15 (utime, stime) follow the parenthesised command name. */
    const char *p = strrchr(buf, ')');
    unsigned long long ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    const char *uri_s = NULL, *server = NULL, *db = NULL;
    long docs = 200000, batch = 1000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--uri"))
            uri_s = argv[i + 1];
        else if (!strcmp(argv[i], "--server"))
            server = argv[i + 1];
        else if (!strcmp(argv[i], "--db"))
            db = argv[i + 1];
        else if (!strcmp(argv[i], "--docs"))
            docs = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch"))
            batch = atol(argv[i + 1]);
        else
            break;
    }
    if ((!uri_s == !server) || docs <= 0 || batch <= 0 || batch > 100000 || argc % 2 == 0) {
        fprintf(stderr, "usage: rt_mongo_bench (--uri URI | --server PATH [--db FILE])"
                        " [--docs N] [--batch B<=100000]\n");
        return 2;
    }
    mt_child_t child = {0};
    char buf[128];
    if (server) {
        if (mt_spawn(server, 0, db, &child))
            return 1;
        snprintf(buf, sizeof buf, "mongodb://127.0.0.1:%d", child.port);
        uri_s = buf;
    }

    mongoc_init();
    bson_error_t err;
    mongoc_client_t *cl = mongoc_client_new(uri_s);
    if (!cl) {
        fprintf(stderr, "rt_mongo_bench: bad URI %s\n", uri_s);
        return 2;
    }
    mongoc_collection_t *c = mongoc_client_get_collection(cl, "rt_bench", "docs");
    mongoc_collection_drop(c, NULL);

    /* Documents are built before timing, so the figure is the server's plus the driver's send. */
    bson_t **set = calloc((size_t)batch, sizeof *set);
    for (long i = 0; i < batch; i++) {
        set[i] = BCON_NEW("topic", BCON_UTF8("site/1/sensor/42/temp"), "ts",
                          BCON_DATE_TIME(1700000000000 + i), "value", BCON_DOUBLE(21.5 + i), "qos",
                          BCON_INT32(1));
    }
    double cpu0 = server ? cpu_seconds(child.pid) : -1;
    double t0 = now_sec();
    long done = 0;
    bool ok = true;
    while (ok && done < docs) {
        long n = docs - done < batch ? docs - done : batch;
        ok = mongoc_collection_insert_many(c, (const bson_t **)set, (size_t)n, NULL, NULL, &err);
        done += ok ? n : 0;
    }
    double secs = now_sec() - t0;
    double cpu = server ? cpu_seconds(child.pid) - cpu0 : -1;
    int rc = 0;
    if (!ok) {
        fprintf(stderr, "rt_mongo_bench: insert failed: %s\n", err.message);
        rc = 1;
    } else {
        int64_t n =
            mongoc_collection_count_documents(c, &(bson_t)BSON_INITIALIZER, NULL, NULL, NULL, &err);
        printf("%ld documents in batches of %ld: %.3f s, %.0f documents/s (count %lld)\n", done,
               batch, secs, done / secs, (long long)n);
        /* The server's own CPU time tells its capacity apart from the client's and the load. */
        if (cpu > 0)
            printf("server CPU %.3f s: %.0f documents per server CPU second\n", cpu, done / cpu);
        rc = n == done ? 0 : 1;
    }
    for (long i = 0; i < batch; i++)
        bson_destroy(set[i]);
    free(set);
    mongoc_collection_destroy(c);
    mongoc_client_destroy(cl);
    mongoc_cleanup();
    if (server)
        mt_stop(&child, SIGTERM);
    return rc;
}
