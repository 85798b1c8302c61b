package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"

	"github.com/backstop-sync/backstop/internal/jsonvalid"
)

// The mirror's typed columns (status, amount, email, …) hold what
// json_extract(data, '$.<column>') gives, and are written by backstop in the
// same statement as data (migration 0022): SQLite computed them as
// generated columns on every write, at 14% of an emitted event's cost on
// the one writer, where reading and binding them here costs a fifth of
// that. The
// column's declared type then converts the value as it did for the
// generated column (SQLite applies a column's affinity to any value
// stored), so that a number in a TEXT column is stored as its text.
// TestTypedValuesAsJSONExtract and FuzzTypedValues hold the two to the
// same answers.

// typedValues appends to dst, for each of keys, the value json_extract
// gives for the member of that name at the top of data: a string
// unescaped, an integer as int64, any other number as a sqliteNumber for
// resolveNumbers to convert, true and false as 1 and 0, null and a missing
// member as nil, an object or array as its JSON text without whitespace.
// The first of members with the same name counts, as for json_extract.
// data must be valid JSON (jsonvalid.Valid); a document that is not an
// object gives nil for every key. At most 64 keys.
func typedValues(dst []any, data []byte, keys []string) []any {
	start := len(dst)
	for range keys {
		dst = append(dst, nil)
	}
	vals := dst[start:]
	i := jsonvalid.SkipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return dst
	}
	i++
	var set uint64 // the keys already found
	all := uint64(1)<<len(keys) - 1
	for set != all {
		i = jsonvalid.SkipSpace(data, i)
		if i >= len(data) || data[i] == '}' {
			break
		}
		if data[i] == ',' {
			i = jsonvalid.SkipSpace(data, i+1)
		}
		keyEnd := jsonvalid.SkipString(data, i)
		if keyEnd < 0 {
			break // not valid JSON, which the caller checked
		}
		key := data[i+1 : keyEnd-1]
		i = jsonvalid.SkipSpace(data, keyEnd) // the colon
		i = jsonvalid.SkipSpace(data, i+1)
		end := jsonvalid.SkipValue(data, i)
		if end < 0 {
			break
		}
		for k, want := range keys {
			if set&(1<<k) == 0 && labelIs(key, want) {
				vals[k] = jsonValue(data[i:end])
				set |= 1 << k
				break
			}
		}
		i = end
	}
	return dst
}

// jsonValue is the SQL value json_extract returns for the JSON value v.
func jsonValue(v []byte) any {
	switch v[0] {
	case '"':
		return unescape(v[1 : len(v)-1])
	case 't':
		return int64(1)
	case 'f':
		return int64(0)
	case 'n':
		return nil
	case '{', '[':
		return minify(v)
	}
	integer := true
	for _, c := range v {
		if c == '.' || c == 'e' || c == 'E' {
			integer = false
			break
		}
	}
	if integer {
		if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return n
		}
	}
	// SQLite's own conversion is not always the nearest float64
	// (700173372036854775808 gives 7.0017337203685471e+20, not …484e+20):
	// it is asked (resolveNumbers).
	return sqliteNumber(v)
}

// sqliteNumber is a JSON number that json_extract gives as a REAL, as
// typedValues leaves it for resolveNumbers.
type sqliteNumber string

// resolveNumbers replaces each sqliteNumber in args with the value SQLite
// gives it, asked on q (the writer's transaction): numbers other than
// int64s are rare in the typed columns, and SQLite's conversion is its own.
func resolveNumbers(ctx context.Context, q sqlx.QueryerContext, args []any) error {
	for i, a := range args {
		n, ok := a.(sqliteNumber)
		if !ok {
			continue
		}
		if err := q.QueryRowxContext(ctx, `SELECT json_extract(?, '$')`, string(n)).Scan(&args[i]); err != nil {
			return fmt.Errorf("convert the number %s: %w", n, err)
		}
	}
	return nil
}

// labelIs reports whether the raw (still escaped) member name key names
// want, a name without a zero byte. A name with escapes is compared as
// SQLite compares it, character by character up to the first zero: a
// \u0000 ends it.
func labelIs(key []byte, want string) bool {
	for _, c := range key {
		if c == '\\' {
			name := unescape(key)
			if end := strings.IndexByte(name, 0); end >= 0 {
				name = name[:end]
			}
			return name == want
		}
	}
	return string(key) == want
}

// unescape is the JSON string body s (between its quotes) with its
// escapes replaced, as SQLite does it: a \u escape of a surrogate not
// followed by its pair is written as the three bytes UTF-8 would give it,
// \u0000 as a zero byte, and the other bytes are kept as they are, valid
// UTF-8 or not.
func unescape(s []byte) string {
	i := 0
	for i < len(s) && s[i] != '\\' {
		i++
	}
	if i == len(s) {
		return string(s)
	}
	out := make([]byte, i, len(s))
	copy(out, s[:i])
	for i < len(s) {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		switch s[i+1] {
		case 'u':
			v := hex4(s[i+2:])
			i += 6
			if v&0xfc00 == 0xd800 && i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
				if lo := hex4(s[i+2:]); lo&0xfc00 == 0xdc00 {
					v = (v&0x3ff)<<10 + lo&0x3ff + 0x10000
					i += 6
				}
			}
			out = appendCodePoint(out, v)
			continue
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		default: // '"', '\\', '/'
			c = s[i+1]
		}
		out = append(out, c)
		i += 2
	}
	return string(out)
}

// appendCodePoint appends v in UTF-8's form, a surrogate's too (which
// utf8.AppendRune would replace).
func appendCodePoint(b []byte, v rune) []byte {
	if v < 0xd800 || v > 0xdfff {
		return utf8.AppendRune(b, v)
	}
	return append(b, byte(0xe0|v>>12), byte(0x80|(v>>6)&0x3f), byte(0x80|v&0x3f))
}

// hex4 is the value of the four hex digits at the start of b (valid JSON
// has them).
func hex4(b []byte) rune {
	var v rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		v = v<<4 | rune(c)
	}
	return v
}

// minify is the JSON text v without the whitespace between its tokens, as
// json_extract writes a nested object or array.
func minify(v []byte) string {
	out := make([]byte, 0, len(v))
	for i := 0; i < len(v); {
		switch c := v[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '"':
			end := jsonvalid.SkipString(v, i)
			if end < 0 {
				end = len(v)
			}
			out = append(out, v[i:end]...)
			i = end
		default:
			out = append(out, c)
			i++
		}
	}
	return string(out)
}
