# Front door for people and CI: every target installs what is missing first.
# The real build is CMake; these targets only pick build directories and options.

BUILD ?= build
JOBS ?= $(shell nproc)
# The integration tests' files (each rtd's data_dir, databases, logs) live in memory where
# there is a tmpfs, as the unit tests' do (tests/unit/tmpdir.h): what a test waits for is
# rtd's work, and a wait must not also cover the disk's worst commit while the sanitizer
# builds beside it write gigabytes (the sinks commit with synchronous=full). The product's
# fsync is not what these tests can check; nothing here cuts the power.
TEST_TMPDIR ?= $(shell test -w /dev/shm && echo /dev/shm || echo /tmp)
PYTEST = TMPDIR=$(TEST_TMPDIR) /usr/bin/python3 -m pytest

PREFIX ?= /usr/local

.PHONY: deps deps-build build build-asan build-tsan run install package test test-unit test-asan \
	test-tsan test-integration test-integration-asan test-integration-asan-a \
	test-integration-asan-b test-integration-tsan test-integration-long test-integration-short \
	test-release test-sanitizers build-fuzz \
	test-fuzz bench \
	xmpp-differential clean

# What install-deps.sh installs: building and running (make build, make run) needs only the
# compiler, rtd's libraries and mosquitto's clients; the test toolchain (chromium, erlang, tsung, clang,
# nats-server, prometheus, testssl, lintian...) comes with the targets that use it. A
# target-specific value reaches the target's prerequisites, `build` and `deps` among them.
DEPS_FOR = run
test test-unit test-asan test-tsan test-integration test-integration-asan \
	test-integration-asan-a test-integration-asan-b test-integration-tsan test-integration-long \
	test-integration-short test-release test-sanitizers build-fuzz test-fuzz bench \
	xmpp-differential: DEPS_FOR = test

# deps installs all of it (waiting for an install deps-build left running); deps-build only what
# configuring and compiling need, the rest of the test toolchain meanwhile in the background
# (install-deps.sh --build-first): on a fresh machine the compiler runs while apt unpacks
# chromium and erlang. What needs the rest (clang, the clients, the servers) asks for deps.
deps:
	@./tools/install-deps.sh --for $(DEPS_FOR)

deps-build:
	@./tools/install-deps.sh --for $(DEPS_FOR) --build-first

build: deps-build
	@cmake -S . -B $(BUILD)/release -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD)/release -j$(JOBS)

build-asan: deps-build
	@cmake -S . -B $(BUILD)/asan -DCMAKE_BUILD_TYPE=Debug -DRT_SANITIZE=address >/dev/null
	@cmake --build $(BUILD)/asan -j$(JOBS)

build-tsan: deps-build
	@cmake -S . -B $(BUILD)/tsan -DCMAKE_BUILD_TYPE=Debug -DRT_SANITIZE=thread >/dev/null
	@cmake --build $(BUILD)/tsan -j$(JOBS)

# libFuzzer targets (tests/fuzz): clang, ASan+UBSan, in their own build directory.
build-fuzz: deps
	@cmake -S . -B $(BUILD)/fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DRT_FUZZ=ON >/dev/null
	@cmake --build $(BUILD)/fuzz -j$(JOBS) --target fuzz

# The broker on 0.0.0.0:1883 with etc/rtd.conf (try: mosquitto_sub -t '#' -v).
run: build
	@$(BUILD)/release/rtd -c etc/rtd.conf

# rtd, rtctl, rtd.conf and the rules, the man pages and the systemd unit (docs/SERVICE.md):
# `make install PREFIX=/usr DESTDIR=/tmp/stage`; the configuration goes to /etc/rt whatever
# the prefix.
install: build
	@DESTDIR=$(DESTDIR) cmake --install $(BUILD)/release --prefix $(PREFIX)

# The Debian package of the release build (build/release/rt_VERSION_ARCH.deb).
package: build
	@cd $(BUILD)/release && cpack -G DEB

test-unit: build
	@cd $(BUILD)/release && ctest --output-on-failure -j1

# The ASan and TSan passes run JOBS unit tests at once: each is its own process with its own
# files (pid-named or tmpdir.h) and ports (bound to 0 or free_port), none has a wall-clock
# bound that a shared core could break (CPU-time ratios, generous waits, lower bounds), and
# a sanitizer proves the same whatever runs beside it. The release pass stays one at a time:
# its valgrind and bench runs print figures meant to be read on an otherwise idle machine.
test-asan: build-asan
	@cd $(BUILD)/asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j$(JOBS)

