package config

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

var (
	durationType = reflect.TypeFor[Duration]()
	secretType   = reflect.TypeFor[Secret]()
)

// decoder walks a yaml.Node tree into a Go value by the yaml tags of its
// struct fields. It supports exactly the kinds Config uses: structs, slices,
// string-keyed maps, strings, ints, float64s, bools and Duration.
type decoder struct {
	meta      *meta
	lookupEnv func(string) (string, bool)
}

// errorf returns an *Error for key at line.
func (d *decoder) errorf(line int, key, format string, args ...any) *Error {
	return &Error{File: d.meta.file, Line: line, Key: key, Msg: fmt.Sprintf(format, args...)}
}

// valueError returns an *Error about the value n of key, at the line of key
// (where a block mapping or list value begins), else of n.
func (d *decoder) valueError(n *yaml.Node, key, format string, args ...any) *Error {
	line, ok := d.meta.lines[key]
	if !ok {
		line = n.Line
	}
	return d.errorf(line, key, format, args...)
}

// decode stores n into v. A null leaves v as it was, keeping the default.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, key string) error {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	if v.Type() == durationType {
		s, err := d.scalar(n, v.Type(), key, "a duration")
		if err != nil {
			return err
		}
		dur, err := ParseDuration(s)
		if err != nil {
			return d.valueError(n, key, "want a duration like 30s, 10m, 1h30m or 14d, got %s", d.found(n, s, key))
		}
		v.SetInt(int64(dur))
		return nil
	}
	switch v.Kind() {
	case reflect.Struct:
		return d.mapping(n, v, key)
	case reflect.Map:
		return d.mapping(n, v, key)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return d.valueError(n, key, "want a list, got %s", d.describe(n, v.Type(), key))
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			ikey := fmt.Sprintf("%s[%d]", key, i)
			d.meta.lines[ikey] = item.Line
			elem := s.Index(i)
			if def, ok := elem.Addr().Interface().(interface{ setDefaults() }); ok {
				def.setDefaults()
			}
			if err := d.decode(item, elem, ikey); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	case reflect.String:
		s, err := d.scalar(n, v.Type(), key, "a string")
		if err != nil {
			return err
		}
		v.SetString(s)
		return nil
	case reflect.Int:
		s, err := d.scalar(n, v.Type(), key, "an integer")
		if err != nil {
			return err
		}
		i, err := strconv.Atoi(s)
		if err != nil {
			return d.valueError(n, key, "want an integer, got %s", d.found(n, s, key))
		}
		v.SetInt(int64(i))
		return nil
	case reflect.Float64:
		s, err := d.scalar(n, v.Type(), key, "a number")
		if err != nil {
			return err
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return d.valueError(n, key, "want a number, got %s", d.found(n, s, key))
		}
		v.SetFloat(f)
		return nil
	case reflect.Bool:
		s, err := d.scalar(n, v.Type(), key, "true or false")
		if err != nil {
			return err
		}
		switch s {
		case "true", "True", "TRUE":
			v.SetBool(true)
		case "false", "False", "FALSE":
			v.SetBool(false)
		default:
			return d.valueError(n, key, "want true or false, got %s", d.found(n, s, key))
		}
		return nil
	}
	panic(fmt.Sprintf("config: cannot decode into %s at %s", v.Type(), key))
}

