// SPDX-License-Identifier: GPL-2.0
/* The pacer's kernel datapath: two tc (cls_bpf, direct action) programs on the VM's own
 * interface, built by `make bpf` (clang -target bpf) and loaded by agents/bpf.py (libbpf).
 *
 * Sensing (data packets, receiver side): every TCP segment this VM sends to a peer carries its
 * send time on the synchronized clock in the IPv4 ID field (RFC 6864: unused in atomic
 * datagrams; 16 bits of 8.192 us units, 537 ms around); the peer's `ingress` computes the
 * one-way delay of each data segment (payload > 0: data crosses the queue an incast fills, the
 * ACKs cross the other direction) as its own synchronized time minus the stamp.
 * Feedback: the receiver's `egress` writes its latest fresh sample toward that peer, once, in
 * the TCP urgent pointer of the next segment it sends there (URG clear: RFC 9293 3.1, the
 * field is read only with URG set), which is usually the ACK of that very segment: 15 bits
 * of stamp units (268 ms) and a top bit set when the segment was full-size (full_bytes).
 * Holding (sender side): the sender's `ingress` applies On-Ramp's rule to each echoed sample
 * (hold the destination for OWD - T, quantized, at most max_hold, in one piece at most
 * max_cont, then open for max_hold), with T counted from the destination's base OWD (the
 * smallest echo of a full-size segment) when from_base is set (ours: On-Ramp counts it from
 * 0); its `egress` holds a held destination's new data:
 *  - edt: skb->tstamp moved to the hold's end (sch_fq in this namespace sends it then);
 *  - refuse: TC_ACT_SHOT before the qdisc; the kernel returns NET_XMIT_DROP to TCP, which
 *    keeps the segment unsent (no loss, no retransmission), reduces its window once (CWR,
 *    as for an ECN mark) and sends it on a later ACK. The flow's last segment in flight and
 *    retransmissions always pass, so an ACK always comes back to resume it.
 * Window clamp (receiver side, `window`): the receiver's `egress` lowers the window it
 * advertises to each sender (ICTCP's idea, Wu et al., CoNEXT 2010; the rule, `window_bytes`,
 * is ours: the line's bytes in the base RTT plus queue_bytes, shared by the flows active in
 * this or the last epoch, cut while the queueing delay exceeds queue_bytes' worth, at least
 * one full segment), scaled by the window
 * scale its own SYN announced (RFC 7323) and only lowered, never raised, and its right edge
 * never moves left (RFC 9293 3.8.6.2.2). The sender's TCP then keeps in flight no more than the queue can
 * take: no loss, no window reduction. Flows whose handshake it did not see are left alone;
 * a SYN's window is two segments.
 * ACK pacing (receiver side, `ack_class`): the receiver's `egress` sends its pure ACKs to the
 * HTB class whose handle is ack_class (skb->priority), which the daemon made with a rate below
 * the line that counts each ACK as a full segment: with one segment sent per ACK, the senders
 * together send no faster than that rate, however many they are (the receiver's pull pacing of
 * NDP, Handley et al., SIGCOMM 2017, with TCP's own ACKs as the pulls).
 * Clocks: bpf_ktime_get_ns (CLOCK_MONOTONIC) mapped to the synchronized (reference) clock by
 * the daemon's anchor in `cfg`: ref = ref0 + (k - k0) + (k - k0) x ppb / 1e9.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_PEERS 256
#define KINDS 3      /* 0: OWD echoed to this sender, 1: the echo's own transit, 2: echo delay */
#define BUCKETS 192
#define UNIT_SHIFT 13          /* stamp units: 8.192 us */
#define STAMP_MASK 0xffffULL
#define MAX_OWD_NS 400000000ULL  /* a larger difference is a negative OWD (clock error) */
#define ECHO_MASK 0x7fff         /* an echo: the OWD in stamp units (268 ms at most) */
#define ECHO_FULL 0x8000         /* and whether its segment was full-size (full_bytes) */

