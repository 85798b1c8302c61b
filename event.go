package backstop

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path"
	"strings"
	"time"
	"unicode/utf8"
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
// ("payment.*", "*", "contact.created"), written as path.Match's patterns
// but with '*' and '?' matching any character, '/' included: an event type
// is not a path, and "*" must take every one ("a/b" too, which path.Match's
// '*' did not, so that such an event was stored but reached no target). A
// malformed glob matches nothing.
func MatchEvents(globs []string, eventType string) bool {
	for _, g := range globs {
		if MatchGlob(g, eventType) {
			return true
		}
	}
	return false
}

// MatchGlob reports whether name matches pattern, in path.Match's syntax:
// '*' any run of characters, '?' any one, '[…]' a class of them ('^' to
// negate, ranges such as a-z), '\\' to take the next one as it is. Unlike
// path.Match, '*' and '?' match '/' too. A malformed pattern (see
// path.Match's ErrBadPattern) matches nothing.
func MatchGlob(pattern, name string) bool {
	if strings.ContainsAny(pattern, "[\\") {
		if _, err := path.Match(pattern, ""); err != nil {
			return false
		}
	}
	pi, si := 0, 0
	star, starAt := -1, 0 // the last '*' seen, and where in name it began
	for si < len(name) {
		if pi < len(pattern) {
			r, w := utf8.DecodeRuneInString(name[si:])
			switch pattern[pi] {
			case '*':
				star, starAt = pi, si
				pi++
				continue
			case '?':
				pi, si = pi+1, si+w
				continue
			case '[':
				ok, n := matchClass(pattern[pi:], r)
				if n == 0 {
					return false // malformed
				}
				if ok {
					pi, si = pi+n, si+w
					continue
				}
			case '\\':
				if pi+1 == len(pattern) {
					return false // malformed
				}
				// Literals compare as bytes, as path.Match's do (two
				// different invalid bytes are not the same character).
				_, cw := utf8.DecodeRuneInString(pattern[pi+1:])
				if pattern[pi+1:pi+1+cw] == name[si:si+w] {
					pi, si = pi+1+cw, si+w
					continue
				}
			default:
				_, cw := utf8.DecodeRuneInString(pattern[pi:])
				if pattern[pi:pi+cw] == name[si:si+w] {
					pi, si = pi+cw, si+w
					continue
				}
			}
		}
		if star < 0 {
			return false
		}
		// Let the last '*' take one more byte and try again (a byte, as
		// path.Match does: the same answers on names not valid UTF-8).
		starAt++
		pi, si = star+1, starAt
	}
	for pi < len(pattern) && pattern[pi] == '*' {
		pi++
	}
	return pi == len(pattern)
}

// matchClass matches r against the class at the start of p ('[' …
// ']'), and returns how many bytes of p the class takes; 0 means the
// class is malformed.
func matchClass(p string, r rune) (ok bool, n int) {
	i := 1
	negate := i < len(p) && p[i] == '^'
	if negate {
		i++
	}
	matched, ranges := false, 0
	for {
		if i < len(p) && p[i] == ']' && ranges > 0 {
			return matched != negate, i + 1
		}
		lo, w := classChar(p[i:])
		if w == 0 {
			return false, 0
		}
		i += w
		hi := lo
		if i < len(p) && p[i] == '-' {
			if hi, w = classChar(p[i+1:]); w == 0 {
				return false, 0
			}
			i += 1 + w
		}
		if lo <= r && r <= hi {
			matched = true
		}
		ranges++
	}
}

// classChar reads one character of a class, an escaped one included, and
// its width in bytes; 0 for none (the end of p, or '-' or ']' where a
// character must be).
func classChar(p string) (rune, int) {
	if p == "" || p[0] == '-' || p[0] == ']' {
		return 0, 0
	}
	if p[0] == '\\' {
		if len(p) == 1 {
			return 0, 0
		}
		r, w := utf8.DecodeRuneInString(p[1:])
		return r, 1 + w
	}
	r, w := utf8.DecodeRuneInString(p)
	return r, w
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
	// nothing was stored or queued again (its object may still have been
	// written to a mirror that lost it: MirrorWritten).
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
	// mirror's and was written: for an accepted event, or for a duplicate
	// of a version already processed that the mirror had lost.
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
