package config

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

const redacted = "[redacted]"

// Secret is a credential. Every way of printing or marshalling it (String,
// GoString, LogValue, MarshalJSON, MarshalText) renders "[redacted]", or ""
// when it is empty; only Value returns the real value.
type Secret string

// Value returns the secret itself, for the code that uses it.
func (s Secret) Value() string { return string(s) }

// String returns "[redacted]", or "" when s is empty.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString returns String quoted, so %#v redacts too.
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// LogValue implements slog.LogValuer with String.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON returns String as a JSON string.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// MarshalText returns String.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Duration is a time.Duration written in YAML as "500ms", "10m", "1h30m" or,
// with a days suffix, "14d" or "1d12h".
type Duration time.Duration

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText formats d like time.Duration, which ParseDuration reads back.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText parses text with ParseDuration.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := ParseDuration(string(text))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// maxDays keeps a day count within time.Duration.
const maxDays = 106751

// ParseDuration parses what time.ParseDuration accepts, and also a leading
// whole number of days: "14d", "1d12h". A day is 24 hours.
func ParseDuration(s string) (Duration, error) {
	days, rest, ok := strings.Cut(s, "d")
	if !ok {
		v, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return Duration(v), nil
	}
	n, err := strconv.Atoi(days)
	if err != nil || n < 0 || n > maxDays || strings.ContainsAny(days, "+-") {
		return 0, fmt.Errorf("invalid duration %q", s)
	}
	d := time.Duration(n) * 24 * time.Hour
	if rest != "" {
		v, err := time.ParseDuration(rest)
		if err != nil || strings.ContainsAny(rest[:1], "+-") || d+v < d {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		d += v
	}
	return Duration(d), nil
}
