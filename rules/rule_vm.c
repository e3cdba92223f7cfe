/*
** One rule Lua state (rule_vm.h): its allocator under the memory cap, the budget and
** deadline of a call (the hook), and running a rule on a message or event.
*/
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "rule_vm_internal.h"

static const char *const event_names[] = {RT_RULE_EVENT_NAMES};

int rt_rule_event_kind(const char *name)
{
    for (int i = 0; i < RT_RULE_NEVENTS; i++)
        if (strcmp(event_names[i], name) == 0)
            return i + 1;
    return 0;
}

const char *rt_rule_event_name(int kind)
{
    return kind >= 1 && kind <= RT_RULE_NEVENTS ? event_names[kind - 1] : NULL;
}

void rt_rule_spec_free(rt_rule_spec_t *s)
{
    for (size_t i = 0; i < s->nfrom; i++)
        free(s->from[i]);
    for (size_t i = 0; i < s->nto; i++) {
        free(s->to[i].sink);
        free(s->to[i].opts);
    }
    memset(s, 0, sizeof(*s));
}

/* Whether the current call's deadline has fired (rule_deadline.c); if so, the call is spent. */
static bool past_deadline(rt_rule_vm_t *vm)
{
    if (!vm->armed || !atomic_load_explicit(&vm->fired, memory_order_relaxed))
        return false;
    vm->timed_out = vm->budget_hit = true;
    return true;
}

static void *vm_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    rt_rule_vm_t *vm = ud;
    size_t used = atomic_load_explicit(&vm->bytes, memory_order_relaxed);
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        atomic_store_explicit(&vm->bytes, used - old, memory_order_relaxed);
        return NULL;
    }
    if (nsize > old && used - old + nsize > vm->cap) {
        vm->oom = true;
        return NULL;
    }
    /* A C loop that only allocates runs no hook: the deadline is looked at here too. Once the
       call is out of time nothing grows, or Lua's emergency collection would retry and succeed. */
    if (nsize > old && vm->armed && (vm->timed_out || past_deadline(vm)))
        return NULL;
    void *p = realloc(ptr, nsize);
    if (!p) {
        vm->oom = true;
        return NULL;
    }
    atomic_store_explicit(&vm->bytes, used - old + nsize, memory_order_relaxed);
    return p;
}

static void vm_hook(lua_State *L, lua_Debug *ar);
static int note_line(lua_State *L);

void rt__rule_vm_enter(rt_rule_vm_t *vm)
{
#ifndef NDEBUG
    bool busy = atomic_exchange_explicit(&vm->busy, true, memory_order_acquire);
    RT_ASSERT(!busy);
#endif
    RT_ASSERT(lua_gettop(vm->L) == 0 && !vm->armed);
}

void rt__rule_vm_leave(rt_rule_vm_t *vm)
{
    RT_ASSERT(lua_gettop(vm->L) == 0 && !vm->armed);
#ifndef NDEBUG
    atomic_store_explicit(&vm->busy, false, memory_order_release);
#endif
}

void rt__rule_vm_arm(rt_rule_vm_t *vm)
{
    RT_ASSERT(!vm->armed);
    vm->used = 0;
    vm->budget_hit = vm->timed_out = false;
    vm->armed = true;
    int slice = vm->instructions < RT_RULE_HOOK_SLICE ? (int)vm->instructions : RT_RULE_HOOK_SLICE;
    lua_sethook(vm->L, vm_hook, LUA_MASKCOUNT | LUA_MASKCALL, slice);
    /* After the hook is set: when the deadline fires, its count of 1 replaces the slice. */
    rt__rule_deadline_arm(vm->L, vm_hook, &vm->fired, vm->call_ms);
}

void rt__rule_vm_disarm(rt_rule_vm_t *vm)
{
    RT_ASSERT(vm->armed);
    rt__rule_deadline_disarm();
    lua_sethook(vm->L, NULL, 0, 0);
    vm->armed = false;
}

/* The hook of a spent call: every RT_RULE_HOOK_AFTER_BUDGET instructions, or every one once
   out of time, and at every call. */