// mapping decodes a YAML mapping into a struct (by yaml tags) or a map.
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, key string) error {
	if n.Kind != yaml.MappingNode {
		return d.valueError(n, key, "want a mapping, got %s", d.describe(n, v.Type(), key))
	}
	var fields map[string]int
	if v.Kind() == reflect.Struct {
		fields = fieldsOf(v.Type())
	} else {
		v.Set(reflect.MakeMapWithSize(v.Type(), len(n.Content)/2))
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return d.errorf(k.Line, key, "want a name as key, got %s", describeKind(k))
		}
		name := k.Value
		sub := name
		if key != "" {
			sub = key + "." + name
		}
		if k.ShortTag() == "!!merge" {
			return d.errorf(k.Line, sub, "merge keys (<<) are not supported")
		}
		if first, dup := seen[name]; dup {
			return d.errorf(k.Line, sub, "duplicate key (first at line %d)", first)
		}
		seen[name] = k.Line
		d.meta.lines[sub] = k.Line
		if val.Kind == yaml.ScalarNode && val.ShortTag() == "!!null" {
			d.meta.nulls[sub] = true
		}
		if fields == nil {
			elem := reflect.New(v.Type().Elem()).Elem()
			if err := d.decode(val, elem, sub); err != nil {
				return err
			}
			v.SetMapIndex(reflect.ValueOf(name).Convert(v.Type().Key()), elem)
			continue
		}
		idx, ok := fields[name]
		if !ok {
			msg := "unknown key"
			if s := suggest(name, fields); s != "" {
				msg += " (did you mean " + s + "?)"
			}
			return d.errorf(k.Line, sub, "%s", msg)
		}
		if err := d.decode(val, v.Field(idx), sub); err != nil {
			return err
		}
	}
	return nil
}

// scalar returns the value of a scalar node with ${VAR} expanded, and
// remembers which variables it came from. want names the expected type for
// the error when n is not a scalar.
func (d *decoder) scalar(n *yaml.Node, t reflect.Type, key, want string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", d.valueError(n, key, "want %s, got %s", want, d.describe(n, t, key))
	}
	s, vars, err := expand(n.Value, d.lookupEnv)
	if err != nil {
		return "", d.valueError(n, key, "%v", err)
	}
	if bare := bareRefs(n.Value); len(bare) > 0 {
		secret := t == secretType
		for _, name := range bare {
			// The name of a variable that is set is not a secret's text.
			if _, set := d.lookupEnv(name); set {
				return "", d.valueError(n, key, "%s", bareMsg(name, secret, true))
			}
		}
		// Unset: most likely a literal $ (a password, an OData path), but
		// serve warns of it (Validate), naming what follows the $ unless
		// the value is a secret or a URL, which may hold a password or a
		// token too (user:pass@, ?token=).
		isURL := strings.HasSuffix(strings.ToLower(key), "url")
		d.meta.bare[key] = bareMsg(bare[0], secret || isURL, false)
	}
	if len(vars) > 0 {
		d.meta.vars[key] = vars
		for _, name := range vars {
			if v, _ := d.lookupEnv(name); v == "" {
				d.meta.unset[key] = append(d.meta.unset[key], name)
			}
		}
	}
	return s, nil
}

// found quotes a scalar value that was wanted as another type, naming the
// variables it was expanded from.
func (d *decoder) found(n *yaml.Node, s, key string) string {
	vars := d.meta.vars[key]
	if secretNamed(vars) {
		return hiddenValue(vars)
	}
	q := strconv.Quote(s)
	if len(vars) > 0 {
		q += " (from ${" + strings.Join(vars, "}, ${") + "})"
	}
	return q
}

// secretWords mark a variable whose name says it holds a credential.
var secretWords = []string{"KEY", "SECRET", "TOKEN", "PASSW", "WHSEC", "CREDENTIAL", "AUTH", "REDIS"}

// secretNamed reports whether any of vars is named like a credential (an
// API key written by mistake where a number or duration goes): its value
// is then left out of errors, which reach terminals, CI logs and cron mail.
func secretNamed(vars []string) bool {
	for _, v := range vars {
		up := strings.ToUpper(v)
		for _, w := range secretWords {
			if strings.Contains(up, w) {
				return true
			}
		}
	}
	return false
}

// hiddenValue describes a value expanded from secret-named vars without
// showing it.
func hiddenValue(vars []string) string {
	return "the value of ${" + strings.Join(vars, "}, ${") + "} (not shown: the name says it is a secret)"
}

// describe says what n is, for a type error. Scalars are quoted unless the
// destination holds secrets.
func (d *decoder) describe(n *yaml.Node, t reflect.Type, key string) string {
	if n.Kind != yaml.ScalarNode {
		return describeKind(n)
	}
	if t == secretType || (t.Kind() == reflect.Slice || t.Kind() == reflect.Map) && t.Elem() == secretType {
		return "a scalar"
	}
	s, vars, err := expand(n.Value, d.lookupEnv)
	if err != nil {
		s = n.Value
	}
	if secretNamed(vars) {
		return hiddenValue(vars)
	}
	return strconv.Quote(s)
}

