package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // the zone database, as the binary has it (tzProblem)

	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/delivery"
)

// Validate checks what decoding cannot: required values, ranges, enums,
// unique names, cron expressions and job schedules. It reports every
// problem it finds, not only the first, so that one run shows all there is
// to fix: a single problem is an *Error naming the key and, for a parsed
// file, the line; several are Errors, in the file's order. Secret values
// never appear in its errors. It normalizes the case of store.synchronous
// and intake.synchronous ("full" becomes "FULL").
func (c *Config) Validate() error {
	var p problems
	c.warnings = nil
	c.warnBare()
	c.validate(&p)
	return p.err()
}

// Errors are the problems Validate found in one configuration, each an
// *Error; errors.As finds the first.
type Errors []*Error

// Error renders one problem per line.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the problems, for errors.As and errors.Is.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// problems collects what validate finds.
type problems struct{ list []*Error }

// add records the first problem of es (one key's checks, in order: a value
// that is missing is not also reported as malformed); nils are skipped.
func (p *problems) add(es ...*Error) {
	for _, e := range es {
		if e != nil {
			p.list = append(p.list, e)
			return
		}
	}
}

// err returns nil, the one problem, or all of them in line order (problems
// without a line keep their place after those with one).
func (p *problems) err() error {
	switch len(p.list) {
	case 0:
		return nil
	case 1:
		return p.list[0]
	}
	es := Errors(slices.Clone(p.list))
	slices.SortStableFunc(es, func(a, b *Error) int { return cmp.Compare(lineOrder(a), lineOrder(b)) })
	return es
}

// lineOrder sorts problems by line, those without one last.
func lineOrder(e *Error) int {
	if e.Line > 0 {
		return e.Line
	}
	return math.MaxInt
}

