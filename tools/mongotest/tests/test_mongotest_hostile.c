/*
** rt_mongo_test against hostile bytes on raw sockets: garbage, lying lengths,
** unknown opcodes and flags, broken and over-deep BSON, truncated messages,
** and mutated copies of a valid request. Each bad connection must be closed
** while the server keeps answering ping on fresh ones. Also checks OP_MSG
** details the driver rarely exercises: moreToCome, checksumPresent, and
** kind 1 document sequences.
**
** Usage: test_mongotest_hostile PATH_TO_rt_mongo_test
*/
#include <arpa/inet.h>
#include <math.h>
#include <bson/bson.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "check.h"
#include "mt_spawn.h"

static mt_child_t child;
static int32_t next_id = 1;

static int connect_server(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)child.port)};
    struct timeval tv = {2, 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool send_all(int fd, const void *p, size_t len)
{
    const uint8_t *b = p;
    while (len) {
        ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
        if (n <= 0)
            return false;
        b += n;
        len -= (size_t)n;
    }
    return true;
}

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4); /* the wire is little-endian, as is every machine this runs on */
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Builds an OP_MSG with flags, body and an optional kind 1 sequence into buf; returns its size. */
static size_t build_msg(uint8_t *buf, size_t cap, uint32_t flags, const bson_t *body,
                        const char *seq_name, const bson_t *const *seq, int nseq)
{
    size_t len = 21 + body->len;
    if (len > cap)
        return 0;
    put32(buf + 4, (uint32_t)next_id++);
    put32(buf + 8, 0);
    put32(buf + 12, 2013);
    put32(buf + 16, flags);
    buf[20] = 0;
    memcpy(buf + 21, bson_get_data(body), body->len);
    if (seq_name) {
        size_t start = len;
        buf[len++] = 1;
        size_t size_at = len;
        len += 4;
        memcpy(buf + len, seq_name, strlen(seq_name) + 1);
        len += strlen(seq_name) + 1;
        for (int i = 0; i < nseq; i++) {
            memcpy(buf + len, bson_get_data(seq[i]), seq[i]->len);
            len += seq[i]->len;
        }
        put32(buf + size_at, (uint32_t)(len - start - 1));
    }
    if (flags & 1) { /* checksumPresent: the server strips the CRC-32C without checking it */
        put32(buf + len, 0);
        len += 4;
    }
    put32(buf, (uint32_t)len);
    return len;
}

/* Reads one OP_MSG reply and copies its body into reply ({} on close or timeout: false). */
static bool recv_reply(int fd, bson_t *reply)
{
    uint8_t head[16];
    bson_init(reply);
    if (recv(fd, head, 16, MSG_WAITALL) != 16)
        return false;
    uint32_t len = get32(head);
    if (len < 21 || len > (1u << 25) || get32(head + 12) != 2013)
        return false;
    uint8_t *rest = malloc(len - 16);
    bool ok = rest && recv(fd, rest, len - 16, MSG_WAITALL) == (ssize_t)(len - 16);
    bson_t body;
    ok = ok && rest[4] == 0 && bson_init_static(&body, rest + 5, len - 21);
    if (ok) {
        bson_destroy(reply);
        bson_copy_to(&body, reply);
    }
    free(rest);
    return ok;
}

/* Sends cmd on fd and returns the reply's ok (or -1 without a reply); reply kept if wanted. */
static int command(int fd, bson_t *cmd, bson_t *out)
{
    static uint8_t buf[1 << 16];
    bson_t reply;
    bson_iter_t it;
    BSON_APPEND_UTF8(cmd, "$db", "admin");
    size_t len = build_msg(buf, sizeof buf, 0, cmd, NULL, NULL, 0);
    if (!len || !send_all(fd, buf, len) || !recv_reply(fd, &reply))
        return -1;
    int ok = bson_iter_init_find(&it, &reply, "ok") ? (int)bson_iter_as_int64(&it) : -1;
    if (out)
        bson_copy_to(&reply, out);
    bson_destroy(&reply);
    return ok;
}

