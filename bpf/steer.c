// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* steer is the DPU's packet classifier: one parser and one rule lookup
 * (include/parse.h, include/rules.h) behind an XDP program and TC programs,
 * so traffic is steered the same way whether it arrives as an xdp_buff or,
 * host-originated or on a device without XDP, as an skb. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "include/parse.h"
#include "include/rules.h"

/* Lovelock UDP port; set from Go before load. */
volatile const __u16 ll_port = LL_DEFAULT_PORT;


/* AF_XDP sockets for the xsk:<queue> action. An AF_XDP socket is bound to
 * one queue of one interface and the kernel delivers to it only packets
 * that arrived there, so sockets are found by (ifindex, queue): xsk_slots
 * maps that pair to a slot of xsks. */
#define MAX_XSK_SLOTS 256

/* A slot in xsk_slots with this bit set holds a socket bound with
 * XDP_USE_SG, which takes multi-buffer frames (one frame in several UMEM
 * frames); the bit is not part of the slot number. */
#define XSK_SLOT_SG (1u << 31)

struct xsk_key {
	__u32 ifindex;
	__u32 queue;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct xsk_key);
	__type(value, __u32);
	__uint(max_entries, MAX_XSK_SLOTS);
} xsk_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, MAX_XSK_SLOTS);
} xsks SEC(".maps");

/* Indices of the per-CPU stats array. */
enum steer_stat {
	STAT_RX = 0,        /* every packet seen */
	STAT_LOVELOCK = 1,  /* valid Lovelock packets */
	STAT_MALFORMED = 2, /* malformed headers: the default action, but a bad Lovelock header alone is classified (bad_ll) */
	STAT_NO_RULE = 3,   /* classified (well-formed, or bad_ll), matched no rule (default action) */
	STAT_PASS = 4,      /* verdicts, as carried out */
	STAT_DROP = 5,
	STAT_REDIRECT = 6,
	STAT_XSK = 7,
	STAT_XSK_TC = 8,    /* xsk verdicts on a TC hook, passed instead */
	STAT_XSK_MISS = 9,  /* xsk verdicts with no socket on the arrival queue (none registered, or its socket gone), or multi-buffer, passed instead */
	STAT_MAX,
};

struct counter {
	__u64 packets;
	__u64 bytes;
};

/* Types bpf2go generates for Go (-type in bpf/bpf.go) that no map names:
 * the rule table's entry type, used only behind the inner map's sizes, and
 * the enums whose values Go uses (counter indices, actions, the rule set's
 * limits), so Go never copies them by hand. The cilium/ebpf idiom: an
 * unused pointer puts a type into BTF (clang emits no enum that no object
 * uses); each costs 8 bytes of .bss and no instruction. */
const struct rule_entry *unused_rule_entry __attribute__((unused));
const enum steer_stat *unused_steer_stat __attribute__((unused));
const enum action *unused_action __attribute__((unused));
const enum rule_limits *unused_rule_limits __attribute__((unused));
const enum iface_limits *unused_iface_limits __attribute__((unused));
const enum shape_flags *unused_shape_flags __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct counter);
	__uint(max_entries, STAT_MAX);
} steer_stats SEC(".maps");

/* Per-interface counters: the steer_stats set again, per slot of the
 * interface the hook ran on (XDP and TC ingress: the arrival interface; TC
 * egress: the one the packet leaves by), the same ifindex the flow key
 * carries. Slot i counts ifindex i for 1 <= i < IFACE_OTHER; every ifindex
 * from IFACE_OTHER up shares slot IFACE_OTHER ("other"), so no packet goes
 * uncounted. An array rather than a hash map: its lookup is inlined (one
 * per packet, the counters then updated through the pointer), where a hash
 * lookup is kernel calls and a jhash. An enum so that bpf2go generates it
 * for Go (-type iface_limits). */
enum iface_limits {
	IFACE_SLOTS = 1024,             /* slots of iface_stats */
	IFACE_OTHER = IFACE_SLOTS - 1,  /* the slot of ifindexes >= IFACE_OTHER */
};

