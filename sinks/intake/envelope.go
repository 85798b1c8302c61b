package intake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/jsonvalid"
)

// MaxBody is the largest webhook body accepted, in bytes (64 KiB).
const MaxBody = 64 << 10

// MaxIDBytes is the longest event_id, event type or object id accepted, in
// bytes.
const MaxIDBytes = 200

// MaxDataDepth is how deep a webhook's data may nest objects and arrays
// (the data object itself is one level). The store's JSON functions read
// at most 1000 levels: deeper data would fail every commit, answered 503 for
// ever, rather than be refused.
const MaxDataDepth = 500

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
//     data.updated_at (not the zero time), both required, except that a
//     truncated event (truncated: true) needs no updated_at and keeps
//     UpdatedAt zero until its object is fetched;
//   - Data holds the bytes of the data object exactly as received, nesting
//     at most MaxDataDepth levels, or is nil when data is absent (allowed
//     only for unknown types).
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
	var top envelopeFields
	if err := top.read(body); err != nil {
		if dup := (*duplicateKeyError)(nil); errors.As(err, &dup) {
			return backstop.Event{}, malformed("body %v", err)
		}
		return backstop.Event{}, malformed("body is not valid JSON: %v", err)
	}

	ev := backstop.Event{Origin: backstop.OriginWebhook}
	var err error
	if ev.ID, err = requiredID(top.eventID, "event_id"); err != nil {
		return backstop.Event{}, err
	}
	if ev.Type, err = requiredID(top.event, "event (the event type)"); err != nil {
		return backstop.Event{}, err
	}
	if t := strings.TrimSpace(ev.Type); t != ev.Type {
		// " contact.updated" matches no glob ("contact.*"): stored and
		// acknowledged, it would reach no target that asked for it.
		return backstop.Event{}, malformed("event (the event type) %q has spaces at its start or end", ev.Type)
	}
	if raw, ok := present(top.createdAt); ok {
		if ev.CreatedAt, err = timeField("created_at", raw); err != nil {
			return backstop.Event{}, err
		}
	}
	if raw, ok := present(top.truncated); ok {
		if ev.Truncated, err = boolField(raw); err != nil {
			return backstop.Event{}, malformed("truncated must be true or false")
		}
	}

	var obj objectFields
	data, hasData := present(top.data)
	if hasData {
		if firstByte(data) != '{' {
			return backstop.Event{}, malformed("data must be a JSON object")
		}
		switch d, huge := scanData(data, MaxDataDepth); {
		case d > MaxDataDepth:
			return backstop.Event{}, malformed("data nests more than %d levels deep", MaxDataDepth)
		case huge != "":
			return backstop.Event{}, malformed("data holds the number %.40s, too large for a JSON parser to read (past ±1.8e308)", huge)
		}
		// Read for every type, so that a key given twice is refused
		// whether or not backstop mirrors the object: targets get it too.
		if err := obj.read(data); err != nil {
			if dup := (*duplicateKeyError)(nil); errors.As(err, &dup) {
				return backstop.Event{}, malformed("data %v", err)
			}
			return backstop.Event{}, malformed("data is not a valid JSON object: %v", err)
		}
		// And every object inside it, a target reads those too: looked
		// for only when data holds an object or an array.
		if obj.nested {
			if where, err := nestedDuplicate(data); err != nil {
				return backstop.Event{}, malformed("%s %v", where, err)
			}
		}
		// A copy: the event must not alias the caller's body.
		ev.Data = append(json.RawMessage(nil), data...)
	}
	resource, known := backstop.ResourceOfEventType(ev.Type)
	if !known {
		return ev, nil
	}
	ev.Resource = resource
	if !hasData {
		return backstop.Event{}, malformed("data is missing: a %s event must carry its object", ev.Type)
	}
	if ev.ObjectID, err = requiredID(obj.id, "data.id"); err != nil {
		return backstop.Event{}, err
	}
	raw, ok := present(obj.updatedAt)
	switch {
	case ok:
		t, err := timeField("data.updated_at", raw)
		if err != nil {
			return backstop.Event{}, err
		}
		if !ev.Truncated {
			if t.IsZero() {
				// The emit path takes a zero updated_at for none: the
				// event would fail every commit, answered 503 for ever.
				return backstop.Event{}, malformed("data.updated_at is 0001-01-01T00:00:00Z, the zero time, which names no version")
			}
			ev.UpdatedAt = t
		}
	case !ev.Truncated:
		return backstop.Event{}, malformed("data.updated_at is missing (required unless truncated is true)")
	}
	return ev, nil
}

// envelopeFields are the raw values of the envelope keys ParseEnvelope
// reads; nil when absent.
type envelopeFields struct {
	eventID, event, createdAt, truncated, data json.RawMessage
}