// validate adds every problem of c to p.
func (c *Config) validate(p *problems) {
	s := c.Source
	switch {
	case !c.local:
		p.add(c.required("source.base_url", s.BaseURL), c.url("source.base_url", s.BaseURL, "http", "https"), c.baseURL(s.BaseURL))
		p.add(c.required("source.api_key", string(s.APIKey)))
		p.add(c.secretText("source.api_key", s.APIKey))
	case s.BaseURL != "":
		p.add(c.url("source.base_url", s.BaseURL, "http", "https"), c.baseURL(s.BaseURL))
	}
	if s.PageSize < 1 || s.PageSize > 200 {
		p.add(c.errorf("source.page_size", "want 1..200, got %d", s.PageSize))
	}
	if s.RateLimit.PerMinute < 1 {
		p.add(c.errorf("source.rate_limit.per_minute", "want more than 0, got %d", s.RateLimit.PerMinute))
	} else if s.RateLimit.Reserve < 0 || s.RateLimit.Reserve >= s.RateLimit.PerMinute {
		got := strconv.Itoa(s.RateLimit.Reserve)
		if !c.isSet("source.rate_limit.reserve", true) {
			got += " (the default: write a smaller reserve beside per_minute)"
		}
		p.add(c.errorf("source.rate_limit.reserve", "want 0..%d (less than per_minute), got %s", s.RateLimit.PerMinute-1, got))
	}
	p.add(c.positive("source.rate_limit.window", s.RateLimit.Window))
	if s.RetryMax < 0 || s.RetryMax > maxRetries {
		p.add(c.errorf("source.retry_max", "want 0..%d, got %d: each retry waits up to 30s first and may take the whole source.timeout, so more would hold a run on one failing request for twenty minutes or more", maxRetries, s.RetryMax))
	}
	p.add(c.positive("source.timeout", s.Timeout), c.atMost("source.timeout", s.Timeout, maxRequestTimeout))

	if e := c.required("store.path", c.Store.Path); e != nil {
		p.add(e)
	} else if path := c.Store.Path; path == ":memory:" || strings.HasPrefix(path, "file:") {
		p.add(c.errorf("store.path", "%q is not supported: give a file path (the mirror and its cursors must outlive the process)", path))
	} else if strings.ContainsAny(path, "?#") {
		p.add(c.errorf("store.path", "%q has '?' or '#', which SQLite would read as URI options: give a plain file path", path))
	}
	p.add(c.oneOf("store.synchronous", &c.Store.Synchronous, true, "NORMAL", "FULL"))

	gv := c.Governor
	if gv.Redis != "" {
		p.add(c.url("governor.redis", gv.Redis.Value(), "redis", "rediss"), c.redisURL(gv.Redis.Value()))
	}
	if !(gv.FallbackShare > 0 && gv.FallbackShare <= 1) {
		p.add(c.errorf("governor.fallback_share", "want a share above 0 and at most 1, got %g", gv.FallbackShare))
	}
	if gv.JobLease < Duration(time.Second) {
		p.add(c.errorf("governor.job_lease", "want at least 1s, got %s", gv.JobLease))
	}

	in := &c.Intake
	if _, port, err := net.SplitHostPort(in.Listen); err != nil || !isPort(port) {
		p.add(c.errorf("intake.listen", "want host:port, got %q", in.Listen))
	}
	p.add(c.intakePath(in.Path))
	if c.Admin.Listen != "" {
		if _, port, err := net.SplitHostPort(c.Admin.Listen); err != nil || !isPort(port) {
			p.add(c.errorf("admin.listen", "want host:port, got %q", c.Admin.Listen))
		} else if c.Admin.Listen == in.Listen {
			p.add(c.errorf("admin.listen", "is intake.listen (%s): give it an address of its own, or leave it out to serve everything there", in.Listen))
		}
	}
	p.add(c.oneOf("intake.scheme", &in.Scheme, false, "botix", "standard-webhooks", "github", "stripe"))
	if in.Scheme == "standard-webhooks" {
		p.add(c.webhookSecret("intake.secret", in.Secret))
		for i, sec := range in.Secrets {
			p.add(c.webhookSecret(fmt.Sprintf("intake.secrets[%d]", i), sec))
		}
	}
	p.add(c.positive("intake.tolerance", in.Tolerance))
	p.add(c.oneOf("intake.synchronous", &in.Synchronous, true, "NORMAL", "FULL"))
	if in.MaxBatch < 1 || in.MaxBatch > 10000 {
		p.add(c.errorf("intake.max_batch", "want 1..10000 webhooks per commit, got %d", in.MaxBatch))
	}
	if in.Linger < 0 || in.Linger > maxLinger {
		p.add(c.errorf("intake.linger", "want 0 (commit at once) up to %s, got %s", maxLinger, in.Linger))
	}
	for i, tp := range in.TrustedProxies {
		if _, err := parseTrustedProxy(tp); err != nil {
			p.add(c.errorf(fmt.Sprintf("intake.trusted_proxies[%d]", i), "want an IP address or a CIDR range such as 10.0.0.0/8, got %q", tp))
		}
	}
	c.shortToken("intake.proxy_token", in.ProxyToken)
	for i, tok := range in.ProxyTokens {
		c.shortToken(fmt.Sprintf("intake.proxy_tokens[%d]", i), tok)
	}
	c.shortToken("dashboard.token", c.Dashboard.Token)
	p.add(c.secretText("intake.proxy_token", in.ProxyToken))
	p.add(c.secretText("dashboard.token", c.Dashboard.Token))
	if in.Scheme != "standard-webhooks" { // else webhookSecret checked them
		p.add(c.secretText("intake.secret", in.Secret))
		for i, sec := range in.Secrets {
			p.add(c.secretText(fmt.Sprintf("intake.secrets[%d]", i), sec))
		}
	}
	for i, tok := range in.ProxyTokens {
		p.add(c.secretText(fmt.Sprintf("intake.proxy_tokens[%d]", i), tok))
	}

	names := map[string]string{}
	for i := range c.Targets {
		c.target(p, i, names)
	}
	names = map[string]string{}
	for i := range c.Jobs {
		c.job(p, i, names)
	}
}

