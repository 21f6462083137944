/* What the C check programs of tests/e2e share: the lines they print, "ok NAME" or
 * "FAIL NAME: why" (which counts in `failures`), read by their tests; and 127.0.0.1:PORT. */
#ifndef CANAL_E2E_CHECK_H
#define CANAL_E2E_CHECK_H
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int failures;

static void report(const char *name, const char *fmt, ...) {
    if (!fmt) {
        printf("ok %s\n", name);
    } else {
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL %s: ", name);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
        failures++;
    }
    fflush(stdout);
}

static struct sockaddr_in addr_of(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}
#endif