// read fills f from body, a valid JSON object.
func (f *envelopeFields) read(body []byte) error {
	return readMembers(body, func(key []byte, val json.RawMessage) {
		switch string(key) {
		case "event_id":
			f.eventID = val
		case "event":
			f.event = val
		case "created_at":
			f.createdAt = val
		case "truncated":
			f.truncated = val
		case "data":
			f.data = val
		}
	})
}

// objectFields are the raw values of the data keys ParseEnvelope reads,
// and whether a member's value is an object or an array (nested), to be
// looked into for keys given twice.
type objectFields struct {
	id, updatedAt json.RawMessage
	nested        bool
}

// read fills f from data, a valid JSON object.
func (f *objectFields) read(data []byte) error {
	return readMembers(data, func(key []byte, val json.RawMessage) {
		switch string(key) {
		case "id":
			f.id = val
		case "updated_at":
			f.updatedAt = val
		}
		if len(val) > 0 && (val[0] == '{' || val[0] == '[') {
			f.nested = true
		}
	})
}

// nestedDuplicate looks through data, a valid JSON object, for an object
// at any depth that gives one key twice, and returns the path of the first
// one found (from "data") with a *duplicateKeyError, or nil. It reads data
// once, front to back, whatever the nesting: a body of arrays nested 500
// deep must not cost 500 passes over it.
func nestedDuplicate(data []byte) (string, error) {
	var stack []dupFrame
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '{':
			stack = append(stack, dupFrame{object: true, expectKey: true})
		case '[':
			stack = append(stack, dupFrame{})
		case '}', ']':
			if len(stack) == 0 {
				return "", nil // not as expected: encoding/json found it valid
			}
			top := &stack[len(stack)-1]
			if top.object {
				if dup := twinKey(top.keys); dup != "" {
					return framePath(stack), &duplicateKeyError{key: dup}
				}
			}
			stack = stack[:len(stack)-1]
		case ',':
			if n := len(stack); n > 0 {
				if stack[n-1].object {
					stack[n-1].expectKey = true
				} else {
					stack[n-1].index++
				}
			}
		case ':':
			if n := len(stack); n > 0 {
				stack[n-1].expectKey = false
			}
		case '"':
			end := jsonvalid.SkipString(data, i)
			if end < 0 {
				return "", nil
			}
			if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].expectKey {
				key := data[i+1 : end-1]
				if bytes.IndexByte(key, '\\') >= 0 {
					decoded, err := stringField(data[i:end])
					if err != nil {
						return "", nil
					}
					key = []byte(decoded)
				}
				stack[n-1].keys = append(stack[n-1].keys, key)
			}
			i = end - 1
		}
	}
	return "", nil
}

// dupFrame is an object or array nestedDuplicate is reading: an object's
// keys so far and whether a key comes next, an array's elements so far.
type dupFrame struct {
	object    bool
	expectKey bool
	keys      [][]byte
	index     int
}

// twinKey returns a key that keys holds twice, or "": pair by pair for a
// few keys, and among many sorted, where a key given twice has its twin
// beside it.
func twinKey(keys [][]byte) string {
	if len(keys) <= 32 {
		for i := 1; i < len(keys); i++ {
			for _, earlier := range keys[:i] {
				if bytes.Equal(keys[i], earlier) {
					return string(keys[i])
				}
			}
		}
		return ""
	}
	sorted := slices.Clone(keys)
	slices.SortFunc(sorted, bytes.Compare)
	for i := 1; i < len(sorted); i++ {
		if bytes.Equal(sorted[i], sorted[i-1]) {
			return string(sorted[i])
		}
	}
	return ""
}

// framePath names the innermost of stack, nestedDuplicate's frames from
// data's own object down: each frame above it names the member or element
// it is in (an object's last key, an array's element count).
func framePath(stack []dupFrame) string {
	path := "data"
	for _, f := range stack[:len(stack)-1] {
		if f.object {
			path += pathStep(f.keys[len(f.keys)-1])
		} else {
			path += "[" + strconv.Itoa(f.index) + "]"
		}
	}
	return path
}

// pathStep is how a path names the member key of an object: ".key", or
// ["key"] for a key that is not a plain name.
func pathStep(key []byte) string {
	plain := len(key) > 0
	for _, c := range key {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			plain = false
			break
		}
	}
	if plain {
		return "." + string(key)
	}
	return "[" + strconv.Quote(string(key)) + "]"
}

