package store

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/jsonvalid"
)

// Delivery statuses of an outbox row.
const (
	StatusPending    = "pending"
	StatusRetrying   = "retrying"
	StatusDelivered  = "delivered"
	StatusDeadLetter = "dead_letter"
)

// MaxAttemptBody is how much of a response body an attempt keeps: the first
// 4 KiB (DESIGN.md, Delivery).
const MaxAttemptBody = 4 << 10

// defaultDeliveriesLimit is the page size of Deliveries when the filter sets
// none.
const defaultDeliveriesLimit = 100

// noTime is what a time column without a value holds where the column is
// NOT NULL (outbox.next_attempt_at of a row that is not retrying): the
// canonical zero time, which reads back as the zero time.Time and sorts
// before every real time, so such a row is always due.
var noTime = backstop.CanonicalTime(time.Time{})

// Attempt is one delivery attempt as logged in delivery_attempts.
type Attempt = backstop.DeliveryAttempt

// Outcome is what an attempt did to its delivery.
type Outcome = backstop.DeliveryOutcome

// DeliveryFilter selects outbox rows for Deliveries. Zero fields select
// everything.
type DeliveryFilter struct {
	Status    string    // one of the Status* constants
	Target    string    // a target's name
	EventType string    // an event type such as "payment.succeeded", or a glob of them as targets' events take ("payment.*")
	Since     time.Time // rows queued at or after Since
	Limit     int       // at most this many rows; 0 means 100
	Offset    int       // skip this many rows first
}

// TargetState is a delivery target's queue and its remembered state.
type TargetState = backstop.TargetState

