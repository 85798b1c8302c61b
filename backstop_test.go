package backstop

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDedupKeyIsCanonical(t *testing.T) {
	cases := []struct{ a, b string }{
		{"2026-03-01T10:00:00Z", "2026-03-01T10:00:00.000000Z"},
		{"2026-03-01T10:00:00.5Z", "2026-03-01T10:00:00.500000000Z"},
		{"2026-03-01T12:00:00+02:00", "2026-03-01T10:00:00Z"},
	}
	for _, c := range cases {
		ta, err := ParseTime(c.a)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := ParseTime(c.b)
		if err != nil {
			t.Fatal(err)
		}
		if ka, kb := DedupKey(Payments, "pay_1", ta), DedupKey(Payments, "pay_1", tb); ka != kb {
			t.Errorf("%s and %s give different keys %q and %q", c.a, c.b, ka, kb)
		}
	}
	if got := DedupKey(Payments, "pay_1", time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)); got != "payments:pay_1:2026-03-01T10:00:00.000000000Z" {
		t.Errorf("DedupKey = %q", got)
	}
}

func TestCanonicalTimeSortsAsTime(t *testing.T) {
	in := []string{"2026-01-01T00:00:00Z", "2026-01-01T00:00:00.1Z", "2026-01-01T00:00:00.123456Z", "2026-01-01T00:00:01Z", "2026-01-01T01:00:00+00:30"}
	var prev string
	for i, s := range in {
		tm, err := ParseTime(s)
		if err != nil {
			t.Fatal(err)
		}
		c := CanonicalTime(tm)
		if i > 0 && c <= prev {
			t.Errorf("%q sorts before the earlier %q", c, prev)
		}
		prev = c
	}
}

// A timestamp whose offset takes it past year 9999 or before year 1 in
// UTC has no canonical form that sorts as text: the intake's parse refuses
// it (ParseTime, which reads what the store kept, does not), and every
// one accepted sorts in time order.
func TestParseCanonicalRangeRefusesYearsOutsideIt(t *testing.T) {
	for _, s := range []string{
		"9999-12-31T23:30:00-01:00",
		"0000-01-01T00:00:00Z",
		"0001-01-01T00:00:00+01:00",
	} {
		if _, err := ParseTime(s); err != nil {
			t.Errorf("ParseTime(%q): %v; it reads what the store kept, as it was", s, err)
		}
		if tm, err := ParseCanonicalRange(s); err == nil {
			t.Errorf("ParseCanonicalRange(%q) = %s, want an error", s, CanonicalTime(tm))
		} else if !strings.Contains(err.Error(), "year") {
			t.Errorf("ParseCanonicalRange(%q): %v, want the year named", s, err)
		}
	}
	edges := []string{"0001-01-01T00:00:00Z", "2026-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z"}
	var prev string
	for i, s := range edges {
		tm, err := ParseCanonicalRange(s)
		if err != nil {
			t.Fatalf("ParseCanonicalRange(%q): %v", s, err)
		}
		if c := CanonicalTime(tm); i > 0 && c <= prev {
			t.Errorf("%q sorts before the earlier %q", c, prev)
		} else {
			prev = c
		}
	}
}

func TestPositionCompare(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		p, q Position
		want int
	}{
		{Position{}, Position{t0, "a"}, -1},
		{Position{t0, "a"}, Position{t0, "b"}, -1},
		{Position{t0, "b"}, Position{t0.Add(time.Microsecond), "a"}, -1},
		{Position{t0, "a"}, Position{t0, "a"}, 0},
		{Position{t0.Add(time.Second), "a"}, Position{t0, "z"}, 1},
	}
	for _, c := range cases {
		if got := c.p.Compare(c.q); got != c.want {
			t.Errorf("%v.Compare(%v) = %d, want %d", c.p, c.q, got, c.want)
		}
	}
}

func TestDecodeObject(t *testing.T) {
	o, err := DecodeObject(Chats, []byte(`{"id":"chat_1","updated_at":"2026-02-03T04:05:06.789Z","status":"opened"}`))
	if err != nil || o.ID != "chat_1" || o.UpdatedAt.Nanosecond() != 789000000 {
		t.Fatalf("DecodeObject = %+v, %v", o, err)
	}
	for _, bad := range []string{`{"updated_at":"2026-02-03T04:05:06Z"}`, `{"id":"x","updated_at":"yesterday"}`, `[1]`} {
		if _, err := DecodeObject(Chats, []byte(bad)); err == nil {
			t.Errorf("DecodeObject(%s) accepted", bad)
		}
	}
}

