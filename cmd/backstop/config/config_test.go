package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

// env returns a lookupEnv over m.
func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// base is a valid source section; lines 1-3, so a case's own lines start at 4.
const base = "source:\n  base_url: https://api.example.com\n  api_key: key\n"

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		env  map[string]string
		want string // the whole error message
		line int
		key  string
	}{
		{"unknown key", base + "  pagesize: 10\n",
			nil, `schedules.yaml:4: source.pagesize: unknown key (did you mean page_size?)`, 4, "source.pagesize"},
		{"unknown key no suggestion", base + "  colour: red\n",
			nil, `schedules.yaml:4: source.colour: unknown key`, 4, "source.colour"},
		{"unknown section", "sources:\n  base_url: x\n",
			nil, `schedules.yaml:1: sources: unknown key (did you mean source?)`, 1, "sources"},
		{"unknown nested key", base + "  rate_limit: {per_minute: 30, reserv: 5}\n",
			nil, `schedules.yaml:4: source.rate_limit.reserv: unknown key (did you mean reserve?)`, 4, "source.rate_limit.reserv"},
		{"string for int", base + "  page_size: abc\n",
			nil, `schedules.yaml:4: source.page_size: want an integer, got "abc"`, 4, "source.page_size"},
		{"float for int", base + "  page_size: 1.5\n",
			nil, `schedules.yaml:4: source.page_size: want an integer, got "1.5"`, 4, "source.page_size"},
		{"env value for int", base + "  page_size: ${PS}\n", map[string]string{"PS": "abc"},
			`schedules.yaml:4: source.page_size: want an integer, got "abc" (from ${PS})`, 4, "source.page_size"},
		{"mapping for int", base + "  page_size: {a: 1}\n",
			nil, `schedules.yaml:4: source.page_size: want an integer, got a mapping`, 4, "source.page_size"},
		{"list for string", base + "  timeout: 1s\nstore:\n  path: [a, b]\n",
			nil, `schedules.yaml:6: store.path: want a string, got a list`, 6, "store.path"},
		{"scalar for section", base + "store: ./x.db\n",
			nil, `schedules.yaml:4: store: want a mapping, got "./x.db"`, 4, "store"},
		{"mapping for list", base + "targets:\n  name: x\n",
			nil, `schedules.yaml:4: targets: want a list, got a mapping`, 4, "targets"},
		{"string for list", base + "targets:\n  - name: a\n    url: https://a.example.com\n    events: payment.*\n",
			nil, `schedules.yaml:7: targets[0].events: want a list, got "payment.*"`, 7, "targets[0].events"},
		{"bad bool", base + "targets:\n  - name: a\n    url: https://a.example.com\n    allow_private: yes\n",
			nil, `schedules.yaml:7: targets[0].allow_private: want true or false, got "yes"`, 7, "targets[0].allow_private"},
		{"bad duration", base + "  timeout: 10 minutes\n",
			nil, `schedules.yaml:4: source.timeout: want a duration like 30s, 10m, 1h30m or 14d, got "10 minutes"`, 4, "source.timeout"},
		{"duration without unit", base + "  timeout: 30\n",
			nil, `schedules.yaml:4: source.timeout: want a duration like 30s, 10m, 1h30m or 14d, got "30"`, 4, "source.timeout"},
		{"bad duration in list", base + "targets:\n  - name: a\n    url: https://a.example.com\n    retry_schedule:\n      - 1m\n      - 10m\n      - 1x\n",
			nil, `schedules.yaml:10: targets[0].retry_schedule[2]: want a duration like 30s, 10m, 1h30m or 14d, got "1x"`, 10, "targets[0].retry_schedule[2]"},
		{"duplicate key", base + "  page_size: 10\n  page_size: 20\n",
			nil, `schedules.yaml:5: source.page_size: duplicate key (first at line 4)`, 5, "source.page_size"},
		{"duplicate section", base + "source:\n  page_size: 10\n",
			nil, `schedules.yaml:4: source: duplicate key (first at line 1)`, 4, "source"},
		{"header given twice in two cases", base + "targets:\n  - name: a\n    url: https://a.example.com\n    headers:\n      Authorization: Bearer a\n      authorization: Bearer b\n",
			nil, `schedules.yaml:9: targets[0].headers.authorization is the header Authorization again (also given as Authorization): header names are case-insensitive; keep one`, 9, "targets[0].headers.authorization"},
		{"duplicate header", base + "targets:\n  - name: a\n    url: https://a.example.com\n    headers:\n      X-A: b\n      X-A: c\n",
			nil, `schedules.yaml:9: targets[0].headers.X-A: duplicate key (first at line 8)`, 9, "targets[0].headers.X-A"},
		{"merge key", base + "  <<: {page_size: 10}\n",
			nil, `schedules.yaml:4: source.<<: merge keys (<<) are not supported`, 4, "source.<<"},
		{"top level list", "- a\n",
			nil, `schedules.yaml:1: want a mapping, got a list`, 1, ""},
		{"syntax error", base + "  page_size: [1\n",
			nil, `schedules.yaml:4: did not find expected ',' or ']'`, 4, ""},
		{"scanner error", base + "  page_size: 1: 2\n",
			nil, `schedules.yaml:4: mapping values are not allowed in this context`, 4, ""},
		{"parser error", base + "store:\n  path: a\n - b\n",
			nil, `schedules.yaml:6: did not find expected key`, 6, ""},
		{"two documents", base + "---\nstore: {}\n",
			nil, `schedules.yaml:4: want one YAML document, found more`, 4, ""},
		{"unterminated variable", base + "dashboard:\n  token: ${TOKEN\n",
			nil, `schedules.yaml:5: dashboard.token: unterminated "${" (write $$ for a literal $)`, 5, "dashboard.token"},
		{"bad variable name", base + "dashboard:\n  token: ${1X}\n",
			nil, `schedules.yaml:5: dashboard.token: bad variable name "1X" in ${...}`, 5, "dashboard.token"},

		// Validate.
		{"empty file", "",
			nil, "schedules.yaml: source.base_url is required\nschedules.yaml: source.api_key is required", 0, "source.base_url"},
		{"api key from unset variable", "source:\n  base_url: https://api.example.com\n  api_key: ${BOTIX_API_KEY}\n",
			nil, `schedules.yaml:3: source.api_key is empty: set BOTIX_API_KEY`, 3, "source.api_key"},
		{"api key missing", "source:\n  base_url: https://api.example.com\n",
			nil, `schedules.yaml:1: source.api_key is required`, 1, "source.api_key"},
		{"base url scheme", "source:\n  base_url: ftp://api.example.com\n  api_key: k\n",
			nil, `schedules.yaml:2: source.base_url: want a http or https URL, got scheme "ftp"`, 2, "source.base_url"},
		{"base url relative", "source:\n  base_url: api.example.com\n  api_key: k\n",
			nil, `schedules.yaml:2: source.base_url: want an absolute http:// URL with a host`, 2, "source.base_url"},
		{"page size range", base + "  page_size: 500\n",
			nil, `schedules.yaml:4: source.page_size: want 1..200, got 500`, 4, "source.page_size"},
		{"reserve above budget", base + "  rate_limit: {per_minute: 5, reserve: 5}\n",
			nil, `schedules.yaml:4: source.rate_limit.reserve: want 0..4 (less than per_minute), got 5`, 4, "source.rate_limit.reserve"},
		{"retry_max above 20", base + "  retry_max: 100\n",
			nil, `schedules.yaml:4: source.retry_max: want 0..20, got 100: each retry waits up to 30s first and may take the whole source.timeout, so more would hold a run on one failing request for twenty minutes or more`, 4, "source.retry_max"},
		{"timeout above 10m", base + "  timeout: 30m\n",
			nil, `schedules.yaml:4: source.timeout: want at most 10m0s, got 30m0s: an answer later than that is not coming, and everything behind it waits as long`, 4, "source.timeout"},
		{"target timeout above 10m", base + "targets:\n  - {name: a, url: \"https://a.example.com\", timeout: 1h}\n",
			nil, `schedules.yaml:5: targets[0].timeout: want at most 10m0s, got 1h0m0s: an answer later than that is not coming, and everything behind it waits as long`, 5, "targets[0].timeout"},
		{"zero timeout", base + "  timeout: 0s\n",
			nil, `schedules.yaml:4: source.timeout: want a duration above 0, got 0s`, 4, "source.timeout"},
		{"synchronous", base + "store:\n  synchronous: OFF\n",
			nil, `schedules.yaml:5: store.synchronous: want one of NORMAL, FULL, got "OFF"`, 5, "store.synchronous"},
		{"redis scheme", base + "governor:\n  redis: http://127.0.0.1:6379\n",
			nil, `schedules.yaml:5: governor.redis: want a redis or rediss URL, got scheme "http"`, 5, "governor.redis"},
		{"redis database", base + "governor:\n  redis: redis://:s3cret@127.0.0.1:6379/first\n",
			nil, `schedules.yaml:5: governor.redis: invalid database number: "first": want redis://[user:password@]host:port[/db][?option=value]`, 5, "governor.redis"},
		{"redis database option", base + "governor:\n  redis: redis://127.0.0.1:6379?db=x\n",
			nil, `schedules.yaml:5: governor.redis: invalid database number: "x" is not a number: want redis://[user:password@]host:port[/db][?option=value]`, 5, "governor.redis"},
		{"redis option", base + "governor:\n  redis: redis://:s3cret@127.0.0.1:6379/0?dial_timout=1s\n",
			nil, `schedules.yaml:5: governor.redis: unexpected option: dial_timout: want redis://[user:password@]host:port[/db][?option=value]`, 5, "governor.redis"},
		{"fallback share zero", base + "governor:\n  fallback_share: 0\n",
			nil, `schedules.yaml:5: governor.fallback_share: want a share above 0 and at most 1, got 0`, 5, "governor.fallback_share"},
		{"fallback share above one", base + "governor:\n  fallback_share: 1.5\n",
			nil, `schedules.yaml:5: governor.fallback_share: want a share above 0 and at most 1, got 1.5`, 5, "governor.fallback_share"},
		{"fallback share not a number", base + "governor:\n  fallback_share: quarter\n",
			nil, `schedules.yaml:5: governor.fallback_share: want a number, got "quarter"`, 5, "governor.fallback_share"},
		{"fallback share NaN", base + "governor:\n  fallback_share: NaN\n",
			nil, `schedules.yaml:5: governor.fallback_share: want a number, got "NaN"`, 5, "governor.fallback_share"},
		{"job lease too short", base + "governor:\n  job_lease: 500ms\n",
			nil, `schedules.yaml:5: governor.job_lease: want at least 1s, got 500ms`, 5, "governor.job_lease"},
		{"listen", base + "intake:\n  listen: 8080\n",
			nil, `schedules.yaml:5: intake.listen: want host:port, got "8080"`, 5, "intake.listen"},
		{"max batch", base + "intake:\n  max_batch: 0\n",
			nil, `schedules.yaml:5: intake.max_batch: want 1..10000 webhooks per commit, got 0`, 5, "intake.max_batch"},
		{"api key ending in a line break", "source:\n  base_url: https://api.example.com\n  api_key: ${BOTIX_API_KEY}\n",
			map[string]string{"BOTIX_API_KEY": "sim_test_key\n"},
			`schedules.yaml:3: source.api_key: holds a line break (\n) at byte 13 of 13, at its end: a value read from a file often ends with one (check BOTIX_API_KEY)`, 3, "source.api_key"},
		{"intake secret with a carriage return", base + "intake:\n  secret: \"abc\\rdef\"\n",
			nil, `schedules.yaml:5: intake.secret: holds a carriage return (\r) at byte 4 of 7`, 5, "intake.secret"},
		{"standard webhooks secret with a line break", base + "intake:\n  scheme: standard-webhooks\n  secret: ${WHSEC}\n",
			map[string]string{"WHSEC": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"},
			`schedules.yaml:6: intake.secret: holds a line break (\n) at byte 39 of 39, at its end: a value read from a file often ends with one (check WHSEC)`, 6, "intake.secret"},
		{"target header with a line break", base + "targets:\n  - name: crm\n    url: https://crm.example.com/hooks\n    headers: {Authorization: \"Bearer abc\\n\"}\n",
			nil, `schedules.yaml:7: targets[0].headers.Authorization: holds a line break (\n) at byte 11 of 11, at its end: a value read from a file often ends with one`, 7, "targets[0].headers.Authorization"},
		{"proxy token with a NUL", base + "intake:\n  proxy_token: \"tok\\0en-0123456789abcdef\"\n",
			nil, `schedules.yaml:5: intake.proxy_token: holds the control character U+0000 at byte 4 of 23`, 5, "intake.proxy_token"},
		{"linger over its bound", base + "intake:\n  linger: 1s\n",
			nil, `schedules.yaml:5: intake.linger: want 0 (commit at once) up to 100ms, got 1s`, 5, "intake.linger"},
		{"linger negative", base + "intake:\n  linger: -1ms\n",
			nil, `schedules.yaml:5: intake.linger: want 0 (commit at once) up to 100ms, got -1ms`, 5, "intake.linger"},
		{"intake path relative", base + "intake:\n  path: webhooks\n",
			nil, `schedules.yaml:5: intake.path: want a path starting with /, got "webhooks"`, 5, "intake.path"},
		{"intake path root", base + "intake:\n  path: /\n",
			nil, `schedules.yaml:5: intake.path: "/" alone would take every request serve answers: give a path such as /webhooks/botix`, 5, "intake.path"},
		{"intake path dashboard", base + "intake:\n  path: /ui\n",
			nil, `schedules.yaml:5: intake.path: "/ui" would clash with serve's own endpoints (/healthz, /readyz, /metrics, /ui/…, /outbox/{target}): give another path such as /webhooks/botix`, 5, "intake.path"},
		{"intake path under dashboard", base + "intake:\n  path: /ui/hooks\n",
			nil, `schedules.yaml:5: intake.path: "/ui/hooks" would clash with serve's own endpoints (/healthz, /readyz, /metrics, /ui/…, /outbox/{target}): give another path such as /webhooks/botix`, 5, "intake.path"},
		{"intake path proxy", base + "intake:\n  path: /outbox/{target}\n",
			nil, `schedules.yaml:5: intake.path: "/outbox/{target}" would clash with serve's own endpoints (/healthz, /readyz, /metrics, /ui/…, /outbox/{target}): give another path such as /webhooks/botix`, 5, "intake.path"},
		{"intake path metrics", base + "intake:\n  path: /metrics\n",
			nil, `schedules.yaml:5: intake.path: "/metrics" would clash with serve's own endpoints (/healthz, /readyz, /metrics, /ui/…, /outbox/{target}): give another path such as /webhooks/botix`, 5, "intake.path"},
		{"intake path wildcard", base + "intake:\n  path: /hooks/{x}\n",
			nil, `schedules.yaml:5: intake.path: "/hooks/{x}" has '{', which serve's router would read as a wildcard: give a literal path such as /webhooks/botix`, 5, "intake.path"},
		{"intake path end wildcard", base + "intake:\n  path: \"/hooks/{$}\"\n",
			nil, `schedules.yaml:5: intake.path: "/hooks/{$}" has '{', which serve's router would read as a wildcard: give a literal path such as /webhooks/botix`, 5, "intake.path"},
		{"intake path method", base + "intake:\n  path: \"/hooks POST\"\n",
			nil, `schedules.yaml:5: intake.path: "/hooks POST" has ' ': use letters, digits, - . _ ~ and ! $ & ' ( ) * + , ; = : @ between the slashes`, 5, "intake.path"},
		{"intake path escape", base + "intake:\n  path: /a%2Fb\n",
			nil, `schedules.yaml:5: intake.path: "/a%2Fb" has '%': use letters, digits, - . _ ~ and ! $ & ' ( ) * + , ; = : @ between the slashes`, 5, "intake.path"},
		{"intake path subtree", base + "intake:\n  path: /hooks/\n",
			nil, `schedules.yaml:5: intake.path: "/hooks/" ends with /, which would make it take every path under it: write "/hooks"`, 5, "intake.path"},
		{"intake path unclean", base + "intake:\n  path: /a//b/../c\n",
			nil, `schedules.yaml:5: intake.path: "/a//b/../c" is not a clean path (no //, . or .. segments): write "/a/c"`, 5, "intake.path"},
		{"scheme", base + "intake:\n  scheme: svix\n",
			nil, `schedules.yaml:5: intake.scheme: want one of botix, standard-webhooks, github, stripe, got "svix"`, 5, "intake.scheme"},
		{"target name missing", base + "targets:\n  - url: https://a.example.com\n",
			nil, `schedules.yaml:5: targets[0].name is required`, 5, "targets[0].name"},
		{"target url missing", base + "targets:\n  - name: crm\n",
			nil, `schedules.yaml:5: targets[0].url is required`, 5, "targets[0].url"},
		{"target url loopback", base + "targets:\n  - name: crm\n    url: http://127.0.0.1:8080/hooks\n",
			nil, `schedules.yaml:6: targets[0].url: refused: 127.0.0.1 is a loopback address (set allow_private on the target to allow)`, 6, "targets[0].url"},
		{"target url metadata", base + "targets:\n  - name: crm\n    url: http://169.254.169.254/latest\n",
			nil, `schedules.yaml:6: targets[0].url: refused: 169.254.169.254 is a cloud metadata address (set allow_private on the target to allow)`, 6, "targets[0].url"},
		{"target url numeric host", base + "targets:\n  - name: crm\n    url: http://2130706433/hooks\n    allow_private: true\n",
			nil, `schedules.yaml:6: targets[0].url: refused: host "2130706433" is an IPv4 address (127.0.0.1) in a non-standard numeric form`, 6, "targets[0].url"},
		{"target names unique", base + "targets:\n  - {name: crm, url: https://a.example.com}\n  - {name: crm, url: https://b.example.com}\n",
			nil, `schedules.yaml:6: targets[1].name: "crm" is already the name of targets[0]`, 6, "targets[1].name"},
		{"target name characters", base + "targets:\n  - {name: my crm, url: https://a.example.com}\n",
			nil, `schedules.yaml:5: targets[0].name: want letters, digits, '.', '_' or '-' (starting with a letter or digit), got "my crm"`, 5, "targets[0].name"},
		{"target events glob", base + "targets:\n  - name: a\n    url: https://a.example.com\n    events: [\"payment.[\"]\n",
			nil, `schedules.yaml:7: targets[0].events[0]: want an event type or glob like payment.*, got "payment.["`, 7, "targets[0].events[0]"},
		{"target retry delay", base + "targets:\n  - name: a\n    url: https://a.example.com\n    retry_schedule: [1m, 0s]\n",
			nil, `schedules.yaml:7: targets[0].retry_schedule[1]: want a duration above 0, got 0s`, 7, "targets[0].retry_schedule[1]"},
		{"target concurrency", base + "targets:\n  - name: a\n    url: https://a.example.com\n    concurrency: 0\n",
			nil, `schedules.yaml:7: targets[0].concurrency: want 1..64 requests in flight, got 0`, 7, "targets[0].concurrency"},
		{"target max payload", base + "targets:\n  - name: a\n    url: https://a.example.com\n    max_payload: 0\n",
			nil, `schedules.yaml:7: targets[0].max_payload: want more than 0 bytes, got 0`, 7, "targets[0].max_payload"},
		{"header name", base + "targets:\n  - name: a\n    url: https://a.example.com\n    headers: {\"X A\": b}\n",
			nil, `schedules.yaml:7: targets[0].headers.X A: want an HTTP header name, got "X A"`, 7, "targets[0].headers.X A"},
		{"header backstop sets", base + "targets:\n  - name: a\n    url: https://a.example.com\n    headers: {user-agent: my-crm-sync}\n",
			nil, `schedules.yaml:7: targets[0].headers.user-agent is set by backstop on every delivery, which would replace this value: leave it out`, 7, "targets[0].headers.user-agent"},
		{"signature header", base + "targets:\n  - name: a\n    url: https://a.example.com\n    headers: {Webhook-Signature: v1,abc}\n",
			nil, `schedules.yaml:7: targets[0].headers.Webhook-Signature is backstop's signature of each delivery, made with the target's secret: leave it out and set secret`, 7, "targets[0].headers.Webhook-Signature"},
		{"host header", base + "targets:\n  - name: a\n    url: https://a.example.com\n    headers: {Host: crm.internal}\n",
			nil, `schedules.yaml:7: targets[0].headers.Host is written by the HTTP client from the URL and the body, not taken from headers: leave it out`, 7, "targets[0].headers.Host"},
		{"bad cron", base + "jobs:\n  - name: a\n    kind: sync\n    cron: \"61 * * * *\"\n",
			nil, `schedules.yaml:7: jobs[0].cron: minute field "61": 61 is out of range 0-59`, 7, "jobs[0].cron"},
		{"cron fields", base + "jobs:\n  - {name: a, kind: sync, cron: \"0 3 * *\"}\n",
			nil, `schedules.yaml:5: jobs[0].cron: want 5 fields (minute hour day-of-month month day-of-week), got 4 in "0 3 * *"`, 5, "jobs[0].cron"},
		{"cron and every", base + "jobs:\n  - name: a\n    kind: sync\n    cron: \"0 * * * *\"\n    every: 1h\n",
			nil, `schedules.yaml:8: jobs[0].every: set either cron or every, not both`, 8, "jobs[0].every"},
		{"cron and every 0", base + "jobs:\n  - name: a\n    kind: sync\n    cron: \"0 * * * *\"\n    every: 0s\n",
			nil, `schedules.yaml:8: jobs[0].every: set either cron or every, not both`, 8, "jobs[0].every"},
		{"every 0", base + "jobs:\n  - {name: a, kind: sync, every: 0s}\n",
			nil, `schedules.yaml:5: jobs[0].every: want 1s or more, got 0s: a shorter interval only piles up skipped runs`, 5, "jobs[0].every"},
		{"event glob with spaces", base + "targets:\n  - name: a\n    url: https://a.example.com\n    events: [\"payment.* \"]\n",
			nil, `schedules.yaml:7: targets[0].events[0]: "payment.* " has spaces at its ends, which no event type has, so it would match nothing: write "payment.*"`, 7, "targets[0].events[0]"},
		{"no schedule", base + "jobs:\n  - name: a\n    kind: sync\n",
			nil, `schedules.yaml:5: jobs[0]: needs a schedule: set cron or every`, 5, "jobs[0]"},
		{"negative every", base + "jobs:\n  - {name: a, kind: sync, every: -1m}\n",
			nil, `schedules.yaml:5: jobs[0].every: want 1s or more, got -1m0s: a shorter interval only piles up skipped runs`, 5, "jobs[0].every"},
		{"every below a second", base + "jobs:\n  - {name: a, kind: sync, every: 10ms}\n",
			nil, `schedules.yaml:5: jobs[0].every: want 1s or more, got 10ms: a shorter interval only piles up skipped runs`, 5, "jobs[0].every"},
		{"job kind", base + "jobs:\n  - {name: a, kind: mirror, every: 1h}\n",
			nil, `schedules.yaml:5: jobs[0].kind: want one of sync, reconcile, backfill, maintenance, backup, got "mirror"`, 5, "jobs[0].kind"},
		{"job kind missing", base + "jobs:\n  - {name: a, every: 1h}\n",
			nil, `schedules.yaml:5: jobs[0].kind is required`, 5, "jobs[0].kind"},
		{"job resource", base + "jobs:\n  - name: a\n    kind: sync\n    every: 1h\n    resources:\n      - contacts\n      - invoices\n",
			nil, `schedules.yaml:10: jobs[0].resources[1]: want contacts, chats, messages or payments, got "invoices"`, 10, "jobs[0].resources[1]"},
		{"job resource twice", base + "jobs:\n  - {name: a, kind: sync, every: 1h, resources: [chats, chats]}\n",
			nil, `schedules.yaml:5: jobs[0].resources[1]: chats is listed twice`, 5, "jobs[0].resources[1]"},
		{"maintenance resources", base + "jobs:\n  - {name: a, kind: maintenance, every: 1h, resources: [chats]}\n",
			nil, `schedules.yaml:5: jobs[0].resources: maintenance jobs take no resources`, 5, "jobs[0].resources"},
		{"backup resources", base + "jobs:\n  - {name: a, kind: backup, every: 24h, dir: /tmp, resources: [chats]}\n",
			nil, `schedules.yaml:5: jobs[0].resources: backup jobs take no resources`, 5, "jobs[0].resources"},
		{"backup without dir", base + "jobs:\n  - {name: a, kind: backup, cron: \"15 4 * * *\"}\n",
			nil, `schedules.yaml:5: jobs[0].dir is required for a backup job: the directory its copies of the store go to, e.g. /var/backups/backstop`, 5, "jobs[0].dir"},
		{"backup keep 0", base + "jobs:\n  - name: a\n    kind: backup\n    every: 24h\n    dir: /tmp\n    keep: 0\n",
			nil, `schedules.yaml:9: jobs[0].keep: want 1 or more, got 0: how many of its backups the job keeps (default 7)`, 9, "jobs[0].keep"},
		{"dir on sync", base + "jobs:\n  - {name: s, kind: sync, every: 1h, dir: /tmp}\n",
			nil, `schedules.yaml:5: jobs[0].dir: only for backup jobs; this one is a sync job`, 5, "jobs[0].dir"},
		{"keep on maintenance", base + "jobs:\n  - {name: m, kind: maintenance, every: 1h, keep: 3}\n",
			nil, `schedules.yaml:5: jobs[0].keep: only for backup jobs; this one is a maintenance job`, 5, "jobs[0].keep"},
		{"emit on reconcile", base + "jobs:\n  - {name: r, kind: reconcile, every: 1m, emit: true}\n",
			nil, `schedules.yaml:5: jobs[0].emit: only for backfill jobs; this one is a reconcile job`, 5, "jobs[0].emit"},
		{"emit false on sync", base + "jobs:\n  - name: s\n    kind: sync\n    every: 1m\n    emit: false\n",
			nil, `schedules.yaml:8: jobs[0].emit: only for backfill jobs; this one is a sync job`, 8, "jobs[0].emit"},
		{"full on maintenance", base + "jobs:\n  - {name: m, kind: maintenance, every: 1m, full: true}\n",
			nil, `schedules.yaml:5: jobs[0].full: only for reconcile jobs; this one is a maintenance job`, 5, "jobs[0].full"},
		{"lookback on backfill", base + "jobs:\n  - {name: b, kind: backfill, every: 1m, lookback: 5m}\n",
			nil, `schedules.yaml:5: jobs[0].lookback: only for reconcile jobs; this one is a backfill job`, 5, "jobs[0].lookback"},
		{"lookback 0", base + "jobs:\n  - {name: r, kind: reconcile, every: 1h, lookback: 0s}\n",
			nil, `schedules.yaml:5: jobs[0].lookback: want more than 0s, got 0s: the window overlaps the last run's start by it, to catch changes made while that run read the feed (default 10m)`, 5, "jobs[0].lookback"},
		{"job names unique", base + "jobs:\n  - {name: a, kind: sync, every: 1h}\n  - {name: b, kind: sync, every: 1h}\n  - {name: a, kind: sync, every: 1h}\n",
			nil, `schedules.yaml:7: jobs[2].name: "a" is already the name of jobs[0]`, 7, "jobs[2].name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse("schedules.yaml", []byte(tt.yaml), env(tt.env))
			if err == nil {
				t.Fatalf("Parse succeeded with %+v, want error %q", cfg, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %s\nwant %s", err, tt.want)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not *Error", err)
			}
			if e.File != "schedules.yaml" || e.Line != tt.line || e.Key != tt.key {
				t.Errorf("Error{File: %q, Line: %d, Key: %q}, want {schedules.yaml, %d, %q}", e.File, e.Line, e.Key, tt.line, tt.key)
			}
		})
	}
}