static void keep_hooking(rt_rule_vm_t *vm)
{
    lua_sethook(vm->L, vm_hook, LUA_MASKCOUNT | LUA_MASKCALL,
                vm->timed_out ? 1 : RT_RULE_HOOK_AFTER_BUDGET);
}

static void vm_hook(lua_State *L, lua_Debug *ar)
{
    rt_rule_vm_t *vm = RT_RULE_VM(L);
    if (!vm->budget_hit) {
        if (ar->event == LUA_HOOKCOUNT)
            vm->used +=
                vm->instructions < RT_RULE_HOOK_SLICE ? vm->instructions : RT_RULE_HOOK_SLICE;
        else
            vm->used += RT_RULE_CALL_COST;
        if (vm->used < vm->instructions && !past_deadline(vm))
            return;
        vm->budget_hit = true;
        keep_hooking(vm);
    } else if (ar->event != LUA_HOOKCOUNT && lua_getinfo(L, "f", ar)) {
        /* The dry run's message handler is called for the very error raised here. */
        bool handler = lua_tocfunction(L, -1) == note_line;
        lua_pop(L, 1);
        if (handler)
            return;
    }
    /* The message is made with the allocator's deadline off: it must not fail for time. */
    vm->armed = false;
    /* Level 0 is the Lua function the hook interrupted; at a call, level 1 is the caller. */
    luaL_where(L, ar->event == LUA_HOOKCOUNT ? 0 : 1);
    if (vm->timed_out)
        lua_pushfstring(L, "time limit of %d ms exceeded", (int)vm->call_ms);
    else
        lua_pushfstring(L, "instruction budget of %d exceeded", (int)vm->instructions);
    lua_concat(L, 2);
    vm->armed = true;
    lua_error(L);
}

void rt__rule_vm_charge(lua_State *L, size_t steps)
{
    rt_rule_vm_t *vm = RT_RULE_VM(L);
    vm->steps += steps;
    if (vm->steps / RT_RULE_STEPS_PER_INSTRUCTION <= (size_t)vm->instructions && !past_deadline(vm))
        return;
    vm->budget_hit = true;
    keep_hooking(vm);
    if (vm->timed_out)
        luaL_error(L, "time limit of %d ms exceeded (in a C function)", (int)vm->call_ms);
    luaL_error(L, "instruction budget of %d exceeded (in a C function)", (int)vm->instructions);
}

bool rt__rule_vm_oom_message(lua_State *L, int idx)
{
    const char *m = lua_type(L, idx) == LUA_TSTRING ? lua_tostring(L, idx) : NULL;
    return m && strncmp(m, "not enough memory", 17) == 0;
}

bool rt__rule_vm_must_propagate(lua_State *L, int status)
{
    rt_rule_vm_t *vm = RT_RULE_VM(L);
    return vm->budget_hit || status == LUA_ERRMEM || (vm->oom && rt__rule_vm_oom_message(L, -1));
}

int rt_rule_vm_new(size_t memory, long instructions, rt_rule_vm_t **out)
{
    rt_rule_vm_t *vm = calloc(1, sizeof(*vm));
    if (!vm)
        return RT_ENOMEM;
    if (rt__rule_deadline_start()) {
        free(vm);
        return RT_ENOMEM;
    }
    vm->cap = memory;
    vm->instructions = instructions > 0 ? instructions : 1;
    rt_rule_vm_set_limits(vm, RT_CONF_RULE_CALL_MS, RT_CONF_RULE_OUTPUT_ROWS,
                          RT_CONF_RULE_OUTPUT_BYTES);
    vm->row = bson_new();
    vm->L = lua_newstate(vm_alloc, vm);
    if (!vm->L || !vm->row) {
        rt_rule_vm_free(vm);
        return RT_ENOMEM;
    }
    RT_RULE_VM(vm->L) = vm;
    /* Generational mode suits the workload: one short-lived message table per call. */
    lua_gc(vm->L, LUA_GCGEN, 0, 0);
    lua_pushcfunction(vm->L, rt__rule_sandbox_open);
    if (lua_pcall(vm->L, 0, 0, 0) != LUA_OK) {
        rt_rule_vm_free(vm);
        return RT_ENOMEM;
    }
    *out = vm;
    return 0;
}

