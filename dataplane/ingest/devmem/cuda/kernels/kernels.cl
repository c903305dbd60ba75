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
// of in, one thread a row. weights holds model.MLPWeights as laid out in Go
// (W1, B1, W2, B2); each block first copies them to shared memory (20.3
// KiB), which every thread of the block then reads.
__kernel void mlp(__global const float *in, ulong rows, __global const float *weights, __global float *out) {
	__local float w[MLP_WEIGHTS];
	for (uint k = tid(); k < MLP_WEIGHTS; k += THREADS)
		w[k] = weights[k];
	__syncthreads();
	ulong r = (ulong)bid() * THREADS + tid();
	if (r >= rows)
		return;
	__local const float *w1 = w;
	__local const float *b1 = w1 + MLP_HIDDEN * MLP_IN;
	__local const float *w2 = b1 + MLP_HIDDEN;
	__local const float *b2 = w2 + MLP_OUT * MLP_HIDDEN;
	__global const float *x = in + r * MLP_IN;
	float h[MLP_HIDDEN];
	for (int j = 0; j < MLP_HIDDEN; j++) {
		float s = b1[j];
		for (int k = 0; k < MLP_IN; k++)
			s += w1[j * MLP_IN + k] * x[k];
		h[j] = s > 0 ? s : 0;
	}
	__global float *y = out + r * MLP_OUT;
	for (int j = 0; j < MLP_OUT; j++) {
		float s = b2[j];
		for (int k = 0; k < MLP_HIDDEN; k++)
			s += w2[j * MLP_HIDDEN + k] * h[k];
		y[j] = s;
	}
}
