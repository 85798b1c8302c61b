// Package dashboard is backstop's web dashboard under /ui: the delivery log
// with retry, redirect and dead letters, the jobs with their runs,
// reconcile reports and cursors, the API quota and the intake, drawn on the
// server (html/template, SVG charts, one embedded stylesheet; no script and
// nothing from another origin).
//
// It is off unless a token is configured. A person signs in with the token
// through a form and gets a session cookie (HttpOnly, SameSite=Strict); a
// script sends Authorization: Bearer <token>. Every POST from a browser
// carries the session's CSRF token, and cross-origin POSTs are refused.
// Secrets are never rendered: the dashboard is never given them.
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/backstop-sync/backstop/sinks/intake"
)

// Prefix is the path the dashboard is served under.
const Prefix = "/ui"

// maxForm bounds a form's body.
const maxForm = 64 << 10

// Defaults of zero Options fields.
const (
	DefaultSessionTTL = 12 * time.Hour
	DefaultPageSize   = 50
	// DefaultWindow is how far back the delivery log looks (attempts are
	// kept 14 days).
	DefaultWindow = 14 * 24 * time.Hour
)

// ErrUnknownJob is what Backend.RunJob wraps for a job that is not
// configured.
var ErrUnknownJob = errors.New("dashboard: unknown job")

// ErrJobRunning is what Backend.RunJob wraps when the job is running
// already (a scheduled run, or a run in another process holding its lock),
// so the run asked for did not start.
var ErrJobRunning = errors.New("dashboard: job is running already")

//go:embed templates/*.html static/*
var assets embed.FS

// Options configure a Dashboard.
type Options struct {
	// Token is the dashboard token (dashboard.token); required.
	Token   string
	Backend Backend
	Logger  *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
	// SessionTTL is how long a sign-in lasts (default 12h).
	SessionTTL time.Duration
	// PageSize is how many deliveries a page lists (default 50).
	PageSize int
}

// Dashboard is the dashboard's http.Handler. Mount it at Prefix and
// Prefix+"/". Close it before the backend goes away.
type Dashboard struct {
	opts    Options
	keys    keys
	log     *slog.Logger
	now     func() time.Time
	pages   map[string]*template.Template
	handler http.Handler

	// Job runs started with "run now" run on runCtx; Close cancels it
	// and waits for them.
	runCtx  context.Context
	stopRun context.CancelFunc
	runs    sync.WaitGroup
	mu      sync.Mutex
	running map[string]bool

	failed intake.AuthFailures // failed sign-ins per client address
}

// New returns the dashboard. It fails without a token or a backend.
func New(opts Options) (*Dashboard, error) {
	if opts.Token == "" {
		return nil, errors.New("dashboard: no token: the dashboard stays off until dashboard.token is set")
	}
	if opts.Backend == nil {
		return nil, errors.New("dashboard: no backend")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = DefaultSessionTTL
	}
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	pages, err := parsePages(opts.Now)
	if err != nil {
		return nil, err
	}
	d := &Dashboard{
		opts: opts, keys: newKeys(opts.Token), log: opts.Logger.With("component", "dashboard"),
		now: opts.Now, pages: pages, running: map[string]bool{},
	}
	d.runCtx, d.stopRun = context.WithCancel(context.Background())
	d.handler = d.routes()
	return d, nil
}

// ServeHTTP implements http.Handler.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) { d.handler.ServeHTTP(w, r) }

// Close cancels the job runs started from the dashboard and waits for them
// to end, or for ctx. No run starts after it.
func (d *Dashboard) Close(ctx context.Context) error {
	// Under mu, so that a "run now" either was counted before the wait
	// below or sees runCtx done.
	d.mu.Lock()
	d.stopRun()
	d.mu.Unlock()
	done := make(chan struct{})
	go func() {
		d.runs.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("dashboard: job runs still going: %w", ctx.Err())
	}
}

// routes builds the dashboard's routes: the login page and the stylesheet
// are open, everything else needs a session or the bearer token, and every
// POST but the login needs the CSRF token. Cross-origin POSTs are refused
// before anything else (http.CrossOriginProtection).
func (d *Dashboard) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "static")
	files := http.FileServerFS(static)
	mux.Handle("GET "+Prefix+"/static/", http.StripPrefix(Prefix+"/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A file that is not there is answered as the dashboard's other
		// errors are (net/http's would be plain text); the directory
		// itself lists nothing.
		if name := r.URL.Path; name == "" || strings.HasSuffix(name, "/") || !fs.ValidPath(name) {
			d.fail(w, r, http.StatusNotFound, "not_found", "There is no such file.")
			return
		} else if _, err := fs.Stat(static, name); err != nil {
			d.fail(w, r, http.StatusNotFound, "not_found", "There is no such file.")
			return
		}
		files.ServeHTTP(w, r)
	})))
	mux.HandleFunc("GET "+Prefix+"/login", d.loginPage)
	mux.HandleFunc("POST "+Prefix+"/login", d.login)

	authed := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, d.guard(h)) }
	authed("GET "+Prefix+"/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix+"/deliveries", http.StatusSeeOther)
	})
	authed("POST "+Prefix+"/logout", d.logout)
	authed("GET "+Prefix+"/deliveries", d.deliveriesPage)
	authed("GET "+Prefix+"/deliveries/{id}", d.deliveryPage)
	authed("POST "+Prefix+"/deliveries/{id}/retry", d.retry)
	authed("POST "+Prefix+"/deliveries/{id}/redirect", d.redirect)
	authed("GET "+Prefix+"/dead-letters", d.deadLettersPage)
	authed("POST "+Prefix+"/targets/{name}/retry-dead", d.retryDead)
	authed("GET "+Prefix+"/jobs", d.jobsPage)
	authed("POST "+Prefix+"/jobs/{name}/run", d.runJob)
	authed("GET "+Prefix+"/quota", d.quotaPage)
	authed("GET "+Prefix+"/intake", d.intakePage)
	mux.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix+"/", http.StatusSeeOther)
	})
	mux.Handle(Prefix+"/", d.guard(func(w http.ResponseWriter, r *http.Request) {
		// This pattern takes every method, so the mux's own 405 never
		// comes: a path that is a page or an action for another method
		// says which (GET on a POST-only action answered 404).
		var allow []string
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			other := r.Clone(r.Context())
			other.Method = method
			if _, pattern := mux.Handler(other); pattern != Prefix+"/" && pattern != "" {
				allow = append(allow, method)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			d.fail(w, r, http.StatusMethodNotAllowed, "method_not_allowed",
				fmt.Sprintf("%s %s: use %s.", r.Method, r.URL.Path, strings.Join(allow, " or ")))
			return
		}
		d.fail(w, r, http.StatusNotFound, "not_found", fmt.Sprintf("The dashboard has no page %s %s.", r.Method, r.URL.Path))
	}))

	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.fail(w, r, http.StatusForbidden, "cross_origin", "This request came from another site; the dashboard only accepts forms from its own pages.")
	}))
	return securityHeaders(cop.Handler(mux))
}

