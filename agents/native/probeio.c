/* libnslabprobeio.so: the agent's datagram path and its loop, compiled (agents/probeio.py loads
 * it with ctypes; agents/agent.py keeps the peers, the clock and the reports).
 *
 * The agent calls nsp_run once per report period; it loops, sleeping until the next send on
 * CLOCK_MONOTONIC (an absolute deadline), and at every wake-up
 *   1. drains the socket's error queue with recvmmsg (MSG_ERRQUEUE): the kernel's software TX
 *      stamp of each probe sent, matched to the probe by its seq;
 *   2. drains the receive queue with recvmmsg: validates each probe in the order of
 *      agents/probe.py's ProbeFilter (length, magic, version, authentication, fields, sender,
 *      source address, destination, replay window: RFC 4303 3.4.3 with a bitmap, RFC 6479),
 *      keeps the RX stamps of the last 64 pairs per sender and, when a follow-up arrives,
 *      emits one record (peer, pair_id, idx, tx_ns, rx_ns) per probe of the pair it names;
 *   3. when a send is due, sends the next pairs of the round (a coded pair, two back-to-back
 *      probes, to each; the follow-up of the previous pair to that peer in both) with
 *      sendmmsg. A round gives every active peer one pair, in a random order; rounds are
 *      1/rate apart on average (uniform jitter +-50 %, so agents never lock in phase), so each
 *      active peer gets ``rate`` pairs/s. A round leaves in sends of at most ``per_send``
 *      pairs (0: all at once), spread evenly over it: the agent wakes ``rate`` x
 *      ceil(peers / per_send) times a second, not once per pair, and its own NIC's queue never
 *      holds more than 2 x ``per_send`` of its probes at once (a round of 2 x (peers) probes
 *      back to back overflows a shallow queue at a low line rate).
 * Each pair's two probes leave back to back; a pair may queue behind its send's earlier pairs,
 * but its place is random, so the lower envelopes the coordinator fits (the least-delayed
 * probes) see sends where it was first.
 * The probe layout is agents/PROBE.md (version 1, big-endian); with a key every probe carries
 * HMAC-SHA256(key, bytes before the tag) truncated to 16 bytes (RFC 2104, RFC 4868; OpenSSL's
 * libcrypto).
 *
 * Stamps: the kernel's are CLOCK_REALTIME as this process sees them (with the lab's vmclock
 * preload, which wraps recvmmsg, clock_gettime and clock_nanosleep, they already are the VM
 * clock). ``conv`` turns such a stamp into the VM clock (agents.clock's formula, called back
 * into Python) or, when NULL, is the identity: every stamp a probe or a record carries is on
 * the VM clock.
 * Sources: Linux recvmmsg(2), sendmmsg(2), clock_nanosleep(2),
 * Documentation/networking/timestamping.rst.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "stamp.h"

#define BATCH 64            /* datagrams per system call */
#define SLOT 2048           /* bytes read per datagram (a probe is at most 1472) */
#define CTL 512             /* ancillary bytes per datagram */
#define HDR 56
#define TAG 16
#define MAGIC 0x4E53
#define VERSION 1
#define F_AUTH 1
#define F_FOLLOWUP 2
#define F_FU_USER 4
#define INFLIGHT 64         /* pairs kept per sender awaiting their follow-up */
#define PENDING 4096        /* probes awaiting their TX stamp */
#define WINDOW 256          /* replay window, sequences */
#define MAX_ERRNO 256

/* reject reasons, in agents.probe.REASONS order */
enum { R_SHORT, R_MAGIC, R_VERSION, R_NO_AUTH, R_UNEXPECTED_AUTH, R_HMAC, R_FIELD, R_SENDER,
       R_SRC, R_DST, R_REPLAY, N_REASONS };

typedef int64_t (*conv_fn)(int64_t);

/* counters read by the agent (agents/probeio.py mirrors this layout) */
struct nsp_counters {
    int64_t probes_tx, probes_rx, tx_user_stamps, rx_user_stamps, tx_stamps_missing,
        errqueue_errors, recv_errors;
    int64_t rejects[N_REASONS];
    int64_t send_errors[MAX_ERRNO];
};

struct nsp_record {         /* one probe's (tx, rx) */
    int32_t peer;
    uint32_t pair_id;
    int32_t idx, pad;
    int64_t tx_ns, rx_ns;
};

