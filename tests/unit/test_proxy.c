/*
** The PROXY protocol header (v1 and v2: TCP over IPv4 and IPv6, LOCAL, UNKNOWN, the other
** families, TLVs, every truncation, oversized and malformed headers), address lists in
** CIDR notation, and the client behind trusted proxies in X-Forwarded-For.
*/
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "proxy.h"

static rt_auth_addr_t addr(const char *text)
{
    rt_auth_addr_t a;
    CHECK_EQ(rt_auth_addr_parse(text, &a), 0);
    return a;
}

static bool addr_is(const rt_auth_addr_t *a, const char *text)
{
    rt_auth_addr_t b = addr(text);
    return memcmp(a->b, b.b, 16) == 0;
}

static int parse(const void *buf, size_t len, size_t *used, rt_proxy_info_t *out)
{
    const char *why = NULL;
    int rc = rt_proxy_parse(buf, len, used, out, &why);
    CHECK(why != NULL);
    if (rc == RT_EPROTO)
        CHECK(why && why[0]);
    return rc;
}

/* Every proper prefix of a valid header asks for more. */
static void check_prefixes(const uint8_t *buf, size_t header_len)
{
    for (size_t cut = 0; cut < header_len; cut++) {
        size_t used = 99;
        rt_proxy_info_t info;
        int rc = parse(buf, cut, &used, &info);
        CHECK_EQ(rc, RT_EAGAIN);
        if (rc != RT_EAGAIN)
            fprintf(stderr, "  prefix of %zu bytes\n", cut);
    }
}

static int status_v1(const char *line)
{
    size_t used;
    rt_proxy_info_t info;
    return parse(line, strlen(line), &used, &info);
}

static void test_v1_valid(void)
{
    static const char *const lines[] = {
        "PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n",
        "PROXY TCP6 2001:db8::1 2001:db8::2 1234 80\r\n",
        "PROXY TCP4 0.0.0.0 255.255.255.255 0 65535\r\n",
        "PROXY TCP6 ::ffff:10.1.2.3 ::1 1 2\r\n",
        "PROXY UNKNOWN\r\n",
        "PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n",
    };
    static const char *const src[] = {"192.168.0.1", "2001:db8::1", "0.0.0.0", "10.1.2.3"};
    static const uint16_t port[] = {56324, 1234, 0, 1};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        char buf[256];
        size_t n = strlen(lines[i]);
        snprintf(buf, sizeof buf, "%s\x10\x0c", lines[i]); /* a CONNECT's first bytes follow */
        size_t used = 0;
        rt_proxy_info_t info;
        CHECK_EQ(parse(buf, n + 2, &used, &info), 0);
        CHECK_EQ(used, n);
        CHECK_EQ(info.has_addr, i < 4);
        if (i < 4) {
            CHECK(addr_is(&info.src, src[i]));
            CHECK_EQ(info.src_port, port[i]);
        }
        check_prefixes((const uint8_t *)buf, n);
    }
    /* The spec's longest line is RT_PROXY_V1_MAX bytes. */
    CHECK_EQ(strlen(lines[5]), RT_PROXY_V1_MAX);
}

static void test_v1_refused(void)
{
    static const char *const lines[] = {
        "proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY\r\n",
        "PROXY \r\n",
        "PROXY TCP4\r\n",
        "PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
        "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
        "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n",
        "PROXY  TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n",
        "PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n",
        "PROXY TCP4 256.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY TCP4 ::1 ::1 1 2\r\n",
        "PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY TCP6 2001:db8:::1 ::1 1 2\r\n",
        "PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
        "PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n",
        "PROXY TCP4 1.2.3.4 5.6.7.8 1 -2\r\n",
        "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
        "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rx",
        "PROXY TCP4\t1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY UNKNOWN\rX\n",
        "PROXY UNKNOWNX\r\n",
        "GET /mqtt HTTP/1.1\r\n",
        "\x10\x0c\x00\x04MQTT",
        /* 108 bytes: one past the longest line. */
        "PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 655355\r\n",
        /* No CRLF in time. */
        "PROXY UNKNOWN xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    };
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        int rc = status_v1(lines[i]);
        CHECK_EQ(rc, RT_EPROTO);
        if (rc != RT_EPROTO)
            fprintf(stderr, "  line %zu: %s\n", i, lines[i]);
    }
    /* A prefix that no valid line starts with is refused before its line ends. */
    static const char *const early[] = {"PROXY TCP4 1.2.3.4x",
                                        "PROXY TCP4 1.2.3.4 5.6.7.8 99999",
                                        "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 ",
                                        "PROXY TCP6 1.2.3.4 x",
                                        "PROXZ",
                                        "GE",
                                        "PROXY UDP4"};
    for (size_t i = 0; i < sizeof early / sizeof *early; i++)
        CHECK_EQ(status_v1(early[i]), RT_EPROTO);
}

/* ---- v2 ---- */

static const uint8_t sig[12] = {0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D,
                                0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A};

