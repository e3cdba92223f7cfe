/*
** One rule state (rules/rule_vm.c) and the libraries rules see: loading and its
** errors, the msg table, rows as BSON, broken rules counted and isolated, the
** sandbox, json (lua_json.c), topic and time (lua_lib.c), template (lua/).
*/
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "rule_vm.h"
#include "test_rule_util.h"

#define MEM (8u << 20)
#define BUDGET 200000

static char err[600];

/* A vm with one rule per text, loaded as t/r<i>.lua; NULL (and a CHECK) if one fails. */
static rt_rule_vm_t *vm_with(const char *const *texts, size_t n)
{
    static char paths[16][32];
    rt_rule_vm_t *vm;
    if (rt_rule_vm_new(MEM, BUDGET, &vm))
        return NULL;
    /* Outcomes here follow from instructions and bytes; test_time_limit tests the clock. */
    rt_rule_vm_set_limits(vm, 600000, RT_CONF_RULE_OUTPUT_ROWS, RT_CONF_RULE_OUTPUT_BYTES);
    for (size_t i = 0; i < n; i++) {
        rt_rule_spec_t spec;
        snprintf(paths[i], sizeof(paths[i]), "t/r%zu.lua", i);
        int rc = rt_rule_vm_load(vm, paths[i], texts[i], strlen(texts[i]), &spec, err, sizeof(err));
        CHECK_EQ(rc, 0);
        if (rc) {
            fprintf(stderr, "  load: %s\n", err);
            rt_rule_vm_free(vm);
            return NULL;
        }
        rt_rule_spec_free(&spec);
    }
    return vm;
}

/*
** Runs `code` as the body of a select(msg, ctx) and returns its outcome; a row
** {v = "..."} puts v in out.
*/
static rt_rule_outcome_t eval(const char *code, char *out, size_t cap)
{
    char text[4096];
    snprintf(text, sizeof(text),
             "return { name = \"e\", from = \"#\", select = function(msg, ctx)\n%s\nend }\n", code);
    const char *texts[] = {text};
    rt_rule_vm_t *vm = vm_with(texts, 1);
    if (!vm)
        return RT_RULE_FAIL_EXCEPTION;
    rt_rule_input_t in = msg_in("a/b", "{}");
    rt_buf_t rows = {0};
    uint32_t n = 0;
    err[0] = 0;
    rt_rule_outcome_t o = rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err));
    if (out) {
        out[0] = 0;
        if (o == RT_RULE_PASSED)
            row_str(rows_data(&rows), "v", out, cap);
    }
    rt_buf_free(&rows);
    rt_rule_vm_free(vm);
    return o;
}

/* Evaluates an expression that must give a string equal to want. */
static void expect(const char *expr, const char *want)
{
    char code[2048], got[1024];
    snprintf(code, sizeof(code), "return { v = %s }", expr);
    rt_rule_outcome_t o = eval(code, got, sizeof(got));
    bool ok = o == RT_RULE_PASSED && strcmp(got, want) == 0;
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "  %s\n    gave \"%s\" (outcome %d: %s), wanted \"%s\"\n", expr, got, o,
                err, want);
}

/* Runs code that must fail with an error containing needle. */
static void expect_error(const char *code, const char *needle)
{
    rt_rule_outcome_t o = eval(code, NULL, 0);
    bool ok = o == RT_RULE_FAIL_EXCEPTION && strstr(err, needle);
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "  %s\n    outcome %d: \"%s\", wanted an error with \"%s\"\n", code, o, err,
                needle);
}

static void test_json_round_trips(void)
{
    static const char *const docs[] = {
        "{}",
        "[1,2,3]",
        "{\"a\":1}",
        "\"x\"",
        "true",
        "false",
        "0",
        "-12",
        "1.5",
        "1.0",
        "-0.25",
        "1e+100",
        "9223372036854775807",
        "-9223372036854775808",
        "[null,1,null]",
        "{\"a\":[1,{\"b\":[true,false,null]}]}",
        "\"\\u0000\\u001f\"",
        "\"tab\\tnl\\nq\\\"bs\\\\\"",
        "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"",
        "0.1",
        "123456789.123",
        "[[[[[[[[[[1]]]]]]]]]]",
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        char lit[512], expr[600];
        /* A Lua long string holds the JSON text as it is. */
        snprintf(lit, sizeof(lit), "[==[%s]==]", docs[i]);
        snprintf(expr, sizeof(expr), "json.encode(json.decode(%s))", lit);
        expect(expr, docs[i]);
    }
    /* What decoding gives, as Lua sees it. */
    expect("math.type(json.decode('1'))", "integer");
    expect("math.type(json.decode('1.0'))", "float");
    expect("math.type(json.decode('1e3'))", "float");
    expect("math.type(json.decode('9223372036854775808'))", "float");
    expect("tostring(json.decode('null') == json.null)", "true");
    expect("json.decode('\"\\\\u00e9\\\\ud83d\\\\ude00\"')", "\xc3\xa9\xf0\x9f\x98\x80");
    expect("json.decode(' {\"a\" : { \"b\" : [ 10 , 20 ] } } ').a.b[2] .. ''", "20");
    expect("json.encode({[1]='a', [2]='b'})", "[\"a\",\"b\"]");
    expect("json.encode({[1]='a', [3]='b'})", "{\"1\":\"a\",\"3\":\"b\"}");
    expect("json.encode(1/3)", "0.3333333333333333");
    expect("json.encode(2^53)", "9007199254740992.0");
    expect("json.encode(json.null)", "null");
    expect("json.encode(json.decode('[]'))", "{}"); /* an empty table is an empty object */
    expect("json.encode('\\127<>/')", "\"\x7f<>/\"");
}

