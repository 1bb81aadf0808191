# outboxkit — see README.md. Every target that needs services starts the local ones if they are down.

GO        ?= go
# The library and its integration suites, two modules of one workspace (go.work): integration/ has a
# go.mod of its own so that what only the tests need (dockertest, chromedp, kfake, Watermill's
# Pub/Sub suite) stays out of the module graph of every service that requires outboxkit. ./... stops
# at a nested module, so both are named; tools/kfake, a third module, is a command with no tests.
PKGS      ?= ./... ./integration/...
MODULES   ?= . integration tools/kfake
PG_URL    ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
AMQP_URL  ?= amqp://guest:guest@127.0.0.1:5672/
NATS_URL  ?= nats://127.0.0.1:4222
REDIS_URL ?= redis://127.0.0.1:6379/0
KAFKA_URL ?= kafka://127.0.0.1:9092
MYSQL_URL ?= mysql://root@127.0.0.1:3306/test

SERVICE_ENV = OUTBOXKIT_TEST_POSTGRES_URL='$(PG_URL)' OUTBOXKIT_TEST_AMQP_URL='$(AMQP_URL)' \
	OUTBOXKIT_TEST_NATS_URL='$(NATS_URL)' OUTBOXKIT_TEST_REDIS_URL='$(REDIS_URL)' \
	OUTBOXKIT_TEST_KAFKA_URL='$(KAFKA_URL)' OUTBOXKIT_TEST_MYSQL_URL='$(MYSQL_URL)' OUTBOXKIT_REQUIRE_SERVICES=1

.PHONY: all test test-unit demo bench bench-compare chaos chaos-all chaos-binlog chaos-fleet chaos-kafka-txn lint alerts services tools browser tidy

all: lint test

## test: everything — unit and integration tests against the local services, with the race detector,
## and the console's pages in headless Chromium (installed by scripts/browser.sh; screenshots in
## .cache/screens/). The log relay's tests run against a private wal_level = logical cluster
## (scripts/pg-logical.sh, data in .cache/pg-logical/), the binlog relay's against a private
## MariaDB with the binary log on (scripts/mariadb-binlog.sh, data in .cache/mariadb-binlog/): each
## started here if it is not running, and stopped after the tests, passed or failed, if this run
## started it. The binlog relay's own package runs first and alone on that MariaDB: its tests
## change the server's globals, purge its binary logs and SIGKILL it, which the other suites
## reading its log (the demo, outboxctl, the soak) must not meet halfway.
BINLOG_PKG = ./forwarder/mysqlbinlog/
test: services tools browser
	scripts/pg-logical.sh with scripts/mariadb-binlog.sh with env $(SERVICE_ENV) sh -c '\
		all=$$($(GO) list $(PKGS)) && own=$$($(GO) list $(BINLOG_PKG)) || exit 1; rc=0; \
		if echo "$$all" | grep -qx "$$own"; then $(GO) test -race -count=1 -timeout 10m "$$own" || rc=$$?; fi; \
		rest=$$(echo "$$all" | grep -vx "$$own"); \
		if [ -n "$$rest" ]; then $(GO) test -race -count=1 -timeout 30m $$rest || rc=$$?; fi; \
		exit $$rc'

## test-unit: the tests that need no service (the others skip, naming the variable they need).
test-unit:
	env -u CI -u OUTBOXKIT_REQUIRE_SERVICES -u OUTBOXKIT_TEST_POSTGRES_URL -u OUTBOXKIT_TEST_AMQP_URL \
		-u OUTBOXKIT_TEST_NATS_URL -u OUTBOXKIT_TEST_REDIS_URL -u OUTBOXKIT_TEST_KAFKA_URL -u OUTBOXKIT_TEST_MYSQL_URL -u OUTBOXKIT_TEST_PGLOGICAL_URL \
		-u OUTBOXKIT_TEST_MYSQLBINLOG_URL \
		$(GO) test -race -count=1 $(PKGS)

## demo: orders → outbox → forwarder → broker → consumers, printed hop by hop. No server needed:
## SQLite and the in-process broker by default; DEMO_ARGS="--db postgres://… --broker amqp://…"
## starts the local services its URLs name.
demo:
	@scripts/services.sh --for $(DEMO_ARGS)
	$(GO) run ./cmd/demo $(DEMO_ARGS)

