package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
)

// runBinary runs the real binary in dir with args and extra environment
// (BACKSTOP_CONFIG cleared), and returns its exit code and both streams.
func runBinary(t *testing.T, dir string, env []string, args ...string) (int, string, string) {
	t.Helper()
	return runBinaryFor(t, 2*time.Minute, dir, env, args...)
}

// runBinaryFor is runBinary killing the process after d (exit code -1).
func runBinaryFor(t *testing.T, d time.Duration, dir string, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "BACKSTOP_CONFIG="), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return code, out.String(), errb.String()
}

// TestBaseURLTheClientCannotUseIsAConfigError: a source.base_url with
// credentials, a query, a fragment or a port out of range used to pass the
// configuration check, and then either failed without naming the file, line
// and key ("source: sources: base URL …") or, for the port, retried a
// connection that could never be made. Each is now a configuration error
// that names them (exit 2), and never repeats a password.
func TestBaseURLTheClientCannotUseIsAConfigError(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ url, want string }{
		{"http://user:s3cret@127.0.0.1:1", "credentials"},
		{"http://127.0.0.1:1/?tenant=a", "a query"},
		{"http://127.0.0.1:1/#top", "a fragment"},
		{"http://127.0.0.1:99999", `want a port number 0..65535, got "99999"`},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			cfg := "source:\n  base_url: \"" + c.url + "\"\n  api_key: k\nstore:\n  path: ./b.db\n"
			writeFile(t, dir, "schedules.yaml", cfg)
			code, _, stderr := runBinary(t, dir, nil, "sync")
			if code != exitUsage {
				t.Fatalf("exit %d, want 2\n%s", code, stderr)
			}
			if !strings.Contains(stderr, "backstop: ./schedules.yaml:2: source.base_url: ") || !strings.Contains(stderr, c.want) {
				t.Errorf("stderr does not name file, line, key and %q:\n%s", c.want, stderr)
			}
			if strings.Contains(stderr, "s3cret") {
				t.Errorf("the error repeats the password:\n%s", stderr)
			}
		})
	}
}

// startSim runs the real binary's sim on a free loopback port with args and
// returns its base URL; the process is killed when the test ends.
func startSim(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"sim", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "BACKSTOP_CONFIG=")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "base_url="); ok {
			go io.Copy(io.Discard, stdout)
			return u
		}
	}
	t.Fatalf("sim printed no base_url (%v)", sc.Err())
	return ""
}

// simPage returns the objects of the first page of resource from the
// simulator at base.
func simPage(t *testing.T, base, resource string) []json.RawMessage {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/public/v1/"+resource+"?cursor_limit=200", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sim_test_key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page struct{ Data []json.RawMessage }
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		t.Fatal(err)
	}
	return page.Data
}

// TestSimZeroMeansNone: "backstop sim --objects 0" used to serve the
// default 1000 objects per resource, and "--big-objects 0" three messages
// over 64 KiB, while its log said objects_per_resource=0. Zero now means
// none, as the flags read.
func TestSimZeroMeansNone(t *testing.T) {
	base := startSim(t, "--objects", "0")
	for _, r := range []string{"contacts", "messages"} {
		if got := simPage(t, base, r); len(got) != 0 {
			t.Errorf("--objects 0: %s has %d objects on its first page, want none", r, len(got))
		}
	}
	base = startSim(t, "--objects", "50", "--big-objects", "0")
	msgs := simPage(t, base, "messages")
	if len(msgs) != 50 {
		t.Fatalf("--objects 50: %d messages, want 50", len(msgs))
	}
	for _, m := range msgs {
		if len(m) > 64<<10 {
			t.Errorf("--big-objects 0: a message of %d bytes", len(m))
		}
	}
}

