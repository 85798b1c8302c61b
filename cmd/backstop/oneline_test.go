package main

import "testing"

// A target's answer is shown by `deliveries show` and `deliveries list`:
// its bytes must not reach the terminal as escape sequences.
func TestOneLineShowsControlCharactersEscaped(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"ok", 10, "ok"},
		{"line one\r\nline\ttwo", 40, "line one  line two"},
		{"\x1b[2J\x1b]0;owned\x07red", 40, `\x1b[2J\x1b]0;owned\ared`},
		{"bad \xff byte", 40, "bad \ufffd byte"},
		{"héllo wörld", 5, "héllo…"},
		{"\x00\x00", 1, `\x00…`},
	} {
		if got := oneLine(tc.in, tc.n); got != tc.want {
			t.Errorf("oneLine(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
