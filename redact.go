package backstop

import (
	"net/url"
	"strings"
)

// redacted replaces a secret in a URL shown to people.
const redacted = "xxxxx"

// RedactURL returns raw fit to show in logs, errors, the CLI and the
// dashboard: the password of its user info (or the user name when there is
// no password, as a token sent as one), every query value, and every
// path segment that looks like a credential (20 or more characters mixing
// letters with digits, '-' or '_', as the tokens of Discord's and Slack's
// webhook URLs do) are replaced by "xxxxx". Scheme, host, port, query keys
// and the other path segments are kept, so the URL still says where it
// points. A URL that cannot be parsed is shown as "(unreadable URL)",
// since it may be a secret mistyped.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unreadable URL)"
	}
	if u.Opaque != "" {
		return u.Scheme + ":" + redacted
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k, vs := range q {
			for i := range vs {
				vs[i] = redacted
			}
			q[k] = vs
		}
		u.RawQuery = q.Encode()
	}
	u.Fragment, u.RawFragment = "", ""
	if u.Path != "" {
		segs := strings.Split(u.Path, "/")
		changed := false
		for i, s := range segs {
			if looksLikeToken(s) {
				segs[i] = redacted
				changed = true
			}
		}
		if changed {
			u.Path = strings.Join(segs, "/")
			u.RawPath = ""
		}
	}
	if u.User != nil {
		if _, hasPassword := u.User.Password(); !hasPassword && u.User.Username() != "" {
			// A user name without a password is most often a token
			// (https://TOKEN@host/): hidden like a password.
			u.User = url.User(redacted)
		}
	}
	return u.Redacted()
}

// looksLikeToken reports whether a path segment is likely a credential: at
// least 20 characters of letters, digits, '-', '_' or '.', not all letters
// and not all digits (an 18-digit Discord webhook id is not secret; its
// 68-character token is).
func looksLikeToken(s string) bool {
	if len(s) < 20 {
		return false
	}
	var letters, others int
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			letters++
		case c >= '0' && c <= '9', c == '-', c == '_', c == '.':
			others++
		default:
			return false
		}
	}
	return letters > 0 && others > 0
}
