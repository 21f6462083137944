/* Edge cases of unmodified programs' socket use (issue 3), one named check per run:
 *
 *   edge CHECK TCP4 TCP6 UDP4 UDP6     run CHECK against progs/peer.c listening on those ports
 *   edge --list                        print the check names with their role
 *   edge child-connect TCP4            (used by the exec checks) connect to the peer, echo
 *   edge child-inherited FD CLOFD      (used by exec_inherits_socket) use inherited FD
 *
 * Each check prints one line per sub-check, "ok CHECK: ..." or "FAIL CHECK: ...", with errno
 * names where a call failed, and exits 1 if any sub-check failed. A watchdog (SIGALRM)
 * turns a hang into "FAIL CHECK: watchdog: ... stuck in <step>" and exit 3.
 *
 * Every expectation is what Linux does natively; the native run of the test suite proves it.
 * The role says which end of the connections this program is: "client" (it connects to the
 * peer) or "server" (it listens and asks the peer to connect to it).
 */
#include "common.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>

extern char **environ;

static const char *check_name = "?";
static int failures;
static const char *volatile step = "start";
static int P_TCP4, P_TCP6, P_UDP4, P_UDP6;
static char self_exe[4096];
static int watchdog_s = 20;

#define STEP(s) (step = (s))

static void report(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(int ok, const char *fmt, ...)
{
    va_list ap;
    printf("%s %s: ", ok ? "ok" : "FAIL", check_name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
    if (!ok)
        failures++;
}
/* cond is evaluated first, so errno in a failure's message is the one cond's calls left;
 * after a success errno is cleared, so the message does not show a stale one */
#define EXPECT(cond, ...)            \
    do {                             \
        int ok_ = !!(cond);          \
        if (ok_)                     \
            errno = 0;               \
        report(ok_, __VA_ARGS__);    \
    } while (0)

/* A failure after which the check cannot go on. */
#define FATAL(...)                  \
    do {                            \
        report(0, __VA_ARGS__);     \
        exit(1);                    \
    } while (0)

static void put(const char *s)
{
    ssize_t r = write(1, s, strlen(s));
    (void)r;
}

static void on_watchdog(int sig)
{
    (void)sig;
    char num[16];
    snprintf(num, sizeof num, "%d", watchdog_s);
    put("FAIL ");
    put(check_name);
    put(": watchdog: no result within ");
    put(num);
    put(" s, stuck in: ");
    put((const char *)step);
    put("\n");
    _exit(3);
}

/* ---------- helpers ---------- */

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

/* Read exactly n bytes (blocking socket); returns the count read (< n on EOF) or -1. */
static ssize_t recv_n(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Read one line (without '\n') from a blocking socket. */
static int recv_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = recv(fd, buf + n, 1, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = 0;
    return (int)n;
}

static struct sockaddr_in lo4(int port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static struct sockaddr_in6 lo6(int port)
{
    struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port) };
    a.sin6_addr = in6addr_loopback;
    return a;
}

static int tcp_connect4(int port, int type_flags)
{
    int fd = socket(AF_INET, SOCK_STREAM | type_flags, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = lo4(port);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static char *new_tag(void)
{
    static int n;
    char *t = malloc(40);
    snprintf(t, 40, "t%d_%d", (int)getpid(), ++n);
    return t;
}

/* A connection to the peer running command "tag CMD..." (tag NULL: untagged). */
static int peer_cmd_flags(int type_flags, const char *tag, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int peer_cmd_flags(int type_flags, const char *tag, const char *fmt, ...)
{
    char line[512];
    int n = snprintf(line, sizeof line, "%s ", tag ? tag : "-");
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    line[n++] = '\n';
    STEP("connecting to the peer");
    int fd = tcp_connect4(P_TCP4, type_flags);
    if (fd < 0)
        FATAL("connect to the peer at 127.0.0.1:%d: %s", P_TCP4, ename(errno));
    int saved = fcntl(fd, F_GETFL);
    if (saved & O_NONBLOCK)
        fcntl(fd, F_SETFL, saved & ~O_NONBLOCK);
    if (send_all(fd, line, (size_t)n) < 0)
        FATAL("send command to the peer: %s", ename(errno));
    if (saved & O_NONBLOCK)
        fcntl(fd, F_SETFL, saved);
    return fd;
}
#define peer_cmd(tag, ...) peer_cmd_flags(0, tag, __VA_ARGS__)

/* "EOF" if the peer has seen the end of tag's connection (waiting up to ms), else "OPEN". */
static const char *peer_query(const char *tag, int ms)
{
    static char ans[64];
    const char *old = step;
    int fd = peer_cmd(NULL, "QUERY %s %d", tag, ms);
    STEP("reading the peer's QUERY answer");
    recv_line(fd, ans, sizeof ans);
    close(fd);
    step = old;
    return ans;
}

/* Send text and expect want back (an ECHO/UPPER connection). */
static void expect_echo(int fd, const char *text, const char *want, const char *what)
{
    char buf[512];
    size_t n = strlen(text);
    STEP(what);
    if (send_all(fd, text, n) < 0) {
        report(0, "%s: send: %s", what, ename(errno));
        return;
    }
    ssize_t r = recv_n(fd, buf, strlen(want));
    if (r < 0) {
        report(0, "%s: recv: %s", what, ename(errno));
        return;
    }
    buf[r] = 0;
    EXPECT(r == (ssize_t)strlen(want) && memcmp(buf, want, (size_t)r) == 0, "%s: sent '%s', got back '%s' (want '%s')",
           what, text, buf, want);
}

static int is_ready(int fd, short ev, int ms)
{
    struct pollfd p = { .fd = fd, .events = ev };
    return poll(&p, 1, ms) == 1 ? p.revents : 0;
}

static volatile sig_atomic_t sigusr1_count;
static void on_usr1(int sig)
{
    (void)sig;
    sigusr1_count++;
}

static void set_usr1(int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

struct killer {
    pthread_t target;
    int ms;
};
static void *killer_main(void *arg)
{
    struct killer *k = arg;
    sleep_ms(k->ms);
    pthread_kill(k->target, SIGUSR1);
    return NULL;
}
/* SIGUSR1 to the calling thread after ms milliseconds (from a helper thread). */
static pthread_t kill_me_later(int ms)
{
    static struct killer k;
    k.target = pthread_self();
    k.ms = ms;
    pthread_t t;
    pthread_create(&t, NULL, killer_main, &k);
    return t;
}

static int port_of(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        return -1;
    return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static const char *addr_str(const struct sockaddr *sa)
{
    static char bufs[4][80];
    static int k;
    char *b = bufs[k++ % 4];
    char ip[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)sa;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        snprintf(b, 80, "%s:%d", ip, ntohs(a->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        snprintf(b, 80, "[%s]:%d", ip, ntohs(a->sin6_port));
    } else {
        snprintf(b, 80, "(family %d)", sa->sa_family);
    }
    return b;
}

static const char *evstr(uint32_t ev)
{
    static char bufs[4][128];
    static int k;
    char *b = bufs[k++ % 4];
    b[0] = 0;
    static const struct { uint32_t bit; const char *name; } names[] = {
        { EPOLLIN, "IN" }, { EPOLLOUT, "OUT" }, { EPOLLRDHUP, "RDHUP" }, { EPOLLPRI, "PRI" },
        { EPOLLERR, "ERR" }, { EPOLLHUP, "HUP" },
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (ev & names[i].bit) {
            strcat(b, b[0] ? "|" : "");
            strcat(b, names[i].name);
        }
    if (!b[0])
        strcpy(b, "none");
    return b;
}

/* Wait (up to ms) until epoll reports something for data==tag; returns those events or 0. */
static uint32_t epoll_for(int ep, uint64_t tag, int ms)
{
    double end = now_ms() + ms;
    for (;;) {
        struct epoll_event evs[16];
        int left = (int)(end - now_ms());
        if (left < 0)
            left = 0;
        int n = epoll_wait(ep, evs, 16, left);
        if (n < 0 && errno == EINTR)
            continue;
        for (int i = 0; i < n; i++)
            if (evs[i].data.u64 == tag)
                return evs[i].events;
        if (left == 0)
            return 0;
    }
}

/* All events epoll reports right now (timeout ms), as a bitmask of tags 1..63. */
static uint64_t epoll_tags(int ep, int ms, int *count)
{
    struct epoll_event evs[64];
    int n;
    do
        n = epoll_wait(ep, evs, 64, ms);
    while (n < 0 && errno == EINTR);
    uint64_t m = 0;
    for (int i = 0; i < n; i++)
        m |= 1ULL << evs[i].data.u64;
    if (count)
        *count = n;
    return m;
}

static int ep_add(int ep, int fd, uint32_t events, uint64_t tag)
{
    struct epoll_event ev = { .events = events, .data.u64 = tag };
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

/* Wait until recv(MSG_PEEK) sees at least n bytes (up to ms). */
static int wait_bytes(int fd, size_t n, int ms)
{
    char buf[65536];
    double end = now_ms() + ms;
    while (now_ms() < end) {
        ssize_t r = recv(fd, buf, n < sizeof buf ? n : sizeof buf, MSG_PEEK | MSG_DONTWAIT);
        if (r >= (ssize_t)n)
            return 1;
        sleep_ms(2);
    }
    return 0;
}

static int wait_child(pid_t pid, const char *what)
{
    int st = 0;
    STEP(what);
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            report(0, "%s: waitpid: %s", what, ename(errno));
            return -1;
        }
    }
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}

/* ---------- threads, signals, close ---------- */

struct blocked_recv {
    int fd;
    ssize_t r;
    int err;
    char buf[64];
    volatile int done;
    double at;
};
static void *blocked_recv_main(void *arg)
{
    struct blocked_recv *b = arg;
    b->r = recv(b->fd, b->buf, sizeof b->buf - 1, 0);
    b->err = errno;
    b->at = now_ms();
    b->done = 1;
    return NULL;
}

/* close() of a socket another thread is blocked in recv() on: Linux does not wake the
 * reader; the connection stays open (the peer sees no EOF) until that recv returns, here
 * with data the peer sends later; then the last reference is gone and the peer sees EOF. */
static void check_close_while_recv_blocked(void)
{
    char *tag = new_tag();
    int s = peer_cmd(tag, "DELAY 1500 late");
    struct blocked_recv b = { .fd = s };
    pthread_t t;
    pthread_create(&t, NULL, blocked_recv_main, &b);
    sleep_ms(200);
    STEP("close while another thread is in recv");
    EXPECT(close(s) == 0, "close(fd) while another thread is blocked in recv on it returns 0 (%s)", ename(errno));
    double closed_at = now_ms();
    sleep_ms(300);
    EXPECT(!b.done, "the blocked recv is still blocked 300 ms after close (done=%d r=%zd errno=%s)", b.done, b.r, ename(b.err));
    const char *q = peer_query(tag, 0);
    EXPECT(strcmp(q, "OPEN") == 0, "the peer sees no EOF while the recv still holds the socket (peer says %s)", q);
    STEP("joining the blocked recv thread");
    pthread_join(t, NULL);
    b.buf[b.r > 0 ? b.r : 0] = 0;
    EXPECT(b.r == 4 && memcmp(b.buf, "late", 4) == 0,
           "the blocked recv returns the peer's later data: r=%zd errno=%s data='%s' after %.0f ms (want 4, 'late')", b.r,
           b.r < 0 ? ename(b.err) : "0", b.buf, b.at - closed_at);
    q = peer_query(tag, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "once that recv returned, the peer sees EOF (peer says %s)", q);
}

/* shutdown(SHUT_RDWR) from another thread wakes a blocked recv with 0 (EOF). */
static void check_shutdown_wakes_blocked_recv(void)
{
    char *tag = new_tag();
    int s = peer_cmd(tag, "WATCH");
    struct blocked_recv b = { .fd = s };
    pthread_t t;
    pthread_create(&t, NULL, blocked_recv_main, &b);
    sleep_ms(200);
    EXPECT(!b.done, "recv blocks while no data comes (done=%d)", b.done);
    double t0 = now_ms();
    STEP("shutdown(SHUT_RDWR) while another thread is in recv");
    EXPECT(shutdown(s, SHUT_RDWR) == 0, "shutdown(SHUT_RDWR) returns 0 (%s)", ename(errno));
    STEP("joining the blocked recv thread after shutdown");
    pthread_join(t, NULL);
    EXPECT(b.r == 0, "the blocked recv returns 0 (EOF): r=%zd errno=%s after %.0f ms", b.r, b.r < 0 ? ename(b.err) : "0",
           b.at - t0);
    const char *q = peer_query(tag, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "the peer sees EOF after shutdown (peer says %s)", q);
    close(s);
}

/* A blocking recv interrupted by a signal: EINTR without SA_RESTART; restarted (and then
 * returning the data that comes later) with SA_RESTART. */
static void check_eintr_recv(void)
{
    int s = peer_cmd(NULL, "WATCH");
    set_usr1(0);
    sigusr1_count = 0;
    pthread_t k = kill_me_later(250);
    char buf[64];
    double t0 = now_ms();
    STEP("recv waiting for SIGUSR1 (no SA_RESTART)");
    ssize_t r = recv(s, buf, sizeof buf, 0);
    int e = errno;
    double dt = now_ms() - t0;
    pthread_join(k, NULL);
    EXPECT(r == -1 && e == EINTR, "recv interrupted by a handled signal (no SA_RESTART): r=%zd errno=%s (want -1 EINTR)", r,
           r < 0 ? ename(e) : "0");
    EXPECT(sigusr1_count == 1 && dt >= 200, "the handler ran once (%d) and recv blocked until the signal (%.0f ms)",
           (int)sigusr1_count, dt);
    close(s);

    s = peer_cmd(NULL, "DELAY 700 late");
    set_usr1(SA_RESTART);
    sigusr1_count = 0;
    k = kill_me_later(250);
    STEP("recv with SA_RESTART, signal at 250 ms, data at 700 ms");
    r = recv(s, buf, sizeof buf, 0);
    e = errno;
    pthread_join(k, NULL);
    EXPECT(r == 4 && memcmp(buf, "late", 4) == 0 && sigusr1_count == 1,
           "with SA_RESTART recv is restarted after the handler and returns the later data: r=%zd errno=%s handler ran %d time(s)",
           r, r < 0 ? ename(e) : "0", (int)sigusr1_count);
    close(s);
    signal(SIGUSR1, SIG_DFL);
}

/* ---------- epoll ---------- */

static void check_et_epoll_drain(void)
{
    const size_t total = 1 << 20;
    int s = peer_cmd(NULL, "SEND %zu", total);
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    EXPECT(ep_add(ep, s, EPOLLIN | EPOLLET, 7) == 0, "EPOLL_CTL_ADD EPOLLIN|EPOLLET (%s)", ename(errno));
    size_t got = 0, bad = 0, wakeups = 0, eagains = 0;
    char *buf = malloc(65536);
    STEP("edge-triggered epoll loop reading 1 MiB");
    while (got < total) {
        uint32_t ev = epoll_for(ep, 7, 3000);
        if (!ev) {
            report(0, "edge-triggered epoll stalled after %zu of %zu bytes (an edge was lost, or a read did not drain)", got,
                   total);
            break;
        }
        wakeups++;
        for (;;) { /* drain to EAGAIN, as ET requires */
            ssize_t r = recv(s, buf, 65536, 0);
            if (r > 0) {
                for (ssize_t i = 0; i < r; i++)
                    bad += (unsigned char)buf[i] != pat(got + (size_t)i);
                got += (size_t)r;
                continue;
            }
            if (r < 0 && errno == EAGAIN) {
                eagains++;
                break;
            }
            report(0, "recv while draining: r=%zd errno=%s after %zu bytes", r, r < 0 ? ename(errno) : "0", got);
            got = total + 1;
            break;
        }
    }
    EXPECT(got == total && bad == 0, "received %zu bytes (want %zu), %zu wrong, in %zu wake-ups each drained to EAGAIN (%zu)",
           got, total, bad, wakeups, eagains);
    int n;
    epoll_tags(ep, 200, &n);
    EXPECT(n == 0, "after draining, no new data: epoll_wait reports nothing (%d events)", n);
    free(buf);
    close(ep);
    close(s);
}

static void check_nonblocking_connect_epoll(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = lo4(P_TCP4);
    STEP("non-blocking connect");
    int rc = connect(s, (struct sockaddr *)&a, sizeof a);
    int e = errno;
    EXPECT(rc == 0 || (rc == -1 && e == EINPROGRESS), "non-blocking connect returns 0 or EINPROGRESS (rc=%d errno=%s)", rc,
           rc ? ename(e) : "0");
    int ep = epoll_create1(0);
    ep_add(ep, s, EPOLLOUT, 1);
    uint32_t ev = epoll_for(ep, 1, 5000);
    EXPECT(ev & EPOLLOUT && !(ev & (EPOLLERR | EPOLLHUP)), "epoll reports the connect completed: %s (want OUT)", evstr(ev));
    int err = -1;
    socklen_t len = sizeof err;
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    EXPECT(err == 0, "SO_ERROR after completion is 0 (%s)", ename(err));
    /* Linux: the first connect() after completion reports it (0), later ones EISCONN */
    rc = connect(s, (struct sockaddr *)&a, sizeof a);
    e = errno;
    EXPECT(rc == 0 || (rc == -1 && e == EISCONN), "connect again after completion: 0 or EISCONN (rc=%d errno=%s)", rc,
           rc ? ename(e) : "0");
    rc = connect(s, (struct sockaddr *)&a, sizeof a);
    e = errno;
    EXPECT(rc == -1 && e == EISCONN, "and once more: EISCONN (rc=%d errno=%s)", rc, rc ? ename(e) : "0");
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
    const char *cmd = "- ECHO\n";
    send_all(s, cmd, strlen(cmd));
    expect_echo(s, "via-nonblocking-connect", "via-nonblocking-connect", "echo over the connection");
    close(s);

    /* refused: a port nothing listens on */
    int tmp = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in b = lo4(0);
    bind(tmp, (struct sockaddr *)&b, sizeof b);
    int closed = port_of(tmp);
    close(tmp);
    s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    a = lo4(closed);
    rc = connect(s, (struct sockaddr *)&a, sizeof a);
    e = errno;
    EXPECT(rc == -1 && (e == EINPROGRESS || e == ECONNREFUSED), "non-blocking connect to a closed port: rc=%d errno=%s", rc,
           ename(e));
    ep_add(ep, s, EPOLLOUT, 2);
    ev = epoll_for(ep, 2, 5000);
    EXPECT((ev & (EPOLLERR | EPOLLHUP)) == (EPOLLERR | EPOLLHUP), "epoll reports the refused connect: %s (want ERR|HUP)",
           evstr(ev));
    err = 0;
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    EXPECT(err == ECONNREFUSED || (rc == -1 && e == ECONNREFUSED && err == 0), "SO_ERROR: %s (want ECONNREFUSED)", ename(err));
    close(s);
    close(ep);
}

/* Level-triggered epoll over a canal socket, a pipe, an eventfd and a timerfd, plus a pipe
 * whose reader is gone (EPOLLERR); MOD, DEL, EEXIST, ENOENT; closing a member. */
static void check_epoll_mixed_level(void)
{
    int s = peer_cmd(NULL, "ECHO");
    int p[2], q[2];
    if (pipe(p) || pipe(q))
        FATAL("pipe: %s", ename(errno));
    close(q[0]);
    int efd = eventfd(0, EFD_NONBLOCK);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    int ep = epoll_create1(0);
    EXPECT(ep_add(ep, s, EPOLLIN, 1) == 0 && ep_add(ep, p[0], EPOLLIN, 2) == 0 && ep_add(ep, efd, EPOLLIN, 3) == 0 &&
               ep_add(ep, tfd, EPOLLIN, 4) == 0,
           "EPOLL_CTL_ADD of a socket, a pipe, an eventfd and a timerfd (%s)", ename(errno));
    int n;
    uint64_t m = epoll_tags(ep, 0, &n);
    EXPECT(n == 0, "nothing ready at first (%d events, tags %#llx)", n, (unsigned long long)m);
    int rc = ep_add(ep, s, EPOLLIN, 1);
    EXPECT(rc == -1 && errno == EEXIST, "adding the socket twice: EEXIST (rc=%d %s)", rc, ename(errno));

    STEP("level-triggered: socket readable");
    send_all(s, "hello", 5);
    uint32_t ev = epoll_for(ep, 1, 3000);
    EXPECT(ev == EPOLLIN, "socket reported readable: %s", evstr(ev));
    wait_bytes(s, 5, 2000);
    m = epoll_tags(ep, 0, &n);
    EXPECT(m == (1 << 1), "level-triggered: still reported before reading (tags %#llx)", (unsigned long long)m);
    char buf[64];
    ssize_t r = recv(s, buf, sizeof buf, 0);
    m = epoll_tags(ep, 0, &n);
    EXPECT(r == 5 && n == 0, "after reading all %zd bytes nothing is reported (%d events)", r, n);

    STEP("level-triggered: all four at once");
    send_all(s, "again", 5);
    if (write(p[1], "x", 1) != 1 || write(efd, &(uint64_t){ 1 }, 8) != 8)
        report(0, "write to pipe/eventfd: %s", ename(errno));
    struct itimerspec its = { .it_value = { 0, 50 * 1000000L } };
    timerfd_settime(tfd, 0, &its, NULL);
    wait_bytes(s, 5, 2000);
    sleep_ms(120);
    m = epoll_tags(ep, 1000, &n);
    EXPECT(m == 0x1e && n == 4, "socket, pipe, eventfd and timerfd all reported (tags %#llx, want 0x1e; %d events)",
           (unsigned long long)m, n);
    r = recv(s, buf, sizeof buf, 0);
    uint64_t v;
    if (read(p[0], buf, 1) != 1 || read(efd, &v, 8) != 8 || read(tfd, &v, 8) != 8)
        report(0, "read pipe/eventfd/timerfd: %s", ename(errno));
    m = epoll_tags(ep, 0, &n);
    EXPECT(n == 0, "after consuming all four, nothing is reported (tags %#llx)", (unsigned long long)m);

    STEP("EPOLLERR on a pipe without reader");
    ep_add(ep, q[1], EPOLLOUT, 5);
    ev = epoll_for(ep, 5, 1000);
    EXPECT(ev == (EPOLLOUT | EPOLLERR), "a pipe whose reader is closed: %s (want OUT|ERR)", evstr(ev));
    epoll_ctl(ep, EPOLL_CTL_DEL, q[1], NULL);

    STEP("EPOLL_CTL_MOD and DEL on the socket");
    struct epoll_event mod = { .events = EPOLLOUT, .data.u64 = 6 };
    EXPECT(epoll_ctl(ep, EPOLL_CTL_MOD, s, &mod) == 0, "EPOLL_CTL_MOD to EPOLLOUT (%s)", ename(errno));
    ev = epoll_for(ep, 6, 1000);
    EXPECT(ev == EPOLLOUT, "the socket is reported writable with the new tag: %s", evstr(ev));
    EXPECT(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) == 0, "EPOLL_CTL_DEL (%s)", ename(errno));
    m = epoll_tags(ep, 0, &n);
    EXPECT(n == 0, "a deleted socket is no longer reported (%d events)", n);
    rc = epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL);
    EXPECT(rc == -1 && errno == ENOENT, "deleting it again: ENOENT (rc=%d %s)", rc, ename(errno));

    STEP("closing a socket that is in the set");
    ep_add(ep, s, EPOLLOUT, 8);
    ev = epoll_for(ep, 8, 1000);
    close(s);
    m = epoll_tags(ep, 0, &n);
    EXPECT(ev == EPOLLOUT && n == 0, "after close() the socket's registration is gone (before: %s; after: %d events)",
           evstr(ev), n);
    close(ep);
    close(p[0]);
    close(p[1]);
    close(q[1]);
    close(efd);
    close(tfd);
}

/* Edge-triggered: a partial read brings no new event; new data does; an eventfd re-triggers
 * on each write. */
static void check_epoll_edge_mixed(void)
{
    int s = peer_cmd(NULL, "ECHO");
    int efd = eventfd(0, EFD_NONBLOCK);
    int ep = epoll_create1(0);
    ep_add(ep, s, EPOLLIN | EPOLLET, 1);
    ep_add(ep, efd, EPOLLIN | EPOLLET, 2);
    char out[100];
    for (int i = 0; i < 100; i++)
        out[i] = (char)pat((uint64_t)i);
    send_all(s, out, 100);
    STEP("waiting for the first edge");
    uint32_t ev = epoll_for(ep, 1, 3000);
    EXPECT(ev & EPOLLIN, "first edge: %s", evstr(ev));
    EXPECT(wait_bytes(s, 100, 2000), "all 100 bytes arrived");
    int n;
    /* The echo may come back in more than one piece; each later piece is a new edge
     * (natively too). Take those before the partial read, whose point is that it makes
     * none. */
    epoll_tags(ep, 0, &n);
    char buf[200];
    ssize_t r1 = recv(s, buf, 10, 0);
    epoll_tags(ep, 200, &n);
    EXPECT(r1 == 10 && n == 0, "after a partial read (10 of 100) edge-triggered epoll reports nothing (%d events)", n);
    send_all(s, out, 5);
    ev = epoll_for(ep, 1, 3000);
    EXPECT(ev & EPOLLIN, "new data makes a new edge: %s", evstr(ev));
    wait_bytes(s, 95, 2000);
    ssize_t r2 = recv_n(s, buf + 10, 95);
    EXPECT(r1 + r2 == 105 && memcmp(buf, out, 100) == 0 && memcmp(buf + 100, out, 5) == 0, "all 105 bytes intact (%zd)",
           r1 + r2);
    if (write(efd, &(uint64_t){ 1 }, 8) != 8)
        report(0, "eventfd write: %s", ename(errno));
    ev = epoll_for(ep, 2, 1000);
    epoll_tags(ep, 100, &n);
    EXPECT(ev == EPOLLIN && n == 0, "eventfd: one edge per write (first %s, then %d events)", evstr(ev), n);
    if (write(efd, &(uint64_t){ 1 }, 8) != 8)
        report(0, "eventfd write: %s", ename(errno));
    ev = epoll_for(ep, 2, 1000);
    EXPECT(ev == EPOLLIN, "eventfd: a second write makes a second edge without reading: %s", evstr(ev));
    close(ep);
    close(efd);
    close(s);
}

static void check_epoll_oneshot(void)
{
    int s = peer_cmd(NULL, "ECHO");
    int ep = epoll_create1(0);
    ep_add(ep, s, EPOLLIN | EPOLLONESHOT, 1);
    send_all(s, "a", 1);
    STEP("first oneshot event");
    uint32_t ev = epoll_for(ep, 1, 3000);
    EXPECT(ev == EPOLLIN, "first event: %s", evstr(ev));
    int n;
    epoll_tags(ep, 200, &n);
    EXPECT(n == 0, "disarmed after one event, though data is unread (%d events)", n);
    send_all(s, "b", 1);
    wait_bytes(s, 2, 2000);
    epoll_tags(ep, 200, &n);
    EXPECT(n == 0, "still disarmed when more data arrives (%d events)", n);
    struct epoll_event mod = { .events = EPOLLIN | EPOLLONESHOT, .data.u64 = 2 };
    EXPECT(epoll_ctl(ep, EPOLL_CTL_MOD, s, &mod) == 0, "EPOLL_CTL_MOD re-arms (%s)", ename(errno));
    ev = epoll_for(ep, 2, 1000);
    EXPECT(ev == EPOLLIN, "re-armed: the pending data is reported at once: %s", evstr(ev));
    epoll_tags(ep, 100, &n);
    EXPECT(n == 0, "and then it is disarmed again (%d events)", n);
    char buf[8];
    EXPECT(recv_n(s, buf, 2) == 2 && memcmp(buf, "ab", 2) == 0, "data intact");
    close(ep);
    close(s);
}

static void check_epoll_rdhup(void)
{
    int s = peer_cmd(NULL, "HALFCLOSE bye");
    int ep = epoll_create1(0);
    ep_add(ep, s, EPOLLIN | EPOLLRDHUP, 1);
    STEP("waiting for EPOLLRDHUP");
    uint32_t ev = 0;
    double end = now_ms() + 3000;
    while (!(ev & EPOLLRDHUP) && now_ms() < end)
        ev |= epoll_for(ep, 1, 100);
    EXPECT((ev & (EPOLLIN | EPOLLRDHUP)) == (EPOLLIN | EPOLLRDHUP) && !(ev & (EPOLLHUP | EPOLLERR)),
           "peer's shutdown(SHUT_WR): %s (want IN|RDHUP, no HUP/ERR)", evstr(ev));
    struct pollfd pf = { .fd = s, .events = POLLIN | POLLRDHUP };
    int pr = poll(&pf, 1, 0);
    EXPECT(pr == 1 && (pf.revents & (POLLIN | POLLRDHUP)) == (POLLIN | POLLRDHUP), "poll agrees: POLLIN|POLLRDHUP (%#x)",
           pf.revents);
    char buf[16];
    ssize_t r = recv_n(s, buf, 3);
    ssize_t r2 = recv(s, buf + 3, 10, 0);
    EXPECT(r == 3 && memcmp(buf, "bye", 3) == 0 && r2 == 0, "data then EOF (r=%zd, then %zd)", r, r2);
    EXPECT(send_all(s, "still-writable", 14) == 0, "our direction still works after the peer's half-close (%s)",
           ename(errno));
    close(ep);
    close(s);
}

static void check_epoll_hup_err(void)
{
    /* both directions shut down -> EPOLLHUP */
    int s = peer_cmd(NULL, "HALFCLOSE x");
    int ep = epoll_create1(0);
    ep_add(ep, s, EPOLLIN | EPOLLRDHUP, 1);
    shutdown(s, SHUT_WR);
    STEP("waiting for EPOLLHUP after both sides shut down");
    uint32_t ev = 0;
    double end = now_ms() + 3000;
    while (!(ev & EPOLLHUP) && now_ms() < end)
        ev = epoll_for(ep, 1, 100);
    EXPECT((ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) == (EPOLLIN | EPOLLRDHUP | EPOLLHUP) && !(ev & EPOLLERR),
           "both directions shut down: %s (want IN|RDHUP|HUP)", evstr(ev));
    close(s);

    /* reset by the peer -> EPOLLERR|EPOLLHUP, SO_ERROR ECONNRESET, then EPIPE */
    s = peer_cmd(NULL, "RST");
    ep_add(ep, s, EPOLLIN, 2); /* EPOLLERR and EPOLLHUP are always reported */
    STEP("waiting for EPOLLERR after a reset");
    ev = 0;
    end = now_ms() + 3000;
    while (!(ev & EPOLLERR) && now_ms() < end)
        ev = epoll_for(ep, 2, 100);
    EXPECT((ev & (EPOLLERR | EPOLLHUP)) == (EPOLLERR | EPOLLHUP), "reset by the peer: %s (want ERR|HUP, not asked for)",
           evstr(ev));
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    EXPECT(err == ECONNRESET, "SO_ERROR: %s (want ECONNRESET)", ename(err));
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    EXPECT(err == 0, "SO_ERROR is cleared by reading it: %s", ename(err));
    char buf[4];
    ssize_t r = recv(s, buf, sizeof buf, 0);
    EXPECT(r == 0, "recv after the error was read: r=%zd %s (want 0)", r, r < 0 ? ename(errno) : "");
    r = send(s, "x", 1, MSG_NOSIGNAL);
    EXPECT(r == -1 && errno == EPIPE, "send after a reset: r=%zd %s (want EPIPE)", r, r < 0 ? ename(errno) : "");
    close(s);

    s = peer_cmd(NULL, "RST");
    STEP("recv after a reset");
    r = recv(s, buf, sizeof buf, 0);
    EXPECT(r == -1 && errno == ECONNRESET, "blocking recv on a reset connection: r=%zd %s (want ECONNRESET)", r,
           r < 0 ? ename(errno) : "");
    close(s);
    close(ep);
}

static void check_epoll_two_sets(void)
{
    int s = peer_cmd(NULL, "ECHO");
    int ep1 = epoll_create1(0), ep2 = epoll_create1(0);
    EXPECT(ep_add(ep1, s, EPOLLIN, 1) == 0 && ep_add(ep2, s, EPOLLIN | EPOLLET, 2) == 0,
           "one socket added to two epoll sets (level and edge) (%s)", ename(errno));
    send_all(s, "x", 1);
    STEP("both sets report");
    uint32_t e1 = epoll_for(ep1, 1, 3000), e2 = epoll_for(ep2, 2, 3000);
    EXPECT(e1 == EPOLLIN && e2 == EPOLLIN, "both report readable: %s / %s", evstr(e1), evstr(e2));
    int n1, n2;
    epoll_tags(ep1, 0, &n1);
    epoll_tags(ep2, 0, &n2);
    EXPECT(n1 == 1 && n2 == 0, "level set reports again, edge set does not (%d, %d)", n1, n2);
    char buf[4];
    recv(s, buf, sizeof buf, 0);
    epoll_ctl(ep1, EPOLL_CTL_DEL, s, NULL);
    send_all(s, "y", 1);
    e2 = epoll_for(ep2, 2, 3000);
    epoll_tags(ep1, 100, &n1);
    EXPECT(e2 == EPOLLIN && n1 == 0, "after removal from one set the other still reports: %s (removed set: %d events)",
           evstr(e2), n1);
    close(ep1);
    close(ep2);
    close(s);
}

static void check_epoll_nested(void)
{
    int s = peer_cmd(NULL, "ECHO");
    int inner = epoll_create1(0), outer = epoll_create1(0);
    ep_add(inner, s, EPOLLIN, 1);
    EXPECT(ep_add(outer, inner, EPOLLIN, 9) == 0, "an epoll fd added to another epoll set (%s)", ename(errno));
    int n;
    epoll_tags(outer, 0, &n);
    EXPECT(n == 0, "nothing ready at first (%d)", n);
    send_all(s, "z", 1);
    STEP("outer epoll reports the inner one");
    uint32_t ev = epoll_for(outer, 9, 3000);
    EXPECT(ev == EPOLLIN, "outer set reports the inner set readable: %s", evstr(ev));
    EXPECT(is_ready(inner, POLLIN, 0) & POLLIN, "poll() on the inner epoll fd: POLLIN");
    uint64_t m = epoll_tags(inner, 0, &n);
    EXPECT(m == 2 && n == 1, "the inner set reports the socket (tags %#llx)", (unsigned long long)m);
    char buf[4];
    recv(s, buf, sizeof buf, 0);
    epoll_tags(outer, 100, &n);
    EXPECT(n == 0, "after reading, the outer set reports nothing (%d)", n);
    close(outer);
    close(inner);
    close(s);
}

static void check_epoll_pwait_timeout_eintr(void)
{
    int s = peer_cmd(NULL, "WATCH");
    int ep = epoll_create1(0);
    ep_add(ep, s, EPOLLIN, 1);
    struct epoll_event evs[4];
    STEP("epoll_pwait with a 150 ms timeout");
    double t0 = now_ms();
    int n = epoll_pwait(ep, evs, 4, 150, NULL);
    double dt = now_ms() - t0;
    EXPECT(n == 0 && dt >= 140 && dt < 2000, "epoll_pwait times out: n=%d after %.0f ms (want 0 after ~150)", n, dt);

    set_usr1(SA_RESTART);
    sigset_t block, empty;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigemptyset(&empty);
    sigprocmask(SIG_BLOCK, &block, NULL);
    sigusr1_count = 0;
    raise(SIGUSR1);
    EXPECT(sigusr1_count == 0, "a blocked signal stays pending");
    STEP("epoll_pwait unblocking a pending signal");
    t0 = now_ms();
    n = epoll_pwait(ep, evs, 4, 5000, &empty);
    int e = errno;
    dt = now_ms() - t0;
    EXPECT(n == -1 && e == EINTR && sigusr1_count == 1 && dt < 1000,
           "epoll_pwait with a mask unblocking the pending signal: n=%d %s, handler ran %d, %.0f ms (want EINTR at once)", n,
           n < 0 ? ename(e) : "", (int)sigusr1_count, dt);
    sigprocmask(SIG_UNBLOCK, &block, NULL);

    sigusr1_count = 0;
    pthread_t k = kill_me_later(200);
    STEP("epoll_wait interrupted by a signal (SA_RESTART does not apply)");
    t0 = now_ms();
    n = epoll_wait(ep, evs, 4, 5000);
    e = errno;
    dt = now_ms() - t0;
    pthread_join(k, NULL);
    EXPECT(n == -1 && e == EINTR && sigusr1_count == 1 && dt >= 150,
           "epoll_wait interrupted by a handled signal even with SA_RESTART: n=%d %s after %.0f ms", n, n < 0 ? ename(e) : "",
           dt);
    signal(SIGUSR1, SIG_DFL);
    close(ep);
    close(s);
}

static void check_ppoll_pselect(void)
{
    int s = peer_cmd(NULL, "ECHO");
    struct pollfd pf = { .fd = s, .events = POLLIN };
    struct timespec ts = { 0, 150 * 1000000L };
    STEP("ppoll timeout");
    double t0 = now_ms();
    int n = ppoll(&pf, 1, &ts, NULL);
    double dt = now_ms() - t0;
    EXPECT(n == 0 && dt >= 140 && dt < 2000, "ppoll times out: n=%d after %.0f ms", n, dt);
    fd_set rf;
    FD_ZERO(&rf);
    FD_SET(s, &rf);
    STEP("pselect timeout");
    t0 = now_ms();
    n = pselect(s + 1, &rf, NULL, NULL, &ts, NULL);
    dt = now_ms() - t0;
    EXPECT(n == 0 && !FD_ISSET(s, &rf) && dt >= 140 && dt < 2000, "pselect times out: n=%d after %.0f ms", n, dt);

    set_usr1(SA_RESTART);
    sigset_t block, empty;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigemptyset(&empty);
    sigprocmask(SIG_BLOCK, &block, NULL);
    struct timespec longts = { 5, 0 };
    sigusr1_count = 0;
    raise(SIGUSR1);
    STEP("ppoll unblocking a pending signal");
    n = ppoll(&pf, 1, &longts, &empty);
    int e = errno;
    EXPECT(n == -1 && e == EINTR && sigusr1_count == 1, "ppoll with a mask unblocking a pending signal: n=%d %s", n,
           n < 0 ? ename(e) : "");
    raise(SIGUSR1);
    FD_ZERO(&rf);
    FD_SET(s, &rf);
    STEP("pselect unblocking a pending signal");
    n = pselect(s + 1, &rf, NULL, NULL, &longts, &empty);
    e = errno;
    EXPECT(n == -1 && e == EINTR && sigusr1_count == 2, "pselect with a mask unblocking a pending signal: n=%d %s", n,
           n < 0 ? ename(e) : "");
    sigprocmask(SIG_UNBLOCK, &block, NULL);
    signal(SIGUSR1, SIG_DFL);

    int p[2];
    if (pipe(p))
        FATAL("pipe: %s", ename(errno));
    send_all(s, "ping", 4);
    if (write(p[1], "x", 1) != 1)
        report(0, "write pipe: %s", ename(errno));
    wait_bytes(s, 4, 2000);
    struct pollfd two[2] = { { .fd = s, .events = POLLIN | POLLOUT }, { .fd = p[0], .events = POLLIN } };
    STEP("ppoll readiness");
    n = ppoll(two, 2, &longts, NULL);
    EXPECT(n == 2 && two[0].revents == (POLLIN | POLLOUT) && two[1].revents == POLLIN,
           "ppoll on a socket and a pipe: n=%d revents %#x %#x", n, two[0].revents, two[1].revents);
    fd_set r2, w2;
    FD_ZERO(&r2);
    FD_ZERO(&w2);
    FD_SET(s, &r2);
    FD_SET(p[0], &r2);
    FD_SET(s, &w2);
    int maxfd = (s > p[0] ? s : p[0]) + 1;
    STEP("pselect readiness");
    n = pselect(maxfd, &r2, &w2, NULL, &longts, NULL);
    EXPECT(n == 3 && FD_ISSET(s, &r2) && FD_ISSET(p[0], &r2) && FD_ISSET(s, &w2),
           "pselect: socket readable and writable, pipe readable (n=%d)", n);
    char buf[8];
    recv_n(s, buf, 4);
    close(p[0]);
    close(p[1]);
    close(s);
}

/* Two threads send on one socket at once (1-byte sends, each thread its own byte sequence)
 * while a third receives the echo: every byte arrives, each thread's bytes in order. */
struct sharer {
    int fd, hi, n, err;
};
static void *sharer_main(void *arg)
{
    struct sharer *sh = arg;
    for (int i = 0; i < sh->n; i++) {
        unsigned char b = (unsigned char)(sh->hi | (i % 100));
        if (send(sh->fd, &b, 1, MSG_NOSIGNAL) != 1) {
            sh->err = errno;
            return NULL;
        }
    }
    return NULL;
}
struct reader {
    int fd, want, got, bad[2], seq[2];
};
static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    unsigned char buf[4096];
    while (rd->got < rd->want) {
        ssize_t r = recv(rd->fd, buf, sizeof buf, 0);
        if (r <= 0)
            return NULL;
        for (ssize_t i = 0; i < r; i++) {
            int who = buf[i] >> 7, v = buf[i] & 0x7f;
            if (v != rd->seq[who] % 100)
                rd->bad[who]++;
            rd->seq[who]++;
        }
        rd->got += (int)r;
    }
    return NULL;
}

static void check_threads_share_socket(void)
{
    const int n = 5000;
    int s = peer_cmd(NULL, "ECHO");
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct reader rd = { .fd = s, .want = 2 * n };
    struct sharer a = { .fd = s, .hi = 0, .n = n }, b = { .fd = s, .hi = 0x80, .n = n };
    pthread_t tr, ta, tb;
    STEP("two threads sending on one socket, a third receiving");
    pthread_create(&tr, NULL, reader_main, &rd);
    pthread_create(&ta, NULL, sharer_main, &a);
    pthread_create(&tb, NULL, sharer_main, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    EXPECT(a.err == 0 && b.err == 0, "two threads each made %d one-byte sends on the same socket (%s, %s)", n, ename(a.err),
           ename(b.err));
    pthread_join(tr, NULL);
    EXPECT(rd.got == 2 * n && rd.seq[0] == n && rd.seq[1] == n && rd.bad[0] == 0 && rd.bad[1] == 0,
           "a third thread received all %d bytes (%d), %d/%d from each sender, in each sender's order (out of order: %d, %d)",
           2 * n, rd.got, rd.seq[0], rd.seq[1], rd.bad[0], rd.bad[1]);
    close(s);
}

/* ---------- descriptors ---------- */

static int cloexec(int fd)
{
    int f = fcntl(fd, F_GETFD);
    return f < 0 ? -1 : !!(f & FD_CLOEXEC);
}

/* dup, dup3(O_CLOEXEC), F_DUPFD_CLOEXEC, F_DUPFD: one socket, five descriptors; file status
 * flags shared, descriptor flags not; the connection closes only with the last one. */
static void check_dup_family_last_close(void)
{
    char *tag = new_tag();
    int s = peer_cmd(tag, "ECHO");
    int a = dup(s);
    int b = dup3(s, 200, O_CLOEXEC);
    int c = fcntl(s, F_DUPFD_CLOEXEC, 300);
    int d = fcntl(s, F_DUPFD, 400);
    EXPECT(a >= 0 && b == 200 && c >= 300 && d >= 400, "dup=%d dup3=%d F_DUPFD_CLOEXEC=%d F_DUPFD=%d (%s)", a, b, c, d,
           ename(errno));
    EXPECT(cloexec(s) == 0 && cloexec(a) == 0 && cloexec(b) == 1 && cloexec(c) == 1 && cloexec(d) == 0,
           "FD_CLOEXEC per descriptor: s=%d dup=%d dup3=%d F_DUPFD_CLOEXEC=%d F_DUPFD=%d (want 0 0 1 1 0)", cloexec(s),
           cloexec(a), cloexec(b), cloexec(c), cloexec(d));
    EXPECT(port_of(a) == port_of(s) && port_of(d) == port_of(s), "getsockname is the same through every copy");
    /* send through one, receive through another */
    char buf[16];
    STEP("echo across duplicates");
    send_all(a, "one", 3);
    ssize_t r = recv_n(c, buf, 3);
    EXPECT(r == 3 && memcmp(buf, "one", 3) == 0, "sent via dup, received via F_DUPFD_CLOEXEC copy");
    send_all(b, "two", 3);
    r = recv_n(d, buf, 3);
    EXPECT(r == 3 && memcmp(buf, "two", 3) == 0, "sent via dup3 copy, received via F_DUPFD copy");
    fcntl(a, F_SETFL, fcntl(a, F_GETFL) | O_NONBLOCK);
    EXPECT(fcntl(d, F_GETFL) & O_NONBLOCK, "O_NONBLOCK set through one copy shows through another (shared file)");
    r = recv(d, buf, sizeof buf, 0);
    EXPECT(r == -1 && errno == EAGAIN, "so recv on the other copy is non-blocking: r=%zd %s", r, r < 0 ? ename(errno) : "");
    fcntl(a, F_SETFL, fcntl(a, F_GETFL) & ~O_NONBLOCK);
    int fds[4] = { s, a, b, c };
    const char *names[4] = { "the original", "the dup", "the dup3 copy", "the F_DUPFD_CLOEXEC copy" };
    for (int i = 0; i < 4; i++) {
        close(fds[i]);
        const char *q = peer_query(tag, 150);
        EXPECT(strcmp(q, "OPEN") == 0, "after closing %s the peer sees no EOF (%s)", names[i], q);
    }
    expect_echo(d, "last", "last", "the last copy still works");
    close(d);
    const char *q = peer_query(tag, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "closing the last copy closes the connection: the peer sees EOF (%s)", q);
}

static void check_dup2_over_socket(void)
{
    char *ta = new_tag(), *tb = new_tag();
    int A = peer_cmd(ta, "ECHO");
    int B = peer_cmd(tb, "UPPER");
    int x = dup2(A, 100);
    EXPECT(x == 100, "dup2(sock, 100) = %d (%s)", x, ename(errno));
    expect_echo(100, "abc", "abc", "echo through fd 100");
    EXPECT(dup2(A, A) == A, "dup2(fd, fd) returns fd and changes nothing");
    x = dup2(B, A);
    EXPECT(x == A, "dup2(B, A) replaces A (%d, %s)", x, ename(errno));
    expect_echo(A, "abc", "ABC", "fd A now reaches B's connection");
    const char *q = peer_query(ta, 150);
    EXPECT(strcmp(q, "OPEN") == 0, "A's old connection is still open through fd 100 (peer: %s)", q);
    close(100);
    q = peer_query(ta, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "closing fd 100, its last descriptor, closes A's old connection (peer: %s)", q);

    int p[2];
    if (pipe(p))
        FATAL("pipe: %s", ename(errno));
    x = dup2(p[0], B);
    EXPECT(x == B, "dup2(pipe, B) puts a pipe on B's number (%d %s)", x, ename(errno));
    char buf[8];
    ssize_t r = recv(B, buf, sizeof buf, MSG_DONTWAIT);
    EXPECT(r == -1 && errno == ENOTSOCK, "recv on that number now: r=%zd %s (want ENOTSOCK)", r, r < 0 ? ename(errno) : "");
    expect_echo(A, "def", "DEF", "B's connection still works through fd A");
    q = peer_query(tb, 150);
    EXPECT(strcmp(q, "OPEN") == 0, "B's connection is open (peer: %s)", q);
    close(A);
    q = peer_query(tb, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "closing A, its last descriptor, closes B's connection (peer: %s)", q);

    int C = peer_cmd(NULL, "ECHO");
    x = dup2(C, p[1]);
    EXPECT(x == p[1], "dup2(socket, pipe's write end) (%d %s)", x, ename(errno));
    close(C);
    expect_echo(p[1], "ghi", "ghi", "the socket works on the former pipe number");
    close(p[1]);
    close(p[0]);
    close(B);
}

static void check_sock_nonblock_cloexec(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    EXPECT((fcntl(s, F_GETFL) & O_NONBLOCK) && cloexec(s) == 1, "socket(SOCK_NONBLOCK|SOCK_CLOEXEC): O_NONBLOCK %s, FD_CLOEXEC %d",
           fcntl(s, F_GETFL) & O_NONBLOCK ? "set" : "clear", cloexec(s));
    struct sockaddr_in a = lo4(P_TCP4);
    int rc = connect(s, (struct sockaddr *)&a, sizeof a);
    EXPECT(rc == 0 || errno == EINPROGRESS, "non-blocking connect: rc=%d %s", rc, rc ? ename(errno) : "");
    STEP("waiting for the connection");
    EXPECT(is_ready(s, POLLOUT, 5000) & POLLOUT, "connected (POLLOUT)");
    const char *cmd = "- DELAY 800 hi\n";
    send_all(s, cmd, strlen(cmd));
    char buf[8];
    ssize_t r = recv(s, buf, sizeof buf, 0);
    EXPECT(r == -1 && errno == EAGAIN, "recv with no data: r=%zd %s (want EAGAIN)", r, r < 0 ? ename(errno) : "");
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
    EXPECT(!(fcntl(s, F_GETFL) & O_NONBLOCK), "F_SETFL cleared O_NONBLOCK");
    STEP("blocking recv after clearing O_NONBLOCK");
    double t0 = now_ms();
    r = recv(s, buf, sizeof buf, 0);
    EXPECT(r == 2 && memcmp(buf, "hi", 2) == 0 && now_ms() - t0 > 100, "now recv blocks until data: r=%zd after %.0f ms", r,
           now_ms() - t0);
    int on = 1;
    EXPECT(ioctl(s, FIONBIO, &on) == 0 && (fcntl(s, F_GETFL) & O_NONBLOCK), "ioctl(FIONBIO, 1) sets O_NONBLOCK (%s)",
           ename(errno));
    r = recv(s, buf, sizeof buf, 0);
    EXPECT(r == -1 && errno == EAGAIN, "and recv is non-blocking again: r=%zd %s", r, r < 0 ? ename(errno) : "");
    EXPECT(fcntl(s, F_SETFD, 0) == 0 && cloexec(s) == 0, "F_SETFD 0 clears FD_CLOEXEC");
    close(s);
    int u = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in ub = lo4(0);
    bind(u, (struct sockaddr *)&ub, sizeof ub);
    r = recvfrom(u, buf, sizeof buf, 0, NULL, NULL);
    EXPECT(r == -1 && errno == EAGAIN, "UDP socket(SOCK_NONBLOCK): recvfrom with nothing queued: r=%zd %s", r,
           r < 0 ? ename(errno) : "");
    close(u);
}

/* ---------- processes ---------- */

static void check_fork_shared_connection(void)
{
    char *tag = new_tag();
    int s = peer_cmd(tag, "ECHO");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char buf[16];
        if (send_all(s, "child", 5) < 0 || recv_n(s, buf, 5) != 5 || memcmp(buf, "child", 5) != 0)
            _exit(1);
        _exit(0);
    }
    int st = wait_child(pid, "waiting for the forked child");
    EXPECT(st == 0, "a forked child uses the inherited connection (echo) and exits: status %d", st);
    expect_echo(s, "parent", "parent", "the parent's connection still works after the child exited");
    const char *q = peer_query(tag, 150);
    EXPECT(strcmp(q, "OPEN") == 0, "the child's exit did not close the connection (peer: %s)", q);
    pid = fork();
    if (pid == 0) {
        close(s);
        _exit(0);
    }
    st = wait_child(pid, "waiting for the child that closes its copy");
    q = peer_query(tag, 150);
    EXPECT(st == 0 && strcmp(q, "OPEN") == 0, "a child closing its copy does not close the parent's (peer: %s)", q);
    expect_echo(s, "again", "again", "the parent's connection still works");
    close(s);
    q = peer_query(tag, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "the parent's close, the last one, closes it (peer: %s)", q);
}

/* Forks a child that reports on res (its write end) and stays until hold (its read
 * end) reaches end of file; each side keeps only its own ends. */
static pid_t fork_reporting(int res[2], int hold[2])
{
    if (pipe(res) < 0 || pipe(hold) < 0)
        FATAL("pipe: %s", ename(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        FATAL("fork: %s", ename(errno));
    close(pid == 0 ? res[0] : res[1]);
    close(pid == 0 ? hold[1] : hold[0]);
    return pid;
}

/* The byte a reporting process wrote on res (0 if none within 8 s). */
static char read_report(int fd, const char *what)
{
    char ok = 0;
    STEP(what);
    if (!is_ready(fd, POLLIN, 8000) || read(fd, &ok, 1) != 1)
        return 0;
    return ok;
}

/* A process that has never forked makes a connection and forks; then it is killed.
 * The connection lives on in its child (the only copy left), and the child's close
 * closes it while the child lives on: under canal, the fork armed a kernel-counted
 * watch for a socket that had none until then (the killed parent never dropped its
 * reference). */
static void check_fork_then_killed(void)
{
    char *tag = new_tag();
    int res[2], hold[2];
    pid_t x = fork_reporting(res, hold);
    if (x == 0) {
        /* X: its first socket, in a process that has not forked since. */
        int s = peer_cmd(tag, "ECHO");
        char buf[16];
        if (send_all(s, "x", 1) < 0 || recv_n(s, buf, 1) != 1)
            _exit(1);
        pid_t me = getpid();
        pid_t y = fork();
        if (y < 0)
            _exit(2);
        if (y == 0) {
            /* Y: wait for X's death, use the inherited connection, close it, and
             * stay until the parent has asked the peer. */
            for (int i = 0; i < 500 && getppid() == me; i++)
                usleep(10000);
            usleep(200000);
            char ok = (getppid() != me && send_all(s, "grandchild", 10) == 0 && recv_n(s, buf, 10) == 10
                       && memcmp(buf, "grandchild", 10) == 0) ? 'y' : 'n';
            close(s);
            if (write(res[1], &ok, 1) != 1)
                _exit(3);
            while (read(hold[0], buf, 1) < 0 && errno == EINTR)
                ;
            _exit(0);
        }
        raise(SIGKILL);
        _exit(4);
    }
    int st = wait_child(x, "waiting for the forking child to be killed");
    EXPECT(st == 128 + SIGKILL, "the child that made the connection, forked and killed itself: status %d", st);
    const char *q = peer_query(tag, 100);
    EXPECT(strcmp(q, "OPEN") == 0, "its connection outlives it in the grandchild (peer: %s)", q);
    char ok = read_report(res[0], "reading the grandchild's result");
    EXPECT(ok == 'y', "the grandchild echoed through the inherited connection after its parent died (%c)",
           ok ? ok : '-');
    q = peer_query(tag, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "the grandchild's close, of the last copy, closes it while it lives (peer: %s)", q);
    close(hold[1]);
    close(res[0]);
}

static void child_argv(char **argv, char *port)
{
    snprintf(port, 16, "%d", P_TCP4);
    argv[0] = self_exe;
    argv[1] = "child-connect";
    argv[2] = port;
    argv[3] = NULL;
}

static void check_vfork_exec(void)
{
    char *tag = new_tag();
    int s = peer_cmd(tag, "ECHO");
    char port[16];
    char *argv[4];
    child_argv(argv, port);
    fflush(stdout);
    pid_t pid = vfork();
    if (pid == 0) {
        execve(self_exe, argv, environ);
        _exit(127);
    }
    EXPECT(pid > 0, "vfork: %s", pid < 0 ? ename(errno) : "ok");
    int st = wait_child(pid, "waiting for the vfork+exec child");
    EXPECT(st == 0, "a vfork+exec child connecting its own socket to the peer succeeded: status %d", st);
    expect_echo(s, "after-vfork", "after-vfork", "the parent's socket works after the child ran");
    const char *q = peer_query(tag, 150);
    EXPECT(strcmp(q, "OPEN") == 0, "the child (which inherited the socket across exec) did not close it (peer: %s)", q);
    close(s);
}

static void check_posix_spawn(void)
{
    char *tag = new_tag();
    int s = peer_cmd(tag, "ECHO");
    char port[16];
    char *argv[4];
    child_argv(argv, port);
    fflush(stdout);
    pid_t pids[2];
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = posix_spawn(&pids[i], self_exe, NULL, NULL, argv, environ);
    EXPECT(rc == 0, "posix_spawn twice: %s", ename(rc));
    if (rc == 0) {
        int st0 = wait_child(pids[0], "waiting for posix_spawn child 1");
        int st1 = wait_child(pids[1], "waiting for posix_spawn child 2");
        EXPECT(st0 == 0 && st1 == 0, "two posix_spawn children using their own sockets at once: status %d, %d", st0, st1);
    }
    expect_echo(s, "after-spawn", "after-spawn", "the parent's socket works after the children ran");
    const char *q = peer_query(tag, 150);
    EXPECT(strcmp(q, "OPEN") == 0, "the children did not close the parent's socket (peer: %s)", q);
    close(s);
}

static void check_exec_inherits_socket(void)
{
    char *t1 = new_tag(), *t2 = new_tag();
    int s = peer_cmd(t1, "ECHO");
    int c = peer_cmd_flags(SOCK_CLOEXEC, t2, "ECHO");
    char a1[16], a2[16];
    snprintf(a1, sizeof a1, "%d", s);
    snprintf(a2, sizeof a2, "%d", c);
    char *argv[] = { self_exe, "child-inherited", a1, a2, NULL };
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execve(self_exe, argv, environ);
        _exit(127);
    }
    int st = wait_child(pid, "waiting for the exec'd child using the inherited socket");
    EXPECT(st == 0, "an exec'd program uses the connected socket it inherited (and not the CLOEXEC one): status %d", st);
    expect_echo(s, "parent-after-exec", "parent-after-exec", "the parent's copy still works");
    const char *q = peer_query(t2, 150);
    EXPECT(strcmp(q, "OPEN") == 0, "the CLOEXEC socket, closed in the child by exec, is still open in the parent (peer: %s)", q);
    expect_echo(c, "cloexec-one", "cloexec-one", "and works");
    close(s);
    close(c);
    q = peer_query(t1, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "closing the parent's copy after the child exited closes it (peer: %s)", q);
}

static int child_connect(int port)
{
    int s = tcp_connect4(port, 0);
    if (s < 0) {
        printf("child %d: connect: %s\n", (int)getpid(), ename(errno));
        return 1;
    }
    char msg[64], buf[64];
    int n = snprintf(msg, sizeof msg, "- ECHO\nchild %d", (int)getpid());
    int body = n - 7;
    if (send_all(s, msg, (size_t)n) < 0 || recv_n(s, buf, (size_t)body) != body || memcmp(buf, msg + 7, (size_t)body) != 0) {
        printf("child %d: echo failed: %s\n", (int)getpid(), ename(errno));
        return 1;
    }
    close(s);
    return 0;
}

static int child_inherited(int fd, int clofd)
{
    if (fcntl(clofd, F_GETFD) != -1 || errno != EBADF) {
        printf("child: the SOCK_CLOEXEC socket %d is still open after exec\n", clofd);
        return 1;
    }
    int type = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_STREAM) {
        printf("child: inherited fd %d: SO_TYPE failed (%s) or is %d\n", fd, ename(errno), type);
        return 1;
    }
    char buf[32];
    if (send_all(fd, "from-exec-child", 15) < 0 || recv_n(fd, buf, 15) != 15 || memcmp(buf, "from-exec-child", 15) != 0) {
        printf("child: echo over the inherited socket failed: %s\n", ename(errno));
        return 1;
    }
    return 0;
}

/* child-exec-wait: child_inherited's checks, the result on RES, then stay until HOLD
 * reaches end of file. */
static int child_exec_wait(int fd, int clofd, int resfd, int holdfd)
{
    char ok = child_inherited(fd, clofd) == 0 ? 'y' : 'n';
    if (write(resfd, &ok, 1) != 1)
        return 1;
    char b;
    while (read(holdfd, &b, 1) < 0 && errno == EINTR)
        ;
    return 0;
}

/* A process that has never forked execs: its close-on-exec connection closes with the
 * old image while the new one runs, and the new image uses the other one. Under canal
 * the exec armed a kernel-counted watch for sockets that had none until then. */
static void check_exec_closes_cloexec(void)
{
    char *t1 = new_tag(), *t2 = new_tag();
    int res[2], hold[2];
    pid_t x = fork_reporting(res, hold);
    if (x == 0) {
        int s = peer_cmd(t1, "ECHO");
        int c = peer_cmd_flags(SOCK_CLOEXEC, t2, "ECHO");
        char a[4][16];
        snprintf(a[0], 16, "%d", s);
        snprintf(a[1], 16, "%d", c);
        snprintf(a[2], 16, "%d", res[1]);
        snprintf(a[3], 16, "%d", hold[0]);
        char *argv[] = { self_exe, "child-exec-wait", a[0], a[1], a[2], a[3], NULL };
        execve(self_exe, argv, environ);
        _exit(127);
    }
    char ok = read_report(res[0], "reading the exec'd image's result");
    EXPECT(ok == 'y', "the exec'd image uses the socket it inherited, and not the CLOEXEC one (%c)", ok ? ok : '-');
    const char *q = peer_query(t2, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "the CLOEXEC connection closed with the old image, the new one running (peer: %s)", q);
    q = peer_query(t1, 100);
    EXPECT(strcmp(q, "OPEN") == 0, "the inherited one is open (peer: %s)", q);
    close(hold[1]);
    int st = wait_child(x, "waiting for the exec'd image");
    EXPECT(st == 0, "the exec'd image exits: status %d", st);
    q = peer_query(t1, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "and its exit closes the inherited connection (peer: %s)", q);
    close(res[0]);
}

/* ---------- data calls ---------- */

static void check_sendfile(void)
{
    const size_t total = (3 << 20) + 123;
    char path[] = "/tmp/canal-compat-sendfile-XXXXXX";
    int f = mkstemp(path);
    if (f < 0)
        FATAL("mkstemp: %s", ename(errno));
    unlink(path);
    unsigned char *data = malloc(total);
    for (size_t i = 0; i < total; i++)
        data[i] = pat(i * 3 + 1);
    if (write(f, data, total) != (ssize_t)total)
        FATAL("write temp file: %s", ename(errno));
    uint64_t want = fnv1a(FNV_INIT, data, total);
    int s = peer_cmd(NULL, "HASH %zu", total);
    off_t off = 0;
    size_t half = total / 2;
    STEP("sendfile with an offset");
    while ((size_t)off < half) {
        ssize_t w = sendfile(s, f, &off, half - (size_t)off);
        if (w <= 0) {
            report(0, "sendfile(offset %lld): r=%zd %s", (long long)off, w, w < 0 ? ename(errno) : "");
            break;
        }
    }
    EXPECT((size_t)off == half, "sendfile with an offset pointer sent the first %zu bytes (offset now %lld)", half,
           (long long)off);
    EXPECT(lseek(f, 0, SEEK_CUR) == (off_t)total, "and left the file position alone (%lld)", (long long)lseek(f, 0, SEEK_CUR));
    lseek(f, (off_t)half, SEEK_SET);
    STEP("sendfile from the file position");
    size_t sent = half;
    while (sent < total) {
        ssize_t w = sendfile(s, f, NULL, total - sent);
        if (w <= 0) {
            report(0, "sendfile(NULL offset) at %zu: r=%zd %s", sent, w, w < 0 ? ename(errno) : "");
            break;
        }
        sent += (size_t)w;
    }
    EXPECT(sent == total && lseek(f, 0, SEEK_CUR) == (off_t)total,
           "sendfile without an offset sent the rest and advanced the file position");
    char line[128];
    STEP("reading the peer's hash");
    recv_line(s, line, sizeof line);
    char expect[128];
    snprintf(expect, sizeof expect, "HASH %zu %016llx", total, (unsigned long long)want);
    EXPECT(strcmp(line, expect) == 0, "the peer received exactly the file: '%s' (want '%s')", line, expect);
    free(data);
    close(f);
    close(s);
}

static void check_msg_flags(void)
{
    int s = peer_cmd(NULL, "DELAY 800 peek-me");
    char buf[64];
    ssize_t r = recv(s, buf, sizeof buf, MSG_DONTWAIT);
    EXPECT(r == -1 && errno == EAGAIN, "MSG_DONTWAIT on a blocking socket with no data: r=%zd %s (want EAGAIN)", r,
           r < 0 ? ename(errno) : "");
    EXPECT(!(fcntl(s, F_GETFL) & O_NONBLOCK), "and the socket stays blocking");
    STEP("blocking recv(MSG_PEEK)");
    r = recv(s, buf, 4, MSG_PEEK);
    EXPECT(r == 4 && memcmp(buf, "peek", 4) == 0, "MSG_PEEK blocks until data and returns it: r=%zd", r);
    wait_bytes(s, 7, 2000);
    r = recv(s, buf, sizeof buf, MSG_PEEK);
    EXPECT(r == 7 && memcmp(buf, "peek-me", 7) == 0, "peeking again returns the same bytes: r=%zd", r);
    r = recv(s, buf, sizeof buf, 0);
    EXPECT(r == 7 && memcmp(buf, "peek-me", 7) == 0, "a normal recv then consumes them: r=%zd", r);
    r = recv(s, buf, sizeof buf, MSG_DONTWAIT | MSG_PEEK);
    EXPECT(r == -1 && errno == EAGAIN, "nothing left: r=%zd %s", r, r < 0 ? ename(errno) : "");
    close(s);

    const size_t n = 100000;
    s = peer_cmd(NULL, "DRIBBLE %zu 7000 15", n);
    char *big = malloc(n);
    STEP("recv(MSG_WAITALL) of dribbled data");
    r = recv(s, big, n, MSG_WAITALL);
    size_t bad = 0;
    for (ssize_t i = 0; i < r; i++)
        bad += (unsigned char)big[i] != pat((uint64_t)i);
    EXPECT(r == (ssize_t)n && bad == 0, "MSG_WAITALL returns all %zu bytes sent in 7000-byte pieces 15 ms apart in one call: r=%zd %s, %zu wrong",
           n, r, r < 0 ? ename(errno) : "", bad);
    free(big);
    close(s);
}

/* SIOCOUTQNSD from linux/sockios.h (SIOCOUTQ is TIOCOUTQ's number). */
#define EDGE_SIOCOUTQNSD 0x894B

static void check_outq(void)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = lo4(0);
    int v = -1;
    int r = -1;
    if (bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 1) == 0)
        r = ioctl(l, TIOCOUTQ, &v);
    EXPECT(r == -1 && errno == EINVAL, "SIOCOUTQ on a listener: r=%d %s (want EINVAL)", r, r < 0 ? ename(errno) : "");
    close(l);

    /* The peer reads nothing for 1.5 s, then reads to the end. */
    int s = peer_cmd(NULL, "DELAY 1500 x");
    double t0 = now_ms();
    double paused_until = t0 + 1500;
    /* Natively loopback takes the command line within send(); canal's ring and
     * canald take it a moment later, as a real network would. */
    while ((r = ioctl(s, TIOCOUTQ, &v)) == 0 && v > 0 && now_ms() - t0 < 1000)
        usleep(1000);
    EXPECT(r == 0 && v == 0, "the command line taken: SIOCOUTQ r=%d value %d", r, v);
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    /* Send until every buffer on the way is full: sends have failed with EAGAIN for
     * 200 ms. Under canal the first EAGAIN comes from the socket's ring, and canald may
     * still be moving it into the host socket, all of it in flight (nothing "not
     * sent") at that instant; natively the first EAGAIN is already that state. */
    static char chunk[65536];
    size_t total = 0;
    double blocked_since = 0;
    while (total < (64u << 20) && now_ms() < paused_until - 300) {
        ssize_t n = send(s, chunk, sizeof chunk, 0);
        if (n > 0) {
            total += (size_t)n;
            blocked_since = 0;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            break;
        if (blocked_since == 0)
            blocked_since = now_ms();
        else if (now_ms() - blocked_since >= 200)
            break;
        usleep(2000);
    }
    int nsd = -1;
    r = ioctl(s, TIOCOUTQ, &v);
    int r2 = ioctl(s, EDGE_SIOCOUTQNSD, &nsd);
    EXPECT(r == 0 && v > 0 && (size_t)v <= total,
           "the peer not reading: SIOCOUTQ counts the bytes not taken (r=%d, %d of %zu sent)", r, v, total);
    EXPECT(r2 == 0 && nsd > 0 && nsd <= v, "and SIOCOUTQNSD those not sent yet (r=%d, %d; SIOCOUTQ %d)", r2, nsd, v);
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
    t0 = now_ms();
    do {
        usleep(10000);
        r = ioctl(s, TIOCOUTQ, &v);
    } while (r == 0 && v > 0 && now_ms() - t0 < 10000);
    EXPECT(r == 0 && v == 0, "once the peer has read everything SIOCOUTQ is 0 (r=%d, %d after %.0f ms)", r, v, now_ms() - t0);
    close(s);
}

/* SIOCATMARK: canal carries no urgent data, so a TCP socket is never at the mark (0,
 * as the kernel answers without urgent data, listeners included); UDP has no such
 * ioctl (ENOTTY). */
static void check_atmark(void)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = lo4(0);
    int v = -1, r = -1;
    if (bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 1) == 0)
        r = ioctl(l, SIOCATMARK, &v);
    EXPECT(r == 0 && v == 0, "SIOCATMARK on a listener: r=%d %s value %d (want 0)", r, r < 0 ? ename(errno) : "", v);
    close(l);
    int s = peer_cmd(NULL, "ECHO");
    v = -1;
    r = ioctl(s, SIOCATMARK, &v);
    EXPECT(r == 0 && v == 0, "SIOCATMARK on a connection: r=%d %s value %d (want 0)", r, r < 0 ? ename(errno) : "", v);
    close(s);
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    r = ioctl(u, SIOCATMARK, &v);
    EXPECT(r == -1 && errno == ENOTTY, "SIOCATMARK on UDP: r=%d %s (want ENOTTY)", r, r < 0 ? ename(errno) : "");
    close(u);
}

static void check_udp_msg_trunc(void)
{
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in peer = lo4(P_UDP4);
    char out[1000];
    for (int i = 0; i < 1000; i++)
        out[i] = (char)pat((uint64_t)i);
    sendto(u, out, sizeof out, 0, (struct sockaddr *)&peer, sizeof peer);
    char buf[2000];
    STEP("recv(MSG_PEEK|MSG_TRUNC) on UDP");
    ssize_t r = recv(u, buf, 10, MSG_PEEK | MSG_TRUNC);
    EXPECT(r == 1000 && memcmp(buf, out, 10) == 0, "MSG_PEEK|MSG_TRUNC with a 10-byte buffer returns the real size: %zd (want 1000)", r);
    r = recv(u, buf, sizeof buf, 0);
    EXPECT(r == 1000 && memcmp(buf, out, 1000) == 0, "the peeked datagram is then read whole: %zd", r);
    sendto(u, out, sizeof out, 0, (struct sockaddr *)&peer, sizeof peer);
    STEP("recv(MSG_TRUNC) on UDP");
    r = recv(u, buf, 10, MSG_TRUNC);
    EXPECT(r == 1000, "MSG_TRUNC with a 10-byte buffer: returns %zd (want 1000), datagram consumed", r);
    sendto(u, out, 300, 0, (struct sockaddr *)&peer, sizeof peer);
    struct iovec iov = { buf, 10 };
    struct sockaddr_in from;
    struct msghdr mh = { .msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &iov, .msg_iovlen = 1 };
    STEP("recvmsg of a datagram larger than the buffer");
    r = recvmsg(u, &mh, 0);
    EXPECT(r == 10 && (mh.msg_flags & MSG_TRUNC) && from.sin_port == htons((uint16_t)P_UDP4),
           "recvmsg into 10 bytes: %zd, msg_flags has MSG_TRUNC: %s, from %s", r, mh.msg_flags & MSG_TRUNC ? "yes" : "no",
           addr_str((struct sockaddr *)&from));
    r = recv(u, buf, sizeof buf, MSG_DONTWAIT);
    EXPECT(r == -1 && errno == EAGAIN, "the rest of a truncated datagram is discarded: r=%zd %s", r, r < 0 ? ename(errno) : "");
    close(u);
}

/* ---------- options ---------- */

static int geti(int fd, int level, int opt)
{
    int v = -12345;
    socklen_t len = sizeof v;
    if (getsockopt(fd, level, opt, &v, &len) < 0)
        return -1000 - errno;
    return v;
}

static void check_sockopts(void)
{
    int s = peer_cmd(NULL, "ECHO");
    int one = 1, zero = 0;
    EXPECT(geti(s, SOL_SOCKET, SO_TYPE) == SOCK_STREAM && geti(s, SOL_SOCKET, SO_DOMAIN) == AF_INET &&
               geti(s, SOL_SOCKET, SO_PROTOCOL) == IPPROTO_TCP && geti(s, SOL_SOCKET, SO_ACCEPTCONN) == 0,
           "SO_TYPE %d SO_DOMAIN %d SO_PROTOCOL %d SO_ACCEPTCONN %d", geti(s, SOL_SOCKET, SO_TYPE),
           geti(s, SOL_SOCKET, SO_DOMAIN), geti(s, SOL_SOCKET, SO_PROTOCOL), geti(s, SOL_SOCKET, SO_ACCEPTCONN));
    EXPECT(geti(s, IPPROTO_TCP, TCP_NODELAY) == 0, "TCP_NODELAY starts 0 (%d)", geti(s, IPPROTO_TCP, TCP_NODELAY));
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    EXPECT(geti(s, IPPROTO_TCP, TCP_NODELAY) == 1, "TCP_NODELAY set to 1 reads back 1 (%d)", geti(s, IPPROTO_TCP, TCP_NODELAY));
    setsockopt(s, IPPROTO_TCP, TCP_CORK, &one, sizeof one);
    EXPECT(geti(s, IPPROTO_TCP, TCP_CORK) == 1, "TCP_CORK reads back 1 (%d)", geti(s, IPPROTO_TCP, TCP_CORK));
    send_all(s, "cork", 4);
    setsockopt(s, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero);
    EXPECT(geti(s, IPPROTO_TCP, TCP_CORK) == 0, "TCP_CORK cleared (%d)", geti(s, IPPROTO_TCP, TCP_CORK));
    char buf[8];
    STEP("data sent while corked arrives after uncorking");
    EXPECT(recv_n(s, buf, 4) == 4 && memcmp(buf, "cork", 4) == 0, "data sent while corked is delivered after uncorking");
    EXPECT(geti(s, SOL_SOCKET, SO_KEEPALIVE) == 0, "SO_KEEPALIVE starts 0");
    setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int idle = 42;
    setsockopt(s, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    EXPECT(geti(s, SOL_SOCKET, SO_KEEPALIVE) == 1 && geti(s, IPPROTO_TCP, TCP_KEEPIDLE) == 42,
           "SO_KEEPALIVE 1 and TCP_KEEPIDLE 42 read back (%d, %d)", geti(s, SOL_SOCKET, SO_KEEPALIVE),
           geti(s, IPPROTO_TCP, TCP_KEEPIDLE));
    struct linger lg = { 1, 5 }, lg2 = { 0, 0 };
    socklen_t len = sizeof lg2;
    setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    getsockopt(s, SOL_SOCKET, SO_LINGER, &lg2, &len);
    EXPECT(lg2.l_onoff == 1 && lg2.l_linger == 5 && len == sizeof lg2, "SO_LINGER {1, 5} reads back {%d, %d}", lg2.l_onoff,
           lg2.l_linger);
    int sz = 65536;
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    EXPECT(geti(s, SOL_SOCKET, SO_RCVBUF) == 2 * sz && geti(s, SOL_SOCKET, SO_SNDBUF) == 2 * sz,
           "SO_RCVBUF/SO_SNDBUF set to %d read back doubled, as Linux does: %d / %d", sz, geti(s, SOL_SOCKET, SO_RCVBUF),
           geti(s, SOL_SOCKET, SO_SNDBUF));
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    EXPECT(geti(s, SOL_SOCKET, SO_REUSEADDR) == 1, "SO_REUSEADDR reads back 1");
    EXPECT(geti(s, SOL_SOCKET, SO_ERROR) == 0, "SO_ERROR is 0 on a healthy connection (%d)", geti(s, SOL_SOCKET, SO_ERROR));
    struct tcp_info ti;
    memset(&ti, 0, sizeof ti);
    len = sizeof ti;
    int rc = getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &len);
    EXPECT(rc == 0 && len > 0 && ti.tcpi_state == 1, "TCP_INFO: rc=%d len=%u tcpi_state=%u (want 1, ESTABLISHED) %s", rc, len,
           ti.tcpi_state, rc ? ename(errno) : "");
    int v = 0;
    len = sizeof v;
    rc = getsockopt(s, SOL_SOCKET, 0x7777, &v, &len);
    EXPECT(rc == -1 && errno == ENOPROTOOPT, "an unknown option: rc=%d %s (want ENOPROTOOPT)", rc, rc ? ename(errno) : "");
    rc = setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, 1);
    EXPECT(rc == -1 && errno == EINVAL, "an option value that is too short: rc=%d %s (want EINVAL)", rc, rc ? ename(errno) : "");
    expect_echo(s, "after-options", "after-options", "the connection works after all that");
    close(s);
}

/* ---------- addresses ---------- */

static void check_ipv6_client(void)
{
    int s = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = lo6(P_TCP6);
    STEP("connect to [::1]");
    int rc = connect(s, (struct sockaddr *)&a, sizeof a);
    EXPECT(rc == 0, "connect to [::1]:%d: %s", P_TCP6, rc ? ename(errno) : "ok");
    if (rc)
        return;
    struct sockaddr_in6 me, him;
    socklen_t l1 = sizeof me, l2 = sizeof him;
    getsockname(s, (struct sockaddr *)&me, &l1);
    getpeername(s, (struct sockaddr *)&him, &l2);
    EXPECT(me.sin6_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&me.sin6_addr) && l1 == sizeof me,
           "getsockname: %s", addr_str((struct sockaddr *)&me));
    EXPECT(him.sin6_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&him.sin6_addr) && ntohs(him.sin6_port) == P_TCP6,
           "getpeername: %s", addr_str((struct sockaddr *)&him));
    send_all(s, "- ECHO\n", 7);
    expect_echo(s, "over-ipv6", "over-ipv6", "TCP echo over IPv6");
    close(s);

    int u = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 ua = lo6(P_UDP6);
    sendto(u, "udp6", 4, 0, (struct sockaddr *)&ua, sizeof ua);
    char buf[16];
    struct sockaddr_in6 from;
    socklen_t fl = sizeof from;
    STEP("UDP echo over IPv6");
    ssize_t r = recvfrom(u, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
    EXPECT(r == 4 && memcmp(buf, "udp6", 4) == 0 && from.sin6_family == AF_INET6 && ntohs(from.sin6_port) == P_UDP6 &&
               IN6_IS_ADDR_LOOPBACK(&from.sin6_addr),
           "UDP echo over IPv6: r=%zd from %s", r, addr_str((struct sockaddr *)&from));
    close(u);
}