struct pair {
    uint32_t pair_id;
    uint8_t used, have[2];
    uint64_t order;
    int64_t rx[2];
};

struct peer {
    uint32_t id, ip;        /* probe id; IPv4 address, network order */
    /* sending: the last pair sent to it */
    int sent;
    uint32_t last_pair;
    uint8_t have_tx[2], have_user[2];
    int64_t tx[2], user[2]; /* kernel TX stamps (VM ns); user-space stamps (raw ns) */
    /* receiving */
    int seen;
    uint64_t highest, window[WINDOW / 64];
    struct pair inflight[INFLIGHT + 1];
    uint64_t orders;
    int64_t rx_run;
};

struct pend {
    uint64_t seq;
    int32_t peer, idx;
    uint32_t pair_id;
    uint8_t used;
};

struct nsp {
    int fd, size, port, npeers;
    uint32_t me;
    unsigned char key[256];
    int keylen;
    uint64_t seq;
    uint32_t pair_seq;
    int64_t run;            /* nsp_run calls, for the peers heard in each */
    double rate;            /* rounds per second */
    int per_send;           /* pairs per send at most (0: a whole round) */
    uint64_t rng;           /* xorshift64* state */
    int64_t next_send;      /* CLOCK_MONOTONIC ns (0: at the first wake-up) */
    int64_t step_ns;        /* between the sends of this round */
    int nactive, round_n, round_pos;
    int *active, *order;    /* active peers (indices); this round's order, its next pair */
    conv_fn conv;
    struct peer *peers;
    struct pend pending[PENDING];
    struct nsp_counters c;
    unsigned char rx[BATCH][SLOT], errq[BATCH][SLOT], ctl[BATCH][CTL], tx[2 * BATCH][1472];
};

static int64_t realtime_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift generators"):
 * uniform in [0, 1) */
static double uniform(struct nsp *h)
{
    h->rng ^= h->rng >> 12;
    h->rng ^= h->rng << 25;
    h->rng ^= h->rng >> 27;
    return (h->rng * 0x2545F4914F6CDD1DULL >> 11) * 0x1p-53;
}

static int64_t to_vm(struct nsp *h, int64_t ns) { return h->conv ? h->conv(ns) : ns; }

static uint64_t get_be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static void put_be(unsigned char *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = v & 0xff;
}

static void tag(struct nsp *h, const unsigned char *data, size_t n, unsigned char *out)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    HMAC(EVP_sha256(), h->key, h->keylen, data, n, md, &len);
    memcpy(out, md, TAG);
}

void nsp_free(struct nsp *h)
{
    if (h) {
        free(h->peers);
        free(h->active);
        free(h->order);
        free(h);
    }
}

/* A new agent: ``fd`` a bound, non-blocking UDP socket with SO_TIMESTAMPING set; ``me`` this
 * VM's probe id; peer k has probe id ``ids[k]`` and address ``ips[k]`` (network order), all on
 * ``port``; probes are ``size`` bytes; ``key`` (``keylen`` 0: none) the HMAC key; ``seq`` and
 * ``pair_seq`` the first probe sequence and pair id; ``rate`` rounds per second; ``per_send``
 * the most pairs sent together (0: a whole round); ``seed`` the rounds' jitter's and order's
 * random seed; ``conv`` NULL or the VM clock. No peer is active (nsp_active). NULL when out of
 * memory, ``size`` is not 56..1472, the key is longer than 256 bytes, ``rate`` is not > 0 or
 * ``per_send`` < 0. */
struct nsp *nsp_new(int fd, uint32_t me, int npeers, const uint32_t *ids, const uint32_t *ips,
                    int port, int size, const unsigned char *key, int keylen, uint64_t seq,
                    uint32_t pair_seq, double rate, int per_send, uint64_t seed, conv_fn conv)
{
    if (keylen < 0 || keylen > 256 || size < HDR || size > 1472 || !(rate > 0) || per_send < 0)
        return NULL;
    struct nsp *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    int n = npeers ? npeers : 1;
    h->peers = calloc(n, sizeof *h->peers);
    h->active = calloc(n, sizeof *h->active);
    h->order = calloc(n, sizeof *h->order);
    if (!h->peers || !h->active || !h->order) {
        nsp_free(h);
        return NULL;
    }
    h->fd = fd, h->me = me, h->npeers = npeers, h->port = port, h->size = size;
    memcpy(h->key, key, keylen);
    h->keylen = keylen, h->seq = seq, h->pair_seq = pair_seq, h->conv = conv;
    h->rate = rate, h->per_send = per_send, h->rng = seed | 1;
    for (int k = 0; k < npeers; k++) {
        h->peers[k].id = ids[k];
        h->peers[k].ip = ips[k];
        h->peers[k].rx_run = -1;
    }
    return h;
}

