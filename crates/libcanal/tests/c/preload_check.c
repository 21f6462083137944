/* Checks libcanal from C: glibc's fortified entry points (__recv_chk, __read_chk,
 * __recvfrom_chk, __poll_chk), fcntl/ioctl argument classes, dup2, vfork+exec, iovec
 * calls, accept4 flags, UDP with recvmsg. Built with -O2 -D_FORTIFY_SOURCE=2 by
 * tests/preload.rs and run under LD_PRELOAD with a canald.
 * Exit 0: all passed; 77: not running under canal; 1: a check failed.
 * CHECK_NATIVE=1 runs it on kernel sockets (validates the expectations). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static int fails;
/* Lengths the compiler cannot see, so _FORTIFY_SOURCE emits the __*_chk calls. */
static volatile size_t RT_LEN = 64;
static volatile nfds_t RT_ONE = 1;
#define CHECK(name, cond)                                                              \
    do {                                                                               \
        int ok_ = (cond);                                                              \
        printf("%s %s", ok_ ? "PASS" : "FAIL", name);                                  \
        if (!ok_) printf("  [errno %d %s]", errno, strerror(errno));                   \
        printf("\n");                                                                  \
        fflush(stdout);                                                                \
        if (!ok_) fails++;                                                             \
    } while (0)

/* The kernel's view of a descriptor's domain, bypassing the library: the system call
 * instruction itself (libc's syscall() is hooked, as the libc functions are). */
