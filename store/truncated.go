package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/jsonvalid"
)

// truncatedRow is what the fetch worker needs of a truncated event.
type truncatedRow struct {
	EventID   string `db:"event_id"`
	Type      string `db:"type"`
	Resource  string `db:"resource"`
	ObjectID  string `db:"object_id"`
	Origin    string `db:"origin"`
	CreatedAt string `db:"created_at"`
	Truncated bool   `db:"truncated"`
	Data      string `db:"data"`
	// ReceivedAt is read only by the queries that list events to fetch
	// (truncatedDueColumns).
	ReceivedAt string `db:"received_at"`
}

func (row truncatedRow) event() (backstop.Event, error) {
	created, err := backstop.ParseTime(row.CreatedAt)
	if err != nil {
		return backstop.Event{}, fmt.Errorf("event %s: created_at: %w", row.EventID, err)
	}
	return backstop.Event{
		ID:        row.EventID,
		Type:      row.Type,
		Resource:  backstop.Resource(row.Resource),
		ObjectID:  row.ObjectID,
		CreatedAt: created,
		Origin:    backstop.Origin(row.Origin),
		Data:      json.RawMessage(row.Data),
		Truncated: row.Truncated,
	}, nil
}

const truncatedColumns = `event_id, type, resource, object_id, origin, created_at, truncated, data`

// truncatedDueColumns are truncatedColumns and received_at, for dueEvent.
const truncatedDueColumns = truncatedColumns + `, received_at`

// dueEvent is row.event() for the fetch worker: its CreatedAt is never later
// than when the event was received. The worker measures how long a missing
// object may still be on its way from CreatedAt, and a created_at ahead of
// the event's arrival is the sender's clock, not the event's: taken as it
// came, a created_at a year ahead would keep a 404 retried for a year.
func (row truncatedRow) dueEvent() (backstop.Event, error) {
	ev, err := row.event()
	if err != nil {
		return ev, err
	}
	received, err := backstop.ParseTime(row.ReceivedAt)
	if err != nil {
		return backstop.Event{}, fmt.Errorf("event %s: received_at: %w", row.EventID, err)
	}
	if ev.CreatedAt.After(received) {
		ev.CreatedAt = received
	}
	return ev, nil
}

// DueTruncated returns up to limit truncated events whose object is still to
// fetch and whose next fetch is due at now (a first fetch is due at once),
// oldest received first. A limit of zero or less means no limit. The events
// carry Truncated, their object id and the data as received, and their
// created_at, or when they were received if that is earlier (a created_at
// ahead of the event's arrival is the sender's clock). It only looks:
// the fetch worker claims the events it fetches with ClaimTruncated, so that
// processes sharing the store do not fetch the same event.
func (db *DB) DueTruncated(ctx context.Context, now time.Time, limit int) ([]backstop.Event, error) {
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	var rows []truncatedRow
	if err := db.r.SelectContext(ctx, &rows, `SELECT `+truncatedDueColumns+` FROM processed_events
		WHERE truncated = 1 AND (next_fetch_at IS NULL OR next_fetch_at <= ?)
		ORDER BY received_at, event_id LIMIT ?`, backstop.CanonicalTime(now), limit); err != nil {
		return nil, fmt.Errorf("list due truncated events: %w", err)
	}
	out := make([]backstop.Event, len(rows))
	for i, row := range rows {
		ev, err := row.dueEvent()
		if err != nil {
			return nil, fmt.Errorf("list due truncated events: %w", err)
		}
		out[i] = ev
	}
	return out, nil
}

