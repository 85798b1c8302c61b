package config

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
)

// Validate checks what decoding cannot: required values, ranges, enums,
// unique names, cron expressions and job schedules. It returns the first
// problem as an *Error naming the key and, for a parsed file, the line.
// Secret values never appear in its errors. It normalizes the case of
// store.synchronous and intake.synchronous ("full" becomes "FULL").
func (c *Config) Validate() error {
	if err := c.validate(); err != nil {
		return err
	}
	return nil
}

// validate is Validate with a typed result.
func (c *Config) validate() *Error {
	s := c.Source
	if e := c.required("source.base_url", s.BaseURL); e != nil {
		return e
	}
	if e := c.url("source.base_url", s.BaseURL, "http", "https"); e != nil {
		return e
	}
	if e := c.required("source.api_key", string(s.APIKey)); e != nil {
		return e
	}
	if s.PageSize < 1 || s.PageSize > 200 {
		return c.errorf("source.page_size", "want 1..200, got %d", s.PageSize)
	}
	if s.RateLimit.PerMinute < 1 {
		return c.errorf("source.rate_limit.per_minute", "want more than 0, got %d", s.RateLimit.PerMinute)
	}
	if s.RateLimit.Reserve < 0 || s.RateLimit.Reserve >= s.RateLimit.PerMinute {
		return c.errorf("source.rate_limit.reserve", "want 0..%d (less than per_minute), got %d", s.RateLimit.PerMinute-1, s.RateLimit.Reserve)
	}
	if e := c.positive("source.rate_limit.window", s.RateLimit.Window); e != nil {
		return e
	}
	if s.RetryMax < 0 {
		return c.errorf("source.retry_max", "want 0 or more, got %d", s.RetryMax)
	}
	if e := c.positive("source.timeout", s.Timeout); e != nil {
		return e
	}

	if e := c.required("store.path", c.Store.Path); e != nil {
		return e
	}
	if p := c.Store.Path; p == ":memory:" || strings.HasPrefix(p, "file:") {
		return c.errorf("store.path", "%q is not supported: give a file path (the mirror and its cursors must outlive the process)", p)
	}
	if e := c.oneOf("store.synchronous", &c.Store.Synchronous, true, "NORMAL", "FULL"); e != nil {
		return e
	}

	gv := c.Governor
	if gv.Redis != "" {
		if e := c.url("governor.redis", gv.Redis.Value(), "redis", "rediss"); e != nil {
			return e
		}
	}
	if !(gv.FallbackShare > 0 && gv.FallbackShare <= 1) {
		return c.errorf("governor.fallback_share", "want a share above 0 and at most 1, got %g", gv.FallbackShare)
	}
	if gv.JobLease < Duration(time.Second) {
		return c.errorf("governor.job_lease", "want at least 1s, got %s", gv.JobLease)
	}

	in := &c.Intake
	if _, port, err := net.SplitHostPort(in.Listen); err != nil || !isPort(port) {
		return c.errorf("intake.listen", "want host:port, got %q", in.Listen)
	}
	if !strings.HasPrefix(in.Path, "/") {
		return c.errorf("intake.path", "want a path starting with /, got %q", in.Path)
	}
	if e := c.oneOf("intake.scheme", &in.Scheme, false, "botix", "standard-webhooks", "github", "stripe"); e != nil {
		return e
	}
	if e := c.positive("intake.tolerance", in.Tolerance); e != nil {
		return e
	}
	if e := c.oneOf("intake.synchronous", &in.Synchronous, true, "NORMAL", "FULL"); e != nil {
		return e
	}
	if in.MaxBatch < 1 || in.MaxBatch > 10000 {
		return c.errorf("intake.max_batch", "want 1..10000 webhooks per commit, got %d", in.MaxBatch)
	}

	names := map[string]string{}
	for i := range c.Targets {
		if e := c.target(i, names); e != nil {
			return e
		}
	}
	names = map[string]string{}
	for i := range c.Jobs {
		if e := c.job(i, names); e != nil {
			return e
		}
	}
	return nil
}

// target validates c.Targets[i]; names maps names seen so far to their keys.
func (c *Config) target(i int, names map[string]string) *Error {
	t := &c.Targets[i]
	k := fmt.Sprintf("targets[%d]", i)
	if e := c.name(k, t.Name, names); e != nil {
		return e
	}
	if e := c.required(k+".url", t.URL); e != nil {
		return e
	}
	if e := c.url(k+".url", t.URL, "http", "https"); e != nil {
		return e
	}
	if len(t.Events) == 0 {
		return c.errorf(k+".events", `is empty: leave it out for all events ("*")`)
	}
	for j, ev := range t.Events {
		if _, err := path.Match(ev, ""); err != nil || ev == "" {
			return c.errorf(fmt.Sprintf("%s.events[%d]", k, j), "want an event type or glob like payment.*, got %q", ev)
		}
	}
	for h := range t.Headers {
		if !isToken(h) {
			return c.errorf(k+".headers."+h, "want an HTTP header name, got %q", h)
		}
	}
	if e := c.positive(k+".connect_timeout", t.ConnectTimeout); e != nil {
		return e
	}
	if e := c.positive(k+".timeout", t.Timeout); e != nil {
		return e
	}
	for j, d := range t.RetrySchedule {
		if e := c.positive(fmt.Sprintf("%s.retry_schedule[%d]", k, j), d); e != nil {
			return e
		}
	}
	if t.MaxPayload < 1 {
		return c.errorf(k+".max_payload", "want more than 0 bytes, got %d", t.MaxPayload)
	}
	if t.Concurrency < 1 || t.Concurrency > maxTargetConcurrency {
		return c.errorf(k+".concurrency", "want 1..%d requests in flight, got %d", maxTargetConcurrency, t.Concurrency)
	}
	if t.RateLimit.PerSecond < 0 {
		return c.errorf(k+".rate_limit.per_second", "want 0 (no limit) or more, got %d", t.RateLimit.PerSecond)
	}
	if t.RateLimit.PerMinute < 0 {
		return c.errorf(k+".rate_limit.per_minute", "want 0 (no limit) or more, got %d", t.RateLimit.PerMinute)
	}
	return nil
}