static void test_json_errors(void)
{
    static const char *const bad[] = {
        "",         "{",        "[1,",         "[1 2]",       "{\"a\" 1}",   "{1:2}",      "\"abc",
        "\"\\x\"",  "tru",      "nul",         "01",          "1.",          ".5",         "-",
        "1e",       "[1]x",     "\"\\ud800\"", "\"\\udc00\"", "\"\\u12G4\"", "{\"a\":1,}", "[,]",
        "\"\x01\"", "\"\xff\"", "NaN",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char code[256];
        snprintf(code, sizeof(code), "json.decode([==[%s]==])", bad[i]);
        expect_error(code, "json.decode: ");
    }
    expect_error("json.decode(string.rep('[', 1000) .. string.rep(']', 1000))",
                 "nested too deeply");
    expect_error("json.encode(0/0)", "NaN cannot be written");
    expect_error("json.encode(1/0)", "inf cannot be written");
    expect_error("json.encode({f = print or function() end})", "cannot encode a function");
    expect_error("local t = {}; t.self = t; json.encode(t)",
                 "a table that contains itself (a cycle)");
    expect_error("json.encode({[true] = 1})", "object keys must be strings");
    expect_error("json.encode({[1.5] = 1})", "object keys must be strings");
    expect_error("json.encode('\\xff')", "not valid UTF-8");
    expect_error("json.decode({})", "bad argument");
    expect_error("json.decode('1e999')", "number out of range");
    /* An error at a known place names the byte. */
    expect_error("json.decode('[1, 2, x]')", "unexpected character at byte 8");
    /* Protected calls catch them like any error. */
    expect("tostring(pcall(json.decode, '{'))", "false");
}

/*
** Random documents made of JSON's pieces: decoding never crashes and either fails
** with a json.decode error or gives a value that survives encode -> decode intact.
*/
static void test_json_fuzz(void)
{
    static const char *const pieces[] = {
        "{",           "}",
        "[",           "]",
        ",",           ":",
        "\"a\"",       "\"b\"",
        "\"\\u00e9\"", "\"\\ud83d\\ude00\"",
        "1",           "-2.5e3",
        "0.125",       "9223372036854775807",
        "true",        "false",
        "null",        " ",
        "\"\\n\"",     "\"\\\\\"",
        "\"x",         "\\",
        "\xc3\xa9",    "\xff",
        "1e999",       "-0",
        "1e308",
    };
    const char *text[] = {
        "local function same(a, b)\n"
        "  if type(a) ~= type(b) then return false end\n"
        "  if type(a) ~= 'table' then return a == b or (a ~= a and b ~= b) end\n"
        "  for k, v in pairs(a) do if not same(v, b[k]) then return false end end\n"
        "  for k in pairs(b) do if a[k] == nil then return false end end\n"
        "  return true\n"
        "end\n"
        "return { name = 'fuzz', from = '#', select = function(msg)\n"
        "  local ok, v = pcall(json.decode, msg.payload)\n"
        "  if not ok then\n"
        "    assert(v:find('json.decode: ', 1, true), v)\n"
        "    return nil\n"
        "  end\n"
        "  local e = json.encode(v)\n"
        "  assert(same(json.decode(e), v), e)\n"
        "  return { ok = true }\n"
        "end }\n",
    };
    rt_rule_vm_t *vm = vm_with(text, 1);
    if (!vm)
        return;
    long decoded = 0, refused = 0, n = check_scale(20000);
    char doc[512];
    rt_buf_t rows = {0};
    for (long i = 0; i < n; i++) {
        size_t len = 0, parts = 1 + rnd() % 24;
        for (size_t k = 0; k < parts; k++) {
            const char *p = pieces[rnd() % (sizeof(pieces) / sizeof(pieces[0]))];
            size_t pl = strlen(p);
            if (len + pl >= sizeof(doc))
                break;
            memcpy(doc + len, p, pl);
            len += pl;
        }
        doc[len] = 0;
        rt_rule_input_t in = msg_in("f", doc);
        uint32_t nrows;
        rows.len = 0;
        rt_rule_outcome_t o = rt_rule_vm_run(vm, 0, &in, &rows, &nrows, err, sizeof(err));
        decoded += o == RT_RULE_PASSED;
        refused += o == RT_RULE_FILTERED;
        if (o != RT_RULE_PASSED && o != RT_RULE_FILTERED) {
            CHECK(false);
            fprintf(stderr, "  %s: %s\n", doc, err);
        }
    }
    CHECK(decoded > 0 && refused > 0);
    rt_buf_free(&rows);
    rt_rule_vm_free(vm);
}

static void test_topic_time_template(void)
{
    expect("tostring(topic.match('a/+/c', 'a/b/c'))", "true");
    expect("tostring(topic.match('a/+/c', 'a/b/d'))", "false");
    expect("tostring(topic.match('a/#', 'a'))", "true");
    expect("tostring(topic.match('a/#', 'a/b/c'))", "true");
    expect("tostring(topic.match('#', '$SYS/x'))", "false");
    expect("tostring(topic.match('+/x', '$SYS/x'))", "false");
    expect("tostring(topic.match('$SYS/#', '$SYS/x'))", "true");
    expect("tostring(topic.match('a/+', 'a/'))", "true");
    expect("tostring(topic.match('a/b', 'a/b/c'))", "false");
    expect("tostring(topic.match('+', 'a/b'))", "false");
    expect_error("topic.match('a/#/b', 'a')", "not a valid topic filter");
    expect_error("topic.match('a+', 'a')", "not a valid topic filter");
    /* As the broker matches (topic.h): shared filters, and no match for what is not a name. */
    expect("tostring(topic.match('$share/g/a/+', 'a/b'))", "true");
    expect("tostring(topic.match('#', ''))", "false");
    expect("tostring(topic.match('a/+', 'a/+'))", "false");
    expect_error("topic.match('$share/g', 'a')", "not a valid topic filter");
    expect_error("topic.match('a\\0b', 'a')", "not a valid topic filter");
    expect("table.concat(topic.split('a//b/c'), '|')", "a||b|c");
    expect("#topic.split('') .. ''", "1");
    expect("time.format(0)", "1970-01-01T00:00:00.000Z");
    expect("time.format(1700000000123)", "2023-11-14T22:13:20.123Z");
    expect("time.format(1700000000123, '%Y/%m/%d %H:%M:%S.%L %%L')", "2023/11/14 22:13:20.123 %L");
    expect("time.format(-1)", "1969-12-31T23:59:59.999Z");
    expect("tostring(time.now_ms() > 1600000000000)", "true");
    expect_error("time.format('x')", "bad argument");
    expect(
        "template('${a}/${b.c}/${b.d.1}/${n}/${t}', {a = 'x', b = {c = 5, d = {true}}, n = 1.5})",
        "x/5/true/1.5/");
    expect("template('$${a}-${a}', {a = 1})", "${a}-1");
    expect("template('${o}', {o = {k = 'v'}})", "{\"k\":\"v\"}");
    expect("template('${clientid}/${payload.t}', {clientid = msg.clientid, payload = {t = 2}})",
           "c1/2");
    expect_error("template(nil, {})", "the template must be a string");
}

