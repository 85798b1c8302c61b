package store

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/backstop-sync/backstop"
)

// QuotaSample is one sample of an API key's rate-limit budget, as the
// governor saw it at At, with what the key's requests did since the
// previous sample.
type QuotaSample struct {
	// KeyID is the governor's KeyID of the API key, never the key.
	KeyID            string
	At               time.Time
	Limit, Remaining int
	// Reset is when the window ends; PausedUntil the end of a 429 pause
	// (zero when there was none).
	Reset, PausedUntil time.Time
	// Requests, RateLimited and ThrottleWait count the requests sent, the
	// 429 answers and the time spent waiting on the governor since the
	// previous sample.
	Requests, RateLimited int
	ThrottleWait          time.Duration
}

// IntakeSample counts what the webhook intake refused or suppressed since
// the previous sample.
type IntakeSample struct {
	At                time.Time
	Duplicates        int
	SignatureFailures int
}

// OriginCount is how many events of one origin were processed in the
// period starting at Start.
type OriginCount struct {
	Start  time.Time
	Origin backstop.Origin
	Events int
}

// SaveQuotaSample stores s. It fails on an empty key id or a zero time.
func (db *DB) SaveQuotaSample(ctx context.Context, s QuotaSample) error {
	if s.KeyID == "" || s.At.IsZero() {
		return errors.New("save quota sample: key id and time are required")
	}
	if _, err := db.w.ExecContext(ctx, `INSERT OR REPLACE INTO quota_samples
		(key_id, at, quota_limit, remaining, reset_at, paused_until, requests, rate_limited, throttle_wait_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		s.KeyID, backstop.CanonicalTime(s.At), s.Limit, s.Remaining, nullTime(s.Reset), nullTime(s.PausedUntil),
		s.Requests, s.RateLimited, float64(s.ThrottleWait)/float64(time.Millisecond)); err != nil {
		return fmt.Errorf("save quota sample of %s: %w", s.KeyID, err)
	}
	return nil
}

// QuotaSamples returns every key's samples taken at or after since, by key
// then oldest first.
func (db *DB) QuotaSamples(ctx context.Context, since time.Time) ([]QuotaSample, error) {
	var rows []struct {
		KeyID          string         `db:"key_id"`
		At             string         `db:"at"`
		Limit          int            `db:"quota_limit"`
		Remaining      int            `db:"remaining"`
		Reset          sql.NullString `db:"reset_at"`
		PausedUntil    sql.NullString `db:"paused_until"`
		Requests       int            `db:"requests"`
		RateLimited    int            `db:"rate_limited"`
		ThrottleWaitMS float64        `db:"throttle_wait_ms"`
	}
	if err := db.r.SelectContext(ctx, &rows, `SELECT key_id, at, quota_limit, remaining, reset_at, paused_until,
		requests, rate_limited, throttle_wait_ms FROM quota_samples WHERE at >= ? ORDER BY key_id, at`,
		backstop.CanonicalTime(since)); err != nil {
		return nil, fmt.Errorf("list quota samples: %w", err)
	}
	out := make([]QuotaSample, len(rows))
	for i, r := range rows {
		s := QuotaSample{KeyID: r.KeyID, Limit: r.Limit, Remaining: r.Remaining, Requests: r.Requests,
			RateLimited: r.RateLimited, ThrottleWait: time.Duration(math.Round(r.ThrottleWaitMS * float64(time.Millisecond)))}
		var err error
		if s.At, err = backstop.ParseTime(r.At); err == nil {
			if s.Reset, err = parseNullTime(r.Reset); err == nil {
				s.PausedUntil, err = parseNullTime(r.PausedUntil)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("list quota samples: %s at %s: %w", r.KeyID, r.At, err)
		}
		out[i] = s
	}
	return out, nil
}

// SaveIntakeSample stores s. It fails on a zero time.
func (db *DB) SaveIntakeSample(ctx context.Context, s IntakeSample) error {
	if s.At.IsZero() {
		return errors.New("save intake sample: time is required")
	}
	if _, err := db.w.ExecContext(ctx, `INSERT OR REPLACE INTO intake_samples (at, duplicates, signature_failures)
		VALUES (?, ?, ?)`, backstop.CanonicalTime(s.At), s.Duplicates, s.SignatureFailures); err != nil {
		return fmt.Errorf("save intake sample: %w", err)
	}
	return nil
}

// IntakeSamples returns the intake samples taken at or after since, oldest
// first.
func (db *DB) IntakeSamples(ctx context.Context, since time.Time) ([]IntakeSample, error) {
	var rows []struct {
		At                string `db:"at"`
		Duplicates        int    `db:"duplicates"`
		SignatureFailures int    `db:"signature_failures"`
	}
	if err := db.r.SelectContext(ctx, &rows, `SELECT at, duplicates, signature_failures FROM intake_samples
		WHERE at >= ? ORDER BY at`, backstop.CanonicalTime(since)); err != nil {
		return nil, fmt.Errorf("list intake samples: %w", err)
	}
	out := make([]IntakeSample, len(rows))
	for i, r := range rows {
		at, err := backstop.ParseTime(r.At)
		if err != nil {
			return nil, fmt.Errorf("list intake samples: %w", err)
		}
		out[i] = IntakeSample{At: at, Duplicates: r.Duplicates, SignatureFailures: r.SignatureFailures}
	}
	return out, nil
}

// PruneSamples deletes the quota and intake samples taken before before and
// returns how many it deleted, in chunks as PruneJobRuns does.
func (db *DB) PruneSamples(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	// Both tables are WITHOUT ROWID: a chunk is named by its primary keys.
	for _, del := range []string{
		`DELETE FROM quota_samples WHERE (key_id, at) IN (SELECT key_id, at FROM quota_samples WHERE at < ? LIMIT ?)`,
		`DELETE FROM intake_samples WHERE at IN (SELECT at FROM intake_samples WHERE at < ? LIMIT ?)`,
	} {
		n, err := db.pruneChunked(ctx, del, before)
		total += n
		if err != nil {
			return total, fmt.Errorf("prune samples: %w", err)
		}
	}
	return total, nil
}

// ProcessedByPeriod counts the events processed (received) at or after
// since by origin, in periods of the given length aligned on the Unix
// epoch (whole hours for an hour), oldest first. Periods without events
// are left out. period must be at least a second.
func (db *DB) ProcessedByPeriod(ctx context.Context, since time.Time, period time.Duration) ([]OriginCount, error) {
	sec := int64(period / time.Second)
	if sec < 1 {
		return nil, fmt.Errorf("count processed events: period %v is under a second", period)
	}
	var rows []struct {
		Start  int64  `db:"start"`
		Origin string `db:"origin"`
		N      int    `db:"n"`
	}
	// received_at is canonical text; its first 19 characters are the
	// second, which unixepoch reads.
	if err := db.r.SelectContext(ctx, &rows, `SELECT (unixepoch(substr(received_at, 1, 19)) / ?1) * ?1 AS start,
		origin, count(*) AS n FROM processed_events WHERE received_at >= ?2
		GROUP BY start, origin ORDER BY start, origin`, sec, backstop.CanonicalTime(since)); err != nil {
		return nil, fmt.Errorf("count processed events by period: %w", err)
	}
	out := make([]OriginCount, len(rows))
	for i, r := range rows {
		out[i] = OriginCount{Start: time.Unix(r.Start, 0).UTC(), Origin: backstop.Origin(r.Origin), Events: r.N}
	}
	return out, nil
}

// RetryDeliveryAsSeen is RetryDelivery for a person who saw the delivery in
// a given state: it requeues the delivery only while its status is still
// status and it was last changed at updatedAt, and reports whether it did.
// A second submission of the same retry therefore changes nothing: the
// first one moved updated_at. It fails with an error wrapping
// backstop.ErrNotFound when there is no such delivery, and with one
// wrapping backstop.ErrInFlight (a *backstop.InFlightError), changing
// nothing, while it is claimed for sending and otherwise as seen.
func (db *DB) RetryDeliveryAsSeen(ctx context.Context, id int64, status string, updatedAt, now time.Time) (bool, error) {
	stamp := backstop.CanonicalTime(now)
	res, err := db.w.ExecContext(ctx, requeueSQL+` WHERE id = ? AND status = ? AND updated_at = ?`+notInFlightSQL,
		stamp, stamp, id, status, backstop.CanonicalTime(updatedAt), stamp)
	if err != nil {
		return false, fmt.Errorf("retry delivery %d: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("retry delivery %d: %w", id, err)
	}
	if n == 1 {
		return true, nil
	}
	// Changed since it was seen (retried already, attempted): that is
	// what the person is told, claimed or not. Else only its claim kept
	// it as it was.
	row, ok, err := db.Delivery(ctx, id)
	switch {
	case err != nil:
		return false, fmt.Errorf("retry delivery %d: %w", id, err)
	case !ok:
		return false, fmt.Errorf("retry delivery %d: no such delivery: %w", id, backstop.ErrNotFound)
	case row.Status != status || !row.UpdatedAt.Equal(updatedAt):
		return false, nil
	}
	if until, ok, err := db.inFlight(ctx, id, now); err != nil {
		return false, fmt.Errorf("retry delivery %d: %w", id, err)
	} else if ok {
		return false, fmt.Errorf("retry delivery %d: %w", id, &backstop.InFlightError{Until: until})
	}
	return false, nil
}

// RevokeSession records that the dashboard session id ended (signed out)
// before it expires at expires. Revoking it again changes nothing.
func (db *DB) RevokeSession(ctx context.Context, id string, expires time.Time) error {
	if id == "" {
		return errors.New("revoke session: empty id")
	}
	if _, err := db.w.ExecContext(ctx, `INSERT INTO revoked_sessions (id, expires_at) VALUES (?, ?)
		ON CONFLICT (id) DO NOTHING`, id, backstop.CanonicalTime(expires)); err != nil {
		return fmt.Errorf("revoke session: %w", err)
	}
	return nil
}

// SessionRevoked reports whether the dashboard session id was revoked.
func (db *DB) SessionRevoked(ctx context.Context, id string) (bool, error) {
	var n int
	if err := db.r.GetContext(ctx, &n, `SELECT count(*) FROM revoked_sessions WHERE id = ?`, id); err != nil {
		return false, fmt.Errorf("session revoked: %w", err)
	}
	return n > 0, nil
}

// PruneRevokedSessions forgets revoked sessions that expired before now
// (their cookies are refused anyway) and returns how many.
func (db *DB) PruneRevokedSessions(ctx context.Context, now time.Time) (int64, error) {
	res, err := db.w.ExecContext(ctx, `DELETE FROM revoked_sessions WHERE expires_at < ?`, backstop.CanonicalTime(now))
	if err != nil {
		return 0, fmt.Errorf("prune revoked sessions: %w", err)
	}
	return res.RowsAffected()
}

// LogFilter selects the rows of the dashboard's delivery log. Zero fields
// select everything.
type LogFilter struct {
	Status    string // one of the Status* constants
	Target    string // a target's name
	EventType string // an event type such as "payment.succeeded"
	// DeliveredSince leaves out the delivered rows queued before it. It
	// applies to delivered rows only: a row still queued (a disabled
	// target's backlog) or dead-lettered is listed whatever its age, as
	// the dead letters' counts include it.
	DeliveredSince time.Time
	Limit          int // at most this many rows; 0 means 100
	// Before, when positive, selects the rows older than the row Before
	// (id < Before): the next page of a log whose last row shown is
	// Before, whatever was queued since it was drawn.
	Before int64
	// After, when positive, selects the rows newer than the row After
	// (id > After), the Limit oldest of them: the page before one whose
	// first row shown is After. Before and After are not used together.
	After int64
}

// DeliveryLog returns the outbox rows f selects, newest first (the most
// recently queued first). It pages by id (f.Before, f.After), so rows
// queued meanwhile neither push a row onto the next page nor hide one. It
// fails on an unknown f.Status, or on f.Before and f.After both set.
func (db *DB) DeliveryLog(ctx context.Context, f LogFilter) ([]OutboxRow, error) {
	s := outboxSelect{status: f.Status, target: f.Target, eventType: f.EventType, limit: f.Limit}
	if !f.DeliveredSince.IsZero() {
		s.where = ` AND (status <> 'delivered' OR created_at >= ?)`
		s.args = append(s.args, backstop.CanonicalTime(f.DeliveredSince))
	}
	switch {
	case f.Before > 0 && f.After > 0:
		return nil, errors.New("list the delivery log: both before and after a row")
	case f.After > 0:
		s.where += ` AND id > ?`
		s.args = append(s.args, f.After)
		s.ascending = true
	case f.Before > 0:
		s.where += ` AND id < ?`
		s.args = append(s.args, f.Before)
	}
	rows, err := db.selectOutbox(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("list the delivery log: %w", err)
	}
	if f.After > 0 {
		slices.Reverse(rows)
	}
	return rows, nil
}

// lastAttemptsSQL reads the newest attempts of a delivery through its
// index (delivery_id, then id, the order they were logged in), never the
// others: a delivery answered 429 for an hour has thousands.
const lastAttemptsSQL = `SELECT id, delivery_id, target, url, attempt, status_code,
	error, body, request_id, duration_ms, at, redirect
	FROM delivery_attempts WHERE delivery_id = ? ORDER BY id DESC LIMIT ?`

// lastAttemptsCountSQL counts a delivery's attempts from its index alone.
const lastAttemptsCountSQL = `SELECT count(*) FROM delivery_attempts WHERE delivery_id = ?`

// LastAttempts returns the last n attempts logged for the delivery
// deliveryID (the n logged last), redirects included, oldest first as
// Attempts orders them, and how many it has in all. It reads those n
// rows only.
func (db *DB) LastAttempts(ctx context.Context, deliveryID int64, n int) ([]Attempt, int, error) {
	tx, err := db.r.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, 0, fmt.Errorf("list the last attempts of delivery %d: begin: %w", deliveryID, err)
	}
	defer tx.Rollback()
	var total int
	if err := tx.GetContext(ctx, &total, lastAttemptsCountSQL, deliveryID); err != nil {
		return nil, 0, fmt.Errorf("count the attempts of delivery %d: %w", deliveryID, err)
	}
	var rows []attemptRow
	if err := tx.SelectContext(ctx, &rows, lastAttemptsSQL, deliveryID, max(n, 0)); err != nil {
		return nil, 0, fmt.Errorf("list the last attempts of delivery %d: %w", deliveryID, err)
	}
	out := make([]Attempt, len(rows))
	for i, r := range rows {
		at, err := backstop.ParseTime(r.At)
		if err != nil {
			return nil, 0, fmt.Errorf("list the last attempts of delivery %d: attempt %d: %w", deliveryID, r.ID, err)
		}
		out[i] = Attempt{ID: r.ID, DeliveryID: r.DeliveryID, Target: r.Target, URL: r.URL, Attempt: r.Attempt,
			StatusCode: r.StatusCode, Error: r.Error, Body: r.Body, RequestID: r.RequestID,
			Duration: time.Duration(math.Round(r.DurationMS * float64(time.Millisecond))), At: at, Redirect: r.Redirect}
	}
	slices.SortFunc(out, func(a, b Attempt) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out, total, nil
}
