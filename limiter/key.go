package limiter

import (
	"crypto/sha256"
	"encoding/base64"
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

// ClientKey returns a bounded, structurally safe form of a client-controlled
// key: the key itself when it is at most maxKeyLen bytes of the safe set,
// otherwise "#" and 22 characters of base64url SHA-256 (128 bits), so that a
// hostile value can neither grow storage nor break the key's structure, and
// no two clients can be made to share a bucket. It does not allocate for a
// key kept verbatim.
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

// KeyDigest returns a short, stable, one-way digest of a client key for
// logs, where the key itself must not appear: 12 characters of base64url
// SHA-256.
func KeyDigest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return base64.RawURLEncoding.EncodeToString(sum[:9])
}
