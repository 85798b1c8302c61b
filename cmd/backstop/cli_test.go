package main

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/backstop-sync/backstop"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop/sources/sim"
)

func TestConfigErrorsNameFileLineAndKey(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 10}})
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown key", "source:\n  base_url: http://x\n  api_key: k\n  page_sise: 10\n", ":4: source.page_sise"},
		{"wrong type", "source:\n  base_url: http://x\n  api_key: k\n  page_size: many\n", ":4: source.page_size"},
		{"bad duration", "source:\n  base_url: http://x\n  api_key: k\n  rate_limit:\n    window: soon\n", ":5: source.rate_limit.window"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.writeConfig(c.yaml)
			code, _, stderr := e.run(context.Background(), "sync")
			if code != 2 {
				t.Fatalf("exit %d, want 2\n%s", code, stderr)
			}
			if !strings.Contains(stderr, "schedules.yaml"+c.want) {
				t.Errorf("error does not name file, line and key %q:\n%s", c.want, stderr)
			}
		})
	}
}

// TestConfigWithSeveralMistakesNamesThemAll: one run reports every
// problem of the file, one "backstop:" line each with its line and key,
// and exits 2 without touching the store.
func TestConfigWithSeveralMistakesNamesThemAll(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 10}})
	e.writeConfig("source:\n  base_url: http://x\n  api_key: k\n  page_size: 0\nintake:\n  max_batch: 0\n" +
		"targets:\n  - {name: crm, url: \"ftp://crm.example.com\"}\n")
	code, _, stderr := e.run(context.Background(), "serve")
	if code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, stderr)
	}
	want := []string{
		"backstop: " + e.dir + "/schedules.yaml:4: source.page_size:",
		"backstop: " + e.dir + "/schedules.yaml:6: intake.max_batch:",
		"backstop: " + e.dir + "/schedules.yaml:8: targets[0].url:",
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), stderr)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q, want it to start %q", i+1, lines[i], w)
		}
	}
}

// TestStoreCommandsNeedNoPlatformKey: reading the delivery log, the
// cursors and the jobs works with the platform's API key unset; a command that calls
// the platform still refuses, naming the variable to set.
func TestStoreCommandsNeedNoPlatformKey(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 10}})
	e.writeConfig("source:\n  base_url: http://127.0.0.1:9\n  api_key: ${BACKSTOP_TEST_UNSET_KEY}\n" +
		"targets:\n  - {name: crm, url: \"https://crm.example.com/hooks\"}\n" +
		"jobs:\n  - {name: nightly, kind: sync, cron: \"0 3 * * *\"}\n" +
		"store:\n  path: " + e.db + "\n")
	e.openStore().Close() // these commands read a database; they do not create one
	for _, args := range [][]string{{"deliveries", "list"}, {"deliveries", "targets"}, {"cursors"}, {"jobs"}} {
		if code, _, stderr := e.run(context.Background(), args...); code != 0 {
			t.Errorf("%v: exit %d, want 0\n%s", args, code, stderr)
		}
	}
	code, _, stderr := e.run(context.Background(), "sync")
	if code != 2 || !strings.Contains(stderr, "source.api_key is empty: set BACKSTOP_TEST_UNSET_KEY") {
		t.Errorf("sync: exit %d, want 2 naming the unset key\n%s", code, stderr)
	}
}

