package kmod

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
)

// fakeKO builds the smallest ELF64 relocatable file debug/elf accepts, with
// a .modinfo section holding fields.
func fakeKO(machine elf.Machine, fields ...string) []byte {
	modinfo := []byte(strings.Join(fields, "\x00") + "\x00")
	shstr := []byte("\x00.modinfo\x00.shstrtab\x00")
	const ehsize, shentsize = 64, 64
	modOff := ehsize
	shstrOff := modOff + len(modinfo)
	shOff := (shstrOff + len(shstr) + 7) &^ 7

	var b bytes.Buffer
	hdr := elf.Header64{
		Ident:     [16]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)},
		Type:      uint16(elf.ET_REL),
		Machine:   uint16(machine),
		Version:   uint32(elf.EV_CURRENT),
		Shoff:     uint64(shOff),
		Ehsize:    ehsize,
		Shentsize: shentsize,
		Shnum:     3,
		Shstrndx:  2,
	}
	binary.Write(&b, binary.LittleEndian, hdr)
	b.Write(modinfo)
	b.Write(shstr)
	b.Write(make([]byte, shOff-b.Len()))
	for _, sh := range []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_PROGBITS), Off: uint64(modOff), Size: uint64(len(modinfo)), Addralign: 1},
		{Name: 10, Type: uint32(elf.SHT_STRTAB), Off: uint64(shstrOff), Size: uint64(len(shstr)), Addralign: 1},
	} {
		binary.Write(&b, binary.LittleEndian, sh)
	}
	return b.Bytes()
}

func TestReadInfo(t *testing.T) {
	for _, m := range []elf.Machine{elf.EM_AARCH64, elf.EM_X86_64} {
		ko := fakeKO(m, "license=GPL", "depends=net_failover,virtio-ring,", "name=virtio_net",
			"vermagic=6.1.0-56-arm64 SMP mod_unload modversions aarch64")
		info, err := ReadInfo(ko, "kernel/drivers/net/virtio_net.ko")
		if err != nil {
			t.Fatal(err)
		}
		if info.Name != "virtio_net" || info.Path != "kernel/drivers/net/virtio_net.ko" ||
			!slices.Equal(info.Depends, []string{"net_failover", "virtio_ring"}) ||
			!strings.HasPrefix(info.Vermagic, "6.1.0-56-arm64 ") {
			t.Fatalf("%v: got %+v", m, info)
		}
	}
	// Without name=, the file name names the module.
	info, err := ReadInfo(fakeKO(elf.EM_AARCH64, "depends="), "kernel/x/pci-hyperv-intf.ko")
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "pci_hyperv_intf" || len(info.Depends) != 0 {
		t.Fatalf("got %+v", info)
	}
	if _, err := ReadInfo([]byte("not elf"), "x.ko"); err == nil {
		t.Fatal("ReadInfo accepted a non-ELF file")
	}
}

func virtioMods() map[string]Info {
	mods := []Info{
		{Name: "virtio", Path: "kernel/drivers/virtio/virtio.ko"},
		{Name: "virtio_ring", Path: "kernel/drivers/virtio/virtio_ring.ko", Depends: []string{"virtio"}},
		{Name: "failover", Path: "kernel/net/core/failover.ko"},
		{Name: "net_failover", Path: "kernel/drivers/net/net_failover.ko", Depends: []string{"failover"}},
		{Name: "virtio_net", Path: "kernel/drivers/net/virtio_net.ko", Depends: []string{"net_failover", "virtio_ring", "virtio"}},
		{Name: "virtio_pci_modern_dev", Path: "kernel/drivers/virtio/virtio_pci_modern_dev.ko"},
		{Name: "virtio_pci", Path: "kernel/drivers/virtio/virtio_pci.ko", Depends: []string{"virtio_pci_modern_dev", "virtio_ring", "virtio"}},
		{Name: "unrelated", Path: "kernel/unrelated.ko"},
	}
	all := make(map[string]Info)
	for _, m := range mods {
		all[m.Name] = m
	}
	return all
}

func TestClosureOrder(t *testing.T) {
	order, err := Closure(virtioMods(), []string{"virtio_pci", "virtio-net"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range order {
		names = append(names, m.Name)
	}
	want := []string{"virtio_pci_modern_dev", "virtio", "virtio_ring", "virtio_pci", "failover", "net_failover", "virtio_net"}
	if !slices.Equal(names, want) {
		t.Fatalf("closure = %v, want %v", names, want)
	}
	assertLoadOrder(t, virtioMods(), names)
}

// assertLoadOrder checks that every module comes after its dependencies.
func assertLoadOrder(t *testing.T, all map[string]Info, names []string) {
	t.Helper()
	pos := make(map[string]int)
	for i, n := range names {
		pos[Normalize(n)] = i
	}
	for _, n := range names {
		for _, d := range all[Normalize(n)].Depends {
			if pos[d] >= pos[Normalize(n)] {
				t.Fatalf("%s loaded before its dependency %s in %v", n, d, names)
			}
		}
	}
}

func TestClosureErrors(t *testing.T) {
	all := virtioMods()
	if _, err := Closure(all, []string{"nope"}); !errors.Is(err, ErrUnknownModule) {
		t.Fatalf("unknown module: err = %v", err)
	}
	all["virtio"] = Info{Name: "virtio", Path: "v.ko", Depends: []string{"virtio_net"}}
	if _, err := Closure(all, []string{"virtio_net"}); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("cycle: err = %v", err)
	}
	delete(all, "failover")
	if _, err := Closure(all, []string{"net_failover"}); !errors.Is(err, ErrUnknownModule) {
		t.Fatalf("missing dependency: err = %v", err)
	}
}

func TestDepRoundTrip(t *testing.T) {
	closure, err := Closure(virtioMods(), []string{"virtio_net", "virtio_pci"})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteDep(&b, closure); err != nil {
		t.Fatal(err)
	}
	// depmod lists a module's whole closure, each module before what it needs.
	wantLine := "kernel/drivers/net/virtio_net.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko " +
		"kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko\n"
	if !strings.Contains(b.String(), wantLine) {
		t.Fatalf("modules.dep:\n%s\nwant line %q", b.String(), wantLine)
	}
	dep, err := ParseDep(&b)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(dep.Names()); got != 7 {
		t.Fatalf("parsed %d modules, want 7", got)
	}
	order, err := dep.LoadOrder([]string{"virtio_pci", "virtio_net", "virtio"})
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != 7 {
		t.Fatalf("load order %v has duplicates or gaps", order)
	}
	assertLoadOrder(t, virtioMods(), order)
	if _, err := dep.LoadOrder([]string{"unrelated"}); !errors.Is(err, ErrUnknownModule) {
		t.Fatalf("LoadOrder of a module not in the file: err = %v", err)
	}
}

func TestParseDepDepmodFormat(t *testing.T) {
	// A line as depmod writes it, with a compressed module and comments.
	in := "# comment\nkernel/a/b-c.ko.xz: kernel/d.ko\nkernel/d.ko:\n\n"
	dep, err := ParseDep(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	order, err := dep.LoadOrder([]string{"b_c"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(order, []string{"kernel/d.ko", "kernel/a/b-c.ko.xz"}) {
		t.Fatalf("load order = %v", order)
	}
	if _, err := ParseDep(strings.NewReader("no colon here\n")); err == nil {
		t.Fatal("ParseDep accepted a line without a colon")
	}
}
