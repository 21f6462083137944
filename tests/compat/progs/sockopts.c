/* The socket-option sweep (issue 14): every option socket(7), ip(7), ipv6(7), tcp(7) and
 * udp(7) document, on fresh TCP and UDP sockets of both families, an IPv4 listener and an
 * IPv4 connection to PORT. For each (socket kind, option): a fresh socket; getsockopt;
 * setsockopt with the value just read (or int 1 when the read failed or was not an
 * int); getsockopt again. One line per step:
 *
 *   KIND LEVEL NAME get  -> ok LEN HEX | err ERRNO
 *   KIND LEVEL NAME set  -> ok | err ERRNO
 *
 * test_compat_sockopts.py runs it natively twice (values that differ between two native
 * runs are per-socket, e.g. SO_COOKIE, and compared by outcome only) and under canal,
 * and compares line by line; the only differences allowed are canald's documented
 * refusals (docs/compat.md, "Socket options").
 *
 * Usage: sockopts PORT   (PORT: a TCP listener on 127.0.0.1 that accepts and holds) */
#include "common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <stdlib.h>
#include <sys/socket.h>

#ifndef SO_PASSPIDFD
#define SO_PASSPIDFD 76
#endif
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#ifndef IP_LOCAL_PORT_RANGE
#define IP_LOCAL_PORT_RANGE 51
#endif

struct opt {
    int level, name;
    const char *lname, *oname;
};

#define S(n) { SOL_SOCKET, n, "SOL_SOCKET", #n }
#define I(n) { IPPROTO_IP, n, "IPPROTO_IP", #n }
#define V6(n) { IPPROTO_IPV6, n, "IPPROTO_IPV6", #n }
#define T(n) { IPPROTO_TCP, n, "IPPROTO_TCP", #n }
#define U(n) { IPPROTO_UDP, n, "IPPROTO_UDP", #n }

static const struct opt opts[] = {
    S(SO_ACCEPTCONN), S(SO_ATTACH_FILTER), S(SO_ATTACH_BPF), S(SO_ATTACH_REUSEPORT_CBPF),
    S(SO_ATTACH_REUSEPORT_EBPF), S(SO_BINDTODEVICE), S(SO_BINDTOIFINDEX), S(SO_BROADCAST),
    S(SO_BSDCOMPAT), S(SO_BUF_LOCK), S(SO_BUSY_POLL), S(SO_BUSY_POLL_BUDGET), S(SO_COOKIE),
    S(SO_DEBUG), S(SO_DETACH_FILTER), S(SO_DOMAIN), S(SO_DONTROUTE), S(SO_ERROR),
    S(SO_INCOMING_CPU), S(SO_INCOMING_NAPI_ID), S(SO_KEEPALIVE), S(SO_LINGER), S(SO_LOCK_FILTER),
    S(SO_MARK), S(SO_MAX_PACING_RATE), S(SO_NETNS_COOKIE), S(SO_NOFCS), S(SO_OOBINLINE),
    S(SO_PASSCRED), S(SO_PASSPIDFD), S(SO_PASSSEC), S(SO_PEEK_OFF), S(SO_PEERCRED),
    S(SO_PEERGROUPS), S(SO_PEERPIDFD), S(SO_PEERSEC), S(SO_PREFER_BUSY_POLL), S(SO_PRIORITY),
    S(SO_PROTOCOL), S(SO_RCVBUF), S(SO_RCVBUFFORCE), S(SO_RCVLOWAT), S(SO_RCVMARK),
    S(SO_RCVTIMEO), S(SO_RESERVE_MEM), S(SO_REUSEADDR), S(SO_REUSEPORT), S(SO_RXQ_OVFL),
    S(SO_SELECT_ERR_QUEUE), S(SO_SNDBUF), S(SO_SNDBUFFORCE), S(SO_SNDLOWAT), S(SO_SNDTIMEO),
    S(SO_TIMESTAMP), S(SO_TIMESTAMPING), S(SO_TIMESTAMPNS), S(SO_TXREHASH), S(SO_TXTIME),
    S(SO_TYPE), S(SO_WIFI_STATUS), S(SO_ZEROCOPY),
    I(IP_ADD_MEMBERSHIP), I(IP_ADD_SOURCE_MEMBERSHIP), I(IP_BIND_ADDRESS_NO_PORT),
    I(IP_BLOCK_SOURCE), I(IP_CHECKSUM), I(IP_DROP_MEMBERSHIP), I(IP_DROP_SOURCE_MEMBERSHIP),
    I(IP_FREEBIND), I(IP_HDRINCL), I(IP_LOCAL_PORT_RANGE), I(IP_MINTTL), I(IP_MSFILTER),
    I(IP_MTU), I(IP_MTU_DISCOVER), I(IP_MULTICAST_ALL), I(IP_MULTICAST_IF), I(IP_MULTICAST_LOOP),
    I(IP_MULTICAST_TTL), I(IP_NODEFRAG), I(IP_OPTIONS), I(IP_PASSSEC), I(IP_PKTINFO),
    I(IP_PKTOPTIONS), I(IP_RECVERR), I(IP_RECVFRAGSIZE), I(IP_RECVOPTS), I(IP_RECVORIGDSTADDR),
    I(IP_RECVTOS), I(IP_RECVTTL), I(IP_RETOPTS), I(IP_ROUTER_ALERT), I(IP_TOS), I(IP_TRANSPARENT),
    I(IP_TTL), I(IP_UNBLOCK_SOURCE),
    V6(IPV6_ADDRFORM), V6(IPV6_ADD_MEMBERSHIP), V6(IPV6_AUTOFLOWLABEL), V6(IPV6_DONTFRAG),
    V6(IPV6_DROP_MEMBERSHIP), V6(IPV6_DSTOPTS), V6(IPV6_FREEBIND), V6(IPV6_HOPLIMIT),
    V6(IPV6_HOPOPTS), V6(IPV6_MINHOPCOUNT), V6(IPV6_MTU), V6(IPV6_MTU_DISCOVER),
    V6(IPV6_MULTICAST_HOPS), V6(IPV6_MULTICAST_IF), V6(IPV6_MULTICAST_LOOP), V6(IPV6_PATHMTU),
    V6(IPV6_RECVERR), V6(IPV6_RECVPATHMTU), V6(IPV6_RECVPKTINFO), V6(IPV6_RECVTCLASS),
    V6(IPV6_ROUTER_ALERT), V6(IPV6_RTHDR), V6(IPV6_TCLASS), V6(IPV6_TRANSPARENT),
    V6(IPV6_UNICAST_HOPS), V6(IPV6_V6ONLY),
    T(TCP_CC_INFO), T(TCP_CONGESTION), T(TCP_CORK), T(TCP_DEFER_ACCEPT), T(TCP_FASTOPEN),
    T(TCP_FASTOPEN_CONNECT), T(TCP_INFO), T(TCP_INQ), T(TCP_KEEPCNT), T(TCP_KEEPIDLE),
    T(TCP_KEEPINTVL), T(TCP_LINGER2), T(TCP_MAXSEG), T(TCP_MD5SIG), T(TCP_NODELAY),
    T(TCP_NOTSENT_LOWAT), T(TCP_QUICKACK), T(TCP_REPAIR), T(TCP_SAVE_SYN), T(TCP_SAVED_SYN),
    T(TCP_SYNCNT), T(TCP_THIN_DUPACK), T(TCP_THIN_LINEAR_TIMEOUTS), T(TCP_TIMESTAMP),
    T(TCP_TX_DELAY), T(TCP_ULP), T(TCP_USER_TIMEOUT), T(TCP_WINDOW_CLAMP), T(TCP_ZEROCOPY_RECEIVE),
    U(UDP_CORK), U(UDP_ENCAP), U(UDP_GRO), U(UDP_NO_CHECK6_RX), U(UDP_NO_CHECK6_TX), U(UDP_SEGMENT),
};

