/*
 * delayline: a fixed one-way delay for every packet of one NFQUEUE queue, for kernels without sch_netem.
 *
 * Usage: delayline QUEUE DELAY_US LIMIT   (run inside the network namespace whose iptables rules send
 * packets to QUEUE; both directions of a link may share the queue, each packet is delayed DELAY_US).
 *
 * Contract:
 * - Every packet is held in the kernel (only its id is copied here, NFQNL_COPY_META; GSO packets stay
 *   whole, NFQA_CFG_F_GSO) and accepted DELAY_US after this process read it, in arrival order: one
 *   verdict batch accepts every packet whose time has come.
 * - At most LIMIT packets wait; one more is dropped, as netem drops beyond its limit. The kernel's own
 *   queue is bounded by LIMIT too.
 * - Prints "ready" on stdout once bound; on SIGTERM or SIGINT prints one line of counters on stderr
 *   (packets, dropped, most waiting, the latest a release came after its time, releases over 1 ms late,
 *   its own CPU-seconds and seconds running) and exits 0.
 * - It runs SCHED_FIFO where allowed (root): it stands for the wire, which does not wait for the host's
 *   cores; "realtime 1" in the counters says it did.
 * - Any netlink error exits 1 with a message: the link is then cut (no listener: the kernel drops
 *   the queue's packets), never silently undelayed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64

struct held { uint32_t id; uint64_t due; };

static volatile sig_atomic_t stopping;
static int sock;
static uint16_t queue;
static uint32_t seq;

static void on_signal(int sig) { (void)sig; stopping = 1; }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, int err) {
    fprintf(stderr, "delayline: %s: %s\n", what, strerror(err));
    exit(1);
}

/* Appends one attribute to the message in buf; returns the new length. */
static size_t put_attr(char *buf, size_t len, uint16_t type, const void *data, uint16_t size) {
    struct nlattr *attr = (struct nlattr *)(buf + NLMSG_ALIGN(len));
    attr->nla_type = type;
    attr->nla_len = NLA_HDRLEN + size;
    memcpy((char *)attr + NLA_HDRLEN, data, size);
    return NLMSG_ALIGN(len) + NLA_ALIGN(attr->nla_len);
}

static size_t start_msg(char *buf, uint8_t type, uint16_t flags) {
    struct nlmsghdr *nlh = (struct nlmsghdr *)buf;
    struct nfgenmsg *nfg = (struct nfgenmsg *)NLMSG_DATA(nlh);
    memset(buf, 0, NLMSG_HDRLEN + sizeof *nfg);
    nlh->nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | type;
    nlh->nlmsg_flags = NLM_F_REQUEST | flags;
    nlh->nlmsg_seq = ++seq;
    nfg->nfgen_family = AF_UNSPEC;
    nfg->version = NFNETLINK_V0;
    nfg->res_id = htons(queue);
    return NLMSG_HDRLEN + NLMSG_ALIGN(sizeof *nfg);
}

static void send_msg(char *buf, size_t len) {
    ((struct nlmsghdr *)buf)->nlmsg_len = len;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    while (sendto(sock, buf, len, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0)
        if (errno != EINTR) die("send", errno);
}

/* Sends one config message and waits for its acknowledgement. */
static void configure(size_t len, char *buf) {
    send_msg(buf, len);
    char reply[8192];
    for (;;) {
        ssize_t n = recv(sock, reply, sizeof reply, 0);
        if (n < 0) { if (errno == EINTR) continue; die("config reply", errno); }
        for (struct nlmsghdr *h = (struct nlmsghdr *)reply; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type == NLMSG_ERROR) {
                int err = -((struct nlmsgerr *)NLMSG_DATA(h))->error;
                if (err) die("queue config", err);
                return;
            }
        }
    }
}

static void bind_queue(uint32_t limit) {
    char buf[256];
    size_t len = start_msg(buf, NFQNL_MSG_CONFIG, NLM_F_ACK);
    struct nfqnl_msg_config_cmd cmd = {.command = NFQNL_CFG_CMD_BIND, .pf = htons(AF_INET)};
    len = put_attr(buf, len, NFQA_CFG_CMD, &cmd, sizeof cmd);
    configure(len, buf);

    len = start_msg(buf, NFQNL_MSG_CONFIG, NLM_F_ACK);
    struct nfqnl_msg_config_params params = {.copy_range = htonl(0), .copy_mode = NFQNL_COPY_META};
    len = put_attr(buf, len, NFQA_CFG_PARAMS, &params, sizeof params);
    uint32_t maxlen = htonl(limit), flags = htonl(NFQA_CFG_F_GSO);
    len = put_attr(buf, len, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof maxlen);
    len = put_attr(buf, len, NFQA_CFG_FLAGS, &flags, sizeof flags);
    len = put_attr(buf, len, NFQA_CFG_MASK, &flags, sizeof flags);
    configure(len, buf);
}

static void verdict(uint8_t type, uint32_t id, uint32_t what) {
    char buf[64];
    size_t len = start_msg(buf, type, 0);
    struct nfqnl_msg_verdict_hdr hdr = {.verdict = htonl(what), .id = htonl(id)};
    len = put_attr(buf, len, NFQA_VERDICT_HDR, &hdr, sizeof hdr);
    send_msg(buf, len);
}

