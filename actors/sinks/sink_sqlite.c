/*
** The SQLite sink driver: one connection in WAL mode, one transaction per batch.
** A row's keys are its columns: a missing table is created from the declared
** `columns` (if any) and the first row's keys, and a key the table lacks is
** added with ALTER TABLE, in the batch's own transaction (so a failed batch
** leaves no half-made schema). BSON types map to SQLite's: integers, booleans and
** dates to INTEGER, doubles to REAL, binary to BLOB, strings and everything else
** (documents and arrays as JSON) to TEXT. Inserts are prepared once per
** (table, key list) and cached.
*/
#include <bson/bson.h>
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "sink_impl.h"
#include "sqlite_mem.h"
#include "store.h"

#define SQ_TABLE_LEN 128       /* bytes in a table name */
#define SQ_STMT_CACHE 32       /* prepared inserts kept */
#define SQ_BUSY_MS_DEFAULT 200 /* how long a write waits for another connection's lock */

typedef struct sq_table_s {
    char name[SQ_TABLE_LEN];
    unsigned ncols;
    size_t cap;
    char **cols;
    uint64_t batch; /* the last batch that wrote to it (sq_t.batches) */
    sq_part_t part; /* where its rows go (its newest partition, with retention) */
} sq_table_t;

typedef struct sq_stmt_s {
    char *sig; /* table \0 key \0 key ... \0\0 */
    size_t siglen;
    sqlite3_stmt *st;
    uint64_t used; /* LRU clock */
} sq_stmt_t;

typedef struct sq_column_s {
    char name[64];
    char type[16];
    long pos; /* index in a listed schema ({"ts integer", ...}); 0 for name = "type" */
} sq_column_t;

typedef struct sq_s {
    char file[512];
    char table[SQ_TABLE_LEN];
    bool sync_full;
    int busy_ms;
    sq_column_t *declared; /* the `columns` schema, for tables this sink creates */
    unsigned ndeclared;

    sqlite3 *db;
    sq_table_t *tables;
    unsigned ntables;
    size_t tables_cap;
    sq_stmt_t cache[SQ_STMT_CACHE];
    uint64_t clock;
    rt_buf_t sig;     /* scratch for building signatures */
    rt_buf_t sql;     /* scratch for SQL text */
    int last;         /* SQLite's code for the last statement that failed */
    uint64_t batches; /* write calls so far */
    sq_retention_t ret;
    uint64_t ret_gen; /* ret.gen when the tables were read: a step since changes them */
} sq_t;

static const char *const sq_sync_modes[] = {"full", "normal", NULL};
static const char *const sql_types[] = {"integer", "real", "text", "blob", "numeric", "json", NULL};

static const rt_setting_t sqlite_keys[] = {
    {.name = "sinks.<name>(sqlite).file",
     .type = RT_SET_PATH,
     .text = "<name>.db",
     .doc = "the database file, relative to data_dir"},
    {.name = "sinks.<name>(sqlite).table",
     .type = RT_SET_STRING,
     .text = "messages",
     .doc = "the table rows go to when a rule names none"},
    {.name = "sinks.<name>(sqlite).synchronous",
     .type = RT_SET_STRING,
     .text = "full",
     .choices = sq_sync_modes,
     .doc = "full: a batch is on disk when acknowledged; normal: it may be lost in a power cut"},
    {.name = "sinks.<name>(sqlite).busy_ms",
     .type = RT_SET_INT,
     .num = SQ_BUSY_MS_DEFAULT,
     .unit = "ms",
     .min = 0,
     .max = 60000,
     .doc = "a write waits for a lock another connection holds"},
    {.name = "sinks.<name>(sqlite).columns.<column>",
     .type = RT_SET_PREFIX,
     .doc = "a column's type: integer, real, text, blob, numeric or json"},
    {.name = "sinks.<name>(sqlite).retention.max_rows",
     .type = RT_SET_INT,
     .text = "no limit",
     .unit = "rows",
     .min = 1,
     .max = 1e15,
     .doc = "kept per table; the oldest beyond are deleted, 1/16 of it at a time"},
    {.name = "sinks.<name>(sqlite).retention.max_age",
     .type = RT_SET_INT,
     .text = "no limit",
     .unit = "seconds",
     .min = 1,
     .max = 1e10,
     .doc = "a row is kept after it was written"},
    {.name = "sinks.<name>(sqlite).retention.max_bytes",
     .type = RT_SET_INT,
     .text = "no limit",
     .unit = "bytes",
     .min = 1 << 20,
     .max = 1e15,
     .doc = "of database pages in use; past it the oldest rows are deleted"},
    {.name = "sinks.<name>(sqlite).retention.zero_deleted",
     .type = RT_SET_BOOL,
     .text = "false",
     .doc = "zero the pages of deleted rows (SQLite's secure_delete), at about the cost of "
            "writing them again"},
    {.name = NULL},
};