// ScheduleProblem reports, at the first job with a cron schedule, a TZ
// environment variable that names no time zone (see tzProblem), or
// returns nil: cron is local time, and Go would keep local time as UTC
// without a word, so that the jobs ran hours off. serve and jobs, which
// schedule by it, refuse to start; other commands do not look.
func (c *Config) ScheduleProblem() *Error {
	for i, j := range c.Jobs {
		if j.Cron == "" {
			continue
		}
		if msg := tzProblem(os.Getenv("TZ")); msg != "" {
			return c.errorf(fmt.Sprintf("jobs[%d].cron", i), "is local time, but %s", msg)
		}
		return nil // TZ is the whole process's
	}
	return nil
}

// tzProblem says why tz, the TZ environment variable, names no time zone
// Go can load, or returns "": Go then keeps local time as UTC without a
// word, and cron jobs would run hours off. An empty TZ is UTC, as for
// Go and the C library; ":" before a name is dropped, and a name starting
// with / is a file, as for them.
func tzProblem(tz string) string {
	name := strings.TrimPrefix(tz, ":")
	if name == "" || name == "UTC" {
		return ""
	}
	var err error
	switch {
	case name == "Local":
		// LoadLocation's own name for time.Local, but no zone to Go's
		// start, which looks for a file of that name.
		err = errors.New("no zone file")
	case strings.HasPrefix(name, "/"):
		var data []byte
		if data, err = os.ReadFile(name); err == nil {
			_, err = time.LoadLocationFromTZData(name, data)
		}
	default:
		_, err = time.LoadLocation(name)
	}
	if err == nil {
		return ""
	}
	return fmt.Sprintf("TZ=%q names no time zone (Go would use UTC): give an IANA name such as Europe/Berlin, or unset TZ for the system's zone", tz)
}

