/* vmclock: the VM clock for unmodified dynamically linked programs (LD_PRELOAD).
 *
 * Reads the VM's clock file (NSLAB_CLOCK, format nslab.clock/3 of agents/clock.py: the same
 * layout and the same formula, operation for operation) and gives the VM clock to
 *   clock_gettime (REALTIME, TAI and their COARSE forms; MONOTONIC, BOOTTIME without the
 *   steps; MONOTONIC_RAW without steps and corrections), gettimeofday, time, timespec_get;
 *   kernel receive/error-queue timestamps (SCM_TIMESTAMP, SCM_TIMESTAMPNS, SCM_TIMESTAMPING)
 *   of recvmsg and recvmmsg, and SIOCGSTAMP/SIOCGSTAMPNS;
 *   absolute deadlines (TIMER_ABSTIME, or the clock the call names or the object was made
 *   with) of clock_nanosleep, sem_timedwait/sem_clockwait, pthread_cond_timedwait/clockwait,
 *   pthread_mutex_timedlock/clocklock, pthread_rwlock_timed*lock/clock*lock and
 *   pthread_timedjoin_np/clockjoin_np, timerfd_settime (TFD_TIMER_ABSTIME, the timer's clock
 *   read from /proc/self/fdinfo) and timer_settime (TIMER_ABSTIME, the clock timer_create
 *   named) (not: mq_timed*, raw futex system calls);
 * and makes the VM's discipline calls act on the VM clock, never on the machine's, with the
 * semantics of Linux kernel/time/ntp.c (adjtimex(2)):
 *   adjtimex/ntp_adjtime/clock_adjtime(CLOCK_REALTIME) (frequency, tick, ADJ_SETOFFSET steps,
 *   status, maxerror growing by 500 us/s to STA_UNSYNC, esterror, time constant, ADJ_OFFSET:
 *   the kernel PLL/FLL with STA_PLL, its phase slewed at 2^-(2 + constant) of the rest per
 *   second), adjtime (ADJ_OFFSET_SINGLESHOT: a slew at 500 us/s), settimeofday,
 *   clock_settime(REALTIME).
 * A change is a new segment appended to the file under flock(<path>.lock), published by
 * write + rename, the old file then marked stale (agents.clock.ClockSpec.write).
 *
 * Without NSLAB_CLOCK every call is the libc one. Statically linked programs and Go programs
 * (which read the vDSO themselves) bypass it: they see the machine's true time.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/net_tstamp.h>
#include <linux/sockios.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/timerfd.h>
#include <sys/timex.h>
#include <time.h>
#include <unistd.h>

#define MAX_WANDER 4
#define NS 1000000000LL

struct hdr {
    char magic[8];
    uint32_t stale, nseg;
    char vm[32];
    int64_t tick, freq;
    int32_t status, pad;
    int64_t maxerror, esterror, constant;
    int64_t reftime_s;      /* the PLL's last update, VM seconds (the kernel's time_reftime) */
    int64_t maxerror_ns;    /* true time maxerror was set at */
};

struct seg {
    int64_t start_ns;
    double offset_ns, steps_ns, corr_ns, corr_ppm;
    int64_t epoch_ns;
    double base_ppm;
    uint32_t nwander, kind;
    double wander[MAX_WANDER][3];
    char host[32];
    double pll_ns, pll_rate, adj_ns;  /* slews left at start_ns (agents.clock.Segment) */
};

_Static_assert(sizeof(struct hdr) == 112, "header layout of agents/clock.py");
_Static_assert(sizeof(struct seg) == 216, "segment layout of agents/clock.py");

enum { K_START, K_STEP, K_MIGRATE, K_VM_FREQUENCY, K_VM_STEP, K_VM_SLEW };
enum { OFF_REALTIME, OFF_MONOTONIC, OFF_RAW };

struct map {
    const struct hdr *h;
    size_t len;
};

static struct map *cur;               /* the mapping in use (old ones stay mapped) */
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static int disabled;                  /* no NSLAB_CLOCK: pass everything through */

static int (*real_clock_gettime)(clockid_t, struct timespec *);

/* Exported so that agents.clock.preloaded() can tell the system clock is the VM clock. */
int nslab_vmclock_active = 1;

static void resolve(void)
{
    if (!real_clock_gettime)
        real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
}

static int64_t true_ns(clockid_t id)
{
    struct timespec ts;
    resolve();
    real_clock_gettime(id, &ts);
    return ts.tv_sec * NS + ts.tv_nsec;
}

static struct map *load(void)
{
    const char *path = getenv("NSLAB_CLOCK");
    if (!path || !*path)
        return NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    struct map *m = NULL;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(struct hdr)) {
        void *p = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        const struct hdr *h = p;
        if (p != MAP_FAILED && memcmp(h->magic, "NSLABCK3", 8) == 0 && h->nseg > 0 &&
            sizeof(struct hdr) + h->nseg * sizeof(struct seg) <= (size_t)st.st_size) {
            m = malloc(sizeof *m);
            m->h = h;
            m->len = st.st_size;
        } else if (p != MAP_FAILED) {
            munmap(p, st.st_size);
        }
    }
    close(fd);
    return m;
}