/* ---- Scratch strings ---- */

/* A scratch buffer emptied for its next use; a growth that failed before is forgotten. */
static rt_buf_t *reuse_scratch(rt_buf_t *b)
{
    if (b->oom)
        rt_buf_free(b); /* the memory a failed growth got back is not kept either */
    else
        rt_buf_truncate(b, 0);
    return b;
}

static void add_str(rt_buf_t *b, const char *s)
{
    rt_buf_add(b, s, strlen(s));
}

/* Appends "name", an SQL identifier (quotes doubled). */
static void add_ident(rt_buf_t *b, const char *name)
{
    rt_buf_add(b, "\"", 1);
    for (const char *p = name; *p; p++) {
        if (*p == '"')
            rt_buf_add(b, "\"", 1);
        rt_buf_add(b, p, 1);
    }
    rt_buf_add(b, "\"", 1);
}

/* ---- Configuration ---- */

static void sq_free(rt_sink_t *s)
{
    sq_t *q = s->drv_state;
    if (!q)
        return;
    free(q->declared);
    rt_buf_free(&q->sig);
    rt_buf_free(&q->sql);
    free(q);
    s->drv_state = NULL;
}

static bool known_type(const char *t)
{
    for (const char *const *k = sql_types; *k; k++)
        if (strcasecmp(*k, t) == 0)
            return true;
    return false;
}

