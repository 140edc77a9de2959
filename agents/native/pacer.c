/* libnslabpacer.so: the pacer's control loop, compiled (agents/pacerio.py loads it with ctypes;
 * agents/pacer.py keeps sensing, the clock sync's parameters, reports and the coordinator API).
 *
 * One native thread (npc_start) owns the pacer's UDP socket and a NETLINK_ROUTE socket and,
 * without ever taking Python's GIL:
 *   1. sends a timestamp probe to each active destination every probe_ns (layout below), with
 *      at most IN_FLIGHT unanswered (then one per max_age_ns; and one when a hold starts or
 *      ends, whatever is unanswered): a probe is a packet in the
 *      queue it measures, and a queue long in time would otherwise fill with probes
 *      (4 senders at 2 ms into a 60 ms queue: 120 probes, more than a 50-packet buffer);
 *   2. answers the probes of other pacers with an echo carrying the probe's kernel RX stamp;
 *   3. turns each echo of a probe still unanswered (its seq: an echo answers for its probe and
 *      the ones sent before it; others, duplicates or a previous pacer's, are only counted)
 *      into a one-way delay on the synchronized clocks,
 *      owd = (rx - theta_dst(rx)) - (tx - theta_me(tx)),
 *      theta_v(t) = off_v + drift_v x 1e-6 x (t - off_v - t_ref) (npc_offset_at_vm),
 *      and runs On-Ramp's gate on it (npc_gate_decide: agents/gate.py's Gate.decide, the same
 *      arithmetic in the same order, which the unit tests check on the same inputs);
 *   4. holds a destination by sending its prebuilt RTM_NEWQDISC message (agents/hold.py builds
 *      it: the TBF under the destination's HTB class at <= 64 kbit/s), also when its oldest
 *      unanswered probe is late (npc_gate_overdue: Gate.overdue), and releases it when the
 *      hold ends (the open message, then a probe to that destination, which wakes the device);
 *   5. records every sample (destination, OWD, whether a hold was applied and how long after
 *      the echo's kernel arrival) in a ring that Python drains (npc_drain).
 * Python changes the destinations (active, synchronized, clock parameters, switch messages)
 * under the engine's mutex (npc_set_*).
 *
 * Wire (big-endian, UDP, the pacer's port): probe = "NSPC", kind 1, 3 pad bytes, seq u64,
 * tx_ns i64 (24 bytes); echo = the same with kind 2 plus rx_ns i64 (32 bytes), rx the probe's
 * arrival at the destination on its VM clock.
 *
 * Stamps and clock: the wire stamps (tx, rx) and so every OWD are on the VM clock,
 * CLOCK_REALTIME as this process sees it (in a lab VM the vmclock preload wraps clock_gettime
 * and recvmmsg: the VM clock); ``conv`` (NULL: identity) maps it to the VM clock otherwise, as
 * in probeio.c. Everything scheduled (the probe period, holds and their release, the SYN
 * window, the overdue rule's "no echo for T + the longest hold", the poll's timeout) and the
 * gate's times are on CLOCK_MONOTONIC, read directly (``mono``; each probe keeps its send
 * time on it beside its VM stamp): the VM clock steps (the lab's clock_step fault, chrony
 * stepping a guest), and on it a step back by S stalled probing and the overdue rule and
 * stretched a hold by S, a step forward ended holds early. The preload wraps CLOCK_MONOTONIC
 * too, as the VM's monotonic clock: its offset less every step (vmclock.c, seg_offset), so
 * it never steps either. Sources: Liu et al., NSDI 2021 (On-Ramp); rtnetlink(7),
 * tc-tbf(8); Documentation/networking/timestamping.rst.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "stamp.h"

#define BATCH 32
#define SLOT 64
#define CTL 256
#define PROBE_LEN 24
#define ECHO_LEN 32
#define KIND_PROBE 1
#define KIND_ECHO 2
#define MAX_MSG 256
#define MAX_ERRNO 256
#define IDLE_NS 10000000LL  /* longest wait: the stop flag is seen within it */
#define IN_FLIGHT 2         /* unanswered probes per destination before probing waits */
#define OUTSTANDING 8       /* unanswered probes tracked per destination (older: lost) */

