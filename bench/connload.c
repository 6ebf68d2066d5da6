/* connload: open many idle MQTT connections as fast as a broker accepts them.
 *
 * One thread, one epoll loop, non-blocking sockets, a pre-built CONNECT per
 * client: the generator costs far less CPU per connection than the brokers
 * under test (a Python generator tops out near 9,000 CONNECT/s, below
 * Mosquitto). Built and driven by bench/connections.py.
 *
 *   connload HOST PORT COUNT WINDOW LEVEL CLEAN EXPIRY KEEPALIVE PREFIX NSRC TIMEOUT
 *
 * LEVEL 4 (3.1.1) or 5; CLEAN 1/0 (Clean Session / Clean Start); EXPIRY the
 * MQTT 5 Session Expiry Interval (s); at most WINDOW handshakes in flight;
 * the sockets are bound to NSRC source addresses 127.0.0.1.. (each has
 * ~28,000 ephemeral ports). Prints one line once every client has its
 * CONNACK (or TIMEOUT s passed):
 *
 *   connected N failed F t_first T0 t_last T1 p50_us P p99_us Q max_us M cpu_s C
 *
 * (T0, T1: CLOCK_MONOTONIC seconds of the first CONNECT attempt and the last
 * CONNACK; latency from the connect() call to the CONNACK), then keeps the
 * connections open, sending PINGREQ every 3/4 KEEPALIVE, until a line on
 * stdin; then closes them all and prints "done alive A".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

enum { ST_IDLE, ST_CONNECTING, ST_WAIT_CONNACK, ST_CONNECTED, ST_FAILED };

typedef struct {
    int fd;
    uint8_t state;
    uint8_t have;           /* bytes of a partial packet in buf */
    uint8_t buf[62];
    double t_start, t_last_send;
} conn_t;

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static size_t put_varint(uint8_t *p, size_t v) {
    size_t n = 0;
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        if (v) b |= 0x80;
        p[n++] = b;
    } while (v);
    return n;
}

/* CONNECT for client id PREFIX-i into out; returns its length */
static size_t build_connect(uint8_t *out, int level, int clean, unsigned expiry, int keepalive,
                            const char *prefix, long i) {
    uint8_t body[300];
    size_t n = 0;
    char id[200];
    int idlen = snprintf(id, sizeof id, "%s-%ld", prefix, i);
    body[n++] = 0; body[n++] = 4;
    memcpy(body + n, "MQTT", 4); n += 4;
    body[n++] = (uint8_t)level;
    body[n++] = clean ? 0x02 : 0x00;
    body[n++] = (uint8_t)(keepalive >> 8); body[n++] = (uint8_t)keepalive;
    if (level == 5) {
        if (expiry) {
            body[n++] = 5; body[n++] = 0x11;
            body[n++] = expiry >> 24; body[n++] = expiry >> 16; body[n++] = expiry >> 8; body[n++] = expiry;
        } else {
            body[n++] = 0;
        }
    }
    body[n++] = (uint8_t)(idlen >> 8); body[n++] = (uint8_t)idlen;
    memcpy(body + n, id, idlen); n += idlen;
    size_t m = 0;
    out[m++] = 0x10;
    m += put_varint(out + m, n);
    memcpy(out + m, body, n);
    return m + n;
}

static const char *host;
static int port, level, clean, keepalive, nsrc;
static unsigned expiry;
static const char *prefix;
static int ep;
static long n_failed, n_connected, in_flight;
static double *lat;
static double t_last_connack;
static char first_error[200];

