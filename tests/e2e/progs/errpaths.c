/* Socket error paths whose errno values must match the kernel's exactly.
 *
 * usage: errpaths PEER_PORT CLOSED_PORT [pause]
 *   PEER_PORT   a TCP server on 127.0.0.1 (tests/e2e's "peer") that reads one command
 *               line per connection: "CLOSE\n" (close at once), "HOLD\n" (keep open, send
 *               nothing, discard input until EOF), "HALF\n" (send "hello", shutdown(SHUT_WR),
 *               read until EOF and record what came), "ECHO\n" (echo until EOF).
 *   CLOSED_PORT a port on 127.0.0.1 nothing listens on.
 *   pause       print "PAUSE" while one connection to the peer is open (in the EAGAIN
 *               check) and wait for a line on stdin, so a test can look at it with
 *               `canal stat`.
 *
 * Prints "ok NAME" or "FAIL NAME: why" per check; exit status 0 only if all passed.
 * The whole program is bounded by alarm(): a hang ends it with SIGALRM.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static int peer_port, closed_port, pause_wanted;
static volatile sig_atomic_t sigpipes;

static void on_sigpipe(int sig) { (void)sig; sigpipes++; }

static const char *en(int e) {
    static char buf[8][64];
    static int i;
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "%s (%d)", strerrorname_np(e) ? strerrorname_np(e) : "?", e);
    return buf[i];
}

static void msleep(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* Blocking connect to the peer, then send the command line. -1 on failure (reported). */
static int peer_connect(const char *name, const char *cmd) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        report(name, "socket: %s", en(errno));
        return -1;
    }
    struct sockaddr_in a = addr_of(peer_port);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        report(name, "connect to peer: %s", en(errno));
        close(fd);
        return -1;
    }
    size_t len = strlen(cmd);
    if (send(fd, cmd, len, MSG_NOSIGNAL) != (ssize_t)len) {
        report(name, "send command: %s", en(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Wait (bounded) until fd is readable, then expect recv() == 0. */
static int expect_eof(const char *name, int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    int n = poll(&p, 1, 5000);
    if (n != 1) {
        report(name, "peer's close not seen within 5 s (poll=%d, %s)", n, en(errno));
        return -1;
    }
    char c;
    ssize_t r = recv(fd, &c, 1, 0);
    if (r != 0) {
        report(name, "recv after peer close returned %zd (%s), want 0", r, r < 0 ? en(errno) : "data");
        return -1;
    }
    return 0;
}

static void test_connect_refused(void) {
    const char *name = "connect_refused_blocking";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = addr_of(closed_port);
    errno = 0;
    int r = connect(fd, (struct sockaddr *)&a, sizeof a);
    if (r == 0)
        report(name, "connect to closed port %d succeeded", closed_port);
    else if (errno != ECONNREFUSED)
        report(name, "errno %s, want ECONNREFUSED", en(errno));
    else
        report(name, NULL);
    close(fd);
}

/* Send until an error; first error EPIPE or ECONNRESET, then EPIPE; SIGPIPE delivered on
 * every EPIPE without MSG_NOSIGNAL and never with it. */
static void test_epipe(int flags, const char *name) {
    int fd = peer_connect(name, "CLOSE\n");
    if (fd < 0)
        return;
    if (expect_eof(name, fd) != 0) {
        close(fd);
        return;
    }
    char buf[1024];
    memset(buf, 'x', sizeof buf);
    int first = 0, sent_ok = 0;
    sig_atomic_t before = sigpipes;
    for (int i = 0; i < 5000 && !first; i++) {
        before = sigpipes;
        ssize_t r = send(fd, buf, sizeof buf, flags);
        if (r < 0)
            first = errno;
        else {
            sent_ok++;
            msleep(1);
        }
    }
    if (!first) {
        report(name, "5000 sends after the peer closed all succeeded");
        close(fd);
        return;
    }
    if (first != EPIPE && first != ECONNRESET) {
        report(name, "first failed send: %s, want EPIPE or ECONNRESET", en(first));
        close(fd);
        return;
    }
    int want_sig = !(flags & MSG_NOSIGNAL);
    if (first == EPIPE && (sigpipes != before) != want_sig) {
        report(name, "first EPIPE: SIGPIPE %s", want_sig ? "not delivered" : "delivered despite MSG_NOSIGNAL");
        close(fd);
        return;
    }
    for (int i = 0; i < 3; i++) {
        before = sigpipes;
        errno = 0;
        ssize_t r = send(fd, buf, sizeof buf, flags);
        if (r >= 0 || errno != EPIPE) {
            report(name, "send #%d after %s returned %zd, errno %s, want -1 EPIPE", i + 1, en(first), r,
                   en(errno));
            close(fd);
            return;
        }
        if ((sigpipes != before) != want_sig) {
            report(name, "EPIPE: SIGPIPE %s", want_sig ? "not delivered" : "delivered despite MSG_NOSIGNAL");
            close(fd);
            return;
        }
    }
    close(fd);
    printf("# %s: %d sends succeeded, then %s, then EPIPE\n", name, sent_ok, en(first));
    report(name, NULL);
}

static int set_nonblock(int fd) { return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static void test_nonblocking_connect(void) {
    const char *name = "nonblocking_connect";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    set_nonblock(fd);
    struct sockaddr_in a = addr_of(peer_port);
    int r = connect(fd, (struct sockaddr *)&a, sizeof a);
    if (r != 0 && errno != EINPROGRESS) {
        report(name, "connect: %s, want 0 or EINPROGRESS", en(errno));
        close(fd);
        return;
    }
    struct pollfd p = {fd, POLLOUT, 0};
    int n = poll(&p, 1, 5000);
    if (n != 1 || !(p.revents & POLLOUT) || (p.revents & (POLLERR | POLLHUP))) {
        report(name, "poll(POLLOUT) = %d, revents 0x%x, want 1 with POLLOUT only", n, p.revents);
        close(fd);
        return;
    }
    int err = -1;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        report(name, "SO_ERROR = %s (getsockopt errno %s), want 0", en(err), en(errno));
        close(fd);
        return;
    }
    struct sockaddr_in pa;
    socklen_t plen = sizeof pa;
    if (getpeername(fd, (struct sockaddr *)&pa, &plen) != 0 || ntohs(pa.sin_port) != peer_port) {
        report(name, "getpeername after connect: %s", en(errno));
        close(fd);
        return;
    }
    /* The connection works: say HOLD so the peer keeps it open quietly. */
    if (send(fd, "HOLD\n", 5, MSG_NOSIGNAL) != 5) {
        report(name, "send after non-blocking connect: %s", en(errno));
        close(fd);
        return;
    }
    close(fd);
    printf("# %s: connect() returned %s\n", name, r == 0 ? "0" : "EINPROGRESS");
    report(name, NULL);
}

static void test_nonblocking_connect_refused(void) {
    const char *name = "nonblocking_connect_refused";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    set_nonblock(fd);
    struct sockaddr_in a = addr_of(closed_port);
    int r = connect(fd, (struct sockaddr *)&a, sizeof a);
    if (r == 0) {
        report(name, "connect to closed port succeeded");
    } else if (errno == ECONNREFUSED) {
        /* Linux may finish a loopback handshake inside connect(); allowed. */
        printf("# %s: connect() itself returned ECONNREFUSED\n", name);
        report(name, NULL);
    } else if (errno != EINPROGRESS) {
        report(name, "connect: %s, want EINPROGRESS or ECONNREFUSED", en(errno));
    } else {
        struct pollfd p = {fd, POLLOUT, 0};
        int n = poll(&p, 1, 5000);
        int err = -1;
        socklen_t len = sizeof err;
        if (n != 1) {
            report(name, "poll(POLLOUT) = %d within 5 s, want 1", n);
        } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            report(name, "getsockopt(SO_ERROR): %s", en(errno));
        } else if (err != ECONNREFUSED) {
            report(name, "SO_ERROR = %s, want ECONNREFUSED (revents 0x%x)", en(err), p.revents);
        } else if (!(p.revents & POLLERR)) {
            report(name, "revents 0x%x lacks POLLERR", p.revents);
        } else {
            len = sizeof err;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err != 0)
                report(name, "SO_ERROR not cleared by reading it: %s", en(err));
            else
                report(name, NULL);
        }
    }
    close(fd);
}

static void test_nonblocking_recv(void) {
    const char *name = "nonblocking_recv_eagain";
    int fd = peer_connect(name, "HOLD\n");
    if (fd < 0)
        return;
    if (pause_wanted) {
        printf("PAUSE\n");
        fflush(stdout);
        struct pollfd p = {0, POLLIN, 0};
        char line[16];
        if (poll(&p, 1, 20000) != 1 || read(0, line, sizeof line) <= 0) {
            report(name, "no line on stdin within 20 s after PAUSE");
            close(fd);
            return;
        }
    }
    char buf[16];
    errno = 0;
    ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r != -1 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        report(name, "recv(MSG_DONTWAIT) = %zd, %s, want -1 EAGAIN", r, en(errno));
        close(fd);
        return;
    }
    set_nonblock(fd);
    errno = 0;
    r = recv(fd, buf, sizeof buf, 0);
    if (r != -1 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        report(name, "recv on O_NONBLOCK socket = %zd, %s, want -1 EAGAIN", r, en(errno));
        close(fd);
        return;
    }
    close(fd);
    report(name, NULL);
}