struct cfg {
    __u64 k0; __s64 ref0; __s64 ppb; __u64 synced; __u64 pace; __u64 edt;
    __u64 threshold_ns; __u64 max_hold_ns; __u64 max_cont_ns; __u64 quantum_ns;
    __u64 max_transit_ns; __u64 ps_per_byte; __u64 burst_ns; __u64 spread;
    __u64 from_base; __u64 window; __u64 active_ns; __u64 full_bytes;
    __u64 min_window; __u64 queue_bytes; __u64 ack_class;
};
struct peer { __u64 idx; __u64 synced; };
struct dest {
    __u64 hold_until, held_since, open_until;
    __u64 rx_owd, rx_at, rx_fresh;
    __u64 rx_samples, echoes, fb_samples, above, holds, held_ns, refused, leaked, stamped;
    __u64 next_ns, paced;
    __u64 rx_full, rx_min, fb_min, clamped, window, acks;
};
/* a TCP connection with this peer, seen from its handshake: the window scale this VM
 * announced (ws_ours, 0xff: none) and whether the peer announced one too (peer_ws), the
 * activity epoch its last data segment arrived in, the right edge of the window last
 * advertised, and the acknowledgement and (unclamped) window of the last segment that left
 * toward the peer (acked, awnd) */
struct flow_key { __u32 peer_ip; __u16 lport, pport; };
struct flow { __u64 epoch; __u32 ws_ours, peer_ws, edge, has_edge, acked, awnd, has_ack, pad; };
/* flows active (a SYN or a data segment arrived) in the current epoch and in the last one
 * before it that had any */
struct act { __u64 epoch, cur, prev; };

struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32);
         __type(value, struct cfg); __uint(pinning, LIBBPF_PIN_BY_NAME); } cfg SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, MAX_PEERS); __type(key, __u32);
         __type(value, struct peer); __uint(pinning, LIBBPF_PIN_BY_NAME); } peers SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, MAX_PEERS); __type(key, __u32);
         __type(value, struct dest); __uint(pinning, LIBBPF_PIN_BY_NAME); } dests SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_LRU_HASH); __uint(max_entries, 4096);
         __type(key, struct flow_key); __type(value, struct flow);
         __uint(pinning, LIBBPF_PIN_BY_NAME); } flows SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32);
         __type(value, struct act); __uint(pinning, LIBBPF_PIN_BY_NAME); } act SEC(".maps");
struct hist { __u64 n[BUCKETS]; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, MAX_PEERS * KINDS);
         __type(key, __u32); __type(value, struct hist); __uint(pinning, LIBBPF_PIN_BY_NAME); }
    hist SEC(".maps");

struct pkt { __u32 ip_off, tcp_off, peer_ip, payload, doff, ack;
             __u16 id, urg, win, lport, pport; __u8 flags, off; };

/* IPv4 TCP to or from a peer: the offsets, the peer's address (network order), the payload
 * length; 0 when not such a packet. */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p, int egress)
{
    __u8 ip[20], th[20];
    if (skb->protocol != bpf_htons(ETH_P_IP))
        return 0;
    p->ip_off = ETH_HLEN;
    if (bpf_skb_load_bytes(skb, p->ip_off, ip, sizeof ip))
        return 0;
    __u32 ihl = (ip[0] & 0x0f) * 4;
    if (ip[9] != IPPROTO_TCP || ihl < 20 || (ip[6] & 0x3f) || ip[7])  /* fragments: no */
        return 0;
    p->tcp_off = p->ip_off + ihl;
    if (bpf_skb_load_bytes(skb, p->tcp_off, th, sizeof th))
        return 0;
    __u32 tot = ((__u32)ip[2] << 8) | ip[3], doff = (th[12] >> 4) * 4;
    if (tot < ihl + doff)
        return 0;
    p->payload = tot - ihl - doff;
    __builtin_memcpy(&p->peer_ip, egress ? ip + 16 : ip + 12, 4);
    p->id = ((__u16)ip[4] << 8) | ip[5];
    p->urg = ((__u16)th[18] << 8) | th[19];
    p->flags = th[13];
    p->off = th[12];
    p->doff = doff;
    p->win = ((__u16)th[14] << 8) | th[15];
    p->ack = ((__u32)th[8] << 24) | ((__u32)th[9] << 16) | ((__u32)th[10] << 8) | th[11];
    __u32 a = egress ? 0 : 2, b = egress ? 2 : 0;
    p->lport = ((__u16)th[a] << 8) | th[a + 1];
    p->pport = ((__u16)th[b] << 8) | th[b + 1];
    return 1;
}