// TestSimRefusesWindowsItCannotServe: "--window 1500ms" used to be
// rounded up to 2s (and logged as 1.5s), and "--window 0s" to be a 1m
// window (logged as 0s). A window that is not whole seconds, and a
// negative count of objects, are now refused (exit 2), and so is every
// other bad value, with a message naming its flag.
func TestSimRefusesWindowsItCannotServe(t *testing.T) {
	for _, args := range [][]string{
		{"--window", "1500ms"}, {"--window", "0s"}, {"--objects", "-1"}, {"--big-objects", "-2"},
		// More than memory holds: it ran out of memory, with a 179-line trace.
		{"--objects", "99999999999"}, {"--big-objects", "5000000"},
		// Each bad value is refused naming its flag, not an option name
		// of the simulator's ("limit -1", "error rate 2").
		{"--limit", "-1"}, {"--error-rate", "2"}, {"--latency", "-1s"}, {"--mutation-rate", "-3"},
		{"--drop-rate", "1.5"}, {"--duplicate-rate", "-0.1"}, {"--reorder-rate", "7"}, {"--retry-after", "soon"},
		{"--retry-schedule", "1s,-2s"}, {"--webhook-url", "ftp://x", "--webhook-secret", "s"},
	} {
		// The old binary served these: 20 s is ample to refuse them.
		code, _, stderr := runBinaryFor(t, 20*time.Second, t.TempDir(), nil, append([]string{"sim", "--listen", "127.0.0.1:0"}, args...)...)
		if code != exitUsage || !strings.Contains(stderr, args[0]) {
			t.Errorf("sim %v: exit %d, want 2 with a message naming %s:\n%s", args, code, args[0], stderr)
		}
	}
}

// TestDemoRefusesAnExistingStore: "backstop demo --store FILE" run a second
// time on the same file used to add to what the first run had stored, so
// its report counted both runs ("duplicate webhooks suppressed -38",
// "deliveries recorded 40 (delivered 80 …)"), and it would as well have
// written the simulator's objects into a real mirror named by mistake. An
// existing file is now refused (exit 2) and left as it was.
func TestDemoRefusesAnExistingStore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "demo.db")
	args := []string{"demo", "--duration", "1s", "--objects", "50", "--rate", "20", "--store", path}
	code, stdout, stderr := runBinary(t, dir, nil, args...)
	if code != 0 || !strings.Contains(stdout, "mirror matches platform: yes") {
		t.Fatalf("first demo: exit %d\n%s\n%s", code, stdout, stderr)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runBinary(t, dir, nil, args...)
	if code != exitUsage || !strings.Contains(stderr, "--store "+path+": the file exists") {
		t.Fatalf("second demo on the same store: exit %d, want 2 naming --store\n%s\n%s", code, stdout, stderr)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("the refused demo changed the existing database")
	}
}

// TestStorePathItCannotOpenIsAConfigError: a store.path in a directory
// that does not exist used to fail with exit 1 and "open store: open store
// /x/y.db: unable to open database file (14)", naming neither the key nor
// its line; a path with '?' passed the check and failed the same way.
// Both are now configuration errors with file, line and key (exit 2), for
// the commands that call the platform and for those that only read the
// store. So is a path naming a file that is not backstop's store (here
// not SQLite at all), which used to exit 1 like a failure.
func TestStorePathItCannotOpenIsAConfigError(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "notes.db", "meeting notes, not a database: ..............................................................\n")
	cases := []struct{ path, want string }{
		{filepath.Join(dir, "missing", "b.db"), "directory " + filepath.Join(dir, "missing") + " does not exist"},
		{"./b?mode=ro.db", "has '?' or '#'"},
		{"./notes.db", "not a backstop store"},
	}
	for _, c := range cases {
		cfg := "source:\n  base_url: http://127.0.0.1:1\n  api_key: k\nstore:\n  path: \"" + c.path + "\"\n"
		writeFile(t, dir, "schedules.yaml", cfg)
		for _, command := range []string{"sync", "cursors"} {
			code, _, stderr := runBinaryFor(t, 20*time.Second, dir, nil, command)
			want := "backstop: ./schedules.yaml:5: store.path: "
			if code != exitUsage || !strings.Contains(stderr, want) || !strings.Contains(stderr, c.want) {
				t.Errorf("%s with store.path %s: exit %d, want 2 and %q…%q:\n%s", command, c.path, code, want, c.want, stderr)
			}
		}
	}
}