static int port;

/* A fresh socket of `kind`: tcp4 tcp6 udp4 udp6 (unconnected), listen4, conn4. */
static int make(const char *kind)
{
    int fam = strchr(kind, '6') ? AF_INET6 : AF_INET;
    int type = strncmp(kind, "udp", 3) == 0 ? SOCK_DGRAM : SOCK_STREAM;
    int fd = socket(fam, type, 0);
    if (fd < 0) {
        fprintf(stderr, "socket %s: %s\n", kind, ename(errno));
        exit(1);
    }
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (strcmp(kind, "listen4") == 0) {
        if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 4)) {
            fprintf(stderr, "listen: %s\n", ename(errno));
            exit(1);
        }
    } else if (strcmp(kind, "conn4") == 0) {
        a.sin_port = htons((uint16_t)port);
        if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
            fprintf(stderr, "connect to %d: %s\n", port, ename(errno));
            exit(1);
        }
    }
    return fd;
}

static void get(const char *kind, const struct opt *o, int fd, unsigned char *val, socklen_t *len)
{
    *len = 256;
    memset(val, 0, 256);
    int r = getsockopt(fd, o->level, o->name, val, len);
    printf("%s %s %s get -> ", kind, o->lname, o->oname);
    if (r < 0) {
        printf("err %s\n", ename(errno));
        *len = 0;
        return;
    }
    printf("ok %u ", (unsigned)*len);
    for (socklen_t i = 0; i < *len; i++)
        printf("%02x", val[i]);
    printf("\n");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: sockopts PORT\n");
        return 2;
    }
    port = atoi(argv[1]);
    const char *kinds[] = { "tcp4", "tcp6", "udp4", "udp6", "listen4", "conn4" };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
            const struct opt *o = &opts[i];
            int fd = make(kinds[k]);
            unsigned char val[256];
            socklen_t len;
            get(kinds[k], o, fd, val, &len);
            if (len != 4 && len != 8 && len != 16) {
                int one = 1;
                memcpy(val, &one, 4);
                len = 4;
            }
            int r = setsockopt(fd, o->level, o->name, val, len);
            printf("%s %s %s set -> %s\n", kinds[k], o->lname, o->oname, r < 0 ? ename(errno) : "ok");
            get(kinds[k], o, fd, val, &len);
            close(fd);
        }
    }
    printf("done\n");
    return 0;
}
