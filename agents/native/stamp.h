/* The kernel's software timestamp in a received message's control data (SO_TIMESTAMPING,
 * SOF_TIMESTAMPING_SOFTWARE: the first of the three timespecs; Documentation/networking/
 * timestamping.rst), shared by probeio.c and pacer.c. */
#ifndef NSLAB_STAMP_H
#define NSLAB_STAMP_H

#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* The stamp of message m, ns since the epoch on the host's clock; 0 when it carries none. */
static inline int64_t kernel_stamp_ns(struct msghdr *m)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof ts);
            if (ts.tv_sec || ts.tv_nsec)
                return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        }
    }
    return 0;
}

#endif
