package backstop

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Object is one version of one platform object: the resource it belongs to,
// its id, its updated_at and its JSON exactly as the platform sent it.
type Object struct {
	Resource  Resource
	ID        string
	UpdatedAt time.Time
	Data      json.RawMessage
}

// Position is a place in a resource's change feed, which the platform orders
// by (updated_at, id). The zero Position is before every object.
type Position struct {
	UpdatedAt time.Time
	ID        string
}

// Position returns the feed position of o.
func (o Object) Position() Position { return Position{UpdatedAt: o.UpdatedAt, ID: o.ID} }

// String renders p as "<canonical updated_at> <id>", or "start".
func (p Position) String() string {
	if p.IsZero() {
		return "start"
	}
	return CanonicalTime(p.UpdatedAt) + " " + p.ID
}

// IsZero reports whether p is the start of the feed.
func (p Position) IsZero() bool { return p.UpdatedAt.IsZero() && p.ID == "" }

// Compare orders positions as the change feed does: by updated_at, then id.
// It returns -1, 0 or +1.
func (p Position) Compare(q Position) int {
	if c := p.UpdatedAt.Compare(q.UpdatedAt); c != 0 {
		return c
	}
	switch {
	case p.ID < q.ID:
		return -1
	case p.ID > q.ID:
		return 1
	}
	return 0
}

// DecodeObject reads the id and updated_at out of an object's JSON.
// It fails when either is missing or updated_at is not RFC 3339.
func DecodeObject(r Resource, data []byte) (Object, error) {
	var head struct {
		ID        string `json:"id"`
		UpdatedAt string `json:"updated_at"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return Object{}, fmt.Errorf("decode %s object: %w", r, err)
	}
	if head.ID == "" {
		return Object{}, fmt.Errorf("decode %s object: missing id", r)
	}
	t, err := ParseTime(head.UpdatedAt)
	if err != nil {
		return Object{}, fmt.Errorf("decode %s object %s: updated_at: %w", r, head.ID, err)
	}
	return Object{Resource: r, ID: head.ID, UpdatedAt: t, Data: json.RawMessage(data)}, nil
}

// ListRequest asks a Source for one page of a resource's change feed.
type ListRequest struct {
	Resource Resource
	// Cursor is the opaque cursor from the previous page; empty starts at the
	// beginning of the feed.
	Cursor string
	// Limit is the page size (the API's cursor_limit, 1..200); zero means the
	// source's default.
	Limit int
	// Since, when not zero, restricts the feed to objects updated at or after it.
	Since time.Time
}

// Page is one page of a change feed plus what fetching it cost.
type Page struct {
	Objects []Object
	// NextCursor continues the feed after the last object. When HasMore is
	// false it still points after the last object; saved, it returns only
	// later changes. An empty page returns the cursor it was given.
	NextCursor string
	HasMore    bool
	Cost       Cost
}

// Cost is what one call to the platform cost: HTTP requests sent (retries
// included), 429 answers received and time spent waiting, on the rate-limit
// governor and in the backoff between retries.
type Cost struct {
	Requests     int
	RateLimited  int
	ThrottleWait time.Duration
}

// Add returns the sum of c and d.
func (c Cost) Add(d Cost) Cost {
	return Cost{
		Requests:     c.Requests + d.Requests,
		RateLimited:  c.RateLimited + d.RateLimited,
		ThrottleWait: c.ThrottleWait + d.ThrottleWait,
	}
}

// Source reads the platform's public API. Implementations are safe for
// concurrent use.
//
// List and Get return an *APIError wrapping ErrUnauthorized on 401,
// ErrInvalidCursor on a cursor the platform cannot read, ErrNotFound on 404, ErrGone on 410,
// and ErrUnavailable once 5xx or network errors outlast the retry budget.
type Source interface {
	List(ctx context.Context, req ListRequest) (Page, error)
	Get(ctx context.Context, r Resource, id string) (Object, Cost, error)
}