// Statements of the dispatcher's hot path: every claim and every attempt.
const (
	// claimSelectSQL reads a target's due rows in queue order: queued,
	// next_attempt_at come, and not claimed (claimed_until NULL, or past:
	// a claim its process left). The rows claimed and not yet recorded
	// (a few batches at the head of the queue) are passed over in
	// outbox_due itself, which holds claimed_until (migration 0017), so
	// that only the rows taken are read from the table.
	claimSelectSQL = `SELECT ` + outboxColumns + ` FROM outbox
		WHERE target = ?1 AND (status = 'pending' OR status = 'retrying') AND next_attempt_at <= ?2
		AND (claimed_until IS NULL OR claimed_until <= ?2)
		ORDER BY next_attempt_at, id LIMIT ?3`
	// claimLeaseSQL leases the rows claimSelectSQL read, by id (a JSON
	// array), rather than running the selection again: it sets their
	// claimed_until alone, so that they keep their place in the queue
	// (next_attempt_at). OR FAIL, here and in the other UPDATEs of many
	// rows, spares SQLite a statement journal (a copy of every page the
	// statement changes, so that a failure could undo it alone): the
	// caller rolls the whole transaction back on any error anyway.
	claimLeaseSQL    = `UPDATE OR FAIL outbox SET claimed_until = ?1 WHERE id IN (SELECT value FROM json_each(?2))`
	insertAttemptSQL = `INSERT INTO delivery_attempts
		(delivery_id, target, url, attempt, status_code, error, body, request_id, duration_ms, at, redirect)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	// recordOutcomeSQL applies an outcome; with a lease (?8 not NULL) only
	// to a delivery that still holds it (see Outcome.Lease). The claim
	// ends with it (claimed_until cleared), unless the outcome keeps the
	// row under the lease (a 429's, whose next attempt is the lease's end:
	// the dispatcher sends it again itself once the pause ends), which
	// leaves the row in its place in the queue too (next_attempt_at as it
	// was). The attempt count never goes back: a redirect may have taken a
	// number past an earlier attempt's (see ReserveAttempt).
	recordOutcomeSQL = `UPDATE outbox SET status = ?1, attempts = max(attempts, ?2),
		next_attempt_at = CASE WHEN ?3 = ?8 THEN next_attempt_at ELSE ?3 END,
		last_status = ?4, last_error = ?5, updated_at = ?6, failures = ?9,
		claimed_until = CASE WHEN ?3 = ?8 THEN claimed_until END WHERE id = ?7
		AND (?8 IS NULL OR (claimed_until = ?8 AND (status = 'pending' OR status = 'retrying')))`
	// recordRedirectSQL moves a delivery's attempt count past a redirect's
	// number (?2), changing nothing else; it is how a redirect finds its
	// delivery.
	recordRedirectSQL = `UPDATE outbox SET attempts = max(attempts, ?2) WHERE id = ?1`
	deliveryExistsSQL = `SELECT count(*) FROM outbox WHERE id = ?`
	// lastAttemptSQL is the largest attempt id in use, after which
	// recordMany allots the ids of the attempts it logs.
	lastAttemptSQL = `SELECT coalesce(max(id), 0) FROM delivery_attempts`
	// targetQueueSQL reads, in one statement and so from one snapshot, a
	// target's state (no state row: neither paused nor disabled) and,
	// when ?2 is true, its queued rows by status (a CASE branch not taken
	// runs no subquery).
	targetQueueSQL = `SELECT
		CASE WHEN ?2 THEN (SELECT count(*) FROM outbox WHERE target = ?1 AND status = 'pending') ELSE 0 END AS pending,
		CASE WHEN ?2 THEN (SELECT count(*) FROM outbox WHERE target = ?1 AND status = 'retrying') ELSE 0 END AS retrying,
		s.paused_until, coalesce(s.disabled, 0) AS disabled, coalesce(s.disabled_reason, '') AS disabled_reason,
		s.disabled_at
		FROM (SELECT 1) LEFT JOIN target_state AS s ON s.name = ?1`
)

// deliveryStmts are the delivery hot-path statements, prepared once per DB
// (in prepare) and closed with it: the writes on the writer connection,
// targetQueue on the readers.
type deliveryStmts struct {
	claimSelect, claimLease, insertAttempt, recordOutcome, lastAttempt *sqlx.Stmt
	enqueue                                                            *sqlx.Stmt // the webhook proxy's insert
	targetQueue                                                        *sqlx.Stmt

	// mu guards chunks: the multi-row statements of RecordAttempts by
	// chunk size, prepared when first needed.
	mu     sync.Mutex
	closed bool
	chunks map[int]chunkStmts

	// dispatchMu guards releaseDispatch, which releases the dispatch
	// claim once the DB claimed deliveries (see startDispatch);
	// dispatching is set once it holds it, for the claims after the first.
	dispatchMu      sync.Mutex
	releaseDispatch func() error
	dispatching     atomic.Bool
}

// isClosed reports whether close ran.
func (st *deliveryStmts) isClosed() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.closed
}

// chunkStmts record recordChunk attempts or fewer (a power of two) in two
// statements: their outcomes and their log rows.
type chunkStmts struct{ outcomes, inserts *sqlx.Stmt }

// prepareDelivery prepares db's delivery statements.
func (db *DB) prepareDelivery(ctx context.Context) error {
	st := &deliveryStmts{}
	for _, p := range []struct {
		dst **sqlx.Stmt
		sql string
	}{
		{&st.claimSelect, claimSelectSQL},
		{&st.claimLease, claimLeaseSQL},
		{&st.insertAttempt, insertAttemptSQL},
		{&st.recordOutcome, recordOutcomeSQL},
		{&st.lastAttempt, lastAttemptSQL},
		{&st.enqueue, enqueueSQL},
	} {
		s, err := db.w.PreparexContext(ctx, p.sql)
		if err != nil {
			st.close()
			return fmt.Errorf("prepare delivery statements: %w", err)
		}
		*p.dst = s
	}
	s, err := db.r.PreparexContext(ctx, targetQueueSQL)
	if err != nil {
		st.close()
		return fmt.Errorf("prepare delivery statements: %w", err)
	}
	st.targetQueue = s
	db.delivery = st
	return nil
}

// deliveryStmts returns db's delivery statements.
func (db *DB) deliveryStmts(context.Context) (*deliveryStmts, error) {
	if db.delivery == nil {
		return nil, errors.New("store is closed or not open")
	}
	return db.delivery, nil
}

// close closes the statements prepared so far.
func (st *deliveryStmts) close() {
	if st == nil {
		return
	}
	for _, s := range []*sqlx.Stmt{st.claimSelect, st.claimLease, st.insertAttempt, st.recordOutcome, st.lastAttempt, st.enqueue, st.targetQueue} {
		if s != nil {
			s.Close()
		}
	}
	st.mu.Lock()
	st.closed = true
	for _, c := range st.chunks {
		c.outcomes.Close()
		c.inserts.Close()
	}
	st.chunks = nil
	st.mu.Unlock()
	st.dispatchMu.Lock()
	defer st.dispatchMu.Unlock()
	if st.releaseDispatch != nil {
		st.releaseDispatch()
		st.releaseDispatch = nil
	}
}

// ClaimDue returns up to limit rows of target that are due at now (status
// pending or retrying, next_attempt_at not after now, and not claimed:
// claimed_until unset or not after now), oldest first by next_attempt_at
// then id, and in the same transaction leases them: their claimed_until
// is set to now+lease, so that no other claim returns them before the
// lease ends and, should the process die mid-attempt, they are due again
// after it (at-least-once), in their own place in the queue: a claim does
// not move next_attempt_at. The rows returned show their values before
// the claim. A target's pause or disabled state is not consulted: that is
// the dispatcher's decision.
//
// Only a dispatcher claims. The first claim of a DB makes it one of the
// store's dispatchers (see startDispatch), until it is closed: when it is
// the only one, the claims still held in the store were left by a process
// that is gone, and it ends them first, so that their rows are due again
// at once rather than when their lease would have ended.
func (db *DB) ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]OutboxRow, error) {
	if limit <= 0 || lease <= 0 {
		return nil, fmt.Errorf("claim due deliveries of %s: limit %d and lease %v must be positive", target, limit, lease)
	}
	st, err := db.deliveryStmts(ctx)
	if err != nil {
		return nil, fmt.Errorf("claim due deliveries of %s: %w", target, err)
	}
	if err := db.startDispatch(ctx, st); err != nil {
		return nil, fmt.Errorf("claim due deliveries of %s: %w", target, err)
	}
	rows, err := db.claimDue(ctx, st, target, now, limit, lease)
	if err != nil {
		return nil, fmt.Errorf("claim due deliveries of %s: %w", target, err)
	}
	return rows, nil
}

// dispatchClaimName is the claim (see Claim and ClaimShared) every DB that
// claims deliveries holds, shared, from before its first claim until it is
// closed: several serves sharing the store (governor.redis) dispatch at
// once, each holding it, and it ends with its process, however that dies.
const dispatchClaimName = "dispatch"

// startDispatch makes db one of the store's dispatchers, once: it holds
// the dispatch claim shared from then on (st.close releases it). Before,
// when it can take that claim alone (no other process dispatches from the
// store), every claim of a delivery still in the store is stale, left by
// a process that died mid-claim (SIGKILL, a crash, a power cut), and it
// ends them all (releaseStaleClaims): their rows are due again at once, in
// their place in the queue, instead of after their lease. Should another
// dispatcher start meanwhile, it finds the claim taken, and does not end
// the claims this one is about to make.
func (db *DB) startDispatch(ctx context.Context, st *deliveryStmts) error {
	if st.dispatching.Load() {
		return nil
	}
	st.dispatchMu.Lock()
	defer st.dispatchMu.Unlock()
	if st.releaseDispatch != nil {
		return nil
	}
	if st.isClosed() {
		return errors.New("store is closed")
	}
	alone, err := Claim(ctx, db.path, dispatchClaimName)
	switch {
	case err == nil:
		_, err = db.releaseStaleClaims(ctx)
		err = errors.Join(err, alone())
		if err != nil {
			return fmt.Errorf("end the claims a stopped process left: %w", err)
		}
	case !errors.Is(err, ErrClaimed):
		return err
	}
	release, err := ClaimShared(ctx, db.path, dispatchClaimName)
	if err != nil {
		return err
	}
	st.releaseDispatch = release
	st.dispatching.Store(true)
	return nil
}

// releaseStaleClaims ends the claim of every queued delivery (all of them
// stale: no other dispatcher holds the store, see startDispatch) and
// returns how many it ended. The claimed rows are found in outbox_due
// alone on a reader, so the store's writer is held only for the few rows
// found.
func (db *DB) releaseStaleClaims(ctx context.Context) (int64, error) {
	var ids []int64
	if err := db.r.SelectContext(ctx, &ids, `SELECT id FROM outbox INDEXED BY outbox_due
		WHERE (status = 'pending' OR status = 'retrying') AND claimed_until IS NOT NULL`); err != nil {
		return 0, err
	}
	var total int64
	for start := 0; start < len(ids); start += pruneChunk {
		n, err := db.execCount(ctx, `UPDATE OR FAIL outbox SET claimed_until = NULL
			WHERE id IN (SELECT value FROM json_each(?)) AND claimed_until IS NOT NULL`,
			jsonIDs(ids[start:min(start+pruneChunk, len(ids))]))
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func (db *DB) claimDue(ctx context.Context, st *deliveryStmts, target string, now time.Time, limit int, lease time.Duration) ([]OutboxRow, error) {
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	// As in emit: no goroutine per statement to watch ctx; a cancelled ctx
	// still fails the commit.
	sctx := context.WithoutCancel(ctx)
	due, err := tx.StmtxContext(sctx, st.claimSelect).QueryContext(sctx, target, backstop.CanonicalTime(now), limit)
	if err != nil {
		return nil, err
	}
	rows, err := scanOutbox(due, limit)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	if _, err := tx.StmtxContext(sctx, st.claimLease).ExecContext(sctx,
		backstop.CanonicalTime(now.Add(lease)), jsonIDs(ids)); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return rows, nil
}

// jsonIDs returns ids as a JSON array, for json_each in an IN list (one
// statement, prepared once, whatever the number of ids).
func jsonIDs(ids []int64) string {
	b := make([]byte, 0, 2+len(ids)*8)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(append(b, ']'))
}

// lastError is what an outcome leaves in outbox.last_error: the attempt's
// transport error or, when the target answered, the start of its body;
// nothing once delivered (a 2xx's body is no error).
func lastError(a Attempt, out Outcome, body string) string {
	switch {
	case out.Status == StatusDelivered:
		return ""
	case a.Error != "":
		return a.Error
	}
	return body
}

// scanOutbox reads and converts rows of outboxColumns (limit is what the
// query asked for, a hint for the slice), as sqlx and convertOutbox would but without sqlx's reflection or a
// second slice (a claim reads a batch on every call), and closes them.
func scanOutbox(rows *sql.Rows, limit int) ([]OutboxRow, error) {
	defer rows.Close()
	var out []OutboxRow
	var r outboxRow
	for rows.Next() {
		if out == nil {
			out = make([]OutboxRow, 0, min(limit, 16)) // a claim is often of one row
		}
		if err := rows.Scan(&r.ID, &r.Target, &r.EventID, &r.EventType, &r.Payload, &r.Status,
			&r.Attempts, &r.Failures, &r.NextAttemptAt, &r.CreatedAt, &r.UpdatedAt, &r.LastStatus, &r.LastError, &r.ProxyKey); err != nil {
			return nil, err
		}
		o, err := r.outboxRow()
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

// Release ends the claim of the rows ids, claimed by ClaimDue but not
// attempted (the dispatcher stopped, their target was paused or
// disabled, before it sent them), so that each is due again at once in its
// place in the queue, ahead of the rows queued since, rather than when its
// lease ends: a claim leaves next_attempt_at as it was, so there is no due
// time to restore, and due, the NextAttemptAt each row had when it was
// claimed, is not used (it may be nil). lease is the end of the lease the
// claim gave them (its now+lease): only rows that still hold it are
// released, so that a row claimed again since (its lease ran out),
// retried or attempted is left alone, as are rows no longer queued
// (pending or retrying). It returns how many rows it released.
func (db *DB) Release(ctx context.Context, ids []int64, due []time.Time, lease, now time.Time) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	n, err := db.execCount(ctx, `UPDATE OR FAIL outbox SET claimed_until = NULL
		WHERE id IN (SELECT value FROM json_each(?)) AND claimed_until = ?
		AND (status = 'pending' OR status = 'retrying')`,
		jsonIDs(ids), backstop.CanonicalTime(lease))
	if err != nil {
		return 0, fmt.Errorf("release %d claimed deliveries: %w", len(ids), err)
	}
	return n, nil
}

// AttemptOutcome is one attempt to record and what it did to its delivery,
// for RecordAttempts.
type AttemptOutcome struct {
	Attempt Attempt
	Outcome Outcome
}

// RecordAttempt logs attempt a and, in the same transaction, applies its
// outcome to the delivery a.DeliveryID: status out.Status, attempts
// a.Attempt (or more: the count never goes back), failures out.Failures
// (0 to a.Attempt), next attempt out.NextAttemptAt for a retrying delivery
// (none otherwise), the last status code and the last error (a.Error, or
// the first MaxAttemptBody bytes of the body when a.Error is empty),
// updated at a.At. With out.Lease set, the outcome applies only while the
// delivery still holds that lease, and a retrying outcome whose
// NextAttemptAt is out.Lease (a 429's, which the dispatcher sends again
// itself once its target's pause ends) keeps the delivery claimed and in
// its place in the queue (its next_attempt_at as it was): should the
// process die, it is due again, first, when the claim ends. The claim of
// any other outcome ends with it. A redirect (a.Redirect) is logged, out
// is ignored, and the delivery is left as it was but for its attempt
// count, which moves up to a.Attempt if it is below (see ReserveAttempt).
// A zero a.At means the store's clock. It returns the attempt's id, and an
// error wrapping backstop.ErrNotFound when there is no such delivery.
func (db *DB) RecordAttempt(ctx context.Context, a Attempt, out Outcome) (int64, error) {
	ids, err := db.RecordAttempts(ctx, []AttemptOutcome{{Attempt: a, Outcome: out}})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// RecordAttempts records each of items as RecordAttempt does, in order and
// in one transaction, and returns the attempts' ids in the same order. It
// records all of them or none: when one fails (an invalid outcome, or an
// error wrapping backstop.ErrNotFound for an unknown delivery) the error
// names that item and nothing is recorded. Recording the same delivery
// twice in one call applies both outcomes in order.
func (db *DB) RecordAttempts(ctx context.Context, items []AttemptOutcome) ([]int64, error) {
	if len(items) == 0 {
		return []int64{}, nil
	}
	ids, i, err := db.recordAttempts(ctx, items)
	switch {
	case err == nil:
		return ids, nil
	case len(items) == 1:
		a := items[0].Attempt
		return nil, fmt.Errorf("record attempt %d of delivery %d: %w", a.Attempt, a.DeliveryID, err)
	case i < 0:
		return nil, fmt.Errorf("record %d attempts: %w", len(items), err)
	default:
		a := items[i].Attempt
		return nil, fmt.Errorf("record %d attempts: item %d, attempt %d of delivery %d: %w",
			len(items), i+1, a.Attempt, a.DeliveryID, err)
	}
}

// attemptArgs are the statement arguments of one validated attempt. The
// ones given to two statements, or the same for many attempts, are boxed
// once (a string or an int64 put in an any is a heap allocation).
type attemptArgs struct {
	next, at any // canonical times (next is noTimeArg unless retrying)
	body     string
	lease    any // the canonical Outcome.Lease, or nil (no lease to hold)
}

// Statement arguments boxed once: the outcome statuses and noTime.
var (
	noTimeArg    any = noTime
	deliveredArg any = StatusDelivered
	retryingArg  any = StatusRetrying
	deadArg      any = StatusDeadLetter
)

// statusArg is status as a statement argument.
func statusArg(status string) any {
	switch status {
	case StatusDelivered:
		return deliveredArg
	case StatusRetrying:
		return retryingArg
	case StatusDeadLetter:
		return deadArg
	}
	return status
}

// leaseArgs are the leases made statement arguments so far in one
// record: the attempts of the rows of one claim share their lease, which
// is put in canonical form once (a record holds the attempts of a few
// claims, so a look through them all costs less).
type leaseArgs []leaseArg

// leaseArg is one lease and its statement argument.
type leaseArg struct {
	t   time.Time
	arg any
}

// of returns t in canonical form as a statement argument.
func (ls *leaseArgs) of(t time.Time) any {
	for _, l := range *ls {
		if l.t.Equal(t) {
			return l.arg
		}
	}
	arg := any(backstop.CanonicalTime(t))
	*ls = append(*ls, leaseArg{t, arg})
	return arg
}

// checkAttempt validates one attempt and its outcome and returns its
// statement arguments, with the lease from leases; a zero a.At becomes
// now.
func checkAttempt(a Attempt, out Outcome, now func() time.Time, leases *leaseArgs) (attemptArgs, error) {
	if a.Attempt < 1 {
		return attemptArgs{}, errors.New("attempt numbers start at 1")
	}
	if out.Failures < 0 || out.Failures > a.Attempt {
		return attemptArgs{}, fmt.Errorf("%d failures after attempt %d: want 0 to %d", out.Failures, a.Attempt, a.Attempt)
	}
	next := noTimeArg
	if !a.Redirect {
		switch out.Status {
		case StatusRetrying:
			if out.NextAttemptAt.IsZero() {
				return attemptArgs{}, errors.New("a retrying outcome needs its next attempt time")
			}
			next = backstop.CanonicalTime(out.NextAttemptAt)
		case StatusDelivered, StatusDeadLetter:
		default:
			return attemptArgs{}, fmt.Errorf("outcome status %q: want %s, %s or %s", out.Status, StatusDelivered, StatusRetrying, StatusDeadLetter)
		}
	}
	at := a.At
	if at.IsZero() {
		at = now()
	}
	var lease any
	if !out.Lease.IsZero() {
		lease = leases.of(out.Lease)
	}
	return attemptArgs{next: next, at: backstop.CanonicalTime(at), body: truncateBody(a.Body), lease: lease}, nil
}

// recordAttempts records items in one transaction. On error, failed is the
// index of the item at fault, or -1 when the transaction as a whole failed.
func (db *DB) recordAttempts(ctx context.Context, items []AttemptOutcome) (ids []int64, failed int, err error) {
	args := make([]attemptArgs, len(items))
	var leases leaseArgs
	for i, it := range items {
		if args[i], err = checkAttempt(it.Attempt, it.Outcome, db.now, &leases); err != nil {
			return nil, i, err
		}
	}
	st, err := db.deliveryStmts(ctx)
	if err != nil {
		return nil, -1, err
	}
	if manyAtOnce(items) {
		ids, err := db.recordMany(ctx, st, items, args)
		if !errors.Is(err, errNotApplied) {
			return ids, -1, err
		}
		// Record them one by one to name the unknown delivery, or to log
		// the attempts whose delivery no longer holds their lease.
	}
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return nil, -1, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	// As in emit: no goroutine per statement to watch ctx; ctx is checked
	// between items and a cancelled ctx still fails the commit.
	sctx := context.WithoutCancel(ctx)
	outcome := tx.StmtxContext(sctx, st.recordOutcome)
	insert := tx.StmtxContext(sctx, st.insertAttempt)
	ids = make([]int64, len(items))
	for i, it := range items {
		if err := ctx.Err(); err != nil {
			return nil, -1, err
		}
		if ids[i], err = recordOne(sctx, tx, outcome, insert, it, args[i]); err != nil {
			return nil, i, err
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, -1, fmt.Errorf("commit: %w", err)
	}
	return ids, -1, nil
}

// recordChunk is the most attempts one multi-row statement records. The
// log rows' INSERT keeps a statement journal (an immediate foreign key can
// fail it halfway), which the writer holds in memory (temp_store=MEMORY:
// by default SQLite spills one over 64 KiB to a temporary file, and with
// 2,000 rows queued per target even 16 attempts did, a pwrite for every
// page they touched, a third of the cost of recording). 32 attempts cost
// about 15% less each than 16; the journal of 32 is a few hundred KiB.
const recordChunk = 32

// errNotApplied is recordMany's: an item's outcome applies to no delivery
// (there is none, or it no longer holds the item's lease).
var errNotApplied = errors.New("an outcome applies to no delivery")

// manyAtOnce reports whether items may be recorded with multi-row
// statements: several, none a redirect (which checks its delivery exists
// instead of updating it), and no delivery twice (one statement would
// apply only one of its outcomes).
func manyAtOnce(items []AttemptOutcome) bool {
	if len(items) < 2 {
		return false
	}
	seen := make(map[int64]struct{}, len(items))
	for _, it := range items {
		if it.Attempt.Redirect {
			return false
		}
		if _, dup := seen[it.Attempt.DeliveryID]; dup {
			return false
		}
		seen[it.Attempt.DeliveryID] = struct{}{}
	}
	return true
}

// recordMany records items, which manyAtOnce accepts, as recordOne would
// one by one, but in chunks of multi-row statements: a statement per chunk
// applies the outcomes and one logs the attempts, with ids allotted after
// the largest in use. It returns errNotApplied, having recorded nothing,
// when an item's outcome applies to no delivery (none, or its lease lost).
func (db *DB) recordMany(ctx context.Context, st *deliveryStmts, items []AttemptOutcome, args []attemptArgs) ([]int64, error) {
	// The statements are prepared before the transaction: the writer has
	// one connection, which the transaction holds.
	sizes := make([]int, 0, 8)
	for left := len(items); left > 0; {
		n := recordChunk
		for n > left {
			n /= 2
		}
		sizes = append(sizes, n)
		left -= n
	}
	chunks := make([]chunkStmts, len(sizes))
	for i, n := range sizes {
		c, err := st.chunk(ctx, db.w, n)
		if err != nil {
			return nil, err
		}
		chunks[i] = c
	}
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	sctx := context.WithoutCancel(ctx) // as in recordAttempts
	var last int64
	if err := tx.StmtxContext(sctx, st.lastAttempt).QueryRowContext(sctx).Scan(&last); err != nil {
		return nil, err
	}
	ids := make([]int64, len(items))
	for i := range ids {
		ids[i] = last + 1 + int64(i)
	}
	start := 0
	for k, n := range sizes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c := chunks[k]
		outs := make([]any, 0, 9*n)
		logs := make([]any, 0, 12*n)
		for i := start; i < start+n; i++ {
			a, out, arg := items[i].Attempt, items[i].Outcome, args[i]
			lastErr := lastError(a, out, arg.body)
			delivery, attempt := any(a.DeliveryID), any(int64(a.Attempt))
			outs = append(outs, delivery, statusArg(out.Status), attempt, arg.next, nullInt(a.StatusCode), nullString(lastErr), arg.at, arg.lease,
				int64(out.Failures))
			logs = append(logs, ids[i], delivery, a.Target, a.URL, attempt, int64(a.StatusCode), a.Error, arg.body,
				a.RequestID, float64(a.Duration)/float64(time.Millisecond), arg.at, a.Redirect)
		}
		res, err := tx.StmtxContext(sctx, c.outcomes).ExecContext(sctx, outs...)
		if err != nil {
			return nil, err
		}
		if updated, err := res.RowsAffected(); err != nil {
			return nil, err
		} else if updated != int64(n) {
			return nil, errNotApplied
		}
		if _, err := tx.StmtxContext(sctx, c.inserts).ExecContext(sctx, logs...); err != nil {
			return nil, err
		}
		start += n
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return ids, nil
}

// chunk returns the multi-row statements for n attempts, preparing them on
// w the first time; it must not be called inside a write transaction.
func (st *deliveryStmts) chunk(ctx context.Context, w *sqlx.DB, n int) (chunkStmts, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return chunkStmts{}, errors.New("store is closed")
	}
	if c, ok := st.chunks[n]; ok {
		return c, nil
	}
	// As recordOutcomeSQL, one row of VALUES per attempt.
	outcomes, err := w.PreparexContext(ctx, `UPDATE OR FAIL outbox SET status = v.column2, attempts = max(outbox.attempts, v.column3),
		next_attempt_at = CASE WHEN v.column4 = v.column8 THEN outbox.next_attempt_at ELSE v.column4 END,
		last_status = v.column5, last_error = v.column6, updated_at = v.column7,
		failures = v.column9, claimed_until = CASE WHEN v.column4 = v.column8 THEN outbox.claimed_until END
		FROM (VALUES `+rowsOf(n, 9)+`) AS v WHERE outbox.id = v.column1
		AND (v.column8 IS NULL OR (outbox.claimed_until = v.column8
			AND (outbox.status = 'pending' OR outbox.status = 'retrying')))`)
	if err != nil {
		return chunkStmts{}, fmt.Errorf("prepare outcomes of %d attempts: %w", n, err)
	}
	inserts, err := w.PreparexContext(ctx, `INSERT INTO delivery_attempts
		(id, delivery_id, target, url, attempt, status_code, error, body, request_id, duration_ms, at, redirect)
		VALUES `+rowsOf(n, 12))
	if err != nil {
		outcomes.Close()
		return chunkStmts{}, fmt.Errorf("prepare log of %d attempts: %w", n, err)
	}
	if st.chunks == nil {
		st.chunks = make(map[int]chunkStmts)
	}
	c := chunkStmts{outcomes: outcomes, inserts: inserts}
	st.chunks[n] = c
	return c, nil
}

// rowsOf returns n rows of cols placeholders for a VALUES list:
// "(?, ?), (?, ?)".
func rowsOf(n, cols int) string {
	row := "(" + placeholders(cols) + ")"
	return strings.Repeat(row+", ", n-1) + row
}

// recordOne records one validated attempt inside tx, through outcome and
// insert (the delivery statements bound to tx), and returns its id.
func recordOne(ctx context.Context, tx *sqlx.Tx, outcome, insert *sqlx.Stmt, it AttemptOutcome, args attemptArgs) (int64, error) {
	a, out := it.Attempt, it.Outcome
	if a.Redirect {
		// Its number is the delivery's now (see ReserveAttempt): the next
		// attempt gets the one after it.
		res, err := tx.ExecContext(ctx, recordRedirectSQL, a.DeliveryID, a.Attempt)
		if err != nil {
			return 0, err
		}
		if n, err := res.RowsAffected(); err != nil {
			return 0, err
		} else if n == 0 {
			return 0, fmt.Errorf("no such delivery: %w", backstop.ErrNotFound)
		}
	} else {
		lastErr := lastError(a, out, args.body)
		res, err := outcome.ExecContext(ctx,
			statusArg(out.Status), a.Attempt, args.next, nullInt(a.StatusCode), nullString(lastErr), args.at, a.DeliveryID, args.lease,
			int64(out.Failures))
		if err != nil {
			return 0, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, err
		}
		if n == 0 && args.lease != nil {
			// Lease lost, or no delivery at all: the attempt is logged all
			// the same in the first case.
			if err := tx.GetContext(ctx, &n, deliveryExistsSQL, a.DeliveryID); err != nil {
				return 0, err
			}
		}
		if n == 0 {
			return 0, fmt.Errorf("no such delivery: %w", backstop.ErrNotFound)
		}
	}
	res, err := insert.ExecContext(ctx,
		a.DeliveryID, a.Target, a.URL, a.Attempt, a.StatusCode, a.Error, args.body, a.RequestID,
		float64(a.Duration)/float64(time.Millisecond), args.at, a.Redirect)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// truncateBody returns the first MaxAttemptBody bytes of s, cut back to the
// start of a UTF-8 sequence so that a character is not split.
func truncateBody(s string) string {
	if len(s) <= MaxAttemptBody {
		return s
	}
	n := MaxAttemptBody
	for n > MaxAttemptBody-utf8.UTFMax && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// nullInt is n, or NULL when n is zero.
func nullInt(n int) any {
	if n == 0 {
		return nil
	}
	return int64(n) // a driver.Value as it is, which database/sql need not convert
}

// attemptRow is one row of delivery_attempts as read back.
type attemptRow struct {
	ID         int64   `db:"id"`
	DeliveryID int64   `db:"delivery_id"`
	Target     string  `db:"target"`
	URL        string  `db:"url"`
	Attempt    int     `db:"attempt"`
	StatusCode int     `db:"status_code"`
	Error      string  `db:"error"`
	Body       string  `db:"body"`
	RequestID  string  `db:"request_id"`
	DurationMS float64 `db:"duration_ms"`
	At         string  `db:"at"`
	Redirect   bool    `db:"redirect"`
}

// Attempts returns the attempts logged for the delivery deliveryID, redirects
// included, oldest first; none for an unknown delivery.
func (db *DB) Attempts(ctx context.Context, deliveryID int64) ([]Attempt, error) {
	var rows []attemptRow
	if err := db.r.SelectContext(ctx, &rows, `SELECT id, delivery_id, target, url, attempt, status_code,
		error, body, request_id, duration_ms, at, redirect
		FROM delivery_attempts WHERE delivery_id = ? ORDER BY at, id`, deliveryID); err != nil {
		return nil, fmt.Errorf("list attempts of delivery %d: %w", deliveryID, err)
	}
	out := make([]Attempt, len(rows))
	for i, r := range rows {
		at, err := backstop.ParseTime(r.At)
		if err != nil {
			return nil, fmt.Errorf("list attempts of delivery %d: attempt %d: %w", deliveryID, r.ID, err)
		}
		out[i] = Attempt{
			ID:         r.ID,
			DeliveryID: r.DeliveryID,
			Target:     r.Target,
			URL:        r.URL,
			Attempt:    r.Attempt,
			StatusCode: r.StatusCode,
			Error:      r.Error,
			Body:       r.Body,
			RequestID:  r.RequestID,
			Duration:   time.Duration(math.Round(r.DurationMS * float64(time.Millisecond))),
			At:         at,
			Redirect:   r.Redirect,
		}
	}
	return out, nil
}

// Deliveries returns the outbox rows f selects, newest first (the most
// recently queued first). It fails on an unknown f.Status.
func (db *DB) Deliveries(ctx context.Context, f DeliveryFilter) ([]OutboxRow, error) {
	s := outboxSelect{status: f.Status, target: f.Target, eventType: f.EventType, limit: f.Limit, offset: max(f.Offset, 0)}
	if !f.Since.IsZero() {
		s.where = ` AND created_at >= ?`
		s.args = []any{backstop.CanonicalTime(f.Since)}
	}
	rows, err := db.selectOutbox(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	return rows, nil
}

// outboxSelect is a selection of outbox rows in id order: those of
// status, target and eventType (each when not empty) and of the condition
// where (" AND …", with its args), newest first (oldest first when
// ascending), limit of them (0: defaultDeliveriesLimit) after offset.
type outboxSelect struct {
	status, target, eventType string
	where                     string
	args                      []any
	ascending                 bool
	limit, offset             int
}

// selectOutbox returns the rows s selects. With a target or a status but
// not both (split), the rows are read per (target, status) pair, each
// through the (target, status) index, whose entries of one pair are in id
// order, and the pages merged. One query would be worse: for a status
// alone SQLite scans the table in id order, reading through millions of
// delivered rows for the few dead letters; for a target alone it sorts
// every row of the target. It fails on an unknown status.
func (db *DB) selectOutbox(ctx context.Context, s outboxSelect) ([]OutboxRow, error) {
	if s.limit <= 0 {
		s.limit = defaultDeliveriesLimit
	}
	if !s.split() {
		return selectOutboxOnce(ctx, db.r, s)
	}
	if _, _, err := outboxQuery(s.status, "", ""); err != nil {
		return nil, err
	}
	// One snapshot for every pair: a row whose status changes meanwhile
	// is read once, in one of them.
	tx, err := db.r.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	var targets []string
	if s.target == "" {
		if err := tx.SelectContext(ctx, &targets, targetsWithRowsSQL); err != nil {
			return nil, err
		}
	}
	var all []OutboxRow
	for _, part := range s.pairs(targets) {
		rows, err := selectOutboxOnce(ctx, tx, part)
		if err != nil {
			return nil, err
		}
		all = append(all, rows...)
	}
	slices.SortFunc(all, func(a, b OutboxRow) int {
		if s.ascending {
			return cmp.Compare(a.ID, b.ID)
		}
		return cmp.Compare(b.ID, a.ID)
	})
	all = all[min(s.offset, len(all)):]
	return all[:min(s.limit, len(all))], nil
}

// split reports whether s is read per (target, status) pair: it has a
// target or a status, not both.
func (s outboxSelect) split() bool { return (s.target == "") != (s.status == "") }

// pairs returns the selections of s, split, per (target, status) pair:
// one per target of targets (the targets with rows) for its status, or
// one per status for its target. Each selects its first offset+limit
// rows, which hold the merged page's.
func (s outboxSelect) pairs(targets []string) []outboxSelect {
	each := s
	each.limit, each.offset = s.offset+s.limit, 0
	var parts []outboxSelect
	if s.target == "" {
		for _, t := range targets {
			each.target = t
			parts = append(parts, each)
		}
		return parts
	}
	for _, st := range []string{StatusPending, StatusRetrying, StatusDelivered, StatusDeadLetter} {
		each.status = st
		parts = append(parts, each)
	}
	return parts
}

// query returns the SQL of s and its arguments.
func (s outboxSelect) query() (string, []any, error) {
	query, args, err := outboxQuery(s.status, s.target, s.eventType)
	if err != nil {
		return "", nil, err
	}
	query += s.where
	args = append(args, s.args...)
	if s.ascending {
		query += ` ORDER BY id LIMIT ? OFFSET ?`
	} else {
		query += ` ORDER BY id DESC LIMIT ? OFFSET ?`
	}
	return query, append(args, s.limit, s.offset), nil
}

// selectOutboxOnce returns the rows s selects with one query through q.
func selectOutboxOnce(ctx context.Context, q sqlx.QueryerContext, s outboxSelect) ([]OutboxRow, error) {
	query, args, err := s.query()
	if err != nil {
		return nil, err
	}
	var raw []outboxRow
	if err := sqlx.SelectContext(ctx, q, &raw, query, args...); err != nil {
		return nil, err
	}
	return convertOutbox(raw)
}

// outboxQuery is the start of a query of outbox rows: those of status,
// target and eventType, each when not empty. It fails on an unknown status.
func outboxQuery(status, target, eventType string) (string, []any, error) {
	q := `SELECT ` + outboxReadColumns + ` FROM outbox WHERE 1 = 1`
	var args []any
	switch status {
	case "":
	case StatusPending, StatusRetrying, StatusDelivered, StatusDeadLetter:
		q += ` AND status = ?`
		args = append(args, status)
	default:
		return "", nil, fmt.Errorf("status %q: want %s, %s, %s or %s",
			status, StatusPending, StatusRetrying, StatusDelivered, StatusDeadLetter)
	}
	if target != "" {
		q += ` AND target = ?`
		args = append(args, target)
	}
	switch {
	case eventType == "":
	case strings.ContainsAny(eventType, "*?["):
		// A glob, as a target's events are (backstop.MatchGlob: '*'
		// takes '/' too, as SQLite's GLOB does; GLOB has no '\' escape).
		if _, err := path.Match(eventType, ""); err != nil {
			return "", nil, fmt.Errorf("event type pattern %q: %w", eventType, err)
		}
		q += ` AND event_type GLOB ?`
		args = append(args, eventType)
	default:
		q += ` AND event_type = ?`
		args = append(args, eventType)
	}
	return q, args, nil
}

// Delivery returns the outbox row id; ok is false when there is none.
func (db *DB) Delivery(ctx context.Context, id int64) (row OutboxRow, ok bool, err error) {
	var raw outboxRow
	err = db.r.GetContext(ctx, &raw, `SELECT `+outboxReadColumns+` FROM outbox WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return OutboxRow{}, false, nil
	}
	if err != nil {
		return OutboxRow{}, false, fmt.Errorf("read delivery %d: %w", id, err)
	}
	if row, err = raw.outboxRow(); err != nil {
		return OutboxRow{}, false, fmt.Errorf("read delivery %d: %w", id, err)
	}
	return row, true, nil
}

