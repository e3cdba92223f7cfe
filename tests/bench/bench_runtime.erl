#!/usr/bin/env escript
%% -*- erlang -*-
%%! +P 4194304
%%
%% bench_runtime.erl: the figures of bench_runtime.c, measured on BEAM with the
%% same definitions, printed with the same keys.
%%
%%   spawn_per_s               N idle processes spawned one after another from one
%%                             process, timed in that process around the spawn loop.
%%   bytes_per_idle_actor      erlang:memory(total) after the spawns minus before, less
%%                             the spawner's own growth (it holds the list of pids; rt's
%%                             spawner fills an array allocated beforehand), divided by N.
%%                             bytes_per_idle_actor_rss is the RSS delta (the rt figure's
%%                             definition), shown for reference.
%%   ring_hops_per_s           1,000 processes, each knowing the next pid; one {token, Hops}
%%                             message goes round until Hops runs out.
%%   ring_parallel_msgs_per_s  the same ring with 1,000 tokens at once, one injected at every
%%                             process, hops shared between them.
%%   gc_pause_*_us             one process keeps ~1 MB live (a queue of 4,096 entries, each
%%                             a 64-128 B tuple pointing to a 64-256 B tuple of small
%%                             integers) and replaces 256 entries per self-sent message.
%%                             Pauses are gc_minor_start..gc_minor_end and
%%                             gc_major_start..gc_major_end pairs from erlang:trace with
%%                             monotonic nanosecond timestamps: every collection of that
%%                             process, minor and major, as rt reports every collection.
%%
%% Ring figures are medians of 3 runs. Usage:
%%   escript bench_runtime.erl [--quick] [--json] [--actors N] [--hops N]
%%                             [--gc-pauses N] [--schedulers N]
-module(bench_runtime).
-mode(compile).
-export([main/1]).

-define(RING_SIZE, 1000).
-define(RING_TOKENS, 1000).
-define(RING_REPEATS, 3).
-define(GC_LIVE_BYTES, 1048576).
-define(GC_ENTRY_BYTES, 256).
-define(GC_BATCH, 256).
-define(GC_WARMUP, 3).

