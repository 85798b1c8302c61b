package intake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/backstop-sync/backstop"
)

// MaxBody is the largest webhook body accepted, in bytes (64 KiB).
const MaxBody = 64 << 10

// MaxIDBytes is the longest event_id, event type or object id accepted, in
// bytes.
const MaxIDBytes = 200

// ErrMalformed is wrapped by every error ParseEnvelope returns: the body is
// not a webhook envelope backstop can store.
var ErrMalformed = errors.New("intake: malformed event")

// malformed wraps ErrMalformed with a reason a person understands.
func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// ParseEnvelope decodes a platform webhook body,
//
//	{"event_id":"evt_…","event":"payment.succeeded","created_at":"…","data":{…},"truncated":true}
//
// into an Event with Origin webhook. On success:
//   - ID and Type are non-empty, valid UTF-8, at most MaxIDBytes bytes and
//     free of control characters (C0, DEL and C1);
//   - Resource comes from the type; an unknown type gives Resource "" and is
//     still a valid event (unknown types are stored and acknowledged);
//   - for a known resource, ObjectID is data.id and UpdatedAt is
//     data.updated_at, both required, except that a truncated event
//     (truncated: true) needs no updated_at and keeps UpdatedAt zero until
//     its object is fetched;
//   - Data holds the bytes of the data object exactly as received, or is nil
//     when data is absent (allowed only for unknown types).
//
// Keys are matched exactly (case-sensitive); unknown keys are ignored; a
// JSON null counts as absent. Every error wraps ErrMalformed and says what
// is wrong, e.g. "event_id is missing".
func ParseEnvelope(body []byte) (backstop.Event, error) {
	if len(body) > MaxBody {
		return backstop.Event{}, malformed("body is %d bytes, more than the %d allowed", len(body), MaxBody)
	}
	if !utf8.Valid(body) {
		return backstop.Event{}, malformed("body is not valid UTF-8")
	}
	if err := checkJSON(body); err != nil {
		return backstop.Event{}, malformed("body is not valid JSON: %v", err)
	}
	if firstByte(body) != '{' {
		return backstop.Event{}, malformed("body must be a JSON object")
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return backstop.Event{}, malformed("body is not valid JSON: %v", err)
	}

	ev := backstop.Event{Origin: backstop.OriginWebhook}
	var err error
	if ev.ID, err = requiredID(top, "event_id", "event_id"); err != nil {
		return backstop.Event{}, err
	}
	if ev.Type, err = requiredID(top, "event", "event (the event type)"); err != nil {
		return backstop.Event{}, err
	}
	if raw, ok := present(top, "created_at"); ok {
		if ev.CreatedAt, err = timeField("created_at", raw); err != nil {
			return backstop.Event{}, err
		}
	}
	if raw, ok := present(top, "truncated"); ok {
		if err := json.Unmarshal(raw, &ev.Truncated); err != nil {
			return backstop.Event{}, malformed("truncated must be true or false")
		}
	}

	data, hasData := present(top, "data")
	if hasData {
		if firstByte(data) != '{' {
			return backstop.Event{}, malformed("data must be a JSON object")
		}
		ev.Data = data
	}
	resource, known := backstop.ResourceOfEventType(ev.Type)
	if !known {
		return ev, nil
	}
	ev.Resource = resource
	if !hasData {
		return backstop.Event{}, malformed("data is missing: a %s event must carry its object", ev.Type)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return backstop.Event{}, malformed("data is not a valid JSON object: %v", err)
	}
	if ev.ObjectID, err = requiredID(obj, "id", "data.id"); err != nil {
		return backstop.Event{}, err
	}
	raw, ok := present(obj, "updated_at")
	switch {
	case ok:
		t, err := timeField("data.updated_at", raw)
		if err != nil {
			return backstop.Event{}, err
		}
		if !ev.Truncated {
			ev.UpdatedAt = t
		}
	case !ev.Truncated:
		return backstop.Event{}, malformed("data.updated_at is missing (required unless truncated is true)")
	}
	return ev, nil
}

// checkJSON reports whether body is exactly one JSON value, with a reason
// when it is not (syntax error, or something after the value).
func checkJSON(body []byte) error {
	if json.Valid(body) {
		return nil
	}
	var v json.RawMessage
	if err := json.Unmarshal(body, &v); err != nil {
		return err
	}
	return errors.New("unexpected data after the JSON value")
}

// firstByte returns the first byte of b that is not JSON whitespace, or 0.
func firstByte(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// present returns the raw value of key, ok=false when it is absent or null.
func present(m map[string]json.RawMessage, key string) (json.RawMessage, bool) {
	raw, ok := m[key]
	if !ok || string(raw) == "null" {
		return nil, false
	}
	return raw, true
}

// requiredID reads key as an identifier: a non-empty string of at most
// MaxIDBytes bytes without control characters. name is the key as errors
// call it.
func requiredID(m map[string]json.RawMessage, key, name string) (string, error) {
	raw, ok := present(m, key)
	if !ok {
		return "", malformed("%s is missing", name)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", malformed("%s must be a string", name)
	}
	if err := checkID(s); err != nil {
		return "", malformed("%s %v", name, err)
	}
	return s, nil
}

// checkID says why s is not an acceptable identifier, or returns nil.
func checkID(s string) error {
	switch {
	case s == "":
		return errors.New("is empty")
	case len(s) > MaxIDBytes:
		return fmt.Errorf("is %d bytes long, more than the %d allowed", len(s), MaxIDBytes)
	case strings.ContainsRune(s, utf8.RuneError):
		// encoding/json turns invalid escapes such as a lone surrogate
		// into U+FFFD: two different ids would read as one.
		return errors.New("contains U+FFFD (a replacement character or a lone surrogate escape)")
	}
	for _, r := range s {
		if isControl(r) {
			return fmt.Errorf("contains a control character (U+%04X)", r)
		}
	}
	return nil
}

// isControl reports whether r is a C0 control, DEL or a C1 control.
func isControl(r rune) bool {
	return r <= 0x1F || (r >= 0x7F && r <= 0x9F)
}

// timeField parses raw as an RFC 3339 timestamp string.
func timeField(name string, raw json.RawMessage) (time.Time, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return time.Time{}, malformed("%s must be a string (an RFC 3339 timestamp)", name)
	}
	parsed, err := backstop.ParseTime(s)
	if err != nil {
		return time.Time{}, malformed("%s: %v", name, err)
	}
	return parsed, nil
}
