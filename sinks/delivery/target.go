package delivery

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Defaults for a Target's zero fields.
const (
	DefaultConnectTimeout = 10 * time.Second
	DefaultTimeout        = 30 * time.Second
	DefaultMaxPayload     = 64 << 10
)

// Target is one downstream HTTP endpoint and how to deliver to it.
type Target struct {
	Name string
	URL  string
	// Secret signs each request with Standard Webhooks headers ("whsec_"
	// and base64). Empty: no webhook-signature header is sent.
	Secret string
	// Headers are added to every request; they cannot replace the
	// headers the dispatcher sets itself (Content-Type, the signature and
	// X-Event-* headers).
	Headers map[string]string
	// ConnectTimeout bounds the dial and TLS handshake (default 10s).
	ConnectTimeout time.Duration
	// Timeout bounds one whole attempt (default 30s).
	Timeout time.Duration
	// RetrySchedule is the delay before each retry (default
	// DefaultRetrySchedule); a row is dead-lettered after
	// len(RetrySchedule)+1 failed attempts.
	RetrySchedule []time.Duration
	// MaxPayload is the largest body sent, in bytes (default 64 KiB): over
	// it, the envelope's data is cut to {"id":…} and "truncated": true is
	// added.
	MaxPayload int
	// Concurrency, when positive, is how many requests the target may
	// have in flight at once, instead of the dispatcher's
	// Options.Concurrency.
	Concurrency int
	// AllowPrivate lets the target, and redirects of its deliveries, reach
	// loopback, private, link-local and the other ranges CheckAddr refuses.
	AllowPrivate bool
}

// withDefaults returns t with its zero fields set to the defaults.
func (t Target) withDefaults() Target {
	if t.ConnectTimeout == 0 {
		t.ConnectTimeout = DefaultConnectTimeout
	}
	if t.Timeout == 0 {
		t.Timeout = DefaultTimeout
	}
	if t.RetrySchedule == nil {
		t.RetrySchedule = DefaultRetrySchedule
	}
	if t.MaxPayload == 0 {
		t.MaxPayload = DefaultMaxPayload
	}
	return t
}

// Validate returns an error naming the target and what is wrong: no name,
// a URL CheckURL refuses (a private address literal is accepted with
// AllowPrivate), a secret that is not a Standard Webhooks secret, a
// negative timeout, payload limit or concurrency, or a schedule step that
// is not positive.
func (t Target) Validate() error {
	if t.Name == "" {
		return errors.New("delivery: target has no name")
	}
	if err := checkURL(t.URL, t.AllowPrivate); err != nil {
		return fmt.Errorf("delivery: target %s: url: %w", t.Name, err)
	}
	if t.Secret != "" {
		if _, err := newSigner(t.Secret); err != nil {
			return fmt.Errorf("delivery: target %s: secret: %w", t.Name, err)
		}
	}
	if t.ConnectTimeout < 0 || t.Timeout < 0 {
		return fmt.Errorf("delivery: target %s: timeouts must not be negative", t.Name)
	}
	if t.MaxPayload < 0 {
		return fmt.Errorf("delivery: target %s: max_payload must not be negative", t.Name)
	}
	if t.Concurrency < 0 {
		return fmt.Errorf("delivery: target %s: concurrency must not be negative", t.Name)
	}
	for i, d := range t.RetrySchedule {
		if d <= 0 {
			return fmt.Errorf("delivery: target %s: retry_schedule step %d is %v, not positive", t.Name, i+1, d)
		}
	}
	return nil
}

// SentBody returns the body a target whose max_payload is limit is sent
// for row (sentBody), for showing it beside the payload stored.
func SentBody(row Row, limit int) []byte { return sentBody(row, limit) }

// sentBody is the body sent for row: a proxied payload as it came (the
// proxy refuses one over its target's max_payload), an event's envelope
// cut to limit (cutPayload).
func sentBody(row Row, limit int) []byte {
	if row.Proxied {
		return row.Payload
	}
	return cutPayload(row.Payload, limit)
}

// cutPayload returns the body to send for payload: payload itself when it
// fits in limit bytes, else the envelope with its data cut to {"id":…} and
// "truncated": true. A payload that is not an envelope with a data object
// is sent as it is.
func cutPayload(payload json.RawMessage, limit int) []byte {
	if limit <= 0 || len(payload) <= limit {
		return payload
	}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(payload, &env); err != nil {
		return payload
	}
	var data struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(env["data"], &data); err != nil || data.ID == nil {
		return payload
	}
	cut, err := json.Marshal(map[string]json.RawMessage{"id": data.ID})
	if err != nil {
		return payload
	}
	env["data"] = cut
	env["truncated"] = json.RawMessage("true")
	out, err := json.Marshal(env)
	if err != nil {
		return payload
	}
	return out
}

// HeaderForm is an event id or type as backstop sends it in a header
// (webhook-id, which the signature covers, X-Event-Id, X-Event-Type): s
// itself when it is printable ASCII without a space at either end, as ids
// and proxy keys (which came as header values) are; else s with every
// byte outside '!'..'~', and '%', percent-encoded ("evt_ü" → "evt_%C3%BC",
// "a b " → "a%20b%20"), which url.PathUnescape reverses. Receivers read
// header values as Latin-1 (Node, Python) and trim their spaces, so the
// raw bytes would read as another id there and its signature would not
// verify.
func HeaderForm(s string) string {
	plain := s != "" && s[0] != ' ' && s[len(s)-1] != ' '
	for i := 0; i < len(s) && plain; i++ {
		plain = s[i] >= ' ' && s[i] < 0x7f
	}
	if plain {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+16)
	for i := 0; i < len(s); i++ {
		if c := s[i]; c > ' ' && c < 0x7f && c != '%' {
			b = append(b, c)
		} else {
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
	}
	return string(b)
}