test-tsan: build-tsan
	@cd $(BUILD)/tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 \
		suppressions=$(CURDIR)/tests/tsan.supp" ctest --output-on-failure -j$(JOBS)

# The release integration pass in two parts side by side: the tests marked long (tens of
# seconds of steady load or waiting, one after another) and the rest, which are many short
# ones mostly waiting on sockets and timers, spread over two pytest workers a file at a time
# (pytest-xdist's loadfile: a module's fixtures, its rtd among them, stay in one worker). Each
# test's bounds hold under the others' load (that is how they are written); the pass takes
# the longest part, not their sum. Each prints its 15 slowest tests.
INTEGRATION = RT_BUILD_DIR=$(CURDIR)/$(BUILD)/release $(PYTEST) -q --durations=15 tests/integration

test-integration: build deps
	@$(MAKE) --no-print-directory -O -j2 test-integration-long test-integration-short

test-integration-long: build deps
	@$(INTEGRATION) -m long

test-integration-short: build deps
	@$(INTEGRATION) -m "not long" -n 2 --dist loadfile

# The broker's, the admin socket's, the transports' (TLS, WebSocket, PROXY) and the cluster's
# end-to-end tests once more against the ASan+UBSan build (rtd must also exit leak-free: the fixture
# checks its exit code). testssl.sh's audit needs no sanitizer: it runs in the release pass.
# These rtds log JSON lines: each line they write is parsed as one JSON object (conftest.py),
# as the release pass parses each logfmt line.
ASAN_INTEGRATION = RT_BUILD_DIR=$(CURDIR)/$(BUILD)/asan ASAN_OPTIONS=detect_leaks=1 \
	RT_RTD_OPTIONS="log_format=json" $(PYTEST) -q
test-integration-asan: test-integration-asan-a test-integration-asan-b

# In two halves of about equal length (the cluster's tests, a minute alone, with XMPP's; at
# stop 44 the first took 300 s, the second 249 s, TSan beside them 293 s), which `make test`
# runs beside the TSan pass. The webhook's 30-second outage (marked long)
# runs in the release pass only.
test-integration-asan-a: build-asan deps
	@$(ASAN_INTEGRATION) \
		tests/integration/test_rtd.py tests/integration/test_admin_socket.py \
		tests/integration/test_rtctl.py tests/integration/test_tls.py \
		tests/integration/test_websocket.py tests/integration/test_proxy_protocol.py \
		tests/integration/test_http.py tests/integration/test_http_tls.py \
		tests/integration/test_trace.py tests/integration/test_banned.py \
		tests/integration/test_jwt.py tests/integration/test_auth_http.py \
		tests/integration/test_xmpp_muc.py tests/integration/test_xmpp_muc_rtd.py \
		tests/integration/test_xmpp_mqtt_rules.py -k "not testssl"

test-integration-asan-b: build-asan deps
	@$(ASAN_INTEGRATION) tests/integration/test_cluster.py tests/integration/test_cluster_routes.py \
		tests/integration/test_xmpp_c2s.py tests/integration/test_xmpp_sm.py \
		tests/integration/test_xmpp_admin.py tests/integration/test_xmpp_xeps.py \
		tests/integration/test_xmpp_hostile.py tests/integration/test_xmpp_rules.py \
		tests/integration/test_xmpp_register.py tests/integration/test_xmpp_mam.py \
		tests/integration/test_xmpp_pep.py tests/integration/test_xmpp_sasl2.py \
		tests/integration/test_bridge.py tests/integration/test_webhook.py \
		tests/integration/test_tenant.py tests/integration/test_delayed.py \
		tests/integration/test_exclusive.py tests/integration/test_xmpp_upload.py \
		tests/integration/test_xmpp_converse.py tests/integration/test_xmpp_push.py \
		tests/integration/test_xmpp_s2s.py tests/integration/test_xmpp_s2s_peers.py \
		tests/integration/test_xmpp_s2s_dns.py tests/integration/test_xmpp_s2s_external.py \
		tests/integration/test_xmpp_cluster.py tests/integration/test_xmpp_cluster_home.py \
		-m "not long"

