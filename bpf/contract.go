package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// The BPF↔Go contract. Enums and the layouts of keys and values come from
// the object's BTF through bpf2go (steer_bpfel.go: steerSteerStat,
// steerAction, steerRuleLimits, steerRuleEntry, steerShapeset, …), so they
// cannot differ. Map sizes are also checked against the object before
// anything is loaded (checkSpec), naming the side to fix when they
// disagree: some (MAX_XSK_SLOTS, RULE_TABLE_SIZE) are #defines that BTF does
// not carry, and a stale object is caught there too.

// The package's limits are untyped constants (callers compare them with
// uint32 IDs and ints alike); each must equal its value in enum rule_limits
// as bpf2go generated it from the object's BTF. A mismatch after a change in
// C and make generate fails the build on one of these lines (an array
// length goes negative): set the Go constant named there to the C value.
var (
	_ [MaxShapes - int(steerRuleLimitsMAX_SHAPES)]struct{}
	_ [int(steerRuleLimitsMAX_SHAPES) - MaxShapes]struct{}
	_ [MaxRules - int(steerRuleLimitsMAX_RULES)]struct{}
	_ [int(steerRuleLimitsMAX_RULES) - MaxRules]struct{}
	_ [tableBits - int(steerRuleLimitsRULE_TABLE_BITS)]struct{}
	_ [int(steerRuleLimitsRULE_TABLE_BITS) - tableBits]struct{}
	_ [MaxProbe - int(steerRuleLimitsMAX_PROBE)]struct{}
	_ [int(steerRuleLimitsMAX_PROBE) - MaxProbe]struct{}
)

// LoadError reports a BPF object the kernel refused. Its message carries the
// whole verifier log when there is one (the *ebpf.VerifierError printed with
// %+v, as cilium/ebpf advises: the last line alone rarely says why; %+v of
// the wrapped chain would print only that line); Unwrap returns the cause,
// so callers can test it with errors.As(err, new(*ebpf.VerifierError)) or
// errors.Is (ebpf.ErrNotSupported, os.ErrPermission).
type LoadError struct {
	Object string // the object, e.g. "steer"
	Err    error
}

func (e *LoadError) Error() string {
	var ve *ebpf.VerifierError
	if errors.As(e.Err, &ve) && len(ve.Log) > 0 {
		return fmt.Sprintf("%s: load: %v; verifier log:\n%+v", e.Object, e.Err, ve)
	}
	return fmt.Sprintf("%s: load: %v", e.Object, e.Err)
}

// Unwrap returns the cause.
func (e *LoadError) Unwrap() error { return e.Err }

// specLimit is one map size of the object that a Go constant must equal.
type specLimit struct {
	mapName string // map in the object
	inner   bool   // the size of its inner map (map-in-map)
	cName   string // what sizes it in C
	goName  string // the Go constant
	goVal   uint32 // its value
	get     func() *ebpf.MapSpec
}

// steerLimits lists the map sizes the Go side relies on.
func steerLimits(spec *ebpf.CollectionSpec) []specLimit {
	m := func(name string) func() *ebpf.MapSpec { return func() *ebpf.MapSpec { return spec.Maps[name] } }
	return []specLimit{
		{steerMapSteerStats, false, "STAT_MAX in bpf/steer.c", "NumStats", uint32(NumStats), m(steerMapSteerStats)},
		{steerMapIfaceStats, false, "IFACE_SLOTS in bpf/steer.c", "IfaceSlots", uint32(IfaceSlots), m(steerMapIfaceStats)},
		{steerMapRuleStats, false, "MAX_RULES in bpf/include/rules.h", "MaxRules", MaxRules, m(steerMapRuleStats)},
		{steerMapRulesets, true, "RULE_TABLE_SIZE in bpf/include/rules.h", "tableSize", tableSize, m(steerMapRulesets)},
		{steerMapXsks, false, "MAX_XSK_SLOTS in bpf/steer.c", "MaxXSKSockets", MaxXSKSockets, m(steerMapXsks)},
		{steerMapXskSlots, false, "MAX_XSK_SLOTS in bpf/steer.c", "MaxXSKSockets", MaxXSKSockets, m(steerMapXskSlots)},
	}
}

// checkSpec holds the object's map sizes and value sizes against the Go
// constants and generated types this package uses. C is the source of
// truth: a mismatch means a Go constant is stale, or the committed object
// is (make generate).
func checkSpec(spec *ebpf.CollectionSpec) error {
	for _, l := range steerLimits(spec) {
		ms := l.get()
		what := "map " + l.mapName
		if ms != nil && l.inner {
			ms, what = ms.InnerMap, "inner map of "+l.mapName
		}
		if ms == nil {
			return fmt.Errorf("steer: the object has no %s (regenerate it with make generate)", what)
		}
		if ms.MaxEntries != l.goVal {
			return fmt.Errorf("steer: %s has %d entries in the BPF object (%s) but Go's %s is %d: "+
				"set %s in package bpf to %d, or run make generate if the object is stale", what, ms.MaxEntries, l.cName, l.goName, l.goVal, l.goName, ms.MaxEntries)
		}
	}
	values := []struct {
		ms   *ebpf.MapSpec
		name string
		val  any
	}{
		{spec.Maps[steerMapRulesets].InnerMap, "inner map of " + steerMapRulesets, ruleEntry{}},
		{spec.Maps[steerMapShapesets], "map " + steerMapShapesets, shapeset{}},
		{spec.Maps[steerMapSteerStats], "map " + steerMapSteerStats, steerCounter{}},
		{spec.Maps[steerMapRuleStats], "map " + steerMapRuleStats, steerCounter{}},
		{spec.Maps[steerMapIfaceStats], "map " + steerMapIfaceStats, steerIfaceCounters{}},
	}
	for _, v := range values {
		if n := binary.Size(v.val); v.ms == nil || int(v.ms.ValueSize) != n {
			return fmt.Errorf("steer: %s: values are not the %d-byte %T generated from the object; run make generate", v.name, n, v.val)
		}
	}
	return nil
}
