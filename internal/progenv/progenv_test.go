package progenv

import (
	"os"
	"slices"
	"sync"
	"testing"
)

// TestCloseRunsCleanupsOnceInReverse registers cleanups from several
// goroutines, as fleetcheck does, and checks that Close runs each once, the
// last registered first, and removes the temporary directory.
func TestCloseRunsCleanupsOnceInReverse(t *testing.T) {
	e := New("progenv-test")
	dir := e.TempDir()
	var order []int
	e.Cleanup(func() { order = append(order, 0) })
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { e.Cleanup(func() {}) })
	}
	wg.Wait()
	e.Cleanup(func() { order = append(order, 1) })
	e.Close()
	e.Close()
	if !slices.Equal(order, []int{1, 0}) {
		t.Errorf("cleanups ran in order %v, want [1 0]", order)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("temporary directory %s still there after Close (stat: %v)", dir, err)
	}
}