// TestParseReportsEveryProblem: a file with several mistakes gets them all
// in one error, one per line in the file's order, each with its line and
// key, and a mistake in one key does not hide the others (nor is a missing
// value also reported as malformed).
func TestParseReportsEveryProblem(t *testing.T) {
	yaml := `jobs:
  - {name: nightly, kind: sync, cron: "61 * * * *"}
  - {name: nightly, kind: mirror, every: 1h}
source:
  base_url: https://api.example.com
  api_key: k
  page_size: 500
intake:
  max_batch: 0
targets:
  - name: crm
    url: ""
    concurrency: 100
`
	_, err := Parse("schedules.yaml", []byte(yaml), env(nil))
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("Parse error %v (%T), want Errors", err, err)
	}
	want := []struct {
		line int
		key  string
	}{
		{2, "jobs[0].cron"},
		{3, "jobs[1].name"},
		{3, "jobs[1].kind"},
		{7, "source.page_size"},
		{9, "intake.max_batch"},
		{12, "targets[0].url"},
		{13, "targets[0].concurrency"},
	}
	if len(es) != len(want) {
		t.Fatalf("%d problems, want %d:\n%v", len(es), len(want), err)
	}
	for i, w := range want {
		if es[i].File != "schedules.yaml" || es[i].Line != w.line || es[i].Key != w.key {
			t.Errorf("problem %d: %q, want line %d key %s", i+1, es[i], w.line, w.key)
		}
	}
	if got := es[5].Error(); got != "schedules.yaml:12: targets[0].url is required" {
		t.Errorf("empty url reported as %q, want only that it is required", got)
	}
	if lines := strings.Split(err.Error(), "\n"); len(lines) != len(want) {
		t.Errorf("error has %d lines, want one per problem:\n%v", len(lines), err)
	}
	var first *Error
	if !errors.As(err, &first) || first.Key != "jobs[0].cron" {
		t.Errorf("errors.As(*Error) = %v, want the first problem", first)
	}
}

