package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/locktest"
	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/sources/sim"
)

// opsServe starts serve on a fresh serve environment (no jobs) and waits
// until it listens; it returns the environment, the process and its
// address.
func opsServe(t *testing.T) (*env, *fleetProc, string) {
	t.Helper()
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 5}})
	p := startProc(t, "serve", e.config, e.sim.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	p.waitCount("msg=serving", 1, 30*time.Second)
	return e, p, addr
}

// getStatus answers GET url's status code, or fails the test.
func getStatus(t *testing.T, url string) int {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	res.Body.Close()
	return res.StatusCode
}

// SIGHUP (systemctl reload, a terminal closing) used to kill serve at once,
// Go's default, without draining or stopping its jobs; serve does not
// reload its configuration, so it now says so and goes on serving, and
// SIGTERM still stops it cleanly with exit 0.
func TestOpsServeSIGHUPIsLoggedNotFatal(t *testing.T) {
	_, p, addr := opsServe(t)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitCount("SIGHUP ignored: serve does not reload its configuration", 1, 15*time.Second)
	if got := getStatus(t, "http://"+addr+"/healthz"); got != http.StatusOK {
		t.Fatalf("/healthz after SIGHUP: %d, want 200", got)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(45 * time.Second); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM, want 0:\n%s", code, p.output())
	}
	if p.count("stopped cleanly") != 1 {
		t.Fatalf("no clean stop:\n%s", p.output())
	}
}

