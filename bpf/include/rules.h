/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The compiled rule set and its tuple-space lookup.
 *
 * A rule set is one hash map (struct rule_key -> struct rule_val). Rules are
 * grouped by mask shape: which fields they match and how many prefix bits.
 * A packet's flow key is masked once per shape and looked up once per shape,
 * so lookup cost grows with the number of shapes (at most MAX_SHAPES), never
 * with the number of rules. The shapes and the set's defaults live in the
 * same map under the reserved shape id META_SHAPE, so one map is one
 * consistent rule set. The data plane reaches the current set through a
 * one-slot array of maps: replacing the slot swaps whole rule sets
 * atomically (the kernel waits for running programs before the syscall
 * returns), and a packet holds one set for its whole lookup. */
#ifndef LOVELOCK_RULES_H
#define LOVELOCK_RULES_H

#include "parse.h"

/* Distinct mask shapes a rule set may use. Each costs one hash lookup. */
#define MAX_SHAPES 32
/* Rule IDs are 1..MAX_RULES-1; ID 0 counts packets no rule matched. */
#define MAX_RULES 65536
/* Entries of one rule set: rules expand to several entries when a rank range
 * is split into prefixes, plus the META entries. */
#define MAX_RULE_ENTRIES 262144

#define META_SHAPE 0xffffffff
/* flow.ifindex of the META entry holding struct ruleset_hdr. */
#define META_HDR 0xffffffff

/* struct shape.fields: exact-match fields. */
#define F_IFINDEX (1 << 0)
#define F_FAMILY (1 << 1)
#define F_PROTO (1 << 2)
#define F_LL_TYPE (1 << 3)
#define F_SPORT (1 << 4)
#define F_DPORT (1 << 5)
#define F_TENANT (1 << 6)

enum action {
	ACT_PASS = 0,     /* to the kernel stack */
	ACT_DROP = 1,     /* nowhere */
	ACT_REDIRECT = 2, /* out of interface arg, no copy to userspace */
	ACT_XSK = 3,      /* to the AF_XDP socket in xsks[arg] (XDP only; TC passes) */
};

struct rule_key {
	__u32 shape;    /* index of the shape, or META_SHAPE */
	struct flow_key flow;
};

struct rule_val {
	__u32 prio;     /* higher wins */
	__u32 id;       /* rule ID: index of its counters */
	__u16 action;   /* enum action */
	__u16 pad;
	__u32 arg;      /* ifindex for ACT_REDIRECT, queue for ACT_XSK */
};

/* Value of META entry i < nshapes. Shapes are stored by descending
 * max_prio, so a lookup stops once no later shape can win. */
struct shape {
	__u8 fields;    /* F_* bits */
	__u8 src_len;   /* source prefix bits kept (0..32 for IPv4, 0..128 for IPv6) */
	__u8 dst_len;   /* destination prefix bits kept */
	__u8 rank_len;  /* high bits of the Lovelock rank kept (0..32) */
	__u32 max_prio; /* highest priority among the shape's rules */
	__u32 pad[2];
};

/* Value of the META_HDR entry. */
struct ruleset_hdr {
	__u32 nshapes;
	__u32 default_id; /* always 0 today: the "no rule" counters */
	__u16 default_action;
	__u16 pad;
	__u32 default_arg;
};

_Static_assert(sizeof(struct rule_val) == sizeof(struct shape), "META values share rule_val's size");
_Static_assert(sizeof(struct rule_val) == sizeof(struct ruleset_hdr), "META values share rule_val's size");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_HASH);
		/* Sizes, not __type: clang 14 emits only forward declarations for
		 * types two pointers deep, which loaders cannot size. */
		__uint(key_size, sizeof(struct rule_key));
		__uint(value_size, sizeof(struct rule_val));
		__uint(max_entries, MAX_RULE_ENTRIES);
		__uint(map_flags, BPF_F_NO_PREALLOC);
	});
} rulesets SEC(".maps");

static __always_inline __u32 prefix_mask(int bits)
{
	if (bits <= 0)
		return 0;
	if (bits >= 32)
		return 0xffffffff;
	return bpf_htonl(0xffffffff << (32 - bits));
}