static int column_cmp(const void *a, const void *b)
{
    const sq_column_t *x = a, *y = b;
    if (x->pos != y->pos)
        return x->pos < y->pos ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int sq_configure(rt_sink_t *s, const rt_conf_section_t *sec, char *why, size_t whylen)
{
    sq_t *q = calloc(1, sizeof(*q));
    if (!q) {
        snprintf(why, whylen, "out of memory");
        return RT_ENOMEM;
    }
    s->drv_state = q;
    const rt_conf_kv_t *kv;
    int rc = 0;
    /* A relative file lives in data_dir (the spill file's directory), like everything else
       rtd writes, so one data_dir per broker keeps brokers and tests apart. */
    const rt_conf_kv_t *file = rt__sink_kv(sec, "file");
    int dirlen = (int)(strrchr(s->spill_path, '/') - s->spill_path);
    if (file && file->str[0] == '/')
        snprintf(q->file, sizeof(q->file), "%s", file->str);
    else if (file && file->str[0])
        snprintf(q->file, sizeof(q->file), "%.*s/%s", dirlen, s->spill_path, file->str);
    else
        snprintf(q->file, sizeof(q->file), "%.*s/%s.db", dirlen, s->spill_path, s->name);
    kv = rt__sink_kv(sec, "table");
    if (kv && (!kv->str[0] || strlen(kv->str) >= SQ_TABLE_LEN)) {
        snprintf(why, whylen, "table must be a name of 1 to %d bytes", SQ_TABLE_LEN - 1);
        rc = RT_EINVAL;
    } else {
        memcpy(q->table, kv ? kv->str : "messages", strlen(kv ? kv->str : "messages") + 1);
    }
    kv = rt__sink_kv(sec, "synchronous"); /* full or normal: its choices are checked */
    q->sync_full = !kv || strcmp(kv->str, "full") == 0;
    kv = rt__sink_kv(sec, "busy_ms");
    q->busy_ms = kv ? (int)kv->num : SQ_BUSY_MS_DEFAULT;
    rt__retention_configure(&q->ret, sec);
    s->retains = rt__retention_on(&q->ret);
    q->declared = calloc(sec->nkeys ? sec->nkeys : 1, sizeof(sq_column_t));
    if (!q->declared && rc == 0) {
        snprintf(why, whylen, "out of memory");
        rc = RT_ENOMEM;
    }
    for (unsigned i = 0; rc == 0 && i < sec->nkeys; i++) {
        if (strncmp(sec->keys[i].key, "columns.", 8) != 0)
            continue;
        const char *suffix = sec->keys[i].key + 8, *val = sec->keys[i].str;
        sq_column_t *c = &q->declared[q->ndeclared];
        /* columns = { ts = "integer" } or columns = { "ts integer", ... } */
        bool array = suffix[strspn(suffix, "0123456789")] == 0;
        int n = 0;
        if (array)
            n = sscanf(val, "%63s %15s", c->name, c->type);
        else if (strlen(suffix) < sizeof(c->name) && strlen(val) < sizeof(c->type)) {
            memcpy(c->name, suffix, strlen(suffix) + 1);
            memcpy(c->type, val, strlen(val) + 1);
            n = 2;
        }
        if (n != 2 || !known_type(c->type)) {
            snprintf(why, whylen,
                     "%s = \"%s\": a column is name = \"type\" or \"name type\" "
                     "with type integer, real, text, blob, numeric or json",
                     sec->keys[i].key, val);
            rc = RT_EINVAL;
        }
        c->pos = array ? atol(suffix) : 0;
        if (strcasecmp(c->type, "json") == 0)
            snprintf(c->type, sizeof(c->type), "text");
        q->ndeclared++;
    }
    /* Lua tables have no order: named columns go by name, listed ones by position. */
    if (rc == 0)
        qsort(q->declared, q->ndeclared, sizeof(sq_column_t), column_cmp);
    if (rc)
        sq_free(s);
    return rc;
}

/* ---- Connection ---- */

static void forget_schema(sq_t *q)
{
    for (unsigned i = 0; i < SQ_STMT_CACHE; i++) {
        sqlite3_finalize(q->cache[i].st);
        free(q->cache[i].sig);
    }
    memset(q->cache, 0, sizeof(q->cache));
    for (unsigned i = 0; i < q->ntables; i++) {
        for (unsigned j = 0; j < q->tables[i].ncols; j++)
            free(q->tables[i].cols[j]);
        free(q->tables[i].cols);
    }
    free(q->tables);
    q->tables = NULL;
    q->ntables = 0;
    q->tables_cap = 0;
}

static void sq_close(rt_sink_t *s)
{
    sq_t *q = s->drv_state;
    forget_schema(q);
    rt__retention_close(&q->ret);
    if (q->db)
        sqlite3_close(q->db);
    q->db = NULL;
}

static int sq_open(rt_sink_t *s)
{
    sq_t *q = s->drv_state;
    /* The database's directory is made if missing (one level, 0700 like data_dir). */
    char dir[512];
    snprintf(dir, sizeof(dir), "%s", q->file);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            rt__sink_error(s, "%s: cannot create directory: %s", dir, strerror(errno));
            return RT_EAGAIN;
        }
    }
    rt_store_create_private(q->file);
    rt_sqlite_mem_init();
    if (sqlite3_open_v2(q->file, &q->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        rt__sink_error(s, "%s: open: %s", q->file, q->db ? sqlite3_errmsg(q->db) : "no memory");
        sq_close(s);
        return RT_EAGAIN;
    }
    sqlite3_busy_timeout(q->db, q->busy_ms);
    char pragmas[128];
    snprintf(pragmas, sizeof(pragmas), "PRAGMA journal_mode=WAL; PRAGMA synchronous=%s",
             q->sync_full ? "FULL" : "NORMAL");
    if (sqlite3_exec(q->db, pragmas, NULL, NULL, NULL) != SQLITE_OK) {
        rt__sink_error(s, "%s: %s", q->file, sqlite3_errmsg(q->db));
        sq_close(s);
        return RT_EAGAIN;
    }
    char why[200];
    if (rt__retention_open(&q->ret, q->db, why, sizeof(why)) != 0) {
        rt__sink_error(s, "%s: retention: %s", q->file, why);
        sq_close(s);
        return RT_EAGAIN;
    }
    return 0;
}