// target adds the problems of c.Targets[i] to p; names maps names seen so
// far to their keys.
func (c *Config) target(p *problems, i int, names map[string]string) {
	t := &c.Targets[i]
	k := fmt.Sprintf("targets[%d]", i)
	p.add(c.name(k, t.Name, names))
	urlProblem := c.url(k+".url", t.URL, "http", "https")
	p.add(c.required(k+".url", t.URL), urlProblem)
	if t.URL != "" && urlProblem == nil {
		// The SSRF guard's own check: an address literal the target may
		// not reach is a configuration error here, not a refusal of
		// every delivery (and every redirect) later.
		if err := delivery.CheckTargetURL(t.URL, t.AllowPrivate); err != nil {
			p.add(c.errorf(k+".url", "%v", err))
		}
	}
	if unset := c.unsetVarsOf(k + ".url"); len(unset) > 0 && t.URL != "" {
		c.warnf(k+".url", "uses %s, unset or empty: deliveries to %s go to the address without it", strings.Join(unset, ", "), t.Name)
	}
	if t.Secret != "" {
		p.add(c.webhookSecret(k+".secret", t.Secret))
	} else if vars := c.varsOf(k + ".secret"); len(vars) > 0 {
		c.warnf(k+".secret", "is empty (%s unset or empty): deliveries to %s are sent unsigned", strings.Join(vars, ", "), t.Name)
	}
	if len(t.Events) == 0 {
		p.add(c.errorf(k+".events", `is empty: leave it out for all events ("*")`))
	}
	for j, ev := range t.Events {
		ek := fmt.Sprintf("%s.events[%d]", k, j)
		if _, err := path.Match(ev, ""); err != nil || ev == "" {
			p.add(c.errorf(ek, "want an event type or glob like payment.*, got %q", ev))
		} else if trimmed := strings.TrimSpace(ev); trimmed != ev {
			p.add(c.errorf(ek, "%q has spaces at its ends, which no event type has, so it would match nothing: write %q", ev, trimmed))
		}
	}
	named := make(map[string]string, len(t.Headers)) // canonical name -> the first key given
	for _, h := range slices.Sorted(maps.Keys(t.Headers)) {
		canon := http.CanonicalHeaderKey(h)
		if first, dup := named[canon]; dup {
			// Header names are case-insensitive: one of the two values
			// would be sent, a different one from request to request.
			p.add(c.errorf(k+".headers."+h, "is the header %s again (also given as %s): header names are case-insensitive; keep one", canon, first))
			continue
		}
		named[canon] = h
		if !isToken(h) {
			p.add(c.errorf(k+".headers."+h, "want an HTTP header name, got %q", h))
		} else if why, reserved := delivery.ReservedHeader(h); reserved {
			p.add(c.errorf(k+".headers."+h, "%s", why))
		} else if err := c.headerText(k+".headers."+h, t.Headers[h]); err != nil {
			p.add(err)
		} else if unset := c.unsetVarsOf(k + ".headers." + h); len(unset) > 0 {
			c.warnf(k+".headers."+h, "uses %s, unset or empty: deliveries to %s carry this header without it", strings.Join(unset, ", "), t.Name)
		}
	}
	p.add(c.positive(k+".connect_timeout", t.ConnectTimeout), c.atMost(k+".connect_timeout", t.ConnectTimeout, maxRequestTimeout))
	p.add(c.positive(k+".timeout", t.Timeout), c.atMost(k+".timeout", t.Timeout, maxRequestTimeout))
	for j, d := range t.RetrySchedule {
		p.add(c.positive(fmt.Sprintf("%s.retry_schedule[%d]", k, j), d))
	}
	if t.MaxPayload < 1 {
		p.add(c.errorf(k+".max_payload", "want more than 0 bytes, got %d", t.MaxPayload))
	}
	if t.Concurrency < 1 || t.Concurrency > maxTargetConcurrency {
		p.add(c.errorf(k+".concurrency", "want 1..%d requests in flight, got %d", maxTargetConcurrency, t.Concurrency))
	}
	if t.RateLimit.PerSecond < 0 {
		p.add(c.errorf(k+".rate_limit.per_second", "want 0 (no limit) or more, got %d", t.RateLimit.PerSecond))
	}
	if t.RateLimit.PerMinute < 0 {
		p.add(c.errorf(k+".rate_limit.per_minute", "want 0 (no limit) or more, got %d", t.RateLimit.PerMinute))
	} else if t.RateLimit.PerSecond > 0 && t.RateLimit.PerMinute > 0 {
		// Delivery paces by one of them; the other would be ignored.
		p.add(c.errorf(k+".rate_limit.per_minute", "set either per_second or per_minute, not both"))
	}
}

// maxTargetConcurrency bounds targets[].concurrency: more requests in flight
// to one target than this only queue in its server.
const maxTargetConcurrency = 64

