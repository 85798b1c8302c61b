package intake

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/backstop-sync/backstop"
)

// FuzzParseEnvelope checks that ParseEnvelope never panics, that every
// error wraps ErrMalformed, and that a parsed event keeps the promises its
// doc comment makes. Seeds live in testdata/fuzz/FuzzParseEnvelope.
func FuzzParseEnvelope(f *testing.F) {
	f.Add([]byte(`{"event_id":"evt_1","event":"payment.succeeded","created_at":"2026-03-01T12:00:01Z","data":{"id":"pay_1","updated_at":"2026-03-01T12:00:00Z"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := ParseEnvelope(body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		again, err := ParseEnvelope(body)
		if err != nil || !reflect.DeepEqual(ev, again) {
			t.Fatalf("a second parse differs: %+v, %v; first %+v", again, err, ev)
		}
		if ev.Origin != backstop.OriginWebhook {
			t.Fatalf("Origin = %q", ev.Origin)
		}
		fuzzCheckID(t, "ID", ev.ID)
		fuzzCheckID(t, "Type", ev.Type)
		if ev.Data != nil {
			if !json.Valid(ev.Data) || ev.Data[0] != '{' {
				t.Fatalf("Data %q is not a JSON object", ev.Data)
			}
			if !bytes.Contains(body, ev.Data) {
				t.Fatalf("Data %q is not the bytes of the body", ev.Data)
			}
		}
		r, known := backstop.ResourceOfEventType(ev.Type)
		if !known {
			if ev.Resource != "" || ev.DedupKey() != "" {
				t.Fatalf("unknown type %q got resource %q, dedup key %q", ev.Type, ev.Resource, ev.DedupKey())
			}
			return
		}
		if ev.Resource != r || ev.Data == nil {
			t.Fatalf("type %q: Resource %q, Data %q", ev.Type, ev.Resource, ev.Data)
		}
		fuzzCheckID(t, "ObjectID", ev.ObjectID)
		switch {
		case ev.Truncated && !ev.UpdatedAt.IsZero():
			t.Fatalf("truncated event has UpdatedAt %v", ev.UpdatedAt)
		case !ev.Truncated && ev.UpdatedAt.IsZero():
			t.Fatalf("complete event has no UpdatedAt")
		case !ev.Truncated && ev.DedupKey() == "":
			t.Fatalf("complete event has no dedup key")
		}
	})
}

// fuzzCheckID restates the identifier rule independently of CheckID.
func fuzzCheckID(t *testing.T, name, s string) {
	t.Helper()
	if s == "" || len(s) > MaxIDBytes {
		t.Fatalf("%s %q: empty or longer than %d bytes", name, s, MaxIDBytes)
	}
	for _, r := range s {
		if r < 0x20 || (r >= 0x7f && r < 0xa0) {
			t.Fatalf("%s %q holds control character %U", name, s, r)
		}
	}
}
