/*
** JIDs (actors/xmpp/jid.c): RFC 7622 §3.5's examples, valid and invalid, with what
** stringprep (ejabberd's and Prosody's preparation, and ours) makes of those where PRECIS
** differs; part lengths, the domainpart's dots, A-labels and IP literals; the ASCII path
** against libidn's; preparing twice; the compact form, its comparisons and its copy on an
** actor's heap.
*/
#include <string.h>

#include "jid.h"
#include "rt_test.h"

/* Prepares in; true when it succeeds with exactly want (NULL: expects a refusal). */
static bool prep_is(const char *in, const char *want)
{
    rt_jid_buf_t b;
    const char *why = NULL;
    int rc = rt_jid_prep(in, strlen(in), &b, &why);
    if (!want) {
        if (rc == 0)
            fprintf(stderr, "  accepted %s as %s\n", in, b.jid.s);
        return rc == RT_EINVAL && why && *why;
    }
    if (rc != 0) {
        fprintf(stderr, "  refused %s: %s\n", in, why);
        return false;
    }
    if (strcmp(b.jid.s, want) != 0 || rt_jid_len(&b.jid) != strlen(want)) {
        fprintf(stderr, "  %s became %s, not %s\n", in, b.jid.s, want);
        return false;
    }
    return true;
}

static void test_rfc7622_valid_examples(void)
{
    /* RFC 7622 §3.5.1, each as stringprep prepares it. */
    CHECK(prep_is("juliet@example.com", "juliet@example.com"));
    CHECK(prep_is("juliet@example.com/foo", "juliet@example.com/foo"));
    CHECK(prep_is("juliet@example.com/foo bar", "juliet@example.com/foo bar"));
    CHECK(prep_is("juliet@example.com/foo@bar", "juliet@example.com/foo@bar"));
    CHECK(prep_is("foo\\20bar@example.com", "foo\\20bar@example.com"));
    CHECK(prep_is("fussball@example.com", "fussball@example.com"));
    CHECK(prep_is("π@example.com", "π@example.com"));
    CHECK(prep_is("Σ@example.com/foo", "σ@example.com/foo"));
    CHECK(prep_is("σ@example.com/foo", "σ@example.com/foo"));
    CHECK(prep_is("king@example.com/♚", "king@example.com/♚"));
    CHECK(prep_is("example.com", "example.com"));
    CHECK(prep_is("example.com/foobar", "example.com/foobar"));
    CHECK(prep_is("a.example.com/b@example.net", "a.example.com/b@example.net"));
    /* Where PRECIS (RFC 7622) and stringprep part: stringprep's full case folding makes
       "fußball" "fussball" and final sigma a sigma, where PRECIS keeps both apart. */
    CHECK(prep_is("fußball@example.com", "fussball@example.com"));
    CHECK(prep_is("ς@example.com/foo", "σ@example.com/foo"));
}

static void test_rfc7622_invalid_examples(void)
{
    /* RFC 7622 §3.5.2 */
    CHECK(prep_is("\"juliet\"@example.com", NULL));
    CHECK(prep_is("foo bar@example.com", NULL));
    CHECK(prep_is("@example.com/", NULL));
    CHECK(prep_is("juliet@", NULL));
    CHECK(prep_is("/foobar", NULL));
    /* Two that PRECIS refuses and nodeprep takes: a compatibility character (U+2163 ROMAN
       NUMERAL FOUR, NFKC "IV", then folded) and a symbol in a localpart. ejabberd and
       Prosody accept both the same way, and a JID here must equal theirs. */
    CHECK(prep_is("henryⅣ@example.com", "henryiv@example.com"));
    CHECK(prep_is("♚@example.com", "♚@example.com"));
}