static __always_inline __s64 to_ref(const struct cfg *c, __u64 k)
{
    __s64 d = (__s64)(k - c->k0);
    __u64 ad = d < 0 ? -d : d, ap = c->ppb < 0 ? -c->ppb : c->ppb;
    __s64 corr = (__s64)(ad * ap / 1000000000ULL);
    return c->ref0 + d + (((d < 0) != (c->ppb < 0)) ? -corr : corr);
}

static __always_inline __u16 stamp(__s64 ref)
{
    return (__u16)(((__u64)ref >> UNIT_SHIFT) & STAMP_MASK);
}

/* ns since `sent` (a stamp) at reference time `ref`; a difference above MAX_OWD_NS is a small
 * negative one (the clocks' error), taken as 0 */
static __always_inline __u64 since(__s64 ref, __u16 sent)
{
    __u64 d = ((stamp(ref) - (__u64)sent) & STAMP_MASK) << UNIT_SHIFT;
    return d > MAX_OWD_NS ? 0 : d;
}

static __always_inline __u32 bucket(__u64 ns)
{
    __u64 v = ns >> 10;
    if (v < 8)
        return v;
    __u32 msb = 0;
    if (v >> 32) { v >>= 32; msb += 32; }
    if (v >> 16) { v >>= 16; msb += 16; }
    if (v >> 8) { v >>= 8; msb += 8; }
    if (v >> 4) { v >>= 4; msb += 4; }
    if (v >> 2) { v >>= 2; msb += 2; }
    if (v >> 1) { msb += 1; }
    __u64 x = ns >> 10;
    __u32 b = (msb - 2) * 8 + ((x >> (msb - 3)) & 7);
    return b < BUCKETS ? b : BUCKETS - 1;
}

static __always_inline void count(__u32 idx, __u32 kind, __u64 ns)
{
    __u32 key = idx * KINDS + kind, b = bucket(ns);
    struct hist *h = bpf_map_lookup_elem(&hist, &key);
    if (h && b < BUCKETS)
        __sync_fetch_and_add(&h->n[b], 1);
}

/* On-Ramp's rule on one echoed sample `owd` at kernel time `now` (Liu et al., NSDI 2021) */
static __always_inline void decide(const struct cfg *c, struct dest *d, __u64 owd, __u64 now)
{
    __u64 t = c->threshold_ns + (c->from_base ? d->fb_min : 0);
    if (owd <= t || now < d->open_until)
        return;
    __sync_fetch_and_add(&d->above, 1);
    __u64 hold = owd - t;
    if (c->quantum_ns)
        hold = (hold + c->quantum_ns - 1) / c->quantum_ns * c->quantum_ns;
    if (hold > c->max_hold_ns)
        hold = c->max_hold_ns;
    if (now >= d->hold_until) {
        d->held_since = now;
        __sync_fetch_and_add(&d->holds, 1);
        if (c->spread)  /* senders held together release apart: + a draw in [0, hold) */
            hold += (__u64)bpf_get_prandom_u32() * hold >> 32;
    }
    __u64 end = now + hold, cap = d->held_since + c->max_cont_ns;
    if (end >= cap) {
        end = cap;
        d->open_until = cap + c->max_hold_ns;
    }
    if (end > d->hold_until) {
        __u64 from = d->hold_until > now ? d->hold_until : now;
        __sync_fetch_and_add(&d->held_ns, end - from);
        d->hold_until = end;
    }
}

