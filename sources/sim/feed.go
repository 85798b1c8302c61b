package sim

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/backstop-sync/backstop"
)

// record is one version of one object. Its data is encoded once and never
// modified, so it may be read after the lock that found it is released.
type record struct {
	id   string
	ts   int64 // updated_at, Unix nanoseconds (whole microseconds)
	v    any   // contact, chat, message or payment
	data []byte
}

func (r *record) object(res backstop.Resource) backstop.Object {
	return backstop.Object{Resource: res, ID: r.id, UpdatedAt: time.Unix(0, r.ts).UTC(), Data: r.data}
}

// cmp orders r against the position (ts, id) as the feed does.
func (r *record) cmp(ts int64, id string) int {
	switch {
	case r.ts < ts:
		return -1
	case r.ts > ts:
		return 1
	case r.id < id:
		return -1
	case r.id > id:
		return 1
	}
	return 0
}

// feed is one resource's change feed: every object's current version,
// ordered by (updated_at, id).
type feed struct {
	recs []*record
	byID map[string]*record
}

func newFeed(recs []*record) *feed {
	slices.SortFunc(recs, func(a, b *record) int { return a.cmp(b.ts, b.id) })
	f := &feed{recs: recs, byID: make(map[string]*record, len(recs))}
	for _, r := range recs {
		f.byID[r.id] = r
	}
	return f
}

// after returns the index of the first record after the position (ts, id).
func (f *feed) after(ts int64, id string) int {
	return sort.Search(len(f.recs), func(i int) bool { return f.recs[i].cmp(ts, id) > 0 })
}

// atOrAfter returns the index of the first record updated at or after ts.
func (f *feed) atOrAfter(ts int64) int {
	return sort.Search(len(f.recs), func(i int) bool { return f.recs[i].ts >= ts })
}

// put stores rec, replacing the previous version of the same id. rec must
// sort after every record in the feed.
func (f *feed) put(rec *record) {
	if old, ok := f.byID[rec.id]; ok {
		i := sort.Search(len(f.recs), func(i int) bool { return f.recs[i].cmp(old.ts, old.id) >= 0 })
		if i < len(f.recs) && f.recs[i] == old {
			f.recs = slices.Delete(f.recs, i, i+1)
		}
	}
	f.recs = append(f.recs, rec)
	f.byID[rec.id] = rec
}

// cursor is the decoded form of the opaque cursor the API hands out: the
// resource, the cursor generation (see Sim.InvalidateCursors) and the feed
// position of the last object read. A cursor without a position is the start
// of the feed.
type cursor struct {
	res    byte
	gen    uint64
	hasPos bool
	ts     int64
	id     string
}

const cursorVersion = 1

// encode returns the cursor as unpadded base64url of
// version, resource, flags, uvarint generation, varint updated_at, id.
func (c cursor) encode() string {
	b := make([]byte, 0, 3+2*binary.MaxVarintLen64+len(c.id))
	var flags byte
	if c.hasPos {
		flags = 1
	}
	b = append(b, cursorVersion, c.res, flags)
	b = binary.AppendUvarint(b, c.gen)
	b = binary.AppendVarint(b, c.ts)
	b = append(b, c.id...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 3 || b[0] != cursorVersion || b[2] > 1 {
		return cursor{}, fmt.Errorf("%w: unreadable", errInvalidCursor)
	}
	c := cursor{res: b[1], hasPos: b[2] == 1}
	b = b[3:]
	gen, n := binary.Uvarint(b)
	if n <= 0 {
		return cursor{}, fmt.Errorf("%w: unreadable", errInvalidCursor)
	}
	b = b[n:]
	ts, n := binary.Varint(b)
	if n <= 0 {
		return cursor{}, fmt.Errorf("%w: unreadable", errInvalidCursor)
	}
	c.gen, c.ts, c.id = gen, ts, string(b[n:])
	return c, nil
}

// resourceIndex is the resource's byte in a cursor.
func resourceIndex(r backstop.Resource) byte {
	return byte(slices.Index(backstop.Resources, r))
}