const struct nsp_counters *nsp_counters(const struct nsp *h) { return &h->c; }

/* ---- error queue: TX stamps ---------------------------------------------------------- */
static void tx_stamp(struct nsp *h, uint64_t seq, int64_t stamp)
{
    struct pend *e = &h->pending[seq % PENDING];
    if (!stamp || !e->used || e->seq != seq)
        return;
    e->used = 0;
    struct peer *p = &h->peers[e->peer];
    if (p->sent && p->last_pair == e->pair_id) {
        p->tx[e->idx] = to_vm(h, stamp);
        p->have_tx[e->idx] = 1;
    }
}

static void drain_errqueue(struct nsp *h)
{
    struct mmsghdr m[BATCH];
    struct iovec v[BATCH];
    for (;;) {
        for (int i = 0; i < BATCH; i++) {
            v[i] = (struct iovec){h->errq[i], SLOT};
            m[i].msg_hdr = (struct msghdr){.msg_iov = &v[i], .msg_iovlen = 1,
                                           .msg_control = h->ctl[i], .msg_controllen = CTL};
        }
        int n = recvmmsg(h->fd, m, BATCH, MSG_ERRQUEUE | MSG_DONTWAIT, NULL);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                h->c.errqueue_errors++;
            return;
        }
        for (int i = 0; i < n; i++) {
            /* the queued packet may carry L2/L3/L4 headers: the probe is its tail */
            int tail = (int)m[i].msg_len - h->size;
            const unsigned char *p = h->errq[i] + tail;
            if (tail >= 0 && get_be(p, 2) == MAGIC)
                tx_stamp(h, get_be(p + 12, 8), kernel_stamp_ns(&m[i].msg_hdr));
        }
        if (n < BATCH)
            return;
    }
}

/* ---- receiving ----------------------------------------------------------------------- */
static int replay_ok(struct peer *p, uint64_t seq)
{
    if (!p->seen || seq > p->highest) {
        uint64_t shift = p->seen ? seq - p->highest : WINDOW;
        if (shift >= WINDOW) {
            memset(p->window, 0, sizeof p->window);
        } else {
            for (uint64_t s = p->highest + 1; s != seq; s++)
                p->window[s % WINDOW / 64] &= ~(1ULL << (s % 64));
        }
        p->seen = 1;
        p->highest = seq;
        p->window[seq % WINDOW / 64] |= 1ULL << (seq % 64);
        return 1;
    }
    if (p->highest - seq >= WINDOW || p->window[seq % WINDOW / 64] >> (seq % 64) & 1)
        return 0;
    p->window[seq % WINDOW / 64] |= 1ULL << (seq % 64);
    return 1;
}

/* Validate one datagram from ``ip`` (network order), as ProbeFilter.check: the peer's index,
 * or -1 with the reason counted. */
int nsp_check(struct nsp *h, const unsigned char *d, int n, uint32_t ip)
{
    int reason;
    if (n < HDR) {
        reason = R_SHORT;
    } else if (get_be(d, 2) != MAGIC) {
        reason = R_MAGIC;
    } else if (d[2] != VERSION) {
        reason = R_VERSION;
    } else if (h->keylen && !(d[3] & F_AUTH)) {
        reason = R_NO_AUTH;
    } else if (h->keylen && n < HDR + TAG) {
        reason = R_SHORT;
    } else if (!h->keylen && d[3] & F_AUTH) {
        reason = R_UNEXPECTED_AUTH;
    } else {
        if (h->keylen) {
            unsigned char t[TAG];
            tag(h, d, n - TAG, t);
            if (CRYPTO_memcmp(t, d + n - TAG, TAG)) {
                h->c.rejects[R_HMAC]++;
                return -1;
            }
        }
        uint32_t src = get_be(d + 4, 4);
        int k = 0;
        while (k < h->npeers && h->peers[k].id != src)
            k++;
        if (d[24] > 1)
            reason = R_FIELD;
        else if (k == h->npeers)
            reason = R_SENDER;
        else if (h->peers[k].ip != ip)
            reason = R_SRC;
        else if (get_be(d + 8, 4) != h->me)
            reason = R_DST;
        else if (!replay_ok(&h->peers[k], get_be(d + 12, 8)))
            reason = R_REPLAY;
        else {
            h->c.probes_rx++;
            return k;
        }
    }
    h->c.rejects[reason]++;
    return -1;
}