/* x mod 64, in a way the verifier sees (the compiler would drop a mask it can prove idle) */
static __always_inline __u32 bound63(__u32 x)
{
    asm volatile("%0 &= 0x3f" : "+r"(x));
    return x;
}

/* The window scale option (RFC 7323 2.2) of a SYN's options: its shift, or -1 without one */
static __always_inline int wscale(struct __sk_buff *skb, const struct pkt *p)
{
    __u8 o[64] = {};
    __u32 len = p->doff - 20;
    if (len < 4 || len > 40)
        return -1;
    __u32 n = len - 1;
    if (bpf_skb_load_bytes(skb, p->tcp_off + 20, o, bound63(n) + 1))
        return -1;
    __u32 i = 0;
    for (int k = 0; k < 16; k++) {  /* a SYN has a handful of options */
        i = bound63(i);
        if (i + 1 >= len)
            break;
        __u8 kind = o[bound63(i)];
        if (kind == 0)
            break;
        if (kind == 1) {
            i++;
            continue;
        }
        __u8 l = o[bound63(i + 1)];
        if (kind == 3 && l == 3 && i + 2 < len) {
            __u8 ws = o[bound63(i + 2)];
            return ws > 14 ? 14 : ws;
        }
        if (l < 2)
            break;
        i += l;
    }
    return -1;
}

static __always_inline struct flow *flow_of(const struct pkt *p, int create)
{
    struct flow_key k = { .peer_ip = p->peer_ip, .lport = p->lport, .pport = p->pport };
    struct flow *f = bpf_map_lookup_elem(&flows, &k);
    if (f || !create)
        return f;
    struct flow init = { .epoch = 0, .ws_ours = 0xff, .peer_ws = 0 };
    bpf_map_update_elem(&flows, &k, &init, BPF_NOEXIST);
    return bpf_map_lookup_elem(&flows, &k);
}

/* flow `f` active in epoch `e` (its SYN or a data segment arrived): counted once per epoch;
 * a race between two CPUs turning the epoch loses at most a count, which the last epoch's
 * number covers */
static __always_inline void mark(struct act *g, struct flow *f, __u64 e)
{
    if (f->epoch == e)
        return;
    f->epoch = e;
    if (g->epoch != e) {
        g->prev = g->cur;
        g->cur = 0;
        g->epoch = e;
    }
    __sync_fetch_and_add(&g->cur, 1);
}

/* the flows to share among: the larger count of the current epoch and of the last one
 * before it that had any (after an idle spell, as many as then: an iteration of a
 * collective starts as the last one ended) */
static __always_inline __u64 active(const struct act *g)
{
    return g->cur > g->prev ? g->cur : g->prev;
}

/* The receive window of one of `n` active flows, bytes (our rule for ICTCP's receiver-side
 * window, Wu et al., CoNEXT 2010, from the OWD this datapath measures): the line's bytes in
 * the base RTT plus queue_bytes, shared by the active flows; cut by target / q while the
 * data's queueing delay q (owd - base_owd) exceeds the target (queue_bytes at the line's
 * rate); in whole segments of min_window (a partial segment would be one more packet in a
 * queue counted in packets), at least one. base RTT: the data's base OWD + the ACKs'
 * (ack_ns). */
static __always_inline __u64 window_bytes(const struct cfg *c, __u64 base_owd, __u64 owd,
                                          __u64 ack_ns, __u64 n)
{
    __u64 w = ((base_owd + ack_ns) * 1000 / c->ps_per_byte + c->queue_bytes) / (n ? n : 1);
    __u64 target = c->queue_bytes * c->ps_per_byte / 1000;
    __u64 q = owd > base_owd ? owd - base_owd : 0;
    if (q > target && q)
        w = w * target / q;
    w = w / c->min_window * c->min_window;
    return w ? w : c->min_window;
}

/* the ACKs' base OWD toward this VM's peer: half the connection's smallest RTT (its
 * handshake's, of small segments), else `base_owd` (0: unknown) */