/* A fresh connection answers ping: the server survived whatever came before. */
static bool ping_ok(void)
{
    int fd = connect_server();
    bson_t *cmd = BCON_NEW("ping", BCON_INT32(1));
    bool ok = fd >= 0 && command(fd, cmd, NULL) == 1;
    bson_destroy(cmd);
    if (fd >= 0)
        close(fd);
    return ok;
}

/* True if the server closes fd (end of stream or reset) within the receive timeout. */
static bool closed_by_server(int fd)
{
    uint8_t b[256];
    for (;;) {
        ssize_t n = recv(fd, b, sizeof b, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return true;
        if (n < 0)
            return false; /* timeout: still open */
    }
}

/* Sends bytes on a fresh connection and checks the server hangs up and stays healthy. */
static void expect_hangup(const char *what, const void *bytes, size_t len)
{
    int fd = connect_server();
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    send_all(fd, bytes, len);
    bool closed = closed_by_server(fd);
    if (!closed)
        fprintf(stderr, "server kept the connection after: %s\n", what);
    CHECK(closed);
    close(fd);
    CHECK(ping_ok());
}

static void test_garbage(void)
{
    uint8_t junk[1000];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)rnd();
    put32(junk, 500); /* a plausible length, then noise */
    expect_hangup("random bytes", junk, sizeof junk);
}

static void test_bad_lengths(void)
{
    uint8_t h[16] = {0};
    put32(h + 12, 2013);
    put32(h, 5);
    expect_hangup("length shorter than a header", h, 16);
    put32(h, 0x80000000u);
    expect_hangup("negative length", h, 16);
    put32(h, 1u << 30); /* refused before any of it arrives */
    expect_hangup("length beyond maxMessageSizeBytes", h, 16);
}

static void test_unknown_opcode(void)
{
    uint8_t m[20] = {0};
    put32(m, 20);
    put32(m + 12, 9999);
    expect_hangup("opcode 9999", m, sizeof m);
    put32(m + 12, 2012); /* never offered in hello, so never accepted */
    expect_hangup("OP_COMPRESSED", m, sizeof m);
}

static void test_bad_op_msg(void)
{
    static uint8_t buf[4096];
    bson_t *ping = BCON_NEW("ping", BCON_INT32(1), "$db", BCON_UTF8("admin"));
    size_t len = build_msg(buf, sizeof buf, 1u << 5, ping, NULL, NULL, 0);
    expect_hangup("unknown required flag bit", buf, len);

    len = build_msg(buf, sizeof buf, 0, ping, NULL, NULL, 0);
    put32(buf + 21, ping->len + 100);
    expect_hangup("body longer than the message", buf, len);

    len = build_msg(buf, sizeof buf, 0, ping, NULL, NULL, 0);
    buf[20] = 7;
    expect_hangup("unknown section kind", buf, len);

    len = build_msg(buf, sizeof buf, 0, ping, NULL, NULL, 0);
    buf[len - 1] = 1;
    expect_hangup("body without its terminating zero", buf, len);

    len = build_msg(buf, sizeof buf, 0, ping, NULL, NULL, 0);
    put32(buf, (uint32_t)len + 50);
    int fd = connect_server();
    /* Truncated: the rest never comes and the client leaves; the server just drops it. */
    send_all(fd, buf, len);
    close(fd);
    CHECK(ping_ok());

    bson_t *insert = BCON_NEW("insert", BCON_UTF8("h"), "$db", BCON_UTF8("test"));
    const bson_t *docs[1] = {ping};
    len = build_msg(buf, sizeof buf, 0, insert, "documents", docs, 1);
    buf[len - ping->len + 4] = 0x7f; /* the type of the sequence document's first element */
    expect_hangup("bad element type in a document sequence", buf, len);
    bson_destroy(insert);
    bson_destroy(ping);
}

