package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/jsonvalid"
)

var _ backstop.EventLog = (*DB)(nil)

// insertEventRowsSQL is the dedup insert of n events: it changes no row
// whose event_id or dedup_key is already taken (ON CONFLICT without a
// target covers both), going row by row, so that an event is refused for
// one before it in the same statement too.
func insertEventRowsSQL(n int) string {
	return `INSERT INTO processed_events
	(event_id, dedup_key, type, resource, object_id, updated_at, origin, created_at, received_at, truncated, data)
	VALUES ` + rowsSQL("("+placeholders(11)+")", n) + `
	ON CONFLICT DO NOTHING`
}

// rowsSQL is n copies of one row of a VALUES list, comma-separated.
func rowsSQL(row string, n int) string {
	return strings.TrimSuffix(strings.Repeat(row+", ", n), ", ")
}

// chunks are the row counts of the emit path's multi-row inserts, largest
// first: a batch's rows go in as few statements as these add up to. A
// multi-row insert takes about a third fewer instructions per row than
// one statement per row.
var chunks = [...]int{32, 16, 8, 4, 2, 1}

// chunkFor returns the index in chunks of the largest statement that n
// rows still to insert fill.
func chunkFor(n int) int {
	c := 0
	for chunks[c] > n {
		c++
	}
	return c
}

// Emit processes events in one transaction on the writer connection, in
// order: each event is inserted into processed_events, and an event whose
// event_id or dedup key is already there (from an earlier commit or earlier
// in the same batch) is an EmitDuplicate, queued to no target again (one
// carrying a version already processed still writes its object to the
// mirror when newer: see emitTx.duplicate). An accepted
// event's object is written to the mirror only when newer than the stored
// version (MirrorWritten), and one outbox row is queued for each route whose
// globs match its type (Outbox), carrying the envelope
// {"event_id","event","created_at","origin","data"} to deliver. A truncated
// event is stored for the fetch worker (see DueTruncated) and neither
// mirrored nor queued until CompleteTruncated. An event of unknown type is
// stored with no dedup key and queued to the routes that match it.
//
// Results are in the order of events. On error nothing of the batch is
// committed; an error caused by one event (no id, type or origin, a known
// type without object id or updated_at, data that is not JSON) names its
// position and id, so a caller can retry the others without it. A zero
// CreatedAt is stored as the time the event was received.
func (db *DB) Emit(ctx context.Context, events []backstop.Event, routes []backstop.Route) ([]backstop.EmitResult, error) {
	if len(events) == 0 {
		return []backstop.EmitResult{}, nil
	}
	res, err := db.emit(ctx, events, routes, db.emitInTx)
	if err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	return res, nil
}

// emitFunc processes events inside an open write transaction: emitInTx, or
// emitNewerInTx, which compares them with the mirror first.
type emitFunc func(ctx, sctx context.Context, tx *sqlx.Tx, now time.Time, stamp string, events []backstop.Event, routes []backstop.Route) ([]backstop.EmitResult, error)

// emit runs events through inTx in one transaction of their own and
// commits it.
func (db *DB) emit(ctx context.Context, events []backstop.Event, routes []backstop.Route, inTx emitFunc) ([]backstop.EmitResult, error) {
	if err := checkRoutes(routes); err != nil {
		return nil, err
	}
	now := db.now()
	stamp := backstop.CanonicalTime(now)

	// A webhook's commit waits for the writer no longer than for a lock
	// held elsewhere: while another process holds the store's write lock,
	// each write before it (a delivery claim, say) waits the busy timeout
	// in turn, and a webhook behind several would go unanswered.
	began := time.Now()
	conn, err := db.writer(ctx, db.busy)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer conn.Close()
	// Nor do the two waits add up: after a wait for the writer, the lock
	// is waited for only what is left of the busy timeout, so that a
	// webhook is answered (503) within about that timeout, not twice it,
	// when a write before it held the writer while it waited for a lock
	// held elsewhere. Only then is the connection's timeout changed.
	if waited := time.Since(began); waited > emitWaitSlack {
		restore, err := db.withBusyTimeout(ctx, conn, max(db.busy-waited, time.Millisecond))
		if err != nil {
			return nil, fmt.Errorf("begin: %w", err)
		}
		defer restore()
	}
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()

	// The statements run without ctx's cancellation, which the driver would
	// watch with one goroutine per statement; ctx is checked between events
	// instead, and a cancelled ctx also fails the commit.
	out, err := inTx(ctx, context.WithoutCancel(ctx), tx, now, stamp, events, routes)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit %d events: %w", len(events), err)
	}
	return out, nil
}