static size_t v2(uint8_t *out, uint8_t ver_cmd, uint8_t family, const void *body, size_t n)
{
    memcpy(out, sig, 12);
    out[12] = ver_cmd;
    out[13] = family;
    out[14] = (uint8_t)(n >> 8);
    out[15] = (uint8_t)n;
    memcpy(out + 16, body, n);
    return 16 + n;
}

static void test_v2_valid(void)
{
    uint8_t buf[8192];
    size_t used;
    rt_proxy_info_t info;

    /* TCP over IPv4: 10.1.2.3:5555 -> 10.0.0.1:1883, then two TLVs (skipped). */
    const uint8_t body4[] = {10,   1,    2,    3,    10,   0,    0,    1,    0x15, 0xB3,
                             0x07, 0x5B, 0x04, 0x00, 0x01, 0xAA, 0x20, 0x00, 0x00};
    size_t n = v2(buf, 0x21, 0x11, body4, sizeof body4);
    buf[n] = 0x10; /* the client's first byte */
    CHECK_EQ(parse(buf, n + 1, &used, &info), 0);
    CHECK_EQ(used, n);
    CHECK(info.has_addr);
    CHECK(addr_is(&info.src, "10.1.2.3"));
    CHECK_EQ(info.src_port, 5555);
    check_prefixes(buf, n);

    /* TCP over IPv6. */
    uint8_t body6[36] = {0x20,        0x01,     0x0d,        0xb8,        [15] = 0x07, [16] = 0xfe,
                         [17] = 0x80, [31] = 1, [32] = 0xC3, [33] = 0x50, [34] = 0x07, [35] = 0x5B};
    n = v2(buf, 0x21, 0x21, body6, sizeof body6);
    CHECK_EQ(parse(buf, n, &used, &info), 0);
    CHECK_EQ(used, n);
    CHECK(info.has_addr);
    CHECK(addr_is(&info.src, "2001:db8::7"));
    CHECK_EQ(info.src_port, 50000);
    check_prefixes(buf, n);

    /* LOCAL: no address, whatever the family says. */
    static const uint8_t local_families[] = {0x00, 0x11, 0x21, 0xFF};
    for (size_t i = 0; i < sizeof local_families; i++) {
        n = v2(buf, 0x20, local_families[i], body4, i == 0 ? 0 : 3);
        CHECK_EQ(parse(buf, n, &used, &info), 0);
        CHECK_EQ(used, n);
        CHECK(!info.has_addr);
        check_prefixes(buf, n);
    }

    /* UDP, UNIX and UNSPEC are accepted without an address. */
    static const struct {
        uint8_t family;
        size_t len;
    } other[] = {{0x12, 12}, {0x22, 36}, {0x31, 216}, {0x32, 216}, {0x00, 0}, {0x00, 5}};
    uint8_t body[300] = {0};
    for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
        n = v2(buf, 0x21, other[i].family, body, other[i].len + 4);
        CHECK_EQ(parse(buf, n, &used, &info), 0);
        CHECK_EQ(used, n);
        CHECK(!info.has_addr);
    }

    /* The longest header accepted: RT_PROXY_MAX bytes in all. */
    static uint8_t big_body[RT_PROXY_MAX];
    n = v2(buf, 0x21, 0x11, big_body, RT_PROXY_MAX - 16);
    CHECK_EQ(parse(buf, n, &used, &info), 0);
    CHECK_EQ(used, RT_PROXY_MAX);
    CHECK_EQ(parse(buf, n - 1, &used, &info), RT_EAGAIN);
}

static void test_v2_refused(void)
{
    uint8_t buf[8192], body[300] = {0};
    size_t used;
    rt_proxy_info_t info;
    size_t n = v2(buf, 0x21, 0x11, body, 12);

    /* A wrong signature byte is refused as soon as it has come. */
    for (size_t i = 0; i < 12; i++) {
        uint8_t bad[32];
        memcpy(bad, buf, n);
        bad[i] ^= 0x40;
        CHECK_EQ(parse(bad, n, &used, &info), RT_EPROTO);
        CHECK_EQ(parse(bad, i + 1, &used, &info), RT_EPROTO);
    }
    /* Versions and commands. */
    static const uint8_t ver_cmd[] = {0x11, 0x31, 0x01, 0xF1, 0x22, 0x2F};
    for (size_t i = 0; i < sizeof ver_cmd; i++) {
        n = v2(buf, ver_cmd[i], 0x11, body, 12);
        CHECK_EQ(parse(buf, n, &used, &info), RT_EPROTO);
        CHECK_EQ(parse(buf, 13, &used, &info), RT_EPROTO);
    }
    /* Family and transport bytes the spec does not define. */
    static const uint8_t families[] = {0x01, 0x02, 0x10, 0x13, 0x20, 0x23, 0x30, 0x33, 0x41, 0xFF};
    for (size_t i = 0; i < sizeof families; i++) {
        n = v2(buf, 0x21, families[i], body, 216);
        CHECK_EQ(parse(buf, n, &used, &info), RT_EPROTO);
        CHECK_EQ(parse(buf, 14, &used, &info), RT_EPROTO);
    }
    /* Lengths shorter than the family's addresses. */
    static const struct {
        uint8_t family;
        size_t len;
    } short_len[] = {{0x11, 11}, {0x12, 0}, {0x21, 35}, {0x22, 12}, {0x31, 215}, {0x32, 36}};
    for (size_t i = 0; i < sizeof short_len / sizeof *short_len; i++) {
        n = v2(buf, 0x21, short_len[i].family, body, short_len[i].len);
        CHECK_EQ(parse(buf, n, &used, &info), RT_EPROTO);
        CHECK_EQ(parse(buf, 16, &used, &info), RT_EPROTO);
    }
    /* Oversized: refused at the length, before the body comes. */
    static uint8_t big_body[RT_PROXY_MAX];
    n = v2(buf, 0x21, 0x11, big_body, RT_PROXY_MAX - 15);
    CHECK_EQ(parse(buf, 16, &used, &info), RT_EPROTO);
    CHECK_EQ(parse(buf, n, &used, &info), RT_EPROTO);
    buf[14] = buf[15] = 0xFF;
    CHECK_EQ(parse(buf, 16, &used, &info), RT_EPROTO);
}

