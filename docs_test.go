package fleetlimit

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// caddyfileSubdirectives lists the subdirectives that UnmarshalCaddyfile
// accepts in each block, named by its path from rate_limit ("rate_limit
// redis tls"), read from the parser's own tables, so that a new
// subdirective is in it without anyone adding it here. The storage block
// takes any contents, and match takes Caddy's matchers: neither is listed.
func caddyfileSubdirectives() map[string][]string {
	return map[string][]string{
		"rate_limit": slices.Concat(handlerBlocks, names(handlerFlags),
			slices.Collect(maps.Keys(handlerSettings))),
		"rate_limit redis": slices.Concat(redisOthers, names(redisFlags), names(redisStrings),
			names(redisDurations), names(redisCounts)),
		"rate_limit redis tls":   slices.Concat(names(tlsSettings), names(tlsFlags)),
		"rate_limit zone":        slices.Concat(zoneLists, slices.Collect(maps.Keys(zoneSettings))),
		"rate_limit distributed": names(distributedSettings),
	}
}

// TestCaddyfileSubdirectivesAreTheParsers checks caddyfileSubdirectives
// against the parser itself: in every block, the list that an unknown
// subdirective's error gives is the same set of names, and the parser
// knows each of them.
func TestCaddyfileSubdirectivesAreTheParsers(t *testing.T) {
	wantRE := regexp.MustCompile(`unknown [a-z ]*subdirective "no_such_thing" \(want ([a-z0-9_, ]+)\)`)
	for path, subs := range caddyfileSubdirectives() {
		t.Run(path, func(t *testing.T) {
			err := unmarshalIn(path, "no_such_thing 1s")
			m := wantRE.FindStringSubmatch(errString(err))
			if m == nil {
				t.Fatalf("an unknown subdirective's error lists no subdirectives: %v", err)
			}
			listed := strings.Split(strings.Replace(m[1], " or ", ", ", 1), ", ")
			if got, want := slices.Sorted(slices.Values(listed)), slices.Sorted(slices.Values(subs)); !slices.Equal(got, want) {
				t.Errorf("the parser lists %v, caddyfileSubdirectives %v", got, want)
			}
			for _, sub := range subs {
				if err := unmarshalIn(path, sub+" 1s"); strings.Contains(errString(err), "unknown") && strings.Contains(errString(err), `"`+sub+`"`) {
					t.Errorf("%s is listed but unknown: %v", sub, err)
				}
			}
		})
	}
}

// unmarshalIn parses a rate_limit handler whose block path holds line.
func unmarshalIn(path, line string) error {
	blocks := strings.Fields(path)
	var b strings.Builder
	for i, name := range blocks {
		b.WriteString(strings.Repeat("\t", i) + name)
		if name == "zone" {
			b.WriteString(" api")
		}
		b.WriteString(" {\n")
	}
	b.WriteString(strings.Repeat("\t", len(blocks)) + line + "\n")
	for i := len(blocks) - 1; i >= 0; i-- {
		b.WriteString(strings.Repeat("\t", i) + "}\n")
	}
	var h Handler
	return h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(b.String()))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestDocsNameEverySubdirective checks that the syntax in
// UnmarshalCaddyfile's doc comment and in docs/directive.md shows every
// subdirective the parser accepts, each at the start of a line of its own
// block, and no line there starts with one the block does not accept.
func TestDocsNameEverySubdirective(t *testing.T) {
	docs := map[string][]string{
		"UnmarshalCaddyfile's doc comment": unmarshalCaddyfileDoc(t),
		"docs/directive.md":                directiveSyntax(t),
	}
	accepted := caddyfileSubdirectives()
	for doc, lines := range docs {
		shown, err := syntaxBlocks(lines)
		if err != nil {
			t.Errorf("%s: %v", doc, err)
			continue
		}
		for _, path := range slices.Sorted(maps.Keys(accepted)) {
			for _, sub := range slices.Sorted(slices.Values(accepted[path])) {
				if !slices.Contains(shown[path], sub) {
					t.Errorf("%s: the %s block does not show %s", doc, path, sub)
				}
			}
		}
		for _, path := range slices.Sorted(maps.Keys(shown)) {
			subs, ok := accepted[path]
			if path == "" {
				subs, ok = []string{"rate_limit"}, true
			}
			if !ok {
				t.Errorf("%s: shows a block %s that the parser does not have", doc, path)
				continue
			}
			for _, sub := range shown[path] {
				if !slices.Contains(subs, sub) {
					t.Errorf("%s: the %s block shows %s, which the parser does not accept there", doc, path, sub)
				}
			}
		}
	}
}