static struct pair *pair_get(struct peer *p, uint32_t pair_id, int create)
{
    struct pair *oldest = NULL, *free_slot = NULL;
    int used = 0;
    for (int i = 0; i <= INFLIGHT; i++) {
        struct pair *e = &p->inflight[i];
        if (!e->used) {
            free_slot = free_slot ? free_slot : e;
            continue;
        }
        if (e->pair_id == pair_id)
            return e;
        used++;
        if (!oldest || e->order < oldest->order)
            oldest = e;
    }
    if (!create)
        return NULL;
    if (used >= INFLIGHT) { /* keep the newest 64, as the Python agent's OrderedDict */
        oldest->used = 0;
        free_slot = oldest;
    }
    *free_slot = (struct pair){.pair_id = pair_id, .used = 1, .order = p->orders++};
    return free_slot;
}

/* One valid probe from peer k: keep its RX stamp; a follow-up completes an earlier pair. */
static int take(struct nsp *h, int k, const unsigned char *d, int64_t stamp,
                  struct nsp_record *rec, int nrec, int *rx_peers, int *nrx)
{
    struct peer *p = &h->peers[k];
    int64_t rx;
    if (stamp) {
        rx = to_vm(h, stamp);
    } else {
        h->c.rx_user_stamps++;
        rx = to_vm(h, realtime_ns());
    }
    if (p->rx_run != h->run) {
        p->rx_run = h->run;
        rx_peers[(*nrx)++] = k;
    }
    struct pair *e = pair_get(p, get_be(d + 20, 4), 1);
    int idx = d[24];
    e->rx[idx] = rx;
    e->have[idx] = 1;
    if (!(d[3] & F_FOLLOWUP))
        return nrec;
    uint32_t fu = get_be(d + 36, 4);
    struct pair *done = pair_get(p, fu, 0);
    if (!done)
        return nrec;
    done->used = 0;
    for (int i = 0; i < 2; i++) {
        if (done->have[i])
            rec[nrec++] = (struct nsp_record){.peer = k, .pair_id = fu, .idx = i,
                                              .tx_ns = (int64_t)get_be(d + 40 + 8 * i, 8),
                                              .rx_ns = done->rx[i]};
    }
    return nrec;
}

/* ---- sending ------------------------------------------------------------------------- */
static void encode(struct nsp *h, unsigned char *b, int dst, uint32_t pair_id, int idx,
                   int64_t tx_ns, int flags, uint32_t fu, int64_t fu0, int64_t fu1)
{
    memset(b, 0, h->size);
    put_be(b, MAGIC, 2);
    b[2] = VERSION;
    b[3] = flags | (h->keylen ? F_AUTH : 0);
    put_be(b + 4, h->me, 4);
    put_be(b + 8, h->peers[dst].id, 4);
    put_be(b + 12, h->seq, 8);
    put_be(b + 20, pair_id, 4);
    b[24] = idx;
    put_be(b + 28, (uint64_t)tx_ns, 8);
    put_be(b + 36, fu, 4);
    put_be(b + 40, (uint64_t)fu0, 8);
    put_be(b + 48, (uint64_t)fu1, 8);
    if (h->keylen)
        tag(h, b, h->size - TAG, b + h->size - TAG);
}

