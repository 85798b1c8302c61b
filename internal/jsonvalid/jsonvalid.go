// Package jsonvalid tells whether bytes are one JSON value, as
// encoding/json.Valid does, in one tight pass. Every webhook's body is
// checked before it is read, and every event's data again before it is
// stored, on the one writer's goroutine: encoding/json's scanner, which
// calls a step function per byte, took about a third of the envelope
// parse and a thirtieth of a commit's instructions.
package jsonvalid

// maxDepth is encoding/json's limit on nesting: a value nested deeper is
// not valid for it, and so not here.
const maxDepth = 10000

// Valid reports whether b is exactly one JSON value, with JSON whitespace
// around it allowed. It answers as encoding/json.Valid does for every
// input: strings are not checked for valid UTF-8 (encoding/json replaces
// invalid bytes when it decodes), and nesting deeper than 10,000 levels is
// refused.
func Valid(b []byte) bool {
	return ValidDepth(b, maxDepth)
}

// ValidDepth is Valid for documents nested at most depth levels deep (an
// object or array in another is two): SQLite's JSON functions, for one,
// read no deeper than 1,000.
func ValidDepth(b []byte, depth int) bool {
	var buf [32]byte
	stack := buf[:0] // the open containers, '{' or '['
	i := skipSpace(b, 0)
	for {
		// A value starts at i.
		if i >= len(b) {
			return false
		}
		switch c := b[i]; c {
		case '{', '[':
			if len(stack) >= depth {
				return false
			}
			end := byte('}')
			if c == '[' {
				end = ']'
			}
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == end {
				i++
				break // an empty container is a whole value
			}
			stack = append(stack, c)
			if c == '{' {
				if i = member(b, i); i < 0 {
					return false
				}
			}
			continue
		case '"':
			i = str(b, i)
		case 't':
			i = literal(b, i, "true")
		case 'f':
			i = literal(b, i, "false")
		case 'n':
			i = literal(b, i, "null")
		default:
			i = number(b, i)
		}
		if i < 0 {
			return false
		}
		// A value ended before i: close the containers it ends, then
		// go on to the next value of the one still open.
		for {
			i = skipSpace(b, i)
			if len(stack) == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			top := stack[len(stack)-1]
			if b[i] == ',' {
				i = skipSpace(b, i+1)
				if top == '{' {
					if i = member(b, i); i < 0 {
						return false
					}
				}
				break
			}
			if top == '{' && b[i] == '}' || top == '[' && b[i] == ']' {
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			return false
		}
	}
}

// member reads an object member's key and colon at b[i] and returns the
// index of its value (whitespace skipped), or -1.
func member(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = str(b, i); i < 0 {
		return -1
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return skipSpace(b, i+1)
}

// skipSpace is SkipSpace.
func skipSpace(b []byte, i int) int { return SkipSpace(b, i) }

// plain marks the bytes a string holds as they are: not the closing
// quote, not a backslash, not a control character.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str returns the index just past the string starting at b[i] (a '"'), or
// -1 when it is not a valid JSON string.
func str(b []byte, i int) int {
	for i++; i < len(b); {
		c := b[i]
		if plain[c] {
			i++
			continue
		}
		switch c {
		case '"':
			return i + 1
		case '\\':
			if i+1 >= len(b) {
				return -1
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return -1
				}
				for _, h := range b[i+2 : i+6] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return -1
					}
				}
				i += 6
			default:
				return -1
			}
		default:
			return -1 // a control character
		}
	}
	return -1
}

// literal returns the index just past word at b[i], or -1 when b does not
// hold it there.
func literal(b []byte, i int, word string) int {
	if len(b)-i < len(word) || string(b[i:i+len(word)]) != word {
		return -1
	}
	return i + len(word)
}

// number returns the index just past the number starting at b[i], or -1
// when none starts there: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func number(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

// digits returns the index of the first byte of b at or after i that is
// not a decimal digit.
func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}
