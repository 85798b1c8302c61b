package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Cookie names. Both are scoped to Path /ui, HttpOnly and SameSite=Strict.
const (
	SessionCookie = "backstop_session"
	flashCookie   = "backstop_flash"
)

// csrfField is the form field every POST of a signed-in browser carries.
const csrfField = "csrf"

// keys are derived from the dashboard token, so sessions survive a restart
// and end when the token changes.
type keys struct {
	token   [sha256.Size]byte // SHA-256 of the token, for constant-time compares
	session []byte            // signs session cookies
	csrf    []byte            // derives CSRF tokens from session ids
}

func newKeys(token string) keys {
	derive := func(label string) []byte {
		m := hmac.New(sha256.New, []byte(token))
		m.Write([]byte("backstop dashboard " + label))
		return m.Sum(nil)
	}
	return keys{token: sha256.Sum256([]byte(token)), session: derive("session"), csrf: derive("csrf")}
}

// tokenOK compares a presented token with the dashboard token in constant
// time (over their hashes, so the length does not leak either).
func (k keys) tokenOK(presented string) bool {
	sum := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(sum[:], k.token[:]) == 1
}

// session is a signed-in browser: a random id and when the session ends.
type session struct {
	id      [16]byte
	expires time.Time
}

// newSession starts a session that lasts ttl from now.
func newSession(now time.Time, ttl time.Duration) (session, error) {
	s := session{expires: now.Add(ttl)}
	if _, err := rand.Read(s.id[:]); err != nil {
		return session{}, err
	}
	return s, nil
}

// cookieValue is the session as its cookie holds it: id and expiry, then
// their HMAC.
func (k keys) cookieValue(s session) string {
	payload := make([]byte, 0, 24)
	payload = append(payload, s.id[:]...)
	payload = binary.BigEndian.AppendUint64(payload, uint64(s.expires.Unix()))
	m := hmac.New(sha256.New, k.session)
	m.Write(payload)
	enc := base64.RawURLEncoding
	return enc.EncodeToString(payload) + "." + enc.EncodeToString(m.Sum(nil))
}

var errBadSession = errors.New("no valid session")

// parseCookie returns the session a cookie value holds, or errBadSession
// when its signature is wrong or it has expired at now.
func (k keys) parseCookie(v string, now time.Time) (session, error) {
	p, sig, ok := strings.Cut(v, ".")
	if !ok {
		return session{}, errBadSession
	}
	enc := base64.RawURLEncoding
	payload, err1 := enc.DecodeString(p)
	mac, err2 := enc.DecodeString(sig)
	if err1 != nil || err2 != nil || len(payload) != 24 {
		return session{}, errBadSession
	}
	m := hmac.New(sha256.New, k.session)
	m.Write(payload)
	if !hmac.Equal(mac, m.Sum(nil)) {
		return session{}, errBadSession
	}
	var s session
	copy(s.id[:], payload[:16])
	s.expires = time.Unix(int64(binary.BigEndian.Uint64(payload[16:])), 0)
	if !now.Before(s.expires) {
		return session{}, errBadSession
	}
	return s, nil
}

// csrfToken is the CSRF token of a session: an HMAC of its id, so it needs
// no storage and is worthless without the session cookie.
func (k keys) csrfToken(s session) string {
	m := hmac.New(sha256.New, k.csrf)
	m.Write(s.id[:])
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// csrfOK reports whether presented is the CSRF token of s.
func (k keys) csrfOK(s session, presented string) bool {
	return hmac.Equal([]byte(presented), []byte(k.csrfToken(s)))
}

// caller is who a request comes from.
type caller struct {
	// bearer is a script that sent the token in Authorization; it needs no
	// CSRF token, since a browser never adds that header to a cross-site
	// request by itself.
	bearer bool
	// session is a signed-in browser's session (when not bearer).
	session session
}

// errBadBearer: an Authorization header with a wrong token.
var errBadBearer = errors.New("wrong bearer token")

// identify returns who r comes from: a script with the right bearer token,
// a browser with a valid session cookie, or an error. An Authorization
// header of another scheme (the Basic credentials of a proxy in front,
// which a browser sends with every request) is not the dashboard's: the
// request is identified by its session cookie, and so needs the CSRF
// token like any other browser's.
func (d *Dashboard) identify(r *http.Request) (caller, error) {
	if scheme, tok, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " "); strings.EqualFold(scheme, "Bearer") {
		if !d.keys.tokenOK(strings.TrimSpace(tok)) {
			return caller{}, errBadBearer
		}
		return caller{bearer: true}, nil
	}
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		return caller{}, errBadSession
	}
	s, err := d.keys.parseCookie(c.Value, d.now())
	if err != nil {
		return caller{}, err
	}
	revoked, err := d.opts.Backend.SessionRevoked(r.Context(), s.idString())
	if err != nil {
		return caller{}, fmt.Errorf("check session: %w", err)
	}
	if revoked {
		return caller{}, errBadSession
	}
	return caller{session: s}, nil
}

