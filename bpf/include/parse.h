/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing through a bounds-checked cursor. Every helper checks the
 * access against data_end before touching a byte, so the verifier accepts it
 * and malformed packets end in a defined status instead of a fault.
 *
 * parse_packet fills a struct pkt_meta: the flow key rules match on, and the
 * verdict on the packet's headers (enum ll_status). The Go reference parser
 * (dataplane/wire.ParseFrame) mirrors it step by step; docs/steering.md
 * lists the rules both follow. */
#ifndef LOVELOCK_PARSE_H
#define LOVELOCK_PARSE_H

#include <linux/types.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/udp.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "lovelock_wire.h"

/* IPv6 extension headers skipped before giving up (malformed). */
#define MAX_IPV6_EXT_HDRS 4
/* The longest IPv6 extension header: (255 + 1) * 8 bytes (hop-by-hop,
 * routing, destination options; AH and fragment headers are shorter). */
#define IPV6_EXT_MAX_LEN 2048
/* The furthest parse_packet reads into a packet: Ethernet, one 802.1Q tag,
 * IPv6 (IPv4 with options is shorter), MAX_IPV6_EXT_HDRS extension headers,
 * UDP (TCP's 20 bytes are fewer than UDP and the Lovelock header) and the
 * Lovelock header. A TC hook that has this much of a packet linear (or all
 * of it) parses it as if it were linear throughout. */
#define LL_MAX_HDR_BYTES (ETH_HLEN + 4 + 40 + MAX_IPV6_EXT_HDRS * IPV6_EXT_MAX_LEN + 8 + 24)

/* A packet being parsed: pos..end is its linear part, where the headers
 * must lie; len is its whole length, more than end - pos for an XDP
 * multi-buffer frame (a jumbo frame in several pages), whose payload
 * continues in fragments the parser never reads. */
struct cursor {
	void *pos;
	void *end;
	__u32 len;
	/* Set by parse_packet: where the packet starts, and how far from
	 * there the innermost datagram found so far reaches (the packet, then
	 * the IP datagram). Headers after the IP header must end within it:
	 * bytes after the IP datagram are Ethernet padding, not headers. */
	void *start;
	__u32 lim;
	/* Set by cursor_pull when a header ends past the linear part but
	 * within the datagram: how many bytes from start the parser needed.
	 * The parse then ends TRUNCATED; a TC hook pulls more of the skb in
	 * and parses again (tc_steer), XDP cannot (a multi-buffer frame's
	 * headers must lie in its first buffer). 0: no such header. */
	__u32 need;
};

struct vlan_hdr {
	__be16 tci;
	__be16 encap_proto;
};

/* Verdict on a packet's headers. Values are shared with dataplane/wire's
 * Status. Anything but OK and NOT_LOVELOCK is malformed. */
enum ll_status {
	LL_OK = 0,           /* a valid Lovelock packet */
	LL_NOT_LOVELOCK = 1, /* well-formed, but not a Lovelock packet */
	LL_TRUNCATED = 2,    /* a header or datagram ends past the packet, its IP datagram or its UDP datagram */
	LL_BAD_VERSION = 3,  /* Lovelock header with an unknown version */
	LL_BAD_LENGTH = 4,   /* Lovelock length disagrees with the UDP payload (a UDP GSO run's: its first datagram's) */
	LL_UNKNOWN_TYPE = 5, /* Lovelock header with an unknown type */
	LL_BAD_HEADER = 6,   /* an invalid L3/L4 header (IP version, IHL, IPv4 total length, UDP length, too many IPv6 extension headers) */
};

/* What rules match on. Numbers are in host byte order, addresses in network
 * order (IPv4 in the first four bytes). Fields a packet lacks are zero. */
struct flow_key {
	__u32 ifindex;  /* interface the hook runs on */
	__u8 family;    /* 4, 6, or 0 for non-IP */
	__u8 proto;     /* IP protocol */
	__u8 ll_type;   /* Lovelock type, 0 when not a valid Lovelock packet */
	__u8 pad;       /* 0; steer() may set SHAPE_LOVELOCK (rules.h) */
	__u8 src[16];
	__u8 dst[16];
	__u16 sport;    /* UDP/TCP ports; 0 for fragments and other protocols */
	__u16 dport;
	__u32 tenant;   /* Lovelock tenant */
	__u32 rank;     /* Lovelock destination rank or region */
};

