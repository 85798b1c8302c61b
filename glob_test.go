package backstop

import (
	"path"
	"testing"
)

// "*" takes every event type, one with a '/' too: path.Match's '*' stops
// at '/', so such an event was stored and acknowledged but reached no
// target, even one subscribed to everything.
func TestMatchEventsTakesSlashes(t *testing.T) {
	for _, c := range []struct {
		globs []string
		typ   string
		want  bool
	}{
		{[]string{"*"}, "../../etc", true},
		{[]string{"*"}, "repo/push", true},
		{[]string{"repo/*"}, "repo/push", true},
		{[]string{"payment.*"}, "payment.refund/partial", true},
		{[]string{"?/?"}, "a/b", true},
		{[]string{"contact.*"}, "repo/push", false},
		{[]string{"[/]x"}, "/x", true},
		{[]string{"[^/]x"}, "/x", false},
	} {
		if got := MatchEvents(c.globs, c.typ); got != c.want {
			t.Errorf("MatchEvents(%q, %q) = %v, want %v", c.globs, c.typ, got, c.want)
		}
	}
}

// On names without '/', MatchGlob agrees with path.Match on every pattern
// of its syntax, and a malformed pattern matches nothing.
func TestMatchGlobAgreesWithPathMatch(t *testing.T) {
	patterns := []string{
		"", "*", "**", "?", "a", "a*", "*a", "a*b", "a*b*c", "*.*", "payment.*", "*.created",
		"a?c", "[abc]", "[a-c]x", "[^a-c]x", "[^ab]*", "\\*", "a\\?b", "[\\]]", "[a\\-c]",
		"é*", "[é-ë]", "?é", "ab[", "a[]", "[^]", "a\\", "[a-]", "[-a]", "[z-a]", "*[", "x[a-",
		"contact.???????", "*e*e*", "[]a]",
	}
	names := []string{
		"", "a", "b", "ab", "abc", "abbc", "a.b", "payment.succeeded", "contact.created",
		"contact.updated", "*", "a?b", "axb", "]", "-", "é", "ê", "éa", "xé", "bx", "dx",
		"eee", "chat.closed", "ab[", "a\\",
	}
	for _, p := range patterns {
		for _, n := range names {
			want, err := path.Match(p, n)
			if err != nil {
				want = false
			}
			if got := MatchGlob(p, n); got != want {
				t.Errorf("MatchGlob(%q, %q) = %v; path.Match says %v (%v)", p, n, got, want, err)
			}
		}
	}
}

// FuzzMatchGlob checks MatchGlob against path.Match on names without '/'.
func FuzzMatchGlob(f *testing.F) {
	f.Add("payment.*", "payment.succeeded")
	f.Add("[^a-c]*x?", "dzzxq")
	f.Add("a\\*b", "a*b")
	f.Fuzz(func(t *testing.T, p, n string) {
		for i := range len(n) {
			if n[i] == '/' {
				return
			}
		}
		want, err := path.Match(p, n)
		if err != nil {
			want = false
		}
		if got := MatchGlob(p, n); got != want {
			t.Errorf("MatchGlob(%q, %q) = %v; path.Match says %v (%v)", p, n, got, want, err)
		}
	})
}
