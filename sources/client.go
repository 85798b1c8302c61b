// Package sources reads the platform's public API: a paginated change feed
// per resource and single objects, through the rate-limit governor
// (sources/governor) and with bounded retries (go-retryablehttp).
package sources

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/governor"
)

// Defaults applied by New to zero Options fields.
const (
	DefaultPageSize     = 20
	MaxPageSize         = 200
	DefaultRetryMax     = 5
	DefaultRetryWaitMin = 500 * time.Millisecond
	DefaultRetryWaitMax = 30 * time.Second
	DefaultMax429       = 10
	DefaultTimeout      = 30 * time.Second
)

// maxBody bounds a response body read into memory.
const maxBody = 64 << 20

// Options configure a Client.
type Options struct {
	// BaseURL is the platform's origin, e.g. https://api.botix.pro. It must
	// not carry credentials.
	BaseURL string
	// APIKey is sent as a Bearer token. It never appears in logs or errors.
	APIKey string
	// PageSize is the cursor_limit of a ListRequest without a Limit
	// (default 20, at most 200).
	PageSize int
	// Governor paces every HTTP attempt. Nil makes one for APIKey with the
	// trial tariff; share one per key (governor.Registry) across clients.
	Governor *governor.Governor
	// RetryMax is how many times a call retries 5xx answers and network
	// errors (default 5; negative for none), waiting a full-jitter
	// exponential backoff between RetryWaitMin and RetryWaitMax (defaults
	// 500ms and 30s).
	RetryMax                   int
	RetryWaitMin, RetryWaitMax time.Duration
	// Max429 is how many 429 answers in a row a call retries before it
	// fails with ErrRateLimited (default 10; negative for none).
	Max429 int
	// Timeout bounds each HTTP attempt from the governor's grant to the end
	// of the body (default 30s).
	Timeout time.Duration
	// Transport sends the requests (default: a clone of
	// http.DefaultTransport).
	Transport http.RoundTripper
	// Logger receives retry diagnostics (default: discarded).
	Logger *slog.Logger
}

// Client reads the platform's public API. It is safe for concurrent use.
type Client struct {
	opts Options
	base string // BaseURL without a trailing slash
	http *http.Client
	log  *slog.Logger
	rand func() float64 // backoff jitter
}

var _ backstop.Source = (*Client)(nil)

