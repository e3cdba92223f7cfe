/* The admin socket's request splitting and its answers' text and JSON rendering. */
#include <string.h>

#include "admin.h"
#include "admin_doc.h"
#include "check.h"
#include "common.h"

static int split(const char *text, char **argv, size_t *arglen, int *argc, char *buf)
{
    char err[128];
    strcpy(buf, text);
    return rt_admin_split(buf, strlen(buf), argv, arglen, 16, argc, err, sizeof(err));
}

static void test_split_words_and_quotes(void)
{
    char buf[256], *argv[16];
    size_t len[16];
    int argc;
    CHECK_EQ(split("rules  test \"r 1\" --payload \"{\\\"a\\\": 1}\"", argv, len, &argc, buf), 0);
    CHECK_EQ(argc, 5);
    CHECK(strcmp(argv[0], "rules") == 0);
    CHECK(strcmp(argv[2], "r 1") == 0);
    CHECK(strcmp(argv[4], "{\"a\": 1}") == 0);
    CHECK_EQ(len[4], 8);
    /* \xHH carries any byte, NUL included: the length says where the word ends. */
    CHECK_EQ(split("\"a\\x00b\\n\\t\\\\\"", argv, len, &argc, buf), 0);
    CHECK_EQ(argc, 1);
    CHECK_EQ(len[0], 6);
    CHECK(memcmp(argv[0], "a\0b\n\t\\", 6) == 0);
    CHECK_EQ(split("\"\"", argv, len, &argc, buf), 0);
    CHECK_EQ(argc, 1);
    CHECK_EQ(len[0], 0);
    CHECK_EQ(split("   ", argv, len, &argc, buf), 0);
    CHECK_EQ(argc, 0);
}

static void test_split_errors(void)
{
    char buf[256], *argv[16];
    size_t len[16];
    int argc;
    CHECK_EQ(split("say \"unclosed", argv, len, &argc, buf), RT_EINVAL);
    CHECK_EQ(split("\"bad \\q escape\"", argv, len, &argc, buf), RT_EINVAL);
    CHECK_EQ(split("\"x\"y", argv, len, &argc, buf), RT_EINVAL);
    CHECK_EQ(split("\"ends in \\", argv, len, &argc, buf), RT_EINVAL);
    CHECK_EQ(split("a b c d e f g h i j k l m n o p q", argv, len, &argc, buf), RT_EINVAL);
}

static char *render(rt_doc_t *d, bool json)
{
    rt_buf_t b = {0};
    CHECK_EQ(json ? rt_doc_render_json(d, &b) : rt_doc_render_text(d, &b), 0);
    return b.data;
}

static void test_json(void)
{
    rt_doc_t *d = rt_doc_object();
    rt_doc_add_str(d, "name", "a\"b\\c\n\x01");
    rt_doc_add_u64(d, "big", UINT64_MAX);
    rt_doc_add_i64(d, "neg", -5);
    rt_doc_add_double(d, "ratio", 0.125, 2);
    rt_doc_add_bool(d, "on", true);
    rt_doc_add_null(d, "none");
    rt_doc_add_json(d, "rows", "[{\"x\":1}]");
    rt_doc_t *arr = rt_doc_add_array(d, "list");
    rt_doc_add_u64(arr, NULL, 1);
    rt_doc_add_strn(arr, NULL, "\xff\xfe ok \xc3\xa9", 8);
    char *j = render(d, true);
    const char *want = "{\"name\":\"a\\\"b\\\\c\\n\\u0001\",\"big\":18446744073709551615,"
                    "\"neg\":-5,\"ratio\":0.12,\"on\":true,\"none\":null,\"rows\":[{\"x\":1}],"
                    "\"list\":[1,\"\\ufffd\\ufffd ok \xc3\xa9\"]}\n";
    CHECK(strcmp(j, want) == 0);
    if (strcmp(j, want) != 0)
        fprintf(stderr, "got: %s", j);
    free(j);
    rt_doc_free(d);
}

static void test_text_record_and_table(void)
{
    rt_doc_t *d = rt_doc_object();
    rt_doc_add_str(d, "version", "0.1.0");
    rt_doc_add_u64(d, "uptime_s", 42);
    rt_doc_t *rows = rt_doc_add_array(d, "schedulers");
    for (int i = 0; i < 2; i++) {
        rt_doc_t *o = rt_doc_add_object(rows, NULL);
        rt_doc_add_u64(o, "id", (uint64_t)i);
        rt_doc_add_str(o, "kind", i ? "blocking" : "scheduler");
        rt_doc_add_double(o, "utilisation", i * 0.5, 3);
    }
    rt_doc_t *tags = rt_doc_add_array(d, "tags");
    rt_doc_add_str(tags, NULL, "a");
    rt_doc_add_str(tags, NULL, "b");
    char *t = render(d, false);
    const char *want = "version   0.1.0\n"
                       "uptime_s  42\n"
                       "schedulers:\n"
                       "  id  kind       utilisation\n"
                       "  0   scheduler  0.000\n"
                       "  1   blocking   0.500\n"
                       "tags      a, b\n";
    CHECK(strcmp(t, want) == 0);
    if (strcmp(t, want) != 0)
        fprintf(stderr, "got:\n%s", t);
    free(t);
    rt_doc_free(d);

    rt_doc_t *empty = rt_doc_array();
    t = render(empty, false);
    CHECK(strcmp(t, "(none)\n") == 0);
    free(t);
    t = render(empty, true);
    CHECK(strcmp(t, "[]\n") == 0);
    free(t);
    rt_doc_free(empty);
}

static void test_buf_printf_long(void)
{
    rt_buf_t b = {0};
    char big[1000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    rt_buf_printf(&b, "<%s>", big);
    CHECK_EQ(b.len, 1001);
    CHECK(b.data[0] == '<' && b.data[1000] == '>' && b.data[1001] == 0);
    rt_buf_free(&b);
}

int main(void)
{
    RUN(test_split_words_and_quotes);
    RUN(test_split_errors);
    RUN(test_json);
    RUN(test_text_record_and_table);
    RUN(test_buf_printf_long);
    return CHECK_SUMMARY();
}
