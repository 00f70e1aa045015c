package localfleet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ReferenceModule is the import path of envoyproxy/ratelimit, the
// reference Envoy rate limit service. The repository's tools module pins
// its version, so that the plugin's own module never requires it.
const ReferenceModule = "github.com/envoyproxy/ratelimit"

// BuildReference builds one command of the reference rate limit service
// (service_cmd, the server, or client_cmd, its client) from the tools
// module into dir, and returns the binary's path.
func BuildReference(dir, command string) (string, error) {
	bin := filepath.Join(dir, command)
	build := exec.Command("go", "build", "-o", bin, ReferenceModule+"/src/"+command)
	build.Dir = filepath.Join(RepoRoot(), "tools")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building the reference's %s: %w", command, err)
	}
	return bin, nil
}
