/* Test helper run inside a VM: the machine's true CLOCK_REALTIME (raw syscalls, which no
   preload sees) around this program's clock_gettime(CLOCK_REALTIME), as JSON
   [true_before_ns, vm_ns, true_after_ns]. */
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long long true_ns(void)
{
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);  /* the preload maps the clock file on first use */
    long long a = true_ns();
    clock_gettime(CLOCK_REALTIME, &ts);
    long long b = true_ns();
    printf("[%lld, %lld, %lld]\n", a, ts.tv_sec * 1000000000LL + ts.tv_nsec, b);
    return 0;
}