static __always_inline __u64 ack_owd(struct __sk_buff *skb, __u64 base_owd)
{
    struct bpf_sock *sk = skb->sk;
    if (sk && (sk = bpf_sk_fullsock(sk))) {
        struct bpf_tcp_sock *tp = bpf_tcp_sock(sk);
        if (tp && tp->rtt_min && tp->rtt_min != ~0U)
            return (__u64)tp->rtt_min * 500;
    }
    return base_owd;
}

/* Clamp the window this VM advertises to its peer in segment `p` (egress) */
static __always_inline void clamp(struct __sk_buff *skb, const struct cfg *c, struct dest *d,
                                  const struct pkt *p, __u64 now)
{
    __u32 zero = 0;
    struct act *g = bpf_map_lookup_elem(&act, &zero);
    if (!g)
        return;
    __u64 w, bytes;
    if (p->flags & 0x02) {  /* SYN: note our scale; the window starts at two segments (a
                             * sender's segments are at most half the largest window it was
                             * offered: Linux's tcp_bound_to_half_wnd, RFC 1122 4.2.3.4) */
        int ws = wscale(skb, p);
        struct flow *f = flow_of(p, 1);
        if (f)
            f->ws_ours = ws < 0 ? 0xfe : ws;
        w = bytes = 2 * c->min_window;
    } else {
        struct flow *f = flow_of(p, 0);
        __u64 e = now / c->active_ns;
        if (!f || f->ws_ours == 0xff || !(p->flags & 0x10) || f->epoch + 1 < e)
            return;
        /* no OWD yet (this VM's clock not yet synchronized): half the handshake's RTT */
        __u64 ack = ack_owd(skb, d->rx_min), base = d->rx_min ? d->rx_min : ack;
        if (!base)
            return;
        __u32 shift = f->ws_ours < 0xfe && f->peer_ws ? f->ws_ours : 0;
        bytes = window_bytes(c, base, d->rx_min ? d->rx_owd : 0, ack, active(g));
        /* never shrink: the right edge stays at or beyond the last one advertised (RFC 9293
         * 3.8.6.2.2; a sender's retransmission beyond a shrunk edge waits for it) */
        if (f->has_edge && (__s32)(f->edge - p->ack) > 0 && f->edge - p->ack > bytes)
            bytes = f->edge - p->ack;
        w = (bytes + (1 << shift) - 1) >> shift;  /* rounded up: never below the floor */
        if (w > p->win)
            w = p->win;
        __u32 edge = p->ack + (w << shift);
        if (!f->has_edge || (__s32)(edge - f->edge) > 0) {
            f->edge = edge;
            f->has_edge = 1;
        }
    }
    if (w >= p->win)
        return;
    __u16 nw = bpf_htons((__u16)w), ow = bpf_htons(p->win);
    if (bpf_skb_store_bytes(skb, p->tcp_off + 14, &nw, 2, 0) ||
        bpf_l4_csum_replace(skb, p->tcp_off + 16, ow, nw, 2))
        return;
    __sync_fetch_and_add(&d->clamped, 1);
    d->window = bytes;
}

/* The policy, the packet parsed and its peer's entries; 0 when it is not TCP with a peer */
static __always_inline struct dest *start(struct __sk_buff *skb, int egress, struct pkt *p,
                                          struct cfg **c, struct peer **pp)
{
    __u32 zero = 0;
    *c = bpf_map_lookup_elem(&cfg, &zero);
    if (!*c || !parse(skb, p, egress))
        return 0;
    struct peer *peer = bpf_map_lookup_elem(&peers, &p->peer_ip);
    if (!peer)
        return 0;
    __u32 idx = peer->idx;
    *pp = peer;
    return bpf_map_lookup_elem(&dests, &idx);
}

