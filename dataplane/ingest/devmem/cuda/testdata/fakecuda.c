// A fake libcuda.so.1 (make test-cuda-fake): the driver API entry points
// package cuda binds, with the C prototypes of cuda.h, over host memory, so
// that the gpu-tagged tests run on a machine without a GPU. It checks the
// Go side's ABI (argument order, CUmemAllocationProp and CUmemAccessDesc
// layouts, the CUipcMemHandle passed by value, cuLaunchKernel's parameter
// array, the JIT log options) and flows (a context current on the calling
// thread for every memory call, fds and IPC handles across processes).
// It is our reading of the headers, not NVIDIA's driver: kernels run as C
// here, so the PTX itself is exercised only on a real GPU.
//
// "Device memory" is memfd-backed: a cuMemCreate handle is a memfd, an IPC
// handle names the exporter's memfd through /proc. FAKE_NO_FD=1 clears the
// POSIX-fd attribute, FAKE_CREATE_NOT_SUPPORTED=1 makes cuMemCreate fail
// with CUDA_ERROR_NOT_SUPPORTED, FAKE_JIT_FAIL=1 fails the module load with
// a JIT log.
//
// The machine has FAKE_GPUS physical GPUs (default 2), which differ only in
// their UUIDs (byte 0 is the physical number). A process sees them as the
// driver would under CUDA_VISIBLE_DEVICES (indices only, read at load: the
// list ends at the first index that is not a GPU), so two processes may
// number them differently. Every allocation remembers its physical GPU, and
// the GPUs have no peer access to each other: mapping memory of one GPU for
// another (cuMemSetAccess) or opening its IPC handle in another GPU's
// context fails with CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, so an importer
// that picks the wrong ordinal fails instead of passing by luck.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>

typedef int CUresult; typedef int CUdevice; typedef void *CUcontext; typedef unsigned long long CUdeviceptr;
typedef struct { unsigned type, req; unsigned ltype; int lid; void *w; unsigned char c, g; unsigned short u; unsigned char r[4]; } Prop;
typedef struct { unsigned ltype; int lid; unsigned flags; } Access;
typedef struct { char reserved[64]; } Ipc;
#define MAXGPU 8
static __thread int *cur;
static int ctxobj[MAXGPU]; // the primary context of each physical GPU
#define NEEDCTX if (!cur) return 201
#define CURGPU ((int)(cur - ctxobj))
static int ngpus = 2, nvis, vis[MAXGPU]; // vis[ordinal] is a physical GPU
__attribute__((constructor)) static void visible(void) {
	const char *g = getenv("FAKE_GPUS"), *v = getenv("CUDA_VISIBLE_DEVICES");
	if (g) ngpus = atoi(g);
	if (ngpus < 1 || ngpus > MAXGPU) ngpus = 1;
	if (!v) { for (nvis = 0; nvis < ngpus; nvis++) vis[nvis] = nvis; return; }
	for (const char *p = v; *p && nvis < MAXGPU; ) {
		char *end; long i = strtol(p, &end, 10);
		if (end == p || i < 0 || i >= ngpus || (*end && *end != ',')) break;
		vis[nvis++] = (int)i; p = *end ? end + 1 : end;
	}
}
static int gpuof(int ordinal) { return ordinal >= 0 && ordinal < nvis ? vis[ordinal] : -1; }
#define GRAN (2u<<20)
static int tids[4096]; static int ntids;
static void notetid(void) { int t = syscall(SYS_gettid); for (int i = 0; i < ntids; i++) if (tids[i] == t) return; if (ntids < 4096) tids[ntids++] = t; }
int fake_threads(void) { return ntids; }

CUresult cuInit(unsigned f) { return f ? 1 : 0; }
CUresult cuDriverGetVersion(int *v) { *v = 12040; return 0; }
CUresult cuGetErrorName(CUresult r, const char **s) { *s = r == 801 ? "CUDA_ERROR_NOT_SUPPORTED" : r == 201 ? "CUDA_ERROR_INVALID_CONTEXT" : r == 218 ? "CUDA_ERROR_INVALID_PTX" :
	r == 217 ? "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED" : r == 101 ? "CUDA_ERROR_INVALID_DEVICE" : "CUDA_ERROR_OTHER"; return 0; }