// guard lets through a request from a signed-in browser or from a script
// with the bearer token; a POST from a browser must also carry the
// session's CSRF token. Anyone else is sent to the login page (a browser
// asking for a page) or answered 401. An address that sent too many wrong
// tokens is answered 429, but a valid session is always let through: its
// cookie cannot be guessed, and a stranger's guesses from the same address
// (a shared proxy or NAT) must not lock a signed-in operator out.
func (d *Dashboard) guard(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := d.identify(r)
		if err != nil && !errors.Is(err, errBadSession) && !errors.Is(err, errBadBearer) {
			d.backendError(w, r, err) // the revocation list could not be read
			return
		}
		if (err != nil || c.bearer) && d.tooManyFailures(w, r) {
			return
		}
		if err != nil {
			if errors.Is(err, errBadBearer) {
				d.log.Warn("dashboard: wrong bearer token", "remote", r.RemoteAddr)
				d.failed.Fail(clientAddr(r), d.now())
			}
			if r.Method == http.MethodGet && wantsHTML(r) && !errors.Is(err, errBadBearer) {
				http.Redirect(w, r, Prefix+"/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="backstop dashboard"`)
			d.fail(w, r, http.StatusUnauthorized, "unauthorized",
				"Sign in at "+Prefix+"/login, or send Authorization: Bearer <dashboard.token>.")
			return
		}
		if r.Method == http.MethodPost && !c.bearer {
			r.Body = http.MaxBytesReader(w, r.Body, maxForm)
			if !d.keys.csrfOK(c.session, r.PostFormValue(csrfField)) {
				d.fail(w, r, http.StatusForbidden, "csrf",
					"This form is missing its CSRF token or the token is not this session's. Reload the page and try again.")
				return
			}
		}
		h(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	})
}

type callerKey struct{}

// csrfFor returns the CSRF token forms on r's page must carry; empty for a
// bearer caller.
func (d *Dashboard) csrfFor(r *http.Request) string {
	c, ok := r.Context().Value(callerKey{}).(caller)
	if !ok || c.bearer {
		return ""
	}
	return d.keys.csrfToken(c.session)
}

// securityHeaders sets headers every dashboard answer carries: no framing,
// no content from elsewhere, no script, not cached, no referrer.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		if !strings.HasPrefix(r.URL.Path, Prefix+"/static/") {
			hd.Set("Cache-Control", "no-store")
		}
		h.ServeHTTP(w, r)
	})
}

// wantsHTML reports whether r comes from a browser that wants a page
// rather than JSON.
func wantsHTML(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

// page is what every template gets.
type page struct {
	Title string
	// Nav is the menu entry to highlight.
	Nav   string
	CSRF  string
	Flash string
	// SignedIn shows the menu and the sign-out button.
	SignedIn bool
	Data     any
}

// render writes the page template name with p, or a 500 when it fails.
func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	t := d.pages[name]
	if p.CSRF == "" {
		p.CSRF = d.csrfFor(r)
	}
	if _, ok := r.Context().Value(callerKey{}).(caller); ok {
		p.SignedIn = true
		p.Flash = takeFlash(w, r)
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		d.log.Error("dashboard: render", "page", name, "err", err)
		intake.WriteError(w, http.StatusInternalServerError, "internal", "the page could not be drawn: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// fail answers an error: a page for a browser, else the JSON body the
// intake uses ({"error":{"code","message"}}).
func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	if wantsHTML(r) {
		d.render(w, r, status, "error", page{Title: http.StatusText(status), Data: errorData{Status: status, Message: msg}})
		return
	}
	intake.WriteError(w, status, code, msg)
}

type errorData struct {
	Status  int
	Message string
}

// backendError answers an error of the backend: 500, logged, unless the
// request was cancelled.
func (d *Dashboard) backendError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	d.log.Error("dashboard: backend", "path", r.URL.Path, "err", err)
	d.fail(w, r, http.StatusInternalServerError, "internal", err.Error())
}