// TestFeedNotFoundPointsAtBaseURL: a source.base_url that already ends in
// /public/v1 (or has any wrong path) made sync fail with only "not found
// (HTTP 404 not_found): no such endpoint: /public/v1/public/v1/contacts";
// it now says which key to check.
func TestFeedNotFoundPointsAtBaseURL(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 10}})
	e.writeConfig("source:\n  base_url: " + e.srv.URL + "/public/v1\n  api_key: ${BOTIX_API_KEY}\nstore:\n  path: " + e.db + "\n")
	code, _, stderr := e.run(context.Background(), "sync", "contacts")
	if code != exitFailure || !strings.Contains(stderr, "check source.base_url") {
		t.Errorf("exit %d, want 1 with a hint to check source.base_url:\n%s", code, stderr)
	}
}

// TestServeWarnsOfTargetValuesMissingAVariable: a target header such as
// "Authorization: Bearer ${CRM_TOKEN}", or a url ending in ${SLACK_PATH},
// with its variable unset used to start serve without a word, and every
// delivery then went out without the credential (a 401, dead-lettered at
// once) or to the wrong address. serve now warns of each at start, naming
// the file, line, key and variable, as it does for an unsigned target.
func TestServeWarnsOfTargetValuesMissingAVariable(t *testing.T) {
	dir := t.TempDir()
	cfg := `source:
  base_url: http://127.0.0.1:1
  api_key: k
store:
  path: ./b.db
intake:
  listen: 127.0.0.1:0
  secret: s
targets:
  - name: crm
    url: https://hooks.example.com/services/${AUDIT_SLACK_PATH}
    headers:
      Authorization: "Bearer ${AUDIT_CRM_TOKEN}"
      X-Static: plain
`
	writeFile(t, dir, "schedules.yaml", cfg)
	cmd := exec.Command(binPath, "serve")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "BACKSTOP_CONFIG=", "AUDIT_SLACK_PATH=", "AUDIT_CRM_TOKEN=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var warnings []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && !strings.Contains(sc.Text(), "msg=serving") {
		if strings.Contains(sc.Text(), "level=WARN") {
			warnings = append(warnings, sc.Text())
		}
	}
	want := []string{
		"targets[0].url uses AUDIT_SLACK_PATH, unset or empty",
		"targets[0].headers.Authorization uses AUDIT_CRM_TOKEN, unset or empty",
	}
	all := strings.Join(warnings, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("serve did not warn %q; its warnings:\n%s", w, all)
		}
	}
	if strings.Contains(all, "X-Static") {
		t.Errorf("serve warned of a header without variables:\n%s", all)
	}
}

// TestVersionFlag: "backstop --version", what people try first, used to
// fail with "unknown flag: --version" (exit 2); it now prints what
// "backstop version" prints.
func TestVersionFlag(t *testing.T) {
	dir := t.TempDir()
	_, want, _ := runBinary(t, dir, nil, "version")
	code, got, stderr := runBinary(t, dir, nil, "--version")
	if code != 0 || got != want || !strings.HasPrefix(got, "backstop ") {
		t.Errorf("--version: exit %d, stdout %q, want 0 and %q\n%s", code, got, want, stderr)
	}
}

// TestReserveDefaultAboveTariffSaysItIsTheDefault: a small tariff
// ("per_minute: 3") without a reserve used to be refused with
// "source.rate_limit.reserve: want 0..2 (less than per_minute), got 5",
// a 5 the file does not hold; the error now says it is the default.
func TestReserveDefaultAboveTariffSaysItIsTheDefault(t *testing.T) {
	wantConfigError(t,
		"source:\n  base_url: http://127.0.0.1:1\n  api_key: k\n  rate_limit: {per_minute: 3}\n",
		"./schedules.yaml:4: source.rate_limit.reserve: want 0..2 (less than per_minute), got 5 (the default: write a smaller reserve beside per_minute)",
		"sync")
}

