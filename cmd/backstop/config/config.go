// Package config loads schedules.yaml, backstop's configuration file.
//
// Loading is strict: unknown keys, wrong types, bad durations, bad cron
// expressions and duplicate keys are errors of type *Error that name the
// file, the line and the full key path. ${VAR} in scalar values expands from
// the environment, so secrets never have to live in the file; values of type
// Secret never appear in errors, fmt or slog output.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/backstop-sync/backstop"
)

// Config is the whole of schedules.yaml. Missing sections and keys hold the
// defaults documented on each field.
type Config struct {
	Source    Source    `yaml:"source"`
	Store     Store     `yaml:"store"`
	Governor  Governor  `yaml:"governor"`
	Intake    Intake    `yaml:"intake"`
	Targets   []Target  `yaml:"targets"`
	Jobs      []Job     `yaml:"jobs"`
	Dashboard Dashboard `yaml:"dashboard"`
	Admin     Admin     `yaml:"admin"`

	// meta remembers where values came from, for the errors of Validate.
	// A pointer, so that fmt prints an address rather than its maps.
	meta *meta
	// local is set by ParseLocal: the platform's address and key may be
	// empty.
	local bool
	// warnings are set by Validate (see Warnings).
	warnings []*Error
}

// Source configures the platform API client.
type Source struct {
	BaseURL   string          `yaml:"base_url"`   // required, http or https
	APIKey    Secret          `yaml:"api_key"`    // required
	PageSize  int             `yaml:"page_size"`  // cursor_limit, 1..200, default 200
	RateLimit SourceRateLimit `yaml:"rate_limit"` // the tariff the governor starts from
	RetryMax  int             `yaml:"retry_max"`  // retries of 5xx and network errors, default 5
	Timeout   Duration        `yaml:"timeout"`    // per request, default 30s
}

// SourceRateLimit seeds the rate-limit governor before the platform's first
// X-RateLimit-* headers arrive.
type SourceRateLimit struct {
	PerMinute int      `yaml:"per_minute"` // > 0, default 30 (the trial tariff)
	Reserve   int      `yaml:"reserve"`    // requests kept back, 0..per_minute-1, default 5
	Window    Duration `yaml:"window"`     // default 1m
}

// Store configures the SQLite database.
type Store struct {
	// Path of the database, default ./backstop.db. Parse resolves a relative
	// path against the directory of the config file.
	Path        string `yaml:"path"`
	Synchronous string `yaml:"synchronous"` // NORMAL or FULL, default NORMAL
}

// Governor configures how the rate-limit budget, and the running of
// scheduled jobs, are shared between processes.
type Governor struct {
	// Redis, when set (redis:// or rediss:// URL, a password included), makes
	// every process share one budget per API key, and elects one process to
	// run the scheduled jobs. Empty keeps both in the process. A Secret,
	// since the URL may carry a password.
	Redis Secret `yaml:"redis"`
	// FallbackShare is the part (0..1] of the key's budget one process uses
	// while Redis is unreachable during a run, default 0.25.
	FallbackShare float64 `yaml:"fallback_share"`
	// JobLease is how long the jobs leader's lease lasts without renewal:
	// when the leader dies another process takes over within it. Default
	// 15s, at least 1s.
	JobLease Duration `yaml:"job_lease"`
}

// Intake configures the webhook endpoint.
type Intake struct {
	Listen      string   `yaml:"listen"`      // host:port, default 127.0.0.1:8080
	Path        string   `yaml:"path"`        // default /webhooks/botix
	Scheme      string   `yaml:"scheme"`      // botix | standard-webhooks | github | stripe, default botix
	Secret      Secret   `yaml:"secret"`      // the shared signing secret
	Secrets     []Secret `yaml:"secrets"`     // more secrets, accepted during rotation
	Tolerance   Duration `yaml:"tolerance"`   // timestamp tolerance, default 5m
	Synchronous string   `yaml:"synchronous"` // NORMAL or FULL for intake commits, default FULL
	// MaxBatch caps the webhooks one commit holds (group commit), default
	// 512; 1 commits every request on its own.
	MaxBatch int `yaml:"max_batch"`
	// Linger is how long a commit smaller than the one before waits for
	// more webhooks to join it (group commit under steady load), default
	// 500µs, at most 100ms; 0 commits at once.
	Linger     Duration `yaml:"linger"`
	ProxyToken Secret   `yaml:"proxy_token"` // bearer token for POST /outbox/{target} (webhook-proxy mode); empty = off
	// ProxyTokens are more bearer tokens the proxy takes, to rotate
	// proxy_token without downtime.
	ProxyTokens []Secret `yaml:"proxy_tokens"`
	// TrustedProxies are the addresses (or CIDR ranges) of the load
	// balancers or proxies in front of serve: a request from one of them
	// is taken to come from the address it names in X-Forwarded-For (the
	// last one not itself trusted), for the wrong-token limits and the
	// logs. Empty: every request's address is its connection's.
	TrustedProxies []string `yaml:"trusted_proxies"`
}