func TestAPIErrorNamesWhatFailed(t *testing.T) {
	err := error(&APIError{Resource: Payments, Cursor: "abc", Status: 400, Code: "invalid_cursor", Message: "cannot read", Err: ErrInvalidCursor})
	if !errors.Is(err, ErrInvalidCursor) {
		t.Error("errors.Is does not see the sentinel")
	}
	for _, want := range []string{"payments", `"abc"`, "400", "invalid_cursor", "cannot read"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not contain %q", err, want)
		}
	}
}

func TestParseResources(t *testing.T) {
	rs, err := ParseResources(nil)
	if err != nil || len(rs) != 4 {
		t.Fatalf("default resources: %v %v", rs, err)
	}
	rs, err = ParseResources([]string{"Payments", "payments", "chats"})
	if err != nil || len(rs) != 2 || rs[0] != Payments {
		t.Fatalf("ParseResources = %v, %v", rs, err)
	}
	if _, err := ParseResources([]string{"invoices"}); err == nil || !strings.Contains(err.Error(), "invoices") {
		t.Errorf("unknown resource error: %v", err)
	}
}

// RFC 3339 lets "T" and "Z" be lower case (5.6); such a timestamp was
// refused. It is the same instant, and the same dedup key.
func TestParseTimeTakesLowerCaseTAndZ(t *testing.T) {
	want, err := ParseTime("2026-03-01T10:00:00.5Z")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"2026-03-01t10:00:00.5Z", "2026-03-01T10:00:00.5z", "2026-03-01t10:00:00.5z", "2026-03-01t11:00:00.5+01:00",
		"2026-03-01T23:59:00.5+13:59", "2026-02-28T10:01:00.5-23:59"} {
		got, err := ParseTime(s)
		if err != nil || !got.Equal(want) || CanonicalTime(got) != CanonicalTime(want) {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"2026-03-01x10:00:00Z", "2026-03-01T10:00:00y", "2026-03-01 10:00:00Z",
		// time.Parse takes these offsets; RFC 3339 does not.
		"2026-03-01T10:00:00+24:00", "2026-03-01T10:00:00-24:00", "2026-03-01T10:00:00+23:60", "2026-03-01t10:00:00.5+24:00"} {
		if _, err := ParseTime(s); err == nil {
			t.Errorf("ParseTime(%q) took it", s)
		}
	}
}

// CanonicalTime writes what time.Format writes with the canonical layout,
// for every instant: the fast path, the years it cannot hold, the zero
// time, other zones and the edges of each field.
func TestCanonicalTimeIsTimeFormat(t *testing.T) {
	east := time.FixedZone("east", 14*3600)
	times := []time.Time{
		{},
		time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 1, east), // the day before in UTC
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 6, 1, 12, 0, 0, 0, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 123456789, time.UTC),
		time.Unix(1<<40, 5),
		time.Unix(-1<<40, 5),
	}
	for i := range 20000 {
		// Spread over years 0001 to about 9000, nanoseconds included.
		sec := int64(i)*14_181_000_417 - 62_135_596_800
		times = append(times, time.Unix(sec, int64(i)*48_271%1_000_000_000))
	}
	for _, tm := range times {
		want := tm.UTC().Format("2006-01-02T15:04:05.000000000Z")
		if got := CanonicalTime(tm); got != want {
			t.Fatalf("CanonicalTime(%v) = %q, want %q", tm, got, want)
		}
		if got := string(AppendCanonicalTime([]byte("x:"), tm)); got != "x:"+want {
			t.Fatalf("AppendCanonicalTime(x:, %v) = %q, want %q", tm, got, "x:"+want)
		}
	}
}

func FuzzCanonicalTime(f *testing.F) {
	f.Add(int64(0), int64(0))
	f.Add(int64(1772359200), int64(123456789))
	f.Add(int64(-62135596800), int64(0))
	f.Add(int64(253402300799), int64(999999999))
	f.Fuzz(func(t *testing.T, sec, nsec int64) {
		tm := time.Unix(sec, nsec)
		if want, got := tm.UTC().Format("2006-01-02T15:04:05.000000000Z"), CanonicalTime(tm); got != want {
			t.Fatalf("CanonicalTime(%d, %d) = %q, want %q", sec, nsec, got, want)
		}
	})
}