_Static_assert(sizeof(struct flow_key) % 4 == 0, "flow_key is masked word by word");

struct pkt_meta {
	struct flow_key key;
	__u32 status;   /* enum ll_status */
	__u32 ll_off;   /* offset of the Lovelock header, when status is LL_OK */
	/* 1: the L3/L4 headers are valid, and only the Lovelock header of a
	 * UDP datagram to the Lovelock port failed its checks (the status is
	 * parse_ll's). The key's L3/L4 fields are then trusted and its
	 * Lovelock fields zero: such a datagram may be another protocol's
	 * that merely uses the port (a DNS reply to ephemeral port 61440). */
	__u32 bad_ll;
};

/* Returns a pointer to len bytes at the cursor and advances it, or NULL
 * when they end past c->lim or past the linear data (then setting
 * c->need). */
static __always_inline void *cursor_pull(struct cursor *c, __u32 len)
{
	void *p = c->pos;
	__u64 end;

	/* A scalar offset: the barrier keeps clang from turning the compare
	 * into packet-pointer arithmetic with an unbounded register, which
	 * older verifiers reject. */
	end = (__u64)(p + len - c->start);
	asm volatile("" : "+r"(end));
	if (end > c->lim)
		return NULL;
	if (p + len > c->end) {
		c->need = end;
		return NULL;
	}
	c->pos = p + len;
	return p;
}

/* cursor_pull for a length read from the packet: IPv4 options, an IPv6
 * extension header. Every such length is below 4096 (at most
 * IPV6_EXT_MAX_LEN), so the mask leaves the value alone; it bounds the
 * register that is added to the packet pointer. Without it clang may
 * compute the length in 64 bits and truncate it with a mask (IPv4's
 * ihl * 4 - 20), and 6.1's verifier, which then sees a bound near 2^32,
 * learns no packet range from the check against data_end ("R2 offset is
 * outside of the packet"). */
static __always_inline void *cursor_pull_var(struct cursor *c, __u32 len)
{
	__u64 l = len;

	asm volatile("%0 &= 0xfff" : "+r"(l));
	return cursor_pull(c, l);
}

_Static_assert(IPV6_EXT_MAX_LEN < 4096, "cursor_pull_var's mask must not cut a header length");

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

/* Validates the Lovelock header at the cursor, given a UDP payload of
 * payload bytes that lies within the packet (of a GSO run: its first
 * datagram's, see parse_packet). Same checks, same order as wire.Decode on
 * that payload. */
static __always_inline enum ll_status parse_ll(struct cursor *c, __u32 payload,
					      struct pkt_meta *m, void *start)
{
	struct ll_hdr *ll;

	if (payload < sizeof(*ll))
		return LL_TRUNCATED;
	ll = cursor_pull(c, sizeof(*ll));
	if (!ll)
		return LL_TRUNCATED;
	if (ll->version != LL_WIRE_VERSION)
		return LL_BAD_VERSION;
	if (bpf_ntohl(ll->length) != payload - sizeof(*ll))
		return LL_BAD_LENGTH;
	if (!ll_type_known(ll->type))
		return LL_UNKNOWN_TYPE;
	m->key.ll_type = ll->type;
	m->key.tenant = bpf_ntohl(ll->tenant);
	m->key.rank = bpf_ntohl(ll->dst);
	m->ll_off = (__u32)((void *)ll - start);
	return LL_OK;
}

static __always_inline int ipv6_ext(__u8 nexthdr)
{
	return nexthdr == IPPROTO_HOPOPTS || nexthdr == IPPROTO_ROUTING ||
	       nexthdr == IPPROTO_DSTOPTS || nexthdr == IPPROTO_FRAGMENT ||
	       nexthdr == IPPROTO_AH;
}

/* Skips IPv6 extension headers. Sets *frag when the packet is a fragment
 * (any piece: L4 ports are then not looked at) and stops at its fragment
 * header, whose next header is then the protocol. */