/* {a: {a: ... {}}} nested depth deep, plus $db. */
static bson_t *nested(int depth)
{
    bson_t *doc = bson_new();
    for (int i = 0; i < depth; i++) {
        bson_t *outer = bson_new();
        BSON_APPEND_DOCUMENT(outer, "a", doc);
        bson_destroy(doc);
        doc = outer;
    }
    BSON_APPEND_UTF8(doc, "$db", "admin");
    return doc;
}

static void test_deep_nesting(void)
{
    static uint8_t buf[8192];
    bson_t *deep = nested(300), *fine = nested(50);
    size_t len = build_msg(buf, sizeof buf, 0, deep, NULL, NULL, 0);
    expect_hangup("BSON nested 300 deep", buf, len);

    /* Within the limit it is a command like any other: "a" is not one. */
    int fd = connect_server();
    bson_t reply;
    bson_iter_t it;
    len = build_msg(buf, sizeof buf, 0, fine, NULL, NULL, 0);
    CHECK(send_all(fd, buf, len) && recv_reply(fd, &reply));
    CHECK(bson_iter_init_find(&it, &reply, "code") && bson_iter_as_int64(&it) == 59);
    bson_destroy(&reply);
    close(fd);
    bson_destroy(deep);
    bson_destroy(fine);
}

static void test_legacy_op_query(void)
{
    uint8_t m[64] = {0};
    put32(m, 40);
    put32(m + 12, 2004);
    memset(m + 20, 'x', 20);
    expect_hangup("OP_QUERY namespace without its end", m, 40);
}

/*
** Valid requests (ping, an insert with a document sequence, find, aggregate,
** delete) with a few random bytes changed: each gets a reply or a hangup,
** never a crash. Mutations that leave valid BSON reach the command handlers
** with fields of the wrong type, which is the point.
*/
static void test_mutations(void)
{
    static uint8_t base[5][1024], buf[1024];
    size_t lens[5];
    bson_t *d1 = BCON_NEW("_id", BCON_INT32(1), "v", "[", BCON_DOUBLE(1.5), "]");
    bson_t *d2 = BCON_NEW("s", BCON_UTF8("x"), "n", "{", "m", BCON_INT64(7), "}");
    const bson_t *docs[2] = {d1, d2};
    bson_t *cmds[5] = {
        BCON_NEW("ping", BCON_INT32(1), "$db", BCON_UTF8("admin"), "x", "{", "y", "[",
                 BCON_INT32(1), "]", "}"),
        BCON_NEW("insert", BCON_UTF8("mut"), "ordered", BCON_BOOL(false), "$db", BCON_UTF8("t")),
        BCON_NEW("find", BCON_UTF8("mut"), "filter", "{", "n.m", "{", "$in", "[", BCON_INT32(7),
                 BCON_UTF8("a"), "]", "}", "}", "sort", "{", "s", BCON_INT32(-1), "}", "projection",
                 "{", "s", BCON_INT32(1), "}", "batchSize", BCON_INT32(1), "$db", BCON_UTF8("t")),
        BCON_NEW("aggregate", BCON_UTF8("mut"), "pipeline", "[", "{", "$match", "{", "s",
                 BCON_UTF8("x"), "}", "}", "{", "$group", "{", "_id", BCON_INT32(1), "n", "{",
                 "$sum", BCON_INT32(1), "}", "}", "}", "]", "cursor", "{", "}", "$db",
                 BCON_UTF8("t")),
        BCON_NEW("delete", BCON_UTF8("mut"), "deletes", "[", "{", "q", "{", "_id", "{", "$gte",
                 BCON_INT32(0), "}", "}", "limit", BCON_INT32(1), "}", "]", "$db", BCON_UTF8("t")),
    };
    for (int i = 0; i < 5; i++)
        lens[i] =
            build_msg(base[i], sizeof base[i], 0, cmds[i], i == 1 ? "documents" : NULL, docs, 2);
    int rounds = (int)check_scale(1000);
    for (int r = 0; r < rounds; r++) {
        int which = (int)(rnd() % 5);
        size_t len = lens[which];
        memcpy(buf, base[which], len);
        for (int k = 0; k < 1 + (int)(rnd() % 3); k++)
            buf[rnd() % len] = (uint8_t)rnd();
        int fd = connect_server();
        if (fd < 0)
            continue;
        send_all(fd, buf, len);
        shutdown(fd, SHUT_WR); /* so a message waiting for more bytes ends at once */
        closed_by_server(fd);
        close(fd);
    }
    for (int i = 0; i < 5; i++)
        bson_destroy(cmds[i]);
    bson_destroy(d1);
    bson_destroy(d2);
    CHECK(ping_ok());
    CHECK(waitpid(child.pid, NULL, WNOHANG) == 0); /* still running */
}