main(Args) ->
    Opts = parse(Args, #{quick => false, json => false}),
    Quick = maps:get(quick, Opts),
    Actors = maps:get(actors, Opts, pick(Quick, 20000, 1000000)),
    Hops = max(?RING_TOKENS, maps:get(hops, Opts, pick(Quick, 200000, 10000000))),
    GcPauses = maps:get(gc_pauses, Opts, pick(Quick, 30, 1000)),
    case maps:find(schedulers, Opts) of
        {ok, S} -> erlang:system_flag(schedulers_online, S);
        error -> ok
    end,
    Scheds = erlang:system_info(schedulers_online),
    {SpawnPerS, Bytes, BytesRss} = run_in_process(fun() -> bench_spawn(Actors) end),
    {HopsPerS, ParPerS} = run_in_process(fun() -> bench_ring(Hops) end),
    {P50, P99, PMax, NPauses, NMajor} = run_in_process(fun() -> bench_gc(GcPauses) end),
    case maps:get(json, Opts) of
        true ->
            io:format("{\"spawn_per_s\": ~b, \"bytes_per_idle_actor\": ~.1f, "
                      "\"ring_hops_per_s\": ~b, \"ring_parallel_msgs_per_s\": ~b, "
                      "\"gc_pause_p50_us\": ~.1f, \"gc_pause_p99_us\": ~.1f, "
                      "\"gc_pause_max_us\": ~.1f, \"bytes_per_idle_actor_rss\": ~.1f, "
                      "\"actors\": ~b, \"hops\": ~b, \"gc_pauses\": ~b, "
                      "\"gc_major_pauses\": ~b, \"schedulers\": ~b, \"otp\": \"~s\"}~n",
                      [round(SpawnPerS), Bytes, round(HopsPerS), round(ParPerS), P50, P99,
                       PMax, BytesRss,
                       Actors, Hops, NPauses, NMajor, Scheds,
                       erlang:system_info(otp_release)]);
        false ->
            io:format("BEAM runtime benchmark (OTP ~s, ~b schedulers~s)~n",
                      [erlang:system_info(otp_release), Scheds, pick(Quick, ", quick", "")]),
            io:format("  spawn_per_s               ~12b  (~b idle processes from one process)~n",
                      [round(SpawnPerS), Actors]),
            io:format("  bytes_per_idle_actor      ~12.1f  (memory(total) delta / N; RSS delta "
                      "/ N is ~.1f)~n", [Bytes, BytesRss]),
            io:format("  ring_hops_per_s           ~12b  (~b processes, 1 token, ~b hops, "
                      "median of ~b)~n", [round(HopsPerS), ?RING_SIZE, Hops, ?RING_REPEATS]),
            io:format("  ring_parallel_msgs_per_s  ~12b  (~b tokens, ~b hops in all, "
                      "median of ~b)~n", [round(ParPerS), ?RING_TOKENS, Hops, ?RING_REPEATS]),
            io:format("  gc_pause_p50_us           ~12.1f  (~b collections, ~b of them major)~n",
                      [P50, NPauses, NMajor]),
            io:format("  gc_pause_p99_us           ~12.1f~n", [P99]),
            io:format("  gc_pause_max_us           ~12.1f~n", [PMax])
    end.

parse([], O) -> O;
parse(["--quick" | T], O) -> parse(T, O#{quick => true});
parse(["--json" | T], O) -> parse(T, O#{json => true});
parse(["--actors", N | T], O) -> parse(T, O#{actors => pos(N)});
parse(["--hops", N | T], O) -> parse(T, O#{hops => pos(N)});
parse(["--gc-pauses", N | T], O) -> parse(T, O#{gc_pauses => pos(N)});
parse(["--schedulers", N | T], O) -> parse(T, O#{schedulers => pos(N)});
parse(_, _) ->
    io:format(standard_error, "usage: bench_runtime.erl [--quick] [--json] [--actors N] "
              "[--hops N] [--gc-pauses N] [--schedulers N]~n", []),
    halt(2).

pos(S) ->
    case string:to_integer(S) of
        {N, ""} when N > 0 -> N;
        _ -> parse(bad, #{})
    end.

pick(true, A, _) -> A;
pick(false, _, B) -> B.

%% Each phase runs in a fresh process, so the escript's own heap is not part of it.
run_in_process(F) ->
    Parent = self(),
    {Pid, Ref} = spawn_monitor(fun() -> Parent ! {self(), F()} end),
    receive
        {Pid, R} -> erlang:demonitor(Ref, [flush]), R;
        {'DOWN', Ref, process, Pid, Why} -> error({phase_failed, Why})
    end.

now_ns() -> erlang:monotonic_time(nanosecond).

rss_bytes() ->
    {ok, B} = file:read_file("/proc/self/statm"),
    [_, Rss | _] = string:lexemes(binary_to_list(B), " \n"),
    list_to_integer(Rss) * 4096.

median(L) ->
    S = lists:sort(L),
    N = length(S),
    case N rem 2 of
        1 -> lists:nth(N div 2 + 1, S);
        0 -> (lists:nth(N div 2, S) + lists:nth(N div 2 + 1, S)) / 2
    end.

%% ---- Spawn and idle memory ----

idle() ->
    receive stop -> ok end.

spawn_loop(0, Acc) -> Acc;
spawn_loop(N, Acc) -> spawn_loop(N - 1, [spawn(fun idle/0) | Acc]).

bench_spawn(N) ->
    erlang:garbage_collect(),
    Self = self(),
    {memory, Own0} = process_info(Self, memory),
    Total0 = erlang:memory(total),
    Rss0 = rss_bytes(),
    T0 = now_ns(),
    Pids = spawn_loop(N, []),
    T1 = now_ns(),
    Rss1 = rss_bytes(),
    Total1 = erlang:memory(total),
    {memory, Own1} = process_info(Self, memory),
    Bytes = (Total1 - Total0 - (Own1 - Own0)) / N,
    BytesRss = (Rss1 - Rss0) / N,
    Refs = [erlang:monitor(process, P) || P <- Pids],
    [P ! stop || P <- Pids],
    [receive {'DOWN', R, process, _, _} -> ok end || R <- Refs],
    {N / ((T1 - T0) / 1.0e9), Bytes, BytesRss}.

%% ---- Ring ----

node(Next, Main) ->
    receive
        {token, 0} -> Main ! token_done, node(Next, Main);
        {token, H} -> Next ! {token, H - 1}, node(Next, Main);
        {next, P} -> node(P, Main);
        stop -> ok
    end.

bench_ring(Hops) ->
    Main = self(),
    Ring = lists:foldl(fun(_, Acc) ->
                               Next = case Acc of [] -> undefined; [H | _] -> H end,
                               [spawn(fun() -> node(Next, Main) end) | Acc]
                       end, [], lists:seq(1, ?RING_SIZE)),
    lists:last(Ring) ! {next, hd(Ring)},
    Arr = list_to_tuple(Ring),
    Runs = [{ring_run(Arr, 1, Hops), ring_run(Arr, ?RING_TOKENS, Hops)}
            || _ <- lists:seq(1, ?RING_REPEATS)],
    [P ! stop || P <- Ring],
    {median([A || {A, _} <- Runs]), median([B || {_, B} <- Runs])}.

ring_run(Arr, Tokens, Hops) ->
    Per = Hops div Tokens,
    T0 = now_ns(),
    [element(I * ?RING_SIZE div Tokens + 1, Arr) ! {token, Per}
     || I <- lists:seq(0, Tokens - 1)],
    [receive token_done -> ok end || _ <- lists:seq(1, Tokens)],
    T1 = now_ns(),
    Per * Tokens / ((T1 - T0) / 1.0e9).

%% ---- GC pauses ----

%% minstd: products stay below 2^47, so no bignums (and no extra garbage) on 64-bit BEAM.
rnd(X) -> (X * 48271) rem 2147483647.

entry(X0) ->
    X1 = rnd(X0),
    X2 = rnd(X1),
    %% A tuple of arity A takes A + 1 words: 64..128 B and 64..256 B as in bench_runtime.c.
    NodeArity = 7 + X1 rem 9,
    LeafArity = 7 + X2 rem 25,
    Leaf = erlang:make_tuple(LeafArity, X2 band 255),
    Node = erlang:make_tuple(NodeArity, X1 bor 1, [{1, Leaf}]),
    {Node, X2}.

fill(Q, X, 0) -> {Q, X};
fill(Q, X, N) ->
    {E, X1} = entry(X),
    fill(queue:in(E, Q), X1, N - 1).

replace(Q, X, 0) -> {Q, X};
replace(Q, X, N) ->
    {E, X1} = entry(X),
    {{value, _}, Q1} = queue:out(Q),
    replace(queue:in(E, Q1), X1, N - 1).

gc_worker(Q, X) ->
    receive
        stop -> ok;
        work ->
            {Q1, X1} = replace(Q, X, ?GC_BATCH),
            self() ! work,
            gc_worker(Q1, X1)
    end.

bench_gc(Want) ->
    Main = self(),
    Worker = spawn(fun() ->
                           receive go -> ok end,
                           {Q, X} = fill(queue:new(), 12345, ?GC_LIVE_BYTES div ?GC_ENTRY_BYTES),
                           Main ! filled,
                           receive go -> ok end,
                           self() ! work,
                           gc_worker(Q, X)
                   end),
    Worker ! go,
    receive filled -> ok end,
    Collector = spawn(fun() -> collect(Main, Want + ?GC_WARMUP, undefined, []) end),
    erlang:trace(Worker, true, [garbage_collection, monotonic_timestamp, {tracer, Collector}]),
    Worker ! go,
    Pauses0 = receive {pauses, P} -> P end,
    Worker ! stop,
    %% Oldest first after the reverse; the first GC_WARMUP are the heap settling.
    Pauses = lists:nthtail(?GC_WARMUP, lists:reverse(Pauses0)),
    Us = lists:sort([Ns / 1000 || {_, Ns} <- Pauses]),
    N = length(Us),
    Major = length([1 || {major, _} <- Pauses]),
    {nearest_rank(Us, N, 50), nearest_rank(Us, N, 99), lists:last(Us), N, Major}.

nearest_rank(Sorted, N, P) ->
    lists:nth(min(N, max(1, ceil(P / 100 * N))), Sorted).

collect(Main, 0, _, Acc) ->
    Main ! {pauses, Acc};
collect(Main, Left, Start, Acc) ->
    receive
        {trace_ts, _, gc_minor_start, _, Ts} -> collect(Main, Left, {minor, Ts}, Acc);
        {trace_ts, _, gc_major_start, _, Ts} -> collect(Main, Left, {major, Ts}, Acc);
        {trace_ts, _, gc_minor_end, _, Ts} when element(1, Start) =:= minor ->
            collect(Main, Left - 1, undefined, [{minor, Ts - element(2, Start)} | Acc]);
        {trace_ts, _, gc_major_end, _, Ts} when element(1, Start) =:= major ->
            collect(Main, Left - 1, undefined, [{major, Ts - element(2, Start)} | Acc]);
        _ -> collect(Main, Left, Start, Acc)
    end.
