/*
 * rtbench: command line, process fan-out and reporting.
 *
 * Shapes (client sequence numbers are %i):
 *   conn    -c clients connect and stay idle for -d seconds.
 *   sub     -c clients subscribe to -t and count what arrives (missing = sequence gaps).
 *   pub     -c clients publish to -t every -I ms (or --rate in total), -L each.
 *   fanin   --pubs P (or -c) publishers on test/fanin/%i, 1 subscriber on test/fanin/+.
 *   fanout  1 publisher on test/fanout, --subs S (or -c) subscribers.
 *   pairs   -c publisher/subscriber pairs on test/%i.
 *   seed    --subs S subscribers on test/%i (default 19000), --pubs P publishers
 *           (default 40) at --rate messages/s in total (default 4000); publisher j
 *           publishes round robin to the topics test/s with s % P == j. --copies K
 *           gives every topic K subscribers (S x K in all): copy c of test/s has the
 *           client sequence number c * S + s and, with --sub-ports, connects to port
 *           c % n, so that with K = n every topic has one subscriber on every node.
 *   hs      -c connectors (default 10), each in a loop for -d seconds (or -L cycles):
 *           connect, TLS handshake (--tls) and/or WebSocket upgrade (--ws), CONNECT/
 *           CONNACK, DISCONNECT, wait for the broker's close; full and resumed
 *           handshakes per second (--tls-resume offers the last session each time).
 * Scenarios run closed loop (each publisher keeps at most --window messages not yet
 * received) unless -I or --rate asks for a fixed rate. --procs splits the clients of
 * conn/sub/pub, the pairs of `pairs`, the publishers (with their subscribers) of
 * `seed`, the publishers of `fanin` and the subscribers of `fanout` over forked
 * processes (the lone fanin subscriber and fanout publisher live in process 0); each
 * child streams its reports through a pipe and the parent adds them up, so the totals
 * are exact. fanin and fanout close their loops across processes through a shared
 * mapping of delivery counters (see rtb_fb_size).
 */
#include "rtbench.h"
#include "rtb_xmpp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define RTB_DEFAULT_DURATION_S 60.0 /* -d when not given: every run stops by itself */
#define RTB_MAX_DURATION_S 86400.0
#define RTB_DEFAULT_CLIENTS 200 /* -c for conn/sub/pub, as emqtt_bench */
#define RTB_DEFAULT_INFLIGHT 32
#define RTB_DEFAULT_WINDOW 10
#define RTB_DEFAULT_COALESCE_US 500 /* closed loop: sleep of an iteration with few reads, us */
#define RTB_DEFAULT_DRAIN_S 5.0
#define RTB_DEFAULT_CONN_TIMEOUT_S 10.0
#define RTB_DEFAULT_CONN_PARALLEL 64 /* Mosquitto listens with a backlog of 100 */
#define RTB_MAX_PAYLOAD (8u * 1024 * 1024)
#define RTB_FD_RESERVE 32         /* descriptors a process keeps for itself */
#define RTB_REC_MAGIC 0x52544231u /* "RTB1", marks a record on a child's pipe */
#define RTB_PARENT_SLACK_S 30.0   /* beyond the children's own deadlines */
#define RTB_GO_WAIT_S 300.0       /* --go-stdin: workers start by themselves after this */

static const char *usage_text =
    "usage: rtbench <conn|sub|pub|fanin|fanout|pairs|seed|hs> [flags]\n"
    "       rtbench <xlogin|xidle|xchat|xroster|xmuc> [flags]   (XMPP, below)\n"
    "  -h host (127.0.0.1)  -p port (1883)  -c clients  -n start index (0)\n"
    "  -i ms between connection starts (conn/sub/pub 10, scenarios 0 = --conn-parallel at a time)\n"
    "  -I ms between publishes per client (pub: 1000; scenarios: closed loop)\n"
    "  -t topic, %i = client sequence number, %c = client id (sub, pub)\n"
    "  -q qos 0|1|2 (0)  -s payload bytes incl. 16-byte header (256)  -L msgs per client\n"
    "  (pub: -s 1-15 = raw 'x' bytes, no header: acks are counted, no sequence checks)\n"
    "  -k keepalive s (300)  -C clean true|false (true)  -V 3|4|5 (5)  -u user  -P pass\n"
    "  -d duration s (60)  --procs N (1)  --inflight N (32)  --window N (10)\n"
    "  --rate msgs/s total  --pubs P  --subs S  --ifaddr a,b,..  --prefix id-prefix\n"
    "  --copies K (seed: K subscribers per topic, copy c to --sub-ports[c%n]; 1)\n"
    "  --sub-ports p,q,..  --pub-ports p,q,..  (subscriber/publisher i to port i%n: cluster "
    "nodes)\n"
    "  --drain s (5)  --conn-timeout s (10)  --conn-parallel N (64)\n"
    "  --coalesce-us N (500; closed loop: quiet iterations sleep N us, 0 = never)\n"
    "  --json  --quiet  --allow-remote  --test-skip-seq K  --help\n"
    "  --go-stdin (with --procs: once all are connected, print 'rtbench: ready' to stderr\n"
    "             and publish after a line, or EOF, on stdin; at most 300 s later anyway)\n"
    "transports (any command):\n"
    "  --tls            TLS 1.2/1.3 (OpenSSL; ALPN mqtt, or http/1.1 with --ws)\n"
    "  --cafile F       verify the server's certificate against F (without it: no check)\n"
    "                   and its name: --sni, else the IP address of -h\n"
    "  --cert F --key F client certificate and key (PEM) for mutual TLS\n"
    "  --tls-resume     resume the last TLS session (ticket) on every reconnect\n"
    "  --sni NAME       server name indication (and the name verified)\n"
    "  --ws PATH        MQTT over WebSocket (subprotocol mqtt) at PATH; with --tls: WSS\n"
    "hs: -c connectors (10) loop for -d s or -L cycles each: connect, TLS/upgrade,\n"
    "  CONNECT/CONNACK, DISCONNECT, broker closes; reports full and resumed handshakes/s\n"
    "  (hs_full_rate, hs_resumed_rate) and rtbench's own CPU\n"
    "XMPP (-p defaults to 5222; plain TCP; SASL SCRAM-SHA-256; no XML parser: each step waits\n"
    "  for the end tag it expects). A login: stream, SASL, restart, bind, roster get, initial\n"
    "  presence. Accounts are -u with %i = index (u%i), password -P (pw; %i too), --domain\n"
    "  (localhost).\n"
    "  xlogin   -c connectors (50) log in and out until -L logins (10000) or -d; account of\n"
    "           login j: -n + j % --accounts (1000). Reports logins/s, login p50/p99.\n"
    "  xidle    -c sessions (1000), accounts -n.., held for -d s; --go-stdin: once all are\n"
    "           up, 'rtbench: ready' on stderr, and the hold starts after a line on stdin.\n"
    "  xchat    --pairs P (40): accounts -n+2k and -n+2k+1 send each other --rate R (100)\n"
    "           messages/s per pair in all (R/2 each way), body = send time and sequence;\n"
    "           chat latency p50/p99/max per second and overall, losses and duplicates.\n"
    "           --storm N: N logins of accounts -n+2P.. during the chat, --conn-parallel at\n"
    "           a time; --hold keeps them logged in (else each logs out after its login);\n"
    "           --pairs-apart: the pairs in the first of --procs, the storm in the others\n"
    "           (so that the storm's work on a client's loop does not delay the chat's).\n"
    "           --leave-at S (with --hold, --pairs-apart): S s into the chat every storm\n"
    "           session's connection is closed at once, no stream end (a load balancer's\n"
    "           restart, a network's loss): the server's mass disconnect, in the chat.\n"
    "  xroster  set-up: accounts -n..-n+c-1 (-c, >= 19) each get the contacts i+-1..9 (mod c)\n"
    "           with subscription both: two passes of logins sending subscribed+subscribe\n"
    "           and approving the requests that arrive (-L logins in all, 2 x c; one\n"
    "           pass, -L c, is enough where the server keeps pre-approvals, RFC 6121\n"
    "           3.4). Run xidle to check (roster_both_per_login = 18).\n"
    "  xmuc     group chat (XEP-0045): -c occupants (1000) join --rooms R (1) rooms r%i@\n"
    "           --muc-host (conference.<domain>) as nick n<i>, occupant i in room i % R; a\n"
    "           session is up once the room's subject has come. Then for -d s --senders S\n"
    "           (10; occupants 0..S-1, in rooms j % R) send groupchat at --rate (100) msgs/s\n"
    "           in all, body = send time, sequence, sender; every occupant counts what the\n"
    "           room reflects: delivered, expected (sent x occupants of the room), lost,\n"
    "           latency p50/p99/max per second and overall. The drain ends after 1 s with\n"
    "           no delivery (or --drain). --hold: log in, wait for the go (--go-stdin or\n"
    "           --procs), then join (--conn-parallel at a time) and hold for -d s, no chat:\n"
    "           memory per room. --room FMT names the rooms (r%i).\n"
    "  --anon   SASL ANONYMOUS instead of SCRAM-SHA-256 (no accounts needed)\n"
    "  --salt-cache F  keep SCRAM salted passwords in F (RFC 5802 client cache) across runs,\n"
    "           so that PBKDF2 runs once per account, not per run (pbkdf2 counts the misses)\n"
    "  --conn-parallel N (64) logins in flight per process; --ifaddr spreads source addresses;\n"
    "  --procs splits sessions, pairs, storm and logins over processes.\n";