// TestCronSundaySevenSaysUseZero: "0 3 * * 7", Sunday in system cron, is
// refused by the scheduler's syntax; the error used to say only "7 is out
// of range 0-6" and now says how to write Sunday.
func TestCronSundaySevenSaysUseZero(t *testing.T) {
	wantConfigError(t, "jobs:\n  - {name: weekly, kind: maintenance, cron: \"0 3 * * 7\"}\n", `./schedules.yaml:2: jobs[0].cron: day-of-week field "7": 7 is out of range 0-6 (Sunday is 0 or SUN)`, "jobs")
}

// TestTargetRateLimitBothPerSecondAndPerMinuteRefused: a target with
// "rate_limit: {per_second: 5, per_minute: 100}" used to be paced at 5 per
// second, its per_minute silently ignored; setting both is now a
// configuration error naming the line and key (exit 2).
func TestTargetRateLimitBothPerSecondAndPerMinuteRefused(t *testing.T) {
	wantConfigError(t,
		"targets:\n  - name: crm\n    url: https://crm.example.com/hooks\n    rate_limit: {per_second: 5, per_minute: 100}\n",
		"./schedules.yaml:4: targets[0].rate_limit.per_minute: set either per_second or per_minute, not both",
		"deliveries", "targets")
}

// TestTypeErrorsDoNotShowSecretVariables: a secret's variable written by
// mistake where a duration or a section goes ("timeout:
// ${BOTIX_WEBHOOK_SECRET}") used to print the secret in the error, on the
// terminal and in CI logs and cron mail; a variable named like a
// credential is now named, its value not shown. Other values are still
// quoted, so a typo stays easy to see.
func TestTypeErrorsDoNotShowSecretVariables(t *testing.T) {
	dir := t.TempDir()
	cfg := "source:\n  base_url: http://127.0.0.1:1\n  api_key: k\n  timeout: ${BOTIX_WEBHOOK_SECRET}\n"
	writeFile(t, dir, "schedules.yaml", cfg)
	code, _, stderr := runBinary(t, dir, []string{"BOTIX_WEBHOOK_SECRET=s3cr3t-value"}, "sync")
	if code != exitUsage || !strings.Contains(stderr, "./schedules.yaml:4: source.timeout: want a duration") ||
		!strings.Contains(stderr, "${BOTIX_WEBHOOK_SECRET}") {
		t.Errorf("exit %d, want 2 naming the line, key and variable:\n%s", code, stderr)
	}
	if strings.Contains(stderr, "s3cr3t-value") {
		t.Errorf("the error shows the secret:\n%s", stderr)
	}
	cfg = "source:\n  base_url: http://127.0.0.1:1\n  api_key: k\n  page_size: ${AUDIT_PS}\n"
	writeFile(t, dir, "schedules.yaml", cfg)
	_, _, stderr = runBinary(t, dir, []string{"AUDIT_PS=abc"}, "sync")
	if !strings.Contains(stderr, `got "abc" (from ${AUDIT_PS})`) {
		t.Errorf("a value that is no secret is not quoted:\n%s", stderr)
	}
}

// wantConfigError runs the binary with cfg as its schedules.yaml and args,
// and fails t unless it exits 2 with want in its stderr.
func wantConfigError(t *testing.T, cfg, want string, args ...string) {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, dir, "schedules.yaml", cfg)
	if code, _, stderr := runBinary(t, dir, nil, args...); code != exitUsage || !strings.Contains(stderr, want) {
		t.Errorf("exit %d, want 2 and %q:\n%s", code, want, stderr)
	}
}
