package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	_ "modernc.org/sqlite"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// auditReconcileJSON runs `reconcile ARGS --json` and returns its one report.
func (e *env) auditReconcileJSON(args ...string) auditReconcile {
	e.t.Helper()
	code, stdout, stderr := e.run(context.Background(), append(append([]string{"reconcile"}, args...), "--json")...)
	if code != exitOK {
		e.t.Fatalf("reconcile %v: exit %d\n%s", args, code, stderr)
	}
	var rows []auditReconcile
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil || len(rows) != 1 {
		e.t.Fatalf("reconcile %v: %v\n%s", args, err, stdout)
	}
	return rows[0]
}

// auditReconcile is one report of `reconcile --json`.
type auditReconcile struct {
	Resource  string `json:"resource"`
	Since     string `json:"since"`
	Scanned   int    `json:"scanned"`
	Missing   int    `json:"missing"`
	Behind    int    `json:"behind"`
	Reemitted int    `json:"reemitted"`
	Orphans   *int   `json:"orphans"`
	Result    string `json:"result"`
}

// An hourly reconcile alongside a narrower one by hand: the hourly run
// two hours ago, then a payment's webhook lost 90 minutes ago, then
// someone runs `reconcile payments --since 30m`. That run read only the
// last 30 minutes, so the next default run must still start from the
// hourly run's start (minus the lookback) and find the payment; it used
// to start 10 minutes before the narrow run's start and never look at it.
func TestReconcileDefaultWindowIsNotNarrowedByASinceRun(t *testing.T) {
	var clock atomic.Int64
	now := time.Now()
	clock.Store(now.Add(-3 * time.Hour).UnixNano())
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 41, Objects: 60,
		Now: func() time.Time { return time.Unix(0, clock.Load()) }}})
	ctx := context.Background()
	if code, _, stderr := e.run(ctx, "backfill", "payments"); code != exitOK {
		t.Fatalf("backfill: exit %d\n%s", code, stderr)
	}
	if rep := e.auditReconcileJSON("payments"); rep.Result != "ok" || rep.Missing+rep.Behind != 0 {
		t.Fatalf("first reconcile: %+v", rep)
	}
	// That was the hourly run of two hours ago.
	raw, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ago := func(d time.Duration) string { return backstop.CanonicalTime(now.Add(-d)) }
	if _, err := raw.Exec(`UPDATE reconcile_runs SET started_at = ?, window_since = ?`,
		ago(2*time.Hour), ago(26*time.Hour)); err != nil {
		t.Fatal(err)
	}
	// A payment changed 90 minutes ago; its webhook was lost.
	clock.Store(now.Add(-90 * time.Minute).UnixNano())
	var changed backstop.Object
	for _, o := range e.sim.Objects(backstop.Payments) {
		if c, ok := e.sim.Update(backstop.Payments, o.ID); ok {
			changed = c
			break
		}
	}
	if changed.ID == "" {
		t.Fatal("no payment could change")
	}
	clock.Store(now.UnixNano())

	narrow := e.auditReconcileJSON("payments", "--since", now.Add(-30*time.Minute).UTC().Format(time.RFC3339))
	if narrow.Result != "ok" || narrow.Behind != 0 {
		t.Fatalf("reconcile --since 30m: %+v, want ok with nothing behind (the change is older)", narrow)
	}
	next := e.auditReconcileJSON("payments")
	if next.Behind != 1 || next.Reemitted != 1 {
		t.Errorf("next default reconcile (since %s): %+v; want the payment %s changed 90 minutes ago behind and re-emitted",
			next.Since, next, changed.ID)
	}
	e.assertMirrorEqualsSim(backstop.Payments)
	// The gap is closed: the run after that starts from the last one.
	if again := e.auditReconcileJSON("payments"); again.Missing+again.Behind != 0 {
		t.Errorf("reconcile after that: %+v, want nothing to do", again)
	}
}