void rt_rule_vm_free(rt_rule_vm_t *vm)
{
    if (!vm)
        return;
    if (vm->L)
        lua_close(vm->L);
    if (vm->row)
        bson_destroy(vm->row);
    free(vm->files);
    free(vm);
}

void rt_rule_vm_set_limits(rt_rule_vm_t *vm, long call_ms, long output_rows, size_t output_bytes)
{
    vm->call_ms = call_ms > 0 ? call_ms : 1;
    vm->max_rows = output_rows > 0 ? (size_t)output_rows : 1;
    vm->max_bytes = output_bytes;
}

size_t rt_rule_vm_bytes(const rt_rule_vm_t *vm)
{
    return atomic_load_explicit(&((rt_rule_vm_t *)vm)->bytes, memory_order_relaxed);
}

uint32_t rt_rule_vm_nrules(const rt_rule_vm_t *vm)
{
    return vm->nrules;
}

/* Error text on top of the stack, without calling any metamethod. */
static const char *error_text(lua_State *L)
{
    if (lua_type(L, -1) == LUA_TSTRING)
        return lua_tostring(L, -1);
    return lua_type(L, -1) == LUA_TNIL ? "error (nil)" : "error (not a string)";
}

static void set_str(lua_State *L, const char *k, const void *s, size_t n)
{
    lua_pushlstring(L, s, n);
    lua_setfield(L, -2, k);
}

static void set_cstr(lua_State *L, const char *k, const char *s)
{
    if (!s)
        return;
    lua_pushstring(L, s);
    lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, lua_Integer v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

/* Pushes the msg (or event) table a select function receives. */
static int push_input(lua_State *L)
{
    const rt_rule_input_t *in = lua_touserdata(L, 1);
    lua_createtable(L, 0, 12);
    if (in->event)
        set_cstr(L, "event", in->event);
    if (in->topic)
        set_str(L, "topic", in->topic, in->topic_len);
    if (in->payload)
        set_str(L, "payload", in->payload, in->payload_len);
    if (in->qos >= 0)
        set_int(L, "qos", in->qos);
    if (in->retain >= 0) {
        lua_pushboolean(L, in->retain);
        lua_setfield(L, -2, "retain");
    }
    set_cstr(L, "clientid", in->clientid);
    set_cstr(L, "username", in->username);
    set_cstr(L, "peer", in->peer);
    set_int(L, "timestamp", (lua_Integer)in->ts_ms);
    if (in->reason_code >= 0)
        set_int(L, "reason_code", in->reason_code);
    set_cstr(L, "reason", in->reason);
    set_cstr(L, "from_clientid", in->from_clientid);
    set_cstr(L, "from_username", in->from_username);
    if (in->proto_ver >= 0)
        set_int(L, "proto_ver", in->proto_ver);
    if (in->keepalive >= 0)
        set_int(L, "keepalive", in->keepalive);
    if (in->clean_start >= 0) {
        lua_pushboolean(L, in->clean_start);
        lua_setfield(L, -2, "clean_start");
    }
    set_cstr(L, "protocol", in->protocol ? in->protocol : "mqtt");
    set_cstr(L, "from", in->from);
    set_cstr(L, "to", in->to);
    set_cstr(L, "type", in->type);
    if ((!in->event || in->topic) && !in->from) {
        /* User properties (MQTT 5); a repeated key keeps its last value. */
        lua_newtable(L);
        const mqtt_props_t block = {.raw = in->props};
        size_t pos = 0;
        mqtt_str_t k, v;
        while (mqtt_props_user_next(&block, &pos, &k, &v)) {
            lua_pushlstring(L, (const char *)k.p, k.len);
            lua_pushlstring(L, (const char *)v.p, v.len);
            lua_rawset(L, -3);
        }
        lua_setfield(L, -2, "props");
    }
    return 1;
}

/* After a memory failure: collect, and if the state is still over half full, rebuild idx. */
static void recover_memory(rt_rule_vm_t *vm, uint32_t idx)
{
    lua_State *L = vm->L;
    lua_gc(L, LUA_GCCOLLECT, 0);
    if (rt_rule_vm_bytes(vm) <= vm->cap / 2)
        return;
    /* Drop the rule's environment first so the collection can take what it hoarded. */
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->selects_ref);
    lua_pushboolean(L, 0);
    lua_rawseti(L, -2, (lua_Integer)idx + 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->rules_ref);
    lua_pushboolean(L, 0);
    lua_rawseti(L, -2, (lua_Integer)idx + 1);
    lua_pop(L, 2);
    lua_gc(L, LUA_GCCOLLECT, 0);
    char err[128];
    if (rt__rule_file_run(vm, idx, NULL, err, sizeof(err)) != 0)
        lua_gc(L, LUA_GCCOLLECT, 0); /* stays lost: later calls fail with a clear error */
}

