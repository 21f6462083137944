/* A network client/server built statically (gcc -static) by tests/e2e/test_isolate.py:
 * LD_PRELOAD cannot reach it, so inside `canal run --isolate` canald serves its
 * socket calls through seccomp user notification.
 *
 *   netstatic dial HOST PORT      connect, print the first line and both names
 *   netstatic serve PORT N        listen on [::]:PORT (dual stack), answer N clients
 *   netstatic udp HOST PORT       sendto "ping", print the reply and its source
 *   netstatic udpself PORT        a datagram between two own sockets on 127.0.0.1
 *   netstatic udpbound PORT HOST HPORT  bind 0.0.0.0:PORT, sendto HOST:HPORT and print
 *                                 the reply, its source and our port; then connect
 *                                 there, send, print the reply and our name
 *   netstatic udpmsg HOST PORT    the same as udp with sendmsg/recvmsg (two iovecs each)
 *   netstatic udpmsgself PORT     the same as udpself with sendmsg/recvmsg
 *   netstatic udpmmsg HOST PORT   sendmmsg of 3 datagrams with addresses, then recvmmsg
 *                                 (MSG_WAITFORONE) until 3 replies; each with its source
 *   netstatic udpmmsgself PORT    sendmmsg of 2 datagrams between two own sockets, one
 *                                 blocking recvmmsg of both (no MSG_WAITFORONE)
 *   netstatic udpmmsgconn HOST PORT  the same as udpmmsg on a connected socket (no
 *                                 addresses: the kernel sends to the peer)
 *   netstatic v6only PORT         an IPv4 and an IPV6_V6ONLY listener on one port (as
 *                                 asyncio and nginx make them): which one a client of
 *                                 127.0.0.1 and of ::1 reaches, what each side sees,
 *                                 and the kernel's IPV6_V6ONLY rules
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
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

static int listen_on(int family, int port, int v6only) {
    int s = socket(family, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (family == AF_INET6 && setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only) < 0)
        perror("IPV6_V6ONLY");
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    struct sockaddr_in a4 = v4("0.0.0.0", port);
    int r = family == AF_INET6 ? bind(s, (struct sockaddr *)&a6, sizeof a6)
                               : bind(s, (struct sockaddr *)&a4, sizeof a4);
    if (r < 0 || listen(s, 4) < 0) {
        perror("bind/listen");
        exit(1);
    }
    return s;
}

/* Connects to host:port ("::1" or an IPv4 address); prints which of the two listeners
 * took it, the peer it saw and the client's names. */
static void dial_pair(const char *host, int port, int l4, int l6) {
    struct sockaddr_storage d = {0};
    socklen_t dl;
    if (strchr(host, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&d;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(port);
        inet_pton(AF_INET6, host, &a->sin6_addr);
        dl = sizeof *a;
    } else {
        *(struct sockaddr_in *)&d = v4(host, port);
        dl = sizeof(struct sockaddr_in);
    }
    int c = socket(d.ss_family, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&d, dl) < 0) {
        printf("%s: connect: %s\n", host, strerror(errno));
        close(c);
        return;
    }
    struct pollfd p[2] = {{.fd = l4, .events = POLLIN}, {.fd = l6, .events = POLLIN}};
    poll(p, 2, 2000);
    int which = p[0].revents & POLLIN ? 0 : 1;
    struct sockaddr_storage ps, ls, cl;
    socklen_t pl = sizeof ps, ll = sizeof ls, cll = sizeof cl;
    int a = accept(which ? l6 : l4, (struct sockaddr *)&ps, &pl);
    getsockname(a, (struct sockaddr *)&ls, &ll);
    getsockname(c, (struct sockaddr *)&cl, &cll);
    char b1[80], b2[80], b3[80];
    /* Ports: the listener's is fixed, the client's the kernel's: shown as "P". */
    *strrchr(name(&ps, b1), ':') = 0;
    *strrchr(name(&cl, b3), ':') = 0;
    printf("%s: listener %s peer %s local %s client %s\n", host, which ? "v6" : "v4", b1,
           name(&ls, b2), b3);
    close(a);
    close(c);
}

static int v6only_pair(int port) {
    int l4 = listen_on(AF_INET, port, 0), l6 = listen_on(AF_INET6, port, 1), v = -1;
    socklen_t vl = sizeof v;
    getsockopt(l6, IPPROTO_IPV6, IPV6_V6ONLY, &v, &vl);
    printf("IPV6_V6ONLY reads %d (%u bytes)\n", v, vl);
    dial_pair("127.0.0.1", port, l4, l6);
    dial_pair("::1", port, l4, l6);
    int zero = 0, one = 1;
    if (setsockopt(l6, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) < 0)
        printf("set after bind: %s\n", strerror(errno));
    int s = socket(AF_INET6, SOCK_STREAM, 0);
    setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    struct sockaddr_in6 m = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &m.sin6_addr);
    if (connect(s, (struct sockaddr *)&m, sizeof m) < 0)
        printf("v6only to a mapped address: %s\n", strerror(errno));
    close(s);
    close(l4);
    close(l6);
    /* Alone, the IPv6-only listener refuses IPv4 clients. */
    l6 = listen_on(AF_INET6, port + 1, 1);
    s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = v4("127.0.0.1", port + 1);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0)
        printf("IPv4 to a lone IPv6-only listener: %s\n", strerror(errno));
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