// job adds the problems of c.Jobs[i] to p; names maps names seen so far to
// their keys.
func (c *Config) job(p *problems, i int, names map[string]string) {
	j := &c.Jobs[i]
	k := fmt.Sprintf("jobs[%d]", i)
	p.add(c.name(k, j.Name, names))
	p.add(c.required(k+".kind", j.Kind), c.oneOf(k+".kind", &j.Kind, false, jobKinds...))
	if (j.Kind == KindMaintenance || j.Kind == KindBackup) && len(j.Resources) > 0 {
		p.add(c.errorf(k+".resources", "%s jobs take no resources", j.Kind))
	}
	if j.Kind == KindBackup {
		if j.Dir == "" {
			p.add(c.errorf(k+".dir", "is required for a backup job: the directory its copies of the store go to, e.g. /var/backups/backstop"))
		}
		if j.Keep < 0 || j.Keep == 0 && c.isSet(k+".keep", false) {
			p.add(c.errorf(k+".keep", "want 1 or more, got %d: how many of its backups the job keeps (default 7)", j.Keep))
		}
	}
	// Keys of one kind are refused on the others, rather than ignored.
	for _, o := range []struct {
		key  string
		kind string
		set  bool // set in a configuration built in code
	}{
		{"lookback", KindReconcile, j.Lookback != 0},
		{"full", KindReconcile, j.Full},
		{"emit", KindBackfill, j.Emit},
		{"dir", KindBackup, j.Dir != ""},
		{"keep", KindBackup, j.Keep != 0},
	} {
		if j.Kind != o.kind && slices.Contains(jobKinds, j.Kind) && c.isSet(k+"."+o.key, o.set) {
			p.add(c.errorf(k+"."+o.key, "only for %s jobs; this one is a %s job", o.kind, j.Kind))
		}
	}
	seen := map[string]bool{}
	for n, r := range j.Resources {
		rk := fmt.Sprintf("%s.resources[%d]", k, n)
		switch {
		case !r.Valid():
			p.add(c.errorf(rk, "want contacts, chats, messages or payments, got %q", string(r)))
		case seen[string(r)]:
			p.add(c.errorf(rk, "%s is listed twice", r))
		}
		seen[string(r)] = true
	}
	// every: 0 written in the file is set (and too short), not left out.
	every := j.Every != 0 || c.isSet(k+".every", false)
	switch {
	case j.Cron != "" && every:
		p.add(c.errorf(k+".every", "set either cron or every, not both"))
	case j.Cron == "" && !every:
		p.add(c.errorf(k, "needs a schedule: set cron or every"))
	case j.Cron != "":
		if err := checkCron(j.Cron); err != nil {
			p.add(c.errorf(k+".cron", "%v", err))
		}
	case j.Every < Duration(time.Second):
		p.add(c.errorf(k+".every", "want 1s or more, got %s: a shorter interval only piles up skipped runs", j.Every))
	}
	if j.Lookback < 0 || j.Lookback == 0 && j.Kind == KindReconcile && c.isSet(k+".lookback", false) {
		// 0 in a file would mean the default (10m) to the engine:
		// refused rather than silently replaced. (A configuration built
		// in code leaves it 0 for the default.)
		p.add(c.errorf(k+".lookback", "want more than 0s, got %s: the window overlaps the last run's start by it, to catch changes made while that run read the feed (default 10m)", j.Lookback))
	}
}

// jobKinds are the values of jobs[].kind.
var jobKinds = []string{KindSync, KindReconcile, KindBackfill, KindMaintenance, KindBackup}

// isSet reports whether key is written in the file with a value (a null
// is the same as leaving it out); for a configuration built in code,
// which has no file, it returns set.
func (c *Config) isSet(key string, set bool) bool {
	if c.meta == nil {
		return set
	}
	_, ok := c.meta.lines[key]
	return ok && !c.meta.nulls[key]
}

// intakePath reports an intake.path that serve cannot route: one that does
// not start with /, is / alone, is or lies under one of serve's own
// endpoints, has a character other than letters, digits and
// - . _ ~ ! $ & ' ( ) * + , ; = : @ (braces would be a ServeMux wildcard, a
// space would split the pattern, % would be an escape), ends with / (a
// ServeMux subtree) or is otherwise not a clean path.
func (c *Config) intakePath(v string) *Error {
	const key, example = "intake.path", "such as /webhooks/botix"
	switch {
	case !strings.HasPrefix(v, "/"):
		return c.errorf(key, "want a path starting with /, got %q", v)
	case v == "/":
		return c.errorf(key, `"/" alone would take every request serve answers: give a path %s`, example)
	}
	clean := path.Clean(v)
	switch {
	case clean == "/healthz", clean == "/readyz", clean == "/metrics", clean == "/ui", clean == "/outbox",
		strings.HasPrefix(clean, "/ui/"), strings.HasPrefix(clean, "/outbox/"):
		return c.errorf(key, "%q would clash with serve's own endpoints (/healthz, /readyz, /metrics, /ui/…, /outbox/{target}): give another path %s", v, example)
	}
	if i := strings.IndexFunc(v, func(r rune) bool { return !isPathChar(r) }); i >= 0 {
		r := []rune(v[i:])[0]
		if r == '{' || r == '}' {
			return c.errorf(key, "%q has %q, which serve's router would read as a wildcard: give a literal path %s", v, r, example)
		}
		return c.errorf(key, "%q has %q: use letters, digits, - . _ ~ and ! $ & ' ( ) * + , ; = : @ between the slashes", v, r)
	}
	switch {
	case clean == v:
		return nil
	case strings.HasSuffix(v, "/") && clean == strings.TrimSuffix(v, "/"):
		return c.errorf(key, "%q ends with /, which would make it take every path under it: write %q", v, clean)
	default:
		return c.errorf(key, "%q is not a clean path (no //, . or .. segments): write %q", v, clean)
	}
}