## bench: write path, drain, end to end, consumer, scale and claim cost, beside stock Watermill.
## BENCH_ARGS="--scenario console [--store sqlite]" builds 10 M outbox rows and 1 M dead letters
## and times the console's pages.
bench: services
	$(GO) run ./internal/cmd/bench $(BENCH_ARGS)

## bench-compare: this tree's bench beside an earlier commit's, run alternately on this machine:
## REF=<commit> (required), ROUNDS=3, BENCH_ARGS="--scenario drain,consumer --reps 3" (those are the
## defaults). Prints per scenario the paired ratios current/ref of every figure both report, and
## each run's own ratios to stock Watermill. The earlier build lives in .cache/bench-compare/.
ROUNDS ?= 3
bench-compare: services
	@[ -n "$(REF)" ] || { echo "make bench-compare: name the earlier commit, e.g. REF=2adf07f"; exit 2; }
	scripts/bench-compare.sh --rounds $(ROUNDS) $(REF) $(BENCH_ARGS)

## chaos: the soak — the demo's parts as processes under load, every fault at once, then the
## invariant checker (exit 1 on a violation). CHAOS_ARGS="--store mysql --broker kafka --duration 10m".
chaos: services
	$(GO) run ./internal/cmd/chaos $(CHAOS_ARGS)

## chaos-binlog: the soak with the binlog relay (forwarder/mysqlbinlog) in the forwarder processes, on
## the private MariaDB with the binary log on (scripts/mariadb-binlog.sh, started for the run if it is
## not running and stopped after it if this run started it): two relay processes of one relay group,
## one reading the binary log while the other stands by, each SIGKILLed at random and exiting after
## publishing, before its checkpoint. CHAOS_ARGS="--broker kafka --duration 6m".
chaos-binlog: services
	scripts/mariadb-binlog.sh with $(GO) run ./internal/cmd/chaos --store mysql --relay log $(CHAOS_ARGS)

## chaos-fleet: the relay fleet's soak — three member processes relaying 200 schema tenants and 20
## database tenants into RabbitMQ under load, each member killed -9 in turn (FLEET_KILLS times, the
## default 10 s lease), one cut off from the coordination database, one's sessions terminated, then
## every event checked: none lost, never two owners by the fencing tokens at the broker, the takeover
## times printed. It is integration's TestFleet_RelayProcessesKilledCutOffAndTerminated at full size
## (make test runs it with 12 outboxes and a 4 s lease).
FLEET_SCHEMAS ?= 200
FLEET_DATABASES ?= 20
FLEET_KILLS ?= 10
chaos-fleet: services
	@mkdir -p .cache; rc=0; env $(SERVICE_ENV) OUTBOXKIT_FLEET_SCHEMAS=$(FLEET_SCHEMAS) OUTBOXKIT_FLEET_DATABASES=$(FLEET_DATABASES) \
		OUTBOXKIT_FLEET_KILLS=$(FLEET_KILLS) OUTBOXKIT_FLEET_LEASE_TTL_MS=10000 OUTBOXKIT_FLEET_MAX_CONNS=1 \
		$(GO) test -race -count=1 -timeout 60m -run '^TestFleet_RelayProcessesKilledCutOffAndTerminated$$' -v ./integration/ \
		> .cache/chaos-fleet.log 2>&1 || rc=$$?; \
		grep -v '^\s*[0-9]\{4\}/[0-9][0-9]/[0-9][0-9] ' .cache/chaos-fleet.log; echo "full log: .cache/chaos-fleet.log"; exit $$rc