// A chat's webhook comes truncated (its object was too large) as
// chat.opened, but by the time serve fetches the chat it is closed, and the
// platform's chat.closed webhook for that version follows. The completed
// event holds that version, so the chat.closed webhook is a duplicate: the
// completed event must reach a target subscribed to chat.closed. It used
// to be queued as chat.opened with the closed chat's data, and the target
// never heard that the chat was closed.
func TestTruncatedEventCompletedWithALaterStateReachesThatStatesTargets(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 12, Objects: 40}})
	rec := newRecorder()
	target := httptest.NewServer(rec)
	defer target.Close()
	e.writeServeConfig(addr, fmt.Sprintf(`targets:
  - {name: closures, url: %q, events: ["chat.closed"], allow_private: true, retry_schedule: [100ms]}
`, target.URL))
	var chat backstop.Object
	for _, o := range e.sim.Objects(backstop.Chats) {
		if backstop.EventTypeFor(backstop.Chats, o.Data, false) == "chat.opened" {
			chat = o
			break
		}
	}
	if chat.ID == "" {
		t.Fatal("no opened chat in the sim")
	}
	closed, ok := e.sim.Update(backstop.Chats, chat.ID)
	if !ok || backstop.EventTypeFor(backstop.Chats, closed.Data, false) != "chat.closed" {
		t.Fatalf("update of %s: %s", chat.ID, closed.Data)
	}
	serveInProcess(t, e, addr)
	url := "http://" + addr + "/webhooks/botix"
	at := time.Now().UTC().Format(time.RFC3339Nano)
	opened := fmt.Appendf(nil, `{"event_id":"evt_opened","event":"chat.opened","created_at":%q,"truncated":true,"data":{"id":%q}}`, at, chat.ID)
	if code, answer := postSigned(t, url, webhookSecret, opened); code != http.StatusOK {
		t.Fatalf("truncated chat.opened: %d %s", code, answer)
	}
	db := e.openStore()
	defer db.Close()
	waitFor(t, 30*time.Second, func() bool {
		pe, ok, err := db.ProcessedEvent(context.Background(), "evt_opened")
		return err == nil && ok && !pe.Truncated
	})
	closing := fmt.Appendf(nil, `{"event_id":"evt_closed","event":"chat.closed","created_at":%q,"data":%s}`, at, closed.Data)
	if code, answer := postSigned(t, url, webhookSecret, closing); code != http.StatusOK || !strings.Contains(string(answer), "duplicate") {
		t.Fatalf("chat.closed for the version already completed: %d %s, want 200 duplicate", code, answer)
	}
	rows, err := db.OutboxRows(context.Background(), "closures")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].EventID != "evt_opened" || rows[0].EventType != "chat.closed" {
		t.Fatalf("closures' queue: %+v, want evt_opened as chat.closed", rows)
	}
	waitFor(t, 30*time.Second, func() bool { n, _ := rec.counts(); return n > 0 })
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var env struct {
		Event string          `json:"event"`
		Data  json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal([]byte(rec.bodies["evt_opened"]), &env); err != nil || env.Event != "chat.closed" || string(env.Data) != string(closed.Data) {
		t.Errorf("closures got %v (%v), want evt_opened as chat.closed with the closed chat", rec.bodies, err)
	}
}

// A --full reconcile that fails before the end of the feed never counted
// its orphans: its report says so with "-" rather than a count of 0, which
// read as "no orphans".
func TestFailedFullReconcileShowsNoOrphanCount(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 13, Objects: 60}, pageSize: 20,
		wrap: func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("cursor") != "" {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusUnauthorized)
					w.Write([]byte(`{"error":{"code":"unauthorized","message":"key revoked"}}`))
					return
				}
				h.ServeHTTP(w, r)
			})
		}})
	code, stdout, stderr := e.run(context.Background(), "reconcile", "payments", "--full")
	if code != exitFailure {
		t.Fatalf("reconcile --full with the key refused on page 2: exit %d, want %d\n%s\n%s", code, exitFailure, stdout, stderr)
	}
	fields := strings.Fields(strings.Split(strings.TrimSpace(stdout), "\n")[1])
	// RESOURCE SINCE SCANNED MISSING BEHIND RE-EMITTED SUPPRESSED ORPHANS ...
	if len(fields) < 8 || fields[0] != "payments" || fields[7] != "-" || fields[len(fields)-1] != "failed" {
		t.Errorf("report line %q: want the orphans column \"-\" and the result failed\n%s", fields, stdout)
	}
	// --json says the same with null, as it does for a run that is not
	// --full; a full run that ends counts them, 0 included.
	_, stdout, stderr = e.run(context.Background(), "reconcile", "payments", "--full", "--json")
	var reports []auditReconcile
	if err := json.Unmarshal([]byte(stdout), &reports); err != nil || len(reports) != 1 || reports[0].Orphans != nil {
		t.Errorf("reconcile --full --json that failed: orphans %v (%v), want null\n%s\n%s", orphansOf(reports), err, stdout, stderr)
	}
	_, stdout, stderr = e.run(context.Background(), "reconcile", "payments", "--since", "1h", "--json")
	if err := json.Unmarshal([]byte(stdout), &reports); err != nil || len(reports) != 1 || reports[0].Orphans != nil {
		t.Errorf("reconcile --since 1h --json: orphans %v (%v), want null\n%s\n%s", orphansOf(reports), err, stdout, stderr)
	}
}

