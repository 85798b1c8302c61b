package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

// clock is a fixed, settable time source for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

var t0 = time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)

// openTest opens a store in a fresh temporary directory, closed at cleanup.
func openTest(t testing.TB) (*DB, *clock) {
	t.Helper()
	clk := &clock{t: t0}
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "backstop.db"), Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db, clk
}

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	tm, err := backstop.ParseTime(s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// obj builds an object of r whose JSON carries id, created_at, updated_at
// (as given, not canonicalised) and the extra fields.
func obj(t testing.TB, r backstop.Resource, id, updatedAt string, extra map[string]any) backstop.Object {
	t.Helper()
	m := map[string]any{"id": id, "created_at": "2024-01-01T00:00:00Z", "updated_at": updatedAt}
	for k, v := range extra {
		m[k] = v
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	o, err := backstop.DecodeObject(r, data)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func cursorAt(r backstop.Resource, kind backstop.CursorKind, value string, pos backstop.Position) backstop.Cursor {
	return backstop.Cursor{Resource: r, Kind: kind, Value: value, Position: pos}
}

// snapshot is everything the mirror and cursors hold, for before/after checks.
type snapshot struct {
	objects map[backstop.Resource][]backstop.Object
	cursors []backstop.Cursor
}

func takeSnapshot(t *testing.T, db *DB) snapshot {
	t.Helper()
	ctx := context.Background()
	s := snapshot{objects: make(map[backstop.Resource][]backstop.Object)}
	for _, r := range backstop.Resources {
		objs, err := db.Objects(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		s.objects[r] = objs
	}
	var err error
	if s.cursors, err = db.Cursors(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func sameObjects(a, b []backstop.Object) bool {
	return slices.EqualFunc(a, b, func(x, y backstop.Object) bool {
		return x.Resource == y.Resource && x.ID == y.ID && x.UpdatedAt.Equal(y.UpdatedAt) && bytes.Equal(x.Data, y.Data)
	})
}

func sameCursor(a, b backstop.Cursor) bool {
	return a.Resource == b.Resource && a.Kind == b.Kind && a.Value == b.Value &&
		a.Position.Compare(b.Position) == 0 && a.Done == b.Done && a.UpdatedAt.Equal(b.UpdatedAt)
}

func assertUnchanged(t *testing.T, before, after snapshot) {
	t.Helper()
	for _, r := range backstop.Resources {
		if !sameObjects(before.objects[r], after.objects[r]) {
			t.Errorf("%s changed:\nbefore %d objects\nafter  %d objects", r, len(before.objects[r]), len(after.objects[r]))
		}
	}
	if !slices.EqualFunc(before.cursors, after.cursors, sameCursor) {
		t.Errorf("cursors changed:\nbefore %+v\nafter  %+v", before.cursors, after.cursors)
	}
}

func TestOpenMigratesOnceAndReopens(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if db.Path() != path {
		t.Errorf("Path() = %q, want %q", db.Path(), path)
	}
	o := obj(t, backstop.Contacts, "ct_1", "2024-05-01T10:00:00Z", map[string]any{"name": "Ann", "email": "a@x", "phone": "+1"})
	if _, err := db.ApplyPage(ctx, []backstop.Object{o}, cursorAt(backstop.Contacts, backstop.CursorSync, "c1", o.Position())); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // reopening twice applies nothing again
		db, err = Open(ctx, path, Options{Synchronous: "full"})
		if err != nil {
			t.Fatalf("reopen %d: %v", i, err)
		}
		var n, latest int
		if err := db.r.GetContext(ctx, &n, `SELECT count(*) FROM schema_migrations`); err != nil {
			t.Fatal(err)
		}
		if err := db.r.GetContext(ctx, &latest, `SELECT max(version) FROM schema_migrations`); err != nil {
			t.Fatal(err)
		}
		if n != len(ms) || latest != ms[len(ms)-1].version {
			t.Errorf("reopen %d: %d migrations recorded up to %d, want %d up to %d", i, n, latest, len(ms), ms[len(ms)-1].version)
		}
		if got, ok, err := db.Get(ctx, backstop.Contacts, "ct_1"); err != nil || !ok || !bytes.Equal(got.Data, o.Data) {
			t.Errorf("reopen %d: Get = %s, %v, %v; want the stored contact", i, got.Data, ok, err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenPragmasAndGeneratedColumns(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "p.db"), Options{Synchronous: "FULL", BusyTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	for _, tc := range []struct {
		pragma string
		want   string
	}{
		{"journal_mode", "wal"},
		{"foreign_keys", "1"},
		{"synchronous", "2"}, // FULL
		{"busy_timeout", "3000"},
		{"query_only", "0"},
		{"temp_store", "2"}, // MEMORY: statement journals never spill to a file
	} {
		var got string
		if err := db.w.GetContext(ctx, &got, "PRAGMA "+tc.pragma); err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("writer PRAGMA %s = %s, want %s", tc.pragma, got, tc.want)
		}
	}
	var qo int
	if err := db.r.GetContext(ctx, &qo, "PRAGMA query_only"); err != nil {
		t.Fatal(err)
	}
	if qo != 1 {
		t.Errorf("reader PRAGMA query_only = %d, want 1", qo)
	}
	if _, err := db.r.ExecContext(ctx, `DELETE FROM contacts`); err == nil {
		t.Error("a write through the reader pool succeeded; want it refused")
	}

	page := []backstop.Object{
		obj(t, backstop.Contacts, "ct_1", "2024-05-01T10:00:00Z", map[string]any{"name": "Zoë", "email": "z@x", "phone": "+48"}),
		obj(t, backstop.Chats, "chat_1", "2024-05-01T10:00:00Z", map[string]any{"contact_id": "ct_1", "channel": "telegram", "status": "opened"}),
		obj(t, backstop.Messages, "msg_1", "2024-05-01T10:00:00Z", map[string]any{"chat_id": "chat_1", "direction": "in", "text": "hi"}),
		obj(t, backstop.Payments, "pay_1", "2024-05-01T10:00:00Z", map[string]any{"contact_id": "ct_1", "amount": 1250, "currency": "PLN", "status": "succeeded"}),
	}
	if _, err := db.ApplyPage(ctx, page, cursorAt(backstop.Payments, backstop.CursorSync, "x", backstop.Position{})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		query string
		want  string
	}{
		{`SELECT name || '|' || email || '|' || phone || '|' || created_at FROM contacts`, "Zoë|z@x|+48|2024-01-01T00:00:00Z"},
		{`SELECT contact_id || '|' || channel || '|' || status FROM chats`, "ct_1|telegram|opened"},
		{`SELECT chat_id || '|' || direction FROM messages`, "chat_1|in"},
		{`SELECT contact_id || '|' || (amount + 1) || '|' || typeof(amount) || '|' || currency || '|' || status FROM payments`, "ct_1|1251|integer|PLN|succeeded"},
	} {
		var got string
		if err := db.r.GetContext(ctx, &got, tc.query); err != nil {
			t.Fatalf("%s: %v", tc.query, err)
		}
		if got != tc.want {
			t.Errorf("%s = %q, want %q", tc.query, got, tc.want)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	missing := filepath.Join(dir, "no", "such", "dir", "x.db")
	for _, tc := range []struct {
		name string
		path string
		opts Options
	}{
		{"missing directory", missing, Options{}},
		{"bad synchronous", filepath.Join(dir, "a.db"), Options{Synchronous: "SOMETIMES"}},
		{"query in path", filepath.Join(dir, "a.db?mode=ro"), Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := Open(ctx, tc.path, tc.opts)
			if err == nil {
				db.Close()
				t.Fatal("Open succeeded, want an error")
			}
			if !strings.Contains(err.Error(), tc.path) {
				t.Errorf("error %q does not name the path %q", err, tc.path)
			}
		})
	}
}

func TestApplyPageCounts(t *testing.T) {
	ctx := context.Background()
	db, clk := openTest(t)
	r := backstop.Messages

	steps := []struct {
		name string
		page []backstop.Object
		want backstop.ApplyResult
	}{
		{"all new", []backstop.Object{
			obj(t, r, "msg_1", "2024-05-01T10:00:00Z", nil),
			obj(t, r, "msg_2", "2024-05-01T10:00:01Z", nil),
			obj(t, r, "msg_3", "2024-05-01T10:00:02Z", nil),
		}, backstop.ApplyResult{New: 3}},
		{"mixed", []backstop.Object{
			obj(t, r, "msg_1", "2024-05-01T10:00:00Z", map[string]any{"text": "same version"}), // equal: unchanged
			obj(t, r, "msg_2", "2024-05-01T11:00:00Z", map[string]any{"text": "edited"}),       // newer: updated
			obj(t, r, "msg_3", "2024-05-01T09:00:00Z", map[string]any{"text": "stale"}),        // older: unchanged
			obj(t, r, "msg_4", "2024-05-01T12:00:00Z", nil),                                    // new
		}, backstop.ApplyResult{New: 1, Updated: 1, Unchanged: 2}},
		{"same id twice in a page", []backstop.Object{
			obj(t, r, "msg_5", "2024-05-01T10:00:00Z", map[string]any{"v": 1}),
			obj(t, r, "msg_5", "2024-05-01T10:00:02Z", map[string]any{"v": 3}),
			obj(t, r, "msg_5", "2024-05-01T10:00:01Z", map[string]any{"v": 2}),
		}, backstop.ApplyResult{New: 1, Updated: 1, Unchanged: 1}},
		{"empty page", nil, backstop.ApplyResult{}},
	}
	for i, st := range steps {
		clk.Set(t0.Add(time.Duration(i) * time.Minute))
		pos := backstop.Position{UpdatedAt: t0.Add(time.Duration(i) * time.Hour), ID: fmt.Sprintf("msg_%d", i)}
		cur := backstop.Cursor{Resource: r, Kind: backstop.CursorSync, Value: st.name, Position: pos, Done: i%2 == 1}
		got, err := db.ApplyPage(ctx, st.page, cur)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got != st.want {
			t.Errorf("%s: ApplyPage = %+v, want %+v", st.name, got, st.want)
		}
		saved, ok, err := db.Cursor(ctx, r, backstop.CursorSync)
		if err != nil || !ok {
			t.Fatalf("%s: Cursor = %v, %v", st.name, ok, err)
		}
		cur.UpdatedAt = clk.Now()
		if !sameCursor(saved, cur) {
			t.Errorf("%s: saved cursor %+v, want %+v", st.name, saved, cur)
		}
	}

	want := map[string]string{
		"msg_1": `"updated_at":"2024-05-01T10:00:00Z"}`,
		"msg_2": `"text":"edited"`,
		"msg_3": `"updated_at":"2024-05-01T10:00:02Z"}`,
		"msg_4": `"updated_at":"2024-05-01T12:00:00Z"`,
		"msg_5": `"v":3`,
	}
	if n, err := db.Count(ctx, r); err != nil || n != len(want) {
		t.Errorf("Count = %d, %v; want %d", n, err, len(want))
	}
	for id, frag := range want {
		o, ok, err := db.Get(ctx, r, id)
		if err != nil || !ok {
			t.Fatalf("Get %s = %v, %v", id, ok, err)
		}
		if !strings.Contains(string(o.Data), frag) {
			t.Errorf("%s: data %s, want it to contain %s", id, o.Data, frag)
		}
	}
	if _, ok, err := db.Get(ctx, r, "msg_missing"); err != nil || ok {
		t.Errorf("Get missing = %v, %v; want false, nil", ok, err)
	}
}

func TestMirrorNeverGoesBackInTime(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	r := backstop.Payments
	cur := cursorAt(r, backstop.CursorSync, "c", backstop.Position{})

	v2 := obj(t, r, "pay_1", "2024-05-01T10:00:00.5Z", map[string]any{"status": "succeeded"})
	if _, err := db.ApplyPage(ctx, []backstop.Object{v2}, cur); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		o    backstop.Object
	}{
		{"older", obj(t, r, "pay_1", "2024-05-01T10:00:00Z", map[string]any{"status": "pending"})},
		{"older, more fraction digits", obj(t, r, "pay_1", "2024-05-01T10:00:00.499999999Z", map[string]any{"status": "pending"})},
		{"older, other offset", obj(t, r, "pay_1", "2024-05-01T12:00:00.4+02:00", map[string]any{"status": "pending"})},
		{"equal, other form", obj(t, r, "pay_1", "2024-05-01T10:00:00.500000Z", map[string]any{"status": "refunded"})},
		{"equal, other offset", obj(t, r, "pay_1", "2024-05-01T13:00:00.5+03:00", map[string]any{"status": "refunded"})},
	} {
		res, err := db.ApplyPage(ctx, []backstop.Object{tc.o}, cur)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if res != (backstop.ApplyResult{Unchanged: 1}) {
			t.Errorf("%s: ApplyPage = %+v, want 1 unchanged", tc.name, res)
		}
		got, _, err := db.Get(ctx, r, "pay_1")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Data, v2.Data) || !got.UpdatedAt.Equal(v2.UpdatedAt) {
			t.Errorf("%s: stored %s, want %s", tc.name, got.Data, v2.Data)
		}
	}

	// InsertBatch is the raw ceiling: it does go back in time, which is why
	// the mirror is kept through ApplyPage only.
	v3 := obj(t, r, "pay_1", "2024-05-01T10:00:01Z", map[string]any{"status": "refunded"})
	if res, err := db.ApplyPage(ctx, []backstop.Object{v3}, cur); err != nil || res != (backstop.ApplyResult{Updated: 1}) {
		t.Fatalf("newer version: %+v, %v; want 1 updated", res, err)
	}
	got, _, _ := db.Get(ctx, r, "pay_1")
	if !bytes.Equal(got.Data, v3.Data) {
		t.Errorf("stored %s, want %s", got.Data, v3.Data)
	}
}

func TestApplyPageIsAtomic(t *testing.T) {
	ctx := context.Background()
	r := backstop.Contacts

	// seed gives each case a mirror with one contact and a saved cursor.
	seed := func(t *testing.T) *DB {
		db, _ := openTest(t)
		o := obj(t, r, "ct_1", "2024-05-01T10:00:00Z", map[string]any{"name": "old"})
		if _, err := db.ApplyPage(ctx, []backstop.Object{o}, cursorAt(r, backstop.CursorSync, "c1", o.Position())); err != nil {
			t.Fatal(err)
		}
		return db
	}
	page := func(t *testing.T, mid backstop.Object) []backstop.Object {
		return []backstop.Object{
			obj(t, r, "ct_1", "2024-05-01T11:00:00Z", map[string]any{"name": "new"}),
			obj(t, r, "ct_2", "2024-05-01T11:00:01Z", nil),
			mid,
			obj(t, r, "ct_3", "2024-05-01T11:00:02Z", nil),
		}
	}
	next := cursorAt(r, backstop.CursorSync, "c2", backstop.Position{UpdatedAt: mustTime(t, "2024-05-01T11:00:02Z"), ID: "ct_3"})

	t.Run("unknown resource mid-page", func(t *testing.T) {
		db := seed(t)
		before := takeSnapshot(t, db)
		bad := obj(t, r, "w_1", "2024-05-01T11:00:00Z", nil)
		bad.Resource = "widgets"
		_, err := db.ApplyPage(ctx, page(t, bad), next)
		if err == nil || !strings.Contains(err.Error(), "widgets") {
			t.Fatalf("ApplyPage error = %v, want one naming the unknown resource", err)
		}
		assertUnchanged(t, before, takeSnapshot(t, db))
	})

	t.Run("object without id mid-page", func(t *testing.T) {
		db := seed(t)
		before := takeSnapshot(t, db)
		bad := obj(t, r, "ct_x", "2024-05-01T11:00:00Z", nil)
		bad.ID = ""
		if _, err := db.ApplyPage(ctx, page(t, bad), next); err == nil {
			t.Fatal("ApplyPage succeeded, want an error")
		}
		assertUnchanged(t, before, takeSnapshot(t, db))
	})

	t.Run("cursor save fails after the objects are written", func(t *testing.T) {
		db := seed(t)
		before := takeSnapshot(t, db)
		if _, err := db.w.ExecContext(ctx, `CREATE TRIGGER fail_cursor BEFORE UPDATE ON cursors
			BEGIN SELECT RAISE(ABORT, 'cursor write refused'); END`); err != nil {
			t.Fatal(err)
		}
		good := obj(t, r, "ct_4", "2024-05-01T11:00:01.5Z", nil)
		_, err := db.ApplyPage(ctx, page(t, good), next)
		if err == nil || !strings.Contains(err.Error(), "cursor write refused") {
			t.Fatalf("ApplyPage error = %v, want the trigger's", err)
		}
		assertUnchanged(t, before, takeSnapshot(t, db))
	})

	t.Run("cancelled context", func(t *testing.T) {
		db := seed(t)
		before := takeSnapshot(t, db)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		good := obj(t, r, "ct_4", "2024-05-01T11:00:01.5Z", nil)
		if _, err := db.ApplyPage(cctx, page(t, good), next); !errors.Is(err, context.Canceled) {
			t.Fatalf("ApplyPage error = %v, want context.Canceled", err)
		}
		assertUnchanged(t, before, takeSnapshot(t, db))
	})

	t.Run("invalid cursor kind", func(t *testing.T) {
		db := seed(t)
		before := takeSnapshot(t, db)
		bad := next
		bad.Kind = "sideways"
		good := obj(t, r, "ct_4", "2024-05-01T11:00:01.5Z", nil)
		if _, err := db.ApplyPage(ctx, page(t, good), bad); err == nil {
			t.Fatal("ApplyPage succeeded, want an error")
		}
		assertUnchanged(t, before, takeSnapshot(t, db))
	})

	t.Run("the same page succeeds on a healthy store", func(t *testing.T) {
		db := seed(t)
		good := obj(t, r, "ct_4", "2024-05-01T11:00:01.5Z", nil)
		res, err := db.ApplyPage(ctx, page(t, good), next)
		if err != nil {
			t.Fatal(err)
		}
		if res != (backstop.ApplyResult{New: 3, Updated: 1}) {
			t.Errorf("ApplyPage = %+v, want 3 new, 1 updated", res)
		}
		c, _, err := db.Cursor(ctx, r, backstop.CursorSync)
		if err != nil || c.Value != "c2" {
			t.Errorf("cursor %+v, %v; want value c2", c, err)
		}
	})
}

func TestAdvanceCursorOnlyForward(t *testing.T) {
	ctx := context.Background()
	db, clk := openTest(t)
	r := backstop.Chats
	at := func(ts, id string) backstop.Position { return backstop.Position{UpdatedAt: mustTime(t, ts), ID: id} }

	steps := []struct {
		name  string
		value string
		pos   backstop.Position
		saved bool
	}{
		{"first save at the zero position", "z", backstop.Position{}, true},
		{"zero again", "z2", backstop.Position{}, false},
		{"forward", "a", at("2024-05-01T10:00:00.5Z", "chat_5"), true},
		{"same position", "a2", at("2024-05-01T10:00:00.500Z", "chat_5"), false},
		{"same time, smaller id", "b", at("2024-05-01T10:00:00.5Z", "chat_4"), false},
		{"same time, larger id", "c", at("2024-05-01T10:00:00.5Z", "chat_6"), true},
		{"earlier time, fewer fraction digits", "d", at("2024-05-01T10:00:00Z", "chat_9"), false},
		{"later whole second", "e", at("2024-05-01T10:00:01Z", "chat_1"), true},
		{"backwards to zero", "f", backstop.Position{}, false},
		{"same instant in another offset", "g", at("2024-05-01T12:00:01+02:00", "chat_1"), false},
	}
	want := backstop.Cursor{}
	for i, st := range steps {
		clk.Set(t0.Add(time.Duration(i) * time.Second))
		cur := backstop.Cursor{Resource: r, Kind: backstop.CursorBackfill, Value: st.value, Position: st.pos, Done: i == 7}
		saved, err := db.AdvanceCursor(ctx, cur)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if saved != st.saved {
			t.Errorf("%s: AdvanceCursor = %v, want %v", st.name, saved, st.saved)
		}
		if saved {
			want = cur
			want.UpdatedAt = clk.Now()
		}
		got, ok, err := db.Cursor(ctx, r, backstop.CursorBackfill)
		if err != nil || !ok {
			t.Fatalf("%s: Cursor = %v, %v", st.name, ok, err)
		}
		if !sameCursor(got, want) {
			t.Errorf("%s: saved %+v, want %+v", st.name, got, want)
		}
	}
	if _, ok, err := db.Cursor(ctx, r, backstop.CursorSync); err != nil || ok {
		t.Errorf("the sync cursor = %v, %v; want none (AdvanceCursor moved only the backfill kind)", ok, err)
	}
	if _, err := db.AdvanceCursor(ctx, backstop.Cursor{Resource: "widgets", Kind: backstop.CursorSync}); err == nil {
		t.Error("AdvanceCursor of an unknown resource succeeded")
	}
	if _, err := db.AdvanceCursor(ctx, backstop.Cursor{Resource: r, Kind: "sideways"}); err == nil {
		t.Error("AdvanceCursor of an unknown kind succeeded")
	}
}

func TestCursorsAndReset(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	if cs, err := db.Cursors(ctx); err != nil || len(cs) != 0 {
		t.Fatalf("Cursors on a new store = %v, %v; want none", cs, err)
	}
	// Saved out of order; Cursors lists them by resource, then kind.
	for _, r := range []backstop.Resource{backstop.Payments, backstop.Chats, backstop.Contacts} {
		for _, k := range []backstop.CursorKind{backstop.CursorSync, backstop.CursorBackfill} {
			if _, err := db.ApplyPage(ctx, nil, cursorAt(r, k, string(r)+"/"+string(k), backstop.Position{})); err != nil {
				t.Fatal(err)
			}
		}
	}
	list := func() []string {
		cs, err := db.Cursors(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range cs {
			out = append(out, c.Value)
		}
		return out
	}
	want := []string{"chats/backfill", "chats/sync", "contacts/backfill", "contacts/sync", "payments/backfill", "payments/sync"}
	if got := list(); !slices.Equal(got, want) {
		t.Errorf("Cursors = %v, want %v", got, want)
	}

	if err := db.ResetCursors(ctx, backstop.Chats); err != nil {
		t.Fatal(err)
	}
	if err := db.ResetCursors(ctx, backstop.Messages); err != nil { // none saved: not an error
		t.Fatal(err)
	}
	want = want[2:]
	if got := list(); !slices.Equal(got, want) {
		t.Errorf("after reset, Cursors = %v, want %v", got, want)
	}
	for _, k := range []backstop.CursorKind{backstop.CursorSync, backstop.CursorBackfill} {
		if _, ok, err := db.Cursor(ctx, backstop.Chats, k); err != nil || ok {
			t.Errorf("chats/%s after reset = %v, %v; want none", k, ok, err)
		}
	}
	if err := db.ResetCursors(ctx, "widgets"); err == nil {
		t.Error("ResetCursors of an unknown resource succeeded")
	}
}

func TestUpdatedAtTextOrderIsTimeOrder(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	r := backstop.Contacts
	stamps := []string{
		"2024-05-01T10:00:00.5Z",
		"2024-05-01T10:00:00Z",
		"2024-05-01T10:00:00.05Z",
		"2024-05-01T10:00:01Z",
		"2024-05-01T09:59:59.999999999Z",
		"2024-05-01T10:00:00.123456Z",
		"2024-05-01T10:00:00.000000001Z",
		"2024-05-01T12:00:00.4+02:00", // 10:00:00.4 UTC
		"2024-05-01T10:00:00.45Z",
		"2024-04-30T23:59:59Z",
	}
	var page []backstop.Object
	for i, s := range stamps {
		page = append(page, obj(t, r, fmt.Sprintf("ct_%02d", i), s, nil))
	}
	if _, err := db.ApplyPage(ctx, page, cursorAt(r, backstop.CursorSync, "c", backstop.Position{})); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(page)
	slices.SortFunc(want, func(a, b backstop.Object) int { return a.Position().Compare(b.Position()) })

	got, err := db.Objects(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !sameObjects(got, want) {
		var g, w []string
		for i := range got {
			g = append(g, got[i].ID)
		}
		for i := range want {
			w = append(w, want[i].ID)
		}
		t.Errorf("Objects order %v, want %v", g, w)
	}

	// The stored text itself sorts in time order, and a range query on it
	// selects by time.
	var ids []string
	if err := db.r.SelectContext(ctx, &ids, `SELECT id FROM contacts WHERE updated_at > ? ORDER BY updated_at`,
		backstop.CanonicalTime(mustTime(t, "2024-05-01T10:00:00.1Z"))); err != nil {
		t.Fatal(err)
	}
	if w := []string{"ct_05", "ct_07", "ct_08", "ct_00", "ct_03"}; !slices.Equal(ids, w) {
		t.Errorf("updated_at > 10:00:00.1 = %v, want %v", ids, w)
	}
}

func TestConcurrentApplyPage(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	const pages, perPage = 30, 40

	var wg sync.WaitGroup
	errs := make(chan error, len(backstop.Resources)*pages+pages)
	for _, r := range backstop.Resources {
		all := make([][]backstop.Object, pages) // built here: obj may call t.Fatal
		for p := range all {
			all[p] = make([]backstop.Object, perPage)
			for i := range all[p] {
				n := p*perPage + i
				all[p][i] = obj(t, r, fmt.Sprintf("%s%05d", r.IDPrefix(), n), t0.Add(time.Duration(n)*time.Millisecond).Format(time.RFC3339Nano), nil)
			}
		}
		wg.Go(func() {
			for p, objs := range all {
				cur := cursorAt(r, backstop.CursorSync, fmt.Sprintf("%s-%d", r, p), objs[perPage-1].Position())
				res, err := db.ApplyPage(ctx, objs, cur)
				if err != nil {
					errs <- fmt.Errorf("%s page %d: %w", r, p, err)
					return
				}
				if res.New != perPage {
					errs <- fmt.Errorf("%s page %d: %+v, want %d new", r, p, res, perPage)
				}
			}
		})
	}
	// A reader runs alongside the writers.
	wg.Go(func() {
		for range pages {
			for _, r := range backstop.Resources {
				if _, err := db.Count(ctx, r); err != nil {
					errs <- fmt.Errorf("count %s: %w", r, err)
					return
				}
			}
			if _, err := db.Cursors(ctx); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err) // "database is locked" would show here
	}
	for _, r := range backstop.Resources {
		if n, err := db.Count(ctx, r); err != nil || n != pages*perPage {
			t.Errorf("Count %s = %d, %v; want %d", r, n, err, pages*perPage)
		}
		c, ok, err := db.Cursor(ctx, r, backstop.CursorSync)
		if err != nil || !ok || c.Value != fmt.Sprintf("%s-%d", r, pages-1) {
			t.Errorf("cursor %s = %+v, %v, %v; want the last page's", r, c, ok, err)
		}
	}
}

func TestDataRoundTripsByteExact(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	r := backstop.Messages

	big := strings.Repeat("ąęłńóśźż ЖЩЯ 日本語 🦀 ", 4000) // well over 64 KiB
	raws := map[string]string{
		// Key order, whitespace and escapes are kept as received.
		"msg_unicode": `{ "updated_at":"2024-05-01T10:00:00Z",  "id":"msg_unicode", "text":"Zażółć gęślą jaźń — Съешь же ещё 🙂 e\u0301 \u00e9 \"q\" \\ \u0000 \t",` + "\n" + `"chat_id":"chat_ü", "direction":"in"}`,
		"msg_big":     `{"id":"msg_big","updated_at":"2024-05-01T10:00:01Z","text":"` + big + `","direction":"out","chat_id":"chat_1"}`,
		"msg_nums":    `{"id":"msg_nums","updated_at":"2024-05-01T10:00:02.100Z","n":1.50,"m":1e3,"big":12345678901234567890}`,
	}
	if len(raws["msg_big"]) <= 64<<10 {
		t.Fatalf("big object is only %d bytes", len(raws["msg_big"]))
	}
	var page []backstop.Object
	for _, raw := range raws {
		o, err := backstop.DecodeObject(r, []byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		page = append(page, o)
	}
	if _, err := db.ApplyPage(ctx, page, cursorAt(r, backstop.CursorSync, "c", backstop.Position{})); err != nil {
		t.Fatal(err)
	}
	for id, raw := range raws {
		o, ok, err := db.Get(ctx, r, id)
		if err != nil || !ok {
			t.Fatalf("Get %s = %v, %v", id, ok, err)
		}
		if !bytes.Equal(o.Data, []byte(raw)) {
			t.Errorf("%s: %d bytes back, want %d identical bytes", id, len(o.Data), len(raw))
		}
	}
	all, err := db.Objects(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range all {
		if !bytes.Equal(o.Data, []byte(raws[o.ID])) {
			t.Errorf("Objects: %s differs from what was applied", o.ID)
		}
	}
	var chatID, typ string
	if err := db.r.QueryRowxContext(ctx, `SELECT chat_id, typeof(data) FROM messages WHERE id = 'msg_unicode'`).Scan(&chatID, &typ); err != nil {
		t.Fatal(err)
	}
	if chatID != "chat_ü" || typ != "text" {
		t.Errorf("chat_id %q, typeof(data) %q; want chat_ü, text", chatID, typ)
	}
}

func TestInsertBatch(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	const n = 2*insertBatchRows + 37 // two full statements and a remainder
	var objs []backstop.Object
	for i := range n {
		objs = append(objs, obj(t, backstop.Contacts, fmt.Sprintf("ct_%04d", i), "2024-05-01T10:00:00Z", nil))
	}
	objs = append(objs, obj(t, backstop.Payments, "pay_1", "2024-05-01T10:00:00Z", map[string]any{"amount": 5}))
	if err := db.InsertBatch(ctx, objs); err != nil {
		t.Fatal(err)
	}
	if c, err := db.Count(ctx, backstop.Contacts); err != nil || c != n {
		t.Errorf("Count contacts = %d, %v; want %d", c, err, n)
	}
	var amount int
	if err := db.r.GetContext(ctx, &amount, `SELECT amount FROM payments WHERE id = 'pay_1'`); err != nil || amount != 5 {
		t.Errorf("payment amount = %d, %v; want 5", amount, err)
	}
	// Replacing keeps one row per id.
	if err := db.InsertBatch(ctx, objs[:10]); err != nil {
		t.Fatal(err)
	}
	if c, _ := db.Count(ctx, backstop.Contacts); c != n {
		t.Errorf("after re-insert, Count contacts = %d, want %d", c, n)
	}
	bad := obj(t, backstop.Contacts, "ct_x", "2024-05-01T10:00:00Z", nil)
	bad.Resource = "widgets"
	if err := db.InsertBatch(ctx, []backstop.Object{bad}); err == nil {
		t.Error("InsertBatch of an unknown resource succeeded")
	}
}

func TestUnknownResourceReads(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	if _, err := db.Objects(ctx, "widgets"); err == nil {
		t.Error("Objects of an unknown resource succeeded")
	}
	if _, err := db.Count(ctx, "widgets"); err == nil {
		t.Error("Count of an unknown resource succeeded")
	}
	if _, _, err := db.Get(ctx, "widgets", "w_1"); err == nil {
		t.Error("Get of an unknown resource succeeded")
	}
	if _, _, err := db.Cursor(ctx, "widgets", backstop.CursorSync); err == nil {
		t.Error("Cursor of an unknown resource succeeded")
	}
}

func TestClosedDBReturnsErrors(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "c.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	r := backstop.Contacts
	o := obj(t, r, "ct_1", "2024-05-01T10:00:00Z", nil)
	cur := cursorAt(r, backstop.CursorSync, "c", o.Position())
	calls := map[string]func() error{
		"ApplyPage":     func() error { _, err := db.ApplyPage(ctx, []backstop.Object{o}, cur); return err },
		"InsertBatch":   func() error { return db.InsertBatch(ctx, []backstop.Object{o}) },
		"AdvanceCursor": func() error { _, err := db.AdvanceCursor(ctx, cur); return err },
		"ResetCursors":  func() error { return db.ResetCursors(ctx, r) },
		"Cursor":        func() error { _, _, err := db.Cursor(ctx, r, backstop.CursorSync); return err },
		"Cursors":       func() error { _, err := db.Cursors(ctx); return err },
		"Objects":       func() error { _, err := db.Objects(ctx, r); return err },
		"Count":         func() error { _, err := db.Count(ctx, r); return err },
		"Get":           func() error { _, _, err := db.Get(ctx, r, "ct_1"); return err },
	}
	for name, call := range calls {
		if err := call(); err == nil {
			t.Errorf("%s on a closed store succeeded, want an error", name)
		}
	}
}

// benchPages makes pages of new objects shaped like the platform's messages.
func benchPages(b *testing.B, pages, perPage int) [][]backstop.Object {
	out := make([][]backstop.Object, pages)
	text := strings.Repeat("lorem ipsum ", 20)
	for p := range out {
		out[p] = make([]backstop.Object, perPage)
		for i := range out[p] {
			n := p*perPage + i
			out[p][i] = obj(b, backstop.Messages, fmt.Sprintf("msg_%08d", n),
				t0.Add(time.Duration(n)*time.Millisecond).Format(time.RFC3339Nano),
				map[string]any{"chat_id": "chat_1", "direction": "in", "text": text})
		}
	}
	return out
}

// BenchmarkIngest compares ApplyPage (version-checked upserts plus the cursor,
// one transaction per page) with the raw InsertBatch ceiling, on the same 100
// pages of 200 new messages, and prints one BENCH line.
func BenchmarkIngest(b *testing.B) {
	const perPage, pages = 200, 100
	ctx := context.Background()
	var apply, raw time.Duration
	for range b.N {
		for _, mode := range []string{"InsertBatch", "ApplyPage"} {
			db, _ := openTest(b)
			batch := benchPages(b, pages, perPage)
			start := time.Now()
			for i, page := range batch {
				var err error
				if mode == "InsertBatch" {
					err = db.InsertBatch(ctx, page)
				} else {
					cur := cursorAt(backstop.Messages, backstop.CursorSync, fmt.Sprint(i), page[len(page)-1].Position())
					_, err = db.ApplyPage(ctx, page, cur)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			if mode == "InsertBatch" {
				raw += time.Since(start)
			} else {
				apply += time.Since(start)
			}
		}
	}
	n := float64(b.N * pages * perPage)
	b.ReportMetric(n/apply.Seconds(), "objects/s")
	fmt.Printf("BENCH store-apply-page objects=%d apply_per_s=%.0f insert_batch_per_s=%.0f ratio=%.2f\n",
		pages*perPage, n/apply.Seconds(), n/raw.Seconds(), raw.Seconds()/apply.Seconds())
}

// A shared claim lasts until it is released, not until the context it was
// taken with ends: serve takes it with its signal context and keeps
// draining after SIGTERM, and a serve without Redis must not start beside
// it meanwhile.
func TestSharedClaimOutlivesItsContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	ctx, cancel := context.WithCancel(context.Background())
	release, err := ClaimShared(ctx, path, "serve")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if r, err := Claim(context.Background(), path, "serve"); !errors.Is(err, ErrClaimed) {
		if err == nil {
			r()
		}
		t.Fatalf("exclusive claim beside a shared one whose context ended: %v, want ErrClaimed", err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	r, err := Claim(context.Background(), path, "serve")
	if err != nil {
		t.Fatalf("exclusive claim after the shared one was released: %v", err)
	}
	r()
}
