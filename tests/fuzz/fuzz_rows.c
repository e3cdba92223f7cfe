/*
** A rule's rows on their way to the sinks: the input is a message payload, JSON, that a rule
** returns as its row(s) (strings "hex:..." turned into their bytes first, so rows also hold
** binary, NUL and non-UTF-8 values and keys). rules/rule_vm.c converts them to BSON; the
** SQLite sink (actors/sink_sqlite.c) makes tables and columns from them and inserts them;
** the MongoDB sink's admission (actors/sink_mongo.c) gives each an _id. A row may be
** refused (with a reason) anywhere along the way, but never crash or corrupt what follows.
*/
#include <bson/bson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rule_vm.h"
#include "sink_impl.h"

static const char rule[] =
    "local function raw(v)\n"
    "  if type(v) == 'string' and v:sub(1, 4) == 'hex:' then\n"
    "    return (v:sub(5):gsub('%x%x', function(h) return string.char(tonumber(h, 16)) end))\n"
    "  elseif type(v) == 'table' then\n"
    "    local t = {}\n"
    "    for k, x in pairs(v) do t[raw(k)] = raw(x) end\n"
    "    return t\n"
    "  end\n"
    "  return v\n"
    "end\n"
    "return { name = 'fuzz', from = '#', to = 'db',\n"
    "         select = function(msg) return raw(json.decode(msg.payload)) end }\n";

#define RESTART_EVERY 2000 /* inputs per database: tables and columns pile up otherwise */

static rt_rule_vm_t *vm;
static rt_sink_t sink;
static char dir[64];
static unsigned runs;

static void remove_database(void)
{
    static const char *const suffixes[] = {"", "-wal", "-shm", "-journal"};
    rt_sink_sqlite_driver.close(&sink);
    for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/db.db%s", dir, suffixes[i]);
        unlink(path);
    }
}

static void cleanup(void)
{
    remove_database();
    rmdir(dir);
}

static void restart_database(void)
{
    remove_database();
    if (rt_sink_sqlite_driver.open(&sink))
        abort();
}

static void setup(void)
{
    rt_rule_spec_t spec;
    char err[512];
    if (rt_rule_vm_new(64u << 20, 1000000, &vm) ||
        rt_rule_vm_load(vm, "fuzz.lua", rule, strlen(rule), &spec, err, sizeof err)) {
        fprintf(stderr, "fuzz_rows: %s\n", err);
        abort();
    }
    rt_rule_spec_free(&spec);
    snprintf(dir, sizeof dir, "/tmp/rt-fuzz-rows-XXXXXX");
    if (!mkdtemp(dir))
        abort();
    snprintf(sink.name, sizeof sink.name, "db");
    snprintf(sink.spill_path, sizeof sink.spill_path, "%s/db.spill", dir);
    pthread_mutex_init(&sink.err_lock, NULL);
    rt_conf_section_t sec = {.name = "db"};
    if (rt_sink_sqlite_driver.configure(&sink, &sec, err, sizeof err))
        abort();
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!vm)
        setup();
    if (runs++ % RESTART_EVERY == 0)
        restart_database();
    rt_rule_input_t in = {.topic = "t",
                          .topic_len = 1,
                          .payload = data,
                          .payload_len = size,
                          .qos = 0,
                          .retain = 0,
                          .clientid = "c",
                          .reason_code = -1,
                          .proto_ver = -1,
                          .keepalive = -1,
                          .clean_start = -1};
    rt_buf_t out = {0};
    uint32_t nrows = 0;
    char err[512];
    rt_rule_outcome_t o = rt_rule_vm_run(vm, 0, &in, &out, &nrows, err, sizeof err);
    if (o != RT_RULE_PASSED || nrows == 0) {
        rt_buf_free(&out);
        return 0;
    }
    /* Rows are BSON that libbson reads back, each with its length. */
    const uint8_t *docs = (const uint8_t *)out.data;
    sink_row_t *rows = calloc(nrows, sizeof *rows);
    size_t off = 0;
    for (uint32_t i = 0; i < nrows; i++) {
        bson_t doc;
        if (out.len - off < 5 || !bson_init_static(&doc, docs + off, rt__sink_doc_len(docs + off)))
            abort();
        rows[i].doc = docs + off;
        rows[i].len = doc.len;
        off += doc.len;
    }
    if (off != out.len)
        abort();
    int rc = rt_sink_sqlite_driver.write(&sink, rows, nrows);
    if (rc != 0 && rc != RT_EAGAIN)
        abort();
    if (rc == RT_EAGAIN) /* as drive() does after a failed batch */
        restart_database();

    rt_bin_t *bin = rt_bin_alloc(out.len);
    memcpy(rt_bin_data(bin), out.data, out.len);
    bin = rt_sink_mongo_driver.admit(NULL, bin, nrows);
    const uint8_t *p = rt_bin_data(bin);
    off = 0;
    for (uint32_t i = 0; i < nrows; i++) {
        bson_t doc;
        if (!bson_init_static(&doc, p + off, rt__sink_doc_len(p + off)) ||
            !bson_has_field(&doc, "_id"))
            abort();
        off += doc.len;
    }
    if (off != rt_bin_len(bin))
        abort();
    rt_bin_release(bin);
    free(rows);
    rt_buf_free(&out);
    return 0;
}