typedef int64_t (*conv_fn)(int64_t);

/* ------------------------------------------------------------------ the gate (agents/gate.py) */
struct npc_gate_cfg {       /* GateConfig */
    double threshold_ns, max_hold_ns, max_age_ns, max_continuous_ns, max_slope;
    int32_t predict, fresh, spread;
    uint64_t seed;
};

/* Decision reasons, in agents.pacerio.REASONS order */
enum { G_UNSYNCED, G_STALE, G_PREDATES, G_OPEN_AFTER, G_BELOW, G_ABOVE, G_FRESH, G_NOT_LATE,
       G_SILENT, G_GOES_ON, G_OVERDUE };

struct gdest {              /* gate._Dest */
    int64_t held_until, held_since, open_until, last_sent, time_until;
    int64_t holds, releases;
    double held_ns, last_owd, spread_ns;
    int has_last, waiting;
};

struct npc_gate {
    struct npc_gate_cfg cfg;
    int n;
    struct gdest *d;
};

struct npc_gate *npc_gate_new(const struct npc_gate_cfg *cfg, int n)
{
    struct npc_gate *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->cfg = *cfg, g->n = n;
    g->d = calloc(n > 0 ? n : 1, sizeof *g->d);
    if (!g->d) {
        free(g);
        return NULL;
    }
    return g;
}

void npc_gate_free(struct npc_gate *g)
{
    if (g) {
        free(g->d);
        free(g);
    }
}

