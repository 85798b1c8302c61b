package jsonvalid

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// cases are inputs on each side of every rule, as encoding/json sees them.
var cases = []string{
	``, ` `, `{}`, `[]`, ` {} `, "\t\r\n[]\n", `{`, `}`, `[`, `]`, `{]`, `[}`, `{}}`, `[]]`, `{}{}`, `[] []`,
	`{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{"a":}`, `{a:1}`, `{"a":1 "b":2}`, `{"a":1,"b":[1,2,{"c":null}]}`,
	`{,}`, `[,]`, `[1,]`, `[,1]`, `[1 2]`, `[1,,2]`, `{"a":1,,"b":2}`, `{"a":{"b":{}}}`, `[[[]]]`, `[[]`, `[[]]]`,
	`"abc"`, `"`, `"abc`, `"a\"b"`, `"a\\"`, `"\/\b\f\n\r\t"`, `"\u00e9"`, `"\u00E9"`, `"\u00g9"`, `"\u00e"`, `"\x"`, `"\'"`,
	"\"tab\there\"", "\"nl\nhere\"", "\"\x1f\"", "\"\x7f\"", "\"\xff\xfe\"", "\"zażółć\"", `"\`, `"\u`, `"\u12`,
	`0`, `-0`, `01`, `-01`, `1`, `-`, `--1`, `+1`, `1.`, `1.5`, `.5`, `1.e5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`,
	`-1.25e-10`, `123456789012345678901234567890`, `1.0.0`, `0x10`, `1_000`, `Infinity`, `NaN`, `-Infinity`,
	`true`, `false`, `null`, `tru`, `truex`, `nul`, `nulll`, `True`, `NULL`, `[true,false,null]`, `{"t":true}`,
	"\ufeff{}", "{}\x00", `[1]x`, `"a"b`, `1 2`,
}

func TestValidIsEncodingJSONValid(t *testing.T) {
	for _, c := range cases {
		if got, want := Valid([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("Valid(%q) = %v, encoding/json says %v", c, got, want)
		}
	}
}

// Nesting is refused past encoding/json's 10,000 levels, and only then,
// for objects, arrays and empty ones alike.
func TestValidDepthIsEncodingJSONs(t *testing.T) {
	for _, depth := range []int{9999, 10000, 10001} {
		for _, shape := range []struct{ open, inner, close string }{
			{"[", "1", "]"}, {"[", "", "]"}, {`{"a":`, "1", "}"}, {`{"a":`, "{}", "}"}, {"[", "[]", "]"},
		} {
			doc := []byte(strings.Repeat(shape.open, depth) + shape.inner + strings.Repeat(shape.close, depth))
			if got, want := Valid(doc), json.Valid(doc); got != want {
				t.Errorf("depth %d of %s%s%s: Valid = %v, encoding/json says %v", depth, shape.open, shape.inner, shape.close, got, want)
			}
		}
	}
}

func FuzzValid(f *testing.F) {
	for _, c := range cases {
		f.Add([]byte(c))
	}
	f.Add([]byte(`{"event_id":"evt_1","event":"payment.succeeded","data":{"id":"pay_1","amount":1250,"tags":["a","b"],"nested":{"x":[1.5e3,-0,true,false,null]}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", b, got, want)
		}
	})
}

// BenchmarkValid checks a webhook's body, the size of the platform's, with
// Valid and with encoding/json.Valid, alternately, and prints one BENCH
// line; ratio is how many times faster Valid is.
func BenchmarkValid(b *testing.B) {
	doc := []byte(`{"event_id":"evt_x_1","event":"payment.succeeded","created_at":"2026-03-01T10:00:00.000001Z","data":{"id":"pay_1","contact_id":"ct_1","amount":1250,"currency":"EUR","status":"succeeded","created_at":"2026-01-01T00:00:00Z","updated_at":"2026-03-01T10:00:00.000001Z"}}`)
	const docs, rounds = 100000, 5
	var fast, std time.Duration
	for range b.N {
		for range rounds {
			start := time.Now()
			for range docs {
				if !Valid(doc) {
					b.Fatal("the body is not valid")
				}
			}
			fast += time.Since(start)
			start = time.Now()
			for range docs {
				if !json.Valid(doc) {
					b.Fatal("the body is not valid")
				}
			}
			std += time.Since(start)
		}
	}
	n := float64(b.N * rounds * docs)
	fmt.Printf("BENCH json-valid bytes=%d ns_per_doc=%.0f encoding_json_ns_per_doc=%.0f ratio=%.2f\n",
		len(doc), float64(fast.Nanoseconds())/n, float64(std.Nanoseconds())/n, std.Seconds()/fast.Seconds())
}