static int udpbound(int port, const char *host, int hport) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in me = v4("0.0.0.0", port), to = v4(host, hport);
    struct sockaddr_storage ls;
    socklen_t ll = sizeof ls;
    char b[80];
    if (bind(s, (struct sockaddr *)&me, sizeof me) < 0) {
        perror("bind");
        return 1;
    }
    printf("bound\n");
    if (sendto(s, "ping", 4, 0, (struct sockaddr *)&to, sizeof to) != 4) {
        perror("sendto");
        return 1;
    }
    if (recv_print(s, "udpbound"))
        return 1;
    getsockname(s, (struct sockaddr *)&ls, &ll);
    printf("name %s\n", name(&ls, b));
    if (connect(s, (struct sockaddr *)&to, sizeof to) < 0 || send(s, "ping", 4, 0) != 4) {
        perror("connect");
        return 1;
    }
    if (recv_print(s, "udpbound connected"))
        return 1;
    ll = sizeof ls;
    getsockname(s, (struct sockaddr *)&ls, &ll);
    printf("name %s\n", name(&ls, b));
    return 0;
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

/* sendmmsg of the NUL-separated payloads in `p` (n of them) to a (NULL: connected). */
static int mmsg_send(int s, struct sockaddr_in *a, const char **p, int n, const char *tag) {
    struct mmsghdr m[4];
    struct iovec v[4];
    memset(m, 0, sizeof m);
    for (int i = 0; i < n; i++) {
        v[i] = (struct iovec){(void *)p[i], strlen(p[i])};
        m[i].msg_hdr.msg_iov = &v[i];
        m[i].msg_hdr.msg_iovlen = 1;
        if (a) {
            m[i].msg_hdr.msg_name = a;
            m[i].msg_hdr.msg_namelen = sizeof *a;
        }
    }
    int k = sendmmsg(s, m, n, 0);
    if (k != n) {
        perror("sendmmsg");
        return 1;
    }
    printf("%s sent %d:", tag, k);
    for (int i = 0; i < n; i++)
        printf(" %u", m[i].msg_len);
    printf("\n");
    return 0;
}

/* recvmmsg until `want` datagrams arrived (`flags` each call); print each. */
static int mmsg_recv(int s, int want, int flags, const char *tag) {
    char buf[4][64], nb[80];
    struct sockaddr_storage src[4];
    struct mmsghdr m[4];
    struct iovec v[4];
    int got = 0, calls = 0;
    while (got < want) {
        memset(m, 0, sizeof m);
        for (int i = 0; i < 4; i++) {
            v[i] = (struct iovec){buf[i], sizeof buf[i] - 1};
            m[i].msg_hdr.msg_iov = &v[i];
            m[i].msg_hdr.msg_iovlen = 1;
            m[i].msg_hdr.msg_name = &src[i];
            m[i].msg_hdr.msg_namelen = sizeof src[i];
        }
        int k = recvmmsg(s, m, want - got, flags, NULL);
        if (k <= 0) {
            perror("recvmmsg");
            return 1;
        }
        calls++;
        for (int i = 0; i < k; i++) {
            buf[i][m[i].msg_len] = 0;
            printf("%s got %s (%u bytes) from %s\n", tag, buf[i], m[i].msg_len, name(&src[i], nb));
        }
        got += k;
    }
    if (flags == 0)
        printf("%s %d in %d call(s)\n", tag, got, calls);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && !strcmp(argv[1], "dial"))
        return dial(argv[2], atoi(argv[3]));
    if (argc == 3 && !strcmp(argv[1], "v6only"))
        return v6only_pair(atoi(argv[2]));
    if (argc == 4 && !strcmp(argv[1], "serve"))
        return serve(atoi(argv[2]), atoi(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "udp"))
        return udp(argv[2], atoi(argv[3]));
    if (argc == 5 && !strcmp(argv[1], "udpbound"))
        return udpbound(atoi(argv[2]), argv[3], atoi(argv[4]));
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
    if (argc == 4 && !strcmp(argv[1], "udpmmsg")) {
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        struct sockaddr_in a = v4(argv[2], atoi(argv[3]));
        const char *p[] = {"m1", "m22", "m333"};
        return mmsg_send(s, &a, p, 3, "udpmmsg") || mmsg_recv(s, 3, MSG_WAITFORONE, "udpmmsg");
    }
    if (argc == 4 && !strcmp(argv[1], "udpmmsgconn")) {
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        struct sockaddr_in a = v4(argv[2], atoi(argv[3]));
        if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
            perror("connect");
            return 1;
        }
        const char *p[] = {"c1", "c22"};
        return mmsg_send(s, NULL, p, 2, "udpmmsgconn") ||
               mmsg_recv(s, 2, MSG_WAITFORONE, "udpmmsgconn");
    }
    if (argc == 3 && !strcmp(argv[1], "udpmmsgself")) {
        int u = socket(AF_INET, SOCK_DGRAM, 0), v = socket(AF_INET, SOCK_DGRAM, 0);
        struct sockaddr_in a = v4("127.0.0.1", atoi(argv[2]));
        if (bind(u, (struct sockaddr *)&a, sizeof a) < 0) {
            perror("bind");
            return 1;
        }
        const char *p[] = {"own1", "own22"};
        return mmsg_send(v, &a, p, 2, "udpmmsgself") || mmsg_recv(u, 2, 0, "udpmmsgself");
    }
    fprintf(stderr, "usage: netstatic dial|serve|udp|udpself|udpmsg|udpmsgself|udpmmsg|"
                    "udpmmsgself|udpmmsgconn ...\n");
    return 2;
}