/* The current mapping, re-opened when a writer marked it stale; NULL: no VM clock. */
static const struct hdr *clock_map(void)
{
    struct map *m = __atomic_load_n(&cur, __ATOMIC_ACQUIRE);
    if (m && !__atomic_load_n(&m->h->stale, __ATOMIC_ACQUIRE))
        return m->h;
    if (disabled)
        return NULL;
    pthread_mutex_lock(&map_lock);
    m = cur;
    if (!m || m->h->stale) {
        struct map *n = load();
        if (n)
            __atomic_store_n(&cur, n, __ATOMIC_RELEASE);
        else if (!m)
            disabled = getenv("NSLAB_CLOCK") == NULL;
        m = cur;
    }
    pthread_mutex_unlock(&map_lock);
    return m ? m->h : NULL;
}

static const struct seg *segments(const struct hdr *h)
{
    return (const struct seg *)(h + 1);
}

static const struct seg *segment_at(const struct hdr *h, int64_t t)
{
    const struct seg *s = segments(h);
    uint32_t i = h->nseg - 1;
    while (i > 0 && s[i].start_ns > t)
        i--;
    return &s[i];
}

/* agents.clock.Oscillator.phase_ns */
static double phase_ns(const struct seg *s, int64_t t)
{
    double dt_ns = (double)(t - s->epoch_ns);
    double dt = dt_ns / 1e9;
    double acc = s->base_ppm * dt_ns;
    for (uint32_t i = 0; i < s->nwander && i < MAX_WANDER; i++) {
        double a = s->wander[i][0], p = s->wander[i][1], ph = s->wander[i][2];
        double swing = sin(2 * M_PI * dt / p + ph) - sin(ph);
        acc += a * p / (2 * M_PI) * swing * 1e9;
    }
    return acc * 1e-6;
}

#define ADJTIME_NS_PER_S 500000.0  /* adjtime's slew: the kernel's MAX_TICKADJ, 500 us/s */

/* agents.clock.Segment.pll_left_ns / adj_left_ns / slew_ns */
static double pll_left(const struct seg *s, int64_t t)
{
    return s->pll_ns * exp(-s->pll_rate * (double)(t - s->start_ns) / 1e9);
}

static double adj_left(const struct seg *s, int64_t t)
{
    double done = fmin(fabs(s->adj_ns), ADJTIME_NS_PER_S * (double)(t - s->start_ns) / 1e9);
    return s->adj_ns - copysign(done, s->adj_ns);
}

static double slew(const struct seg *s, int64_t t)
{
    return (s->pll_ns - pll_left(s, t)) + (s->adj_ns - adj_left(s, t));
}

/* agents.clock.Segment.offset_at / monotonic_offset_at / raw_offset_at */
static double seg_offset(const struct seg *s, int64_t t, int which)
{
    double swing = phase_ns(s, t) - phase_ns(s, s->start_ns);
    if (which == OFF_RAW)
        return (s->offset_ns - s->steps_ns - s->corr_ns) + swing;
    double off = s->offset_ns + swing + s->corr_ppm * (double)(t - s->start_ns) * 1e-6 +
        slew(s, t);
    return which == OFF_MONOTONIC ? off - s->steps_ns : off;
}

/* Exported for the test that holds agents/clock.py and this file to one formula. */
double nslab_vmclock_offset_ns(int which, int64_t t)
{
    const struct hdr *h = clock_map();
    return h ? seg_offset(segment_at(h, t), t, which) : NAN;
}

static int64_t to_vm(const struct hdr *h, int64_t t)
{
    return t + llrint(seg_offset(segment_at(h, t), t, OFF_REALTIME));
}

static void set_ts(struct timespec *ts, int64_t ns)
{
    ts->tv_sec = ns / NS;
    ts->tv_nsec = ns % NS;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += NS;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    resolve();
    const struct hdr *h = clock_map();
    int which;
    switch (id) {
    case CLOCK_REALTIME: case CLOCK_REALTIME_COARSE: case CLOCK_TAI:
        which = OFF_REALTIME; break;
    case CLOCK_MONOTONIC: case CLOCK_MONOTONIC_COARSE: case CLOCK_BOOTTIME:
        which = OFF_MONOTONIC; break;
    case CLOCK_MONOTONIC_RAW:
        which = OFF_RAW; break;
    default:
        return real_clock_gettime(id, ts);
    }
    if (!h)
        return real_clock_gettime(id, ts);
    struct timespec raw;
    int r = real_clock_gettime(id, &raw);
    if (r != 0 || !ts)
        return r;
    int64_t t = raw.tv_sec * NS + raw.tv_nsec;
    /* the formula runs on true CLOCK_REALTIME; other clocks differ from it by a constant on
       this machine (its clock is never stepped) */
    int64_t rt = which == OFF_REALTIME && id != CLOCK_TAI ? t : true_ns(CLOCK_REALTIME);
    set_ts(ts, t + llrint(seg_offset(segment_at(h, rt), rt, which)));
    return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    static int (*real)(struct timeval *, void *);
    if (!real)
        real = dlsym(RTLD_NEXT, "gettimeofday");
    if (!clock_map() || !tv)
        return real(tv, tz);
    if (tz)
        real(NULL, tz);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}