/* The k-th draw in [0, 1) of ``seed``: splitmix64, its top 53 bits (gate._uniform). */
static double uniform(uint64_t seed, uint64_t k)
{
    uint64_t z = seed + k * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

/* How long a fresh release is put off, ns (Gate._stagger). */
static int64_t stagger(const struct npc_gate *g, struct gdest *d)
{
    if (!g->cfg.spread)
        return 0;
    d->releases++;
    return (int64_t)(uniform(g->cfg.seed, (uint64_t)d->releases) * d->spread_ns);
}

static double predicted(const struct npc_gate *g, struct gdest *d, double owd, int64_t sent,
                        int64_t now)
{
    if (d->has_last && sent <= d->last_sent)
        return owd;         /* reordered echo: the newer sample already set the trend */
    int had = d->has_last;
    int64_t prev = d->last_sent;
    double prev_owd = d->last_owd;
    d->last_sent = sent, d->last_owd = owd, d->has_last = 1;
    if (!g->cfg.predict || !had)
        return owd;
    double slope = (owd - prev_owd) / (double)(sent - prev);
    slope = fmin(fmax(slope, 0.0), g->cfg.max_slope);
    return owd + slope * (double)(now - sent);
}

/* Gate.decide for destination ``i``: the reason; *hold_ns > 0 holds until *until_ns (``sent``
 * and ``now`` on one clock: the engine's CLOCK_MONOTONIC). */
int npc_gate_decide(struct npc_gate *g, int i, double owd, int64_t sent, int64_t now,
                    int synced, double *hold_ns, int64_t *until_ns)
{
    struct gdest *d = &g->d[i];
    *hold_ns = 0.0, *until_ns = 0;
    if (!synced)
        return G_UNSYNCED;
    if ((double)(now - sent) - owd > g->cfg.max_age_ns)
        return G_STALE;
    double pred = predicted(g, d, owd, sent, now);
    int holding = now < d->held_until;
    if (!holding && d->waiting) {   /* the hold ran to its cap with no fresh sample below T */
        d->waiting = 0;
        d->open_until = d->held_until + (int64_t)g->cfg.max_hold_ns;
    }
    if (holding && sent < d->held_since) {
        *until_ns = d->held_until;
        return G_PREDATES;
    }
    if (now < d->open_until)
        return G_OPEN_AFTER;
    if (owd <= g->cfg.threshold_ns) {
        if (!d->waiting)
            return G_BELOW;
        int64_t end = (d->time_until > now ? d->time_until : now) + stagger(g, d);
        if (end > d->held_until)
            end = d->held_until;
        d->held_ns -= (double)(d->held_until - end);
        d->held_until = end, d->waiting = 0;
        *until_ns = end;
        return G_FRESH;
    }
    double excess = pred - g->cfg.threshold_ns;
    if (!holding) {
        d->held_since = now, d->time_until = 0, d->spread_ns = 0.0;
        d->holds++;
    }
    d->spread_ns = fmax(d->spread_ns, fmin(excess, g->cfg.max_hold_ns));
    int64_t end = now + (int64_t)fmin(excess, g->cfg.max_hold_ns);
    int64_t cap = d->held_since + (int64_t)g->cfg.max_continuous_ns;
    if (g->cfg.fresh) {
        int64_t t = end > d->time_until ? end : d->time_until;
        d->time_until = t < cap ? t : cap, d->waiting = 1;
        end = cap;
    } else if (end >= cap) {
        end = cap;
        d->open_until = cap + (int64_t)g->cfg.max_hold_ns;
    }
    d->held_ns += (double)(end - (d->held_until > now ? d->held_until : now));
    d->held_until = end;
    *hold_ns = (double)(end - now), *until_ns = end;
    return G_ABOVE;
}

/* Gate.overdue for destination ``i``: its probe sent at ``sent`` has no echo by ``now``; its
 * last echo came at ``answered`` (``has_answered`` 0: never). The reason; *hold_ns as above. */
int npc_gate_overdue(struct npc_gate *g, int i, int64_t sent, int64_t now, int64_t answered,
                     int has_answered, int synced, double *hold_ns, int64_t *until_ns)
{
    struct gdest *d = &g->d[i];
    *hold_ns = 0.0, *until_ns = 0;
    if (!synced)
        return G_UNSYNCED;
    if (!g->cfg.fresh || (double)(now - sent) <= g->cfg.threshold_ns + g->cfg.max_hold_ns)
        return G_NOT_LATE;
    if (!has_answered || (double)(now - answered) > g->cfg.max_age_ns)
        return G_SILENT;
    if (now < d->held_until) {
        *until_ns = d->held_until;
        return G_GOES_ON;
    }
    if (d->waiting) {       /* the hold ran to its cap with no fresh sample below T */
        d->waiting = 0;
        d->open_until = d->held_until + (int64_t)g->cfg.max_hold_ns;
    }
    if (now < d->open_until)
        return G_OPEN_AFTER;
    int64_t end = now + (int64_t)g->cfg.max_continuous_ns;
    d->held_since = now, d->time_until = now, d->waiting = 1, d->spread_ns = 0.0;
    d->holds++;
    d->held_ns += (double)(end - now);
    d->held_until = end;
    *hold_ns = (double)(end - now), *until_ns = end;
    return G_OVERDUE;
}

void npc_gate_stats(const struct npc_gate *g, int i, int64_t *holds, double *held_ns)
{
    *holds = g->d[i].holds, *held_ns = g->d[i].held_ns;
}

/* ------------------------------------------------------------------------------- the engine */
struct npc_rec {            /* one OWD sample (agents/pacerio.py: RECORD) */
    int32_t dst, held;      /* held: 1 when this sample started or extended a hold */
    double owd_ns;
    int64_t tx_ns;
    int64_t wake_ns;        /* the echo's kernel arrival -> this thread handling it */
    int64_t react_ns;       /* the echo's kernel arrival -> hold applied (held only); both on
                               the VM clock: a clock step in between adds to that sample */
};

struct npc_dstats {         /* per destination, since the start */
    int64_t sent, echoed, samples, above, switches, switch_errors;  /* echoed: answering */
    int64_t stale;          /* echoes answering no unanswered probe (answered() 0): ignored */
    int64_t holds;          /* holds the gate started that held the destination (hold() 1) */
    int64_t overdue;        /* of them, started by a late echo (npc_gate_overdue) */
};

struct npc_counters {
    int64_t echoes_tx, recv_errors, dropped_records, netlink_errors, unprepared;
    int64_t send_errors[MAX_ERRNO];
};

struct dest {
    uint32_t ip;            /* network order */
    int active, synced, held;
    double off_ns, drift_ppm;
    int64_t next_probe, release_at, probed_at, syn_at;    /* CLOCK_MONOTONIC */
    struct probe {
        uint64_t seq;
        int64_t tx, sent;   /* its stamp (VM clock) and its send (CLOCK_MONOTONIC) */
    } out[OUTSTANDING];     /* unanswered probes, oldest (smallest seq) first */
    int64_t answered_at;    /* the last echo (CLOCK_MONOTONIC) */
    int unanswered;         /* how many: sent after the newest probe echoed (a path is FIFO:
                             * an echo answers for every probe sent before its own) */
    int has_answered;
    unsigned char hold_msg[MAX_MSG], open_msg[MAX_MSG];
    int hold_len, open_len;
    struct npc_dstats st;
};

struct npc {
    int fd, nl, pk, port, n, pace;
    int64_t probe_ns, t_ref, syn_active_ns;
    uint64_t seq;
    uint32_t nlseq;
    double me_off, me_drift;
    conv_fn conv;
    struct dest *d;
    struct npc_gate *gate;
    struct npc_rec *ring;
    int ring_cap, head, count;
    struct npc_counters c;
    pthread_mutex_t mu;
    pthread_t thread;
    int started;
    volatile int stop;
};

static int64_t clock_ns(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t to_vm(const struct npc *h, int64_t ns) { return h->conv ? h->conv(ns) : ns; }
static int64_t now_vm(const struct npc *h) { return to_vm(h, clock_ns(CLOCK_REALTIME)); }
static int64_t mono(void) { return clock_ns(CLOCK_MONOTONIC); }  /* scheduling (header) */

static void put_be(unsigned char *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

static uint64_t get_be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static void count_errno(struct npc *h, int e) { h->c.send_errors[e < MAX_ERRNO ? e : 0]++; }

/* ``n`` destinations (IPv4, network order); the pacers' UDP ``port``; ``pace`` 0: sense only.
 * ``fd``: bound UDP socket with SO_TIMESTAMPING (the caller's, kept open). NULL on failure. */
struct npc *npc_new(int fd, int port, int n, const uint32_t *ips, int pace,
                    const struct npc_gate_cfg *gcfg, int64_t probe_ns, int ring_cap,
                    conv_fn conv)
{
    struct npc *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->fd = fd, h->port = port, h->n = n, h->pace = pace, h->probe_ns = probe_ns;
    h->conv = conv, h->ring_cap = ring_cap;
    h->d = calloc(n > 0 ? n : 1, sizeof *h->d);
    h->ring = calloc(ring_cap, sizeof *h->ring);
    h->gate = npc_gate_new(gcfg, n);
    h->nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
    if (!h->d || !h->ring || !h->gate || h->nl < 0) {
        if (h->nl >= 0)
            close(h->nl);
        npc_gate_free(h->gate);
        free(h->ring);
        free(h->d);
        free(h);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        h->d[i].ip = ips[i];
    h->pk = -1;
    pthread_mutex_init(&h->mu, NULL);
    return h;
}

/* Watch interface ``ifindex``'s outgoing TCP SYNs (AF_PACKET, a classic BPF filter: outgoing,
 * IPv4, TCP, first fragment, SYN without ACK; every packet the interface sends is cloned for
 * the filter, as for tcpdump): a destination this VM opens a connection to is
 * probed at once and for ``active_ns`` (sock_diag, polled by Python every sense_s, sees a
 * connection's data only after its first window is in the queue). Before npc_start; 0 or
 * -errno (no CAP_NET_RAW). */
int npc_watch_syn(struct npc *h, int ifindex, int64_t active_ns)
{
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, SKF_AD_OFF + SKF_AD_PKTTYPE),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PACKET_OUTGOING, 0, 11),
        BPF_STMT(BPF_LD | BPF_H | BPF_ABS, SKF_AD_OFF + SKF_AD_PROTOCOL),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ETH_P_IP, 0, 9),
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 9),              /* IPv4 protocol */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_TCP, 0, 7),
        BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 6),              /* fragment offset */
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x1fff, 5, 0),
        BPF_STMT(BPF_LDX | BPF_B | BPF_MSH, 0),             /* x = IP header length */
        BPF_STMT(BPF_LD | BPF_B | BPF_IND, 13),             /* TCP flags */
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0x12),          /* SYN | ACK */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x02, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, 64),
        BPF_STMT(BPF_RET | BPF_K, 0),
    };
    struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
    /* ETH_P_ALL: a packet socket of one protocol sees only received packets */
    int fd = socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, htons(ETH_P_ALL));
    if (fd < 0)
        return -errno;
    struct sockaddr_ll at = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
                             .sll_ifindex = ifindex};
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) < 0 ||
        bind(fd, (struct sockaddr *)&at, sizeof at) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    h->pk = fd, h->syn_active_ns = active_ns;
    return 0;
}

