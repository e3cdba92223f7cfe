/*
** The log: levels; logfmt lines any strict parser splits, whatever the values hold; JSON
** lines with the same keys; conversions; cut values and lines; reopening the file; the
** journal's priority prefixes; concurrent writers never interleave.
*/
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "log.h"

static char path[64];

static size_t read_all(const char *p, char *buf, size_t cap)
{
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    return n;
}

/* ---- A strict logfmt parser: key=value pairs split by one space, a line each ---- */

#define PAIRS_MAX 64
typedef struct {
    char key[64];
    char value[8192]; /* decoded */
    size_t len;
} pair_t;

static pair_t pairs[PAIRS_MAX];

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Decodes a JSON string's inside from *p up to its closing quote; -1 if malformed. */
static int unquote(const char **p, pair_t *o)
{
    const char *s = *p;
    o->len = 0;
    for (; *s != '"'; s++) {
        if ((unsigned char)*s < 0x20 || o->len + 4 >= sizeof(o->value))
            return -1;
        if (*s != '\\') {
            o->value[o->len++] = *s;
            continue;
        }
        s++;
        const char *simple = strchr("\"\\/bfnrt", *s);
        if (*s && simple) {
            static const char to[] = "\"\\/\b\f\n\r\t";
            o->value[o->len++] = to[simple - "\"\\/bfnrt"];
        } else if (*s == 'u') {
            int cp = 0;
            for (int i = 1; i <= 4; i++) {
                int h = hexval(s[i]);
                if (h < 0)
                    return -1;
                cp = cp * 16 + h;
            }
            s += 4;
            if (cp >= 0xd800 && cp < 0xe000)
                return -1;
            if (cp < 0x80) {
                o->value[o->len++] = (char)cp;
            } else if (cp < 0x800) {
                o->value[o->len++] = (char)(0xc0 | cp >> 6);
                o->value[o->len++] = (char)(0x80 | (cp & 0x3f));
            } else {
                o->value[o->len++] = (char)(0xe0 | cp >> 12);
                o->value[o->len++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                o->value[o->len++] = (char)(0x80 | (cp & 0x3f));
            }
        } else {
            return -1;
        }
    }
    *p = s + 1;
    return 0;
}

/* The pairs of one line (ending at its newline); -1 when it is not strict logfmt. */
static int parse_logfmt(const char *line)
{
    int n = 0;
    const char *s = line;
    while (*s != '\n') {
        if (n == PAIRS_MAX || !*s || (n && *s++ != ' '))
            return -1;
        pair_t *o = &pairs[n++];
        size_t k = 0;
        if (*s < 'a' || *s > 'z')
            return -1;
        while ((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '.')
            if (k + 1 < sizeof(o->key))
                o->key[k++] = *s++;
            else
                return -1;
        o->key[k] = 0;
        if (*s++ != '=')
            return -1;
        if (*s == '"') {
            s++;
            if (unquote(&s, o) != 0)
                return -1;
        } else {
            o->len = 0;
            while ((unsigned char)*s > ' ' && *s != '=' && *s != '"' && *s != '\\' && *s != 0x7f)
                o->value[o->len++] = *s++;
            if (!o->len)
                return -1;
        }
        o->value[o->len] = 0;
    }
    return n;
}

static const pair_t *find(int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (strcmp(pairs[i].key, key) == 0)
            return &pairs[i];
    return NULL;
}

/* The value of key in the line (decoded), or NULL. */
static const char *value_of(const char *line, const char *key)
{
    int n = parse_logfmt(line);
    const pair_t *p = n > 0 ? find(n, key) : NULL;
    return p ? p->value : NULL;
}

/* The file's last line (without its newline kept in buf). */
static const char *last_line(char *buf, size_t cap)
{
    size_t n = read_all(path, buf, cap);
    if (n < 2)
        return "";
    size_t i = n - 1;
    while (i > 0 && buf[i - 1] != '\n')
        i--;
    return buf + i;
}

static void reopen(bool json)
{
    unlink(path);
    CHECK_EQ(rt_log_open(path, RT_LOG_INFO, json), 0);
}

/* ---- Tests ---- */

static void test_levels_and_fields(void)
{
    reopen(false);
    rt_log(RT_LOG_DEBUG, "hidden", "not shown %d", 1);
    rt_log(RT_LOG_INFO, "client.connected", "client=%s peer=%s", "c1", "127.0.0.1:5000");
    rt_log(RT_LOG_ERROR, "listener.failed", "address in use");
    rt_log_set_level(RT_LOG_DEBUG);
    rt_log(RT_LOG_DEBUG, "shown", "now");
    char buf[4096];
    read_all(path, buf, sizeof(buf));
    CHECK(strstr(buf, "hidden") == NULL);
    CHECK(strncmp(buf, "ts=20", 5) == 0 && buf[13] == 'T'); /* ISO 8601 UTC, milliseconds */
    CHECK(strstr(buf, "Z level=info event=client.connected client=c1 peer=127.0.0.1:5000\n"));
    CHECK(strstr(buf, " level=error event=listener.failed msg=\"address in use\"\n"));
    CHECK(strstr(buf, " level=debug event=shown msg=now\n"));
    for (char *l = buf; *l; l = strchr(l, '\n') + 1)
        CHECK_EQ(parse_logfmt(l), strstr(l, "peer=") ? 5 : 4);
    rt_log_level_t l;
    CHECK_EQ(rt_log_parse_level("warning", &l), 0);
    CHECK_EQ(l, RT_LOG_WARNING);
    CHECK_EQ(rt_log_parse_level("loud", &l), RT_EINVAL);
    CHECK_EQ(rt_log_open("/nonexistent/dir/log", RT_LOG_INFO, false), RT_ENOTFOUND);
    rt_log_set_level(RT_LOG_INFO);
}

/* What issue 28 found: a client id with spaces, quotes and '=' made a line no parser splits. */
static void test_values_from_clients_are_quoted(void)
{
    reopen(false);
    const char *id = "id with \"quotes\" and=equals";
    rt_log(RT_LOG_INFO, "client.connected", "client=%s user=%s peer=%s:%d", id, "", "::1", 7);
    char buf[4096];
    const char *line = last_line(buf, sizeof(buf));
    CHECK(strstr(line, "client=\"id with \\\"quotes\\\" and=equals\" user=\"\" peer=::1:7\n"));
    CHECK_EQ(parse_logfmt(line), 6);
    CHECK(strcmp(value_of(line, "client"), id) == 0);
    CHECK(strcmp(value_of(line, "user"), "") == 0);

    /* Control characters, a backslash, DEL; UTF-8 bare; bytes that are not UTF-8: U+FFFD. */
    rt_log(RT_LOG_INFO, "e", "a=%s b=%s c=%s d=%s", "x\ny\tz\r\x01", "back\\slash\x7f",
           "caf\xc3\xa9", "bad\xff\xc3(\xed\xa0\x80");
    line = last_line(buf, sizeof(buf));
    CHECK(strstr(line, " a=\"x\\ny\\tz\\r\\u0001\" b=\"back\\\\slash\\u007f\" c=caf\xc3\xa9 "
                       "d=\"bad\\ufffd\\ufffd(\\ufffd\\ufffd\\ufffd\"\n"));
    CHECK(strcmp(value_of(line, "a"), "x\ny\tz\r\x01") == 0);
    CHECK(strcmp(value_of(line, "d"), "bad\xef\xbf\xbd\xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd"
                                      "\xef\xbf\xbd") == 0);

    /* A value cannot make a key: "k=v" from a client is the value of the format's key. */
    rt_log(RT_LOG_INFO, "e", "topic=%s", "x level=error event=forged");
    line = last_line(buf, sizeof(buf));
    CHECK_EQ(parse_logfmt(line), 4);
    CHECK(strcmp(value_of(line, "level"), "info") == 0);
    CHECK(strcmp(value_of(line, "topic"), "x level=error event=forged") == 0);
}

/* Words that are not key=value are the message, in order, whatever lies between them. */
static void test_message_words(void)
{
    reopen(false);
    rt_log(RT_LOG_WARNING, "client.ack_unconfirmed",
           "client=%s packet_id=%u closing, so that the client sends it again: %s", "c 1", 7u,
           "why \"not\"");
    char buf[4096];
    const char *line = last_line(buf, sizeof(buf));
    CHECK_EQ(parse_logfmt(line), 6);
    CHECK(strcmp(value_of(line, "client"), "c 1") == 0);
    CHECK(strcmp(value_of(line, "packet_id"), "7") == 0);
    CHECK(strcmp(value_of(line, "msg"), "closing, so that the client sends it again: why "
                                        "\"not\"") == 0);
    /* A key is literal text: "%s=..." is a message word; reserved keys are too. */
    rt_log(RT_LOG_INFO, "e", "%s=1 level=x ok=1 (a=b)", "k");
    line = last_line(buf, sizeof(buf));
    CHECK_EQ(parse_logfmt(line), 5);
    CHECK(strcmp(value_of(line, "msg"), "k=1 level=x (a=b)") == 0);
    CHECK(strcmp(value_of(line, "level"), "info") == 0);
    CHECK(strcmp(value_of(line, "ok"), "1") == 0);
}

static void test_conversions(void)
{
    reopen(false);
    const char not_terminated[3] = {'a', 'b', 'c'};
    rt_log(RT_LOG_INFO, "e",
           "a=%.*s b=%5d c=%-3s| d=%lld e=%hhu f=%zu g=%% h=%c i=%x j=%.1f k=%llu l=%*d m=%.2s "
           "n=%ld o=%" PRId64 " p=%hd",
           2, not_terminated, 42, "x", -5LL, (unsigned char)200, (size_t)12345, 'q', 255u, 2.25,
           18446744073709551615ULL, 4, 9, "xyz", -7L, (int64_t)-9, (short)-3);
    char buf[4096];
    const char *line = last_line(buf, sizeof(buf));
    CHECK_EQ(parse_logfmt(line), 19);
    CHECK(strcmp(value_of(line, "a"), "ab") == 0);
    CHECK(strcmp(value_of(line, "b"), "   42") == 0);
    CHECK(strcmp(value_of(line, "c"), "x  |") == 0);
    CHECK(strcmp(value_of(line, "d"), "-5") == 0);
    CHECK(strcmp(value_of(line, "e"), "200") == 0);
    CHECK(strcmp(value_of(line, "f"), "12345") == 0);
    CHECK(strcmp(value_of(line, "g"), "%") == 0);
    CHECK(strcmp(value_of(line, "h"), "q") == 0);
    CHECK(strcmp(value_of(line, "i"), "ff") == 0);
    CHECK(strcmp(value_of(line, "j"), "2.2") == 0 || strcmp(value_of(line, "j"), "2.3") == 0);
    CHECK(strcmp(value_of(line, "k"), "18446744073709551615") == 0);
    CHECK(strcmp(value_of(line, "l"), "   9") == 0);
    CHECK(strcmp(value_of(line, "m"), "xy") == 0);
    CHECK(strcmp(value_of(line, "n"), "-7") == 0);
    CHECK(strcmp(value_of(line, "o"), "-9") == 0);
    CHECK(strcmp(value_of(line, "p"), "-3") == 0);
}

static void test_json_lines(void)
{
    reopen(true);
    rt_log(RT_LOG_WARNING, "client.auth_failed",
           "user=%s reason=%s delay_ms=%u ms=%.1f peer=%s:%d hex=%x wide=%3d %s", "bob \"b\"\n",
           "bad_password", 100u, 1.5, "::1", 8, 255u, 7, "from \\here");
    char buf[4096];
    const char *line = last_line(buf, sizeof(buf));
    CHECK(strncmp(line, "{\"ts\":\"20", 9) == 0);
    CHECK(strstr(line, "Z\",\"level\":\"warning\",\"event\":\"client.auth_failed\","
                       "\"user\":\"bob \\\"b\\\"\\n\",\"reason\":\"bad_password\","
                       "\"delay_ms\":100,\"ms\":1.5,\"peer\":\"::1:8\",\"hex\":\"ff\","
                       "\"wide\":\"  7\",\"msg\":\"from \\\\here\"}\n"));
    CHECK_EQ(strchr(line, '\n') - line, (long)strlen(line) - 1); /* one line */
    rt_log(RT_LOG_INFO, "e", "nan=%f neg=%d big=%llu", 0.0 / 0.0, -3, 1ULL << 63);
    line = last_line(buf, sizeof(buf));
    CHECK(strstr(line, "\"nan\":\"") && strstr(line, "\"neg\":-3,\"big\":9223372036854775808}\n"));
}

/* Any value, any bytes: the line parses; UTF-8 values come back as they went in. */
static void test_random_values_parse(void)
{
    reopen(false);
    static const char alphabet[] = " =\"\\\n\t\x01\x7f\xc3\xa9\xff\xe2\x82\xac%az09.:";
    char value[80], buf[4096];
    int bad = 0, mismatched = 0;
    for (int i = 0; i < 3000; i++) {
        size_t n = rnd() % 64;
        for (size_t j = 0; j < n; j++)
            value[j] = alphabet[rnd() % (sizeof(alphabet) - 1)];
        value[n] = 0;
        reopen(false); /* one line in the file: last_line reads it whole */
        rt_log(RT_LOG_INFO, "fuzz", "v=%s %s", value, value);
        const char *line = last_line(buf, sizeof(buf));
        int np = parse_logfmt(line);
        bad += np < 4;
        bool utf8 = true;
        for (size_t j = 0; j < n; j++)
            if ((unsigned char)value[j] == 0xff ||
                ((unsigned char)value[j] >= 0x80 &&
                 !(j + 1 < n && (unsigned char)value[j] == 0xc3 &&
                   (unsigned char)value[j + 1] == 0xa9)))
                utf8 = false, j = n;
        if (np >= 4 && utf8 && strcmp(value_of(line, "v"), value) != 0)
            mismatched++;
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(mismatched, 0);
}

/* A value past RT_LOG_VALUE_MAX is cut; a line past RT_LOG_LINE_MAX loses its last fields. */
static void test_long_values_and_lines(void)
{
    static char big[3 * RT_LOG_VALUE_MAX], buf[16384];
    memset(big, 'x', sizeof(big) - 1);
    reopen(false);
    rt_log(RT_LOG_INFO, "e", "a=%s b=1", big);
    const char *line = last_line(buf, sizeof(buf));
    CHECK_EQ(parse_logfmt(line), 5);
    CHECK_EQ(strlen(value_of(line, "a")), RT_LOG_VALUE_MAX + 3);
    CHECK(strcmp(value_of(line, "b"), "1") == 0);
    /* Control characters grow six-fold when escaped: the line is cut, and still parses. */
    memset(big, 1, sizeof(big) - 1);
    for (int json = 0; json < 2; json++) {
        reopen(json);
        rt_log(RT_LOG_INFO, "e", "a=%s b=%s c=%s d=%s e=%s", big, big, big, big, big);
        line = last_line(buf, sizeof(buf));
        CHECK(strlen(line) <= RT_LOG_LINE_MAX);
        if (json) {
            CHECK(strstr(line, "...\",\"truncated\":true}\n") != NULL);
        } else {
            int n = parse_logfmt(line);
            CHECK(n == 5 && strcmp(pairs[n - 1].key, "truncated") == 0);
            CHECK(strcmp(value_of(line, "a") + strlen(value_of(line, "a")) - 3, "...") == 0);
        }
    }
}

static void test_reopen_after_rotation(void)
{
    reopen(false);
    rt_log(RT_LOG_INFO, "before", "n=1");
    char rotated[80], buf[4096];
    snprintf(rotated, sizeof(rotated), "%s.1", path);
    CHECK_EQ(rename(path, rotated), 0);
    rt_log(RT_LOG_INFO, "still_old", "n=2");
    CHECK_EQ(rt_log_reopen(), 0);
    rt_log(RT_LOG_INFO, "after", "n=3");
    read_all(rotated, buf, sizeof(buf));
    CHECK(strstr(buf, "event=before") && strstr(buf, "event=still_old") && !strstr(buf, "after"));
    read_all(path, buf, sizeof(buf));
    CHECK(strstr(buf, "event=after") && !strstr(buf, "before"));
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    /* A directory that went away: the old file stays in use. */
    char dir[80], inside[96];
    snprintf(dir, sizeof(dir), "%s.d", path);
    mkdir(dir, 0700);
    snprintf(inside, sizeof(inside), "%s/log", dir);
    CHECK_EQ(rt_log_open(inside, RT_LOG_INFO, false), 0);
    unlink(inside);
    rmdir(dir);
    CHECK_EQ(rt_log_reopen(), RT_ENOTFOUND);
    rt_log(RT_LOG_INFO, "kept", "n=4"); /* to the unlinked file: no crash, no error */
    unlink(rotated);
}

/* Under systemd, stderr is the journal's stream and each line says its priority. */
static void test_priority_prefix(void)
{
    char err_path[80], buf[4096];
    snprintf(err_path, sizeof(err_path), "%s.stderr", path);
    int saved = dup(STDERR_FILENO);
    FILE *f = fopen(err_path, "w");
    dup2(fileno(f), STDERR_FILENO);
    rt_log_close(); /* to stderr */
    rt_log_set_priority_prefix(true);
    rt_log(RT_LOG_ERROR, "a", "n=1");
    rt_log(RT_LOG_WARNING, "b", "n=2");
    rt_log(RT_LOG_INFO, "c", "n=3");
    CHECK_EQ(rt_log_open(NULL, RT_LOG_DEBUG, true), 0);
    rt_log(RT_LOG_DEBUG, "d", "n=4");
    struct stat st;
    fstat(STDERR_FILENO, &st);
    char js[64];
    snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    setenv("JOURNAL_STREAM", js, 1);
    CHECK(rt_log_stderr_is_journal());
    setenv("JOURNAL_STREAM", "1:2", 1);
    CHECK(!rt_log_stderr_is_journal());
    unsetenv("JOURNAL_STREAM");
    CHECK(!rt_log_stderr_is_journal());
    rt_log_set_priority_prefix(false);
    dup2(saved, STDERR_FILENO);
    close(saved);
    fclose(f);
    read_all(err_path, buf, sizeof(buf));
    CHECK(strncmp(buf, "<3>ts=", 6) == 0);
    CHECK(strstr(buf, "\n<4>ts=") && strstr(buf, "\n<6>ts=") && strstr(buf, "\n<7>{\"ts\":"));
    unlink(err_path);
}

static void *writer(void *arg)
{
    long id = (long)(intptr_t)arg;
    for (int i = 0; i < 2000; i++)
        rt_log(RT_LOG_INFO, "w", "writer=%ld line=%d pad=%s", id, i,
               "padding padding padding padding padding padding padding padding");
    return NULL;
}

static void test_concurrent_lines_whole(void)
{
    reopen(false);
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
        whole += parse_logfmt(line) == 6 && strstr(line, " event=w writer=") != NULL;
    }
    if (f)
        fclose(f);
    CHECK_EQ(lines, 8000);
    CHECK_EQ(whole, 8000);
}

int main(void)
{
    snprintf(path, sizeof(path), "/tmp/rt-test-log-%d.log", (int)getpid());
    RUN(test_levels_and_fields);
    RUN(test_values_from_clients_are_quoted);
    RUN(test_message_words);
    RUN(test_conversions);
    RUN(test_json_lines);
    RUN(test_random_values_parse);
    RUN(test_long_values_and_lines);
    RUN(test_reopen_after_rotation);
    RUN(test_priority_prefix);
    RUN(test_concurrent_lines_whole);
    rt_log_close();
    unlink(path);
    return CHECK_SUMMARY();
}