static void check_udp_connected(void)
{
    /* bound to an explicit port: connect(AF_UNSPEC) releases a port the kernel chose */
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    int probe = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in sb = lo4(0);
    bind(probe, (struct sockaddr *)&sb, sizeof sb);
    sb = lo4(port_of(probe));
    close(probe);
    EXPECT(bind(s, (struct sockaddr *)&sb, sizeof sb) == 0, "bind UDP to 127.0.0.1:%d (%s)", ntohs(sb.sin_port), ename(errno));
    struct sockaddr_in peer = lo4(P_UDP4);
    EXPECT(connect(s, (struct sockaddr *)&peer, sizeof peer) == 0, "connect() a UDP socket (%s)", ename(errno));
    struct sockaddr_in him, me;
    socklen_t l = sizeof him;
    getpeername(s, (struct sockaddr *)&him, &l);
    EXPECT(him.sin_port == htons((uint16_t)P_UDP4), "getpeername: %s", addr_str((struct sockaddr *)&him));
    l = sizeof me;
    getsockname(s, (struct sockaddr *)&me, &l);
    EXPECT(me.sin_port == htons((uint16_t)port_of(s)) && me.sin_port != 0, "getsockname: %s", addr_str((struct sockaddr *)&me));
    char buf[64];
    STEP("connected UDP send/recv");
    ssize_t w = send(s, "dgram", 5, 0);
    ssize_t r = recv(s, buf, sizeof buf, 0);
    EXPECT(w == 5 && r == 5 && memcmp(buf, "dgram", 5) == 0, "send/recv on a connected UDP socket: %zd/%zd", w, r);
    w = write(s, "write", 5);
    r = read(s, buf, sizeof buf);
    EXPECT(w == 5 && r == 5 && memcmp(buf, "write", 5) == 0, "write/read on it: %zd/%zd", w, r);

    int t = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in tb = lo4(0);
    bind(t, (struct sockaddr *)&tb, sizeof tb);
    sendto(t, "intruder", 8, 0, (struct sockaddr *)&me, sizeof me);
    send(s, "after", 5, 0);
    STEP("filtering of other sources");
    r = recv(s, buf, sizeof buf, 0);
    EXPECT(r == 5 && memcmp(buf, "after", 5) == 0, "a datagram from another address is not delivered to it (got %zd bytes '%.*s')",
           r, (int)(r > 0 ? r : 0), buf);
    struct sockaddr_in unspec = { .sin_family = AF_UNSPEC };
    EXPECT(connect(s, (struct sockaddr *)&unspec, sizeof unspec) == 0, "connect(AF_UNSPEC) dissolves the association (%s)",
           ename(errno));
    sendto(t, "second", 6, 0, (struct sockaddr *)&me, sizeof me);
    struct sockaddr_in from;
    socklen_t fl = sizeof from;
    STEP("recvfrom after disconnect");
    r = recvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
    EXPECT(r == 6 && memcmp(buf, "second", 6) == 0 && from.sin_port == htons((uint16_t)port_of(t)),
           "then datagrams from anyone arrive: r=%zd from %s", r, addr_str((struct sockaddr *)&from));
    close(t);
    close(s);

    int tmp = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in b = lo4(0);
    bind(tmp, (struct sockaddr *)&b, sizeof b);
    int closed = port_of(tmp);
    close(tmp);
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in c = lo4(closed);
    connect(u, (struct sockaddr *)&c, sizeof c);
    send(u, "x", 1, 0);
    STEP("recv on a connected UDP socket whose peer port is closed");
    r = recv(u, buf, sizeof buf, 0);
    EXPECT(r == -1 && errno == ECONNREFUSED, "ICMP port unreachable shows as ECONNREFUSED: r=%zd %s", r,
           r < 0 ? ename(errno) : "");
    close(u);
}

