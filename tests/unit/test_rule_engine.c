/*
** The rule engine (rules/rule_engine.h) on a running runtime with real SQLite
** sinks: loading and its errors, filtering and reshaping into 0..N rows, every
** event kind, broken rules counted and isolated, the topic index with 1,000
** rules, hot reload, durable acknowledgement, rt_rules_test, and a throughput
** bench (printed, not asserted).
*/
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_test.h"
#include "rule_engine.h"
#include "sink.h"
#include "test_rule_util.h"

static char dir[128];   /* per-run scratch: data and rules */
static char rules[160]; /* rules written by the tests */
static char err[RT_CONF_ERR_LEN];
static long flush_ms = -1; /* rule_flush_ms for the next start; -1: the default */
static size_t max_heap;    /* the runtime's per-actor limit for the next start; 0: none */

static void sh(const char *fmt, const char *arg)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), fmt, arg);
    if (system(cmd) != 0)
        fprintf(stderr, "failed: %s\n", cmd);
}

static void write_rule(const char *file, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", rules, file);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void clean_rules(void)
{
    sh("rm -rf %s", rules);
    mkdir(rules, 0755);
}

/*
** Starts the runtime, a SQLite sink "store" (file in dir) and the rule engine
** on rules_dir. Returns rt_rules_start's code (err has the reason).
*/
static int start_sink(const char *sink, const char *rules_dir, long workers, long instructions,
                      long memory)
{
    rt_config_t cfg;
    rt_config_defaults(&cfg);
    cfg.schedulers = 2;
    cfg.max_heap = max_heap;
    if (rt_init(&cfg) != 0)
        exit(2);
    rt_conf_t *c = malloc(sizeof(*c));
    rt_conf_defaults(c);
    snprintf(c->data_dir, sizeof(c->data_dir), "%s", dir);
    char a[512];
    snprintf(a, sizeof(a),
             "sinks={%s={type=\"sqlite\",file=\"%s/rt.db\",table=\"rows\",synchronous=\"normal\"}}",
             sink, dir);
    if (rt_conf_set(c, a, err, sizeof(err)) || rt_sinks_start(c, 0, err, sizeof(err))) {
        fprintf(stderr, "sinks: %s\n", err);
        exit(2);
    }
    snprintf(c->rules_dir, sizeof(c->rules_dir), "%s", rules_dir);
    c->rule_workers = workers;
    c->rule_instructions = instructions;
    c->rule_memory = memory;
    /* Outcomes here follow from instructions and bytes: a memory bomb under a sanitiser on a
       loaded box must not become a time limit (test_rule_vm.c tests the clock). */
    c->rule_call_ms = 600000;
    if (flush_ms >= 0)
        c->rule_flush_ms = flush_ms;
    err[0] = 0;
    int rc = rt_rules_start(c, 0, err, sizeof(err));
    free(c);
    return rc;
}

static int start(const char *rules_dir, long workers, long instructions, long memory)
{
    return start_sink("store", rules_dir, workers, instructions, memory);
}

static void stop(void)
{
    rt_rules_stop();
    rt_sinks_stop();
    rt_shutdown();
    rt_sinks_free();
}

/* rt_rules_publish's answer, and 2 for "handed over with the durable promise". */
static int publish_from(const char *clientid, const char *topic, const char *payload, rt_pid_t ack,
                        uint64_t token)
{
    rt_bin_t *b = make_publish(topic, payload, strlen(payload), 1, NULL, 0);
    rt_rule_origin_t o = {clientid, "user", "1.2.3.4:5", 42};
    bool promised;
    int rc = rt_rules_publish(&o, b, ack, token, &promised);
    rt_bin_release(b);
    return rc == 1 && promised ? 2 : rc;
}

static int publish(const char *topic, const char *payload)
{
    return publish_from("c1", topic, payload, 0, 0);
}

static rt_rule_info_t info(const char *name)
{
    static rt_rule_info_t all[1100];
    rt_rule_info_t none;
    memset(&none, 0, sizeof(none));
    size_t n = rt_rules_snapshot(all, 1100);
    for (size_t i = 0; i < n && i < 1100; i++)
        if (strcmp(all[i].name, name) == 0)
            return all[i];
    return none;
}

/* Waits until rule name has matched at least n messages. */
/*
** The work waited for is bounded (each rule call by its instruction and memory budgets), so
** the deadline only says when to give up on a broken run: long enough for a sanitizer build
** on a loaded machine, where the rule bombs of test_broken_rules_isolated took over 10 s.
*/
static bool wait_matched(const char *name, uint64_t n)
{
    uint64_t end = test_now_ms() + 60000;
    while (info(name).matched < n) {
        if (test_now_ms() > end)
            return false;
        test_sleep_ms(1);
    }
    return true;
}

static uint64_t sink_written(const char *name)
{
    rt_sink_info_t all[8];
    size_t n = rt_sinks_snapshot(all, 8);
    for (size_t i = 0; i < n && i < 8; i++)
        if (strcmp(all[i].name, name) == 0)
            return all[i].written;
    return 0;
}

static bool wait_written(const char *name, uint64_t n)
{
    uint64_t end = test_now_ms() + RT_TEST_WAIT_MS;
    while (sink_written(name) < n) {
        if (test_now_ms() > end)
            return false;
        test_sleep_ms(2);
    }
    return true;
}

/* Runs one SQL query that returns a single integer against the sink's database. */
static long long sql_int(const char *sql)
{
    char path[200];
    snprintf(path, sizeof(path), "%s/rt.db", dir);
    sqlite3 *db;
    sqlite3_stmt *st;
    long long v = -1;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW)
            v = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return v;
}

static bool err_has(const char *want)
{
    bool ok = strstr(err, want) != NULL;
    if (!ok)
        fprintf(stderr, "  error \"%s\" lacks \"%s\"\n", err, want);
    return ok;
}

