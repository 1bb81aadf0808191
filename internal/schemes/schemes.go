// Package schemes is the registry behind store.Open and backends.Open: packages register what
// opens their URL schemes when they are imported, as database/sql drivers do, so that a program
// opens by URL only what it links in.
package schemes

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Registry maps URL schemes to what opens them.
type Registry[T any] struct {
	// What names the registry's kind in messages: "database", "broker".
	What string
	// Packages names, per scheme, the package of outboxkit's own that registers it (relative to
	// the module), for the error of a scheme whose package the program does not import.
	Packages map[string]string
	// All names the package that imports every one of them.
	All string

	mu      sync.RWMutex
	entries map[string]entry[T]
}

type entry[T any] struct {
	open    T
	example string
}

// Register adds open for schemes; example shows the URL form in messages. It panics when a scheme
// is registered twice.
func (r *Registry[T]) Register(open T, example string, schemes ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.entries == nil {
		r.entries = map[string]entry[T]{}
	}
	for _, s := range schemes {
		if _, dup := r.entries[s]; dup {
			panic(fmt.Sprintf("%s scheme %s registered twice", r.What, s))
		}
		r.entries[s] = entry[T]{open: open, example: example}
	}
}

// Lookup returns what opens scheme, or an error saying which package to import (or which
// schemes there are).
func (r *Registry[T]) Lookup(scheme string) (T, error) {
	r.mu.RLock()
	e, found := r.entries[scheme]
	r.mu.RUnlock()
	if found {
		return e.open, nil
	}
	var zero T
	if pkg, known := r.Packages[scheme]; known {
		return zero, fmt.Errorf("%s URL scheme %q: its package is not linked into this program: "+
			"import _ \"github.com/outboxkit/outboxkit/%s\" (or %s)", r.What, scheme, pkg, r.All)
	}
	return zero, fmt.Errorf("%s URL scheme %q is not supported: use one of %s", r.What, scheme, r.Schemes())
}

// Schemes lists the URL forms of what is registered, or says what to import when nothing is.
func (r *Registry[T]) Schemes() string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var forms []string
	for _, e := range r.entries {
		if !slices.Contains(forms, e.example) {
			forms = append(forms, e.example)
		}
	}
	slices.Sort(forms)
	if len(forms) == 0 {
		return fmt.Sprintf("none registered: import a %s package, e.g. _ \"github.com/outboxkit/outboxkit/%s\"", r.What, r.All)
	}
	return strings.Join(forms, ", ")
}

// Swap replaces the registered entries with none and returns a function that puts them back, for
// a test of a program that forgot its imports.
func (r *Registry[T]) Swap() (restore func()) {
	r.mu.Lock()
	saved := r.entries
	r.entries = nil
	r.mu.Unlock()
	return func() { r.mu.Lock(); r.entries = saved; r.mu.Unlock() }
}
