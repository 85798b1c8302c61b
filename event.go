package backstop

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path"
	"strings"
	"time"
)

// Origin says where an event came from.
type Origin string

// The origins of events.
const (
	OriginWebhook   Origin = "webhook"
	OriginSync      Origin = "sync"
	OriginReconcile Origin = "reconcile"
	OriginBackfill  Origin = "backfill"
	OriginManual    Origin = "manual"
)

// Event is one version of one object, as announced by a webhook or found by
// sync or reconciliation. Two events with the same DedupKey are the same
// event, whoever saw it first.
type Event struct {
	// ID is the event_id: the platform's for webhooks, EventID(DedupKey) for
	// events the engine makes itself.
	ID string
	// Type is the event type, e.g. "payment.succeeded". Unknown types are
	// kept as they came.
	Type string
	// Resource is the resource the type names; empty for unknown types.
	Resource Resource
	// ObjectID and UpdatedAt identify the version. UpdatedAt is zero for a
	// truncated event until its object is fetched.
	ObjectID  string
	UpdatedAt time.Time
	// CreatedAt is when the platform made the event (the envelope's created_at).
	CreatedAt time.Time
	Origin    Origin
	// Data is the object's JSON; for a truncated event only {"id":…}.
	Data json.RawMessage
	// Truncated marks an event whose object was too large to send: the
	// engine fetches it from the API and completes the event.
	Truncated bool
}

// DedupKey returns the event's dedup key, or "" when it has none yet (an
// unknown type, or a truncated event whose object is not fetched).
func (e Event) DedupKey() string {
	if e.Resource == "" || e.ObjectID == "" || e.UpdatedAt.IsZero() {
		return ""
	}
	return DedupKey(e.Resource, e.ObjectID, e.UpdatedAt)
}

// Object returns the mirror object the event carries, ok=false when it
// carries none (unknown type, truncated, or no version).
func (e Event) Object() (Object, bool) {
	if e.Resource == "" || e.Truncated || e.UpdatedAt.IsZero() || len(e.Data) == 0 {
		return Object{}, false
	}
	return Object{Resource: e.Resource, ID: e.ObjectID, UpdatedAt: e.UpdatedAt, Data: e.Data}, true
}

// EventID derives the deterministic event id of an event the engine makes
// itself from its dedup key: the same version always gets the same id.
func EventID(dedupKey string) string {
	sum := sha256.Sum256([]byte(dedupKey))
	return "evt_bs_" + hex.EncodeToString(sum[:12])
}

// resourceOfType maps the first part of an event type to its resource.
var resourceOfType = map[string]Resource{
	"contact": Contacts,
	"chat":    Chats,
	"message": Messages,
	"payment": Payments,
}

// KnownEventTypes lists the platform's event types.
var KnownEventTypes = []string{
	"contact.created", "contact.updated", "chat.opened", "chat.closed",
	"message.created", "payment.pending", "payment.succeeded", "payment.failed",
	"payment.refunded",
}

// ResourceOfEventType returns the resource an event type is about
// ("payment.succeeded" → payments), ok=false for an unknown prefix.
func ResourceOfEventType(eventType string) (Resource, bool) {
	prefix, _, found := strings.Cut(eventType, ".")
	if !found {
		return "", false
	}
	r, ok := resourceOfType[prefix]
	return r, ok
}

// MatchEvents reports whether an event type matches any of the globs
// ("payment.*", "*", "contact.created"). A malformed glob matches nothing.
func MatchEvents(globs []string, eventType string) bool {
	for _, g := range globs {
		if ok, err := path.Match(g, eventType); err == nil && ok {
			return true
		}
	}
	return false
}

// Route is what the emit path needs to know of a delivery target: its name
// and the event globs it subscribes to.
type Route struct {
	Target string
	Events []string
}

// QueuedTargets calls queued once for each route whose globs match an event
// that the emit queued outbox rows for: results are the emit's, in the
// order of events (as EventLog.Emit returns them). Callers use it to wake
// those targets' delivery workers after the commit.
func QueuedTargets(events []Event, results []EmitResult, routes []Route, queued func(target string)) {
	var seen []bool // by route, made on the first event that queued rows
	for i, r := range results {
		if r.Outbox == 0 || i >= len(events) {
			continue
		}
		if seen == nil {
			seen = make([]bool, len(routes))
		}
		for j, rt := range routes {
			if !seen[j] && MatchEvents(rt.Events, events[i].Type) {
				seen[j] = true
				queued(rt.Target)
			}
		}
	}
}

// EmitStatus is the outcome of emitting one event.
type EmitStatus string

// The outcomes of emitting an event.
const (
	// EmitAccepted: first time seen; stored, mirrored when newer, queued.
	EmitAccepted EmitStatus = "accepted"
	// EmitDuplicate: its event_id or dedup key was already processed;
	// nothing changed.
	EmitDuplicate EmitStatus = "duplicate"
	// EmitSuperseded: the mirror already held a newer version of the
	// event's object when the event's transaction ran (a webhook brought
	// it after the caller read the object); nothing of the event was
	// stored, mirrored or queued, so an older state is never queued after
	// a newer one. Only the emit paths that compare inside their
	// transaction give it: the store's EmitChanged (reconcile's) and the
	// pages of emitting sync and backfill runs.
	EmitSuperseded EmitStatus = "superseded"
)

// EmitResult is what happened to one event of a batch.
type EmitResult struct {
	Status EmitStatus
	// MirrorWritten is true when the event's object was newer than the
	// mirror's and was written.
	MirrorWritten bool
	// Outbox counts the outbox rows made (one per matching target).
	Outbox int
}

// EventLog is the durable side of the emit path. Emit processes a batch in
// one transaction: for each event, insert into processed_events (a conflict
// on event_id or dedup key makes it a duplicate), upsert the mirror only when
// newer, and add one outbox row per route whose globs match; then commit.
// Results are in the order of events. When the error is not nil nothing of
// the batch was committed.
type EventLog interface {
	Emit(ctx context.Context, events []Event, routes []Route) ([]EmitResult, error)
}