static void fail(conn_t *c, const char *why) {
    if (c->state == ST_FAILED) return;
    if (!first_error[0]) snprintf(first_error, sizeof first_error, "%s", why);
    if (c->state == ST_CONNECTING || c->state == ST_WAIT_CONNACK) in_flight--;
    if (c->state == ST_CONNECTED) n_connected--;
    c->state = ST_FAILED;
    n_failed++;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

static void start(conn_t *c, long i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) { fail(c, strerror(errno)); return; }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in src = {.sin_family = AF_INET};
    if (nsrc > 1) {
        setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
        src.sin_addr.s_addr = htonl(0x7f000001 + (uint32_t)(i % nsrc));
        if (bind(fd, (struct sockaddr *)&src, sizeof src) < 0) { close(fd); fail(c, "bind"); return; }
    }
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &dst.sin_addr);
    c->fd = fd;
    c->t_start = mono();
    c->state = ST_CONNECTING;
    in_flight++;
    if (connect(fd, (struct sockaddr *)&dst, sizeof dst) < 0 && errno != EINPROGRESS) {
        fail(c, strerror(errno));
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u64 = (uint64_t)i};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

static void send_connect(conn_t *c, long i) {
    uint8_t pkt[320];
    size_t n = build_connect(pkt, level, clean, expiry, keepalive, prefix, i);
    ssize_t w = send(c->fd, pkt, n, MSG_NOSIGNAL);
    if (w != (ssize_t)n) { fail(c, w < 0 ? strerror(errno) : "short write"); return; }
    c->t_last_send = mono();
    c->state = ST_WAIT_CONNACK;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)i};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* one packet at p (len bytes, complete) */
static void on_packet(conn_t *c, long i, const uint8_t *p, size_t hdr, size_t rl) {
    uint8_t type = p[0] >> 4;
    if (type == 2 && c->state == ST_WAIT_CONNACK) {
        if (rl < 2 || p[hdr + 1] != 0) {
            char why[64];
            snprintf(why, sizeof why, "CONNACK reason 0x%02x", rl >= 2 ? p[hdr + 1] : 0xff);
            fail(c, why);
            return;
        }
        double t = mono();
        lat[i] = t - c->t_start;
        t_last_connack = t;
        c->state = ST_CONNECTED;
        in_flight--;
        n_connected++;
    } else if (type == 14) {
        fail(c, "DISCONNECT from broker");
    }
    /* PINGRESP and anything else: ignored */
}

static void readable(conn_t *c, long i) {
    uint8_t rb[4096];
    ssize_t r = recv(c->fd, rb, sizeof rb, 0);
    if (r == 0) { fail(c, "closed by broker"); return; }
    if (r < 0) {
        if (errno != EAGAIN && errno != EINTR) fail(c, strerror(errno));
        return;
    }
    uint8_t all[4096 + 64];
    size_t n = c->have;
    memcpy(all, c->buf, n);
    memcpy(all + n, rb, r);
    n += r;
    size_t pos = 0;
    while (pos < n) {
        size_t rl = 0, k = pos + 1, mult = 1;
        int ok = 0;
        while (k < n && k < pos + 5) {
            rl += (all[k] & 0x7f) * mult;
            mult <<= 7;
            if (!(all[k++] & 0x80)) { ok = 1; break; }
        }
        if (!ok || k + rl > n) break;
        on_packet(c, i, all + pos, k - pos, rl);
        if (c->state == ST_FAILED) return;
        pos = k + rl;
    }
    c->have = (uint8_t)(n - pos);
    if (c->have > sizeof c->buf) { fail(c, "packet too long"); return; }
    memcpy(c->buf, all + pos, c->have);
}