/* ---- X-Forwarded-For ---- */

/* The trusted proxies as rtd.conf gives them (the loader's own address lists). */
static unsigned trusted_nets(rt_conf_net_t *out)
{
    rt_conf_t conf;
    rt_conf_defaults(&conf);
    char err[RT_CONF_ERR_LEN];
    CHECK_EQ(rt_conf_set(&conf, "anonymous_from={\"10.0.0.0/8\", \"2001:db8:1::/48\"}", err,
                         sizeof(err)),
             0);
    memcpy(out, conf.anonymous_from, conf.nanonymous_from * sizeof(out[0]));
    return conf.nanonymous_from;
}

static void test_forwarded(void)
{
    rt_conf_net_t trusted[RT_CONF_MAX_NETS];
    CHECK_EQ(trusted_nets(trusted), 2);
    rt_auth_addr_t out;
    static const struct {
        const char *xff;
        const char *client; /* NULL: none */
    } cases[] = {
        {"203.0.113.7", "203.0.113.7"},
        {"203.0.113.7, 10.0.0.1", "203.0.113.7"},
        {"203.0.113.7,10.0.0.1,10.2.2.2", "203.0.113.7"},
        /* A client may write anything on the left; only the proxies' entries count. */
        {"1.1.1.1, 203.0.113.7, 10.0.0.1", "203.0.113.7"},
        {"garbage, 203.0.113.7, 10.0.0.1", "203.0.113.7"},
        {" \t198.51.100.1 \t, 10.0.0.1 ", "198.51.100.1"},
        {"2001:db8:2::9, 2001:db8:1::1", "2001:db8:2::9"},
        {"[2001:db8:2::9]:4711, 10.0.0.1:80", "2001:db8:2::9"},
        {"[2001:db8:2::9]", "2001:db8:2::9"},
        {"203.0.113.7:5000", "203.0.113.7"},
        {"::ffff:10.0.0.1, 198.51.100.2", "198.51.100.2"},
        {"10.0.0.1", NULL},
        {"10.0.0.1, 2001:db8:1::5, 10.0.0.2", NULL},
        {"", NULL},
        {"203.0.113.7, garbage, 10.0.0.1", NULL},
        {"203.0.113.7, unknown", NULL},
        {"203.0.113.7,,10.0.0.1", NULL},
        {"203.0.113.7, 10.0.0.1,", NULL},
        {"203.0.113.7:", NULL},
        {"203.0.113.7:x", NULL},
        {"[2001:db8::1", NULL},
        {"[2001:db8::1]x", NULL},
        {"[2001:db8::1]:", NULL},
        {"[1.2.3.4]", NULL},
        {"2001:db8:2::9:::", NULL},
        {"203.0.113.7 10.0.0.1", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bool found = rt_forwarded_client(cases[i].xff, trusted, 2, &out);
        CHECK_EQ(found, cases[i].client != NULL);
        if (found != (cases[i].client != NULL))
            fprintf(stderr, "  case %zu: '%s'\n", i, cases[i].xff);
        if (found && cases[i].client)
            CHECK(addr_is(&out, cases[i].client));
    }
    /* With nothing trusted, the rightmost entry is the client. */
    CHECK(rt_forwarded_client("203.0.113.7, 10.0.0.1", trusted, 0, &out));
    CHECK(addr_is(&out, "10.0.0.1"));
}

int main(void)
{
    RUN(test_v1_valid);
    RUN(test_v1_refused);
    RUN(test_v2_valid);
    RUN(test_v2_refused);
    RUN(test_forwarded);
    return CHECK_SUMMARY();
}