// ClaimTruncated returns up to limit truncated events that are due at now,
// as DueTruncated would list them, and in the same write transaction leases
// them to the caller: their next fetch moves to now+lease, so that no other
// claim (by this process or another on the same store) returns them before
// the lease ends and, should the process die mid-fetch, they are due again
// after it. The caller records the fetch (CompleteTruncated,
// FailClaimedTruncated, AbandonTruncated) or hands the event back
// (ReleaseTruncated) within the lease. A reader looks first, so that a poll
// with nothing due takes no write lock.
func (db *DB) ClaimTruncated(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]backstop.Event, error) {
	if limit <= 0 || lease <= 0 {
		return nil, fmt.Errorf("claim due truncated events: limit %d and lease %v must be positive", limit, lease)
	}
	at := backstop.CanonicalTime(now)
	var due bool
	if err := db.r.GetContext(ctx, &due, `SELECT EXISTS (SELECT 1 FROM processed_events
		WHERE truncated = 1 AND (next_fetch_at IS NULL OR next_fetch_at <= ?))`, at); err != nil {
		return nil, fmt.Errorf("claim due truncated events: %w", err)
	}
	if !due {
		return nil, nil
	}
	evs, err := db.claimTruncated(ctx, at, limit, backstop.CanonicalTime(now.Add(lease)))
	if err != nil {
		return nil, fmt.Errorf("claim due truncated events: %w", err)
	}
	return evs, nil
}