/* Appends value number k of a set covering every BSON type and awkward numbers; false past it. */
static bool odd_value(bson_t *doc, const char *key, int k)
{
    bson_oid_t oid;
    bson_t sub;
    bson_oid_init_from_string(&oid, "0123456789abcdef01234567");
    switch (k) {
    case 0:
        return BSON_APPEND_UTF8(doc, key, "x");
    case 1:
        return BSON_APPEND_INT32(doc, key, -1);
    case 2:
        return BSON_APPEND_INT32(doc, key, 5);
    case 3:
        return BSON_APPEND_INT64(doc, key, INT64_MIN);
    case 4:
        return BSON_APPEND_DOUBLE(doc, key, NAN);
    case 5:
        return BSON_APPEND_DOUBLE(doc, key, 1e300);
    case 6:
        return BSON_APPEND_DOUBLE(doc, key, -0.0);
    case 7:
        return BSON_APPEND_BOOL(doc, key, true);
    case 8:
        return BSON_APPEND_NULL(doc, key);
    case 9:
        return BSON_APPEND_DOCUMENT_BEGIN(doc, key, &sub) && bson_append_document_end(doc, &sub);
    case 10:
        BSON_APPEND_DOCUMENT_BEGIN(doc, key, &sub);
        BSON_APPEND_INT32(&sub, "$gt", 1);
        return bson_append_document_end(doc, &sub);
    case 11:
        BSON_APPEND_ARRAY_BEGIN(doc, key, &sub);
        return bson_append_array_end(doc, &sub);
    case 12:
        BSON_APPEND_ARRAY_BEGIN(doc, key, &sub);
        BSON_APPEND_INT32(&sub, "0", 1);
        BSON_APPEND_UTF8(&sub, "1", "$a");
        return bson_append_array_end(doc, &sub);
    case 13: {
        bson_t el;
        BSON_APPEND_ARRAY_BEGIN(doc, key, &sub);
        BSON_APPEND_DOCUMENT_BEGIN(&sub, "0", &el);
        BSON_APPEND_INT32(&el, "$nosuch", 1);
        bson_append_document_end(&sub, &el);
        return bson_append_array_end(doc, &sub);
    }
    case 14:
        return BSON_APPEND_OID(doc, key, &oid);
    case 15:
        return BSON_APPEND_DATE_TIME(doc, key, -1);
    case 16:
        return BSON_APPEND_REGEX(doc, key, "a.*", "i");
    case 17:
        return BSON_APPEND_BINARY(doc, key, BSON_SUBTYPE_BINARY, (const uint8_t *)"ab", 2);
    case 18:
        return BSON_APPEND_MINKEY(doc, key);
    case 19:
        return BSON_APPEND_UTF8(doc, key, "");
    default:
        return false;
    }
}