static void die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "rtbench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see rtbench --help)\n");
    exit(2);
}

static double parse_num(const char *flag, const char *v, double lo, double hi)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (!*v || *end || errno || d < lo || d > hi) {
        char msg[128];
        snprintf(msg, sizeof(msg), "bad value for %s (want %g..%g): '%%s'", flag, lo, hi);
        die_usage(msg, v);
    }
    return d;
}

/* Like parse_num, for flags that only take whole numbers. */
static double parse_int(const char *flag, const char *v, double lo, double hi)
{
    double d = parse_num(flag, v, lo, hi);
    if (d != (double)(int64_t)d) {
        char msg[128];
        snprintf(msg, sizeof(msg), "%s takes a whole number: '%%s'", flag);
        die_usage(msg, v);
    }
    return d;
}

static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

static void resolve_port(const rtb_opts_t *o, int port_no, struct sockaddr_storage *out)
{
    struct addrinfo hints, *res;
    char port[16];
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof(port), "%d", port_no);
    int r = getaddrinfo(o->host, port, &hints, &res);
    if (r) {
        fprintf(stderr, "rtbench: cannot resolve '%s': %s\n", o->host, gai_strerror(r));
        exit(2);
    }
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (!o->allow_remote && !is_loopback((struct sockaddr *)out))
        die_usage("refusing non-loopback target '%s' without --allow-remote", o->host);
}

static void resolve(rtb_opts_t *o)
{
    resolve_port(o, o->port, &o->addr);
}

/* --sub-ports / --pub-ports: "p1,p2,..." on -h. */
static int parse_ports(const rtb_opts_t *o, const char *flag, const char *list,
                       struct sockaddr_storage *out)
{
    int n = 0;
    char copy[256];
    snprintf(copy, sizeof(copy), "%s", list);
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == RTB_MAX_PORTS)
            die_usage("too many ports in %s (max 16)", flag);
        resolve_port(o, (int)parse_int(flag, t, 1, 65535), &out[n++]);
    }
    if (!n)
        die_usage("empty %s list", flag);
    return n;
}