static void test_msg_fields(void)
{
    /* A canonical message's property block supplies the user properties. */
    static const mqtt_user_prop_t users[] = {
        {{(const uint8_t *)"k1", 2}, {(const uint8_t *)"v1", 2}},
        {{(const uint8_t *)"k2", 2}, {(const uint8_t *)"v2", 2}}};
    rt_bin_t *b = make_publish("s/1", "\x00\xff", 2, 1, users, 2);
    rt_message_t m;
    rt_message_view(b, &m);
    const char *texts[] = {
        "return { name = 'f', from = 's/+', select = function(msg, ctx)\n"
        "  return { topic = msg.topic, len = #msg.payload, payload = msg.payload,\n"
        "    qos = msg.qos, retain = msg.retain, clientid = msg.clientid,\n"
        "    username = msg.username, peer = msg.peer, ts = msg.timestamp,\n"
        "    k1 = msg.props.k1, k2 = msg.props.k2, rule = ctx.rule,\n"
        "    nested = { list = { 1, 2.5, 'three' }, empty = {} } }\n"
        "end, to = {} }\n",
    };
    rt_rule_vm_t *vm = vm_with(texts, 1);
    if (!vm) {
        rt_bin_release(b);
        return;
    }
    rt_rule_input_t in = msg_in("s/1", "");
    in.payload = m.payload.p;
    in.payload_len = m.payload.len;
    in.props = m.props;
    rt_buf_t rows = {0};
    uint32_t n = 0;
    CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_PASSED);
    CHECK_EQ(n, 1);
    char s[128];
    CHECK(strcmp(row_str(rows_data(&rows), "topic", s, sizeof(s)), "s/1") == 0);
    CHECK_EQ(row_int(rows_data(&rows), "len"), 2);
    CHECK_EQ(row_int(rows_data(&rows), "qos"), 1);
    CHECK(strcmp(row_str(rows_data(&rows), "clientid", s, sizeof(s)), "c1") == 0);
    CHECK(strcmp(row_str(rows_data(&rows), "username", s, sizeof(s)), "u1") == 0);
    CHECK(strcmp(row_str(rows_data(&rows), "peer", s, sizeof(s)), "10.0.0.1:5555") == 0);
    CHECK_EQ(row_int(rows_data(&rows), "ts"), 1700000000123ll);
    CHECK(strcmp(row_str(rows_data(&rows), "k1", s, sizeof(s)), "v1") == 0);
    CHECK(strcmp(row_str(rows_data(&rows), "k2", s, sizeof(s)), "v2") == 0);
    CHECK(strcmp(row_str(rows_data(&rows), "rule", s, sizeof(s)), "f") == 0);
    /* Bytes that are not UTF-8 are stored as binary; tables as documents and arrays. */
    bson_t doc;
    bson_iter_t it, sub;
    CHECK(bson_init_static(&doc, rows_data(&rows), rows.len));
    CHECK(bson_iter_init_find(&it, &doc, "payload") && BSON_ITER_HOLDS_BINARY(&it));
    CHECK(bson_iter_init_find(&it, &doc, "retain") && BSON_ITER_HOLDS_BOOL(&it));
    CHECK(bson_iter_init(&it, &doc) && bson_iter_find_descendant(&it, "nested.list.1", &sub) &&
          BSON_ITER_HOLDS_DOUBLE(&sub) && bson_iter_double(&sub) == 2.5);
    CHECK(bson_iter_init(&it, &doc) && bson_iter_find_descendant(&it, "nested.list.2", &sub) &&
          BSON_ITER_HOLDS_UTF8(&sub));
    CHECK(bson_iter_init(&it, &doc) && bson_iter_find_descendant(&it, "nested.list", &sub) &&
          BSON_ITER_HOLDS_ARRAY(&sub));
    CHECK(bson_iter_init(&it, &doc) && bson_iter_find_descendant(&it, "nested.empty", &sub) &&
          BSON_ITER_HOLDS_DOCUMENT(&sub));
    rt_buf_free(&rows);
    rt_rule_vm_free(vm);
    rt_bin_release(b);
}