int timespec_get(struct timespec *ts, int base)
{
    if (base != TIME_UTC)
        return 0;
    clock_gettime(CLOCK_REALTIME, ts);
    return base;
}

/* ---- absolute deadlines ---- */

#define FOREVER_S (1LL << 32)
/* A deadline further than this (s, 136 years) is left as it is: programs write "never" as a
   huge tv_sec (C++'s time_point::max()), which the conversion's nanoseconds would overflow
   into a deadline already past. */

/* A deadline ``abs`` on the VM's clock ``id`` as one on the machine's: the VM interval left
   from now, on the machine's clock (off by the VM clock's rate error: its drift, < 1e-3,
   unless the VM's own adjtimex set another tick; a step of the VM clock during the wait does
   not move it). ``abs`` itself
   without a VM clock or with an invalid time (the real call then says EINVAL). Without this a
   program whose VM clock is behind the machine's spins through the last |offset| of every
   wait that re-waits its remainder (Python's Queue.get(timeout), its GIL's 5 ms waits), and
   one whose clock is ahead waits |offset| too long. */
static const struct timespec *true_deadline(clockid_t id, const struct timespec *abs,
                                            struct timespec *out)
{
    struct timespec vnow;
    if (!abs || abs->tv_sec < 0 || abs->tv_nsec < 0 || abs->tv_nsec >= NS || !clock_map() ||
        clock_gettime(id, &vnow) != 0 || abs->tv_sec - FOREVER_S > vnow.tv_sec)
        return abs;  /* the real call's EINVAL, or a deadline that means "never" */
    int64_t left = abs->tv_sec < vnow.tv_sec ? 0 :
        (abs->tv_sec - vnow.tv_sec) * NS + (abs->tv_nsec - vnow.tv_nsec);
    set_ts(out, true_ns(id) + (left > 0 ? left : 0));
    return out;
}

/* The libc function this file replaces, found once. */
#define REAL(name) static __typeof__(name) *real; if (!real) real = dlsym(RTLD_NEXT, #name)

int clock_nanosleep(clockid_t id, int flags, const struct timespec *req, struct timespec *rem)
{
    REAL(clock_nanosleep);
    struct timespec t;
    return real(id, flags, flags & TIMER_ABSTIME ? true_deadline(id, req, &t) : req, rem);
}

int sem_timedwait(sem_t *restrict sem, const struct timespec *restrict abs)
{
    REAL(sem_timedwait);
    struct timespec t;
    return real(sem, true_deadline(CLOCK_REALTIME, abs, &t));
}

int pthread_cond_timedwait(pthread_cond_t *restrict cond, pthread_mutex_t *restrict mutex,
                           const struct timespec *restrict abs)
{
    REAL(pthread_cond_timedwait);
    /* glibc keeps the condition's clock (pthread_condattr_setclock) in bit 1 of __wrefs
       (__PTHREAD_COND_CLOCK_MONOTONIC_MASK, nptl/pthreadP.h) */
    clockid_t id = __atomic_load_n(&cond->__data.__wrefs, __ATOMIC_RELAXED) & 2
        ? CLOCK_MONOTONIC : CLOCK_REALTIME;
    struct timespec t;
    return real(cond, mutex, true_deadline(id, abs, &t));
}

int pthread_mutex_timedlock(pthread_mutex_t *restrict mutex, const struct timespec *restrict abs)
{
    REAL(pthread_mutex_timedlock);
    struct timespec t;
    return real(mutex, true_deadline(CLOCK_REALTIME, abs, &t));
}

