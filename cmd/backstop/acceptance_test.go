package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/sources"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

// Issue 4's acceptance: with the platform dropping 10% of its webhooks,
// duplicating 5% and reordering some, one reconcile brings every payment's
// current version into the mirror; every (payment, version) reaches the
// outbox exactly once across the webhook and reconcile origins; a second
// reconcile emits nothing; a webhook arriving after the reconcile for a
// version it re-emitted is a duplicate.
func TestLostWebhooksAreFoundByReconcileExactlyOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "a.db"), store.Options{Synchronous: "FULL"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const secret = "acceptance-secret"
	verifier, err := intake.NewVerifier(intake.SchemeBotix, intake.SchemeOptions{Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	log := slog.New(slog.DiscardHandler)

	// The intake needs the API client (for truncated events) and the sim
	// needs the intake's URL: start the intake's server first.
	var handler http.Handler
	intakeSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	defer intakeSrv.Close()
	platform := sim.New(sim.Options{
		Seed: 99, Objects: 400,
		WebhookURL: intakeSrv.URL, WebhookSecret: secret,
		DropRate: 0.10, DuplicateRate: 0.05, ReorderRate: 0.05,
		RetrySchedule: []time.Duration{20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond},
	})
	api := httptest.NewServer(platform.Handler())
	defer api.Close()
	client, err := sources.New(sources.Options{BaseURL: api.URL, APIKey: platform.APIKey(), PageSize: 100,
		Governor: governor.New(platform.APIKey(), governor.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	stack := startIntake(ctx, db, client, verifier, intakeOptions{routes: routes}, log, prometheus.NewRegistry())
	defer stack.stop(context.Background())
	handler = stack.handler
	engine := &bsync.Engine{Source: client, Mirror: db, PageSize: 100}

	if _, err := engine.Backfill(ctx, backstop.Payments, false); err != nil {
		t.Fatal(err)
	}
	platform.StartWebhooks(ctx)
	platform.Mutate(800)
	idle, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	if err := platform.WebhooksIdle(idle); err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, ev := range platform.Events() {
		if ev.Dropped && ev.Resource == backstop.Payments {
			lost++
		}
	}
	if lost == 0 {
		t.Fatal("no payment webhook was lost: the test proves nothing")
	}

	rep, err := engine.Reconcile(ctx, backstop.Payments, bsync.ReconcileOptions{Full: true, Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Reemitted == 0 {
		t.Fatalf("reconcile re-emitted nothing although %d payment webhooks were lost: %+v", lost, rep)
	}
	if diff, err := mirrorDiff(ctx, db, platform, backstop.Payments); err != nil || diff != 0 {
		t.Fatalf("after reconcile %d payments differ from the platform (err %v)", diff, err)
	}

	// Exactly once per (payment, version) across origins.
	rows, err := db.OutboxRows(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	var reemitted *backstop.Object
	for _, r := range rows {
		var env struct {
			Origin string          `json:"origin"`
			Data   json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(r.Payload, &env); err != nil {
			t.Fatal(err)
		}
		obj, err := backstop.DecodeObject(backstop.Payments, env.Data)
		if err != nil {
			t.Fatal(err)
		}
		key := backstop.DedupKey(backstop.Payments, obj.ID, obj.UpdatedAt)
		if prev, dup := seen[key]; dup {
			t.Errorf("%s reached the outbox twice (%s, %s)", key, prev, env.Origin)
		}
		seen[key] = env.Origin
		if env.Origin == string(backstop.OriginReconcile) && reemitted == nil {
			reemitted = &obj
		}
	}
	// Every payment changed during the traffic reached the outbox in its
	// current version.
	for _, ev := range platform.Events() {
		if ev.Resource != backstop.Payments {
			continue
		}
		cur, _ := platform.Object(backstop.Payments, ev.ObjectID)
		if _, ok := seen[backstop.DedupKey(backstop.Payments, cur.ID, cur.UpdatedAt)]; !ok {
			t.Errorf("payment %s: its current version never reached the outbox", cur.ID)
		}
	}

	again, err := engine.Reconcile(ctx, backstop.Payments, bsync.ReconcileOptions{Full: true, Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	if again.Reemitted != 0 || again.Missing+again.Behind != 0 {
		t.Errorf("second reconcile: %+v, want nothing emitted", again)
	}

	// The platform's late webhook for a version reconcile already emitted.
	if reemitted == nil {
		t.Fatal("no outbox row came from reconcile")
	}
	body := []byte(fmt.Sprintf(`{"event_id":"evt_late_%d","event":"payment.updated","created_at":%q,"data":%s}`,
		time.Now().UnixNano(), time.Now().UTC().Format(time.RFC3339), reemitted.Data))
	code, answer := postSigned(t, intakeSrv.URL, secret, body)
	if code != 200 || !bytes.Contains(answer, []byte(`"duplicate"`)) {
		t.Errorf("late webhook for %s: %d %s, want 200 duplicate", reemitted.ID, code, answer)
	}
	t.Logf("payment webhooks lost %d; reconcile found %d missing, %d behind, re-emitted %d; outbox %d rows",
		lost, rep.Missing, rep.Behind, rep.Reemitted, len(rows))
}