static void test_rows(void)
{
    char v[64];
    CHECK_EQ(eval("return nil", NULL, 0), RT_RULE_FILTERED);
    CHECK_EQ(eval("return false", NULL, 0), RT_RULE_FILTERED);
    CHECK_EQ(eval("return {}", NULL, 0), RT_RULE_FILTERED);
    CHECK_EQ(eval("return { v = 'one' }", v, sizeof(v)), RT_RULE_PASSED);
    CHECK(strcmp(v, "one") == 0);
    /* UTF-8 holding a NUL is binary, not text (bson_validate in the sinks refuses it). */
    CHECK_EQ(eval("return { v = 'a\\0b' }", v, sizeof(v)), RT_RULE_PASSED);
    CHECK(strcmp(v, "") == 0);
    /* A list of rows (EMQX's FOREACH): one row per element. */
    const char *texts[] = {
        "return { name = 'each', from = '#', select = function(msg)\n"
        "  local rows = {}\n"
        "  for i, x in ipairs(json.decode(msg.payload)) do rows[i] = { i = i, x = x } end\n"
        "  return rows\n"
        "end }\n",
    };
    rt_rule_vm_t *vm = vm_with(texts, 1);
    if (vm) {
        rt_rule_input_t in = msg_in("a", "[10, 20, 30]");
        rt_buf_t rows = {0};
        uint32_t n = 0;
        CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_PASSED);
        CHECK_EQ(n, 3);
        const uint8_t *p = rows_data(&rows);
        for (int i = 1; i <= 3 && n == 3; i++, p = row_next(p)) {
            CHECK_EQ(row_int(p, "i"), i);
            CHECK_EQ(row_int(p, "x"), i * 10);
        }
        CHECK(p == rows_data(&rows) + rows.len);
        in = msg_in("a", "[]");
        rows.len = 0;
        CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_FILTERED);
        CHECK_EQ(rows.len, 0);
        rt_buf_free(&rows);
        rt_rule_vm_free(vm);
    }
    /* Rows that cannot be stored fail the rule, naming why. */
    expect_error("return 'x'", "select must return nil, a row or a list of rows");
    expect_error("return { f = function() end }", "cannot store a function");
    expect_error("return { [true] = 1 }", "field names must be strings");
    expect_error("return { { a = 1 }, { b = function() end } }", "row 2:");
    expect_error("return { { a = 1 }, 5 }", "row 2: a row must be a table");
    expect_error("local t = {}; t.t = t; return { t = t }", "nested too deeply");
    expect_error("return { ['a\\0b'] = 1 }", "field name");
}

/* Whether s holds one of the '|'-separated fragments of any. */
static bool has_any(const char *s, const char *any)
{
    for (const char *p = any;; p++) {
        size_t n = strcspn(p, "|");
        char one[64];
        snprintf(one, sizeof(one), "%.*s", (int)n, p);
        if (strstr(s, one))
            return true;
        p += n;
        if (!*p)
            return false;
    }
}