CUresult cuGetErrorString(CUresult r, const char **s) { *s = "fake error text"; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = nvis; return 0; }
CUresult cuDeviceGet(CUdevice *d, int o) { if (gpuof(o) < 0) return 101; *d = o; return 0; }
CUresult cuDeviceGetName(char *n, int len, CUdevice d) { snprintf(n, len, "fake libcuda (testdata/fakecuda.c) as NVIDIA H100 80GB HBM3"); return 0; }
CUresult cuDeviceGetUuid_v2(unsigned char *u, CUdevice d) { if (gpuof(d) < 0) return 101; for (int i = 0; i < 16; i++) u[i] = i * 17; u[0] = gpuof(d); return 0; }
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { *b = 81559ull << 20; return 0; }
CUresult cuDeviceGetAttribute(int *v, int a, CUdevice d) {
	*v = a == 16 ? 132 : a == 102 ? 1 : a == 103 ? (getenv("FAKE_NO_FD") ? 0 : 1) : 0; return 0; }
// Primary contexts count their retains; their scheduling flags change only
// while inactive (the stricter of the drivers' rules: older ones return
// CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, 708, for an active one).
static unsigned ctxflags[MAXGPU]; static int ctxrefs[MAXGPU];
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { if (gpuof(d) < 0) return 101; *c = &ctxobj[gpuof(d)]; ctxrefs[gpuof(d)]++; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { if (gpuof(d) < 0 || ctxrefs[gpuof(d)] == 0) return 101; ctxrefs[gpuof(d)]--; return 0; }
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned f) { if (gpuof(d) < 0) return 101; if ((f & 7) == 3 || (f & 7) > 4) return 1;
	if (ctxrefs[gpuof(d)] > 0) return 708; ctxflags[gpuof(d)] = f; return 0; }
CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned *f, int *active) { if (gpuof(d) < 0) return 101; *f = ctxflags[gpuof(d)]; *active = ctxrefs[gpuof(d)] > 0; return 0; }
CUresult cuCtxPushCurrent_v2(CUcontext c) { if ((int *)c < ctxobj || (int *)c >= ctxobj + ngpus) return 201; cur = c; notetid(); return 0; }
CUresult cuCtxPopCurrent_v2(CUcontext *c) { *c = cur; cur = 0; return 0; }
CUresult cuCtxSynchronize(void) { NEEDCTX; return 0; }

// cuMemAlloc memory is a memfd too, so legacy IPC handles work across processes.
// Every memfd is named after its physical GPU ("fake1", "fakevmm1"), so a
// process that receives one knows where the memory lives.
struct blk { void *p; size_t n; int fd; };
static struct blk blks[4096];
static void *memfd_map(size_t n, int *fdp) { char name[16]; snprintf(name, sizeof name, "fake%d", CURGPU); int fd = memfd_create(name, 0); ftruncate(fd, n); void *p = mmap(0, n, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0); *fdp = fd; return p; }
static int gpuoffd(int fd) { char path[64], link[128]; snprintf(path, sizeof path, "/proc/self/fd/%d", fd); ssize_t k = readlink(path, link, sizeof link - 1);
	if (k < 0) return -1; link[k] = 0; const char *p = strstr(link, "memfd:fake"); if (!p) return -1; p += 10; if (!strncmp(p, "vmm", 3)) p += 3; return atoi(p); }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { NEEDCTX; notetid(); int fd; void *m = memfd_map(n, &fd);
	for (int i = 0; i < 4096; i++) if (!blks[i].p) { blks[i] = (struct blk){m, n, fd}; *p = (CUdeviceptr)m; return 0; } return 2; }