static void test_load(void)
{
    CHECK_EQ(start("tests/rules/good", 2, 100000, 8 << 20), 0);
    rt_rule_info_t all[8];
    CHECK_EQ(rt_rules_snapshot(all, 8), 5);
    CHECK(strcmp(all[0].name, "temps") == 0 && strcmp(all[3].name, "events") == 0);
    CHECK_EQ(all[0].version, 1);
    CHECK(all[0].enabled && !all[2].enabled);
    CHECK(strcmp(all[0].from, "sensors/+/temp") == 0);
    CHECK(strcmp(all[0].to, "store") == 0);
    CHECK(strncmp(all[3].from, "client.connected, client.disconnected", 37) == 0);
    /* A disabled rule may name a sink that is not running, but cannot be enabled. */
    CHECK(strcmp(all[4].name, "mongo_off") == 0 && !all[4].enabled);
    CHECK_EQ(rt_rules_enable("mongo_off", true), RT_EINVAL);
    CHECK(!info("mongo_off").enabled);
    rt_rules_worker_info_t w[4];
    CHECK_EQ(rt_rules_workers(w, 4), 2);
    CHECK(w[0].lua_bytes > 10000 && w[1].lua_bytes > 10000);
    stop();

    /* Each bad set names the file and line; nothing is left running. */
    CHECK(start("tests/rules/syntax", 2, 100000, 8 << 20) == RT_EINVAL &&
          err_has("tests/rules/syntax/b_broken.lua:5:"));
    stop();
    CHECK(start("tests/rules/missing", 2, 100000, 8 << 20) == RT_EINVAL &&
          err_has("tests/rules/missing/nosel.lua:") && err_has("select must be a function"));
    stop();
    CHECK(start("tests/rules/badsink", 2, 100000, 8 << 20) == RT_EINVAL &&
          err_has("tests/rules/badsink/x.lua:6: to: no sink named \"nosuchsink\""));
    stop();
    CHECK(start("tests/rules/dupname", 2, 100000, 8 << 20) == RT_EINVAL &&
          err_has("tests/rules/dupname/b.lua:2: name \"same\" is already used by "
                  "tests/rules/dupname/a.lua"));
    stop();
    /* No directory: no rules, nothing matches. */
    CHECK_EQ(start("tests/rules/none-here", 1, 100000, 8 << 20), 0);
    CHECK_EQ(rt_rules_snapshot(all, 8), 0);
    CHECK_EQ(publish("a/b", "x"), 0);
    stop();
}

static void test_filter_reshape_rows(void)
{
    sh("rm -f %s/rt.db*", dir);
    CHECK_EQ(start("tests/rules/good", 2, 100000, 8 << 20), 0);
    char topic[64], payload[64];
    for (int i = 0; i < 10; i++) {
        snprintf(topic, sizeof(topic), "sensors/s%d/temp", i);
        snprintf(payload, sizeof(payload), "{\"t\": %d}", i * 5);
        CHECK_EQ(publish_from(i % 2 ? "c1" : "c2", topic, payload, 0, 0), 1);
    }
    CHECK_EQ(publish("batch/1", "[1, 2, 3]"), 1);
    CHECK_EQ(publish("batch/2", "[]"), 1);
    CHECK_EQ(publish("other/topic", "x"), 0); /* no rule: one lookup, nothing sent */
    CHECK_EQ(publish("sensors/s1/humidity", "x"), 0);
    CHECK(wait_matched("temps", 10));
    CHECK(wait_matched("each", 2));
    rt_rule_info_t t = info("temps"), e = info("each"), off = info("off");
    CHECK_EQ(t.matched, 10);
    CHECK_EQ(t.passed, 5); /* t = 25..45 */
    CHECK_EQ(t.filtered, 5);
    CHECK_EQ(t.failed, 0);
    CHECK_EQ(t.rows_out, 5);
    CHECK_EQ(e.passed, 1);
    CHECK_EQ(e.filtered, 1);
    CHECK_EQ(e.rows_out, 3);
    CHECK_EQ(off.matched, 0);
    CHECK(wait_written("store", 8));
    CHECK_EQ(sql_int("SELECT count(*) FROM temps WHERE t > 20 AND sensor LIKE 's%'"), 5);
    CHECK_EQ(sql_int("SELECT sum(v) FROM items"), 6);
    CHECK_EQ(sql_int("SELECT count(*) FROM temps WHERE client IN ('c1', 'c2')"), 5);
    /* A payload that is not JSON fails the rule and is counted with its error. */
    CHECK_EQ(publish("sensors/x/temp", "not json"), 1);
    CHECK(wait_matched("temps", 11));
    t = info("temps");
    CHECK_EQ(t.failed_exception, 1);
    CHECK(strstr(t.last_error, "json.decode: unexpected character at byte 1") != NULL);
    /* Enabling the disabled rule makes it match everything. */
    CHECK_EQ(rt_rules_enable("off", true), 0);
    CHECK_EQ(rt_rules_enable("nope", true), RT_ENOTFOUND);
    CHECK_EQ(publish("other/topic", "x"), 1);
    CHECK(wait_matched("off", 1));
    CHECK_EQ(rt_rules_enable("off", false), 0);
    CHECK_EQ(publish("other/topic", "x"), 0);
    stop();
}

static void test_events(void)
{
    CHECK_EQ(start("tests/rules/good", 2, 100000, 8 << 20), 0);
    static const mqtt_user_prop_t users[] = {
        {{(const uint8_t *)"k", 1}, {(const uint8_t *)"v", 1}}};
    rt_bin_t *m = make_publish("m/1", "hello", 5, 1, users, 1);
    rt_rule_origin_t o = {"c1", NULL, "1.2.3.4:5", 42};
    rt_rule_event_t evs[7];
    for (int k = 0; k < 7; k++)
        evs[k] = (rt_rule_event_t){.kind = (rt_rule_event_kind_t)(k + 1),
                                   .qos = -1,
                                   .reason_code = -1,
                                   .proto_ver = -1,
                                   .keepalive = -1,
                                   .clean_start = -1};
    evs[0].proto_ver = 5, evs[0].keepalive = 30, evs[0].clean_start = 1;
    evs[1].reason_code = 0x8E, evs[1].reason = "takeover";
    evs[2].topic = "s/#", evs[2].qos = 1;
    evs[3].topic = "s/#";
    for (int k = 4; k < 7; k++)
        evs[k].canonical = m, evs[k].from_clientid = "pub";
    evs[6].reason_code = 0x97, evs[6].reason = "queue_full";
    for (size_t i = 0; i < 7; i++)
        CHECK_EQ(rt_rules_event(&o, &evs[i]), 1);
    rt_bin_release(m);
    CHECK(wait_matched("events", 7));
    rt_rule_info_t e = info("events");
    CHECK_EQ(e.passed, 7);
    CHECK_EQ(e.failed, 0);
    if (e.failed)
        fprintf(stderr, "  %s\n", e.last_error);
    CHECK_EQ(e.rows_out, 7);
    /* Wrong fields fail the rule's asserts: the event table really carries them. */
    rt_rule_event_t bad = evs[2];
    bad.qos = 2;
    CHECK_EQ(rt_rules_event(&o, &bad), 1);
    CHECK(wait_matched("events", 8));
    CHECK(strstr(info("events").last_error, "session.subscribed") != NULL);
    /* Nobody listening: nothing handed over. */
    CHECK_EQ(rt_rules_enable("events", false), 0);
    CHECK_EQ(rt_rules_event(&o, &evs[0]), 0);
    rt_rule_event_t nonsense = {.kind = 99};
    CHECK_EQ(rt_rules_event(&o, &nonsense), RT_EINVAL);
    stop();
    /* A set without event rules: events cost one atomic load. */
    CHECK_EQ(start("tests/rules/none-here", 1, 100000, 8 << 20), 0);
    CHECK_EQ(rt_rules_event(&o, &evs[0]), 0);
    stop();
}

