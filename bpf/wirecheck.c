// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* wirecheck parses one packet with the data plane's parser and stores what it
 * found, so tests can hold the C parser against dataplane/wire through
 * BPF_PROG_TEST_RUN. It never forwards traffic. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "include/parse.h"

/* Lovelock UDP port; set from Go before load. */
volatile const __u16 ll_port = LL_DEFAULT_PORT;

struct wire_result {
	__u32 status; /* enum ll_status */
	__u32 offset; /* byte offset of the Lovelock header in the frame */
	struct ll_hdr hdr;
	struct flow_key key;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct wire_result);
	__uint(max_entries, 1);
} wire_out SEC(".maps");

SEC("xdp")
int wire_check(struct xdp_md *ctx)
{
	struct cursor c = {
		.pos = (void *)(long)ctx->data,
		.end = (void *)(long)ctx->data_end,
		.len = ctx->data_end - ctx->data,
	};
	struct pkt_meta m = {};
	__u32 key = 0;
	struct wire_result *res = bpf_map_lookup_elem(&wire_out, &key);

	if (!res)
		return XDP_ABORTED;
	__builtin_memset(res, 0, sizeof(*res));
	res->status = parse_packet(&c, ll_port, &m);
	res->key = m.key;
	if (res->status == LL_OK) {
		__u32 off = m.ll_off;
		void *ll;

		/* Bound the offset so the verifier can check the access. */
		if (off > 4096)
			return XDP_ABORTED;
		ll = (void *)(long)ctx->data + off;
		res->offset = off;
		if (ll + sizeof(res->hdr) <= (void *)(long)ctx->data_end)
			__builtin_memcpy(&res->hdr, ll, sizeof(res->hdr));
	}
	return XDP_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