// requeueSQL puts outbox rows back in their queue, due at once, with their
// failures counted from zero again (the whole retry schedule is theirs
// again); their attempts go on counting, so that the attempt log and
// X-Delivery-Attempt number every attempt once, and the last status and
// error are kept. A claim left on a row (its lease over, see
// notInFlightSQL) ends: it would otherwise be the token of a late outcome.
const requeueSQL = `UPDATE outbox SET status = 'pending', failures = 0, next_attempt_at = ?, updated_at = ?, claimed_until = NULL`

// notInFlightSQL is requeueSQL's condition that the delivery's attempt is
// not claimed for sending (see backstop.ErrInFlight); its parameter is now.
const notInFlightSQL = ` AND NOT (coalesce(claimed_until > ?, 0) AND (status = 'pending' OR status = 'retrying'))`

// inFlight returns the end of the claim of the delivery id when it is
// claimed for sending at now (see backstop.ErrInFlight), for the error of a
// retry that changed nothing; ok is false when it is not. It fails with an
// error wrapping backstop.ErrNotFound when there is no such delivery.
func (db *DB) inFlight(ctx context.Context, id int64, now time.Time) (until time.Time, ok bool, err error) {
	var v sql.NullString
	err = db.w.GetContext(ctx, &v, `SELECT CASE WHEN claimed_until > ?1 AND (status = 'pending' OR status = 'retrying')
		THEN claimed_until END FROM outbox WHERE id = ?2`, backstop.CanonicalTime(now), id)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, false, fmt.Errorf("no such delivery: %w", backstop.ErrNotFound)
	}
	if err != nil || !v.Valid {
		return time.Time{}, false, err
	}
	if until, err = backstop.ParseTime(v.String); err != nil {
		return time.Time{}, false, fmt.Errorf("claimed_until: %w", err)
	}
	return until, true, nil
}