// isPathChar reports whether r may appear in intake.path: a pchar of RFC
// 3986 (section 3.3) that is not a percent-escape, or a slash.
func isPathChar(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' ||
		strings.ContainsRune("-._~!$&'()*+,;=:@/", r)
}

// Warnings are what Validate found suspicious but not wrong (a target
// secret that came from an unset variable), each naming its key and line;
// serve logs them when it starts.
func (c *Config) Warnings() []*Error { return c.warnings }

// minTokenLen is the shortest bearer token Validate takes without a
// warning: the proxy's and the dashboard's are served on the intake's
// listener, which the platform (so the internet) reaches.
const minTokenLen = 16

// shortToken warns when the bearer token under key is set but shorter
// than minTokenLen.
func (c *Config) shortToken(key string, token Secret) {
	if n := len(token.Value()); n > 0 && n < minTokenLen {
		c.warnf(key, "is %d characters: a token served where the platform can reach it should be at least %d random ones (openssl rand -hex 32 makes one)", n, minTokenLen)
	}
}

// warnBare warns of each value holding a $NAME of a variable that is not
// set, kept as written (see bareMsg), in the file's order.
func (c *Config) warnBare() {
	if c.meta == nil {
		return
	}
	keys := slices.Collect(maps.Keys(c.meta.bare))
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(c.meta.line(a), c.meta.line(b)), cmp.Compare(a, b))
	})
	for _, key := range keys {
		c.warnf(key, "%s", c.meta.bare[key])
	}
}

// warnf records a warning for key.
func (c *Config) warnf(key, format string, args ...any) {
	c.warnings = append(c.warnings, c.errorf(key, format, args...))
}

// secretText reports a secret or token holding a control character,
// which no one means: most often the line break that ends a file the value
// was read from. Left in, every request failed (the API key's, a proxy
// token's) or every signature did. The message names the character and
// where, never the value.
func (c *Config) secretText(key string, s Secret) *Error {
	return c.controlText(key, s, false)
}

// headerText is secretText for a target header's value, which may hold a
// tab between other characters, as HTTP allows (RFC 9110 5.5); a tab at
// either end, which HTTP strips, is refused with the other control
// characters.
func (c *Config) headerText(key string, s Secret) *Error {
	return c.controlText(key, s, true)
}

// controlText is secretText, taking tabs inside s when tabInside is set.
func (c *Config) controlText(key string, s Secret, tabInside bool) *Error {
	v := s.Value()
	for i, r := range v {
		if r >= 0x20 && r != 0x7f || tabInside && r == '\t' && i > 0 && i < len(v)-1 {
			continue
		}
		var what string
		switch r {
		case '\n':
			what = "a line break (\\n)"
		case '\r':
			what = "a carriage return (\\r)"
		case '\t':
			what = "a tab"
		default:
			what = fmt.Sprintf("the control character U+%04X", r)
		}
		msg := fmt.Sprintf("holds %s at byte %d of %d", what, i+1, len(s.Value()))
		if i == len(s.Value())-1 {
			msg += ", at its end: a value read from a file often ends with one"
		}
		if vars := c.varsOf(key); len(vars) > 0 {
			msg += " (check " + strings.Join(vars, ", ") + ")"
		}
		return c.errorf(key, "%s", msg)
	}
	return nil
}

