package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// overallCode finds the overall code in client_cmd's output, the response
// in protobuf's text format ("response: overall_code:OK statuses:{...}").
var overallCode = regexp.MustCompile(`overall_code:\s*(\w+)`)

// TestReferenceClientAgainstRLS runs the reference's own client, client_cmd
// of envoyproxy/ratelimit (built from the tools module), against the
// rate_limit_rls app: a client nobody here wrote. With a limit of 2 a
// minute, its first two calls are OK and its third OVER_LIMIT.
func TestReferenceClientAgainstRLS(t *testing.T) {
	t.Parallel()
	client, err := localfleet.BuildReference(t.TempDir(), "client_cmd")
	if err != nil {
		t.Fatal(err)
	}
	redis := redistest.Start(t)
	configDir := t.TempDir()
	config := "domain: refclient\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n"
	if err := os.WriteFile(filepath.Join(configDir, "refclient.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	port := redistest.FreePort(t)
	startCaddy(t, rlsGlobals(port, configDir, redis.Addr), `respond "ok"`)

	want := []string{"OK", "OK", "OVER_LIMIT"}
	for i, code := range want {
		out, err := exec.Command(client, "-dial_string", fmt.Sprintf("127.0.0.1:%d", port), "-domain", "refclient", "-descriptors", "user=alice").CombinedOutput()
		if err != nil {
			t.Fatalf("client_cmd call %d: %v: %s", i+1, err, out)
		}
		m := overallCode.FindSubmatch(out)
		if m == nil || string(m[1]) != code {
			t.Fatalf("client_cmd call %d: want overall_code %s, got output:\n%s", i+1, code, out)
		}
	}
}