# The admin socket's wire tests against the TSan build: they walk every actor from the
# blocking pool while others exit, which is where a use-after-free in the runtime hid; and
# packet tracing, whose set of traces connections read while tracers start and stop them; and
# XMPP sessions, which share the session registry and hand sockets to each other (and which
# `xmpp sessions` walks from an admin connection while they bind and end), and take archive
# ids from one atomic while the store writes their copies, and group chat rooms, actors that
# sessions on both schedulers spawn by name and send to as they end, and PEP's events, which the
# store's thread sends to sessions on both schedulers, and SASL2's inline resumption, which hands
# a socket from the new connection's actor to the detached session's. And tenants, whose counts and
# retained bytes both schedulers change while the store's watch and rtctl read them (their
# two extra cluster nodes only in the release and ASan passes: the TSan pass is as long as
# the ASan halves). And uploads, whose files HTTP connections on both schedulers write and
# serve while the upload actor on the blocking pool makes slots and sweeps. And push, whose
# notifications the store's thread sends to sessions on both schedulers. And federation,
# whose incoming and outgoing streams hand each other dialback verifications across schedulers,
# and whose resolver answers outgoing streams from the blocking pool. And XMPP across the
# cluster, whose other nodes' bindings one actor applies to the registry while sessions on
# both schedulers bind, route and tell the other nodes of theirs under the registry's locks.
test-integration-tsan: build-tsan deps
	@RT_BUILD_DIR=$(CURDIR)/$(BUILD)/tsan \
		TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" $(PYTEST) -q \
		tests/integration/test_admin_socket.py tests/integration/test_trace.py \
		tests/integration/test_cluster.py tests/integration/test_xmpp_c2s.py \
		tests/integration/test_xmpp_sm.py tests/integration/test_xmpp_admin.py \
		tests/integration/test_xmpp_xeps.py tests/integration/test_xmpp_mam.py \
		tests/integration/test_auth_http.py tests/integration/test_tenant.py \
		tests/integration/test_xmpp_muc.py tests/integration/test_xmpp_muc_rtd.py \
		tests/integration/test_xmpp_mqtt_rules.py tests/integration/test_xmpp_pep.py \
		tests/integration/test_xmpp_sasl2.py tests/integration/test_xmpp_upload.py \
		tests/integration/test_xmpp_converse.py tests/integration/test_xmpp_push.py \
		tests/integration/test_xmpp_s2s.py tests/integration/test_xmpp_s2s_peers.py \
		tests/integration/test_xmpp_s2s_dns.py tests/integration/test_xmpp_s2s_external.py \
		tests/integration/test_xmpp_cluster.py tests/integration/test_xmpp_cluster_home.py \
		-k "not tenants_across"

# Each parser that reads outside input, fuzzed for FUZZ_SECONDS (after replaying its corpus
# and the inputs that once crashed it), JOBS targets at once (one core each); any crash fails.
FUZZ_SECONDS ?= 6
test-fuzz: build-fuzz
	@./tests/fuzz/run.sh $(BUILD)/fuzz $(FUZZ_SECONDS) $(JOBS)

# The suite in two stages after the release build, each as long as its slowest part. First the
# release unit tests and then the short part of its integration pass (mostly waiting on sockets
# and clients), beside the long part of that pass and beside the sanitizer builds, their unit
# tests and the fuzz run, which take the CPU the release passes leave idle: niced, so that they
# give it back whenever a test wants it,
# and a test sees no more than the busy machine its bounds are written for (the release unit
# tests' valgrind and bench runs print figures, which are not bounds; the unit tests run one
# at a time, so the chain has a core from the start). Then the sanitizer integration passes
# side by side, the ASan one in two halves. make -O holds a part's output until it ends, so
# parts running together do not interleave (the sanitizer chain, a make of its own, prints as
# it goes). At stop 45 it took 20 min on a fresh machine, 2 of them the packages' install (now
# beside the build) and 1 the release unit tests alone (now beside the chain).
test: build
	@$(MAKE) --no-print-directory -O -j3 test-release test-integration-long test-sanitizers
	@$(MAKE) --no-print-directory -O -j3 test-integration-asan-a test-integration-asan-b \
		test-integration-tsan
	@echo "all test suites passed"

# The release build's unit tests, then the short part of its integration pass (the long part
# starts beside the unit tests: it waits on nothing they make).
test-release: test-unit
	@$(MAKE) --no-print-directory test-integration-short

# The sanitizer builds and unit tests and the fuzz run, one after another (a make without the
# caller's job slots), at low priority.
test-sanitizers:
	@nice -n 10 env MAKEFLAGS= $(MAKE) --no-print-directory test-asan test-tsan test-fuzz

bench: build deps
	@./tests/bench/run_runtime_bench.sh --quick

# The XMPP functional tests against rtd, ejabberd and Prosody, and a pass/fail table
# (docs/XMPP.md, "Differential run"). Not part of `test`: install-deps.sh does not install the
# peers (the script says how), and it takes minutes.
xmpp-differential: build deps
	@RT_BUILD_DIR=$(CURDIR)/$(BUILD)/release ./tests/integration/xmpp_differential.sh

clean:
	rm -rf $(BUILD)