// readMembers calls member for each member of obj, a valid JSON object, in
// order, with its decoded key and its raw value (the value's bytes, which
// alias obj). A key given twice is refused with a *duplicateKeyError
// before member is called at all: parsers disagree on which of the two
// counts (encoding/json and most targets take the last, SQLite's
// json_extract, which the mirror's columns use, the first), so the event
// would mean one thing here and another there. Objects whose keys hold
// escapes, which the fast scan does not decode, go through encoding/json.
func readMembers(obj []byte, member func(key []byte, val json.RawMessage)) error {
	switch ok, dup := scanMembers(obj, member); {
	case dup != "":
		return &duplicateKeyError{key: dup}
	case ok:
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(obj))
	if _, err := dec.Token(); err != nil { // the '{'
		return err
	}
	type pair struct {
		key string
		val json.RawMessage
	}
	var pairs []pair
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		if seen[key] {
			return &duplicateKeyError{key: key}
		}
		seen[key] = true
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return err
		}
		pairs = append(pairs, pair{key, val})
	}
	for _, p := range pairs {
		member([]byte(p.key), p.val)
	}
	return nil
}

// duplicateKeyError is readMembers' refusal of an object that gives one
// key twice.
type duplicateKeyError struct{ key string }

func (e *duplicateKeyError) Error() string {
	return fmt.Sprintf("has the key %q twice (JSON parsers differ on which one counts)", e.key)
}

// scanMembers is readMembers' fast path over a valid JSON object: it
// reports false, having called member for nothing, when a key holds an
// escape or obj is not as expected, and a key given twice, having called
// member for nothing either.
func scanMembers(obj []byte, member func(key []byte, val json.RawMessage)) (ok bool, dup string) {
	type span struct{ key, val []byte }
	var buf [16]span
	spans := buf[:0]
	i := jsonvalid.SkipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false, ""
	}
	i = jsonvalid.SkipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return true, ""
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return false, ""
		}
		end := jsonvalid.SkipString(obj, i)
		if end < 0 {
			return false, ""
		}
		key := obj[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return false, ""
		}
		i = jsonvalid.SkipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return false, ""
		}
		i = jsonvalid.SkipSpace(obj, i+1)
		end = jsonvalid.SkipValue(obj, i)
		if end < 0 {
			return false, ""
		}
		spans = append(spans, span{key, obj[i:end]})
		i = jsonvalid.SkipSpace(obj, end)
		if i >= len(obj) {
			return false, ""
		}
		if obj[i] == '}' {
			break
		}
		if obj[i] != ',' {
			return false, ""
		}
		i = jsonvalid.SkipSpace(obj, i+1)
	}
	var kbuf [16][]byte
	keys := kbuf[:0]
	for _, sp := range spans {
		keys = append(keys, sp.key)
	}
	if dup := twinKey(keys); dup != "" {
		return false, dup
	}
	for _, s := range spans {
		member(s.key, s.val)
	}
	return true, ""
}

// scanData returns how deep b, valid JSON, nests objects and arrays
// (counting up to limit+1 and stopping there) and the first number in it
// too large for a float64 (1e999), or "": SQLite's json_extract, whose
// answers the mirror's typed columns hold, reads one as Infinity, and a
// target's parser refuses it or does the same, so the event would mean
// different things in different places.
func scanData(b []byte, limit int) (deepest int, hugeNumber string) {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			end := jsonvalid.SkipString(b, i)
			if end < 0 {
				return deepest, ""
			}
			i = end - 1
		case '{', '[':
			depth++
			if depth > deepest {
				deepest = depth
				if deepest > limit {
					return deepest, ""
				}
			}
		case '}', ']':
			depth--
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			end := i + 1
			for end < len(b) && !isDelimiter(b[end]) {
				end++
			}
			if num := b[i:end]; hugeNumber == "" && magnitude(num) > 300 {
				if f, err := strconv.ParseFloat(string(num), 64); err != nil && math.IsInf(f, 0) {
					hugeNumber = string(num)
				}
			}
			i = end - 1
		}
	}
	return deepest, hugeNumber
}

// magnitude returns, for num a valid JSON number, the place of its
// leading digit's power of ten plus one (1 for 1.5, 3 for 250, 0 for 0.5,
// 311 for 2e310; capped, and 0 for zero), so that only a number that may
// be past a float64's range (about 1.8e308) is parsed to make sure.
func magnitude(num []byte) int {
	j := 0
	if j < len(num) && num[j] == '-' {
		j++
	}
	for j < len(num) && num[j] == '0' {
		j++
	}
	mag, digits := 0, false
	for ; j < len(num) && num[j] >= '0' && num[j] <= '9'; j++ {
		mag, digits = mag+1, true
	}
	if j < len(num) && num[j] == '.' {
		for j++; !digits && j < len(num) && num[j] == '0'; j++ {
			mag--
		}
		for ; j < len(num) && num[j] >= '0' && num[j] <= '9'; j++ {
			digits = true
		}
	}
	if !digits {
		return 0 // zero, whatever its exponent
	}
	if j < len(num) && (num[j] == 'e' || num[j] == 'E') {
		j++
		neg := j < len(num) && num[j] == '-'
		if j < len(num) && (num[j] == '-' || num[j] == '+') {
			j++
		}
		exp := 0
		for ; j < len(num) && num[j] >= '0' && num[j] <= '9'; j++ {
			if exp < 1_000_000 {
				exp = exp*10 + int(num[j]-'0')
			}
		}
		if neg {
			exp = -exp
		}
		mag += exp
	}
	return mag
}