/* ---------- this program as the server ---------- */

/* Ask the peer to open n connections to us; returns the control connection. */
static int ask_peer_to_connect(int fam, int port, int n)
{
    return peer_cmd(NULL, "CONNECT %d %d %d", fam, port, n);
}

/* Accept one connection on l (waiting up to 5 s), read its "hello i" line and answer
 * "<who> <line>"; returns 0 on success. */
static int serve_one(int l, const char *who)
{
    STEP("waiting for a connection from the peer");
    if (!(is_ready(l, POLLIN, 5000) & POLLIN)) {
        report(0, "no connection from the peer within 5 s");
        return -1;
    }
    int c = accept(l, NULL, NULL);
    if (c < 0) {
        report(0, "accept: %s", ename(errno));
        return -1;
    }
    fcntl(c, F_SETFL, fcntl(c, F_GETFL) & ~O_NONBLOCK);
    char line[128], out[256];
    recv_line(c, line, sizeof line);
    int k = snprintf(out, sizeof out, "%s %s\n", who, line);
    send_all(c, out, (size_t)k);
    close(c);
    return 0;
}

/* Read the peer's "R i ..." lines up to "DONE" into res[i]; returns how many. */
static int read_results(int ctl, char res[][160], int max)
{
    int n = 0;
    char line[200];
    STEP("reading the peer's CONNECT results");
    for (;;) {
        if (recv_line(ctl, line, sizeof line) == 0 || strcmp(line, "DONE") == 0)
            break;
        int i, off = 0;
        if (sscanf(line, "R %d %n", &i, &off) >= 1 && i >= 0 && i < max && off > 0) {
            snprintf(res[i], 160, "%s", line + off);
            n++;
        }
    }
    close(ctl);
    return n;
}