// TestDeliveriesErrorsSayWhatIsWrong: an unknown delivery is named once,
// without the error's package prefix twice, --dead without --target says
// what it needs, and an empty list for a target the configuration does not
// name says so (a typo, most likely).
func TestDeliveriesErrorsSayWhatIsWrong(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 10}})
	e.openStore().Close() // deliveries show reads a database; it does not create one
	for _, args := range [][]string{{"deliveries", "show", "99999"}, {"deliveries", "retry", "99999"}} {
		code, _, stderr := e.run(context.Background(), args...)
		if code != 1 || strings.TrimSpace(stderr) != "backstop: no delivery 99999 (see backstop deliveries list)" {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
	code, _, stderr := e.run(context.Background(), "deliveries", "retry", "--dead")
	if code != 2 || !strings.Contains(stderr, "--dead needs --target") {
		t.Errorf("retry --dead: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = e.run(context.Background(), "deliveries", "purge", "--dead", "--before", "bogus")
	if code != 2 || !strings.Contains(stderr, `--before "bogus"`) || strings.Contains(stderr, "--since") {
		t.Errorf("purge --before bogus: exit %d, stderr %q; want 2 naming --before", code, stderr)
	}
	// A --before in the future (2099 for 2019) purged every dead letter.
	code, _, stderr = e.run(context.Background(), "deliveries", "purge", "--dead", "--before", "2099-01-01")
	if code != 2 || !strings.Contains(stderr, "--before 2099-01-01 is in the future") || !strings.Contains(stderr, "--before 1s") {
		t.Errorf("purge --before 2099-01-01: exit %d, stderr %q; want 2 saying it is in the future", code, stderr)
	}
	code, stdout, stderr := e.run(context.Background(), "deliveries", "purge", "--dead", "--before", "1s")
	if code != 0 || !strings.HasPrefix(stdout, "0 dead letters from before ") {
		t.Errorf("purge --before 1s: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, _ = e.run(context.Background(), "deliveries", "list", "--target", "crmm")
	if code != 0 || strings.TrimSpace(stdout) != `no deliveries match (and the configuration has no target "crmm")` {
		t.Errorf("list --target crmm: exit %d, stdout %q", code, stdout)
	}
}

func TestMissingConfigIsAUsageError(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 10}})
	code, _, stderr := e.run(context.Background(), "--config", e.dir+"/nope.yaml", "sync")
	if code != 2 || !strings.Contains(stderr, "nope.yaml") {
		t.Fatalf("exit %d, want 2 naming the file\n%s", code, stderr)
	}
}

func TestBadUsageExits2(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 10}})
	for _, args := range [][]string{{"sync", "invoices"}, {"backfill", "--frobnicate"}, {"cursors", "reset"}, {"frobnicate"}, {"--log-level", "loud", "sync"}} {
		code, _, stderr := e.run(context.Background(), args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2\n%s", args, code, stderr)
		}
	}
}

// A mistyped subcommand is bad usage under every command that groups
// others, and so is an unknown help topic: "deliveries retyr 42" printed
// the group's help and exited 0, so a script took it for done.
func TestUnknownSubcommandExits2(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	var groups [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		if c.HasSubCommands() {
			groups = append(groups, path)
		}
		for _, sub := range c.Commands() {
			if sub.Name() != "help" && sub.Name() != "completion" {
				walk(sub, append(slices.Clone(path), sub.Name()))
			}
		}
	}
	walk((&Main{LookupEnv: func(string) (string, bool) { return "", false }}).rootCommand(), nil)
	if len(groups) < 4 { // the root, cursors, deliveries, deliveries targets
		t.Fatalf("command groups %v", groups)
	}
	for _, g := range groups {
		args := append(slices.Clone(g), "retyr")
		code, stdout, stderr := e.run(context.Background(), args...)
		if code != 2 || !strings.Contains(stderr, `unknown command "retyr"`) || stdout != "" {
			t.Errorf("%v: exit %d, stderr %q, stdout %d bytes; want 2 and unknown command", args, code, stderr, len(stdout))
		}
	}
	if code, _, stderr := e.run(context.Background(), "help", "nope"); code != 2 || !strings.Contains(stderr, `unknown help topic "nope"`) {
		t.Errorf("help nope: exit %d, %q; want 2", code, stderr)
	}
	if code, stdout, _ := e.run(context.Background(), "help", "deliveries", "retry"); code != 0 || !strings.Contains(stdout, "retry puts a delivery back") {
		t.Errorf("help deliveries retry: exit %d\n%s", code, stdout)
	}
	if code, stdout, _ := e.run(context.Background(), "deliveries"); code != 0 || !strings.Contains(stdout, "Available Commands") {
		t.Errorf("deliveries alone: exit %d, want its help\n%s", code, stdout)
	}
}

