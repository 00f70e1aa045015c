package limiter

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestClientKeyVerbatim(t *testing.T) {
	t.Parallel()
	for _, k := range []string{
		"",
		"203.0.113.9",
		"2001:db8::1",
		"user@example.com",
		"sk_live_4eC39HqLyjWDarjtT1zdp7dc",
		"aGVsbG8gd29ybGQ=",
		"/api/v1/users",
		"-._:@/+=~!$&*^|",
		strings.Repeat("a", maxKeyLen),
	} {
		if got := ClientKey(k); got != k {
			t.Errorf("ClientKey(%q) = %q, want it kept", k, got)
		}
	}
}

func TestClientKeyVerbatimDoesNotAllocate(t *testing.T) {
	// Not parallel: AllocsPerRun counts every goroutine's allocations.
	key := strings.Repeat("0123456789abcdef", 4)
	var out string
	if n := testing.AllocsPerRun(1000, func() { out = ClientKey(key) }); n != 0 {
		t.Fatalf("ClientKey of a safe key: %.1f allocations, want 0", n)
	}
	if out != key {
		t.Fatal("safe key not kept")
	}
}

func TestClientKeyHashed(t *testing.T) {
	t.Parallel()
	for _, k := range []string{
		strings.Repeat("a", maxKeyLen+1),
		strings.Repeat("x", 10_000),
		"{tag}", "a{b", "a}b", "}",
		"two words", " ", "tab\there", "nl\n", "\x00", "\x7f",
		"caf\u00e9", "\xff\xfe", "日本",
		"#already-hashed-looking",
		"quote\"", "back\\slash", "a,b", "a;b", "a%20b", "a?b", "a'b", "a<b>", "a[b]", "a(b)", "a`b",
	} {
		got := ClientKey(k)
		if got == k {
			t.Errorf("ClientKey(%q) kept it verbatim", k)
		}
		checkHashed(t, k, got)
	}
}

// checkHashed checks the shape of a hashed client key.
func checkHashed(t *testing.T, raw, got string) {
	t.Helper()
	if !strings.HasPrefix(got, hashedKeyPrefix) || len(got) != 23 {
		t.Fatalf("ClientKey(%q) = %q, want # and 22 characters", raw, got)
	}
	b, err := base64.RawURLEncoding.DecodeString(got[1:])
	if err != nil || len(b) != 16 {
		t.Fatalf("ClientKey(%q) = %q: not 128 bits of base64url (%v)", raw, got, err)
	}
}

// checkClientKey checks the invariants that hold for every input.
func checkClientKey(t *testing.T, raw string) string {
	t.Helper()
	got := ClientKey(raw)
	if got != ClientKey(raw) {
		t.Fatalf("ClientKey(%q) is not deterministic", raw)
	}
	if len(got) > maxKeyLen {
		t.Fatalf("ClientKey(%q) = %q: %d bytes, more than %d", raw, got, len(got), maxKeyLen)
	}
	if strings.ContainsAny(got, "{}") {
		t.Fatalf("ClientKey(%q) = %q holds a brace", raw, got)
	}
	for i := 0; i < len(got); i++ {
		if c := got[i]; c <= ' ' || c >= 0x7f {
			t.Fatalf("ClientKey(%q) = %q holds byte %#x", raw, got, c)
		}
	}
	if got == raw {
		// Kept verbatim: short, only safe bytes, and so never starting
		// like a hashed key.
		if len(raw) > maxKeyLen || strings.Contains(raw, hashedKeyPrefix) {
			t.Fatalf("ClientKey(%q) kept an unsafe key", raw)
		}
		for i := 0; i < len(raw); i++ {
			if !safeKeyByte[raw[i]] {
				t.Fatalf("ClientKey(%q) kept byte %#x", raw, raw[i])
			}
		}
	} else {
		checkHashed(t, raw, got)
		// The hashed form is not safe itself: fed back, it is hashed
		// again, so no client can present a key equal to another's
		// hashed key.
		if again := ClientKey(got); again == got {
			t.Fatalf("ClientKey(%q) = %q is kept verbatim when fed back", raw, got)
		}
	}
	return got
}