static void test_broken_rules_isolated(void)
{
    clean_rules();
    write_rule("good.lua",
               "return { name = 'good', from = 'x/#', to = { store = { table = 'good' } },\n"
               "  select = function(msg) return { p = msg.payload } end }\n");
    /* Each misbehaves on real traffic (payload "p") but passes the load-time dry run. */
    write_rule("throws.lua", "return { name = 'throws', from = 'x/#', to = { 'store' },\n"
                             "  select = function(msg)\n"
                             "    error('boom') end }\n");
    write_rule("loops.lua", "return { name = 'loops', from = 'x/#', to = { 'store' },\n"
                            "  select = function(msg) while msg.payload == 'p' do end end }\n");
    write_rule("bomb.lua", "return { name = 'bomb', from = 'x/#', to = { 'store' },\n"
                           "  select = function(msg)\n"
                           "    local t = {} for i = 1, msg.payload == 'p' and 1e9 or 0 do\n"
                           "      t[i] = string.rep('x', 10000) .. i end\n"
                           "  end }\n");
    write_rule("badrow.lua", "return { name = 'badrow', from = 'x/#', to = { 'store' },\n"
                             "  select = function(msg)\n"
                             "    if msg.payload == 'p' then return { f = error } end end }\n");
    sh("rm -f %s/rt.db*", dir);
    CHECK_EQ(start(rules, 2, 100000, 8 << 20), 0);
    int n = 20;
    for (int i = 0; i < n; i++) {
        char c[16];
        snprintf(c, sizeof(c), "c%d", i);
        CHECK_EQ(publish_from(c, "x/y", "p", 0, 0), 1);
    }
    CHECK(wait_matched("good", n) && wait_matched("throws", n) && wait_matched("loops", n) &&
          wait_matched("bomb", n) && wait_matched("badrow", n));
    rt_rule_info_t g = info("good"), t = info("throws"), l = info("loops"), b = info("bomb"),
                   r = info("badrow");
    CHECK_EQ(g.passed, n);
    CHECK_EQ(g.failed, 0);
    CHECK_EQ(t.failed_exception, n);
    CHECK(strstr(t.last_error, "throws.lua:3: boom") != NULL);
    CHECK_EQ(l.failed_budget, n);
    CHECK(strstr(l.last_error, "loops.lua:2: instruction budget of 100000 exceeded") != NULL);
    CHECK_EQ(b.failed_memory, n);
    CHECK(strstr(b.last_error, "not enough memory") != NULL);
    CHECK_EQ(r.failed_exception, n);
    CHECK(strstr(r.last_error, "cannot store a function") != NULL);
    CHECK_EQ(t.matched, t.passed + t.filtered + t.failed);
    CHECK(wait_written("store", (uint64_t)n));
    CHECK_EQ(sql_int("SELECT count(*) FROM good WHERE p = 'p'"), n);
    stop();
}

/* The worker's charged memory (ext_bytes), polled until want says yes or 10 s pass. */
static uint64_t worker_ext(rt_pid_t pid, bool (*want)(uint64_t ext, uint64_t ref), uint64_t ref)
{
    rt_actor_info_t a = {0};
    uint64_t end = test_now_ms() + 10000;
    while (rt_actor_info(pid, &a) == 0 && !want(a.ext_bytes, ref) && test_now_ms() < end)
        test_sleep_ms(2);
    return a.ext_bytes;
}

static bool at_least(uint64_t ext, uint64_t ref)
{
    return ext >= ref;
}

static bool below(uint64_t ext, uint64_t ref)
{
    return ext < ref;
}

/*
** A worker is charged for the Lua state it runs (and its buffers): a rule that keeps a big
** table makes the worker's ext_bytes grow by at least the table's string bytes, and the
** state's memory cap still stops a rule that passes it; the collection and rebuild that
** follow (the hoard is more than half the cap) give the memory back, and the charge drops.
** The runtime's per-actor limit, far under the hoard, kills no worker for it.
*/
static void test_worker_memory(void)
{
    enum { ENTRIES = 12000, ENTRY = 1000, CAP = 20 << 20 };
    _Static_assert((size_t)ENTRIES * ENTRY > CAP / 2 && (size_t)ENTRIES * ENTRY < CAP * 3 / 4,
                   "the hoard fits under the cap but holds more than half of it");
    clean_rules();
    char text[800];
    snprintf(text, sizeof(text),
             "local keep = {}\n"
             "return { name = 'hoard', from = 'h/#', to = { 'store' },\n"
             "  select = function(msg)\n"
             "    if msg.payload == 'grow' then\n"
             "      for i = 1, %d do keep[i] = string.rep('x', %d) .. i end\n"
             "    elseif msg.payload == 'bomb' then\n"
             "      local t = {} for i = 1, 1e9 do t[i] = string.rep('y', 1000) .. i end\n"
             "    end end }\n",
             ENTRIES, ENTRY);
    write_rule("hoard.lua", text);
    sh("rm -f %s/rt.db*", dir);
    max_heap = 1 << 20; /* an actor limit far under the hoard: the state's cap is what counts */
    CHECK_EQ(start(rules, 1, 100000000, CAP), 0);
    max_heap = 0;
    rt_rules_worker_info_t w;
    CHECK_EQ(rt_rules_workers(&w, 1), 1);
    CHECK_EQ(publish("h/1", "noop"), 1); /* the worker takes the set (and its state) */
    CHECK(wait_matched("hoard", 1));
    uint64_t ext0 = worker_ext(w.pid, at_least, 1);
    CHECK(ext0 > 0);

    CHECK_EQ(publish("h/1", "grow"), 1);
    CHECK(wait_matched("hoard", 2));
    uint64_t ext1 = worker_ext(w.pid, at_least, ext0 + (uint64_t)ENTRIES * ENTRY);
    CHECK(ext1 >= ext0 + (uint64_t)ENTRIES * ENTRY);
    CHECK_EQ(rt_rules_workers(&w, 1), 1);
    CHECK(w.lua_bytes >= (uint64_t)ENTRIES * ENTRY && w.lua_bytes + w.c_bytes == ext1);
    uint64_t all, in_workers;
    rt_rules_lua_memory(&all, &in_workers);
    CHECK(in_workers == w.lua_bytes && all >= in_workers);

    CHECK_EQ(publish("h/1", "bomb"), 1);
    CHECK(wait_matched("hoard", 3));
    CHECK_EQ(info("hoard").failed_memory, 1);
    CHECK(worker_ext(w.pid, below, ext1 - (uint64_t)ENTRIES * ENTRY) <
          ext1 - (uint64_t)ENTRIES * ENTRY);
    rt_stats_t rs;
    rt_stats(&rs);
    CHECK_EQ(rs.heap_limit_kills, 0);
    CHECK(rt_alive(w.pid));
    stop();
}

