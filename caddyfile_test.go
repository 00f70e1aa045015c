package fleetlimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"

	// The standard modules: the http app, matchers, basic_auth, respond...
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	fleetlimit "github.com/fleetlimit/caddy-fleetlimit"
)

// Regenerate the golden files' JSON with
//
//	go test -run TestCaddyfileAdapt -update-caddytest .
//
// and read the diff before committing it.
var updateCaddytest = flag.Bool("update-caddytest", false, "rewrite the expected JSON of testdata/caddyfile/*.caddytest")

const goldenDir = "testdata/caddyfile"

// goldenSeparator is the line between a golden file's Caddyfile and its JSON.
const goldenSeparator = "\n----------\n"

// secret is a Redis password that no error message may ever show.
const secret = "hunter2-Zq9"

// TestCaddyfileAdapt adapts every testdata/caddyfile/*.caddytest file and
// compares the result with the JSON below its `----------` line. The files
// double as the directive's reference: one per form. Every rate_limit handler
// of the result must also provision, so the examples are valid at run time
// too, not only well formed.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.caddytest"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no golden files in %s", goldenDir)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".caddytest"), func(t *testing.T) {
			caddyfile, expected := readGolden(t, file)
			if *updateCaddytest {
				expected = writeGolden(t, file, caddyfile)
			}
			if !caddytest.CompareAdapt(t, file, caddyfile, "caddyfile", expected) {
				t.Errorf("%s: the adapted JSON differs from the expected JSON (diff above)", file)
			}

			out, warnings, err := adaptCaddyfile(caddyfile)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range warnings {
				t.Errorf("%s:%d: warning: %s", file, w.Line, w.Message)
			}
			handlers := rateLimitHandlers(t, out)
			if len(handlers) == 0 {
				t.Fatal("the adapted config has no rate_limit handler")
			}
			for i, raw := range handlers {
				if err := provisionHandler(raw); err != nil {
					t.Errorf("rate_limit handler %d does not provision: %v\n%s", i, err, raw)
				}
			}
		})
	}
}

// TestCaddyfileExample keeps the repository's example adaptable.
func TestCaddyfileExample(t *testing.T) {
	body, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := adaptCaddyfile(string(body))
	if err != nil {
		t.Fatalf("Caddyfile.example: %v", err)
	}
	for i, raw := range rateLimitHandlers(t, out) {
		if err := provisionHandler(raw); err != nil {
			t.Errorf("Caddyfile.example: rate_limit handler %d does not provision: %v", i, err)
		}
	}
}

// FuzzCaddyfile feeds arbitrary text as the body of a rate_limit block. The
// adapter may refuse it but must not panic; what it accepts must be valid
// JSON, and every rate_limit handler in it must provision: a Caddyfile that
// adapts but then fails at start-up would report its mistake without a line.
func FuzzCaddyfile(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.caddytest"))
	if err != nil {
		f.Fatal(err)
	}
	var seeds []string
	for _, file := range files {
		caddyfile, _ := readGolden(f, file)
		seeds = append(seeds, caddyfile)
	}
	for _, tc := range badCaddyfiles {
		seeds = append(seeds, tc.caddyfile)
	}
	for _, s := range seeds {
		for _, body := range rateLimitBodies(s) {
			f.Add(body)
		}
		f.Add(s) // a whole Caddyfile as a body: nested sites, stray braces
	}
	for _, s := range []string{
		"zone a {\n\trate 1 1us\n\tburst 1125899906842624\n}",
		"zone a {\n\trate 9223372036854775807 1s\n\tburst 1\n}",
		"zone a {\n\trate 9007199254740992 1s\n\tburst 1\n}",
		"redis {\n\taddress a:1\n\tdb 9223372036854775807\n}\nzone a {\n\trate 10 1s\n}",
		"zone a {\n\trate 10 1s\n\tcost {header.X-Cost\n}",
		"zone a {\n\tkey `{client_ip}` \"{header.A} {header.B}\"\n\trate 10 1s\n}",
		"zone a {\n\tkey <<EOF\n\tx\n\tEOF\n\trate 10 1s\n}",
		"zone a {\n\trate 10 1s\n\tmatch {\n\t\tnot path /x\n\t}\n}",
		"zone a {\n\trate 10 1s\n}\n}\n:81 {\n\trate_limit {\n\t\tzone a {\n\t\t\trate 1 1s",
		"redis {\n\taddress {$REDIS_ADDR:127.0.0.1:6379}\n}\nzone a {\n\trate 10 1s\n}",
		"\x00{\\}\"",
	} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, body string) {
		caddyfile := ":80 {\n\trate_limit {\n" + body + "\n\t}\n}\n"
		out, _, err := adaptCaddyfile(caddyfile)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("adapted to invalid JSON:\n%s", out)
		}
		for _, raw := range rateLimitHandlers(t, out) {
			var h struct{ Redis *struct{ Address string } }
			if json.Unmarshal(raw, &h) == nil && h.Redis != nil && strings.Contains(h.Redis.Address, "{") {
				continue // depends on the environment at start-up ({env.*})
			}
			err := provisionHandler(raw)
			if err != nil && strings.Contains(err.Error(), "loading matchers:") {
				continue // Caddy's matchers: `match { method }` adapts and then fails in Caddy too
			}
			if err != nil {
				t.Errorf("adapted, but the handler does not provision: %v\nCaddyfile:\n%s\nJSON: %s", err, caddyfile, raw)
			}
		}
	})
}

// adaptCaddyfile runs the Caddyfile adapter as `caddy adapt` does.
func adaptCaddyfile(caddyfile string) ([]byte, []caddyconfig.Warning, error) {
	return caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
}