/* The switch of destination ``i``: its hold and open RTM_NEWQDISC messages (seq rewritten). */
int npc_set_switch(struct npc *h, int i, const unsigned char *hold, int hold_len,
                   const unsigned char *open, int open_len)
{
    if (i < 0 || i >= h->n || hold_len > MAX_MSG || open_len > MAX_MSG ||
        hold_len < (int)sizeof(struct nlmsghdr) || open_len < (int)sizeof(struct nlmsghdr))
        return -1;
    pthread_mutex_lock(&h->mu);
    memcpy(h->d[i].hold_msg, hold, hold_len);
    memcpy(h->d[i].open_msg, open, open_len);
    h->d[i].hold_len = hold_len, h->d[i].open_len = open_len;
    pthread_mutex_unlock(&h->mu);
    return 0;
}

/* Destination ``i`` (``i == n``: this VM, whose ``active`` is ignored): probed or not, gated or
 * not, and its clock's offset (ns) and drift (ppm) against the reference at ``t_ref`` (ns). */
void npc_set_dest(struct npc *h, int i, int active, int synced, double off_ns, double drift_ppm,
                  int64_t t_ref)
{
    pthread_mutex_lock(&h->mu);
    h->t_ref = t_ref;
    if (i == h->n) {
        h->me_off = off_ns, h->me_drift = drift_ppm;
    } else if (i >= 0 && i < h->n) {
        struct dest *d = &h->d[i];
        d->active = active, d->synced = synced, d->off_ns = off_ns, d->drift_ppm = drift_ppm;
    }
    pthread_mutex_unlock(&h->mu);
}