static void raise_nofile(long want) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if ((long)rl.rlim_cur >= want) return;
    rl.rlim_cur = want;
    if ((long)rl.rlim_max < want) rl.rlim_max = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv) {
    if (argc != 12) {
        fprintf(stderr, "usage: connload HOST PORT COUNT WINDOW LEVEL CLEAN EXPIRY KEEPALIVE PREFIX NSRC TIMEOUT\n");
        return 2;
    }
    host = argv[1];
    port = atoi(argv[2]);
    long count = atol(argv[3]);
    long window = atol(argv[4]);
    level = atoi(argv[5]);
    clean = atoi(argv[6]);
    expiry = (unsigned)strtoul(argv[7], NULL, 10);
    keepalive = atoi(argv[8]);
    prefix = argv[9];
    nsrc = atoi(argv[10]);
    double timeout = atof(argv[11]);
    raise_nofile(count + 64);
    conn_t *cs = calloc(count, sizeof *cs);
    lat = calloc(count, sizeof *lat);
    ep = epoll_create1(0);
    struct epoll_event stdin_ev = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    epoll_ctl(ep, EPOLL_CTL_ADD, 0, &stdin_ev);
    struct epoll_event evs[1024];
    double cpu0 = cpu_s();
    double t_first = mono(), deadline = t_first + timeout;
    long next = 0;
    int reported = 0, stop = 0;
    double next_ping_scan = 0;
    while (!stop) {
        while (next < count && in_flight < window) {
            cs[next].fd = -1;
            start(&cs[next], next);
            next++;
        }
        int nev = epoll_wait(ep, evs, 1024, 50);
        for (int e = 0; e < nev; e++) {
            uint64_t i = evs[e].data.u64;
            if (i == UINT64_MAX) {
                if (reported) stop = 1;
                else { char b[64]; if (read(0, b, sizeof b) <= 0) stop = 1; }
                continue;
            }
            conn_t *c = &cs[i];
            if (c->state == ST_FAILED) continue;
            if (evs[e].events & (EPOLLERR | EPOLLHUP) && c->state == ST_CONNECTING) {
                int err = 0;
                socklen_t l = sizeof err;
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l);
                fail(c, err ? strerror(err) : "connect failed");
                continue;
            }
            if (c->state == ST_CONNECTING && (evs[e].events & EPOLLOUT)) {
                send_connect(c, (long)i);
                continue;
            }
            if (evs[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) readable(c, (long)i);
        }
        double t = mono();
        if (!reported && ((next == count && in_flight == 0) || t > deadline)) {
            double cpu = cpu_s() - cpu0;
            long k = 0;
            double *ok = malloc(sizeof(double) * (count ? count : 1));
            for (long i = 0; i < next; i++)
                if (cs[i].state == ST_CONNECTED) ok[k++] = lat[i];
            qsort(ok, k, sizeof *ok, cmp_dbl);
            double p50 = k ? ok[(k - 1) / 2] : 0, p99 = k ? ok[(long)((k - 1) * 0.99)] : 0, mx = k ? ok[k - 1] : 0;
            free(ok);
            for (char *q = first_error; *q; q++) if (*q == ' ') *q = '_';
            printf("connected %ld failed %ld t_first %.6f t_last %.6f p50_us %.0f p99_us %.0f max_us %.0f cpu_s %.3f"
                   " error %s\n", n_connected, n_failed + (count - next), t_first,
                   t_last_connack ? t_last_connack : t, p50 * 1e6, p99 * 1e6, mx * 1e6, cpu,
                   first_error[0] ? first_error : "-");
            fflush(stdout);
            reported = 1;
            next = count;  /* start no more after a timeout */
        }
        if (reported && keepalive > 0 && t >= next_ping_scan) {
            next_ping_scan = t + 1.0;
            static const uint8_t ping[2] = {0xc0, 0x00};
            for (long i = 0; i < count; i++) {
                conn_t *c = &cs[i];
                if (c->state == ST_CONNECTED && t - c->t_last_send >= keepalive * 0.75) {
                    if (send(c->fd, ping, 2, MSG_NOSIGNAL) == 2) c->t_last_send = t;
                    else fail(c, "PINGREQ write");
                }
            }
        }
    }
    long alive = 0;
    static const uint8_t disc[2] = {0xe0, 0x00};
    for (long i = 0; i < count; i++) {
        if (cs[i].state == ST_CONNECTED) {
            alive++;
            send(cs[i].fd, disc, 2, MSG_NOSIGNAL);
        }
        if (cs[i].fd >= 0) close(cs[i].fd);
    }
    printf("done alive %ld\n", alive);
    return 0;
}