func (db *DB) claimTruncated(ctx context.Context, at string, limit int, until string) ([]backstop.Event, error) {
	tx, err := db.w.BeginTxx(ctx, nil) // immediate: the selection and the lease are one write
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	var rows []truncatedRow
	if err := tx.SelectContext(ctx, &rows, `SELECT `+truncatedDueColumns+` FROM processed_events
		WHERE truncated = 1 AND (next_fetch_at IS NULL OR next_fetch_at <= ?)
		ORDER BY received_at, event_id LIMIT ?`, at, limit); err != nil {
		return nil, fmt.Errorf("select: %w", err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	out := make([]backstop.Event, len(rows))
	for i, row := range rows {
		ev, err := row.dueEvent()
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE processed_events SET next_fetch_at = ?
			WHERE event_id = ?`, until, row.EventID); err != nil {
			return nil, fmt.Errorf("lease event %s: %w", row.EventID, err)
		}
		out[i] = ev
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return out, nil
}

// FailClaimedTruncated records a failed fetch of the truncated event eventID
// that ClaimTruncated leased until lease (its now+lease): one more attempt,
// errMsg as the last error, and the next fetch due at next(n), n being the
// stored number of attempts with this one. The backoff thus follows the
// attempts every process has made, not only the caller's; next must not
// block. It returns n. It changes nothing and fails with an error wrapping
// backstop.ErrNotFound when the event no longer holds that lease: it was
// completed or given up, or its lease ran out and it was claimed again.
func (db *DB) FailClaimedTruncated(ctx context.Context, eventID string, lease time.Time, errMsg string, next func(attempts int) time.Time) (int, error) {
	n, err := db.failClaimedTruncated(ctx, eventID, backstop.CanonicalTime(lease), errMsg, next)
	if err != nil {
		return 0, fmt.Errorf("fail truncated event %s: %w", eventID, err)
	}
	return n, nil
}

func (db *DB) failClaimedTruncated(ctx context.Context, eventID, lease, errMsg string, next func(int) time.Time) (int, error) {
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	var attempts int
	err = tx.GetContext(ctx, &attempts, `SELECT fetch_attempts FROM processed_events
		WHERE event_id = ? AND truncated = 1 AND next_fetch_at = ?`, eventID, lease)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("no such event holding the claim until %s: %w", lease, backstop.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("read: %w", err)
	}
	n := attempts + 1
	if _, err := tx.ExecContext(ctx, `UPDATE processed_events
		SET fetch_attempts = ?, last_fetch_error = ?, next_fetch_at = ?
		WHERE event_id = ?`, n, errMsg, backstop.CanonicalTime(next(n)), eventID); err != nil {
		return 0, fmt.Errorf("update: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return n, nil
}

// ReleaseTruncated hands the truncated event eventID, claimed by
// ClaimTruncated until lease and not fetched (the worker is stopping), back
// before its lease ends: its next fetch is due at due, and neither its
// attempts nor its last error change. An event that no longer holds that
// lease is left alone. It reports whether the event was released.
func (db *DB) ReleaseTruncated(ctx context.Context, eventID string, lease, due time.Time) (bool, error) {
	res, err := db.w.ExecContext(ctx, `UPDATE processed_events SET next_fetch_at = ?
		WHERE event_id = ? AND truncated = 1 AND next_fetch_at = ?`,
		backstop.CanonicalTime(due), eventID, backstop.CanonicalTime(lease))
	if err != nil {
		return false, fmt.Errorf("release truncated event %s: %w", eventID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("release truncated event %s: %w", eventID, err)
	}
	return n > 0, nil
}

// CompleteTruncated completes the truncated event eventID with obj, its
// object as fetched, in one transaction. The event takes obj's version
// (updated_at, dedup key) and data, and stops being truncated. When another
// event already holds that dedup key, this one is an EmitDuplicate: it is
// kept with no dedup key and DuplicateOf naming the other event, and neither
// the mirror nor the outbox changes. Otherwise it is accepted as Emit would
// accept it: the mirror is written when obj is newer, and one outbox row is
// queued per matching route, whose envelope carries obj's data. For chats
// and payments, whose event types name the object's status, the rows carry
// the type of obj's status (see stateEventType); processed_events keeps the
// type the event arrived with.
//
// An event completed already is reported as an EmitDuplicate with no change.
// It fails with an error wrapping backstop.ErrNotFound when no event has that
// id, and on an obj of another resource or id than the event's.
func (db *DB) CompleteTruncated(ctx context.Context, eventID string, obj backstop.Object, routes []backstop.Route) (backstop.EmitResult, error) {
	res, err := db.completeTruncated(ctx, eventID, obj, routes)
	if err != nil {
		return backstop.EmitResult{}, fmt.Errorf("complete truncated event %s: %w", eventID, err)
	}
	return res, nil
}

func (db *DB) completeTruncated(ctx context.Context, eventID string, obj backstop.Object, routes []backstop.Route) (backstop.EmitResult, error) {
	var res backstop.EmitResult
	if err := checkRoutes(routes); err != nil {
		return res, err
	}
	if err := checkObject(obj); err != nil {
		return res, err
	}
	if obj.UpdatedAt.IsZero() {
		return res, fmt.Errorf("%s %s: no updated_at", obj.Resource, obj.ID)
	}
	if !jsonvalid.Valid(obj.Data) {
		return res, fmt.Errorf("%s %s: data is not valid JSON", obj.Resource, obj.ID)
	}
	now := db.now()
	stamp := backstop.CanonicalTime(now)

	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return res, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()

	var row truncatedRow
	err = tx.GetContext(ctx, &row, `SELECT `+truncatedColumns+` FROM processed_events WHERE event_id = ?`, eventID)
	if errors.Is(err, sql.ErrNoRows) {
		return res, backstop.ErrNotFound
	}
	if err != nil {
		return res, fmt.Errorf("read: %w", err)
	}
	if !row.Truncated {
		return backstop.EmitResult{Status: backstop.EmitDuplicate}, nil
	}
	if backstop.Resource(row.Resource) != obj.Resource || row.ObjectID != obj.ID {
		return res, fmt.Errorf("fetched %s %s, but the event is about %s %s", obj.Resource, obj.ID, row.Resource, row.ObjectID)
	}
	ev, err := row.event()
	if err != nil {
		return res, err
	}
	ev.UpdatedAt, ev.Data, ev.Truncated = obj.UpdatedAt, obj.Data, false
	if typ := stateEventType(obj.Resource, obj.Data); typ != "" {
		ev.Type = typ
	}
	key := ev.DedupKey()

	var holder string
	err = tx.GetContext(ctx, &holder, `SELECT event_id FROM processed_events WHERE dedup_key = ?`, key)
	switch {
	case err == nil:
		if _, err := tx.ExecContext(ctx, `UPDATE processed_events
			SET updated_at = ?, truncated = 0, next_fetch_at = NULL, data = ?, duplicate_of = ?
			WHERE event_id = ?`, backstop.CanonicalTime(obj.UpdatedAt), string(obj.Data), holder, eventID); err != nil {
			return res, fmt.Errorf("mark duplicate of %s: %w", holder, err)
		}
		if err := tx.Commit(); err != nil {
			return res, fmt.Errorf("commit: %w", err)
		}
		return backstop.EmitResult{Status: backstop.EmitDuplicate}, nil
	case !errors.Is(err, sql.ErrNoRows):
		return res, fmt.Errorf("look up dedup key: %w", err)
	}

	if _, err := tx.ExecContext(ctx, `UPDATE processed_events
		SET dedup_key = ?, updated_at = ?, truncated = 0, next_fetch_at = NULL, data = ?
		WHERE event_id = ?`, key, backstop.CanonicalTime(obj.UpdatedAt), string(obj.Data), eventID); err != nil {
		return res, fmt.Errorf("update: %w", err)
	}
	res.Status = backstop.EmitAccepted
	if res.MirrorWritten, err = db.mirrorWriter(tx, now).write(ctx, obj); err != nil {
		return backstop.EmitResult{}, err
	}
	q := db.outboxQueue(tx, stamp)
	res.Outbox = q.queue(ev, routes, 0)
	out := []backstop.EmitResult{res}
	if err := q.flush(ctx, out); err != nil {
		return backstop.EmitResult{}, err
	}
	res = out[0]
	if err := tx.Commit(); err != nil {
		return backstop.EmitResult{}, fmt.Errorf("commit: %w", err)
	}
	return res, nil
}

// stateEventType returns the event type that r's object data announces by
// its state alone (chat.<status>, payment.<status>), or "" for a resource
// whose events say more than the state (contact.created or .updated).
//
// A truncated event is completed with the object as fetched, which may be
// a later state than the one the event announced: a chat closed since it
// was opened, a payment succeeded since it was pending. That version's own
// webhook is then a duplicate of the completed event, so the completed
// event is queued under the type of the state it carries; otherwise a
// target subscribed to that state (payment.succeeded) would never hear of
// it, and one subscribed to the announced state would get data saying
// otherwise.
func stateEventType(r backstop.Resource, data json.RawMessage) string {
	typ := backstop.EventTypeFor(r, data, true)
	if typ == "" || typ != backstop.EventTypeFor(r, data, false) {
		return ""
	}
	return typ
}

// FailTruncated records a failed fetch of the truncated event eventID: one
// more attempt, errMsg as the last error, and the next fetch due at next. It
// fails with an error wrapping backstop.ErrNotFound when no event with that
// id is waiting for its object.
func (db *DB) FailTruncated(ctx context.Context, eventID string, errMsg string, next time.Time) error {
	res, err := db.w.ExecContext(ctx, `UPDATE processed_events
		SET fetch_attempts = fetch_attempts + 1, last_fetch_error = ?, next_fetch_at = ?
		WHERE event_id = ? AND truncated = 1`, errMsg, backstop.CanonicalTime(next), eventID)
	if err != nil {
		return fmt.Errorf("fail truncated event %s: %w", eventID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("fail truncated event %s: %w", eventID, err)
	}
	if n == 0 {
		return fmt.Errorf("fail truncated event %s: no such event waiting for its object: %w", eventID, backstop.ErrNotFound)
	}
	return nil
}

// AbandonTruncated gives up on the truncated event eventID, whose object
// the platform says does not exist: one more attempt and errMsg are
// recorded, and the event no longer waits for its object (it is neither
// fetched again nor counted by CountTruncatedPending). It stays in
// processed_events, so its id and dedup key still suppress repeats; it is
// neither mirrored nor queued. It fails with an error wrapping
// backstop.ErrNotFound when no event with that id is waiting for its
// object.
func (db *DB) AbandonTruncated(ctx context.Context, eventID string, errMsg string) error {
	res, err := db.w.ExecContext(ctx, `UPDATE processed_events
		SET fetch_attempts = fetch_attempts + 1, last_fetch_error = ?, next_fetch_at = NULL, truncated = 0
		WHERE event_id = ? AND truncated = 1`, errMsg, eventID)
	if err != nil {
		return fmt.Errorf("abandon truncated event %s: %w", eventID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("abandon truncated event %s: %w", eventID, err)
	}
	if n == 0 {
		return fmt.Errorf("abandon truncated event %s: no such event waiting for its object: %w", eventID, backstop.ErrNotFound)
	}
	return nil
}

// CountTruncatedPending returns how many truncated events still wait for
// their object, due or not.
func (db *DB) CountTruncatedPending(ctx context.Context) (int, error) {
	var n int
	if err := db.r.GetContext(ctx, &n, `SELECT count(*) FROM processed_events WHERE truncated = 1`); err != nil {
		return 0, fmt.Errorf("count truncated events: %w", err)
	}
	return n, nil
}
