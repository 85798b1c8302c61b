package store

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/backstop-sync/backstop"
)

// openAtVersion creates a store at path whose schema stops at version
// (inclusive), as a binary of that time left it, for upgrade tests; the
// returned handle is the writer connection, for the caller to fill and close.
func openAtVersion(t *testing.T, path string, version int) *sqlx.DB {
	t.Helper()
	ctx := context.Background()
	w, err := sqlx.Open(driverName, path+"?_txlock=immediate&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	w.SetMaxOpenConns(1)
	old := &DB{w: w, now: time.Now}
	if _, err := w.ExecContext(ctx, `CREATE TABLE schema_migrations (
		version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.version <= version {
			if err := old.apply(ctx, m); err != nil {
				t.Fatalf("migration %s: %v", m.name, err)
			}
		}
	}
	return w
}

// openUpgraded creates a store at path whose schema stops at version, runs
// the statements that fill it there, then opens it with Open, which applies
// the later migrations; the caller closes the returned store.
func openUpgraded(t *testing.T, path string, version int, statements ...string) *DB {
	t.Helper()
	ctx := context.Background()
	w := openAtVersion(t, path, version)
	for _, q := range statements {
		if _, err := w.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// Migration 0010 keeps every job and reconcile run (and their statuses),
// gives a run left running the heartbeat of its start, and then accepts
// the statuses interrupted and abandoned.
func TestMigration10KeepsRunsAndAddsStatuses(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db := openUpgraded(t, path, 9,
		`INSERT INTO job_runs (id, job, kind, started_at, finished_at, status, pages, error)
			VALUES (7, 'crm-nightly', 'sync', '2026-01-01T03:00:00.000000000Z', '2026-01-01T03:00:09.000000000Z', 'failed', 4, 'context canceled')`,
		`INSERT INTO reconcile_runs (id, resource, started_at, finished_at, status, scanned)
			VALUES (1, 'payments', '2026-01-01T01:00:00.000000000Z', '2026-01-01T01:00:05.000000000Z', 'ok', 40)`,
		`INSERT INTO reconcile_runs (id, resource, started_at, full) VALUES (2, 'contacts', '2026-01-01T02:00:00.000000000Z', 1)`,
		`INSERT INTO reconcile_seen (run_id, id) VALUES (2, 'ct_1')`,
	)
	defer db.Close()
	runs, err := db.JobRuns(ctx, "crm-nightly", 0)
	if err != nil || len(runs) != 1 || runs[0].ID != 7 || runs[0].Status != "failed" || runs[0].Counts.Pages != 4 {
		t.Fatalf("job runs after the upgrade: %+v, %v", runs, err)
	}
	if _, err := db.SaveJobRun(ctx, JobRun{Job: "crm-nightly", Kind: "sync", Status: "interrupted", Error: "context canceled"}); err != nil {
		t.Fatalf("an interrupted run cannot be stored: %v", err)
	}
	rec, err := db.ReconcileRuns(ctx, 0)
	if err != nil || len(rec) != 2 || rec[0].ID != 2 || rec[0].Status != "running" || rec[1].Status != "ok" || rec[1].Scanned != 40 {
		t.Fatalf("reconcile runs after the upgrade: %+v, %v", rec, err)
	}
	var beat string
	if err := db.r.GetContext(ctx, &beat, `SELECT heartbeat_at FROM reconcile_runs WHERE id = 2`); err != nil || beat != "2026-01-01T02:00:00.000000000Z" {
		t.Errorf("heartbeat of the run left running: %q, %v; want its start", beat, err)
	}
	// The tables took their indexes back, and new runs are stored.
	var idx int
	if err := db.r.GetContext(ctx, &idx, `SELECT count(*) FROM sqlite_schema WHERE type = 'index'
		AND name IN ('job_runs_job', 'job_runs_started', 'reconcile_runs_last_ok')`); err != nil || idx != 3 {
		t.Errorf("%d of 3 indexes after the upgrade (%v)", idx, err)
	}
	id, err := db.StartReconcile(ctx, backstop.ReconcileReport{Resource: backstop.Chats})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.FinishReconcile(ctx, id, backstop.ReconcileReport{Resource: backstop.Chats, Err: context.Canceled}); err != nil {
		t.Fatal(err)
	}
	if rec, err := db.ReconcileRuns(ctx, 1); err != nil || rec[0].Status != "interrupted" {
		t.Errorf("a cancelled reconcile stored as %+v, %v; want interrupted", rec, err)
	}
	// A binary from before the migration, still running on the store (a
	// rolling upgrade), starts reconcile runs without a heartbeat.
	if _, err := db.w.ExecContext(ctx, `INSERT INTO reconcile_runs (resource, started_at) VALUES ('chats', '2026-01-01T03:00:00.000000000Z')`); err != nil {
		t.Errorf("a reconcile run started by an older binary cannot be stored: %v", err)
	}
}

// Migration 0012 keeps every job run (its status, counts and times) of a
// store at schema 11, gives it its end as heartbeat, then stores runs as
// running and abandoned, and gives the store an id that stays the same
// when it is opened again.
func TestMigration12KeepsJobRunsAndAddsRunningAndStoreID(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db := openUpgraded(t, path, 11,
		`INSERT INTO job_runs (id, job, kind, started_at, finished_at, status, pages, error)
			VALUES (7, 'crm-nightly', 'sync', '2026-01-01T03:00:00.000000000Z', '2026-01-01T03:00:09.000000000Z', 'interrupted', 4, 'context canceled')`,
		`INSERT INTO job_runs (id, job, kind, started_at, finished_at, status)
			VALUES (8, 'crm-nightly', 'sync', '2026-01-01T03:01:00.000000000Z', '2026-01-01T03:01:00.000000000Z', 'skipped')`,
	)
	runs, err := db.JobRuns(ctx, "crm-nightly", 0)
	if err != nil || len(runs) != 2 || runs[1].ID != 7 || runs[1].Status != "interrupted" || runs[1].Counts.Pages != 4 ||
		runs[1].Error != "context canceled" || runs[0].Status != "skipped" {
		t.Fatalf("job runs after the upgrade: %+v, %v", runs, err)
	}
	if want := mustTime(t, "2026-01-01T03:00:09Z"); !runs[1].FinishedAt.Equal(want) || !runs[1].HeartbeatAt.Equal(want) {
		t.Errorf("run 7 finished %v, heartbeat %v; want both at its end %v", runs[1].FinishedAt, runs[1].HeartbeatAt, want)
	}
	var idx int
	if err := db.r.GetContext(ctx, &idx, `SELECT count(*) FROM sqlite_schema WHERE type = 'index'
		AND name IN ('job_runs_job', 'job_runs_started', 'job_runs_running')`); err != nil || idx != 3 {
		t.Errorf("%d of 3 indexes after the upgrade (%v)", idx, err)
	}
	id, err := db.StartJobRun(ctx, JobRun{Job: "crm-nightly", Kind: "sync"})
	if err != nil {
		t.Fatalf("a running run cannot be stored: %v", err)
	}
	if last, _, err := db.LastJobRun(ctx, "crm-nightly"); err != nil || last.ID != id || last.Status != "running" {
		t.Errorf("last run: %+v, %v; want %d running", last, err, id)
	}
	// A binary from before the migration still running on the store reads
	// finished_at into a plain string: a running run must not hold NULL.
	var finished []string
	if err := db.r.SelectContext(ctx, &finished, `SELECT finished_at FROM job_runs`); err != nil {
		t.Errorf("job_runs as an older binary reads it: %v", err)
	}
	// A binary from before the migration still running on the store
	// stores finished runs without a heartbeat.
	if _, err := db.w.ExecContext(ctx, `INSERT INTO job_runs (job, kind, started_at, finished_at, status)
		VALUES ('prune', 'maintenance', '2026-01-02T04:30:00.000000000Z', '2026-01-02T04:30:01.000000000Z', 'ok')`); err != nil {
		t.Errorf("a run stored by an older binary: %v", err)
	}
	if _, _, err := db.LastJobRun(ctx, "prune"); err != nil {
		t.Errorf("a run stored by an older binary cannot be read: %v", err)
	}
	first, err := db.StoreID(ctx)
	if err != nil || len(first) != 32 {
		t.Fatalf("store id %q, %v; want 32 hex digits", first, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if again, err := db.StoreID(ctx); err != nil || again != first {
		t.Errorf("store id after reopening %q (%v), want %q", again, err, first)
	}
	other, _ := openTest(t)
	if id, err := other.StoreID(ctx); err != nil || id == first || len(id) != 32 {
		t.Errorf("another store's id %q (%v), want another than %q", id, err, first)
	}
}

// A store that lists a schema version this binary does not know, though
// not above its latest (one a development build applied), is refused with
// the reason, instead of opened as if that migration were not there.
func TestOpenRefusesAnUnknownSchemaVersion(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "dev.db")
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.w.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (0, '0000_dev.sql', '2026-01-01T00:00:00Z')`); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db, err := Open(ctx, path, Options{}); err == nil || !strings.Contains(err.Error(), "schema version 0 is applied to the store but unknown to this binary") {
		if err == nil {
			db.Close()
		}
		t.Fatalf("Open of a store with an unknown schema version: %v, want it refused", err)
	}
}

// Migration 0022 turns the mirror's generated columns into stored ones
// filled with what they gave, in the same order, and the mirror's writes
// fill them from then on.
func TestMigration22StoresTheTypedColumns(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db := openUpgraded(t, path, 21,
		`INSERT INTO payments (id, updated_at, data, synced_at) VALUES ('pay_1', '2026-01-01T00:00:00.000000000Z',
			'{"id":"pay_1","contact_id":"ct_1","amount":1250,"currency":"EUR","status":"succeeded","created_at":"2025-12-31T10:00:00Z"}', '2026-01-01T00:00:00.000000000Z')`,
		`INSERT INTO payments (id, updated_at, data, synced_at) VALUES ('pay_2', '2026-01-01T00:00:00.000000000Z',
			'{"id":"pay_2","amount":12.5,"status":"caf\u00e9 \"x\""}', '2026-01-01T00:00:00.000000000Z')`,
		`INSERT INTO contacts (id, updated_at, data, synced_at) VALUES ('ct_1', '2026-01-01T00:00:00.000000000Z',
			'{"id":"ct_1","name":"Ada","email":"ada@example.com","phone":null}', '2026-01-01T00:00:00.000000000Z')`,
	)
	defer db.Close()
	var cols []string
	if err := db.r.SelectContext(ctx, &cols, `SELECT name || ' ' || type || ' ' || hidden FROM pragma_table_xinfo('payments')`); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(cols, ", "), "id TEXT 0, updated_at TEXT 0, data TEXT 0, synced_at TEXT 0, created_at TEXT 0, contact_id TEXT 0, amount INTEGER 0, currency TEXT 0, status TEXT 0"; got != want {
		t.Errorf("payments columns after the upgrade:\n %s\nwant\n %s", got, want)
	}
	rows := func(q string) string {
		t.Helper()
		var out []string
		if err := db.r.SelectContext(ctx, &out, q); err != nil {
			t.Fatal(err)
		}
		return strings.Join(out, "; ")
	}
	if got, want := rows(`SELECT id || ' ' || quote(created_at) || ' ' || quote(contact_id) || ' ' || quote(amount) || ' ' || typeof(amount) || ' ' || quote(currency) || ' ' || quote(status) FROM payments ORDER BY id`),
		`pay_1 '2025-12-31T10:00:00Z' 'ct_1' 1250 integer 'EUR' 'succeeded'; pay_2 NULL NULL 12.5 real NULL 'café "x"'`; got != want {
		t.Errorf("payments after the upgrade:\n %s\nwant\n %s", got, want)
	}
	if got, want := rows(`SELECT quote(name) || ' ' || quote(email) || ' ' || quote(phone) FROM contacts`), `'Ada' 'ada@example.com' NULL`; got != want {
		t.Errorf("contacts after the upgrade: %s, want %s", got, want)
	}
	// A newer version written after the upgrade replaces them all.
	o := backstop.Object{Resource: backstop.Payments, ID: "pay_1", UpdatedAt: time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC),
		Data: []byte(`{"id":"pay_1","amount":990,"status":"refunded"}`)}
	if _, err := db.ApplyPage(ctx, []backstop.Object{o}, backstop.Cursor{Resource: backstop.Payments, Kind: backstop.CursorSync}); err != nil {
		t.Fatal(err)
	}
	if got, want := rows(`SELECT quote(contact_id) || ' ' || quote(amount) || ' ' || quote(status) FROM payments WHERE id = 'pay_1'`), `NULL 990 'refunded'`; got != want {
		t.Errorf("pay_1 after a newer version: %s, want %s", got, want)
	}
}
