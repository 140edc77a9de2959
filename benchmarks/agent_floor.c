/* agent_floor: an agent's datagram I/O without its logic, compiled (benchmarks/agent_cost.py).
 *
 *   agent_floor ME PEER1,PEER2,.. PORT RATE SECONDS MODE
 *
 * At every wake-up: drain the error queue and the receive queue with one recvmmsg each, then
 * send the coded pairs due (two 56-byte datagrams each, RATE pairs/s per peer on average,
 * +-50 % jitter) with one sendmmsg, with the agent's SO_TIMESTAMPING flags. MODE 0: a wake-up
 * every 20 ms, each peer on its own schedule (the agent of 3cb2827); MODE 1: a wake-up per
 * burst, RATE a second, a pair to every peer in each (agents/native/probeio.c's loop).
 * Nothing is parsed: the CPU left is what the kernel and the system calls cost, the floor of
 * any agent with that schedule at this rate.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/net_tstamp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define SLOTS 64
#define MAX_PEERS 32

static double mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static char buf[SLOTS][2048], ctl[SLOTS][512];
static struct sockaddr_in from[SLOTS];
static struct mmsghdr msgs[SLOTS];
static struct iovec iov[SLOTS];

static void drain(int fd, int flags)
{
    int n;
    do {
        for (int i = 0; i < SLOTS; i++) {
            iov[i] = (struct iovec){buf[i], sizeof buf[i]};
            msgs[i].msg_hdr = (struct msghdr){.msg_name = &from[i],
                .msg_namelen = sizeof from[i], .msg_iov = &iov[i], .msg_iovlen = 1,
                .msg_control = ctl[i], .msg_controllen = sizeof ctl[i]};
        }
        n = recvmmsg(fd, msgs, SLOTS, flags | MSG_DONTWAIT, NULL);
    } while (n == SLOTS);
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s ME PEERS PORT RATE SECONDS MODE\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[3]), bursts = atoi(argv[6]) == 1;
    double rate = atof(argv[4]), end = mono() + atof(argv[5]);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    int ts = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_RX_SOFTWARE |
             SOF_TIMESTAMPING_SOFTWARE;
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &ts, sizeof ts) ||
        !inet_aton(argv[1], &me.sin_addr) || bind(fd, (void *)&me, sizeof me)) {
        perror("agent_floor");
        return 1;
    }
    struct sockaddr_in peer[MAX_PEERS];
    double due[MAX_PEERS];
    int np = 0;
    for (char *t = strtok(argv[2], ","); t && np < MAX_PEERS; t = strtok(NULL, ",")) {
        peer[np] = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(port)};
        inet_aton(t, &peer[np].sin_addr);
        due[np++] = 0.0;
    }
    static char pkt[56];
    srand48(port ^ me.sin_addr.s_addr);
    double burst = 0.0;
    while (mono() < end) {
        double now = mono();
        drain(fd, MSG_ERRQUEUE);
        drain(fd, 0);
        int k = 0;
        for (int p = 0; p < np; p++) {
            if ((bursts ? burst : due[p]) > now)
                continue;
            for (int j = 0; j < 2; j++, k++) {
                iov[k] = (struct iovec){pkt, sizeof pkt};
                msgs[k].msg_hdr = (struct msghdr){.msg_name = &peer[p],
                    .msg_namelen = sizeof peer[p], .msg_iov = &iov[k], .msg_iovlen = 1};
            }
            due[p] += (0.5 + drand48()) / rate;
        }
        if (k)
            sendmmsg(fd, msgs, k, 0);
        if (bursts && burst <= now)
            burst = (burst ? burst : now) + (0.5 + drand48()) / rate;
        double rest = bursts ? burst - mono() : 0.02 - (mono() - now);
        if (rest > 0) {
            struct timespec d = {(time_t)rest, (long)((rest - (time_t)rest) * 1e9)};
            nanosleep(&d, NULL);
        }
    }
    return 0;
}