static void test_load_errors(void)
{
    struct {
        const char *text;
        const char *want;     /* prefix "t/r0.lua:LINE:" or "t/r0.lua:" plus a fragment */
        const char *fragment; /* "a|b": either */
    } cases[] = {
        {"return {\n name = 'x',\n from = '#'\n select = function() end }",
         "t/r0.lua:4:", "expected"},
        {"local x = nil\nx.y = 1\nreturn {}", "t/r0.lua:2:", "attempt to index"},
        {"return 5", "t/r0.lua:1:", "must return a table"},
        {"return {\n from = '#',\n select = function() end }", "t/r0.lua:1:", "name must be"},
        {"return {\n name = 'x',\n select = function() end }", "t/r0.lua:1:", "from is required"},
        {"return {\n name = 'x',\n from = '#' }", "t/r0.lua:1:", "select must be a function"},
        {"return {\n name = 'x',\n from = 'a/#/b',\n select = function() end }",
         "t/r0.lua:3:", "neither a topic filter nor an event"},
        {"return {\n name = 'x',\n from = { 'a', 'client.nope' },\n select = function() end }",
         "t/r0.lua:3:", "client.nope"},
        {"return {\n name = 'x',\n from = '$share/g/a',\n select = function() end }",
         "t/r0.lua:3:", "shared subscriptions"},
        {"return {\n name = 'x',\n from = '#',\n select = function() end,\n\n form = 1 }",
         "t/r0.lua:6:", "unknown field \"form\""},
        {"return {\n name = 'x',\n from = '#',\n select = function() end,\n to = { 5 } }",
         "t/r0.lua:5:", "to: entries are sink names"},
        {"return {\n name = 'x',\n from = '#',\n select = function() end,\n to = { 'a', 'a' } }",
         "t/r0.lua:5:", "named twice"},
        {"return {\n name = 'x',\n from = '#',\n select = function() end,\n to = { a = { f = "
         "function() end } } }",
         "t/r0.lua:5:", "to.a:"},
        {"return {\n name = 'x',\n from = '#',\n select = function() end,\n enabled = 'yes' }",
         "t/r0.lua:5:", "enabled must be true or false"},
        {"return {\n name = 'bad name',\n from = '#',\n select = function() end }",
         "t/r0.lua:2:", "name must be"},
        {"while true do end", "t/r0.lua:1:", "instruction budget"},
        /* Doubling reaches the memory cap in a few dozen steps, each copying the string: on
           a slow machine (TSan) the time limit can come first. Either limit ends it. */
        {"local s = 'x' while true do s = s .. s end", "t/r0.lua:", "not enough memory|time limit"},
        /* Bytecode is refused: only text loads. */
        {"\x1bLua", "t/r0.lua", "binary"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        rt_rule_vm_t *vm;
        rt_rule_spec_t spec;
        if (rt_rule_vm_new(MEM, BUDGET, &vm))
            continue;
        err[0] = 0;
        int rc = rt_rule_vm_load(vm, "t/r0.lua", cases[i].text, strlen(cases[i].text), &spec, err,
                                 sizeof(err));
        bool ok = rc == RT_EINVAL && strncmp(err, cases[i].want, strlen(cases[i].want)) == 0 &&
                  has_any(err, cases[i].fragment);
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "  case %zu: rc %d, \"%s\"; wanted \"%s\" ... \"%s\"\n", i, rc, err,
                    cases[i].want, cases[i].fragment);
        CHECK_EQ(rt_rule_vm_nrules(vm), 0);
        rt_rule_vm_free(vm);
    }
    /* A path longer than Lua's LUA_IDSIZE still comes back whole, before its line. */
    const char *longp = "/a/very/long/rules/directory/that/lua/would/shorten/to/its/tail/r1.lua";
    rt_rule_vm_t *lvm;
    rt_rule_spec_t lspec;
    if (rt_rule_vm_new(MEM, BUDGET, &lvm) == 0) {
        const char *bad = "return {\n name = 'x',\n from = '#'\n select = 1 }";
        CHECK_EQ(rt_rule_vm_load(lvm, longp, bad, strlen(bad), &lspec, err, sizeof(err)),
                 RT_EINVAL);
        CHECK(strncmp(err, longp, strlen(longp)) == 0 &&
              strncmp(err + strlen(longp), ":4:", 3) == 0);
        rt_rule_vm_free(lvm);
    }
    /* And from a dry run's runtime error, whose message Lua positions with the short name. */
    if (rt_rule_vm_new(MEM, BUDGET, &lvm) == 0) {
        const char *bad = "return { name = 'x', from = 'a/#', sample = { payload = 'x' },\n"
                          "  select = function(msg)\n"
                          "    return { n = msg.nope.x } end }\n";
        CHECK_EQ(rt_rule_vm_load(lvm, longp, bad, strlen(bad), &lspec, err, sizeof(err)), 0);
        rt_rule_spec_free(&lspec);
        CHECK_EQ(rt_rule_vm_dry_run(lvm, 0, err, sizeof(err)), RT_EINVAL);
        const char *want = ":3: dry run on its sample message failed: attempt to index";
        bool ok = strncmp(err, longp, strlen(longp)) == 0 &&
                  strncmp(err + strlen(longp), want, strlen(want)) == 0;
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "  long dry run: \"%s\"\n", err);
        rt_rule_vm_free(lvm);
    }
    /* A good file: the spec carries everything declared. */
    const char *good = "return { name = 'g', from = { 'a/+', 'client.connected' },\n"
                       "  select = function() end, durable = true, enabled = false,\n"
                       "  to = { 'one', two = { collection = 'x', n = 2 }, three = true } }\n";
    rt_rule_vm_t *vm;
    rt_rule_spec_t spec;
    if (rt_rule_vm_new(MEM, BUDGET, &vm) == 0) {
        CHECK_EQ(rt_rule_vm_load(vm, "g.lua", good, strlen(good), &spec, err, sizeof(err)), 0);
        CHECK(strcmp(spec.name, "g") == 0);
        CHECK_EQ(spec.nfrom, 2);
        CHECK_EQ(spec.nto, 3);
        CHECK(spec.durable && !spec.enabled);
        for (size_t i = 0; i < spec.nto; i++) {
            if (strcmp(spec.to[i].sink, "two") == 0) {
                char s[32];
                CHECK(spec.to[i].opts != NULL);
                CHECK(strcmp(row_str(spec.to[i].opts, "collection", s, sizeof(s)), "x") == 0);
                CHECK_EQ(row_int(spec.to[i].opts, "n"), 2);
            } else {
                CHECK(spec.to[i].opts == NULL);
            }
        }
        rt_rule_spec_free(&spec);
        CHECK_EQ(rt_rule_vm_dry_run(vm, 0, err, sizeof(err)), 0);
        rt_rule_vm_free(vm);
    }
    /* The dry run uses the file's sample, and fails with the file and line of the error. */
    const char *dry = "return { name = 'd', from = 'a/#',\n"
                      "  sample = { topic = 'a/b', payload = '{\"t\": 1}' },\n"
                      "  select = function(msg)\n"
                      "    return { t = json.decode(msg.payload).t + 1 } end }\n";
    const char *dry_bad = "return { name = 'd', from = 'a/#',\n"
                          "  sample = { topic = 'a/b', payload = '{}' },\n"
                          "  select = function(msg)\n"
                          "    return { t = json.decode(msg.payload).t + 1 } end }\n";
    /* Without a sample a Lua error is accepted, a runaway or an unstorable row is not. */
    const char *no_sample = "return { name = 'd', from = 'a/#',\n"
                            "  select = function(msg)\n"
                            "    return { t = json.decode(msg.payload).t + 1 } end }\n";
    const char *loops = "return { name = 'd', from = 'client.connected',\n"
                        "  select = function(msg)\n"
                        "    while msg.clientid do end end }\n";
    const char *bad_row = "return { name = 'd', from = 'a/#',\n"
                          "  select = function(msg)\n"
                          "    return { f = function() end } end }\n";
    struct {
        const char *text;
        int rc;
        const char *fragment;
    } dry_cases[] = {
        {dry, 0, NULL},
        {dry_bad, RT_EINVAL,
         "d.lua:4: dry run on its sample message failed: attempt to perform arithmetic"},
        {no_sample, 0, NULL},
        {loops, RT_EINVAL, "d.lua:3: dry run on a made-up event failed: instruction budget"},
        {bad_row, RT_EINVAL,
         "d.lua:2: dry run on a made-up message failed: row: field \"f\": cannot store a "
         "function"},
        /* A C function's error has no position: the line the rule was running. */
        {"return { name = 'd', from = 'a/#', sample = { payload = 'x' },\n"
         "  select = function(msg)\n"
         "    local n = 1\n"
         "    return json.decode(msg.payload) end }\n",
         RT_EINVAL, "d.lua:4: dry run on its sample message failed: json.decode:"},
    };
    for (size_t i = 0; i < sizeof(dry_cases) / sizeof(dry_cases[0]); i++) {
        if (rt_rule_vm_new(MEM, BUDGET, &vm))
            continue;
        const char *t = dry_cases[i].text;
        CHECK_EQ(rt_rule_vm_load(vm, "d.lua", t, strlen(t), &spec, err, sizeof(err)), 0);
        rt_rule_spec_free(&spec);
        err[0] = 0;
        CHECK_EQ(rt_rule_vm_dry_run(vm, 0, err, sizeof(err)), dry_cases[i].rc);
        if (dry_cases[i].fragment) {
            bool ok = strncmp(err, dry_cases[i].fragment, strlen(dry_cases[i].fragment)) == 0;
            CHECK(ok);
            if (!ok)
                fprintf(stderr, "  dry case %zu: \"%s\"\n", i, err);
        }
        rt_rule_vm_free(vm);
    }
}

