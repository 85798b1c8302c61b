package delivery

import (
	"context"
	"encoding/json"
	"time"
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
	// or retrying and whose NextAttemptAt is at or before now, oldest due
	// first, and moves their NextAttemptAt to now+lease, so that a row
	// whose attempt is never recorded (the process died) is due again
	// after the lease.
	ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]Row, error)
	// RecordAttempt stores a and returns its id. Unless a.Redirect, it
	// also sets the row's status and NextAttemptAt from out, its attempt
	// count to a.Attempt, and its last status and error from a. A
	// redirect attempt leaves the row unchanged, as does an outcome whose
	// Lease the row no longer holds.
	RecordAttempt(ctx context.Context, a Attempt, out Outcome) (int64, error)
	// Release makes the rows ids, claimed but not attempted, due again at
	// now instead of when their lease ends. lease is the end of the lease
	// their claim gave them (its now+lease): rows that no longer hold it
	// (claimed again, retried, attempted) are left alone, as are rows no
	// longer pending or retrying.
	Release(ctx context.Context, ids []int64, lease, now time.Time) error
	// PauseTarget keeps the target's rows from being attempted before until.
	PauseTarget(ctx context.Context, name string, until time.Time) error
	// DisableTarget stops all deliveries to the target until it is
	// re-enabled, with a reason a person reads.
	DisableTarget(ctx context.Context, name, reason string, now time.Time) error
	// TargetQueue returns the target's pause and disabled state and its
	// queued rows (Pending and Retrying; the other counts may be left
	// zero). The worker reads it before every claim, so it must not cost
	// more as the delivered history grows.
	TargetQueue(ctx context.Context, name string) (TargetState, error)
}

// Row is one queued delivery: one event for one target. Its fields are
// those of store.OutboxRow.
type Row struct {
	ID        int64
	Target    string
	EventID   string
	EventType string
	// Payload is the envelope to deliver:
	// {"event_id","event","created_at","origin","data"}.
	Payload json.RawMessage
	// Status is one of the Status constants.
	Status string
	// Attempts is the number of attempts made so far.
	Attempts      int
	NextAttemptAt time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time
	// LastStatus is the HTTP status of the last attempt; zero when none was
	// answered.
	LastStatus int
	LastError  string
}

// Attempt is one logged HTTP attempt to deliver a row. Its fields are
// those of store.Attempt.
type Attempt struct {
	ID, DeliveryID int64
	Target, URL    string
	// Attempt is the attempt number sent in X-Delivery-Attempt (1-based).
	Attempt int
	// StatusCode is the HTTP status; zero when no answer came (Error says
	// why).
	StatusCode int
	Error      string
	// Body is the first 4 KiB of the response body.
	Body      string
	RequestID string
	Duration  time.Duration
	At        time.Time
	// Redirect marks a manual send to another URL; it does not change the
	// delivery.
	Redirect bool
}

// Outcome is what an attempt does to its row. Its fields are those of
// store.Outcome.
type Outcome struct {
	// Status is StatusDelivered, StatusRetrying or StatusDeadLetter.
	Status string
	// NextAttemptAt is when a retrying row is due again.
	NextAttemptAt time.Time
	// Lease, when not zero, is the end of the lease the attempt was made
	// under: the outcome applies only while the row still holds it (no
	// later claim, retry or release changed it), so that a late outcome
	// never overwrites a newer one.
	Lease time.Time
}

// TargetState is a target's delivery state and queue counts. Its fields
// are those of store.TargetState.
type TargetState struct {
	Name                                     string
	PausedUntil                              time.Time
	Disabled                                 bool
	DisabledReason                           string
	DisabledAt                               time.Time
	Pending, Retrying, Delivered, DeadLetter int
}
