package main

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// A backfill without events (--no-emit, as the README's serve walkthrough
// runs it while webhooks flow) used to write every version it read into
// the mirror silently, among them the changes whose webhooks the platform
// lost: reconcile then found the mirror equal to the platform, and those
// events never reached the targets. Now only history, the versions from
// before backstop recorded the resource's events and before the run (less
// QuietMargin), is written without events; the later ones go through the
// emit path (origin sync), once each, and reconcile finds nothing left.
func TestBackfillNoEmitDoesNotHideLostWebhooks(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 21, Objects: 40}})
	data, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(string(data) + `targets:
  - {name: billing, url: "https://billing.example.com/hooks", events: ["payment.*"]}
`)
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	emitted := func(db *store.DB, id string) []map[string]any {
		t.Helper()
		rows, err := db.OutboxRows(ctx, "billing")
		if err != nil {
			t.Fatal(err)
		}
		var out []map[string]any
		for _, r := range rows {
			var env map[string]any
			if err := json.Unmarshal(r.Payload, &env); err != nil {
				t.Fatal(err)
			}
			if d, _ := env["data"].(map[string]any); d["id"] == id {
				out = append(out, env)
			}
		}
		return out
	}

	// Webhooks flow: one payment changes and its webhook is taken.
	pays := e.sim.Objects(backstop.Payments)
	var updated []backstop.Object
	for _, p := range pays {
		if o, ok := e.sim.Update(backstop.Payments, p.ID); ok {
			updated = append(updated, o)
		}
		if len(updated) == 4 {
			break
		}
	}
	if len(updated) < 4 {
		t.Fatalf("only %d payments could change", len(updated))
	}
	db := e.openStore()
	delivered := updated[0]
	typ := backstop.EventTypeFor(backstop.Payments, delivered.Data, false)
	if _, err := db.Emit(ctx, []backstop.Event{{ID: "evt_webhook_1", Type: typ, Resource: backstop.Payments,
		ObjectID: delivered.ID, UpdatedAt: delivered.UpdatedAt, Origin: backstop.OriginWebhook, Data: delivered.Data}}, routes); err != nil {
		t.Fatal(err)
	}
	db.Close()
	// The other three changed while the platform lost their webhooks.
	lost := updated[1:]

	code, stdout, stderr := e.run(ctx, "backfill", "payments", "--no-emit", "--json")
	if code != exitOK {
		t.Fatalf("backfill --no-emit: exit %d\n%s%s", code, stdout, stderr)
	}
	if r := parseSummary(t, stdout).Resources[0]; r.Emitted == nil || *r.Emitted != len(lost) {
		t.Errorf("backfill --no-emit summary %+v, want %d emitted (the changes whose webhooks were lost)", r, len(lost))
	}

	db = e.openStore()
	defer db.Close()
	for _, o := range lost {
		got := emitted(db, o.ID)
		if len(got) != 1 || got[0]["origin"] != string(backstop.OriginSync) {
			t.Errorf("payment %s changed with its webhook lost: queued %v, want one event, origin sync", o.ID, got)
		}
	}
	if got := emitted(db, delivered.ID); len(got) != 1 || got[0]["event_id"] != "evt_webhook_1" {
		t.Errorf("payment %s, whose webhook was taken: queued %v, want its webhook's event alone", delivered.ID, got)
	}
	rows, err := db.OutboxRows(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + len(lost); len(rows) != want {
		t.Errorf("%d deliveries queued, want %d: the history (the platform's older versions) gets no events", len(rows), want)
	}
	// Nothing is left for reconcile to find: the mirror is the platform.
	rep := e.auditReconcileJSON("payments", "--full", "--dry-run")
	if rep.Missing != 0 || rep.Behind != 0 {
		t.Errorf("reconcile after the backfill: %+v, want nothing missing or behind", rep)
	}
}
