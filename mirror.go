package backstop

import (
	"context"
	"time"
)

// CursorKind says which cursor of a resource is meant. Each resource has an
// incremental cursor (moved by sync) and a backfill checkpoint (moved only by
// backfill, so a backfill never moves the incremental cursor backwards).
type CursorKind string

// The cursor kinds.
const (
	CursorSync     CursorKind = "sync"
	CursorBackfill CursorKind = "backfill"
)

// Cursor is a saved place in a resource's change feed.
type Cursor struct {
	Resource Resource
	Kind     CursorKind
	// Value is the platform's opaque cursor.
	Value string
	// Position is the (updated_at, id) of the last object read before Value,
	// so two cursors of one resource can be compared.
	Position Position
	// Done is set on a backfill checkpoint whose backfill reached the end.
	Done      bool
	UpdatedAt time.Time
	// StartedAt is, for a backfill checkpoint, when the backfill that began
	// it started: a run that resumes the checkpoint keeps it, and page
	// commits never change it once saved (only a reset of the checkpoint
	// does). It is zero when unknown (a checkpoint saved by a backstop
	// older than it) and on a sync cursor.
	StartedAt time.Time
}

// ApplyResult counts what one page did to the mirror.
type ApplyResult struct {
	New       int // objects not in the mirror before
	Updated   int // objects whose stored version was older
	Unchanged int // objects whose stored version was the same or newer
}

// Mirror is the local copy of the platform plus its cursors. Implementations
// are safe for concurrent use.
type Mirror interface {
	// ApplyPage writes objs and then saves cur, in one transaction: the saved
	// cursor is never ahead of the mirror. An object is written only when its
	// updated_at is newer than the stored version; the mirror never goes back
	// in time. Nor does the saved cursor: cur is saved only when its
	// position is not before the saved one's (two runs that overlap leave
	// the cursor where the one ahead put it).
	ApplyPage(ctx context.Context, objs []Object, cur Cursor) (ApplyResult, error)
	// Cursor returns the saved cursor, or ok=false when none is saved.
	Cursor(ctx context.Context, r Resource, kind CursorKind) (c Cursor, ok bool, err error)
	// Cursors returns every saved cursor.
	Cursors(ctx context.Context) ([]Cursor, error)
	// AdvanceCursor saves cur only when no cursor of that kind is saved or the
	// saved one's Position is before cur.Position. It reports whether it saved.
	AdvanceCursor(ctx context.Context, cur Cursor) (bool, error)
	// ResetCursors deletes both cursors of r.
	ResetCursors(ctx context.Context, r Resource) error
}
