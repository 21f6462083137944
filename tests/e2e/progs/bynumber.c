/* Socket calls made by number, through libc's syscall(): what libuv 1.44 does for
 * sendmmsg/recvmmsg (bind9's dig, host and named) and libseccomp for seccomp(2).
 *
 * usage: bynumber [pause]
 *   pause  print "PAUSE PORT" while a connection to this program's own listener on
 *          127.0.0.1:PORT is open and wait for a line on stdin, so a test can see it
 *          in `canal stat` (a program the library failed to intercept cannot pass).
 *
 * Every socket call below goes through syscall(SYS_x, ...), never the libc function,
 * but for some socket() calls (libuv makes its sockets with libc's socket()):
 *   tcp       socket, bind, listen, connect, accept4, getsockname, getpeername, write,
 *             read, sendto, recvfrom, sendmsg, recvmsg, writev, readv, setsockopt,
 *             getsockopt, fcntl, ioctl(FIONREAD), shutdown, close
 *   nonblock  recvfrom on an empty non-blocking socket: -1 and EAGAIN
 *   poll      ppoll (with the kernel's 8-byte signal set) and poll, epoll_ctl and
 *             epoll_pwait, on a socket with and without data
 *   udp       sendmmsg of three datagrams, recvmmsg of them, contents and sources
 *   dup       dup3 of a connected socket, used through the copy, closed by number
 *   seccomp   a filter installed with syscall(SYS_seccomp) that allows poll but not
 *             ppoll, nanosleep but not sched_yield (as sshd's sandbox): a forked child
 *             echoes after 3 ms, so every read sleeps; the program must not be killed
 *
 * Prints "ok NAME" or "FAIL NAME: why" per check; exit status 0 only if all passed.
 * The whole program is bounded by alarm(): a hang ends it with SIGALRM.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"


#define FAIL(name, ...)                  \
    do {                                 \
        report(name, __VA_ARGS__);       \
        return;                          \
    } while (0)

/* A listener on 127.0.0.1 (any port), by number; its port in *port. */
static int listener(int *port) {
    long l = syscall(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = addr_of(0);
    socklen_t n = sizeof a;
    if (l < 0 || syscall(SYS_bind, l, &a, sizeof a) != 0 || syscall(SYS_listen, l, 8) != 0 ||
        syscall(SYS_getsockname, l, &a, &n) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return (int)l;
}

/* A connected pair through `l` (port `port`): *c the client, *s the server. The
 * client is made by libc's socket(), as libuv makes its sockets, and used by number. */
static int connected_pair(int l, int port, int *c, int *s) {
    struct sockaddr_in a = addr_of(port), peer;
    socklen_t n = sizeof peer;
    *c = socket(AF_INET, SOCK_STREAM, 0);
    if (*c < 0 || syscall(SYS_connect, *c, &a, sizeof a) != 0)
        return -1;
    *s = (int)syscall(SYS_accept4, l, &peer, &n, SOCK_CLOEXEC);
    return *s < 0 ? -1 : 0;
}

static int pause_port = -1;

static void check_tcp(int l, int port) {
    int c, s;
    if (connected_pair(l, port, &c, &s) != 0)
        FAIL("tcp", "connect/accept4: %s", strerror(errno));
    struct sockaddr_in mine, theirs;
    socklen_t n1 = sizeof mine, n2 = sizeof theirs;
    if (syscall(SYS_getsockname, c, &mine, &n1) != 0 || syscall(SYS_getpeername, s, &theirs, &n2) != 0)
        FAIL("tcp", "names: %s", strerror(errno));
    if (mine.sin_port != theirs.sin_port)
        FAIL("tcp", "client port %d, server's peer port %d", ntohs(mine.sin_port), ntohs(theirs.sin_port));
    char buf[64] = {0};
    if (syscall(SYS_write, c, "write", 5) != 5 || syscall(SYS_read, s, buf, sizeof buf) != 5 ||
        memcmp(buf, "write", 5) != 0)
        FAIL("tcp", "write/read: %s", strerror(errno));
    if (syscall(SYS_sendto, s, "sendto", 6, 0, NULL, 0) != 6 ||
        syscall(SYS_recvfrom, c, buf, sizeof buf, 0, NULL, NULL) != 6 || memcmp(buf, "sendto", 6) != 0)
        FAIL("tcp", "sendto/recvfrom: %s", strerror(errno));
    struct iovec iov[2] = {{"send", 4}, {"msg", 3}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
    if (syscall(SYS_sendmsg, c, &m, 0) != 7)
        FAIL("tcp", "sendmsg: %s", strerror(errno));
    struct iovec riov = {buf, 7};
    struct msghdr rm = {.msg_iov = &riov, .msg_iovlen = 1};
    if (syscall(SYS_recvmsg, s, &rm, MSG_WAITALL) != 7 || memcmp(buf, "sendmsg", 7) != 0)
        FAIL("tcp", "recvmsg: %s", strerror(errno));
    struct iovec wv[2] = {{"wri", 3}, {"tev", 3}};
    char r1[3], r2[3];
    struct iovec rv[2] = {{r1, 3}, {r2, 3}};
    if (syscall(SYS_writev, s, wv, 2) != 6 || syscall(SYS_readv, c, rv, 2) != 6 ||
        memcmp(r1, "wri", 3) != 0 || memcmp(r2, "tev", 3) != 0)
        FAIL("tcp", "writev/readv: %s", strerror(errno));
    int one = 1, got = 0;
    socklen_t gl = sizeof got;
    if (syscall(SYS_setsockopt, c, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0 ||
        syscall(SYS_getsockopt, c, SOL_SOCKET, SO_KEEPALIVE, &got, &gl) != 0 || got != 1)
        FAIL("tcp", "SO_KEEPALIVE set/get: %s (got %d)", strerror(errno), got);
    int type = 0;
    gl = sizeof type;
    if (syscall(SYS_getsockopt, s, SOL_SOCKET, SO_TYPE, &type, &gl) != 0 || type != SOCK_STREAM)
        FAIL("tcp", "SO_TYPE %d: %s", type, strerror(errno));
    int avail = -1;
    if (syscall(SYS_write, c, "12345", 5) != 5)
        FAIL("tcp", "write: %s", strerror(errno));
    for (int i = 0; i < 1000 && avail != 5; i++) {
        if (syscall(SYS_ioctl, s, FIONREAD, &avail) != 0)
            FAIL("tcp", "FIONREAD: %s", strerror(errno));
        if (avail != 5)
            usleep(1000);
    }
    if (avail != 5)
        FAIL("tcp", "FIONREAD says %d, not 5", avail);
    if (syscall(SYS_read, s, buf, 5) != 5)
        FAIL("tcp", "read: %s", strerror(errno));
    if (pause_port >= 0) {
        printf("PAUSE %d\n", port);
        fflush(stdout);
        char line[8];
        if (!fgets(line, sizeof line, stdin))
            FAIL("tcp", "no line on stdin");
    }
    if (syscall(SYS_shutdown, c, SHUT_WR) != 0 || syscall(SYS_read, s, buf, sizeof buf) != 0)
        FAIL("tcp", "shutdown: the server did not read end-of-file (%s)", strerror(errno));
    if (syscall(SYS_close, s) != 0 || syscall(SYS_close, c) != 0)
        FAIL("tcp", "close: %s", strerror(errno));
    if (syscall(SYS_close, c) != -1 || errno != EBADF)
        FAIL("tcp", "a second close: %s, not EBADF", strerror(errno));
    report("tcp", NULL);
}

static void check_nonblock(int l, int port) {
    int c, s;
    char buf[8];
    if (connected_pair(l, port, &c, &s) != 0)
        FAIL("nonblock", "connect/accept4: %s", strerror(errno));
    long fl = syscall(SYS_fcntl, s, F_GETFL, 0);
    if (fl < 0 || syscall(SYS_fcntl, s, F_SETFL, fl | O_NONBLOCK) != 0)
        FAIL("nonblock", "fcntl: %s", strerror(errno));
    if (!(syscall(SYS_fcntl, s, F_GETFL, 0) & O_NONBLOCK))
        FAIL("nonblock", "O_NONBLOCK not kept");
    errno = 0;
    if (syscall(SYS_recvfrom, s, buf, sizeof buf, 0, NULL, NULL) != -1 || errno != EAGAIN)
        FAIL("nonblock", "recvfrom on an empty socket: %s, not EAGAIN", strerror(errno));
    syscall(SYS_close, c);
    syscall(SYS_close, s);
    report("nonblock", NULL);
}

static void check_poll(int l, int port) {
    int c, s;
    if (connected_pair(l, port, &c, &s) != 0)
        FAIL("poll", "connect/accept4: %s", strerror(errno));
    struct pollfd p = {.fd = s, .events = POLLIN};
    struct timespec zero = {0, 0}, wait = {5, 0};
    sigset_t mask;
    sigemptyset(&mask);
    if (syscall(SYS_ppoll, &p, 1, &zero, &mask, 8) != 0)
        FAIL("poll", "ppoll of an empty socket: not 0 (%s)", strerror(errno));
    if (syscall(SYS_ppoll, &p, 1, &zero, &mask, 4) != -1 || errno != EINVAL)
        FAIL("poll", "ppoll with a 4-byte signal set: %s, not EINVAL", strerror(errno));
    long ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 42}, out[2];
    if (ep < 0 || syscall(SYS_epoll_ctl, ep, EPOLL_CTL_ADD, s, &ev) != 0)
        FAIL("poll", "epoll_ctl: %s", strerror(errno));
    if (syscall(SYS_epoll_pwait, ep, out, 2, 0, NULL, 8) != 0)
        FAIL("poll", "epoll_pwait of an empty socket: not 0 (%s)", strerror(errno));
    if (syscall(SYS_write, c, "x", 1) != 1)
        FAIL("poll", "write: %s", strerror(errno));
    if (syscall(SYS_ppoll, &p, 1, &wait, NULL, 8) != 1 || !(p.revents & POLLIN))
        FAIL("poll", "ppoll after a write: revents %#x (%s)", p.revents, strerror(errno));
    p.revents = 0;
    if (syscall(SYS_poll, &p, 1, 5000) != 1 || !(p.revents & POLLIN))
        FAIL("poll", "poll after a write: revents %#x (%s)", p.revents, strerror(errno));
    if (syscall(SYS_epoll_pwait, ep, out, 2, 5000, &mask, 8) != 1 || out[0].data.u64 != 42)
        FAIL("poll", "epoll_pwait after a write: %s", strerror(errno));
    syscall(SYS_close, ep);
    syscall(SYS_close, c);
    syscall(SYS_close, s);
    report("poll", NULL);
}

static void check_udp(void) {
    int a = socket(AF_INET, SOCK_DGRAM, 0);
    int b = (int)syscall(SYS_socket, AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in any = addr_of(0), aa, ba;
    socklen_t n = sizeof aa;
    if (a < 0 || b < 0 || syscall(SYS_bind, a, &any, sizeof any) != 0 ||
        syscall(SYS_bind, b, &any, sizeof any) != 0 || syscall(SYS_getsockname, a, &aa, &n) != 0)
        FAIL("udp", "socket/bind: %s", strerror(errno));
    n = sizeof ba;
    if (syscall(SYS_getsockname, b, &ba, &n) != 0)
        FAIL("udp", "getsockname: %s", strerror(errno));
    const char *words[3] = {"one", "two!", "three"};
    struct mmsghdr out[3], in[3];
    struct iovec oiov[3], iiov[3];
    char bufs[3][32];
    struct sockaddr_in from[3];
    memset(out, 0, sizeof out);
    memset(in, 0, sizeof in);
    for (int i = 0; i < 3; i++) {
        oiov[i] = (struct iovec){(void *)words[i], strlen(words[i])};
        out[i].msg_hdr = (struct msghdr){.msg_name = &ba, .msg_namelen = sizeof ba, .msg_iov = &oiov[i], .msg_iovlen = 1};
        iiov[i] = (struct iovec){bufs[i], sizeof bufs[i]};
        in[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_namelen = sizeof from[i], .msg_iov = &iiov[i], .msg_iovlen = 1};
    }
    long sent = syscall(SYS_sendmmsg, a, out, 3, 0);
    if (sent != 3)
        FAIL("udp", "sendmmsg sent %ld: %s", sent, strerror(errno));
    int got = 0;
    for (int tries = 0; got < 3 && tries < 500; tries++) {
        struct timespec t = {5, 0};
        long r = syscall(SYS_recvmmsg, b, in + got, 3 - got, MSG_WAITFORONE, &t);
        if (r < 0)
            FAIL("udp", "recvmmsg: %s", strerror(errno));
        got += (int)r;
    }
    for (int i = 0; i < got; i++) {
        if (in[i].msg_len != strlen(words[i]) || memcmp(bufs[i], words[i], in[i].msg_len) != 0)
            FAIL("udp", "datagram %d: %u bytes %.*s", i, in[i].msg_len, (int)in[i].msg_len, bufs[i]);
        if (from[i].sin_port != aa.sin_port)
            FAIL("udp", "datagram %d from port %d, not %d", i, ntohs(from[i].sin_port), ntohs(aa.sin_port));
    }
    if (got != 3)
        FAIL("udp", "received %d datagrams of 3", got);
    syscall(SYS_close, a);
    syscall(SYS_close, b);
    report("udp", NULL);
}

static void check_dup(int l, int port) {
    int c, s;
    char buf[8];
    if (connected_pair(l, port, &c, &s) != 0)
        FAIL("dup", "connect/accept4: %s", strerror(errno));
    int copy = 200;
    if (syscall(SYS_dup3, c, copy, O_CLOEXEC) != copy)
        FAIL("dup", "dup3: %s", strerror(errno));
    if (syscall(SYS_close, c) != 0)
        FAIL("dup", "close: %s", strerror(errno));
    if (syscall(SYS_write, copy, "dup", 3) != 3 || syscall(SYS_read, s, buf, sizeof buf) != 3 ||
        memcmp(buf, "dup", 3) != 0)
        FAIL("dup", "through the copy: %s", strerror(errno));
    syscall(SYS_close, copy);
    if (syscall(SYS_read, s, buf, sizeof buf) != 0)
        FAIL("dup", "no end-of-file after the last copy closed");
    syscall(SYS_close, s);
    report("dup", NULL);
}

/* sshd's sandbox, roughly: what a confined child may still do. */
static const int allowed[] = {
    SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_close, SYS_poll, SYS_futex,
    SYS_nanosleep, SYS_clock_nanosleep, SYS_clock_gettime, SYS_gettimeofday, SYS_getpid,
    SYS_gettid, SYS_brk, SYS_mmap, SYS_munmap, SYS_madvise, SYS_rt_sigprocmask,
    SYS_rt_sigreturn, SYS_sendto, SYS_recvfrom, SYS_wait4, SYS_exit, SYS_exit_group,
};

static int install_filter(void) {
    enum { N = sizeof allowed / sizeof allowed[0] };
    struct sock_filter f[3 + 2 * N + 1];
    int k = 0;
    f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    for (int i = 0; i < N; i++) {
        f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)allowed[i], 0, 1);
        f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    }
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    struct sock_fprog prog = {.len = (unsigned short)k, .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
}

static void check_seccomp(int l, int port) {
    int c, s;
    if (connected_pair(l, port, &c, &s) != 0)
        FAIL("seccomp", "connect/accept4: %s", strerror(errno));
    pid_t child = fork();
    if (child == 0) {
        char b[16];
        close(c);
        for (;;) {
            long n = read(s, b, sizeof b);
            if (n <= 0)
                _exit(n == 0 ? 0 : 1);
            usleep(3000);
            if (write(s, b, (size_t)n) != n)
                _exit(1);
        }
    }
    syscall(SYS_close, s);
    if (install_filter() != 0)
        FAIL("seccomp", "seccomp(SECCOMP_SET_MODE_FILTER): %s", strerror(errno));
    char b[16];
    for (int i = 0; i < 20; i++) {
        char msg[16];
        int len = snprintf(msg, sizeof msg, "round %d", i);
        if (write(c, msg, (size_t)len) != len)
            FAIL("seccomp", "write %d: %s", i, strerror(errno));
        long got = 0;
        while (got < len) {
            long n = read(c, b + got, sizeof b - (size_t)got);
            if (n <= 0)
                FAIL("seccomp", "read %d: %ld (%s)", i, n, strerror(errno));
            got += n;
        }
        if (memcmp(b, msg, (size_t)len) != 0)
            FAIL("seccomp", "round %d: %.*s", i, (int)got, b);
    }
    close(c);
    int st = 0;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        FAIL("seccomp", "the echoing child ended with status %#x", st);
    report("seccomp", NULL);
}

int main(int argc, char **argv) {
    alarm(60);
    if (argc > 1 && strcmp(argv[1], "pause") == 0)
        pause_port = 0;
    int port;
    int l = listener(&port);
    if (l < 0) {
        printf("FAIL listener: %s\n", strerror(errno));
        return 1;
    }
    check_tcp(l, port);
    check_nonblock(l, port);
    check_poll(l, port);
    check_udp();
    check_dup(l, port);
    check_seccomp(l, port);
    return failures ? 1 : 0;
}