static int listener4(int type_flags, int port, int reuseport)
{
    int l = socket(AF_INET, SOCK_STREAM | type_flags, 0);
    int one = 1;
    if (reuseport)
        setsockopt(l, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    struct sockaddr_in a = lo4(port);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 64) < 0) {
        int e = errno;
        close(l);
        errno = e;
        return -1;
    }
    return l;
}

static void check_fork_shared_listener(void)
{
    int l = listener4(0, 0, 0);
    if (l < 0)
        FATAL("listen: %s", ename(errno));
    int port = port_of(l);
    pid_t kids[2];
    fflush(stdout);
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            alarm(10);
            int c = accept(l, NULL, NULL);
            if (c < 0)
                _exit(2);
            char line[128], out[200];
            recv_line(c, line, sizeof line);
            int k = snprintf(out, sizeof out, "pid %d %s\n", (int)getpid(), line);
            send_all(c, out, (size_t)k);
            close(c);
            _exit(0);
        }
    }
    int ctl = ask_peer_to_connect(4, port, 2);
    int st0 = wait_child(kids[0], "waiting for worker 1 to accept and serve");
    int st1 = wait_child(kids[1], "waiting for worker 2 to accept and serve");
    EXPECT(st0 == 0 && st1 == 0, "two forked workers each accepted one connection on the shared listener: status %d, %d", st0,
           st1);
    char res[2][160] = { "", "" };
    int n = read_results(ctl, res, 2);
    int pa = 0, pb = 0, ha = -1, hb = -1;
    sscanf(res[0], "pid %d hello %d", &pa, &ha);
    sscanf(res[1], "pid %d hello %d", &pb, &hb);
    EXPECT(n == 2 && ha == 0 && hb == 1 && pa != pb && (pa == kids[0] || pa == kids[1]) && (pb == kids[0] || pb == kids[1]),
           "the peer was answered once by each worker: '%s', '%s' (workers %d, %d)", res[0], res[1], (int)kids[0],
           (int)kids[1]);
    ctl = ask_peer_to_connect(4, port, 1);
    serve_one(l, "parent");
    n = read_results(ctl, res, 1);
    EXPECT(n == 1 && strcmp(res[0], "parent hello 0") == 0,
           "after the workers exited, the parent's copy of the listener still accepts: '%s'", res[0]);
    close(l);
}

