/* A network client/server built statically (gcc -static) by tests/e2e/test_isolate.py:
 * LD_PRELOAD cannot reach it, so inside `canal run --isolate` canald serves its
 * socket calls through seccomp user notification.
 *
 *   netstatic dial HOST PORT      connect, print the first line and both names
 *   netstatic serve PORT N        listen on [::]:PORT (dual stack), answer N clients
 *   netstatic udp HOST PORT       sendto "ping", print the reply and its source
 *   netstatic udpself PORT        a datagram between two own sockets on 127.0.0.1
 *   netstatic udpmsg HOST PORT    the same as udp with sendmsg/recvmsg (two iovecs each)
 *   netstatic udpmsgself PORT     the same as udpself with sendmsg/recvmsg
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *name(struct sockaddr_storage *s, char *buf) {
    char ip[64];
    int port;
    if (s->ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)s;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)s;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
    }
    sprintf(buf, s->ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", ip, port);
    return buf;
}

static struct sockaddr_in v4(const char *host, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    return a;
}

static int dial(const char *host, int port) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = v4(host, port);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("connect");
        return 1;
    }
    char buf[200], l[80], p[80];
    int n = read(s, buf, sizeof buf - 1);
    if (n <= 0) {
        perror("read");
        return 1;
    }
    buf[n] = 0;
    buf[strcspn(buf, "\n")] = 0;
    struct sockaddr_storage ls, ps;
    socklen_t ll = sizeof ls, pl = sizeof ps;
    getsockname(s, (struct sockaddr *)&ls, &ll);
    getpeername(s, (struct sockaddr *)&ps, &pl);
    printf("got %s | local %s peer %s\n", buf, name(&ls, l), name(&ps, p));
    return 0;
}

static int serve(int port, int n) {
    int s = socket(AF_INET6, SOCK_STREAM, 0), one = 1, zero = 0;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) < 0) {
        perror("IPV6_V6ONLY");
        return 1;
    }
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 16) < 0) {
        perror("bind/listen");
        return 1;
    }
    struct sockaddr_storage ls;
    socklen_t ll = sizeof ls;
    char b[80];
    getsockname(s, (struct sockaddr *)&ls, &ll);
    printf("listening %s\n", name(&ls, b));
    fflush(stdout);
    for (int i = 0; i < n; i++) {
        struct sockaddr_storage ps;
        socklen_t pl = sizeof ps;
        int c = accept(s, (struct sockaddr *)&ps, &pl);
        if (c < 0) {
            perror("accept");
            return 1;
        }
        char out[160];
        int k = snprintf(out, sizeof out, "static %s\n", name(&ps, b));
        write(c, out, k);
        close(c);
    }
    return 0;
}

/* Receives one datagram on s and prints it as "TAG DATA from SOURCE". */
static int recv_print(int s, const char *tag) {
    char buf[100], b[80];
    struct sockaddr_storage src;
    socklen_t sl = sizeof src;
    int n = recvfrom(s, buf, sizeof buf - 1, 0, (struct sockaddr *)&src, &sl);
    if (n < 0) {
        perror("recvfrom");
        return 1;
    }
    buf[n] = 0;
    printf("%s %s from %s\n", tag, buf, name(&src, b));
    return 0;
}

static int udp(const char *host, int port) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = v4(host, port);
    if (sendto(s, "ping", 4, 0, (struct sockaddr *)&a, sizeof a) != 4) {
        perror("sendto");
        return 1;
    }
    return recv_print(s, "udp");
}

static int udpself(int port) {
    int u = socket(AF_INET, SOCK_DGRAM, 0), v = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = v4("127.0.0.1", port);
    if (bind(u, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("bind");
        return 1;
    }
    sendto(v, "own", 3, 0, (struct sockaddr *)&a, sizeof a);
    return recv_print(u, "udpself");
}

/* sendmsg of "pi" + "ng" (or "o" + "wn") to a, then recvmsg into two iovecs. */
static int msg_pair(int tx, int rx, struct sockaddr_in a, const char *p1, const char *p2,
                    const char *tag) {
    struct iovec out[2] = {{(void *)p1, strlen(p1)}, {(void *)p2, strlen(p2)}};
    struct msghdr m = {.msg_name = &a, .msg_namelen = sizeof a, .msg_iov = out, .msg_iovlen = 2};
    ssize_t want = strlen(p1) + strlen(p2);
    if (sendmsg(tx, &m, 0) != want) {
        perror("sendmsg");
        return 1;
    }
    char b1[3] = {0}, b2[100] = {0}, nb[80];
    struct sockaddr_storage src;
    struct iovec in[2] = {{b1, 2}, {b2, sizeof b2 - 1}};
    struct msghdr r = {.msg_name = &src, .msg_namelen = sizeof src, .msg_iov = in, .msg_iovlen = 2};
    ssize_t n = recvmsg(rx, &r, 0);
    if (n < 0) {
        perror("recvmsg");
        return 1;
    }
    printf("%s %s%s from %s (%zd bytes, namelen %u)\n", tag, b1, b2, name(&src, nb), n,
           (unsigned)r.msg_namelen);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && !strcmp(argv[1], "dial"))
        return dial(argv[2], atoi(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "serve"))
        return serve(atoi(argv[2]), atoi(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "udp"))
        return udp(argv[2], atoi(argv[3]));
    if (argc == 3 && !strcmp(argv[1], "udpself"))
        return udpself(atoi(argv[2]));
    if (argc == 4 && !strcmp(argv[1], "udpmsg")) {
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        return msg_pair(s, s, v4(argv[2], atoi(argv[3])), "pi", "ng", "udpmsg");
    }
    if (argc == 3 && !strcmp(argv[1], "udpmsgself")) {
        int u = socket(AF_INET, SOCK_DGRAM, 0), v = socket(AF_INET, SOCK_DGRAM, 0);
        struct sockaddr_in a = v4("127.0.0.1", atoi(argv[2]));
        if (bind(u, (struct sockaddr *)&a, sizeof a) < 0) {
            perror("bind");
            return 1;
        }
        return msg_pair(v, u, a, "o", "wn", "udpmsgself");
    }
    fprintf(stderr, "usage: netstatic dial|serve|udp|udpself|udpmsg|udpmsgself ...\n");
    return 2;
}
