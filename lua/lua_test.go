package lua

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

var update = flag.Bool("update", false, "rewrite the golden scripts in testdata")

// TestScriptsGolden pins the assembled scripts' text, the wire format's
// header at their top included (as go-redis/redis_rate's script tests pin
// its scripts). After a deliberate change, go test ./lua -update rewrites
// testdata; the diff is the change's review.
func TestScriptsGolden(t *testing.T) {
	for name, script := range map[string]string{"decide.lua": Decide, "refund.lua": Refund, "peek.lua": Peek} {
		path := filepath.Join("testdata", name+".golden")
		if *update {
			if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (go test ./lua -update writes it)", err)
		}
		if script != string(want) {
			t.Errorf("the assembled %s differs from %s (go test ./lua -update rewrites it):\n%s", name, path, firstDiff(script, string(want)))
		}
	}
}

// firstDiff shows the first line where got and want differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n got:  " + gl + "\n want: " + wl
		}
	}
	return ""
}

// barePosition matches a position or a flag written as a number where the
// scripts must name it: a rule's field, an ARGV position, a
// zone's value in the reply, a flag set or compared.
var barePosition = regexp.MustCompile(`rule\[\d|ARGV\[\s*\d|reply\[c\s*[+-]\s*\d|reply\[c\]|\bflag\s*(=|==|~=)\s*\d`)

// TestNamesNotNumbers: the .lua files use the wire format's names, never
// its numbers, so that the wire declarations are the one place a position is declared.
func TestNamesNotNumbers(t *testing.T) {
	files, err := filepath.Glob("*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no .lua files: %v", err)
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			code, _, _ := strings.Cut(line, "--")
			if m := barePosition.FindString(code); m != "" {
				t.Errorf("%s:%d: %q: name the position (see wire.go): %s", f, i+1, m, strings.TrimSpace(line))
			}
		}
	}
}

// TestNamesUsed: every name of the wire format is used by a .lua file,
// names are unique, and none is left in the code of an assembled script.
func TestNamesUsed(t *testing.T) {
	files, err := filepath.Glob("*.lua")
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n.name] {
			t.Errorf("%s is declared twice", n.name)
		}
		seen[n.name] = true
		if !regexp.MustCompile(`\b` + n.name + `\b`).MatchString(src.String()) {
			t.Errorf("%s is declared but no .lua file uses it", n.name)
		}
	}
	for name, script := range map[string]string{"decide": Decide, "refund": Refund, "peek": Peek} {
		for i, line := range strings.Split(script, "\n") {
			code, _, _ := strings.Cut(line, "--")
			if m := nameRE.FindString(code); m != "" {
				t.Errorf("%s, line %d: %s left unbound: %s", name, i+1, m, line)
			}
		}
	}
}

// TestPackZone pins PackZone's numbers, and shows that zone.lua, run by
// Redis, decodes every one of them back.
func TestPackZone(t *testing.T) {
	for _, c := range []struct {
		k, ki, keys int
		last        bool
		want        int
	}{
		{1, 1, 1, false, 0},
		{1, 1, 1, true, 1},
		{1, 2, 6, false, 2},
		{2, 2, 6, true, 15},
		{3, 3, 6, true, 29},
		{6, 6, 6, true, 71},
	} {
		if got := PackZone(c.k, c.ki, c.keys, c.last); got != c.want {
			t.Errorf("PackZone(%d, %d, %d, %v) = %d, want %d", c.k, c.ki, c.keys, c.last, got, c.want)
		}
	}

	const keys = 5
	args := []string{"EVAL", "local nkeys = tonumber(ARGV[1])\nlocal out = {}\n" +
		"for a = 2, #ARGV do\nlocal z = tonumber(ARGV[a])\nlocal ki, k, last\n" + unzone +
		"out[#out + 1] = ki .. ',' .. k .. ',' .. last\nend\nreturn out\n", "0", strconv.Itoa(keys)}
	var want []string
	for k := 1; k <= 4; k++ {
		for ki := 1; ki <= keys; ki++ {
			for _, last := range []bool{false, true} {
				args = append(args, strconv.Itoa(PackZone(k, ki, keys, last)))
				l := 0
				if last {
					l = 1
				}
				want = append(want, strconv.Itoa(ki)+","+strconv.Itoa(k)+","+strconv.Itoa(l))
			}
		}
	}
	r := redistest.Start(t)
	if got := r.MustDo(args...); got != strings.Join(want, "\n") {
		t.Errorf("zone.lua decodes PackZone's numbers as\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
}