static void test_sandbox(void)
{
    static const char *const absent[] = {
        "io",          "os",     "require",  "package",        "debug",  "load",
        "loadstring",  "dofile", "loadfile", "collectgarbage", "print",  "coroutine",
        "string.dump", "module", "newproxy", "setfenv",        "getfenv"};
    for (size_t i = 0; i < sizeof(absent) / sizeof(absent[0]); i++) {
        char expr[128];
        snprintf(expr, sizeof(expr), "tostring(%s)", absent[i]);
        expect(expr, "nil");
    }
    expect_error("io.open('/etc/passwd')", "attempt to index a nil value (global 'io')");
    expect_error("os.execute('true')", "attempt to index a nil value (global 'os')");
    expect_error("require('os')", "attempt to call a nil value (global 'require')");
    expect_error("load(string.dump(function() end))", "attempt to call a nil value");
    expect_error("debug.getregistry()", "attempt to index a nil value");
    /* Shared tables are read-only, rawset or not; the string metatable is hidden. */
    expect_error("string.upper = nil", "read-only");
    expect_error("json.encode = function() end", "read-only");
    expect_error("math.pi = 3", "read-only");
    expect_error("rawset(string, 'upper', 1)", "read-only");
    expect_error("rawset(_G, 'x', 1); rawset(getmetatable(_G), 'x', 1)", "bad argument");
    expect_error("setmetatable(string, {})", "read-only");
    expect("tostring(getmetatable(''))", "false");
    expect("tostring(getmetatable(string))", "false");
    expect("tostring(getmetatable(_G))", "false");
    expect_error("getmetatable('').__index = {}", "attempt to index a boolean value");
    expect_error("setmetatable({}, { __gc = function() end })", "__gc metamethods are not allowed");
    expect(" ('abc'):upper()", "ABC");
    expect(
        "tostring(select(2, xpcall(function(a) return a * 2 end, function(e) return e end, 21)))",
        "42");
    expect("select(2, xpcall(function() error('x', 0) end, function(e) return 'h:' .. e end))",
           "h:x");
    expect("tostring(select('#', pcall(function() return 1, 2, 3 end)))", "4");
    expect("string.format('%d-%s', 5, 'x')", "5-x");
    /* _G is the rule's own environment: globals it makes stay its own. */
    expect("(function() x = 1; return tostring(_G.x) .. tostring(rawget(_G, 'string')) end)()",
           "1nil");
    /* Rules in one state cannot see each other's globals, nor change what others see. */
    const char *texts[] = {
        "return { name = 'a', from = '#', select = function(msg)\n"
        "  shared = 'from a'; _G.also = 1; json = nil; string = nil\n"
        "  return { v = tostring(shared) } end }\n",
        "return { name = 'b', from = '#', select = function(msg)\n"
        "  return { v = tostring(shared) .. tostring(also) .. type(json) .. type(string) } end }\n",
    };
    rt_rule_vm_t *vm = vm_with(texts, 2);
    if (vm) {
        rt_rule_input_t in = msg_in("a", "x");
        rt_buf_t rows = {0};
        uint32_t n;
        char v[64];
        CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_PASSED);
        CHECK(strcmp(row_str(rows_data(&rows), "v", v, sizeof(v)), "from a") == 0);
        rows.len = 0;
        CHECK_EQ(rt_rule_vm_run(vm, 1, &in, &rows, &n, err, sizeof(err)), RT_RULE_PASSED);
        CHECK(strcmp(row_str(rows_data(&rows), "v", v, sizeof(v)), "nilniltabletable") == 0);
        rt_buf_free(&rows);
        rt_rule_vm_free(vm);
    }
    /* C loops that neither the hook nor the memory cap would stop are refused. */
    expect("'[' .. string.rep('', 1e15) .. string.rep('', 1e15, '') .. ('x'):rep(3, ',') .. ']'",
           "[x,x,x]");
    expect_error("local t = {} table.move(t, 1, 1e15, 2)", "table.move: more than");
    expect_error("table.insert(setmetatable({}, { __len = function() return 1e15 end }), 1, 'x')",
                 "table.insert: more than");
    expect_error("table.remove(setmetatable({}, { __len = function() return 1e15 end }), 1)",
                 "table.remove: more than");
    expect("(function() local t = { 1, 2, 3 } table.insert(t, 1, 0) table.remove(t, 2)\n"
           "  table.insert(t, 9) local u = table.move(t, 1, 4, 1, {}) return table.concat(t) .. "
           "'/' .. tostring(table.remove(t)) .. '/' .. #u end)()",
           "0239/9/4");
    /* pcall cannot hide a spent budget or the memory cap. */
    CHECK_EQ(eval("while true do pcall(function() while true do end end) end", NULL, 0),
             RT_RULE_FAIL_BUDGET);
    CHECK_EQ(eval("pcall(function() while true do pcall(error, 'x') end end) return { v = 'x' }",
                  NULL, 0),
             RT_RULE_FAIL_BUDGET);
    CHECK_EQ(eval("local ok = xpcall(function() local s = 'x' while true do s = s .. s end end,"
                  " function(e) return e end) return { v = tostring(ok) }",
                  NULL, 0),
             RT_RULE_FAIL_MEMORY);
    CHECK_EQ(eval("local ok, e = pcall(error, 'mine') return { v = e }", NULL, 0), RT_RULE_PASSED);
    /* A string error whose object has a __tostring is reported without running it. */
    CHECK_EQ(
        eval("error(setmetatable({}, { __tostring = function() while true do end end }))", NULL, 0),
        RT_RULE_FAIL_EXCEPTION);
    CHECK(strstr(err, "not a string") != NULL);
}

