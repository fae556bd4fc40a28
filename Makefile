# oncekit: the README's commands. `make help` lists them.
SHELL     := /bin/bash
.SHELLFLAGS := -o pipefail -c
GO        ?= go
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
export DATABASE_URL

.PHONY: help test test-short demo bench build vet fuzz clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

test: ## run every test with the race detector (real PostgreSQL and NATS)
	$(GO) vet ./...
	$(GO) test -race -timeout 30m ./...
	cd bench && $(GO) vet ./... && $(GO) test ./cmd/...

test-short: ## the quick tests only
	$(GO) test -short ./...

demo: ## the whole chain end to end on the local services (edge, outbox, relay, inbox, ledger, drift)
	$(GO) run ./examples/chain

BENCH_COUNT ?= 3

bench: ## benchmarks against watermill and the raw limits (BENCH_COUNT runs each, 3 unless set)
	cd bench && $(GO) test -run '^$$' -bench . -benchtime 1x -count $(BENCH_COUNT) -timeout 90m . | tee ../bench.txt
	cd bench && $(GO) run ./cmd/benchsum < ../bench.txt | tee ../bench-summary.txt

build: ## build the oncekit binary into bin/
	$(GO) build -o bin/oncekit ./cmd/oncekit

vet: ## go vet
	$(GO) vet ./...

fuzz: ## run each fuzz target for 30 s
	$(GO) test -run '^$$' -fuzz FuzzCanonicalJSON -fuzztime 30s ./idempotency/
	$(GO) test -run '^$$' -fuzz FuzzParseKey -fuzztime 30s ./idempotency/
	$(GO) test -run '^$$' -fuzz FuzzParseRetryAfter -fuzztime 30s ./sideeffect/webhook/

clean: ## remove build output
	rm -rf bin bench.txt bench-summary.txt
