// Package fmap is the transparent mapping of far memory (SODA's host agent):
// a program calls Map and uses the returned bytes like any slice; the pages
// are fetched from a Backend on first touch and written back when dirty.
//
// The package has two sides that run in different processes. The
// application side (Map, Mapping) creates a memfd, maps it, registers it with
// a userfaultfd and hands both descriptors to the host agent over a unix
// socket; it contains no fault-handling code, so a goroutine that faults
// never needs its own process's Go scheduler to be served. The host agent
// side (Serve) runs one process per host node and serves every program's
// faults: it fetches 64 KiB chunks with UFFDIO_COPY, keeps a bounded LRU
// buffer of them per mapping, tracks dirty chunks with userfaultfd
// write-protection, writes dirty chunks back before evicting them (by
// punching holes in the memfd), and evicts proactively above a load factor.
//
// See docs/farmem-mapping.md for the design, the kernel facts it relies on
// and what is measured.
package fmap