static rt_rule_outcome_t classify(rt_rule_vm_t *vm, int status)
{
    if (vm->budget_hit)
        return RT_RULE_FAIL_BUDGET;
    if (status == LUA_ERRMEM || (vm->oom && rt__rule_vm_oom_message(vm->L, -1)))
        return RT_RULE_FAIL_MEMORY;
    return RT_RULE_FAIL_EXCEPTION;
}

/*
** The dry run's message handler: notes the line the innermost frame of the rule's own file
** was running when the error was raised (a C function such as json.decode gives its message
** no position) and leaves the error as it was. C, so it runs no budgeted instructions.
*/
static int note_line(lua_State *L)
{
    rt_rule_vm_t *vm = RT_RULE_VM(L);
    lua_Debug ar;
    for (int level = 0; vm->line_of && lua_getstack(L, level, &ar); level++)
        if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0 && ar.source[0] == '@' &&
            strcmp(ar.source + 1, vm->line_of) == 0) {
            vm->err_line = ar.currentline;
            break;
        }
    return 1;
}

rt_rule_outcome_t rt_rule_vm_run(rt_rule_vm_t *vm, uint32_t idx, const rt_rule_input_t *in,
                                 rt_buf_t *out, uint32_t *nrows, char *err, size_t errlen)
{
    RT_ASSERT(idx < vm->nrules && !out->oom);
    rt__rule_vm_enter(vm);
    lua_State *L = vm->L;
    *nrows = 0;
    vm->budget_hit = vm->timed_out = vm->oom = false;
    vm->steps = 0;
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->selects_ref);
    if (lua_rawgeti(L, 1, (lua_Integer)idx + 1) != LUA_TFUNCTION) {
        lua_settop(L, 0);
        snprintf(err, errlen,
                 "the rule's state was lost after a memory failure and could not "
                 "be rebuilt; reload the rules");
        rt__rule_vm_leave(vm);
        return RT_RULE_FAIL_MEMORY;
    }
    /* Building msg can hit the memory cap too, so it runs protected, inside the budget. */
    lua_pushcfunction(L, push_input);
    lua_pushlightuserdata(L, (void *)in);
    int status = lua_pcall(L, 1, 1, 0);
    if (status == LUA_OK) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, vm->ctxs_ref);
        lua_rawgeti(L, -1, (lua_Integer)idx + 1);
        lua_remove(L, -2);
        int msgh = 0;
        if (vm->line_of) {
            lua_pushcfunction(L, note_line); /* below select and its two arguments */
            lua_insert(L, -4);
            msgh = lua_gettop(L) - 3;
        }
        rt__rule_vm_arm(vm);
        status = lua_pcall(L, 2, 1, msgh);
        rt__rule_vm_disarm(vm);
    }
    rt_rule_outcome_t r;
    vm->row_error = false;
    if (status != LUA_OK) {
        r = classify(vm, status);
        /* Out of time in the allocator: Lua's message says memory. */
        if (vm->timed_out && rt__rule_vm_oom_message(L, -1))
            snprintf(err, errlen, "time limit of %d ms exceeded (in a C function)",
                     (int)vm->call_ms);
        else
            snprintf(err, errlen, "%s", error_text(L));
    } else {
        r = rt__rule_rows_collect(vm, lua_gettop(L), out, nrows, err, errlen);
        vm->row_error = r != RT_RULE_PASSED && r != RT_RULE_FILTERED;
    }
    lua_settop(L, 0);
    if (r == RT_RULE_FAIL_MEMORY)
        recover_memory(vm, idx);
    rt__rule_vm_leave(vm);
    return r;
}
