// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* steer is the DPU's packet classifier. This first version parses every frame
 * up to the Lovelock header and counts what it saw; every frame is passed to
 * the kernel. The rule engine and the other verdicts build on it. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "include/parse.h"

/* Lovelock UDP port; set from Go before load. */
volatile const __u16 ll_port = LL_DEFAULT_PORT;

/* Indices of the per-CPU stats array. */
enum steer_stat {
	STAT_RX = 0,        /* every frame seen */
	STAT_LOVELOCK = 1,  /* valid Lovelock packets */
	STAT_OTHER = 2,     /* well-formed non-Lovelock traffic */
	STAT_MALFORMED = 3, /* truncated or invalid headers */
	STAT_MAX,
};

struct stat_counter {
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct stat_counter);
	__uint(max_entries, STAT_MAX);
} steer_stats SEC(".maps");

static __always_inline void count(__u32 idx, __u64 bytes)
{
	struct stat_counter *s = bpf_map_lookup_elem(&steer_stats, &idx);

	if (s) {
		s->packets++;
		s->bytes += bytes;
	}
}

SEC("xdp")
int xdp_steer(struct xdp_md *ctx)
{
	struct cursor c = {
		.pos = (void *)(long)ctx->data,
		.end = (void *)(long)ctx->data_end,
	};
	__u64 len = ctx->data_end - ctx->data;
	struct ll_hdr *ll = NULL;

	count(STAT_RX, len);
	switch (parse_to_ll(&c, ll_port, &ll)) {
	case LL_OK:
		count(STAT_LOVELOCK, len);
		break;
	case LL_NOT_LOVELOCK:
		count(STAT_OTHER, len);
		break;
	default:
		count(STAT_MALFORMED, len);
	}
	return XDP_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
