package delivery

import (
	"context"
	"time"

	"github.com/backstop-sync/backstop"
)

// The statuses of a delivery (an outbox row).
const (
	StatusPending    = "pending"
	StatusRetrying   = "retrying"
	StatusDelivered  = "delivered"
	StatusDeadLetter = "dead_letter"
)

// Queue is the durable per-target queue the dispatcher works on. The
// store implements it (through a thin adapter in cmd). Implementations are
// safe for concurrent use.
type Queue interface {
	// ClaimDue returns up to limit rows of target whose status is pending
	// or retrying, whose NextAttemptAt is at or before now and that no
	// claim holds (none, or one whose lease ended), oldest due first, and
	// claims them until now+lease (their ClaimedUntil), leaving their
	// NextAttemptAt as it was: a row whose attempt is never recorded (the
	// process died) is due again after the lease, in its place in the
	// queue. The rows returned show their values before the claim.
	ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]Row, error)
	// RecordAttempts stores each item's attempt, in order and all or
	// none, and returns their ids in the same order. Unless an attempt is
	// a Redirect, it also sets its row's status and NextAttemptAt from the
	// item's Outcome, its attempt count to Attempt.Attempt (never lower
	// than it was), its failure count to Outcome.Failures, and its last
	// status and error from the attempt, and ends its claim; but a
	// retrying Outcome whose NextAttemptAt is its Lease (a 429's) keeps
	// the row claimed and its NextAttemptAt as it was (its place in the
	// queue). A redirect attempt leaves the row unchanged but for its
	// attempt count, raised to Attempt.Attempt if lower; an outcome
	// whose Lease the row no longer holds leaves it unchanged.
	RecordAttempts(ctx context.Context, items []AttemptRecord) ([]int64, error)
	// Release ends the claim of rows, claimed but not attempted, so that
	// they are due again at once, in their place in the queue (the
	// NextAttemptAt each had when it was claimed) ahead of the rows queued
	// since, rather than when their lease ends. lease is the end of the
	// lease their claim gave them (its now+lease): rows that no longer
	// hold it (claimed again, retried, attempted) are left alone, as are
	// rows no longer pending or retrying.
	Release(ctx context.Context, rows []Row, lease, now time.Time) error
	// PauseTarget keeps the target's rows from being attempted before until.
	PauseTarget(ctx context.Context, name string, until time.Time) error
	// DisableTarget stops all deliveries to the target until it is
	// re-enabled, with a reason a person reads.
	DisableTarget(ctx context.Context, name, reason string, now time.Time) error
	// TargetQueue returns the target's pause and disabled state and, when
	// counts is true, its queued rows (Pending and Retrying; the other
	// counts may be left zero, and all of them when counts is false). The
	// worker reads it before every claim, with counts now and then (see
	// depthEvery), so it must not cost more as the delivered history
	// grows.
	TargetQueue(ctx context.Context, name string, counts bool) (TargetState, error)
}

// AttemptReserver is what a Queue also implements to number redirects
// safely: Redirect takes its attempt number from it before sending.
type AttemptReserver interface {
	// ReserveAttempt takes the next attempt number of row id (its attempt
	// count moves up by one, nothing else of the row changes) and returns
	// it, so that no other attempt of the row gets it. It fails with an
	// error wrapping backstop.ErrInFlight while the row is claimed for
	// sending at now (its attempt in flight already has the next number),
	// and with one wrapping backstop.ErrNotFound when there is no such
	// row.
	ReserveAttempt(ctx context.Context, id int64, now time.Time) (int, error)
}

// Row is one queued delivery: one event for one target.
type Row = backstop.Delivery

// Attempt is one logged HTTP attempt to deliver a row.
type Attempt = backstop.DeliveryAttempt

// Outcome is what an attempt does to its row.
type Outcome = backstop.DeliveryOutcome

// AttemptRecord is one attempt to record and what it does to its row, for
// Queue.RecordAttempts.
type AttemptRecord struct {
	Attempt Attempt
	Outcome Outcome
}

// TargetState is a target's delivery state and queue counts.
type TargetState = backstop.TargetState
