package config

import (
	"errors"
	"strings"
	"testing"
)

// An unquoted ${VAR} inside a flow mapping or list ({ } or [ ], as the
// README writes jobs and rate_limit) is a YAML syntax error: the { of ${
// opens a mapping. The parser's message ("did not find expected ',' or
// '}'") did not say so; now it ends with what to do, at the line of the
// ${VAR}. Other syntax errors, and ${VAR}s that are fine where they are,
// get no hint.
func TestUnquotedVarInFlowCollectionIsExplained(t *testing.T) {
	const hintMapping = `; a ${BOTIX_API_KEY} inside { } must be quoted: "${BOTIX_API_KEY}"`
	tests := []struct {
		name string
		yaml string
		want string // the whole error message
		line int
	}{
		{"one-line flow mapping, last value",
			"source: {base_url: http://x, api_key: ${BOTIX_API_KEY}}\n",
			`q2.yaml:1: did not find expected ',' or '}'` + hintMapping, 1},
		{"one-line flow mapping, first value",
			"source: {api_key: ${BOTIX_API_KEY}, base_url: http://x}\n",
			`q2.yaml:1: did not find expected ',' or '}'` + hintMapping, 1},
		{"two unquoted: the first is named",
			"source: {api_key: ${BOTIX_API_KEY}, base_url: ${BASE}}\n",
			`q2.yaml:1: did not find expected ',' or '}'` + hintMapping, 1},
		{"the first unquoted after a quoted one",
			"source: {base_url: \"${BASE}\", api_key: ${BOTIX_API_KEY}}\n",
			`q2.yaml:1: did not find expected ',' or '}'` + hintMapping, 1},
		// yaml reports the line of the flow mapping's start here; the
		// hint's line is that of the ${VAR}.
		{"flow mapping over several lines",
			base + "  rate_limit: {\n    per_minute: 30,\n    reserve: ${RESERVE}\n  }\n",
			`q2.yaml:6: did not find expected ',' or '}'; a ${RESERVE} inside { } must be quoted: "${RESERVE}"`, 6},
		{"job in a list",
			base + "jobs:\n  - {name: b, kind: backup, dir: ${BACKUP_DIR}, cron: \"15 4 * * *\"}\n",
			`q2.yaml:5: did not find expected ',' or '}'; a ${BACKUP_DIR} inside { } must be quoted: "${BACKUP_DIR}"`, 5},
		{"flow list",
			base + "  api_key: k2\nintake:\n  secrets: [${OLD_SECRET}, b]\n",
			`q2.yaml:6: did not find expected ',' or ']'; a ${OLD_SECRET} inside [ ] must be quoted: "${OLD_SECRET}"`, 6},

		// No hint.
		{"syntax error beside a quoted variable",
			base + "targets:\n  - {name: a, url: \"${URL}\", events: [a}\n",
			`q2.yaml:5: did not find expected ',' or ']'`, 5},
		{"syntax error after a variable in a block value",
			base + "dashboard:\n  token: ${TOKEN}\n  x: [1\n",
			`q2.yaml:6: did not find expected ',' or ']'`, 6},
		{"syntax error before an unquoted variable",
			base + "  page_size: [1\nstore: {path: ${DB}}\n",
			`q2.yaml:4: did not find expected ',' or ']'`, 4},
		{"scanner error with a variable on the line",
			base + "  api_key: ${KEY}: 2\n",
			`q2.yaml:4: mapping values are not allowed in this context`, 4},
		{"variable in a comment",
			base + "  rate_limit: {per_minute: 30, # ${X}\n    reserve: [5}\n",
			`q2.yaml:5: did not find expected ',' or ']'`, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("q2.yaml", []byte(tt.yaml), env(map[string]string{"BOTIX_API_KEY": "k"}))
			if err == nil {
				t.Fatalf("no error, want %s", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error:\n got %s\nwant %s", err, tt.want)
			}
			var e *Error
			if !errors.As(err, &e) || e.Line != tt.line || e.File != "q2.yaml" {
				t.Errorf("error %#v: want file q2.yaml, line %d", err, tt.line)
			}
		})
	}

	// Quoted, each form loads.
	for _, ok := range []string{
		"source: {base_url: http://x, api_key: \"${BOTIX_API_KEY}\"}\n",
		"source: {base_url: http://x, api_key: '${BOTIX_API_KEY}'}\n",
		"source:\n  base_url: http://x\n  api_key: ${BOTIX_API_KEY}\n",
	} {
		cfg, err := Parse("q2.yaml", []byte(ok), env(map[string]string{"BOTIX_API_KEY": "k"}))
		if err != nil {
			t.Errorf("%q: %v", ok, err)
		} else if cfg.Source.APIKey.Value() != "k" {
			t.Errorf("%q: api key not expanded", ok)
		}
	}
}

// The hint does not show a variable's value, only its name.
func TestUnquotedVarHintShowsNoValue(t *testing.T) {
	_, err := Parse("q2.yaml", []byte("source: {base_url: http://x, api_key: ${BOTIX_API_KEY}}\n"),
		env(map[string]string{"BOTIX_API_KEY": "s3cr3t-value"}))
	if err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("error %v: want one without the key's value", err)
	}
}

// A tab used for indentation gets yaml's "found character that cannot
// start any token", which does not say what the character is: the error
// now says the line has a tab and to indent with spaces.
func TestTabIndentationIsExplained(t *testing.T) {
	_, err := Parse("t.yaml", []byte("source:\n\tbase_url: http://x\n"), env(nil))
	want := "t.yaml:2: found character that cannot start any token; the line has a tab: YAML takes no tabs for indentation, indent with spaces"
	if err == nil || err.Error() != want {
		t.Errorf("error:\n got %v\nwant %s", err, want)
	}
}