/* pthread_rwlock_timedrdlock, pthread_rwlock_timedwrlock */
#define RWLOCK_TIMED(op)                                                                   \
    int pthread_rwlock_timed##op##lock(pthread_rwlock_t *restrict lock,                    \
                                       const struct timespec *restrict abs)                \
    {                                                                                      \
        REAL(pthread_rwlock_timed##op##lock);                                              \
        struct timespec t;                                                                 \
        return real(lock, true_deadline(CLOCK_REALTIME, abs, &t));                         \
    }
RWLOCK_TIMED(rd)
RWLOCK_TIMED(wr)

int pthread_timedjoin_np(pthread_t thread, void **ret, const struct timespec *abs)
{
    REAL(pthread_timedjoin_np);
    struct timespec t;
    return real(thread, ret, true_deadline(CLOCK_REALTIME, abs, &t));
}

/* The calls that name their clock: glibc 2.30 (pthread_clockjoin_np 2.31); an older glibc
   (RHEL 8's 2.28) has none of them to replace. */
#if __GLIBC_PREREQ(2, 30)
int sem_clockwait(sem_t *restrict sem, clockid_t id, const struct timespec *restrict abs)
{
    REAL(sem_clockwait);
    struct timespec t;
    return real(sem, id, true_deadline(id, abs, &t));
}

int pthread_cond_clockwait(pthread_cond_t *restrict cond, pthread_mutex_t *restrict mutex,
                           clockid_t id, const struct timespec *restrict abs)
{
    REAL(pthread_cond_clockwait);
    struct timespec t;
    return real(cond, mutex, id, true_deadline(id, abs, &t));
}

int pthread_mutex_clocklock(pthread_mutex_t *restrict mutex, clockid_t id,
                            const struct timespec *restrict abs)
{
    REAL(pthread_mutex_clocklock);
    struct timespec t;
    return real(mutex, id, true_deadline(id, abs, &t));
}

/* pthread_rwlock_clockrdlock, pthread_rwlock_clockwrlock */
#define RWLOCK_CLOCK(op)                                                                   \
    int pthread_rwlock_clock##op##lock(pthread_rwlock_t *restrict lock, clockid_t id,      \
                                       const struct timespec *restrict abs)                \
    {                                                                                      \
        REAL(pthread_rwlock_clock##op##lock);                                              \
        struct timespec t;                                                                 \
        return real(lock, id, true_deadline(id, abs, &t));                                 \
    }
RWLOCK_CLOCK(rd)
RWLOCK_CLOCK(wr)
#endif

#if __GLIBC_PREREQ(2, 31)
int pthread_clockjoin_np(pthread_t thread, void **ret, clockid_t id, const struct timespec *abs)
{
    REAL(pthread_clockjoin_np);
    struct timespec t;
    return real(thread, ret, id, true_deadline(id, abs, &t));
}
#endif

/* timerfd_settime: the timer's clock, from /proc/self/fdinfo/<fd> ("clockid: N"); -1: none
   (not a timerfd, or /proc unreadable: the deadline is then left as it is). */
static int timerfd_clock(int fd, clockid_t *id)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return -1;
    ssize_t n = read(f, buf, sizeof buf - 1);
    close(f);
    char *c;
    if (n <= 0)
        return -1;
    buf[n] = 0;
    if (!(c = strstr(buf, "clockid:")))
        return -1;
    *id = (clockid_t)strtol(c + 8, NULL, 10);
    return 0;
}

/* ``its`` with its first expiry, an absolute time on the VM's clock ``id``, as one on the
   machine's (a zero it_value disarms: left as it is); the interval stays relative. */
static const struct itimerspec *true_timer(clockid_t id, const struct itimerspec *its,
                                           struct itimerspec *out)
{
    if (!its || (its->it_value.tv_sec == 0 && its->it_value.tv_nsec == 0))
        return its;
    out->it_interval = its->it_interval;
    const struct timespec *v = true_deadline(id, &its->it_value, &out->it_value);
    if (v != &out->it_value)
        out->it_value = *v;
    return out;
}

int timerfd_settime(int fd, int flags, const struct itimerspec *its, struct itimerspec *old)
{
    REAL(timerfd_settime);
    clockid_t id;
    struct itimerspec t;
    if ((flags & TFD_TIMER_ABSTIME) && clock_map() && timerfd_clock(fd, &id) == 0)
        its = true_timer(id, its, &t);
    return real(fd, flags, its, old);
}

/* POSIX timers: the clock each was created on (timer_settime cannot tell); a timer beyond
   MAX_TIMERS live ones keeps its absolute deadlines as they are. */
#define MAX_TIMERS 256
static struct { timer_t timer; clockid_t clock; int used; } timers[MAX_TIMERS];
static pthread_mutex_t timers_lock = PTHREAD_MUTEX_INITIALIZER;

int timer_create(clockid_t id, struct sigevent *restrict sev, timer_t *restrict out)
{
    REAL(timer_create);
    int r = real(id, sev, out);
    if (r == 0) {
        pthread_mutex_lock(&timers_lock);
        for (int i = 0; i < MAX_TIMERS; i++)
            if (!timers[i].used) {
                timers[i].timer = *out;
                timers[i].clock = id;
                timers[i].used = 1;
                break;
            }
        pthread_mutex_unlock(&timers_lock);
    }
    return r;
}

/* The clock ``timer`` was created on; -1 when not known. */
static int timer_clock(timer_t timer, clockid_t *id, int forget)
{
    int found = -1;
    pthread_mutex_lock(&timers_lock);
    for (int i = 0; i < MAX_TIMERS && found < 0; i++)
        if (timers[i].used && timers[i].timer == timer) {
            *id = timers[i].clock;
            timers[i].used = !forget;
            found = 0;
        }
    pthread_mutex_unlock(&timers_lock);
    return found;
}

int timer_delete(timer_t timer)
{
    REAL(timer_delete);
    clockid_t id;
    timer_clock(timer, &id, 1);
    return real(timer);
}

int timer_settime(timer_t timer, int flags, const struct itimerspec *restrict its,
                  struct itimerspec *restrict old)
{
    REAL(timer_settime);
    clockid_t id;
    struct itimerspec t;
    if ((flags & TIMER_ABSTIME) && clock_map() && timer_clock(timer, &id, 0) == 0)
        its = true_timer(id, its, &t);
    return real(timer, flags, its, old);
}