// A second serve started by mistake on the same store without
// governor.redis used to start silently and run every scheduled job a
// second time (each process with its own API budget); it now exits 1 at
// once, before opening the store, with a message saying why and what to
// do, the first one serves on, and once the first is SIGKILLed a new serve
// starts on the store.
func TestOpsSecondServeOnOneStoreWithoutRedisIsRefused(t *testing.T) {
	e, first, addr := opsServe(t)
	data, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	other := freeAddr(t)
	second := writeFile(t, e.dir, "second.yaml", strings.Replace(string(data), addr, other, 1))
	env := []string{"BOTIX_API_KEY=" + e.sim.APIKey(), "BOTIX_WEBHOOK_SECRET=" + webhookSecret}
	// The second serve is refused before it opens the store: a newer
	// binary would otherwise migrate the schema under the first. Here the
	// store says it has a newer schema, which opening it would report.
	raw, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (9999, '9999_future.sql', '2026-01-01T00:00:00.000000000Z')`); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runBinaryFor(t, 30*time.Second, e.dir, env, "--config", second, "serve")
	if code != 1 || !strings.Contains(stderr, "in use by another backstop serve") || !strings.Contains(stderr, "governor.redis") {
		t.Fatalf("second serve: exit %d, stderr:\n%s\nwant exit 1 naming the other serve and governor.redis", code, stderr)
	}
	if _, err := raw.Exec(`DELETE FROM schema_migrations WHERE version = 9999`); err != nil {
		t.Fatal(err)
	}
	if got := getStatus(t, "http://"+addr+"/readyz"); got != http.StatusOK {
		t.Fatalf("first serve's /readyz after the second was refused: %d", got)
	}

	// SIGKILLed, the first leaves no claim behind.
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.wait(30 * time.Second)
	p := startProc(t, "serve-after-kill", second, e.sim.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	p.waitCount("msg=serving", 1, 30*time.Second)
}

// Without a maintenance job nothing prunes processed_events, the delivery
// log or job_runs, and the store grows for ever; serve used to say nothing
// of it. It now warns at start, and does not when one is configured. A
// backup job whose directory is missing is warned of at start too, not
// only when its first run fails hours later.
func TestOpsServeWarnsWithoutMaintenanceJob(t *testing.T) {
	const warning = "no maintenance job in jobs"
	e, p, _ := opsServe(t)
	p.waitCount(warning, 1, 10*time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(45 * time.Second)

	e.appendConfig("jobs:\n  - {name: prune, kind: maintenance, cron: \"30 4 * * *\"}\n" +
		"  - {name: nightly-backup, kind: backup, cron: \"15 4 * * *\", dir: no-such-backups}\n")
	q := startProc(t, "serve-pruned", e.config, e.sim.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	q.waitCount("msg=serving", 1, 30*time.Second)
	if q.count(warning) != 0 {
		t.Fatalf("warned with a maintenance job configured:\n%s", q.output())
	}
	if q.count("backup job's directory") != 1 || q.count(filepath.Join(filepath.Dir(e.config), "no-such-backups")) == 0 {
		t.Fatalf("no warning of the backup job's missing directory:\n%s", q.output())
	}
}

// When the store stops taking commits (a full disk; here another process
// holding its write lock), every webhook was answered 503 while /readyz
// said ready, so a load balancer kept sending them and no alert on
// readiness fired. /readyz now answers 503 store_error after a failed
// commit until a write of its own commits, and 200 again once it does,
// without waiting for a webhook. Its answer names the cause in words but
// not the store's path or the driver's message (/readyz may be public);
// those are in the log.
func TestOpsReadyzFailsWhileTheStoreCannotCommit(t *testing.T) {
	e, p, addr := opsServe(t)
	release := locktest.HoldWriteLock(t, e.db)

	// serve's commit waits out its busy timeout (10 s), then fails.
	code, body := postSigned(t, "http://"+addr+"/webhooks/botix", webhookSecret, paymentWebhook("evt_ops_locked", "pay_ops_locked"))
	if code != http.StatusServiceUnavailable {
		t.Fatalf("webhook while the store is locked: %d %s, want 503", code, body)
	}
	res, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(answer), "store_error") {
		t.Fatalf("/readyz after a failed commit: %d %s, want 503 store_error", res.StatusCode, answer)
	}
	// Either the test write found the lock, or, with writes queued on the
	// writer behind it, the probe could not have the writer in time.
	if !strings.Contains(string(answer), "another process holds the store's write lock") &&
		!strings.Contains(string(answer), "the store's writes are waiting for its write lock (another process may hold it)") {
		t.Fatalf("/readyz does not name the cause: %s", answer)
	}
	for _, leak := range []string{filepath.Base(e.db), "locked", "SQLITE"} {
		if strings.Contains(string(answer), leak) {
			t.Fatalf("/readyz answer shows %q, internals for the log only: %s", leak, answer)
		}
	}
	p.waitCount("not ready: the last webhook commit failed and so did a test write", 1, 15*time.Second)
	if got := getStatus(t, "http://"+addr+"/healthz"); got != http.StatusOK {
		t.Fatalf("/healthz while the store cannot commit: %d, want 200 (a restart would not help)", got)
	}

	release()
	waitFor(t, 30*time.Second, func() bool { return getStatus(t, "http://"+addr+"/readyz") == http.StatusOK })
	if code, body := postSigned(t, "http://"+addr+"/webhooks/botix", webhookSecret, paymentWebhook("evt_ops_locked", "pay_ops_locked")); code != http.StatusOK {
		t.Fatalf("webhook once the store is free: %d %s", code, body)
	}
}

// backstop_job_last_run_timestamp_seconds used to appear only after a
// job's first run in the serve process, so after every restart an alert
// on the age of a nightly job's last run went blind (or fired) for up to
// a day. serve now exports, from its start, when each configured job last
// finished as stored (here by backstop run from system cron), and every
// configured job's counters at zero.
func TestOpsJobMetricsReflectTheStoreAtStart(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 5}})
	e.appendConfig("jobs:\n  - {name: prune, kind: maintenance, cron: \"30 4 31 12 *\"}\n")
	env := []string{"BOTIX_API_KEY=" + e.sim.APIKey()}
	before := time.Now().Add(-time.Second).Unix()
	e.openStore().Close() // a maintenance job refuses a store.path with no database
	if code, out, errs := runBinary(t, e.dir, env, "--config", e.config, "run", "prune"); code != 0 {
		t.Fatalf("backstop run prune: exit %d\n%s%s", code, out, errs)
	}
	p := startProc(t, "serve", e.config, e.sim.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	p.waitCount("msg=serving", 1, 30*time.Second)
	m := p.metrics()
	last, ok := m[`backstop_job_last_run_timestamp_seconds{job="prune",status="ok"}`]
	if !ok || int64(last) < before || int64(last) > time.Now().Unix() {
		t.Fatalf("last run of prune at start: %v (present %v), want the stored run's end (after %d)", last, ok, before)
	}
	for _, series := range []string{
		`backstop_job_runs_total{job="prune",status="ok"}`,
		`backstop_job_runs_total{job="prune",status="failed"}`,
		`backstop_job_objects_total{count="pruned",job="prune"}`,
	} {
		if v, ok := m[series]; !ok || v != 0 {
			t.Errorf("%s at start: %v (present %v), want 0", series, v, ok)
		}
	}
}

// bigContactWebhook is a webhook of about 50 KB for contact
// n, version v.
func bigContactWebhook(n, v int) []byte {
	at := time.Date(2026, 3, 1, 10, 0, v, 0, time.UTC).Format(time.RFC3339)
	return []byte(fmt.Sprintf(`{"event_id":"evt_big_%d_%d","event":"contact.updated","created_at":%q,"data":{"id":"ct_big_%d","name":%q,"email":"big%d@example.com","created_at":"2026-03-01T10:00:00Z","updated_at":%q}}`,
		n, v, at, n, strings.Repeat("x", 50_000), n, at))
}

// walBytes is serve's backstop_store_size_bytes{file="wal"}.
func walBytes(p *fleetProc) float64 {
	v, ok := p.metrics()[`backstop_store_size_bytes{file="wal"}`]
	if !ok {
		p.t.Fatalf("no backstop_store_size_bytes{file=\"wal\"} on /metrics")
	}
	return v
}

// While a long read transaction (a sqlite3 shell, a backup) holds back
// checkpoints the WAL grows with every commit; afterwards it kept that
// size for as long as serve ran (hundreds of megabytes in a minute of
// load), and nothing on /metrics showed it. Now the store's files are on
// /metrics, and the WAL is cut back to 64 MiB once checkpoints catch up.
func TestOpsWALShrinksAfterALongReader(t *testing.T) {
	e, p, addr := opsServe(t)
	ctx := context.Background()
	raw, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	reader, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if _, err := reader.ExecContext(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := reader.QueryRowContext(ctx, "SELECT count(*) FROM contacts").Scan(&n); err != nil {
		t.Fatal(err)
	}

	const limit = 64 << 20
	url := "http://" + addr + "/webhooks/botix"
	post := func(from, to, version int) {
		var wg stdsync.WaitGroup
		next := make(chan int)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if code, body := postSigned(t, url, webhookSecret, bigContactWebhook(i, version)); code != http.StatusOK {
						t.Errorf("webhook %d: %d %s", i, code, body)
					}
				}
			}()
		}
		for i := from; i < to; i++ {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	post(0, 1000, 1)
	if grown := walBytes(p); grown <= limit {
		t.Fatalf("the WAL grew to %.0f bytes only under a long reader: the test proves nothing", grown)
	}
	if _, err := reader.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	// Checkpoints catch up over the next commits, and the WAL starts over.
	deadline := time.Now().Add(90 * time.Second)
	for round := 0; walBytes(p) > limit; round++ {
		if time.Now().After(deadline) {
			t.Fatalf("the WAL is still %.0f bytes %s after the reader ended", walBytes(p), 90*time.Second)
		}
		post(round*4, round*4+4, 2+round)
	}
}

// backstop_delivery_dead_letters_total counts from zero in each process,
// so after a restart nothing on /metrics said that dead letters were
// waiting to be retried or purged. backstop_delivery_dead_letter_depth now
// gives each target's stored dead letters from serve's start.
func TestOpsDeadLettersOnMetricsAfterRestart(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 5}})
	ctx := context.Background()
	db := e.openStore()
	at := time.Now().Add(-time.Hour)
	for _, id := range []string{"evt_dead_1", "evt_dead_2"} {
		enqueueDeadLetter(t, ctx, db, "billing", id, "http://127.0.0.1:9/hooks", 400, at)
	}
	db.Close()
	p := startProc(t, "serve", e.config, e.sim.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	p.waitCount("msg=serving", 1, 30*time.Second)
	if got, ok := p.metrics()[`backstop_delivery_dead_letter_depth{target="billing"}`]; !ok || got != 2 {
		t.Fatalf("backstop_delivery_dead_letter_depth{target=\"billing\"} at start: %v (present %v), want 2", got, ok)
	}
}

// serve --help said nothing of what an operator must know to run it: that
// /readyz turns 503 when commits fail, that one serve per store runs
// without Redis, and what SIGHUP does; it now says all three.
func TestOpsServeHelpSaysHowItIsOperated(t *testing.T) {
	code, out, errs := runBinary(t, t.TempDir(), nil, "serve", "--help")
	if code != 0 {
		t.Fatalf("serve --help: exit %d\n%s", code, errs)
	}
	for _, want := range []string{"after a webhook commit\nfailed", "only one serve may run on a store", "SIGHUP is logged and ignored"} {
		if !strings.Contains(out, want) {
			t.Errorf("serve --help does not say %q:\n%s", want, out)
		}
	}
}

// backstop_delivery_latency_seconds's buckets ended at 5.8 h, while the
// default retry schedule alone spans about 25 h: every delivery that
// needed the later retries fell into +Inf, and a quantile over them said
// 5.8 h. A delivery queued 30 h ago now lands in a finite bucket.
func TestOpsDeliveryLatencyBucketsCoverTheRetrySchedule(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer target.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, fmt.Sprintf("targets:\n  - {name: late, url: %q, allow_private: true}\n", target.URL))
	db := e.openStore()
	if _, err := db.Enqueue(context.Background(), "late", "evt_late", "proxy", []byte(`{"n":1}`), time.Now().Add(-30*time.Hour)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	p := startProc(t, "serve", e.config, e.sim.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	p.waitCount("msg=serving", 1, 30*time.Second)
	var m map[string]float64
	waitFor(t, 30*time.Second, func() bool {
		m = p.metrics()
		return m[`backstop_delivery_latency_seconds_count{target="late"}`] == 1
	})
	for series, v := range m {
		if !strings.HasPrefix(series, `backstop_delivery_latency_seconds_bucket{target="late",le="`) || strings.Contains(series, `le="+Inf"`) {
			continue
		}
		if v == 1 {
			return // a finite bucket holds it
		}
	}
	t.Fatalf("the 30 h delivery is only in the +Inf bucket:\n%v", m)
}

