package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/backstop-sync/backstop"
)

// table is the mirror table of one resource and the SQL that touches it.
// Table names come only from this fixed set, never from input.
type table struct {
	name      string
	columns   []string // the typed columns, each read out of data by its own name (typedValues)
	upsertSQL string   // one object, written only when newer
	existSQL  string   // "... WHERE id IN (" + placeholders + ")"
}

// typedColumns are each mirror table's typed columns, in their order in
// the table: each holds the object's top-level member of its name
// (migration 0022).
var typedColumns = map[backstop.Resource][]string{
	backstop.Contacts: {"created_at", "name", "email", "phone"},
	backstop.Chats:    {"created_at", "contact_id", "channel", "status"},
	backstop.Messages: {"created_at", "chat_id", "direction"},
	backstop.Payments: {"created_at", "contact_id", "amount", "currency", "status"},
}

// tables maps each resource to its mirror table.
var tables = func() map[backstop.Resource]*table {
	m := make(map[backstop.Resource]*table, len(backstop.Resources))
	for _, r := range backstop.Resources {
		n := string(r)
		cols := typedColumns[r]
		set := ""
		for _, c := range cols {
			set += ",\n\t\t\t\t\t" + c + " = excluded." + c
		}
		m[r] = &table{
			name:    n,
			columns: cols,
			upsertSQL: `INSERT INTO ` + n + ` (id, updated_at, data, synced_at, ` + strings.Join(cols, ", ") + `)
				VALUES (` + placeholders(4+len(cols)) + `)
				ON CONFLICT (id) DO UPDATE SET
					updated_at = excluded.updated_at,
					data = excluded.data,
					synced_at = excluded.synced_at` + set + `
				WHERE excluded.updated_at > ` + n + `.updated_at`,
			existSQL: `SELECT id, updated_at FROM ` + n + ` WHERE id IN (`,
		}
	}
	return m
}()

// tableFor returns the mirror table of r, or an error for an unknown resource.
func tableFor(r backstop.Resource) (*table, error) {
	t, ok := tables[r]
	if !ok {
		return nil, fmt.Errorf("unknown resource %q", r)
	}
	return t, nil
}

// objectRow is one row of a mirror table as read back.
type objectRow struct {
	ID        string `db:"id"`
	UpdatedAt string `db:"updated_at"`
	Data      string `db:"data"`
}

func (row objectRow) object(r backstop.Resource) (backstop.Object, error) {
	t, err := backstop.ParseTime(row.UpdatedAt)
	if err != nil {
		return backstop.Object{}, fmt.Errorf("%s %s: updated_at: %w", r, row.ID, err)
	}
	return backstop.Object{Resource: r, ID: row.ID, UpdatedAt: t, Data: json.RawMessage(row.Data)}, nil
}

// versionRow is the stored version of one object.
type versionRow struct {
	ID        string `db:"id"`
	UpdatedAt string `db:"updated_at"`
}

// group is the objects of one resource within a page, in page order.
type group struct {
	resource backstop.Resource
	objs     []backstop.Object
}

// groupByResource splits objs by resource, keeping the order of first
// appearance; a page of one resource is one group without copying.
func groupByResource(objs []backstop.Object) []group {
	if len(objs) == 0 {
		return nil
	}
	first := objs[0].Resource
	same := true
	for _, o := range objs[1:] {
		if o.Resource != first {
			same = false
			break
		}
	}
	if same {
		return []group{{resource: first, objs: objs}}
	}
	var gs []group
	idx := make(map[backstop.Resource]int)
	for _, o := range objs {
		i, ok := idx[o.Resource]
		if !ok {
			i = len(gs)
			idx[o.Resource] = i
			gs = append(gs, group{resource: o.Resource})
		}
		gs[i].objs = append(gs[i].objs, o)
	}
	return gs
}

// checkObject rejects an object that cannot be stored.
func checkObject(o backstop.Object) error {
	if o.ID == "" {
		return fmt.Errorf("%s object without id", o.Resource)
	}
	if len(o.Data) == 0 {
		return fmt.Errorf("%s %s: empty data", o.Resource, o.ID)
	}
	return nil
}

