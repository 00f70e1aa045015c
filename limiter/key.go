package limiter

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"strconv"
	"sync"
)

// maxKeyLen is the longest client key kept as it is. Longer keys, and keys
// with any byte outside the safe set, are replaced by a hash (see ClientKey).
const maxKeyLen = 64

// hashedKeyPrefix starts every hashed key. It is not in the safe set, so a
// hashed key never equals a key kept verbatim.
const hashedKeyPrefix = "#"

// safeKeyByte marks the bytes a client key may hold verbatim: letters,
// digits and the punctuation of IP addresses, user ids, e-mail addresses and
// base64 or hex API keys. Braces (which would break a Cluster hash tag),
// spaces, control bytes and non-ASCII are not in it.
var safeKeyByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "-._:@/+=~!$&*^|" {
		t[c] = true
	}
	return t
}()

// sourceSeparator ends the source number of a key from a zone's second or
// later key alternative (see SourceKey). It is neither in the safe set nor
// the hashed prefix, so ClientKey never yields it.
const sourceSeparator = ","

// ClientKey returns a bounded, structurally safe form of a client-controlled
// key: the key itself when it is at most maxKeyLen bytes of the safe set,
// otherwise "#" and 22 characters of base64url SHA-256 (128 bits), so that a
// hostile value can neither grow storage nor break the key's structure, and
// no two values share a bucket. It does not allocate for a key kept
// verbatim. Where a key may come from several sources, SourceKey keeps them
// apart.
func ClientKey(raw string) string {
	if len(raw) <= maxKeyLen {
		safe := true
		for i := 0; i < len(raw); i++ {
			if !safeKeyByte[raw[i]] {
				safe = false
				break
			}
		}
		if safe {
			return raw
		}
	}
	sum := sha256.Sum256([]byte(raw))
	return hashedKeyPrefix + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// SourceKey returns the bucket key of a value that the source-th (from 0)
// of a zone's key alternatives produced: ClientKey(raw) for the first, and
// for a later one the same after the source's number (from 1) and a comma,
// which ClientKey never yields. Values of different sources never share a
// bucket, so a client cannot spend the bucket of the address 192.0.2.7 by
// sending "192.0.2.7" in the header that the first alternative reads.
func SourceKey(source int, raw string) string {
	k := ClientKey(raw)
	if source == 0 {
		return k
	}
	return strconv.Itoa(source+1) + sourceSeparator + k
}

// Digester turns client keys into the short digests that logs, statistics
// and events carry where the key itself must not appear: 12 characters of
// base64url HMAC-SHA256 under a secret. Without the secret a digest cannot
// be reversed by trying every candidate key (all 2^32 IPv4 addresses, the
// default key, take minutes to hash), and nodes with the same secret give
// the same digest, so a key can be followed across a fleet's logs. The zero
// value has no secret: it hashes with an empty one, which anybody can
// reproduce. It is safe for concurrent use.
type Digester struct {
	macs *sync.Pool // of hash.Hash: HMAC-SHA256 under the secret
}

// NewDigester returns a digester keyed with secret.
func NewDigester(secret []byte) Digester {
	secret = append([]byte(nil), secret...)
	return Digester{macs: &sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}}
}

// Digest returns the key's digest.
func (d Digester) Digest(key string) string {
	if d.macs == nil {
		d = NewDigester(nil)
	}
	mac := d.macs.Get().(hash.Hash)
	mac.Reset()
	mac.Write([]byte(key))
	var sum [sha256.Size]byte
	out := base64.RawURLEncoding.EncodeToString(mac.Sum(sum[:0])[:9])
	d.macs.Put(mac)
	return out
}