static void send_pairs(struct nsp *h, const int *due, int ndue)
{
    struct sockaddr_in to[2 * BATCH];
    struct mmsghdr m[2 * BATCH];
    struct iovec v[2 * BATCH];
    int npk = 0;
    int64_t tx_ns = to_vm(h, realtime_ns());
    uint64_t seq0 = h->seq;
    for (int j = 0; j < ndue && j < BATCH; j++) {
        struct peer *p = &h->peers[due[j]];
        uint32_t pid = h->pair_seq++;
        int flags = 0;
        uint32_t fu = 0;
        int64_t fu0 = 0, fu1 = 0;
        if (p->sent && p->have_tx[0] && p->have_tx[1]) {
            flags = F_FOLLOWUP, fu = p->last_pair, fu0 = p->tx[0], fu1 = p->tx[1];
        } else if (p->sent && p->have_user[0] && p->have_user[1]) {
            h->c.tx_user_stamps += 2;
            flags = F_FOLLOWUP | F_FU_USER, fu = p->last_pair;
            fu0 = to_vm(h, p->user[0]), fu1 = to_vm(h, p->user[1]);
        }
        p->sent = 1, p->last_pair = pid;
        p->have_tx[0] = p->have_tx[1] = p->have_user[0] = p->have_user[1] = 0;
        for (int i = 0; i < 2; i++, npk++, h->seq++) {
            encode(h, h->tx[npk], due[j], pid, i, tx_ns, flags, fu, fu0, fu1);
            to[npk] = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(h->port),
                                           .sin_addr.s_addr = p->ip};
            v[npk] = (struct iovec){h->tx[npk], h->size};
            m[npk].msg_hdr = (struct msghdr){.msg_name = &to[npk], .msg_namelen = sizeof to[npk],
                                             .msg_iov = &v[npk], .msg_iovlen = 1};
        }
    }
    for (int k = 0; k < npk;) {
        int64_t user = realtime_ns();
        int r = sendmmsg(h->fd, m + k, npk - k, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            h->c.send_errors[errno < MAX_ERRNO ? errno : 0]++;
            k++;            /* skip the datagram that failed, send the rest */
            continue;
        }
        for (int i = 0; i < r; i++, k++) {
            int peer = due[k / 2], idx = k % 2;
            struct peer *p = &h->peers[peer];
            p->user[idx] = user;
            p->have_user[idx] = 1;
            struct pend *e = &h->pending[(seq0 + k) % PENDING];
            if (e->used)
                h->c.tx_stamps_missing++;
            *e = (struct pend){.seq = seq0 + k, .peer = peer, .idx = idx,
                               .pair_id = p->last_pair, .used = 1};
            h->c.probes_tx++;
        }
    }
}

/* Drain the receive queue into ``rec`` from ``out`` on (room for ``nrec`` records in all);
 * stops reading when fewer than 2 x 64 are left, setting ``*full``. Returns the records'
 * new count. */
static int drain_rx(struct nsp *h, struct nsp_record *rec, int out, int nrec, int *rx_peers,
                    int *nrx, int *full)
{
    struct sockaddr_in from[BATCH];
    struct mmsghdr m[BATCH];
    struct iovec v[BATCH];
    for (;;) {
        if (nrec - out < 2 * BATCH) {
            *full = 1;
            return out;
        }
        for (int i = 0; i < BATCH; i++) {
            v[i] = (struct iovec){h->rx[i], SLOT};
            m[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_namelen = sizeof from[i],
                                           .msg_iov = &v[i], .msg_iovlen = 1,
                                           .msg_control = h->ctl[i], .msg_controllen = CTL};
        }
        int n = recvmmsg(h->fd, m, BATCH, MSG_DONTWAIT, NULL);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                h->c.recv_errors++;
            return out;
        }
        for (int i = 0; i < n; i++) {
            int len = m[i].msg_len > SLOT ? SLOT : (int)m[i].msg_len;
            int k = nsp_check(h, h->rx[i], len, from[i].sin_addr.s_addr);
            if (k >= 0)
                out = take(h, k, h->rx[i], kernel_stamp_ns(&m[i].msg_hdr), rec, out, rx_peers, nrx);
        }
        if (n < BATCH)
            return out;
    }
}

/* A new round: the active peers in a random order (Fisher-Yates), its length drawn
 * ((0.5 + U) / rate) and split evenly between its sends. */
static void new_round(struct nsp *h)
{
    int n = h->nactive;
    memcpy(h->order, h->active, n * sizeof *h->order);
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(uniform(h) * (i + 1)), t = h->order[i];
        h->order[i] = h->order[j], h->order[j] = t;
    }
    int per = h->per_send && h->per_send < n ? h->per_send : (n ? n : 1);
    int sends = (n + per - 1) / per;
    h->round_n = n, h->round_pos = 0;
    h->step_ns = (int64_t)((0.5 + uniform(h)) / h->rate * 1e9) / (sends ? sends : 1);
}

/* The round's next send (a new round first when the last is done): at most ``per_send``
 * pairs, 64 per sendmmsg. */