// maxTargetConcurrency bounds targets[].concurrency: more requests in flight
// to one target than this only queue in its server.
const maxTargetConcurrency = 64

// job validates c.Jobs[i]; names maps names seen so far to their keys.
func (c *Config) job(i int, names map[string]string) *Error {
	j := &c.Jobs[i]
	k := fmt.Sprintf("jobs[%d]", i)
	if e := c.name(k, j.Name, names); e != nil {
		return e
	}
	if e := c.required(k+".kind", j.Kind); e != nil {
		return e
	}
	if e := c.oneOf(k+".kind", &j.Kind, false, KindSync, KindReconcile, KindBackfill, KindMaintenance); e != nil {
		return e
	}
	if j.Kind == KindMaintenance && len(j.Resources) > 0 {
		return c.errorf(k+".resources", "maintenance jobs take no resources")
	}
	seen := map[string]bool{}
	for n, r := range j.Resources {
		rk := fmt.Sprintf("%s.resources[%d]", k, n)
		if !r.Valid() {
			return c.errorf(rk, "want contacts, chats, messages or payments, got %q", string(r))
		}
		if seen[string(r)] {
			return c.errorf(rk, "%s is listed twice", r)
		}
		seen[string(r)] = true
	}
	switch {
	case j.Cron != "" && j.Every != 0:
		return c.errorf(k+".every", "set either cron or every, not both")
	case j.Cron == "" && j.Every == 0:
		return c.errorf(k, "needs a schedule: set cron or every")
	case j.Cron != "":
		if err := checkCron(j.Cron); err != nil {
			return c.errorf(k+".cron", "%v", err)
		}
	default:
		if e := c.positive(k+".every", j.Every); e != nil {
			return e
		}
	}
	if j.Lookback < 0 {
		return c.errorf(k+".lookback", "want 0 or more, got %s", j.Lookback)
	}
	return nil
}

// errorf returns an *Error for key, with its line when known.
func (c *Config) errorf(key, format string, args ...any) *Error {
	e := &Error{Key: key, Msg: fmt.Sprintf(format, args...)}
	if c.meta != nil {
		e.File, e.Line = c.meta.file, c.meta.line(key)
	}
	return e
}

// required reports an empty value, naming the variables it came from.
func (c *Config) required(key, v string) *Error {
	if v != "" {
		return nil
	}
	return c.errorf(key, "%s", c.emptyMsg(key))
}

// emptyMsg says that key is empty and, when it came from variables, which
// ones to set.
func (c *Config) emptyMsg(key string) string {
	if c.meta != nil {
		if vars := c.meta.vars[key]; len(vars) > 0 {
			return "is empty: set " + strings.Join(vars, ", ")
		}
	}
	return "is required"
}

// positive reports a duration that is not above zero.
func (c *Config) positive(key string, d Duration) *Error {
	if d > 0 {
		return nil
	}
	return c.errorf(key, "want a duration above 0, got %s", d)
}

// oneOf reports a value outside allowed; with fold it accepts any case and
// stores the allowed spelling.
func (c *Config) oneOf(key string, v *string, fold bool, allowed ...string) *Error {
	for _, a := range allowed {
		if *v == a || fold && strings.EqualFold(*v, a) {
			*v = a
			return nil
		}
	}
	return c.errorf(key, "want one of %s, got %q", strings.Join(allowed, ", "), *v)
}

// url reports a value that is not an absolute URL with a host in one of
// schemes. The value is not repeated: URLs can carry credentials.
func (c *Config) url(key, v string, schemes ...string) *Error {
	u, err := url.Parse(v)
	if err != nil || u.Host == "" {
		return c.errorf(key, "want an absolute %s:// URL with a host", schemes[0])
	}
	for _, s := range schemes {
		if strings.EqualFold(u.Scheme, s) {
			return nil
		}
	}
	return c.errorf(key, "want a %s URL, got scheme %q", strings.Join(schemes, " or "), u.Scheme)
}

// name checks the name of targets[i] or jobs[i] (key): required, usable on a
// command line and in a URL path, and unique among names.
func (c *Config) name(key, name string, names map[string]string) *Error {
	nk := key + ".name"
	if e := c.required(nk, name); e != nil {
		return e
	}
	for i, r := range name {
		ok := 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' ||
			i > 0 && (r == '.' || r == '_' || r == '-')
		if !ok {
			return c.errorf(nk, "want letters, digits, '.', '_' or '-' (starting with a letter or digit), got %q", name)
		}
	}
	if first, dup := names[name]; dup {
		return c.errorf(nk, "%q is already the name of %s", name, first)
	}
	names[name] = key
	return nil
}

// isPort reports whether s is a port number.
func isPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 0 && n <= 65535 && s == strconv.Itoa(n)
}

// isToken reports whether s is an HTTP token (RFC 9110, section 5.6.2).
func isToken(s string) bool {
	for _, r := range s {
		if r > 0x7e || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return s != ""
}