/* A VM clock's offset against the reference at its own reading ``at`` (ns), from its offset
 * ``off`` (ns) and drift (ppm) at reference time ``t_ref``: the same as
 * contracts.messages.ClockEstimate.offset_at_vm (a unit test checks both on the same numbers). */
double npc_offset_at_vm(double off, double drift, int64_t t_ref, int64_t at)
{
    double elapsed = (double)(at - t_ref) - off;
    return off + drift * 1e-6 * elapsed;
}

static double theta(const struct npc *h, double off, double drift, int64_t at)
{
    return npc_offset_at_vm(off, drift, h->t_ref, at);
}

static void emit(struct npc *h, const struct npc_rec *r)
{
    if (h->count == h->ring_cap) {   /* full: the oldest goes */
        h->head = (h->head + 1) % h->ring_cap;
        h->count--;
        h->c.dropped_records++;
    }
    h->ring[(h->head + h->count) % h->ring_cap] = *r;
    h->count++;
}

static int nl_send(struct npc *h, unsigned char *msg, int len)
{
    ((struct nlmsghdr *)msg)->nlmsg_seq = ++h->nlseq;
    struct sockaddr_nl to = {.nl_family = AF_NETLINK};
    return sendto(h->nl, msg, len, 0, (struct sockaddr *)&to, sizeof to) == len ? 0 : -1;
}

static void send_probe(struct npc *h, int i, int64_t now)
{
    struct dest *d = &h->d[i];
    unsigned char b[PROBE_LEN] = "NSPC";
    int64_t tx = now_vm(h), sent = mono();
    b[4] = KIND_PROBE;
    put_be(b + 8, ++h->seq, 8);
    put_be(b + 16, (uint64_t)tx, 8);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(h->port),
                             .sin_addr.s_addr = d->ip};
    d->next_probe = now + h->probe_ns;
    d->probed_at = now;
    if (sendto(h->fd, b, sizeof b, MSG_DONTWAIT, (struct sockaddr *)&to, sizeof to) < 0) {
        count_errno(h, errno);
        return;
    }
    d->st.sent++;
    if (d->unanswered == OUTSTANDING) {     /* the oldest is taken as lost */
        memmove(d->out, d->out + 1, (OUTSTANDING - 1) * sizeof *d->out);
        d->unanswered--;
    }
    d->out[d->unanswered++] = (struct probe){h->seq, tx, sent};
}