// isDelimiter reports whether c ends a JSON number.
func isDelimiter(c byte) bool {
	return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\r' || c == '\n'
}

// boolField decodes raw as a JSON boolean.
func boolField(raw json.RawMessage) (bool, error) {
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	var v bool
	err := json.Unmarshal(raw, &v)
	return v, err
}

// stringField decodes raw as a JSON string; a string without escapes is
// taken as it is (the body is valid UTF-8, so decoding would not change it).
func stringField(raw json.RawMessage) (string, error) {
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' && bytes.IndexByte(raw[1:n-1], '\\') < 0 && bytes.IndexByte(raw[1:n-1], '"') < 0 {
		return string(raw[1 : n-1]), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// checkJSON reports whether body is exactly one JSON value, with a reason
// when it is not (syntax error, or something after the value).
func checkJSON(body []byte) error {
	if jsonvalid.Valid(body) {
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

// present returns raw, ok=false when it is absent (nil) or null.
func present(raw json.RawMessage) (json.RawMessage, bool) {
	if raw == nil || string(raw) == "null" {
		return nil, false
	}
	return raw, true
}

// requiredID reads raw as an identifier: a non-empty string of at most
// MaxIDBytes bytes without control characters. name is the key as errors
// call it.
func requiredID(raw json.RawMessage, name string) (string, error) {
	raw, ok := present(raw)
	if !ok {
		return "", malformed("%s is missing", name)
	}
	s, err := stringField(raw)
	if err != nil {
		return "", malformed("%s must be a string", name)
	}
	if err := CheckID(s); err != nil {
		return "", malformed("%s %v", name, err)
	}
	return s, nil
}

// CheckID is the rule every identifier backstop accepts from outside
// follows: an event's id and type, an object's id, the webhook proxy's
// X-Event-Id and X-Event-Type. It returns nil for a non-empty string of
// valid UTF-8, at most MaxIDBytes bytes, without U+FFFD or control
// characters (C0, DEL and C1); otherwise an error saying what is wrong, to
// follow the identifier's name ("is empty", "contains a control character
// (U+0085)").
func CheckID(s string) error {
	switch {
	case s == "":
		return errors.New("is empty")
	case len(s) > MaxIDBytes:
		return fmt.Errorf("is %d bytes long, more than the %d allowed", len(s), MaxIDBytes)
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	case strings.ContainsRune(s, utf8.RuneError):
		// encoding/json turns invalid escapes such as a lone surrogate
		// into U+FFFD: two different ids would read as one.
		return errors.New("contains U+FFFD (a replacement character or a lone surrogate escape)")
	}
	for _, r := range s {
		if isControl(r) {
			return fmt.Errorf("contains a control character (U+%04X)", r)
		}
		if isDisguising(r) {
			// Invisible, or reordering what follows (U+202E): an id
			// printed by deliveries list or the dashboard would not
			// read as what it is.
			return fmt.Errorf("contains an invisible Unicode format character (U+%04X)", r)
		}
	}
	return nil
}

// isDisguising reports whether r is a format character that hides itself
// or reorders the text around it: the bidirectional controls (U+061C,
// U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069) and the invisible
// spaces and joiners without a use in words (U+180E, U+200B, U+2060 to
// U+2064, U+FEFF). The format characters that text needs are allowed: the
// zero-width non-joiner and joiner (U+200C, U+200D: Persian and Indic
// words, emoji sequences), the soft hyphen, tag characters of flags.
func isDisguising(r rune) bool {
	switch {
	case r == 0x061C, r == 0x180E, r == 0x200B, r == 0x200E, r == 0x200F, r == 0xFEFF:
		return true
	case r >= 0x202A && r <= 0x202E, r >= 0x2060 && r <= 0x2064, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// isControl reports whether r is a C0 control, DEL or a C1 control.
func isControl(r rune) bool {
	return r <= 0x1F || (r >= 0x7F && r <= 0x9F)
}

// timeField parses raw as an RFC 3339 timestamp string.
func timeField(name string, raw json.RawMessage) (time.Time, error) {
	s, err := stringField(raw)
	if err != nil {
		return time.Time{}, malformed("%s must be a string (an RFC 3339 timestamp)", name)
	}
	parsed, err := backstop.ParseCanonicalRange(s)
	if err != nil {
		return time.Time{}, malformed("%s: %v", name, err)
	}
	return parsed, nil
}
