package observe

import (
	"net/http"
	"net/netip"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Client addresses in what observe shows: the denial feed's client_ip and
// the top denied networks. Unless the handler has log_key, an address is
// shown only as its network, a /24 for IPv4 and a /64 for IPv6: enough to
// tell where a flood comes from and to block it, not who sent it.

// Mask widths of client networks.
const (
	ipv4Network = 24
	ipv6Network = 64
)

// clientAddr returns the client's address as Caddy determined it (the
// client_ip variable: the connection's peer, or what trusted proxies say),
// or the connection's peer when that is unset; the zero Addr when neither
// parses. It does not allocate.
func clientAddr(r *http.Request) netip.Addr {
	if s, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok {
		if ip, err := netip.ParseAddr(s); err == nil {
			return ip.Unmap().WithZone("")
		}
	}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	return netip.Addr{}
}

// network returns the network an address is shown as: its /24 or /64.
// It returns the zero Prefix for the zero Addr.
func network(ip netip.Addr) netip.Prefix {
	if !ip.IsValid() {
		return netip.Prefix{}
	}
	bits := ipv6Network
	if ip.Is4() {
		bits = ipv4Network
	}
	p, _ := ip.Prefix(bits)
	return p
}

// networkKey is the compact key of a network in the top networks sketch:
// the family (4 or 6) and the network's leading bytes (3 or 8).
type networkKey struct {
	b [9]byte
	n int
}

// keyOfNetwork returns the sketch's key of an address's network, and false
// for the zero Addr.
func keyOfNetwork(ip netip.Addr) (networkKey, bool) {
	var k networkKey
	switch {
	case ip.Is4():
		a := ip.As4()
		k.b[0] = 4
		copy(k.b[1:], a[:ipv4Network/8])
		k.n = 1 + ipv4Network/8
	case ip.Is6():
		a := ip.As16()
		k.b[0] = 6
		copy(k.b[1:], a[:ipv6Network/8])
		k.n = 1 + ipv6Network/8
	default:
		return k, false
	}
	return k, true
}

// bytes returns the key's bytes.
func (k *networkKey) bytes() []byte { return k.b[:k.n] }

// networkOfKey returns the network a sketch key stands for, as text
// ("203.0.113.0/24", "2001:db8::/64"); "" for a key that is none.
func networkOfKey(key string) string {
	switch {
	case len(key) == 1+ipv4Network/8 && key[0] == 4:
		var a [4]byte
		copy(a[:], key[1:])
		return netip.PrefixFrom(netip.AddrFrom4(a), ipv4Network).String()
	case len(key) == 1+ipv6Network/8 && key[0] == 6:
		var a [16]byte
		copy(a[:], key[1:])
		return netip.PrefixFrom(netip.AddrFrom16(a), ipv6Network).String()
	}
	return ""
}