static void test_broken_rules_isolated(void)
{
    const char *texts[] = {
        "return { name = 'good', from = '#', select = function(msg)\n"
        "  count = (count or 0) + 1\n"
        "  return { n = count } end }\n",
        "return { name = 'throws', from = '#', select = function(msg)\n"
        "  error('boom') end }\n",
        "return { name = 'loops', from = '#', select = function(msg)\n"
        "  while true do end end }\n",
        "return { name = 'bomb', from = '#', select = function(msg)\n"
        "  local t = {} for i = 1, 1e9 do t[i] = string.rep('x', 10000) .. i end end }\n",
        "return { name = 'hoard', from = '#', select = function(msg)\n"
        "  hoard = hoard or {} for i = 1, 5000 do hoard[#hoard + 1] = string.rep('y', 100) .. i "
        "end\n"
        "  return { n = #hoard } end }\n",
        "return { name = 'strbomb', from = '#', select = function(msg)\n"
        "  return { s = string.rep('x', 1 << 30) } end }\n",
    };
    rt_rule_vm_t *vm = vm_with(texts, 6);
    if (!vm)
        return;
    rt_rule_input_t in = msg_in("a", "x");
    rt_buf_t rows = {0};
    uint32_t n;
    int hoard_passed = 0, hoard_memory = 0;
    for (int round = 1; round <= 25; round++) {
        rows.len = 0;
        CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_PASSED);
        CHECK_EQ(row_int(rows_data(&rows), "n"),
                 round); /* its own state survives the others' failures */
        CHECK_EQ(rt_rule_vm_run(vm, 1, &in, &rows, &n, err, sizeof(err)), RT_RULE_FAIL_EXCEPTION);
        CHECK(strstr(err, "t/r1.lua:2: boom") != NULL);
        CHECK_EQ(rt_rule_vm_run(vm, 2, &in, &rows, &n, err, sizeof(err)), RT_RULE_FAIL_BUDGET);
        CHECK(strstr(err, "instruction budget") != NULL);
        CHECK_EQ(rt_rule_vm_run(vm, 3, &in, &rows, &n, err, sizeof(err)), RT_RULE_FAIL_MEMORY);
        CHECK(strstr(err, "not enough memory") != NULL);
        rt_rule_outcome_t o = rt_rule_vm_run(vm, 4, &in, &rows, &n, err, sizeof(err));
        hoard_passed += o == RT_RULE_PASSED;
        hoard_memory += o == RT_RULE_FAIL_MEMORY;
        CHECK_EQ(rt_rule_vm_run(vm, 5, &in, &rows, &n, err, sizeof(err)), RT_RULE_FAIL_MEMORY);
        CHECK(rt_rule_vm_bytes(vm) <= MEM);
    }
    /* The hoarder fills the state, fails, is rebuilt, and starts again. */
    CHECK(hoard_memory >= 1);
    CHECK(hoard_passed >= 2);
    CHECK(rt_rule_vm_bytes(vm) > 0);
    rt_buf_free(&rows);
    rt_rule_vm_free(vm);
}

/*
** C library loops that run no Lua instruction and need no memory: every C function they call
** is charged to the budget, so each shape ends as a budget failure. Before, each passed (and
** at a larger N held the caller for seconds).
*/
static void test_c_loops_budgeted(void)
{
    static const char *const shapes[] = {
        "local t = setmetatable({}, { __index = table.concat })\n"
        "return { v = table.concat(t, '', 1, 1000000) }",
        "local t = setmetatable({}, { __index = rawlen })\n"
        "return { v = table.concat(t, '', 1, 1000000) }",
        "local t = setmetatable({}, { __index = json.encode })\n"
        "return { v = table.concat(t, '', 1, 1000000) }",
        "local t = setmetatable({}, { __index = rawlen })\n"
        "return { v = tostring(select('#', table.unpack(t, 1, 300000))) }",
        "local t = table.pack(string.byte(string.rep('x', 30000), 1, -1))\n"
        "table.sort(t, math.ult) return { v = 'sorted' }",
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        rt_rule_outcome_t o = eval(shapes[i], NULL, 0);
        CHECK_EQ(o, RT_RULE_FAIL_BUDGET);
        if (o != RT_RULE_FAIL_BUDGET)
            fprintf(stderr, "  shape %zu: outcome %d: %s\n", i, o, err);
        else
            CHECK(strstr(err, "instruction budget of 200000 exceeded") != NULL);
    }
    /* Spans past RT_LUA_TABLE_OP_MAX are refused before the loop starts. */
    expect_error("table.concat(setmetatable({}, { __index = rawlen }), '', 1, 3e7)",
                 "table.concat: more than");
    expect_error("table.unpack({}, 1, 3e7)", "table.unpack: more than");
    expect_error("table.sort(setmetatable({}, { __len = function() return 3e7 end }))",
                 "table.sort: more than");
    expect("(function() local t = { 'c', 'a', 'b' } table.sort(t)\n"
           "  return table.concat(t, ',') .. '/' .. table.concat(t, '', 2) .. '/' ..\n"
           "    select('#', table.unpack(t)) end)()",
           "a,b,c/bc/3");
}

/*
** The wall-clock limit, with a budget too large to matter: a C-called comparator loop ends
** by time (each sort of 30,000 charges ~450,000 calls, so the budget needs hundreds of sorts), and
** so does a plain Lua loop.
*/
static void test_time_limit(void)
{
    static const char *const bodies[] = {
        "local t = table.pack(string.byte(string.rep('x', 30000), 1, -1))\n"
        "for k = 1, 1e9 do table.sort(t, math.ult) end",
        "while true do end",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        char text[1024];
        snprintf(text, sizeof(text),
                 "return { name = 't', from = '#', select = function(msg)\n%s\nend }\n", bodies[i]);
        rt_rule_vm_t *vm;
        if (rt_rule_vm_new(MEM, 1000000000, &vm))
            continue;
        rt_rule_vm_set_limits(vm, 20, 100, 1 << 20);
        rt_rule_spec_t spec;
        CHECK_EQ(rt_rule_vm_load(vm, "t/t.lua", text, strlen(text), &spec, err, sizeof(err)), 0);
        rt_rule_spec_free(&spec);
        rt_rule_input_t in = msg_in("a", "x");
        rt_buf_t rows = {0};
        uint32_t n;
        CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_FAIL_BUDGET);
        CHECK(strstr(err, "time limit of 20 ms exceeded") != NULL);
        rt_buf_free(&rows);
        rt_rule_vm_free(vm);
    }
}