static int kernel_domain(int fd) {
    int d = -1;
    socklen_t l = sizeof d;
#if defined(__x86_64__)
    register long r10 __asm__("r10") = (long)&d;
    register long r8 __asm__("r8") = (long)&l;
    long ret = SYS_getsockopt;
    __asm__ volatile("syscall"
                     : "+a"(ret)
                     : "D"((long)fd), "S"((long)SOL_SOCKET), "d"((long)SO_DOMAIN), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = SYS_getsockopt;
    register long x0 __asm__("x0") = fd;
    register long x1 __asm__("x1") = SOL_SOCKET;
    register long x2 __asm__("x2") = SO_DOMAIN;
    register long x3 __asm__("x3") = (long)&d;
    register long x4 __asm__("x4") = (long)&l;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
#else
#error "kernel_domain: x86-64 and arm64 only"
#endif
    return d;
}

static void pair(int *cli, int *srv, int *lst) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    *lst = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bind(*lst, (struct sockaddr *)&a, sizeof a);
    listen(*lst, 4);
    getsockname(*lst, (struct sockaddr *)&a, &al);
    *cli = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    CHECK("connect", connect(*cli, (struct sockaddr *)&a, sizeof a) == 0);
    struct sockaddr_in peer;
    socklen_t pl = 4; /* deliberately short: truncated copy, full length back */
    *srv = accept4(*lst, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    CHECK("accept4", *srv >= 0);
    CHECK("accept4 addrlen reports full length", pl == sizeof(struct sockaddr_in));
    CHECK("accept4 SOCK_NONBLOCK", (fcntl(*srv, F_GETFL) & O_NONBLOCK) != 0);
    CHECK("accept4 SOCK_CLOEXEC on the dummy", (fcntl(*srv, F_GETFD) & FD_CLOEXEC) != 0);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    /* CHECK_NATIVE=1 runs the same checks on kernel sockets, to confirm that every
     * expectation here is the kernel's behaviour. */
    if (kernel_domain(probe) != AF_UNIX && !getenv("CHECK_NATIVE")) {
        printf("skipped: not running under libcanal with a canald\n");
        return 77;
    }
    int d = 0;
    socklen_t dl = sizeof d;
    getsockopt(probe, SOL_SOCKET, SO_DOMAIN, &d, &dl);
    CHECK("SO_DOMAIN answered as AF_INET", d == AF_INET);
    close(probe);

    int c, s, l;
    pair(&c, &s, &l);
    char buf[64];

    /* Fortified reads (the compiler knows sizeof buf). */
    CHECK("write", write(c, "abcdef", 6) == 6);
    struct pollfd p = {.fd = s, .events = POLLIN};
    CHECK("poll (__poll_chk)", poll(&p, RT_ONE, 5000) == 1 && (p.revents & POLLIN));
    int avail = -1;
    CHECK("ioctl FIONREAD", ioctl(s, FIONREAD, &avail) == 0 && avail == 6);
    CHECK("recv (__recv_chk)", recv(s, buf, RT_LEN, MSG_PEEK) == 6);
    CHECK("read (__read_chk)", read(s, buf, RT_LEN / 21) == 3 && memcmp(buf, "abc", 3) == 0);
    struct sockaddr_in from;
    socklen_t fl = sizeof from;
    CHECK("recvfrom (__recvfrom_chk)", recvfrom(s, buf, RT_LEN, 0, (struct sockaddr *)&from, &fl) == 3);
    CHECK("recvfrom on TCP: addrlen 0", fl == 0);
    CHECK("nonblocking read: EAGAIN", read(s, buf, sizeof buf) == -1 && errno == EAGAIN);

    /* fcntl classes: F_SETFL int, F_GETFL none, F_SETFD passes to the dummy. */
    int f = fcntl(s, F_GETFL);
    CHECK("F_SETFL clears O_NONBLOCK", fcntl(s, F_SETFL, f & ~O_NONBLOCK) == 0 &&
                                           (fcntl(s, F_GETFL) & O_NONBLOCK) == 0);
    int on = 1;
    CHECK("FIONBIO", ioctl(s, FIONBIO, &on) == 0 && (fcntl(s, F_GETFL) & O_NONBLOCK));
    CHECK("F_SETFD on the dummy", fcntl(s, F_SETFD, 0) == 0 && fcntl(s, F_GETFD) == 0);

    /* writev/readv and sendmsg/recvmsg with iovecs; MSG_WAITALL. */
    struct iovec iov[3] = {{"he", 2}, {"llo", 3}, {" world", 6}};
    CHECK("writev", writev(c, iov, 3) == 11);
    on = 0;
    ioctl(s, FIONBIO, &on);
    char a1[4], a2[7];
    struct iovec riov[2] = {{a1, 4}, {a2, 7}};
    struct msghdr m = {.msg_iov = riov, .msg_iovlen = 2};
    CHECK("recvmsg MSG_WAITALL fills both iovecs", recvmsg(s, &m, MSG_WAITALL) == 11 &&
                                                       memcmp(a1, "hell", 4) == 0 &&
                                                       memcmp(a2, "o world", 7) == 0);

    /* dup2 onto another number: both refer to the socket; closing one keeps it. */
    int nd = dup2(c, 100);
    CHECK("dup2", nd == 100);
    close(c);
    CHECK("write on dup2 copy", write(100, "x", 1) == 1 && read(s, buf, 1) == 1 && buf[0] == 'x');

    /* select with a canal descriptor and a pipe. */
    int pp[2];
    CHECK("pipe", pipe(pp) == 0);
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(s, &rs);
    FD_SET(pp[0], &rs);
    struct timeval tv = {0, 100000};
    CHECK("select timeout", select((s > pp[0] ? s : pp[0]) + 1, &rs, NULL, NULL, &tv) == 0);
    CHECK("pipe write", write(pp[1], "p", 1) == 1);
    FD_ZERO(&rs);
    FD_SET(s, &rs);
    FD_SET(pp[0], &rs);
    tv.tv_sec = 5;
    CHECK("select on pipe", select((s > pp[0] ? s : pp[0]) + 1, &rs, NULL, NULL, &tv) == 1 &&
                                FD_ISSET(pp[0], &rs) && !FD_ISSET(s, &rs));

    /* vfork + exec: the child shares our memory and must not disturb our state. */
    pid_t pid = vfork();
    if (pid == 0) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK("vfork+exec", WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK("socket fine after vfork", write(100, "y", 1) == 1 && read(s, buf, 1) == 1 && buf[0] == 'y');

    /* fork: child writes and exits with exit(); the parent's socket stays usable. */
    pid = fork();
    if (pid == 0) exit(write(100, "z", 1) == 1 ? 0 : 1);
    waitpid(pid, &st, 0);
    CHECK("fork child wrote", WIFEXITED(st) && WEXITSTATUS(st) == 0 && read(s, buf, 1) == 1 && buf[0] == 'z');

    /* Peer close: EOF, then EPIPE (no SIGPIPE with MSG_NOSIGNAL). */
    close(100);
    CHECK("EOF after last close", read(s, buf, sizeof buf) == 0);
    shutdown(s, SHUT_WR);
    CHECK("send after SHUT_WR: EPIPE", send(s, "q", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE);
    close(s);
    close(l);

    /* UDP: sendto / recvmsg with source address and MSG_TRUNC. */
    int u1 = socket(AF_INET, SOCK_DGRAM, 0), u2 = socket(AF_INET6, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in ua = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t ul = sizeof ua;
    bind(u1, (struct sockaddr *)&ua, sizeof ua);
    getsockname(u1, (struct sockaddr *)&ua, &ul);
    CHECK("udp v6 socket recv EAGAIN", recv(u2, buf, 1, 0) == -1 && errno == EAGAIN);
    int u3 = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK("udp sendto", sendto(u3, "datagram!", 9, 0, (struct sockaddr *)&ua, sizeof ua) == 9);
    char small[4];
    struct iovec uiov = {small, sizeof small};
    struct sockaddr_in src;
    struct msghdr um = {.msg_name = &src, .msg_namelen = sizeof src, .msg_iov = &uiov, .msg_iovlen = 1};
    ssize_t n = recvmsg(u1, &um, 0);
    CHECK("udp recvmsg truncates", n == 4 && (um.msg_flags & MSG_TRUNC));
    CHECK("udp source address", um.msg_namelen == sizeof src && src.sin_family == AF_INET &&
                                    src.sin_addr.s_addr == htonl(INADDR_LOOPBACK));
    /* sendmmsg / recvmmsg (MSG_WAITFORONE). */
    struct iovec sv[3] = {{"one", 3}, {"two", 3}, {"three", 5}};
    struct mmsghdr smm[3];
    memset(smm, 0, sizeof smm);
    for (int i = 0; i < 3; i++) {
        smm[i].msg_hdr.msg_iov = &sv[i];
        smm[i].msg_hdr.msg_iovlen = 1;
        smm[i].msg_hdr.msg_name = &ua;
        smm[i].msg_hdr.msg_namelen = sizeof ua;
    }
    CHECK("sendmmsg", sendmmsg(u3, smm, 3, 0) == 3 && smm[2].msg_len == 5);
    char rb[4][16];
    struct iovec rv[4];
    struct mmsghdr rmm[4];
    memset(rmm, 0, sizeof rmm);
    for (int i = 0; i < 4; i++) {
        rv[i].iov_base = rb[i];
        rv[i].iov_len = sizeof rb[i];
        rmm[i].msg_hdr.msg_iov = &rv[i];
        rmm[i].msg_hdr.msg_iovlen = 1;
    }
    usleep(100000);
    int got = recvmmsg(u1, rmm, 4, MSG_WAITFORONE, NULL);
    CHECK("recvmmsg MSG_WAITFORONE", got == 3 && rmm[0].msg_len == 3 && rmm[2].msg_len == 5 &&
                                         memcmp(rb[2], "three", 5) == 0);
    close(u1);
    close(u2);
    close(u3);

    printf(fails ? "%d failed\n" : "all passed\n", fails);
    return fails ? 1 : 0;
}
