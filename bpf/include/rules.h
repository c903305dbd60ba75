/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The compiled rule set and its tuple-space lookup.
 *
 * Rules are grouped by mask shape: which fields they match and how many
 * prefix bits. A packet's flow key is masked once per shape and looked up
 * once per shape, so lookup cost grows with the number of shapes (at most
 * MAX_SHAPES), never with the number of rules.
 *
 * The entries of all shapes live in one open-addressed hash table: an array
 * of RULE_TABLE_SIZE struct rule_entry, filled by userspace (bpf/ruleset.go)
 * with Robin Hood linear probing: every entry sits at most MAX_PROBE - 1
 * slots after the slot its hash names (its home), with no empty slot and no
 * entry nearer its own home in between. A lookup hashes the masked key (a
 * multiply per 8-byte word) and compares entries from the home slot on,
 * stopping at an empty slot or an entry nearer its home than the key would
 * be: about one compare per shape for a miss. Why
 * not a kernel hash map: an array lookup is inlined into the program, where
 * a hash map lookup costs three kernel function calls and a jhash of the
 * whole key, about 4x the time per shape (docs/steering.md, "Cost").
 *
 * Atomic swaps: there are two slots, each a table (in the rulesets array of
 * maps) and the shapeset built for it (in shapesets), and active_set names
 * the live slot. A packet reads active_set once and uses that slot's table
 * and shapeset for its whole lookup. A swap fills the other slot, flips
 * active_set, then waits until every program that could still hold the old
 * slot has finished (an update of a map-in-map slot returns only after the
 * kernel waited for running programs), so a slot is never rewritten while a
 * packet uses it. */
#ifndef LOVELOCK_RULES_H
#define LOVELOCK_RULES_H

#include "parse.h"

/* The rule set's limits and the table's geometry: an enum rather than
 * #defines so that bpf2go generates them for Go (-type rule_limits), where
 * bpf/contract.go holds the package's constants to them at compile time. */
enum rule_limits {
	/* Distinct mask shapes a rule set may use. Each costs one table lookup. */
	MAX_SHAPES = 32,
	/* Rule IDs are 1..MAX_RULES-1; ID 0 counts packets no rule matched. */
	MAX_RULES = 65536,
	/* Slots of a rule table: 1 << RULE_TABLE_BITS (RULE_TABLE_SIZE), and
	 * the entries it may hold: at most half full (MAX_RULE_ENTRIES), so
	 * that probe sequences stay short. Rules expand to several entries
	 * when a rank range is split into prefixes. */
	RULE_TABLE_BITS = 18,
	/* Slots a lookup compares per shape; userspace places every entry
	 * within. */
	MAX_PROBE = 16,
	/* A flow key as 8-byte words: six whole words and the rank, alone in
	 * the low half of the seventh. */
	KEY_WORDS = 7,
};
#define RULE_TABLE_SIZE (1u << RULE_TABLE_BITS)
#define MAX_RULE_ENTRIES (RULE_TABLE_SIZE / 2)
/* The hash: h = (h ^ word) * RULE_HASH_MUL over the key's words, starting
 * from the shapeset's seed; the top RULE_TABLE_BITS bits name the slot. */
#define RULE_HASH_MUL 0x9E3779B97F4A7C15ULL

enum action {
	ACT_PASS = 0,     /* to the kernel stack */
	ACT_DROP = 1,     /* nowhere */
	ACT_REDIRECT = 2, /* out of interface arg, no copy to userspace */
	ACT_XSK = 3,      /* to the AF_XDP socket in xsks[arg] (XDP only; TC passes) */
};

/* One slot of a rule table: a masked flow key whose pad byte holds its
 * shape's index + 1 (0 marks an empty slot), and its rule's verdict. */
struct rule_entry {
	struct flow_key key;
	__u8 action;    /* enum action */
	__u8 probe;     /* slots after its home slot (< MAX_PROBE) */
	__u16 id;       /* rule ID: index of its counters */
	__u32 prio;     /* higher wins */
	__u32 arg;      /* ifindex for ACT_REDIRECT, queue for ACT_XSK */
};

_Static_assert(sizeof(struct flow_key) == 52, "a flow key is six and a half 8-byte words");
_Static_assert(sizeof(struct rule_entry) == 64, "a rule entry is one cache line");

/* Flags of a shape, in its mask's pad byte. An enum so that bpf2go
 * generates it for Go (-type shape_flags). */
enum shape_flags {
	/* The shape's rules match Lovelock fields (type, tenant, rank), so
	 * valid Lovelock packets only. A packet whose Lovelock header failed
	 * its checks (pkt_meta.bad_ll) is classified on its L3/L4 fields, and
	 * its key holds zeros in the Lovelock ones, which a tenant 0 or rank 0
	 * rule would match: steer() sets this bit in its key's pad byte too.
	 * Masked by such a shape, the bit lands in the shape tag beside the
	 * shape's index + 1 (at most MAX_SHAPES, so bit 7 is free), and no
	 * entry's tag has it: no match, at no cost for other packets and
	 * without a branch per shape. Other shapes mask it out. */
	SHAPE_LOVELOCK = 0x80,
};