static void test_splitting(void)
{
    CHECK(prep_is("", NULL));
    CHECK(prep_is("@", NULL));
    CHECK(prep_is("/", NULL));
    CHECK(prep_is("juliet@example.com/", NULL)); /* an empty resourcepart */
    CHECK(prep_is("juliet@@example.com", NULL)); /* the domainpart holds the second @ */
    CHECK(prep_is("juliet@example.com/a/b", "juliet@example.com/a/b")); /* from the first / */
    CHECK(prep_is("example.com/juliet@x", "example.com/juliet@x"));
    CHECK(prep_is("a/b@c", "a/b@c")); /* an @ after the first / is the resource's */
    CHECK(prep_is("Juliet@Example.COM/Balcony", "juliet@example.com/Balcony"));
    CHECK(prep_is("juliet@exam\\ple.com", NULL));
    CHECK(prep_is("jul:iet@example.com", NULL));
    CHECK(prep_is("jul'iet@example.com", NULL));
    CHECK(prep_is("jul<iet@example.com", NULL));
    CHECK(prep_is("jul&iet@example.com", NULL));
    CHECK(prep_is("juliet@example.com/a\tb", NULL)); /* a control in the resourcepart */
    /* Non-ASCII spaces: NFKC makes NO-BREAK SPACE a space, which a resourcepart may hold;
       OGHAM SPACE MARK has no such mapping and is prohibited (RFC 3454 C.1.2). */
    CHECK(prep_is("juliet@example.com/a\xc2\xa0z", "juliet@example.com/a z"));
    CHECK(prep_is("juliet@example.com/a\xe1\x9a\x80z", NULL));
    CHECK(prep_is("ju\xcc\x81liet@example.com", "j\xc3\xbaliet@example.com")); /* NFKC */
    CHECK(prep_is("\xff@example.com", NULL));
    CHECK(prep_is("juliet@example.com/\xed\xa0\x80", NULL)); /* a UTF-16 surrogate */
    rt_jid_buf_t b;
    const char *why = NULL;
    CHECK_EQ(rt_jid_prep("a\0b@example.com", 15, &b, &why), RT_EINVAL);
    CHECK(why && strstr(why, "localpart")); /* U+0000 is a control nodeprep prohibits */
    CHECK_EQ(rt_jid_prep("example.com/a\0", 14, &b, &why), RT_EINVAL);
}

static void test_domainpart(void)
{
    CHECK(prep_is("juliet@example.com.", "juliet@example.com")); /* the final dot goes */
    CHECK(prep_is("juliet@example.com..", NULL));
    CHECK(prep_is("juliet@.example.com", NULL));
    CHECK(prep_is("juliet@a..b", NULL));
    CHECK(prep_is("juliet@.", NULL));
    CHECK(prep_is("juliet@exa_mple.com", NULL)); /* STD3: letters, digits, hyphens */
    CHECK(prep_is("juliet@-example.com", NULL));
    CHECK(prep_is("juliet@example-.com", NULL));
    CHECK(prep_is("juliet@ex--ample.com", "juliet@ex--ample.com"));
    CHECK(prep_is("juliet@192.168.0.1", "juliet@192.168.0.1"));
    /* IDNA: U-labels kept (lower case), A-labels turned into them, ideographic dots. */
    CHECK(prep_is("juliet@bücher.example", "juliet@bücher.example"));
    CHECK(prep_is("juliet@BÜCHER.Example", "juliet@bücher.example"));
    CHECK(prep_is("juliet@xn--bcher-kva.example", "juliet@bücher.example"));
    CHECK(prep_is("juliet@XN--BCHER-KVA.example", "juliet@bücher.example"));
    CHECK(prep_is("juliet@bücher。example", "juliet@bücher.example"));
    CHECK(prep_is("juliet@bücher．example", "juliet@bücher.example"));
    CHECK(prep_is("juliet@xn--zz.example", NULL));   /* no punycode: no U-label to keep */
    CHECK(prep_is("juliet@xn--abc-.example", NULL)); /* STD3: a hyphen at the end */
    CHECK(prep_is("juliet@b\303\274cher.example/r", "juliet@bücher.example/r"));
    /* IPv6 literals, in their canonical text. */
    CHECK(prep_is("juliet@[::1]/r", "juliet@[::1]/r"));
    CHECK(prep_is("[0:0:0:0:0:0:0:1]", "[::1]"));
    CHECK(prep_is("[2001:DB8::1]", "[2001:db8::1]"));
    CHECK(prep_is("[::1", NULL));
    CHECK(prep_is("[example.com]", NULL));
    CHECK(prep_is("[]", NULL));
}

