/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing through a bounds-checked cursor. Every helper checks the
 * access against data_end before touching a byte, so the verifier accepts it
 * and truncated packets end in a defined status instead of a fault. */
#ifndef LOVELOCK_PARSE_H
#define LOVELOCK_PARSE_H

#include <linux/types.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "lovelock_wire.h"

struct cursor {
	void *pos;
	void *end;
};

struct vlan_hdr {
	__be16 tci;
	__be16 encap_proto;
};

/* Result of parsing a packet up to the Lovelock header. The values are shared
 * with dataplane/wire's error kinds (see wire.Status). */
enum ll_status {
	LL_OK = 0,           /* a valid Lovelock header was parsed */
	LL_NOT_LOVELOCK = 1, /* well-formed, but not UDP to the Lovelock port */
	LL_TRUNCATED = 2,    /* a header ends past the packet (short buffer) */
	LL_BAD_VERSION = 3,  /* Lovelock header with an unknown version */
	LL_BAD_LENGTH = 4,   /* length field disagrees with the UDP payload */
	LL_UNKNOWN_TYPE = 5, /* Lovelock header with an unknown type */
};

/* Returns a pointer to len bytes at the cursor and advances it, or NULL. */
static __always_inline void *cursor_pull(struct cursor *c, __u32 len)
{
	void *p = c->pos;

	if (p + len > c->end)
		return NULL;
	c->pos = p + len;
	return p;
}

static __always_inline int ll_type_known(__u8 type)
{
	switch (type) {
	case LL_TYPE_BUNDLE:
	case LL_TYPE_CREDIT:
	case LL_TYPE_MEM_READ:
	case LL_TYPE_MEM_WRITE:
	case LL_TYPE_MEM_REPLY:
	case LL_TYPE_INGEST_INPUT:
	case LL_TYPE_INGEST_RESULT:
	case LL_TYPE_INGEST_CTRL:
	case LL_TYPE_PING:
	case LL_TYPE_PONG:
		return 1;
	}
	return 0;
}

/* Validates the Lovelock header at the cursor. udp_payload is the payload
 * length the UDP header claims. */
static __always_inline enum ll_status parse_ll(struct cursor *c, __u32 udp_payload,
					      struct ll_hdr **out)
{
	struct ll_hdr *ll = cursor_pull(c, sizeof(*ll));

	if (!ll)
		return LL_TRUNCATED;
	if (ll->version != LL_WIRE_VERSION)
		return LL_BAD_VERSION;
	if (udp_payload < sizeof(*ll) || bpf_ntohl(ll->length) != udp_payload - sizeof(*ll))
		return LL_BAD_LENGTH;
	if (!ll_type_known(ll->type))
		return LL_UNKNOWN_TYPE;
	*out = ll;
	return LL_OK;
}

/* Parses Ethernet (one optional 802.1Q tag), IPv4 (with options) or IPv6
 * (no extension headers yet), UDP to port, and the Lovelock header. */
static __always_inline enum ll_status parse_to_ll(struct cursor *c, __u16 port,
						  struct ll_hdr **out)
{
	struct ethhdr *eth = cursor_pull(c, sizeof(*eth));
	__u16 proto;
	__u8 l4;

	if (!eth)
		return LL_TRUNCATED;
	proto = eth->h_proto;
	if (proto == bpf_htons(ETH_P_8021Q)) {
		struct vlan_hdr *vh = cursor_pull(c, sizeof(*vh));

		if (!vh)
			return LL_TRUNCATED;
		proto = vh->encap_proto;
	}

	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = c->pos;
		__u32 ihl;

		if (!cursor_pull(c, sizeof(*ip)))
			return LL_TRUNCATED;
		ihl = ip->ihl * 4;
		if (ihl < sizeof(*ip))
			return LL_TRUNCATED;
		/* Skip IPv4 options: pull the rest of the header. */
		if (ihl > sizeof(*ip) && !cursor_pull(c, ihl - sizeof(*ip)))
			return LL_TRUNCATED;
		/* Only first fragments carry the UDP header. */
		if (ip->frag_off & bpf_htons(0x1fff))
			return LL_NOT_LOVELOCK;
		l4 = ip->protocol;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = cursor_pull(c, sizeof(*ip6));

		if (!ip6)
			return LL_TRUNCATED;
		l4 = ip6->nexthdr;
	} else {
		return LL_NOT_LOVELOCK;
	}

	if (l4 != IPPROTO_UDP)
		return LL_NOT_LOVELOCK;

	struct udphdr *udp = cursor_pull(c, sizeof(*udp));
	__u16 ulen;

	if (!udp)
		return LL_TRUNCATED;
	if (udp->dest != bpf_htons(port))
		return LL_NOT_LOVELOCK;
	ulen = bpf_ntohs(udp->len);
	if (ulen < sizeof(*udp))
		return LL_BAD_LENGTH;
	return parse_ll(c, ulen - sizeof(*udp), out);
}

#endif