static void check_accept4_flags(void)
{
    int l = listener4(SOCK_NONBLOCK, 0, 0);
    if (l < 0)
        FATAL("listen: %s", ename(errno));
    int port = port_of(l);
    EXPECT(geti(l, SOL_SOCKET, SO_ACCEPTCONN) == 1, "SO_ACCEPTCONN is 1 on a listener");
    int c = accept(l, NULL, NULL);
    EXPECT(c == -1 && errno == EAGAIN, "accept on a non-blocking listener with nothing pending: %d %s (want EAGAIN)", c,
           c < 0 ? ename(errno) : "");
    int ep = epoll_create1(0);
    ep_add(ep, l, EPOLLIN, 1);
    int n;
    epoll_tags(ep, 0, &n);
    EXPECT(n == 0, "epoll: the idle listener is not ready (%d)", n);
    int ctl = ask_peer_to_connect(4, port, 1);
    STEP("epoll on the listener");
    uint32_t ev = epoll_for(ep, 1, 5000);
    EXPECT(ev == EPOLLIN, "epoll reports the pending connection: %s", evstr(ev));
    struct sockaddr_in from;
    socklen_t fl = sizeof from;
    c = accept4(l, (struct sockaddr *)&from, &fl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    EXPECT(c >= 0 && (fcntl(c, F_GETFL) & O_NONBLOCK) && cloexec(c) == 1,
           "accept4(SOCK_NONBLOCK|SOCK_CLOEXEC): fd %d, O_NONBLOCK %s, FD_CLOEXEC %d (%s)", c,
           c >= 0 && (fcntl(c, F_GETFL) & O_NONBLOCK) ? "set" : "clear", c >= 0 ? cloexec(c) : -1, c < 0 ? ename(errno) : "ok");
    EXPECT(fl == sizeof from && from.sin_family == AF_INET && from.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && from.sin_port,
           "accept4 reports the peer's address: %s", addr_str((struct sockaddr *)&from));
    EXPECT(port_of(c) == port, "the accepted socket's local port is the listener's (%d)", port_of(c));
    if (c >= 0) {
        fcntl(c, F_SETFL, 0);
        char line[64], out[100];
        recv_line(c, line, sizeof line);
        int k = snprintf(out, sizeof out, "acc %s\n", line);
        send_all(c, out, (size_t)k);
        close(c);
    }
    char res[1][160] = { "" };
    read_results(ctl, res, 1);
    EXPECT(strcmp(res[0], "acc hello 0") == 0, "the peer got the answer: '%s'", res[0]);

    /* nginx's workers wait on their shared listener with EPOLLEXCLUSIVE */
    int ep2 = epoll_create1(0);
    EXPECT(ep_add(ep2, l, EPOLLIN | EPOLLEXCLUSIVE, 3) == 0, "EPOLL_CTL_ADD with EPOLLEXCLUSIVE on the listener (%s)",
           ename(errno));
    struct epoll_event mx = { .events = EPOLLIN, .data.u64 = 3 };
    int rc = epoll_ctl(ep2, EPOLL_CTL_MOD, l, &mx);
    EXPECT(rc == -1 && errno == EINVAL, "EPOLL_CTL_MOD of an EPOLLEXCLUSIVE registration: rc=%d %s (want EINVAL)", rc,
           rc ? ename(errno) : "");
    ctl = ask_peer_to_connect(4, port, 1);
    STEP("waiting for the second connection");
    ev = epoll_for(ep2, 3, 5000);
    EXPECT(ev == EPOLLIN, "the EPOLLEXCLUSIVE set reports the pending connection: %s", evstr(ev));
    epoll_for(ep, 1, 5000);
    c = accept(l, NULL, NULL);
    EXPECT(c >= 0 && !(fcntl(c, F_GETFL) & O_NONBLOCK) && cloexec(c) == 0,
           "plain accept on a non-blocking listener gives a blocking socket without FD_CLOEXEC (fd %d, %s)", c,
           c < 0 ? ename(errno) : "ok");
    if (c >= 0) {
        char line[64], out[100];
        recv_line(c, line, sizeof line);
        int k = snprintf(out, sizeof out, "plain %s\n", line);
        send_all(c, out, (size_t)k);
        close(c);
    }
    read_results(ctl, res, 1);
    EXPECT(strcmp(res[0], "plain hello 0") == 0, "the peer got the answer: '%s'", res[0]);
    close(ep2);
    close(ep);
    close(l);
}

static void check_dualstack_listener(void)
{
    int l = socket(AF_INET6, SOCK_STREAM, 0);
    int zero = 0, one = 1;
    setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    EXPECT(geti(l, IPPROTO_IPV6, IPV6_V6ONLY) == 0, "IPV6_V6ONLY reads back 0");
    /* ::ffff:127.0.0.1 rather than :: so nothing listens beyond loopback */
    struct sockaddr_in6 a = { .sin6_family = AF_INET6 };
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &a.sin6_addr);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 16) < 0)
        FATAL("bind/listen on [::ffff:127.0.0.1]:0: %s", ename(errno));
    struct sockaddr_in6 me;
    socklen_t ml = sizeof me;
    getsockname(l, (struct sockaddr *)&me, &ml);
    EXPECT(me.sin6_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&me.sin6_addr), "getsockname of the listener: %s",
           addr_str((struct sockaddr *)&me));
    int port = ntohs(me.sin6_port);
    int ctl = ask_peer_to_connect(4, port, 1);
    STEP("accepting an IPv4 connection on the IPv6 socket");
    EXPECT(is_ready(l, POLLIN, 5000) & POLLIN, "the IPv4 connection arrives at the IPv6 listener");
    struct sockaddr_storage from;
    socklen_t fl = sizeof from;
    int c = accept(l, (struct sockaddr *)&from, &fl);
    struct sockaddr_in6 *f6 = (struct sockaddr_in6 *)&from;
    EXPECT(c >= 0 && from.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&f6->sin6_addr) &&
               f6->sin6_addr.s6_addr[12] == 127 && f6->sin6_addr.s6_addr[15] == 1,
           "accept gives a v4-mapped IPv6 peer address: %s (%s)", addr_str((struct sockaddr *)&from), c < 0 ? ename(errno) : "ok");
    if (c >= 0) {
        char line[64], out[100];
        recv_line(c, line, sizeof line);
        int k = snprintf(out, sizeof out, "dual %s\n", line);
        send_all(c, out, (size_t)k);
        close(c);
    }
    char res[1][160] = { "" };
    read_results(ctl, res, 1);
    EXPECT(strcmp(res[0], "dual hello 0") == 0, "the IPv4 client got the answer: '%s'", res[0]);
    close(l);

    l = socket(AF_INET6, SOCK_STREAM, 0);
    setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    struct sockaddr_in6 b = lo6(0);
    if (bind(l, (struct sockaddr *)&b, sizeof b) < 0 || listen(l, 16) < 0)
        FATAL("bind/listen on [::1]:0: %s", ename(errno));
    ctl = ask_peer_to_connect(6, port_of(l), 1);
    STEP("accepting on [::1]");
    EXPECT(is_ready(l, POLLIN, 5000) & POLLIN, "a connection arrives at the [::1] listener");
    fl = sizeof from;
    c = accept(l, (struct sockaddr *)&from, &fl);
    EXPECT(c >= 0 && from.ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&f6->sin6_addr),
           "accept on [::1] gives peer %s (%s)", addr_str((struct sockaddr *)&from), c < 0 ? ename(errno) : "ok");
    if (c >= 0) {
        char line[64], out[100];
        recv_line(c, line, sizeof line);
        int k = snprintf(out, sizeof out, "six %s\n", line);
        send_all(c, out, (size_t)k);
        close(c);
    }
    read_results(ctl, res, 1);
    EXPECT(strcmp(res[0], "six hello 0") == 0, "the IPv6 client got the answer: '%s'", res[0]);
    close(l);
}

