/* The other end for edge.c: a command server on 127.0.0.1 and ::1 (TCP) plus UDP echo on
 * both. Deliberately plain: one thread per connection, blocking calls only (no poll/epoll,
 * no fork), so it works under canal as soon as basic sockets do.
 *
 * Prints "READY tcp4=P tcp6=P udp4=P udp6=P" and serves until killed (at most 300 s).
 *
 * Every TCP connection starts with one command line "<tag> <CMD> [args]\n"; tag "-" means
 * none. When a tagged connection ends (the peer saw EOF or an error, and closed), the tag is
 * recorded, so a later "QUERY tag ms" can tell whether the subject's side was closed.
 *   ECHO                       echo until EOF
 *   UPPER                      echo upper-cased until EOF
 *   SEND n                     send n pattern bytes, then read until EOF
 *   DELAY ms text              sleep ms, send text, then read until EOF
 *   DRIBBLE n chunk ms         send n pattern bytes in chunks, ms apart, then read until EOF
 *   HASH n                     read n bytes (or to EOF), reply "HASH count fnv-hex\n", read to EOF
 *   HALFCLOSE text             send text, shutdown(SHUT_WR), read until EOF
 *   RST                        close with SO_LINGER {1, 0} (the subject gets a reset)
 *   WATCH                      read until EOF
 *   QUERY tag ms               reply "EOF\n" once tag's connection has ended, or "OPEN\n"
 *                              after ms milliseconds
 *   CONNECT fam port n         open n connections at once to 127.0.0.1 (fam 4) or ::1
 *                              (fam 6) port; each sends "hello i\n" and reads to EOF; then
 *                              reply one line "R i <first reply line>" (or "R i ERR <errno>")
 *                              per connection, in order, and "DONE\n"
 */
#include "common.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>

#define MAXTAGS 4096

static pthread_mutex_t tag_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t tag_cv = PTHREAD_COND_INITIALIZER;
static char ended[MAXTAGS][40];
static int nended;

static void die(const char *what)
{
    fprintf(stderr, "peer: %s: %s\n", what, ename(errno));
    exit(1);
}

static int send_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void drain(int fd)
{
    char buf[65536];
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r > 0)
            continue;
        if (r < 0 && errno == EINTR)
            continue;
        return;
    }
}

static int send_pattern(int fd, uint64_t n, uint64_t chunk, int gap_ms)
{
    unsigned char buf[65536];
    uint64_t off = 0;
    if (chunk == 0 || chunk > sizeof buf)
        chunk = sizeof buf;
    while (off < n) {
        uint64_t k = n - off < chunk ? n - off : chunk;
        for (uint64_t i = 0; i < k; i++)
            buf[i] = pat(off + i);
        if (send_all(fd, buf, k) < 0)
            return -1;
        off += k;
        if (gap_ms && off < n)
            sleep_ms(gap_ms);
    }
    return 0;
}

static void record_end(const char *tag)
{
    if (strcmp(tag, "-") == 0)
        return;
    pthread_mutex_lock(&tag_mu);
    if (nended < MAXTAGS) {
        snprintf(ended[nended], sizeof ended[0], "%s", tag);
        nended++;
    }
    pthread_cond_broadcast(&tag_cv);
    pthread_mutex_unlock(&tag_mu);
}

static int tag_ended(const char *tag)
{
    for (int i = 0; i < nended; i++)
        if (strcmp(ended[i], tag) == 0)
            return 1;
    return 0;
}

static int query(const char *tag, int ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&tag_mu);
    int rc = 0;
    while (!tag_ended(tag) && rc == 0)
        rc = pthread_cond_timedwait(&tag_cv, &tag_mu, &dl);
    int done = tag_ended(tag);
    pthread_mutex_unlock(&tag_mu);
    return done;
}

struct out_conn {
    int fam, port, i;
    char result[200];
};

static void *connect_one(void *arg)
{
    struct out_conn *c = arg;
    int fd = socket(c->fam == 6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    int rc;
    if (fd < 0) {
        snprintf(c->result, sizeof c->result, "ERR socket %s", ename(errno));
        return NULL;
    }
    if (c->fam == 6) {
        struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)c->port) };
        a.sin6_addr = in6addr_loopback;
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)c->port) };
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (rc < 0) {
        snprintf(c->result, sizeof c->result, "ERR connect %s", ename(errno));
        close(fd);
        return NULL;
    }
    char hello[32];
    int n = snprintf(hello, sizeof hello, "hello %d\n", c->i);
    if (send_all(fd, hello, (size_t)n) < 0) {
        snprintf(c->result, sizeof c->result, "ERR send %s", ename(errno));
        close(fd);
        return NULL;
    }
    char buf[256];
    size_t got = 0;
    for (;;) {
        ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(c->result, sizeof c->result, "ERR recv %s", ename(errno));
            close(fd);
            return NULL;
        }
        if (r == 0 || got + (size_t)r >= sizeof buf - 1) {
            got += (size_t)(r > 0 ? r : 0);
            break;
        }
        got += (size_t)r;
    }
    buf[got] = 0;
    char *nl = strchr(buf, '\n');
    if (nl)
        *nl = 0;
    snprintf(c->result, sizeof c->result, "%.180s", got ? buf : "(nothing)");
    close(fd);
    return NULL;
}