/* ---- Schema ---- */

static const char *decl_type(bson_type_t t)
{
    switch (t) {
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
    case BSON_TYPE_BOOL:
    case BSON_TYPE_DATE_TIME:
        return "INTEGER";
    case BSON_TYPE_DOUBLE:
        return "REAL";
    case BSON_TYPE_BINARY:
        return "BLOB";
    case BSON_TYPE_NULL:
    case BSON_TYPE_UNDEFINED:
        return "";
    default:
        return "TEXT";
    }
}

static bool has_col(const sq_table_t *t, const char *name)
{
    for (unsigned i = 0; i < t->ncols; i++)
        if (strcasecmp(t->cols[i], name) == 0)
            return true;
    return false;
}

static bool add_col(sq_table_t *t, const char *name)
{
    if (rt_grow(&t->cols, &t->cap, t->ncols + 1, sizeof(*t->cols), 16) != 0)
        return false;
    char *c = strdup(name);
    if (!c)
        return false;
    t->cols[t->ncols++] = c;
    return true;
}

/* Runs the statement built in q->sql (which did not run out of memory). */
static int exec_sql(rt_sink_t *s, sq_t *q)
{
    RT_ASSERT(!q->sql.oom && q->sql.data);
    if ((q->last = sqlite3_exec(q->db, q->sql.data, NULL, NULL, NULL)) == SQLITE_OK)
        return 0;
    rt__sink_error(s, "%s: %s (in %.100s)", q->file, sqlite3_errmsg(q->db), q->sql.data);
    return RT_EAGAIN;
}

/* Forgets the last table of the cache (its load or creation failed). */
static void forget_last_table(sq_t *q)
{
    sq_table_t *t = &q->tables[--q->ntables];
    for (unsigned j = 0; j < t->ncols; j++)
        free(t->cols[j]);
    free(t->cols);
}