static void check_reuseaddr_reuseport(void)
{
    int a = listener4(SOCK_NONBLOCK, 0, 1);
    if (a < 0)
        FATAL("listen with SO_REUSEPORT: %s", ename(errno));
    int port = port_of(a);
    int b = listener4(SOCK_NONBLOCK, port, 1);
    EXPECT(b >= 0, "a second SO_REUSEPORT listener on the same port (%d): %s", port, b < 0 ? ename(errno) : "ok");
    EXPECT(geti(a, SOL_SOCKET, SO_REUSEPORT) == 1, "SO_REUSEPORT reads back 1");
    int c = listener4(0, port, 0);
    EXPECT(c == -1 && errno == EADDRINUSE, "a third listener without SO_REUSEPORT: %s (want EADDRINUSE)",
           c < 0 ? ename(errno) : "bound");
    if (c >= 0)
        close(c);
    if (b < 0)
        return;
    const int N = 16;
    int ctl = ask_peer_to_connect(4, port, N);
    int served[2] = { 0, 0 };
    double end = now_ms() + 5000;
    STEP("serving 16 connections on two SO_REUSEPORT listeners");
    while (served[0] + served[1] < N && now_ms() < end) {
        struct pollfd pf[2] = { { .fd = a, .events = POLLIN }, { .fd = b, .events = POLLIN } };
        poll(pf, 2, 100);
        for (int i = 0; i < 2; i++)
            if (pf[i].revents & POLLIN)
                if (serve_one(i ? b : a, i ? "b" : "a") == 0)
                    served[i]++;
    }
    char res[16][160];
    memset(res, 0, sizeof res);
    int n = read_results(ctl, res, N);
    int good = 0;
    for (int i = 0; i < N; i++) {
        char want[32];
        snprintf(want, sizeof want, " hello %d", i);
        good += strlen(res[i]) > 2 && strcmp(res[i] + 1, want) == 0;
    }
    EXPECT(served[0] + served[1] == N && n == N && good == N,
           "all %d connections answered (%d by the first listener, %d by the second; %d answers right)", N, served[0],
           served[1], good);
    EXPECT(served[0] > 0 && served[1] > 0, "the kernel spread them over both listeners (%d, %d)", served[0], served[1]);
    close(a);
    close(b);

    /* SO_REUSEADDR: rebinding a port whose connection this side closed first (TIME_WAIT) */
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in la = lo4(0);
    bind(l, (struct sockaddr *)&la, sizeof la);
    listen(l, 16);
    port = port_of(l);
    ctl = ask_peer_to_connect(4, port, 1);
    serve_one(l, "first");
    read_results(ctl, res, 1);
    close(l);
    l = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    la = lo4(port);
    int rc = bind(l, (struct sockaddr *)&la, sizeof la);
    EXPECT(rc == 0 && listen(l, 16) == 0, "with SO_REUSEADDR the port is bound and listened on again at once: %s",
           rc ? ename(errno) : "ok");
    ctl = ask_peer_to_connect(4, port, 1);
    serve_one(l, "again");
    read_results(ctl, res, 1);
    EXPECT(strcmp(res[0], "again hello 0") == 0, "and the new listener serves: '%s'", res[0]);
    close(l);
}

