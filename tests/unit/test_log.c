/* The log: levels, text and JSON lines, concurrent writers never interleave. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "log.h"

static char path[64];

static size_t read_all(char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    return n;
}

static void test_levels_and_text(void)
{
    unlink(path);
    CHECK_EQ(rt_log_open(path, RT_LOG_INFO, false), 0);
    rt_log(RT_LOG_DEBUG, "hidden", "not shown %d", 1);
    rt_log(RT_LOG_INFO, "client.connected", "client=%s peer=%s", "c1", "127.0.0.1:5000");
    rt_log(RT_LOG_ERROR, "listener.failed", "address in use");
    rt_log_set_level(RT_LOG_DEBUG);
    rt_log(RT_LOG_DEBUG, "shown", "now");
    char buf[4096];
    read_all(buf, sizeof(buf));
    CHECK(strstr(buf, "hidden") == NULL);
    CHECK(strstr(buf, " info client.connected client=c1 peer=127.0.0.1:5000\n") != NULL);
    CHECK(strstr(buf, " error listener.failed address in use\n") != NULL);
    CHECK(strstr(buf, " debug shown now\n") != NULL);
    CHECK(strncmp(buf, "20", 2) == 0 && buf[10] == 'T'); /* ISO 8601 UTC timestamp */
    rt_log_level_t l;
    CHECK_EQ(rt_log_parse_level("warning", &l), 0);
    CHECK_EQ(l, RT_LOG_WARNING);
    CHECK_EQ(rt_log_parse_level("loud", &l), RT_EINVAL);
    CHECK_EQ(rt_log_open("/nonexistent/dir/log", RT_LOG_INFO, false), RT_ENOTFOUND);
}

static void test_json_lines(void)
{
    unlink(path);
    CHECK_EQ(rt_log_open(path, RT_LOG_INFO, true), 0);
    rt_log(RT_LOG_WARNING, "auth.failed", "user \"bob\" from 127.0.0.1\nnext");
    char buf[4096];
    read_all(buf, sizeof(buf));
    CHECK(strstr(buf, "\"level\":\"warning\",\"event\":\"auth.failed\"") != NULL);
    CHECK(strstr(buf, "\"msg\":\"user \\\"bob\\\" from 127.0.0.1\\u000anext\"}\n") != NULL);
    CHECK_EQ(strchr(buf, '\n') - buf, (long)strlen(buf) - 1); /* one line */
}

static void *writer(void *arg)
{
    long id = (long)(intptr_t)arg;
    for (int i = 0; i < 2000; i++)
        rt_log(RT_LOG_INFO, "w", "writer=%ld line=%d %s", id, i,
               "padding-padding-padding-padding-padding-padding-padding-padding");
    return NULL;
}

static void test_concurrent_lines_whole(void)
{
    unlink(path);
    CHECK_EQ(rt_log_open(path, RT_LOG_INFO, false), 0);
    pthread_t th[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, writer, (void *)(intptr_t)i);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    FILE *f = fopen(path, "r");
    char line[512];
    long lines = 0, whole = 0;
    while (f && fgets(line, sizeof(line), f)) {
        lines++;
        whole += strstr(line, " info w writer=") != NULL && strstr(line, "padding\n") != NULL;
    }
    if (f)
        fclose(f);
    CHECK_EQ(lines, 8000);
    CHECK_EQ(whole, 8000);
}

int main(void)
{
    snprintf(path, sizeof(path), "/tmp/rt-test-log-%d.log", (int)getpid());
    RUN(test_levels_and_text);
    RUN(test_json_lines);
    RUN(test_concurrent_lines_whole);
    rt_log_close();
    unlink(path);
    return CHECK_SUMMARY();
}