/* One client's messages reach its worker, and its rules, in the order they were published. */
static void test_order_per_client(void)
{
    clean_rules();
    write_rule("order.lua", "local last = {}\n"
                            "return { name = 'order', from = 'o/#', to = {},\n"
                            "  select = function(msg)\n"
                            "    local n, prev = tonumber(msg.payload), last[msg.clientid] or 0\n"
                            "    if n ~= prev + 1 then error(msg.clientid .. ': ' .. prev .. "
                            "' then ' .. tostring(n)) end\n"
                            "    last[msg.clientid] = n\n"
                            "  end }\n");
    CHECK_EQ(start(rules, 2, 100000, 8 << 20), 0);
    /* Clients go to workers by a hash keyed at random each run: with 24 of them, the
       chance that all land on one of the two workers is 2^-23. */
    enum { NCLIENTS = 24 };
    long n = check_scale(600);
    char clients[NCLIENTS][8];
    for (int c = 0; c < NCLIENTS; c++)
        snprintf(clients[c], sizeof(clients[c]), "c%d", c);
    for (long i = 1; i <= n; i++) {
        char p[24];
        snprintf(p, sizeof(p), "%ld", i);
        for (int c = 0; c < NCLIENTS; c++)
            CHECK_EQ(publish_from(clients[c], "o/x", p, 0, 0), 1);
    }
    CHECK(wait_matched("order", NCLIENTS * (uint64_t)n));
    rt_rule_info_t r = info("order");
    CHECK_EQ(r.filtered, NCLIENTS * n);
    CHECK_EQ(r.failed, 0);
    if (r.failed)
        fprintf(stderr, "  %s\n", r.last_error);
    rt_rules_worker_info_t w[2];
    CHECK_EQ(rt_rules_workers(w, 2), 2);
    CHECK(w[0].messages > 0 && w[1].messages > 0); /* the clients spread over both workers */
    stop();
}

static void test_index_1000_rules(void)
{
    clean_rules();
    char name[32], text[256];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof(name), "r%04d.lua", i);
        snprintf(text, sizeof(text),
                 "return { name = 'r%04d', from = { 'dev/%d/+', 'dev/%d/x/#' }, to = {},\n"
                 "  select = function(msg) return { i = %d } end }\n",
                 i, i, i, i);
        write_rule(name, text);
    }
    double t0 = now_s();
    CHECK_EQ(start(rules, 1, 100000, 64 << 20), 0);
    double t_load = now_s() - t0;
    CHECK_EQ(publish("dev/500/a", "x"), 1);
    CHECK_EQ(publish("dev/500/x/y/z", "x"), 1);
    CHECK_EQ(publish("dev/5000/a", "x"), 0);
    CHECK_EQ(publish("dev/500", "x"), 0);
    CHECK(wait_matched("r0500", 2));
    static rt_rule_info_t all[1000];
    CHECK_EQ(rt_rules_snapshot(all, 1000), 1000);
    uint64_t total = 0;
    for (int i = 0; i < 1000; i++)
        total += all[i].matched;
    CHECK_EQ(total, 2);
    /* A miss costs one index lookup whatever the number of rules. */
    rt_bin_t *b = make_publish("dev/nomatch/a", "x", 1, 1, NULL, 0);
    rt_rule_origin_t o = {"c1", NULL, NULL, 0};
    long misses = check_scale(200000);
    t0 = now_s();
    for (long i = 0; i < misses; i++)
        CHECK_EQ(rt_rules_publish(&o, b, 0, 0, NULL), 0);
    double dt = now_s() - t0;
    rt_bin_release(b);
    rt_rules_stats_t st;
    CHECK_EQ(rt_rules_stats(&st), 0);
    CHECK_EQ(st.rules, 1000);
    CHECK(st.index_bytes > 1000 * sizeof(rt_rule_info_t) / 8 && st.lua_bytes > 1000 * 500);
    printf("rules: 1000 rules: Lua %llu bytes, index %llu bytes, texts %llu bytes\n",
           (unsigned long long)st.lua_bytes, (unsigned long long)st.index_bytes,
           (unsigned long long)st.text_bytes);
    printf("rules: 1000 rules loaded in %.0f ms (3 states); a miss costs %.0f ns\n", t_load * 1e3,
           dt / (double)misses * 1e9);
    stop();
}

