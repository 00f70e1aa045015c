package rls

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
)

// Regenerate the golden files' JSON with
//
//	go test ./rls/ -run TestCaddyfileAdapt -update-caddytest
//
// and read the diff before committing it.
var updateCaddytest = flag.Bool("update-caddytest", false, "rewrite the expected JSON of testdata/caddyfile/*.caddytest")

// goldenSeparator is the line between a golden file's Caddyfile and its JSON.
const goldenSeparator = "\n----------\n"

// TestCaddyfileAdapt adapts every testdata/caddyfile/*.caddytest file and
// compares the result with the JSON below its `----------` line: one file
// per form of the rate_limit_rls global option.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/caddyfile/*.caddytest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".caddytest"), func(t *testing.T) {
			body, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			caddyfile, expected, ok := strings.Cut(string(body), goldenSeparator)
			if !ok {
				t.Fatalf("%s has no %q line", file, strings.TrimSpace(goldenSeparator))
			}
			caddyfile, expected = strings.TrimSpace(caddyfile)+"\n", strings.TrimSpace(expected)
			if *updateCaddytest {
				out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
				if err != nil {
					t.Fatal(err)
				}
				var buf bytes.Buffer
				if err := json.Indent(&buf, out, "", "\t"); err != nil {
					t.Fatal(err)
				}
				expected = buf.String()
				if err := os.WriteFile(file, []byte(strings.TrimSpace(caddyfile)+goldenSeparator+expected+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if !caddytest.CompareAdapt(t, file, caddyfile, "caddyfile", expected) {
				t.Errorf("%s: the adapted JSON differs from the expected JSON (diff above)", file)
			}
		})
	}
}

// TestCaddyfileMistakes: each mistake fails adaptation with the file's
// line of the setting at fault and what is wrong.
func TestCaddyfileMistakes(t *testing.T) {
	for _, c := range []struct{ caddyfile, want string }{
		{"{\n\trate_limit_rls {\n\t\tlisten :8081\n\t}\n}", "config_dir or xds is required"},
		{"{\n\trate_limit_rls {\n\t\tconfig_dir /d\n\t\tlisten\n\t}\n}", "Caddyfile:4"},
		{"{\n\trate_limit_rls {\n\t\tconfig_dir /d\n\t\ton_error maybe\n\t}\n}", `on_error must be local, deny or allow, got "maybe"`},
		{"{\n\trate_limit_rls {\n\t\tconfig_dir /d\n\t\tmax_entries many\n\t}\n}", "Caddyfile:4"},
		{"{\n\trate_limit_rls {\n\t\tconfig_dir /d\n\t\tunknown 1\n\t}\n}", `unknown rate_limit_rls setting "unknown"`},
		{"{\n\trate_limit_rls {\n\t\tconfig_dir /d\n\t\ttls {\n\t\t\tcert_file c\n\t\t}\n\t}\n}", "listen is required"},
		{"{\n\trate_limit_rls {\n\t\tconfig_dir /d\n\t\tredis {\n\t\t\tpassword x\n\t\t}\n\t}\n}", "address is required"},
		{"{\n\trate_limit_rls {\n\t\tconfig_dir /d\n\t\tlisten :1-5\n\t}\n}", "one port"},
		{"{\n\trate_limit_rls {\n\t\tconfig_dir /d\n\t\txds {\n\t\t\taddress x:1\n\t\t}\n\t}\n}", "config_dir and xds exclude each other"},
		{"{\n\trate_limit_rls {\n\t\txds {\n\t\t\tnode_id n\n\t\t}\n\t}\n}", "address is required: the xDS management server, at Caddyfile:3"},
		{"{\n\trate_limit_rls {\n\t\txds {\n\t\t\taddress x:1\n\t\t\tnode n\n\t\t}\n\t}\n}", `xds setting "node" (want address, node_id, tls, backoff_initial or backoff_max), at Caddyfile:5`},
		{"{\n\trate_limit_rls {\n\t\txds {\n\t\t\taddress x:1\n\t\t\ttls {\n\t\t\t\tcert_file c\n\t\t\t}\n\t\t}\n\t}\n}", "cert_file and key_file go together"},
		{"{\n\trate_limit_rls {\n\t\txds {\n\t\t\taddress x:1\n\t\t\tbackoff_initial 2s\n\t\t\tbackoff_max 1s\n\t\t}\n\t}\n}", "backoff_max must not be shorter"},
	} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(c.caddyfile), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.caddyfile, err, c.want)
		}
	}
}