/* ---- socket timestamps ---- */

#ifndef SO_TIMESTAMP_NEW
#define SO_TIMESTAMP_NEW 63
#define SO_TIMESTAMPNS_NEW 64
#define SO_TIMESTAMPING_NEW 65
#endif

static void convert_ts(const struct hdr *h, struct timespec *ts)
{
    if (ts->tv_sec == 0 && ts->tv_nsec == 0)
        return;  /* an empty slot (SO_TIMESTAMPING: the unused software/hardware stamps) */
    set_ts(ts, to_vm(h, ts->tv_sec * NS + ts->tv_nsec));
}

static void convert_cmsgs(struct msghdr *msg)
{
    const struct hdr *h = clock_map();
    if (!h || !msg || !msg->msg_control)
        return;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET)
            continue;
        size_t len = c->cmsg_len - CMSG_LEN(0);
        unsigned char *d = CMSG_DATA(c);
        if ((c->cmsg_type == SO_TIMESTAMP || c->cmsg_type == SO_TIMESTAMP_NEW) &&
            len >= sizeof(struct timeval)) {
            struct timeval tv;
            memcpy(&tv, d, sizeof tv);
            struct timespec ts = {tv.tv_sec, tv.tv_usec * 1000};
            convert_ts(h, &ts);
            tv.tv_sec = ts.tv_sec;
            tv.tv_usec = ts.tv_nsec / 1000;
            memcpy(d, &tv, sizeof tv);
        } else if ((c->cmsg_type == SO_TIMESTAMPNS || c->cmsg_type == SO_TIMESTAMPNS_NEW) &&
                   len >= sizeof(struct timespec)) {
            struct timespec ts;
            memcpy(&ts, d, sizeof ts);
            convert_ts(h, &ts);
            memcpy(d, &ts, sizeof ts);
        } else if ((c->cmsg_type == SO_TIMESTAMPING || c->cmsg_type == SO_TIMESTAMPING_NEW) &&
                   len >= sizeof(struct timespec)) {
            /* [0] software (CLOCK_REALTIME); [1] deprecated; [2] a NIC's own clock: left */
            struct timespec ts;
            memcpy(&ts, d, sizeof ts);
            convert_ts(h, &ts);
            memcpy(d, &ts, sizeof ts);
        }
    }
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
    static ssize_t (*real)(int, struct msghdr *, int);
    if (!real)
        real = dlsym(RTLD_NEXT, "recvmsg");
    ssize_t n = real(fd, msg, flags);
    if (n >= 0)
        convert_cmsgs(msg);
    return n;
}

int recvmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags, struct timespec *tmo)
{
    static int (*real)(int, struct mmsghdr *, unsigned int, int, struct timespec *);
    if (!real)
        real = dlsym(RTLD_NEXT, "recvmmsg");
    int n = real(fd, vec, vlen, flags, tmo);
    for (int i = 0; i < n; i++)
        convert_cmsgs(&vec[i].msg_hdr);
    return n;
}

int ioctl(int fd, unsigned long req, ...)
{
    static int (*real)(int, unsigned long, ...);
    if (!real)
        real = dlsym(RTLD_NEXT, "ioctl");
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    int r = real(fd, req, arg);
    const struct hdr *h;
    if (r == 0 && arg && (req == SIOCGSTAMP || req == SIOCGSTAMPNS) && (h = clock_map())) {
        if (req == SIOCGSTAMP) {
            struct timeval *tv = arg;
            struct timespec ts = {tv->tv_sec, tv->tv_usec * 1000};
            convert_ts(h, &ts);
            tv->tv_sec = ts.tv_sec;
            tv->tv_usec = ts.tv_nsec / 1000;
        } else {
            convert_ts(h, arg);
        }
    }
    return r;
}

/* ---- discipline: changes are new segments of the VM's clock file ---- */

static int publish(const char *path, const void *buf, size_t len)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    ssize_t w = write(fd, buf, len);
    fchmod(fd, 0644);
    close(fd);
    if (w != (ssize_t)len) {
        unlink(tmp);
        return -1;
    }
    int old = open(path, O_RDWR | O_CLOEXEC);
    if (rename(tmp, path) != 0) {
        if (old >= 0)
            close(old);
        unlink(tmp);
        return -1;
    }
    if (old >= 0) {
        uint32_t one = 1;
        pwrite(old, &one, sizeof one, offsetof(struct hdr, stale));
        close(old);
    }
    return 0;
}