/* A string of n copies of c. */
static char *repeat(char *buf, char c, size_t n)
{
    memset(buf, c, n);
    buf[n] = 0;
    return buf;
}

static void test_part_lengths(void)
{
    static char text[4 * RT_JID_PART_MAX], part[RT_JID_PART_MAX + 2];
    /* Each part up to 1023 bytes (RFC 7622 §3.1), the three together 3071. */
    char label[64];
    repeat(label, 'd', 63);
    size_t n = 0;
    while (n + 64 <= RT_JID_PART_MAX) /* labels of 63 and dots: a 1023-byte domainpart */
        n += (size_t)sprintf(part + n, "%s.", label);
    n += (size_t)sprintf(part + n, "%.*s", (int)(RT_JID_PART_MAX - n), label);
    CHECK_EQ(n, RT_JID_PART_MAX);
    char local[RT_JID_PART_MAX + 2], res[RT_JID_PART_MAX + 2];
    repeat(local, 'l', RT_JID_PART_MAX);
    repeat(res, 'r', RT_JID_PART_MAX);
    snprintf(text, sizeof(text), "%s@%s/%s", local, part, res);
    CHECK_EQ(strlen(text), RT_JID_TEXT_MAX);
    CHECK(prep_is(text, text));
    rt_jid_buf_t b;
    const char *why;
    CHECK_EQ(rt_jid_prep(text, strlen(text), &b, &why), 0);
    CHECK_EQ(b.jid.local, RT_JID_PART_MAX);
    CHECK_EQ(b.jid.domain, RT_JID_PART_MAX);
    CHECK_EQ(b.jid.resource, RT_JID_PART_MAX);
    /* One byte more in any part. */
    repeat(local, 'l', RT_JID_PART_MAX + 1);
    snprintf(text, sizeof(text), "%s@example.com", local);
    CHECK(prep_is(text, NULL));
    repeat(res, 'r', RT_JID_PART_MAX + 1);
    snprintf(text, sizeof(text), "example.com/%s", res);
    CHECK(prep_is(text, NULL));
    snprintf(text, sizeof(text), "%s.a", part);
    CHECK(prep_is(text, NULL));
    repeat(label, 'd', 63);
    snprintf(text, sizeof(text), "%s.example", label);
    CHECK(prep_is(text, text));
    snprintf(text, sizeof(text), "%sd.example", label); /* a 64-byte label */
    CHECK(prep_is(text, NULL));
    /* A part that grows past 1023 bytes as it is prepared: U+FB03 (ffi, 3 bytes) becomes
       three letters; 341 of them are 1023 bytes given and prepared, 342 are 1026 prepared. */
    n = 0;
    for (int i = 0; i < 341; i++)
        n += (size_t)sprintf(text + n, "\xef\xac\x83");
    sprintf(text + n, "@example.com");
    CHECK_EQ(rt_jid_prep(text, strlen(text), &b, &why), 0);
    CHECK_EQ(b.jid.local, 1023);
    /* U+3300 SQUARE APAATO (3 bytes) is four katakana once NFKC'd (12 bytes): 100 of them
       are 300 bytes given and 1200 prepared. */
    n = 0;
    for (int i = 0; i < 100; i++)
        n += (size_t)sprintf(text + n, "\xe3\x8c\x80");
    sprintf(text + n, "@example.com");
    CHECK_EQ(rt_jid_prep(text, strlen(text), &b, &why), RT_EINVAL);
    CHECK(strstr(why, "over 1023"));
    /* Too long as a whole. */
    memset(text, 'a', RT_JID_TEXT_MAX + 1);
    CHECK_EQ(rt_jid_prep(text, RT_JID_TEXT_MAX + 1, &b, &why), RT_EINVAL);
}

