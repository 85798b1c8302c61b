package backstop

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrUnauthorized: the platform refused the API key (HTTP 401).
	ErrUnauthorized = errors.New("backstop: unauthorized: the API key was refused")
	// ErrInvalidCursor: the platform could not read a saved cursor (HTTP 400
	// invalid_cursor). The cursor is never reset silently.
	ErrInvalidCursor = errors.New("backstop: invalid cursor")
	// ErrNotFound: the object does not exist (HTTP 404).
	ErrNotFound = errors.New("backstop: not found")
	// ErrGone: the object existed and is deleted for good (HTTP 410): no
	// retry can fetch it.
	ErrGone = errors.New("backstop: gone")
	// ErrUnavailable: the platform kept failing (5xx or network errors)
	// beyond the retry budget.
	ErrUnavailable = errors.New("backstop: platform unavailable")
	// ErrRateLimited: the platform kept answering 429 beyond the retry budget.
	ErrRateLimited = errors.New("backstop: rate limited")
	// ErrInFlight: a Retry or a Redirect of a delivery claimed for
	// sending, refused: its attempt is in flight, or it waits in memory for
	// a free slot or for a 429's pause to end, and the attempt's outcome is
	// recorded when it ends (delivered, or queued for its next attempt); a
	// redirect would take that attempt's number. Requeueing it then would
	// send it a second time even when the attempt succeeds. The error is an
	// *InFlightError, which says until when.
	ErrInFlight = errors.New("backstop: it is claimed for sending")
	// ErrJobRunning: a run of the job is going on already (in this process
	// or, recorded in the store or a lock, in another); the new run was
	// skipped.
	ErrJobRunning = errors.New("job is still running")
)

// InFlightError is the error of a Retry refused with ErrInFlight: Until is
// when the delivery's claim ends at the latest (its lease, should the
// process sending it die).
type InFlightError struct{ Until time.Time }

// Error says until when the delivery is claimed.
func (e *InFlightError) Error() string {
	return fmt.Sprintf("%v, until %s at the latest", ErrInFlight, e.Until.UTC().Format(time.RFC3339))
}

// Unwrap returns ErrInFlight.
func (e *InFlightError) Unwrap() error { return ErrInFlight }

// APIError describes a failed call to the platform. It wraps one of the
// sentinel errors so errors.Is works, and names what was asked for.
type APIError struct {
	Resource Resource
	Cursor   string // the cursor sent, for list calls
	ID       string // the object id, for get calls
	Status   int    // last HTTP status, 0 for a network error
	Code     string // the platform's error code, if any
	Message  string // the platform's message or the transport error
	Err      error  // one of the sentinel errors
}

// Error names the resource, the cursor or id, and the cause.
func (e *APIError) Error() string {
	what := string(e.Resource)
	switch {
	case e.ID != "":
		what += " " + e.ID
	case e.Cursor != "":
		what += fmt.Sprintf(" at cursor %q", e.Cursor)
	}
	// The sentinel's "backstop: " prefix is left out: the message is read
	// after the command's own prefix.
	msg := strings.TrimPrefix(e.Err.Error(), "backstop: ")
	if e.Status != 0 {
		msg += fmt.Sprintf(" (HTTP %d", e.Status)
		if e.Code != "" {
			msg += " " + e.Code
		}
		msg += ")"
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return what + ": " + msg
}

// Unwrap returns the sentinel error.
func (e *APIError) Unwrap() error { return e.Err }

// Retryable reports whether trying the same call later may succeed.
func (e *APIError) Retryable() bool {
	return errors.Is(e.Err, ErrUnavailable) || errors.Is(e.Err, ErrRateLimited)
}

// KeyReusedError is the webhook proxy's refusal of a payload queued under
// an idempotency key already queued for the target with another payload or
// event type: a repeat must be the same request, and the first one is what
// is delivered.
type KeyReusedError struct {
	Key string
	ID  int64 // the delivery queued with it first
}

func (e *KeyReusedError) Error() string {
	return fmt.Sprintf("key %q was queued with another payload or event type (delivery %d)", e.Key, e.ID)
}
