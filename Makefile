# backstop — run `make help` for the targets.
GO      ?= go
BIN     ?= bin/backstop
PKGS    ?= ./...

SHELL   := /bin/bash
.SHELLFLAGS := -o pipefail -c
.DEFAULT_GOAL := help

.PHONY: help
help: ## show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
# VERSION is what backstop version prints: the git commit (with -dirty for
# uncommitted changes), also where the build info has no VCS stamp
# (GOFLAGS=-buildvcs=false, a copy of the tree without .git).
VERSION ?= $(shell git describe --always --dirty --tags 2>/dev/null)

build: ## build bin/backstop
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/backstop

.PHONY: test
test: lint deps ## what CI runs: go vet, gofmt check, test deps, then every test with -race
	mkdir -p artifacts
	BACKSTOP_ARTIFACTS=$(CURDIR)/artifacts \
	$(GO) test -race -count=1 -timeout 45m $(PKGS)

.PHONY: deps
deps: ## install chromium, redis-server, node, npm and the node signature checker when missing
	scripts/test-deps

.PHONY: race
race: ## every test with the race detector, without the lint step
	$(GO) test -race -count=1 -timeout 45m $(PKGS)

.PHONY: lint
lint: ## go vet and a gofmt check
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

.PHONY: bench
bench: ## run the benchmarks, one package at a time (-p 1: two at once on 2 cores skew each other); each prints one BENCH line
	$(GO) test -p 1 -run '^$$' -bench . -benchtime 1x -count 1 $(PKGS) | tee bench.out | grep -E '^(BENCH|ok|FAIL|---)'

.PHONY: demo
demo: build ## lose webhooks on purpose, reconcile, check the mirror (about 25 s)
	$(BIN) demo