/* Random strings over an alphabet, for the checks below. */
static size_t random_text(char *out, size_t max, const char *alphabet)
{
    size_t n = 1 + rnd() % max, k = strlen(alphabet);
    for (size_t i = 0; i < n; i++)
        out[i] = alphabet[rnd() % k];
    out[n] = 0;
    return n;
}

static void test_ascii_path_agrees_with_libidn(void)
{
    /* Every part the ASCII path decides, libidn decides the same way, refusals included. */
    static const char *const alphabets[] = {
        "abcXYZ019-.", "abcXYZ019-._", "aA\"&'/:<>@ \t\x7f!~\\", "xn-.abc", "\x01 abc\x1f",
    };
    char in[40], fast[RT_JID_PART_MAX + 1], slow[RT_JID_PART_MAX + 1];
    int disagreements = 0, accepted = 0;
    for (int round = 0; round < 20000; round++) {
        rt_jid_part_t part = (rt_jid_part_t)(rnd() % 3);
        size_t n = random_text(in, 30, alphabets[rnd() % 5]);
        size_t fn = 0, sn = 0;
        const char *fw = NULL, *sw = NULL;
        int frc = rt_jid_prep_part(part, in, n, fast, &fn, &fw);
        int src = rt__jid_prep_part_slow(part, in, n, slow, &sn, &sw);
        bool same = frc == src && (frc || (fn == sn && memcmp(fast, slow, fn) == 0));
        if (!same && disagreements++ < 5)
            fprintf(stderr, "  part %d \"%s\": ASCII path %d \"%s\", libidn %d \"%s\"\n", part, in,
                    frc, frc ? fw : fast, src, src ? sw : slow);
        accepted += frc == 0;
    }
    CHECK_EQ(disagreements, 0);
    CHECK(accepted > 1000); /* the alphabets make both outcomes common */
}

static void test_prepared_twice_is_the_same(void)
{
    static const char *const jids[] = {
        "Juliet@Example.com/Balcony", "ΣΑΣ@xn--bcher-kva.example/♚ x",     "henryⅣ@EXAMPLE.com.",
        "ﬃ@bücher。example/Ⅳ",        "foo\\20bar@[2001:db8::0:1]/r/s@t",  "例子@例子.测试/资源",
        "مثال@example.com",           "user@example.com/\xf0\x9f\x98\x80", /* U+1F600: unassigned
                                                                              in 3.2 */
    };
    for (size_t i = 0; i < sizeof(jids) / sizeof(jids[0]); i++) {
        rt_jid_buf_t a, b;
        const char *why = "";
        int rc = rt_jid_prep(jids[i], strlen(jids[i]), &a, &why);
        if (rc)
            fprintf(stderr, "  refused %s: %s\n", jids[i], why);
        CHECK_EQ(rc, 0);
        if (rc)
            continue;
        CHECK_EQ(rt_jid_prep(a.jid.s, rt_jid_len(&a.jid), &b, &why), 0);
        CHECK(rt_jid_eq(&a.jid, &b.jid));
    }
    /* Right-to-left text mixed with left-to-right in one part is refused (RFC 3454 §6). */
    CHECK(prep_is("مثالabc@example.com", NULL));
}