struct iface_counters {
	struct counter c[STAT_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct iface_counters);
	__uint(max_entries, IFACE_SLOTS);
} iface_stats SEC(".maps");

/* Per-rule counters, by rule ID; ID 0 counts default verdicts. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct counter);
	__uint(max_entries, MAX_RULES);
} rule_stats SEC(".maps");

static __always_inline void count(void *map, __u32 idx, __u64 bytes)
{
	struct counter *c = bpf_map_lookup_elem(map, &idx);

	if (c) {
		c->packets++;
		c->bytes += bytes;
	}
}

/* iface_counters returns this CPU's counters of interface ifindex. */
static __always_inline struct iface_counters *iface_counters(__u32 ifindex)
{
	__u32 slot = ifindex < IFACE_OTHER ? ifindex : IFACE_OTHER;

	return bpf_map_lookup_elem(&iface_stats, &slot);
}

/* count_stat counts a packet of bytes under the verdict counter idx (a
 * constant at every call, so ic->c[idx] is a fixed offset), globally and
 * for its interface ic (NULL: only globally). */
static __always_inline void count_stat(struct iface_counters *ic, __u32 idx, __u64 bytes)
{
	count(&steer_stats, idx, bytes);
	if (ic) {
		ic->c[idx].packets++;
		ic->c[idx].bytes += bytes;
	}
}

/* parse parses the packet of len bytes whose linear part is data..data_end
 * into m and returns its status; *need is cursor.need (a header ends past
 * the linear part). gso_size: skb->gso_size, not 0 for a GSO super-packet
 * (parse_packet). */
static __always_inline enum ll_status parse(void *data, void *data_end, __u32 len, __u32 ifindex,
					    __u32 gso_size, struct pkt_meta *m, __u32 *need)
{
	struct cursor c = { .pos = data, .end = data_end, .len = len };
	enum ll_status st;

	__builtin_memset(m, 0, sizeof(*m));
	m->key.ifindex = ifindex;
	st = parse_packet(&c, ll_port, m, gso_size);
	*need = c.need;
	return st;
}

/* What a parse leaves for the program that asked for it: the packet's
 * metadata and cursor.need. */
struct parse_result {
	struct pkt_meta m;
	__u32 need;
};

/* Slots of parse_results, one per kind of hook, so a program of one kind
 * never reads a result the other wrote. */
enum parse_slot {
	PARSE_XDP = 0,
	PARSE_TC = 1,
	PARSE_SLOTS,
};

/* Where parse_xdp and parse_skb leave their results (this CPU's slot). A
 * map value and not the caller's stack: 6.1's verifier does not mark a
 * caller's stack as written by a global function it calls, and goes on
 * taking it to hold what it held before the call (zeroes: the caller must
 * pass initialised stack), so it would prune, and on a privileged load
 * remove, branches on that belief. It assumes nothing of what a map value
 * holds. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct parse_result);
	__uint(max_entries, PARSE_SLOTS);
} parse_results SEC(".maps");

/* parse_xdp and parse_skb parse the packet of their context into r and
 * return its status. Global functions (not static, not inlined): the
 * verifier checks each once, on its own, instead of walking every path of
 * the classifier after every path through the parser (r and the status
 * are unknown to it after the call, so it walks the classifier once). That
 * keeps the steering programs within 6.1's limit of a million verified
 * instructions: inline, 6.1 passed it, and 6.18 verified 690,000 of each;
 * now 215,000 to 320,000 (docs/image.md). r is never NULL: the callers
 * pass their parse_results slot. */
__attribute__((noinline)) int parse_xdp(struct xdp_md *ctx, struct parse_result *r)
{
	if (!r)
		return LL_TRUNCATED;
	return parse((void *)(long)ctx->data, (void *)(long)ctx->data_end, bpf_xdp_get_buff_len(ctx),
		     ctx->ingress_ifindex, 0, &r->m, &r->need);
}

