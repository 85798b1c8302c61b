package backstop

import (
	"fmt"
	"time"
)

// canonicalLayout has a fixed width, so that canonical times sort as text in
// time order (SQLite's ORDER BY on a TEXT column is then time order).
const canonicalLayout = "2006-01-02T15:04:05.000000000Z"

// CanonicalTime writes t in the one form used for storage and dedup keys:
// UTC, nanoseconds, fixed width. Two instants that are equal give equal
// strings, whatever form they arrived in.
func CanonicalTime(t time.Time) string { return t.UTC().Format(canonicalLayout) }

// ParseTime parses an RFC 3339 timestamp with or without fractional
// seconds. The instant must fall in the years 0001 to 9999 in UTC: outside
// them (an offset can take 9999-12-31 into year 10000) CanonicalTime's
// text no longer sorts in time order, and the mirror compares versions as
// text.
func ParseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("invalid timestamp %q: want RFC 3339", s)
	}
	t = t.UTC()
	if y := t.Year(); y < 1 || y > 9999 {
		return time.Time{}, fmt.Errorf("invalid timestamp %q: year %d in UTC, outside 0001 to 9999", s, y)
	}
	return t, nil
}

// DedupKey is the identity of one version of one object:
// "{resource}:{id}:{canonical updated_at}". It is the same whether the event
// came from a webhook, a sync page or reconciliation.
func DedupKey(r Resource, id string, updatedAt time.Time) string {
	return string(r) + ":" + id + ":" + CanonicalTime(updatedAt)
}
