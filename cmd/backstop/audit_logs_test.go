package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// duplicateKey returns the first key that a JSON object (or one nested in
// it) holds twice, or "" when none does.
func duplicateKey(line []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	var walk func() (string, error)
	walk = func() (string, error) {
		tok, err := dec.Token()
		if err != nil {
			return "", err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return "", err
				}
				key, _ := k.(string)
				if seen[key] {
					return key, nil
				}
				seen[key] = true
				if dup, err := walk(); dup != "" || err != nil {
					return dup, err
				}
			}
			_, err = dec.Token() // '}'
			return "", err
		case json.Delim('['):
			for dec.More() {
				if dup, err := walk(); dup != "" || err != nil {
					return dup, err
				}
			}
			_, err = dec.Token() // ']'
			return "", err
		}
		return "", nil
	}
	return walk()
}

// logLines collects a process's stderr lines.
type logLines struct {
	mu    stdsync.Mutex
	lines []string
}

func (l *logLines) collect(ch <-chan string) (done <-chan struct{}) {
	d := make(chan struct{})
	go func() {
		defer close(d)
		for line := range ch {
			l.mu.Lock()
			l.lines = append(l.lines, line)
			l.mu.Unlock()
		}
	}()
	return d
}

// waitFor waits for a line holding substr, or fails with the lines after
// the deadline.
func (l *logLines) waitFor(t *testing.T, d time.Duration, substr string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for l.count(substr) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no %q line within %s:\n%s", substr, d, strings.Join(l.all(), "\n"))
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

func (l *logLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func (l *logLines) count(substr string) int {
	n := 0
	for _, line := range l.all() {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

// Serve's JSON log lines each hold a key once: the target governors' lines
// (a 429's pause) held "component" twice, the caller's target-governor and
// the governor's own, which JSON tools read as one or the other. A target
// that fails logs one warning, not a line per attempt, and a line once it
// delivers again.
func TestAuditServeJSONLogsHoldEachKeyOnce(t *testing.T) {
	var mu stdsync.Mutex
	hits := 0
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		hits++
		n := hits
		mu.Unlock()
		if n <= 2 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer target.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeDeliveryConfig(addr, target.URL)
	cmd, ch := e.startBinaryWith(append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret), "--log-format", "json", "serve")
	var logs logLines
	done := logs.collect(ch)
	logs.waitFor(t, 30*time.Second, `"msg":"serving"`)
	proxyPost(t, addr, "evt_logs_1", `{"hello":"world"}`)
	logs.waitFor(t, 60*time.Second, `"msg":"target delivers again","component":"delivery","target":"recorder"`)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not end within 30 s of SIGTERM")
	}
	cmd.Wait()

	all := logs.all()
	text := strings.Join(all, "\n")
	if logs.count("rate limited: key paused") == 0 {
		t.Fatalf("the target governor logged no 429 pause:\n%s", text)
	}
	for _, line := range all {
		dup, err := duplicateKey([]byte(line))
		if err != nil && !errors.Is(err, io.EOF) {
			t.Errorf("not a JSON line (%v): %s", err, line)
			continue
		}
		if dup != "" {
			t.Errorf("key %q twice in: %s", dup, line)
		}
	}
	if n := logs.count("will retry"); n != 0 {
		t.Errorf("%d will-retry lines at the default level, want 0:\n%s", n, text)
	}
	if n := logs.count(`"msg":"target failing; further failures at debug until it delivers again","component":"delivery","target":"recorder"`); n != 1 {
		t.Errorf("%d warnings that the target fails, want 1:\n%s", n, text)
	}
	if n := logs.count(`"msg":"target delivers again","component":"delivery","target":"recorder"`); n != 1 {
		t.Errorf("%d lines saying the target delivers again, want 1:\n%s", n, text)
	}
	for _, line := range all {
		if strings.Contains(line, "rate limited: key paused") && !strings.Contains(line, `"component":"target-governor"`) {
			t.Errorf("a target governor's line does not name its component target-governor: %s", line)
		}
		var pause struct {
			Msg       string `json:"msg"`
			PausedFor any    `json:"paused_for"`
		}
		if json.Unmarshal([]byte(line), &pause) == nil && pause.Msg == "rate limited: key paused" {
			if s, ok := pause.PausedFor.(string); !ok {
				t.Errorf("paused_for is %#v, want a duration such as 1.2s: %s", pause.PausedFor, line)
			} else if _, err := time.ParseDuration(s); err != nil {
				t.Errorf("paused_for %q: %v", s, err)
			}
		}
	}
}

// A cron-run maintenance job prunes the dashboard's quota and intake
// samples older than 14 days, and expired revoked sessions: only serve's
// dashboard did, so without dashboard.token they grew forever. Its JSON
// "job finished" line gives the duration as a string, each key once.
func TestAuditMaintenanceRunPrunesSamplesAndLogsADuration(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.withJobs()
	db := e.openStore()
	ctx := t.Context()
	old := time.Now().Add(-15 * 24 * time.Hour)
	if err := db.SaveQuotaSample(ctx, store.QuotaSample{KeyID: "k1", At: old, Limit: 100, Remaining: 10}); err != nil {
		t.Fatal(err)
	}
	if err := db.SaveIntakeSample(ctx, store.IntakeSample{At: old, Duplicates: 1}); err != nil {
		t.Fatal(err)
	}
	if err := db.RevokeSession(ctx, "signed-out", time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	db.Close()

	cmd, ch := e.startBinary("--log-format", "json", "run", "prune")
	var logs logLines
	done := logs.collect(ch)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("run prune did not end within 60 s")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("run prune: %v\n%s", err, strings.Join(logs.all(), "\n"))
	}
	db = e.openStore()
	defer db.Close()
	if qs, err := db.QuotaSamples(ctx, time.Time{}); err != nil || len(qs) != 0 {
		t.Errorf("quota samples left after maintenance: %d (%v), want 0", len(qs), err)
	}
	if is, err := db.IntakeSamples(ctx, time.Time{}); err != nil || len(is) != 0 {
		t.Errorf("intake samples left after maintenance: %d (%v), want 0", len(is), err)
	}
	if ok, _ := db.SessionRevoked(ctx, "signed-out"); ok {
		t.Error("an expired revoked session was kept")
	}
	finished := 0
	for _, line := range logs.all() {
		if dup, _ := duplicateKey([]byte(line)); dup != "" {
			t.Errorf("key %q twice in: %s", dup, line)
		}
		var l struct {
			Msg      string `json:"msg"`
			Duration any    `json:"duration"`
			Pruned   int    `json:"pruned"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "job finished" {
			continue
		}
		finished++
		if s, ok := l.Duration.(string); !ok {
			t.Errorf("job finished: duration %#v, want a string such as 12ms: %s", l.Duration, line)
		} else if _, err := time.ParseDuration(s); err != nil {
			t.Errorf("job finished: duration %q: %v", s, err)
		}
		if l.Pruned < 3 {
			t.Errorf("job finished: pruned %d, want at least 3 (two samples, a session): %s", l.Pruned, line)
		}
	}
	if finished != 1 {
		t.Errorf("%d job finished lines, want 1:\n%s", finished, strings.Join(logs.all(), "\n"))
	}
}