static __always_inline enum ll_status skip_ipv6_ext(struct cursor *c, __u8 *nexthdr, int *frag)
{
	int i;

	/* Unrolled: no loop for the verifier. As a loop, clang lays out its
	 * latch to fall through into the header, which 6.1's check_cfg
	 * refuses ("back-edge from insn N to N+1"; 6.3 and later accept it). */
#pragma unroll
	for (i = 0; i < MAX_IPV6_EXT_HDRS; i++) {
		__u8 *h;

		if (!ipv6_ext(*nexthdr))
			return LL_OK;
		h = cursor_pull(c, 2);
		if (!h)
			return LL_TRUNCATED;
		if (*nexthdr == IPPROTO_FRAGMENT) {
			/* 8 bytes: next header, reserved, offset+flags, identification. */
			__be16 *off = cursor_pull(c, 6);

			if (!off)
				return LL_TRUNCATED;
			*nexthdr = h[0];
			/* A fragment (offset or M set): what follows is datagram
			 * data, not headers, in every piece but the first. Stop
			 * here so all pieces carry the same protocol. An atomic
			 * fragment (neither set) is walked through. */
			if (*off & bpf_htons(0xfff9)) {
				*frag = 1;
				return LL_OK;
			}
			continue;
		}
		__u32 len = *nexthdr == IPPROTO_AH ? ((__u32)h[1] + 2) * 4 : ((__u32)h[1] + 1) * 8;

		if (!cursor_pull_var(c, len - 2))
			return LL_TRUNCATED;
		*nexthdr = h[0];
	}
	return ipv6_ext(*nexthdr) ? LL_BAD_HEADER : LL_OK;
}

/* parse_packet walks Ethernet (one optional 802.1Q tag), IPv4 (with options)
 * or IPv6 (with up to MAX_IPV6_EXT_HDRS extension headers), UDP or TCP, and
 * the Lovelock header on UDP destination port port.
 *
 * The IP length bounds the datagram, as in the kernel's ip_rcv and
 * ip6_rcv: bytes after it are Ethernet padding, and the headers after the IP
 * header and the UDP datagram must end within it. gso_size is the packet's
 * skb->gso_size: not 0 for a GSO super-packet (skb_is_gso; TC only, XDP
 * never sees one, and passes 0). There an IPv4 total length, IPv6 payload
 * length or UDP length of 0 means "up to the end of the packet" (BIG TCP, UDP
 * tunnels over GSO) instead of a broken header. And a UDP GSO run (a
 * UDP_SEGMENT send, or datagrams GRO merged) is one skb of datagrams of
 * gso_size payload bytes each (the last may be shorter), each with its own
 * Lovelock header, under one UDP header whose length is the whole run's:
 * when the UDP payload exceeds gso_size, the Lovelock header is checked
 * against the first datagram's payload, gso_size bytes, as the datagram will
 * be once the kernel segments the run. */
static __always_inline enum ll_status parse_packet(struct cursor *c, __u16 port,
						   struct pkt_meta *m, __u32 gso_size)
{
	int gso = gso_size != 0;
	void *start = c->pos;
	struct ethhdr *eth;
	__u16 proto;
	enum ll_status st;
	__u8 l4;
	int frag = 0;

	c->start = start;
	c->lim = c->len;
	eth = cursor_pull(c, sizeof(*eth));
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
		struct iphdr *ip = cursor_pull(c, sizeof(*ip));
		__u32 ihl, tot;

		if (!ip)
			return LL_TRUNCATED;
		if (ip->version != 4 || ip->ihl < 5)
			return LL_BAD_HEADER;
		ihl = ip->ihl * 4;
		/* Skip IPv4 options. */
		if (ihl > sizeof(*ip) && !cursor_pull_var(c, ihl - sizeof(*ip)))
			return LL_TRUNCATED;
		m->key.family = 4;
		m->key.proto = ip->protocol;
		__builtin_memcpy(m->key.src, &ip->saddr, 4);
		__builtin_memcpy(m->key.dst, &ip->daddr, 4);
		tot = bpf_ntohs(ip->tot_len);
		if (tot != 0 || !gso) {
			__u32 ip_off = (__u32)((void *)ip - start);

			asm volatile("" : "+r"(ip_off)); /* see cursor_pull */
			if (tot < ihl)
				return LL_BAD_HEADER;
			if (ip_off + tot > c->len)
				return LL_TRUNCATED;
			c->lim = ip_off + tot;
		}
		/* More-fragments flag or an offset: a fragment. */
		frag = (ip->frag_off & bpf_htons(0x3fff)) != 0;
		l4 = ip->protocol;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = cursor_pull(c, sizeof(*ip6));
		__u32 plen;