static const char HALF_PAYLOAD[] = "ping-after-half-close\n";

static void test_half_close(void) {
    const char *name = "half_close";
    int fd = peer_connect(name, "HALF\n");
    if (fd < 0)
        return;
    char buf[64];
    size_t got = 0;
    while (got < 5) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 5000) != 1) {
            report(name, "no data from peer within 5 s");
            close(fd);
            return;
        }
        ssize_t r = recv(fd, buf + got, sizeof buf - got, 0);
        if (r <= 0) {
            report(name, "recv = %zd (%s) after %zu bytes, want \"hello\"", r, r ? en(errno) : "EOF", got);
            close(fd);
            return;
        }
        got += (size_t)r;
    }
    if (got != 5 || memcmp(buf, "hello", 5) != 0) {
        report(name, "got %zu bytes \"%.*s\", want \"hello\"", got, (int)got, buf);
        close(fd);
        return;
    }
    if (expect_eof(name, fd) != 0) {
        close(fd);
        return;
    }
    /* EOF is sticky. */
    ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r != 0) {
        report(name, "second recv after EOF = %zd (%s), want 0", r, r < 0 ? en(errno) : "data");
        close(fd);
        return;
    }
    /* The other direction still works. */
    size_t len = strlen(HALF_PAYLOAD);
    if (send(fd, HALF_PAYLOAD, len, MSG_NOSIGNAL) != (ssize_t)len) {
        report(name, "send after peer's SHUT_WR: %s", en(errno));
        close(fd);
        return;
    }
    if (shutdown(fd, SHUT_WR) != 0) {
        report(name, "shutdown(SHUT_WR): %s", en(errno));
        close(fd);
        return;
    }
    /* Wait for the peer's close so the peer recorded the payload before we exit. */
    struct pollfd p = {fd, POLLIN, 0};
    poll(&p, 1, 5000);
    close(fd);
    report(name, NULL); /* the test also checks what the peer recorded */
}

