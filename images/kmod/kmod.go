// Package kmod owns kernel modules in the Lovelock image: reading a module's
// name and dependencies from its .modinfo section (at build time, for any
// architecture, without kmod), resolving the closure of what a set of modules
// needs, writing and reading modules.dep in depmod's format, and loading
// modules in dependency order with finit_module(2) (at boot, in /init).
package kmod

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrUnknownModule reports a module name that no known module carries.
var ErrUnknownModule = errors.New("unknown module")

// Info is what a module says about itself in its .modinfo section.
type Info struct {
	// Name is the module's name (underscores, no .ko).
	Name string
	// Path is where the module lives relative to /lib/modules/<release>.
	Path string
	// Depends lists the names of the modules it needs loaded first.
	Depends []string
	// Vermagic is the kernel release and options it was built for.
	Vermagic string
}

// Normalize turns a module name or file name into the kernel's spelling:
// no directory, no .ko (or .ko.xz, .ko.zst, .ko.gz) suffix, dashes as
// underscores.
func Normalize(name string) string {
	name = path.Base(name)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		name = strings.TrimSuffix(name, ext)
	}
	name = strings.TrimSuffix(name, ".ko")
	return strings.ReplaceAll(name, "-", "_")
}

// ReadInfo parses the .modinfo section of an uncompressed module (.ko ELF
// file of any architecture). relPath is recorded as Info.Path and names the
// module when .modinfo carries no name= field.
func ReadInfo(ko []byte, relPath string) (Info, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return Info{}, fmt.Errorf("module %s: %w", relPath, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return Info{}, fmt.Errorf("module %s: no .modinfo section", relPath)
	}
	data, err := sec.Data()
	if err != nil {
		return Info{}, fmt.Errorf("module %s: read .modinfo: %w", relPath, err)
	}
	info := Info{Name: Normalize(relPath), Path: relPath}
	for _, field := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(field), "=")
		if !ok {
			continue
		}
		switch k {
		case "name":
			info.Name = v
		case "vermagic":
			info.Vermagic = v
		case "depends":
			for d := range strings.SplitSeq(v, ",") {
				if d != "" {
					info.Depends = append(info.Depends, Normalize(d))
				}
			}
		}
	}
	return info, nil
}

// Closure returns the modules that loading names needs, dependencies first
// (a valid load order), each once. all maps module names to what they say
// about themselves.
func Closure(all map[string]Info, names []string) ([]Info, error) {
	var (
		order []Info
		state = make(map[string]int) // 1: visiting, 2: done
		visit func(name, from string) error
	)
	visit = func(name, from string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("module %s: dependency cycle through %s", name, from)
		case 2:
			return nil
		}
		info, ok := all[name]
		if !ok {
			if from != "" {
				return fmt.Errorf("module %s (needed by %s): %w", name, from, ErrUnknownModule)
			}
			return fmt.Errorf("module %s: %w", name, ErrUnknownModule)
		}
		state[name] = 1
		for _, d := range info.Depends {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, info)
		return nil
	}
	for _, n := range names {
		if err := visit(Normalize(n), ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// WriteDep writes modules.dep in depmod's format for mods, which must hold
// every dependency of every module: one line per module (sorted by path),
// "path: dep dep ...", where the dependencies are the module's whole
// closure listed so that loading them from last to first, then the module,
// is a valid order (as modprobe does).
func WriteDep(w io.Writer, mods []Info) error {
	byName := make(map[string]Info, len(mods))
	for _, m := range mods {
		byName[m.Name] = m
	}
	sorted := slices.SortedFunc(maps.Values(byName), func(a, b Info) int { return strings.Compare(a.Path, b.Path) })
	bw := bufio.NewWriter(w)
	for _, m := range sorted {
		closure, err := Closure(byName, []string{m.Name})
		if err != nil {
			return err
		}
		fmt.Fprintf(bw, "%s:", m.Path)
		// closure ends with m itself; its dependencies, reversed, are
		// depmod's order.
		for i := len(closure) - 2; i >= 0; i-- {
			fmt.Fprintf(bw, " %s", closure[i].Path)
		}
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// Dep is a parsed modules.dep: for every module, its path and the paths of
// its dependencies in depmod's order.
type Dep map[string]DepEntry

// DepEntry is one line of modules.dep.
type DepEntry struct {
	Path string
	Deps []string
}

// ParseDep reads modules.dep (depmod's or WriteDep's).
func ParseDep(r io.Reader) (Dep, error) {
	dep := make(Dep)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p, rest, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep line %d: no colon in %q", n, line)
		}
		dep[Normalize(p)] = DepEntry{Path: p, Deps: strings.Fields(rest)}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("modules.dep: %w", err)
	}
	return dep, nil
}

// LoadOrder returns the paths to load, in order, so that every module of
// names is loaded after what it needs. A module that appears twice is loaded
// once.
func (d Dep) LoadOrder(names []string) ([]string, error) {
	var (
		order []string
		seen  = make(map[string]bool)
	)
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			order = append(order, p)
		}
	}
	for _, n := range names {
		e, ok := d[Normalize(n)]
		if !ok {
			return nil, fmt.Errorf("module %s: not in modules.dep: %w", n, ErrUnknownModule)
		}
		for i := len(e.Deps) - 1; i >= 0; i-- {
			add(e.Deps[i])
		}
		add(e.Path)
	}
	return order, nil
}

// Names returns every module in d, sorted.
func (d Dep) Names() []string {
	return slices.Sorted(maps.Keys(d))
}

// Load loads the module file at path with finit_module(2). A module that is
// already loaded (or built in) is not an error.
func Load(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("module %s: %w", path, err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("module %s: finit_module: %w", path, err)
	}
	return nil
}