/* With EDGE_WITNESS set (the harness sets it when this program runs under canal): after the
 * check, open one more socket of the kind the check is about, print "WITNESS kind port" and
 * wait for stdin to close, so the harness can see in `canal stat` that this process's
 * sockets really are canal's (a check passing over the kernel would prove nothing). */
/* ---------- descriptor numbers (issue 14) ---------- */

static int lowest_free(void)
{
    for (int i = 0;; i++)
        if (fcntl(i, F_GETFD) < 0 && errno == EBADF)
            return i;
}

/* Programs get the lowest free descriptor, exactly as natively: the library's own
 * descriptors (control socket, eventfds, memfds, the copy a sleeping call holds) never
 * take one of the numbers the program would get next. */
static void check_lowest_free_numbering(void)
{
    int want = lowest_free();
    int s1 = peer_cmd(NULL, "ECHO"); /* the first socket: canal attaches inside it */
    EXPECT(s1 == want, "the first socket gets the lowest free number %d (got %d)", want, s1);
    want = lowest_free();
    int f = open("/dev/null", O_RDONLY);
    EXPECT(f == want, "open() after it gets %d (got %d)", want, f);
    want = lowest_free();
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    EXPECT(u == want, "a UDP socket gets %d (got %d)", want, u);
    close(s1);
    int s2 = peer_cmd(NULL, "ECHO");
    EXPECT(s2 == s1, "after close(%d), the next socket reuses it (got %d)", s1, s2);

    /* A thread sleeping in recv: the pinned copy must not take a low number. */
    struct blocked_recv b = { .fd = s2 };
    pthread_t t;
    pthread_create(&t, NULL, blocked_recv_main, &b);
    sleep_ms(300);
    want = lowest_free();
    int p[2] = { -1, -1 };
    if (pipe(p))
        FATAL("pipe: %s", ename(errno));
    EXPECT(p[0] == want, "while another thread sleeps in recv, pipe() gets %d (got %d, %d)", want, p[0], p[1]);
    send_all(s2, "x", 1);
    pthread_join(t, NULL);
    EXPECT(b.r == 1, "the sleeping recv got the echo (r=%zd %s)", b.r, ename(b.err));

    /* accept(): a connection to our own listener. */
    int l = listener4(0, 0, 0);
    if (l < 0)
        FATAL("listener: %s", ename(errno));
    int c = tcp_connect4(port_of(l), 0);
    want = lowest_free();
    int a = accept(l, NULL, NULL);
    EXPECT(c >= 0 && a == want, "accept() gets %d (got %d; connect %d %s)", want, a, c, ename(errno));
    expect_echo(s2, "numbers", "numbers", "the echo connection still works");
    int fds[] = { a, c, l, p[0], p[1], u, f, s2 };
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        close(fds[i]);
}

/* dup2 onto every descriptor number 0..64 while canal sockets are open: each time the
 * socket works through the new number, and nothing of the library is in the way. */
static void check_dup2_low_numbers(void)
{
    int A = peer_cmd(NULL, "ECHO");
    int B = peer_cmd(NULL, "UPPER");
    /* Keep stdin/stdout/stderr to put back: dup2 onto 0-2 replaces them for a moment. */
    int saved[3];
    for (int i = 0; i < 3; i++)
        saved[i] = fcntl(i, F_DUPFD_CLOEXEC, 70);
    int bad = 0, first_bad = -1, first_err = 0;
    char why[200] = "";
    for (int n = 0; n <= 64; n++) {
        if (n == A || n == B || (n >= 70 && n < 73))
            continue;
        int was_open = fcntl(n, F_GETFD) >= 0;
        int keep = was_open ? fcntl(n, F_DUPFD_CLOEXEC, 80) : -1;
        int x = dup2(A, n);
        int e = errno;
        char buf[8] = "";
        ssize_t r = -1;
        if (x == n && send_all(n, "ping", 4) == 0)
            r = recv_n(n, buf, 4);
        if (x != n || r != 4 || memcmp(buf, "ping", 4) != 0) {
            if (!bad++) {
                first_bad = n;
                first_err = x != n ? e : errno;
                snprintf(why, sizeof why, "dup2=%d r=%zd", x, r);
            }
        }
        if (keep >= 0) {
            dup2(keep, n);
            close(keep);
        } else {
            close(n);
        }
    }
    for (int i = 0; i < 3; i++) {
        dup2(saved[i], i);
        close(saved[i]);
    }
    EXPECT(bad == 0, "dup2(socket, n) then an echo through n, for n = 0..64: %d failed (first n=%d: %s, %s)", bad,
           first_bad, why, ename(first_err));
    expect_echo(A, "after", "after", "the socket still works through its own number");
    expect_echo(B, "upper", "UPPER", "the other socket is untouched");
    close(A);
    close(B);
}

/* The numbers the library holds (those this process did not open itself): a dup2 or
 * dup3 onto each of them succeeds and puts the program's file there, and canal keeps
 * working (its descriptor moved). Natively there are none. */
static int list_fds(int *out, int cap)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        FATAL("opendir /proc/self/fd: %s", ename(errno));
    struct dirent *de;
    while ((de = readdir(d)) && n < cap)
        if (de->d_name[0] != '.' && atoi(de->d_name) != dirfd(d))
            out[n++] = atoi(de->d_name);
    closedir(d);
    return n;
}

static void check_dup2_onto_library_fds(void)
{
    int before[256], nb = list_fds(before, 256);
    int A = peer_cmd(NULL, "ECHO");
    int devnull = open("/dev/null", O_RDWR);
    int now[256], nn = list_fds(now, 256);
    int theirs[64], n = 0;
    for (int i = 0; i < nn && n < 64; i++) {
        int known = now[i] == A || now[i] == devnull;
        for (int j = 0; j < nb; j++)
            known |= now[i] == before[j];
        if (!known)
            theirs[n++] = now[i];
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int x = i % 2 ? dup3(devnull, theirs[i], O_CLOEXEC) : dup2(devnull, theirs[i]);
        struct stat st1, st2;
        int same = x == theirs[i] && fstat(x, &st1) == 0 && fstat(devnull, &st2) == 0 && st1.st_ino == st2.st_ino;
        EXPECT(same, "%s onto the library's descriptor %d puts the program's /dev/null there (got %d, %s)",
               i % 2 ? "dup3" : "dup2", theirs[i], x, ename(errno));
        bad += !same;
        /* Echo after every move: the library's descriptor must have gone elsewhere. */
        expect_echo(A, "moved", "moved", "canal still works after its descriptor moved");
    }
    if (getenv("EDGE_WITNESS")) /* set by the harness only under canal */
        EXPECT(n > 0, "under canal the library holds descriptors of its own (found %d)", n);
    report(1, "%d descriptor(s) of the library were in the way (%s)", n, n ? "moved" : "none: native");
    for (int i = 0; i < n; i++)
        close(theirs[i]);
    int B = peer_cmd(NULL, "UPPER");
    expect_echo(B, "new", "NEW", "a new socket after the moves works");
    close(B);
    close(A);
    close(devnull);
}