// ApplyPage writes objs to the mirror and saves cur, in one transaction:
// either all of it is committed or none of it, so the saved cursor is never
// ahead of the mirror. An object is written only when its updated_at is newer
// than the stored version's; an equal or older version counts as Unchanged
// and leaves the stored one in place. Objects may belong to several
// resources. With no objects only the cursor is saved.
//
// The cursor never moves back: cur is saved only when no cursor of its
// resource and kind is saved or the saved one's position is not after
// cur's. Otherwise another run (an overlapping sync) has already committed
// everything up to the saved position, and the objects are written but the
// cursor is left where it is. A run that means to start over deletes its
// cursor first (ResetCursor, ResetCursors). It fails on an unknown
// resource, an object without id or data, or an invalid cursor.
func (db *DB) ApplyPage(ctx context.Context, objs []backstop.Object, cur backstop.Cursor) (backstop.ApplyResult, error) {
	res, _, err := db.applyPage(ctx, objs, cur, nil)
	if err != nil {
		return backstop.ApplyResult{}, fmt.Errorf("apply %s page: %w", cur.Resource, err)
	}
	return res, nil
}

// ApplyPageAt is ApplyPage for a run that read its cursor at reset
// generation gen (CursorGeneration): when the cursor has been reset since
// (backstop cursors reset while the run was going), it commits nothing,
// neither the objects nor the cursor, and reports reset=true, so the run
// stops instead of writing its position over the reset.
func (db *DB) ApplyPageAt(ctx context.Context, gen int64, objs []backstop.Object, cur backstop.Cursor) (_ backstop.ApplyResult, reset bool, _ error) {
	res, reset, err := db.applyPage(ctx, objs, cur, &gen)
	if err != nil {
		return backstop.ApplyResult{}, false, fmt.Errorf("apply %s page: %w", cur.Resource, err)
	}
	return res, reset, nil
}

