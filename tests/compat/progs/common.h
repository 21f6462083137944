/* Shared by peer.c and edge.c: the byte pattern, FNV-1a, errno names, timing. */
#ifndef CANAL_COMPAT_COMMON_H
#define CANAL_COMPAT_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Byte i of every pattern stream: no short period, so reordering or loss shows. */
static inline unsigned char pat(uint64_t i)
{
    return (unsigned char)((i ^ (i >> 8) ^ (i >> 16) ^ (i >> 24)) * 31u + 7u);
}

static inline uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}
#define FNV_INIT 14695981039346656037ULL

static inline const char *ename(int e)
{
    if (e == 0)
        return "0";
    const char *n = strerrorname_np(e);
    return n ? n : "E?";
}

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

#endif