SEC("tc")
int ingress(struct __sk_buff *skb)
{
    struct pkt p;
    struct peer *peer;
    struct cfg *c;
    struct dest *d = start(skb, 0, &p, &c, &peer);
    if (!d)
        return TC_ACT_OK;
    __u64 now = bpf_ktime_get_ns();
    if (c->window && c->active_ns) {
        __u32 zero = 0;
        struct act *g = bpf_map_lookup_elem(&act, &zero);
        struct flow *f = (p.payload || (p.flags & 0x02)) ? flow_of(&p, 1) : 0;
        if (f && (p.flags & 0x02))
            f->peer_ws = wscale(skb, &p) >= 0;
        if (f && g)
            mark(g, f, now / c->active_ns);
    }
    if (!c->synced)
        return TC_ACT_OK;
    __u32 idx = peer->idx;
    __s64 ref = to_ref(c, now);
    __u64 transit = since(ref, p.id);
    if (p.payload) {  /* a data segment: its OWD, to echo */
        int full = p.payload >= c->full_bytes;
        d->rx_owd = transit;
        d->rx_at = now;
        d->rx_fresh = 1;
        d->rx_full = full;
        if (full && transit && (!d->rx_min || transit < d->rx_min))
            d->rx_min = transit;
        __sync_fetch_and_add(&d->rx_samples, 1);
    }
    if (!(p.flags & 0x20) && p.urg && peer->synced && transit <= c->max_transit_ns) {
        __u64 owd = (__u64)(p.urg & ECHO_MASK) << UNIT_SHIFT;
        if ((p.urg & ECHO_FULL) && (!d->fb_min || owd < d->fb_min))
            d->fb_min = owd;
        __sync_fetch_and_add(&d->fb_samples, 1);
        count(idx, 0, owd);
        count(idx, 1, transit);
        if (c->pace)
            decide(c, d, owd, now);
    }
    return TC_ACT_OK;
}

/* whether a held destination's segment must pass: the flow's only one in flight, or a
 * retransmission (its sequence before snd_nxt) */
static __always_inline int must_pass(struct __sk_buff *skb, const struct pkt *p)
{
    struct bpf_sock *sk = skb->sk;
    if (!sk)
        return 1;
    sk = bpf_sk_fullsock(sk);
    if (!sk)
        return 1;
    struct bpf_tcp_sock *tp = bpf_tcp_sock(sk);
    if (!tp || tp->packets_out == 0)
        return 1;
    __u32 seq;
    if (bpf_skb_load_bytes(skb, p->tcp_off + 4, &seq, 4))
        return 1;
    return (__s32)(bpf_ntohl(seq) - tp->snd_nxt) < 0;
}

/* A segment about to be refused carries an acknowledgement (or a wider window) the peer has
 * not been sent: TCP counted it as sent when it built the segment (tcp_event_ack_sent, before
 * the qdisc), so it would send no other, and two VMs held toward each other would each wait
 * for the other's acknowledgement until a retransmission timeout. Send it on: the segment cut
 * to its headers (a pure ACK at snd_nxt, FIN and PSH cleared), a clone of it out of this
 * interface (this program sees it again: no payload, it passes); the caller then refuses the
 * segment itself. TCP builds its segments CHECKSUM_PARTIAL: the checksum field holds the
 * pseudo-header's sum, which the new length changes. */
static __always_inline void hand_on(struct __sk_buff *skb, const struct pkt *p,
                                    const struct flow *f, struct dest *d)
{
    if (!(p->flags & 0x10) || (f && f->has_ack && f->acked == p->ack && p->win <= f->awnd))
        return;
    __u32 ihl = p->tcp_off - p->ip_off;
    __u16 old_tot = bpf_htons(ihl + p->doff + p->payload), new_tot = bpf_htons(ihl + p->doff);
    __u16 old_len = bpf_htons(p->doff + p->payload), new_len = bpf_htons(p->doff);
    __u16 old_fl = bpf_htons(((__u16)p->off << 8) | p->flags);
    __u16 new_fl = bpf_htons(((__u16)p->off << 8) | (p->flags & ~0x09));
    if (bpf_skb_change_tail(skb, p->tcp_off + p->doff, 0) ||
        bpf_skb_store_bytes(skb, p->ip_off + 2, &new_tot, 2, 0) ||
        bpf_l3_csum_replace(skb, p->ip_off + 10, old_tot, new_tot, 2) ||
        bpf_l4_csum_replace(skb, p->tcp_off + 16, old_len, new_len, BPF_F_PSEUDO_HDR | 2) ||
        bpf_skb_store_bytes(skb, p->tcp_off + 12, &new_fl, 2, 0) ||
        bpf_l4_csum_replace(skb, p->tcp_off + 16, old_fl, new_fl, 2) ||
        bpf_clone_redirect(skb, skb->ifindex, 0))
        return;
    __sync_fetch_and_add(&d->acks, 1);
}