// TestParseLocal: commands that only use the store accept a file whose
// platform key is unset or address empty, but still report a malformed
// address and every other problem; Parse does not.
func TestParseLocal(t *testing.T) {
	yaml := "source:\n  api_key: ${BOTIX_API_KEY}\nstore:\n  path: /var/lib/backstop/backstop.db\n"
	cfg, err := ParseLocal("schedules.yaml", []byte(yaml), env(nil))
	if err != nil {
		t.Fatalf("ParseLocal: %v", err)
	}
	if cfg.Store.Path != "/var/lib/backstop/backstop.db" {
		t.Errorf("store.path %q", cfg.Store.Path)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate of a local configuration: %v", err)
	}
	if _, err := Parse("schedules.yaml", []byte(yaml), env(nil)); err == nil ||
		err.Error() != "schedules.yaml:1: source.base_url is required\nschedules.yaml:2: source.api_key is empty: set BOTIX_API_KEY" {
		t.Errorf("Parse = %v, want base_url and api_key reported", err)
	}
	bad := "source:\n  base_url: ftp://api.example.com\nintake:\n  max_batch: 0\n"
	if _, err := ParseLocal("schedules.yaml", []byte(bad), env(nil)); err == nil ||
		err.Error() != "schedules.yaml:2: source.base_url: want a http or https URL, got scheme \"ftp\"\nschedules.yaml:4: intake.max_batch: want 1..10000 webhooks per commit, got 0" {
		t.Errorf("ParseLocal of a bad file = %v", err)
	}
}