func TestClientKeyDistinct(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(8, 9))
	n := 200_000
	if raceEnabled {
		n = 50_000
	}
	seen := make(map[string]string, 2*n)
	alphabet := "abcXYZ019-._:@{} \x00\xff#"
	for i := range n {
		var raw string
		switch i % 4 {
		case 0: // short safe keys, kept
			raw = randomString(rng, "abcdefABCDEF0123456789.:-@", 1+rng.IntN(maxKeyLen))
		case 1: // long safe keys, hashed
			raw = randomString(rng, "abcdefABCDEF0123456789.:-@", maxKeyLen+1+rng.IntN(100))
		default: // anything, short or long
			raw = randomString(rng, alphabet, rng.IntN(2*maxKeyLen))
		}
		if _, dup := seen[raw]; dup {
			continue
		}
		got := checkClientKey(t, raw)
		if prev, ok := seen[got]; ok {
			t.Fatalf("ClientKey(%q) == ClientKey(%q) == %q", raw, prev, got)
		}
		seen[got] = raw
		seen[raw] = raw // a raw key equal to an earlier output is caught too
	}
}

func randomString(rng *rand.Rand, alphabet string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// TestDigester: digests are short, stable under one secret, distinct per
// key, and another secret gives others, so a digest cannot be reversed by
// hashing candidate keys without the secret.
func TestDigester(t *testing.T) {
	t.Parallel()
	d := NewDigester([]byte("secret one"))
	a, b := d.Digest("203.0.113.9"), d.Digest("203.0.113.10")
	if len(a) != 12 || a == b || a != d.Digest("203.0.113.9") || strings.Contains(a, "203") {
		t.Fatalf("Digest: %q, %q", a, b)
	}
	if other := NewDigester([]byte("secret two")).Digest("203.0.113.9"); other == a {
		t.Fatal("two secrets give the same digest")
	}
	// The unkeyed digest of earlier versions (SHA-256 alone) is not it.
	plain := sha256.Sum256([]byte("203.0.113.9"))
	if a == base64.RawURLEncoding.EncodeToString(plain[:9]) {
		t.Fatal("the digest is the unkeyed SHA-256")
	}
	var zero Digester
	if zero.Digest("k") != NewDigester(nil).Digest("k") {
		t.Fatal("the zero Digester is not the empty secret's")
	}
}

func FuzzClientKey(f *testing.F) {
	for _, s := range []string{
		"", "203.0.113.9", "2001:db8::1", "user@example.com", "{", "}", "{}", "a{b}c",
		" ", "\x00", "\t", "\xff", "é", "#", "#AAAAAAAAAAAAAAAAAAAAAA",
		strings.Repeat("a", maxKeyLen), strings.Repeat("a", maxKeyLen+1), strings.Repeat("{", 1000),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got := checkClientKey(t, raw)
		other := raw + "x"
		if raw != "" && ClientKey(other) == got {
			t.Fatalf("ClientKey(%q) == ClientKey(%q)", raw, other)
		}
	})
}

// TestSourceKeyNamespaces checks that no value of one key alternative can
// name the bucket of another's: the same value, a value that spells another
// source's key, and a long one hashed.
func TestSourceKeyNamespaces(t *testing.T) {
	t.Parallel()
	values := []string{"127.0.0.1", "2,127.0.0.1", "3,127.0.0.1", "#x", strings.Repeat("a", maxKeyLen+1), "", ","}
	seen := map[string]string{}
	for source := range 3 {
		for _, v := range values {
			k := SourceKey(source, v)
			if len(k) > maxKeyLen+3 || strings.ContainsAny(k, "{}") {
				t.Errorf("SourceKey(%d, %q) = %q: unbounded or breaks a hash tag", source, v, k)
			}
			who := fmt.Sprintf("source %d value %q", source, v)
			if prev, ok := seen[k]; ok {
				t.Errorf("%s and %s share the bucket %q", prev, who, k)
			}
			seen[k] = who
		}
	}
	if SourceKey(0, "127.0.0.1") != ClientKey("127.0.0.1") {
		t.Error("the first alternative's keys are not ClientKey's: their buckets would be renamed")
	}
}