// webhookSecret reports a Standard Webhooks secret that is not one, or
// holds a control character (secretText; an empty one is left to the
// checks of the key). The message names the
// variables the value came from, never the value.
func (c *Config) webhookSecret(key string, secret Secret) *Error {
	if secret == "" {
		return nil
	}
	if err := c.secretText(key, secret); err != nil {
		return err
	}
	if _, err := backstop.DecodeWebhookSecret(secret.Value()); err == nil {
		return nil
	}
	msg := `want a Standard Webhooks secret: base64, usually after "whsec_"`
	if vars := c.varsOf(key); len(vars) > 0 {
		msg += " (check " + strings.Join(vars, ", ") + ")"
	}
	return c.errorf(key, "%s", msg)
}

// varsOf returns the variables the value of key was expanded from.
func (c *Config) varsOf(key string) []string {
	if c.meta == nil {
		return nil
	}
	return c.meta.vars[key]
}

// unsetVarsOf returns the variables the value of key was expanded from
// that were unset or empty.
func (c *Config) unsetVarsOf(key string) []string {
	if c.meta == nil {
		return nil
	}
	return c.meta.unset[key]
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

// maxLinger bounds intake.linger: every webhook of a lingering commit waits
// that much longer for its answer.
const maxLinger = Duration(100 * time.Millisecond)

// maxRetries bounds source.retry_max.
const maxRetries = 20

// maxRequestTimeout bounds the timeouts of one request (the platform's,
// a target's attempt): an answer later than this is not coming, and the
// queue behind it waits as long (most often a unit mistaken: 30m for 30s).
const maxRequestTimeout = 10 * time.Minute

// atMost reports a duration above limit.
func (c *Config) atMost(key string, d Duration, limit time.Duration) *Error {
	if time.Duration(d) <= limit {
		return nil
	}
	return c.errorf(key, "want at most %s, got %s: an answer later than that is not coming, and everything behind it waits as long", Duration(limit), d)
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
	if port := u.Port(); port != "" && !isPort(port) {
		return c.errorf(key, "want a port number 0..65535, got %q", port)
	}
	for _, s := range schemes {
		if strings.EqualFold(u.Scheme, s) {
			return nil
		}
	}
	return c.errorf(key, "want a %s URL, got scheme %q", strings.Join(schemes, " or "), u.Scheme)
}

// redisURL reports a governor.redis URL that go-redis cannot use (a
// database that is not a number, an option it does not know), found here
// rather than when a command first connects. Its messages name the path
// or the option, never the password.
func (c *Config) redisURL(v string) *Error {
	if _, err := redis.ParseURL(v); err != nil {
		msg := strings.TrimPrefix(err.Error(), "redis: ")
		var num *strconv.NumError
		if errors.As(err, &num) {
			// "invalid database number: strconv.Atoi: parsing "x": invalid syntax"
			msg = strings.Replace(msg, num.Error(), strconv.Quote(num.Num)+" is not a number", 1)
		}
		return c.errorf("governor.redis", "%s: want redis://[user:password@]host:port[/db][?option=value]", msg)
	}
	return nil
}

// baseURL reports a source.base_url that the platform client cannot use:
// one with credentials (the API key is the only credential it sends), a
// query or a fragment. The value is not repeated, for its credentials.
func (c *Config) baseURL(v string) *Error {
	u, err := url.Parse(v)
	if err != nil {
		return nil // reported by url
	}
	var what string
	switch {
	case u.User != nil:
		what = "credentials (user:password@): the API key goes in source.api_key"
	case u.RawQuery != "" || u.ForceQuery:
		what = "a query (?…)"
	case u.Fragment != "" || strings.HasSuffix(v, "#"):
		what = "a fragment (#…)"
	default:
		return nil
	}
	return c.errorf("source.base_url", "want the API's address alone, such as https://api.botix.pro; this one has %s", what)
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