// Nothing on /metrics said how long job runs took, so a nightly sync
// creeping towards its next run could not be watched or alerted on; each
// run that ran is now observed in backstop_job_duration_seconds{job}.
func TestOpsJobDurationOnMetrics(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 5}})
	e.appendConfig("jobs:\n  - {name: tick, kind: maintenance, every: 1s}\n")
	p := startProc(t, "serve", e.config, e.sim.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	p.waitCount("msg=serving", 1, 30*time.Second)
	p.waitCount(`msg="job finished"`, 1, 30*time.Second)
	waitFor(t, 10*time.Second, func() bool {
		m := p.metrics()
		return m[`backstop_job_duration_seconds_count{job="tick"}`] >= 1 && m[`backstop_job_duration_seconds_bucket{job="tick",le="+Inf"}`] >= 1
	})
}

// backstop_intake_requests_total{outcome} had only the outcomes seen since
// the start: an alert on store_error or bad_signature had no series to
// watch after a restart, and the first burst of them showed as a series
// appearing, not as a rate. Every outcome is now exported at zero from
// the start.
func TestOpsIntakeOutcomesExportedFromTheStart(t *testing.T) {
	_, p, _ := opsServe(t)
	m := p.metrics()
	for _, outcome := range []string{"accepted", "duplicate", "bad_signature", "malformed", "too_large",
		"unsupported_media_type", "method_not_allowed", "draining", "store_error", "timeout", "sender_gone"} {
		series := `backstop_intake_requests_total{outcome="` + outcome + `"}`
		if v, ok := m[series]; !ok || v != 0 {
			t.Errorf("%s at start: %v (present %v), want 0", series, v, ok)
		}
	}
}

