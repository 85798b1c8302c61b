package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/backstop-sync/backstop"
)

// OutboxRow is one queued delivery: one event for one target.
type OutboxRow = backstop.Delivery

// outboxRow is one row of outbox as read back.
type outboxRow struct {
	ID            int64          `db:"id"`
	Target        string         `db:"target"`
	EventID       string         `db:"event_id"`
	EventType     string         `db:"event_type"`
	Payload       string         `db:"payload"`
	Status        string         `db:"status"`
	Attempts      int            `db:"attempts"`
	Failures      int            `db:"failures"`
	NextAttemptAt string         `db:"next_attempt_at"`
	CreatedAt     string         `db:"created_at"`
	UpdatedAt     string         `db:"updated_at"`
	LastStatus    sql.NullInt64  `db:"last_status"`
	LastError     sql.NullString `db:"last_error"`
	// ProxyKey is the caller's key of a payload queued through the webhook
	// proxy; NULL for an event's row.
	ProxyKey sql.NullString `db:"proxy_key"`
	// ClaimedUntil is read only by the queries of outboxReadColumns.
	ClaimedUntil sql.NullString `db:"claimed_until"`
}

// proxyPrefix starts the event_id of every row queued through the webhook
// proxy (see proxyEventID).
const proxyPrefix = "\x1fproxy:"

// proxyEventID is the event_id under which a payload queued through the
// webhook proxy with the caller's key is stored. It starts with a control
// character, which no event's id holds (the intake refuses them, the
// engine's ids are "evt_bs_" and hex, and the emit path refuses
// proxyPrefix), so a proxied row never takes the place of an event's row
// in UNIQUE (target, event_id), nor an event's row that of a proxied one.
// Migration 0009 moved the rows of earlier versions to this form.
func proxyEventID(key string) string { return proxyPrefix + key }

// reservedEventID reports whether id is in the proxied rows' key space, and
// so not an id an event may have.
func reservedEventID(id string) bool { return strings.HasPrefix(id, proxyPrefix) }

func (row outboxRow) outboxRow() (OutboxRow, error) {
	o := OutboxRow{
		ID:         row.ID,
		Target:     row.Target,
		EventID:    row.EventID,
		EventType:  row.EventType,
		Payload:    json.RawMessage(row.Payload),
		Status:     row.Status,
		Attempts:   row.Attempts,
		Failures:   row.Failures,
		LastStatus: int(row.LastStatus.Int64),
		LastError:  row.LastError.String,
	}
	if row.ProxyKey.Valid {
		o.EventID, o.Proxied = row.ProxyKey.String, true
	}
	var err error
	if o.NextAttemptAt, err = backstop.ParseTime(row.NextAttemptAt); err != nil {
		return o, fmt.Errorf("outbox %d: next_attempt_at: %w", row.ID, err)
	}
	if o.CreatedAt, err = backstop.ParseTime(row.CreatedAt); err != nil {
		return o, fmt.Errorf("outbox %d: created_at: %w", row.ID, err)
	}
	if o.UpdatedAt, err = backstop.ParseTime(row.UpdatedAt); err != nil {
		return o, fmt.Errorf("outbox %d: updated_at: %w", row.ID, err)
	}
	if row.ClaimedUntil.Valid && (o.Status == StatusPending || o.Status == StatusRetrying) {
		if o.ClaimedUntil, err = backstop.ParseTime(row.ClaimedUntil.String); err != nil {
			return o, fmt.Errorf("outbox %d: claimed_until: %w", row.ID, err)
		}
	}
	return o, nil
}

// OutboxRows returns the outbox rows of target, every target's when target
// is empty, in the order they were queued.
func (db *DB) OutboxRows(ctx context.Context, target string) ([]OutboxRow, error) {
	var rows []outboxRow
	if err := db.r.SelectContext(ctx, &rows, `SELECT `+outboxColumns+`
		FROM outbox WHERE ? = '' OR target = ? ORDER BY id`, target, target); err != nil {
		return nil, fmt.Errorf("list outbox %s: %w", target, err)
	}
	out, err := convertOutbox(rows)
	if err != nil {
		return nil, fmt.Errorf("list outbox %s: %w", target, err)
	}
	return out, nil
}

// outboxColumns are the columns outboxRow reads, for SELECT lists.
const outboxColumns = `id, target, event_id, event_type, payload, status,
	attempts, failures, next_attempt_at, created_at, updated_at, last_status, last_error, proxy_key`

// outboxReadColumns are outboxColumns and the claim's end, for the reads
// that show deliveries to a person (the claim itself has no use for it).
const outboxReadColumns = outboxColumns + `, claimed_until`

// convertOutbox converts rows read with outboxColumns.
func convertOutbox(rows []outboxRow) ([]OutboxRow, error) {
	out := make([]OutboxRow, len(rows))
	for i, row := range rows {
		o, err := row.outboxRow()
		if err != nil {
			return nil, err
		}
		out[i] = o
	}
	return out, nil
}
