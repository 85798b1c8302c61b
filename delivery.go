package backstop

import (
	"encoding/json"
	"time"
)

// Delivery is one queued delivery (an outbox row): one event for one
// target, and how far its delivery got.
type Delivery struct {
	ID        int64
	Target    string
	EventID   string
	EventType string
	// Payload is the envelope to deliver:
	// {"event_id","event","created_at","origin","data"}.
	Payload json.RawMessage
	// Status is "pending", "retrying", "delivered" or "dead_letter".
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

// DeliveryAttempt is one HTTP attempt to deliver an outbox row, as logged
// in delivery_attempts. The dispatcher makes it, the store keeps it, the
// CLI and the dashboard show it.
type DeliveryAttempt struct {
	ID         int64
	DeliveryID int64
	Target     string
	// URL is the URL sent to, redacted (RedactURL).
	URL string
	// Attempt is the 1-based attempt number sent in X-Delivery-Attempt. A
	// redirect logs the delivery's current count + 1 but does not change
	// the delivery.
	Attempt int
	// StatusCode is the HTTP status of the answer; 0 when nothing answered
	// (timeout, connection error, refused by the SSRF guard; Error says
	// why).
	StatusCode int
	Error      string
	// Body is the first 4 KiB of the response body; the store cuts a
	// longer one.
	Body      string
	RequestID string
	Duration  time.Duration
	At        time.Time
	// Redirect marks a manual send to another URL; it does not change the
	// delivery.
	Redirect bool
}

// DeliveryOutcome is what an attempt does to its delivery.
type DeliveryOutcome struct {
	// Status is "delivered", "retrying" or "dead_letter".
	Status string
	// NextAttemptAt is when a retrying delivery is due again; ignored for
	// other statuses.
	NextAttemptAt time.Time
	// Lease, when not zero, is the end of the lease (the claim's now+lease)
	// under which the attempt was made. The outcome is then applied only
	// while the delivery still holds that lease and is queued: once a later
	// claim (the lease ran out), a retry or a release has changed it, or it
	// is no longer pending or retrying, the attempt is logged but the
	// delivery is left as it is, so that a late outcome never overwrites a
	// newer one.
	Lease time.Time
}

// TargetState is a delivery target's queue and its remembered state.
type TargetState struct {
	Name string
	// PausedUntil is the end of the target's latest pause (429
	// Retry-After), zero when it was never paused or was re-enabled. It may
	// lie in the past: the target is paused only while now is before it.
	PausedUntil    time.Time
	Disabled       bool
	DisabledReason string
	DisabledAt     time.Time
	// Outbox rows of the target by status.
	Pending, Retrying, Delivered, DeadLetter int
}