// Nothing told which version a serve process runs (during a rolling
// upgrade, or when comparing a fleet's behaviour): its start line and
// /metrics (backstop_build_info{version}) now say it, as backstop version
// does.
func TestOpsServeSaysItsVersion(t *testing.T) {
	_, p, _ := opsServe(t)
	code, out, _ := runBinary(t, t.TempDir(), nil, "version")
	fields := strings.Fields(out)
	if code != 0 || len(fields) < 2 {
		t.Fatalf("backstop version: exit %d, %q", code, out)
	}
	if line, _ := p.first("msg=serving"); !strings.Contains(line, "version="+fields[1]) {
		t.Errorf("start line does not name version %s: %s", fields[1], line)
	}
	if v := p.metrics()[`backstop_build_info{version="`+fields[1]+`"}`]; v != 1 {
		t.Errorf("backstop_build_info{version=%q} = %v, want 1", fields[1], v)
	}
}

// backstop cursors reset run while serve's sync job read that resource
// was undone by the job's next page, which saved its cursor over the
// reset (backstop sync and run were guarded, serve's jobs were not): the
// job now stops that resource saying its cursor was reset.
func TestOpsCursorResetDuringAServeSyncJobWins(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 5, Objects: 600, Latency: 25 * time.Millisecond}, pageSize: 10})
	e.writeServeConfig(addr, "jobs:\n  - {name: contacts-sync, kind: sync, resources: [contacts], every: 2s}\n"+
		"  - {name: prune, kind: maintenance, cron: \"30 4 * * *\"}\n")
	data, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(strings.Replace(string(data), "  api_key: ${BOTIX_API_KEY}\n", "  api_key: ${BOTIX_API_KEY}\n  page_size: 10\n", 1))
	p := startProc(t, "serve", e.config, e.sim.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	p.waitCount("msg=serving", 1, 30*time.Second)
	r := backstop.Contacts
	db := e.openStore()
	waitFor(t, 60*time.Second, func() bool {
		c, ok, err := db.Cursor(context.Background(), r, backstop.CursorSync)
		return err == nil && ok && c.Position.Compare(e.sim.Objects(r)[49].Position()) >= 0
	})
	db.Close()
	if code, out, stderr := e.run(context.Background(), "cursors", "reset", string(r)); code != 0 {
		t.Fatalf("cursors reset: exit %d\n%s%s", code, out, stderr)
	}
	p.waitCount("its cursor was reset while it ran", 1, 60*time.Second)
}