func TestCursorsListAndReset(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 60}})
	if code, _, stderr := e.run(context.Background(), "backfill", "payments"); code != 0 {
		t.Fatalf("backfill exit %d\n%s", code, stderr)
	}
	code, stdout, _ := e.run(context.Background(), "cursors", "--json")
	if code != 0 {
		t.Fatal("cursors failed")
	}
	var rows []struct {
		Resource, Kind string
		Done           bool
		PositionID     string `json:"position_id"`
	}
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	last := e.sim.Objects("payments")[59].ID
	kinds := map[string]bool{}
	for _, r := range rows {
		if r.Resource != "payments" || r.PositionID != last {
			t.Errorf("cursor %+v: want payments at %s", r, last)
		}
		kinds[r.Kind] = true
		if r.Kind == "backfill" && !r.Done {
			t.Error("finished backfill checkpoint not marked done")
		}
	}
	if !kinds["sync"] || !kinds["backfill"] {
		t.Errorf("want the backfill checkpoint and the sync cursor it handed over, got %+v", rows)
	}
	if code, _, _ := e.run(context.Background(), "cursors", "reset", "payments"); code != 0 {
		t.Fatal("reset failed")
	}
	_, stdout, _ = e.run(context.Background(), "cursors", "--json")
	if strings.TrimSpace(stdout) != "[]" {
		t.Errorf("cursors after reset: %s", stdout)
	}
}

func TestVersionAndHelp(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	code, stdout, _ := e.run(context.Background(), "version")
	if code != 0 || !strings.HasPrefix(stdout, "backstop ") {
		t.Errorf("version: exit %d, %q", code, stdout)
	}
	code, stdout, _ = e.run(context.Background(), "backfill", "--help")
	if code != 0 || !strings.Contains(stdout, "--restart") || !strings.Contains(stdout, "checkpoint") {
		t.Errorf("backfill --help: exit %d\n%s", code, stdout)
	}
}

func TestAPIKeyNeverLogged(t *testing.T) {
	const key = "sk_live_Zq81secretKEY"
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 300, APIKey: key, Limit: 20, Window: time.Second, RetryAfter: "mixed"}, perMinute: 6000, window: "1s"})
	for _, args := range [][]string{
		{"--log-level", "debug", "backfill"},
		{"--log-level", "debug", "--log-format", "json", "sync", "--json"},
	} {
		code, stdout, stderr := e.run(context.Background(), args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, stderr)
		}
		if strings.Contains(stdout+stderr, key) || strings.Contains(stdout+stderr, "Zq81secret") {
			t.Fatalf("%v: the API key appears in the output", args)
		}
	}
	code, _, stderr := e.runKey(context.Background(), key+"x", "--log-level", "debug", "sync", "chats")
	if code != 1 || strings.Contains(stderr, "Zq81secret") {
		t.Fatalf("wrong key: exit %d, and the output must not echo it:\n%s", code, stderr)
	}
}

