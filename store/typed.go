package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
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

// sqliteMaxDepth is how deep SQLite's JSON functions read a document
// (JSON_MAX_DEPTH): json_extract fails on one nested deeper, and so did
// every write of such an object while the typed columns were generated.
const sqliteMaxDepth = 1000

// checkMirrorJSON tells why data cannot be an object's in the mirror, or
// nil: it is not JSON, or nests deeper than SQLite's JSON functions read,
// so that the mirror holds nothing a query of it could not read.
func checkMirrorJSON(data []byte) error {
	if jsonvalid.ValidDepth(data, sqliteMaxDepth) {
		return nil
	}
	if jsonvalid.Valid(data) {
		return fmt.Errorf("data nests deeper than %d levels, more than SQLite's JSON functions read", sqliteMaxDepth)
	}
	return errors.New("data is not valid JSON")
}

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
// want, an ASCII name. A name with escapes is compared as SQLite compares
// it: character by character, its escapes read as characters and its
// other bytes as SQLite reads UTF-8 (sqliteRune), up to the first zero
// character (a \u0000 ends it).
func labelIs(key []byte, want string) bool {
	if bytes.IndexByte(key, '\\') < 0 {
		return string(key) == want
	}
	for i, w := 0, 0; ; w++ {
		var c rune // 0 once key ends
		switch {
		case i >= len(key):
		case key[i] == '\\':
			var n int
			c, n = unescapeOne(key[i:])
			i += n
		case key[i] >= 0xc0:
			var n int
			c, n = sqliteRune(key[i:])
			i += n
		default:
			c = rune(key[i])
			i++
		}
		var r rune
		if w < len(want) {
			r = rune(want[w])
		}
		if c != r {
			return false
		}
		if c == 0 {
			return true
		}
	}
}

// sqliteRune reads one character from b, whose first byte is 0xc0 or
// more, as SQLite's sqlite3Utf8ReadLimited does: the lead byte's bits,
// then as many continuation bytes as follow, three at most, whatever the
// lead byte announced and whether or not the sequence is the shortest.
// It returns the character and the bytes it took.
func sqliteRune(b []byte) (rune, int) {
	c := rune(b[0])
	switch {
	case c < 0xe0:
		c -= 0xc0
	case c < 0xf0:
		c -= 0xe0
	case c < 0xf8:
		c -= 0xf0
	case c < 0xfc:
		c -= 0xf8
	case c < 0xfe:
		c -= 0xfc
	default:
		c = 0
	}
	i := 1
	for i < len(b) && i < 4 && b[i]&0xc0 == 0x80 {
		c = c<<6 + rune(b[i]&0x3f)
		i++
	}
	return c, i
}

// unescape is the JSON string body s (between its quotes) with its
// escapes replaced, as SQLite does it: a \u escape of a surrogate not
// followed by its pair is written as the three bytes UTF-8 would give it,
// \u0000 as a zero byte, and the other bytes are kept as they are, valid
// UTF-8 or not.
func unescape(s []byte) string {
	i := bytes.IndexByte(s, '\\')
	if i < 0 {
		return string(s)
	}
	out := make([]byte, i, len(s))
	copy(out, s[:i])
	for i < len(s) {
		if s[i] != '\\' {
			out = append(out, s[i])
			i++
			continue
		}
		c, n := unescapeOne(s[i:])
		out = appendCodePoint(out, c)
		i += n
	}
	return string(out)
}

// unescapeOne reads the escape that starts s (valid JSON), as SQLite's
// jsonUnescapeOneChar does: a \u escape of a high surrogate followed by
// one of a low surrogate is one character. It returns the character and
// the bytes it took.
func unescapeOne(s []byte) (rune, int) {
	switch s[1] {
	case 'u':
		v := hex4(s[2:])
		if v&0xfc00 == 0xd800 && len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
			if lo := hex4(s[8:]); lo&0xfc00 == 0xdc00 {
				return (v&0x3ff)<<10 + lo&0x3ff + 0x10000, 12
			}
		}
		return v, 6
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	}
	return rune(s[1]), 2 // '"', '\\', '/'
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