// New validates opts, applies the defaults and returns a Client.
func New(opts Options) (*Client, error) {
	u, err := url.Parse(opts.BaseURL)
	switch {
	case opts.BaseURL == "":
		return nil, errors.New("sources: base URL is required")
	case err != nil:
		return nil, fmt.Errorf("sources: base URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return nil, fmt.Errorf("sources: base URL %q: want http(s)://host", u.Redacted())
	case u.User != nil, u.RawQuery != "", u.Fragment != "":
		return nil, fmt.Errorf("sources: base URL %q: want no credentials, query or fragment", u.Redacted())
	case opts.APIKey == "":
		return nil, errors.New("sources: API key is required (source.api_key)")
	case opts.PageSize < 0 || opts.PageSize > MaxPageSize:
		return nil, fmt.Errorf("sources: page size %d: want 1..%d", opts.PageSize, MaxPageSize)
	}
	if opts.PageSize == 0 {
		opts.PageSize = DefaultPageSize
	}
	opts.RetryMax = orDefault(opts.RetryMax, DefaultRetryMax)
	opts.Max429 = orDefault(opts.Max429, DefaultMax429)
	if opts.RetryWaitMin <= 0 {
		opts.RetryWaitMin = DefaultRetryWaitMin
	}
	if opts.RetryWaitMax <= 0 {
		opts.RetryWaitMax = max(DefaultRetryWaitMax, opts.RetryWaitMin)
	}
	if opts.RetryWaitMax < opts.RetryWaitMin {
		return nil, fmt.Errorf("sources: retry wait max %v is below min %v", opts.RetryWaitMax, opts.RetryWaitMin)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Governor == nil {
		opts.Governor = governor.New(opts.APIKey, governor.Options{Logger: opts.Logger})
	}
	if opts.Transport == nil {
		opts.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	return &Client{
		opts: opts,
		base: strings.TrimRight(u.String(), "/"),
		http: &http.Client{
			Transport: &governedTransport{next: opts.Transport, gov: opts.Governor, timeout: opts.Timeout},
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse // an API answer, not a page to follow
			},
		},
		log:  opts.Logger.With("component", "source", "key_id", opts.Governor.KeyID()),
		rand: rand.Float64,
	}, nil
}

func orDefault(n, def int) int {
	switch {
	case n == 0:
		return def
	case n < 0:
		return 0
	}
	return n
}

// Governor returns the governor pacing the client's requests.
func (c *Client) Governor() *governor.Governor { return c.opts.Governor }

// List fetches one page of req.Resource's change feed: GET
// /public/v1/{resource}?cursor=&cursor_limit=&since=. Each object keeps the
// JSON the platform sent byte for byte. A page with no objects keeps the
// cursor it was given.
//
// Errors are *backstop.APIError naming the resource and cursor, wrapping
// ErrUnauthorized (401, not retried), ErrInvalidCursor (the cursor is never
// reset silently), ErrNotFound, ErrUnavailable (5xx or network errors beyond
// RetryMax, or a body that cannot be read), ErrRateLimited (more than Max429
// 429s in a row), ErrRejected (other 4xx) or the context's error. The Page
// returned with an error still carries the call's Cost.
func (c *Client) List(ctx context.Context, req backstop.ListRequest) (backstop.Page, error) {
	ae := backstop.APIError{Resource: req.Resource, Cursor: req.Cursor}
	if !req.Resource.Valid() {
		ae.Err, ae.Message = ErrRejected, "unknown resource"
		return backstop.Page{}, &ae
	}
	limit := req.Limit
	if limit <= 0 {
		limit = c.opts.PageSize
	}
	q := url.Values{"cursor_limit": {strconv.Itoa(min(limit, MaxPageSize))}}
	if req.Cursor != "" {
		q.Set("cursor", req.Cursor)
	}
	if !req.Since.IsZero() {
		q.Set("since", req.Since.UTC().Format(time.RFC3339Nano))
	}
	res, cost, err := c.call(ctx, ae, http.MethodGet, c.base+"/public/v1/"+string(req.Resource)+"?"+q.Encode(), nil)
	page := backstop.Page{Cost: cost}
	if err != nil {
		return page, err
	}
	var body struct {
		Data *[]json.RawMessage `json:"data"`
		Meta *struct {
			NextCursor string `json:"next_cursor"`
			HasMore    bool   `json:"has_more"`
		} `json:"meta"`
	}
	if err := json.Unmarshal(res.body, &body); err != nil {
		return page, c.badBody(ae, res.status, fmt.Errorf("decode page: %w", err))
	}
	// An answer without both is not a page of the feed (a base_url that is
	// not the platform's API, answering 200 to every path): taken for an
	// empty last page, it would mark a first backfill done with nothing read.
	if body.Data == nil || body.Meta == nil {
		missing := `"data" list`
		if body.Data != nil {
			missing = `"meta" object`
		}
		return page, c.badBody(ae, res.status, fmt.Errorf(`not a page of the change feed: no %s (is source.base_url the platform's API?)`, missing))
	}
	page.Objects = make([]backstop.Object, 0, len(*body.Data))
	for _, raw := range *body.Data {
		obj, err := backstop.DecodeObject(req.Resource, raw)
		if err != nil {
			return page, c.badBody(ae, res.status, err)
		}
		page.Objects = append(page.Objects, obj)
	}
	page.NextCursor, page.HasMore = body.Meta.NextCursor, body.Meta.HasMore
	if len(page.Objects) == 0 {
		if page.NextCursor == "" {
			page.NextCursor = req.Cursor // never fall back to the start of the feed
		}
		if page.NextCursor == req.Cursor {
			page.HasMore = false // the same empty page again would loop
		}
	} else if page.NextCursor == "" {
		return page, c.badBody(ae, res.status, errors.New("page without meta.next_cursor"))
	}
	return page, nil
}

// Get fetches one object: GET /public/v1/{resource}/{id}. Errors are as for
// List, naming the resource and id; a missing object is ErrNotFound, a deleted one (410) ErrGone.
func (c *Client) Get(ctx context.Context, r backstop.Resource, id string) (backstop.Object, backstop.Cost, error) {
	ae := backstop.APIError{Resource: r, ID: id}
	if !r.Valid() || id == "" {
		ae.Err, ae.Message = ErrRejected, "unknown resource or empty id"
		return backstop.Object{}, backstop.Cost{}, &ae
	}
	res, cost, err := c.call(ctx, ae, http.MethodGet, c.base+"/public/v1/"+string(r)+"/"+url.PathEscape(id), nil)
	if err != nil {
		return backstop.Object{}, cost, err
	}
	obj, err := backstop.DecodeObject(r, res.body)
	if err != nil {
		return backstop.Object{}, cost, c.badBody(ae, res.status, err)
	}
	if obj.ID != id {
		return backstop.Object{}, cost, c.badBody(ae, res.status, fmt.Errorf("asked for %s, got %s", id, obj.ID))
	}
	return obj, cost, nil
}

func (c *Client) badBody(e backstop.APIError, status int, err error) *backstop.APIError {
	e.Status, e.Err, e.Message = status, backstop.ErrUnavailable, clean(c.redact(err.Error()))
	return &e
}

// response is a finished HTTP exchange with its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

// call sends one request with retries and maps every failure (transport
// error, non-2xx answer) to an *backstop.APIError built on e.
func (c *Client) call(ctx context.Context, e backstop.APIError, method, rawURL string, body []byte) (*response, backstop.Cost, error) {
	res, cost, err := c.do(ctx, method, rawURL, body)
	switch {
	case err != nil && ctx.Err() != nil:
		// Cancelled while the request was unanswered. An answer that did
		// arrive is still used: the caller commits the page it carries.
		e.Err = ctx.Err()
		return nil, cost, &e
	case err != nil:
		return nil, cost, c.transportError(e, err)
	case res.status < 200 || res.status > 299:
		return nil, cost, c.statusError(e, res.status, res.body)
	}
	return res, cost, nil
}

// do sends one request through retryablehttp and the governor and reads the
// answer, whatever its status. Each attempt rewinds body (so any method may
// be retried). It fails only when no answer could be read.
func (c *Client) do(ctx context.Context, method, rawURL string, body []byte) (*response, backstop.Cost, error) {
	st := &callStats{}
	ctx = withCallStats(ctx, st)
	pol := &retryPolicy{max5xx: c.opts.RetryMax, max429: c.opts.Max429, rand: c.rand, now: time.Now, stats: st}
	rc := &retryablehttp.Client{
		HTTPClient:   c.http,
		Logger:       quietWhenCancelled{retryLogger{c.log}, ctx},
		RetryWaitMin: c.opts.RetryWaitMin,
		RetryWaitMax: c.opts.RetryWaitMax,
		// The policy enforces RetryMax and Max429 itself; this only bounds
		// the loop (each 5xx ends a run of 429s).
		RetryMax:     (c.opts.RetryMax + 1) * (c.opts.Max429 + 1),
		CheckRetry:   pol.checkRetry,
		Backoff:      pol.backoff,
		ErrorHandler: retryablehttp.PassthroughErrorHandler,
	}
	var raw any // a nil []byte would still be a body
	if body != nil {
		raw = body
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, method, rawURL, raw)
	if err != nil {
		return nil, backstop.Cost{}, err
	}
	req.Header.Set("Authorization", "Bearer "+c.opts.APIKey)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := rc.Do(req)
	if err != nil {
		if resp != nil {
			resp.Body.Close()
		}
		return nil, st.cost(), err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err == nil && len(data) > maxBody {
		err = fmt.Errorf("response body over %d bytes", maxBody)
	}
	if err != nil {
		return nil, st.cost(), fmt.Errorf("read response: %w", err)
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: bytes.TrimSpace(data)}, st.cost(), nil
}

// quietWhenCancelled is the retry logger of one call: once the call's
// context is cancelled (Ctrl-C, a run stopping), the attempt it abandoned
// is not a failure worth a warning, so nothing more is logged about it.
type quietWhenCancelled struct {
	retryLogger
	ctx context.Context
}

// Error logs unless the call was cancelled (a deadline that passed is a
// failure, and is logged).
func (q quietWhenCancelled) Error(msg string, kv ...any) {
	if !errors.Is(q.ctx.Err(), context.Canceled) {
		q.retryLogger.Error(msg, kv...)
	}
}

// Warn logs unless the call was cancelled.
func (q quietWhenCancelled) Warn(msg string, kv ...any) {
	if !errors.Is(q.ctx.Err(), context.Canceled) {
		q.retryLogger.Warn(msg, kv...)
	}
}