/* The echo of probe ``seq`` stamped ``tx`` answers for it and every probe sent before it; 0
 * when it is no unanswered probe's (a duplicate, a late echo of a probe taken as lost, or an
 * echo of a previous pacer on this port: another seq or stamp). By seq, not by stamp: after
 * the VM clock steps back, a new probe is stamped before the older ones still unanswered.
 * *sent: the probe's send (CLOCK_MONOTONIC). */
static int answered(struct dest *d, uint64_t seq, int64_t tx, int64_t *sent)
{
    int k = 0;
    while (k < d->unanswered && d->out[k].seq != seq)
        k++;
    if (k == d->unanswered || d->out[k].tx != tx)
        return 0;
    *sent = d->out[k++].sent;
    memmove(d->out, d->out + k, (d->unanswered - k) * sizeof *d->out);
    d->unanswered -= k;
    return 1;
}

/* When destination ``d`` may be probed next: its period, later while IN_FLIGHT probes are
 * unanswered (until an echo of one of them, or max_age_ns after the last probe: echoes get
 * lost). Before, any echo reset the count: under a long queue each echo let 2 more probes in,
 * and the probes in flight grew to the queue's delay over the period (26 of a 50-packet queue's
 * packets were 66-byte probes, measured). */
static int64_t probe_due(const struct npc *h, const struct dest *d)
{
    if (d->unanswered < IN_FLIGHT)
        return d->next_probe;
    int64_t late = d->probed_at + (int64_t)h->gate->cfg.max_age_ns;
    return late > d->next_probe ? late : d->next_probe;
}

static int find(const struct npc *h, uint32_t ip)
{
    for (int i = 0; i < h->n; i++)
        if (h->d[i].ip == ip)
            return i;
    return -1;
}

/* Probed: active by sock_diag (Python) or by a SYN within syn_active_ns. */
static int active(const struct npc *h, const struct dest *d, int64_t now)
{
    return d->active || (d->syn_at && now - d->syn_at < h->syn_active_ns);
}

static void on_syns(struct npc *h)
{
    unsigned char b[64];
    ssize_t len;
    while ((len = recv(h->pk, b, sizeof b, MSG_DONTWAIT)) >= 20) {
        uint32_t dst;
        memcpy(&dst, b + 16, 4);
        pthread_mutex_lock(&h->mu);
        int i = find(h, dst);
        if (i >= 0) {
            int64_t now = mono();
            h->d[i].syn_at = now, h->d[i].next_probe = now;
        }
        pthread_mutex_unlock(&h->mu);
    }
}

/* Hold destination ``i`` until ``until`` (its prebuilt message; when it was open, a fresh probe
 * goes out at once, whatever is unanswered: the hold waits for a sample sent in it, and the
 * switch counts as a hold: ``holds`` are the holds that held, whichever sample or extension
 * of the gate's hold made the switch). 1 when it is held now. */
static int hold(struct npc *h, int i, int64_t until, int64_t now)
{
    struct dest *d = &h->d[i];
    if (!d->held) {
        if (!d->hold_len) {
            h->c.unprepared++;
        } else if (nl_send(h, d->hold_msg, d->hold_len) == 0) {
            d->held = 1;
            d->st.switches++;
            d->st.holds++;
            send_probe(h, i, now);
        } else {
            d->st.switch_errors++;
        }
    }
    d->release_at = until;
    return d->held;
}

static void on_echo(struct npc *h, int i, uint64_t seq, int64_t tx, int64_t prx, int64_t seen)
{
    struct dest *d = &h->d[i];
    int64_t sent;
    if (!answered(d, seq, tx, &sent)) {
        d->st.stale++;
        return;
    }
    int64_t now = mono();
    d->st.echoed++;
    d->answered_at = now, d->has_answered = 1;
    if (!d->synced)
        return;
    double owd = (double)(prx - tx) - theta(h, d->off_ns, d->drift_ppm, prx)
                 + theta(h, h->me_off, h->me_drift, tx);
    struct npc_rec r = {.dst = i, .owd_ns = owd, .tx_ns = tx, .wake_ns = now_vm(h) - seen};
    d->st.samples++;
    if (owd > h->gate->cfg.threshold_ns)
        d->st.above++;
    if (h->pace) {
        double hold_ns;
        int64_t until;
        int why = npc_gate_decide(h->gate, i, owd, sent, now, 1, &hold_ns, &until);
        if (why == G_FRESH && d->held)
            d->release_at = until;
        if (hold_ns > 0 && hold(h, i, until, now)) {
            r.held = 1;
            r.react_ns = now_vm(h) - seen;
        }
    }
    emit(h, &r);
}