// provisionHandler builds a handler from its JSON the way Caddy loads it
// and releases it again.
func provisionHandler(raw []byte) error {
	var h fleetlimit.Handler
	if err := json.Unmarshal(raw, &h); err != nil {
		return err
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		return err
	}
	defer h.Cleanup()
	return h.Validate()
}

// readGolden splits a golden file into its Caddyfile (ending in a newline,
// as `caddy fmt` leaves it) and its expected JSON.
func readGolden(t testing.TB, file string) (caddyfile, expected string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\r\n", "\n")
	before, after, ok := strings.Cut(text, goldenSeparator)
	if !ok {
		t.Fatalf("%s: no line of exactly %q", file, strings.TrimSpace(goldenSeparator))
	}
	return strings.TrimSpace(before) + "\n", strings.TrimSpace(after)
}

// writeGolden replaces a golden file's JSON with what the adapter makes of
// its Caddyfile now, and returns that JSON.
func writeGolden(t *testing.T, file, caddyfile string) string {
	t.Helper()
	out, _, err := adaptCaddyfile(caddyfile)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var buf strings.Builder
	var indented []byte
	if indented, err = indentJSON(out); err != nil {
		t.Fatal(err)
	}
	buf.WriteString(caddyfile)
	buf.WriteString(strings.TrimPrefix(goldenSeparator, "\n"))
	buf.Write(indented)
	buf.WriteString("\n")
	if err := os.WriteFile(file, []byte(buf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return string(indented)
}

// indentJSON indents as caddytest.CompareAdapt and `caddy adapt --pretty` do.
func indentJSON(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	err := json.Indent(&buf, b, "", "\t")
	return buf.Bytes(), err
}

// rateLimitHandlers returns the JSON of every rate_limit handler in an
// adapted config, in any route or subroute.
func rateLimitHandlers(t testing.TB, config []byte) []json.RawMessage {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.UseNumber() // re-encode numbers exactly as the adapter wrote them
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("adapted config is not JSON: %v", err)
	}
	var found []json.RawMessage
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "rate_limit" {
				b, err := json.Marshal(v)
				if err != nil {
					t.Fatal(err)
				}
				found = append(found, b)
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return found
}

// rateLimitBodies returns the text inside each `rate_limit … { … }` block of
// a Caddyfile, found by counting braces (good enough for seeds).
func rateLimitBodies(caddyfile string) []string {
	var bodies []string
	rest := caddyfile
	for {
		i := strings.Index(rest, "rate_limit")
		if i < 0 {
			return bodies
		}
		rest = rest[i+len("rate_limit"):]
		line, _, _ := strings.Cut(rest, "\n")
		open := strings.Index(line, "{")
		if open < 0 {
			continue
		}
		depth := 0
		for j := open; j < len(rest); j++ {
			switch rest[j] {
			case '{':
				depth++
			case '}':
				depth--
			}
			if depth == 0 {
				bodies = append(bodies, strings.Trim(rest[open+1:j], "\n"))
				rest = rest[j:]
				break
			}
		}
		if depth != 0 {
			return bodies
		}
	}
}

// TestCaddyfileWantLists checks the lists that unknown subdirectives get,
// built from the parsers' tables: every name listed is one the parser
// knows, and the list has them all.
func TestCaddyfileWantLists(t *testing.T) {
	wantRE := regexp.MustCompile(`\(want ([a-z0-9_, ]+)\)`)
	blocks := []struct {
		name   string
		wrap   func(sub string) string
		length int // how many names the list must have
	}{
		{"rate_limit", func(sub string) string {
			return ":80 {\n\trate_limit {\n\t\t" + sub + "\n\t\tzone api {\n\t\t\trate 10 1s\n\t\t}\n\t}\n}\n"
		}, 14},
		{"zone", func(sub string) string {
			return ":80 {\n\trate_limit {\n\t\tzone api {\n\t\t\trate 10 1s\n\t\t\t" + sub + "\n\t\t}\n\t}\n}\n"
		}, 25},
		{"redis", func(sub string) string {
			return ":80 {\n\trate_limit {\n\t\tredis {\n\t\t\taddress 127.0.0.1:6379\n\t\t\t" + sub + "\n\t\t}\n\t\tzone api {\n\t\t\trate 10 1s\n\t\t}\n\t}\n}\n"
		}, 21},
		{"redis tls", func(sub string) string {
			return ":80 {\n\trate_limit {\n\t\tredis {\n\t\t\taddress 127.0.0.1:6379\n\t\t\ttls {\n\t\t\t\t" + sub + "\n\t\t\t}\n\t\t}\n\t\tzone api {\n\t\t\trate 10 1s\n\t\t}\n\t}\n}\n"
		}, 5},
	}
	for _, b := range blocks {
		t.Run(b.name, func(t *testing.T) {
			_, _, err := adaptCaddyfile(b.wrap("no_such_thing 1"))
			if err == nil {
				t.Fatal("an unknown subdirective adapted")
			}
			m := wantRE.FindStringSubmatch(err.Error())
			if m == nil {
				t.Fatalf("no list of subdirectives in: %v", err)
			}
			names := strings.Split(strings.Replace(m[1], " or ", ", ", 1), ", ")
			if len(names) != b.length {
				t.Errorf("the list has %d names, want %d: %s", len(names), b.length, m[1])
			}
			for _, name := range names {
				_, _, err := adaptCaddyfile(b.wrap(name + " 1"))
				if err != nil && strings.Contains(err.Error(), "unknown") && strings.Contains(err.Error(), `"`+name+`"`) {
					t.Errorf("%s is listed but unknown: %v", name, err)
				}
			}
		})
	}
}
