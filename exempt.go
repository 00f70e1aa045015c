package fleetlimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Exemptions: clients, by their address, that a handler or a zone never
// limits (`exempt <cidr|ip>...`). The address is Caddy's client IP, the
// {client_ip} placeholder: the connection's peer, or the client that the
// server's trusted_proxies name. The networks are parsed once, at
// provisioning; a request is matched against them without allocating.

// privateRanges is the word that stands for the private networks, as in
// Caddy's remote_ip and client_ip matchers.
const privateRanges = "private_ranges"

// exemptSet is the networks of an exempt list, parsed.
type exemptSet []netip.Prefix

// parseExempt parses an exempt list: IP addresses, CIDR networks and
// private_ranges. A network written with host bits set (10.1.2.3/8) is
// the network it names (10.0.0.0/8), as Caddy's matchers read it.
func parseExempt(list []string) (exemptSet, error) {
	var set exemptSet
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == privateRanges {
			for _, c := range caddyhttp.PrivateRangesCIDR() {
				if p, err := parseNetwork(c); err == nil {
					set = append(set, p)
				}
			}
			continue
		}
		p, err := parseNetwork(s)
		if err != nil {
			return nil, err
		}
		set = append(set, p)
	}
	return set, nil
}

// parseNetwork parses one entry of an exempt list: an address (a network
// of one) or a CIDR network.
func parseNetwork(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("exempt: %q is not an IP address or CIDR network (want e.g. 10.0.0.0/8, 2001:db8::/32, 192.0.2.7 or %s)", s, privateRanges)
		}
		if p.Addr().Is4In6() {
			// ::ffff:10.0.0.0/104 is 10.0.0.0/8: addresses are unmapped
			// before they are matched.
			bits := p.Bits() - 96
			if bits < 0 {
				return netip.Prefix{}, fmt.Errorf("exempt: %q is wider than the IPv4-mapped range", s)
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), bits)
		}
		return p.Masked(), nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("exempt: %q is not an IP address or CIDR network (want e.g. 10.0.0.0/8, 2001:db8::/32, 192.0.2.7 or %s)", s, privateRanges)
	}
	ip = ip.Unmap()
	return netip.PrefixFrom(ip, ip.BitLen()), nil
}

// contains reports whether an (unmapped) address is in one of the
// networks.
func (s exemptSet) contains(ip netip.Addr) bool {
	for _, p := range s {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// clientIP returns the request's client address as Caddy determined it
// ({client_ip}, which honours trusted_proxies), unmapped and without a
// zone; the zero Addr when it has none that parses.
func clientIP(r *http.Request) netip.Addr {
	s, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if !ok {
		// Outside a Caddy server (the variable is set by it): the peer.
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			return netip.Addr{}
		}
		return ap.Addr().Unmap().WithZone("")
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}
	}
	return ip.Unmap().WithZone("")
}

// exemption is what a request's client is exempt from: every zone of the
// handler (all), or the zones whose own exempt lists hold it (looked up
// zone by zone, with the address read once).
type exemption struct {
	h      *Handler
	r      *http.Request
	ip     netip.Addr
	looked bool
	all    bool
}

// newExemption starts the exemption of request r: all is decided at once,
// each zone's when asked.
func (h *Handler) newExemption(r *http.Request) exemption {
	e := exemption{h: h, r: r}
	if len(h.exempt) > 0 {
		e.ip, e.looked = clientIP(r), true
		e.all = e.ip.IsValid() && h.exempt.contains(e.ip)
	}
	return e
}

// of reports whether the request's client is exempt from zone z.
func (e *exemption) of(z *Zone) bool {
	if e.all {
		return true
	}
	if len(z.exempt) == 0 {
		return false
	}
	if !e.looked {
		e.ip, e.looked = clientIP(e.r), true
	}
	return e.ip.IsValid() && z.exempt.contains(e.ip)
}
