// Package backstop holds the language of the domain: the platform's resources
// and objects, cursors, the interfaces the engine needs from its adapters
// (Source, Mirror) and the errors callers branch on.
//
// It imports only the standard library. Adapters live in sub-packages
// (store, sources, sinks); the engine in sync; cmd/backstop wires them.
package backstop

import (
	"fmt"
	"strings"
)

// Resource names one collection of the platform's public API.
type Resource string

// The platform's resources, in the order commands process them.
const (
	Contacts Resource = "contacts"
	Chats    Resource = "chats"
	Messages Resource = "messages"
	Payments Resource = "payments"
)

// Resources lists every resource in the default processing order.
var Resources = []Resource{Contacts, Chats, Messages, Payments}

// IDPrefix returns the prefix every object id of the resource carries.
func (r Resource) IDPrefix() string {
	switch r {
	case Contacts:
		return "ct_"
	case Chats:
		return "chat_"
	case Messages:
		return "msg_"
	case Payments:
		return "pay_"
	}
	return ""
}

// Valid reports whether r is one of Resources.
func (r Resource) Valid() bool { return r.IDPrefix() != "" }

// ParseResource returns the resource named s. The error lists the valid names.
func ParseResource(s string) (Resource, error) {
	r := Resource(strings.ToLower(strings.TrimSpace(s)))
	if !r.Valid() {
		return "", fmt.Errorf("unknown resource %q (want one of contacts, chats, messages, payments)", s)
	}
	return r, nil
}

// ParseResources parses names into resources, returning Resources when names
// is empty. Duplicates are removed; order follows names.
func ParseResources(names []string) ([]Resource, error) {
	if len(names) == 0 {
		return append([]Resource(nil), Resources...), nil
	}
	seen := make(map[Resource]bool, len(names))
	out := make([]Resource, 0, len(names))
	for _, n := range names {
		r, err := ParseResource(n)
		if err != nil {
			return nil, err
		}
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out, nil
}