/* The packet id of one NFQNL_MSG_PACKET message, or -1 if it carries none. */
static int64_t packet_id(struct nlmsghdr *h) {
    char *attrs = (char *)NLMSG_DATA(h) + NLMSG_ALIGN(sizeof(struct nfgenmsg));
    int left = (int)h->nlmsg_len - (int)(attrs - (char *)h);
    for (struct nlattr *a = (struct nlattr *)attrs; left >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= left;
         left -= NLA_ALIGN(a->nla_len), a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len))) {
        if ((a->nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR) {
            struct nfqnl_msg_packet_hdr *ph = (struct nfqnl_msg_packet_hdr *)((char *)a + NLA_HDRLEN);
            return ntohl(ph->packet_id);
        }
    }
    return -1;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: delayline QUEUE DELAY_US LIMIT\n"); return 2; }
    queue = (uint16_t)atoi(argv[1]);
    uint64_t delay = strtoull(argv[2], NULL, 10) * 1000u;
    uint32_t limit = (uint32_t)strtoul(argv[3], NULL, 10);
    if (limit < 1) { fprintf(stderr, "delayline: LIMIT must be at least 1\n"); return 2; }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    prctl(PR_SET_TIMERSLACK, 1UL);  /* wake at the due time, not up to 50 us after it */
    struct sched_param rt = {.sched_priority = 1};
    int realtime = sched_setscheduler(0, SCHED_FIFO, &rt) == 0;

    sock = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    if (sock < 0) die("netlink socket", errno);
    int one = 1, rcvbuf = 32 << 20;
    setsockopt(sock, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    if (setsockopt(sock, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) < 0)
        setsockopt(sock, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_nl local = {.nl_family = AF_NETLINK};
    if (bind(sock, (struct sockaddr *)&local, sizeof local) < 0) die("netlink bind", errno);
    bind_queue(limit);
    printf("ready\n");
    fflush(stdout);

    uint64_t began = now_ns();
    struct held *ring = calloc(limit, sizeof *ring);
    if (!ring) die("ring", ENOMEM);
    uint32_t head = 0, count = 0, most = 0;
    uint64_t packets = 0, dropped = 0, late = 0, late_1ms = 0;
    static char bufs[BATCH][8192];  /* a packet message with NFQNL_COPY_META is a few hundred bytes */
    static struct iovec iov[BATCH];
    static struct mmsghdr batch[BATCH];
    for (int m = 0; m < BATCH; m++) {
        iov[m] = (struct iovec){.iov_base = bufs[m], .iov_len = sizeof bufs[m]};
        batch[m].msg_hdr = (struct msghdr){.msg_iov = &iov[m], .msg_iovlen = 1};
    }
    while (!stopping) {
        uint64_t now = now_ns();
        if (count && ring[head].due <= now) {  /* accept every packet whose time has come, in one message */
            uint32_t last = ring[head].id;
            while (count && ring[head].due <= now) {
                if (now - ring[head].due > late) late = now - ring[head].due;
                if (now - ring[head].due > 1000000u) late_1ms++;
                last = ring[head].id;
                head = (head + 1) % limit;
                count--;
            }
            verdict(NFQNL_MSG_VERDICT_BATCH, last, NF_ACCEPT);
            continue;
        }
        struct timespec wait, *timeout = NULL;
        if (count) {
            uint64_t left = ring[head].due - now;
            wait.tv_sec = (time_t)(left / 1000000000u);
            wait.tv_nsec = (long)(left % 1000000000u);
            timeout = &wait;
        }
        struct pollfd pfd = {.fd = sock, .events = POLLIN};
        int ready = ppoll(&pfd, 1, timeout, NULL);
        if (ready < 0) { if (errno == EINTR) continue; die("poll", errno); }
        if (!ready) continue;
        int got = recvmmsg(sock, batch, BATCH, MSG_DONTWAIT, NULL);  /* one message per packet: up to BATCH per call */
        if (got < 0) { if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS) continue; die("recv", errno); }
        uint64_t arrived = now_ns();
        for (int m = 0; m < got; m++) {
          ssize_t n = batch[m].msg_len;
          for (struct nlmsghdr *h = (struct nlmsghdr *)bufs[m]; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type == NLMSG_ERROR) {
                int err = -((struct nlmsgerr *)NLMSG_DATA(h))->error;
                if (err) die("verdict", err);
                continue;
            }
            if ((h->nlmsg_type & 0xff) != NFQNL_MSG_PACKET) continue;
            int64_t id = packet_id(h);
            if (id < 0) continue;
            packets++;
            if (count == limit) {  /* full: drop this one, as netem beyond its limit */
                verdict(NFQNL_MSG_VERDICT, (uint32_t)id, NF_DROP);
                dropped++;
                continue;
            }
            ring[(head + count) % limit] = (struct held){(uint32_t)id, arrived + delay};
            if (++count > most) most = count;
          }
        }
    }
    struct rusage use;
    getrusage(RUSAGE_SELF, &use);
    double cpu = use.ru_utime.tv_sec + use.ru_stime.tv_sec + (use.ru_utime.tv_usec + use.ru_stime.tv_usec) / 1e6;
    fprintf(stderr, "delayline: queue %u delay_us %llu packets %llu dropped %llu most_waiting %u latest_release_us %.1f"
            " late_1ms %llu cpu_s %.3f seconds %.3f realtime %d\n", queue, (unsigned long long)(delay / 1000u),
            (unsigned long long)packets, (unsigned long long)dropped, most, late / 1000.0, (unsigned long long)late_1ms, cpu,
            (now_ns() - began) / 1e9, realtime);
    return 0;
}
