package chaos

import (
	"reflect"
	"strings"
	"testing"
)

// TestDrawReproduces checks that a seed draws the same scenario every time,
// that seeds differ, and that the site it writes names every zone.
func TestDrawReproduces(t *testing.T) {
	t.Parallel()
	a, b := Draw(7, Options{}), Draw(7, Options{})
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 7 drew two different scenarios:\n%s\n%s", a.Summary(), b.Summary())
	}
	if reflect.DeepEqual(a, Draw(8, Options{})) {
		t.Fatal("seeds 7 and 8 drew the same scenario")
	}
	site := a.Site("", "127.0.0.1:1", 0)
	for _, z := range a.Zones {
		if !strings.Contains(site, "zone "+z.Name+" {") {
			t.Errorf("the site has no zone %s:\n%s", z.Name, site)
		}
	}
}
