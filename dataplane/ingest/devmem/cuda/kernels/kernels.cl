// Kernels of the CUDA device, one per built-in model of package model.
// OpenCL C compiled by clang's NVPTX backend into kernels.ptx (see
// gen.go); the NVPTX builtins stand in for OpenCL's work-item functions,
// which would otherwise be calls into a libclc the driver does not have.
// Every kernel must agree with its model's CPU reference: checksum bit for
// bit, mlp within model.Close.

#define THREADS 256 // threads per block; Go launches exactly this many

#define tid() __nvvm_read_ptx_sreg_tid_x()
#define bid() __nvvm_read_ptx_sreg_ctaid_x()
#define nblocks() __nvvm_read_ptx_sreg_nctaid_x()

// checksum adds A = sum b_i and B = sum (i+1)*b_i (mod 2^32) over the n
// bytes at in into out[0] and out[1], which the caller zeroes. Sums mod 2^32
// are associative, so per-thread partial sums, a per-block tree and one
// atomic add per block give the CPU's bits exactly. Each thread reads
// aligned 32-bit words (the buffer starts aligned), a grid-stride loop
// covers any n; the last partial word is read byte by byte.
__kernel void checksum(__global const uchar *in, ulong n, __global uint *out) {
	__local uint sa[THREADS];
	__local uint sb[THREADS];
	uint a = 0, b = 0;
	ulong words = n / 4;
	__global const uint *w = (__global const uint *)in;
	ulong stride = (ulong)nblocks() * THREADS;
	for (ulong k = (ulong)bid() * THREADS + tid(); k < words; k += stride) {
		uint v = w[k];
		uint i = (uint)(k * 4) + 1; // index + 1 of the word's first byte, mod 2^32
		uint b0 = v & 0xff, b1 = (v >> 8) & 0xff, b2 = (v >> 16) & 0xff, b3 = v >> 24;
		a += b0 + b1 + b2 + b3;
		b += i * b0 + (i + 1) * b1 + (i + 2) * b2 + (i + 3) * b3;
	}
	if (bid() == 0 && tid() == 0) {
		for (ulong k = words * 4; k < n; k++) {
			uint v = in[k];
			a += v;
			b += (uint)(k + 1) * v;
		}
	}
	sa[tid()] = a;
	sb[tid()] = b;
	__syncthreads();
	for (uint s = THREADS / 2; s > 0; s >>= 1) {
		if (tid() < s) {
			sa[tid()] += sa[tid() + s];
			sb[tid()] += sb[tid() + s];
		}
		__syncthreads();
	}
	if (tid() == 0) {
		__nvvm_atom_add_gen_i((volatile int *)&out[0], (int)sa[0]);
		__nvvm_atom_add_gen_i((volatile int *)&out[1], (int)sb[0]);
	}
}

// The MLP's shape, as model.MLPIn, MLPHidden, MLPOut.
#define MLP_IN 64
#define MLP_HIDDEN 64
#define MLP_OUT 16
#define MLP_WEIGHTS (MLP_HIDDEN * MLP_IN + MLP_HIDDEN + MLP_OUT * MLP_HIDDEN + MLP_OUT)

// mlp computes out = W2·relu(W1·x + B1) + B2 for each of rows float32 rows
// of in. A block takes MLP_ROWS rows (THREADS / MLP_HIDDEN): one thread per
// hidden unit of a row, then MLP_OUT threads of each row one output each, so
// a row's 5120 multiply-adds run as 64 short chains in parallel, not as one
// thread's (which took 660 µs for 256 rows on an H100: one SM, h in local
// memory). Each block first copies the weights, as laid out in Go (W1, B1,
// W2, B2), into shared memory with W1 and W2 transposed, so the threads of
// a warp read consecutive words, and its rows' inputs. Each sum runs in the
// CPU reference's order (k ascending); only rounding differs (fused
// multiply-adds), within model.Close.
#if MLP_IN != MLP_HIDDEN || THREADS % MLP_HIDDEN != 0 || MLP_OUT > MLP_HIDDEN
#error "mlp loads one input float per thread and needs MLP_IN == MLP_HIDDEN dividing THREADS"
#endif
#define MLP_ROWS (THREADS / MLP_HIDDEN)
__kernel void mlp(__global const float *in, ulong rows, __global const float *weights, __global float *out) {
	__local float w1t[MLP_IN * MLP_HIDDEN];  // w1t[k*MLP_HIDDEN + j] = W1[j*MLP_IN + k]
	__local float w2t[MLP_HIDDEN * MLP_OUT]; // w2t[k*MLP_OUT + j] = W2[j*MLP_HIDDEN + k]
	__local float b1[MLP_HIDDEN];
	__local float b2[MLP_OUT];
	__local float x[MLP_ROWS * MLP_IN];
	__local float h[MLP_ROWS * MLP_HIDDEN];
	__global const float *gw1 = weights;
	__global const float *gb1 = gw1 + MLP_HIDDEN * MLP_IN;
	__global const float *gw2 = gb1 + MLP_HIDDEN;
	__global const float *gb2 = gw2 + MLP_OUT * MLP_HIDDEN;
	for (uint i = tid(); i < MLP_HIDDEN * MLP_IN; i += THREADS)
		w1t[(i % MLP_IN) * MLP_HIDDEN + i / MLP_IN] = gw1[i];
	for (uint i = tid(); i < MLP_OUT * MLP_HIDDEN; i += THREADS)
		w2t[(i % MLP_HIDDEN) * MLP_OUT + i / MLP_HIDDEN] = gw2[i];
	if (tid() < MLP_HIDDEN)
		b1[tid()] = gb1[tid()];
	if (tid() < MLP_OUT)
		b2[tid()] = gb2[tid()];
	uint r = tid() / MLP_HIDDEN, j = tid() % MLP_HIDDEN;
	ulong row = (ulong)bid() * MLP_ROWS + r;
	int live = row < rows; // every thread reaches both barriers
	x[r * MLP_IN + j] = live ? in[row * MLP_IN + j] : 0;
	__syncthreads();
	float s = b1[j];
	for (int k = 0; k < MLP_IN; k++)
		s += w1t[k * MLP_HIDDEN + j] * x[r * MLP_IN + k];
	h[r * MLP_HIDDEN + j] = s > 0 ? s : 0;
	__syncthreads();
	if (live && j < MLP_OUT) {
		float o = b2[j];
		for (int k = 0; k < MLP_HIDDEN; k++)
			o += w2t[k * MLP_OUT + j] * h[r * MLP_HIDDEN + k];
		out[row * MLP_OUT + j] = o;
	}
}
