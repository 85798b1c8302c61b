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
func CanonicalTime(t time.Time) string {
	var b [len(canonicalLayout)]byte
	return string(AppendCanonicalTime(b[:0], t))
}

// AppendCanonicalTime appends CanonicalTime(t) to b. The emit path writes
// several of them per event, on the one writer's goroutine: this is
// time.Format's result without its layout interpreter, which cost a
// twentieth of a commit's instructions. Years outside 0000 to 9999, which
// the fixed width cannot hold, go through time.Format.
func AppendCanonicalTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, canonicalLayout)
	}
	hour, minute, sec := t.Clock()
	b = appendDigits(b, year, 4)
	b = append(b, '-')
	b = appendDigits(b, int(month), 2)
	b = append(b, '-')
	b = appendDigits(b, day, 2)
	b = append(b, 'T')
	b = appendDigits(b, hour, 2)
	b = append(b, ':')
	b = appendDigits(b, minute, 2)
	b = append(b, ':')
	b = appendDigits(b, sec, 2)
	b = append(b, '.')
	b = appendDigits(b, t.Nanosecond(), 9)
	return append(b, 'Z')
}

// appendDigits appends v, at least 0, as exactly width decimal digits
// (zero-padded; v has no more than width digits).
func appendDigits(b []byte, v, width int) []byte {
	n := len(b) + width
	b = append(b, "000000000"[:width]...)
	for i := n - 1; v > 0; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return b
}

// ParseTime parses an RFC 3339 timestamp with or without fractional
// seconds, "T" and "Z" in either case.
func ParseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil && len(s) > 10 && (s[10] == 't' || s[len(s)-1] == 'z') {
		// RFC 3339 (5.6) lets "T" and "Z" be lower case; time.Parse
		// does not.
		b := []byte(s)
		if b[10] == 't' {
			b[10] = 'T'
		}
		if b[len(b)-1] == 'z' {
			b[len(b)-1] = 'Z'
		}
		t, err = time.Parse(time.RFC3339Nano, string(b))
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("invalid timestamp %q: want RFC 3339", s)
	}
	if n := len(s); s[n-1] != 'Z' && s[n-1] != 'z' {
		// time.Parse takes an offset of +24:00 or +23:60; RFC 3339 (5.6)
		// has hours 00 to 23 and minutes 00 to 59. Parsed, s ends in
		// ±hh:mm.
		if hh, mm := s[n-5:n-3], s[n-2:]; hh > "23" || mm > "59" {
			return time.Time{}, fmt.Errorf("invalid timestamp %q: offset %s out of range (hours 00 to 23, minutes 00 to 59)", s, s[n-6:])
		}
	}
	return t.UTC(), nil
}

// ParseCanonicalRange parses s as ParseTime does, and refuses an instant
// outside the years 0001 to 9999 in UTC: outside them (an offset can take
// 9999-12-31 into year 10000) CanonicalTime's text no longer sorts in time
// order, and the mirror compares versions as text. The webhook intake
// parses what senders write with it; what the store reads back, written
// by an earlier version perhaps, goes through ParseTime.
func ParseCanonicalRange(s string) (time.Time, error) {
	t, err := ParseTime(s)
	if err != nil {
		return t, err
	}
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