static void test_select_mix(void) {
    const char *name = "select_pipe_and_socket";
    int pfd[2];
    if (pipe(pfd) != 0) {
        report(name, "pipe: %s", en(errno));
        return;
    }
    int fd = peer_connect(name, "ECHO\n");
    if (fd < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return;
    }
    int maxfd = (fd > pfd[0] ? fd : pfd[0]) + 1;
    fd_set rd, wr;
    struct timeval tv;
    const char *why = NULL;
    char c;

    /* 1: nothing readable; the socket is writable. */
    FD_ZERO(&rd);
    FD_SET(fd, &rd);
    FD_SET(pfd[0], &rd);
    FD_ZERO(&wr);
    FD_SET(fd, &wr);
    tv.tv_sec = 0;
    tv.tv_usec = 100000;
    int n = select(maxfd, &rd, &wr, NULL, &tv);
    if (n != 1 || FD_ISSET(fd, &rd) || FD_ISSET(pfd[0], &rd) || !FD_ISSET(fd, &wr))
        why = "step 1 (idle): want only the socket writable";

    /* 2: pipe readable only. */
    if (!why) {
        if (write(pfd[1], "p", 1) != 1)
            why = "write to pipe failed";
        FD_ZERO(&rd);
        FD_SET(fd, &rd);
        FD_SET(pfd[0], &rd);
        tv.tv_sec = 5;
        tv.tv_usec = 0;
        n = select(maxfd, &rd, NULL, NULL, &tv);
        if (!why && (n != 1 || !FD_ISSET(pfd[0], &rd) || FD_ISSET(fd, &rd)))
            why = "step 2 (pipe written): want only the pipe readable";
        if (read(pfd[0], &c, 1) != 1)
            why = why ? why : "read from pipe failed";
    }

    /* 3: socket readable only (the peer echoes one byte). */
    if (!why) {
        if (send(fd, "s", 1, MSG_NOSIGNAL) != 1)
            why = "send to echo peer failed";
        FD_ZERO(&rd);
        FD_SET(fd, &rd);
        FD_SET(pfd[0], &rd);
        tv.tv_sec = 5;
        tv.tv_usec = 0;
        n = select(maxfd, &rd, NULL, NULL, &tv);
        if (!why && (n != 1 || !FD_ISSET(fd, &rd) || FD_ISSET(pfd[0], &rd)))
            why = "step 3 (echo arrives): want only the socket readable within 5 s";
        if (!why && (recv(fd, &c, 1, 0) != 1 || c != 's'))
            why = "echoed byte wrong";
    }

    /* 4: both readable. */
    if (!why) {
        if (send(fd, "t", 1, MSG_NOSIGNAL) != 1 || write(pfd[1], "q", 1) != 1)
            why = "step 4 writes failed";
        /* wait (bounded) for the echo first, so both are ready for one select() */
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, 5000);
        FD_ZERO(&rd);
        FD_SET(fd, &rd);
        FD_SET(pfd[0], &rd);
        tv.tv_sec = 5;
        tv.tv_usec = 0;
        n = select(maxfd, &rd, NULL, NULL, &tv);
        if (!why && (n != 2 || !FD_ISSET(fd, &rd) || !FD_ISSET(pfd[0], &rd)))
            why = "step 4 (both written): want the pipe and the socket readable";
    }
    if (why)
        report(name, "%s (select returned %d)", why, n);
    else
        report(name, NULL);
    close(fd);
    close(pfd[0]);
    close(pfd[1]);
}