/*
** Every command with each of its arguments (and its first field) replaced by
** values of every type: each request gets a reply with ok 0 or 1.
*/
static void test_type_confusion(void)
{
    static const char *const cmds[][8] = {
        {"insert", "documents", "ordered"},
        {"find", "filter", "sort", "projection", "skip", "limit", "batchSize", "singleBatch"},
        {"getMore", "collection", "batchSize"},
        {"killCursors", "cursors"},
        {"count", "query", "skip", "limit"},
        {"aggregate", "pipeline", "cursor"},
        {"delete", "deletes", "ordered"},
        {"drop"},
        {"create"},
        {"createIndexes", "indexes"},
        {"listCollections", "filter", "cursor", "nameOnly"},
        {"listDatabases", "filter"},
        {"rtFault", "n", "code"},
        {"hello", "helloOk"},
    };
    int fd = connect_server(), replies = 0, sent = 0;
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
        for (int arg = 0; arg < 8 && cmds[c][arg]; arg++) {
            for (int k = 0; k < 32; k++) {
                bson_t cmd = BSON_INITIALIZER;
                /* arg 0 confuses the first field; otherwise it is a plain collection name. */
                bool more =
                    arg ? BSON_APPEND_UTF8(&cmd, cmds[c][0], "tc") : odd_value(&cmd, cmds[c][0], k);
                if (!more) {
                    bson_destroy(&cmd);
                    break;
                }
                if (arg && !odd_value(&cmd, cmds[c][arg], k)) {
                    bson_destroy(&cmd);
                    break;
                }
                if (!strcmp(cmds[c][0], "rtFault") && arg)
                    bson_append_utf8(&cmd, "rtFault", -1, "failWrites", -1);
                if (!strcmp(cmds[c][0], "getMore") && arg)
                    BSON_APPEND_INT64(&cmd, "getMore", 12345);
                sent++;
                int ok = command(fd, &cmd, NULL);
                replies += ok == 0 || ok == 1;
                bson_destroy(&cmd);
            }
        }
    }
    CHECK(sent > 300);
    CHECK_EQ(replies, sent);
    bson_t *clear = BCON_NEW("rtFault", BCON_UTF8("clear"));
    CHECK_EQ(command(fd, clear, NULL), 1);
    bson_destroy(clear);
    close(fd);
    CHECK(ping_ok());
}

/* moreToCome writes get no reply; checksums are accepted; sequences carry documents. */
static void test_op_msg_features(void)
{
    static uint8_t buf[4096];
    int fd = connect_server();
    bson_t *insert = BCON_NEW("insert", BCON_UTF8("features"), "$db", BCON_UTF8("test"),
                              "writeConcern", "{", "w", BCON_INT32(0), "}");
    bson_t *d1 = BCON_NEW("_id", BCON_INT32(1)), *d2 = BCON_NEW("_id", BCON_INT32(2));
    const bson_t *docs[2] = {d1, d2};
    size_t len = build_msg(buf, sizeof buf, 2, insert, "documents", docs, 2);
    CHECK(send_all(fd, buf, len));

    bson_t *count = BCON_NEW("count", BCON_UTF8("features"), "$db", BCON_UTF8("test"));
    len = build_msg(buf, sizeof buf, 1, count, NULL, NULL, 0);
    bson_t reply;
    bson_iter_t it;
    CHECK(send_all(fd, buf, len) && recv_reply(fd, &reply));
    /* The first reply on the wire answers the count: the insert had none. */
    CHECK(bson_iter_init_find(&it, &reply, "n") && bson_iter_as_int64(&it) == 2);
    bson_destroy(&reply);

    bson_t *stats = BCON_NEW("rtStats", BCON_INT32(1));
    CHECK(command(fd, stats, &reply) == 1);
    CHECK(bson_iter_init_find(&it, &reply, "protocolErrors") && bson_iter_as_int64(&it) > 5);
    bson_destroy(&reply);
    close(fd);
    bson_destroy(stats);
    bson_destroy(count);
    bson_destroy(insert);
    bson_destroy(d1);
    bson_destroy(d2);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH_TO_rt_mongo_test\n", argv[0]);
        return 2;
    }
    if (mt_spawn(argv[1], 0, NULL, &child))
        return 1;
    RUN(test_garbage);
    RUN(test_bad_lengths);
    RUN(test_unknown_opcode);
    RUN(test_bad_op_msg);
    RUN(test_deep_nesting);
    RUN(test_legacy_op_query);
    RUN(test_mutations);
    RUN(test_type_confusion);
    RUN(test_op_msg_features);
    CHECK_EQ(mt_stop(&child, SIGTERM), 0);
    return CHECK_SUMMARY();
}