		if (!ip6)
			return LL_TRUNCATED;
		if (ip6->version != 6)
			return LL_BAD_HEADER;
		m->key.family = 6;
		__builtin_memcpy(m->key.src, &ip6->saddr, 16);
		__builtin_memcpy(m->key.dst, &ip6->daddr, 16);
		plen = bpf_ntohs(ip6->payload_len);
		if (plen != 0 || !gso) {
			/* A payload length of 0 outside GSO (a jumbogram, which
			 * no Ethernet frame here carries) leaves no room for
			 * headers: TRUNCATED at the first one. */
			__u32 end = (__u32)((void *)ip6 - start);

			asm volatile("" : "+r"(end)); /* see cursor_pull */
			end += sizeof(*ip6) + plen;
			if (end > c->len)
				return LL_TRUNCATED;
			c->lim = end;
		}
		l4 = ip6->nexthdr;
		st = skip_ipv6_ext(c, &l4, &frag);
		if (st != LL_OK)
			return st;
		m->key.proto = l4;
	} else {
		return LL_NOT_LOVELOCK;
	}

	/* Fragments are classified on L3 alone, so all pieces of a datagram
	 * go the same way. */
	if (frag)
		return LL_NOT_LOVELOCK;

	if (l4 == IPPROTO_TCP) {
		struct tcphdr *tcp = cursor_pull(c, sizeof(*tcp));

		if (!tcp)
			return LL_TRUNCATED;
		m->key.sport = bpf_ntohs(tcp->source);
		m->key.dport = bpf_ntohs(tcp->dest);
		return LL_NOT_LOVELOCK;
	}
	if (l4 != IPPROTO_UDP)
		return LL_NOT_LOVELOCK;

	struct udphdr *udp = cursor_pull(c, sizeof(*udp));
	__u64 ulen; /* 64-bit, so the asm mask below costs no zero-extension */
	__u32 udp_off, payload;

	if (!udp)
		return LL_TRUNCATED;
	m->key.sport = bpf_ntohs(udp->source);
	m->key.dport = bpf_ntohs(udp->dest);
	udp_off = (__u32)((void *)udp - start);
	asm volatile("" : "+r"(udp_off)); /* see cursor_pull */
	ulen = bpf_ntohs(udp->len);
	/* A no-op on the value (a byte-swapped u16), for older verifiers:
	 * 6.12's and 6.1's forget every bound across a byte swap (BPF_END;
	 * 6.18's keeps them) and then reject the packet-pointer addition below
	 * ("math between pkt pointer and register with unbounded min value is
	 * not allowed"). Clang knows the value fits 16 bits and would drop a C
	 * check; the asm puts the mask in the register that is added. */
	asm volatile("%0 &= 0xffff" : "+r"(ulen));
	if (ulen == 0 && gso) {
		/* The datagram runs to the end of the IP datagram, which holds
		 * the 8-byte header (cursor_pull checked). */
		ulen = c->lim - udp_off;
	} else {
		if (ulen < sizeof(*udp))
			return LL_BAD_HEADER;
		/* The datagram must lie within the IP datagram, and so within
		 * the packet, fragments of a multi-buffer frame included: the
		 * kernel drops one that does not (UdpInErrors). Bytes after it
		 * are padding. */
		if (udp_off + ulen > c->lim)
			return LL_TRUNCATED;
	}
	if (m->key.dport != port)
		return LL_NOT_LOVELOCK;
	payload = ulen - sizeof(*udp);
	/* A UDP GSO run: its first datagram's payload. */
	if (gso && payload > gso_size)
		payload = gso_size;
	st = parse_ll(c, payload, m, start);
	m->bad_ll = st != LL_OK;
	return st;
}

static __always_inline int ll_malformed(enum ll_status st)
{
	return st != LL_OK && st != LL_NOT_LOVELOCK;
}

#endif