// applyPage is ApplyPage, and ApplyPageAt when gen is not nil.
func (db *DB) applyPage(ctx context.Context, objs []backstop.Object, cur backstop.Cursor, gen *int64) (backstop.ApplyResult, bool, error) {
	var res backstop.ApplyResult
	if err := checkCursor(cur); err != nil {
		return res, false, err
	}
	now := db.now()

	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return res, false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if gen != nil {
		if ok, err := sameGeneration(ctx, tx, cur, *gen); err != nil {
			return res, false, err
		} else if !ok {
			return res, true, nil
		}
	}

	if res, err = db.mirrorWriter(tx, now).apply(ctx, objs); err != nil {
		return res, false, err
	}

	row := newCursorRow(cur, now)
	// saveCursor never moves the cursor back (saveCursorSQL).
	if _, err := tx.StmtxContext(ctx, db.saveCursor).ExecContext(ctx, row.args()...); err != nil {
		return res, false, fmt.Errorf("save cursor: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return res, false, fmt.Errorf("commit: %w", err)
	}
	return res, false, nil
}

// mirrorWriter writes objects to the mirror inside one write transaction,
// each only when its updated_at is newer than the stored version's: the one
// place the never-back-in-time rule is enforced, shared by ApplyPage and the
// emit path.
type mirrorWriter struct {
	db     *DB
	tx     *sqlx.Tx
	synced string
	stmts  map[backstop.Resource]*sqlx.Stmt // db.upsert bound to tx, on first use
	args   []any                            // the statement's arguments, reused from object to object
}

// mirrorWriter returns a mirrorWriter for tx that stamps synced_at with now.
func (db *DB) mirrorWriter(tx *sqlx.Tx, now time.Time) *mirrorWriter {
	return &mirrorWriter{db: db, tx: tx, synced: backstop.CanonicalTime(now)}
}

// apply writes each of objs that is new to the mirror or newer than its
// stored version, and counts them against the mirror as it was: ApplyPage's
// writes, without events.
func (mw *mirrorWriter) apply(ctx context.Context, objs []backstop.Object) (backstop.ApplyResult, error) {
	var res backstop.ApplyResult
	for _, g := range groupByResource(objs) {
		t, err := tableFor(g.resource)
		if err != nil {
			return res, err
		}
		stored, err := storedVersions(ctx, mw.tx, t, g.objs)
		if err != nil {
			return res, err
		}
		for _, o := range g.objs {
			if err := checkObject(o); err != nil {
				return res, err
			}
			v := backstop.CanonicalTime(o.UpdatedAt)
			old, ok := stored[o.ID]
			switch {
			case !ok:
				res.New++
			case v > old:
				res.Updated++
			default:
				res.Unchanged++
				continue
			}
			if _, err := mw.write(ctx, o); err != nil {
				return res, err
			}
			stored[o.ID] = v // a later copy in the same page compares with this one
		}
	}
	return res, nil
}

// write upserts o when it is newer than the stored version (or not stored)
// and reports whether it wrote. It fails on an unknown resource or an object
// without id or data, or whose data is not JSON.
func (m *mirrorWriter) write(ctx context.Context, o backstop.Object) (bool, error) {
	if len(o.Data) > 0 {
		if err := checkMirrorJSON(o.Data); err != nil {
			return false, fmt.Errorf("write %s %s: %w", o.Resource, o.ID, err)
		}
	}
	return m.writeJSON(ctx, o)
}

// writeJSON is write for an object whose data has been checked
// (checkMirrorJSON; an event's, by checkEvent).
func (m *mirrorWriter) writeJSON(ctx context.Context, o backstop.Object) (bool, error) {
	if err := checkObject(o); err != nil {
		return false, err
	}
	st, ok := m.stmts[o.Resource]
	if !ok {
		prepared, known := m.db.upsert[o.Resource]
		if !known {
			return false, fmt.Errorf("%s %s: unknown resource", o.Resource, o.ID)
		}
		if m.stmts == nil {
			m.stmts = make(map[backstop.Resource]*sqlx.Stmt, 1)
		}
		st = m.tx.StmtxContext(ctx, prepared)
		m.stmts[o.Resource] = st
	}
	// The typed columns are read out of data before the statement, as
	// SQLite did for its generated columns (migration 0022).
	m.args = append(m.args[:0], o.ID, backstop.CanonicalTime(o.UpdatedAt), string(o.Data), m.synced)
	m.args = typedValues(m.args, o.Data, tables[o.Resource].columns)
	if err := resolveNumbers(ctx, m.tx, m.args); err != nil {
		return false, fmt.Errorf("write %s %s: %w", o.Resource, o.ID, err)
	}
	res, err := st.ExecContext(ctx, m.args...)
	if err != nil {
		return false, fmt.Errorf("write %s %s: %w", o.Resource, o.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("write %s %s: %w", o.Resource, o.ID, err)
	}
	return n > 0, nil
}

// maxIn bounds the ids in one IN list, well under SQLite's variable limit.
const maxIn = 500

// storedVersions returns the stored canonical updated_at of those of objs
// that are in t, keyed by id.
func storedVersions(ctx context.Context, tx *sqlx.Tx, t *table, objs []backstop.Object) (map[string]string, error) {
	stored := make(map[string]string, len(objs))
	for start := 0; start < len(objs); start += maxIn {
		chunk := objs[start:min(start+maxIn, len(objs))]
		args := make([]any, len(chunk))
		for i, o := range chunk {
			args[i] = o.ID
		}
		q := t.existSQL + placeholders(len(chunk)) + ")"
		rows, err := tx.QueryxContext(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("read %s versions: %w", t.name, err)
		}
		for rows.Next() {
			var v versionRow
			if err := rows.StructScan(&v); err != nil {
				rows.Close()
				return nil, fmt.Errorf("read %s versions: %w", t.name, err)
			}
			stored[v.ID] = v.UpdatedAt
		}
		if err := rows.Close(); err != nil {
			return nil, fmt.Errorf("read %s versions: %w", t.name, err)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read %s versions: %w", t.name, err)
		}
	}
	return stored, nil
}

// placeholders returns n comma-separated "?".
func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?, ", n-1) + "?"
}

// Objects returns every stored object of r, ordered by (updated_at, id).
func (db *DB) Objects(ctx context.Context, r backstop.Resource) ([]backstop.Object, error) {
	t, err := tableFor(r)
	if err != nil {
		return nil, fmt.Errorf("list objects: %w", err)
	}
	var rows []objectRow
	if err := db.r.SelectContext(ctx, &rows,
		`SELECT id, updated_at, data FROM `+t.name+` ORDER BY updated_at, id`); err != nil {
		return nil, fmt.Errorf("list %s: %w", r, err)
	}
	out := make([]backstop.Object, len(rows))
	for i, row := range rows {
		if out[i], err = row.object(r); err != nil {
			return nil, fmt.Errorf("list %s: %w", r, err)
		}
	}
	return out, nil
}

// Count returns how many objects of r are stored.
func (db *DB) Count(ctx context.Context, r backstop.Resource) (int, error) {
	t, err := tableFor(r)
	if err != nil {
		return 0, fmt.Errorf("count objects: %w", err)
	}
	var n int
	if err := db.r.GetContext(ctx, &n, `SELECT count(*) FROM `+t.name); err != nil {
		return 0, fmt.Errorf("count %s: %w", r, err)
	}
	return n, nil
}

// Get returns the stored object r/id, or ok=false when it is not stored.
func (db *DB) Get(ctx context.Context, r backstop.Resource, id string) (backstop.Object, bool, error) {
	t, err := tableFor(r)
	if err != nil {
		return backstop.Object{}, false, fmt.Errorf("get object: %w", err)
	}
	var row objectRow
	err = db.r.GetContext(ctx, &row, `SELECT id, updated_at, data FROM `+t.name+` WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return backstop.Object{}, false, nil
	}
	if err != nil {
		return backstop.Object{}, false, fmt.Errorf("get %s %s: %w", r, id, err)
	}
	o, err := row.object(r)
	if err != nil {
		return backstop.Object{}, false, fmt.Errorf("get %s %s: %w", r, id, err)
	}
	return o, true, nil
}

// insertBatchRows is how many objects one multi-row INSERT of InsertBatch
// carries (4 variables each and one per typed column).
const insertBatchRows = 200

// InsertBatch writes objs with plain multi-row INSERT OR REPLACE statements
// in one transaction: no version check, no counting, no cursor. It is the
// raw-ingest ceiling that ApplyPage is measured against (same tables, same
// columns), not a way to keep the mirror: it can move an object back in time.
func (db *DB) InsertBatch(ctx context.Context, objs []backstop.Object) error {
	if err := db.insertBatch(ctx, objs); err != nil {
		return fmt.Errorf("insert batch: %w", err)
	}
	return nil
}

func (db *DB) insertBatch(ctx context.Context, objs []backstop.Object) error {
	synced := backstop.CanonicalTime(db.now())
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()

	for _, g := range groupByResource(objs) {
		t, err := tableFor(g.resource)
		if err != nil {
			return err
		}
		var full *sqlx.Stmt // the statement for a full chunk, prepared once
		args := make([]any, 0, (4+len(t.columns))*insertBatchRows)
		for start := 0; start < len(g.objs); start += insertBatchRows {
			chunk := g.objs[start:min(start+insertBatchRows, len(g.objs))]
			args = args[:0]
			for _, o := range chunk {
				if err := checkObject(o); err != nil {
					return err
				}
				if err := checkMirrorJSON(o.Data); err != nil {
					return fmt.Errorf("%s %s: %w", o.Resource, o.ID, err)
				}
				args = append(args, o.ID, backstop.CanonicalTime(o.UpdatedAt), string(o.Data), synced)
				args = typedValues(args, o.Data, t.columns)
			}
			if err := resolveNumbers(ctx, tx, args); err != nil {
				return fmt.Errorf("insert %s: %w", t.name, err)
			}
			if len(chunk) == insertBatchRows && full == nil {
				if full, err = tx.PreparexContext(ctx, insertSQL(t, insertBatchRows)); err != nil {
					return fmt.Errorf("prepare %s insert: %w", t.name, err)
				}
			}
			if len(chunk) == insertBatchRows {
				_, err = full.ExecContext(ctx, args...)
			} else {
				_, err = tx.ExecContext(ctx, insertSQL(t, len(chunk)), args...)
			}
			if err != nil {
				return fmt.Errorf("insert %s: %w", t.name, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// insertSQL is a multi-row INSERT OR REPLACE of n objects into t.
func insertSQL(t *table, n int) string {
	return `INSERT OR REPLACE INTO ` + t.name + ` (id, updated_at, data, synced_at, ` + strings.Join(t.columns, ", ") + `) VALUES ` +
		rowsSQL("("+placeholders(4+len(t.columns))+")", n)
}