// TestEverySubdirectiveHasAGolden checks that every subdirective the
// parser accepts is written, in its block, in some golden Caddyfile of
// TestCaddyfileAdapt, so that a reader learns every form from them.
func TestEverySubdirectiveHasAGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "caddyfile", "*.caddytest"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	written := map[string][]string{}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		caddyfile, _, _ := strings.Cut(string(b), "\n----------\n")
		lines := strings.Split(caddyfile, "\n")
		for i := range lines {
			if !strings.HasPrefix(strings.TrimSpace(lines[i]), "rate_limit ") {
				continue
			}
			blocks, err := syntaxBlocks(outline(lines[i:], "rate_limit "))
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			for path, subs := range blocks {
				written[path] = append(written[path], subs...)
			}
		}
	}
	accepted := caddyfileSubdirectives()
	for _, path := range slices.Sorted(maps.Keys(accepted)) {
		for _, sub := range slices.Sorted(slices.Values(accepted[path])) {
			if !slices.Contains(written[path], sub) {
				t.Errorf("no golden file writes %s in the %s block", sub, path)
			}
		}
	}
}

// syntaxBlocks reads a syntax outline of the rate_limit directive, a
// Caddyfile with placeholders and # comments, and returns the first word of
// each line by the path of the block it is in ("rate_limit zone"). A line
// that ends with { opens a block named by its first word; } closes it.
func syntaxBlocks(lines []string) (map[string][]string, error) {
	shown := map[string][]string{}
	var open []string
	for _, line := range lines {
		code, _, _ := strings.Cut(line, "#")
		words := strings.Fields(code)
		switch {
		case len(words) == 0:
			continue
		case len(words) == 1 && words[0] == "}":
			if len(open) == 0 {
				return nil, errors.New("a } closes no block")
			}
			open = open[:len(open)-1]
			continue
		}
		path := strings.Join(open, " ")
		shown[path] = append(shown[path], words[0])
		if words[len(words)-1] == "{" {
			open = append(open, words[0])
		}
	}
	if len(open) > 0 {
		return nil, fmt.Errorf("the blocks %s are not closed", strings.Join(open, " "))
	}
	return shown, nil
}

// unmarshalCaddyfileDoc returns the lines of the syntax outline in
// Handler.UnmarshalCaddyfile's doc comment, wherever in the package it is.
func unmarshalCaddyfileDoc(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if ok && fn.Name.Name == "UnmarshalCaddyfile" && fn.Recv != nil && receiverIs(fn, "Handler") {
				return outline(strings.Split(fn.Doc.Text(), "\n"), "rate_limit ")
			}
		}
	}
	t.Fatal("no Handler.UnmarshalCaddyfile in the package")
	return nil
}

func receiverIs(fn *ast.FuncDecl, name string) bool {
	star, ok := fn.Recv.List[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	id, ok := star.X.(*ast.Ident)
	return ok && id.Name == name
}

// directiveSyntax returns the lines of the caddyfile block of
// docs/directive.md that outlines the directive.
func directiveSyntax(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("docs", "directive.md"))
	if err != nil {
		t.Fatal(err)
	}
	return outline(strings.Split(string(b), "\n"), "rate_limit ")
}

// outline returns the lines from the first that starts with start (after
// its indentation) to the line that closes its block.
func outline(lines []string, start string) []string {
	for i, line := range lines {
		if !strings.HasPrefix(strings.TrimSpace(line), start) {
			continue
		}
		depth := 0
		for j := i; j < len(lines); j++ {
			code, _, _ := strings.Cut(lines[j], "#")
			depth += strings.Count(code, "{") - strings.Count(code, "}")
			if depth == 0 {
				return lines[i : j+1]
			}
		}
		return lines[i:]
	}
	return nil
}