/*
** The table named name in *out, with its columns read from the database, or created
** from the declared columns and the keys of doc. Returns 0, RT_EINVAL if the row
** cannot make the table, or RT_EAGAIN (see q->last); the error is set on failure.
*/
static int get_table(rt_sink_t *s, sq_t *q, const char *name, const bson_t *doc, sq_table_t **out)
{
    for (unsigned i = 0; i < q->ntables; i++)
        if (strcmp(q->tables[i].name, name) == 0) {
            *out = &q->tables[i];
            return 0;
        }
    if (rt_grow(&q->tables, &q->tables_cap, q->ntables + 1, sizeof(*q->tables), 4) != 0) {
        rt__sink_error(s, "out of memory");
        return RT_EAGAIN;
    }
    sq_table_t *t = &q->tables[q->ntables++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    bool create = false;
    uint64_t now = rt_wall_ms();
    if ((q->last = rt__retention_resolve(&q->ret, q->db, name, now, &t->part, &create)) !=
        SQLITE_OK) {
        bool theirs = q->last == SQLITE_MISMATCH;
        if (theirs)
            rt__sink_error(
                s, "row rejected: %s is not a table (a view or an index rtd did not make)", name);
        else
            rt__sink_error(s, "%s: partitions of %s: %s", q->file, name, sqlite3_errmsg(q->db));
        forget_last_table(q);
        return theirs ? RT_EINVAL : RT_EAGAIN;
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(q->db, "SELECT name FROM pragma_table_info(?)", -1, &st, NULL) !=
        SQLITE_OK) {
        rt__sink_error(s, "%s: %s", q->file, sqlite3_errmsg(q->db));
        forget_last_table(q);
        return RT_EAGAIN;
    }
    sqlite3_bind_text(st, 1, t->part.name, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if (!add_col(t, (const char *)sqlite3_column_text(st, 0)))
            rc = SQLITE_NOMEM;
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        rt__sink_error(s, "%s: columns of %s: %s", q->file, name, sqlite3_errstr(rc));
        forget_last_table(q);
        return RT_EAGAIN;
    }
    if (t->ncols > 0 && !create) {
        *out = t;
        return 0;
    }
    /* A new table: declared columns first, then the row's other keys. */
    rt_buf_t *sql = reuse_scratch(&q->sql);
    add_str(sql, "CREATE TABLE ");
    add_ident(sql, t->part.name);
    add_str(sql, " (");
    bool ok = true;
    for (unsigned i = 0; ok && i < q->ndeclared; i++) {
        if (i > 0)
            add_str(sql, ", ");
        add_ident(sql, q->declared[i].name);
        rt_buf_printf(sql, " %s", q->declared[i].type);
        ok = add_col(t, q->declared[i].name);
    }
    bson_iter_t it;
    bson_iter_init(&it, doc);
    while (ok && bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        if (has_col(t, k))
            continue;
        if (t->ncols > 0)
            add_str(sql, ", ");
        add_ident(sql, k);
        rt_buf_printf(sql, " %s", decl_type(bson_iter_type(&it)));
        ok = add_col(t, k);
    }
    add_str(sql, ")");
    ok = ok && !sql->oom;
    rc = 0;
    if (!ok) {
        rt__sink_error(s, "out of memory");
        rc = RT_EAGAIN;
    } else if (t->ncols == 0) {
        rt__sink_error(s, "row rejected: table %s cannot be made from a row with no keys", name);
        rc = RT_EINVAL;
    } else {
        rc = exec_sql(s, q);
    }
    if (rc == 0 && create &&
        (q->last = rt__retention_made(&q->ret, q->db, name, &t->part, now)) != SQLITE_OK) {
        rt__sink_error(s, "%s: partitions of %s: %s", q->file, name, sqlite3_errmsg(q->db));
        rc = RT_EAGAIN;
    }
    if (rc) {
        forget_last_table(q);
        return rc;
    }
    *out = t;
    return 0;
}

/* A column for key in the table, in each of its partitions (the view takes them all). */
static int add_column(rt_sink_t *s, sq_t *q, sq_table_t *t, const char *key, bson_type_t type)
{
    rt_buf_t *sql = reuse_scratch(&q->sql);
    add_str(sql, " ADD COLUMN ");
    add_ident(sql, key);
    rt_buf_printf(sql, " %s", decl_type(type));
    if (sql->oom || !add_col(t, key)) {
        rt__sink_error(s, "out of memory");
        return RT_ENOMEM;
    }
    if ((q->last = rt__retention_alter(&q->ret, q->db, t->name, &t->part, sql->data)) == SQLITE_OK)
        return 0;
    rt__sink_error(s, "%s: %s (adding column %s to %s)", q->file, sqlite3_errmsg(q->db), key,
                   t->name);
    free(t->cols[--t->ncols]);
    return RT_EAGAIN;
}

/* The cached insert for sig (table and keys), prepared on a miss. */
static sqlite3_stmt *get_insert(rt_sink_t *s, sq_t *q, const char *sig, size_t siglen,
                                const char *table, unsigned nkeys)
{
    sq_stmt_t *victim = &q->cache[0];
    for (unsigned i = 0; i < SQ_STMT_CACHE; i++) {
        sq_stmt_t *c = &q->cache[i];
        if (c->st && c->siglen == siglen && memcmp(c->sig, sig, siglen) == 0) {
            c->used = ++q->clock;
            return c->st;
        }
        if (!c->st || c->used < victim->used)
            victim = c;
        if (!c->st)
            break;
    }
    rt_buf_t *sql = reuse_scratch(&q->sql);
    add_str(sql, "INSERT INTO ");
    add_ident(sql, table);
    add_str(sql, " (");
    const char *k = sig + strlen(table) + 1;
    for (unsigned i = 0; i < nkeys; i++, k += strlen(k) + 1) {
        if (i > 0)
            add_str(sql, ", ");
        add_ident(sql, k);
    }
    add_str(sql, ") VALUES (");
    for (unsigned i = 0; i < nkeys; i++)
        add_str(sql, i == 0 ? "?" : ", ?");
    add_str(sql, ")");
    char *copy = sql->oom ? NULL : malloc(siglen);
    if (!copy) {
        rt__sink_error(s, "out of memory");
        return NULL;
    }
    sqlite3_stmt *st = NULL;
    if ((q->last = sqlite3_prepare_v2(q->db, sql->data, -1, &st, NULL)) != SQLITE_OK) {
        rt__sink_error(s, "%s: %s (in %.100s)", q->file, sqlite3_errmsg(q->db), sql->data);
        free(copy);
        return NULL;
    }
    sqlite3_finalize(victim->st);
    free(victim->sig);
    memcpy(copy, sig, siglen);
    *victim = (sq_stmt_t){.sig = copy, .siglen = siglen, .st = st, .used = ++q->clock};
    return st;
}

/* ---- Writing ---- */

static void bind_value(sqlite3_stmt *st, int col, const bson_iter_t *it)
{
    switch (bson_iter_type(it)) {
    case BSON_TYPE_INT32:
        sqlite3_bind_int64(st, col, bson_iter_int32(it));
        return;
    case BSON_TYPE_INT64:
        sqlite3_bind_int64(st, col, bson_iter_int64(it));
        return;
    case BSON_TYPE_BOOL:
        sqlite3_bind_int64(st, col, bson_iter_bool(it));
        return;
    case BSON_TYPE_DATE_TIME:
        sqlite3_bind_int64(st, col, bson_iter_date_time(it));
        return;
    case BSON_TYPE_DOUBLE:
        sqlite3_bind_double(st, col, bson_iter_double(it));
        return;
    case BSON_TYPE_NULL:
    case BSON_TYPE_UNDEFINED:
        sqlite3_bind_null(st, col);
        return;
    case BSON_TYPE_BINARY: {
        const uint8_t *data;
        uint32_t len;
        bson_subtype_t sub;
        bson_iter_binary(it, &sub, &len, &data);
        sqlite3_bind_blob(st, col, data, (int)len, SQLITE_STATIC);
        return;
    }
    default: {
        uint32_t len;
        char *tmp, num[64];
        const char *text = rt__sink_text(it, &len, &tmp, num);
        sqlite3_bind_text(st, col, text, (int)len, tmp ? bson_free : SQLITE_TRANSIENT);
        return;
    }
    }
}

/* Errors that belong to one row's data: no retry can fix them. */
static bool row_error(int rc)
{
    rc &= 0xff;
    return rc == SQLITE_CONSTRAINT || rc == SQLITE_MISMATCH || rc == SQLITE_TOOBIG ||
           rc == SQLITE_RANGE;
}

/*
** Retention: before a batch's first row of t (once per batch: its time and bytes) and
** before each row (its count), the partition rows go to is closed and the next begun when
** it holds its share. 0, or RT_EAGAIN (q->last).
*/
static int next_partition(rt_sink_t *s, sq_t *q, sq_table_t *t)
{
    bool rolled = false;
    uint64_t now = rt_wall_ms();
    bool by_count = false;
    q->last = SQLITE_OK;
    if (t->batch != q->batches) {
        t->batch = q->batches;
        q->last = rt__retention_batch(&q->ret, q->db, t->name, now, &t->part, &rolled);
    }
    if (q->last == SQLITE_OK)
        q->last = rt__retention_row(&q->ret, q->db, t->name, now, &t->part, &by_count);
    rolled |= by_count;
    if (q->last != SQLITE_OK) {
        rt__sink_error(s, "%s: partitions of %s: %s", q->file, t->name, sqlite3_errmsg(q->db));
        return RT_EAGAIN;
    }
    if (rolled)
        s->expire_due = true; /* the oldest may go now */
    return 0;
}

/*
** Inserts one row. Returns 0, RT_EINVAL when the row itself is at fault (it is
** rejected, the batch goes on), or RT_EAGAIN when a statement failed (q->last).
*/
static int insert_once(rt_sink_t *s, sq_t *q, sink_row_t *r)
{
    bson_t doc;
    bson_iter_t it;
    uint32_t tlen = 0;
    const char *table = rt__sink_opt_str(r, "table", &tlen);
    if (!table) {
        table = q->table;
        tlen = (uint32_t)strlen(table);
    }
    if (tlen == 0 || tlen >= SQ_TABLE_LEN || memchr(table, 0, tlen)) {
        rt__sink_error(s, "row rejected: table name must be 1 to %d bytes", SQ_TABLE_LEN - 1);
        return RT_EINVAL;
    }
    if (rt__retention_reserved(table, tlen)) {
        rt__sink_error(s, "row rejected: table %.*s is the sink's own (retention)", (int)tlen,
                       table);
        return RT_EINVAL;
    }
    if (!bson_init_static(&doc, r->doc, r->len) || !bson_validate(&doc, BSON_VALIDATE_UTF8, NULL)) {
        rt__sink_error(s, "row rejected: malformed BSON");
        return RT_EINVAL;
    }
    char tname[SQ_TABLE_LEN];
    memcpy(tname, table, tlen);
    tname[tlen] = 0;
    sq_table_t *t = NULL;
    int rc = get_table(s, q, tname, &doc, &t);
    if (rc)
        return rc;
    if ((rc = next_partition(s, q, t)) != 0)
        return rc;
    /* The signature: the table written (its partition), then each key once
       (case-insensitively, as SQLite sees names); a key the table lacks becomes a column
       first. */
    const char *into = t->part.name;
    size_t intolen = strlen(into);
    rt_buf_t *sig = reuse_scratch(&q->sig);
    rt_buf_add(sig, into, intolen + 1);
    if (sig->oom)
        return RT_EAGAIN;
    unsigned nkeys = 0;
    bson_iter_init(&it, &doc);
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        size_t kl = strlen(k);
        if (kl == 0) {
            rt__sink_error(s, "row rejected: a key is empty");
            return RT_EINVAL;
        }
        const char *p = sig->data + intolen + 1;
        for (unsigned i = 0; i < nkeys; i++, p += strlen(p) + 1)
            if (strcasecmp(p, k) == 0) {
                rt__sink_error(s,
                               "row rejected: key %s appears twice (SQLite columns ignore "
                               "case)",
                               k);
                return RT_EINVAL;
            }
        if (!has_col(t, k) && add_column(s, q, t, k, bson_iter_type(&it)) != 0)
            return RT_EAGAIN;
        rt_buf_add(sig, k, kl + 1);
        if (sig->oom)
            return RT_EAGAIN;
        nkeys++;
    }
    if (nkeys == 0) {
        rt__sink_error(s, "row rejected: no keys");
        return RT_EINVAL;
    }
    rt_buf_add(sig, "", 1);
    if (sig->oom)
        return RT_EAGAIN;
    sqlite3_stmt *st = get_insert(s, q, sig->data, sig->len, into, nkeys);
    if (!st)
        return RT_EAGAIN;
    int col = 1;
    bson_iter_init(&it, &doc);
    while (bson_iter_next(&it))
        bind_value(st, col++, &it);
    q->last = sqlite3_step(st);
    if (q->last == SQLITE_DONE)
        t->part.rows++;
    else
        rt__sink_error(s, "%s: insert into %s: %s", q->file, into, sqlite3_errmsg(q->db));
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (q->last == SQLITE_DONE)
        return 0;
    return row_error(q->last) ? RT_EINVAL : RT_EAGAIN;
}