// idString is the session's id as the revocation list keeps it.
func (s session) idString() string { return hex.EncodeToString(s.id[:]) }

// setCookie sets a dashboard cookie: Path /ui, HttpOnly, SameSite=Strict,
// Secure over TLS, whether backstop ends it or a proxy in front does (and
// says so with X-Forwarded-Proto: https; trusting it can only make the
// cookie stricter). maxAge < 0 deletes it.
func setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: Prefix, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: overTLS(r),
	})
}

// overTLS reports whether the browser reached r over TLS.
func overTLS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https")
}

// loginPage shows the login form.
func (d *Dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, err := d.identify(r); err == nil {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	d.render(w, r, http.StatusOK, "login", page{Title: "Sign in", Data: loginData{Next: safeNext(r.URL.Query().Get("next"))}})
}

type loginData struct {
	Next  string
	Error string
}

// login checks the token from the form and starts a session.
func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if d.tooManyFailures(w, r) {
		return
	}
	next := safeNext(r.PostFormValue("next"))
	if !d.keys.tokenOK(r.PostFormValue("token")) {
		d.log.Warn("dashboard: failed sign-in", "remote", r.RemoteAddr)
		d.failed.Fail(clientAddr(r), d.now())
		d.render(w, r, http.StatusUnauthorized, "login", page{Title: "Sign in",
			Data: loginData{Next: next, Error: "That is not the dashboard token (dashboard.token in the configuration)."}})
		return
	}
	s, err := newSession(d.now(), d.opts.SessionTTL)
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, "internal", "cannot start a session: "+err.Error())
		return
	}
	setCookie(w, r, SessionCookie, d.keys.cookieValue(s), int(d.opts.SessionTTL/time.Second))
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the browser's session, for every copy of its cookie.
func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	// The cookie is signed, not stored: its id is remembered as ended, so
	// that a copy of it stops working too.
	if c, ok := r.Context().Value(callerKey{}).(caller); ok && !c.bearer {
		if err := d.opts.Backend.RevokeSession(r.Context(), c.session.idString(), c.session.expires); err != nil {
			d.backendError(w, r, err)
			return
		}
	}
	setCookie(w, r, SessionCookie, "", -1)
	http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
}

// safeNext returns next when it is a path inside the dashboard, else the
// dashboard's home: a login never sends a browser elsewhere.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || next == "" || u.Scheme != "" || u.Host != "" || strings.HasPrefix(next, "//") ||
		strings.Contains(next, `\`) || !strings.HasPrefix(u.Path, Prefix+"/") || strings.HasPrefix(u.Path, Prefix+"/login") {
		return Prefix + "/deliveries"
	}
	return u.RequestURI()
}

// flash leaves a message for the next page the browser shows.
func flash(w http.ResponseWriter, r *http.Request, msg string) {
	setCookie(w, r, flashCookie, url.QueryEscape(msg), 60)
}

// takeFlash returns the message left by flash and clears it.
func takeFlash(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	setCookie(w, r, flashCookie, "", -1)
	msg, err := url.QueryUnescape(c.Value)
	if err != nil {
		return ""
	}
	return msg
}