CUresult cuMemFree_v2(CUdeviceptr p) { NEEDCTX; for (int i = 0; i < 4096; i++) if (blks[i].p == (void *)p) { munmap(blks[i].p, blks[i].n); close(blks[i].fd); blks[i].p = 0; return 0; } return 1; }
CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) { NEEDCTX; memset((void *)p, v, n); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { NEEDCTX; notetid(); memcpy((void *)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { NEEDCTX; notetid(); memcpy(d, (void *)s, n); return 0; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) { NEEDCTX; *p = malloc(n); return 0; }
CUresult cuMemFreeHost(void *p) { free(p); return 0; }
CUresult cuIpcGetMemHandle(Ipc *h, CUdeviceptr p) {
	NEEDCTX;
	for (int i = 0; i < 4096; i++) {
		if (blks[i].p != (void *)p)
			continue;
		int pid = getpid();
		memset(h, 0, 64);
		memcpy(h->reserved, "FAKEIPC", 8);
		memcpy(h->reserved + 8, &pid, 4);
		memcpy(h->reserved + 12, &blks[i].fd, 4);
		memcpy(h->reserved + 16, &blks[i].n, 8);
		h->reserved[24] = (char)CURGPU;
		h->reserved[63] = 0x5a;
		return 0;
	}
	return 1;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, Ipc h, unsigned flags) { NEEDCTX;
	if (memcmp(h.reserved, "FAKEIPC", 8) || h.reserved[63] != 0x5a || flags != 1) return 1;
	int pid, fd; size_t n; memcpy(&pid, h.reserved + 8, 4); memcpy(&fd, h.reserved + 12, 4); memcpy(&n, h.reserved + 16, 8);
	if (pid == getpid()) return 201;
	if (h.reserved[24] != CURGPU) return 217; // another GPU's memory, and no peer access
	char path[64]; snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd); int f = open(path, O_RDWR); if (f < 0) return 999;
	void *m = mmap(0, n, PROT_READ|PROT_WRITE, MAP_SHARED, f, 0); close(f); *p = (CUdeviceptr)m; return 0; }
CUresult cuIpcCloseMemHandle(CUdeviceptr p) { NEEDCTX; return 0; }

CUresult cuModuleLoadDataEx(void **m, const char *img, unsigned n, int *opts, void **vals) { NEEDCTX;
	char *log = 0; size_t logn = 0;
	for (unsigned i = 0; i < n; i++) { if (opts[i] == 5) log = vals[i]; if (opts[i] == 6) logn = (size_t)vals[i]; }
	if (n != 2 || !log || logn != 16384) return 1;
	if (getenv("FAKE_JIT_FAIL") || !strstr(img, ".visible .entry checksum(")) { snprintf(log, logn, "ptxas fatal: fake JIT failure"); return 218; }
	*m = &ctxobj; return 0; }
CUresult cuModuleUnload(void *m) { return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { NEEDCTX;
	if (!strcmp(name, "checksum")) *f = (void *)1; else if (!strcmp(name, "mlp")) *f = (void *)2; else return 500; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, void *st, void **params, void **extra) {
	NEEDCTX; notetid();
	if (gx == 0 || gy != 1 || gz != 1 || bx != 256 || by != 1 || bz != 1 || sh || st || extra) return 1;
	if (f == (void *)1) {
		const unsigned char *in = *(const unsigned char **)params[0]; unsigned long long n = *(unsigned long long *)params[1]; unsigned *out = *(unsigned **)params[2];
		if (gx > 132 * 8) return 1;
		for (unsigned long long i = 0; i < n; i++) { out[0] += in[i]; out[1] += (unsigned)(i + 1) * in[i]; }
		return 0; }
	if (f == (void *)2) {
		const float *in = *(const float **)params[0]; unsigned long long rows = *(unsigned long long *)params[1]; const float *w = *(const float **)params[2]; float *out = *(float **)params[3];
		if ((unsigned long long)gx * 4 < rows || (unsigned long long)(gx - 1) * 4 >= rows) return 1; // 4 rows a block
		const float *w1 = w, *b1 = w1 + 64 * 64, *w2 = b1 + 64, *b2 = w2 + 16 * 64;
		for (unsigned long long r = 0; r < rows; r++) { float h[64];
			for (int j = 0; j < 64; j++) { float s = b1[j]; for (int k = 0; k < 64; k++) s += w1[j * 64 + k] * in[r * 64 + k]; h[j] = s > 0 ? s : 0; }
			for (int j = 0; j < 16; j++) { float s = b2[j]; for (int k = 0; k < 64; k++) s += w2[j * 64 + k] * h[k]; out[r * 16 + j] = s; } }
		return 0; }
	return 400; }

static int propok(const Prop *p) { return sizeof(Prop) == 32 && p->type == 1 && p->req == 1 && p->ltype == 1 && gpuof(p->lid) >= 0 && !p->w; }
CUresult cuMemGetAllocationGranularity(size_t *g, const Prop *p, int opt) { if (!propok(p) || opt != 0) return 1; *g = GRAN; return 0; }
CUresult cuMemCreate(unsigned long long *h, size_t n, const Prop *p, unsigned long long fl) { NEEDCTX;
	if (getenv("FAKE_CREATE_NOT_SUPPORTED")) return 801;
	if (!propok(p) || n % GRAN || fl) return 1; char name[16]; snprintf(name, sizeof name, "fakevmm%d", gpuof(p->lid));
	int fd = memfd_create(name, 0); ftruncate(fd, n); *h = (unsigned long long)fd + 1000; return 0; }
CUresult cuMemRelease(unsigned long long h) { close((int)(h - 1000)); return 0; }
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t al, CUdeviceptr a, unsigned long long f) { NEEDCTX;
	if (n % GRAN || al || a || f) return 1; void *m = mmap(0, n, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0); *p = (CUdeviceptr)m; return 0; }
CUresult cuMemAddressFree(CUdeviceptr p, size_t n) { munmap((void *)p, n); return 0; }
// The physical GPU of each mapped range, for cuMemSetAccess.
struct vmap { CUdeviceptr p; int gpu; };
static struct vmap vmaps[4096];
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, unsigned long long h, unsigned long long f) { NEEDCTX;
	if (off || f) return 1; void *m = mmap((void *)p, n, PROT_NONE, MAP_SHARED|MAP_FIXED, (int)(h - 1000), 0); if (m != (void *)p) return 1;
	int gpu = gpuoffd((int)(h - 1000));
	for (int i = 0; i < 4096; i++) if (__sync_bool_compare_and_swap(&vmaps[i].p, 0, p)) { vmaps[i].gpu = gpu; return 0; } return 2; }
CUresult cuMemUnmap(CUdeviceptr p, size_t n) { mmap((void *)p, n, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0);
	for (int i = 0; i < 4096; i++) __sync_bool_compare_and_swap(&vmaps[i].p, p, 0); return 0; }
CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const Access *d, size_t c) { NEEDCTX;
	if (c != 1 || d->ltype != 1 || gpuof(d->lid) < 0 || d->flags != 3) return 1;
	int gpu = -1; for (int i = 0; i < 4096; i++) if (vmaps[i].p == p) gpu = vmaps[i].gpu;
	if (gpu != gpuof(d->lid)) return 217; // another GPU's memory, and no peer access
	return mprotect((void *)p, n, PROT_READ|PROT_WRITE) ? 1 : 0; }
CUresult cuMemExportToShareableHandle(void *out, unsigned long long h, int kind, unsigned long long f) { NEEDCTX;
	if (kind != 1 || f) return 1; *(int *)out = dup((int)(h - 1000)); return 0; }
CUresult cuMemImportFromShareableHandle(unsigned long long *h, void *os, int kind) { NEEDCTX;
	if (kind != 1) return 1; int fd = dup((int)(intptr_t)os); if (fd < 0) return 1; *h = (unsigned long long)fd + 1000; return 0; }