static void send_due(struct nsp *h)
{
    if (h->round_pos >= h->round_n)
        new_round(h);
    int left = h->round_n - h->round_pos;
    int k = h->per_send && h->per_send < left ? h->per_send : left;
    for (int i = 0; i < k; i += BATCH)
        send_pairs(h, h->order + h->round_pos + i, k - i < BATCH ? k - i : BATCH);
    h->round_pos += k;      /* no active peer: an empty round, a new one at the next send */
}

/* The peers that get a pair in every round: ``n`` indices into the peer table (a changed set
 * starts a new round at the next send). Returns 0, or -1 (nothing changed) when an index is
 * out of range or repeated. */
int nsp_active(struct nsp *h, const int *peers, int n)
{
    if (n < 0 || n > h->npeers)
        return -1;
    for (int i = 0; i < n; i++) {
        if (peers[i] < 0 || peers[i] >= h->npeers)
            return -1;
        for (int j = 0; j < i; j++)
            if (peers[j] == peers[i])
                return -1;
    }
    if (n != h->nactive || memcmp(h->active, peers, n * sizeof *peers)) {
        memcpy(h->active, peers, n * sizeof *peers);
        h->nactive = n;
        h->round_pos = h->round_n;
    }
    return 0;
}

/* Set the round rate (rounds per second: the pairs each active peer gets a second) from the
 * next round on. Returns 0, or -1 when ``rate`` is not > 0. */
int nsp_rate(struct nsp *h, double rate)
{
    if (!(rate > 0))
        return -1;
    h->rate = rate;
    return 0;
}

/* The agent's loop for ``span_ns`` of CLOCK_MONOTONIC: at every wake-up drain the error queue
 * and the receive queue (records into ``rec``, room for ``nrec``) and send when a send is
 * due, then sleep until the next send or the end of the span (span 0: one wake-up's work).
 * ``rx_peers`` gets the peers that sent a valid probe during the call (``*nrx`` of them).
 * Returns the number of records, early when fewer than 2 x 64 records of room are left or a
 * signal interrupted the sleep (the caller handles it and calls again). */
int nsp_run(struct nsp *h, int64_t span_ns, struct nsp_record *rec, int nrec, int *rx_peers,
            int *nrx)
{
    int out = 0, full = 0;
    int64_t end = monotonic_ns() + span_ns;
    h->run++;
    *nrx = 0;
    for (;;) {
        drain_errqueue(h);
        out = drain_rx(h, rec, out, nrec, rx_peers, nrx, &full);
        int64_t now = monotonic_ns();
        if (now >= h->next_send) {
            send_due(h);
            int64_t gap = h->step_ns;
            /* on time: keep the mean rate; after a stall (or the first send): from now */
            h->next_send = h->next_send + gap > now ? h->next_send + gap : now + gap;
        }
        if (full || now >= end)
            return out;
        int64_t wake = h->next_send < end ? h->next_send : end;
        struct timespec ts = {wake / 1000000000, wake % 1000000000};
        int r = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        if (r == EINTR)
            return out;
    }
}

/* The report's packing (agents.messages.PackedRecords): ``n`` records of ``in`` grouped by
 * peer, in peer-index order and in their order within a peer, each as four little-endian
 * int64 (pair_id, idx, tx_ns, rx_ns) into ``out`` (room for 4 x n); ``counts[k]`` gets the
 * records of peer k (npeers entries). Returns 0, or -1 when a record names no peer. */
int nsp_pack(const struct nsp *h, const struct nsp_record *in, int n, int64_t *out,
             int32_t *counts)
{
    int np = h->npeers;
    memset(counts, 0, np * sizeof *counts);
    for (int i = 0; i < n; i++) {
        if (in[i].peer < 0 || in[i].peer >= np)
            return -1;
        counts[in[i].peer]++;
    }
    int64_t *at[np ? np : 1];
    for (int k = 0, off = 0; k < np; off += counts[k++])
        at[k] = out + 4 * (int64_t)off;
    for (int i = 0; i < n; i++) {
        int64_t *o = at[in[i].peer];
        o[0] = (int64_t)htole64((uint64_t)in[i].pair_id);
        o[1] = (int64_t)htole64((uint64_t)(int64_t)in[i].idx);
        o[2] = (int64_t)htole64((uint64_t)in[i].tx_ns);
        o[3] = (int64_t)htole64((uint64_t)in[i].rx_ns);
        at[in[i].peer] += 4;
    }
    return 0;
}