/* FIONREAD on a listener: EINVAL, as tcp_ioctl answers (not a count of waiting
 * connections). */
static void test_listener_fionread(void) {
    const char *name = "listener_fionread";
    int l = socket(AF_INET, SOCK_STREAM, 0), n = -1;
    struct sockaddr_in a = addr_of(0);
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 4) != 0) {
        report(name, "bind/listen: %s", en(errno));
    } else if (ioctl(l, FIONREAD, &n) == 0) {
        report(name, "FIONREAD succeeded (%d), want %s", n, en(EINVAL));
    } else {
        report(name, errno == EINVAL ? NULL : "FIONREAD: %s, want %s", en(errno), en(EINVAL));
    }
    close(l);
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4 || (argc == 4 && strcmp(argv[3], "pause") != 0)) {
        fprintf(stderr, "usage: %s PEER_PORT CLOSED_PORT [pause]\n", argv[0]);
        return 2;
    }
    pause_wanted = argc == 4;
    peer_port = atoi(argv[1]);
    closed_port = atoi(argv[2]);
    alarm(30);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigpipe;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);

    test_connect_refused();
    test_epipe(0, "epipe_sigpipe");
    test_epipe(MSG_NOSIGNAL, "epipe_msg_nosignal");
    test_nonblocking_connect();
    test_nonblocking_connect_refused();
    test_nonblocking_recv();
    test_half_close();
    test_select_mix();
    test_listener_fionread();
    printf("%d failed\n", failures);
    return failures ? 1 : 0;
}