// TrustedPrefixes returns TrustedProxies as prefixes (an address is its
// own /32 or /128); Validate has checked them.
func (in Intake) TrustedPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range in.TrustedProxies {
		if p, err := parseTrustedProxy(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// parseTrustedProxy reads one entry of intake.trusted_proxies.
func parseTrustedProxy(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// AllProxyTokens returns ProxyToken followed by ProxyTokens, leaving out
// empty ones: the bearer tokens POST /outbox/{target} takes (none: off).
func (in Intake) AllProxyTokens() []string {
	var out []string
	for _, s := range append([]Secret{in.ProxyToken}, in.ProxyTokens...) {
		if s != "" {
			out = append(out, s.Value())
		}
	}
	return out
}

// AllSecrets returns Secret followed by Secrets, leaving out empty ones.
func (in Intake) AllSecrets() []Secret {
	var out []Secret
	for _, s := range append([]Secret{in.Secret}, in.Secrets...) {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Target is one downstream HTTP endpoint events are delivered to.
type Target struct {
	Name   string   `yaml:"name"`   // required, unique; letters, digits, '.', '_', '-'
	URL    string   `yaml:"url"`    // required, http or https
	Secret Secret   `yaml:"secret"` // signs deliveries (Standard Webhooks)
	Events []string `yaml:"events"` // event-type globs (path.Match), default ["*"]
	// Headers are added to every delivery. Values are secrets because they
	// usually carry credentials (Authorization).
	Headers        map[string]Secret `yaml:"headers"`
	ConnectTimeout Duration          `yaml:"connect_timeout"` // default 10s
	Timeout        Duration          `yaml:"timeout"`         // response timeout, default 30s
	// RetrySchedule is the delay before each retry, default [1m, 10m, 1h, 24h];
	// an empty list means no retries.
	RetrySchedule []Duration      `yaml:"retry_schedule"`
	MaxPayload    int             `yaml:"max_payload"`   // bytes, default 65536
	AllowPrivate  bool            `yaml:"allow_private"` // let the SSRF guard dial private addresses
	RateLimit     TargetRateLimit `yaml:"rate_limit"`
	// Concurrency is how many deliveries to the target may be in flight at
	// once (default 1: one after another, in queue order). A target that
	// answers slowly but can take several requests at a time goes faster
	// with more.
	Concurrency int `yaml:"concurrency"`
}

// TargetRateLimit caps deliveries to one target; zero means no cap.
type TargetRateLimit struct {
	PerSecond int `yaml:"per_second"`
	PerMinute int `yaml:"per_minute"`
}

// Job kinds.
const (
	KindSync        = "sync"
	KindReconcile   = "reconcile"
	KindBackfill    = "backfill"
	KindMaintenance = "maintenance"
	KindBackup      = "backup"
)

// Job is one scheduled run of the engine. Exactly one of Cron and Every is set.
type Job struct {
	Name string `yaml:"name"` // required, unique; letters, digits, '.', '_', '-'
	Kind string `yaml:"kind"` // sync | reconcile | backfill | maintenance | backup
	// Resources the job works on; empty means every resource. Maintenance
	// and backup jobs take none.
	Resources []backstop.Resource `yaml:"resources"`
	Cron      string              `yaml:"cron"`     // 5-field cron expression (or @hourly, @daily, ...)
	Every     Duration            `yaml:"every"`    // fixed interval, > 0
	Lookback  Duration            `yaml:"lookback"` // reconcile window overlap, default 10m
	Full      bool                `yaml:"full"`     // reconcile everything, not a window
	Emit      bool                `yaml:"emit"`     // backfill emits events
	// Dir is where a backup job writes its copies of the store (required
	// for backup jobs, which alone take it); a relative one is relative to
	// the configuration file's directory, as store.path is.
	Dir string `yaml:"dir"`
	// Keep is how many of its copies a backup job keeps in Dir; 0 (unset)
	// means 7.
	Keep int `yaml:"keep"`
}

// Dashboard configures the web dashboard.
type Dashboard struct {
	Token Secret `yaml:"token"` // bearer token for /ui
}

// Admin configures serve's admin address.
type Admin struct {
	// Listen, when set (host:port), is where serve answers /ui, /metrics,
	// /healthz and /readyz, and then /ui and /metrics are no longer
	// answered on intake.listen, which the platform must reach. Empty
	// (the default) serves everything on intake.listen.
	Listen string `yaml:"listen"`
}

// Default returns a configuration holding every default. It does not pass
// Validate: source.base_url and source.api_key have no default.
func Default() *Config {
	return &Config{
		Source: Source{
			PageSize: 200,
			RateLimit: SourceRateLimit{
				PerMinute: 30,
				Reserve:   5,
				Window:    Duration(time.Minute),
			},
			RetryMax: 5,
			Timeout:  Duration(30 * time.Second),
		},
		Store:    Store{Path: "./backstop.db", Synchronous: "NORMAL"},
		Governor: Governor{FallbackShare: 0.25, JobLease: Duration(15 * time.Second)},
		Intake: Intake{
			Listen:      "127.0.0.1:8080",
			Path:        "/webhooks/botix",
			Scheme:      "botix",
			Tolerance:   Duration(5 * time.Minute),
			Synchronous: "FULL",
			MaxBatch:    512,
			Linger:      Duration(500 * time.Microsecond),
		},
	}
}

// setDefaults fills a target that is about to be decoded.
func (t *Target) setDefaults() {
	*t = Target{
		Events:         []string{"*"},
		ConnectTimeout: Duration(10 * time.Second),
		Timeout:        Duration(30 * time.Second),
		RetrySchedule: []Duration{
			Duration(time.Minute), Duration(10 * time.Minute),
			Duration(time.Hour), Duration(24 * time.Hour),
		},
		MaxPayload:  65536,
		Concurrency: 1,
	}
}

// setDefaults fills a job that is about to be decoded.
func (j *Job) setDefaults() {
	*j = Job{Lookback: Duration(10 * time.Minute)}
}

// Error is a problem in a configuration file. Line is 0 when unknown; Key is
// the full path of the value, such as "jobs[1].cron" or
// "targets[0].retry_schedule[2]", or empty for the file as a whole.
type Error struct {
	File string
	Line int
	Key  string
	Msg  string
}

// Error renders "file:line: key: msg", leaving out what is unknown. A message
// that reads as a predicate ("is required") follows the key without a colon.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
	}
	if e.Line > 0 {
		if b.Len() > 0 {
			b.WriteByte(':')
		}
		b.WriteString(strconv.Itoa(e.Line))
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		if strings.HasPrefix(e.Msg, "is ") {
			b.WriteByte(' ')
		} else {
			b.WriteString(": ")
		}
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Problem returns an *Error about key, naming the file and line its value
// was read from (when it was read from a file), for what a command checks
// after loading: a value it requires, a path it cannot use.
func (c *Config) Problem(key, format string, args ...any) *Error {
	return c.errorf(key, format, args...)
}

// Missing returns an *Error saying that key, which a command requires, is
// empty ("is required", or "is empty: set VAR" when its value came from
// unset variables), followed by why the command needs it; with the file
// and line of the key when it was read from a file.
func (c *Config) Missing(key, why string) *Error {
	return c.errorf(key, "%s: %s", c.emptyMsg(key), why)
}

// meta records, per key path, the line of its value and the environment
// variables its value was expanded from.
type meta struct {
	file  string
	lines map[string]int
	vars  map[string][]string
	// unset are, per key, the variables of vars that were unset or empty.
	unset map[string][]string
	// bare are, per key, the warning for a $NAME kept as written (of a
	// variable that is not set: one that is set is an error).
	bare map[string]string
	// nulls are the keys written with a null value (key: ~, or nothing
	// after the colon): the same as left out.
	nulls map[string]bool
}

// line returns the line of key, or of its nearest ancestor that has one.
func (m *meta) line(key string) int {
	if m == nil {
		return 0
	}
	for key != "" {
		if l, ok := m.lines[key]; ok {
			return l
		}
		key = key[:max(strings.LastIndexByte(key, '.'), strings.LastIndexByte(key, '['), 0)]
	}
	return 0
}

// Load reads and parses the file at path with the process environment; see
// Parse. A missing file is an error that names the path and wraps
// fs.ErrNotExist.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("config file %s not found: %w", path, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data, os.LookupEnv)
}

// Parse decodes data, the contents of the config file named file, expands
// ${VAR} in scalar values with lookupEnv (os.LookupEnv when nil; an unset
// variable expands to ""; $$ is a literal $), applies defaults, resolves a
// relative store.path against the directory of file, and validates the
// result. A problem is returned as an *Error, several found by validation
// as Errors.
func Parse(file string, data []byte, lookupEnv func(string) (string, bool)) (*Config, error) {
	return parse(file, data, lookupEnv, false)
}

// ParseLocal is Parse for commands that only use the store (cursors,
// deliveries): they never call the platform, so an empty source.base_url
// or source.api_key is not a problem there (an operator reading the
// delivery log need not hold the platform's API key). Validate on the
// result keeps that leniency.
func ParseLocal(file string, data []byte, lookupEnv func(string) (string, bool)) (*Config, error) {
	return parse(file, data, lookupEnv, true)
}

func parse(file string, data []byte, lookupEnv func(string) (string, bool), local bool) (*Config, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	cfg := Default()
	cfg.local = local
	cfg.meta = &meta{file: file, lines: map[string]int{}, vars: map[string][]string{}, unset: map[string][]string{}, bare: map[string]string{}, nulls: map[string]bool{}}

	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, syntaxError(file, data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &Error{File: file, Line: extra.Line, Msg: "want one YAML document, found more"}
	} else if !errors.Is(err, io.EOF) {
		return nil, syntaxError(file, data, err)
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		d := decoder{meta: cfg.meta, lookupEnv: lookupEnv}
		if err := d.decode(doc.Content[0], reflect.ValueOf(cfg).Elem(), ""); err != nil {
			return nil, err
		}
	}
	cfg.Store.Path = resolvePath(filepath.Dir(file), cfg.Store.Path)
	for i := range cfg.Jobs {
		if d := cfg.Jobs[i].Dir; d != "" && !filepath.IsAbs(d) {
			cfg.Jobs[i].Dir = filepath.Join(filepath.Dir(file), d)
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// resolvePath joins a relative database path to dir. SQLite's special names
// are left alone.
func resolvePath(dir, p string) string {
	if p == "" || p == ":memory:" || strings.HasPrefix(p, "file:") || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parserProblems are the messages of yaml/v3's parser (as opposed to its
// scanner). For these it reports 0-based lines, and no line for the first
// one; scanner errors are 1-based.
var parserProblems = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected <stream-start>":   true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %TAG directive":         true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

// syntaxError turns a YAML parser error on data into an *Error with its
// line. When an unquoted ${VAR} in a flow collection ({ } or [ ]) caused it,
// the message says to quote it, at the line of the ${VAR}.
func syntaxError(file string, data []byte, err error) *Error {
	e := &Error{File: file}
	e.Line, e.Msg = yamlProblem(err)
	if v, line, ok := unquotedVarCause(data, err); ok {
		where := "{ } or [ ]"
		switch {
		case strings.HasSuffix(e.Msg, "'}'"):
			where = "{ }"
		case strings.HasSuffix(e.Msg, "']'"):
			where = "[ ]"
		}
		e.Line = line
		e.Msg += fmt.Sprintf("; a %s inside %s must be quoted: \"%s\"", v, where, v)
	} else if l := lineOf(data, e.Line); strings.Contains(e.Msg, "cannot start any token") && strings.Contains(l, "\t") {
		e.Msg += "; the line has a tab: YAML takes no tabs for indentation, indent with spaces"
	}
	return e
}

// lineOf returns line n (1-based) of data, "" when there is none.
func lineOf(data []byte, n int) string {
	if n < 1 {
		return ""
	}
	for i, l := range strings.Split(string(data), "\n") {
		if i+1 == n {
			return l
		}
	}
	return ""
}

// yamlProblem returns the 1-based line (0: unknown) and the message of a
// YAML parser error.
func yamlProblem(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	if parserProblems[msg] {
		line++
	}
	return line, msg
}

// varRef matches a ${VAR} reference on one line.
var varRef = regexp.MustCompile(`\$\{[^}\n]*\}`)

// firstYAMLError returns the first error reading data as parse does (its
// first document, then whether another follows), nil when there is none.
func firstYAMLError(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for range 2 {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
	return nil
}

// unquotedVarCause reports whether err, the YAML syntax error of data, is
// caused by an unquoted ${VAR}: inside { } or [ ] the { of ${ opens a
// mapping. It returns that ${VAR} (the first one the parser fails on) and
// its 1-based line. The cause is found by the parser itself rather than by
// guessing at YAML's rules: the ${VAR}s are written over with text of the
// same length without braces (harmless wherever a ${VAR} is not the
// problem: in quotes, in a block value, in a comment), the last ones first;
// the first ${VAR} whose overwriting changes the error is the cause. Any
// other syntax error stays as it is, without a hint.
func unquotedVarCause(data []byte, err error) (string, int, bool) {
	refs := varRef.FindAllIndex(data, -1)
	if len(refs) == 0 {
		return "", 0, false
	}
	want := err.Error()
	changed := func(from int) bool {
		buf := bytes.Clone(data)
		for _, r := range refs[from:] {
			for i := r[0] + 1; i < r[1]; i++ {
				buf[i] = '_'
			}
		}
		e := firstYAMLError(buf)
		return e == nil || e.Error() != want
	}
	if !changed(0) {
		return "", 0, false
	}
	// Overwriting refs[from:] changes the error for every from up to the
	// cause's index, and for none after it.
	from := len(refs) - 1
	for from > 0 && !changed(from) {
		from--
	}
	r := refs[from]
	return string(data[r[0]:r[1]]), 1 + bytes.Count(data[:r[0]], []byte("\n")), true
}