static int64_t stamp_of(const struct npc *h, struct msghdr *m)
{
    int64_t ns = kernel_stamp_ns(m);
    return ns ? to_vm(h, ns) : now_vm(h);
}

static void receive(struct npc *h)
{
    static __thread unsigned char buf[BATCH][SLOT], ctl[BATCH][CTL];
    static __thread struct sockaddr_in from[BATCH];
    struct mmsghdr mm[BATCH];
    struct iovec iov[BATCH];
    for (;;) {
        for (int k = 0; k < BATCH; k++) {
            iov[k] = (struct iovec){buf[k], SLOT};
            mm[k].msg_hdr = (struct msghdr){.msg_name = &from[k], .msg_namelen = sizeof from[k],
                                            .msg_iov = &iov[k], .msg_iovlen = 1,
                                            .msg_control = ctl[k], .msg_controllen = CTL};
        }
        int got = recvmmsg(h->fd, mm, BATCH, MSG_DONTWAIT, NULL);
        if (got <= 0) {
            if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                h->c.recv_errors++;
            return;
        }
        pthread_mutex_lock(&h->mu);
        for (int k = 0; k < got; k++) {
            unsigned char *p = buf[k];
            unsigned len = mm[k].msg_len;
            if (len < PROBE_LEN || memcmp(p, "NSPC", 4))
                continue;
            int64_t rx = stamp_of(h, &mm[k].msg_hdr);
            if (len == PROBE_LEN && p[4] == KIND_PROBE) {
                unsigned char e[ECHO_LEN];
                memcpy(e, p, PROBE_LEN);
                e[4] = KIND_ECHO;
                put_be(e + 24, (uint64_t)rx, 8);
                if (sendto(h->fd, e, sizeof e, MSG_DONTWAIT, (struct sockaddr *)&from[k],
                           sizeof from[k]) < 0)
                    count_errno(h, errno);
                else
                    h->c.echoes_tx++;
            } else if (len == ECHO_LEN && p[4] == KIND_ECHO) {
                int i = find(h, from[k].sin_addr.s_addr);
                if (i >= 0)
                    on_echo(h, i, get_be(p + 8, 8), (int64_t)get_be(p + 16, 8),
                            (int64_t)get_be(p + 24, 8), rx);
            }
        }
        pthread_mutex_unlock(&h->mu);
        if (got < BATCH)
            return;
    }
}

static void drain_netlink(struct npc *h)
{
    unsigned char b[4096];
    ssize_t len;
    while ((len = recv(h->nl, b, sizeof b, MSG_DONTWAIT)) > 0) {
        for (struct nlmsghdr *m = (struct nlmsghdr *)b; NLMSG_OK(m, (size_t)len);
             m = NLMSG_NEXT(m, len)) {
            if (m->nlmsg_type == NLMSG_ERROR &&
                ((struct nlmsgerr *)NLMSG_DATA(m))->error != 0)
                h->c.netlink_errors++;
        }
    }
}

/* Destination ``i``'s oldest unanswered probe, when it is late (npc_gate_overdue): a hold.
 * When to look again (ns, CLOCK_MONOTONIC; INT64_MAX: nothing to watch until an echo or a
 * probe). */
static int64_t watch_echo(struct npc *h, int i, int64_t now)
{
    struct dest *d = &h->d[i];
    if (!h->pace || !d->synced || !d->unanswered || d->held)
        return INT64_MAX;
    int64_t late = d->out[0].sent +
                   (int64_t)(h->gate->cfg.threshold_ns + h->gate->cfg.max_hold_ns) + 1;
    if (now < late)
        return late;
    double hold_ns;
    int64_t until;
    int why = npc_gate_overdue(h->gate, i, d->out[0].sent, now, d->answered_at,
                               d->has_answered, 1, &hold_ns, &until);
    if (why == G_OPEN_AFTER)    /* late still, and gated again when the open spell ends */
        return h->gate->d[i].open_until;
    if (hold_ns > 0 && hold(h, i, until, now))   /* it was open (above): a hold that held */
        d->st.overdue++;
    return INT64_MAX;
}