// TestRefusedKeyStopsEveryResource: a sync of every resource with a key the
// platform refuses used to send a 401 for each resource in turn (the
// governor lets one request through until the first answer), the last
// one after seconds of "waiting for its first page". The first 401 now
// stops the others at once: at most one request more reaches the
// platform, every resource says why it stopped, and none of them is
// offered for resuming (nothing was interrupted).
func TestRefusedKeyStopsEveryResource(t *testing.T) {
	// 20 a minute: the governor spaces the resources' first requests
	// seconds apart, as the default tariff does.
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 20}, perMinute: 20})
	code, stdout, stderr := e.runKey(context.Background(), e.sim.APIKey()+"x", "sync", "--json")
	if code != exitFailure {
		t.Fatalf("sync with a refused key: exit %d, want 1\n%s%s", code, stdout, stderr)
	}
	var out struct {
		Resources []struct {
			Resource string `json:"resource"`
			Result   string `json:"result"`
			Error    string `json:"error"`
			Requests int    `json:"requests"`
		} `json:"resources"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("sync --json: %v\n%s", err, stdout)
	}
	rows := out.Resources
	if len(rows) != len(backstop.Resources) {
		t.Fatalf("sync --json gave %d resources, want %d:\n%s", len(rows), len(backstop.Resources), stdout)
	}
	requests := 0
	for _, r := range rows {
		requests += r.Requests
		if !strings.Contains(r.Error, "API key was refused") {
			t.Errorf("%s: result %q error %q, want it to say the key was refused", r.Resource, r.Result, r.Error)
		}
	}
	if requests < 1 || requests > 2 {
		t.Errorf("the platform got %d requests, want the first 401 (and at most one sent beside it)\n%s", requests, stdout)
	}
	if strings.Contains(stderr, "to resume") {
		t.Errorf("a run stopped by a refused key is offered for resuming:\n%s", stderr)
	}
}

// A reconcile with a key the platform refuses stored and printed the
// resources the first 401 stopped as "interrupted" with "context
// canceled", which means Ctrl-C or SIGTERM: each is failed now, saying
// why, as a sync's are, in the output and in the stored reports.
func TestRefusedKeyFailsEveryReconcile(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 20}, perMinute: 20})
	code, stdout, stderr := e.runKey(context.Background(), e.sim.APIKey()+"x", "reconcile", "--json")
	if code != exitFailure {
		t.Fatalf("reconcile with a refused key: exit %d, want 1\n%s%s", code, stdout, stderr)
	}
	var rows []reconcileRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil || len(rows) != len(backstop.Resources) {
		t.Fatalf("reconcile --json: %v\n%s", err, stdout)
	}
	for _, r := range rows {
		if r.Result != "failed" {
			t.Errorf("%s: result %q, want failed", r.Resource, r.Result)
		}
	}
	if strings.Contains(stdout+stderr, "context canceled") || strings.Contains(stderr, "interrupted") {
		t.Errorf("a reconcile stopped by a refused key says it was interrupted:\n%s%s", stdout, stderr)
	}
	db := e.openStore()
	defer db.Close()
	// Those stopped before they began store no report.
	runs, err := db.ReconcileRuns(context.Background(), 0)
	if err != nil || len(runs) == 0 {
		t.Fatalf("stored reports: %+v %v", runs, err)
	}
	for _, run := range runs {
		if run.Status != "failed" || strings.Contains(run.Error, "context canceled") {
			t.Errorf("%s's stored report: %s %q, want failed saying why", run.Resource, run.Status, run.Error)
		}
	}
}

// A sync whose resources fail for different reasons printed only the
// first one's on stderr; each is printed now, one line each.
func TestSyncPrintsEveryResourcesFailure(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 10}, wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for _, r2 := range []string{"chats", "messages"} {
				if strings.Contains(r.URL.Path, r2) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusForbidden)
					fmt.Fprintf(w, `{"error":{"code":"forbidden","message":"no access to %s"}}`, r2)
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	}})
	code, _, stderr := e.run(context.Background(), "sync")
	if code != exitFailure {
		t.Fatalf("sync with two resources refused: exit %d, want 1\n%s", code, stderr)
	}
	for _, want := range []string{"no access to chats", "no access to messages"} {
		if n := strings.Count(stderr, "backstop: "); !strings.Contains(stderr, want) || n < 2 {
			t.Errorf("stderr does not give %q on a line of its own:\n%s", want, stderr)
		}
	}
}