static void do_connect(int ctl, int fam, int port, int n)
{
    if (n < 1 || n > 256)
        n = 1;
    struct out_conn *cs = calloc((size_t)n, sizeof *cs);
    pthread_t *ts = calloc((size_t)n, sizeof *ts);
    for (int i = 0; i < n; i++) {
        cs[i].fam = fam;
        cs[i].port = port;
        cs[i].i = i;
        if (pthread_create(&ts[i], NULL, connect_one, &cs[i]) != 0)
            die("pthread_create");
    }
    for (int i = 0; i < n; i++) {
        pthread_join(ts[i], NULL);
        char line[256];
        int k = snprintf(line, sizeof line, "R %d %s\n", i, cs[i].result);
        send_all(ctl, line, (size_t)k);
    }
    send_all(ctl, "DONE\n", 5);
    free(cs);
    free(ts);
}

static void *conn_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char line[512];
    size_t n = 0;
    while (n < sizeof line - 1) {
        ssize_t r = recv(fd, line + n, 1, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            close(fd);
            return NULL;
        }
        if (line[n] == '\n')
            break;
        n++;
    }
    line[n] = 0;
    char tag[40] = "-", cmd[32] = "", a1[256] = "", a2[64] = "", a3[64] = "";
    sscanf(line, "%39s %31s %255s %63s %63s", tag, cmd, a1, a2, a3);

    if (strcmp(cmd, "ECHO") == 0 || strcmp(cmd, "UPPER") == 0) {
        int up = cmd[0] == 'U';
        char buf[65536];
        for (;;) {
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            if (up)
                for (ssize_t i = 0; i < r; i++)
                    buf[i] = (char)toupper((unsigned char)buf[i]);
            if (send_all(fd, buf, (size_t)r) < 0)
                break;
        }
    } else if (strcmp(cmd, "SEND") == 0) {
        if (send_pattern(fd, strtoull(a1, NULL, 10), 0, 0) == 0)
            drain(fd);
    } else if (strcmp(cmd, "DELAY") == 0) {
        sleep_ms(atoi(a1));
        if (send_all(fd, a2, strlen(a2)) == 0)
            drain(fd);
    } else if (strcmp(cmd, "DRIBBLE") == 0) {
        if (send_pattern(fd, strtoull(a1, NULL, 10), strtoull(a2, NULL, 10), atoi(a3)) == 0)
            drain(fd);
    } else if (strcmp(cmd, "HASH") == 0) {
        uint64_t want = strtoull(a1, NULL, 10), got = 0, h = FNV_INIT;
        unsigned char buf[65536];
        while (got < want) {
            size_t k = want - got < sizeof buf ? (size_t)(want - got) : sizeof buf;
            ssize_t r = recv(fd, buf, k, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            h = fnv1a(h, buf, (size_t)r);
            got += (uint64_t)r;
        }
        char out[80];
        int k = snprintf(out, sizeof out, "HASH %llu %016llx\n", (unsigned long long)got, (unsigned long long)h);
        if (send_all(fd, out, (size_t)k) == 0)
            drain(fd);
    } else if (strcmp(cmd, "HALFCLOSE") == 0) {
        if (send_all(fd, a1, strlen(a1)) == 0 && shutdown(fd, SHUT_WR) == 0)
            drain(fd);
    } else if (strcmp(cmd, "RST") == 0) {
        struct linger lg = { 1, 0 };
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    } else if (strcmp(cmd, "WATCH") == 0) {
        drain(fd);
    } else if (strcmp(cmd, "QUERY") == 0) {
        const char *ans = query(a1, atoi(a2)) ? "EOF\n" : "OPEN\n";
        send_all(fd, ans, strlen(ans));
    } else if (strcmp(cmd, "CONNECT") == 0) {
        do_connect(fd, atoi(a1), atoi(a2), atoi(a3));
    } else {
        char out[600];
        int k = snprintf(out, sizeof out, "ERR unknown command '%s'\n", line);
        send_all(fd, out, (size_t)k);
    }
    close(fd);
    record_end(tag);
    return NULL;
}

static void *accept_loop(void *arg)
{
    int l = (int)(intptr_t)arg;
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            die("accept");
        }
        pthread_t t;
        if (pthread_create(&t, NULL, conn_main, (void *)(intptr_t)c) != 0)
            die("pthread_create");
        pthread_detach(t);
    }
    return NULL;
}

static void *udp_echo(void *arg)
{
    int u = (int)(intptr_t)arg;
    char buf[65536];
    for (;;) {
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t r = recvfrom(u, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("recvfrom");
        }
        sendto(u, buf, (size_t)r, 0, (struct sockaddr *)&from, fl);
    }
    return NULL;
}

static int bound(int fam, int type)
{
    int fd = socket(fam, type, 0);
    if (fd < 0)
        die("socket");
    int one = 1;
    if (fam == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    if (fam == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof *a;
    }
    if (bind(fd, (struct sockaddr *)&ss, len) < 0)
        die(fam == AF_INET6 ? "bind ::1" : "bind 127.0.0.1");
    if (type == SOCK_STREAM && listen(fd, 512) < 0)
        die("listen");
    return fd;
}

static int port_of(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        die("getsockname");
    return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    alarm(300); /* never outlive a test run by much, whatever happens */
    int t4 = bound(AF_INET, SOCK_STREAM), t6 = bound(AF_INET6, SOCK_STREAM);
    int u4 = bound(AF_INET, SOCK_DGRAM), u6 = bound(AF_INET6, SOCK_DGRAM);
    pthread_t t;
    int fds[4] = { t4, t6, u4, u6 };
    for (int i = 0; i < 4; i++) {
        if (pthread_create(&t, NULL, i < 2 ? accept_loop : udp_echo, (void *)(intptr_t)fds[i]) != 0)
            die("pthread_create");
        pthread_detach(t);
    }
    printf("READY tcp4=%d tcp6=%d udp4=%d udp6=%d\n", port_of(t4), port_of(t6), port_of(u4), port_of(u6));
    fflush(stdout);
    for (;;)
        pause();
}
