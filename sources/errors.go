package sources

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"unicode"

	"github.com/backstop-sync/backstop"
)

// ErrRejected is wrapped by the *backstop.APIError of a request the platform
// refused with a 4xx that has no sentinel of its own (not 401, 404, 429 or
// invalid_cursor): retrying the same request will not help.
var ErrRejected = errors.New("backstop: request rejected by the platform")

// maxMessage bounds a platform message copied into an error.
const maxMessage = 300

// statusError fills e (which names the resource and the cursor or id) from
// a non-2xx answer and returns it.
func (c *Client) statusError(e backstop.APIError, status int, body []byte) *backstop.APIError {
	e.Status = status
	e.Code, e.Message = c.platformMessage(body)
	switch {
	case status == http.StatusUnauthorized:
		e.Err = backstop.ErrUnauthorized
		e.Message = joinMessage(e.Message, "check source.api_key")
	case status == http.StatusBadRequest && e.Code == "invalid_cursor":
		e.Err = backstop.ErrInvalidCursor
	case status == http.StatusNotFound:
		e.Err = backstop.ErrNotFound
		if e.ID == "" {
			// A resource's feed always exists: the address is wrong, most
			// often a base URL that already ends in /public/v1.
			e.Message = joinMessage(e.Message, "check source.base_url: the API's address, without /public/v1")
		}
	case status == http.StatusGone:
		e.Err = backstop.ErrGone
	case status == http.StatusTooManyRequests:
		e.Err = backstop.ErrRateLimited
	case status >= 500:
		e.Err = backstop.ErrUnavailable
	default:
		e.Err = ErrRejected
	}
	return &e
}

// transportError fills e from a call that got no usable answer.
func (c *Client) transportError(e backstop.APIError, err error) *backstop.APIError {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the URL is named by the resource and cursor already
	}
	e.Err = backstop.ErrUnavailable
	e.Message = clean(c.redact(err.Error()))
	return &e
}

// platformMessage reads {"error":{"code","message"}}, falling back to the
// body's text. The result is bounded, single-line and free of the API key.
func (c *Client) platformMessage(body []byte) (code, msg string) {
	var eb struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &eb); err == nil && (eb.Error.Code != "" || eb.Error.Message != "") {
		code, msg = eb.Error.Code, eb.Error.Message
	} else {
		msg = string(body)
	}
	return clean(c.redact(code)), clean(c.redact(msg))
}

func (c *Client) redact(s string) string {
	if c.opts.APIKey == "" {
		return s
	}
	return strings.ReplaceAll(s, c.opts.APIKey, "[redacted]")
}

// clean makes s one bounded line of printable text.
func clean(s string) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }), " ")
	if r := []rune(s); len(r) > maxMessage {
		s = string(r[:maxMessage]) + "…"
	}
	return s
}

func joinMessage(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