/* A mask shape: a packet's flow key ANDed with mask is looked up under the
 * shape's index. Userspace computes the masks (all-ones for exact fields,
 * prefix bits for addresses and ranks), so masking here is branch-free.
 * mask.pad holds the shape's flags (enum shape_flags). max_prio follows
 * mask so that the two read as KEY_WORDS words whose last one has the
 * rank's mask in its low half. */
struct shape {
	struct flow_key mask;
	__u32 max_prio; /* highest priority among the shape's rules */
};

/* The shapes of a rule set, by descending max_prio (so a lookup stops once
 * no later shape can win), its default verdict and its table's hash seed. */
struct shapeset {
	__u32 nshapes;
	__u16 default_action;
	__u16 pad;
	__u32 default_arg;
	__u32 pad2;
	__u64 seed;
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
		__uint(type, BPF_MAP_TYPE_ARRAY);
		/* Sizes, not __type: clang 14 emits only forward declarations for
		 * types two pointers deep, which loaders cannot size. */
		__uint(key_size, sizeof(__u32));
		__uint(value_size, sizeof(struct rule_entry));
		__uint(max_entries, RULE_TABLE_SIZE);
	});
} rulesets SEC(".maps");

struct verdict {
	__u32 id;     /* matching rule, 0 for none */
	__u16 action;
	__u32 arg;
};

/* lookup_shape looks the flow key f (as words) up under shape idx of ss in
 * table and returns the matching entry, or NULL. */
static __always_inline struct rule_entry *lookup_shape(void *table, const struct shapeset *ss,
						       const __u64 *f, __u32 idx)
{
	const __u64 *mask;
	__u64 k[KEY_WORDS], h = ss->seed;
	__u64 i = idx;
	__u32 home, p;
	int w;

	/* Bound the index in the register that indexes: clang otherwise checks
	 * one copy and indexes with another, which the verifier cannot follow.
	 * MAX_SHAPES is a power of two. */
	asm volatile("%0 &= %1" : "+r"(i) : "i"(MAX_SHAPES - 1));
	mask = (const __u64 *)&ss->shapes[i];
#pragma unroll
	for (w = 0; w < KEY_WORDS; w++)
		k[w] = f[w] & mask[w];
	/* The rank's word: drop max_prio, which shares it with the rank mask. */
	k[KEY_WORDS - 1] &= 0xffffffff;
	/* The shape tag, in the key's pad byte (the top byte of word 0). */
	k[0] |= (__u64)(idx + 1) << 56;
#pragma unroll
	for (w = 0; w < KEY_WORDS; w++)
		h = (h ^ k[w]) * RULE_HASH_MUL;
	home = h >> (64 - RULE_TABLE_BITS);

	for (p = 0; p < MAX_PROBE; p++) {
		__u32 slot = (home + p) & (RULE_TABLE_SIZE - 1);
		struct rule_entry *e = bpf_map_lookup_elem(table, &slot);
		const __u64 *ew = (const __u64 *)e;
		__u64 diff;

		/* An empty slot ends every probe sequence through it, and Robin
		 * Hood placement puts no entry behind one closer to its home. */
		if (!e || !e->key.pad || e->probe < p)
			return NULL;
		/* Branch-free compare; the last word's high half is the verdict. */
		diff = (ew[KEY_WORDS - 1] ^ k[KEY_WORDS - 1]) & 0xffffffff;
#pragma unroll
		for (w = 0; w < KEY_WORDS - 1; w++)
			diff |= ew[w] ^ k[w];
		if (!diff)
			return e;
	}
	return NULL;
}

/* classify finds the highest-priority rule matching f. Malformed packets and
 * packets no rule matches get the set's default action. f's pad byte is 0,
 * or SHAPE_LOVELOCK to keep rules on Lovelock fields from matching it.
 * Returns 0 when no rule set is installed (v is left as it was). */
static __always_inline int classify(const struct flow_key *f, int malformed, struct verdict *v)
{
	__u32 zero = 0, slot, *live, i, found = 0, best_prio = 0;
	__u64 words[KEY_WORDS] = {};
	struct shapeset *ss;
	void *table;

	live = bpf_map_lookup_elem(&active_set, &zero);
	if (!live)
		return 0;
	slot = *live & 1;
	table = bpf_map_lookup_elem(&rulesets, &slot);
	if (!table)
		return 0;
	ss = bpf_map_lookup_elem(&shapesets, &slot);
	if (!ss)
		return 0;
	v->id = 0;
	v->action = ss->default_action;
	v->arg = ss->default_arg;
	if (malformed)
		return 1;

	__builtin_memcpy(words, f, sizeof(*f));
	for (i = 0; i < MAX_SHAPES && i < ss->nshapes; i++) {
		struct rule_entry *e;

		/* Shapes come by descending max_prio: none later can win. */
		if (found && ss->shapes[i & (MAX_SHAPES - 1)].max_prio <= best_prio)
			break;
		e = lookup_shape(table, ss, words, i);
		if (e && (!found || e->prio > best_prio)) {
			found = 1;
			best_prio = e->prio;
			v->id = e->id;
			v->action = e->action;
			v->arg = e->arg;
		}
	}
	return 1;
}

#endif