// Nothing on /metrics gave the webhook answer latency the platform sees
// (only the commit's own duration), so an SLO on it could not be kept;
// backstop_intake_request_duration_seconds{code} now observes every
// webhook answer, refusals included.
func TestOpsWebhookAnswerLatencyOnMetrics(t *testing.T) {
	_, p, addr := opsServe(t)
	url := "http://" + addr + "/webhooks/botix"
	if code, body := postSigned(t, url, webhookSecret, paymentWebhook("evt_ops_lat", "pay_ops_lat")); code != http.StatusOK {
		t.Fatalf("webhook: %d %s", code, body)
	}
	if code, _ := postSigned(t, url, "wrong-secret", paymentWebhook("evt_ops_lat2", "pay_ops_lat2")); code != http.StatusUnauthorized {
		t.Fatalf("badly signed webhook: %d, want 401", code)
	}
	m := p.metrics()
	for _, code := range []string{"200", "401"} {
		if v := m[`backstop_intake_request_duration_seconds_count{code="`+code+`"}`]; v != 1 {
			t.Errorf("backstop_intake_request_duration_seconds_count{code=%q} = %v, want 1", code, v)
		}
	}
}

// A webhook whose sender hung up while its event waited for the commit
// (here behind a write lock another process held) got no answer, yet was
// observed as a 200 in backstop_intake_request_duration_seconds and counted
// under no outcome. It is now code="499" and outcome="sender_gone", and the
// event, committed once the lock is free, makes the sender's retry a
// duplicate.
func TestOpsWebhookWhoseSenderHungUpIsNotCountedAsAnswered(t *testing.T) {
	e, p, addr := opsServe(t)
	release := locktest.HoldWriteLock(t, e.db)

	url := "http://" + addr + "/webhooks/botix"
	body := paymentWebhook("evt_ops_gone", "pay_ops_gone")
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Botix-Signature", intake.SignBotix(webhookSecret, body))
	// The client gives up and closes its connection long before serve's
	// busy timeout (10 s) would end the commit's wait.
	impatient := &http.Client{Timeout: time.Second}
	if res, err := impatient.Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("webhook while the store is locked: answered %d before the lock was released", res.StatusCode)
	}
	// The handler counts the outcome, then the middleware around it times
	// the answer: wait for both, or a scrape between the two sees one.
	var m map[string]float64
	waitFor(t, 5*time.Second, func() bool {
		m = p.metrics()
		return m[`backstop_intake_requests_total{outcome="sender_gone"}`] >= 1 &&
			m[`backstop_intake_request_duration_seconds_count{code="499"}`]+m[`backstop_intake_request_duration_seconds_count{code="200"}`] >= 1
	})
	if v := m[`backstop_intake_request_duration_seconds_count{code="499"}`]; v != 1 {
		t.Errorf(`backstop_intake_request_duration_seconds_count{code="499"} = %v, want 1`, v)
	}
	if v := m[`backstop_intake_request_duration_seconds_count{code="200"}`]; v != 0 {
		t.Errorf(`backstop_intake_request_duration_seconds_count{code="200"} = %v, want 0: no webhook was answered`, v)
	}

	release()
	// The event queued before the sender left commits once the lock is
	// free; the platform's retry is then a duplicate.
	waitFor(t, 15*time.Second, func() bool { return p.metrics()[`backstop_emit_commit_batch_size_count`] >= 1 })
	code, answer := postSigned(t, url, webhookSecret, body)
	if code != http.StatusOK || !strings.Contains(string(answer), `"duplicate"`) {
		t.Fatalf("the sender's retry: %d %s, want 200 duplicate", code, answer)
	}
}