static void test_reload(void)
{
    clean_rules();
    write_rule("a.lua", "return { name = 'a', from = 'r/#', to = {},\n"
                        "  select = function(msg) return { v = 1 } end }\n");
    CHECK_EQ(start(rules, 2, 100000, 8 << 20), 0);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(publish("r/1", "x"), 1);
    CHECK(wait_matched("a", 3));
    char *json = NULL;
    CHECK_EQ(rt_rules_test("a", "r/1", "x", 1, 0, &json, err, sizeof(err)), 0);
    CHECK(json && strstr(json, "\"v\" : 1"));
    free(json);

    /* A broken file: the reload fails naming it, and the old set keeps running. */
    write_rule("a.lua", "return { name = 'a', from = 'r/#', to = {},\n"
                        "  select = function(msg)\n"
                        "    return { v = 2 ] end }\n");
    write_rule("b.lua", "return { name = 'b', from = 'r/#', to = {}, select = function() end }\n");
    CHECK(rt_rules_reload(err, sizeof(err)) == RT_EINVAL && err_has("/a.lua:3:"));
    CHECK_EQ(info("a").version, 1);
    CHECK_EQ(info("b").version, 0); /* not there */
    CHECK_EQ(publish("r/1", "x"), 1);
    CHECK(wait_matched("a", 4));
    /* An unknown sink is refused the same way. */
    write_rule("a.lua", "return { name = 'a', from = 'r/#', to = { 'gone' },\n"
                        "  select = function(msg) return { v = 2 } end }\n");
    CHECK(rt_rules_reload(err, sizeof(err)) == RT_EINVAL && err_has("no sink named \"gone\""));
    CHECK_EQ(info("a").version, 1);

    /* Fixed: swapped in, metrics carried by name, the new code runs. */
    write_rule("a.lua", "return { name = 'a', from = 'r/#', to = {},\n"
                        "  select = function(msg) return { v = 2 } end }\n");
    CHECK_EQ(rt_rules_reload(err, sizeof(err)), 0);
    rt_rule_info_t a = info("a");
    CHECK_EQ(a.version, 2);
    CHECK_EQ(a.matched, 4);
    CHECK_EQ(info("b").version, 2);
    CHECK_EQ(publish("r/1", "x"), 1);
    CHECK(wait_matched("a", 5) && wait_matched("b", 1));
    CHECK_EQ(info("a").passed, 5);
    CHECK_EQ(info("b").filtered, 1);
    CHECK_EQ(rt_rules_test("a", "r/1", "x", 1, 0, &json, err, sizeof(err)), 0);
    CHECK(json && strstr(json, "\"v\" : 2"));
    free(json);

    /* Reloading under load: every message is handled by exactly one version. */
    long n = check_scale(20000);
    for (long i = 0; i < n; i++) {
        CHECK_EQ(publish_from(i % 3 ? "p" : "q", "r/2", "x", 0, 0), 1);
        if (i % (n / 4) == 0)
            CHECK_EQ(rt_rules_reload(err, sizeof(err)), 0);
    }
    CHECK(wait_matched("a", 5 + (uint64_t)n));
    a = info("a");
    CHECK_EQ(a.matched, 5 + n);
    CHECK_EQ(a.passed, 5 + n);
    CHECK_EQ(a.version, 6);
    stop();
}

/* Every kind of bad reload names the file and line, and leaves the running set alone. */
static void test_reload_errors(void)
{
    clean_rules();
    write_rule("a.lua", "return { name = 'a', from = 'r/#', to = {},\n"
                        "  select = function(msg) return { v = 1 } end }\n");
    CHECK_EQ(start(rules, 2, 100000, 8 << 20), 0);
    struct {
        const char *text;
        const char *want; /* after rules_dir */
    } cases[] = {
        /* syntax */
        {"return { name = 'a', from = 'r/#', to = {},\n  select = function(msg)\n"
         "    return { v = 2 ] end }\n",
         "/a.lua:3: "},
        /* a runtime error in the dry run on the file's sample */
        {"return { name = 'a', from = 'r/#', to = {},\n"
         "  sample = { topic = 'r/1', payload = 'x' },\n"
         "  select = function(msg)\n"
         "    return { v = msg.nope.x } end }\n",
         "/a.lua:4: dry run on its sample message failed: attempt to index a nil value"},
        /* the same from a C function (no position in its message) */
        {"return { name = 'a', from = 'r/#', to = {},\n"
         "  sample = { topic = 'r/1', payload = 'x' },\n"
         "  select = function(msg)\n"
         "    local d = json.decode(msg.payload)\n"
         "    return d end }\n",
         "/a.lua:4: dry run on its sample message failed: json.decode:"},
        /* an unknown sink */
        {"return { name = 'a', from = 'r/#',\n  to = { 'gone' },\n"
         "  select = function(msg) return { v = 2 } end }\n",
         "/a.lua:2: to: no sink named \"gone\""},
        /* bad fields: a wrong type, an unknown one, a missing one */
        {"return { name = 'a', from = 'r/#', to = {},\n  enabled = 'yes',\n"
         "  select = function(msg) return { v = 2 } end }\n",
         "/a.lua:2: enabled must be true or false"},
        {"return { name = 'a', from = 'r/#', to = {},\n  selcet = function(msg) end }\n",
         "/a.lua:2: unknown field \"selcet\""},
        {"local x = 1\n\nreturn { name = 'a', from = 'r/#', to = {} }\n",
         "/a.lua:3: select must be a function"},
        {"return { name = 'a', from = 'r/#/x', to = {},\n"
         "  select = function(msg) return { v = 2 } end }\n",
         "/a.lua:1: from: \"r/#/x\" is neither a topic filter nor an event"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_rule("a.lua", cases[i].text);
        err[0] = 0;
        CHECK_EQ(rt_rules_reload(err, sizeof(err)), RT_EINVAL);
        char want[512];
        snprintf(want, sizeof(want), "%s%s", rules, cases[i].want);
        bool ok = strncmp(err, want, strlen(want)) == 0;
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "  case %zu: \"%s\"; wanted \"%s\"\n", i, err, want);
        /* The old set runs on: same version, same code, counting on. */
        CHECK_EQ(info("a").version, 1);
        CHECK_EQ(publish("r/1", "x"), 1);
        CHECK(wait_matched("a", i + 1));
        CHECK_EQ(info("a").passed, i + 1);
    }
    /* A directory gone for a moment (mid-deploy) does not empty the set. */
    char moved[200];
    snprintf(moved, sizeof(moved), "%s.moved", rules);
    CHECK_EQ(rename(rules, moved), 0);
    CHECK_EQ(rt_rules_reload(err, sizeof(err)), RT_EINVAL);
    CHECK(err_has("cannot open"));
    CHECK_EQ(rename(moved, rules), 0);
    CHECK_EQ(info("a").version, 1);
    char *json = NULL;
    CHECK_EQ(rt_rules_test("a", "r/1", "x", 1, 0, &json, err, sizeof(err)), 0);
    CHECK(json && strstr(json, "\"v\" : 1"));
    free(json);
    stop();
}