// describeKind names the kind of a node.
func describeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return "a scalar"
}

// fieldsOf maps yaml tag names to field indexes.
func fieldsOf(t reflect.Type) map[string]int {
	fields := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			fields[name] = i
		}
	}
	return fields
}

// Suggest returns the one of names closest to name, if it is close enough
// to be a typo of it, or "".
func Suggest(name string, names []string) string {
	known := make(map[string]int, len(names))
	for i, n := range names {
		known[n] = i
	}
	return suggest(name, known)
}

// suggest returns the known name closest to name, if it is close enough to
// be a typo.
func suggest(name string, fields map[string]int) string {
	norm := func(s string) string {
		return strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(s))
	}
	best, bestDist := "", -1
	for f := range fields {
		dist := levenshtein(norm(name), norm(f))
		if bestDist < 0 || dist < bestDist || dist == bestDist && f < best {
			best, bestDist = f, dist
		}
	}
	if bestDist <= 1 || bestDist == 2 && len(best) >= 6 {
		return best
	}
	return ""
}

// levenshtein is the edit distance between a and b, by bytes.
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// expand replaces ${NAME} in s with lookupEnv(NAME) ("" when unset) and $$
// with $; any other $ is kept. It returns the names it expanded.
func expand(s string, lookupEnv func(string) (string, bool)) (string, []string, error) {
	if !strings.Contains(s, "$") {
		return s, nil, nil
	}
	var b strings.Builder
	var vars []string
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '{':
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 {
				return "", nil, errors.New(`unterminated "${" (write $$ for a literal $)`)
			}
			name := s[i+2 : i+2+end]
			if !isEnvName(name) {
				return "", nil, fmt.Errorf("bad variable name %q in ${...}", name)
			}
			v, _ := lookupEnv(name)
			b.WriteString(v)
			vars = append(vars, name)
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String(), vars, nil
}

// bareRefs returns the names written $NAME in s (a shell's reference,
// which expand keeps as written: only ${NAME} expands), in order.
func bareRefs(s string) []string {
	var names []string
	for i := 0; i+1 < len(s); i++ {
		if s[i] != '$' {
			continue
		}
		if s[i+1] == '$' {
			i++
			continue
		}
		j := i + 1
		for j < len(s) && (s[j] == '_' || 'A' <= s[j] && s[j] <= 'Z' || 'a' <= s[j] && s[j] <= 'z' || j > i+1 && '0' <= s[j] && s[j] <= '9') {
			j++
		}
		// $_ alone is not taken for a variable: bash exports _ to every
		// command, so a literal "$_" would fail when run from a shell.
		if name := s[i+1 : j]; strings.Trim(name, "_") != "" {
			names = append(names, name)
		}
		i = j - 1
	}
	return names
}

// bareMsg is the problem with a $NAME in a value: an error when the
// variable is set (it was surely meant), else a warning. The name is left
// out of a secret's message, as it is part of the value.
func bareMsg(name string, secret, set bool) string {
	if secret {
		if set {
			return "holds $ and the name of a variable that is set, which is kept as written, not expanded: write ${NAME} to expand it, or $$ for a literal $"
		}
		return "holds $ followed by a name, kept as written: write ${NAME} to expand a variable, or $$ for a literal $"
	}
	if set {
		return fmt.Sprintf("$%s is kept as written, not expanded (only ${...} is): write ${%s} to expand the variable %s, which is set, or $$%s for a literal $", name, name, name, name)
	}
	return fmt.Sprintf("$%s is kept as written, not expanded (only ${...} is): write ${%s} to expand a variable, or $$%s for a literal $", name, name, name)
}

// isEnvName reports whether s is a shell variable name.
func isEnvName(s string) bool {
	for i, c := range s {
		switch {
		case c == '_', 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return s != ""
}
