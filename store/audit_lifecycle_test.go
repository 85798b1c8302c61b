package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/backstop-sync/backstop"
)

// A store path that names another application's SQLite database (a typo
// in store.path, a shared data directory) or a file that is not SQLite is
// refused with an error naming the path, and the file is left byte for
// byte as it was: no backstop tables, no switch to WAL mode.
func TestOpenRefusesAnotherApplicationsDatabase(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		fill   []string // statements run on a new SQLite file; nil: text
		reason string   // in the error
	}{
		{"tables of another application", []string{
			`CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)`,
			`INSERT INTO customers (name) VALUES ('Ann')`,
			`CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER)`,
		}, "customers, invoices"},
		{"another tool's schema_migrations", []string{
			`CREATE TABLE schema_migrations (version TEXT NOT NULL PRIMARY KEY)`,
			`INSERT INTO schema_migrations VALUES ('20240101120000')`,
			`CREATE TABLE users (id INTEGER PRIMARY KEY)`,
		}, "schema_migrations"},
		{"not SQLite", nil, "not an SQLite database"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "other.db")
			if tc.fill == nil {
				if err := os.WriteFile(path, bytes.Repeat([]byte("not a database, just some text\n"), 200), 0o600); err != nil {
					t.Fatal(err)
				}
			} else {
				w, err := sqlx.Open(driverName, path)
				if err != nil {
					t.Fatal(err)
				}
				for _, q := range tc.fill {
					if _, err := w.ExecContext(ctx, q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
			}
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			db, err := Open(ctx, path, Options{})
			if err == nil {
				db.Close()
				t.Fatal("Open succeeded; want it refused")
			}
			if !errors.Is(err, ErrNotStore) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Open error %q; want ErrNotStore naming %s and %q", err, path, tc.reason)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Errorf("the refused file was changed (%d bytes before, %d after)", len(before), len(after))
			}
		})
	}
	// An empty file is a new store.
	path := filepath.Join(t.TempDir(), "empty.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatalf("Open of an empty file: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// Processes that start on one new file at once all open it: none takes
// the schema another is creating for another application's.
func TestOpenNewFileFromManyAtOnce(t *testing.T) {
	for round := range 3 {
		path := filepath.Join(t.TempDir(), "n.db")
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				db, err := Open(context.Background(), path, Options{})
				errs[i] = err
				if err == nil {
					db.Close()
				}
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d opener %d: %v", round, i, err)
			}
		}
	}
}

// migrateTo applies to the store behind w (made by openAtVersion) the
// migrations up to version, as the binary of that version did.
func migrateTo(t *testing.T, w *sqlx.DB, version int) {
	t.Helper()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	old := &DB{w: w, now: time.Now}
	for _, m := range ms {
		if m.version <= version {
			if err := old.apply(context.Background(), m); err != nil {
				t.Fatalf("migration %s: %v", m.name, err)
			}
		}
	}
}