/*
** enabled across reloads: the operator's switch stays while the file's enabled stays as it
** was; a file that changes its enabled wins; a restart takes the files.
*/
static void test_reload_enabled(void)
{
    clean_rules();
    write_rule("a.lua", "return { name = 'a', from = 'r/#', to = {},\n"
                        "  select = function(msg) return { v = 1 } end }\n");
    write_rule("b.lua", "return { name = 'b', from = 'r/#', to = {}, enabled = false,\n"
                        "  select = function(msg) return { v = 1 } end }\n");
    CHECK_EQ(start(rules, 1, 100000, 8 << 20), 0);
    CHECK(info("a").enabled && !info("a").overridden && !info("b").enabled);
    CHECK_EQ(rt_rules_enable("a", false), 0);
    CHECK_EQ(rt_rules_enable("b", true), 0);
    CHECK(!info("a").enabled && info("a").overridden && info("b").enabled && info("b").overridden);
    /* An unrelated change (b's description) and a reload: both switches stay. */
    write_rule("b.lua", "return { name = 'b', from = 'r/#', to = {}, enabled = false,\n"
                        "  description = 'edited',\n"
                        "  select = function(msg) return { v = 2 } end }\n");
    CHECK_EQ(rt_rules_reload(err, sizeof(err)), 0);
    CHECK_EQ(info("a").version, 2);
    CHECK(!info("a").enabled && info("a").overridden && info("b").enabled);
    CHECK_EQ(publish("r/1", "x"), 1);
    CHECK(wait_matched("b", 1));
    CHECK_EQ(info("a").matched, 0);
    /* a's file now says enabled = false, then true again: the file's new word wins. */
    write_rule("a.lua", "return { name = 'a', from = 'r/#', to = {}, enabled = false,\n"
                        "  select = function(msg) return { v = 1 } end }\n");
    CHECK_EQ(rt_rules_reload(err, sizeof(err)), 0);
    CHECK(!info("a").enabled && !info("a").overridden);
    write_rule("a.lua", "return { name = 'a', from = 'r/#', to = {}, enabled = true,\n"
                        "  select = function(msg) return { v = 1 } end }\n");
    CHECK_EQ(rt_rules_reload(err, sizeof(err)), 0);
    CHECK(info("a").enabled && !info("a").overridden && info("b").enabled);
    /* Switching b back to what its file says ends the override: a reload keeps the file's. */
    CHECK_EQ(rt_rules_enable("b", false), 0);
    CHECK(!info("b").overridden);
    CHECK_EQ(rt_rules_reload(err, sizeof(err)), 0);
    CHECK(!info("b").enabled);
    /* A failed reload changes nothing, the switches included. */
    CHECK_EQ(rt_rules_enable("b", true), 0);
    write_rule("c.lua", "return { name = 'c' ");
    CHECK_EQ(rt_rules_reload(err, sizeof(err)), RT_EINVAL);
    CHECK(info("b").enabled && info("b").overridden && info("a").version == 5);
    sh("rm -f %s/c.lua", rules);
    /* A restart takes the files as they are. */
    stop();
    CHECK_EQ(start(rules, 1, 100000, 8 << 20), 0);
    CHECK(info("a").enabled && !info("b").enabled);
    stop();
}

/*
** A swap while a worker holds rows for rule_flush_ms and durable acks wait on the sink: the
** old version's rows are submitted, every ack comes once, and each message is in the table
** once, written by one version.
*/
static atomic_long acks, acks_ok, acks_failed, ack_tokens, marker_acks;
static void test_reload_in_flight(void);
#define MARKER_TOKEN UINT64_MAX /* ack_markers' publishes: counted apart from the tokens */

/* The stand-in for a connection: counts RT_RULES_MSG_DURABLE acks. */
static atomic_int last_ack_status;

static void ack_handle(rt_actor_t *self, void *state, rt_msg_t *m)
{
    if (m->tag != RT_RULES_MSG_DURABLE)
        return;
    rt_rules_durable_t d;
    memcpy(&d, m->data, sizeof(d));
    if (d.token == MARKER_TOKEN)
        atomic_fetch_add(&marker_acks, 1);
    else
        atomic_fetch_add(&ack_tokens, (long)d.token);
    atomic_store(&last_ack_status, d.status);
    atomic_fetch_add(d.status == 0 ? &acks_ok : &acks_failed, 1);
    atomic_fetch_add(&acks, 1);
}

static const rt_actor_type_t ack_type = {.name = "test_ack", .handle = ack_handle};

/* A fresh stand-in connection, with the counters zeroed. */
static rt_pid_t ack_actor(void)
{
    atomic_store(&acks, 0);
    atomic_store(&acks_ok, 0);
    atomic_store(&acks_failed, 0);
    atomic_store(&ack_tokens, 0);
    rt_pid_t ack = 0;
    CHECK_EQ(rt_spawn(&ack_type, NULL, &ack), 0);
    return ack;
}

/*
** Publishes a durable marker on d/x from each of the n clients and waits for the markers'
** acks. A client's messages go to one worker, in order; a worker submits its flights to the
** sink in order and acks a flight's entries in the order they were made: an ack still owed
** for anything those clients published before comes before their markers' acks.
*/
static void ack_markers(rt_pid_t ack, const char *const *clients, long n)
{
    long before = atomic_load(&marker_acks);
    for (long i = 0; i < n; i++)
        CHECK_EQ(publish_from(clients[i], "d/x", "marker", ack, MARKER_TOKEN), 2);
    CHECK(wait_at_least(&marker_acks, before + n));
}

static void versioned_rule(int v)
{
    char text[512];
    snprintf(text, sizeof(text),
             "return { name = 'd', from = 'd/#', durable = true,\n"
             "  to = { store = { table = 'inflight' } },\n"
             "  select = function(msg) return { p = msg.payload, v = %d } end }\n",
             v);
    write_rule("d.lua", text);
}

