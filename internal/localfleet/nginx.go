package localfleet

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// Nginx is an nginx process started for a test: one process in the
// foreground (daemon off, master_process off), with its configuration,
// pid file, logs and temporary files in its own directory.
type Nginx struct {
	// URL is the base URL of its server, http://127.0.0.1:port.
	URL string
	// Port is the port its server listens on.
	Port int
	// Dir is its prefix directory: nginx.conf, nginx.pid, access.log.
	Dir string
	// Log holds everything the process printed, its error log included.
	Log *SyncBuffer

	proc proc
}

// NginxBinary returns the nginx to run: $NGINX if set, else nginx on
// PATH, else Debian's /usr/sbin/nginx (sbin is not on every PATH); "" if
// there is none.
func NginxBinary() string {
	if p := os.Getenv("NGINX"); p != "" {
		return p
	}
	for _, name := range []string{"nginx", "/usr/sbin/nginx"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// nginxPreamble is the part of the configuration that keeps nginx in its
// directory and in the foreground; the caller's text goes in the http
// block. As root, a single process (master_process off) serves without
// switching to an unprivileged user that could not read the directory.
const nginxPreamble = `daemon off;
master_process off;
pid "%[1]s/nginx.pid";
error_log stderr notice;
events {
	worker_connections 256;
}
http {
	access_log "%[1]s/access.log";
	client_body_temp_path "%[1]s/tmp/client_body";
	proxy_temp_path "%[1]s/tmp/proxy";
	fastcgi_temp_path "%[1]s/tmp/fastcgi";
	uwsgi_temp_path "%[1]s/tmp/uwsgi";
	scgi_temp_path "%[1]s/tmp/scgi";

%[2]s
}
`

// NginxFile is a file beside nginx.conf, for the configuration to
// include.
type NginxFile struct {
	// Name is the file's name, as an include directive names it.
	Name string
	// Text is its content.
	Text string
}

// StartNginx runs the nginx binary bin with http as the content of its
// http block, and files beside its nginx.conf, and waits until it answers
// GET readyPath on port (a location of http's server on 127.0.0.1:port
// that answers without side effects, e.g. `location = /ready { return
// 204; }`). It fails the test with nginx's output when nginx exits or is
// not ready within readyTimeout. nginx is stopped when the test ends.
func StartNginx(t redistest.T, bin string, port int, http, readyPath string, files ...NginxFile) *Nginx {
	t.Helper()
	n := &Nginx{
		URL:  fmt.Sprintf("http://127.0.0.1:%d", port),
		Port: port,
		Dir:  t.TempDir(),
		Log:  &SyncBuffer{},
	}
	// logs/: where a build whose default error log is a file writes
	// before it has read the configuration.
	for _, d := range []string{"logs", "tmp"} {
		if err := os.Mkdir(filepath.Join(n.Dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(n.Dir, f.Name), []byte(f.Text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(n.Dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(nginxPreamble, n.Dir, http)), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := startProc("nginx", exec.Command(bin, "-p", n.Dir+"/", "-c", conf), n.Log)
	if err != nil {
		t.Fatal(err)
	}
	n.proc = p
	t.Cleanup(n.Stop)
	// Ready when nginx itself answers readyPath (another process could
	// hold a port that was free a moment ago: nginx would then exit).
	var last error
	ready := func() bool {
		resp, err := readyClient.Get(n.URL + readyPath)
		last = err
		if err != nil {
			return false
		}
		resp.Body.Close()
		return strings.HasPrefix(resp.Header.Get("Server"), "nginx") && resp.StatusCode < 300
	}
	n.proc.waitReady(t, ready, func() string {
		return fmt.Sprintf("nginx did not answer %s within %s (last: %v)", readyPath, readyTimeout, last)
	})
	return n
}

// Stop kills the process and waits for it. Calling it twice is harmless.
func (n *Nginx) Stop() { n.proc.stop() }

// Get sends one GET request through nginx with optional headers
// ("Name: value").
func (n *Nginx) Get(path string, headers ...string) (Response, error) {
	return do(http.MethodGet, n.URL+path, headers...)
}