/* close_range(3, ~0U, 0) and closefrom(3) close the program's descriptors (canal sockets
 * included) but not the library's: new sockets afterwards get 3, 4, ... and work. */
static void check_close_range_then_sockets(void)
{
    for (int round = 0; round < 2; round++) {
        int A = peer_cmd(NULL, "ECHO");
        int f = open("/dev/null", O_RDONLY);
        int B = peer_cmd(NULL, "ECHO");
        (void)A;
        (void)f;
        (void)B;
        if (round == 0)
            EXPECT(close_range(3, ~0U, 0) == 0, "close_range(3, ~0U, 0) = 0 (%s)", ename(errno));
        else
            closefrom(3);
        int want = lowest_free();
        EXPECT(want == 3, "%s closed everything from 3 (lowest free %d)", round ? "closefrom(3)" : "close_range(3, ~0U)",
               want);
        int C = peer_cmd(NULL, "UPPER");
        EXPECT(C == 3, "the next socket is 3 (got %d)", C);
        expect_echo(C, "again", "AGAIN", round ? "a socket after closefrom works" : "a socket after close_range works");
        close(C);
    }
}

/* ---------- descriptor passing and stdio on sockets (issue 14) ---------- */

static int send_fd(int unix_fd, int fd)
{
    char byte = 'F';
    struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf };
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(unix_fd, &m, 0) == 1 ? 0 : -1;
}

static int recv_fd(int unix_fd)
{
    char byte;
    struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf };
    if (recvmsg(unix_fd, &m, 0) != 1)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_type != SCM_RIGHTS)
        return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

/* The receiving end of scm_rights_pass, as a program of its own (run with and without
 * the library): takes a socket from `unix_fd`, echoes `word` through it, says "ok". */
static int child_scm(int unix_fd, const char *word)
{
    int s = recv_fd(unix_fd);
    if (s < 0)
        return 10;
    size_t n = strlen(word);
    char buf[64] = "";
    if (send_all(s, word, n) < 0 || recv_n(s, buf, n) != (ssize_t)n || memcmp(buf, word, n) != 0)
        return 11;
    close(s);
    return write(unix_fd, "ok", 2) == 2 ? 0 : 12;
}

/* A connected socket passed with SCM_RIGHTS to a process under canal (a forked child)
 * and to one without the library (posix_spawn with LD_PRELOAD removed: glibc's own
 * exec, which the library does not see): each takes its turn reading and writing it,
 * the sender in between, and the data arrives in order — one socket for all. */
static void check_scm_rights_pass(void)
{
    char *tag = new_tag();
    int s = peer_cmd(tag, "ECHO");
    expect_echo(s, "p1", "p1", "the sender uses the socket first");
    for (int round = 0; round < 2; round++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
            FATAL("socketpair: %s", ename(errno));
        pid_t pid;
        const char *word = round == 0 ? "canal-child" : "plain-child";
        fflush(stdout);
        if (round == 0) {
            pid = fork();
            if (pid == 0) {
                close(sv[0]);
                _exit(child_scm(sv[1], word));
            }
        } else {
            char fdarg[16];
            snprintf(fdarg, sizeof fdarg, "%d", sv[1]);
            char *argv[] = { self_exe, "child-scm", fdarg, (char *)word, NULL };
            /* The environment without LD_PRELOAD: a process canal does not serve. */
            char *envp[64];
            int k = 0;
            for (char **e = environ; *e && k < 63; e++)
                if (strncmp(*e, "LD_PRELOAD=", 11) != 0)
                    envp[k++] = *e;
            envp[k] = NULL;
            if (posix_spawn(&pid, self_exe, NULL, NULL, argv, envp) != 0)
                pid = -1;
        }
        close(sv[1]);
        EXPECT(pid > 0, "started the %s receiver", word);
        STEP("passing the socket");
        EXPECT(send_fd(sv[0], s) == 0, "sendmsg(SCM_RIGHTS) of the socket to the %s (%s)", word, ename(errno));
        char ok[3] = "";
        STEP("waiting for the receiver's turn to end");
        ssize_t r = recv_n(sv[0], ok, 2);
        int st = wait_child(pid, "waiting for the receiver");
        EXPECT(r == 2 && st == 0, "the %s echoed through the passed socket (status %d)", word, st);
        close(sv[0]);
        expect_echo(s, round ? "p3" : "p2", round ? "p3" : "p2", "the sender's turn again: same connection, in order");
    }
    const char *q = peer_query(tag, 150);
    EXPECT(strcmp(q, "OPEN") == 0, "the receivers' closes left the sender's socket open (peer: %s)", q);
    close(s);
    q = peer_query(tag, 3000);
    EXPECT(strcmp(q, "EOF") == 0, "the last close ends the connection (peer: %s)", q);
}

/* A socket as a child program's stdin and stdout, used through stdio (coreutils' head
 * reads with fread, printf writes with fwrite: glibc calls the kernel directly). */
static void check_stdio_on_inherited_socket(void)
{
    int s = peer_cmd(NULL, "UPPER");
    send_all(s, "line one\nline two\n", 18);
    sleep_ms(100);
    int out[2];
    if (pipe(out))
        FATAL("pipe: %s", ename(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(s, 0);
        dup2(out[1], 1);
        close(s);
        close(out[0]);
        close(out[1]);
        execlp("head", "head", "-n", "1", (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    char buf[64] = "";
    ssize_t r = 0, k;
    while (r < 9 && (k = read(out[0], buf + r, (size_t)(9 - r))) > 0)
        r += k;
    close(out[0]);
    int st = wait_child(pid, "waiting for head");
    EXPECT(st == 0 && r == 9 && memcmp(buf, "LINE ONE\n", 9) == 0,
           "head -n 1 with the socket as stdin printed '%.*s' (status %d; want 'LINE ONE')", (int)(r > 0 ? r - 1 : 0), buf, st);
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        dup2(s, 1);
        close(s);
        execlp("printf", "printf", "via stdio\n", (char *)NULL);
        _exit(127);
    }
    st = wait_child(pid, "waiting for printf");
    EXPECT(st == 0, "printf with the socket as stdout (status %d)", st);
    /* What is left: the peer's "LINE TWO\n" (head read its whole buffer natively? no:
     * head -n 1 on a socket reads what is there; the rest may be consumed), then the
     * upper-cased echo of printf's line. Look for the latter. */
    char all[256] = "";
    size_t got = 0;
    double until = now_ms() + 3000;
    while (!strstr(all, "VIA STDIO\n") && now_ms() < until && got < sizeof all - 1) {
        if (!is_ready(s, POLLIN, 200))
            continue;
        ssize_t k = recv(s, all + got, sizeof all - 1 - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    EXPECT(strstr(all, "VIA STDIO\n") != NULL, "the peer got printf's line through the socket: read back '%s'", all);
    close(s);
}


/* A stdio stream on a connected socket (fdopen): fprintf and fgets use glibc's own
 * system calls, never the write/read the library interposes. */
static void check_fdopen_stream(void)
{
    int s = peer_cmd(NULL, "UPPER");
    FILE *f = fdopen(s, "r+");
    EXPECT(f != NULL, "fdopen(socket, \"r+\") (%s)", ename(errno));
    if (!f)
        return;
    STEP("fprintf/fflush/fgets through the stream");
    fprintf(f, "through stdio\n");
    fflush(f);
    char line[64] = "";
    char *r = fgets(line, sizeof line, f);
    EXPECT(r && strcmp(line, "THROUGH STDIO\n") == 0, "fgets after fprintf on the socket's stream: '%s'", line);
    int again = fileno(f);
    expect_echo(again, "and write", "AND WRITE", "write/recv on the same descriptor after stdio");
    fclose(f);
}

static void witness(const char *kind)
{
    int fd = -1;
    STEP("opening the witness socket");
    if (strcmp(kind, "tcp6") == 0) {
        fd = socket(AF_INET6, SOCK_STREAM, 0);
        struct sockaddr_in6 a = lo6(P_TCP6);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 || send_all(fd, "- WATCH\n", 8) < 0)
            FATAL("witness: TCP over IPv6 to the peer: %s", ename(errno));
    } else if (strcmp(kind, "udp4") == 0) {
        fd = socket(AF_INET, SOCK_DGRAM, 0);
        struct sockaddr_in a = lo4(P_UDP4);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 || send(fd, "w", 1, 0) != 1)
            FATAL("witness: UDP to the peer: %s", ename(errno));
    } else {
        fd = peer_cmd(NULL, "WATCH");
    }
    printf("WITNESS %s %d\n", kind, port_of(fd));
    fflush(stdout);
    STEP("waiting for the harness to look at canal stat (stdin EOF)");
    char c;
    while (read(0, &c, 1) > 0) {
    }
    close(fd);
}

/* ---------- main ---------- */

static const struct {
    const char *name, *role, *witness;
    void (*fn)(void);
} checks[] = {
    { "close_while_recv_blocked", "client", "tcp4", check_close_while_recv_blocked },
    { "shutdown_wakes_blocked_recv", "client", "tcp4", check_shutdown_wakes_blocked_recv },
    { "eintr_recv", "client", "tcp4", check_eintr_recv },
    { "threads_share_socket", "client", "tcp4", check_threads_share_socket },
    { "et_epoll_drain", "client", "tcp4", check_et_epoll_drain },
    { "nonblocking_connect_epoll", "client", "tcp4", check_nonblocking_connect_epoll },
    { "epoll_mixed_level", "client", "tcp4", check_epoll_mixed_level },
    { "epoll_edge_mixed", "client", "tcp4", check_epoll_edge_mixed },
    { "epoll_oneshot", "client", "tcp4", check_epoll_oneshot },
    { "epoll_rdhup", "client", "tcp4", check_epoll_rdhup },
    { "epoll_hup_err", "client", "tcp4", check_epoll_hup_err },
    { "epoll_two_sets", "client", "tcp4", check_epoll_two_sets },
    { "epoll_nested", "client", "tcp4", check_epoll_nested },
    { "epoll_pwait_timeout_eintr", "client", "tcp4", check_epoll_pwait_timeout_eintr },
    { "ppoll_pselect", "client", "tcp4", check_ppoll_pselect },
    { "dup_family_last_close", "client", "tcp4", check_dup_family_last_close },
    { "dup2_over_socket", "client", "tcp4", check_dup2_over_socket },
    { "sock_nonblock_cloexec", "client", "tcp4", check_sock_nonblock_cloexec },
    { "fork_shared_connection", "client", "tcp4", check_fork_shared_connection },
    { "fork_then_killed", "client", "tcp4", check_fork_then_killed },
    { "vfork_exec", "client", "tcp4", check_vfork_exec },
    { "posix_spawn", "client", "tcp4", check_posix_spawn },
    { "exec_inherits_socket", "client", "tcp4", check_exec_inherits_socket },
    { "exec_closes_cloexec", "client", "tcp4", check_exec_closes_cloexec },
    { "sendfile", "client", "tcp4", check_sendfile },
    { "msg_flags", "client", "tcp4", check_msg_flags },
    { "outq", "client", "tcp4", check_outq },
    { "atmark", "client", "tcp4", check_atmark },
    { "udp_msg_trunc", "client", "udp4", check_udp_msg_trunc },
    { "sockopts", "client", "tcp4", check_sockopts },
    { "ipv6_client", "client", "tcp6", check_ipv6_client },
    { "udp_connected", "client", "udp4", check_udp_connected },
    { "fork_shared_listener", "server", "tcp4", check_fork_shared_listener },
    { "accept4_flags", "server", "tcp4", check_accept4_flags },
    { "dualstack_listener", "server", "tcp4", check_dualstack_listener },
    { "reuseaddr_reuseport", "server", "tcp4", check_reuseaddr_reuseport },
    { "lowest_free_numbering", "client", "tcp4", check_lowest_free_numbering },
    { "dup2_low_numbers", "client", "tcp4", check_dup2_low_numbers },
    { "dup2_onto_library_fds", "client", "tcp4", check_dup2_onto_library_fds },
    { "close_range_then_sockets", "client", "tcp4", check_close_range_then_sockets },
    { "scm_rights_pass", "client", "tcp4", check_scm_rights_pass },
    { "stdio_on_inherited_socket", "client", "tcp4", check_stdio_on_inherited_socket },
    { "fdopen_stream", "client", "tcp4", check_fdopen_stream },
};

int main(int argc, char **argv)
{
    ssize_t k = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    self_exe[k > 0 ? k : 0] = 0;
    signal(SIGPIPE, SIG_IGN);
    int nchecks = (int)(sizeof checks / sizeof checks[0]);
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < nchecks; i++)
            printf("%s %s\n", checks[i].name, checks[i].role);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "child-connect") == 0) {
        alarm(10);
        return child_connect(atoi(argv[2]));
    }
    if (argc == 4 && strcmp(argv[1], "child-scm") == 0) {
        alarm(10);
        return child_scm(atoi(argv[2]), argv[3]);
    }
    if (argc == 6 && strcmp(argv[1], "child-exec-wait") == 0) {
        alarm(10);
        return child_exec_wait(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    }
    if (argc == 4 && strcmp(argv[1], "child-inherited") == 0) {
        alarm(10);
        return child_inherited(atoi(argv[2]), atoi(argv[3]));
    }
    if (argc != 6) {
        fprintf(stderr, "usage: %s CHECK TCP4 TCP6 UDP4 UDP6 | --list\n", argv[0]);
        return 2;
    }
    P_TCP4 = atoi(argv[2]);
    P_TCP6 = atoi(argv[3]);
    P_UDP4 = atoi(argv[4]);
    P_UDP6 = atoi(argv[5]);
    if (getenv("EDGE_WATCHDOG"))
        watchdog_s = atoi(getenv("EDGE_WATCHDOG"));
    for (int i = 0; i < nchecks; i++) {
        if (strcmp(argv[1], checks[i].name) != 0)
            continue;
        check_name = checks[i].name;
        signal(SIGALRM, on_watchdog);
        alarm((unsigned)watchdog_s);
        checks[i].fn();
        if (getenv("EDGE_WITNESS"))
            witness(checks[i].witness);
        alarm(0);
        printf("done %s: %d failure(s)\n", check_name, failures);
        return failures ? 1 : 0;
    }
    fprintf(stderr, "unknown check %s\n", argv[1]);
    return 2;
}