SEC("tc")
int egress(struct __sk_buff *skb)
{
    struct pkt p;
    struct peer *peer;
    struct cfg *c;
    struct dest *d = start(skb, 1, &p, &c, &peer);
    if (!d)
        return TC_ACT_OK;
    __u32 idx = peer->idx;
    __u64 now = bpf_ktime_get_ns();
    if (c->ack_class && !p.payload && (p.flags & 0x17) == 0x10)  /* ACK alone: no SYN/FIN/RST */
        skb->priority = c->ack_class;
    /* refuse mode: the flow's last acknowledgement sent, for hand_on */
    struct flow *f = c->pace && !c->edt ? flow_of(&p, 1) : 0;
    if (c->pace && p.payload && now < d->hold_until) {
        if (c->edt) {
            if (skb->tstamp < d->hold_until)
                skb->tstamp = d->hold_until;
        } else if (must_pass(skb, &p)) {
            __sync_fetch_and_add(&d->leaked, 1);
        } else {
            __sync_fetch_and_add(&d->refused, 1);
            hand_on(skb, &p, f, d);
            return TC_ACT_SHOT;
        }
    } else if (c->pace && p.payload && !c->edt && c->ps_per_byte) {
        /* no faster than the line toward one destination: a burst queues in TCP, where a
         * hold reaches it, not in the vNIC's queue, where it does not */
        if (now + c->burst_ns < d->next_ns && !must_pass(skb, &p)) {
            __sync_fetch_and_add(&d->paced, 1);
            hand_on(skb, &p, f, d);
            return TC_ACT_SHOT;
        }
        __u64 from = d->next_ns > now ? d->next_ns : now;
        d->next_ns = from + (__u64)skb->len * c->ps_per_byte / 1000;
    }
    if (f && (p.flags & 0x10)) {
        f->acked = p.ack;
        f->awnd = p.win;
        f->has_ack = 1;
    }
    if (c->window && c->ps_per_byte && c->active_ns)
        clamp(skb, c, d, &p, now);
    if (!c->synced)
        return TC_ACT_OK;
    __u16 id = bpf_htons(stamp(to_ref(c, now)));
    __u16 old_id = bpf_htons(p.id);
    if (bpf_skb_store_bytes(skb, p.ip_off + 4, &id, 2, 0) ||
        bpf_l3_csum_replace(skb, p.ip_off + 10, old_id, id, 2))
        return TC_ACT_OK;
    __sync_fetch_and_add(&d->stamped, 1);
    if (d->rx_fresh && !(p.flags & 0x20) && now - d->rx_at <= c->max_transit_ns) {
        __u64 units = d->rx_owd >> UNIT_SHIFT;
        units = units == 0 ? 1 : units > ECHO_MASK ? ECHO_MASK : units;
        __u16 urg = bpf_htons((__u16)units | (d->rx_full ? ECHO_FULL : 0));
        __u16 old_urg = bpf_htons(p.urg);
        if (bpf_skb_store_bytes(skb, p.tcp_off + 18, &urg, 2, 0) ||
            bpf_l4_csum_replace(skb, p.tcp_off + 16, old_urg, urg, 2))
            return TC_ACT_OK;
        d->rx_fresh = 0;
        __sync_fetch_and_add(&d->echoes, 1);
        count(idx, 2, now - d->rx_at);
    }
    return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