__attribute__((noinline)) int parse_skb(struct __sk_buff *skb, struct parse_result *r)
{
	if (!r)
		return LL_TRUNCATED;
	return parse((void *)(long)skb->data, (void *)(long)skb->data_end, skb->len, skb->ifindex,
		     skb->gso_size, &r->m, &r->need);
}

/* steer classifies a packet of len bytes that parse left in m with status
 * st, and counts it (under interface ic too); v holds the verdict. */
static __always_inline void steer(struct iface_counters *ic, struct pkt_meta *m, enum ll_status st, __u32 len,
				  struct verdict *v)
{
	int malformed = ll_malformed(st);
	/* UDP to the Lovelock port whose Lovelock header alone is bad
	 * (pkt_meta.bad_ll) is malformed as Lovelock, but its L3/L4 headers
	 * are valid, and it may be another protocol's datagram that uses the
	 * port (a reply to a host whose ephemeral port is 61440): rules on
	 * addresses, ports and protocol apply to it, so a forwarding DPU does
	 * not black-hole it with the default. Only other malformed packets
	 * go unclassified. */
	int unclassified = malformed && !m->bad_ll;

	if (malformed) {
		/* Fields of a malformed packet are not trusted, beyond the
		 * L3/L4 ones of a bad Lovelock header, which rules on Lovelock
		 * fields must not match (SHAPE_LOVELOCK). */
		if (unclassified)
			__builtin_memset(&m->key, 0, sizeof(m->key));
		count_stat(ic, STAT_MALFORMED, len);
	} else if (st == LL_OK) {
		count_stat(ic, STAT_LOVELOCK, len);
	}
	count_stat(ic, STAT_RX, len);
	if (m->bad_ll)
		m->key.pad = SHAPE_LOVELOCK;

	v->id = 0;
	v->action = ACT_PASS;
	v->arg = 0;
	classify(&m->key, unclassified, v);
	/* unclassified, not malformed, is what stays live across classify:
	 * it is 0 for every packet that reaches the lookup, so the verifier's
	 * walks of the lookup for bad Lovelock headers can prune against the
	 * others' (with malformed, xdp_steer passed the verifier's limit of a
	 * million instructions). A bad Lovelock header that matches no rule
	 * thus counts as no_rule as well as malformed. */
	if (v->id == 0 && !unclassified)
		count_stat(ic, STAT_NO_RULE, len);
	count(&rule_stats, v->id, len);
}

/* xdp.frags: the program takes multi-buffer frames, which lets an interface
 * with XDP attached run an MTU above a page (jumbo frames; drivers refuse
 * that to programs without it). Headers are parsed from the first buffer. */
SEC("xdp.frags")
int xdp_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	__u64 len = bpf_xdp_get_buff_len(ctx);
	struct iface_counters *ic = iface_counters(ctx->ingress_ifindex);
	__u32 slot = PARSE_XDP;
	struct parse_result *r = bpf_map_lookup_elem(&parse_results, &slot);
	struct verdict v;

	/* Never NULL (a per-CPU array's slot below its size), but the
	 * verifier asks. */
	if (!r)
		return XDP_PASS;
	steer(ic, &r->m, parse_xdp(ctx, r), len, &v);
	switch (v.action) {
	case ACT_DROP:
		count_stat(ic, STAT_DROP, len);
		return XDP_DROP;
	case ACT_REDIRECT:
		count_stat(ic, STAT_REDIRECT, len);
		return bpf_redirect(v.arg, 0);
	case ACT_XSK:
		/* A multi-buffer frame needs a socket bound with XDP_USE_SG
		 * (XSK_SLOT_SG); the kernel drops it at any other, so there it
		 * goes to the stack. The headers were parsed from the first
		 * buffer, which holds them whole (parse needs them there). */
		if (ctx->rx_queue_index == v.arg) {
			struct xsk_key k = { .ifindex = ctx->ingress_ifindex, .queue = ctx->rx_queue_index };
			__u32 *slot = bpf_map_lookup_elem(&xsk_slots, &k);

			/* The slot may have outlived its socket: the kernel
			 * removes a closed socket from xsks, not its xsk_slots
			 * entry (lovelockd died). The redirect then falls back
			 * to XDP_PASS, a miss. */
			if (slot && (len == (__u64)(data_end - data) || (*slot & XSK_SLOT_SG)) &&
			    bpf_redirect_map(&xsks, *slot & ~XSK_SLOT_SG, XDP_PASS) == XDP_REDIRECT) {
				count_stat(ic, STAT_XSK, len);
				return XDP_REDIRECT;
			}
		}
		/* No socket for the queue the packet arrived on (the kernel could
		 * not deliver it to another queue's socket), a slot whose socket
		 * is gone, or a multi-buffer frame for a socket without
		 * XDP_USE_SG: the stack gets it, nothing is lost. */
		count_stat(ic, STAT_XSK_MISS, len);
		break;
	}
	count_stat(ic, STAT_PASS, len);
	return XDP_PASS;
}