static void parse_ifaddr(rtb_opts_t *o, const char *list)
{
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", list);
    char *save = NULL;
    for (char *a = strtok_r(buf, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        if (o->nifaddr == RTB_MAX_IFADDR)
            die_usage("too many --ifaddr addresses (max 64): '%s'", list);
        struct sockaddr_storage *ss = &o->ifaddr[o->nifaddr++];
        if (uv_ip4_addr(a, 0, (struct sockaddr_in *)ss) &&
            uv_ip6_addr(a, 0, (struct sockaddr_in6 *)ss))
            die_usage("bad --ifaddr address '%s'", a);
        if (!o->allow_remote && !is_loopback((struct sockaddr *)ss))
            die_usage("refusing non-loopback --ifaddr '%s' without --allow-remote", a);
    }
    if (!o->nifaddr)
        die_usage("empty --ifaddr list '%s'", list);
}

/* The short tag goes into default client ids, which MQTT 3.1 caps at 23 bytes. */
static const struct {
    const char *name;
    const char *tag;
    rtb_cmd_t cmd;
} cmds[] = {
    {"conn", "c", RTB_CMD_CONN},      {"sub", "s", RTB_CMD_SUB},
    {"pub", "p", RTB_CMD_PUB},        {"fanin", "fi", RTB_CMD_FANIN},
    {"fanout", "fo", RTB_CMD_FANOUT}, {"pairs", "pr", RTB_CMD_PAIRS},
    {"seed", "sd", RTB_CMD_SEED},     {"hs", "hs", RTB_CMD_HS},
    {"xlogin", "xl", RTB_CMD_XLOGIN}, {"xidle", "xi", RTB_CMD_XIDLE},
    {"xchat", "xc", RTB_CMD_XCHAT},   {"xroster", "xr", RTB_CMD_XROSTER},
    {"xmuc", "xm", RTB_CMD_XMUC},
};

/* Defaults and checks of the XMPP commands (rtb_xmpp.h). */
static void xmpp_opts(rtb_opts_t *o, int64_t count, int64_t accounts, int64_t pairs, int64_t storm,
                      int port_set)
{
    if (!port_set)
        o->port = 5222;
    if (o->tls || o->ws)
        die_usage("the XMPP commands speak plain TCP only (%s)", o->tls ? "--tls" : "--ws");
    if (!o->user)
        o->user = "u%i";
    if (!o->pass)
        o->pass = "pw";
    if (!o->domain)
        o->domain = "localhost";
    if (strlen(o->user) > 40 || strlen(o->domain) > 60)
        die_usage("-u (40 bytes) or --domain (60 bytes) is too long: '%s'", o->user);
    if (o->cmd != RTB_CMD_XCHAT && (pairs > 0 || storm > 0 || (o->hold && o->cmd != RTB_CMD_XMUC) ||
                                    o->pairs_apart || o->leave_at_s > 0))
        die_usage("--pairs, --storm, --hold, --pairs-apart and --leave-at are for xchat (got them "
                  "for %s)",
                  o->cmd_name);
    if (o->cmd == RTB_CMD_XMUC) {
        static char host[128];
        o->count = count > 0 ? (uint32_t)count : 1000;
        o->rate = o->rate > 0 ? o->rate : 100;
        if (o->hold)
            rtb_xmuc.senders = 0;
        if (rtb_xmuc.rooms > o->count)
            die_usage("--rooms is above -c: every room wants an occupant%s", "");
        if (rtb_xmuc.senders > o->count)
            die_usage("--senders is above -c%s", "");
        if (!rtb_xmuc.muc_host) {
            snprintf(host, sizeof(host), "conference.%s", o->domain);
            rtb_xmuc.muc_host = host;
        }
        if (strlen(rtb_xmuc.muc_host) > 80 || strlen(rtb_xmuc.room_fmt) > 40)
            die_usage("--muc-host (80 bytes) or --room (40) is too long: '%s'", rtb_xmuc.muc_host);
        return;
    }
    switch (o->cmd) {
    case RTB_CMD_XLOGIN:
        o->count = count > 0 ? (uint32_t)count : 50;
        o->limit = o->limit ? o->limit : 10000;
        o->accounts = accounts > 0 ? (uint32_t)accounts : 1000;
        break;
    case RTB_CMD_XIDLE:
    case RTB_CMD_XROSTER:
        o->count = count > 0 ? (uint32_t)count : 1000;
        if (o->cmd == RTB_CMD_XROSTER && o->count < 19)
            die_usage("xroster needs at least 19 accounts for 18 contacts each%s", "");
        if (o->cmd == RTB_CMD_XROSTER && !o->limit)
            o->limit = 2 * (uint64_t)o->count;
        break;
    default:
        if (count > 0)
            die_usage("xchat takes --pairs and --storm, not -c%s", "");
        o->pairs = pairs > 0 ? (uint32_t)pairs : 40;
        o->storm = storm > 0 ? (uint32_t)storm : 0;
        o->rate = o->rate > 0 ? o->rate : 100;
        o->accounts = accounts > 0 ? (uint32_t)accounts : 2 * o->pairs + o->storm;
        if (o->accounts <= 2 * o->pairs && o->storm)
            die_usage("--accounts must leave some for the storm beyond the 2 x --pairs%s", "");
        if (o->pairs_apart && (!o->storm || o->procs < 2))
            die_usage("--pairs-apart wants --storm and --procs 2 or more%s", "");
        if (o->leave_at_s > 0 && (!o->hold || !o->pairs_apart || o->leave_at_s >= o->duration_s))
            die_usage("--leave-at wants --hold, --pairs-apart and a time before -d's end%s", "");
        o->count = 2 * o->pairs;
    }
}

static void parse(rtb_opts_t *o, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->port = 1883;
    o->conn_interval_ms = UINT32_MAX; /* 10 for conn/sub/pub, 0 for scenarios */
    o->pub_interval_ms = -1;
    o->size = 256;
    o->keepalive = 300;
    o->clean = 1;
    o->version = 5;
    o->duration_s = RTB_DEFAULT_DURATION_S;
    o->procs = 1;
    o->inflight = RTB_DEFAULT_INFLIGHT;
    o->window = RTB_DEFAULT_WINDOW;
    o->coalesce_us = RTB_DEFAULT_COALESCE_US;
    o->drain_s = RTB_DEFAULT_DRAIN_S;
    o->conn_timeout_s = RTB_DEFAULT_CONN_TIMEOUT_S;
    o->conn_parallel = RTB_DEFAULT_CONN_PARALLEL;
    o->test_skip_seq = -1;
    o->rate = -1;
    int64_t count = -1, pubs = -1, subs = -1, copies = -1, accounts = -1, pairs = -1, storm = -1;
    int port_set = 0, muc_flags = 0;
    const char *ifaddr = NULL, *prefix = NULL, *tag = "", *sub_ports = NULL, *pub_ports = NULL;

    if (argc < 2)
        die_usage("missing command%s", "");
    if (!strcmp(argv[1], "--help")) {
        fputs(usage_text, stdout);
        exit(0);
    }
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (!strcmp(argv[1], cmds[i].name)) {
            o->cmd = cmds[i].cmd;
            o->cmd_name = cmds[i].name;
            tag = cmds[i].tag;
        }
    if (!o->cmd_name)
        die_usage("unknown command '%s'", argv[1]);

    for (int i = 2; i < argc; i++) {
        char *f = argv[i], *v = NULL, *eq;
        char name[64];
        if (!strcmp(f, "--help")) {
            fputs(usage_text, stdout);
            exit(0);
        }
        if (!strcmp(f, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(f, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        if (!strcmp(f, "--go-stdin")) {
            o->go_stdin = 1;
            continue;
        }
        if (!strcmp(f, "--allow-remote")) {
            o->allow_remote = 1;
            continue;
        }
        if (!strcmp(f, "--tls")) {
            o->tls = 1;
            continue;
        }
        if (!strcmp(f, "--tls-resume")) {
            o->tls_resume = 1;
            continue;
        }
        if (!strcmp(f, "--hold")) {
            o->hold = 1;
            continue;
        }
        if (!strcmp(f, "--anon")) {
            rtb_xmuc.anon = 1;
            continue;
        }
        if (!strcmp(f, "--pairs-apart")) {
            o->pairs_apart = 1;
            continue;
        }
        if (f[0] != '-' || !f[1])
            die_usage("unexpected argument '%s'", f);
        snprintf(name, sizeof(name), "%s", f);
        if (f[1] == '-' && (eq = strchr(name, '='))) {
            *eq = 0;
            v = f + (eq - name) + 1;
        } else {
            if (i + 1 >= argc)
                die_usage("flag %s needs a value", f);
            v = argv[++i];
        }
        const char *n = name;
        if (!strcmp(n, "-h"))
            o->host = v;
        else if (!strcmp(n, "-p"))
            o->port = (int)parse_int(n, v, 1, 65535), port_set = 1;
        else if (!strcmp(n, "-c"))
            count = (int64_t)parse_int(n, v, 1, 1000000);
        else if (!strcmp(n, "-n"))
            o->start = (uint32_t)parse_int(n, v, 0, 1e9);
        else if (!strcmp(n, "-i"))
            o->conn_interval_ms = (uint32_t)parse_int(n, v, 0, 60000);
        else if (!strcmp(n, "-I"))
            o->pub_interval_ms = parse_num(n, v, 0, 3600000);
        else if (!strcmp(n, "-t"))
            o->topic = v;
        else if (!strcmp(n, "-q"))
            o->qos = (int)parse_int(n, v, 0, 2);
        else if (!strcmp(n, "-s"))
            o->size = (uint32_t)parse_int(n, v, 1, RTB_MAX_PAYLOAD);
        else if (!strcmp(n, "-L"))
            o->limit = (uint64_t)parse_int(n, v, 1, 1e9);
        else if (!strcmp(n, "-k"))
            o->keepalive = (uint16_t)parse_int(n, v, 0, 65535);
        else if (!strcmp(n, "-C")) {
            if (!strcmp(v, "true") || !strcmp(v, "1"))
                o->clean = 1;
            else if (!strcmp(v, "false") || !strcmp(v, "0"))
                o->clean = 0;
            else
                die_usage("bad value for -C (want true|false): '%s'", v);
        } else if (!strcmp(n, "-V")) {
            o->version = (int)parse_int(n, v, 3, 5);
        } else if (!strcmp(n, "-u"))
            o->user = v;
        else if (!strcmp(n, "-P"))
            o->pass = v;
        else if (!strcmp(n, "-d"))
            o->duration_s = parse_num(n, v, 0.001, RTB_MAX_DURATION_S);
        else if (!strcmp(n, "--procs"))
            o->procs = (uint32_t)parse_int(n, v, 1, RTB_MAX_PROCS);
        else if (!strcmp(n, "--inflight"))
            o->inflight = (uint32_t)parse_int(n, v, 1, 16384);
        else if (!strcmp(n, "--window"))
            o->window = (uint32_t)parse_int(n, v, 1, 1000000);
        else if (!strcmp(n, "--coalesce-us"))
            o->coalesce_us = (uint32_t)parse_int(n, v, 0, 100000);
        else if (!strcmp(n, "--rate"))
            o->rate = parse_num(n, v, 0.001, 1e8);
        else if (!strcmp(n, "--pubs"))
            pubs = (int64_t)parse_int(n, v, 1, 1000000);
        else if (!strcmp(n, "--subs"))
            subs = (int64_t)parse_int(n, v, 1, 1000000);
        else if (!strcmp(n, "--copies"))
            copies = (int64_t)parse_int(n, v, 1, 1000);
        else if (!strcmp(n, "--ifaddr"))
            ifaddr = v;
        else if (!strcmp(n, "--sub-ports"))
            sub_ports = v;
        else if (!strcmp(n, "--pub-ports"))
            pub_ports = v;
        else if (!strcmp(n, "--prefix"))
            prefix = v;
        else if (!strcmp(n, "--drain"))
            o->drain_s = parse_num(n, v, 0, 600);
        else if (!strcmp(n, "--conn-timeout"))
            o->conn_timeout_s = parse_num(n, v, 0.001, 600);
        else if (!strcmp(n, "--conn-parallel"))
            o->conn_parallel = (uint32_t)parse_int(n, v, 1, 100000);
        else if (!strcmp(n, "--cafile"))
            o->cafile = v;
        else if (!strcmp(n, "--cert"))
            o->cert = v;
        else if (!strcmp(n, "--key"))
            o->key = v;
        else if (!strcmp(n, "--sni"))
            o->sni = v;
        else if (!strcmp(n, "--ws")) {
            if (v[0] != '/')
                die_usage("--ws wants a path starting with '/': '%s'", v);
            o->ws = v;
        } else if (!strcmp(n, "--domain"))
            o->domain = v;
        else if (!strcmp(n, "--accounts"))
            accounts = (int64_t)parse_int(n, v, 1, 10000000);
        else if (!strcmp(n, "--pairs"))
            pairs = (int64_t)parse_int(n, v, 1, 1000000);
        else if (!strcmp(n, "--storm"))
            storm = (int64_t)parse_int(n, v, 1, 10000000);
        else if (!strcmp(n, "--rooms"))
            rtb_xmuc.rooms = (uint32_t)parse_int(n, v, 1, 1000000), muc_flags = 1;
        else if (!strcmp(n, "--senders"))
            rtb_xmuc.senders = (uint32_t)parse_int(n, v, 0, 1000000), muc_flags = 1;
        else if (!strcmp(n, "--muc-host"))
            rtb_xmuc.muc_host = v, muc_flags = 1;
        else if (!strcmp(n, "--room"))
            rtb_xmuc.room_fmt = v, muc_flags = 1;
        else if (!strcmp(n, "--salt-cache"))
            o->salt_cache = v;
        else if (!strcmp(n, "--leave-at"))
            o->leave_at_s = parse_num(n, v, 0.001, RTB_MAX_DURATION_S);
        else if (!strcmp(n, "--test-skip-seq"))
            o->test_skip_seq = (int64_t)parse_int(n, v, 0, 1e9);
        else
            die_usage("unknown flag '%s'", f);
    }
    switch (o->cmd) {
    case RTB_CMD_CONN:
    case RTB_CMD_SUB:
    case RTB_CMD_PUB:
        o->count = count > 0 ? (uint32_t)count : RTB_DEFAULT_CLIENTS;
        if (o->cmd != RTB_CMD_CONN && !o->topic)
            die_usage("%s needs -t topic", o->cmd_name);
        if (o->cmd == RTB_CMD_PUB && o->pub_interval_ms < 0 && o->rate < 0)
            o->pub_interval_ms = 1000;
        break;
    case RTB_CMD_FANIN:
        o->pubs = (uint32_t)(pubs > 0 ? pubs : count > 0 ? count : 100);
        o->subs = 1;
        break;
    case RTB_CMD_FANOUT:
        o->subs = (uint32_t)(subs > 0 ? subs : count > 0 ? count : 1000);
        o->pubs = 1;
        break;
    case RTB_CMD_PAIRS:
        o->count = count > 0 ? (uint32_t)count : 1000;
        o->pubs = o->subs = o->count;
        break;
    case RTB_CMD_HS:
        o->count = count > 0 ? (uint32_t)count : 10;
        break;
    case RTB_CMD_SEED:
        o->subs = (uint32_t)(subs > 0 ? subs : count > 0 ? count : 19000);
        o->pubs = (uint32_t)(pubs > 0 ? pubs : 40);
        if (o->rate < 0 && o->pub_interval_ms < 0)
            o->rate = 4000;
        if (o->pubs > o->subs)
            die_usage("seed needs at least as many subscribers as publishers%s", "");
        o->copies = (uint32_t)(copies > 0 ? copies : 1);
        if ((uint64_t)o->subs * o->copies > 10000000)
            die_usage("--subs x --copies is above 10,000,000 subscribers%s", "");
        break;
    default:
        break; /* the XMPP commands: xmpp_opts below */
    }
    if (muc_flags && o->cmd != RTB_CMD_XMUC)
        die_usage("--rooms, --senders, --muc-host and --room are for xmuc (got them for %s)",
                  o->cmd_name);
    if (rtb_xmuc.anon && !rtb_xmpp_cmd(o->cmd))
        die_usage("--anon is for the XMPP commands (got it for %s)", o->cmd_name);
    if (rtb_xmpp_cmd(o->cmd))
        xmpp_opts(o, count, accounts, pairs, storm, port_set);
    else if (accounts > 0 || pairs > 0 || storm > 0 || o->hold || o->domain || o->salt_cache ||
             o->leave_at_s > 0)
        die_usage("--accounts, --pairs, --storm, --hold, --leave-at, --domain and --salt-cache "
                  "are for the XMPP commands (got them for %s)",
                  o->cmd_name);
    if (copies > 0 && o->cmd != RTB_CMD_SEED)
        die_usage("--copies is for seed only (got it for %s)", o->cmd_name);
    if (!o->copies)
        o->copies = 1;
    /* Below the header size the payload is raw filler: nothing to check on receipt. */
    if (o->size < RTB_HDR_SIZE && o->cmd != RTB_CMD_PUB)
        die_usage("-s below 16 (raw payload, no header) is for pub only%s", "");
    if (o->cmd >= RTB_CMD_FANIN && o->topic)
        die_usage("scenarios use fixed topics; -t is for sub and pub (got '%s')", o->topic);
    if ((o->cafile || o->cert || o->key || o->sni || o->tls_resume) && !o->tls)
        die_usage("--cafile, --cert, --key, --sni and --tls-resume need --tls%s", "");
    if (!o->cert != !o->key)
        die_usage("--cert and --key go together%s", "");
    if (o->pub_interval_ms < 0)
        o->pub_interval_ms = 0;
    if (o->conn_interval_ms == UINT32_MAX)
        o->conn_interval_ms = o->cmd >= RTB_CMD_FANIN ? 0 : 10;
    if (o->rate < 0)
        o->rate = 0;
    /* --pairs-apart: one process for the pairs, the storm's logins over the others */
    uint32_t most = o->pairs_apart ? o->storm + 1 : rtb_groups(o);
    if (o->procs > most) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "%s splits into at most %u process(es); --procs %u is too many%%s", o->cmd_name,
                 most, o->procs);
        die_usage(msg, "");
    }
    if (ifaddr)
        parse_ifaddr(o, ifaddr);
    if (sub_ports)
        o->nsub_addr = parse_ports(o, "--sub-ports", sub_ports, o->sub_addr);
    if (pub_ports)
        o->npub_addr = parse_ports(o, "--pub-ports", pub_ports, o->pub_addr);
    char def[48];
    snprintf(def, sizeof(def), "rtb%d%s_", (int)getpid(), tag);
    if (prefix && strlen(prefix) >= sizeof(o->prefix))
        die_usage("--prefix is longer than 47 bytes: '%s'", prefix);
    snprintf(o->prefix, sizeof(o->prefix), "%s", prefix ? prefix : def);
    if (o->version == 3 && strlen(o->prefix) + 8 > 23)
        die_usage("MQTT 3.1 client ids are at most 23 bytes; shorten --prefix '%s'", o->prefix);
    resolve(o);
}

/* Raises the open-file limit to the hard limit and checks that each process fits. */
static void check_fds(const rtb_opts_t *o)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    uint64_t total = (uint64_t)o->pubs + (uint64_t)o->subs * o->copies;
    if (o->cmd <= RTB_CMD_PUB || o->cmd == RTB_CMD_HS || rtb_xmpp_cmd(o->cmd))
        total = o->count;
    if (o->cmd == RTB_CMD_XCHAT)
        total += o->hold ? o->storm : (uint64_t)o->conn_parallel * o->procs;
    if (o->cmd == RTB_CMD_XROSTER)
        total = (uint64_t)o->conn_parallel * o->procs;
    uint64_t per = (total + o->procs - 1) / o->procs;
    if (o->pairs_apart) { /* the storm's processes hold the most */
        uint64_t storm = o->hold ? o->storm : (uint64_t)o->conn_parallel * (o->procs - 1);
        per = (storm + o->procs - 2) / (o->procs - 1);
    }
    if (o->cmd == RTB_CMD_SEED)
        per = ((uint64_t)o->subs / o->procs + o->subs % o->procs) * o->copies +
              o->pubs; /* upper bound */
    if (per + RTB_FD_RESERVE > rl.rlim_cur) {
        fprintf(stderr,
                "rtbench: %llu clients per process exceed the open-file limit %llu; "
                "use more --procs\n",
                (unsigned long long)per, (unsigned long long)rl.rlim_cur);
        exit(2);
    }
}

/* ---- aggregation ------------------------------------------------------------------ */

typedef struct rtb_agg_s {
    const rtb_opts_t *o;
    uint32_t n;         /* reporting processes */
    rtb_report_t *last; /* latest report per process */
    uint8_t *final;     /* process sent its final report */
    uint8_t *ready;     /* process is connected and waits for the go */
    uint64_t printed;   /* seconds already printed */
    rtb_report_t prev;  /* merged totals at the previous printed second */
    uint64_t worst_p99; /* XMPP: highest per-second chat p99, ns */
    uint64_t worst_max; /* XMPP: highest per-second chat max, ns */
} rtb_agg_t;

static void stats_merge(rtb_stats_t *d, const rtb_stats_t *s)
{
#define AGG_SUM(f) d->f += s->f
#define AGG_MAX(f) d->f = s->f > d->f ? s->f : d->f
#define AGG_MINNZ(f) d->f = (s->f && (!d->f || s->f < d->f)) ? s->f : d->f
    AGG_SUM(clients);
    AGG_SUM(conn_ok);
    AGG_SUM(conn_fail);
    AGG_SUM(conn_lost);
    AGG_SUM(sub_ok);
    AGG_SUM(sub_fail);
    AGG_SUM(sent);
    AGG_SUM(acked);
    AGG_SUM(received);
    AGG_SUM(unique);
    AGG_SUM(dups);
    AGG_SUM(ooo);
    AGG_SUM(gaps);
    AGG_SUM(expected);
    AGG_MAX(expected_known);
    AGG_SUM(foreign);
    AGG_SUM(proto_err);
    AGG_SUM(tls_full);
    AGG_SUM(tls_resumed);
    AGG_SUM(hs_full);
    AGG_SUM(hs_resumed);
    AGG_SUM(roster_both);
    AGG_SUM(pbkdf2);
    AGG_MINNZ(t_conn_first);
    AGG_MAX(t_conn_last);
    AGG_MINNZ(t_run_start);
    AGG_MAX(t_run_end);
    AGG_MAX(t_recv_last);
    AGG_SUM(cpu_us);
    AGG_MAX(tick);
#undef AGG_SUM
#undef AGG_MAX
#undef AGG_MINNZ
}

static void report_init(rtb_report_t *r)
{
    memset(&r->s, 0, sizeof(r->s));
    rtb_hist_init(&r->e2e);
    rtb_hist_init(&r->ack);
    rtb_hist_init(&r->conn);
}

static void agg_merged(const rtb_agg_t *a, rtb_report_t *m)
{
    report_init(m);
    for (uint32_t i = 0; i < a->n; i++) {
        stats_merge(&m->s, &a->last[i].s);
        rtb_hist_merge(&m->e2e, &a->last[i].e2e);
        rtb_hist_merge(&m->ack, &a->last[i].ack);
        rtb_hist_merge(&m->conn, &a->last[i].conn);
    }
}

static double ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

static void agg_feed(rtb_agg_t *a, uint32_t i, int kind, const rtb_report_t *r)
{
    a->last[i] = *r;
    if (kind == RTB_EMIT_FINAL)
        a->final[i] = 1;
    if (kind == RTB_EMIT_READY)
        a->ready[i] = 1;
    int xmpp = rtb_xmpp_cmd(a->o->cmd);
    if (kind != RTB_EMIT_TICK || (a->o->quiet && !xmpp))
        return;
    /* Print the next second once every live process has reported it. */
    for (uint32_t j = 0; j < a->n; j++)
        if (!a->final[j] && a->last[j].s.tick <= a->printed)
            return;
    static rtb_report_t m;
    static rtb_hist_t iv;
    agg_merged(a, &m);
    rtb_hist_diff(&iv, &m.e2e, &a->prev.e2e);
    a->printed++;
    if (xmpp) {
        /* The XMPP summary names the worst second, so it is tracked even when quiet. */
        uint64_t p99 = rtb_hist_quantile(&iv, 0.99);
        a->worst_p99 = p99 > a->worst_p99 ? p99 : a->worst_p99;
        a->worst_max = iv.max > a->worst_max ? iv.max : a->worst_max;
        if (!a->o->quiet && a->o->cmd == RTB_CMD_XMUC)
            rtb_xmuc_tick_line(a->printed, &m, &a->prev, &iv);
        else if (!a->o->quiet)
            rtb_xmpp_tick_line(a->printed, &m, &a->prev, &iv);
        a->prev = m;
        return;
    }
    fprintf(stderr,
            "rtbench[%3llus] conn=%llu fail=%llu lost=%llu pub/s=%llu recv/s=%llu "
            "lat p50=%.3fms p99=%.3fms\n",
            (unsigned long long)a->printed, (unsigned long long)(m.s.conn_ok - m.s.conn_lost),
            (unsigned long long)m.s.conn_fail, (unsigned long long)m.s.conn_lost,
            (unsigned long long)(m.s.sent - a->prev.s.sent),
            (unsigned long long)(m.s.received - a->prev.s.received),
            ms(rtb_hist_quantile(&iv, 0.50)), ms(rtb_hist_quantile(&iv, 0.99)));
    a->prev = m;
}

static void emit_direct(void *ctx, int kind, const rtb_report_t *r)
{
    agg_feed(ctx, 0, kind, r);
}

static void emit_pipe(void *ctx, int kind, const rtb_report_t *r)
{
    int fd = *(int *)ctx;
    uint32_t head[2] = {RTB_REC_MAGIC, (uint32_t)kind};
    struct {
        const void *p;
        size_t n;
    } parts[2] = {{head, sizeof(head)}, {r, sizeof(*r)}};
    for (int k = 0; k < 2; k++) {
        const char *p = parts[k].p;
        size_t n = parts[k].n;
        while (n) {
            ssize_t w = write(fd, p, n);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                _exit(1); /* the parent is gone; nobody can use our figures */
            p += w;
            n -= (size_t)w;
        }
    }
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* An upper bound on how long a child may run, from its own phase deadlines. */
static double child_bound_s(const rtb_opts_t *o)
{
    double clients = (double)o->pubs + (double)o->subs * o->copies + o->count + o->storm;
    /* Connects start in waves of conn_parallel; each may take up to conn_timeout_s. */
    double waves = clients / o->conn_parallel + 2;
    double conn = clients * o->conn_interval_ms / 1000.0 + waves * o->conn_timeout_s;
    return conn + o->duration_s + o->drain_s + 2.0 + RTB_PARENT_SLACK_S;
}

/* Forks o->procs workers and feeds their records into the aggregate; 0 on success. */
static int run_procs(const rtb_opts_t *o, rtb_agg_t *a)
{
    int fds[RTB_MAX_PROCS];   /* report pipes, read ends */
    int gofds[RTB_MAX_PROCS]; /* go pipes, write ends; -1 once released */
    pid_t pids[RTB_MAX_PROCS];
    size_t got[RTB_MAX_PROCS] = {0};
    int live[RTB_MAX_PROCS];
    const size_t rec = 2 * sizeof(uint32_t) + sizeof(rtb_report_t);
    char *bufs = malloc(rec * o->procs);
    if (!bufs)
        return -ENOMEM;
    /* Shared before the fork, so that every worker maps the same pages. */
    size_t fbn = rtb_fb_size(o);
    uint64_t *fb = NULL;
    if (fbn) {
        fb = mmap(NULL, fbn, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (fb == MAP_FAILED) {
            free(bufs);
            return -errno;
        }
    }
    fflush(NULL);
    for (uint32_t p = 0; p < o->procs; p++) {
        int pf[2], gf[2];
        if (pipe(pf) || pipe(gf))
            return -errno;
        pid_t pid = fork();
        if (pid < 0)
            return -errno;
        if (pid == 0) {
            for (uint32_t q = 0; q < p; q++) {
                close(fds[q]);
                close(gofds[q]);
            }
            close(pf[0]);
            close(gf[1]);
            int wfd = pf[1];
            int r = rtb_worker_run(o, p, gf[0], fb, emit_pipe, &wfd);
            _exit(r ? 1 : 0);
        }
        close(pf[1]);
        close(gf[0]);
        fds[p] = pf[0];
        gofds[p] = gf[1];
        pids[p] = pid;
        live[p] = 1;
    }
    uint64_t deadline = mono_ns() + (uint64_t)(child_bound_s(o) * 1e9);
    if (o->go_stdin)
        deadline += (uint64_t)(RTB_GO_WAIT_S * 1e9);
    int asked = 0; /* --go-stdin: "ready" printed, stdin polled */
    uint32_t nlive = o->procs;
    int err = 0;
    int released = 0;
    while (nlive) {
        /* Release the barrier once every process is connected, finished or gone. */
        uint32_t waiting = 0;
        for (uint32_t p = 0; p < o->procs; p++)
            waiting += live[p] && !a->ready[p] && !a->final[p];
        if (!released && waiting == 0 && o->go_stdin && !asked) {
            fprintf(stderr, "rtbench: ready\n");
            fflush(stderr);
            asked = 1;
        }
        if (!released && waiting == 0 && (!o->go_stdin || asked == 2)) {
            for (uint32_t p = 0; p < o->procs; p++) {
                if (write(gofds[p], "g", 1) < 0) {
                    /* The child is gone; its EOF on the report pipe tells the rest. */
                }
                close(gofds[p]);
            }
            released = 1;
        }
        if (mono_ns() > deadline) {
            fprintf(stderr, "rtbench: workers overran their deadline; killing them\n");
            for (uint32_t p = 0; p < o->procs; p++)
                if (live[p])
                    kill(pids[p], SIGKILL);
            err = -ETIMEDOUT;
            break;
        }
        struct pollfd pfd[RTB_MAX_PROCS + 1];
        for (uint32_t p = 0; p < o->procs; p++) {
            pfd[p].fd = live[p] ? fds[p] : -1;
            pfd[p].events = POLLIN;
            pfd[p].revents = 0;
        }
        pfd[o->procs].fd = asked == 1 ? 0 : -1;
        pfd[o->procs].events = POLLIN;
        pfd[o->procs].revents = 0;
        if (poll(pfd, o->procs + 1, 200) < 0 && errno != EINTR)
            break;
        if (pfd[o->procs].revents) {
            /* Up to the end of a line, or EOF: either one says go. */
            char ch;
            ssize_t r = read(0, &ch, 1);
            if (r <= 0 ? !(r < 0 && errno == EINTR) : ch == '\n')
                asked = 2;
        }
        for (uint32_t p = 0; p < o->procs; p++) {
            if (!live[p] || !pfd[p].revents)
                continue;
            char *b = bufs + rec * p;
            ssize_t r = read(fds[p], b + got[p], rec - got[p]);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                live[p] = 0;
                nlive--;
                continue;
            }
            got[p] += (size_t)r;
            if (got[p] < rec)
                continue;
            got[p] = 0;
            uint32_t head[2];
            memcpy(head, b, sizeof(head));
            if (head[0] != RTB_REC_MAGIC) {
                err = -EPROTO;
                live[p] = 0;
                nlive--;
                continue;
            }
            agg_feed(a, p, (int)head[1], (const rtb_report_t *)(b + sizeof(head)));
        }
    }
    for (uint32_t p = 0; p < o->procs; p++) {
        int st;
        if (!released)
            close(gofds[p]);
        close(fds[p]);
        waitpid(pids[p], &st, 0);
        if (!a->final[p] && !err) {
            fprintf(stderr, "rtbench: worker %u ended without a final report\n", p);
            err = -EPIPE;
        }
    }
    free(bufs);
    if (fb)
        munmap(fb, fbn);
    return err;
}

static uint64_t rusage_us(int who)
{
    struct rusage ru;
    getrusage(who, &ru);
    return (uint64_t)ru.ru_utime.tv_sec * 1000000 + (uint64_t)ru.ru_utime.tv_usec +
           (uint64_t)ru.ru_stime.tv_sec * 1000000 + (uint64_t)ru.ru_stime.tv_usec;
}

static void print_lat(const char *name, const rtb_hist_t *h, int json, int last)
{
    if (json) {
        printf("\"%s\":{\"count\":%llu,\"p50_ms\":%.4f,\"p90_ms\":%.4f,\"p99_ms\":%.4f,"
               "\"p999_ms\":%.4f,\"max_ms\":%.4f}%s",
               name, (unsigned long long)h->count, ms(rtb_hist_quantile(h, 0.5)),
               ms(rtb_hist_quantile(h, 0.9)), ms(rtb_hist_quantile(h, 0.99)),
               ms(rtb_hist_quantile(h, 0.999)), ms(h->max), last ? "" : ",");
        return;
    }
    printf("%-9s n=%llu p50=%.3fms p90=%.3fms p99=%.3fms p99.9=%.3fms max=%.3fms\n", name,
           (unsigned long long)h->count, ms(rtb_hist_quantile(h, 0.5)),
           ms(rtb_hist_quantile(h, 0.9)), ms(rtb_hist_quantile(h, 0.99)),
           ms(rtb_hist_quantile(h, 0.999)), ms(h->max));
}

static void summary(const rtb_opts_t *o, const rtb_report_t *m, uint64_t cpu_us)
{
    const rtb_stats_t *s = &m->s;
    double conn_s =
        s->t_conn_last > s->t_conn_first ? (double)(s->t_conn_last - s->t_conn_first) / 1e9 : 0;
    double run_s =
        s->t_run_end > s->t_run_start ? (double)(s->t_run_end - s->t_run_start) / 1e9 : 0;
    uint64_t recv_end = s->t_recv_last > s->t_run_end ? s->t_recv_last : s->t_run_end;
    double recv_s = recv_end > s->t_run_start ? (double)(recv_end - s->t_run_start) / 1e9 : 0;
    double conn_rate = conn_s > 0 ? (double)s->conn_ok / conn_s : 0;
    double pub_rate = run_s > 0 ? (double)s->sent / run_s : 0;
    double recv_rate = recv_s > 0 ? (double)s->received / recv_s : 0;
    int known = s->expected_known != 0;
    uint64_t missing = known ? (s->expected > s->unique ? s->expected - s->unique : 0) : s->gaps;
    uint64_t msgs = s->received ? s->received : s->sent;
    double cpu_s = (double)cpu_us / 1e6;
    double cpu_per_m = msgs ? cpu_s / ((double)msgs / 1e6) : 0;
    const char *transport = o->tls ? (o->ws ? "wss" : "tls") : (o->ws ? "ws" : "tcp");
    double hs_full_rate = run_s > 0 ? (double)s->hs_full / run_s : 0;
    double hs_resumed_rate = run_s > 0 ? (double)s->hs_resumed / run_s : 0;
    double hs_rate = hs_full_rate + hs_resumed_rate;

    if (o->json) {
        printf("{\"command\":\"%s\",\"procs\":%u,\"qos\":%d,\"size\":%u,\"mqtt\":%d,"
               "\"clients\":%llu,\"connected\":%llu,\"failed\":%llu,\"lost\":%llu,"
               "\"subscribed\":%llu,\"sub_failed\":%llu,\"connect_seconds\":%.6f,"
               "\"connect_rate\":%.1f,\"sent\":%llu,\"acked\":%llu,\"received\":%llu,"
               "\"unique\":%llu,",
               o->cmd_name, o->procs, o->qos, o->size, o->version, (unsigned long long)s->clients,
               (unsigned long long)s->conn_ok, (unsigned long long)s->conn_fail,
               (unsigned long long)s->conn_lost, (unsigned long long)s->sub_ok,
               (unsigned long long)s->sub_fail, conn_s, conn_rate, (unsigned long long)s->sent,
               (unsigned long long)s->acked, (unsigned long long)s->received,
               (unsigned long long)s->unique);
        if (known)
            printf("\"expected\":%llu,", (unsigned long long)s->expected);
        else
            printf("\"expected\":null,");
        printf("\"missing\":%llu,\"missing_basis\":\"%s\",\"gaps\":%llu,\"duplicates\":%llu,"
               "\"out_of_order\":%llu,\"foreign\":%llu,\"protocol_errors\":%llu,"
               "\"run_seconds\":%.6f,\"pub_rate\":%.1f,\"recv_rate\":%.1f,",
               (unsigned long long)missing, known ? "expected" : "gaps",
               (unsigned long long)s->gaps, (unsigned long long)s->dups, (unsigned long long)s->ooo,
               (unsigned long long)s->foreign, (unsigned long long)s->proto_err, run_s, pub_rate,
               recv_rate);
        print_lat("e2e", &m->e2e, 1, 0);
        print_lat("ack", &m->ack, 1, 0);
        print_lat("connack", &m->conn, 1, 0);
        /* The run phase on the wall clock, so a sampler of the broker can cut its CPU to
         * the steady part (no connects, no drain); the workers time it on CLOCK_MONOTONIC. */
        struct timespec mono, wall;
        clock_gettime(CLOCK_MONOTONIC, &mono);
        clock_gettime(CLOCK_REALTIME, &wall);
        double wall_minus_mono = ((double)wall.tv_sec + (double)wall.tv_nsec / 1e9) -
                                 ((double)mono.tv_sec + (double)mono.tv_nsec / 1e9);
        printf("\"run_start_unix\":%.6f,\"run_end_unix\":%.6f,",
               s->t_run_start ? (double)s->t_run_start / 1e9 + wall_minus_mono : 0,
               s->t_run_end ? (double)s->t_run_end / 1e9 + wall_minus_mono : 0);
        if (o->tls || o->ws || o->cmd == RTB_CMD_HS)
            printf("\"transport\":\"%s\",\"tls_full\":%llu,\"tls_resumed\":%llu,"
                   "\"hs_full\":%llu,\"hs_resumed\":%llu,\"hs_rate\":%.1f,"
                   "\"hs_full_rate\":%.1f,\"hs_resumed_rate\":%.1f,",
                   transport, (unsigned long long)s->tls_full, (unsigned long long)s->tls_resumed,
                   (unsigned long long)s->hs_full, (unsigned long long)s->hs_resumed, hs_rate,
                   hs_full_rate, hs_resumed_rate);
        printf("\"cpu_seconds\":%.3f,\"cpu_seconds_per_million\":%.3f}\n", cpu_s, cpu_per_m);
        return;
    }
    printf("rtbench %s: procs=%u qos=%d size=%uB mqtt=%d\n", o->cmd_name, o->procs, o->qos, o->size,
           o->version);
    printf("clients   planned=%llu connected=%llu failed=%llu lost=%llu subscribed=%llu "
           "sub_failed=%llu connect=%.0f/s over %.3fs\n",
           (unsigned long long)s->clients, (unsigned long long)s->conn_ok,
           (unsigned long long)s->conn_fail, (unsigned long long)s->conn_lost,
           (unsigned long long)s->sub_ok, (unsigned long long)s->sub_fail, conn_rate, conn_s);
    printf("messages  sent=%llu acked=%llu received=%llu", (unsigned long long)s->sent,
           (unsigned long long)s->acked, (unsigned long long)s->received);
    if (known)
        printf(" expected=%llu missing=%llu", (unsigned long long)s->expected,
               (unsigned long long)missing);
    else
        printf(" expected=n/a missing(gaps)=%llu", (unsigned long long)missing);
    printf(" duplicates=%llu out-of-order=%llu foreign=%llu protocol-errors=%llu\n",
           (unsigned long long)s->dups, (unsigned long long)s->ooo, (unsigned long long)s->foreign,
           (unsigned long long)s->proto_err);
    printf("rates     pub=%.0f/s over %.3fs recv=%.0f/s over %.3fs\n", pub_rate, run_s, recv_rate,
           recv_s);
    print_lat("e2e", &m->e2e, 0, 0);
    print_lat("ack", &m->ack, 0, 0);
    print_lat("connack", &m->conn, 0, 0);
    if (o->tls || o->ws || o->cmd == RTB_CMD_HS)
        printf("transport %s: tls handshakes full=%llu resumed=%llu\n", transport,
               (unsigned long long)s->tls_full, (unsigned long long)s->tls_resumed);
    if (o->cmd == RTB_CMD_HS)
        printf("hs        cycles full=%llu resumed=%llu over %.3fs: %.1f/s (full %.1f/s, "
               "resumed %.1f/s)\n",
               (unsigned long long)s->hs_full, (unsigned long long)s->hs_resumed, run_s, hs_rate,
               hs_full_rate, hs_resumed_rate);
    printf("cpu       %.3fs user+sys (all processes), %.3fs per million messages\n", cpu_s,
           cpu_per_m);
}

int main(int argc, char **argv)
{
    static rtb_opts_t o;
    parse(&o, argc, argv);
    check_fds(&o);
    signal(SIGPIPE, SIG_IGN);

    rtb_agg_t a;
    memset(&a, 0, sizeof(a));
    a.o = &o;
    a.n = o.procs;
    a.last = calloc(o.procs, sizeof(rtb_report_t));
    a.final = calloc(o.procs, 1);
    a.ready = calloc(o.procs, 1);
    if (!a.last || !a.final || !a.ready) {
        fprintf(stderr, "rtbench: out of memory\n");
        return 1;
    }
    report_init(&a.prev);
    for (uint32_t i = 0; i < o.procs; i++)
        report_init(&a.last[i]);

    int r;
    uint64_t cpu_us;
    if (o.procs == 1 && !o.go_stdin) {
        r = rtb_worker_run(&o, 0, -1, NULL, emit_direct, &a);
        cpu_us = rusage_us(RUSAGE_SELF);
    } else {
        r = run_procs(&o, &a);
        cpu_us = rusage_us(RUSAGE_SELF) + rusage_us(RUSAGE_CHILDREN);
    }
    if (r) {
        fprintf(stderr, "rtbench: run failed: %s\n", uv_strerror(r));
        return 1;
    }
    static rtb_report_t m;
    agg_merged(&a, &m);
    if (o.cmd == RTB_CMD_XMUC)
        rtb_xmuc_summary(&o, &m, cpu_us, a.worst_p99, a.worst_max);
    else if (rtb_xmpp_cmd(o.cmd))
        rtb_xmpp_summary(&o, &m, cpu_us, a.worst_p99, a.worst_max);
    else
        summary(&o, &m, cpu_us);
    free(a.last);
    free(a.final);
    free(a.ready);
    return 0;
}
