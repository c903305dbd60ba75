/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The compiled rule set and its tuple-space lookup.
 *
 * A rule set is one hash map (struct rule_key -> struct rule_val) plus one
 * struct shapeset. Rules are grouped by mask shape: which fields they match
 * and how many prefix bits. A packet's flow key is masked once per shape and
 * looked up once per shape, so lookup cost grows with the number of shapes
 * (at most MAX_SHAPES), never with the number of rules.
 *
 * Atomic swaps: there are two slots, each a hash map (in the rulesets array
 * of maps) and the shapeset built for it (in shapesets), and active_set names
 * the live slot. A packet reads active_set once and uses that slot's map and
 * shapeset for its whole lookup. A swap fills the other slot, flips
 * active_set, then waits until every program that could still hold the old
 * slot has finished (an update of a map-in-map slot returns only after the
 * kernel waited for running programs), so a slot is never rewritten while a
 * packet uses it. */
#ifndef LOVELOCK_RULES_H
#define LOVELOCK_RULES_H

#include "parse.h"

/* Distinct mask shapes a rule set may use. Each costs one hash lookup. */
#define MAX_SHAPES 32
/* Rule IDs are 1..MAX_RULES-1; ID 0 counts packets no rule matched. */
#define MAX_RULES 65536
/* Entries of one rule set: rules expand to several entries when a rank range
 * is split into prefixes. */
#define MAX_RULE_ENTRIES 262144


enum action {
	ACT_PASS = 0,     /* to the kernel stack */
	ACT_DROP = 1,     /* nowhere */
	ACT_REDIRECT = 2, /* out of interface arg, no copy to userspace */
	ACT_XSK = 3,      /* to the AF_XDP socket in xsks[arg] (XDP only; TC passes) */
};

struct rule_key {
	__u32 shape;    /* index of the shape */
	struct flow_key flow;
};

struct rule_val {
	__u32 prio;     /* higher wins */
	__u32 id;       /* rule ID: index of its counters */
	__u16 action;   /* enum action */
	__u16 pad;
	__u32 arg;      /* ifindex for ACT_REDIRECT, queue for ACT_XSK */
};

/* A mask shape: a packet's flow key ANDed with mask is looked up under the
 * shape's index. Userspace computes the masks (all-ones for exact fields,
 * prefix bits for addresses and ranks), so masking here is branch-free. */
struct shape {
	struct flow_key mask;
	__u32 max_prio; /* highest priority among the shape's rules */
};

/* The shapes of a rule set, by descending max_prio (so a lookup stops once
 * no later shape can win), and its default verdict. */
struct shapeset {
	__u32 nshapes;
	__u16 default_action;
	__u16 pad;
	__u32 default_arg;
	__u32 pad2;
	struct shape shapes[MAX_SHAPES];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct shapeset);
	__uint(max_entries, 2);
} shapesets SEC(".maps");

/* The live slot of rulesets and shapesets: 0 or 1. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} active_set SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 2);
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

/* Builds the key of flow f under shape sh (index idx) into k. */
static __always_inline void mask_flow(struct rule_key *k, const struct flow_key *f,
				      const struct shape *sh, __u32 idx)
{
	const __u32 *in = (const __u32 *)f, *m = (const __u32 *)&sh->mask;
	__u32 *out = (__u32 *)&k->flow;
	int w;

	k->shape = idx;
#pragma unroll
	for (w = 0; w < sizeof(struct flow_key) / 4; w++)
		out[w] = in[w] & m[w];
}

struct verdict {
	__u32 id;     /* matching rule, 0 for none */
	__u16 action;
	__u32 arg;
};

struct lookup_ctx {
	void *rs;                  /* the rule set, fixed for the whole lookup */
	struct shapeset *ss;       /* its shapes */
	const struct flow_key *f;
	struct rule_key k;
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

	__u64 idx = i;

	if (i >= lc->ss->nshapes)
		return 1;
	/* Bound the index in the register that indexes: clang otherwise checks
	 * one copy of i and indexes with another, which the verifier cannot
	 * follow. MAX_SHAPES is a power of two. */
	asm volatile("%0 &= %1" : "+r"(idx) : "i"(MAX_SHAPES - 1));
	sh = &lc->ss->shapes[idx];
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
	__u32 zero = 0, slot, *live;
	struct lookup_ctx lc = {};

	live = bpf_map_lookup_elem(&active_set, &zero);
	if (!live)
		return 0;
	slot = *live & 1;
	lc.rs = bpf_map_lookup_elem(&rulesets, &slot);
	if (!lc.rs)
		return 0;
	lc.ss = bpf_map_lookup_elem(&shapesets, &slot);
	if (!lc.ss)
		return 0;
	v->id = 0;
	v->action = lc.ss->default_action;
	v->arg = lc.ss->default_arg;
	if (malformed)
		return 1;

	lc.f = f;
	/* A no-op on the value (a byte-swapped 0 is 0), for older verifiers:
	 * 6.1's (upstream fixed it in 6.7) checks a bpf_loop callback once,
	 * from this state, as if it ran one time. Knowing found == 0 there, it
	 * takes lookup_shape's code for found != 0 (the priority comparisons)
	 * for dead and removes it, and the last matching shape, not the
	 * highest-priority one, would win. It does not follow a byte swap
	 * (BPF_END), so after this it cannot know found and keeps both ways. */
	asm volatile("%0 = be32 %0" : "+r"(lc.found));
	bpf_loop(MAX_SHAPES, lookup_shape, &lc, 0);
	if (lc.found) {
		v->id = lc.best.id;
		v->action = lc.best.action;
		v->arg = lc.best.arg;
	}
	return 1;
}

#endif