// emitWaitSlack is how long Emit may wait for the writer before the lock
// wait after it is shortened by as much.
const emitWaitSlack = 50 * time.Millisecond

// emitTx is one Emit transaction: its statements and the time it stamps.
type emitTx struct {
	db      *DB
	tx      *sqlx.Tx
	inserts [len(chunks)]*sqlx.Stmt // db.insertEventRows bound to tx, on first use
	args    []any
	mirror  *mirrorWriter
	queue   *outboxQueue
	now     time.Time
	stamp   string // now, canonical
}

// insertEvents inserts events, checked (checkEvent), into processed_events
// in their order, by multi-row statements, and reports for each whether
// it was inserted: an event whose id or dedup key is taken, by an earlier
// commit or an event before it in the batch, is not (ON CONFLICT DO
// NOTHING goes row by row). A statement that inserted all its rows needs
// no more; where it did not (duplicates are the rare case), each of its
// events is looked up: the rows it inserted took the rowids after the
// table's highest, one each, up to the last one.
func (et *emitTx) insertEvents(ctx context.Context, events []backstop.Event) ([]bool, error) {
	inserted := make([]bool, len(events))
	for start := 0; start < len(events); {
		c := chunkFor(len(events) - start)
		chunk := events[start : start+chunks[c]]
		if et.inserts[c] == nil {
			et.inserts[c] = et.tx.StmtxContext(ctx, et.db.insertEventRows[c])
		}
		et.args = et.args[:0]
		for _, ev := range chunk {
			createdAt := ev.CreatedAt
			if createdAt.IsZero() {
				createdAt = et.now
			}
			// An unknown type names no resource to fetch from: it is kept
			// as it came, not queued for a fetch that could never succeed.
			truncated := ev.Truncated && ev.Resource != ""
			et.args = append(et.args, ev.ID, nullString(ev.DedupKey()), ev.Type, string(ev.Resource), ev.ObjectID, nullTime(ev.UpdatedAt),
				string(ev.Origin), backstop.CanonicalTime(createdAt), et.stamp, truncated, dataText(ev.Data))
		}
		res, err := et.inserts[c].ExecContext(ctx, et.args...)
		if err != nil {
			return nil, fmt.Errorf("insert %d processed events: %w", len(chunk), err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return nil, fmt.Errorf("insert %d processed events: %w", len(chunk), err)
		}
		switch {
		case int(n) == len(chunk):
			for j := range chunk {
				inserted[start+j] = true
			}
		case n > 0:
			last, err := res.LastInsertId()
			if err != nil {
				return nil, fmt.Errorf("insert %d processed events: %w", len(chunk), err)
			}
			first := last - n + 1
			for j, ev := range chunk {
				var row struct {
					RowID    int64          `db:"rowid"`
					DedupKey sql.NullString `db:"dedup_key"`
				}
				err := et.tx.GetContext(ctx, &row, `SELECT rowid, dedup_key FROM processed_events WHERE event_id = ?`, ev.ID)
				if errors.Is(err, sql.ErrNoRows) {
					continue // its version came under another id
				}
				if err != nil {
					return nil, fmt.Errorf("look up processed event %s: %w", ev.ID, err)
				}
				// Two events of one id and one version in the statement: the
				// first took the row.
				mine := row.RowID >= first && row.DedupKey.String == ev.DedupKey() && (j == 0 || !slices.ContainsFunc(chunk[:j], func(e backstop.Event) bool {
					return e.ID == ev.ID && e.DedupKey() == ev.DedupKey()
				}))
				inserted[start+j] = mine
			}
		}
		start += len(chunk)
	}
	return inserted, nil
}

// emit processes one event of the batch, inserted into processed_events
// or not (insertEvents), whose result is at index result; its outbox rows
// are gathered for et.queue.flush. taken tells a duplicate whether its
// version was processed before it.
func (et *emitTx) emit(ctx context.Context, ev backstop.Event, routes []backstop.Route, result int, inserted bool, taken func(key string) (bool, error)) (backstop.EmitResult, error) {
	if !inserted {
		return et.duplicate(ctx, ev, taken)
	}
	r := backstop.EmitResult{Status: backstop.EmitAccepted}
	if ev.Truncated && ev.Resource != "" {
		return r, nil
	}
	if o, ok := ev.Object(); ok {
		var err error
		if r.MirrorWritten, err = et.mirror.writeJSON(ctx, o); err != nil {
			return backstop.EmitResult{}, err
		}
	}
	r.Outbox = et.queue.queue(ev, routes, result)
	return r, nil
}

// processedVersionSQL tells whether a version's dedup key is taken.
const processedVersionSQL = `SELECT EXISTS (SELECT 1 FROM processed_events WHERE dedup_key = ?)`

// duplicate is emit's answer for ev, already processed: queued to no target
// again, but when ev carries a version already processed (its dedup key
// is taken; not merely its event id, under which another version may have
// come) its object is written to the mirror when newer, as for a new
// event. That repairs a mirror that lost the version (a row deleted by
// hand, an object the mirror was cleared of): sync and reconcile, finding
// it missing, emit it, and were otherwise told duplicate for good.
func (et *emitTx) duplicate(ctx context.Context, ev backstop.Event, taken func(key string) (bool, error)) (backstop.EmitResult, error) {
	r := backstop.EmitResult{Status: backstop.EmitDuplicate}
	o, ok := ev.Object()
	if !ok {
		return r, nil
	}
	processed, err := taken(ev.DedupKey())
	if err != nil {
		return backstop.EmitResult{}, fmt.Errorf("look up processed version: %w", err)
	}
	if !processed {
		return r, nil
	}
	if r.MirrorWritten, err = et.mirror.writeJSON(ctx, o); err != nil {
		return backstop.EmitResult{}, err
	}
	return r, nil
}

// checkEvent rejects an event the emit path cannot store faithfully.
func checkEvent(ev backstop.Event) error {
	switch {
	case ev.ID == "":
		return errors.New("missing event id")
	case ev.Type == "":
		return errors.New("missing event type")
	case ev.Origin == "":
		return errors.New("missing origin")
	case reservedEventID(ev.ID):
		// Its outbox rows would be taken for proxied payloads' (proxyEventID).
		return errors.New("event id is in the space reserved for the webhook proxy's payloads")
	}
	if ev.Resource != "" {
		if _, err := tableFor(ev.Resource); err != nil {
			return err
		}
		if ev.ObjectID == "" {
			return fmt.Errorf("%s event without object id", ev.Type)
		}
		if !ev.Truncated {
			if ev.UpdatedAt.IsZero() {
				return fmt.Errorf("%s event for %s without updated_at", ev.Type, ev.ObjectID)
			}
			if len(ev.Data) == 0 {
				return fmt.Errorf("%s event for %s without data", ev.Type, ev.ObjectID)
			}
		}
	}
	if len(ev.Data) > 0 {
		if _, ok := ev.Object(); ok {
			// Written to the mirror (a truncated event's data is not).
			return checkMirrorJSON(ev.Data)
		}
		if !jsonvalid.Valid(ev.Data) {
			return errors.New("data is not valid JSON")
		}
	}
	return nil
}

// checkRoutes rejects a route without a target name.
func checkRoutes(routes []backstop.Route) error {
	for i, rt := range routes {
		if rt.Target == "" {
			return fmt.Errorf("route %d: empty target", i+1)
		}
	}
	return nil
}

// outboxQueue adds outbox rows inside one write transaction; Emit and
// CompleteTruncated share it: it gathers the rows of a batch's events
// (queue) and inserts them together before the commit (flush).
type outboxQueue struct {
	db    *DB
	tx    *sqlx.Tx
	stamp string
	rows  []queuedRow
	args  []any
	multi [len(chunks)]*sqlx.Stmt // db.insertOutboxRows bound to tx, on first use
}

// queuedRow is one outbox row queue gathered, for the event whose result
// is at index result of the batch.
type queuedRow struct {
	target, eventID, eventType, payload string
	result                              int
}

// insertOutboxRowsSQL queues n deliveries, due now: ?1 is the time, bound
// once for its three columns of every row, then four parameters per row.
// A (target, event) pair is queued at most once. Payloads queued through
// the webhook proxy (Enqueue) never conflict here: their event_id is in a
// space of its own (proxyEventID), and the proxy_key left NULL is outside
// outbox_proxy_key.
func insertOutboxRowsSQL(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO outbox
	(target, event_id, event_type, payload, status, attempts, next_attempt_at, created_at, updated_at)
	VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		p := 2 + 4*i
		fmt.Fprintf(&b, "(?%d, ?%d, ?%d, ?%d, 'pending', 0, ?1, ?1, ?1)", p, p+1, p+2, p+3)
	}
	b.WriteString(`
	ON CONFLICT (target, event_id) DO NOTHING`)
	return b.String()
}