// RetryDelivery puts the delivery id, whatever its status, back in its
// target's queue: pending, due at now, failures counted from zero (so it
// has the whole retry schedule again), attempts, last status and error
// kept. It fails with an error wrapping backstop.ErrNotFound
// when there is no such delivery, and with one wrapping backstop.ErrInFlight
// (a *backstop.InFlightError), changing nothing, while it is claimed for
// sending.
func (db *DB) RetryDelivery(ctx context.Context, id int64, now time.Time) error {
	stamp := backstop.CanonicalTime(now)
	res, err := db.w.ExecContext(ctx, requeueSQL+` WHERE id = ?`+notInFlightSQL, stamp, stamp, id, stamp)
	if err != nil {
		return fmt.Errorf("retry delivery %d: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("retry delivery %d: %w", id, err)
	}
	if n == 0 {
		// It exists: then only its claim (at the UPDATE, if not still)
		// kept it as it was.
		until, ok, err := db.inFlight(ctx, id, now)
		if err != nil {
			return fmt.Errorf("retry delivery %d: %w", id, err)
		}
		if !ok {
			until = now // the claim ended just now
		}
		return fmt.Errorf("retry delivery %d: %w", id, &backstop.InFlightError{Until: until})
	}
	return nil
}

// ReserveAttempt takes the next attempt number of the delivery id for a
// redirect (a manual send to another URL) and returns it: the delivery's
// attempt count moves up by one, and nothing else of it changes (its
// status, failures and next attempt stay as they were: the retry schedule
// counts failures, not attempts), so that the next attempt, a redirect's
// or its target's, gets the number after it. It fails, changing nothing,
// with an error wrapping backstop.ErrNotFound when there is no such
// delivery, and with one wrapping backstop.ErrInFlight (a
// *backstop.InFlightError) while the delivery is claimed for sending at
// now: the attempt in flight, or held through a 429's pause, already has
// the next number.
func (db *DB) ReserveAttempt(ctx context.Context, id int64, now time.Time) (int, error) {
	var n int
	err := db.w.GetContext(ctx, &n, `UPDATE outbox SET attempts = attempts + 1 WHERE id = ?`+notInFlightSQL+` RETURNING attempts`,
		id, backstop.CanonicalTime(now))
	if err == nil {
		return n, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("take an attempt number of delivery %d: %w", id, err)
	}
	until, ok, err := db.inFlight(ctx, id, now)
	if err != nil {
		return 0, fmt.Errorf("take an attempt number of delivery %d: %w", id, err)
	}
	if !ok {
		until = now // the claim ended just now
	}
	return 0, fmt.Errorf("take an attempt number of delivery %d: %w", id, &backstop.InFlightError{Until: until})
}

// RetryDead puts every dead letter of target back in its queue as
// RetryDelivery does, and returns how many. target must not be empty.
func (db *DB) RetryDead(ctx context.Context, target string, now time.Time) (int64, error) {
	return db.RetryDeadAsOf(ctx, target, now, now)
}

// RetryDeadAsOf is RetryDead for the dead letters of target as they were
// at asOf (when a page listing them was shown): a delivery that became a
// dead letter after asOf is left as it is, so that a second press of the
// same button queues nothing it did not show.
func (db *DB) RetryDeadAsOf(ctx context.Context, target string, asOf, now time.Time) (int64, error) {
	if target == "" {
		return 0, errors.New("retry dead letters: empty target")
	}
	stamp := backstop.CanonicalTime(now)
	res, err := db.w.ExecContext(ctx, requeueSQL+` WHERE target = ? AND status = 'dead_letter' AND updated_at <= ?`,
		stamp, stamp, target, backstop.CanonicalTime(asOf))
	if err != nil {
		return 0, fmt.Errorf("retry dead letters of %s: %w", target, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("retry dead letters of %s: %w", target, err)
	}
	return n, nil
}

// PurgeDead deletes the dead letters last updated before before, with their
// attempts, and returns how many deliveries it deleted. It deletes in short
// transactions: on error, the count says how many were deleted before it.
func (db *DB) PurgeDead(ctx context.Context, before time.Time) (int64, error) {
	n, err := db.deleteOutbox(ctx, StatusDeadLetter, before)
	if err != nil {
		return n, fmt.Errorf("purge dead letters: %w", err)
	}
	return n, nil
}

// PruneDelivered deletes the deliveries (outbox rows) delivered before
// before, with their attempts, and returns how many it deleted; rows still
// queued and dead letters stay. It deletes in short transactions, as
// PurgeDead does.
func (db *DB) PruneDelivered(ctx context.Context, before time.Time) (int64, error) {
	n, err := db.deleteOutbox(ctx, StatusDelivered, before)
	if err != nil {
		return n, fmt.Errorf("prune delivered deliveries: %w", err)
	}
	return n, nil
}

// deleteOutbox deletes the outbox rows in status last changed before
// before; their attempts go with them (ON DELETE CASCADE). No index serves
// that filter, and one would cost every delivery a write, so the rows are
// found by a scan in id order on a reader connection, which holds no write
// lock: the writer, which the intake's commits share, only deletes the
// ids found, a chunk per short transaction, checking status and age again
// (a row retried meanwhile stays).
func (db *DB) deleteOutbox(ctx context.Context, status string, before time.Time) (int64, error) {
	cutoff := backstop.CanonicalTime(before)
	var total, after int64
	for {
		var ids []int64
		if err := db.r.SelectContext(ctx, &ids, `SELECT id FROM outbox
			WHERE id > ? AND status = ? AND updated_at < ? ORDER BY id LIMIT ?`, after, status, cutoff, pruneChunk); err != nil {
			return total, err
		}
		if len(ids) == 0 {
			return total, nil
		}
		after = ids[len(ids)-1]
		n, err := db.execCount(ctx, `DELETE FROM outbox
			WHERE id IN (SELECT value FROM json_each(?)) AND status = ? AND updated_at < ?`, jsonIDs(ids), status, cutoff)
		total += n
		if err != nil {
			return total, err
		}
		if len(ids) < pruneChunk {
			return total, nil
		}
	}
}

// PruneAttempts deletes the attempts made before before, whatever their
// delivery's status, and returns how many it deleted. It deletes in short
// transactions: on error, the count says how many were deleted before it.
func (db *DB) PruneAttempts(ctx context.Context, before time.Time) (int64, error) {
	n, err := db.pruneChunked(ctx, `DELETE FROM delivery_attempts WHERE id IN (
		SELECT id FROM delivery_attempts WHERE at < ? LIMIT ?)`, before)
	if err != nil {
		return n, fmt.Errorf("prune delivery attempts: %w", err)
	}
	return n, nil
}

// pruneChunked runs del, a DELETE taking the cutoff time and a row limit,
// until it deletes fewer than pruneChunk rows, and returns the total.
func (db *DB) pruneChunked(ctx context.Context, del string, before time.Time) (int64, error) {
	cutoff := backstop.CanonicalTime(before)
	var total int64
	for {
		n, err := db.execCount(ctx, del, cutoff, pruneChunk)
		total += n
		if err != nil {
			return total, err
		}
		if n < pruneChunk {
			return total, nil
		}
	}
}

// execCount runs q on the writer and returns how many rows it changed.
func (db *DB) execCount(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := db.w.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Enqueue queues payload, which must be valid UTF-8 JSON, for delivery to
// target as it is (webhook-proxy mode: it is not wrapped in the event
// envelope), of type eventType, pending and due at now, and returns the
// delivery's id. key is the caller's idempotency key (its X-Event-Id),
// which the target is sent as X-Event-Id and webhook-id (the row's EventID;
// Proxied is true; in its header form, delivery.HeaderForm). A (target,
// key) pair is queued once while its row is kept: a repeat changes nothing
// and returns the id queued first; one with another payload (another JSON
// value: whitespace, key order and escapes aside) or event type is refused with a
// backstop.KeyReusedError, as the first would be delivered in its place.
// (Maintenance prunes a delivered row after 14 days; a repeat after that is
// queued again.) Keys are a space of their own: an event with the same id,
// emitted before or after, gets its own row, as does a key equal to an
// event's id.
func (db *DB) Enqueue(ctx context.Context, target, key, eventType string, payload json.RawMessage, now time.Time) (int64, error) {
	id, err := db.enqueue(ctx, target, key, eventType, payload, now)
	if err != nil {
		return 0, fmt.Errorf("enqueue %s for %s: %w", key, target, err)
	}
	return id, nil
}

// enqueueSQL queues one proxied payload, due now. ON CONFLICT without a
// target covers outbox_proxy_key (target, proxy_key), and UNIQUE (target,
// event_id), which only the same key can meet (proxyEventID).
const enqueueSQL = `INSERT INTO outbox
	(target, event_id, proxy_key, event_type, payload, status, attempts, next_attempt_at, created_at, updated_at)
	VALUES (?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)
	ON CONFLICT DO NOTHING`

// sameJSON reports whether stored and payload are the same JSON value: a
// sender may re-encode a retry, with other whitespace, its object keys in
// another order or characters escaped. Numbers compare as written (1 and
// 1.0 differ), arrays in order.
func sameJSON(stored string, payload []byte) bool {
	if stored == string(payload) {
		return true
	}
	a, errA := decodeJSON([]byte(stored))
	b, errB := decodeJSON(payload)
	return errA == nil && errB == nil && reflect.DeepEqual(a, b)
}

// decodeJSON decodes one JSON value, numbers as written.
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

func (db *DB) enqueue(ctx context.Context, target, key, eventType string, payload json.RawMessage, now time.Time) (int64, error) {
	switch {
	case target == "":
		return 0, errors.New("empty target")
	case key == "":
		return 0, errors.New("empty key")
	case eventType == "":
		return 0, errors.New("empty event type")
	case !utf8.Valid(payload):
		return 0, errors.New("payload is not valid UTF-8")
	case !jsonvalid.Valid(payload):
		return 0, errors.New("payload is not valid JSON")
	}
	st, err := db.deliveryStmts(ctx)
	if err != nil {
		return 0, err
	}
	stamp := backstop.CanonicalTime(now)
	conn, err := db.writer(ctx, db.busy) // as a webhook's commit (emit)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer conn.Close()
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.StmtxContext(ctx, st.enqueue).ExecContext(ctx,
		target, proxyEventID(key), key, eventType, string(payload), stamp, stamp, stamp)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	var id int64
	if n == 1 {
		if id, err = res.LastInsertId(); err != nil {
			return 0, err
		}
	} else {
		var first struct {
			ID        int64  `db:"id"`
			EventType string `db:"event_type"`
			Payload   string `db:"payload"`
		}
		if err := tx.GetContext(ctx, &first, `SELECT id, event_type, payload FROM outbox WHERE target = ? AND proxy_key = ?`, target, key); err != nil {
			return 0, fmt.Errorf("find the row queued first: %w", err)
		}
		if first.EventType != eventType || !sameJSON(first.Payload, payload) {
			return 0, &backstop.KeyReusedError{Key: key, ID: first.ID}
		}
		id = first.ID
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return id, nil
}

// TargetStates returns the state of each of names, in the same order: its
// outbox rows counted by status, its pause and whether it is disabled. A
// name the store knows nothing about gets a zero state.
func (db *DB) TargetStates(ctx context.Context, names []string) ([]TargetState, error) {
	out := make([]TargetState, len(names))
	byName := make(map[string][]*TargetState, len(names))
	for i, n := range names {
		out[i].Name = n
		byName[n] = append(byName[n], &out[i])
	}
	if len(names) == 0 {
		return out, nil
	}
	// One read transaction, so the counts and the states are one snapshot.
	tx, err := db.r.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("read target states: begin: %w", err)
	}
	defer tx.Rollback()
	for start := 0; start < len(names); start += maxIn {
		chunk := names[start:min(start+maxIn, len(names))]
		if err := readTargetStates(ctx, tx, chunk, byName); err != nil {
			return nil, fmt.Errorf("read target states: %w", err)
		}
	}
	return out, nil
}

// TargetQueue returns what a delivery worker looks at before each claim:
// target name's pause and whether it is disabled, as TargetStates does,
// and, when counts is true, its queued rows (Pending and Retrying; zero
// otherwise, which spares counting them). Delivered and DeadLetter are
// left zero: unlike TargetStates it reads only the queued rows, so its cost
// does not grow with the delivered history.
func (db *DB) TargetQueue(ctx context.Context, name string, counts bool) (TargetState, error) {
	st, err := db.deliveryStmts(ctx)
	if err != nil {
		return TargetState{}, fmt.Errorf("read queue of %s: %w", name, err)
	}
	var (
		ts                 = TargetState{Name: name}
		paused, disabledAt sql.NullString
	)
	if err := st.targetQueue.QueryRowContext(ctx, name, counts).Scan(&ts.Pending, &ts.Retrying,
		&paused, &ts.Disabled, &ts.DisabledReason, &disabledAt); err != nil {
		return TargetState{}, fmt.Errorf("read queue of %s: %w", name, err)
	}
	if paused.Valid {
		if ts.PausedUntil, err = backstop.ParseTime(paused.String); err != nil {
			return TargetState{}, fmt.Errorf("read queue of %s: paused_until: %w", name, err)
		}
	}
	if disabledAt.Valid {
		if ts.DisabledAt, err = backstop.ParseTime(disabledAt.String); err != nil {
			return TargetState{}, fmt.Errorf("read queue of %s: disabled_at: %w", name, err)
		}
	}
	return ts, nil
}

// readTargetStates fills byName's states for names, at most maxIn of them.
func readTargetStates(ctx context.Context, tx *sqlx.Tx, names []string, byName map[string][]*TargetState) error {
	args := make([]any, len(names))
	for i, n := range names {
		args[i] = n
	}
	in := placeholders(len(names))
	var counts []struct {
		Target string `db:"target"`
		Status string `db:"status"`
		N      int    `db:"n"`
	}
	if err := tx.SelectContext(ctx, &counts, `SELECT target, status, count(*) AS n FROM outbox
		WHERE target IN (`+in+`) GROUP BY target, status`, args...); err != nil {
		return err
	}
	for _, c := range counts {
		for _, ts := range byName[c.Target] {
			switch c.Status {
			case StatusPending:
				ts.Pending = c.N
			case StatusRetrying:
				ts.Retrying = c.N
			case StatusDelivered:
				ts.Delivered = c.N
			case StatusDeadLetter:
				ts.DeadLetter = c.N
			}
		}
	}
	var states []struct {
		Name           string         `db:"name"`
		PausedUntil    sql.NullString `db:"paused_until"`
		Disabled       bool           `db:"disabled"`
		DisabledReason string         `db:"disabled_reason"`
		DisabledAt     sql.NullString `db:"disabled_at"`
	}
	if err := tx.SelectContext(ctx, &states, `SELECT name, paused_until, disabled, disabled_reason, disabled_at
		FROM target_state WHERE name IN (`+in+`)`, args...); err != nil {
		return err
	}
	for _, s := range states {
		var paused, disabledAt time.Time
		var err error
		if s.PausedUntil.Valid {
			if paused, err = backstop.ParseTime(s.PausedUntil.String); err != nil {
				return fmt.Errorf("target %s: paused_until: %w", s.Name, err)
			}
		}
		if s.DisabledAt.Valid {
			if disabledAt, err = backstop.ParseTime(s.DisabledAt.String); err != nil {
				return fmt.Errorf("target %s: disabled_at: %w", s.Name, err)
			}
		}
		for _, ts := range byName[s.Name] {
			ts.PausedUntil = paused
			ts.Disabled = s.Disabled
			ts.DisabledReason = s.DisabledReason
			ts.DisabledAt = disabledAt
		}
	}
	return nil
}

// PauseTarget pauses target name until until. A pause is only ever
// extended: an earlier until than the current pause's end changes nothing.
func (db *DB) PauseTarget(ctx context.Context, name string, until time.Time) error {
	if name == "" {
		return errors.New("pause target: empty name")
	}
	if _, err := db.w.ExecContext(ctx, `INSERT INTO target_state (name, paused_until) VALUES (?, ?)
		ON CONFLICT (name) DO UPDATE SET paused_until = max(coalesce(paused_until, ''), excluded.paused_until)`,
		name, backstop.CanonicalTime(until)); err != nil {
		return fmt.Errorf("pause target %s: %w", name, err)
	}
	return nil
}

// DisableTarget disables target name from now with reason (a 410 answer,
// say) until EnableTarget. Disabling a disabled target replaces its reason
// and time.
func (db *DB) DisableTarget(ctx context.Context, name, reason string, now time.Time) error {
	if name == "" {
		return errors.New("disable target: empty name")
	}
	if _, err := db.w.ExecContext(ctx, `INSERT INTO target_state (name, disabled, disabled_reason, disabled_at)
		VALUES (?, 1, ?, ?)
		ON CONFLICT (name) DO UPDATE SET disabled = 1, disabled_reason = excluded.disabled_reason,
			disabled_at = excluded.disabled_at`,
		name, reason, backstop.CanonicalTime(now)); err != nil {
		return fmt.Errorf("disable target %s: %w", name, err)
	}
	return nil
}

// EnableTarget re-enables target name and ends its pause, if any. Enabling
// a target that is neither disabled nor paused changes nothing.
func (db *DB) EnableTarget(ctx context.Context, name string) error {
	if _, err := db.w.ExecContext(ctx, `UPDATE target_state
		SET disabled = 0, disabled_reason = '', disabled_at = NULL, paused_until = NULL
		WHERE name = ?`, name); err != nil {
		return fmt.Errorf("enable target %s: %w", name, err)
	}
	return nil
}