// tableRows reads every row of table in key order, each column's value as
// text (NULL as "<nil>").
func tableRows(t *testing.T, q sqlx.QueryerContext, table string) []map[string]string {
	t.Helper()
	order := "rowid"
	switch table {
	case "quota_samples":
		order = "key_id, at"
	case "intake_samples":
		order = "at"
	case "revoked_sessions":
		order = "id"
	case "reconcile_seen":
		order = "run_id, id"
	}
	rows, err := q.QueryxContext(context.Background(), `SELECT * FROM `+table+` ORDER BY `+order)
	if err != nil {
		t.Fatalf("read %s: %v", table, err)
	}
	defer rows.Close()
	var out []map[string]string
	for rows.Next() {
		m := map[string]any{}
		if err := rows.MapScan(m); err != nil {
			t.Fatal(err)
		}
		row := make(map[string]string, len(m))
		for k, v := range m {
			if b, ok := v.([]byte); ok {
				v = string(b)
			}
			row[k] = fmt.Sprint(v)
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A store made by the first schema version and used through every later
// one (each table filled when its migration made it, as that version's
// binary wrote it: mirror objects, cursors, processed events of every kind,
// outbox rows in every status and one the old webhook proxy queued,
// attempts, runs, samples, sessions) comes through the upgrade to the
// latest schema with every row and every value it held, except the
// changes the migrations document: the old proxy's row moves to its own
// key space (0009), a running --full reconcile's scratch ids go (0010),
// and the columns added get their documented values. The upgraded store
// then serves them: the queue is claimed, dead letters retried, the
// truncated event fetched.
func TestUpgradeFromFirstSchemaKeepsEveryRow(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "year-old.db")
	w := openAtVersion(t, path, 1)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := w.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	before := map[string][]map[string]string{}
	snap := func(tables ...string) {
		for _, tb := range tables {
			before[tb] = tableRows(t, w, tb)
		}
	}
	ts := func(s string) string { return backstop.CanonicalTime(mustTime(t, s)) }

	// Version 1: the mirror and the cursors.
	objects := map[backstop.Resource][]backstop.Object{
		backstop.Contacts: {
			obj(t, backstop.Contacts, "ct_1", "2025-01-02T03:04:05.123456Z", map[string]any{"name": "Zoë Łukasiewicz", "email": "z@example.com", "phone": "+48 600 000 000"}),
			obj(t, backstop.Contacts, "ct_2", "2025-01-02T03:04:05Z", map[string]any{"name": "Анна", "email": nil, "phone": "+7"}),
		},
		backstop.Chats: {
			obj(t, backstop.Chats, "chat_1", "2025-01-03T00:00:00Z", map[string]any{"contact_id": "ct_1", "channel": "telegram", "status": "opened"}),
		},
		backstop.Messages: {
			obj(t, backstop.Messages, "msg_1", "2025-01-03T00:00:01Z", map[string]any{"chat_id": "chat_1", "direction": "in", "text": "cześć 👋 \"quoted\" \\ back"}),
		},
		backstop.Payments: {
			obj(t, backstop.Payments, "pay_1", "2025-01-04T00:00:00Z", map[string]any{"contact_id": "ct_1", "amount": 1250, "currency": "PLN", "status": "succeeded"}),
			obj(t, backstop.Payments, "pay_2", "2025-01-04T00:00:00.5Z", map[string]any{"contact_id": "ct_2", "amount": 99, "currency": "EUR", "status": "refunded"}),
		},
	}
	for r, objs := range objects {
		for _, o := range objs {
			exec(`INSERT INTO `+string(r)+` (id, updated_at, data, synced_at) VALUES (?, ?, ?, ?)`,
				o.ID, backstop.CanonicalTime(o.UpdatedAt), string(o.Data), ts("2025-01-05T00:00:00Z"))
		}
	}
	exec(`INSERT INTO cursors (resource, kind, value, pos_updated_at, pos_id, done, updated_at) VALUES
		('contacts', 'sync', 'cur_c_42', ?, 'ct_2', 0, ?),
		('payments', 'backfill', 'cur_p_9', ?, 'pay_2', 1, ?)`,
		ts("2025-01-02T03:04:05Z"), ts("2025-01-05T00:00:00Z"), ts("2025-01-04T00:00:00.5Z"), ts("2025-01-05T00:00:01Z"))
	snap("contacts", "chats", "messages", "payments", "cursors")

	// Version 2: processed events and the outbox.
	migrateTo(t, w, 2)
	webhook := payment(t, "evt_wh_1", "pay_1", "2025-01-04T00:00:00Z")
	synced := event(t, "evt_bs_00ff", "contact.updated", backstop.OriginSync, backstop.Contacts, "ct_1", "2025-01-02T03:04:05.123456Z")
	unknown := backstop.Event{ID: "evt_wh_2", Type: "invoice.created", CreatedAt: mustTime(t, "2025-01-04T01:00:00Z"),
		Origin: backstop.OriginWebhook, Data: []byte(`{"id":"inv_1","total":5}`)}
	odd := payment(t, "evt_<&>\u2028", "pay_2", "2025-01-04T00:00:00.5Z") // escaped differently by encoding/json and json_quote
	for _, pe := range []struct {
		ev       backstop.Event
		dedup    any
		upd      any
		received string
	}{
		{webhook, webhook.DedupKey(), backstop.CanonicalTime(webhook.UpdatedAt), "2025-01-04T00:00:02Z"},
		{synced, synced.DedupKey(), backstop.CanonicalTime(synced.UpdatedAt), "2025-01-05T00:00:00Z"},
		{unknown, nil, nil, "2025-01-04T01:00:01Z"},
		{odd, odd.DedupKey(), backstop.CanonicalTime(odd.UpdatedAt), "2025-01-04T00:00:03Z"},
	} {
		exec(`INSERT INTO processed_events (event_id, dedup_key, type, resource, object_id, updated_at, origin, created_at, received_at, data)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, pe.ev.ID, pe.dedup, pe.ev.Type, string(pe.ev.Resource), pe.ev.ObjectID, pe.upd,
			string(pe.ev.Origin), backstop.CanonicalTime(pe.ev.CreatedAt), ts(pe.received), string(pe.ev.Data))
	}
	exec(`INSERT INTO processed_events (event_id, type, resource, object_id, origin, created_at, received_at, truncated,
			fetch_attempts, next_fetch_at, last_fetch_error, data)
		VALUES ('evt_wh_3', 'message.created', 'messages', 'msg_2', 'webhook', ?, ?, 1, 2, ?, 'GET /public/v1/messages/msg_2: 503', '{"id":"msg_2"}')`,
		ts("2025-01-06T00:00:00Z"), ts("2025-01-06T00:00:01Z"), ts("2025-01-06T00:10:00Z"))
	exec(`INSERT INTO processed_events (event_id, type, resource, object_id, updated_at, origin, created_at, received_at, duplicate_of, data)
		VALUES ('evt_wh_4', 'payment.succeeded', 'payments', 'pay_1', ?, 'webhook', ?, ?, 'evt_wh_1', '{"id":"pay_1"}')`,
		ts("2025-01-04T00:00:00Z"), ts("2025-01-04T00:00:00Z"), ts("2025-01-04T00:05:00Z"))
	outbox := []struct {
		target, status string
		ev             backstop.Event
		attempts       int
		lastStatus     any
		lastError      any
	}{
		{"billing", "pending", webhook, 0, nil, nil},
		{"audit", "retrying", webhook, 2, 503, "503 Service Unavailable"},
		{"crm", "delivered", synced, 1, 200, nil},
		{"audit", "dead_letter", unknown, 5, 500, "500 Internal Server Error"},
		{"billing", "delivered", odd, 1, 204, nil},
	}
	for i, o := range outbox {
		exec(`INSERT INTO outbox (target, event_id, event_type, payload, status, attempts, next_attempt_at, created_at, updated_at, last_status, last_error)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, o.target, o.ev.ID, o.ev.Type, string(envelope(o.ev)), o.status, o.attempts,
			ts("2025-01-07T00:00:00Z"), ts("2025-01-04T00:00:02Z"), ts(fmt.Sprintf("2025-01-04T00:0%d:00Z", i+1)), o.lastStatus, o.lastError)
	}
	// A payload the webhook proxy of that time queued under its caller's key.
	exec(`INSERT INTO outbox (target, event_id, event_type, payload, status, attempts, next_attempt_at, created_at, updated_at)
		VALUES ('billing', 'order-7731', 'proxy', '{"order":7731,"paid":true}', 'pending', 0, ?, ?, ?)`,
		ts("2025-01-07T00:00:00Z"), ts("2025-01-04T00:00:09Z"), ts("2025-01-04T00:00:09Z"))
	snap("processed_events", "outbox")

	// Version 3: reconcile runs; version 4: job runs.
	migrateTo(t, w, 4)
	exec(`INSERT INTO reconcile_runs (id, resource, started_at, finished_at, window_since, pages, scanned, missing, behind, reemitted, requests, duration_ms, status)
		VALUES (1, 'payments', ?, ?, ?, 3, 410, 2, 1, 3, 4, 5120, 'ok')`, ts("2025-01-05T01:00:00Z"), ts("2025-01-05T01:00:05Z"), ts("2025-01-05T00:00:00Z"))
	exec(`INSERT INTO reconcile_runs (id, resource, started_at, finished_at, status, error)
		VALUES (2, 'contacts', ?, ?, 'failed', 'GET /public/v1/contacts: 401')`, ts("2025-01-05T02:00:00Z"), ts("2025-01-05T02:00:01Z"))
	exec(`INSERT INTO reconcile_runs (id, resource, started_at, full) VALUES (3, 'chats', ?, 1)`, ts("2025-01-08T00:00:00Z"))
	exec(`INSERT INTO reconcile_seen (run_id, id) VALUES (3, 'chat_1'), (3, 'chat_9')`)
	exec(`INSERT INTO job_runs (id, job, kind, started_at, finished_at, status, pages, objects, new, updated, pruned, requests, rate_limited, error) VALUES
		(1, 'crm-nightly', 'sync', ?, ?, 'ok', 12, 2400, 30, 7, 0, 12, 1, NULL),
		(2, 'prune', 'maintenance', ?, ?, 'ok', 0, 0, 0, 0, 51234, 0, 0, NULL),
		(3, 'crm-nightly', 'sync', ?, ?, 'failed', 1, 200, 0, 0, 0, 3, 2, '429 Too Many Requests'),
		(4, 'payments-hourly', 'reconcile', ?, ?, 'skipped', 0, 0, 0, 0, 0, 0, 0, NULL)`,
		ts("2025-01-06T03:00:00Z"), ts("2025-01-06T03:01:00Z"), ts("2025-01-06T04:30:00Z"), ts("2025-01-06T04:30:02Z"),
		ts("2025-01-07T03:00:00Z"), ts("2025-01-07T03:00:10Z"), ts("2025-01-07T05:00:00Z"), ts("2025-01-07T05:00:00Z"))
	snap("reconcile_runs", "reconcile_seen", "job_runs")

	// Version 5: the delivery log and target state; 6: dashboard samples;
	// 8: revoked sessions.
	migrateTo(t, w, 8)
	exec(`INSERT INTO delivery_attempts (delivery_id, target, url, attempt, status_code, error, body, request_id, duration_ms, at) VALUES
		(2, 'audit', 'https://audit.example.com/in', 1, 503, '503 Service Unavailable', 'upstream down', 'req_1', 31.5, ?),
		(2, 'audit', 'https://audit.example.com/in', 2, 429, '', 'slow down', 'req_2', 2.25, ?),
		(3, 'crm', 'https://crm.example.com/hooks', 1, 200, '', 'ok', 'req_3', 80, ?),
		(4, 'audit', 'https://audit.example.com/in', 5, 500, '500 Internal Server Error', '', 'req_4', 12, ?),
		(4, 'audit', 'https://inspector.example.com/x', 1, 200, '', '', 'req_5', 9, ?)`,
		ts("2025-01-04T00:02:00Z"), ts("2025-01-04T00:03:00Z"), ts("2025-01-04T00:03:30Z"), ts("2025-01-04T00:04:00Z"), ts("2025-01-04T00:04:30Z"))
	exec(`UPDATE delivery_attempts SET redirect = 1 WHERE request_id = 'req_5'`)
	exec(`INSERT INTO target_state (name, paused_until, disabled, disabled_reason, disabled_at) VALUES
		('audit', ?, 0, '', NULL), ('legacy', NULL, 1, '410 Gone', ?)`, ts("2025-01-08T00:00:00Z"), ts("2025-01-06T00:00:00Z"))
	exec(`INSERT INTO quota_samples (key_id, at, quota_limit, remaining, reset_at, requests, rate_limited, throttle_wait_ms) VALUES
		('k_1a2b', ?, 2000, 1500, ?, 500, 1, 120.5)`, ts("2025-01-06T00:00:00Z"), ts("2025-01-06T00:01:00Z"))
	exec(`INSERT INTO intake_samples (at, duplicates, signature_failures) VALUES (?, 4, 1)`, ts("2025-01-06T00:00:00Z"))
	exec(`INSERT INTO revoked_sessions (id, expires_at) VALUES ('sess_1', ?)`, ts("2025-01-09T00:00:00Z"))
	// target_state's order by rowid is its insertion order.
	snap("delivery_attempts", "target_state", "quota_samples", "intake_samples", "revoked_sessions")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	clk := &clock{t: mustTime(t, "2025-01-08T12:00:00Z")}
	db, err := Open(ctx, path, Options{Now: clk.Now})
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	defer db.Close()

	added := map[string]map[string]bool{ // columns the migrations add
		"outbox":         {"proxy_key": true, "failures": true, "claimed_until": true},
		"reconcile_runs": {"heartbeat_at": true, "owner": true},
		"job_runs":       {"heartbeat_at": true, "output": true, "owner": true, "orphans": true},
		"cursors":        {"started_at": true},
	}
	for table, old := range before {
		now := tableRows(t, db.r, table)
		want := old
		switch table {
		case "reconcile_seen":
			want = nil // 0010: a running --full run's scratch ids
		case "outbox":
			want = nil
			for _, row := range old {
				r := maps.Clone(row)
				if r["event_id"] == "order-7731" { // 0009
					r["event_id"] = proxyPrefix + "order-7731"
				}
				want = append(want, r)
			}
		}
		if len(now) != len(want) {
			t.Errorf("%s: %d rows after the upgrade, want %d", table, len(now), len(want))
			continue
		}
		for i := range want {
			for col, v := range want[i] {
				if now[i][col] != v {
					t.Errorf("%s row %d: %s = %q after the upgrade, was %q", table, i+1, col, now[i][col], v)
				}
			}
			for col := range now[i] {
				if _, ok := want[i][col]; !ok && !added[table][col] {
					t.Errorf("%s: column %s is not in the old schema nor added by a migration", table, col)
				}
			}
		}
	}
	// The added columns hold their documented values.
	var failures []int
	if err := db.r.SelectContext(ctx, &failures, `SELECT failures FROM outbox ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 1, 0, 5, 0, 0}; !slices.Equal(failures, want) {
		t.Errorf("outbox failures after the upgrade %v, want %v (attempts less logged 429s; delivered 0)", failures, want)
	}
	var keys []sql.NullString
	if err := db.r.SelectContext(ctx, &keys, `SELECT proxy_key FROM outbox ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if proxied := i == 5; k.Valid != proxied || (proxied && k.String != "order-7731") {
			t.Errorf("outbox row %d: proxy_key %v; want %v", i+1, k, proxied)
		}
	}
	var owners []sql.NullString
	if err := db.r.SelectContext(ctx, &owners, `SELECT owner FROM reconcile_runs ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	for i, o := range owners {
		if o.Valid {
			t.Errorf("reconcile run %d: owner %q after the upgrade, want NULL (a run of an older binary)", i+1, o.String)
		}
	}
	var beats []string
	if err := db.r.SelectContext(ctx, &beats, `SELECT heartbeat_at FROM job_runs ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	for i, b := range beats {
		if b != before["job_runs"][i]["finished_at"] {
			t.Errorf("job run %d: heartbeat %s, want its end %s", i+1, b, before["job_runs"][i]["finished_at"])
		}
	}
	var outputs int
	if err := db.r.GetContext(ctx, &outputs, `SELECT count(*) FROM job_runs WHERE output IS NOT NULL`); err != nil || outputs != 0 {
		t.Errorf("job runs with an output after the upgrade: %d (%v), want none (0016: NULL for the runs before)", outputs, err)
	}
	var starts int
	if err := db.r.GetContext(ctx, &starts, `SELECT count(*) FROM cursors WHERE started_at IS NOT NULL`); err != nil || starts != 0 {
		t.Errorf("cursors with a start after the upgrade: %d (%v), want none (0018: NULL, unknown, for the cursors before)", starts, err)
	}

	// The upgraded store carries on where the old binary stopped.
	for r, objs := range objects {
		for _, o := range objs {
			if got := mirrored(t, db, r, o.ID); !bytes.Equal(got.Data, o.Data) || !got.UpdatedAt.Equal(o.UpdatedAt) {
				t.Errorf("%s %s after the upgrade: %s at %v", r, o.ID, got.Data, got.UpdatedAt)
			}
		}
	}
	if cur, ok, err := db.Cursor(ctx, backstop.Payments, backstop.CursorBackfill); err != nil || !ok || cur.Value != "cur_p_9" || !cur.Done {
		t.Errorf("payments backfill checkpoint after the upgrade: %+v, %v, %v", cur, ok, err)
	}
	// A repeat of each processed event is still a duplicate.
	if got := emit(t, db, testRoutes, webhook, synced, unknown, odd); !slices.Equal(got, []backstop.EmitResult{duplicate, duplicate, duplicate, duplicate}) {
		t.Errorf("repeats of the processed events after the upgrade: %+v; want 4 duplicates", got)
	}
	claimed := claimIDs(t, db, "billing", clk.Now(), 10, time.Minute)
	if !sameIDs(claimed, []int64{1, 6}) {
		t.Errorf("billing claims %v after the upgrade, want its pending event and the proxied payload [1 6]", claimed)
	}
	if n, err := db.RetryDead(ctx, "audit", clk.Now()); err != nil || n != 1 {
		t.Errorf("RetryDead(audit) = %d, %v after the upgrade; want 1", n, err)
	}
	if due, err := db.DueTruncated(ctx, clk.Now(), 10); err != nil || len(due) != 1 || due[0].ID != "evt_wh_3" {
		t.Errorf("truncated events due after the upgrade: %+v, %v", due, err)
	}
	if runs, err := db.JobRuns(ctx, "crm-nightly", 0); err != nil || len(runs) != 2 || runs[0].Status != "failed" || runs[1].Counts.Objects != 2400 {
		t.Errorf("crm-nightly runs after the upgrade: %+v, %v", runs, err)
	}
}

// A backfill run with --emit and interrupted is still known to have
// emitted after maintenance has pruned the events older than the
// retention: its guard (CheckpointEmitted) looks for its events, and
// without one the guard took it for a silent first fill, so resuming it
// weeks later without --emit was allowed (the rest of the resource written
// to the mirror without events) and the nightly sync beside it was refused
// as if the fill were silent. One backfill event of the resource is
// kept while its checkpoint is unfinished; every other old event goes,
// and that one goes too once the backfill has finished.
func TestPruneKeepsWhatTellsAnUnfinishedBackfillEmitted(t *testing.T) {
	ctx := context.Background()
	db, clk := openTest(t)
	routes := []backstop.Route{{Target: "crm", Events: []string{"contact.*"}}}
	r := backstop.Contacts
	ev := func(id string, at time.Time, origin backstop.Origin) backstop.Event {
		return backstop.Event{ID: backstop.EventID(backstop.DedupKey(r, id, at)), Type: "contact.created",
			Resource: r, ObjectID: id, UpdatedAt: at, Origin: origin, Data: obj(t, r, id, at.Format(time.RFC3339Nano), nil).Data}
	}
	// Two pages of the backfill with --emit, then it is stopped.
	var chk backstop.Cursor
	for page := range 2 {
		var evs []backstop.Event
		for i := range 3 {
			evs = append(evs, ev(fmt.Sprintf("ct_%d_%d", page, i), t0.Add(time.Duration(page*3+i)*time.Second), backstop.OriginBackfill))
		}
		last := evs[len(evs)-1]
		chk = cursorAt(r, backstop.CursorBackfill, fmt.Sprintf("page-%d", page+1), backstop.Position{UpdatedAt: last.UpdatedAt, ID: last.ObjectID})
		if _, err := db.EmitPage(ctx, evs, routes, chk); err != nil {
			t.Fatal(err)
		}
		clk.Set(clk.Now().Add(time.Minute))
	}
	// Webhooks of other payments, a day later.
	clk.Set(t0.Add(24 * time.Hour))
	emit(t, db, testRoutes, payment(t, "evt_pay_old", "pay_1", "2024-05-02T10:00:00Z"))
	// Five weeks on, a webhook of today, and the maintenance job.
	clk.Set(t0.Add(35 * 24 * time.Hour))
	emit(t, db, testRoutes, payment(t, "evt_pay_new", "pay_2", "2024-06-05T10:00:00Z"))
	if emitted, err := db.CheckpointEmitted(ctx, chk); err != nil || !emitted {
		t.Fatalf("before pruning: CheckpointEmitted = %v, %v; want true", emitted, err)
	}
	n, err := db.PruneProcessed(ctx, clk.Now().Add(-30*24*time.Hour))
	if err != nil || n != 6 {
		t.Errorf("PruneProcessed = %d, %v; want 6 (five of the backfill's events and the old payment)", n, err)
	}
	if emitted, err := db.CheckpointEmitted(ctx, chk); err != nil || !emitted {
		t.Errorf("after pruning: CheckpointEmitted = %v, %v; want true: the interrupted backfill emitted", emitted, err)
	}
	if c := countProcessed(t, db); c != 2 {
		t.Errorf("%d processed events kept, want 2 (one of the backfill and today's payment)", c)
	}
	if n, err := db.PruneProcessed(ctx, clk.Now().Add(-30*24*time.Hour)); err != nil || n != 0 {
		t.Errorf("PruneProcessed again = %d, %v; want 0", n, err)
	}
	// The backfill resumes and finishes: the kept event goes with the next
	// maintenance run.
	done := cursorAt(r, backstop.CursorBackfill, "page-3", chk.Position)
	done.Done = true
	if _, err := db.EmitPage(ctx, nil, routes, done); err != nil {
		t.Fatal(err)
	}
	if n, err := db.PruneProcessed(ctx, clk.Now().Add(-30*24*time.Hour)); err != nil || n != 1 {
		t.Errorf("PruneProcessed after the backfill finished = %d, %v; want 1", n, err)
	}
	if c := countProcessed(t, db); c != 1 {
		t.Errorf("%d processed events kept, want 1 (today's payment)", c)
	}
}

// openHelperEnv names the store TestOpenHelperProcess opens, in a process
// of its own that a test kills.
const openHelperEnv = "BACKSTOP_AUDIT_OPEN_STORE"

// TestOpenHelperProcess is not a test: run by TestMigrationKilledMidwayIsRerun
// in a process of its own, it opens the store named by openHelperEnv.
func TestOpenHelperProcess(t *testing.T) {
	path := os.Getenv(openHelperEnv)
	if path == "" {
		t.Skip("helper process only")
	}
	db, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
}

// A process killed (SIGKILL: an OOM kill, a failed startup probe) in the
// middle of the upgrade of a big store leaves it as it was before the
// migration in progress, and the next start finishes the upgrade with
// every row there.
func TestMigrationKilledMidwayIsRerun(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a store big enough to kill its upgrade midway")
	}
	ctx := context.Background()
	const rows = 12000
	build := func(path string) {
		w := openAtVersion(t, path, 8)
		defer w.Close()
		// Half the rows look like the old proxy's (0009 moves them), a
		// third failed at least once (0011 counts their failures).
		for _, q := range []string{
			`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ` + fmt.Sprint(rows) + `)
			INSERT INTO outbox (target, event_id, event_type, payload, status, attempts, next_attempt_at, created_at, updated_at)
			SELECT 'billing', 'evt_' || i, 'payment.succeeded',
				CASE WHEN i % 2 = 0 THEN '{"event_id":"evt_' || i || '","event":"payment.succeeded","created_at":"2025-01-01T00:00:00Z","origin":"webhook","data":{"id":"pay_' || i || '","pad":"' || hex(randomblob(60)) || '"}}'
				ELSE '{"order":' || i || ',"pad":"' || hex(randomblob(60)) || '"}' END,
				CASE i % 3 WHEN 0 THEN 'retrying' WHEN 1 THEN 'delivered' ELSE 'pending' END,
				CASE i % 3 WHEN 0 THEN 2 WHEN 1 THEN 1 ELSE 0 END,
				'2025-01-01T00:00:00.000000000Z', '2025-01-01T00:00:00.000000000Z', '2025-01-01T00:00:00.000000000Z'
			FROM n`,
			`INSERT INTO delivery_attempts (delivery_id, target, url, attempt, status_code, at)
			SELECT id, target, 'https://billing.example.com/', 1, 429, '2025-01-01T00:00:00.000000000Z' FROM outbox WHERE status = 'retrying'`,
		} {
			if _, err := w.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	sum := func(q sqlx.QueryerContext) string {
		t.Helper()
		var s string
		if err := sqlx.GetContext(ctx, q, &s, `SELECT count(*) || ' ' || total(id) || ' ' || total(length(payload)) || ' ' || total(attempts) ||
			' ' || (SELECT count(*) FROM delivery_attempts) FROM outbox`); err != nil {
			t.Fatal(err)
		}
		return s
	}

	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	newest := ms[len(ms)-1].version
	for try := 1; ; try++ {
		path := filepath.Join(t.TempDir(), "big.db")
		build(path)
		raw, err := sqlx.Open(driverName, path+"?_pragma=busy_timeout(10000)")
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		want := sum(raw)

		cmd := exec.Command(os.Args[0], "-test.run=^TestOpenHelperProcess$")
		cmd.Env = append(os.Environ(), openHelperEnv+"="+path)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The WAL grows only while the upgrade writes (0001-0008 ran):
		// kill it once it has written some.
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if fi, err := os.Stat(path + "-wal"); err == nil && fi.Size() > 64<<10 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		cmd.Process.Kill()
		cmd.Wait()

		var version int
		if err := raw.GetContext(ctx, &version, `SELECT max(version) FROM schema_migrations`); err != nil {
			t.Fatal(err)
		}
		if version >= newest {
			if try < 10 {
				t.Logf("try %d: the upgrade finished before it was killed; again", try)
				continue
			}
			// Failed, not skipped: a green run must have tested the kill.
			t.Fatal("the upgrade finished before it could be killed, ten times")
		}
		if got := sum(raw); got != want {
			t.Errorf("killed at schema %d: outbox %s, want %s as before the upgrade", version, got, want)
		}
		raw.Close()

		db, err := Open(ctx, path, Options{})
		if err != nil {
			t.Fatalf("the start after the kill (schema %d): %v", version, err)
		}
		defer db.Close()
		if got := sum(db.r); got != want {
			t.Errorf("after the upgrade: outbox %s, want %s", got, want)
		}
		var latest, moved, failed int
		if err := db.r.GetContext(ctx, &latest, `SELECT max(version) FROM schema_migrations`); err != nil || latest != newest {
			t.Errorf("schema %d after the upgrade (%v), want %d", latest, err, newest)
		}
		if err := db.r.GetContext(ctx, &moved, `SELECT count(*) FROM outbox WHERE proxy_key IS NOT NULL`); err != nil || moved != rows/2 {
			t.Errorf("%d proxied rows moved (%v), want %d", moved, err, rows/2)
		}
		if err := db.r.GetContext(ctx, &failed, `SELECT count(*) FROM outbox WHERE failures = 1`); err != nil || failed != rows/3 {
			t.Errorf("%d rows with one failure (%v), want %d (two attempts, one a 429)", failed, err, rows/3)
		}
		t.Logf("killed at schema %d on try %d", version, try)
		return
	}
}

// A store a newer binary upgraded (a rollback of the deploy, a cron job
// left on the old binary) is refused with both schema versions named, and
// nothing in it is written.
func TestOpenRefusesANewerSchemaAndWritesNothing(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "newer.db")
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	latest := ms[len(ms)-1].version
	if _, err := db.w.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
		latest+1, fmt.Sprintf("%04d_future.sql", latest+1), backstop.CanonicalTime(t0)); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	db, err = Open(ctx, path, Options{})
	if err == nil {
		db.Close()
		t.Fatal("Open of a newer schema succeeded")
	}
	for _, want := range []string{path, fmt.Sprint(latest + 1), fmt.Sprint(latest)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("the refused store was written")
	}
}

// An up-to-date store opens while another process holds its write lock
// for longer than the busy timeout (a VACUUM, a sqlite3 shell in a write
// transaction, another process's long migration): opening only reads
// unless a migration is missing, so `backstop jobs` or `deliveries list`
// work beside it instead of failing with "migration 0001_mirror.sql:
// database is locked".
func TestOpenUpToDateStoreBesideAWriter(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "busy.db")
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := obj(t, backstop.Contacts, "ct_1", "2024-05-01T10:00:00Z", map[string]any{"name": "Ann"})
	if _, err := db.ApplyPage(ctx, []backstop.Object{o}, cursorAt(backstop.Contacts, backstop.CursorSync, "c1", o.Position())); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	other, err := sqlx.Open(driverName, path+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE contacts SET synced_at = synced_at`); err != nil {
		t.Fatal(err)
	}

	db, err = Open(ctx, path, Options{BusyTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("Open beside a writer: %v", err)
	}
	defer db.Close()
	if got := mirrored(t, db, backstop.Contacts, "ct_1"); !bytes.Equal(got.Data, o.Data) {
		t.Errorf("contact read beside a writer: %s", got.Data)
	}
}

// A store in a directory this user cannot write to (SQLite creates the
// -wal and -shm files beside the database) fails to open with SQLite's
// bare "unable to open database file" unless the error says what to
// check: it names the directory and the files SQLite must create.
func TestOpenInADirectoryThatCannotBeWritten(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "backstop.db")
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o755) })
	if f, err := os.Create(filepath.Join(dir, "probe")); err == nil {
		// Permissions do not bind this user (root): the WAL's name is
		// taken by a directory instead, which SQLite cannot open either.
		f.Close()
		os.Chmod(dir, 0o755)
		if err := os.Mkdir(path+"-wal", 0o755); err != nil {
			t.Fatal(err)
		}
	}
	db, err = Open(ctx, path, Options{})
	if err == nil {
		db.Close()
		t.Fatal("Open succeeded")
	}
	for _, want := range []string{path, "backstop.db-wal", "backstop.db-shm", "directory " + dir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}
