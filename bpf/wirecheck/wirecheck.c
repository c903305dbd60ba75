// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* wirecheck parses one packet with the data plane's parser and stores what it
 * found, so tests can hold the C parser against dataplane/wire through
 * BPF_PROG_TEST_RUN. It never forwards traffic, and only tests import its Go
 * package (bpf/wirecheck), so shipped binaries do not carry it. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "include/parse.h" /* -I.. */

/* Lovelock UDP port; set from Go before load. */
volatile const __u16 ll_port = LL_DEFAULT_PORT;

struct wire_result {
	enum ll_status status; /* an enum, so bpf2go generates it for Go */
	__u32 offset; /* byte offset of the Lovelock header in the frame */
	struct ll_hdr hdr;
	struct flow_key key;
	__u32 bad_ll; /* pkt_meta.bad_ll */
};

_Static_assert(sizeof(enum ll_status) == 4, "Go reads status as a u32");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct wire_result);
	__uint(max_entries, 1);
} wire_out SEC(".maps");

/* check parses the packet in data..data_end (the whole packet) and stores
 * the result; gso_size as parse_packet takes it. */
static __always_inline int check(void *data, void *data_end, __u32 gso_size)
{
	struct cursor c = {
		.pos = data,
		.end = data_end,
		.len = data_end - data,
	};
	struct pkt_meta m = {};
	__u32 key = 0;
	struct wire_result *res = bpf_map_lookup_elem(&wire_out, &key);

	if (!res)
		return -1;
	__builtin_memset(res, 0, sizeof(*res));
	res->status = parse_packet(&c, ll_port, &m, gso_size);
	res->key = m.key;
	res->bad_ll = m.bad_ll;
	if (res->status == LL_OK) {
		__u32 off = m.ll_off;
		void *ll;

		/* Bound the offset so the verifier can check the access. */
		if (off > 4096)
			return -1;
		ll = data + off;
		res->offset = off;
		if (ll + sizeof(res->hdr) <= data_end)
			__builtin_memcpy(&res->hdr, ll, sizeof(res->hdr));
	}
	return 0;
}

SEC("xdp")
int wire_check(struct xdp_md *ctx)
{
	if (check((void *)(long)ctx->data, (void *)(long)ctx->data_end, 0))
		return XDP_ABORTED;
	return XDP_PASS;
}

/* wire_check_skb is wire_check as a TC hook sees a packet: the test sets
 * gso_size in the context to make the packet a GSO super-packet of that
 * segment size. The test run's skb is linear. */
SEC("tc")
int wire_check_skb(struct __sk_buff *skb)
{
	if (check((void *)(long)skb->data, (void *)(long)skb->data_end, skb->gso_size))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char __license[] SEC("license") = "Dual BSD/GPL";