/* Releases due, late echoes, probes due; the next time something is due (ns,
 * CLOCK_MONOTONIC). */
static int64_t step(struct npc *h)
{
    int64_t now = mono(), next = now + IDLE_NS;
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < h->n; i++) {
        struct dest *d = &h->d[i];
        int kick = 0;
        int on = active(h, d, now);
        if (on) {
            int64_t late = watch_echo(h, i, now);
            if (late < next)
                next = late;
        }
        if (d->held && d->release_at <= now) {
            if (nl_send(h, d->open_msg, d->open_len) == 0) {
                d->held = 0;
                d->st.switches++;
                kick = 1;   /* a packet on the interface wakes the released queue (hold.py) */
            } else {
                d->st.switch_errors++;
            }
        }
        if (kick || (on && probe_due(h, d) <= now))
            send_probe(h, i, now);
        if (d->held && d->release_at < next)
            next = d->release_at;
        if (on && probe_due(h, d) < next)
            next = probe_due(h, d);
    }
    pthread_mutex_unlock(&h->mu);
    return next;
}

static void *run(void *arg)
{
    struct npc *h = arg;
    struct pollfd p[3] = {{.fd = h->fd, .events = POLLIN}, {.fd = h->nl, .events = POLLIN},
                          {.fd = h->pk, .events = POLLIN}};   /* pk -1: ignored */
    while (!h->stop) {
        int64_t wait = step(h) - mono();
        if (wait < 0)
            wait = 0;
        struct timespec ts = {wait / 1000000000, wait % 1000000000};
        if (ppoll(p, 3, &ts, NULL) > 0) {
            if (p[2].revents & POLLIN)
                on_syns(h);
            if (p[0].revents & POLLIN)
                receive(h);
            if (p[1].revents & POLLIN)
                drain_netlink(h);
        }
    }
    return NULL;
}

int npc_start(struct npc *h)
{
    if (h->started)
        return 0;
    int e = pthread_create(&h->thread, NULL, run, h);
    h->started = e == 0;
    return -e;
}

/* Stop the thread and send every held destination's open message. */
void npc_stop(struct npc *h)
{
    if (h->started) {
        h->stop = 1;
        pthread_join(h->thread, NULL);
        h->started = 0;
    }
    for (int i = 0; i < h->n; i++)
        if (h->d[i].held && nl_send(h, h->d[i].open_msg, h->d[i].open_len) == 0)
            h->d[i].held = 0;
}

/* Up to ``max`` samples, oldest first, removed from the ring; how many. */
int npc_drain(struct npc *h, struct npc_rec *out, int max)
{
    pthread_mutex_lock(&h->mu);
    int k = 0;
    for (; k < max && h->count; k++) {
        out[k] = h->ring[h->head];
        h->head = (h->head + 1) % h->ring_cap;
        h->count--;
    }
    pthread_mutex_unlock(&h->mu);
    return k;
}

/* Destination ``i``'s counters and its gate's hold time (ns) now. */
void npc_stats(struct npc *h, int i, struct npc_dstats *out, double *held_ns)
{
    int64_t holds;
    pthread_mutex_lock(&h->mu);
    *out = h->d[i].st;
    npc_gate_stats(h->gate, i, &holds, held_ns);
    pthread_mutex_unlock(&h->mu);
}

void npc_counters(struct npc *h, struct npc_counters *out)
{
    pthread_mutex_lock(&h->mu);
    *out = h->c;
    pthread_mutex_unlock(&h->mu);
}

void npc_free(struct npc *h)
{
    if (!h)
        return;
    npc_stop(h);
    close(h->nl);
    if (h->pk >= 0)
        close(h->pk);
    pthread_mutex_destroy(&h->mu);
    npc_gate_free(h->gate);
    free(h->ring);
    free(h->d);
    free(h);
}