// queue gathers ev's rows for every route whose globs match its type, for
// the result at index result of the batch, and returns how many it
// gathered: flush inserts them and takes back from the count any that was
// queued already.
func (q *outboxQueue) queue(ev backstop.Event, routes []backstop.Route, result int) int {
	var payload string
	n := 0
	for _, rt := range routes {
		if !backstop.MatchEvents(rt.Events, ev.Type) {
			continue
		}
		// Two routes to one target queue one delivery, as the pair's
		// uniqueness would have it.
		if slices.ContainsFunc(q.rows[len(q.rows)-n:], func(r queuedRow) bool { return r.target == rt.Target }) {
			continue
		}
		if payload == "" {
			payload = string(envelope(ev))
		}
		q.rows = append(q.rows, queuedRow{target: rt.Target, eventID: ev.ID, eventType: ev.Type, payload: payload, result: result})
		n++
	}
	return n
}

// flush inserts the rows queue gathered, in their order, and lowers the
// Outbox count of out's results by the rows that were there already: a
// (target, event) pair is queued at most once, and an event whose
// processed_events row was pruned may come again while its deliveries
// are kept. That is rare, and only then is each row looked up: the rows
// inserted here took the ids after the outbox's highest (its ids are
// rowids), one each, so they are the added ids up to the last one.
func (q *outboxQueue) flush(ctx context.Context, out []backstop.EmitResult) error {
	if len(q.rows) == 0 {
		return nil
	}
	added := 0
	var lastID int64 // the id of the last row inserted
	for rows := q.rows; len(rows) > 0; {
		c := chunkFor(len(rows))
		chunk := rows[:chunks[c]]
		rows = rows[len(chunk):]
		if q.multi[c] == nil {
			q.multi[c] = q.tx.StmtxContext(ctx, q.db.insertOutboxRows[c])
		}
		q.args = append(q.args[:0], q.stamp)
		for _, r := range chunk {
			q.args = append(q.args, r.target, r.eventID, r.eventType, r.payload)
		}
		res, err := q.multi[c].ExecContext(ctx, q.args...)
		if err != nil {
			return fmt.Errorf("queue %d deliveries: %w", len(chunk), err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("queue %d deliveries: %w", len(chunk), err)
		}
		if n > 0 {
			if lastID, err = res.LastInsertId(); err != nil {
				return fmt.Errorf("queue %d deliveries: %w", len(chunk), err)
			}
		}
		added += int(n)
	}
	if added < len(q.rows) {
		first := lastID - int64(added) + 1 // with none added, every row was there
		for _, r := range q.rows {
			var id int64
			if err := q.tx.QueryRowxContext(ctx, `SELECT id FROM outbox WHERE target = ? AND event_id = ?`, r.target, r.eventID).Scan(&id); err != nil {
				return fmt.Errorf("look up the delivery of %s to %s: %w", r.eventID, r.target, err)
			}
			if added == 0 || id < first {
				out[r.result].Outbox--
			}
		}
	}
	q.rows = q.rows[:0]
	return nil
}

// outboxQueue returns an outboxQueue for tx whose rows are created and due at stamp.
func (db *DB) outboxQueue(tx *sqlx.Tx, stamp string) *outboxQueue {
	return &outboxQueue{db: db, tx: tx, stamp: stamp}
}

// envelope is the JSON delivered for ev:
// {"event_id","event","created_at","origin","data"}, with data byte for byte
// as received (it has been checked to be JSON), and "truncated": true after
// it for a truncated event.
func envelope(ev backstop.Event) []byte {
	b := make([]byte, 0, len(ev.Data)+len(ev.ID)+len(ev.Type)+96)
	b = append(b, `{"event_id":`...)
	b = appendJSONString(b, ev.ID)
	b = append(b, `,"event":`...)
	b = appendJSONString(b, ev.Type)
	b = append(b, `,"created_at":"`...)
	// RFC 3339 text holds nothing JSON escapes.
	b = ev.CreatedAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	b = append(b, `,"origin":`...)
	b = appendJSONString(b, string(ev.Origin))
	b = append(b, `,"data":`...)
	b = append(b, dataText(ev.Data)...)
	if ev.Truncated {
		// Only an event of an unknown type is queued truncated (others
		// wait for their object): its data is partial, as the platform
		// said, and the target is told so as a max_payload cut tells it.
		b = append(b, `,"truncated":true`...)
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string, as json.Marshal writes it.
// Ids and types are mostly printable ASCII that needs no escape, which is
// appended as it is; any other string goes through json.Marshal.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// dataText is the stored form of an event's data; no data is JSON null.
func dataText(data json.RawMessage) string {
	if len(data) == 0 {
		return "null"
	}
	return string(data)
}

// nullString is s, or NULL when s is empty.
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// nullTime is t in canonical form, or NULL when t is zero.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return backstop.CanonicalTime(t)
}

// parseNullTime parses a nullable canonical time; NULL is the zero time.
func parseNullTime(s sql.NullString) (time.Time, error) {
	if !s.Valid {
		return time.Time{}, nil
	}
	return backstop.ParseTime(s.String)
}

// ProcessedEvent is one row of processed_events: an event as the emit path
// recorded it.
type ProcessedEvent struct {
	EventID string
	// DedupKey is empty while the event has no version: an unknown type, a
	// truncated event not fetched yet, or a duplicate found on completion.
	DedupKey string
	Type     string
	// Resource is empty for an unknown type.
	Resource backstop.Resource
	ObjectID string
	// UpdatedAt is the version's updated_at; zero when not known yet.
	UpdatedAt  time.Time
	Origin     backstop.Origin
	CreatedAt  time.Time // the event's, as the platform made it
	ReceivedAt time.Time // when the emit path stored it
	// Truncated is true while the object is still to fetch.
	Truncated     bool
	FetchAttempts int
	// NextFetchAt is when the next fetch is due; zero means at once.
	NextFetchAt    time.Time
	LastFetchError string
	// DuplicateOf names the event that already held this one's version,
	// found when a truncated event was completed.
	DuplicateOf string
	// Data is the event's data as received, or the full object once a
	// truncated event is completed.
	Data json.RawMessage
}

// processedRow is one row of processed_events as read back.
type processedRow struct {
	EventID        string         `db:"event_id"`
	DedupKey       sql.NullString `db:"dedup_key"`
	Type           string         `db:"type"`
	Resource       string         `db:"resource"`
	ObjectID       string         `db:"object_id"`
	UpdatedAt      sql.NullString `db:"updated_at"`
	Origin         string         `db:"origin"`
	CreatedAt      string         `db:"created_at"`
	ReceivedAt     string         `db:"received_at"`
	Truncated      bool           `db:"truncated"`
	FetchAttempts  int            `db:"fetch_attempts"`
	NextFetchAt    sql.NullString `db:"next_fetch_at"`
	LastFetchError sql.NullString `db:"last_fetch_error"`
	DuplicateOf    sql.NullString `db:"duplicate_of"`
	Data           string         `db:"data"`
}

func (row processedRow) processedEvent() (ProcessedEvent, error) {
	pe := ProcessedEvent{
		EventID:        row.EventID,
		DedupKey:       row.DedupKey.String,
		Type:           row.Type,
		Resource:       backstop.Resource(row.Resource),
		ObjectID:       row.ObjectID,
		Origin:         backstop.Origin(row.Origin),
		Truncated:      row.Truncated,
		FetchAttempts:  row.FetchAttempts,
		LastFetchError: row.LastFetchError.String,
		DuplicateOf:    row.DuplicateOf.String,
		Data:           json.RawMessage(row.Data),
	}
	var err error
	if pe.UpdatedAt, err = parseNullTime(row.UpdatedAt); err != nil {
		return pe, fmt.Errorf("updated_at: %w", err)
	}
	if pe.CreatedAt, err = backstop.ParseTime(row.CreatedAt); err != nil {
		return pe, fmt.Errorf("created_at: %w", err)
	}
	if pe.ReceivedAt, err = backstop.ParseTime(row.ReceivedAt); err != nil {
		return pe, fmt.Errorf("received_at: %w", err)
	}
	if pe.NextFetchAt, err = parseNullTime(row.NextFetchAt); err != nil {
		return pe, fmt.Errorf("next_fetch_at: %w", err)
	}
	return pe, nil
}

// ProcessedEvent returns the processed event eventID, or ok=false when no
// event with that id was processed (or it was pruned).
func (db *DB) ProcessedEvent(ctx context.Context, eventID string) (ProcessedEvent, bool, error) {
	var row processedRow
	err := db.r.GetContext(ctx, &row, `SELECT event_id, dedup_key, type, resource, object_id, updated_at,
		origin, created_at, received_at, truncated, fetch_attempts, next_fetch_at, last_fetch_error,
		duplicate_of, data FROM processed_events WHERE event_id = ?`, eventID)
	if errors.Is(err, sql.ErrNoRows) {
		return ProcessedEvent{}, false, nil
	}
	if err != nil {
		return ProcessedEvent{}, false, fmt.Errorf("read processed event %s: %w", eventID, err)
	}
	pe, err := row.processedEvent()
	if err != nil {
		return ProcessedEvent{}, false, fmt.Errorf("read processed event %s: %w", eventID, err)
	}
	return pe, true, nil
}

// CountProcessed returns how many processed events are kept.
func (db *DB) CountProcessed(ctx context.Context) (int, error) {
	var n int
	if err := db.r.GetContext(ctx, &n, `SELECT count(*) FROM processed_events`); err != nil {
		return 0, fmt.Errorf("count processed events: %w", err)
	}
	return n, nil
}

// pruneChunk bounds the rows one pruning transaction deletes, so that the
// emit path never waits long behind maintenance.
const pruneChunk = 5000

// PruneProcessed deletes the processed events received before before and
// returns how many it deleted. Truncated events still waiting for their
// object are kept whatever their age; outbox rows are never touched. While
// a backfill checkpoint is unfinished, one event of origin backfill of its
// resource is kept too, whatever its age: it is how the backfill guards
// (CheckpointEmitted) know that the backfill emitted, so that resuming it
// weeks later without --emit is still refused and a sync beside it still
// allowed. It deletes in short transactions: on error, the count says how
// many were deleted before it. Callers keep processed ids longer than any
// upstream retry window (DESIGN.md: at least 30 days).
func (db *DB) PruneProcessed(ctx context.Context, before time.Time) (int64, error) {
	cutoff := backstop.CanonicalTime(before)
	// Any one event does, as for the guards: the scan stops at the first
	// (the fill's first, when it emitted; a fill without --emit has none,
	// and the scan reads the whole table, about 0.3 s per million
	// events), and it is read on a reader connection, which holds no
	// write lock.
	var keep []string
	if err := db.r.SelectContext(ctx, &keep, `SELECT event_id FROM (
			SELECT (SELECT p.event_id FROM processed_events AS p
				WHERE p.resource = c.resource AND p.origin = ?1 LIMIT 1) AS event_id
			FROM cursors AS c WHERE c.kind = ?2 AND c.done = 0)
		WHERE event_id IS NOT NULL`, string(backstop.OriginBackfill), string(backstop.CursorBackfill)); err != nil {
		return 0, fmt.Errorf("prune processed events: find the unfinished backfills' events: %w", err)
	}
	kept, err := json.Marshal(append([]string{}, keep...))
	if err != nil {
		return 0, fmt.Errorf("prune processed events: %w", err)
	}
	var total int64
	for {
		res, err := db.w.ExecContext(ctx, `DELETE FROM processed_events WHERE rowid IN (
			SELECT rowid FROM processed_events WHERE received_at < ? AND truncated = 0
				AND event_id NOT IN (SELECT value FROM json_each(?)) LIMIT ?)`,
			cutoff, string(kept), pruneChunk)
		if err != nil {
			return total, fmt.Errorf("prune processed events: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("prune processed events: %w", err)
		}
		total += n
		if n < pruneChunk {
			return total, nil
		}
	}
}
