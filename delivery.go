package backstop

import (
	"encoding/json"
	"time"
)

// Delivery is one queued delivery (an outbox row): one event, or one
// payload queued through the webhook proxy, for one target, and how far its
// delivery got.
type Delivery struct {
	ID     int64
	Target string
	// EventID is the id the target is sent as X-Event-Id and webhook-id:
	// the event's id or, for a payload queued through the webhook proxy
	// (Proxied), the caller's key (its X-Event-Id or Idempotency-Key, or
	// the "evt_px_" id made for a call with neither). The two are kept
	// apart: an event and a proxied payload with the same id are two
	// deliveries.
	EventID string
	// EventType is the event's type, or a proxied payload's X-Event-Type
	// ("proxy" when the caller sent none).
	EventType string
	// Proxied marks a payload queued through the webhook proxy (POST
	// /outbox/{target}) rather than an event.
	Proxied bool
	// Payload is what is delivered: for an event the envelope
	// {"event_id","event","created_at","origin","data"}, for a proxied
	// payload the caller's JSON body as it came.
	Payload json.RawMessage
	// Status is "pending", "retrying", "delivered" or "dead_letter".
	Status string
	// Attempts is the number of attempts made so far, every one counted:
	// the next is sent as X-Delivery-Attempt Attempts+1.
	Attempts int
	// Failures is how many of those attempts failed (5xx, timeout,
	// connection error, 3xx): the count the retry schedule and the
	// dead-letter rule read. A 429 pauses the target and is not a failure.
	Failures      int
	NextAttemptAt time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time
	// LastStatus is the HTTP status of the last attempt; zero when none was
	// answered.
	LastStatus int
	LastError  string
	// ClaimedUntil, for a queued delivery a dispatcher has claimed (its
	// attempt in flight, or waiting in memory for a free slot or for a
	// 429's pause to end), is when that claim ends at the latest; a time
	// past is a claim its process left (it is due again). Zero when it is
	// not claimed, and on the rows a claim returns.
	ClaimedUntil time.Time
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
	// Attempt is the 1-based attempt number sent in X-Delivery-Attempt,
	// one per attempt of the delivery: a redirect takes the delivery's
	// next number, which its count moves to, and changes nothing else.
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
	// Failures is the delivery's count of failed attempts after this one
	// (Delivery.Failures): one more than before for a failure, the same
	// for a 2xx or a 429.
	Failures int
	// Lease, when not zero, is the end of the lease (the claim's now+lease)
	// under which the attempt was made. The outcome is then applied only
	// while the delivery still holds that lease and is queued: once a later
	// claim (the lease ran out), a retry or a release has changed it, or it
	// is no longer pending or retrying, the attempt is logged but the
	// delivery is left as it is, so that a late outcome never overwrites a
	// newer one. A retrying outcome whose NextAttemptAt equals Lease (a
	// 429's) keeps the delivery claimed, in its place in the queue.
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