/* Linux kernel/time/ntp.c and include/uapi/linux/timex.h */
#define TICK_US 10000                    /* USER_HZ 100: 1 us of tick is 100 ppm */
#define MAXFREQ_SCALED (500LL << 16)     /* 500 ppm, as adjtimex's freq */
#define MAXPHASE_NS 500000000.0          /* the PLL's offset bound */
#define PHASE_LIMIT_US 16000000LL        /* NTP_PHASE_LIMIT: maxerror's bound */
#define MAXERROR_US_PER_S 500            /* maxerror's growth (MAXFREQ) */
#define SHIFT_PLL 2
#define SHIFT_FLL 2
#define KERNEL_MAXTC 10                  /* glibc's MAXTC (6) is not the kernel's */
#define MINSEC 256
#define MAXSEC 2048
#ifndef ADJ_ADJTIME
#define ADJ_ADJTIME 0x8000
#define ADJ_OFFSET_READONLY 0x2000
#endif
#define STA_RONLY (STA_PPSSIGNAL | STA_PPSJITTER | STA_PPSWANDER | STA_PPSERROR | \
                   STA_CLOCKERR | STA_NANO | STA_MODE | STA_CLK)

/* maxerror (us) at true time ``t``: as set, plus 500 us for every second since
   (second_overflow); above the phase limit the kernel holds it there and sets STA_UNSYNC */
static int64_t maxerror_at(const struct hdr *h, int64_t t)
{
    return h->maxerror + (t - h->maxerror_ns) / NS * MAXERROR_US_PER_S;
}

/* ntp_update_offset: the PLL's (and FLL's) answer to an ADJ_OFFSET of ``offset`` (ns) at VM
   second ``now_s``: updates h's freq, status and reftime; the phase to slew, ns. */
static double update_offset(struct hdr *h, double offset, int64_t now_s)
{
    if (offset > MAXPHASE_NS)
        offset = MAXPHASE_NS;
    if (offset < -MAXPHASE_NS)
        offset = -MAXPHASE_NS;
    int64_t secs = h->status & STA_FREQHOLD ? 0 : now_s - h->reftime_s;
    h->reftime_s = now_s;
    double adj = 0;  /* ns/s */
    h->status &= ~STA_MODE;
    if (secs >= MINSEC && ((h->status & STA_FLL) || secs > MAXSEC)) {
        h->status |= STA_MODE;
        adj = offset / (double)(1 << SHIFT_FLL) / (double)secs;
    }
    adj += offset * (double)secs / ldexp(1.0, 2 * (SHIFT_PLL + 2 + (int)h->constant));
    int64_t freq = h->freq + llrint(adj / 1000.0 * 65536.0);
    h->freq = freq > MAXFREQ_SCALED ? MAXFREQ_SCALED : freq < -MAXFREQ_SCALED ? -MAXFREQ_SCALED
                                                                                 : freq;
    return offset;
}

/* Apply ``tx`` (process_adjtimex_modes, or adjtime's ADJ_ADJTIME; may be NULL) and a step of
   ``step_ns`` to the published clock under its lock (agents.clock.update and
   ClockSpec.append): a new segment when the clock's course changes. Returns 0, or -1 with
   errno set. */