// A serve without governor.redis and serves with it on one store (one node
// configured differently, by mistake) used to run side by side, the first
// running every job again beside the Redis leader. Each is now refused
// while the other kind runs, saying which and what to do; serves with
// Redis still run together.
func TestOpsServesWithAndWithoutRedisOnOneStoreAreRefused(t *testing.T) {
	rds := redistest.Start(t)
	s := sim.New(sim.Options{Seed: 5, Objects: 10})
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "shared.db")
	withRedis := writeTickConfig(t, dir, newSimServer(t, s), dbPath, rds.URL(), 3*time.Second, time.Hour)
	data, err := os.ReadFile(withRedis)
	if err != nil {
		t.Fatal(err)
	}
	alone := writeFile(t, dir, "alone.yaml", regexp.MustCompile(`(?m)^governor:\n(  .*\n)+`).ReplaceAllString(string(data), ""))
	env := []string{"BOTIX_API_KEY=" + s.APIKey(), "BOTIX_WEBHOOK_SECRET=" + webhookSecret}

	procs := startServes(t, "redis-serve-", 2, withRedis, s.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret})
	code, _, stderr := runBinaryFor(t, 30*time.Second, dir, env, "--config", alone, "serve")
	if code != 1 || !strings.Contains(stderr, "in use by another backstop serve") {
		t.Fatalf("serve without Redis beside two with it: exit %d, stderr:\n%s\nwant exit 1", code, stderr)
	}
	for _, p := range procs {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		p.wait(45 * time.Second)
	}

	p := startProc(t, "alone", alone, s.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	p.waitCount("msg=serving", 1, 30*time.Second)
	code, _, stderr = runBinaryFor(t, 30*time.Second, dir, env, "--config", withRedis, "serve")
	if code != 1 || !strings.Contains(stderr, "in use by a backstop serve without governor.redis") {
		t.Fatalf("serve with Redis beside one without: exit %d, stderr:\n%s\nwant exit 1", code, stderr)
	}
}