static void test_reload_in_flight(void)
{
    clean_rules();
    sh("rm -f %s/rt.db*", dir);
    versioned_rule(1);
    flush_ms = 300; /* rows wait in the worker well past the swap */
    CHECK_EQ(start(rules, 2, 100000, 8 << 20), 0);
    flush_ms = -1;
    rt_pid_t ack = ack_actor();
    long n = 200, versions = 4;
    for (long v = 1; v <= versions; v++) {
        for (long i = 0; i < n; i++) {
            char c[16], p[32];
            snprintf(c, sizeof(c), "c%ld", i % 5);
            snprintf(p, sizeof(p), "m%ld", (v - 1) * n + i);
            CHECK_EQ(publish_from(c, "d/x", p, ack, (uint64_t)i), 2);
        }
        /* The rows of this version's messages are still batched (or not yet run). */
        rt_rules_worker_info_t w[2];
        rt_rules_workers(w, 2);
        if (v == 1)
            CHECK(w[0].pending_durable + w[1].pending_durable > 0 || atomic_load(&acks) < n);
        if (v < versions) {
            versioned_rule((int)v + 1);
            CHECK_EQ(rt_rules_reload(err, sizeof(err)), 0);
        }
    }
    CHECK(wait_at_least(&acks, n * versions));
    CHECK_EQ(atomic_load(&acks_ok), n * versions);
    for (long v = 1; v <= versions; v++) {
        char q[128];
        snprintf(q, sizeof(q), "SELECT count(*) FROM inflight WHERE v = %ld", v);
        CHECK_EQ(sql_int(q), n);
    }
    CHECK_EQ(sql_int("SELECT count(DISTINCT p) FROM inflight"), n * versions);
    CHECK_EQ(info("d").passed, n * versions);
    CHECK_EQ(info("d").version, versions);
    /* Once each: a second ack for any of them would come before the markers' acks. */
    const char *const senders[] = {"c0", "c1", "c2", "c3", "c4"};
    ack_markers(ack, senders, 5);
    CHECK_EQ(atomic_load(&acks), n * versions + 5);
    stop();
}

static void test_durable(void)
{
    clean_rules();
    /* Two durable rules on d/# into two tables: one ack per message, after both commits. */
    write_rule("d1.lua", "return { name = 'd1', from = 'd/#', durable = true,\n"
                         "  to = { store = { table = 'd1' } },\n"
                         "  select = function(msg) return { p = msg.payload } end }\n");
    write_rule("d2.lua",
               "return { name = 'd2', from = 'd/#', durable = true,\n"
               "  to = { store = { table = 'd2' } },\n"
               "  select = function(msg) return { { p = msg.payload }, { p = 'x' } } end }\n");
    write_rule("f.lua", "return { name = 'f', from = 'f/#', durable = true, to = { 'store' },\n"
                        "  select = function(msg) return nil end }\n");
    write_rule("e.lua", "return { name = 'e', from = 'e/#', durable = true, to = { 'store' },\n"
                        "  select = function(msg) error('no') end }\n");
    write_rule("n.lua", "return { name = 'n', from = 'n/#', to = { 'store' },\n"
                        "  select = function(msg) return { p = msg.payload } end }\n");
    sh("rm -f %s/rt.db*", dir);
    CHECK_EQ(start(rules, 2, 100000, 8 << 20), 0);
    rt_pid_t ack = ack_actor();
    long n = 50, tokens = 0;
    for (long i = 1; i <= n; i++) {
        char c[16], p[16];
        snprintf(c, sizeof(c), "c%ld", i % 7);
        snprintf(p, sizeof(p), "m%ld", i);
        CHECK_EQ(publish_from(c, "d/x", p, ack, (uint64_t)i), 2);
        tokens += i;
    }
    CHECK(wait_at_least(&acks, n));
    CHECK_EQ(atomic_load(&acks_ok), n);
    CHECK_EQ(atomic_load(&ack_tokens), tokens);
    /* Every acked row is in the database. */
    CHECK_EQ(sql_int("SELECT count(*) FROM d1"), n);
    CHECK_EQ(sql_int("SELECT count(*) FROM d2"), 2 * n);
    rt_rules_worker_info_t w[2];
    rt_rules_workers(w, 2);
    CHECK_EQ(w[0].pending_durable + w[1].pending_durable, 0);
    /* Filtered: acked at once, committed (nothing to write). */
    CHECK_EQ(publish_from("c1", "f/x", "p", ack, 1000), 2);
    CHECK(wait_at_least(&acks, n + 1));
    CHECK_EQ(atomic_load(&acks_ok), n + 1);
    /* A durable rule that fails: acked with an error. */
    CHECK_EQ(publish_from("c1", "e/x", "p", ack, 1001), 2);
    CHECK(wait_at_least(&acks, n + 2));
    CHECK_EQ(atomic_load(&acks_failed), 1);
    CHECK_EQ(atomic_load(&last_ack_status), RT_EINVAL);
    /* Not durable: no ack promised; no ack_pid: not durable either. */
    CHECK_EQ(publish_from("c1", "n/x", "p", ack, 1002), 1);
    CHECK_EQ(publish_from("c1", "d/x", "p", 0, 0), 1);
    CHECK(wait_matched("n", 1) && wait_matched("d1", (uint64_t)n + 1));
    /* c1's worker took both before the marker: an ack for either would come before its. */
    const char *const sender[] = {"c1"};
    ack_markers(ack, sender, 1);
    CHECK_EQ(atomic_load(&acks), n + 2 + 1);
    stop();
}

/* Stopping hands every row already taken to the sinks, which write it before they stop. */
static void test_stop_flushes(void)
{
    sh("rm -f %s/rt.db*", dir);
    CHECK_EQ(start_sink("archive", "etc/rules", 2, 1000000, 64 << 20), 0);
    long n = check_scale(20000);
    for (long i = 0; i < n; i++)
        CHECK_EQ(publish_from(i % 2 ? "s1" : "s2", "stop/x", "p", 0, 0), 1);
    rt_rules_stop();
    CHECK_EQ(publish("stop/x", "late"), 0); /* stopped: nothing is taken */
    stop();
    CHECK_EQ(sql_int("SELECT count(*) FROM rows WHERE topic = 'stop/x'"), n);
}

static void test_rules_test(void)
{
    CHECK_EQ(start("tests/rules/good", 1, 100000, 8 << 20), 0);
    char *json = NULL;
    CHECK_EQ(
        rt_rules_test("temps", "sensors/s9/temp", "{\"t\": 30.5}", 11, 1, &json, err, sizeof(err)),
        0);
    CHECK(json && strstr(json, "\"sensor\" : \"s9\"") && strstr(json, "\"t\" : 30.5") &&
          strstr(json, "\"client\" : \"rt_rules_test\"") && json[0] == '[');
    free(json);
    CHECK_EQ(rt_rules_test("temps", "sensors/s9/temp", "{\"t\": 3}", 8, 1, &json, err, sizeof(err)),
             0);
    CHECK(json && strcmp(json, "[]") == 0);
    free(json);
    CHECK_EQ(rt_rules_test("each", "batch/1", "[\"a\", 2]", 8, 0, &json, err, sizeof(err)), 0);
    CHECK(json && strstr(json, "\"v\" : \"a\"") && strstr(json, "\"v\" : 2") &&
          strstr(json, "},{"));
    free(json);
    CHECK_EQ(rt_rules_test("temps", "sensors/s9/temp", "oops", 4, 1, &json, err, sizeof(err)),
             RT_EINVAL);
    CHECK(json == NULL && err_has("json.decode"));
    CHECK_EQ(rt_rules_test("nope", "a", "", 0, 0, &json, err, sizeof(err)), RT_ENOTFOUND);
    /* Nothing was counted or written. */
    CHECK_EQ(info("temps").matched, 0);
    stop();
    /* Bytes that are not UTF-8 show as the binary a sink would store. */
    clean_rules();
    write_rule("bin.lua", "return { name = 'bin', from = '#', to = {},\n"
                          "  select = function(msg) return { p = msg.payload } end }\n");
    CHECK_EQ(start(rules, 1, 100000, 8 << 20), 0);
    CHECK_EQ(rt_rules_test("bin", "a", "\xff\x00", 2, 0, &json, err, sizeof(err)), 0);
    CHECK(json && strstr(json, "$binary") && strstr(json, "/wA="));
    free(json);
    stop();
}

