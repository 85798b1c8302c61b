package delivery

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrRefused is wrapped by every refusal of the SSRF guard: a URL that is
// not http or https, or an address in a range a target may not reach.
var ErrRefused = errors.New("delivery: refused")

// RefusedError says why the SSRF guard refused a URL or an address.
// errors.Is(err, ErrRefused) holds for it.
type RefusedError struct {
	// Addr is the refused address; invalid when the URL itself was refused.
	Addr netip.Addr
	// Reason is what is wrong, e.g. "127.0.0.1 is a loopback address".
	Reason string
	// Private says allow_private on the target would allow it.
	Private bool
}

// Error reads "refused: <reason>", with a hint when allow_private would
// allow it.
func (e *RefusedError) Error() string {
	if e.Private {
		return "refused: " + e.Reason + " (set allow_private on the target to allow)"
	}
	return "refused: " + e.Reason
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// addrRange is a range of addresses a target may not reach by default.
type addrRange struct {
	prefix netip.Prefix
	kind   string
}

// The kinds of address a redirect never goes to (checkRedirectAddr).
const (
	kindMetadata  = "a cloud metadata address"
	kindLinkLocal = "a link-local address"
)

// v4Ranges and v6Ranges are checked in order; the first match names the
// kind. IPv4 addresses embedded in IPv6 ones (mapped, NAT64, 6to4) are
// checked separately against v4Ranges.
var (
	v4Ranges = []addrRange{
		{netip.MustParsePrefix("169.254.169.254/32"), kindMetadata},
		{netip.MustParsePrefix("0.0.0.0/32"), "an unspecified address"},
		{netip.MustParsePrefix("0.0.0.0/8"), `a "this network" address (0.0.0.0/8)`},
		{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
		{netip.MustParsePrefix("10.0.0.0/8"), "a private address (RFC 1918)"},
		{netip.MustParsePrefix("172.16.0.0/12"), "a private address (RFC 1918)"},
		{netip.MustParsePrefix("192.168.0.0/16"), "a private address (RFC 1918)"},
		{netip.MustParsePrefix("100.64.0.0/10"), "a carrier-grade NAT address (100.64.0.0/10)"},
		{netip.MustParsePrefix("169.254.0.0/16"), kindLinkLocal},
		{netip.MustParsePrefix("192.0.0.0/24"), "a reserved address (192.0.0.0/24)"},
		{netip.MustParsePrefix("198.18.0.0/15"), "a reserved address (198.18.0.0/15)"},
		{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
		{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address (240.0.0.0/4)"},
	}
	v6Ranges = []addrRange{
		{netip.MustParsePrefix("::/128"), "an unspecified address"},
		{netip.MustParsePrefix("::1/128"), "a loopback address"},
		{netip.MustParsePrefix("::/96"), "an IPv4-compatible address (::/96, deprecated)"},
		{netip.MustParsePrefix("64:ff9b:1::/48"), "a local-use NAT64 address (64:ff9b:1::/48)"},
		{netip.MustParsePrefix("100::/64"), "a discard-only address (100::/64)"},
		{netip.MustParsePrefix("fc00::/7"), "a unique local address (fc00::/7)"},
		{netip.MustParsePrefix("fe80::/10"), kindLinkLocal},
		{netip.MustParsePrefix("fec0::/10"), "a site-local address (fec0::/10, deprecated)"},
		{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
	}
	nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour   = netip.MustParsePrefix("2002::/16")
	// translated is SIIT's IPv4-translated form (RFC 2765), ::ffff:0:a.b.c.d.
	translated = netip.MustParsePrefix("::ffff:0:0:0/96")
	// teredo addresses (RFC 4380) carry the Teredo server's IPv4 address
	// in bits 32-63 and the client's, inverted, in bits 96-127.
	teredo = netip.MustParsePrefix("2001::/32")
)

// CheckAddr returns a *RefusedError when ip is in a range a target may not
// reach unless allow_private: loopback, private (RFC 1918), link-local
// (with the 169.254.169.254 metadata address), carrier-grade NAT,
// unspecified, multicast, reserved, unique local (fc00::/7), or an IPv6
// address that embeds such an IPv4 address (IPv4-mapped, NAT64
// 64:ff9b::/96, 6to4, IPv4-translated ::ffff:0:0:0/96, or either address
// of a Teredo 2001::/32 one). It returns nil for any other address.
func CheckAddr(ip netip.Addr) error {
	ip = ip.WithZone("")
	if ip.Is4() {
		if kind := v4Kind(ip); kind != "" {
			return &RefusedError{Addr: ip, Reason: fmt.Sprintf("%s is %s", ip, kind), Private: true}
		}
		return nil
	}
	if ip.Is4In6() {
		return embedded(ip, ip.Unmap(), "an IPv4-mapped IPv6 address")
	}
	if nat64Prefix.Contains(ip) {
		b := ip.As16()
		return embedded(ip, netip.AddrFrom4([4]byte(b[12:16])), "a NAT64 address")
	}
	if sixToFour.Contains(ip) {
		b := ip.As16()
		return embedded(ip, netip.AddrFrom4([4]byte(b[2:6])), "a 6to4 address")
	}
	if translated.Contains(ip) {
		b := ip.As16()
		return embedded(ip, netip.AddrFrom4([4]byte(b[12:16])), "an IPv4-translated address")
	}
	if teredo.Contains(ip) {
		b := ip.As16()
		if err := embedded(ip, netip.AddrFrom4([4]byte(b[4:8])), "a Teredo address with server"); err != nil {
			return err
		}
		return embedded(ip, netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}), "a Teredo address with client")
	}
	for _, r := range v6Ranges {
		if r.prefix.Contains(ip) {
			return &RefusedError{Addr: ip, Reason: fmt.Sprintf("%s is %s", ip, r.kind), Private: true}
		}
	}
	return nil
}

// embedded refuses ip, an IPv6 address of the given kind, when the IPv4
// address v4 it carries is refused.
func embedded(ip, v4 netip.Addr, kind string) error {
	if k := v4Kind(v4); k != "" {
		return &RefusedError{Addr: ip, Reason: fmt.Sprintf("%s is %s of %s, %s", ip, kind, v4, k), Private: true}
	}
	return nil
}

func v4Kind(ip netip.Addr) string {
	for _, r := range v4Ranges {
		if r.prefix.Contains(ip) {
			return r.kind
		}
	}
	return ""
}

// CheckURL checks a target or redirect URL up front, as if allow_private
// were off: the scheme must be http or https and there must be a host. A
// host that is an address literal is checked with CheckAddr; a host that
// is an IPv4 address in a non-standard numeric form ("2130706433",
// "0x7f.1", "017700000001") is decoded and refused whatever it means. Host
// names are not resolved here: the check made when the connection is
// dialled (NewClient) is the real guard, and also catches DNS rebinding.
// Every refusal wraps ErrRefused.
func CheckURL(raw string) error {
	return checkURL(raw, false)
}

// CheckTargetURL checks a target's URL as New does: as CheckURL, but
// with allowPrivate (the target's allow_private) an address literal in a
// private range is accepted. Every refusal wraps ErrRefused.
func CheckTargetURL(raw string, allowPrivate bool) error {
	return checkURL(raw, allowPrivate)
}

func checkURL(raw string, allowPrivate bool) error {
	u, err := url.Parse(raw)
	if err != nil {
		return &RefusedError{Reason: fmt.Sprintf("not a URL: %v", errors.Unwrap(err))}
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return &RefusedError{Reason: fmt.Sprintf("scheme %q is not allowed (only http and https)", u.Scheme)}
	}
	host := u.Hostname()
	if host == "" {
		return &RefusedError{Reason: "the URL has no host"}
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if allowPrivate {
			return nil
		}
		return CheckAddr(ip)
	}
	if ip, numeric := parseNumericIPv4(strings.TrimSuffix(host, ".")); numeric {
		if !ip.IsValid() {
			return &RefusedError{Reason: fmt.Sprintf("host %q is a number that is not a valid IPv4 address", host)}
		}
		return &RefusedError{Addr: ip, Reason: fmt.Sprintf("host %q is an IPv4 address (%s) in a non-standard numeric form", host, ip)}
	}
	return nil
}

// parseNumericIPv4 decodes the inet_aton forms of an IPv4 address: one to
// four parts separated by dots, each decimal, octal (leading 0) or hex
// (0x), the last filling the remaining bytes. numeric reports whether s
// has that shape at all; ip is invalid when it does but overflows.
func parseNumericIPv4(s string) (ip netip.Addr, numeric bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	overflow := false
	for i, p := range parts {
		base, digits := 10, p
		switch {
		case len(p) >= 2 && (p[:2] == "0x" || p[:2] == "0X"):
			base, digits = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		if p == "" || (digits == "" && base != 16) || !allDigits(digits, base) {
			return netip.Addr{}, false
		}
		if digits == "" {
			continue
		}
		v, err := strconv.ParseUint(digits, base, 32)
		if err != nil {
			overflow = true
			continue
		}
		vals[i] = v
	}
	if overflow {
		return netip.Addr{}, true
	}
	var n uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 0xff {
			return netip.Addr{}, true
		}
		n |= v << (8 * (3 - i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, true
	}
	n |= last
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

func allDigits(s string, base int) bool {
	for _, c := range s {
		ok := c >= '0' && c <= '9'
		if base == 8 {
			ok = c >= '0' && c <= '7'
		}
		if base == 16 {
			ok = ok || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
		}
		if !ok {
			return false
		}
	}
	return true
}

// NewClient returns the HTTP client for t. Unless t.AllowPrivate, every
// connection it dials, after name resolution and for every redirect or
// retry, is refused with a *RefusedError when its address fails CheckAddr.
// It does not follow redirects (a 3xx is returned as the answer), uses no
// proxy (a proxy would dial the target for it, past the guard), and applies
// t's connect timeout (to the dial and TLS handshake) and timeout (to the
// whole exchange). Zero timeouts take the defaults.
func NewClient(t Target) *http.Client {
	return newClient(t, 1)
}

// newClient is NewClient for a target sent up to concurrency requests at
// once: it keeps that many idle connections to the target for reuse.
func newClient(t Target, concurrency int) *http.Client {
	if t.AllowPrivate {
		return newGuardedClient(t, concurrency, nil)
	}
	return newGuardedClient(t, concurrency, guardDial)
}

// newRedirectClient is the client of t's redirects (Dispatcher.Redirect):
// NewClient's, except that with t.AllowPrivate it still never dials a
// link-local or cloud metadata address (checkRedirectAddr). A redirect
// goes wherever the person at the CLI or the dashboard says; a target's
// allow_private is meant for the target's own private address, not to let
// the dashboard read the cloud's instance metadata.
func newRedirectClient(t Target) *http.Client {
	if t.AllowPrivate {
		return newGuardedClient(t, 1, guardRedirectDial)
	}
	return newGuardedClient(t, 1, guardDial)
}

// newGuardedClient is newClient with control as its dialer's Control (nil:
// none).
func newGuardedClient(t Target, concurrency int, control func(network, address string, c syscall.RawConn) error) *http.Client {
	t = t.withDefaults()
	dialer := &net.Dialer{Timeout: t.ConnectTimeout, KeepAlive: 30 * time.Second, Control: control}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = dialer.DialContext
	tr.TLSHandshakeTimeout = t.ConnectTimeout
	tr.MaxIdleConnsPerHost = max(4, concurrency)
	return &http.Client{
		Transport: tr,
		Timeout:   t.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// guardDial is the net.Dialer Control of a guarded client: address is the
// resolved "ip:port" about to be connected.
func guardDial(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Reason: fmt.Sprintf("cannot read the dialled address %q", address)}
	}
	return CheckAddr(ap.Addr())
}

// guardRedirectDial is the net.Dialer Control of the redirect client of a
// target with allow_private (see newRedirectClient).
func guardRedirectDial(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Reason: fmt.Sprintf("cannot read the dialled address %q", address)}
	}
	return checkRedirectAddr(ap.Addr())
}

// metadataAddrs are the cloud instance metadata addresses outside the
// link-local ranges: AWS's IPv6 one and Alibaba Cloud's.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("fd00:ec2::254"),
	netip.MustParseAddr("100.100.100.200"),
}

// checkRedirectAddr refuses, allow_private or not, a link-local address
// (169.254.0.0/16, fe80::/10), where cloud instance metadata lives, and the
// metadata addresses outside those ranges (metadataAddrs), in any form: the
// address itself and every IPv4 address an IPv6 one carries (IPv4-mapped,
// NAT64, 6to4, IPv4-translated, and both of a Teredo address's).
func checkRedirectAddr(ip netip.Addr) error {
	ip = ip.WithZone("")
	for _, a := range append([]netip.Addr{ip.Unmap()}, carriedV4(ip)...) {
		if a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || slices.Contains(metadataAddrs, a) {
			what := "a link-local address"
			if a != ip {
				what = fmt.Sprintf("an address carrying %s, a link-local address", a)
			}
			if slices.Contains(metadataAddrs, a) {
				what = kindMetadata
				if a != ip {
					what = fmt.Sprintf("an address carrying %s, %s", a, kindMetadata)
				}
			}
			return &RefusedError{Addr: ip,
				Reason: fmt.Sprintf("%s is %s: a redirect never goes there, whatever the target's allow_private", ip, what)}
		}
	}
	return nil
}

// carriedV4 returns the IPv4 addresses the IPv6 address ip carries in the
// forms CheckAddr reads: none for an IPv4 address or another IPv6 one.
func carriedV4(ip netip.Addr) []netip.Addr {
	if !ip.Is6() || ip.Is4In6() {
		return nil
	}
	b := ip.As16()
	switch {
	case nat64Prefix.Contains(ip), translated.Contains(ip):
		return []netip.Addr{netip.AddrFrom4([4]byte(b[12:16]))}
	case sixToFour.Contains(ip):
		return []netip.Addr{netip.AddrFrom4([4]byte(b[2:6]))}
	case teredo.Contains(ip):
		return []netip.Addr{netip.AddrFrom4([4]byte(b[4:8])), netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})}
	case ip.Is6() && b[0] == 0 && b[1] == 0 && b[2] == 0 && b[3] == 0 && b[4] == 0 && b[5] == 0 && b[6] == 0 && b[7] == 0 && b[8] == 0 && b[9] == 0 && b[10] == 0 && b[11] == 0:
		// IPv4-compatible (::a.b.c.d, deprecated).
		return []netip.Addr{netip.AddrFrom4([4]byte(b[12:16]))}
	}
	return nil
}