/* Many references to one row make BSON the memory cap never saw: rows and bytes are bounded. */
static void test_output_bounded(void)
{
    /* 20,000 rows > RT_CONF_RULE_OUTPUT_ROWS. */
    CHECK_EQ(eval("local row = { s = string.rep('x', 1000) } local rows = {}\n"
                  "for i = 1, 20000 do rows[i] = row end return rows",
                  NULL, 0),
             RT_RULE_FAIL_MEMORY);
    CHECK(strstr(err, "rule_output_rows") != NULL);
    /* 5,000 rows of 2 KB: 10 MB of BSON, more than the 8 MB cap has room for. */
    CHECK_EQ(eval("local row = { s = string.rep('x', 2000) } local rows = {}\n"
                  "for i = 1, 5000 do rows[i] = row end return rows",
                  NULL, 0),
             RT_RULE_FAIL_MEMORY);
    CHECK(strstr(err, "rows larger than rule_output_bytes") != NULL);
    /* One row holding one 100 KB string 200 times: 20 MB. */
    CHECK_EQ(eval("local s = string.rep('x', 100000) local r = {}\n"
                  "for i = 1, 200 do r['k' .. i] = s end return r",
                  NULL, 0),
             RT_RULE_FAIL_MEMORY);
    CHECK(strstr(err, "rows larger than") != NULL);
    /* The limits set on a vm hold exactly: 3 rows of ~1 KB pass, 4 rows or 4 KB do not. */
    const char *texts[] = {
        "return { name = 'n', from = '#', select = function(msg)\n"
        "  local rows = {} for i = 1, tonumber(msg.payload) do\n"
        "    rows[i] = { s = string.rep('y', 1000) } end return rows end }\n",
    };
    rt_rule_vm_t *vm = vm_with(texts, 1);
    if (!vm)
        return;
    rt_rule_vm_set_limits(vm, 1000, 3, 3500);
    rt_buf_t rows = {0};
    uint32_t n;
    rt_rule_input_t in = msg_in("a", "3");
    CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_PASSED);
    CHECK_EQ(n, 3);
    CHECK(rows.len <= 3500);
    rows.len = 0;
    in = msg_in("a", "4");
    CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_FAIL_MEMORY);
    CHECK_EQ(rows.len, 0);
    rt_rule_vm_set_limits(vm, 1000, 4, 3500);
    CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_FAIL_MEMORY);
    CHECK(strstr(err, "rows larger than rule_output_bytes (3500)") != NULL);
    CHECK_EQ(rows.len, 0);
    rt_buf_free(&rows);
    rt_rule_vm_free(vm);
}

/* Rules share no random generator, and nothing prints a heap address. */
static void test_rules_share_nothing(void)
{
    const char *texts[] = {
        "return { name = 'seeds', from = '#', select = function(msg)\n"
        "  math.randomseed(42) return { v = tostring(math.random(1 << 40)) } end }\n",
        "return { name = 'draws', from = '#', select = function(msg)\n"
        "  return { v = tostring(math.random(1 << 40)) } end }\n",
        "return { name = 'predicts', from = '#', select = function(msg)\n"
        "  math.randomseed(42) math.random(1 << 40)\n"
        "  return { v = tostring(math.random(1 << 40)) } end }\n",
    };
    rt_rule_vm_t *vm = vm_with(texts, 3);
    if (vm) {
        rt_rule_input_t in = msg_in("a", "x");
        rt_buf_t rows = {0};
        uint32_t n;
        char first[32], drawn[32], predicted[32];
        CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_PASSED);
        row_str(rows_data(&rows), "v", first, sizeof(first));
        rows.len = 0;
        CHECK_EQ(rt_rule_vm_run(vm, 1, &in, &rows, &n, err, sizeof(err)), RT_RULE_PASSED);
        row_str(rows_data(&rows), "v", drawn, sizeof(drawn));
        rows.len = 0;
        CHECK_EQ(rt_rule_vm_run(vm, 2, &in, &rows, &n, err, sizeof(err)), RT_RULE_PASSED);
        row_str(rows_data(&rows), "v", predicted, sizeof(predicted));
        /* With one shared generator, draws gave seed 42's second number. */
        CHECK(strcmp(drawn, predicted) != 0);
        CHECK(strcmp(first, predicted) != 0);
        rows.len = 0;
        CHECK_EQ(rt_rule_vm_run(vm, 0, &in, &rows, &n, err, sizeof(err)), RT_RULE_PASSED);
        CHECK(strcmp(row_str(rows_data(&rows), "v", drawn, sizeof(drawn)), first) == 0);
        rt_buf_free(&rows);
        rt_rule_vm_free(vm);
    }
    expect("math.type(math.random(10)) .. tostring(math.random(1, 1))", "integer1");
    expect_error("math.random = nil", "read-only");
    expect("tostring({}) .. ' ' .. tostring(print) .. tostring(function() end) .. ' ' ..\n"
           "  tostring(setmetatable({}, { __name = 'My' }))",
           "table nilfunction table");
    expect("tostring(setmetatable({}, { __tostring = function() return 'mine' end }))", "mine");
    expect("string.format('%s|%5s|%s|%d', {}, true, string.upper, 7)", "table| true|function|7");
    expect("('%s%%p'):format(setmetatable({}, { __tostring = function() return 'x' end }))", "x%p");
    expect_error("return { v = string.format('%p', {}) }", "%p is not available");
    expect_error("return { v = ('%-5p'):format('s') }", "%p is not available");
    expect("select(2, pcall(error, {})) == nil and 'x' or tostring(select(2, pcall(error, {})))",
           "table");
}

int main(void)
{
    RUN(test_json_round_trips);
    RUN(test_json_errors);
    RUN(test_json_fuzz);
    RUN(test_topic_time_template);
    RUN(test_msg_fields);
    RUN(test_rows);
    RUN(test_load_errors);
    RUN(test_sandbox);
    RUN(test_broken_rules_isolated);
    RUN(test_c_loops_budgeted);
    RUN(test_time_limit);
    RUN(test_output_bounded);
    RUN(test_rules_share_nothing);
    return CHECK_SUMMARY();
}