static __always_inline void mask_addr(__u8 *dst, const __u8 *src, int len)
{
	__u32 w[4];

	__builtin_memcpy(w, src, 16);
	w[0] &= prefix_mask(len);
	w[1] &= prefix_mask(len - 32);
	w[2] &= prefix_mask(len - 64);
	w[3] &= prefix_mask(len - 96);
	__builtin_memcpy(dst, w, 16);
}

/* Builds the key of flow under shape sh into k. */
static __always_inline void mask_flow(struct rule_key *k, const struct flow_key *f,
				      const struct shape *sh, __u32 idx)
{
	__u8 fl = sh->fields;

	__builtin_memset(k, 0, sizeof(*k));
	k->shape = idx;
	if (fl & F_IFINDEX)
		k->flow.ifindex = f->ifindex;
	if (fl & F_FAMILY)
		k->flow.family = f->family;
	if (fl & F_PROTO)
		k->flow.proto = f->proto;
	if (fl & F_LL_TYPE)
		k->flow.ll_type = f->ll_type;
	if (fl & F_SPORT)
		k->flow.sport = f->sport;
	if (fl & F_DPORT)
		k->flow.dport = f->dport;
	if (fl & F_TENANT)
		k->flow.tenant = f->tenant;
	if (sh->src_len)
		mask_addr(k->flow.src, f->src, sh->src_len);
	if (sh->dst_len)
		mask_addr(k->flow.dst, f->dst, sh->dst_len);
	if (sh->rank_len)
		k->flow.rank = f->rank & (sh->rank_len >= 32 ? 0xffffffff : ~(0xffffffff >> sh->rank_len));
}

struct verdict {
	__u32 id;     /* matching rule, 0 for none */
	__u16 action;
	__u32 arg;
};

struct lookup_ctx {
	void *rs;                  /* the rule set, fixed for the whole lookup */
	const struct flow_key *f;
	struct rule_key k;
	__u32 nshapes;
	__u32 found;
	struct rule_val best;
};

/* One shape of the lookup, as a bpf_loop callback: the verifier checks it
 * once instead of once per unrolled iteration. Returns 1 to stop. */
static long lookup_shape(__u32 i, void *data)
{
	struct lookup_ctx *lc = data;
	struct shape *sh;
	struct rule_val *r;

	if (i >= lc->nshapes)
		return 1;
	__builtin_memset(&lc->k, 0, sizeof(lc->k));
	lc->k.shape = META_SHAPE;
	lc->k.flow.ifindex = i;
	sh = bpf_map_lookup_elem(lc->rs, &lc->k);
	if (!sh)
		return 1;
	/* Shapes come by descending max_prio: none later can win. */
	if (lc->found && sh->max_prio <= lc->best.prio)
		return 1;
	mask_flow(&lc->k, lc->f, sh, i);
	r = bpf_map_lookup_elem(lc->rs, &lc->k);
	if (r && (!lc->found || r->prio > lc->best.prio)) {
		lc->best = *r;
		lc->found = 1;
	}
	return 0;
}

/* classify finds the highest-priority rule matching f. Malformed packets and
 * packets no rule matches get the set's default action. Returns 0 when no
 * rule set is installed (v is left as it was). */
static __always_inline int classify(const struct flow_key *f, int malformed, struct verdict *v)
{
	__u32 zero = 0;
	struct lookup_ctx lc = {};
	struct ruleset_hdr *hdr;

	lc.rs = bpf_map_lookup_elem(&rulesets, &zero);
	if (!lc.rs)
		return 0;
	lc.k.shape = META_SHAPE;
	lc.k.flow.ifindex = META_HDR;
	hdr = bpf_map_lookup_elem(lc.rs, &lc.k);
	if (!hdr)
		return 0;
	v->id = hdr->default_id;
	v->action = hdr->default_action;
	v->arg = hdr->default_arg;
	if (malformed)
		return 1;

	lc.f = f;
	lc.nshapes = hdr->nshapes;
	bpf_loop(MAX_SHAPES, lookup_shape, &lc, 0);
	if (lc.found) {
		v->id = lc.best.id;
		v->action = lc.best.action;
		v->arg = lc.best.arg;
	}
	return 1;
}

#endif