/* Bytes pulled past the header that did not fit, on a first retry: the
 * rest of the headers of all but IPv6 packets with long extension headers. */
#define TC_PULL_AHEAD 128

static __always_inline int tc_steer(struct __sk_buff *skb)
{
	/* A host's own TSO/GSO traffic on egress, and GRO'd traffic on
	 * ingress, arrives as one super-packet whose lengths may be 0 (BIG
	 * TCP, UDP tunnels). A UDP GSO run, datagrams of gso_size payload
	 * bytes each with its own Lovelock header, arrives as one datagram
	 * whose UDP length is the whole run's (parse_packet; parse_skb passes
	 * skb->gso_size). */
	__u32 slot = PARSE_TC;
	struct parse_result *r = bpf_map_lookup_elem(&parse_results, &slot);
	struct iface_counters *ic;
	struct verdict v;
	enum ll_status st;
	__u32 need, want, try;

	if (!r) /* never (see xdp_steer) */
		return TC_ACT_OK;

	/* Parse from linear data, pulling in only header bytes: most skbs
	 * have their headers linear already, and pulling a whole GSO
	 * super-packet (skb->len, up to 64 KiB or more under BIG TCP) would
	 * copy its payload into one buffer. When a header ends past the
	 * linear part (cursor.need), pull up to it and TC_PULL_AHEAD beyond,
	 * parse again, and if that is still short pull all a parse can reach
	 * (LL_MAX_HDR_BYTES) for a last parse, which then sees what a parse of
	 * the whole packet would. A failed pull leaves the packet TRUNCATED. */
#pragma clang loop unroll(disable)
	for (try = 0;; try++) {
		st = parse_skb(skb, r);
		need = r->need;
		if (st != LL_TRUNCATED || !need || try == 2)
			break;
		want = try == 0 ? need + TC_PULL_AHEAD : LL_MAX_HDR_BYTES;
		if (want > skb->len)
			want = skb->len;
		if (bpf_skb_pull_data(skb, want))
			break;
	}
	/* skb->ifindex: on ingress the arrival interface, on egress the one
	 * the packet leaves by (the interface the hook is attached to). */
	ic = iface_counters(skb->ifindex);
	steer(ic, &r->m, st, skb->len, &v);
	switch (v.action) {
	case ACT_DROP:
		count_stat(ic, STAT_DROP, skb->len);
		return TC_ACT_SHOT;
	case ACT_REDIRECT:
		count_stat(ic, STAT_REDIRECT, skb->len);
		return bpf_redirect(v.arg, 0);
	case ACT_XSK:
		/* AF_XDP sockets are reachable from XDP only. */
		count_stat(ic, STAT_XSK_TC, skb->len);
		break;
	}
	count_stat(ic, STAT_PASS, skb->len);
	return TC_ACT_OK;
}

SEC("tc")
int tc_ingress(struct __sk_buff *skb)
{
	return tc_steer(skb);
}

SEC("tc")
int tc_egress(struct __sk_buff *skb)
{
	return tc_steer(skb);
}

/* xdp_pass lets veth deliver XDP_REDIRECTed frames: a veth only takes them
 * when the program on its peer exists. Attach it to the peers of redirect
 * targets that run no steering program. */
SEC("xdp.frags")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