// TestTargetSecrets: a target secret that is not a Standard Webhooks
// secret is an error at its line, without the value; one that came from an
// unset variable is a warning (its deliveries would go unsigned); one left
// out on purpose is neither.
func TestTargetSecrets(t *testing.T) {
	base := "source:\n  base_url: https://api.example.com\n  api_key: k\ntargets:\n"
	_, err := Parse("schedules.yaml", []byte(base+"  - {name: crm, url: \"https://crm.example.com\", secret: \"hunter2!\"}\n"), env(nil))
	if err == nil || err.Error() != `schedules.yaml:5: targets[0].secret: want a Standard Webhooks secret: base64, usually after "whsec_"` {
		t.Errorf("bad secret: %v", err)
	}
	// The intake's, under the standard-webhooks scheme, the same way, and
	// the message names the variable the value came from.
	_, err = Parse("schedules.yaml", []byte("source:\n  base_url: https://api.example.com\n  api_key: k\n"+
		"intake:\n  scheme: standard-webhooks\n  secret: whsec_${WHSEC}\n"), env(map[string]string{"WHSEC": "not base64!"}))
	if err == nil || err.Error() != `schedules.yaml:6: intake.secret: want a Standard Webhooks secret: base64, usually after "whsec_" (check WHSEC)` {
		t.Errorf("bad intake secret: %v", err)
	}
	cfg, err := Parse("schedules.yaml", []byte(base+"  - name: crm\n    url: https://crm.example.com\n    secret: ${CRM_WEBHOOK_SECRET}\n"+
		"  - {name: erp, url: \"https://erp.example.com\"}\n"+
		"  - {name: billing, url: \"https://billing.example.com\", secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Warnings()
	if len(w) != 1 || w[0].Error() != "schedules.yaml:7: targets[0].secret is empty (CRM_WEBHOOK_SECRET unset or empty): deliveries to crm are sent unsigned" {
		t.Errorf("warnings %v, want one for crm's unset secret", w)
	}
}

func TestExpand(t *testing.T) {
	lookup := env(map[string]string{"A": "alpha", "B_2": "beta", "EMPTY": ""})
	tests := []struct {
		in, want string
		vars     []string
		err      bool
	}{
		{in: "plain", want: "plain"},
		{in: "${A}", want: "alpha", vars: []string{"A"}},
		{in: "x-${A}-${B_2}-y", want: "x-alpha-beta-y", vars: []string{"A", "B_2"}},
		{in: "${UNSET}", want: "", vars: []string{"UNSET"}},
		{in: "${EMPTY}", want: "", vars: []string{"EMPTY"}},
		{in: "$$", want: "$"},
		{in: "$${A}", want: "${A}"},
		{in: "$$$${A}", want: "$${A}"},
		{in: "$A stays", want: "$A stays"},
		{in: "cost: 5$", want: "cost: 5$"},
		{in: "${A", err: true},
		{in: "${}", err: true},
		{in: "${A-B}", err: true},
	}
	for _, tt := range tests {
		got, vars, err := expand(tt.in, lookup)
		if (err != nil) != tt.err {
			t.Errorf("expand(%q) error %v, want error %t", tt.in, err, tt.err)
			continue
		}
		if got != tt.want || !reflect.DeepEqual(vars, tt.vars) {
			t.Errorf("expand(%q) = %q, %q; want %q, %q", tt.in, got, vars, tt.want, tt.vars)
		}
	}
}

func TestParseExpandsVariables(t *testing.T) {
	data := "source:\n  base_url: ${BASE}/v1\n  api_key: ${KEY}\n  page_size: ${PS}\n" +
		"store:\n  path: /var/lib/$${literal}.db\n" +
		"intake:\n  path: /hooks/$$botix\n  secrets: [\"${OLD}\", \"${NEW}\"]\n"
	cfg, err := Parse("schedules.yaml", []byte(data), env(map[string]string{
		"BASE": "https://api.example.com", "KEY": "k-123", "PS": "50", "OLD": "o", "NEW": "n",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source.BaseURL != "https://api.example.com/v1" || cfg.Source.APIKey.Value() != "k-123" ||
		cfg.Source.PageSize != 50 || cfg.Store.Path != "/var/lib/${literal}.db" || cfg.Intake.Path != "/hooks/$botix" {
		t.Errorf("source/store/intake = %+v / %+v / %+v", cfg.Source, cfg.Store, cfg.Intake)
	}
	if got := cfg.Intake.AllSecrets(); len(got) != 2 || got[0].Value() != "o" || got[1].Value() != "n" {
		t.Errorf("AllSecrets() = %d secrets", len(got))
	}
}

func TestDefaults(t *testing.T) {
	data := base + "  page_size: ~\n" + // null keeps the default
		"targets:\n  - {name: crm, url: https://crm.example.com}\n" +
		"jobs:\n  - {name: nightly, kind: sync, cron: \"0 3 * * *\"}\n"
	cfg, err := Parse("/etc/backstop/schedules.yaml", []byte(data), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Source.BaseURL = "https://api.example.com"
	want.Source.APIKey = "key"
	want.Store.Path = "/etc/backstop/backstop.db"
	want.Targets = []Target{{
		Name:           "crm",
		URL:            "https://crm.example.com",
		Events:         []string{"*"},
		ConnectTimeout: Duration(10 * time.Second),
		Timeout:        Duration(30 * time.Second),
		RetrySchedule: []Duration{
			Duration(time.Minute), Duration(10 * time.Minute), Duration(time.Hour), Duration(24 * time.Hour),
		},
		MaxPayload: 65536, Concurrency: 1,
	}}
	want.Jobs = []Job{{Name: "nightly", Kind: KindSync, Cron: "0 3 * * *", Lookback: Duration(10 * time.Minute)}}
	cfg.meta = nil
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Parse =\n%+v\nwant\n%+v", cfg, want)
	}
	// Spot-check Default itself, so the comparison above cannot pass vacuously.
	d := Default()
	if d.Source.PageSize != 200 || d.Source.RateLimit != (SourceRateLimit{30, 5, Duration(time.Minute)}) ||
		d.Source.RetryMax != 5 || d.Source.Timeout.Std() != 30*time.Second ||
		d.Store != (Store{"./backstop.db", "NORMAL"}) || d.Intake.Listen != "127.0.0.1:8080" ||
		d.Intake.Path != "/webhooks/botix" || d.Intake.Scheme != "botix" ||
		d.Intake.Tolerance.Std() != 5*time.Minute || d.Intake.Synchronous != "FULL" ||
		d.Intake.MaxBatch != 512 || d.Intake.Linger.Std() != 500*time.Microsecond ||
		d.Governor != (Governor{FallbackShare: 0.25, JobLease: Duration(15 * time.Second)}) {
		t.Errorf("Default() = %+v", d)
	}
}

// intake.linger takes a duration such as 500us, and 0 turns it off.
// TestHeaderValueTabs: HTTP allows a tab inside a header value (RFC 9110
// 5.5), so a target header holding one is taken as written; a tab at
// either end, which HTTP would strip, is refused as the other control
// characters are.
func TestHeaderValueTabs(t *testing.T) {
	cfg, err := Parse("schedules.yaml", []byte(base+"targets:\n  - name: crm\n    url: https://crm.example.com/hooks\n    headers: {X-Note: \"a\\tb\"}\n"), env(nil))
	if err != nil {
		t.Fatalf("a tab inside a header value: %v", err)
	}
	if got := cfg.Targets[0].Headers["X-Note"].Value(); got != "a\tb" {
		t.Errorf("header value %q, want %q", got, "a\tb")
	}
	for _, v := range []string{`\tab`, `ab\t`} {
		_, err := Parse("schedules.yaml", []byte(base+"targets:\n  - name: crm\n    url: https://crm.example.com/hooks\n    headers: {X-Note: \""+v+"\"}\n"), env(nil))
		if err == nil || !strings.Contains(err.Error(), "targets[0].headers.X-Note: holds a tab at byte") {
			t.Errorf("header value %s: %v, want a tab refused", v, err)
		}
	}
}

func TestIntakeLinger(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
	}{{"500us", 500 * time.Microsecond}, {"0", 0}, {"100ms", 100 * time.Millisecond}} {
		cfg, err := Parse("schedules.yaml", []byte(base+"intake:\n  linger: "+c.in+"\n"), env(nil))
		if err != nil {
			t.Errorf("linger %s: %v", c.in, err)
			continue
		}
		if got := cfg.Intake.Linger.Std(); got != c.want {
			t.Errorf("linger %s = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestListsReplaceDefaults(t *testing.T) {
	data := base + "targets:\n  - name: a\n    url: https://a.example.com\n    retry_schedule: []\n    events: [\"payment.*\", contact.created]\n"
	cfg, err := Parse("schedules.yaml", []byte(data), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	tg := cfg.Targets[0]
	if len(tg.RetrySchedule) != 0 || !reflect.DeepEqual(tg.Events, []string{"payment.*", "contact.created"}) {
		t.Errorf("target = %+v", tg)
	}
}

func TestStorePath(t *testing.T) {
	abs := filepath.Join(t.TempDir(), "state.db")
	tests := []struct {
		file, store, want string
	}{
		{"/etc/backstop/schedules.yaml", "", "/etc/backstop/backstop.db"},
		{"/etc/backstop/schedules.yaml", "data/b.db", "/etc/backstop/data/b.db"},
		{"/etc/backstop/schedules.yaml", "../b.db", "/etc/b.db"},
		{"/etc/backstop/schedules.yaml", abs, abs},
		{"conf/schedules.yaml", "./b.db", "conf/b.db"},
		{"schedules.yaml", "", "backstop.db"},
	}
	for _, tt := range tests {
		data := base
		if tt.store != "" {
			data += "store:\n  path: \"" + tt.store + "\"\n"
		}
		cfg, err := Parse(tt.file, []byte(data), env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Store.Path != filepath.FromSlash(tt.want) {
			t.Errorf("file %s, store.path %q: got %q, want %q", tt.file, tt.store, cfg.Store.Path, tt.want)
		}
	}
}

func TestStorePathRejectsSpecialNames(t *testing.T) {
	for _, p := range []string{":memory:", "file:x.db?mode=memory"} {
		_, err := Parse("schedules.yaml", []byte("source:\n  base_url: http://x\n  api_key: k\nstore:\n  path: \""+p+"\"\n"), env(nil))
		if err == nil || !strings.Contains(err.Error(), "schedules.yaml:5: store.path") {
			t.Errorf("store.path %q: error %v, want one naming line 5 and the key", p, err)
		}
	}
}

// exampleEnv sets the variables the DESIGN.md sample refers to.
var exampleEnv = map[string]string{
	"BOTIX_API_KEY":            "sk_live_apikey_0001",
	"BOTIX_WEBHOOK_SECRET":     "intake_secret_0002",
	"BILLING_WHSEC":            "whsec_YmlsbGluZ3NlY3JldDAwMDM=", // base64 of billingsecret0003
	"BACKSTOP_DASHBOARD_TOKEN": "dash_token_0004",
}

func TestLoadExample(t *testing.T) {
	for k, v := range exampleEnv {
		t.Setenv(k, v)
	}
	cfg, err := Load("testdata/schedules.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source.BaseURL != "https://api.botix.pro" || cfg.Source.APIKey.Value() != "sk_live_apikey_0001" ||
		cfg.Source.PageSize != 200 || cfg.Source.RateLimit.PerMinute != 30 || cfg.Source.RateLimit.Reserve != 5 {
		t.Errorf("source = %+v", cfg.Source)
	}
	if cfg.Store.Path != filepath.Join("testdata", "backstop.db") || cfg.Governor.Redis != "" {
		t.Errorf("store = %+v, governor = %+v", cfg.Store, cfg.Governor)
	}
	if cfg.Intake.Scheme != "botix" || cfg.Intake.Secret.Value() != "intake_secret_0002" || cfg.Intake.Listen != "127.0.0.1:8080" {
		t.Errorf("intake = %+v", cfg.Intake)
	}
	if len(cfg.Targets) != 1 {
		t.Fatalf("targets = %+v", cfg.Targets)
	}
	tg := cfg.Targets[0]
	if tg.Name != "billing" || tg.Secret.Value() != "whsec_YmlsbGluZ3NlY3JldDAwMDM=" || !reflect.DeepEqual(tg.Events, []string{"payment.*"}) ||
		len(tg.RetrySchedule) != 4 || tg.RetrySchedule[3].Std() != 24*time.Hour || tg.AllowPrivate {
		t.Errorf("target = %+v", tg)
	}
	wantJobs := []Job{
		{Name: "crm-nightly", Kind: KindSync, Resources: []backstop.Resource{backstop.Contacts}, Cron: "0 3 * * *", Lookback: Duration(10 * time.Minute)},
		{Name: "payments-hourly", Kind: KindReconcile, Resources: []backstop.Resource{backstop.Payments}, Cron: "0 * * * *", Lookback: Duration(10 * time.Minute)},
		{Name: "prune", Kind: KindMaintenance, Cron: "30 4 * * *", Lookback: Duration(10 * time.Minute)},
	}
	if !reflect.DeepEqual(cfg.Jobs, wantJobs) {
		t.Errorf("jobs = %+v\nwant %+v", cfg.Jobs, wantJobs)
	}
	if cfg.Dashboard.Token.Value() != "dash_token_0004" {
		t.Errorf("dashboard token not expanded")
	}
}

func TestLoadExampleWithoutEnv(t *testing.T) {
	t.Setenv("BOTIX_API_KEY", "")
	_, err := Load("testdata/schedules.example.yaml")
	want := "testdata/schedules.example.yaml:3: source.api_key is empty: set BOTIX_API_KEY"
	if err == nil || err.Error() != want {
		t.Errorf("Load error = %v, want %s", err, want)
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := Load(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Errorf("Load(%s) error = %v, want one naming the path and wrapping fs.ErrNotExist", path, err)
	}
}

func TestSecretsRedacted(t *testing.T) {
	e := map[string]string{"AUTH": "Bearer hdr_secret_0005", "OLD": "old_secret_0006"}
	for k, v := range exampleEnv {
		e[k] = v
	}
	data := strings.Replace(readExample(t), "intake:\n",
		"intake:\n  secrets: [\"${OLD}\"]\n", 1)
	data = strings.Replace(data, "    allow_private: false",
		"    allow_private: false\n    headers: {Authorization: \"${AUTH}\"}", 1)
	cfg, err := Parse("schedules.yaml", []byte(data), env(e))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Targets[0].Headers["Authorization"].Value() != "Bearer hdr_secret_0005" || len(cfg.Intake.AllSecrets()) != 2 {
		t.Fatalf("secrets not decoded: %+v", cfg)
	}

	var outputs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		outputs = append(outputs, fmt.Sprintf(verb, cfg), fmt.Sprintf(verb, *cfg))
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, string(js))
	var jsonLog, textLog bytes.Buffer
	slog.New(slog.NewJSONHandler(&jsonLog, nil)).Info("config", "cfg", cfg, "key", cfg.Source.APIKey)
	slog.New(slog.NewTextHandler(&textLog, nil)).Info("config", "cfg", cfg, "key", cfg.Source.APIKey)
	outputs = append(outputs, jsonLog.String(), textLog.String())

	for _, out := range outputs {
		for _, secret := range e {
			if strings.Contains(out, secret) || strings.Contains(out, fmt.Sprintf("%x", secret)) {
				t.Errorf("output contains secret %q:\n%s", secret, out)
			}
		}
		if !strings.Contains(out, redacted) && !strings.Contains(out, fmt.Sprintf("%x", redacted)) {
			t.Errorf("output does not show %s:\n%s", redacted, out)
		}
	}

	if s := Secret(""); s.String() != "" || s.GoString() != `""` {
		t.Errorf("empty secret renders %q / %s", s.String(), s.GoString())
	}
	if b, _ := Secret("x").MarshalText(); string(b) != redacted {
		t.Errorf("MarshalText = %s", b)
	}
	if b, _ := json.Marshal(Secret("")); string(b) != `""` {
		t.Errorf("empty secret marshals to %s", b)
	}
}

func TestErrorsDoNotLeakSecrets(t *testing.T) {
	const secret = "sk_live_leak_0007"
	tests := []string{
		base + "intake:\n  secrets: " + secret + "\n",
		base + "intake:\n  secrets: ${S}\n",
		base + "dashboard:\n  token: [" + secret + "]\n",
		base + "targets:\n  - name: a\n    url: https://a.example.com\n    headers: " + secret + "\n",
		"source:\n  base_url: https://user:" + secret + "@api.example.com\n  api_key: ${S}x\n  page_size: 0\n",
		"source:\n  base_url: ftp://user:" + secret + "@api.example.com\n  api_key: k\n",
		"source:\n  base_url: \"https://" + secret + "%zz\"\n  api_key: k\n",
		base + "governor:\n  redis: http://:" + secret + "@localhost:6379\n",
	}
	for _, data := range tests {
		_, err := Parse("schedules.yaml", []byte(data), env(map[string]string{"S": secret}))
		if err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", data)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error leaks the secret: %v", err)
		}
	}
}

func readExample(t *testing.T) string {
	t.Helper()
	cfg, err := os.ReadFile("testdata/schedules.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(cfg)
}

func TestValidateWithoutFile(t *testing.T) {
	cfg := Default()
	cfg.Source.BaseURL = "https://api.example.com"
	cfg.Source.APIKey = "k"
	cfg.Jobs = []Job{{Name: "a", Kind: KindSync, Every: Duration(time.Hour)}}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
	cfg.Jobs[0].Every = 0
	if err := cfg.Validate(); err == nil || err.Error() != "jobs[0]: needs a schedule: set cron or every" {
		t.Errorf("Validate() = %v", err)
	}
	cfg.Jobs[0].Every, cfg.Store.Synchronous = Duration(time.Hour), "full"
	if err := cfg.Validate(); err != nil || cfg.Store.Synchronous != "FULL" {
		t.Errorf("Validate() = %v, synchronous %q; want nil, FULL", err, cfg.Store.Synchronous)
	}
}

func TestCheckCron(t *testing.T) {
	valid := []string{
		"0 3 * * *", "*/15 * * * *", "0 9-17 * * MON-FRI", "0 0 1,15 * *",
		"30 4 * JAN,jul sun", "5/10 * * * *", "0-30/5 0 1 1 0", "59 23 31 12 6",
		"@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually", "@midnight",
		"  0   3 * * *  ",
		"0 3 29 2 *",   // leap years
		"0 3 31 2 MON", // a restricted weekday adds its own days
		"0 3 30,31 1-3 *",
	}
	for _, expr := range valid {
		if err := checkCron(expr); err != nil {
			t.Errorf("checkCron(%q) = %v, want nil", expr, err)
		}
	}
	invalid := map[string]string{
		"":                      "want 5 fields",
		"0 3 * * * *":           "want 5 fields",
		"60 * * * *":            `minute field "60": 60 is out of range 0-59`,
		"* 24 * * *":            `hour field "24": 24 is out of range 0-23`,
		"* * 0 * *":             `day-of-month field "0": 0 is out of range 1-31`,
		"* * * 13 *":            `month field "13": 13 is out of range 1-12`,
		"* * * * 7":             `day-of-week field "7": 7 is out of range 0-6`,
		"* * * FOO *":           `month field "FOO": bad value "FOO"`,
		"* * * * MON-SUN":       `day-of-week field "MON-SUN": range MON-SUN goes backwards`,
		"*/0 * * * *":           `minute field "*/0": bad step "0"`,
		"*/x * * * *":           `minute field "*/x": bad step "x"`,
		"1,,2 * * * *":          `minute field "1,,2": bad value ""`,
		"-5 * * * *":            `minute field "-5": bad value ""`,
		"+5 * * * *":            `minute field "+5": bad value "+5"`,
		"? * * * *":             `minute field "?": bad value "?"`,
		"* * * JAN-MON *":       `month field "JAN-MON": bad value "MON"`,
		"@every 5m":             "use every:",
		"@often":                `unknown descriptor "@often"`,
		"30-10 * * * *":         `range 30-10 goes backwards`,
		"CRON_TZ=UTC 0 3 * * *": "want 5 fields",
		"0 3 31 2 *":            "never fires",
		"0 3 30,31 2 *":         "never fires",
		"0 3 31 4,6,9,11 *":     "never fires",
		"0 3 31 FEB */1":        "never fires",
	}
	for expr, want := range invalid {
		err := checkCron(expr)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("checkCron(%q) = %v, want error containing %q", expr, err, want)
		}
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{in: "500ms", want: 500 * time.Millisecond},
		{in: "10m", want: 10 * time.Minute},
		{in: "1h30m", want: 90 * time.Minute},
		{in: "0", want: 0},
		{in: "-1m", want: -time.Minute},
		{in: "14d", want: 14 * 24 * time.Hour},
		{in: "1d12h", want: 36 * time.Hour},
		{in: "0d", want: 0},
		{in: "30", err: true},
		{in: "d", err: true},
		{in: "1.5d", err: true},
		{in: "-1d", err: true},
		{in: "1d-1h", err: true},
		{in: "1d2d", err: true},
		{in: "999999d", err: true},
		{in: "", err: true},
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if (err != nil) != tt.err || !tt.err && got.Std() != tt.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v, error %t", tt.in, got, err, tt.want, tt.err)
		}
	}
	var d Duration
	if err := d.UnmarshalText([]byte("2d")); err != nil || d.Std() != 48*time.Hour {
		t.Errorf("UnmarshalText(2d) = %v, %v", d, err)
	}
	if b, _ := d.MarshalText(); string(b) != "48h0m0s" {
		t.Errorf("MarshalText = %s", b)
	}
}

func TestSuggest(t *testing.T) {
	fields := fieldsOf(reflect.TypeFor[Target]())
	tests := map[string]string{
		"retry-schedule": "retry_schedule",
		"retrySchedule":  "retry_schedule",
		"RetrySchedule":  "retry_schedule",
		"conect_timeout": "connect_timeout",
		"event":          "events",
		"uri":            "url",
		"colour":         "",
		"x":              "",
	}
	for in, want := range tests {
		if got := suggest(in, fields); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAliases(t *testing.T) {
	data := base + "targets:\n  - {name: a, url: https://a.example.com, retry_schedule: &slow [1h, 1d]}\n" +
		"  - {name: b, url: https://b.example.com, retry_schedule: *slow}\n"
	cfg, err := Parse("schedules.yaml", []byte(data), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []Duration{Duration(time.Hour), Duration(24 * time.Hour)}
	if !reflect.DeepEqual(cfg.Targets[1].RetrySchedule, want) {
		t.Errorf("aliased retry_schedule = %v, want %v", cfg.Targets[1].RetrySchedule, want)
	}
}

func TestGovernorKeys(t *testing.T) {
	const password = "s3cret-pass"
	data := base + "governor:\n  redis: ${REDIS_URL}\n  fallback_share: 0.5\n  job_lease: 5s\n"
	cfg, err := Parse("schedules.yaml", []byte(data), env(map[string]string{"REDIS_URL": "redis://:" + password + "@10.0.0.7:6379/2"}))
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.Governor
	if g.Redis.Value() != "redis://:"+password+"@10.0.0.7:6379/2" || g.FallbackShare != 0.5 || g.JobLease.Std() != 5*time.Second {
		t.Errorf("governor = %+v", g)
	}
	if out := fmt.Sprintf("%v %+v %#v", cfg, g, g); strings.Contains(out, password) {
		t.Errorf("printing the configuration shows the Redis password: %s", out)
	}
}

// The example schedules.yaml at the top of the repository, which the README
// points new users to, parses with only the API key set, and with every
// variable set.
func TestExampleConfigParses(t *testing.T) {
	data, err := os.ReadFile("../../../schedules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range []map[string]string{
		{"BOTIX_API_KEY": "k"},
		{"BOTIX_API_KEY": "k", "BOTIX_WEBHOOK_SECRET": "s", "BACKSTOP_REDIS_URL": "redis://127.0.0.1:6379/0",
			"BACKSTOP_DASHBOARD_TOKEN": "t", "BACKSTOP_PROXY_TOKEN": "p", "CRM_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
	} {
		lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
		cfg, err := Parse("schedules.yaml", data, lookup)
		if err != nil {
			t.Fatalf("with %d variables set: %v", len(env), err)
		}
		if len(cfg.Jobs) != 3 || len(cfg.Targets) != 1 {
			t.Errorf("example: %d jobs and %d targets, want 3 and 1", len(cfg.Jobs), len(cfg.Targets))
		}
		if got := cfg.Governor.Redis.Value(); got != env["BACKSTOP_REDIS_URL"] {
			t.Errorf("governor.redis = %q, want %q", got, env["BACKSTOP_REDIS_URL"])
		}
	}
}

// TestJobKeysOfAnotherKind: lookback and full belong to reconcile jobs,
// emit to backfill jobs; on a job of another kind each is an error (not
// silently ignored), and every such key is reported at once.
func TestJobKeysOfAnotherKind(t *testing.T) {
	yaml := `jobs:
  - {name: r, kind: reconcile, every: 1m, emit: true}
  - {name: s, kind: sync, every: 1m, lookback: 5m, full: true}
  - {name: b, kind: backfill, every: 1m, lookback: 5m}
  - {name: m, kind: maintenance, every: 1m, full: true}
  - {name: ok-r, kind: reconcile, every: 1m, lookback: 5m, full: true}
  - {name: ok-b, kind: backfill, every: 1m, emit: true}
` + base
	_, err := Parse("p2.yaml", []byte(yaml), env(nil))
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("Parse error %v (%T), want Errors", err, err)
	}
	want := []string{
		"p2.yaml:2: jobs[0].emit: only for backfill jobs; this one is a reconcile job",
		"p2.yaml:3: jobs[1].lookback: only for reconcile jobs; this one is a sync job",
		"p2.yaml:3: jobs[1].full: only for reconcile jobs; this one is a sync job",
		"p2.yaml:4: jobs[2].lookback: only for reconcile jobs; this one is a backfill job",
		"p2.yaml:5: jobs[3].full: only for reconcile jobs; this one is a maintenance job",
	}
	if got := err.Error(); got != strings.Join(want, "\n") {
		t.Errorf("error\n got %s\nwant %s", got, strings.Join(want, "\n"))
	}

	// A configuration built in code has no file: a value that is set
	// counts.
	cfg := Default()
	cfg.Source.BaseURL, cfg.Source.APIKey = "https://api.example.com", "k"
	cfg.Jobs = []Job{
		{Name: "s", Kind: KindSync, Every: Duration(time.Hour), Emit: true},
		{Name: "r", Kind: KindReconcile, Every: Duration(time.Hour), Lookback: Duration(time.Minute), Full: true},
	}
	if err := cfg.Validate(); err == nil || err.Error() != "jobs[0].emit: only for backfill jobs; this one is a sync job" {
		t.Errorf("Validate() = %v", err)
	}
}

// TestIntakePathsServeCanRoute: paths that are neither serve's own nor
// special to its router are accepted as written.
func TestIntakePathsServeCanRoute(t *testing.T) {
	for _, p := range []string{"/webhooks/botix", "/hooks", "/ui-hooks", "/outboxes/in", "/healthz2", "/metrics/botix",
		"/v1/hooks:botix", "/a.b/c_d~e", "/hooks/$x", "/hooks@platform"} {
		cfg, err := Parse("schedules.yaml", []byte(base+"intake:\n  path: \""+p+"\"\n"), env(nil))
		if err != nil {
			t.Errorf("intake.path %q: %v", p, err)
		} else if cfg.Intake.Path != p {
			t.Errorf("intake.path %q read as %q", p, cfg.Intake.Path)
		}
	}
}

// TestMissingNamesLineAndVariables: a key a command requires (serve's
// intake.secret) is reported with the file, the line and the variable to
// set, not only the file.
func TestMissingNamesLineAndVariables(t *testing.T) {
	cfg, err := Parse("schedules.yaml", []byte(base+"intake:\n  secret: ${BOTIX_WEBHOOK_SECRET}\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Missing("intake.secret", "serve needs the webhook signing secret").Error()
	want := "schedules.yaml:5: intake.secret is empty: set BOTIX_WEBHOOK_SECRET: serve needs the webhook signing secret"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	cfg, err = Parse("schedules.yaml", []byte(base), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	got = cfg.Missing("intake.secret", "serve needs the webhook signing secret").Error()
	want = "schedules.yaml: intake.secret is required: serve needs the webhook signing secret"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// The proxy's and the dashboard's bearer tokens are served on the intake's
// listener: a short one is guessable, and Validate says so (a warning: it
// still works), naming the line and key and never the token.
func TestShortBearerTokensWarned(t *testing.T) {
	cfg, err := Parse("schedules.yaml", []byte(base+"intake:\n  proxy_token: ${PROXY_TOKEN}\ndashboard:\n  token: hunter2\n"),
		env(map[string]string{"PROXY_TOKEN": "0123456789abcdef"}))
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Warnings()
	if len(w) != 1 || w[0].Error() != "schedules.yaml:7: dashboard.token is 7 characters: a token served where the platform can reach it should be at least 16 random ones (openssl rand -hex 32 makes one)" {
		t.Errorf("warnings %v, want one for the 7-character dashboard token", w)
	}
	cfg, err = Parse("schedules.yaml", []byte(base+"intake:\n  proxy_token: short\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if w := cfg.Warnings(); len(w) != 1 || !strings.Contains(w[0].Error(), "intake.proxy_token is 5 characters") || strings.Contains(w[0].Error(), "short") {
		t.Errorf("warnings %v, want one for the proxy token, without its value", w)
	}
	// During a rotation: both tokens are taken, each checked.
	cfg, err = Parse("schedules.yaml", []byte(base+"intake:\n  proxy_token: new-token-0123456789\n  proxy_tokens: [old-token-0123456789, \"${OLD}\", tiny]\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Intake.AllProxyTokens(); !slices.Equal(got, []string{"new-token-0123456789", "old-token-0123456789", "tiny"}) {
		t.Errorf("AllProxyTokens = %q", got)
	}
	if w := cfg.Warnings(); len(w) != 1 || w[0].Error() != "schedules.yaml:6: intake.proxy_tokens[2] is 4 characters: a token served where the platform can reach it should be at least 16 random ones (openssl rand -hex 32 makes one)" {
		t.Errorf("warnings %v, want one for proxy_tokens[2]", w)
	}
}

// admin.listen must be an address of its own.
func TestAdminListen(t *testing.T) {
	for yaml, want := range map[string]string{
		"admin:\n  listen: 9090\n": `schedules.yaml:5: admin.listen: want host:port, got "9090"`,
		"intake:\n  listen: 127.0.0.1:8080\nadmin:\n  listen: 127.0.0.1:8080\n": "schedules.yaml:7: admin.listen is intake.listen (127.0.0.1:8080): give it an address of its own, or leave it out to serve everything there",
	} {
		if _, err := Parse("schedules.yaml", []byte(base+yaml), env(nil)); err == nil || err.Error() != want {
			t.Errorf("%q: %v, want %s", yaml, err, want)
		}
	}
	cfg, err := Parse("schedules.yaml", []byte(base+"admin:\n  listen: 127.0.0.1:9090\n"), env(nil))
	if err != nil || cfg.Admin.Listen != "127.0.0.1:9090" {
		t.Errorf("a good admin.listen: %v %+v", err, cfg.Admin)
	}
}

// intake.trusted_proxies takes addresses and CIDR ranges, and names a bad
// entry's line and index.
func TestTrustedProxies(t *testing.T) {
	cfg, err := Parse("schedules.yaml", []byte(base+"intake:\n  trusted_proxies: [10.0.0.0/8, 192.0.2.7, \"::ffff:198.51.100.1\", \"fd00::/8\"]\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(cfg.Intake.TrustedPrefixes()); got != "[10.0.0.0/8 192.0.2.7/32 198.51.100.1/32 fd00::/8]" {
		t.Errorf("TrustedPrefixes = %s", got)
	}
	_, err = Parse("schedules.yaml", []byte(base+"intake:\n  trusted_proxies: [10.0.0.0/8, lb.internal]\n"), env(nil))
	if want := `schedules.yaml:5: intake.trusted_proxies[1]: want an IP address or a CIDR range such as 10.0.0.0/8, got "lb.internal"`; err == nil || err.Error() != want {
		t.Errorf("a host name: %v, want %s", err, want)
	}
}

// A backup job's dir, like store.path, is relative to the configuration
// file's directory; an absolute one is kept.
func TestBackupDirRelativeToConfig(t *testing.T) {
	cfg, err := Parse("/etc/backstop/schedules.yaml", []byte(`source: {base_url: "https://api.example.com", api_key: k}
jobs:
  - {name: b, kind: backup, cron: "15 4 * * *", dir: backups}
  - {name: c, kind: backup, cron: "15 4 * * *", dir: /var/backups/backstop, keep: 3}
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Jobs[0].Dir; got != "/etc/backstop/backups" {
		t.Errorf("relative dir = %s, want /etc/backstop/backups", got)
	}
	if got := cfg.Jobs[1]; got.Dir != "/var/backups/backstop" || got.Keep != 3 {
		t.Errorf("absolute dir = %s keep %d, want /var/backups/backstop keep 3", got.Dir, got.Keep)
	}
}

// $NAME is not expanded (only ${NAME} is): when the variable is set, the
// user surely meant it, and it is an error naming file, line and the fix;
// when it is not, it may be a literal $ (a password, an OData path), and
// serve warns. A secret's message leaves the name out, as it is part of
// the value. $$NAME is a literal $ and says nothing.
func TestBareDollarVariables(t *testing.T) {
	vars := env(map[string]string{"BASE": "https://api.example.com", "BOTIX_KEY": "k"})
	_, err := Parse("schedules.yaml", []byte("source:\n  base_url: $BASE/v1\n  api_key: key\n"), vars)
	var e *Error
	if !errors.As(err, &e) || e.Line != 2 || e.Key != "source.base_url" ||
		!strings.Contains(e.Msg, "$BASE is kept as written") || !strings.Contains(e.Msg, "write ${BASE}") {
		t.Errorf("set variable: %v", err)
	}
	_, err = Parse("schedules.yaml", []byte("source:\n  base_url: https://api.example.com\n  api_key: $BOTIX_KEY\n"), vars)
	if !errors.As(err, &e) || e.Line != 3 || e.Key != "source.api_key" || !strings.Contains(e.Msg, "write ${NAME}") ||
		strings.Contains(e.Msg, "BOTIX_KEY") {
		t.Errorf("set variable in a secret: %v", err)
	}

	cfg, err := Parse("schedules.yaml", []byte("source:\n  base_url: https://api.example.com/$metadata\n  api_key: pa$word\n"), vars)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Source.BaseURL != "https://api.example.com/$metadata" || cfg.Source.APIKey.Value() != "pa$word" {
		t.Errorf("values %q, %q: want them as written", cfg.Source.BaseURL, cfg.Source.APIKey.Value())
	}
	w := cfg.Warnings()
	if len(w) != 2 || w[0].Line != 2 || !strings.Contains(w[0].Msg, "kept as written") || strings.Contains(w[0].Msg, "metadata") ||
		w[1].Line != 3 || strings.Contains(w[1].Msg, "word") {
		t.Errorf("warnings %v: want them without the names, parts of a URL (which may hold a token) and of a secret", w)
	}
	cfg, err = Parse("schedules.yaml", []byte("source:\n  base_url: https://api.example.com\n  api_key: key\nstore:\n  path: /var/lib/$state.db\n"), vars)
	if err != nil {
		t.Fatal(err)
	}
	if w := cfg.Warnings(); len(w) != 1 || w[0].Line != 5 || !strings.Contains(w[0].Msg, "$state is kept as written") {
		t.Errorf("warnings %v", w)
	}

	cfg, err = Parse("schedules.yaml", []byte("source:\n  base_url: https://api.example.com/$$BASE\n  api_key: key\n"), vars)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil || len(cfg.Warnings()) != 0 || cfg.Source.BaseURL != "https://api.example.com/$BASE" {
		t.Errorf("$$BASE: %v, warnings %v, base_url %q", err, cfg.Warnings(), cfg.Source.BaseURL)
	}
}

func TestBareRefs(t *testing.T) {
	for in, want := range map[string][]string{
		"plain": nil, "$A": {"A"}, "x$A_1/y": {"A_1"}, "$$A": nil, "${A}": nil, "$1": nil,
		"cost 5$": nil, "$A$B": {"A", "B"}, "$$$A": {"A"}, "$a9": {"a9"},
		"abc$_!": nil, "$__": nil, "$_A": {"_A"},
	} {
		if got := bareRefs(in); !reflect.DeepEqual(got, want) {
			t.Errorf("bareRefs(%q) = %q, want %q", in, got, want)
		}
	}
}

// A TZ that names no zone makes Go keep local time as UTC without a word:
// with a cron job (local time) in the file, it is a problem at the job's
// cron, which serve and jobs refuse to start with (the other commands do
// not schedule); TZ is not looked at without one.
func TestMisspeltTZ(t *testing.T) {
	data := base + "jobs:\n  - {name: a, kind: sync, cron: \"0 3 * * *\"}\n"
	for tz, bad := range map[string]bool{
		"Europe/Berlni": true, "Europe/Berlin": false, ":Europe/Berlin": false, "": false, "UTC": false,
		"/nonexistent/zone": true, "CET": false, "Local": true,
	} {
		t.Run(tz, func(t *testing.T) {
			t.Setenv("TZ", tz)
			cfg, err := Parse("schedules.yaml", []byte(data), env(nil)) // Parse validates
			if err != nil {
				t.Fatalf("Parse: %v (only serve and jobs look at TZ)", err)
			}
			e := cfg.ScheduleProblem()
			if !bad {
				if e != nil {
					t.Errorf("ScheduleProblem: %v", e)
				}
				return
			}
			if e == nil || e.Line != 5 || e.Key != "jobs[0].cron" ||
				!strings.Contains(e.Msg, fmt.Sprintf("TZ=%q names no time zone", tz)) {
				t.Errorf("ScheduleProblem = %v", e)
			}
		})
	}
	t.Setenv("TZ", "Europe/Berlni")
	cfg, err := Parse("schedules.yaml", []byte(base+"jobs:\n  - {name: a, kind: sync, every: 1h}\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if e := cfg.ScheduleProblem(); e != nil {
		t.Errorf("without a cron job: %v", e)
	}
}

// A key written with a null value (every: ~, or nothing after the colon,
// as a template leaves it) is the same as one left out: beside cron it is
// not a second schedule, and keep: on a sync job is not a backup option.
func TestNullIsLeftOut(t *testing.T) {
	data := base + "jobs:\n  - name: a\n    kind: sync\n    cron: \"0 * * * *\"\n    every: ~\n    lookback: ~\n    keep:\n"
	cfg, err := Parse("schedules.yaml", []byte(data), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if j := cfg.Jobs[0]; j.Every != 0 || j.Lookback != Duration(10*time.Minute) || j.Keep != 0 {
		t.Errorf("job %+v: want every and keep unset, lookback the default", j)
	}
}
