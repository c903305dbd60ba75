package appliance

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The project's layers, top to bottom (DESIGN.md §2, docs/ARCHITECTURE.md):
// a package may import its own layer and the layers below it, never above.
//
//	3  appliance/...  images/cmd/...   the appliance and the tools that build its image
//	2  control/...                     control plane, CLI, testbed
//	1  dataplane/...                   userspace fast path and services
//	0  bpf/...  images/<library>/...   BPF programs and their loader; image format libraries
//
// bpf and dataplane/wire import nothing of the project at all: they are the
// contract with the kernel and the wire, and everything builds on them.
const module = "github.com/lovelock-dpu/lovelock/"

func layer(pkg string) int {
	switch top, _, _ := strings.Cut(pkg, "/"); top {
	case "appliance":
		return 3
	case "images":
		if strings.HasPrefix(pkg, "images/cmd/") {
			return 3
		}
		return 0
	case "control":
		return 2
	case "dataplane":
		return 1
	}
	return 0
}

// leaves import nothing of the project, tests aside.
var leaves = map[string]bool{"bpf": true, "dataplane/wire": true}

// allowedInTests are the imports test files may make across the layers,
// each with its reason.
var allowedInTests = map[string]string{
	"control/testenv": "the test plumbing every privileged test shares: root check, namespaces, veth pairs, bpffs",
	// bpf's TestJumboFrames checks the xsk verdict on multi-buffer frames
	// against a real AF_XDP socket.
	"dataplane/xsk": "bpf's tests hand xsk verdicts to a real AF_XDP socket",
}

// goFile is one Go file's package directory and project imports.
type goFile struct {
	path    string // relative to the module root
	pkg     string // its directory, relative to the module root
	test    bool
	imports []string // project packages, relative to the module root
}

// violations returns each import that breaks the layering.
func violations(files []goFile) []string {
	var out []string
	for _, f := range files {
		for _, imp := range f.imports {
			if imp == f.pkg {
				continue // an external test package of its own package
			}
			if f.test && allowedInTests[imp] != "" {
				continue
			}
			switch {
			case leaves[f.pkg] && !f.test:
				out = append(out, f.path+": imports "+imp+": "+f.pkg+" imports nothing of the project")
			case layer(imp) > layer(f.pkg):
				out = append(out, f.path+": imports "+imp+": layer "+strconv.Itoa(layer(imp))+" from layer "+strconv.Itoa(layer(f.pkg))+" (imports flow appliance → control → dataplane → bpf)")
			}
		}
	}
	return out
}

// projectFiles parses the imports of every Go file under root.
func projectFiles(t *testing.T, root string) []goFile {
	t.Helper()
	var files []goFile
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		g := goFile{path: rel, pkg: filepath.Dir(rel), test: strings.HasSuffix(name, "_test.go")}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, module) {
				g.imports = append(g.imports, strings.TrimPrefix(p, module))
			}
		}
		files = append(files, g)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestLayers: no import in the project, commands and tests included, flows
// upward. `make lint` runs it.
func TestLayers(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	files := projectFiles(t, root)
	if len(files) < 100 {
		t.Fatalf("read %d Go files under %s; the walk is broken", len(files), root)
	}
	for _, v := range violations(files) {
		t.Error(v)
	}
}

// TestLayersCatch: the check fails on planted upward imports.
func TestLayersCatch(t *testing.T) {
	for _, c := range []struct {
		name string
		f    goFile
		want string
	}{
		{"dataplane to control", goFile{path: "dataplane/x/x.go", pkg: "dataplane/x", imports: []string{"control/rules"}}, "layer 2 from layer 1"},
		{"control to appliance", goFile{path: "control/cli/a.go", pkg: "control/cli", imports: []string{"appliance/config"}}, "layer 3 from layer 2"},
		{"bpf to dataplane", goFile{path: "bpf/steer.go", pkg: "bpf", imports: []string{"dataplane/xsk"}}, "bpf imports nothing"},
		{"wire to bpf", goFile{path: "dataplane/wire/wire.go", pkg: "dataplane/wire", imports: []string{"bpf"}}, "dataplane/wire imports nothing"},
		{"test to control", goFile{path: "bpf/x_test.go", pkg: "bpf", test: true, imports: []string{"control/rules"}}, "layer 2 from layer 0"},
		{"image library to control", goFile{path: "images/bfb/b.go", pkg: "images/bfb", imports: []string{"control/api"}}, "layer 2 from layer 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := violations([]goFile{c.f})
			if len(v) != 1 || !strings.Contains(v[0], c.want) {
				t.Errorf("violations %q, want one with %q", v, c.want)
			}
		})
	}
	for _, ok := range []goFile{
		{path: "appliance/daemon/d.go", pkg: "appliance/daemon", imports: []string{"control/api", "dataplane/messaging", "bpf"}},
		{path: "images/cmd/lovelock-init/c.go", pkg: "images/cmd/lovelock-init", imports: []string{"control/api", "images/kmod"}},
		{path: "dataplane/xsk/x_test.go", pkg: "dataplane/xsk", test: true, imports: []string{"control/testenv", "bpf"}},
		{path: "dataplane/wire/c_test.go", pkg: "dataplane/wire", test: true, imports: []string{"bpf"}},
	} {
		if v := violations([]goFile{ok}); len(v) != 0 {
			t.Errorf("%s: %q, want none", ok.path, v)
		}
	}
}
