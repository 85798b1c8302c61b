package dashboard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/url"
	"strings"
	"time"
)

// pageNames are the page templates; each is parsed with the layout and the
// partials.
var pageNames = []string{"login", "error", "deliveries", "delivery", "jobs", "quota", "intake"}

// parsePages parses every page with the layout and the partials.
func parsePages(now func() time.Time) (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"when": when,
		"rel":  func(t time.Time) string { return rel(t, now()) },
		"dur":  dur,
		"json": prettyJSON,
		"badge": func(status string) string {
			return "badge b-" + strings.ReplaceAll(status, "_", "-")
		},
		"codeClass": func(code int) string {
			switch {
			case code >= 200 && code < 300:
				return "badge b-delivered"
			case code == 0:
				return "badge b-none"
			case code == 429 || code >= 500:
				return "badge b-retrying"
			}
			return "badge b-dead-letter"
		},
		"join":  strings.Join,
		"esc":   url.QueryEscape,
		"after": func(t time.Time) bool { return t.After(now()) },
		"rowArgs": func(v deliveryView, csrf string, open bool) rowArgs {
			return rowArgs{Row: v, CSRF: csrf, Open: open}
		},
	}
	out := make(map[string]*template.Template, len(pageNames))
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets,
			"templates/layout.html", "templates/partials.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: parse %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// when writes t in UTC to the second, or a dash for the zero time.
func when(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// rel writes t relative to now: "in 5m", "3h ago".
func rel(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := t.Sub(now)
	if d >= 0 {
		return "in " + short(d)
	}
	return short(-d) + " ago"
}

// short writes d in its largest unit: 45s, 12m, 3h, 2d.
func short(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// dur writes d rounded for reading: 850ms, 2.4s, 3m10s.
func dur(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// prettyJSON indents a JSON document for reading, or returns it as it is
// when it is not JSON.
func prettyJSON(raw json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

// rowArgs is what the delivery-row template takes.
type rowArgs struct {
	Row  deliveryView
	CSRF string
	Open bool
}