static int modify(const struct timex *tx, int64_t step_ns)
{
    const char *path = getenv("NSLAB_CLOCK");
    char lockpath[4096];
    snprintf(lockpath, sizeof lockpath, "%s.lock", path);
    int lk = open(lockpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (lk < 0)
        return -1;
    flock(lk, LOCK_EX);
    int rc = -1, fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    char *buf = NULL;
    if (fd < 0 || fstat(fd, &st) != 0)
        goto out;
    buf = malloc(st.st_size + sizeof(struct seg));
    if (!buf || read(fd, buf, st.st_size) != st.st_size)
        goto out;
    struct hdr *h = (struct hdr *)buf;
    if (memcmp(h->magic, "NSLABCK3", 8) != 0 || h->nseg == 0 ||
        sizeof *h + h->nseg * sizeof(struct seg) > (size_t)st.st_size) {
        errno = EIO;
        goto out;
    }
    struct seg *s = (struct seg *)(h + 1), *last = &s[h->nseg - 1], *n = &s[h->nseg];
    int64_t t = true_ns(CLOCK_REALTIME);
    if (t < last->start_ns)
        t = last->start_ns;
    int64_t now_s = (t + llrint(seg_offset(last, t, OFF_REALTIME))) / NS;
    h->stale = 0;
    if (maxerror_at(h, t) > PHASE_LIMIT_US)
        h->status |= STA_UNSYNC;
    *n = *last;
    n->pll_ns = pll_left(last, t);
    n->adj_ns = adj_left(last, t);
    int kind = -1;  /* none: no new segment */
    int64_t tick = h->tick, freq = h->freq;
    if (tx && !(tx->modes & ADJ_ADJTIME) && (tx->modes & ADJ_SETOFFSET)) {
        int64_t frac = tx->modes & ADJ_NANO ? tx->time.tv_usec : tx->time.tv_usec * 1000;
        step_ns = tx->time.tv_sec * NS + frac;
    }
    int stepped = step_ns || (tx && !(tx->modes & ADJ_ADJTIME) && (tx->modes & ADJ_SETOFFSET));
    if (stepped) {
        /* a step clears the NTP state first (TK_CLEAR_NTP: ntp_clear), as settimeofday and
           ADJ_SETOFFSET do before the other modes; the frequency stays */
        kind = K_VM_STEP;
        n->pll_ns = n->adj_ns = 0;
        h->status |= STA_UNSYNC;
        h->maxerror = h->esterror = PHASE_LIMIT_US;
        h->maxerror_ns = t;
    }
    if (tx && tx->modes & ADJ_ADJTIME) {
        n->adj_ns = (double)tx->offset * 1000.0;
        kind = K_VM_SLEW;
    } else if (tx) {
        if (tx->modes & ADJ_STATUS) {
            if ((h->status & STA_PLL) && !(tx->status & STA_PLL))
                h->status = STA_UNSYNC;
            if (!(h->status & STA_PLL) && (tx->status & STA_PLL))
                h->reftime_s = now_s;
            h->status = (h->status & STA_RONLY) | (tx->status & ~STA_RONLY);
        }
        if (tx->modes & ADJ_NANO)
            h->status |= STA_NANO;
        if (tx->modes & ADJ_MICRO)
            h->status &= ~STA_NANO;
        if (tx->modes & ADJ_FREQUENCY)
            h->freq = tx->freq > MAXFREQ_SCALED ? MAXFREQ_SCALED
                : tx->freq < -MAXFREQ_SCALED ? -MAXFREQ_SCALED : tx->freq;
        if (tx->modes & ADJ_MAXERROR) {
            h->maxerror = tx->maxerror < 0 ? 0 : tx->maxerror > PHASE_LIMIT_US ? PHASE_LIMIT_US
                                                                                : tx->maxerror;
            h->maxerror_ns = t;
        }
        if (tx->modes & ADJ_ESTERROR)
            h->esterror = tx->esterror < 0 ? 0 : tx->esterror > PHASE_LIMIT_US ? PHASE_LIMIT_US
                                                                                : tx->esterror;
        if (tx->modes & ADJ_TIMECONST) {
            int64_t c = tx->constant < 0 ? 0 : tx->constant > KERNEL_MAXTC ? KERNEL_MAXTC : tx->constant;
            c += h->status & STA_NANO ? 0 : 4;
            h->constant = c > KERNEL_MAXTC ? KERNEL_MAXTC : c;
        }
        if ((tx->modes & ADJ_OFFSET) && (h->status & STA_PLL)) {
            double off = (double)tx->offset;
            if (!(h->status & STA_NANO))
                off = fmax(-1e6, fmin(1e6, off)) * 1000.0;
            n->pll_ns = update_offset(h, off, now_s);
            kind = K_VM_SLEW;
        }
        if (tx->modes & ADJ_TICK)
            h->tick = tx->tick;
    }
    /* the PLL's phase decays by 2^-(SHIFT_PLL + constant) a second (second_overflow) */
    n->pll_rate = -log1p(-ldexp(1.0, -(SHIFT_PLL + (int)h->constant)));
    if (kind < 0 && (h->tick != tick || h->freq != freq))
        kind = K_VM_FREQUENCY;
    if (kind < 0 && n->pll_ns != 0 && n->pll_rate != last->pll_rate)
        kind = K_VM_SLEW;
    if (stepped)
        kind = K_VM_STEP;
    if (kind >= 0) {
        n->start_ns = t;
        n->offset_ns = seg_offset(last, t, OFF_REALTIME) + (double)step_ns;
        n->steps_ns = last->steps_ns + (double)step_ns;
        n->corr_ns = last->corr_ns + last->corr_ppm * (double)(t - last->start_ns) * 1e-6 +
            slew(last, t);
        n->corr_ppm = (double)(h->tick - TICK_US) * 100.0 + (double)h->freq / 65536.0;
        n->kind = kind;
        h->nseg++;
    }
    rc = publish(path, buf, sizeof *h + h->nseg * sizeof(struct seg));
out:
    free(buf);
    if (fd >= 0)
        close(fd);
    flock(lk, LOCK_UN);
    close(lk);
    return rc;
}

/* time_status is an error (is_error_status of kernel/time/ntp.c) */
static int error_status(int s)
{
    return (s & (STA_UNSYNC | STA_CLOCKERR)) ||
        ((s & (STA_PPSFREQ | STA_PPSTIME)) && !(s & STA_PPSSIGNAL)) ||
        ((s & (STA_PPSTIME | STA_PPSJITTER)) == (STA_PPSTIME | STA_PPSJITTER)) ||
        ((s & STA_PPSFREQ) && (s & (STA_PPSWANDER | STA_PPSERROR)));
}

/* __do_adjtimex on the VM clock: validation (timekeeping_validate_timex), the changes
   (modify), then the state read back into ``tx``. */
static int vm_adjtimex(struct timex *tx)
{
    const struct hdr *h = clock_map();
    int adjtime = tx->modes & ADJ_ADJTIME;
    if (adjtime && (tx->modes & ADJ_OFFSET_SINGLESHOT) != ADJ_OFFSET_SINGLESHOT) {
        errno = EINVAL;
        return -1;
    }
    if (!adjtime && (tx->modes & ADJ_TICK) && (tx->tick < 9000 || tx->tick > 11000)) {
        errno = EINVAL;
        return -1;
    }
    if (!adjtime && (tx->modes & ADJ_SETOFFSET) &&
        (tx->time.tv_usec < 0 ||
         tx->time.tv_usec >= (tx->modes & ADJ_NANO ? NS : 1000000))) {
        errno = EINVAL;
        return -1;
    }
    int64_t t = true_ns(CLOCK_REALTIME);
    const struct seg *s = segment_at(h, t);
    long old_adj_us = (long)(adj_left(s, t) / 1000.0);
    if (adjtime ? !(tx->modes & ADJ_OFFSET_READONLY) : tx->modes != 0) {
        if (modify(tx, 0) != 0)
            return -1;
        h = clock_map();
        t = true_ns(CLOCK_REALTIME);
        s = segment_at(h, t);
    }
    int64_t vm = t + llrint(seg_offset(s, t, OFF_REALTIME));
    int64_t maxerror = maxerror_at(h, t);
    int status = h->status | (maxerror > PHASE_LIMIT_US ? STA_UNSYNC : 0);
    if (adjtime)
        tx->offset = old_adj_us;
    else
        tx->offset = (long)(status & STA_NANO ? pll_left(s, t) : pll_left(s, t) / 1000.0);
    tx->freq = h->freq;
    tx->tick = h->tick;
    tx->status = status;
    tx->maxerror = maxerror < PHASE_LIMIT_US ? maxerror : PHASE_LIMIT_US;
    tx->esterror = h->esterror;
    tx->constant = h->constant;
    tx->precision = 1;
    tx->tolerance = MAXFREQ_SCALED;
    tx->time.tv_sec = vm / NS;
    tx->time.tv_usec = status & STA_NANO ? vm % NS : vm % NS / 1000;
    return error_status(status) ? TIME_ERROR : TIME_OK;
}

int adjtimex(struct timex *tx)
{
    static int (*real)(struct timex *);
    if (!real)
        real = dlsym(RTLD_NEXT, "adjtimex");
    return clock_map() ? vm_adjtimex(tx) : real(tx);
}

int ntp_adjtime(struct timex *tx)
{
    return adjtimex(tx);
}

int __adjtimex(struct timex *tx)
{
    return adjtimex(tx);
}

int clock_adjtime(clockid_t id, struct timex *tx)
{
    static int (*real)(clockid_t, struct timex *);
    if (!real)
        real = dlsym(RTLD_NEXT, "clock_adjtime");
    return id == CLOCK_REALTIME && clock_map() ? vm_adjtimex(tx) : real(id, tx);
}

/* glibc's adjtime (misc/adjtime.c): ADJ_OFFSET_SINGLESHOT of ``delta`` (us), or
   ADJ_OFFSET_SS_READ without; the adjustment left before it into ``olddelta``. glibc calls
   its own clock_adjtime, which the preload cannot replace, so this one is replaced. */
int adjtime(const struct timeval *delta, struct timeval *olddelta)
{
    REAL(adjtime);
    if (!clock_map())
        return real(delta, olddelta);
    struct timex tx = {.modes = ADJ_OFFSET_SS_READ};
    if (delta) {
        int64_t sec = delta->tv_sec + delta->tv_usec / 1000000;
        if (sec > INT32_MAX / 1000000 - 2 || sec < INT32_MIN / 1000000 + 2) {
            errno = EINVAL;
            return -1;
        }
        tx.modes = ADJ_OFFSET_SINGLESHOT;
        tx.offset = delta->tv_usec % 1000000 + sec * 1000000;
    }
    if (vm_adjtimex(&tx) < 0)
        return -1;
    if (olddelta) {
        olddelta->tv_sec = tx.offset / 1000000;
        olddelta->tv_usec = tx.offset % 1000000;
    }
    return 0;
}

static int vm_settime(int64_t target_ns)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t step = target_ns - (now.tv_sec * NS + now.tv_nsec);
    return modify(NULL, step);
}

int clock_settime(clockid_t id, const struct timespec *ts)
{
    static int (*real)(clockid_t, const struct timespec *);
    if (!real)
        real = dlsym(RTLD_NEXT, "clock_settime");
    if (!clock_map() || !ts)
        return real(id, ts);
    if (id != CLOCK_REALTIME) {
        errno = EINVAL;  /* as the kernel: only CLOCK_REALTIME can be set */
        return -1;
    }
    if (ts->tv_nsec < 0 || ts->tv_nsec >= NS) {
        errno = EINVAL;
        return -1;
    }
    return vm_settime(ts->tv_sec * NS + ts->tv_nsec);
}

int settimeofday(const struct timeval *tv, const struct timezone *tz)
{
    static int (*real)(const struct timeval *, const struct timezone *);
    if (!real)
        real = dlsym(RTLD_NEXT, "settimeofday");
    if (!clock_map() || !tv)
        return real(tv, tz);  /* tz only (or no VM clock): the kernel decides (EPERM) */
    if (tv->tv_usec < 0 || tv->tv_usec >= 1000000) {
        errno = EINVAL;
        return -1;
    }
    return vm_settime(tv->tv_sec * NS + tv->tv_usec * 1000LL);
}