## chaos-kafka-txn: the transactional relay's proof at full size — polling relay processes, then log
## relay processes (on the private logical Postgres), killed with SIGKILL at random points (before
## publishing, with the transaction open, after the commit before the mark or the checkpoint, at any
## instant) KAFKA_TXN_KILLS times over KAFKA_TXN_EVENTS events each, then raw
## read_committed consumers (franz-go and kcat) count duplicates, gaps and inversions per key: 0 each;
## the control without transactions shows the duplicates. It is integration's
## TestKafkaTxn_RelayKilledAtRandomPointsExactlyOnce and TestKafkaTxn_LogRelayKilledAtRandomPointsExactlyOnce
## at full size (make test runs 6,000 and 60, 4,000 and 30).
KAFKA_TXN_EVENTS ?= 120000
KAFKA_TXN_KILLS ?= 1000
chaos-kafka-txn: services tools
	@mkdir -p .cache; rc=0; scripts/pg-logical.sh with env $(SERVICE_ENV) \
		OUTBOXKIT_KAFKA_TXN_EVENTS=$(KAFKA_TXN_EVENTS) OUTBOXKIT_KAFKA_TXN_KILLS=$(KAFKA_TXN_KILLS) \
		OUTBOXKIT_KAFKA_TXN_LOG_EVENTS=$(KAFKA_TXN_EVENTS) OUTBOXKIT_KAFKA_TXN_LOG_KILLS=$(KAFKA_TXN_KILLS) \
		$(GO) test -count=1 -timeout 60m -run '^TestKafkaTxn_' -v ./integration/ \
		> .cache/chaos-kafka-txn.log 2>&1 || rc=$$?; \
		grep -E '^\s*(---|kafka_txn_test|kafka_txn_log_test|ok|FAIL)' .cache/chaos-kafka-txn.log; echo "full log: .cache/chaos-kafka-txn.log"; exit $$rc

## chaos-all: the soak on every store (Postgres, MySQL, SQLite) and every broker (RabbitMQ, Kafka,
## NATS, Redis), in turn, then chaos-fleet; CHAOS_ARGS apply to each soak run (e.g. --duration 10m).
CHAOS_RUNS = postgres:amqp postgres:kafka postgres:nats postgres:redis mysql:amqp mysql:redis sqlite:amqp sqlite:nats
chaos-all: services
	@failed=""; for run in $(CHAOS_RUNS); do \
		echo "== chaos --store $${run%%:*} --broker $${run##*:}"; \
		$(GO) run ./internal/cmd/chaos --store $${run%%:*} --broker $${run##*:} $(CHAOS_ARGS) || failed="$$failed $$run"; \
	done; echo "== chaos-fleet"; $(MAKE) --no-print-directory chaos-fleet || failed="$$failed fleet"; \
	echo "== chaos-kafka-txn"; $(MAKE) --no-print-directory chaos-kafka-txn || failed="$$failed kafka-txn"; if [ -n "$$failed" ]; then echo "chaos failed:$$failed"; exit 1; fi

## lint: formatting, a tidy go.mod in each module, vet, golangci-lint (.golangci.yml: staticcheck with
## every check, errcheck, the store seam as a depguard rule, no time.Sleep in tests unless a
## //nolint:forbidigo says what the duration is), each module built on its own go.mod, and the
## exported-API changes since the last release (scripts/apidiff.sh: a breaking change CHANGELOG.md's
## [Unreleased] section does not name fails). golangci-lint is pinned: go run pkg@version builds it
## outside the workspace's module graph (about 2 minutes the first time, then cached).
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do (cd $$m && $(GO) mod tidy -diff) || { echo "$$m/go.mod or go.sum is not tidy: run make tidy and commit"; exit 1; }; done
	$(GO) vet $(PKGS)
	@# The workspace builds each module with the highest version any of them requires; a user of the
	@# library gets only the library's own. So each builds once more on its go.mod alone.
	GOWORK=off $(GO) build ./...
	cd integration && GOWORK=off $(GO) vet ./...
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0 run $(PKGS)
	scripts/apidiff.sh

## alerts: validate the shipped Prometheus alert rules and run their unit tests; check that every query of
## the Grafana dashboard (deploy/grafana) parses and reads only metrics and labels the demo exports
## (internal/cmd/dashcheck: the demo on SQLite and Kafka, its relay transactional).
alerts:
	scripts/promtool.sh check rules deploy/prometheus/alerts.yml
	cd deploy/prometheus && ../../scripts/promtool.sh test rules alerts_test.yml
	@scripts/services.sh kafka
	$(GO) run ./internal/cmd/dashcheck deploy/grafana/outboxkit.json

services:
	@scripts/services.sh

## browser: the headless Chromium the console's browser tests drive (Debian's chromium; idempotent).
browser:
	@scripts/browser.sh

## tools: the clients outboxkit does not control that the interoperability tests drive: kcat, the Node
## packages of tools/interop (amqplib, pg), Python's psycopg2 and the PostgreSQL JDBC driver (Debian's).
tools:
	@scripts/tools.sh

tidy:
	@for m in $(MODULES); do echo "go mod tidy in $$m"; (cd $$m && $(GO) mod tidy) || exit 1; done