/*
** Inserts one row; returns 0, or the row's status (< 0, set in r) when the row is
** rejected, or RT_EAGAIN when the database is in trouble (busy, locked, I/O, full,
** read-only). A plain SQL error is first blamed on a stale cache (a table changed by
** another connection): the schema is read again and the row tried once more; a
** second one is the row's doing (too many columns, a name SQLite refuses), so one
** such row cannot hold up every row behind it.
*/
static int insert_row(rt_sink_t *s, sq_t *q, sink_row_t *r)
{
    for (int attempt = 0;; attempt++) {
        q->last = SQLITE_OK;
        int rc = insert_once(s, q, r);
        if (rc == 0)
            return 0;
        if (rc == RT_EINVAL)
            return r->status = RT_EINVAL;
        if ((q->last & 0xff) != SQLITE_ERROR)
            return RT_EAGAIN;
        if (attempt == 1) {
            char why[sizeof(s->last_error)];
            pthread_mutex_lock(&s->err_lock);
            memcpy(why, s->last_error, sizeof(why));
            pthread_mutex_unlock(&s->err_lock);
            rt__sink_error(s, "row rejected: %.*s", (int)sizeof(why) - 16, why);
            return r->status = RT_EINVAL;
        }
        forget_schema(q);
    }
}

static int sq_write(rt_sink_t *s, sink_row_t *rows, size_t n)
{
    sq_t *q = s->drv_state;
    q->batches++;
    if (q->ret_gen != q->ret.gen) {
        forget_schema(q); /* a retention step changed partitions: where rows go is read again */
        q->ret_gen = q->ret.gen;
    }
    if (sqlite3_exec(q->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        rt__sink_error(s, "%s: begin: %s", q->file, sqlite3_errmsg(q->db));
        return RT_EAGAIN;
    }
    for (size_t i = 0; i < n; i++) {
        if (insert_row(s, q, &rows[i]) == RT_EAGAIN) {
            sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
            return RT_EAGAIN; /* drive() closes: the schema cache is rebuilt on reopen */
        }
        /* A table declared ON CONFLICT ROLLBACK ends the whole transaction on a rejected
           row; going on would commit the rest row by row, then retry them all. */
        if (rows[i].status < 0 && sqlite3_get_autocommit(q->db)) {
            rt__sink_error(s, "%s: a rejected row rolled the batch back (ON CONFLICT ROLLBACK)",
                           q->file);
            return RT_EAGAIN;
        }
    }
    if (sqlite3_exec(q->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        rt__sink_error(s, "%s: commit: %s", q->file, sqlite3_errmsg(q->db));
        sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
        return RT_EAGAIN;
    }
    return 0;
}

/* The driver's own memory: its settings, the schema it knows, its statement cache's keys
   and its scratch (the statements themselves are SQLite's). */
static size_t sq_held(const rt_sink_t *s)
{
    const sq_t *q = s->drv_state;
    size_t n = sizeof(*q) + q->ndeclared * sizeof(sq_column_t) + q->sig.cap + q->sql.cap +
               q->tables_cap * sizeof(sq_table_t);
    for (unsigned i = 0; i < q->ntables; i++) {
        n += q->tables[i].cap * sizeof(char *);
        for (unsigned j = 0; j < q->tables[i].ncols; j++)
            n += strlen(q->tables[i].cols[j]) + 1;
    }
    for (unsigned i = 0; i < SQ_STMT_CACHE; i++)
        n += q->cache[i].st ? q->cache[i].siglen : 0;
    return n;
}

static int sq_expire(rt_sink_t *s, uint64_t *rows, bool *more)
{
    sq_t *q = s->drv_state;
    return rt__retention_step(s, &q->ret, q->db, rt_wall_ms(), rows, more);
}

static const char *sq_file(const rt_sink_t *s)
{
    return ((const sq_t *)s->drv_state)->file;
}

static void sq_retention(const rt_sink_t *s, char *text, size_t textlen, rt_sink_keeps_t *keeps)
{
    const sq_t *q = s->drv_state;
    if (text)
        rt__retention_text(&q->ret, text, textlen);
    if (keeps)
        rt__retention_keeps(&q->ret, keeps);
}

const sink_driver_t rt_sink_sqlite_driver = {
    .type = "sqlite",
    .blocking = true,
    .spills = true,
    .keys = sqlite_keys,
    .configure = sq_configure,
    .open = sq_open,
    .write = sq_write,
    .expire = sq_expire,
    .retention = sq_retention,
    .file = sq_file,
    .close = sq_close,
    .free = sq_free,
    .held = sq_held,
};