static void test_compact_form(void)
{
    rt_jid_buf_t full, bare, other;
    const char *why;
    CHECK_EQ(rt_jid_prep("User@Example.com/phone", 22, &full, &why), 0);
    const rt_jid_t *j = &full.jid;
    CHECK_EQ(j->local, 4);
    CHECK_EQ(j->domain, 11);
    CHECK_EQ(j->resource, 5);
    CHECK(memcmp(rt_jid_local(j), "user", 4) == 0);
    CHECK(memcmp(rt_jid_domain(j), "example.com", 11) == 0);
    CHECK(memcmp(rt_jid_resource(j), "phone", 5) == 0);
    CHECK_EQ(rt_jid_bare_len(j), 16);
    CHECK_EQ(rt_jid_size(j), sizeof(rt_jid_t) + 23); /* 29 bytes: a 32-byte heap object */
    CHECK_EQ(rt_jid_prep("user@example.com", 16, &bare, &why), 0);
    CHECK(rt_jid_bare_eq(j, &bare.jid));
    CHECK(!rt_jid_eq(j, &bare.jid));
    CHECK_EQ(rt_jid_bare_hash(j), rt_jid_bare_hash(&bare.jid));
    CHECK_EQ(rt_jid_bare_hash(j), rt_hash("user@example.com", 16));
    /* The bare form of a domain JID, and one with a resource only. */
    CHECK_EQ(rt_jid_prep("example.com/r", 13, &other, &why), 0);
    CHECK_EQ(other.jid.local, 0);
    CHECK_EQ(rt_jid_bare_len(&other.jid), 11);
    CHECK(memcmp(rt_jid_resource(&other.jid), "r", 1) == 0);
    CHECK(!rt_jid_bare_eq(j, &other.jid));
    /* Made from prepared parts, it is the JID they were prepared from. */
    CHECK_EQ(rt_jid_make(&other, "user", 4, "example.com", 11, "phone", 5), 0);
    CHECK(rt_jid_eq(j, &other.jid));
    CHECK_EQ(rt_jid_make(&other, NULL, 0, "example.com", 11, NULL, 0), 0);
    CHECK(strcmp(other.jid.s, "example.com") == 0);
    CHECK_EQ(rt_jid_make(&other, "a", 1, "", 0, NULL, 0), RT_EINVAL);
    CHECK_EQ(rt_jid_make(&other, "a", RT_JID_PART_MAX + 1, "b", 1, NULL, 0), RT_EINVAL);
}

static void dup_on_heap(rt_actor_t *self)
{
    rt_jid_buf_t b;
    const char *why;
    CHECK_EQ(rt_jid_prep("juliet@example.com/balcony", 26, &b, &why), 0);
    size_t before = rt_memory(self);
    rt_jid_t *c = rt_jid_dup(self, &b.jid);
    CHECK(c != NULL);
    if (!c)
        return;
    CHECK(rt_jid_eq(c, &b.jid));
    CHECK(strcmp(c->s, "juliet@example.com/balcony") == 0);
    CHECK(rt_memory(self) - before <= 64); /* at most one small object */
    rt_free(self, c);
}

static void test_dup_on_an_actor_heap(void)
{
    test_start(1);
    test_in_actor(dup_on_heap);
    rt_shutdown();
}

/* A caller that does not want the reason passes NULL (a session refusing a client's to). */
static void test_no_reason_asked(void)
{
    rt_jid_buf_t b;
    static const char *const bad[] = {"", "@bad", "a@", "a@b/", "a@b@c\x01"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK_EQ(rt_jid_prep(bad[i], strlen(bad[i]), &b, NULL), RT_EINVAL);
    char out[RT_JID_PART_MAX + 1];
    size_t n;
    CHECK_EQ(rt_jid_prep_part(RT_JID_DOMAIN, "a b", 3, out, &n, NULL), RT_EINVAL);
}

int main(void)
{
    RUN(test_rfc7622_valid_examples);
    RUN(test_no_reason_asked);
    RUN(test_rfc7622_invalid_examples);
    RUN(test_splitting);
    RUN(test_domainpart);
    RUN(test_part_lengths);
    RUN(test_ascii_path_agrees_with_libidn);
    RUN(test_prepared_twice_is_the_same);
    RUN(test_compact_form);
    RUN(test_dup_on_an_actor_heap);
    return CHECK_SUMMARY();
}
