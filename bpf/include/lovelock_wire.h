/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The Lovelock header: the fixed 24-byte header that starts the UDP payload of
 * every service packet. Network byte order. dataplane/wire owns the Go side and
 * a test keeps the two in step; docs/wire.md draws the layout. */
#ifndef LOVELOCK_WIRE_H
#define LOVELOCK_WIRE_H

#include <linux/types.h>

#define LL_WIRE_VERSION 1
/* 61440 (0xF000) lies in IANA's dynamic range, which is never assigned, and
 * above Linux's default ephemeral range (32768-60999), so no kernel-chosen
 * source port collides with it. Configurable at load time. */
#define LL_DEFAULT_PORT 61440
#define LL_HDR_LEN 24

/* Message types. Unknown types are malformed. */
enum ll_type {
	LL_TYPE_BUNDLE = 0x01,        /* messaging: aggregated small messages */
	LL_TYPE_CREDIT = 0x02,        /* messaging: flow-control credit and ack */
	LL_TYPE_MEM_READ = 0x10,      /* far memory: page read request */
	LL_TYPE_MEM_WRITE = 0x11,     /* far memory: page write request */
	LL_TYPE_MEM_REPLY = 0x12,     /* far memory: reply to a read or write */
	LL_TYPE_INGEST_INPUT = 0x20,  /* accelerator ingest: client input */
	LL_TYPE_INGEST_RESULT = 0x21, /* accelerator ingest: result to client */
	LL_TYPE_INGEST_CTRL = 0x22,   /* accelerator ingest: host/DPU control */
	LL_TYPE_PING = 0x30,          /* liveness probe */
	LL_TYPE_PONG = 0x31,          /* liveness reply */
};

/* Flags: bits not defined here are carried through, never interpreted. */
#define LL_FLAG_ACK_REQ 0x0001    /* sender wants an acknowledgement */
#define LL_FLAG_MORE 0x0002       /* more fragments of this message follow */
#define LL_FLAG_RETRANSMIT 0x0004 /* this packet is a retransmission */

struct ll_hdr {
	__u8 version;    /* LL_WIRE_VERSION */
	__u8 type;       /* enum ll_type */
	__be16 flags;    /* LL_FLAG_* */
	__be32 tenant;   /* tenant ID, 0 = infrastructure */
	__be32 src;      /* source rank or region */
	__be32 dst;      /* destination rank or region */
	__be32 seq;      /* per-flow sequence number */
	__be32 length;   /* payload bytes after this header; must equal the rest of the UDP payload */
};

_Static_assert(sizeof(struct ll_hdr) == LL_HDR_LEN, "ll_hdr must be 24 bytes");

#endif
