# One venv for everything; every target installs what it needs first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-all chaos bench lint demo clean client-types ui ui-screenshots

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,otel]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench devtools
	$(BIN)/ruff format --check src tests bench devtools
	$(BIN)/mypy
	$(BIN)/lint-imports

# $(call apt_install,PACKAGES,WHAT FOR): Debian packages a test needs from the host. As root
# with apt-get, installed; otherwise one line saying how, and make goes on: those tests skip here
# and fail on CI (tests/support/tools.py), where every test must run.
define apt_install
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's $(1) for $(2) ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null; \
	else \
	  echo "missing for $(2): sudo apt-get install $(1) (skipped until then; a failure on CI)"; \
	fi
endef

# The browser test (tests/test_browser_client.py) drives Debian's Chromium with Playwright, which
# never downloads a browser here: install it once where it is missing (apt_install above).
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	$(call apt_install,chromium,the browser tests)

# tests/test_deploy.py runs the compose file's valkey-cli commands with Debian's redis-cli (the
# bundled Valkey has no cli) and checks the systemd units with systemd-analyze: install them
# where they are missing, as Chromium above.
REDIS_CLI := /usr/bin/redis-cli
SYSTEMD_ANALYZE := /usr/bin/systemd-analyze

$(REDIS_CLI):
	$(call apt_install,redis-tools,the deploy test)

$(SYSTEMD_ANALYZE):
	$(call apt_install,systemd,the deploy test)

DEPLOY_TOOLS := $(REDIS_CLI) $(SYSTEMD_ANALYZE)

# tests/test_tls.py needs a server with TLS, which the bundled Valkey is built without: Debian's
# redis-server (7.0, which also shows what works without WAITAOF), and openssl for its certificates.
REDIS_SERVER := /usr/bin/redis-server

$(REDIS_SERVER):
	$(call apt_install,redis-server openssl,the TLS test)

test: lint $(CHROMIUM) $(DEPLOY_TOOLS) $(REDIS_SERVER)
	$(BIN)/pytest -q

test-all: lint $(CHROMIUM) $(DEPLOY_TOOLS) $(REDIS_SERVER)
	$(BIN)/pytest -q -m ''

# Every chaos scenario, the long runs included (~24 min): worker / Valkey / network faults at full size,
# the model-based test and schemathesis at their long budgets. Tables also in chaos-report.txt.
chaos: $(STAMP)
	CHAOS_REPORT=chaos-report.txt $(BIN)/pytest -q -m '' tests/chaos

# The benchmarks (about nine minutes): idle cost, accept -> delivery start, open SSE streams
# (bench/scale.py); what each accept level costs (bench/durability.py); server time per
# transition against the queue's length (bench/transitions.py); round trips per delivered
# prompt against a no-op script's raw rate (bench/roundtrips.py); HTTP accepts of serve against
# a bare FastAPI+RPUSH route per server stack (bench/http.py; its first run installs autocannon
# with npm ci into bench/load/node_modules); serve's memory with event streams that never read
# and large edits, bounded in bytes against in events only (bench/stalled.py); end-to-end
# throughput, memory and latency against
# SAQ, BullMQ, streaq and arq (bench/peers; its first run installs each peer into a venv of
# its own under .cache/, about half a minute); serve's peak memory under a flood of oversized
# bodies and request heads, with and without a token, against its idle memory (bench/flood.py);
# serve's peak memory for the overview routes and a /metrics count against a workspace holding
# 100 MB, against its idle memory (bench/overview.py); one worker holding 10,000 agent turns:
# its RSS per turn, Valkey commands/s while held, a fresh session's accept -> send (bench/turns.py);
# another workspace's accept -> send behind one workspace's 5,000 due sessions (bench/fairness.py).
# Tables go to the terminal and bench-report.md;
# each target's verdict to bench-results.jsonl, from which bench/summary.py writes the targets
# table into docs/performance.md.
bench: $(STAMP)
	rm -f bench-results.jsonl
	$(BIN)/python -m bench.scale --out bench-report.md --results bench-results.jsonl
	$(BIN)/python -m bench.durability --out bench-report.md
	$(BIN)/python -m bench.transitions --out bench-report.md --results bench-results.jsonl
	$(BIN)/python -m bench.roundtrips --out bench-report.md --results bench-results.jsonl
	$(BIN)/python -m bench.http --out bench-report.md --results bench-results.jsonl
	$(BIN)/python -m bench.stalled --out bench-report.md --results bench-results.jsonl
	$(BIN)/python -m bench.peers --out bench-report.md --results bench-results.jsonl
	$(BIN)/python -m bench.flood --out bench-report.md --results bench-results.jsonl
	$(BIN)/python -m bench.overview --out bench-report.md --results bench-results.jsonl
	$(BIN)/python -m bench.turns --out bench-report.md --results bench-results.jsonl
	$(BIN)/python -m bench.fairness --out bench-report.md --results bench-results.jsonl
	$(BIN)/python -m bench.summary --results bench-results.jsonl --doc docs/performance.md

# The TypeScript client's generated types: clients/typescript/openapi.json from `prompt-outbox
# openapi`, then src/schema.ts from it (openapi-typescript, `npm run types`). Run it after any
# change to the HTTP API; `make test` fails while the committed files differ from the code's.
client-types: $(STAMP)
	$(BIN)/python -m devtools.client_types

# The queue page (clients/ui, served at /ui/): type-check it and bundle it with esbuild into
# src/prompt_outbox/ui/static/ (committed; `make test` fails while the committed files differ from
# what the sources, the TypeScript client's included, build to). Run it after changing either.
ui: $(STAMP)
	$(BIN)/python -m devtools.ui

# The README's screenshots of the queue page (docs/ui-desktop.png, docs/ui-phone.png) and the
# workspace's charts (docs/ui-dashboard.png), taken by the browser tests from the page as it is now.
ui-screenshots: $(STAMP) $(CHROMIUM)
	UI_SCREENSHOTS_TO_DOCS=1 $(BIN)/pytest -q tests/test_ui.py -k "hostile or charts"

demo: $(STAMP)
	$(BIN)/prompt-outbox demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