// orphansOf shows the orphan counts of reports, nil as "null".
func orphansOf(reports []auditReconcile) []string {
	out := make([]string, len(reports))
	for i, r := range reports {
		out[i] = "null"
		if r.Orphans != nil {
			out[i] = fmt.Sprint(*r.Orphans)
		}
	}
	return out
}

// Webhooks the store cannot hold are malformed: 400, nothing stored. A
// data.updated_at of the zero time (0001-01-01T00:00:00Z), which the emit
// path took for an event without a version, and data nested deeper than
// SQLite's JSON functions read (1000 levels) used to fail their commit: each
// was answered 503 "retry later" (retried by the platform for a day),
// counted as a commit error and logged as one, and failed the group commit
// of every webhook batched with it.
func TestWebhooksTheStoreCannotHoldAreMalformedNotStoreErrors(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "z.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const secret = "poison-secret"
	verifier, err := intake.NewVerifier(intake.SchemeBotix, intake.SchemeOptions{Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	stack := startIntake(ctx, db, nil, verifier, intakeOptions{}, slog.New(slog.DiscardHandler), reg)
	defer stack.stop(context.Background())
	srv := httptest.NewServer(stack.handler)
	defer srv.Close()

	deep := strings.Repeat("[", 1200) + strings.Repeat("]", 1200)
	for _, c := range []struct{ name, data, want string }{
		{"zero updated_at", `{"id":"pay_zero","updated_at":"0001-01-01T00:00:00Z","status":"succeeded"}`, "updated_at"},
		{"data 1201 levels deep", `{"id":"pay_deep","updated_at":"2026-11-30T10:00:00Z","status":"succeeded","meta":` + deep + `}`, "levels deep"},
	} {
		body := []byte(`{"event_id":"evt_poison","event":"payment.succeeded","data":` + c.data + `}`)
		code, answer := postSigned(t, srv.URL, secret, body)
		var got struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(answer, &got); err != nil || code != http.StatusBadRequest || got.Error.Code != "malformed_event" ||
			!strings.Contains(got.Error.Message, c.want) {
			t.Errorf("%s: %d %s, want 400 malformed_event saying %q", c.name, code, answer, c.want)
		}
	}
	if n, err := db.CountProcessed(ctx); err != nil || n != 0 {
		t.Errorf("%d events stored (err %v), want none", n, err)
	}
	if errs := testutil.ToFloat64(stack.metrics.CommitErrors); errs != 0 {
		t.Errorf("backstop_emit_commit_errors_total = %v, want 0: the store is fine", errs)
	}
	// Data as deep as allowed is stored, mirrored and queued.
	ok := `{"id":"pay_ok","updated_at":"2026-11-30T10:00:00Z","status":"succeeded","meta":` +
		strings.Repeat("[", intake.MaxDataDepth-1) + strings.Repeat("]", intake.MaxDataDepth-1) + `}`
	body := []byte(`{"event_id":"evt_ok","event":"payment.succeeded","data":` + ok + `}`)
	if code, answer := postSigned(t, srv.URL, secret, body); code != http.StatusOK || !strings.Contains(string(answer), "accepted") {
		t.Errorf("data %d levels deep: %d %s, want 200 accepted", intake.MaxDataDepth, code, answer)
	}
}
