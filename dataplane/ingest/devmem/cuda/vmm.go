package cuda

// The virtual memory management calls (cuMemCreate and friends) shared by
// the exporting Device and the importing side: physical allocations that
// can be exported as POSIX descriptors, mapped into a reserved range.

// fdProp describes a pinned allocation on device dev that may be exported
// as a POSIX file descriptor.
func fdProp(dev cuDevice) allocProp {
	return allocProp{
		Type:                 memAllocationTypePinned,
		RequestedHandleTypes: memHandleTypePOSIXFD,
		LocationType:         memLocationTypeDevice,
		LocationID:           int32(dev),
	}
}

// granularity returns the size every allocation, reservation and mapping
// of dev is a multiple of. Exporter and importer both use the minimum, so
// both round a handle's size to the same span.
func granularity(cu *driver, dev cuDevice) (uintptr, error) {
	prop := fdProp(dev)
	var g uintptr
	if err := cu.check("cuMemGetAllocationGranularity", cu.cuMemGetAllocationGranularity(&g, &prop, memGranularityMinimum)); err != nil {
		return 0, err
	}
	return g, nil
}

func roundUp(n, to uintptr) uintptr { return (n + to - 1) / to * to }

// mapHandle reserves span bytes of device address space, maps h there and
// gives dev read-write access; on failure it undoes what it did (h stays
// the caller's).
func mapHandle(cu *driver, h cuMemHandle, span uintptr, dev cuDevice) (cuDevPtr, error) {
	var ptr cuDevPtr
	if err := cu.check("cuMemAddressReserve", cu.cuMemAddressReserve(&ptr, span, 0, 0, 0)); err != nil {
		return 0, err
	}
	if err := cu.check("cuMemMap", cu.cuMemMap(ptr, span, 0, h, 0)); err != nil {
		cu.cuMemAddressFree(ptr, span)
		return 0, err
	}
	access := accessDesc{LocationType: memLocationTypeDevice, LocationID: int32(dev), Flags: memAccessProtReadWrite}
	if err := cu.check("cuMemSetAccess", cu.cuMemSetAccess(ptr, span, &access, 1)); err != nil {
		cu.cuMemUnmap(ptr, span)
		cu.cuMemAddressFree(ptr, span)
		return 0, err
	}
	return ptr, nil
}

// unmapHandle undoes mapHandle and releases h; the physical memory goes
// when its last handle (here or in another process) is released.
func unmapHandle(cu *driver, ptr cuDevPtr, span uintptr, h cuMemHandle) error {
	err := cu.check("cuMemUnmap", cu.cuMemUnmap(ptr, span))
	if e := cu.check("cuMemAddressFree", cu.cuMemAddressFree(ptr, span)); err == nil {
		err = e
	}
	if e := cu.check("cuMemRelease", cu.cuMemRelease(h)); err == nil {
		err = e
	}
	return err
}