/* The shipped examples load against the shipped sink names and do what they say. */
static void test_examples(void)
{
    sh("rm -f %s/rt.db*", dir);
    CHECK_EQ(start_sink("archive", "etc/rules", 2, 1000000, 64 << 20), 0);
    if (err[0])
        fprintf(stderr, "  %s\n", err);
    CHECK(info("archive").enabled && !info("mongo_sensors").enabled &&
          !info("republish_alerts").enabled);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(publish_from("c9", "any/topic", "\x01\x02 payload", 0, 0), 1);
    CHECK_EQ(publish_from("c9", "$SYS/x", "p", 0, 0), 0);
    CHECK(wait_written("archive", 10));
    CHECK_EQ(sql_int("SELECT count(*) FROM rows WHERE topic = 'any/topic' AND clientid = 'c9' "
                     "AND qos = 1 AND retain = 0 AND ts = 42"),
             10);
    char *json = NULL;
    CHECK_EQ(rt_rules_test("mongo_sensors", "sensors/s7/data",
                           "{\"temp\": 20.5, \"tags\": [\"a\"]}", 29, 0, &json, err, sizeof(err)),
             0);
    CHECK(json && strstr(json, "\"sensor\" : \"s7\"") && strstr(json, "\"temp\" : 20.5") &&
          strstr(json, "\"tags\" : [ \"a\" ]"));
    free(json);
    CHECK_EQ(
        rt_rules_test("mongo_sensors", "sensors/s7/data", "garbage", 7, 0, &json, err, sizeof(err)),
        0);
    CHECK(json && strcmp(json, "[]") == 0);
    free(json);
    CHECK_EQ(rt_rules_test("republish_alerts", "sensors/s1/temp", "{\"temp\": 31.5}", 14, 0, &json,
                           err, sizeof(err)),
             0);
    CHECK(json && strstr(json, "\"temp\" : 31.5") && strstr(json, "\"sensor\" : \"s1\""));
    free(json);
    stop();
}

static void test_bench(void)
{
    clean_rules();
    write_rule("bench.lua",
               "return { name = 'bench', from = '#', to = {},\n"
               "  select = function(msg)\n"
               "    return { topic = msg.topic, payload = msg.payload, qos = msg.qos,\n"
               "             clientid = msg.clientid, ts = msg.timestamp } end }\n");
    CHECK_EQ(start(rules, 1, 100000, 64 << 20), 0);
    long n = check_scale(200000);
    rt_bin_t *b = make_publish("bench/topic/1", "0123456789", 10, 1, NULL, 0);
    rt_rule_origin_t o = {"bench-client", "user", "127.0.0.1:1234", 0};
    double t0 = now_s();
    for (long i = 0; i < n; i++)
        if (rt_rules_publish(&o, b, 0, 0, NULL) != 1)
            break;
    CHECK(wait_matched("bench", (uint64_t)n));
    double dt = now_s() - t0;
    rt_bin_release(b);
    rt_rule_info_t r = info("bench");
    CHECK_EQ(r.rows_out, n);
    rt_rules_worker_info_t w;
    rt_rules_workers(&w, 1);
    printf("rules: %ld messages through one worker (10-byte payload, 5-field row as BSON, no sink) "
           "in %.3f s: %.0f msg/s; Lua state %llu bytes, buffers %llu bytes\n",
           n, dt, n / dt, (unsigned long long)w.lua_bytes, (unsigned long long)w.c_bytes);
    stop();

    /* The shipped archive rule into a real SQLite sink (WAL, synchronous=normal), 2 workers. */
    sh("rm -f %s/rt.db*", dir);
    CHECK_EQ(start_sink("archive", "etc/rules", 2, 1000000, 64 << 20), 0);
    n = check_scale(100000);
    b = make_publish("bench/topic/1", "0123456789", 10, 1, NULL, 0);
    t0 = now_s();
    for (long i = 0; i < n; i++) {
        o.clientid = i % 2 ? "bench-a" : "bench-b";
        if (rt_rules_publish(&o, b, 0, 0, NULL) != 1)
            break;
    }
    CHECK(wait_matched("archive", (uint64_t)n));
    double t_rules = now_s() - t0;
    CHECK(wait_written("archive", (uint64_t)n));
    dt = now_s() - t0;
    rt_bin_release(b);
    CHECK_EQ(sql_int("SELECT count(*) FROM rows"), n);
    printf("rules: %ld messages through etc/rules/archive.lua into SQLite: rules done in %.3f s, "
           "committed in %.3f s: %.0f msg/s end to end\n",
           n, t_rules, dt, n / dt);
    stop();
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/rt-test-rules-%d", (int)getpid());
    snprintf(rules, sizeof(rules), "%s/rules", dir);
    sh("rm -rf %s", dir);
    mkdir(dir, 0755);
    RUN(test_load);
    RUN(test_filter_reshape_rows);
    RUN(test_events);
    RUN(test_broken_rules_isolated);
    RUN(test_worker_memory);
    RUN(test_order_per_client);
    RUN(test_index_1000_rules);
    RUN(test_reload);
    RUN(test_reload_errors);
    RUN(test_reload_enabled);
    RUN(test_reload_in_flight);
    RUN(test_durable);
    RUN(test_stop_flushes);
    RUN(test_rules_test);
    RUN(test_examples);
    RUN(test_bench);
    sh("rm -rf %s", dir);
    return CHECK_SUMMARY();
}