// A store file serve can read but not write (restored as another user, on
// a read-only mount; here made immutable, which binds root too) was opened
// read-only without a word: serve said ready and answered every webhook
// 503. It now refuses to start, saying why.
func TestOpsServeRefusesAStoreItCannotWrite(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 5}})
	db := e.openStore() // creates and migrates it
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chattr", "+i", e.db).CombinedOutput(); err != nil {
		t.Fatalf("chattr +i %s (the test makes the store read-only so): %v %s", e.db, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("chattr", "-i", e.db).CombinedOutput(); err != nil {
			t.Errorf("chattr -i %s: %v %s", e.db, err, out)
		}
	})
	code, out, stderr := runBinaryFor(t, 30*time.Second, filepath.Dir(e.config),
		[]string{"BOTIX_API_KEY=" + e.sim.APIKey(), "BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "--config", e.config, "serve")
	if code != exitFailure || !strings.Contains(stderr, "serve needs a store it can write (the store file cannot be written)") {
		t.Fatalf("serve on a read-only store: exit %d, want 1 saying the store cannot be written\n%s%s", code, out, stderr)
	}
	if strings.Contains(out, "listening on") {
		t.Errorf("serve listened on a store it cannot write:\n%s", out)
	}
}

// On a full disk every webhook was answered 503 while /readyz said ready:
// its test write, one page, fit in room the WAL file already had, so it
// took the store for committing again, and the next webhook failed too
// (found by an operator audit, on an 8 MiB tmpfs). /readyz now also wants
// room on the disk, and says the disk is full until there is; it is ready
// again by itself once room is made. It mounts a tmpfs, which takes root.
func TestOpsReadyzSaysNotReadyWhileTheDiskIsFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root (CI runs as root)")
	}
	small := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(small, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", small).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs for the store: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", small).Run() })
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 5}})
	e.db = filepath.Join(small, "b.db")
	e.writeServeConfig(addr, `targets:
  - {name: billing, url: "http://127.0.0.1:9/hooks", events: ["payment.*"], allow_private: true}
`)
	p := startProc(t, "serve", e.config, e.sim.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	p.waitCount("msg=serving", 1, 30*time.Second)
	hook := "http://" + addr + "/webhooks/botix"
	if code, body := postSigned(t, hook, webhookSecret, paymentWebhook("evt_full_0", "pay_full_0")); code != http.StatusOK {
		t.Fatalf("webhook with room on the disk: %d %s", code, body)
	}

	// Fill the disk.
	filler, err := os.Create(filepath.Join(small, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := filler.Write(chunk); err != nil {
			break
		}
	}
	filler.Close()
	refused := false
	for i := 1; i <= 3000 && !refused; i++ {
		code, _ := postSigned(t, hook, webhookSecret, paymentWebhook(fmt.Sprintf("evt_full_%d", i), fmt.Sprintf("pay_full_%d", i)))
		refused = code == http.StatusServiceUnavailable
	}
	if !refused {
		t.Fatal("no webhook refused on a full disk")
	}
	// A little room, as a disk that is full but for a few pages: enough
	// for a one-page test write, not for the webhooks' batches.
	if fi, err := os.Stat(filepath.Join(small, "filler")); err != nil {
		t.Fatal(err)
	} else if err := os.Truncate(filepath.Join(small, "filler"), fi.Size()-128<<10); err != nil {
		t.Fatal(err)
	}
	// Over more than one probe period (a second): never ready.
	for range 4 {
		res, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		answer, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(answer), "the disk is full") {
			t.Fatalf("/readyz on a full disk: %d %s, want 503 saying the disk is full", res.StatusCode, answer)
		}
		time.Sleep(600 * time.Millisecond) // the probe's one-second cache passes between the checks
	}

	if err := os.Remove(filepath.Join(small, "filler")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool { return getStatus(t, "http://"+addr+"/readyz") == http.StatusOK })
	if code, body := postSigned(t, hook, webhookSecret, paymentWebhook("evt_full_after", "pay_full_after")); code != http.StatusOK {
		t.Fatalf("webhook once room was made: %d %s", code, body)
	}
}
